//! The processor's outcome table with real components: a real `redis-server`,
//! real SQLite files. Every order executed exactly once in effect, none lost.

mod common;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use order_guard::guard::{GuardSettings, IdempotencyGuard};
use order_guard::order::{Order, OrderStatus};
use order_guard::processor::{GuardPolicy, OutcomeKind, Processor, ProcessorSettings};
use order_guard::store::{OrderStore, SqliteStore};
use rust_decimal::Decimal;
use serde_json::{json, Value};

use common::{eg_event, order_data, unique_id, RedisServer};

fn dec(s: &str) -> Decimal {
    Decimal::from_str(s).unwrap()
}

fn redis_settings() -> GuardSettings {
    GuardSettings::default()
}

/// A processor on a fresh test Redis and a fresh SQLite file (kept by the dir).
async fn with_redis() -> (
    Arc<Processor>,
    Arc<SqliteStore>,
    RedisServer,
    tempfile::TempDir,
) {
    let server = RedisServer::start();
    let (store, dir) = common::sqlite_store().await;
    let guard = common::redis_guard(&server, redis_settings());
    (common::processor(guard, store.clone()), store, server, dir)
}

/// 64 concurrent deliveries of one order; redeliver every `in_progress` the
/// way Event Grid would until it is answered.
async fn deliver_concurrently(p: &Arc<Processor>, event: &Value, n: usize) -> Vec<OutcomeKind> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (p, e) = (Arc::clone(p), event.clone());
            tokio::spawn(async move {
                for _ in 0..200 {
                    let o = p.process_event(&e).await;
                    if !o.outcome.needs_redelivery() {
                        return o.outcome;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                panic!("delivery never settled")
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

fn count(outcomes: &[OutcomeKind], kind: OutcomeKind) -> usize {
    outcomes.iter().filter(|o| **o == kind).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_deliveries_execute_once_with_redis() {
    let (p, store, server, _dir) = with_redis().await;
    let account = unique_id("acct");
    let id = unique_id("ord");
    let event = eg_event(order_data(&id, "buy", "MSFT", "25", &account));
    let outcomes = deliver_concurrently(&p, &event, 64).await;
    assert_eq!(count(&outcomes, OutcomeKind::Executed), 1, "{outcomes:?}");
    assert_eq!(count(&outcomes, OutcomeKind::Duplicate), 63, "{outcomes:?}");
    assert_eq!(
        store.position(&account, "MSFT").await.unwrap(),
        Some(dec("25"))
    );
    let row = store.order(&id).await.unwrap().unwrap();
    assert_eq!(row.status, OrderStatus::Executed);
    assert_eq!(
        server.get(&format!("orden:{id}")).as_deref(),
        Some("COMPLETADA")
    );
    assert_eq!(p.counters().executed, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_deliveries_execute_once_with_memory_guard() {
    let (store, _dir) = common::sqlite_store().await;
    let p = common::processor(common::memory_guard(), store.clone());
    let account = unique_id("acct");
    let event = eg_event(order_data(
        &unique_id("ord"),
        "sell",
        "MSFT",
        "2.5",
        &account,
    ));
    let outcomes = deliver_concurrently(&p, &event, 64).await;
    assert_eq!(count(&outcomes, OutcomeKind::Executed), 1, "{outcomes:?}");
    assert_eq!(
        store.position(&account, "MSFT").await.unwrap(),
        Some(dec("-2.5"))
    );
}

#[tokio::test]
async fn duplicates_after_completion_are_answered_by_the_guard_alone() {
    let (p, store, _server, dir) = with_redis().await;
    let account = unique_id("acct");
    let id = unique_id("ord");
    let data = order_data(&id, "buy", "MSFT", "10", &account);
    assert_eq!(
        p.process_event(&eg_event(data.clone())).await.outcome,
        OutcomeKind::Executed
    );
    // Hide the orders table: a duplicate must not need the store.
    let rusqlite = rusqlite::Connection::open(dir.path().join("orders.db")).unwrap();
    rusqlite
        .execute_batch("ALTER TABLE Orders RENAME TO OrdersAway")
        .unwrap();
    // Same order, other formatting and key order, other event id.
    let same = json!({"quantity": "10.000", "symbol": "msft", "side": "BUY", "accountId": account,
                      "orderId": id, "limitPrice": "431.150", "currency": "usd",
                      "placedAt": "2025-06-14T09:30:02.118Z"});
    let o = p.process_event(&eg_event(same)).await;
    assert_eq!(o.outcome, OutcomeKind::Duplicate, "{o:?}");
    assert_eq!(o.guard, "redis");
    rusqlite
        .execute_batch("ALTER TABLE OrdersAway RENAME TO Orders")
        .unwrap();
    assert_eq!(
        store.position(&account, "MSFT").await.unwrap(),
        Some(dec("10"))
    );
}

#[tokio::test]
async fn a_different_order_reusing_an_id_is_a_stored_conflict() {
    let (p, store, server, _dir) = with_redis().await;
    let account = unique_id("acct");
    let id = unique_id("ord");
    let first = order_data(&id, "buy", "MSFT", "10", &account);
    assert_eq!(
        p.process_event(&eg_event(first.clone())).await.outcome,
        OutcomeKind::Executed
    );
    let changed = order_data(&id, "buy", "MSFT", "11", &account);
    let o = p.process_event(&eg_event(changed.clone())).await;
    assert_eq!(o.outcome, OutcomeKind::Conflict);
    assert!(o.reason.unwrap().contains("different order"));
    // Also when the guard has forgotten (flushed): the unique index decides.
    server.cmd(&["FLUSHALL"]);
    let o = p.process_event(&eg_event(changed)).await;
    assert_eq!(o.outcome, OutcomeKind::Conflict);
    let rows = store.rejections(Some(&id)).await.unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    let fp1 = Order::from_data(&first).unwrap().fingerprint().to_string();
    for r in &rows {
        assert_eq!(r.kind, "conflict");
        assert_eq!(r.existing_fingerprint.as_deref(), Some(fp1.as_str()));
        assert!(r.raw_event.contains("\"quantity\":11"));
    }
    assert_eq!(
        store.position(&account, "MSFT").await.unwrap(),
        Some(dec("10"))
    );
    // The conflicting delivery left no reservation behind.
    assert_eq!(server.get(&format!("orden:{id}")), None);
}

#[tokio::test]
async fn poison_events_are_stored_with_their_reason() {
    let (store, _dir) = common::sqlite_store().await;
    let p = common::processor(common::memory_guard(), store.clone());
    let id = unique_id("ord");
    let mut data = order_data(&id, "hold", "MSFT", "1", "a");
    let o = p.process_event(&eg_event(data.clone())).await;
    assert_eq!(o.outcome, OutcomeKind::Rejected);
    assert!(o.reason.as_deref().unwrap().contains("side must be"));
    data["side"] = json!("buy");
    data["quantity"] = json!(0);
    let o = p.process_event(&eg_event(data)).await;
    assert_eq!(o.outcome, OutcomeKind::Rejected);
    let rows = store.rejections(Some(&id)).await.unwrap();
    assert_eq!(rows.len(), 2);
    assert!(rows[0].reason.contains("side must be \"buy\" or \"sell\""));
    assert!(rows[1].reason.contains("quantity must be greater than 0"));
    assert!(
        store.order(&id).await.unwrap().is_none(),
        "poison never becomes an order"
    );
    // A trigger value that is no event at all is kept too.
    let r = p.process_trigger(json!(42)).await;
    assert_eq!(r.outcomes[0].outcome, OutcomeKind::Rejected);
    let rows = store.rejections(None).await.unwrap();
    assert!(rows
        .iter()
        .any(|r| r.raw_event == "42" && r.reason.contains("got a number")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_down_still_executes_exactly_once_through_the_unique_index() {
    let (p, store, mut server, _dir) = with_redis().await;
    server.stop();
    let account = unique_id("acct");
    let event = eg_event(order_data(&unique_id("ord"), "buy", "MSFT", "7", &account));
    let outcomes = deliver_concurrently(&p, &event, 32).await;
    assert_eq!(count(&outcomes, OutcomeKind::Executed), 1, "{outcomes:?}");
    assert_eq!(count(&outcomes, OutcomeKind::Duplicate), 31, "{outcomes:?}");
    assert_eq!(
        store.position(&account, "MSFT").await.unwrap(),
        Some(dec("7"))
    );
    assert!(p.counters().guard_unavailable >= 32);
}

#[tokio::test]
async fn redis_down_with_retry_policy_asks_for_redelivery() {
    let mut server = RedisServer::start();
    let (store, _dir) = common::sqlite_store().await;
    let guard = common::redis_guard(&server, redis_settings());
    let settings = ProcessorSettings {
        on_guard_unavailable: GuardPolicy::Retry,
        ..ProcessorSettings::default()
    };
    let p = Processor::new(guard, store.clone(), settings);
    server.stop();
    let id = unique_id("ord");
    let o = p
        .process_event(&eg_event(order_data(&id, "buy", "X", "1", "a")))
        .await;
    assert_eq!(o.outcome, OutcomeKind::Retry);
    assert!(o.reason.unwrap().contains("GUARD_UNAVAILABLE=retry"));
    assert!(store.order(&id).await.unwrap().is_none());
}

#[tokio::test]
async fn a_reservation_held_by_another_owner_is_in_progress_and_untouched() {
    let (p, store, server, _dir) = with_redis().await;
    let id = unique_id("ord");
    server.cmd(&[
        "SET",
        &format!("orden:{id}"),
        "PROCESANDO:other-worker",
        "EX",
        "300",
    ]);
    let o = p
        .process_event(&eg_event(order_data(&id, "buy", "X", "1", "a")))
        .await;
    assert_eq!(o.outcome, OutcomeKind::InProgress);
    assert!(store.order(&id).await.unwrap().is_none());
    assert_eq!(
        server.get(&format!("orden:{id}")).as_deref(),
        Some("PROCESANDO:other-worker")
    );
    // The other worker dies; its key expires (simulated by deleting it).
    server.cmd(&["DEL", &format!("orden:{id}")]);
    let o = p
        .process_event(&eg_event(order_data(&id, "buy", "X", "1", "a")))
        .await;
    assert_eq!(o.outcome, OutcomeKind::Executed);
}

#[tokio::test]
async fn a_row_left_received_by_a_crashed_worker_is_resumed_once() {
    let (p, store, server, _dir) = with_redis().await;
    let account = unique_id("acct");
    let id = unique_id("ord");
    let data = order_data(&id, "buy", "X", "4", &account);
    // A worker accepted the order and died before executing it; its
    // reservation has expired since.
    store
        .accept(&Order::from_data(&data).unwrap(), "e0")
        .await
        .unwrap();
    let o = p.process_event(&eg_event(data.clone())).await;
    assert_eq!(o.outcome, OutcomeKind::Executed);
    let row = store.order(&id).await.unwrap().unwrap();
    assert_eq!((row.status, row.attempts), (OrderStatus::Executed, 2));
    assert_eq!(store.position(&account, "X").await.unwrap(), Some(dec("4")));
    // The guard is lost after completion (failover, flush): the store still says duplicate.
    server.cmd(&["FLUSHALL"]);
    assert_eq!(
        p.process_event(&eg_event(data)).await.outcome,
        OutcomeKind::Duplicate
    );
    assert_eq!(
        server.get(&format!("orden:{id}")).as_deref(),
        Some("COMPLETADA"),
        "guard refreshed"
    );
    assert_eq!(store.position(&account, "X").await.unwrap(), Some(dec("4")));
}

#[tokio::test]
async fn a_store_failure_answers_retry_and_releases_the_reservation() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders.db");
    let store = Arc::new(SqliteStore::open(&path, Duration::from_millis(100)).unwrap());
    store.migrate().await.unwrap();
    let guard = common::redis_guard(&server, redis_settings());
    let p = common::processor(guard.clone() as Arc<dyn IdempotencyGuard>, store.clone());
    // Another process holds the database's write lock.
    let blocker = rusqlite::Connection::open(&path).unwrap();
    blocker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let id = unique_id("ord");
    let data = order_data(&id, "buy", "X", "1", "a");
    let o = p.process_event(&eg_event(data.clone())).await;
    assert_eq!(o.outcome, OutcomeKind::Retry, "{o:?}");
    assert!(o.reason.unwrap().contains("transient"));
    assert_eq!(
        server.get(&format!("orden:{id}")),
        None,
        "reservation released for the retry"
    );
    blocker.execute_batch("ROLLBACK").unwrap();
    assert_eq!(
        p.process_event(&eg_event(data)).await.outcome,
        OutcomeKind::Executed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_processors_sharing_redis_and_a_file_execute_once() {
    // Two handler instances: separate guards and store connections, shared state.
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders.db");
    let mk = || async {
        let s = Arc::new(SqliteStore::open(&path, Duration::from_secs(5)).unwrap());
        s.migrate().await.unwrap();
        common::processor(common::redis_guard(&server, redis_settings()), s)
    };
    let (a, b) = (mk().await, mk().await);
    let account = unique_id("acct");
    let events: Vec<Value> = (0..20)
        .map(|i| {
            eg_event(order_data(
                &format!("{account}-{i}"),
                "buy",
                "X",
                "1",
                &account,
            ))
        })
        .collect();
    let mut tasks = Vec::new();
    for e in events.iter().chain(events.iter()) {
        for p in [&a, &b] {
            let (p, e) = (Arc::clone(p), e.clone());
            tasks.push(tokio::spawn(async move {
                deliver_concurrently(&p, &e, 1).await[0]
            }));
        }
    }
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.unwrap());
    }
    assert_eq!(count(&outcomes, OutcomeKind::Executed), 20, "{outcomes:?}");
    assert_eq!(count(&outcomes, OutcomeKind::Duplicate), 60);
    let store = SqliteStore::open(&path, Duration::from_secs(5)).unwrap();
    assert_eq!(
        store.position(&account, "X").await.unwrap(),
        Some(dec("20"))
    );
}
