//! The outbox's dispatch against a real Azure Queue Storage API (Azurite's
//! queue service): what executes is announced on the queue with
//! its stable id; a destination down or a dispatcher killed between send and
//! mark loses nothing and repeats only that id; `serve` announces what it
//! executes, and duplicates announce nothing.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use order_guard::order::Order;
use order_guard::outbox::dispatch::Round;
use order_guard::outbox::envelope::{cloud_event, to_text};
use order_guard::outbox::queue::queue_sas;
use order_guard::outbox::{
    Destination, DispatchSettings, Dispatcher, Encoding, Naming, QueueDestination, QueueSettings,
};
use order_guard::store::{message_id, Execution, Listing, OrderStore};
use serde_json::{json, Value};

use common::azurite::Azurite;
use common::unique_id;

fn order(id: &str, account: &str, side: &str, qty: &str) -> Order {
    Order::from_data(&json!({
        "orderId": id, "accountId": account, "side": side, "symbol": "MSFT", "quantity": qty
    }))
    .unwrap()
}

fn queue_settings(azurite: &Azurite, queue: &str) -> QueueSettings {
    QueueSettings {
        storage: order_guard::storage::parse_storage_of(
            &azurite.queue_connection_string(),
            order_guard::storage::Service::Queue,
        )
        .unwrap(),
        queue: queue.into(),
        encoding: Encoding::Base64,
        message_ttl: None,
    }
}

fn dispatcher(store: &Arc<dyn OrderStore>, settings: QueueSettings) -> Dispatcher {
    Dispatcher::new(
        Arc::clone(store),
        Destination::Queue(QueueDestination::new(settings)),
        DispatchSettings::default(),
    )
}

/// Each message's events: every message is a JSON array of CloudEvents.
fn events_of(text: &str) -> Vec<Value> {
    match serde_json::from_str(text) {
        Ok(Value::Array(events)) => events,
        other => panic!("a message is a JSON array of events: {other:?} in {text}"),
    }
}

/// The queue's messages' events, by id (several copies of one id kept
/// together).
fn by_id(texts: &[String]) -> BTreeMap<String, Vec<Value>> {
    let mut out: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for e in texts.iter().flat_map(|t| events_of(t)) {
        out.entry(e["id"].as_str().unwrap().to_string())
            .or_default()
            .push(e);
    }
    out
}

async fn execute_all(store: &Arc<dyn OrderStore>, orders: &[Order]) {
    for o in orders {
        assert_eq!(
            store.execute(o, "e", "{}").await.unwrap(),
            Execution::Executed
        );
    }
}

/// A message outlives the row it announces: sent with no expiry (Azure's
/// default is 7 days, after which a consumer still away would find
/// nothing, and the row is purged after the retention), or with the one
/// `OUTBOX_MESSAGE_TTL_SECONDS` sets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn announcements_never_expire_on_the_queue_unless_told_to() {
    let azurite = Azurite::start_queue();
    let (store, _dir) = common::sqlite_store().await;
    let store: Arc<dyn OrderStore> = store;
    let account = unique_id("acct");
    let year = |t: &azure_core::time::OffsetDateTime| t.year();
    for (queue, ttl) in [
        ("forever", None),
        ("an-hour", Some(Duration::from_secs(3600))),
    ] {
        azurite.create_queue(queue).await;
        execute_all(&store, &[order(&unique_id("ord"), &account, "buy", "1")]).await;
        let settings = QueueSettings {
            message_ttl: ttl,
            ..queue_settings(&azurite, queue)
        };
        assert_eq!(dispatcher(&store, settings).drain().await.unwrap(), 1);
        let expiries = azurite.expiries(queue).await;
        assert_eq!(expiries.len(), 1, "{queue}");
        let now = azure_core::time::OffsetDateTime::now_utc();
        match ttl {
            None => assert_eq!(year(&expiries[0]), 9999, "never expires: {expiries:?}"),
            Some(ttl) => {
                let left = expiries[0] - now;
                assert!(
                    left <= ttl && left > ttl / 2,
                    "expires in {left} with a TTL of {ttl:?}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executions_reach_the_queue_packed_as_cloud_events_with_their_message_id() {
    let azurite = Azurite::start_queue();
    azurite.create_queue("order-executed").await;
    let (store, _dir) = common::sqlite_store().await;
    let store: Arc<dyn OrderStore> = store;
    let account = unique_id("acct");
    let orders: Vec<Order> = ["5", "2.5", "1"]
        .iter()
        .map(|q| order(&unique_id("ord"), &account, "buy", q))
        .collect();
    execute_all(&store, &orders).await;
    let d = dispatcher(&store, queue_settings(&azurite, "order-executed"));
    assert_eq!(d.drain().await.unwrap(), 3);
    let texts = azurite.drain_queue("order-executed", true).await;
    // One round, one message: its three events packed in their order.
    assert_eq!(texts.len(), 1, "{texts:#?}");
    let sequences: Vec<i64> = events_of(&texts[0])
        .iter()
        .map(|e| e["data"]["sequence"].as_i64().unwrap())
        .collect();
    assert!(
        sequences.len() == 3 && sequences.windows(2).all(|w| w[0] < w[1]),
        "{sequences:?}"
    );
    let got = by_id(&texts);
    assert_eq!(got.len(), 3, "{got:#?}");
    for (o, after) in orders.iter().zip(["5", "7.5", "8.5"]) {
        let copies = &got[&message_id(&o.order_id)];
        assert_eq!(copies.len(), 1);
        let e = &copies[0];
        assert_eq!(e["specversion"], "1.0");
        assert_eq!(e["type"], "OrderGuard.OrderExecuted");
        assert_eq!(e["subject"], format!("orders/{}", o.order_id));
        assert_eq!(e["data"]["orderId"], o.order_id.as_str());
        assert_eq!(e["data"]["accountId"], account.as_str());
        assert_eq!(e["data"]["positionAfter"], after);
        let row = store.order(&o.order_id).await.unwrap().unwrap();
        assert_eq!(e["data"]["executedAt"], row.executed_at.unwrap().as_str());
    }
    // Dispatched once: nothing left, nothing sent again.
    assert_eq!(store.outbox_counts().await.unwrap().undispatched, 0);
    // A duplicate delivery executes nothing and announces nothing.
    assert_eq!(
        store.execute(&orders[0], "e", "{}").await.unwrap(),
        Execution::AlreadyDone
    );
    assert_eq!(d.drain().await.unwrap(), 0);
    assert!(azurite.drain_queue("order-executed", true).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_down_defers_every_row_and_loses_none() {
    let azurite = Azurite::start_queue();
    azurite.create_queue("order-executed").await;
    let (store, _dir) = common::sqlite_store().await;
    let store: Arc<dyn OrderStore> = store;
    let account = unique_id("acct");
    let orders: Vec<Order> = (0..4)
        .map(|_| order(&unique_id("ord"), &account, "sell", "1"))
        .collect();
    execute_all(&store, &orders).await;
    // Nothing listens on this port: every send fails, every row is counted.
    let mut down = queue_settings(&azurite, "order-executed");
    down.storage.endpoint = format!("http://127.0.0.1:{}/devstoreaccount1", common::free_port());
    let round = dispatcher(&store, down).round().await.unwrap();
    assert_eq!((round.claimed, round.sent, round.failed), (4, 0, 4));
    let waiting = store
        .announcements(&Listing::Undispatched, 100)
        .await
        .unwrap();
    assert_eq!(waiting.len(), 4);
    for a in &waiting {
        assert_eq!(a.attempts, 1);
        assert!(!a.parked, "a destination down is not the row's fault");
        let why = a.last_error.as_deref().unwrap();
        assert!(why.contains("could not be reached"), "{why}");
    }
    // A missing queue is named, with the fix, and is not the row's fault.
    let missing = dispatcher(&store, queue_settings(&azurite, "no-such-queue"));
    store.retry_announcements(None).await.unwrap();
    let round = missing.round().await.unwrap();
    assert_eq!(round.failed, 4);
    let a = &store
        .announcements(&Listing::Undispatched, 1)
        .await
        .unwrap()[0];
    let why = a.last_error.as_deref().unwrap();
    assert!(
        why.contains("does not exist (404)") && why.contains("docs/deploy.md step 6"),
        "{why}"
    );
    assert_eq!((a.attempts, a.parked), (2, false));
    // Back up: the operator's retry makes them due now; all four arrive.
    assert_eq!(store.retry_announcements(None).await.unwrap(), 4);
    let up = dispatcher(&store, queue_settings(&azurite, "order-executed"));
    assert_eq!(up.drain().await.unwrap(), 4);
    let got = by_id(&azurite.drain_queue("order-executed", true).await);
    let want: Vec<String> = orders.iter().map(|o| message_id(&o.order_id)).collect();
    let mut want_sorted = want.clone();
    want_sorted.sort();
    assert_eq!(got.keys().cloned().collect::<Vec<_>>(), want_sorted);
    assert_eq!(store.outbox_counts().await.unwrap().undispatched, 0);
}

/// A running dispatcher sends the rows its process executes without a
/// claim; one it could not send is deferred under the lease it was born
/// with (counted, not parked), and a later claim sends it once the
/// destination is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_born_row_not_sent_is_deferred_and_sent_by_a_later_claim() {
    let azurite = Azurite::start_queue();
    let (sqlite, dir) = common::sqlite_store().await;
    let store: Arc<dyn OrderStore> = sqlite;
    // The queue does not exist yet: the send fails (404, the
    // destination's state, not the row's fault).
    let d = Arc::new(Dispatcher::new(
        Arc::clone(&store),
        Destination::Queue(QueueDestination::new(queue_settings(&azurite, "late"))),
        DispatchSettings {
            poll: Duration::from_millis(200),
            ..DispatchSettings::default()
        },
    ));
    let running = d.spawn();
    let o = order(&unique_id("ord"), &unique_id("acct"), "buy", "3");
    execute_all(&store, std::slice::from_ref(&o)).await;
    d.announcer().executed();
    let row = || async {
        let rows = store
            .announcements(&Listing::Order(o.order_id.clone()), 1)
            .await
            .unwrap();
        rows.into_iter().next().expect("the order's announcement")
    };
    let started = Instant::now();
    while row().await.attempts == 0 {
        assert!(started.elapsed() < Duration::from_secs(10), "never tried");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deferred = row().await;
    assert!(!deferred.parked && deferred.dispatched_at.is_none());
    let why = deferred.last_error.unwrap();
    assert!(why.contains("does not exist (404)"), "{why}");
    azurite.create_queue("late").await;
    let mut got = Vec::new();
    while got.is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never sent: {:?}",
            row().await
        );
        got.extend(azurite.drain_queue("late", true).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        by_id(&got).keys().cloned().collect::<Vec<_>>(),
        [message_id(&o.order_id)]
    );
    while row().await.dispatched_at.is_none() {
        assert!(started.elapsed() < Duration::from_secs(30), "never marked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Sent by a claim: the row holds the claim's token (born, it held none).
    let token: Option<String> = rusqlite::Connection::open(dir.path().join("orders.db"))
        .unwrap()
        .query_row("SELECT ClaimToken FROM Outbox", [], |r| r.get(0))
        .unwrap();
    assert!(token.is_some(), "sent with no claim");
    running.abort();
}

/// Each failed send of a row waits longer than the last: 1 s after the
/// first, 2 s after the second (`NextAttemptAt` against the failure's
/// time, both written by the deferral's one statement).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_failing_again_waits_twice_as_long() {
    let azurite = Azurite::start_queue();
    let (store, dir) = common::sqlite_store().await;
    let store: Arc<dyn OrderStore> = store;
    let o = order(&unique_id("ord"), &unique_id("acct"), "buy", "1");
    execute_all(&store, std::slice::from_ref(&o)).await;
    // No such queue: every send fails on the destination's state (404).
    let d = dispatcher(&store, queue_settings(&azurite, "missing"));
    let db = rusqlite::Connection::open(dir.path().join("orders.db")).unwrap();
    let back_off = || -> (i64, Option<f64>) {
        db.query_row(
            "SELECT Attempts, (julianday(NextAttemptAt) - julianday(LeaseUntil)) * 86400 FROM Outbox",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
    };
    let started = Instant::now();
    for (attempts, wait) in [(1, 1.0), (2, 2.0)] {
        // The row is claimable again once its back-off has passed.
        while back_off().0 < attempts {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "never tried again"
            );
            assert_eq!(d.drain().await.unwrap(), 0);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (tried, waits) = back_off();
        assert_eq!(tried, attempts);
        let waits = waits.expect("a deferred row's next attempt and lease");
        assert!(
            (waits - wait).abs() < 0.01,
            "after {attempts} failures it waits {waits} s"
        );
    }
}

/// An execution wakes the running dispatcher through its announcer: the
/// announcement goes at once, not at the next poll (an hour away here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execution_wakes_the_dispatcher_before_its_next_poll() {
    let azurite = Azurite::start_queue();
    azurite.create_queue("woken").await;
    let (store, _dir) = common::sqlite_store().await;
    let store: Arc<dyn OrderStore> = store;
    let poll = Duration::from_secs(3600);
    let d = Arc::new(Dispatcher::new(
        Arc::clone(&store),
        Destination::Queue(QueueDestination::new(queue_settings(&azurite, "woken"))),
        DispatchSettings {
            poll,
            ..DispatchSettings::default()
        },
    ));
    let running = d.spawn();
    let started = Instant::now();
    // Two executions, each announced before the next: the second is born
    // after the dispatcher's first round ended, so only the wake sends it.
    for n in 0..2 {
        let o = order(&unique_id("ord"), &unique_id("acct"), "buy", "1");
        execute_all(&store, std::slice::from_ref(&o)).await;
        d.announcer().executed();
        let mut got = Vec::new();
        while got.is_empty() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "execution {n} not announced until the poll ({poll:?})"
            );
            got.extend(azurite.drain_queue("woken", true).await);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            by_id(&got).keys().cloned().collect::<Vec<_>>(),
            [message_id(&o.order_id)]
        );
    }
    running.abort();
}

/// Births too old to send within their lease are taken from the hand-off
/// and counted (so the drain goes on to the births behind them), not sent
/// from memory: a claim sends them once their lease has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn births_too_old_to_send_from_memory_are_counted_and_left_for_a_claim() {
    let azurite = Azurite::start_queue();
    azurite.create_queue("stale").await;
    let (store, _dir) = common::sqlite_store().await;
    let store: Arc<dyn OrderStore> = store;
    // A lease of zero: every birth is already too old to send from memory.
    let handoff = store
        .hand_over_announcements(Duration::ZERO)
        .expect("SQLite hands its births over");
    let orders = [
        order(&unique_id("ord"), &unique_id("acct"), "buy", "1"),
        order(&unique_id("ord"), &unique_id("acct"), "sell", "2"),
    ];
    execute_all(&store, &orders).await;
    let d = dispatcher(&store, queue_settings(&azurite, "stale"));
    assert_eq!(
        d.send_born(&handoff).await.unwrap(),
        Round {
            claimed: 2,
            sent: 0,
            failed: 0
        }
    );
    assert!(azurite.drain_queue("stale", true).await.is_empty());
    assert_eq!(d.drain().await.unwrap(), 2, "a claim sends them");
    assert_eq!(d.sent(), 2, "sent since it started");
    let sent = by_id(&azurite.drain_queue("stale", true).await);
    let want: Vec<String> = orders.iter().map(|o| message_id(&o.order_id)).collect();
    assert_eq!(
        sent.keys()
            .cloned()
            .collect::<std::collections::BTreeSet<_>>(),
        want.into_iter().collect()
    );
}

/// A dispatcher that sent and died before its mark: the lease runs out,
/// another sends the row again, with the same id and the same bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatcher_killed_between_send_and_mark_repeats_only_that_id() {
    let azurite = Azurite::start_queue();
    azurite.create_queue("order-executed").await;
    let (store, _dir) = common::sqlite_store().await;
    let store: Arc<dyn OrderStore> = store;
    let o = order(&unique_id("ord"), &unique_id("acct"), "buy", "2");
    execute_all(&store, std::slice::from_ref(&o)).await;
    // Long enough that a send under a loaded machine ends within its
    // window (half of it), so this sends it just once more.
    let lease = Duration::from_secs(2);
    // The one that died: claimed, sent, never marked.
    let started = Instant::now();
    let claim = store.claim_announcements(10, lease).await.unwrap();
    assert_eq!(claim.rows.len(), 1);
    let first = QueueDestination::new(queue_settings(&azurite, "order-executed"));
    first
        .post(&[to_text(&cloud_event(&Naming::default(), &claim.rows[0]))])
        .await
        .unwrap();
    // Another dispatcher: nothing to claim while the lease holds, the row
    // once it has run out (the lease is the only signal there is).
    let other = Dispatcher::new(
        Arc::clone(&store),
        Destination::Queue(QueueDestination::new(queue_settings(
            &azurite,
            "order-executed",
        ))),
        DispatchSettings {
            lease,
            ..DispatchSettings::default()
        },
    );
    let mut sent = 0;
    while sent == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never reclaimed"
        );
        sent = other.drain().await.unwrap();
        if sent == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert!(started.elapsed() >= lease / 2, "claimed under a live lease");
    let texts = azurite.drain_queue("order-executed", true).await;
    assert_eq!(texts.len(), 2, "sent twice: at least once");
    assert_eq!(texts[0], texts[1], "the same id and the same bytes");
    assert_eq!(
        by_id(&texts).keys().next().unwrap(),
        &message_id(&o.order_id)
    );
    assert_eq!(store.outbox_counts().await.unwrap().undispatched, 0);
}

/// A SAS made from the account key may add messages to its queue and do
/// nothing else (least privilege for the dispatcher).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dispatchers_sas_may_only_add_to_its_queue() {
    let azurite = Azurite::start_queue();
    azurite.create_queue("order-executed").await;
    azurite.create_queue("other").await;
    let sas = queue_sas(
        order_guard::storage::EMULATOR_ACCOUNT,
        "order-executed",
        order_guard::storage::EMULATOR_KEY,
        "a",
        std::time::SystemTime::now() + Duration::from_secs(600),
    )
    .unwrap();
    order_guard::tls::install_crypto_provider();
    let client = |queue: &str| {
        azure_storage_queue::QueueClient::new(
            azure_core::http::Url::parse(&format!("{}/{queue}?{sas}", azurite.endpoint())).unwrap(),
            None,
            None,
        )
        .unwrap()
    };
    let message = || {
        azure_storage_queue::models::QueueMessage {
            message_text: Some("x".into()),
        }
        .try_into()
        .unwrap()
    };
    client("order-executed")
        .send_message(message(), None)
        .await
        .expect("add is granted");
    let status = |e: azure_core::Error| e.http_status().map(u16::from);
    let read = client("order-executed").peek_messages(None).await;
    assert_eq!(read.err().and_then(status), Some(403), "no read");
    let elsewhere = client("other").send_message(message(), None).await;
    assert_eq!(
        elsewhere.err().and_then(status),
        Some(403),
        "no other queue"
    );
}

/// The real binary as deployed: `serve` announces what it executes, right
/// after answering, and a duplicate delivery announces nothing more;
/// `outbox list` then shows nothing waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_announces_what_it_executes_and_nothing_else() {
    let azurite = Azurite::start_queue();
    azurite.create_queue("executions").await;
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let mut env = common::handler_env(port, dir.path());
    let settings = [
        ("RUST_LOG", "info".to_string()),
        (
            "SQL_CONNECTION_STRING",
            format!("sqlite:{}?mode=rwc", dir.path().join("orders.db").display()),
        ),
        ("OUTBOX_STORAGE", azurite.queue_connection_string()),
        ("OUTBOX_QUEUE", "executions".into()),
        ("OUTBOX_MESSAGE_ENCODING", "none".into()),
    ];
    env.extend(settings.iter().map(|(k, v)| (k.to_string(), v.clone())));
    let log = dir.path().join("serve.log");
    let mut child = common::spawn_handler(&common::handler_binary(), &env, &log);
    let log_text = || String::from_utf8_lossy(&std::fs::read(&log).unwrap()).into_owned();
    if let Err(e) = common::wait_ready(port, &mut child, Duration::from_secs(30)).await {
        panic!("{e}; log:\n{}", log_text());
    }
    let url = format!("http://127.0.0.1:{port}/OrderTrigger");
    let client = hyper::Client::new();
    let account = unique_id("acct");
    let ids: Vec<String> = (0..3).map(|_| unique_id("ord")).collect();
    let deliveries = ids.iter().chain(std::iter::once(&ids[0]));
    for id in deliveries {
        let event = common::eg_event(common::order_data(id, "buy", "MSFT", "1", &account));
        let body = serde_json::to_vec(&common::invocation(event)).unwrap();
        let answer = common::try_send(&client, &url, body, false, Duration::from_secs(30))
            .await
            .unwrap();
        assert!(
            matches!(answer.verdict(), common::Verdict::Succeeded(_)),
            "{:?}",
            answer.verdict()
        );
    }
    // The announcements arrive on their own (nobody asks the dispatcher).
    let mut got = Vec::new();
    let started = Instant::now();
    while by_id(&got).len() < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{} of 3 announcements arrived; log:\n{}",
            by_id(&got).len(),
            log_text()
        );
        got.extend(azurite.drain_queue("executions", false).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut want: Vec<String> = ids.iter().map(|id| message_id(id)).collect();
    want.sort();
    assert_eq!(by_id(&got).keys().cloned().collect::<Vec<_>>(), want);
    assert!(log_text().contains("outbox: dispatching to the Storage Queue executions"));
    // The mark follows the send: wait for it (the rows' own state, read
    // from the file the handler writes; bounded).
    let conn = rusqlite::Connection::open(dir.path().join("orders.db")).unwrap();
    let rows = || -> Vec<(Option<String>, bool)> {
        conn.prepare("SELECT ClaimToken, DispatchedAt IS NOT NULL FROM Outbox ORDER BY Seq")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    let started = Instant::now();
    while rows().iter().any(|(_, marked)| !marked) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "not all marked: {:?}",
            rows()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Sent from memory, with no claim: no row holds a claim's token (a
    // claim writes its own on every row it takes).
    let tokens = rows();
    assert_eq!(tokens.len(), 3, "{tokens:?}");
    assert!(tokens.iter().all(|(t, _)| t.is_none()), "{tokens:?}");
    // Nothing waits; the CLI says so.
    let out = std::process::Command::new(common::handler_binary())
        .args(["outbox", "list"])
        .envs(settings.iter().map(|(k, v)| (*k, v.as_str())))
        .env_remove("REDIS_URL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("undispatched=0 parked=0 dispatched=3"),
        "{stdout}"
    );
    // No duplicate arrived meanwhile.
    assert!(azurite.drain_queue("executions", false).await.is_empty());
}

/// On plans that scale to zero the `DeadLetterSweep` timer starts an
/// instance when no event does: its tick also sends what the outbox holds
/// (here with the sweep itself off), and says how many.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timer_tick_sends_what_the_outbox_holds() {
    let azurite = Azurite::start_queue();
    azurite.create_queue("order-executed").await;
    let (store, _dir) = common::sqlite_store().await;
    let store: Arc<dyn OrderStore> = store;
    let account = unique_id("acct");
    let orders: Vec<Order> = (0..2)
        .map(|_| order(&unique_id("ord"), &account, "buy", "1"))
        .collect();
    execute_all(&store, &orders).await;
    let processor = Arc::new(order_guard::processor::Processor::new(
        Arc::new(order_guard::guard::MemoryGuard::new(
            order_guard::guard::GuardSettings::default(),
        )),
        Arc::clone(&store),
        order_guard::processor::ProcessorSettings::default(),
    ));
    let tick = order_guard::deadletter::function::SweepFunction::new(processor, None).with_outbox(
        Some(Arc::new(dispatcher(
            &store,
            queue_settings(&azurite, "order-executed"),
        ))),
    );
    let timer = json!({"Data": {"timer": {"Schedule": {"AdjustForDST": true}, "IsPastDue": false}},
                       "Metadata": {"sys": {"MethodName": "DeadLetterSweep"}}});
    let (status, answer) = tick.invoke(&serde_json::to_vec(&timer).unwrap()).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["ReturnValue"]["sweep"], "off");
    assert_eq!(answer["ReturnValue"]["outbox"]["sent"], 2, "{answer}");
    assert!(answer["Logs"][1]
        .as_str()
        .unwrap()
        .contains("outbox: 2 announcements sent"));
    let got = by_id(&azurite.drain_queue("order-executed", true).await);
    assert_eq!(got.len(), 2);
    // A body that is not a timer's is refused before anything is sent.
    let orders2 = vec![order(&unique_id("ord"), &account, "buy", "1")];
    execute_all(&store, &orders2).await;
    let (status, _) = tick.invoke(b"[]").await;
    assert_eq!(status, 400);
    assert_eq!(store.outbox_counts().await.unwrap().undispatched, 1);
}

/// `order-guard` with this file and queue's settings, run to its end.
fn outbox_cli(dir: &std::path::Path, azurite: &Azurite, args: &[&str]) -> std::process::Output {
    std::process::Command::new(common::handler_binary())
        .args(args)
        .env(
            "SQL_CONNECTION_STRING",
            format!("sqlite:{}", dir.join("orders.db").display()),
        )
        .env("OUTBOX_STORAGE", azurite.queue_connection_string())
        .env("OUTBOX_QUEUE", "by-hand")
        .env("OUTBOX_MESSAGE_ENCODING", "none")
        .env_remove("REDIS_URL")
        .env_remove("OUTBOX_TOPIC_ENDPOINT")
        .env_remove("FUNCTIONS_CUSTOMHANDLER_PORT")
        .output()
        .unwrap()
}

/// A queue message that may expire unread before its row is purged is an
/// announcement that can be lost with its row saying "sent": such a
/// lifetime is refused at start, naming both settings; accepted on
/// purpose, `outbox list` says what it means.
#[test]
fn a_message_lifetime_shorter_than_the_retention_is_refused_unless_meant() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str], extra: &[(&str, &str)]| {
        std::process::Command::new(common::handler_binary())
            .args(args)
            .env(
                "SQL_CONNECTION_STRING",
                format!("sqlite:{}", dir.path().join("orders.db").display()),
            )
            .env("OUTBOX_STORAGE", "UseDevelopmentStorage=true")
            .env("OUTBOX_RETENTION_HOURS", "48")
            .env_remove("REDIS_URL")
            .env_remove("OUTBOX_TOPIC_ENDPOINT")
            .env_remove("OUTBOX_MESSAGE_TTL_UNDER_RETENTION")
            .env_remove("FUNCTIONS_CUSTOMHANDLER_PORT")
            .envs(extra.iter().copied())
            .output()
            .unwrap()
    };
    let migrated = run(&["migrate"], &[]);
    assert!(migrated.status.success(), "{}", text(&migrated));

    let day = [("OUTBOX_MESSAGE_TTL_SECONDS", "86400")];
    let refused = run(&["outbox", "list"], &day);
    assert!(!refused.status.success(), "{}", text(&refused));
    let said = text(&refused);
    assert!(
        said.contains("OUTBOX_MESSAGE_TTL_SECONDS")
            && said.contains("48 h, OUTBOX_RETENTION_HOURS")
            && said.contains("OUTBOX_MESSAGE_TTL_UNDER_RETENTION=accept"),
        "{said}"
    );

    let meant = [
        ("OUTBOX_MESSAGE_TTL_SECONDS", "86400"),
        ("OUTBOX_MESSAGE_TTL_UNDER_RETENTION", "accept"),
    ];
    let listed = run(&["outbox", "list"], &meant);
    assert!(listed.status.success(), "{}", text(&listed));
    assert!(
        text(&listed)
            .contains("messages expire unread after 86400 s, before their rows are purged"),
        "{}",
        text(&listed)
    );
    // As long as the retention: accepted as it is.
    let two_days = [("OUTBOX_MESSAGE_TTL_SECONDS", "172800")];
    let listed = run(&["outbox", "list"], &two_days);
    assert!(listed.status.success(), "{}", text(&listed));
    assert!(
        text(&listed).contains("(messages expire unread after 172800 s)"),
        "{}",
        text(&listed)
    );
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// An operator's shell may name another destination than production's:
/// `outbox dispatch` and `outbox resend` say what they would do (where,
/// as what, how many) and act only with `--yes`. A resent announcement
/// goes again with its id and sequence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatch_and_resend_act_only_when_told_yes() {
    let azurite = Azurite::start_queue();
    azurite.create_queue("by-hand").await;
    let (store, dir) = common::sqlite_store().await;
    let store: Arc<dyn OrderStore> = store;
    let account = unique_id("acct");
    let orders: Vec<Order> = (0..3)
        .map(|_| order(&unique_id("ord"), &account, "buy", "1"))
        .collect();
    execute_all(&store, &orders).await;

    let out = outbox_cli(dir.path(), &azurite, &["outbox", "dispatch"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let said = text(&out);
    for part in [
        "3 undispatched",
        "Storage Queue by-hand",
        "OrderGuard.OrderExecuted",
        "--yes",
    ] {
        assert!(said.contains(part), "{part:?} not in: {said}");
    }
    assert!(
        azurite.drain_queue("by-hand", false).await.is_empty(),
        "nothing sent"
    );
    assert_eq!(
        store.outbox_counts().await.unwrap().undispatched,
        3,
        "nothing marked"
    );

    let out = outbox_cli(dir.path(), &azurite, &["outbox", "dispatch", "--yes"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("3 announcements dispatched"),
        "{}",
        text(&out)
    );
    let first = by_id(&azurite.drain_queue("by-hand", false).await);
    assert_eq!(first.len(), 3);

    let id = message_id(&orders[1].order_id);
    let out = outbox_cli(dir.path(), &azurite, &["outbox", "resend", &id]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_eq!(
        store.outbox_counts().await.unwrap().undispatched,
        0,
        "nothing changed"
    );
    let out = outbox_cli(dir.path(), &azurite, &["outbox", "resend", &id, "--yes"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(store.outbox_counts().await.unwrap().undispatched, 1);
    let out = outbox_cli(dir.path(), &azurite, &["outbox", "dispatch", "--yes"]);
    assert!(
        text(&out).contains("1 announcements dispatched"),
        "{}",
        text(&out)
    );
    let again = by_id(&azurite.drain_queue("by-hand", false).await);
    assert_eq!(again.keys().collect::<Vec<_>>(), vec![&id]);
    assert_eq!(
        again[&id], first[&id],
        "the same event: id, sequence, bytes"
    );

    // Every one dispatched in the last hour: all three again.
    let out = outbox_cli(
        dir.path(),
        &azurite,
        &["outbox", "resend", "--since", "1h", "--yes"],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).starts_with("3 announcements due again"),
        "{}",
        text(&out)
    );
    let out = outbox_cli(
        dir.path(),
        &azurite,
        &["outbox", "resend", "--since", "tomorrow"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}
