//! The HTTP ceiling server: reads an invocation, answers a fixed body.

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
