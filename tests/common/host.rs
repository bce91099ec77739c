//! The handler as the Functions host meets it: the invocation body, a
//! handler on an ephemeral port, requests as the host sends them and its
//! judgement of the answers, and the real binary started as the host does.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use order_guard::processor::Processor;
use serde_json::{json, Value};

/// The body the Functions host sends for a trigger value (docs/host-protocol.md, "One invocation").
pub fn invocation(trigger: Value) -> Value {
    let data = trigger.get("data").cloned().unwrap_or(Value::Null);
    json!({
        "Data": { "eventGridEvent": trigger },
        "Metadata": { "data": data, "sys": {
            "MethodName": "OrderTrigger", "UtcNow": "2025-06-14T09:30:02.4471234Z",
            "RandGuid": uuid::Uuid::new_v4().to_string() } }
    })
}

/// A handler served on an ephemeral loopback port, stopped on drop.
pub struct Handler {
    pub addr: SocketAddr,
    pub processor: Arc<Processor>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Handler {
    pub async fn start(processor: Arc<Processor>, max_body: usize) -> Handler {
        let limits = order_guard::host::Limits {
            max_body_bytes: max_body,
            ..Default::default()
        };
        Handler::start_with(processor, limits).await
    }

    pub async fn start_with(
        processor: Arc<Processor>,
        limits: order_guard::host::Limits,
    ) -> Handler {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (addr, server) = order_guard::host::bind(
            Arc::clone(&processor),
            SocketAddr::from(([127, 0, 0, 1], 0)),
            limits,
            async move {
                let _ = rx.await;
            },
            Duration::from_secs(5),
        )
        .unwrap();
        let task = tokio::spawn(server);
        Handler {
            addr,
            processor,
            stop: Some(tx),
            task: Some(task),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Signal shutdown and wait until the server has drained.
    pub async fn shutdown(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.unwrap();
        }
    }
}

/// What the handler answered.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub content_type: String,
    pub body: Value,
}

/// A request the way the host sends it (the headers of docs/host-protocol.md, "One invocation"); a
/// chunked body is streamed in `chunk`-byte pieces with no Content-Length.
pub fn host_request(
    method: &str,
    url: &str,
    body: Vec<u8>,
    chunked: Option<usize>,
) -> hyper::Request<hyper::Body> {
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(url)
        .header("Content-Type", "application/json; charset=utf-8")
        .header(
            "X-Azure-Functions-InvocationId",
            uuid::Uuid::new_v4().to_string(),
        )
        .header("X-Azure-Functions-HostVersion", "4.1037.0.0")
        .header("User-Agent", "Azure-Functions-Host/4.1037.0.0");
    let body = match chunked {
        // A streamed body: no Content-Length, Transfer-Encoding: chunked.
        Some(chunk) => {
            let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
                body.chunks(chunk).map(|c| Ok(c.to_vec())).collect();
            hyper::Body::wrap_stream(futures::stream::iter(chunks))
        }
        None => {
            req = req.header("Content-Length", body.len());
            hyper::Body::from(body)
        }
    };
    req.body(body).expect("a valid request")
}

/// Send a request the way the host does and read the JSON answer.
pub async fn send(method: &str, url: &str, body: Vec<u8>, chunked: bool) -> Answer {
    let client = hyper::Client::new();
    let req = host_request(method, url, body, chunked.then_some(7));
    let resp = client.request(req).await.expect("request");
    let status = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let bytes = hyper::body::to_bytes(resp.into_body()).await.unwrap();
    let body = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "answer is not JSON ({e}): {:?} — the host would fail or hang on it",
            String::from_utf8_lossy(&bytes)
        )
    });
    Answer {
        status,
        content_type,
        body,
    }
}

/// POST an invocation body to /OrderTrigger.
pub async fn invoke(handler: &Handler, body: &Value) -> Answer {
    send(
        "POST",
        &handler.url("/OrderTrigger"),
        serde_json::to_vec(body).unwrap(),
        false,
    )
    .await
}

/// Send `signal` (a name such as `TERM`, `STOP`, `CONT`, `KILL`) to a process
/// with the system's `kill`, failing loudly when that is not possible.
pub fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args(["-s", signal, &pid.to_string()])
        .status()
        .unwrap_or_else(|e| panic!("cannot run `kill` to send SIG{signal}: {e}"));
    assert!(status.success(), "kill -s {signal} {pid} failed: {status}");
}

/// An answer as raw bytes, for judging it the way the host does.
#[derive(Debug, Clone)]
pub struct RawAnswer {
    pub status: u16,
    pub content_type: String,
    pub bytes: Vec<u8>,
}

/// What the Functions host makes of an answer (docs/host-protocol.md, "The answer").
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// 2xx, JSON-typed, a JSON object: the invocation succeeded.
    Succeeded(Value),
    /// Non-2xx, wrong content type or unparsable body: the invocation failed
    /// and Event Grid will deliver again (the body, when JSON, for diagnosis).
    Failed { status: u16, body: Option<Value> },
    /// 2xx with an empty or `null` body: the host would hang until its
    /// function timeout. Always a test failure.
    Hang,
}

impl RawAnswer {
    /// The body as JSON, if it is.
    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.bytes).ok()
    }

    /// Judge the answer as the host does (docs/host-protocol.md, "The answer").
    pub fn verdict(&self) -> Verdict {
        let text = String::from_utf8_lossy(&self.bytes);
        if !(200..=299).contains(&self.status) {
            return Verdict::Failed {
                status: self.status,
                body: self.json(),
            };
        }
        if text.trim().is_empty() || text.trim() == "null" {
            return Verdict::Hang;
        }
        let ct = self.content_type.to_ascii_lowercase();
        let media = ct.split(';').next().unwrap_or("").trim();
        if media != "application/json" && media != "text/json" {
            return Verdict::Failed {
                status: self.status,
                body: None,
            };
        }
        match self.json() {
            Some(v @ Value::Object(_)) => Verdict::Succeeded(v),
            _ => Verdict::Failed {
                status: self.status,
                body: None,
            },
        }
    }
}

/// Send a request the way the host does, without judging or panicking:
/// connection errors and `timeout` (the harness's function timeout) come
/// back as `Err`.
pub async fn try_send(
    client: &hyper::Client<hyper::client::HttpConnector>,
    url: &str,
    body: Vec<u8>,
    chunked: bool,
    timeout: Duration,
) -> Result<RawAnswer, String> {
    let request = host_request("POST", url, body, chunked.then_some(4096));
    let exchange = async {
        let resp = client.request(request).await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let bytes = hyper::body::to_bytes(resp.into_body())
            .await
            .map_err(|e| e.to_string())?;
        Ok(RawAnswer {
            status,
            content_type,
            bytes: bytes.to_vec(),
        })
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "no answer within the harness's function timeout ({} ms)",
            timeout.as_millis()
        )),
    }
}

/// Send a POST over a raw TCP connection and read the answer while the body
/// is still being written, the way curl and the Functions host's HttpClient
/// read an early answer (a 413 sent before the whole body arrived).
///
/// The server may close, and the kernel reset, the connection while the
/// client is still writing: a failed write is expected then and ignored. What
/// counts is the answer: a complete response (head, and a body as long as its
/// `Content-Length`) is returned; no answer, or a cut-off one, is an error.
pub async fn send_reading_early_answer(
    addr: SocketAddr,
    path: &str,
    body: Vec<u8>,
    chunked: bool,
    timeout: Duration,
) -> Result<RawAnswer, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let (mut reader, mut writer) = stream.into_split();
    let framing = if chunked {
        "Transfer-Encoding: chunked".to_string()
    } else {
        format!("Content-Length: {}", body.len())
    };
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json; charset=utf-8\r\n\
         X-Azure-Functions-InvocationId: {}\r\n{framing}\r\nConnection: close\r\n\r\n",
        uuid::Uuid::new_v4()
    );
    let mut wire = head.into_bytes();
    if chunked {
        for chunk in body.chunks(4096) {
            wire.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            wire.extend_from_slice(chunk);
            wire.extend_from_slice(b"\r\n");
        }
        wire.extend_from_slice(b"0\r\n\r\n");
    } else {
        wire.extend_from_slice(&body);
    }
    // The write may fail once the server has answered and closed: expected.
    let write = tokio::spawn(async move {
        let _ = writer.write_all(&wire).await;
        writer
    });
    let read = async {
        let mut received = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) => return (received, None),
                Ok(n) => {
                    received.extend_from_slice(&buf[..n]);
                    if complete_response(&received).is_some() {
                        return (received, None);
                    }
                }
                Err(e) => return (received, Some(e)),
            }
        }
    };
    let (received, read_error) = tokio::time::timeout(timeout, read).await.map_err(|_| {
        format!(
            "no answer within the harness's function timeout ({} ms)",
            timeout.as_millis()
        )
    })?;
    write.abort();
    complete_response(&received).ok_or_else(|| {
        format!(
            "no complete answer ({} bytes received{})",
            received.len(),
            read_error
                .map(|e| format!(", then {e}"))
                .unwrap_or_default()
        )
    })
}

/// The response in `bytes`, if its head and its whole body (by
/// `Content-Length`) have arrived.
fn complete_response(bytes: &[u8]) -> Option<RawAnswer> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(head_len) = response.parse(bytes).ok()? else {
        return None;
    };
    let header = |name: &str| {
        response
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).to_string())
    };
    let length: usize = header("content-length")?.trim().parse().ok()?;
    let body = bytes.get(head_len..head_len + length)?;
    Some(RawAnswer {
        status: response.code?,
        content_type: header("content-type").unwrap_or_default(),
        bytes: body.to_vec(),
    })
}

/// The `order-guard` binary cargo built for this test run.
pub fn handler_binary() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_order-guard"))
}

/// Run `order-guard ARGS` to its end in `dir` with only `vars` set: its
/// exit status and its output (stdout, then stderr).
pub fn run_command(
    dir: &std::path::Path,
    args: &[&str],
    vars: &[(&str, &str)],
) -> (std::process::ExitStatus, String) {
    let out = std::process::Command::new(handler_binary())
        .args(args)
        .env_clear()
        .current_dir(dir)
        .envs(vars.iter().copied())
        .output()
        .expect("run order-guard");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status, text)
}

/// Environment for one handler process, as the Functions host sets it
/// (docs/host-protocol.md, "Starting the handler") plus the app settings given.
pub fn handler_env(port: u16, app_root: &std::path::Path) -> Vec<(String, String)> {
    let worker = uuid::Uuid::new_v4().to_string();
    vec![
        ("FUNCTIONS_CUSTOMHANDLER_PORT".into(), port.to_string()),
        ("FUNCTIONS_HTTPWORKER_PORT".into(), port.to_string()),
        ("FUNCTIONS_CUSTOMHANDLER_WORKER_ID".into(), worker.clone()),
        ("FUNCTIONS_HTTPWORKER_ID".into(), worker),
        (
            "FUNCTIONS_APP_ROOT_PATH".into(),
            app_root.display().to_string(),
        ),
    ]
}

/// Start `order-guard serve` with `env` (on top of a clean environment for
/// the handler's own settings), stdout and stderr appended to `log`. The
/// child is killed when dropped.
pub fn spawn_handler(
    binary: &std::path::Path,
    env: &[(String, String)],
    log: &std::path::Path,
) -> tokio::process::Child {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap_or_else(|e| panic!("cannot open handler log {}: {e}", log.display()));
    let err = out.try_clone().expect("clone log handle");
    let mut cmd = tokio::process::Command::new(binary);
    cmd.arg("serve")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true);
    for var in [
        "REDIS_URL",
        "SQL_CONNECTION_STRING",
        "FAILPOINTS",
        "GUARD_UNAVAILABLE",
        "GUARD_KEY_PREFIX",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    if let Some(root) = env.iter().find(|(k, _)| k == "FUNCTIONS_APP_ROOT_PATH") {
        cmd.current_dir(&root.1);
    }
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()))
}

/// Probe `GET /` like the host (every 25 ms, any HTTP answer means ready)
/// until the handler answers, its process exits, or `limit` passes.
pub async fn wait_ready(
    port: u16,
    child: &mut tokio::process::Child,
    limit: Duration,
) -> Result<(), String> {
    let client = hyper::Client::new();
    let url: hyper::Uri = format!("http://127.0.0.1:{port}/").parse().unwrap();
    let started = std::time::Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("the handler exited before it was ready: {status}"));
        }
        let probe = tokio::time::timeout(Duration::from_secs(2), client.get(url.clone())).await;
        if let Ok(Ok(_)) = probe {
            return Ok(());
        }
        if started.elapsed() > limit {
            return Err(format!(
                "the handler did not answer GET / on port {port} within {} s",
                limit.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
