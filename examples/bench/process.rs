//! Cold start and peak RSS of the handler process.

use super::*;

/// Peak resident set (VmHWM) of `pid`, in MiB.
pub(crate) fn peak_rss_mib(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .context("no VmHWM line")?;
    let kib: f64 = line
        .split_whitespace()
        .nth(1)
        .context("VmHWM value")?
        .parse()?;
    Ok(kib / 1024.0)
}

pub(crate) fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Start the handler with a fresh SQLite file and time until its first
/// invocation (a new order) answers 200 `executed`. Connection attempts are
/// retried every millisecond, for at most 10 s.
pub(crate) async fn cold_start(opts: &Opts, tag: u32, i: usize) -> anyhow::Result<Duration> {
    let port = free_port()?;
    let db = opts.scratch.join(format!("cold-{i}.db"));
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let started = Instant::now();
    let mut child = Command::new(&opts.binary)
        .arg("serve")
        .env("FUNCTIONS_CUSTOMHANDLER_PORT", port.to_string())
        .env("REDIS_URL", &opts.redis_url)
        .env(
            "SQL_CONNECTION_STRING",
            format!("sqlite:{}?mode=rwc", db.display()),
        )
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", opts.binary.display()))?;
    let result = async {
        let deadline = started + Duration::from_secs(10);
        loop {
            if Instant::now() > deadline {
                bail!("no successful invocation within 10 s");
            }
            match http_connection(addr).await {
                Ok(mut sender) => {
                    let body = invocation_body(tag, i as u64);
                    match invoke(&mut sender, addr, body, "\"outcome\":\"executed\"").await {
                        Ok(()) => return Ok(started.elapsed()),
                        Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
                    }
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
            }
        }
    }
    .await;
    let _ = child.kill();
    let _ = child.wait();
    result
}
