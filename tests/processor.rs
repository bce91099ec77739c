//! The processor's outcome table with real components: a real `redis-server`,
//! real SQLite files. Every order executed exactly once in effect, none lost.

mod common;

use std::sync::Arc;
use std::time::Duration;

use order_guard::guard::{GuardSettings, IdempotencyGuard};
use order_guard::order::{Order, OrderStatus};
use order_guard::position::Position;
use order_guard::processor::{GuardPolicy, OutcomeKind, Processor, ProcessorSettings};
use order_guard::store::{OrderStore, SqliteStore};
use serde_json::{json, Value};

use common::{eg_event, order_data, unique_id, RedisServer};

fn pos(s: &str) -> Position {
    s.parse().unwrap()
}

fn redis_settings() -> GuardSettings {
    GuardSettings::default()
}

/// A processor, its SQLite store, its Redis server and the store's directory.
type OnRedis = (
    Arc<Processor>,
    Arc<SqliteStore>,
    RedisServer,
    tempfile::TempDir,
);

/// A processor on a fresh test Redis and a fresh SQLite file (kept by the dir).
async fn with_redis() -> OnRedis {
    on_redis(common::processor).await
}

/// The same with the processor's cache of finished orders off: every
/// redelivery reaches Redis (and the store, when Redis cannot decide).
async fn with_redis_uncached() -> OnRedis {
    on_redis(common::processor_without_cache).await
}

/// How a test builds its processor from a guard and a store.
type MakeProcessor = fn(Arc<dyn IdempotencyGuard>, Arc<dyn OrderStore>) -> Arc<Processor>;

async fn on_redis(make: MakeProcessor) -> OnRedis {
    let server = RedisServer::start();
    let (store, dir) = common::sqlite_store().await;
    let guard = common::redis_guard(&server, redis_settings());
    (make(guard, store.clone()), store, server, dir)
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
        Some(pos("25"))
    );
    let row = store.order(&id).await.unwrap().unwrap();
    assert_eq!(row.status, OrderStatus::Executed);
    assert_eq!(
        server.get(&format!("orden:{{{id}}}")).as_deref(),
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
        Some(pos("-2.5"))
    );
}

#[tokio::test]
async fn duplicates_after_completion_are_answered_by_the_guard_alone() {
    let (p, store, _server, dir) = with_redis_uncached().await;
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
        Some(pos("10"))
    );
}

#[tokio::test]
async fn a_different_order_reusing_an_id_is_a_stored_conflict() {
    let (p, store, server, _dir) = with_redis_uncached().await;
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
        Some(pos("10"))
    );
    // The conflicting delivery left no reservation behind.
    assert_eq!(server.get(&format!("orden:{{{id}}}")), None);
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
        Some(pos("7"))
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
        &format!("orden:{{{id}}}"),
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
        server.get(&format!("orden:{{{id}}}")).as_deref(),
        Some("PROCESANDO:other-worker")
    );
    // The other worker dies; its key expires (simulated by deleting it).
    server.cmd(&["DEL", &format!("orden:{{{id}}}")]);
    let o = p
        .process_event(&eg_event(order_data(&id, "buy", "X", "1", "a")))
        .await;
    assert_eq!(o.outcome, OutcomeKind::Executed);
}

#[tokio::test]
async fn a_row_left_received_by_a_crashed_worker_is_resumed_once() {
    let (p, store, server, _dir) = with_redis_uncached().await;
    let account = unique_id("acct");
    let id = unique_id("ord");
    let data = order_data(&id, "buy", "X", "4", &account);
    // A worker of an earlier version (two store calls: accept, then
    // execute) accepted the order and died before executing it; its
    // reservation has expired since.
    let o = Order::from_data(&data).unwrap();
    rusqlite::Connection::open(_dir.path().join("orders.db"))
        .unwrap()
        .execute(
            "INSERT INTO Orders (OrderId, Fingerprint, EventId, AccountId, Side, Symbol, Quantity,
                                 LimitPrice, Currency, PlacedAt, Status, ReceivedAt)
             VALUES (?1, ?2, 'e0', ?3, ?4, ?5, ?6, ?7, ?8, ?9, 'Received', 'then')",
            rusqlite::params![
                o.order_id,
                o.fingerprint(),
                o.account_id,
                o.side.as_str(),
                o.symbol,
                o.quantity.to_string(),
                o.limit_price.map(|p| p.to_string()),
                o.currency,
                o.placed_at
            ],
        )
        .unwrap();
    let o = p.process_event(&eg_event(data.clone())).await;
    assert_eq!(o.outcome, OutcomeKind::Executed);
    let row = store.order(&id).await.unwrap().unwrap();
    assert_eq!((row.status, row.attempts), (OrderStatus::Executed, 2));
    assert_eq!(store.position(&account, "X").await.unwrap(), Some(pos("4")));
    // The guard is lost after completion (failover, flush): the store still says duplicate.
    server.cmd(&["FLUSHALL"]);
    assert_eq!(
        p.process_event(&eg_event(data)).await.outcome,
        OutcomeKind::Duplicate
    );
    assert_eq!(
        server.get(&format!("orden:{{{id}}}")).as_deref(),
        Some("COMPLETADA"),
        "guard refreshed"
    );
    assert_eq!(store.position(&account, "X").await.unwrap(), Some(pos("4")));
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
        server.get(&format!("orden:{{{id}}}")),
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
        Some(pos("20"))
    );
}

/// A rejected payload keeps its order id only when that id could be stored
/// (`RejectedEvents.OrderId` is `NVARCHAR(128)` on SQL Server): an id that is
/// itself the reason for the rejection is not recorded as the order id, so
/// storing the rejection cannot fail on it and the event is still kept.
#[tokio::test]
async fn a_poison_order_keeps_its_id_only_when_the_id_is_valid() {
    let (store, _dir) = common::sqlite_store().await;
    let p = common::processor(common::memory_guard(), store.clone());
    let too_long = format!("{}😀", "o".repeat(127)); // 129 UTF-16 units
    for (id, why) in [
        (
            too_long.clone(),
            "orderId is 129 characters (UTF-16 units) long; at most 128 are allowed",
        ),
        (
            "o\u{7}1".to_string(),
            "orderId must not contain control characters",
        ),
        ("   ".to_string(), "orderId must not be empty"),
    ] {
        let event = eg_event(order_data(&id, "buy", "MSFT", "1", "a"));
        let o = p.process_event(&event).await;
        assert_eq!(o.outcome, OutcomeKind::Rejected, "{o:?}");
        assert_eq!(o.order_id, None, "{o:?}");
        assert_eq!(
            o.reason.as_deref(),
            Some(format!("invalid order: {why}").as_str())
        );
        let event_id = event["id"].as_str().unwrap();
        let rows = store.rejections(None).await.unwrap();
        let row = rows
            .iter()
            .find(|r| r.raw_event.contains(event_id))
            .unwrap_or_else(|| panic!("no rejection without an order id for {id:?}: {rows:?}"));
        assert_eq!(row.kind, "poison");
        assert_eq!(row.reason, format!("invalid order: {why}"));
        assert!(store.rejections(Some(&id)).await.unwrap().is_empty());
    }
    // At the limit (128 UTF-16 units) the id is kept, with the real reason.
    let at_limit = format!("{}😀", "o".repeat(126));
    let mut data = order_data(&at_limit, "buy", "MSFT", "1", "a");
    data["currency"] = json!("USDX");
    let o = p.process_event(&eg_event(data)).await;
    assert_eq!(o.outcome, OutcomeKind::Rejected, "{o:?}");
    assert_eq!(o.order_id.as_deref(), Some(at_limit.as_str()));
    let why = "invalid order: currency must be a 3-letter ISO 4217 code, got \"USDX\"";
    assert_eq!(o.reason.as_deref(), Some(why));
    let rows = store.rejections(Some(&at_limit)).await.unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].reason, why);
    assert_eq!(p.counters().rejected, 4);
}

/// A conflict says which order holds the id and which one tried to reuse it,
/// each by the first 12 hex digits of its fingerprint; the answer names the
/// memory guard when that guard decided.
#[tokio::test]
async fn a_conflict_names_both_fingerprints_shortened() {
    let (store, _dir) = common::sqlite_store().await;
    let p = common::processor_without_cache(common::memory_guard(), store.clone());
    let id = unique_id("ord");
    let first = order_data(&id, "buy", "MSFT", "10", "a");
    let o = p.process_event(&eg_event(first.clone())).await;
    assert_eq!((o.outcome, o.guard), (OutcomeKind::Executed, "memory"));
    let changed = order_data(&id, "buy", "MSFT", "11", "a");
    let (fp1, fp2) = (
        Order::from_data(&first).unwrap().fingerprint().to_string(),
        Order::from_data(&changed)
            .unwrap()
            .fingerprint()
            .to_string(),
    );
    // `v2:` and 64 hex digits; shown as the version and 12 digits.
    assert_eq!((fp1.len(), fp2.len()), (67, 67));
    let want = format!(
        "order id {id} is already used by a different order (fingerprint {} ≠ {})",
        &fp1[..15],
        &fp2[..15]
    );
    // Decided by the guard's completed marker, then (guard lost: a new
    // process with an empty memory guard) by the store's unique index.
    let restarted = common::processor_without_cache(common::memory_guard(), store.clone());
    for p in [&p, &restarted] {
        let o = p.process_event(&eg_event(changed.clone())).await;
        assert_eq!((o.outcome, o.guard), (OutcomeKind::Conflict, "memory"));
        assert_eq!(o.reason.as_deref(), Some(want.as_str()));
    }
    let rows = store.rejections(Some(&id)).await.unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    for r in &rows {
        assert_eq!(r.reason, want);
        assert_eq!(r.fingerprint.as_deref(), Some(fp2.as_str()));
    }
}

/// An order the store already holds as executed is a duplicate on the
/// store's word alone, even when the guard has forgotten it (a restarted
/// process: empty memory guard): the store's one call answers it with no
/// write (the row's attempts stay 1, the position unmoved), and the guard
/// learns it is done.
#[tokio::test]
async fn an_executed_order_is_a_duplicate_without_another_execution() {
    let (store, _dir) = common::sqlite_store().await;
    let account = unique_id("acct");
    let id = unique_id("ord");
    let data = order_data(&id, "buy", "MSFT", "10", &account);
    let before = common::processor(common::memory_guard(), store.clone());
    assert_eq!(
        before.process_event(&eg_event(data.clone())).await.outcome,
        OutcomeKind::Executed
    );
    let guard = common::memory_guard();
    let restarted = common::processor(guard.clone(), store.clone());
    let o = restarted.process_event(&eg_event(data.clone())).await;
    assert_eq!(
        (o.outcome, o.reason.as_deref()),
        (OutcomeKind::Duplicate, None),
        "{o:?}"
    );
    let entry = guard.inspect(&id).await.unwrap();
    assert_eq!(entry.value.as_deref(), Some("COMPLETADA"));
    let fp = Order::from_data(&data).unwrap().fingerprint().to_string();
    let marker = order_guard::processor::completion_marker(&store.identity().await.unwrap(), &fp);
    assert_eq!(entry.fingerprint, Some(marker));
    let row = store.order(&id).await.unwrap().unwrap();
    assert_eq!((row.status, row.attempts), (OrderStatus::Executed, 1));
    assert_eq!(
        store.position(&account, "MSFT").await.unwrap(),
        Some(pos("10"))
    );
}

/// With `ORDER_EVENT_TYPES` set, an event of another type
/// carrying an order is rejected with its reason and stored, not placed.
#[tokio::test]
async fn an_event_of_another_type_is_rejected_when_types_are_listed() {
    let (store, _dir) = common::sqlite_store().await;
    let settings = ProcessorSettings {
        event_types: Some(vec!["Trading.Order.Placed".into()]),
        ..ProcessorSettings::default()
    };
    let p = Processor::new(common::memory_guard(), store.clone(), settings);
    let id = unique_id("typed");
    let placed = eg_event(order_data(&id, "buy", "MSFT", "3", "acct-t"));
    let mut cancelled = placed.clone();
    cancelled["eventType"] = json!("Order.Cancelled");
    cancelled["id"] = json!(unique_id("evt"));
    let o = p.process_event(&cancelled).await;
    assert_eq!(o.outcome, OutcomeKind::Rejected, "{o:?}");
    let want = "event type \"Order.Cancelled\" is not an order event type (ORDER_EVENT_TYPES: Trading.Order.Placed)";
    assert!(o.reason.as_deref().unwrap().starts_with(want), "{o:?}");
    assert_eq!(o.order_id.as_deref(), Some(id.as_str()));
    assert_eq!(store.order(&id).await.unwrap(), None, "not placed");
    let stored = store.rejections(Some(&id)).await.unwrap();
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(stored[0].kind, "poison");
    assert!(stored[0].reason.starts_with(want), "{stored:?}");
    // The same for a CloudEvent's `type`.
    let mut ce = common::cloud_event(order_data(&id, "buy", "MSFT", "3", "acct-t"));
    ce["type"] = json!("Order.Cancelled");
    assert_eq!(p.process_event(&ce).await.outcome, OutcomeKind::Rejected);
    // The listed type is placed.
    assert_eq!(
        p.process_event(&placed).await.outcome,
        OutcomeKind::Executed
    );
    // Without a list, every type is an order (as before).
    let (store, _dir2) = common::sqlite_store().await;
    let open = common::processor(common::memory_guard(), store);
    cancelled["data"]["orderId"] = json!(unique_id("any"));
    assert_eq!(
        open.process_event(&cancelled).await.outcome,
        OutcomeKind::Executed
    );
}

/// `status " id "` finds the order the processor stored
/// as `id` (ids are kept trimmed).
#[tokio::test]
async fn status_finds_an_order_by_its_id_with_surrounding_spaces() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("orders.db");
    let config = order_guard::config::Config::from_lookup(|k| {
        (k == "SQL_CONNECTION_STRING").then(|| format!("sqlite:{}?mode=rwc", db.display()))
    })
    .unwrap();
    let p = order_guard::app::build_processor(&config).await.unwrap();
    let id = unique_id("status");
    let o = p
        .process_event(&eg_event(order_data(
            &format!("  {id} "),
            "buy",
            "MSFT",
            "2",
            "acct-s",
        )))
        .await;
    assert_eq!(o.outcome, OutcomeKind::Executed, "{o:?}");
    drop(p);
    for asked in [id.clone(), format!(" {id} "), format!("\t{id}\n")] {
        let text = order_guard::app::status(&config, &asked)
            .await
            .unwrap()
            .text;
        assert!(
            text.contains(&format!("order   {id} Executed buy 2 MSFT for acct-s")),
            "status {asked:?}:\n{text}"
        );
    }
}

/// The same instant written three ways (the host's
/// Newtonsoft round trip writes seven fraction digits or an offset) is one
/// order: executed once, then duplicates, never conflicts.
#[tokio::test]
async fn one_instant_written_three_ways_is_one_order() {
    let (p, store, _redis, _dir) = with_redis().await;
    let id = unique_id("instant");
    let mut outcomes = Vec::new();
    for placed in [
        "2025-06-14T09:30:02.1180000Z",
        "2025-06-14T09:30:02.118Z",
        "2025-06-14T11:30:02.118+02:00",
    ] {
        let mut data = order_data(&id, "buy", "MSFT", "5", "acct-i");
        data["placedAt"] = json!(placed);
        outcomes.push(p.process_event(&eg_event(data)).await.outcome);
    }
    assert_eq!(
        outcomes,
        [
            OutcomeKind::Executed,
            OutcomeKind::Duplicate,
            OutcomeKind::Duplicate
        ]
    );
    assert_eq!(
        store.position("acct-i", "MSFT").await.unwrap(),
        Some(pos("5"))
    );
    assert_eq!(store.rejections(Some(&id)).await.unwrap(), vec![]);
}

/// The fingerprint of format version 1: hex SHA-256 of the fields as the
/// order held them then (`placedAt` as sent), without a version prefix.
fn v1_fingerprint(fields: [&str; 8]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"order-guard/v1");
    for f in fields {
        h.update((f.len() as u64).to_be_bytes());
        h.update(f.as_bytes());
    }
    order_guard::order::hex(&h.finalize())
}

/// Rows (and Redis markers) written before the placedAt
/// normalization hold version-1 fingerprints of the text as sent. Their
/// redeliveries stay duplicates (decided from the row), a different order
/// under their id stays a conflict, and nothing executes twice.
#[tokio::test]
async fn rows_stored_under_fingerprint_v1_are_judged_by_their_columns() {
    let (p, store, redis, dir) = with_redis().await;
    let identity = store.identity().await.unwrap();
    let conn = rusqlite::Connection::open(dir.path().join("orders.db")).unwrap();
    let mut olds = Vec::new();
    for (status, with_marker) in [("Executed", true), ("Executed", false), ("Received", false)] {
        let id = unique_id("v1");
        let placed = "2025-06-14T11:30:02.1180000+02:00";
        let fp = v1_fingerprint([&id, "acct-v1", "buy", "MSFT", "5", "431.15", "USD", placed]);
        conn.execute(
            "INSERT INTO Orders (OrderId, Fingerprint, EventId, AccountId, Side, Symbol, Quantity,
                                 LimitPrice, Currency, PlacedAt, Status, ReceivedAt)
             VALUES (?1, ?2, 'e-old', 'acct-v1', 'buy', 'MSFT', '5', '431.15', 'USD', ?3, ?4,
                     '2025-06-14T09:30:03Z')",
            rusqlite::params![id, fp, placed, status],
        )
        .unwrap();
        if with_marker {
            // As `complete` wrote it before: COMPLETADA and a v1 marker.
            redis.cmd(&["SET", &redis_settings().key(&id), "COMPLETADA"]);
            redis.cmd(&[
                "SET",
                &redis_settings().fingerprint_key(&id),
                &format!("{identity}/{fp}"),
            ]);
        }
        olds.push((id, status, placed));
    }
    for (id, status, placed) in &olds {
        // The very same text, and the same instant written otherwise.
        for sent in [*placed, "2025-06-14T09:30:02.118Z"] {
            let mut data = order_data(id, "buy", "MSFT", "5", "acct-v1");
            data["placedAt"] = json!(sent);
            let o = p.process_event(&eg_event(data)).await;
            let want = if *status == "Received" && sent == *placed {
                OutcomeKind::Executed // resumed: the row was left Received
            } else {
                OutcomeKind::Duplicate
            };
            assert_eq!(o.outcome, want, "{id} ({status}) placedAt {sent}: {o:?}");
        }
        // Another instant under the same id is another order.
        let mut data = order_data(id, "buy", "MSFT", "5", "acct-v1");
        data["placedAt"] = json!("2025-06-14T09:30:02.119Z");
        let o = p.process_event(&eg_event(data)).await;
        assert_eq!(o.outcome, OutcomeKind::Conflict, "{id}: {o:?}");
        let row = store.order(id).await.unwrap().unwrap();
        assert_eq!(row.status, OrderStatus::Executed);
        assert!(
            !row.fingerprint.starts_with("v2:"),
            "the row is not rewritten"
        );
    }
    // One resumed execution in all: the position holds it once.
    assert_eq!(
        store.position("acct-v1", "MSFT").await.unwrap(),
        Some(pos("5"))
    );
}

/// An order that would take its position beyond DECIMAL(38,10) is answered
/// `rejected` with the reason, kept `Rejected` with the event stored (one
/// transaction), never executed nor rounded; its redeliveries are
/// duplicates, by the guard or, once the guard forgot, by the store.
#[tokio::test]
async fn an_order_overflowing_its_position_is_rejected_with_a_stored_reason() {
    let (store, dir) = common::sqlite_store().await;
    let p = common::processor(common::memory_guard(), store.clone());
    let account = unique_id("acct");
    let top = "9999999999999999999999999999";
    // No order can get there (10^10 of the largest): seeded in the file.
    rusqlite::Connection::open(dir.path().join("orders.db"))
        .unwrap()
        .execute(
            "INSERT INTO Positions (AccountId, Symbol, Quantity, UpdatedAt)
             VALUES (?1, 'MSFT', ?2, 'seeded')",
            [account.as_str(), top],
        )
        .unwrap();
    let id = unique_id("ord");
    let event = eg_event(order_data(
        &id,
        "buy",
        "MSFT",
        "999999999999999999",
        &account,
    ));
    let first = p.process_event(&event).await;
    assert_eq!(first.outcome, OutcomeKind::Rejected, "{first:?}");
    let reason = first.reason.clone().unwrap();
    assert!(
        reason.starts_with(&format!(
            "position overflow: the order would take the position of account {account:?} in \"MSFT\" from {top} to 10000000000999999999999999998, beyond DECIMAL(38,10)"
        )),
        "{reason}"
    );
    let row = store.order(&id).await.unwrap().unwrap();
    assert_eq!(row.status, OrderStatus::Rejected);
    assert_eq!(
        store.position(&account, "MSFT").await.unwrap(),
        Some(pos(top))
    );
    let stored = store.rejections(Some(&id)).await.unwrap();
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(
        (stored[0].kind.as_str(), stored[0].reason.as_str()),
        ("poison", reason.as_str())
    );
    assert_eq!(stored[0].raw_event, event.to_string());
    assert_eq!(
        p.process_event(&event).await.outcome,
        OutcomeKind::Duplicate
    );
    let restarted = common::processor(common::memory_guard(), store.clone());
    assert_eq!(
        restarted.process_event(&event).await.outcome,
        OutcomeKind::Duplicate
    );
    assert_eq!(store.rejections(Some(&id)).await.unwrap().len(), 1);
    assert_eq!(
        store.position(&account, "MSFT").await.unwrap(),
        Some(pos(top))
    );
    assert_eq!(p.counters().rejected, 1);
}

/// A field outside the documented set is refused and stored, never
/// executed: a producer adding `orderType` does not see a different order
/// taken for a duplicate of the first.
#[tokio::test]
async fn an_order_with_an_unknown_field_is_rejected_and_stored() {
    let (store, _dir) = common::sqlite_store().await;
    let p = common::processor(common::memory_guard(), store.clone());
    let account = unique_id("acct");
    let id = unique_id("ord");
    let plain = eg_event(order_data(&id, "buy", "MSFT", "5", &account));
    assert_eq!(p.process_event(&plain).await.outcome, OutcomeKind::Executed);
    let mut stop = order_data(&id, "buy", "MSFT", "5", &account);
    stop["orderType"] = json!("stop");
    let stop = eg_event(stop);
    let o = p.process_event(&stop).await;
    assert_eq!(o.outcome, OutcomeKind::Rejected, "{o:?}");
    assert!(
        o.reason
            .as_deref()
            .unwrap()
            .starts_with("invalid order: unknown field \"orderType\" in the order;"),
        "{o:?}"
    );
    let stored = store.rejections(Some(&id)).await.unwrap();
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(stored[0].raw_event, stop.to_string());
    assert_eq!(
        store.position(&account, "MSFT").await.unwrap(),
        Some(pos("5"))
    );
}

/// A processor on `server` with the `retry` policy: an event that reaches an
/// unreachable guard is answered `retry`, so an answer given while Redis is
/// down can only come from the cache of finished orders.
fn retry_policy_processor(
    server: &RedisServer,
    store: Arc<SqliteStore>,
    cache_bytes: u64,
) -> Processor {
    let mut settings = ProcessorSettings {
        on_guard_unavailable: GuardPolicy::Retry,
        ..ProcessorSettings::default()
    };
    settings.finished_cache.max_bytes = cache_bytes;
    Processor::new(
        common::redis_guard(server, redis_settings()),
        store,
        settings,
    )
}

#[tokio::test]
async fn a_finished_order_redelivered_is_answered_from_the_cache_without_redis() {
    let mut server = RedisServer::start();
    let (store, _dir) = common::sqlite_store().await;
    let p = retry_policy_processor(&server, store.clone(), 1 << 20);
    let (id, account) = (unique_id("cached"), unique_id("acct"));
    let order = order_data(&id, "buy", "MSFT", "4", &account);
    let first = p.process_event(&eg_event(order.clone())).await;
    assert_eq!(
        (first.outcome, first.guard),
        (OutcomeKind::Executed, "redis")
    );
    // With Redis gone, only the cache can tell this is a duplicate.
    server.stop();
    let again = p.process_event(&eg_event(order.clone())).await;
    assert_eq!(
        (again.outcome, again.guard),
        (OutcomeKind::Duplicate, "cache")
    );
    // Other content under the same id: a conflict, stored with both
    // fingerprints, with no Redis either.
    let other = order_data(&id, "buy", "MSFT", "5", &account);
    let conflict = p.process_event(&eg_event(other)).await;
    assert_eq!(
        (conflict.outcome, conflict.guard),
        (OutcomeKind::Conflict, "cache")
    );
    let rows = store.rejections(Some(&id)).await.unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    let fp = Order::from_data(&order).unwrap().fingerprint().to_string();
    assert_eq!(rows[0].existing_fingerprint.as_deref(), Some(fp.as_str()));
    assert_eq!(p.counters().cache_hits, 2);
    assert_eq!(p.counters().cache_misses, 1, "the first delivery's lookup");
    assert_eq!(
        store.position(&account, "MSFT").await.unwrap(),
        Some(pos("4")),
        "executed once"
    );
}

#[tokio::test]
async fn with_the_cache_off_a_redelivery_asks_redis() {
    let mut server = RedisServer::start();
    let (store, _dir) = common::sqlite_store().await;
    let p = retry_policy_processor(&server, store, 0);
    let order = order_data(&unique_id("uncached"), "buy", "MSFT", "1", "a");
    assert_eq!(
        p.process_event(&eg_event(order.clone())).await.outcome,
        OutcomeKind::Executed
    );
    server.stop();
    let again = p.process_event(&eg_event(order)).await;
    assert_eq!(again.outcome, OutcomeKind::Retry, "{again:?}");
    assert_eq!(p.counters().cache_hits, 0);
    assert_eq!(p.counters().cache_misses, 0, "no cache, no lookups");
}

/// Only a finished order is remembered: an `in_progress` answer (another
/// worker's reservation, no row yet) must not make the next delivery a
/// duplicate.
#[tokio::test]
async fn an_order_answered_in_progress_is_not_remembered() {
    let (store, _dir) = common::sqlite_store().await;
    let guard = common::memory_guard();
    let p = Processor::new(guard.clone(), store.clone(), ProcessorSettings::default());
    let id = unique_id("held");
    let order = eg_event(order_data(&id, "buy", "MSFT", "2", "acct-held"));
    let order_guard::guard::Acquisition::Acquired(token) = guard.acquire(&id).await else {
        panic!("a fresh id must be acquired");
    };
    assert_eq!(
        p.process_event(&order).await.outcome,
        OutcomeKind::InProgress
    );
    assert!(guard.release(&id, &token).await.unwrap());
    let o = p.process_event(&order).await;
    assert_eq!((o.outcome, o.guard), (OutcomeKind::Executed, "memory"));
    assert_eq!(
        store.order(&id).await.unwrap().map(|r| r.status),
        Some(OrderStatus::Executed)
    );
}
