//! The handler binary and its processes.

use super::*;

/// The fault-enabled handler binary, and a sentence saying where it came from.
pub(crate) fn fault_binary() -> (PathBuf, String) {
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    if cfg!(feature = "failpoints") {
        return (
            common::handler_binary(),
            format!(
                "failpoints ({profile} handler built by this cargo run with --features failpoints)"
            ),
        );
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|t| if t.is_relative() { manifest.join(t) } else { t })
        .unwrap_or_else(|| manifest.join("target"))
        .join("chaos-bin");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(&manifest)
        .args(["build", "--features", "failpoints", "--bin", "order-guard"])
        .arg("--target-dir")
        .arg(&target);
    if profile == "release" {
        cmd.arg("--release");
    }
    println!(
        "chaos: this test was built without the `failpoints` feature, so the handler's fault \
         points are not in target/{profile}/order-guard; building a fault-enabled handler: {cmd:?}"
    );
    let status = cmd.status().unwrap_or_else(|e| {
        panic!("chaos: cannot run {cargo} to build the fault-enabled handler: {e}")
    });
    assert!(
        status.success(),
        "chaos: building the fault-enabled handler failed ({status}); refusing to run without fault points"
    );
    let bin = target.join(profile).join("order-guard");
    assert!(bin.is_file(), "chaos: {} was not built", bin.display());
    (
        bin,
        format!(
            "failpoints ({profile} handler built by the test into {})",
            target.display()
        ),
    )
}

/// Counters the supervisors and the chaos schedule keep.
#[derive(Default)]
pub(crate) struct FleetStats {
    /// SIGKILLs sent by the chaos schedule.
    pub(crate) kills: AtomicU64,
    /// Processes that aborted at a crash fault point.
    pub(crate) crashes: AtomicU64,
    /// Crashes the run may have: once spent, handlers start with their
    /// crash fault points disarmed. Fault points run on failed calls too,
    /// so without a budget the crashes would grow with the failures a
    /// store fault causes, and a slower store would meet more of them.
    pub(crate) crash_budget: AtomicU64,
    /// Processes that exited any other way (each is a finding).
    pub(crate) other_exits: AtomicU64,
    /// Starts that did not become ready (the host would count these).
    pub(crate) start_failures: AtomicU64,
    /// Handlers killed because an invocation timed out (as the host does).
    pub(crate) timeout_restarts: AtomicU64,
    pub(crate) starts: AtomicU64,
}

/// Things that must not happen; the audit fails when any were recorded.
pub(crate) type Problems = Arc<Mutex<Vec<String>>>;

pub(crate) fn problem(problems: &Problems, p: String) {
    let mut all = problems.lock().unwrap();
    if all.len() < 10_000 {
        all.push(p);
    }
}

/// A request to kill a handler; the reply comes once it is back and ready.
pub(crate) type KillRequest = oneshot::Sender<()>;

/// Keeps one handler process running: restarts it whenever it exits (as the
/// host restarts a crashed custom handler), kills it on request.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn supervise(
    slot: usize,
    port: u16,
    binary: PathBuf,
    env: Vec<(String, String)>,
    dir: PathBuf,
    mut kills: mpsc::UnboundedReceiver<KillRequest>,
    mut stop: watch::Receiver<bool>,
    stats: Arc<FleetStats>,
    problems: Problems,
    mut first_ready: Option<oneshot::Sender<()>>,
) {
    let mut incarnation = 0u32;
    let mut waiting: Vec<KillRequest> = Vec::new();
    let mut consecutive_failures = 0u32;
    let mut kills_open = true;
    loop {
        if *stop.borrow() {
            return;
        }
        incarnation += 1;
        let log = dir.join(format!("handler{slot}-{incarnation:04}.log"));
        let spent =
            stats.crashes.load(Ordering::Relaxed) >= stats.crash_budget.load(Ordering::Relaxed);
        let disarmed;
        let env_now = if spent {
            disarmed = without_crashes(&env);
            &disarmed
        } else {
            &env
        };
        let mut child = common::spawn_handler(&binary, env_now, &log);
        stats.starts.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = common::wait_ready(port, &mut child, Duration::from_secs(30)).await {
            let _ = child.start_kill();
            let status = child.wait().await;
            let tail = log_tail(&log, 5);
            // It was listening and already serving the driver when a crash
            // fault point aborted it, before the probe's answer came back.
            if crashed_at_fault_point(&status, &log) {
                stats.crashes.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            stats.start_failures.fetch_add(1, Ordering::Relaxed);
            consecutive_failures += 1;
            // The host shuts down after 3 failed starts in a short window.
            problem(
                &problems,
                format!("handler {slot} failed to start (the host counts this): {e}; log: {tail}"),
            );
            if consecutive_failures >= 20 {
                problem(
                    &problems,
                    format!("handler {slot} failed to start 20 times in a row: {e}; log: {tail}"),
                );
                return;
            }
            // The host waits a moment and starts it again.
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        consecutive_failures = 0;
        let log_text = std::fs::read_to_string(&log).unwrap_or_default();
        if !log_text.contains("fault points armed") {
            problem(
                &problems,
                format!(
                    "handler {} ignores FAILPOINTS: it was built without the `failpoints` feature; \
                     refusing to run a weaker chaos test",
                    binary.display()
                ),
            );
            let _ = child.start_kill();
            return;
        }
        if let Some(tx) = first_ready.take() {
            let _ = tx.send(());
        }
        for w in waiting.drain(..) {
            let _ = w.send(());
        }
        tokio::select! {
            status = child.wait() => {
                if crashed_at_fault_point(&status, &log) {
                    stats.crashes.fetch_add(1, Ordering::Relaxed);
                } else {
                    stats.other_exits.fetch_add(1, Ordering::Relaxed);
                    problem(&problems, format!(
                        "handler {slot} exited on its own ({status:?}); log: {}", log_tail(&log, 5)));
                }
            }
            req = kills.recv(), if kills_open => {
                match req {
                    Some(req) => {
                        let _ = child.start_kill();
                        let _ = child.wait().await;
                        stats.kills.fetch_add(1, Ordering::Relaxed);
                        waiting.push(req);
                    }
                    None => {
                        // Nobody will ask again: keep this process until stop.
                        kills_open = false;
                        tokio::select! {
                            _ = child.wait() => {}
                            _ = stop.changed() => {
                                let _ = child.start_kill();
                                let _ = child.wait().await;
                                return;
                            }
                        }
                    }
                }
            }
            _ = stop.changed() => {
                let _ = child.start_kill();
                let _ = child.wait().await;
                return;
            }
        }
    }
}

/// The crash budget of a run of `n` orders: the same for every store.
pub(crate) fn crash_budget(n: usize) -> u64 {
    (n as u64 / 30).max(4)
}

/// `env` with every crash action of `FAILPOINTS` taken out (a fault point
/// left with none is `off`); its other actions stay.
pub(crate) fn without_crashes(env: &[(String, String)]) -> Vec<(String, String)> {
    env.iter()
        .map(|(k, v)| {
            if k != "FAILPOINTS" {
                return (k.clone(), v.clone());
            }
            let points: Vec<String> = v
                .split(';')
                .filter(|p| !p.trim().is_empty())
                .map(|p| {
                    let (name, actions) = p.split_once('=').expect("FAILPOINTS is name=actions;…");
                    let kept: Vec<&str> = actions
                        .split("->")
                        .filter(|a| !a.contains("return(crash)"))
                        .collect();
                    let kept = if kept.is_empty() {
                        "off".to_string()
                    } else {
                        kept.join("->")
                    };
                    format!("{}={kept}", name.trim())
                })
                .collect();
            (k.clone(), points.join(";"))
        })
        .collect()
}

/// Did the process abort at a crash fault point (SIGABRT, and it said so)?
pub(crate) fn crashed_at_fault_point(
    status: &std::io::Result<std::process::ExitStatus>,
    log: &Path,
) -> bool {
    use std::os::unix::process::ExitStatusExt;
    matches!(status, Ok(s) if s.signal() == Some(6))
        && log_text_now(log).contains("fault point")
        && log_text_now(log).contains(": crash")
}

pub(crate) fn log_text_now(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

pub(crate) fn log_tail(log: &Path, lines: usize) -> String {
    let text = log_text_now(log);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_crashes_keeps_every_other_fault() {
        let env = vec![
            ("RUST_LOG".to_string(), "info".to_string()),
            (
                "FAILPOINTS".to_string(),
                "a=0.8%return(crash)->1%return(error);b=1%return(crash);c=2%return(503)"
                    .to_string(),
            ),
        ];
        let out = without_crashes(&env);
        assert_eq!(out[0], env[0]);
        assert_eq!(out[1].1, "a=1%return(error);b=off;c=2%return(503)");
    }
}
