//! The HTTP ceiling server (reads an invocation, answers a fixed body) and
//! the OTLP sink a handler with telemetry exports to.

use super::*;

/// What the handler answers for a duplicate, byte for byte in shape.
pub(crate) const CEILING_ANSWER: &str = r#"{"Outputs":{},"Logs":["order bench-00000000-000000 duplicate"],"ReturnValue":{"orderId":"bench-00000000-000000","eventId":"00000000-0000-4000-8000-000000000000","outcome":"duplicate","guard":"redis"}}"#;

pub(crate) async fn ceiling_server(port: u16) -> anyhow::Result<()> {
    use warp::Filter;
    let invoke = warp::post()
        .and(warp::path::param::<String>())
        .and(warp::path::end())
        .and(warp::body::bytes())
        .map(|_function: String, _body: bytes::Bytes| {
            warp::http::Response::builder()
                .header("content-type", "application/json")
                .body(CEILING_ANSWER)
                .expect("static response")
        });
    let ready = warp::get().map(|| "{\"status\":\"ready\"}");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let (bound, server) = warp::serve(invoke.or(ready))
        .try_bind_ephemeral(addr)
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    println!("ceiling server listening on {bound}");
    server.await;
    Ok(())
}

/// A collector that takes every OTLP/HTTP export (`POST /v1/traces`,
/// `/v1/metrics`, `/v1/logs`) and answers the empty protobuf response, so
/// the handler's export costs what it costs against a collector that keeps
/// up; counts the requests and bytes it took.
pub(crate) async fn otlp_sink(port: u16) -> anyhow::Result<()> {
    use warp::Filter;
    let requests = Arc::new(AtomicU64::new(0));
    let bytes_in = Arc::new(AtomicU64::new(0));
    let (r, b) = (Arc::clone(&requests), Arc::clone(&bytes_in));
    let export = warp::post()
        .and(warp::path!("v1" / String))
        .and(warp::body::bytes())
        .map(move |_signal: String, body: bytes::Bytes| {
            r.fetch_add(1, Ordering::Relaxed);
            b.fetch_add(body.len() as u64, Ordering::Relaxed);
            warp::http::Response::builder()
                .header("content-type", "application/x-protobuf")
                .body(Vec::<u8>::new())
                .expect("static response")
        });
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let (bound, server) = warp::serve(export)
        .try_bind_ephemeral(addr)
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    println!("otlp sink listening on {bound}");
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(10));
        loop {
            tick.tick().await;
            println!(
                "otlp sink: {} exports, {} bytes",
                requests.load(Ordering::Relaxed),
                bytes_in.load(Ordering::Relaxed)
            );
        }
    });
    server.await;
    Ok(())
}
