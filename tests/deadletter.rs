//! Dead-lettered orders replayed from Blob Storage, against a
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
    // Not in a documented layout: left alone, and said (unresolved); at
    // the container's root too.
    put(c, "notes/readme.json", &json!({})).await;
    put(c, "stray.json", &json!({})).await;
    let dry = order_guard::deadletter::list(
        c,
        w.store.as_ref(),
        &ProcessorSettings::default(),
        &SweepOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(
        dry.not_dead_letters,
        ["notes/readme.json", "stray.json"],
        "{dry}"
    );
    assert_eq!((dry.blobs, dry.events), (6, 5), "{dry}");

    let s = replay(&w).await;
    assert_eq!(
        s.to_string(),
        "blobs=6 events=5 executed=5 duplicates=0 conflicts=0 rejected=0 retries=0 unresolved=2 moved=4 unreadable=0",
        "{s:?}"
    );
    assert_eq!(s.left.len(), 2, "{s:?}");
    for (left, name) in s.left.iter().zip(["notes/readme.json", "stray.json"]) {
        assert!(
            left.starts_with(&format!("{name}: not in a documented dead-letter layout")),
            "{s:?}"
        );
    }
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

    // A rerun finds nothing to do and changes nothing (the stray blob is
    // said again).
    let before = w.processor.counters();
    let again = replay(&w).await;
    assert_eq!(
        (again.blobs, again.unresolved, again.events, again.moved),
        (2, 2, 0, 0),
        "{again}"
    );
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
    // The unreadable blob: stored once with its reason, name and size (not
    // its body), kept under unreadable/.
    let unreadable: Vec<_> = w
        .store
        .rejections(None)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.reason.contains(&garbage))
        .collect();
    assert_eq!(unreadable.len(), 1);
    assert!(
        unreadable[0].reason.contains("not valid JSON"),
        "{}",
        unreadable[0].reason
    );
    let record: Value = serde_json::from_str(&unreadable[0].raw_event).unwrap();
    assert_eq!(record["deadLetterBlob"], json!(garbage));
    assert_eq!(record["size"], json!(b"{\"not\": json".len()));
    assert!(!unreadable[0].raw_event.contains("\"not\": json"));
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

/// Every blob is read, copied and deleted by the name it
/// was listed under. Event Grid writes hours unpadded, but a name that
/// parses with padded numbers (or any other spelling that differs from the
/// one rebuilt from its parts) must not be taken for gone: it is executed
/// and moved like any other. One name per documented layout, then padded
/// and odd ones.
#[tokio::test]
async fn a_blob_is_read_and_moved_by_the_name_it_was_listed_under() {
    let w = world(Duration::from_secs(5)).await;
    let c = &w.container;
    let names = [
        // The two layouts Microsoft documents, as Event Grid writes them.
        "MY-BLOB-SUBSCRIPTION/2019/8/8/5/111111111-1111-1111-1111-111111111111.json",
        "mynamespace/mytopic/myeventsubscription/2023/9/23/2/480b2295-0c38-40d0-b25a-f34b30aac1a9.json",
        // Zero-padded month, day and hour, in each layout.
        "PADDED/2026/06/04/09/99999999-0000-0000-0000-000000000001.json",
        "ns/orders/sub/2026/01/02/03/99999999-0000-0000-0000-000000000002.json",
        // Padded to the parser's limit, a subscription with every character
        // Event Grid allows in a name, an id with dots, a space and a plus.
        "ODD-SUB/2026/0006/004/0009/99999999-0000-0000-0000-000000000003.json",
        "SUB-1-A/2026/12/31/23/a.b.c.json",
        "SPACED SUB/2026/1/1/0/99999999 0000+0001.json",
        // Characters a path type might percent-encode into another name.
        "PCT%20SUB/2026/1/1/1/99999999-0000-0000-0000-000000000004.json",
        "HASH#SUB/2026/1/1/2/99999999-0000-0000-0000-000000000005.json",
    ];
    for (i, name) in names.iter().enumerate() {
        put(
            c,
            name,
            &json!([eg_dead(&eg_event(&format!("n-{i}"), "1"))]),
        )
        .await;
    }
    let s = replay(&w).await;
    assert_eq!(
        (s.blobs, s.executed, s.moved, s.unresolved, s.unreadable),
        (
            names.len() as u64,
            names.len() as u64,
            names.len() as u64,
            0,
            0
        ),
        "{s:?}"
    );
    let mut want: Vec<String> = names.iter().map(|n| format!("replayed/{n}")).collect();
    want.sort();
    assert_eq!(self::names(c, Some("replayed")).await, want);
    for name in names {
        let top = name.split('/').next().unwrap();
        assert_eq!(
            self::names(c, Some(top)).await,
            Vec::<String>::new(),
            "{name}"
        );
    }
    for i in 0..names.len() {
        let row = w
            .store
            .order(&format!("n-{i}"))
            .await
            .unwrap()
            .expect("executed");
        assert_eq!(row.status.as_str(), "Executed");
    }
}

/// A blob over the bound is set aside by its listed size
/// without being read: a `RejectedEvents` row with its name, size and
/// reason (not its body), the blob under `unreadable/`, and the sweep goes
/// on with the next blob.
#[tokio::test]
async fn a_blob_over_the_bound_is_set_aside_unread_and_the_next_is_replayed() {
    let azurite = Azurite::start();
    azurite.create_container("bounded").await;
    let mut settings = azurite.settings("bounded");
    settings.max_blob_bytes = 64 * 1024;
    let c = Container::open(&settings).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store =
        Arc::new(SqliteStore::open(&dir.path().join("o.db"), Duration::from_secs(5)).unwrap());
    store.migrate().await.unwrap();
    let processor = processor_on(Arc::clone(&store) as Arc<dyn OrderStore>);
    // Oldest first: the large blob is met before the order.
    let large = "BIG/2025/6/14/8/eeeeeeee-0000-0000-0000-000000000001.json";
    let next = "BIG/2025/6/14/9/eeeeeeee-0000-0000-0000-000000000002.json";
    // A real array of dead-lettered events, only too many of them.
    let many: Vec<Value> = (0..400)
        .map(|i| eg_dead(&eg_event(&format!("big-{i}"), "1")))
        .collect();
    let body = Bytes::from(json!(many).to_string());
    let size = body.len() as u64;
    assert!(size > 64 * 1024, "{size}");
    assert!(c.put_new(large, body).await.unwrap());
    put(&c, next, &json!([eg_dead(&eg_event("after-big", "1"))])).await;

    // The dry run sees the same: one blob it would set aside, one event.
    let dry = order_guard::deadletter::list(
        &c,
        store.as_ref(),
        &ProcessorSettings::default(),
        &SweepOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(
        (
            dry.blobs,
            dry.unreadable,
            dry.events,
            dry.not_dead_letters.len()
        ),
        (2, 1, 1, 0),
        "{dry}"
    );

    let s = sweep(
        &processor,
        &c,
        &SweepOptions::default(),
        &order_guard::deadletter::sweep::Silent,
    )
    .await
    .unwrap();
    assert_eq!(
        (s.blobs, s.unreadable, s.executed, s.moved, s.unresolved),
        (2, 1, 1, 1, 0),
        "{s:?}"
    );
    assert!(
        store.order("big-0").await.unwrap().is_none(),
        "nothing of it was executed"
    );
    assert_eq!(
        store
            .order("after-big")
            .await
            .unwrap()
            .unwrap()
            .status
            .as_str(),
        "Executed"
    );
    let rows: Vec<_> = store
        .rejections(None)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.reason.contains(large))
        .collect();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(
        rows[0]
            .reason
            .contains(&format!("is {size} bytes, over the 65536")),
        "{}",
        rows[0].reason
    );
    assert!(rows[0].raw_event.len() < 512, "{}", rows[0].raw_event);
    let record: Value = serde_json::from_str(&rows[0].raw_event).unwrap();
    assert_eq!(record["size"], json!(size));
    assert_eq!(record["movedTo"], json!(format!("unreadable/{large}")));
    assert_eq!(
        names(&c, Some("unreadable")).await,
        vec![format!("unreadable/{large}")]
    );
    assert_eq!(names(&c, Some("BIG")).await, Vec::<String>::new());
    // The copy is the whole blob, untouched.
    match c.read(&format!("unreadable/{large}")).await.unwrap() {
        order_guard::deadletter::blobs::Read::TooLarge { size: copied } => assert_eq!(copied, size),
        other => panic!("the copy under unreadable/ is {other:?}"),
    }
}

/// The CLI's dead-letter commands on a container of this test's own.
struct Cli {
    azurite: Azurite,
    dir: tempfile::TempDir,
}

impl Cli {
    async fn new(memory_mb: u32) -> Cli {
        let azurite = Azurite::start_with_memory_mb(memory_mb);
        azurite.create_container("deadletters").await;
        Cli {
            azurite,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn container(&self) -> Container {
        Container::open(&self.azurite.settings("deadletters")).unwrap()
    }

    /// `order-guard <args>` in this test's folder with only
    /// `DEAD_LETTER_STORAGE` and `vars` set; its exit status, its output,
    /// and its peak resident memory in KiB (from `wait4`).
    fn run(&self, args: &[&str], vars: &[(&str, &str)]) -> (std::process::ExitStatus, String, u64) {
        let out_path = self.dir.path().join("out.txt");
        let out = std::fs::File::create(&out_path).unwrap();
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_order-guard"));
        // A plain fork, not posix_spawn's vfork: with vfork the child runs
        // on this process's memory until it execs, and `ru_maxrss` keeps
        // this process's own high-water mark. After a fork it starts from
        // this process's current resident set (an upper bound, said below).
        // SAFETY: the closure does nothing, so nothing unsafe runs between
        // fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(|| Ok(()));
        }
        let child = command
            .args(args)
            .current_dir(self.dir.path())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("RUST_LOG", "info")
            .env("DEAD_LETTER_STORAGE", self.azurite.connection_string())
            .envs(vars.iter().copied())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        let (status, peak_kib) = wait_with_peak_memory(child);
        (
            status,
            std::fs::read_to_string(&out_path).unwrap(),
            peak_kib,
        )
    }
}

/// Wait for `child` with `wait4`, which also gives its peak resident set
/// (`ru_maxrss`, KiB on Linux): this process's other children do not count.
fn wait_with_peak_memory(child: std::process::Child) -> (std::process::ExitStatus, u64) {
    use std::os::unix::process::ExitStatusExt;
    let pid = child.id() as libc::pid_t;
    let mut status: libc::c_int = 0;
    // SAFETY: a zeroed rusage is a valid value for wait4 to fill; the pid is
    // our own child, waited for once (the Child is forgotten, not waited).
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(waited, pid, "wait4: {}", std::io::Error::last_os_error());
    std::mem::forget(child);
    (
        std::process::ExitStatus::from_raw(status),
        usage.ru_maxrss as u64,
    )
}

/// With only `DEAD_LETTER_STORAGE` set (an operator who
/// forgot the app's other settings), `dead-letters replay` and `list`
/// refuse to run on the embedded defaults: they say which settings are
/// missing and the flag for a deliberate local replay, leave every blob
/// where it was, and create no local database.
#[tokio::test]
async fn dead_letter_commands_refuse_the_embedded_defaults() {
    let cli = Cli::new(256).await;
    let c = cli.container();
    let name = format!("PROD/{HOUR}/ffffffff-0000-0000-0000-000000000001.json");
    put(&c, &name, &json!([eg_dead(&eg_event("prod-1", "1"))])).await;
    for command in ["replay", "list"] {
        let (status, out, _) = cli.run(&["dead-letters", command], &[]);
        assert!(!status.success(), "{command}: {out}");
        assert!(
            out.contains(&format!(
                "dead-letters {command}: REDIS_URL and SQL_CONNECTION_STRING not set"
            )) && out.contains("--allow-embedded-state")
                && out.contains("Nothing was read or moved"),
            "{command}: {out}"
        );
        assert_eq!(names(&c, None).await, vec![name.clone()], "{command}");
        assert!(!cli.dir.path().join("order-guard.db").exists(), "{command}");
        // One setting given, the other still missing: named alone.
        let (status, out, _) = cli.run(
            &["dead-letters", command],
            &[("SQL_CONNECTION_STRING", "sqlite:./chosen.db")],
        );
        assert!(!status.success(), "{command}: {out}");
        assert!(
            out.contains(&format!("dead-letters {command}: REDIS_URL not set")),
            "{command}: {out}"
        );
    }
    // On purpose: the flag replays into the embedded state.
    let (status, out, _) = cli.run(&["dead-letters", "replay", "--allow-embedded-state"], &[]);
    assert!(status.success(), "{out}");
    assert!(
        out.contains("executed=1") && out.contains("moved=1"),
        "{out}"
    );
    assert!(cli.dir.path().join("order-guard.db").exists());
}

/// Black-box: a 300 MiB blob under a dead-letter
/// name is set aside without being read (the process's peak memory stays
/// far below it), the padded name after it is replayed, and the command
/// exits non-zero saying what it set aside.
#[tokio::test]
async fn a_huge_blob_does_not_take_the_process_memory_and_the_next_is_replayed() {
    const HUGE: usize = 300 * 1024 * 1024;
    let cli = Cli::new(1024).await;
    let c = cli.container();
    let huge = "HUGE/2025/6/14/8/abababab-0000-0000-0000-000000000001.json";
    let padded = "HUGE/2025/06/14/09/abababab-0000-0000-0000-000000000002.json";
    assert!(c
        .put_new(huge, Bytes::from(vec![b'['; HUGE]))
        .await
        .unwrap());
    put(&c, padded, &json!([eg_dead(&eg_event("after-huge", "1"))])).await;
    // The test process's own resident set, which the child's figure may
    // include (a fork maps it until the exec): the 300 MiB are gone by now.
    let ours_kib = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap();
    println!(
        "this test process's resident set before the run: {} MiB",
        ours_kib / 1024
    );
    let (status, out, peak_kib) = cli.run(
        &["dead-letters", "replay", "--allow-embedded-state"],
        &[("SQL_CONNECTION_STRING", "sqlite:./orders.db?mode=rwc")],
    );
    println!(
        "peak resident memory of `dead-letters replay` with a 300 MiB blob: {} MiB",
        peak_kib / 1024
    );
    assert!(
        !status.success(),
        "a blob set aside makes the run fail: {out}"
    );
    assert!(
        out.contains("blobs=2 events=1 executed=1 duplicates=0 conflicts=0 rejected=0 retries=0 unresolved=0 moved=1 unreadable=1"),
        "{out}"
    );
    assert!(
        out.contains("1 dead-letter blobs held no events or were too large"),
        "{out}"
    );
    assert!(peak_kib < 128 * 1024, "peak {peak_kib} KiB: {out}");
    let mut want = vec![format!("replayed/{padded}"), format!("unreadable/{huge}")];
    want.sort();
    assert_eq!(names(&c, None).await, want);
}
