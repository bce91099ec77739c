//! The outbox under chaos: every handler dispatches to a real
//! Azure Queue Storage API (Azurite's queue service) through a proxy the
//! schedule cuts (the destination down), with the send answering 500, 503
//! or 413, or slow, and dispatchers killed between send and mark (fault
//! points `outbox_send`, `outbox_after_send`). Once the faults end (the
//! handlers stopped, the dead letters replayed), an operator's `outbox
//! retry` and `outbox dispatch` send what is left, timed; then the queue is
//! read whole and audited against the tables.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use serde_json::Value;

use super::audit::Tables;

/// What the queue held, judged against the tables.
#[derive(Debug, Default)]
pub(crate) struct AnnouncementAudit {
    pub(crate) messages: usize,
    pub(crate) distinct: usize,
    /// Copies beyond the first of an id (at least once: expected, counted).
    pub(crate) extra_copies: usize,
    pub(crate) findings: Vec<String>,
}

/// Each executed order announced at least once, every copy with its id
/// and the same bytes (whichever pack it came in), nothing announced that
/// did not execute.
pub(crate) fn audit_announcements(tables: &Tables, texts: &[String]) -> AnnouncementAudit {
    let mut a = AnnouncementAudit {
        messages: texts.len(),
        ..AnnouncementAudit::default()
    };
    let executed: HashMap<String, (&String, &super::audit::OrderRow)> = tables
        .orders
        .iter()
        .filter(|(_, row)| row.0 == "Executed")
        .map(|(id, row)| (order_guard::store::message_id(id), (id, row)))
        .collect();
    // Each message is a pack: a JSON array of events, each kept as its
    // bytes, so that copies of one id sent in different packs compare.
    let mut copies: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for t in texts {
        match serde_json::from_str::<Vec<&RawValue>>(t) {
            Ok(events) => {
                for e in events {
                    let id = serde_json::from_str::<Value>(e.get())
                        .ok()
                        .and_then(|v| v["id"].as_str().map(str::to_string))
                        .unwrap_or_default();
                    copies.entry(id).or_default().push(e.get());
                }
            }
            Err(e) => a.findings.push(format!(
                "a message is not a JSON array of events ({e}): {t:.200}"
            )),
        }
    }
    a.distinct = copies.len();
    for (id, texts) in &copies {
        a.extra_copies += texts.len() - 1;
        if texts.iter().any(|t| *t != texts[0]) {
            a.findings
                .push(format!("announcement {id}: copies differ: {texts:?}"));
        }
        match executed.get(id) {
            None => a.findings.push(format!(
                "announcement {id} of no executed order: {:.300}",
                texts[0]
            )),
            Some((order_id, row)) => {
                // The facts are the row's: order, account, symbol, side.
                let e: Value = serde_json::from_str(texts[0]).unwrap_or_default();
                let d = &e["data"];
                let facts = [
                    ("orderId", order_id.as_str()),
                    ("accountId", row.1.as_str()),
                    ("symbol", row.2.as_str()),
                    ("side", row.3.as_str()),
                ];
                for (field, want) in facts {
                    if d[field].as_str() != Some(want) {
                        a.findings.push(format!(
                            "announcement {id}: {field} {} where the row says {want:?}",
                            d[field]
                        ));
                    }
                }
            }
        }
    }
    for (id, (order_id, _)) in &executed {
        if !copies.contains_key(id) {
            a.findings.push(format!(
                "order {order_id} executed and never announced ({id})"
            ));
        }
    }
    a
}

/// `order-guard <args>` with the handlers' settings but no fault points
/// (the operator's commands are not under test here).
fn outbox_command(
    binary: &Path,
    env: &[(String, String)],
    app_root: &Path,
    args: &[&str],
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(binary);
    cmd.args(args)
        .kill_on_drop(true)
        .current_dir(app_root)
        .env_remove("FAILPOINTS")
        .env("RUST_LOG", "warn");
    for (k, v) in env.iter().filter(|(k, _)| k != "FAILPOINTS") {
        cmd.env(k, v);
    }
    cmd
}

/// With the handlers still running and the faults over: how long their
/// own dispatchers take to send everything but what the destination
/// refused for good (parked, left for the operator), polled through
/// `outbox list` (bounded by `bound`). Leases of killed dispatchers run
/// out meanwhile: nothing is forced.
pub(crate) async fn wait_self_dispatched(
    binary: &Path,
    env: &[(String, String)],
    app_root: &Path,
    bound: Duration,
) -> Duration {
    let started = Instant::now();
    loop {
        let out = outbox_command(binary, env, app_root, &["outbox", "list"])
            .output()
            .await
            .expect("cannot run order-guard outbox list");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let field = |name: &str| -> Option<u64> {
            text.split_whitespace()
                .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                .and_then(|v| v.parse().ok())
        };
        if let (Some(waiting), Some(parked)) = (field("undispatched"), field("parked")) {
            if waiting == parked {
                return started.elapsed();
            }
        }
        assert!(
            started.elapsed() < bound,
            "the serving dispatchers left announcements waiting {} s after the faults ended:\n{text}{}",
            bound.as_secs(),
            String::from_utf8_lossy(&out.stderr)
        );
        // Polling the table; the dispatchers' own pace is what is measured.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The operator's runbook once the faults are over: `outbox retry` (what
/// a 413 parked), then `outbox dispatch` until `outbox list` shows nothing
/// waiting (leases of killed dispatchers run out meanwhile). Answers how
/// long that took and how many it sent; a panic past `bound`.
pub(crate) async fn dispatch_until_done(
    binary: &Path,
    env: &[(String, String)],
    app_root: &Path,
    bound: Duration,
) -> (Duration, u64) {
    let started = Instant::now();
    let run = |args: &'static [&'static str]| {
        let mut cmd = outbox_command(binary, env, app_root, args);
        async move {
            let out = cmd.output().await.expect("cannot run order-guard outbox");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(out.status.success(), "order-guard {args:?} failed: {text}");
            text
        }
    };
    run(&["outbox", "retry"]).await;
    let mut sent = 0;
    loop {
        let out = run(&["outbox", "dispatch", "--yes"]).await;
        sent += out
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        let list = run(&["outbox", "list"]).await;
        if list.contains("undispatched=0 ") {
            return (started.elapsed(), sent);
        }
        assert!(
            started.elapsed() < bound,
            "announcements still waiting {} s after the faults ended:\n{list}",
            bound.as_secs()
        );
        // Waiting out the lease of a killed dispatcher: its end is a time.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
