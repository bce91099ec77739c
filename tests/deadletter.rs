//! Dead-lettered orders replayed from Blob Storage (issue 21), against a
//! real Azurite (tests/common/azurite.rs), a real SQLite file and the real
//! processor: each schema and layout; a mix of orders executed before,
//! never executed, a conflict and a poison event; an unreadable blob; a
//! replay while the store is locked (the blob stays, the next replay
//! finishes it); two replays at once; a rerun that changes nothing; the
//! `DeadLetterSweep` route.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::azurite::Azurite;
use order_guard::deadletter::{sweep, Container, SweepOptions, SweepSummary};
use order_guard::processor::{OutcomeKind, Processor, ProcessorSettings};
use order_guard::store::{OrderStore, SqliteStore};
use serde_json::{json, Value};

const HOUR: &str = "2025/6/14/9";

fn data(id: &str, quantity: &str) -> Value {
    json!({"orderId": id, "side": "buy", "symbol": "MSFT", "quantity": quantity, "accountId": "acct-1"})
}

fn eg_event(id: &str, quantity: &str) -> Value {
    json!({"id": format!("e-{id}-{quantity}"), "eventType": "Trading.Order.Placed", "subject": format!("orders/{id}"),
           "eventTime": "2025-06-14T09:30:02Z", "dataVersion": "1.0", "metadataVersion": "1", "topic": "/t",
           "data": data(id, quantity)})
}

fn ce_event(id: &str) -> Value {
    json!({"specversion": "1.0", "id": format!("c-{id}"), "source": "/orders", "type": "Trading.Order.Placed",
           "time": "2025-06-14T09:30:02Z", "datacontenttype": "application/json", "data": data(id, "3")})
}

/// An Event Grid schema event as Event Grid dead-letters it.
fn eg_dead(event: &Value) -> Value {
    let mut e = event.clone();
    let o = e.as_object_mut().unwrap();
    o.insert(
        "deadLetterReason".into(),
        json!("MaxDeliveryAttemptsExceeded"),
    );
    o.insert("deliveryAttempts".into(), json!(30));
    o.insert("lastDeliveryOutcome".into(), json!("Busy"));
    o.insert("lastHttpStatusCode".into(), json!(500));
    o.insert("publishTime".into(), json!("2025-06-14T09:30:02.3Z"));
    o.insert(
        "lastDeliveryAttemptTime".into(),
        json!("2025-06-15T09:30:01Z"),
    );
    e
}

fn ce_dead(event: &Value) -> Value {
    let mut e = event.clone();
    let o = e.as_object_mut().unwrap();
    o.insert("deadletterreason".into(), json!("TimeToLiveExceeded"));
    o.insert("deliveryattempts".into(), json!(12));
    o.insert("publishtime".into(), json!("2025-06-14T09:30:02Z"));
    e
}

fn namespace_properties() -> Value {
    json!({"deadletterreason": "Undeliverable due to client error", "deliveryattempts": 3, "deliveryresult": "Unauthorized",
           "publishutc": "2025-06-14T09:30:02.3063899Z", "deliveryattemptutc": "2025-06-14T09:40:08.3220145Z"})
}

struct World {
    _azurite: Azurite,
    container: Container,
    store: Arc<SqliteStore>,
    processor: Arc<Processor>,
    dir: tempfile::TempDir,
}

async fn world(busy_timeout: Duration) -> World {
    let azurite = Azurite::start();
    let container = azurite.container("dead-letters").await;
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("orders.db"), busy_timeout).unwrap());
    store.migrate().await.unwrap();
    let processor = processor_on(Arc::clone(&store) as Arc<dyn OrderStore>);
    World {
        _azurite: azurite,
        container,
        store,
        processor,
        dir,
    }
}

fn processor_on(store: Arc<dyn OrderStore>) -> Arc<Processor> {
    let settings = ProcessorSettings {
        deadline: Duration::from_secs(3),
        ..ProcessorSettings::default()
    };
    Arc::new(Processor::new(common::memory_guard(), store, settings))
}

async fn put(c: &Container, name: &str, content: &Value) {
    assert!(c
        .put_new(name, Bytes::from(content.to_string()))
        .await
        .unwrap());
}

async fn names(c: &Container, prefix: Option<&str>) -> Vec<String> {
    let mut n: Vec<String> = c
        .list(prefix)
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.name)
        .collect();
    n.sort();
    n
}

async fn replay(w: &World) -> SweepSummary {
    sweep(
        &w.processor,
        &w.container,
        &SweepOptions::default(),
        &order_guard::deadletter::sweep::Silent,
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn every_schema_and_layout_is_replayed_and_moved_and_a_rerun_changes_nothing() {
    let w = world(Duration::from_secs(5)).await;
    let c = &w.container;
    let topic_eg = format!("ORDERS-SUB/{HOUR}/11111111-1111-1111-1111-111111111111.json");
    let topic_ce = format!("ORDERS-CE/{HOUR}/22222222-2222-2222-2222-222222222222.json");
    let ns_wrapped = format!("ns/orders/sub/{HOUR}/33333333-3333-3333-3333-333333333333.json");
    let ns_flat = format!("ns/orders/sub/{HOUR}/44444444-4444-4444-4444-444444444444.json");
    put(
        c,
        &topic_eg,
        &json!([
            eg_dead(&eg_event("s-1", "1")),
            eg_dead(&eg_event("s-2", "2"))
        ]),
    )
    .await;
    put(c, &topic_ce, &json!([ce_dead(&ce_event("s-3"))])).await;
    put(
        c,
        &ns_wrapped,
        &json!({"event": ce_event("s-4"), "deadletterProperties": namespace_properties()}),
    )
    .await;
    let mut flat = ce_event("s-5");
    flat["brokerProperties"] = namespace_properties();
    flat["customDeliveryProperties"] = json!({"custom-header-1": "value1"});
    put(c, &ns_flat, &flat).await;
    // Not in a documented layout: left alone.
    put(c, "notes/readme.json", &json!({})).await;

    let s = replay(&w).await;
    assert_eq!(
        s.to_string(),
        "blobs=4 events=5 executed=5 duplicates=0 conflicts=0 rejected=0 retries=0 unresolved=0 moved=4 unreadable=0",
        "{s:?}"
    );
    for id in ["s-1", "s-2", "s-3", "s-4", "s-5"] {
        let row = w.store.order(id).await.unwrap().expect("executed");
        assert_eq!(row.status.as_str(), "Executed", "{id}");
    }
    let mut want: Vec<String> = [&topic_eg, &topic_ce, &ns_wrapped, &ns_flat]
        .iter()
        .map(|n| format!("replayed/{n}"))
        .collect();
    want.sort();
    assert_eq!(names(c, Some("replayed")).await, want);
    assert_eq!(names(c, Some("ORDERS-SUB")).await, Vec::<String>::new());
    assert_eq!(
        names(c, Some("notes")).await,
        vec!["notes/readme.json".to_string()]
    );

    // A rerun finds nothing to do and changes nothing.
    let before = w.processor.counters();
    let again = replay(&w).await;
    assert_eq!(again, SweepSummary::default(), "{again}");
    assert_eq!(w.processor.counters(), before);
    assert_eq!(names(c, Some("replayed")).await, want);
}

#[tokio::test]
async fn executed_before_never_executed_conflict_poison_and_unreadable() {
    let w = world(Duration::from_secs(5)).await;
    let c = &w.container;
    // Delivered live (as the host hands it: Json.NET's double for 0.000001)
    // and executed, then dead-lettered anyway (the answer was lost).
    let live = json!({"id": "e-done", "eventType": "Trading.Order.Placed", "subject": "orders/m-done", "eventTime": "2025-06-14T09:30:02Z", "dataVersion": "1.0",
        "data": {"orderId": "m-done", "side": "buy", "symbol": "MSFT", "quantity": serde_json::from_str::<Value>("1E-06").unwrap(), "accountId": "acct-1"}});
    assert_eq!(
        w.processor.process_event(&live).await.outcome,
        OutcomeKind::Executed
    );
    // The blob keeps the publisher's own text.
    let published = r#"{"id":"e-done","eventType":"Trading.Order.Placed","subject":"orders/m-done","eventTime":"2025-06-14T09:30:02Z","dataVersion":"1.0",
        "data":{"orderId":"m-done","side":"buy","symbol":"MSFT","quantity":0.000001,"accountId":"acct-1"},
        "deadLetterReason":"MaxDeliveryAttemptsExceeded","deliveryAttempts":30}"#;
    // A poison event, stored live, then dead-lettered (a 400 goes there at once).
    let poison = json!({"id": "e-poison", "eventType": "Trading.Order.Placed", "data": {"orderId": "m-poison", "side": "hold", "symbol": "MSFT", "quantity": 1, "accountId": "acct-1"}});
    assert_eq!(
        w.processor.process_event(&poison).await.outcome,
        OutcomeKind::Rejected
    );

    let mixed = format!("MIX/{HOUR}/aaaaaaaa-0000-0000-0000-000000000001.json");
    let conflict = format!("MIX/{HOUR}/aaaaaaaa-0000-0000-0000-000000000002.json");
    let poisoned = format!("MIX/{HOUR}/aaaaaaaa-0000-0000-0000-000000000003.json");
    let garbage = format!("MIX/{HOUR}/aaaaaaaa-0000-0000-0000-000000000004.json");
    let text = format!("[{published},{}]", eg_dead(&eg_event("m-new", "4")));
    assert!(c.put_new(&mixed, Bytes::from(text)).await.unwrap());
    put(c, &conflict, &json!([eg_dead(&eg_event("m-done", "7"))])).await;
    let mut poison_dead = poison.clone();
    poison_dead["deadLetterReason"] = json!("UndeliverableDueToHttpBadRequest");
    poison_dead["deliveryAttempts"] = json!(1);
    put(c, &poisoned, &json!([poison_dead])).await;
    assert!(c
        .put_new(&garbage, Bytes::from_static(b"{\"not\": json"))
        .await
        .unwrap());

    let s = replay(&w).await;
    assert_eq!(
        s.to_string(),
        "blobs=4 events=4 executed=1 duplicates=1 conflicts=1 rejected=1 retries=0 unresolved=0 moved=3 unreadable=1",
        "{s:?}"
    );
    assert_eq!(
        w.store
            .order("m-new")
            .await
            .unwrap()
            .unwrap()
            .status
            .as_str(),
        "Executed"
    );
    let conflicts = w.store.rejections(Some("m-done")).await.unwrap();
    assert_eq!(conflicts.len(), 1, "{conflicts:?}");
    assert_eq!(conflicts[0].kind, "conflict");
    // The replayed poison event is a redelivery of its row, not a second row.
    let poisons = w.store.rejections(Some("m-poison")).await.unwrap();
    assert_eq!(poisons.len(), 1, "{poisons:?}");
    assert_eq!(poisons[0].deliveries, 2);
    // The unreadable blob: stored once with its reason, kept under unreadable/.
    let unreadable: Vec<_> = w
        .store
        .rejections(None)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.raw_event == "{\"not\": json")
        .collect();
    assert_eq!(unreadable.len(), 1);
    assert!(
        unreadable[0].reason.contains("not valid JSON"),
        "{}",
        unreadable[0].reason
    );
    assert_eq!(
        names(c, Some("unreadable")).await,
        vec![format!("unreadable/{garbage}")]
    );
    assert_eq!(names(c, Some("replayed")).await.len(), 3);
    assert_eq!(names(c, Some("MIX")).await, Vec::<String>::new());
    // Again: nothing left, nothing stored twice.
    assert_eq!(replay(&w).await, SweepSummary::default());
    assert_eq!(
        w.store.rejections(Some("m-poison")).await.unwrap()[0].deliveries,
        2
    );
}

/// Hold the whole database with `BEGIN EXCLUSIVE` (as tests/operational.rs).
fn lock(db: &std::path::Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.execute_batch("BEGIN EXCLUSIVE").unwrap();
    conn
}

#[tokio::test]
async fn a_replay_while_the_store_is_locked_leaves_the_blob_and_the_next_finishes_it() {
    let w = world(Duration::from_millis(200)).await;
    let c = &w.container;
    let name = format!("LOCKED/{HOUR}/bbbbbbbb-0000-0000-0000-000000000001.json");
    let garbage = format!("LOCKED/{HOUR}/bbbbbbbb-0000-0000-0000-000000000002.json");
    put(c, &name, &json!([eg_dead(&eg_event("l-1", "1"))])).await;
    assert!(c
        .put_new(&garbage, Bytes::from_static(b"nope"))
        .await
        .unwrap());
    let held = lock(&w.dir.path().join("orders.db"));
    let s = replay(&w).await;
    assert_eq!(
        (s.blobs, s.unresolved, s.moved, s.unreadable, s.retries),
        (2, 2, 0, 0, 1),
        "{s:?}"
    );
    assert_eq!(names(c, Some("LOCKED")).await.len(), 2, "both blobs stay");
    drop(held);
    let s = replay(&w).await;
    assert_eq!(
        (s.blobs, s.executed, s.moved, s.unreadable, s.unresolved),
        (2, 1, 1, 1, 0),
        "{s:?}"
    );
    assert_eq!(names(c, Some("LOCKED")).await, Vec::<String>::new());
    assert_eq!(
        w.store.order("l-1").await.unwrap().unwrap().status.as_str(),
        "Executed"
    );
}

#[tokio::test]
async fn two_replays_at_once_execute_each_order_once_and_move_each_blob_once() {
    let w = world(Duration::from_secs(5)).await;
    let c = &w.container;
    const N: usize = 12;
    for i in 0..N {
        let name = format!("BOTH/{HOUR}/cccccccc-0000-0000-0000-{i:012}.json");
        put(
            c,
            &name,
            &json!([eg_dead(&eg_event(&format!("t-{i}"), "1"))]),
        )
        .await;
    }
    // A second process: its own guard, the same database.
    let other_store = Arc::new(
        SqliteStore::open(&w.dir.path().join("orders.db"), Duration::from_secs(5)).unwrap(),
    );
    other_store.migrate().await.unwrap();
    let other = processor_on(other_store);
    let silent = order_guard::deadletter::sweep::Silent;
    let options = SweepOptions::default();
    let (a, b) = tokio::join!(
        sweep(&w.processor, c, &options, &silent),
        sweep(&other, c, &options, &silent)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.executed + b.executed, N as u64, "{a} / {b}");
    assert_eq!(a.moved + b.moved, N as u64, "{a} / {b}");
    // What one left (in_progress) the other finished, or the next run does.
    let rest = replay(&w).await;
    assert_eq!(rest.executed, 0, "{rest}");
    assert_eq!(names(c, Some("BOTH")).await, Vec::<String>::new());
    assert_eq!(names(c, Some("replayed")).await.len(), N);
    let position = w.store.position("acct-1", "MSFT").await.unwrap().unwrap();
    assert_eq!(position.to_string(), N.to_string());
}

#[tokio::test]
async fn the_timer_route_sweeps_and_is_off_without_storage() {
    let w = world(Duration::from_secs(5)).await;
    put(
        &w.container,
        &format!("TIMER/{HOUR}/dddddddd-0000-0000-0000-000000000001.json"),
        &json!([eg_dead(&eg_event("r-1", "1"))]),
    )
    .await;
    let function = Arc::new(order_guard::deadletter::function::SweepFunction::new(
        Arc::clone(&w.processor),
        Some(w.container.clone()),
    ));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (addr, server) = order_guard::host::bind_with(
        Arc::clone(&w.processor),
        function,
        std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        order_guard::host::Limits::default(),
        async move {
            let _ = rx.await;
        },
        Duration::from_secs(5),
    )
    .unwrap();
    let task = tokio::spawn(server);
    let timer = json!({"Data": {"timer": {"Schedule": {"AdjustForDST": true}, "ScheduleStatus": null, "IsPastDue": false}},
                       "Metadata": {"sys": {"MethodName": "DeadLetterSweep", "UtcNow": "2025-06-14T10:00:00Z"}}});
    let url = format!("http://{addr}/DeadLetterSweep");
    let answer = common::send("POST", &url, serde_json::to_vec(&timer).unwrap(), false).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(
        answer.body["ReturnValue"]["summary"]["executed"], 1,
        "{:?}",
        answer.body
    );
    assert!(answer.body["Logs"][0].as_str().unwrap().contains("moved=1"));
    let _ = tx.send(());
    task.await.unwrap();

    // The handler without DEAD_LETTER_STORAGE: off, and says so.
    let handler = common::Handler::start(Arc::clone(&w.processor), 1 << 20).await;
    let answer = common::send(
        "POST",
        &handler.url("/DeadLetterSweep"),
        serde_json::to_vec(&timer).unwrap(),
        false,
    )
    .await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body["ReturnValue"]["sweep"], "off");
    assert!(answer.body["Logs"][0]
        .as_str()
        .unwrap()
        .contains("DEAD_LETTER_STORAGE is not set"));
    let answer = common::send(
        "POST",
        &handler.url("/DeadLetterSweep"),
        b"[]".to_vec(),
        false,
    )
    .await;
    assert_eq!(answer.status, 400);
    handler.shutdown().await;
}
