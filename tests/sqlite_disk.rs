//! The SQLite store when its disk goes away and comes back, as a network
//! volume does (Azure Files under a Functions app): every call fails as
//! transient (answered `retry`; an open too, which a start waits out), and
//! the same store serves again on its open handle once the disk is back,
//! its file whole. (Here the calls fail as they begin; the disk gone in
//! the middle of a group is `store::sqlite::writer::tests`'.)
//!
//! The disk is taken away by the `failpoints` build's fault VFS
//! (`order_guard::faults::disk`): every SQLite file operation of this
//! process fails while a given file exists. It is the process's default
//! VFS once armed, so this binary holds one test.
#![cfg(feature = "failpoints")]

mod common;

use std::time::Duration;

use order_guard::order::{Order, OrderStatus};
use order_guard::store::{Execution, OrderStore, SqliteStore, StoreError};
use rusqlite::Connection;
use serde_json::json;

use common::unique_id;

fn order(id: &str) -> Order {
    Order::from_data(&json!({
        "orderId": id, "accountId": unique_id("acct"), "side": "buy", "symbol": "MSFT",
        "quantity": "1", "limitPrice": "431.15", "currency": "USD"
    }))
    .unwrap()
}

#[tokio::test]
async fn calls_fail_as_transient_while_the_disk_is_away_and_the_same_store_serves_when_it_is_back()
{
    let dir = tempfile::tempdir().unwrap();
    let away = dir.path().join("disk-away");
    order_guard::faults::disk::arm(away.clone(), true).unwrap();
    let path = dir.path().join("orders.db");
    let store = SqliteStore::open(&path, Duration::from_secs(5)).unwrap();
    store.migrate().await.unwrap();
    let (before, during) = (order(&unique_id("before")), order(&unique_id("during")));
    assert_eq!(
        store.execute(&before, "evt-before", "{}").await.unwrap(),
        Execution::Executed
    );

    std::fs::write(&away, b"").unwrap();
    let failed = store.execute(&during, "evt-during", "{}").await;
    assert!(
        matches!(failed, Err(StoreError::Transient(_))),
        "an execution while the disk is away must fail as transient, got {failed:?}"
    );
    let read = store.order(&before.order_id).await;
    assert!(
        matches!(read, Err(StoreError::Transient(_))),
        "a read while the disk is away must fail as transient, got {read:?}"
    );
    // A handler starting now: its open is waited out, not a failed start.
    let opened = SqliteStore::open(&path, Duration::from_secs(5)).map(|_| ());
    assert!(
        matches!(opened, Err(StoreError::Transient(_))),
        "opening while the disk is away must fail as transient, got {opened:?}"
    );

    std::fs::remove_file(&away).unwrap();
    assert_eq!(
        store.execute(&during, "evt-during", "{}").await.unwrap(),
        Execution::Executed,
        "the same store executes again once the disk is back"
    );
    assert_eq!(
        store.execute(&before, "evt-before", "{}").await.unwrap(),
        Execution::AlreadyDone
    );

    // The file is whole, and holds each order once, executed.
    let check = Connection::open(&path).unwrap();
    let integrity: String = check
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");
    for o in [&before, &during] {
        let record = store.order(&o.order_id).await.unwrap().unwrap();
        assert_eq!(record.status, OrderStatus::Executed, "{}", o.order_id);
    }
    let rows: i64 = check
        .query_row("SELECT COUNT(*) FROM Orders", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 2);
}
