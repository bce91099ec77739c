//! Event Grid's webhook door (`order-guard webhook`), the real binary on a
//! real Redis and a real SQLite file, tokens from a local issuer: the two
//! handshakes, deliveries in both schemas executed once, the answers by
//! Event Grid's rules and what a refusal says, probes, and a batch of
//! thousands of events; who may deliver (`auth`); where it may start and
//! how it stops (`lifecycle`).

#[path = "../common/mod.rs"]
mod common;

mod auth;
mod lifecycle;

use std::time::Duration;

use common::webhook::*;
use common::{cloud_event, eg_event, free_port, order_data, signal, unique_id, RedisServer};
use serde_json::{json, Value};

/// A webhook process and what it runs on.
struct Webhook {
    child: tokio::process::Child,
    base: String,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Webhook {
    /// `order-guard webhook` with `extra` settings, on `redis` and a new
    /// SQLite file; returns once `/healthz` answers.
    async fn start(redis: &RedisServer, extra: &[(String, String)]) -> Webhook {
        let mut hook = Webhook::spawn(redis, extra, &[]);
        hook.wait_alive().await;
        hook
    }

    /// `order-guard webhook` started (run by `wrapper`, a command and its
    /// arguments, when one is given), not waited for.
    fn spawn(redis: &RedisServer, extra: &[(String, String)], wrapper: &[&str]) -> Webhook {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let log = dir.path().join("webhook.log");
        let out = std::fs::File::create(&log).unwrap();
        let binary = common::handler_binary();
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut cmd = tokio::process::Command::new(program);
                cmd.args(args).arg(&binary);
                cmd
            }
            None => tokio::process::Command::new(&binary),
        };
        cmd.arg("webhook")
            .env_clear()
            .env("RUST_LOG", "info")
            .env("WEBHOOK_PORT", port.to_string())
            .env("REDIS_URL", redis.url())
            .env(
                "SQL_CONNECTION_STRING",
                format!("sqlite:{}?mode=rwc", dir.path().join("orders.db").display()),
            )
            .envs(extra.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .current_dir(dir.path())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .kill_on_drop(true);
        let child = cmd.spawn().expect("start order-guard webhook");
        Webhook {
            child,
            base: format!("http://127.0.0.1:{port}"),
            log,
            _dir: dir,
        }
    }

    /// Once `/healthz` answers.
    async fn wait_alive(&mut self) {
        let started = std::time::Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("order-guard webhook exited ({status}): {}", self.log());
            }
            let probe = tokio::time::timeout(
                Duration::from_secs(2),
                hyper::Client::new().get(format!("{}/healthz", self.base).parse().unwrap()),
            )
            .await;
            if let Ok(Ok(r)) = probe {
                if r.status() == 200 {
                    break;
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the webhook did not answer /healthz: {}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Once its log holds `line`, or after `limit`.
    async fn wait_for_log(&mut self, line: &str, limit: Duration) {
        let started = std::time::Instant::now();
        while !self.log().contains(line) {
            assert!(
                started.elapsed() < limit,
                "no {line:?} in the log within {limit:?}: {}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

fn order(tag: &str) -> Value {
    order_data(&unique_id(tag), "buy", "MSFT", "10", "acct-1")
}

#[tokio::test]
async fn the_validation_handshake_is_answered_with_its_code_and_the_options_one_allows_the_origin()
{
    let redis = RedisServer::start();
    let issuer = Issuer::start().await;
    let hook = Webhook::start(&redis, &issuer.settings()).await;
    let url = format!("{}/events", hook.base);
    let body = serde_json::to_vec(&validation_event("512d38b6-c7b8")).unwrap();
    let handshake = |token: Option<String>| {
        let mut headers = vec![
            ("Content-Type", "application/json".to_string()),
            ("aeg-event-type", "SubscriptionValidation".to_string()),
        ];
        if let Some(t) = token {
            headers.push(("Authorization", format!("Bearer {t}")));
        }
        let (url, body) = (url.clone(), body.clone());
        async move { webhook_request("POST", &url, &headers, body).await }
    };
    let answer = handshake(Some(issuer.token())).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(
        answer.body,
        json!({ "validationResponse": "512d38b6-c7b8" })
    );
    let unsigned = handshake(None).await;
    assert_eq!(unsigned.status, 401, "the handshake is authenticated too");

    let options = webhook_request(
        "OPTIONS",
        &url,
        &[("WebHook-Request-Origin", "eventgrid.azure.net".to_string())],
        Vec::new(),
    )
    .await;
    assert_eq!(options.status, 200);
    let header = |k: &str| {
        options
            .headers
            .get(k)
            .map(|v| v.to_str().unwrap().to_string())
    };
    assert_eq!(
        header("webhook-allowed-origin").as_deref(),
        Some("eventgrid.azure.net")
    );
    assert_eq!(header("webhook-allowed-rate").as_deref(), Some("*"));
    assert!(header("allow").unwrap().contains("POST"));
    let no_origin = webhook_request("OPTIONS", &url, &[], Vec::new()).await;
    assert_eq!(no_origin.status, 400);
}

#[tokio::test]
async fn an_order_delivered_twice_executes_once_in_either_schema_and_in_batches() {
    let redis = RedisServer::start();
    let issuer = Issuer::start().await;
    let hook = Webhook::start(&redis, &issuer.settings()).await;
    let token = issuer.token();

    // Event Grid schema: an array, twice.
    let events = json!([eg_event(order("eg"))]);
    let first = deliver(&hook.base, Some(&token), &events).await;
    assert_eq!(
        (first.status, outcomes(&first)),
        (200, vec!["executed".to_string()])
    );
    let again = deliver(&hook.base, Some(&token), &events).await;
    assert_eq!(
        (again.status, outcomes(&again)),
        (200, vec!["duplicate".to_string()])
    );

    // One CloudEvent, and a CloudEvents batch holding it again with another.
    let one = cloud_event(order("ce"));
    let single = webhook_request(
        "POST",
        &format!("{}/events", hook.base),
        &[
            (
                "Content-Type",
                "application/cloudevents+json; charset=utf-8".to_string(),
            ),
            ("Authorization", format!("Bearer {token}")),
        ],
        serde_json::to_vec(&one).unwrap(),
    )
    .await;
    assert_eq!(
        (single.status, outcomes(&single)),
        (200, vec!["executed".to_string()])
    );
    let batch = webhook_request(
        "POST",
        &format!("{}/events", hook.base),
        &[
            (
                "Content-Type",
                "application/cloudevents-batch+json; charset=utf-8".to_string(),
            ),
            ("Authorization", format!("Bearer {token}")),
        ],
        serde_json::to_vec(&json!([one, cloud_event(order("ce2"))])).unwrap(),
    )
    .await;
    assert_eq!(
        (batch.status, outcomes(&batch)),
        (200, vec!["duplicate".to_string(), "executed".to_string()])
    );
}

#[tokio::test]
async fn a_delivery_that_can_never_be_read_is_400_and_one_too_large_413() {
    let redis = RedisServer::start();
    let issuer = Issuer::start().await;
    let mut settings = issuer.settings();
    settings.push(("MAX_BODY_BYTES".into(), "4096".into()));
    let hook = Webhook::start(&redis, &settings).await;
    let token = issuer.token();
    let url = format!("{}/events", hook.base);
    let auth = vec![("Authorization", format!("Bearer {token}"))];
    for body in [&b"{not json"[..], b"[]", b"42"] {
        let answer = webhook_request("POST", &url, &auth, body.to_vec()).await;
        assert_eq!(answer.status, 400, "{body:?}: {}", answer.body);
    }
    let large = json!([eg_event(json!({"orderId": "x", "pad": "p".repeat(5000)}))]);
    let answer = deliver(&hook.base, Some(&token), &large).await;
    assert_eq!(answer.status, 413, "{}", answer.body);
    assert!(answer.body["error"]
        .as_str()
        .unwrap()
        .contains("MAX_BODY_BYTES"));
    // An event that is not an order is the event's fault alone: stored as
    // rejected, and the delivery done.
    let poison_event = deliver(
        &hook.base,
        Some(&token),
        &json!([eg_event(json!({"orderId": "p-1"}))]),
    )
    .await;
    assert_eq!(
        (poison_event.status, outcomes(&poison_event)),
        (200, vec!["rejected".to_string()])
    );
}

#[tokio::test]
async fn readiness_follows_the_guard_and_the_store() {
    let mut redis = RedisServer::start();
    let issuer = Issuer::start().await;
    let hook = Webhook::start(&redis, &issuer.settings()).await;
    let ready = |base: String| async move {
        webhook_request("GET", &format!("{base}/readyz"), &[], Vec::new()).await
    };
    let answer = ready(hook.base.clone()).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    redis.stop();
    let answer = ready(hook.base.clone()).await;
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert!(
        answer.body["reason"].as_str().unwrap().contains("guard"),
        "{}",
        answer.body
    );
    let alive = webhook_request("GET", &format!("{}/healthz", hook.base), &[], Vec::new()).await;
    assert_eq!(alive.status, 200, "alive whatever its dependencies say");
}

#[tokio::test]
async fn a_handshake_typed_event_in_a_notification_never_hides_the_orders_after_it() {
    let redis = RedisServer::start();
    let issuer = Issuer::start().await;
    let hook = Webhook::start(&redis, &issuer.settings()).await;
    let token = issuer.token();
    let validation = validation_event("hidden")[0].clone();
    let deleted = json!({
        "id": unique_id("deleted"), "eventType": "Microsoft.EventGrid.SubscriptionDeletedEvent",
        "subject": "", "eventTime": "2026-12-05T10:00:00Z", "dataVersion": "1", "data": {}
    });
    for first in [validation, deleted] {
        // `aeg-event-type: Notification`: events, whatever the first one's type.
        let batch = json!([first, eg_event(order("behind")), eg_event(order("behind"))]);
        let answer = deliver(&hook.base, Some(&token), &batch).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(
            outcomes(&answer),
            vec!["rejected", "executed", "executed"],
            "{}",
            answer.body
        );
        let again = deliver(&hook.base, Some(&token), &batch).await;
        assert_eq!(outcomes(&again)[1..], ["duplicate", "duplicate"]);
    }
}

#[tokio::test]
async fn refusals_say_only_their_class_and_unknown_paths_are_404() {
    let redis = RedisServer::start();
    let issuer = Issuer::start().await;
    let hook = Webhook::start(&redis, &issuer.settings()).await;
    let events = json!([eg_event(order("refused"))]);
    let mut other_app = event_grid_claims();
    other_app["aud"] = json!("api://another-app");
    let mut no_role = event_grid_claims();
    no_role["roles"] = json!([]);
    for (token, status, class) in [
        (None, 401, "unauthorized"),
        (Some(issuer.key.sign(&other_app)), 401, "unauthorized"),
        (Some(issuer.key.sign(&no_role)), 403, "forbidden"),
    ] {
        let answer = deliver(&hook.base, token.as_deref(), &events).await;
        assert_eq!(
            (answer.status, answer.body.clone()),
            (status, json!({ "error": class }))
        );
    }
    // The detail is in the log, for the operator.
    let log = hook.log();
    assert!(log.contains("refused (401 unauthorized)"), "{log}");
    assert!(log.contains(AUDIENCE) && log.contains(TENANT), "{log}");
    assert!(log.contains(ROLE), "{log}");

    for (method, path, status, allow) in [
        ("GET", "/", 404, None),
        ("POST", "/nope", 404, None),
        ("GET", "/events/x", 404, None),
        ("GET", "/events", 405, Some("POST, OPTIONS")),
        ("POST", "/healthz", 405, Some("GET")),
        ("DELETE", "/readyz", 405, Some("GET")),
    ] {
        let answer =
            webhook_request(method, &format!("{}{path}", hook.base), &[], Vec::new()).await;
        assert_eq!(answer.status, status, "{method} {path}: {}", answer.body);
        assert_eq!(
            answer.headers.get("allow").map(|v| v.to_str().unwrap()),
            allow,
            "{method} {path}"
        );
        let class = if status == 404 {
            "not found"
        } else {
            "method not allowed"
        };
        assert_eq!(answer.body, json!({ "error": class }), "{method} {path}");
    }
    drop(hook);

    // Keys that cannot be fetched: 503, without the key endpoint's address.
    let mut down = Issuer::start().await;
    down.stop();
    let hook = Webhook::start(&redis, &down.settings()).await;
    let answer = deliver(&hook.base, Some(&down.token()), &events).await;
    assert_eq!(
        (answer.status, answer.body),
        (503, json!({ "error": "keys unavailable" }))
    );
    assert!(hook.log().contains(&down.authority()), "{}", hook.log());
}

#[tokio::test]
async fn a_delivery_of_thousands_of_events_is_answered_once_each_executed_once() {
    let redis = RedisServer::start();
    let issuer = Issuer::start().await;
    let hook = Webhook::start(&redis, &issuer.settings()).await;
    let token = issuer.token();
    // 2 000 events, more than the SQLite writer's queue holds (1 024).
    let events: Vec<Value> = (0..2000).map(|_| eg_event(order("bulk"))).collect();
    let batch = Value::Array(events);
    let answer = deliver(&hook.base, Some(&token), &batch).await;
    assert_eq!(answer.status, 200, "{}", hook.log());
    let first = outcomes(&answer);
    assert_eq!(first.len(), 2000);
    assert!(first.iter().all(|o| o == "executed"), "{first:?}");
    let again = outcomes(&deliver(&hook.base, Some(&token), &batch).await);
    assert!(again.iter().all(|o| o == "duplicate"), "{again:?}");
}
