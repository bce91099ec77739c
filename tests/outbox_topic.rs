//! The outbox's Event Grid destination, contract-tested: a local
//! endpoint enforces the publish API's contract as Microsoft documents it
//! (`tests/common/event_grid.rs`: path and api-version, the access key, the
//! schema's content type, 1 MB a request, the required fields), and plays
//! the service failing. Not an emulator: what the topic would deliver is
//! not exercised here.

mod common;

use std::sync::Arc;

use order_guard::order::Order;
use order_guard::outbox::{
    Destination, DispatchSettings, Dispatcher, Schema, TopicAuth, TopicDestination, TopicSettings,
};
use order_guard::storage::Secret;
use order_guard::store::{message_id, Execution, Listing, OrderStore};
use serde_json::json;

use common::event_grid::EventGridTopic;
use common::unique_id;

fn order(id: &str, account: &str, qty: &str) -> Order {
    Order::from_data(&json!({
        "orderId": id, "accountId": account, "side": "buy", "symbol": "MSFT", "quantity": qty
    }))
    .unwrap()
}

fn dispatcher(store: &Arc<dyn OrderStore>, topic: &EventGridTopic, key: &str) -> Dispatcher {
    let settings = TopicSettings {
        endpoint: topic.endpoint(),
        auth: TopicAuth::Key(Secret::new(key)),
        schema: if topic.cloud_events() {
            Schema::CloudEvents
        } else {
            Schema::EventGrid
        },
    };
    Dispatcher::new(
        Arc::clone(store),
        Destination::Topic(TopicDestination::new(settings).unwrap()),
        DispatchSettings::default(),
    )
}

async fn executed(store: &Arc<dyn OrderStore>, n: usize) -> Vec<Order> {
    let account = unique_id("acct");
    let mut orders = Vec::new();
    for i in 0..n {
        let o = order(&unique_id("ord"), &account, &(i + 1).to_string());
        assert_eq!(
            store.execute(&o, "e", "{}").await.unwrap(),
            Execution::Executed
        );
        orders.push(o);
    }
    orders
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_grid_schema_events_reach_the_topic_in_one_request() {
    let topic = EventGridTopic::start("topic-key-1", false).await;
    let (store, _dir) = common::sqlite_store().await;
    let store: Arc<dyn OrderStore> = store;
    let orders = executed(&store, 5).await;
    let d = dispatcher(&store, &topic, topic.key());
    assert_eq!(d.drain().await.unwrap(), 5);
    assert_eq!(topic.requests(), 1, "one request for the round");
    let got = topic.accepted();
    assert_eq!(got.len(), 5);
    for (o, e) in orders.iter().zip(&got) {
        assert_eq!(e["id"], message_id(&o.order_id).as_str());
        assert_eq!(e["eventType"], "OrderGuard.OrderExecuted");
        assert_eq!(e["subject"], format!("orders/{}", o.order_id));
        assert_eq!(e["data"]["orderId"], o.order_id.as_str());
        assert_eq!(e["dataVersion"], "1.0");
    }
    assert_eq!(store.outbox_counts().await.unwrap().undispatched, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cloudevents_topic_gets_cloud_events() {
    let topic = EventGridTopic::start("topic-key-2", true).await;
    let (store, _dir) = common::sqlite_store().await;
    let store: Arc<dyn OrderStore> = store;
    let orders = executed(&store, 2).await;
    assert_eq!(
        dispatcher(&store, &topic, topic.key())
            .drain()
            .await
            .unwrap(),
        2
    );
    let got = topic.accepted();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0]["specversion"], "1.0");
    assert_eq!(got[0]["type"], "OrderGuard.OrderExecuted");
    assert_eq!(got[1]["id"], message_id(&orders[1].order_id).as_str());
}

/// The service failing: a wrong key (401) and a 503 are the destination's
/// state (deferred, counted, said); a 413 for a single event, twice
/// running, is that event's (parked for an operator); nothing is lost,
/// and an operator's retry sends what was parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_defer_or_park_and_lose_nothing() {
    let topic = EventGridTopic::start("topic-key-3", false).await;
    let (store, _dir) = common::sqlite_store().await;
    let store: Arc<dyn OrderStore> = store;
    let orders = executed(&store, 3).await;
    let round = dispatcher(&store, &topic, "not-the-key")
        .round()
        .await
        .unwrap();
    assert_eq!((round.claimed, round.sent, round.failed), (3, 0, 3));
    let waiting = store
        .announcements(&Listing::Undispatched, 10)
        .await
        .unwrap();
    assert!(waiting.iter().all(|a| a.attempts == 1 && !a.parked));
    let why = waiting[0].last_error.as_deref().unwrap();
    assert!(why.contains("refused the credential (401)"), "{why}");

    store.retry_announcements(None).await.unwrap();
    topic.answer_next(&[503]);
    let d = dispatcher(&store, &topic, topic.key());
    let round = d.round().await.unwrap();
    assert_eq!((round.sent, round.failed), (0, 3));
    let a = &store
        .announcements(&Listing::Undispatched, 1)
        .await
        .unwrap()[0];
    assert_eq!((a.attempts, a.parked), (2, false));

    // One event alone refused as too large: parked, the others go on.
    let late = executed(&store, 1).await;
    store.retry_announcements(None).await.unwrap();
    let d = Dispatcher::new(
        Arc::clone(&store),
        Destination::Topic(
            TopicDestination::new(TopicSettings {
                endpoint: topic.endpoint(),
                auth: TopicAuth::Key(Secret::new(topic.key())),
                schema: Schema::EventGrid,
            })
            .unwrap(),
        ),
        DispatchSettings {
            batch: 1,
            ..DispatchSettings::default()
        },
    );
    // Refused alone once: it waits (a refusal misread must not park it);
    // refused alone again, running: parked.
    topic.answer_next(&[413, 413]);
    let round = d.round().await.unwrap();
    assert_eq!(round.failed, 1);
    assert_eq!(store.outbox_counts().await.unwrap().parked, 0);
    store.retry_announcements(None).await.unwrap();
    let round = d.round().await.unwrap();
    assert_eq!(round.failed, 1);
    let parked: Vec<_> = store
        .announcements(&Listing::Undispatched, 10)
        .await
        .unwrap()
        .into_iter()
        .filter(|a| a.parked)
        .collect();
    assert_eq!(parked.len(), 1);
    assert!(parked[0].last_error.as_deref().unwrap().contains("413"));
    assert_eq!(d.drain().await.unwrap(), 3, "the rows behind it go on");
    assert_eq!(store.outbox_counts().await.unwrap().parked, 1);
    assert_eq!(
        store
            .retry_announcements(Some(&parked[0].message_id))
            .await
            .unwrap(),
        1
    );
    assert_eq!(d.drain().await.unwrap(), 1);
    let mut want: Vec<String> = orders
        .iter()
        .chain(&late)
        .map(|o| message_id(&o.order_id))
        .collect();
    want.sort();
    let mut got: Vec<String> = topic
        .accepted()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    got.sort();
    assert_eq!(got, want, "each announced once, none lost");
}

/// A topic made with the other input schema than `OUTBOX_TOPIC_SCHEMA`
/// says answers 400 to every request: the setting's fault, not the
/// events'. Nothing is parked however often it is tried, and once the
/// setting is fixed every row goes, with no `outbox retry`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_mismatch_parks_nothing_and_every_row_goes_once_fixed() {
    let topic = EventGridTopic::start("topic-key-5", true).await;
    let (store, _dir) = common::sqlite_store().await;
    let store: Arc<dyn OrderStore> = store;
    let orders = executed(&store, 5).await;
    let mismatched = |batch: u32| {
        Dispatcher::new(
            Arc::clone(&store),
            Destination::Topic(
                TopicDestination::new(TopicSettings {
                    endpoint: topic.endpoint(),
                    auth: TopicAuth::Key(Secret::new(topic.key())),
                    schema: Schema::EventGrid,
                })
                .unwrap(),
            ),
            DispatchSettings {
                batch,
                ..DispatchSettings::default()
            },
        )
    };
    // Rounds of all five, then of one row each, several times over: each
    // row refused alone, every time, and never parked.
    for batch in [64, 1, 1, 64, 1] {
        store.retry_announcements(None).await.unwrap();
        let round = mismatched(batch).round().await.unwrap();
        assert_eq!((round.sent, round.failed), (0, batch.min(5) as usize));
        let counts = store.outbox_counts().await.unwrap();
        assert_eq!((counts.undispatched, counts.parked), (5, 0), "{batch}");
    }
    let waiting = store
        .announcements(&Listing::Undispatched, 10)
        .await
        .unwrap();
    let why = waiting[0].last_error.as_deref().unwrap();
    assert!(why.contains("OUTBOX_TOPIC_SCHEMA"), "{why}");
    assert!(topic.accepted().is_empty());
    // Fixed: the rows are due again after their back-off, and go.
    let fixed = dispatcher(&store, &topic, topic.key());
    let started = std::time::Instant::now();
    let mut sent = 0;
    while sent < 5 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "{sent} of 5 sent after the fix"
        );
        sent += fixed.round().await.unwrap().sent;
        if sent < 5 {
            // The back-off's due time is the signal: a row is claimable
            // from then on (1 s to 4 s here).
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
    let mut got: Vec<String> = topic
        .accepted()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    got.sort();
    let mut want: Vec<String> = orders.iter().map(|o| message_id(&o.order_id)).collect();
    want.sort();
    assert_eq!(got, want, "each once");
    assert_eq!(store.outbox_counts().await.unwrap().parked, 0);
}

/// The double itself refuses what Event Grid refuses, so a pass above
/// means the handler met the contract (not a lenient fake).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_contract_endpoint_refuses_what_event_grid_refuses() {
    let topic = EventGridTopic::start("k", false).await;
    order_guard::tls::install_crypto_provider();
    let client = reqwest::Client::new();
    let post = |url: String, key: Option<&'static str>, ct: &'static str, body: String| {
        let mut r = client.post(url).header("content-type", ct).body(body);
        if let Some(k) = key {
            r = r.header("aeg-sas-key", k);
        }
        async move { r.send().await.unwrap().status().as_u16() }
    };
    let url = format!("{}?api-version=2018-01-01", topic.endpoint());
    let good = json!([{"id": "1", "subject": "s", "eventType": "t",
        "eventTime": "2026-12-02T08:00:00Z", "data": {}, "dataVersion": "1.0"}])
    .to_string();
    assert_eq!(
        post(url.clone(), Some("k"), "application/json", good.clone()).await,
        200
    );
    assert_eq!(
        post(
            topic.endpoint(),
            Some("k"),
            "application/json",
            good.clone()
        )
        .await,
        400
    );
    assert_eq!(
        post(url.clone(), None, "application/json", good.clone()).await,
        401
    );
    assert_eq!(
        post(url.clone(), Some("x"), "application/json", good.clone()).await,
        401
    );
    assert_eq!(
        post(url.clone(), Some("k"), "text/plain", good.clone()).await,
        400
    );
    let no_type = json!([{"id": "1", "subject": "s", "eventTime": "2026-12-02T08:00:00Z",
        "data": {}, "dataVersion": "1.0"}])
    .to_string();
    assert_eq!(
        post(url.clone(), Some("k"), "application/json", no_type).await,
        400
    );
    let big = format!(
        "[{{\"id\": \"1\", \"subject\": \"s\", \"eventType\": \"t\", \"eventTime\": \"2026-12-02T08:00:00Z\", \"dataVersion\": \"1.0\", \"data\": \"{}\"}}]",
        "x".repeat(common::event_grid::MAX_REQUEST_BYTES)
    );
    assert_eq!(post(url, Some("k"), "application/json", big).await, 413);
    assert_eq!(topic.accepted().len(), 1);
}

/// An app whose only identity is user-assigned (what Azure's templates
/// deploy): `AZURE_CLIENT_ID` names it, and the topic's client asks the
/// identity endpoint for that one. Without it the endpoint gives no token
/// and the rows wait, saying why. (The token then goes to the contract
/// endpoint, which takes keys only: the request is refused there, after
/// the token was had.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_topic_signs_in_as_the_user_assigned_identity_azure_client_id_names() {
    use common::identity::{user_assigned_identity_endpoint, IdentityEnv, HEADER_SECRET};
    const CLIENT_ID: &str = "6f1c3b52-8d1e-4c5a-9f43-2b7d0e9a1c11";
    let identity = user_assigned_identity_endpoint(CLIENT_ID).await;
    let _env = IdentityEnv::set(Some(&identity.url), Some(HEADER_SECRET)).await;
    let topic = EventGridTopic::start("topic-key-6", false).await;
    let (store, _dir) = common::sqlite_store().await;
    let store: Arc<dyn OrderStore> = store;
    executed(&store, 2).await;
    // The settings as `config` builds them from the app's settings (an
    // https endpoint: Entra ID tokens never go over http), pointed at the
    // local contract endpoint.
    let auth_of = |client_id: Option<&str>| {
        let mut settings = vec![(
            "OUTBOX_TOPIC_ENDPOINT",
            "https://orders.westeurope-1.eventgrid.azure.net/api/events",
        )];
        settings.extend(client_id.map(|id| ("AZURE_CLIENT_ID", id)));
        let config = order_guard::config::Config::from_lookup(|k| {
            settings
                .iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| v.to_string())
        })
        .unwrap();
        match config.outbox.destination {
            Some(order_guard::outbox::DestinationSettings::Topic(t)) => t.auth,
            other => panic!("want a topic: {other:?}"),
        }
    };
    let round_with = |auth: TopicAuth| {
        let settings = TopicSettings {
            endpoint: topic.endpoint(),
            auth,
            schema: Schema::EventGrid,
        };
        Dispatcher::new(
            Arc::clone(&store),
            Destination::Topic(TopicDestination::new(settings).unwrap()),
            DispatchSettings::default(),
        )
    };
    // No AZURE_CLIENT_ID: the system-assigned identity is asked for, and
    // there is none.
    let round = round_with(auth_of(None)).round().await.unwrap();
    assert_eq!(round.failed, 2);
    let why = store
        .announcements(&Listing::Undispatched, 1)
        .await
        .unwrap()[0]
        .last_error
        .clone()
        .unwrap();
    assert!(why.contains("no Entra ID token"), "{why}");
    assert!(identity.refused.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    assert_eq!(identity.tokens_handed_out(), 0);

    store.retry_announcements(None).await.unwrap();
    let round = round_with(auth_of(Some(CLIENT_ID))).round().await.unwrap();
    assert_eq!(round.failed, 2, "the contract endpoint takes keys only");
    let requests = identity.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0].client_id.as_deref(), Some(CLIENT_ID));
    assert_eq!(
        requests[0].resource.as_deref(),
        Some("https://eventgrid.azure.net")
    );
    let why = store
        .announcements(&Listing::Undispatched, 1)
        .await
        .unwrap()[0]
        .last_error
        .clone()
        .unwrap();
    assert!(why.contains("refused the credential (401)"), "{why}");
}
