//! Invocation bodies and the HTTP/1.1 client that sends them.

use super::*;

/// The Functions host's invocation body for order `i` of run `tag`
/// (docs/host-protocol.md, "One invocation": Event Grid schema, the default binding). The same `i`
/// always gives the same event: a redelivery.
pub(crate) fn invocation_body(tag: u32, i: u64) -> String {
    let (event, data) = event_and_data(tag, i);
    format!(
        r#"{{"Data":{{"eventGridEvent":{event}}},"Metadata":{{"data":{data},"sys":{{"MethodName":"OrderTrigger","UtcNow":"2025-06-14T09:30:02.4471234Z","RandGuid":"5d0c2a8e-7b1f-4c39-9e62-{i:012x}"}}}}}}"#
    )
}

/// What Event Grid posts to the webhook for orders `first..first + n` of
/// run `tag`: the same events as [`invocation_body`], as a JSON array.
pub(crate) fn webhook_body(tag: u32, first: u64, n: u64) -> String {
    let events: Vec<String> = (first..first + n)
        .map(|i| event_and_data(tag, i).0)
        .collect();
    format!("[{}]", events.join(","))
}

/// Order `i` of run `tag` as an Event Grid event, and its data.
fn event_and_data(tag: u32, i: u64) -> (String, String) {
    let order_id = format!("bench-{tag:08x}-{i:06}");
    let event_id = format!("{tag:08x}-0000-4000-8000-{i:012x}");
    let account = i % 64;
    let side = if i.is_multiple_of(3) { "sell" } else { "buy" };
    let data = format!(
        r#"{{"orderId":"{order_id}","side":"{side}","symbol":"MSFT","quantity":25,"limitPrice":431.15,"currency":"USD","accountId":"acct-{account}","placedAt":"2025-06-14T09:30:02.118Z"}}"#
    );
    let event = format!(
        r#"{{"id":"{event_id}","topic":"/subscriptions/11111111-2222-3333-4444-555555555555/resourceGroups/rg-trading/providers/Microsoft.EventGrid/topics/orders","subject":"orders/{order_id}","eventType":"Trading.Order.Placed","eventTime":"2025-06-14T09:30:02.1180000Z","data":{data},"dataVersion":"1.0","metadataVersion":"1"}}"#
    );
    (event, data)
}

/// Which front door a request goes to.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Door {
    /// `serve`: the Functions host's invocation to `/OrderTrigger`.
    Functions,
    /// `webhook`: Event Grid's delivery to `/events`.
    Webhook,
}

/// A delivery of `body` through `door`, with the headers its sender sends.
pub(crate) fn delivery_request(
    door: Door,
    addr: SocketAddr,
    body: String,
) -> anyhow::Result<Request<Body>> {
    match door {
        Door::Functions => invocation_request(addr, body),
        Door::Webhook => {
            let mut request = Request::post("/events")
                .header("host", addr.to_string())
                .header("content-type", "application/json; charset=utf-8")
                .header("aeg-event-type", "Notification")
                .header("aeg-delivery-count", "0");
            if let Some(token) = WEBHOOK_TOKEN.get() {
                request = request.header("authorization", format!("Bearer {token}"));
            }
            Ok(request.body(Body::from(body))?)
        }
    }
}

pub(crate) fn invocation_request(addr: SocketAddr, body: String) -> anyhow::Result<Request<Body>> {
    Ok(Request::post("/OrderTrigger")
        .header("host", addr.to_string())
        .header("content-type", "application/json; charset=utf-8")
        .header(
            "x-azure-functions-invocationid",
            uuid::Uuid::new_v4().to_string(),
        )
        .header("x-azure-functions-hostversion", "4.1037.0.0")
        .header("user-agent", "Azure-Functions-Host/4.1037.0.0")
        .body(Body::from(body))?)
}

/// One keep-alive HTTP/1.1 connection (the host keeps its connections open).
pub(crate) async fn http_connection(addr: SocketAddr) -> anyhow::Result<SendRequest<Body>> {
    let stream = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connect {addr}"))?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::handshake(stream).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// Send one invocation; `Ok` only for a 200 whose body holds `expect`.
pub(crate) async fn invoke(
    sender: &mut SendRequest<Body>,
    addr: SocketAddr,
    body: String,
    expect: &str,
) -> anyhow::Result<()> {
    send(sender, invocation_request(addr, body)?, expect).await
}

/// Send one request; `Ok` only for a 200 whose body holds `expect`.
pub(crate) async fn send(
    sender: &mut SendRequest<Body>,
    request: Request<Body>,
    expect: &str,
) -> anyhow::Result<()> {
    futures::future::poll_fn(|cx| sender.poll_ready(cx)).await?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let bytes = hyper::body::to_bytes(response.into_body()).await?;
    if status != StatusCode::OK || !contains(&bytes, expect.as_bytes()) {
        bail!(
            "unexpected answer {status}: {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(300)])
        );
    }
    Ok(())
}

pub(crate) fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
