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
use std::str::FromStr;
use std::time::{Duration, Instant};

use rust_decimal::Decimal;
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
    let mut sequenced = Vec::new();
    for (id, texts) in &copies {
        let event: Value = serde_json::from_str(texts[0]).unwrap_or_default();
        match Sequenced::of(id, &event) {
            Ok(s) => sequenced.push(s),
            Err(e) => a.findings.push(e),
        }
    }
    a.findings.extend(sequence_findings(&sequenced));
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

/// What the sequence of one announcement says, from its event's `data`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sequenced {
    pub(crate) id: String,
    /// `data.epoch` (0 when absent, as docs/outbox.md tells a consumer).
    pub(crate) epoch: i64,
    pub(crate) sequence: i64,
    pub(crate) account: String,
    pub(crate) symbol: String,
    /// The order's change to the position: its quantity, negated for a sell.
    pub(crate) change: Decimal,
    pub(crate) position_after: Decimal,
}

impl Sequenced {
    fn of(id: &str, event: &Value) -> Result<Sequenced, String> {
        let d = &event["data"];
        let text = |field: &str| {
            d[field]
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| format!("announcement {id}: no {field}: {d}"))
        };
        let number = |field: &str| {
            let t = text(field)?;
            Decimal::from_str(&t).map_err(|e| format!("announcement {id}: {field} {t:?}: {e}"))
        };
        let quantity = number("quantity")?;
        Ok(Sequenced {
            id: id.to_string(),
            epoch: match &d["epoch"] {
                Value::Null => 0,
                e => e
                    .as_i64()
                    .ok_or_else(|| format!("announcement {id}: epoch {e} is not an integer"))?,
            },
            sequence: d["sequence"]
                .as_i64()
                .ok_or_else(|| format!("announcement {id}: no sequence: {d}"))?,
            account: text("accountId")?,
            symbol: text("symbol")?,
            change: if text("side")? == "sell" {
                -quantity
            } else {
                quantity
            },
            position_after: number("positionAfter")?,
        })
    }
}

/// What the outbox promises of `(data.epoch, data.sequence)`
/// (docs/outbox.md, "Order"), checked over every distinct announcement
/// delivered (one per id: copies of an id are the same bytes, checked
/// apart): no two ids share one; and one position's announcements in that
/// order are its executions in the order they ran, each position after
/// the one before plus its change, from zero (a run's positions start
/// empty). Delivery order is not checked: packs go several at a time, and
/// a deferred or re-sent row arrives after later ones, as the docs say; a
/// consumer orders by the pair. Pure.
pub(crate) fn sequence_findings(announced: &[Sequenced]) -> Vec<String> {
    let mut findings = Vec::new();
    let mut by_sequence: BTreeMap<(i64, i64), &str> = BTreeMap::new();
    for a in announced {
        if let Some(other) = by_sequence.insert((a.epoch, a.sequence), &a.id) {
            if other != a.id {
                findings.push(format!(
                    "epoch {} sequence {} names two announcements: {other} and {}",
                    a.epoch, a.sequence, a.id
                ));
            }
        }
    }
    let mut positions: BTreeMap<(&str, &str), Vec<&Sequenced>> = BTreeMap::new();
    for a in announced {
        positions
            .entry((&a.account, &a.symbol))
            .or_default()
            .push(a);
    }
    for ((account, symbol), mut rows) in positions {
        rows.sort_by_key(|a| (a.epoch, a.sequence));
        let mut position = Decimal::ZERO;
        for a in rows {
            position += a.change;
            if a.position_after != position {
                findings.push(format!(
                    "position {account}/{symbol}: announcement {} (epoch {} sequence {}) says {} after it, its executions in that order make {position}: the order is not the execution order",
                    a.id, a.epoch, a.sequence, a.position_after
                ));
                position = a.position_after;
            }
        }
    }
    findings
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, sequence: i64, symbol: &str, change: &str, after: &str) -> Sequenced {
        Sequenced {
            id: id.into(),
            epoch: 1,
            sequence,
            account: "A".into(),
            symbol: symbol.into(),
            change: Decimal::from_str(change).unwrap(),
            position_after: Decimal::from_str(after).unwrap(),
        }
    }

    /// Two positions of one account interleaved, listed in any order (as
    /// delivered): the sequence gives each position's execution order.
    fn history() -> Vec<Sequenced> {
        vec![
            row("b2", 5, "B", "-1", "1"),
            row("a1", 1, "A", "5", "5"),
            row("b1", 2, "B", "2", "2"),
            row("a3", 7, "A", "0.5", "3.5"),
            row("a2", 3, "A", "-2", "3"),
        ]
    }

    #[test]
    fn a_history_in_execution_order_passes_whatever_the_delivery_order() {
        assert_eq!(sequence_findings(&history()), Vec::<String>::new());
        let mut reversed = history();
        reversed.reverse();
        assert_eq!(sequence_findings(&reversed), Vec::<String>::new());
        assert_eq!(sequence_findings(&[]), Vec::<String>::new());
    }

    /// Mutations the check must catch: a sequence handed out twice, and
    /// two executions of a position numbered against their order.
    #[test]
    fn a_reused_or_reordered_sequence_is_a_finding() {
        let mut reused = history();
        reused[3].sequence = 2; // a3 takes b1's number
        let found = sequence_findings(&reused);
        assert!(
            found
                .iter()
                .any(|f| f.contains("epoch 1 sequence 2 names two")),
            "{found:?}"
        );
        let mut swapped = history();
        swapped[1].sequence = 3; // a1 and a2 numbered against their order
        swapped[4].sequence = 1;
        let found = sequence_findings(&swapped);
        assert!(
            found
                .iter()
                .any(|f| f.contains("position A/A") && f.contains("not the execution order")),
            "{found:?}"
        );
        // A later epoch's numbers come after every earlier epoch's, however
        // low: a3 numbered again from 1 after a restore is still last.
        let mut restarted = history();
        restarted[3].epoch = 2;
        restarted[3].sequence = 1;
        assert_eq!(sequence_findings(&restarted), Vec::<String>::new());
        let mut behind = history();
        behind[4].epoch = 2; // a2 under a later epoch than a3, which ran after it
        let found = sequence_findings(&behind);
        assert!(
            found.iter().any(|f| f.contains("not the execution order")),
            "{found:?}"
        );
    }
}
