//! The SQLite store's writer thread, seen from outside: the file it leaves
//! (WAL), the calls it skips (their callers stopped waiting) and how it
//! groups waiting calls into one commit. The behaviour every store shares
//! is in `store_conformance.rs`.
//!
//! The writer is held with a real lock: a second connection to the same
//! file takes SQLite's write lock (`BEGIN IMMEDIATE`), so the writer waits
//! in its own `BEGIN IMMEDIATE` (the busy timeout) while the test queues
//! calls behind it; releasing the lock lets it go.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::task::Context;
use std::time::Duration;

use futures::FutureExt;
use order_guard::order::{Order, OrderStatus};
use order_guard::store::{Execution, OrderStore, SqliteStore, SQLITE_MAX_GROUP};
use rusqlite::Connection;
use serde_json::json;

use common::unique_id;

/// Long enough that the writer never gives up on the test's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(60);

fn order(id: &str) -> Order {
    Order::from_data(&json!({
        "orderId": id, "accountId": unique_id("acct"), "side": "buy", "symbol": "MSFT",
        "quantity": "1", "limitPrice": "431.15", "currency": "USD"
    }))
    .unwrap()
}

async fn migrated(path: &Path) -> Arc<SqliteStore> {
    let store = SqliteStore::open(path, BUSY_TIMEOUT).unwrap();
    store.migrate().await.unwrap();
    Arc::new(store)
}

/// Another process's write, as far as SQLite can tell.
fn hold_write_lock(path: &Path) -> Connection {
    let other = Connection::open(path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    other
}

/// Poll `f` once: its call reaches the writer's queue (the store sends it
/// on the first poll) and waits there.
fn send<F: std::future::Future + Unpin>(f: &mut F) {
    let waker = futures::task::noop_waker();
    let poll = f.poll_unpin(&mut Context::from_waker(&waker));
    assert!(
        poll.is_pending(),
        "the call was answered while the writer was held"
    );
}

#[tokio::test]
async fn a_new_file_is_put_in_wal_mode() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders.db");
    let store = migrated(&path).await;
    assert_eq!(store.name(), "sqlite");
    let mode: String = Connection::open(&path)
        .unwrap()
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal", "the store must leave its file in WAL mode");
}

#[tokio::test]
async fn a_call_whose_caller_stopped_waiting_is_skipped_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders.db");
    let store = migrated(&path).await;
    let (kept, dropped) = (order(&unique_id("kept")), order(&unique_id("dropped")));

    let lock = hold_write_lock(&path);
    let mut first = store.execute(&kept, "evt-kept", "{}");
    send(&mut first);
    // Sent, then its caller gives up (a deadline, a dropped request): the
    // future and with it the answer's receiver are gone.
    let mut gone = store.execute(&dropped, "evt-dropped", "{}");
    send(&mut gone);
    drop(gone);
    lock.execute_batch("ROLLBACK").unwrap();

    assert_eq!(first.await.unwrap(), Execution::Executed);
    assert!(
        store.order(&dropped.order_id).await.unwrap().is_none(),
        "the abandoned call was run: its order is in the database"
    );
    let pressure = store.pressure();
    assert_eq!((pressure.skipped, pressure.refused), (1, 0), "{pressure:?}");
    assert_eq!(
        store.load().writer,
        Some((0, 1)),
        "load() reports the writer's counters"
    );
}

#[tokio::test]
async fn waiting_calls_share_commits_of_at_most_a_full_group() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders.db");
    let store = migrated(&path).await;
    // Enough that, whatever the first group took before the lock stopped
    // it, at least two full groups wait behind it.
    let max_group = SQLITE_MAX_GROUP;
    let orders: Vec<Order> = (0..3 * max_group + 5)
        .map(|_| order(&unique_id("grp")))
        .collect();
    let before = store.pressure();

    let lock = hold_write_lock(&path);
    let mut calls: Vec<_> = orders
        .iter()
        .map(|o| store.execute(o, "evt", "{}"))
        .collect();
    calls.iter_mut().for_each(send);
    lock.execute_batch("ROLLBACK").unwrap();

    let answers = futures::future::join_all(calls).await;
    assert!(
        answers.iter().all(|a| *a == Ok(Execution::Executed)),
        "{answers:?}"
    );
    let after = store.pressure();
    assert_eq!(after.largest_group, max_group as u64, "{after:?}");
    let commits = after.commits - before.commits;
    // The first group (1 to 64 calls), then the rest in full groups.
    let calls = orders.len() as u64;
    let least = 1 + (calls - max_group as u64).div_ceil(max_group as u64);
    let most = 1 + (calls - 1).div_ceil(max_group as u64);
    assert!(
        (least..=most).contains(&commits),
        "{calls} waiting calls took {commits} commits, expected {least} to {most}"
    );
    for o in &orders {
        let row = store.order(&o.order_id).await.unwrap();
        assert!(
            row.is_some_and(|r| r.status == OrderStatus::Executed),
            "{} not executed",
            o.order_id
        );
    }
}
