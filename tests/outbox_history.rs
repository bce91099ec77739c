//! What a destination set late sends: the outbox's history through the
//! binary, on a real SQLite file and Azurite's queue service. With no
//! destination `serve` keeps the table to the retention, so a destination
//! set later sends only the rows that fell due within it.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use order_guard::order::Order;
use order_guard::store::{message_id, Execution, OrderStore};
use serde_json::{json, Value};

use common::azurite::Azurite;
use common::unique_id;

fn order(id: &str, account: &str) -> Order {
    Order::from_data(&json!({
        "orderId": id, "accountId": account, "side": "buy", "symbol": "MSFT", "quantity": "1"
    }))
    .unwrap()
}

async fn execute_all(store: &Arc<dyn OrderStore>, orders: &[Order]) {
    for o in orders {
        assert_eq!(
            store.execute(o, "e", "{}").await.unwrap(),
            Execution::Executed
        );
    }
}

/// `order-guard ARGS` on this file, sending (when a queue is named) to
/// Azurite's `queue`, run to its end.
fn cli(dir: &Path, azurite: &Azurite, queue: &str, args: &[&str]) -> std::process::Output {
    cli_with(dir, azurite, queue, args, &[])
}

/// [`cli`] with settings of the operator's shell besides.
fn cli_with(
    dir: &Path,
    azurite: &Azurite,
    queue: &str,
    args: &[&str],
    settings: &[(&str, &str)],
) -> std::process::Output {
    std::process::Command::new(common::handler_binary())
        .args(args)
        .env(
            "SQL_CONNECTION_STRING",
            format!("sqlite:{}", dir.join("orders.db").display()),
        )
        .env("OUTBOX_STORAGE", azurite.queue_connection_string())
        .env("OUTBOX_QUEUE", queue)
        .env("OUTBOX_MESSAGE_ENCODING", "none")
        .env_remove("REDIS_URL")
        .env_remove("OUTBOX_TOPIC_ENDPOINT")
        .env_remove("FUNCTIONS_CUSTOMHANDLER_PORT")
        .envs(settings.iter().copied())
        .output()
        .unwrap()
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The events on the queue's messages (each a JSON array of CloudEvents).
fn events(texts: &[String]) -> Vec<Value> {
    texts
        .iter()
        .flat_map(|t| match serde_json::from_str(t) {
            Ok(Value::Array(events)) => events,
            other => panic!("a message is a JSON array of events: {other:?} in {t}"),
        })
        .collect()
}

fn ids(events: &[Value]) -> BTreeSet<String> {
    events
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect()
}

/// The order ids of the file's outbox rows, in sequence order.
fn outbox_orders(dir: &Path) -> Vec<String> {
    let conn = rusqlite::Connection::open(dir.join("orders.db")).unwrap();
    let mut select = conn
        .prepare("SELECT OrderId FROM Outbox ORDER BY Seq")
        .unwrap();
    let orders = select
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    orders
}

/// Make the announcements of `orders` due since `days` days ago, as if
/// they had waited that long with nothing to send them.
fn backdate_due(dir: &Path, orders: &[Order], days: u32) {
    let conn = rusqlite::Connection::open(dir.join("orders.db")).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    for o in orders {
        let changed = conn
            .execute(
                "UPDATE Outbox SET NextAttemptAt = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?2)
                  WHERE OrderId = ?1",
                rusqlite::params![o.order_id, format!("-{days} days")],
            )
            .unwrap();
        assert_eq!(changed, 1);
    }
}

/// With no destination, `serve` runs the retention all the same: the
/// rows due for longer than `OUTBOX_RETENTION_HOURS` and never sent are
/// deleted (it says so), the others kept; a destination set afterwards
/// sends those only, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_destination_serve_keeps_the_outbox_to_the_retention() {
    let azurite = Azurite::start_queue();
    azurite.create_queue("set-later").await;
    let (store, dir) = common::sqlite_store().await;
    let store: Arc<dyn OrderStore> = store;
    let account = unique_id("acct");
    let old: Vec<Order> = (0..3).map(|_| order(&unique_id("old"), &account)).collect();
    let recent: Vec<Order> = (0..2).map(|_| order(&unique_id("new"), &account)).collect();
    execute_all(&store, &old).await;
    execute_all(&store, &recent).await;
    backdate_due(dir.path(), &old, 2);
    drop(store);

    let port = common::free_port();
    let mut env = common::handler_env(port, dir.path());
    env.extend(
        [
            ("RUST_LOG", "info".to_string()),
            (
                "SQL_CONNECTION_STRING",
                format!("sqlite:{}", dir.path().join("orders.db").display()),
            ),
            ("OUTBOX_RETENTION_HOURS", "24".into()),
        ]
        .map(|(k, v)| (k.to_string(), v)),
    );
    let log = dir.path().join("serve.log");
    let mut child = common::spawn_handler(&common::handler_binary(), &env, &log);
    let log_text = || String::from_utf8_lossy(&std::fs::read(&log).unwrap()).into_owned();
    if let Err(e) = common::wait_ready(port, &mut child, Duration::from_secs(30)).await {
        panic!("{e}; log:\n{}", log_text());
    }
    // The purge runs at start and says what it deleted (bounded wait).
    let started = Instant::now();
    while !log_text().contains("outbox: 3 announcements past the retention (24 h) deleted") {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no purge; log:\n{}",
            log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        log_text().contains("those waiting more than OUTBOX_RETENTION_HOURS (24 h) are deleted"),
        "{}",
        log_text()
    );
    let want: Vec<String> = recent.iter().map(|o| o.order_id.clone()).collect();
    assert_eq!(outbox_orders(dir.path()), want, "the recent rows kept");
    child.kill().await.unwrap();

    // A destination set now: what fell due within the retention, once.
    let out = cli(
        dir.path(),
        &azurite,
        "set-later",
        &["outbox", "dispatch", "--yes"],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("2 announcements dispatched"),
        "{}",
        text(&out)
    );
    let sent = events(&azurite.drain_queue("set-later", false).await);
    assert_eq!(sent.len(), 2, "{sent:#?}");
    assert_eq!(
        ids(&sent),
        recent.iter().map(|o| message_id(&o.order_id)).collect()
    );
}

/// `outbox backfill --since`: says how many executed orders have no
/// announcement and where they would go, and writes nothing, unless
/// `--yes`; then writes each once (a second run writes none), and the
/// destination gets them with their own ids, the position after each and
/// sequences above the announcements before them. A window longer than the
/// retention is refused, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_announces_executions_without_one_once_and_only_when_told_yes() {
    let azurite = Azurite::start_queue();
    azurite.create_queue("backfilled").await;
    let (store, dir) = common::sqlite_store().await;
    let store: Arc<dyn OrderStore> = store;
    let account = unique_id("acct");
    let orders: Vec<Order> = (0..3).map(|_| order(&unique_id("ord"), &account)).collect();
    execute_all(&store, &orders).await;
    // The first and the last executed by an earlier version: no row.
    let conn = rusqlite::Connection::open(dir.path().join("orders.db")).unwrap();
    for o in [&orders[0], &orders[2]] {
        let n = conn
            .execute("DELETE FROM Outbox WHERE OrderId = ?1", [&o.order_id])
            .unwrap();
        assert_eq!(n, 1);
    }
    let backfill = |args: &[&str]| {
        let mut all = vec!["outbox", "backfill"];
        all.extend_from_slice(args);
        cli(dir.path(), &azurite, "backfilled", &all)
    };

    let out = backfill(&["--since", "1h"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    for part in ["would announce 2 orders", "queue backfilled", "--yes"] {
        assert!(text(&out).contains(part), "{part:?} not in: {}", text(&out));
    }
    assert_eq!(outbox_orders(dir.path()), [orders[1].order_id.clone()]);

    let out = backfill(&["--since", "30days", "--yes"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("more than OUTBOX_RETENTION_HOURS (168 h)"),
        "{}",
        text(&out)
    );

    let out = backfill(&["--since", "1h", "--yes"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("2 announcements written"),
        "{}",
        text(&out)
    );
    let out = backfill(&["--since", "1h", "--yes"]);
    assert!(
        text(&out).contains("0 announcements written"),
        "{}",
        text(&out)
    );

    let out = cli(
        dir.path(),
        &azurite,
        "backfilled",
        &["outbox", "dispatch", "--yes"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let sent = events(&azurite.drain_queue("backfilled", false).await);
    assert_eq!(sent.len(), 3, "{sent:#?}");
    let of = |o: &Order| {
        sent.iter()
            .find(|e| e["id"] == message_id(&o.order_id).as_str())
            .unwrap_or_else(|| panic!("{} not sent: {sent:#?}", o.order_id))
    };
    let seq = |o: &Order| of(o)["data"]["sequence"].as_i64().unwrap();
    for (o, after) in orders.iter().zip(["1", "2", "3"]) {
        assert_eq!(of(o)["data"]["positionAfter"], after, "{}", o.order_id);
    }
    assert!(
        seq(&orders[1]) < seq(&orders[0]) && seq(&orders[0]) < seq(&orders[2]),
        "new sequences, above the one before, in execution order"
    );
}

/// The store remembers what its retention purged, and `outbox backfill`
/// never reaches back to it, whatever retention the operator's shell
/// names: an order executed then may have had its announcement sent and
/// deleted, and would be announced again, same id, new sequence. Its
/// refusal names the watermark; a window after it is backfilled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_never_reaches_back_to_what_the_store_purged_whatever_the_shell_says() {
    let azurite = Azurite::start_queue();
    azurite.create_queue("backfilled").await;
    let (store, dir) = common::sqlite_store().await;
    let store: Arc<dyn OrderStore> = store;
    let account = unique_id("acct");
    let orders: Vec<Order> = (0..3).map(|_| order(&unique_id("ord"), &account)).collect();
    execute_all(&store, &orders).await;
    // The first was executed 3 h ago, announced and sent 8 days ago (as
    // far as the rows say), so a week's retention deletes its row; the
    // second was executed by an earlier version: no row.
    let conn = rusqlite::Connection::open(dir.path().join("orders.db")).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    let three_hours_ago = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-3 hours')";
    for table in ["Orders", "Outbox"] {
        conn.execute(
            &format!("UPDATE {table} SET ExecutedAt = {three_hours_ago} WHERE OrderId = ?1"),
            [&orders[0].order_id],
        )
        .unwrap();
    }
    conn.execute(
        "UPDATE Outbox SET DispatchedAt = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-8 days')
          WHERE OrderId = ?1",
        [&orders[0].order_id],
    )
    .unwrap();
    conn.execute(
        "DELETE FROM Outbox WHERE OrderId = ?1",
        [&orders[1].order_id],
    )
    .unwrap();
    let week = Duration::from_secs(7 * 24 * 3600);
    assert_eq!(
        store
            .purge_announced(week, 500, order_guard::store::Expired::Sent)
            .await
            .unwrap(),
        1
    );
    let through: String = conn
        .query_row("SELECT ExecutedThrough FROM OutboxPurge", [], |r| r.get(0))
        .unwrap();

    // The operator's shell keeps a year, production a week: the store's
    // watermark decides.
    let backfill = |since: &str| {
        cli_with(
            dir.path(),
            &azurite,
            "backfilled",
            &["outbox", "backfill", "--since", since, "--yes"],
            &[("OUTBOX_RETENTION_HOURS", "8760")],
        )
    };
    let out = backfill("5h");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("purge watermark {through}")),
        "{}",
        text(&out)
    );
    let listed = cli(dir.path(), &azurite, "backfilled", &["outbox", "list"]);
    assert!(
        text(&listed).contains(&format!("purged through executions of {through}")),
        "{}",
        text(&listed)
    );
    assert!(
        !outbox_orders(dir.path()).contains(&orders[0].order_id),
        "the purged execution was announced again"
    );

    let out = backfill("1h");
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("1 announcements written"),
        "{}",
        text(&out)
    );
    assert!(outbox_orders(dir.path()).contains(&orders[1].order_id));
}
