//! Event Grid's webhook door (`order-guard webhook`), the real binary on a
//! real Redis and a real SQLite file, tokens from a local issuer: the two
//! handshakes, deliveries in both schemas executed once, the answers by
//! Event Grid's rules, who may deliver, probes, and the drain on SIGTERM.

mod common;

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
async fn only_event_grids_valid_token_for_this_app_may_deliver() {
    let redis = RedisServer::start();
    let issuer = Issuer::start().await;
    let hook = Webhook::start(&redis, &issuer.settings()).await;
    let events = || json!([eg_event(order("auth"))]);
    let with = |claims: Value| issuer.key.sign(&claims);
    let change = |k: &str, v: Value| {
        let mut c = event_grid_claims();
        c[k] = v;
        c
    };
    let without = |k: &str| {
        let mut c = event_grid_claims();
        c.as_object_mut().unwrap().remove(k);
        c
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let stranger = issuer.new_key("key-1");
    let cases: Vec<(&str, Option<String>, u16)> = vec![
        ("no token", None, 401),
        ("not a JWT", Some("not-a-token".into()), 401),
        (
            "signed by another key under the same kid",
            Some(stranger.sign(&event_grid_claims())),
            401,
        ),
        (
            "for another audience",
            Some(with(change("aud", json!("api://another-app")))),
            401,
        ),
        (
            "from another tenant",
            Some(with(change(
                "iss",
                json!("https://sts.windows.net/99999999-2222-3333-4444-555555555555/"),
            ))),
            401,
        ),
        ("expired", Some(with(change("exp", json!(now - 600)))), 401),
        (
            "not yet valid",
            Some(with(change("nbf", json!(now + 600)))),
            401,
        ),
        (
            "without the role",
            Some(with(change("roles", json!(["Reader"])))),
            403,
        ),
        ("without roles", Some(with(without("roles"))), 403),
        (
            "issued to another app",
            Some(with(change(
                "appid",
                json!("00000000-0000-0000-0000-000000000001"),
            ))),
            403,
        ),
    ];
    for (what, token, status) in cases {
        let answer = deliver(&hook.base, token.as_deref(), &events()).await;
        assert_eq!(answer.status, status, "{what}: {}", answer.body);
    }
    // A v2 token names its caller in `azp` and its issuer so.
    let mut v2 = without("appid");
    v2["azp"] = json!(EVENT_GRID_APP_ID);
    v2["iss"] = json!(format!("https://login.microsoftonline.com/{TENANT}/v2.0"));
    let answer = deliver(&hook.base, Some(&with(v2)), &events()).await;
    assert_eq!(
        (answer.status, outcomes(&answer)),
        (200, vec!["executed".to_string()])
    );
    // Nothing refused was executed: the refused order is still new.
    let refused_then_good = events();
    let _ = deliver(&hook.base, None, &refused_then_good).await;
    let good = deliver(&hook.base, Some(&issuer.token()), &refused_then_good).await;
    assert_eq!(outcomes(&good), vec!["executed".to_string()]);
}

#[tokio::test]
async fn rolled_keys_are_fetched_again_and_keys_that_cannot_be_had_are_503() {
    let redis = RedisServer::start();
    let mut issuer = Issuer::start().await;
    let hook = Webhook::start(&redis, &issuer.settings()).await;
    let ok = deliver(
        &hook.base,
        Some(&issuer.token()),
        &json!([eg_event(order("k"))]),
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    let again = deliver(
        &hook.base,
        Some(&issuer.token()),
        &json!([eg_event(order("k1"))]),
    )
    .await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(issuer.fetches(), 1, "the keys are fetched once and kept");
    // Entra ID rolls its keys. A token signed by the new key, so soon after
    // the fetch, is answered 503 (Event Grid delivers again later, when the
    // keys may be fetched again), never 401, which Event Grid never retries;
    // and it costs no fetch (a flood of made-up key ids costs none either).
    let rolled = issuer.new_key("key-2");
    issuer.publish(&[&issuer.key, &rolled]);
    let later = json!([eg_event(order("k2"))]);
    let answer = deliver(&hook.base, Some(&rolled.sign(&event_grid_claims())), &later).await;
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert_eq!(issuer.fetches(), 1);
    // A process that starts after the roll fetches the keys at its first
    // token and takes the new key.
    drop(hook);
    let hook = Webhook::start(&redis, &issuer.settings()).await;
    let answer = deliver(&hook.base, Some(&rolled.sign(&event_grid_claims())), &later).await;
    assert_eq!(
        (answer.status, outcomes(&answer)),
        (200, vec!["executed".to_string()])
    );
    assert_eq!(issuer.fetches(), 2);
    drop(hook);

    // A webhook whose keys cannot be fetched answers 503 (Event Grid
    // retries), never 401 or 403 (which it never retries).
    issuer.stop();
    let hook = Webhook::start(&redis, &issuer.settings()).await;
    let answer = deliver(
        &hook.base,
        Some(&issuer.token()),
        &json!([eg_event(order("down"))]),
    )
    .await;
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert!(hook.log().contains("signing keys"), "{}", hook.log());
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
async fn sigterm_drains_taking_deliveries_until_the_last_stretch_of_the_grace() {
    let redis = RedisServer::start();
    let issuer = Issuer::start().await;
    let mut settings = issuer.settings();
    settings.push(("SHUTDOWN_GRACE_SECONDS".into(), "4".into()));
    let mut hook = Webhook::start(&redis, &settings).await;
    let port: u16 = hook.base.rsplit(':').next().unwrap().parse().unwrap();
    let pid = hook.child.id().unwrap();
    drain_as_event_grid_meets_it(
        &hook.base,
        port,
        &issuer.token(),
        || json!([eg_event(order("drain"))]),
        || signal(pid, "TERM"),
    )
    .await;
    let status = tokio::time::timeout(Duration::from_secs(30), hook.child.wait())
        .await
        .expect("the webhook exits once drained")
        .unwrap();
    assert!(status.success(), "{status}: {}", hook.log());
    assert!(
        hook.log().contains("all deliveries drained"),
        "{}",
        hook.log()
    );
}

#[tokio::test]
async fn a_quiet_drain_ends_before_the_grace() {
    let redis = RedisServer::start();
    let issuer = Issuer::start().await;
    let mut settings = issuer.settings();
    settings.push(("SHUTDOWN_GRACE_SECONDS".into(), "300".into()));
    let mut hook = Webhook::start(&redis, &settings).await;
    signal(hook.child.id().unwrap(), "TERM");
    // Nothing in flight and nothing coming: over after the quiet stretch
    // (5 s), not the grace (5 min).
    let status = tokio::time::timeout(Duration::from_secs(60), hook.child.wait())
        .await
        .expect("a quiet drain ends before its grace")
        .unwrap();
    assert!(status.success(), "{status}: {}", hook.log());
}

#[test]
fn authentication_off_is_refused_where_the_embedded_state_would_be() {
    let dir = tempfile::tempdir().unwrap();
    let (status, out) = common::run_command(
        dir.path(),
        &["webhook"],
        &[
            ("WEBHOOK_AUTH", "off"),
            ("ORDER_GUARD_IMAGE", "0.2.0"),
            ("REDIS_URL", "redis://127.0.0.1:1"),
            (
                "SQL_CONNECTION_STRING",
                "Server=tcp:127.0.0.1,1;User ID=u;Password=p",
            ),
        ],
    );
    assert!(!status.success());
    assert!(
        out.contains("WEBHOOK_AUTH") && out.contains("this project's image"),
        "{out}"
    );
    let (status, out) = common::run_command(dir.path(), &["webhook"], &[]);
    assert!(!status.success());
    assert!(out.contains("WEBHOOK_TENANT_ID"), "{out}");
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

/// The path of `program` on this machine's PATH.
fn on_path(program: &str) -> String {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| std::path::Path::new(d).join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{program} is not on PATH (util-linux)"))
        .display()
        .to_string()
}

#[tokio::test]
async fn sigterm_during_a_slow_start_ends_the_process_promptly_even_as_pid_1() {
    let redis = RedisServer::start();
    let issuer = Issuer::start().await;
    let mut settings = issuer.settings();
    settings.push(("SQLITE_BUSY_TIMEOUT_MS".into(), "100".into()));
    // PID 1 of its own PID namespace, as in a container: the kernel drops
    // a signal PID 1 does not listen for.
    // The start waits for its SQLite file, which this test holds locked.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("locked.db");
    let held = rusqlite::Connection::open(&file).unwrap();
    held.execute_batch("BEGIN EXCLUSIVE; CREATE TABLE held(x);")
        .unwrap();
    settings.push((
        "SQL_CONNECTION_STRING".into(),
        format!("sqlite:{}?mode=rwc", file.display()),
    ));
    let unshare = on_path("unshare");
    let mut hook = Webhook::spawn(
        &redis,
        &settings,
        &[&unshare, "--pid", "--fork", "--kill-child"],
    );
    hook.wait_for_log("store not ready yet", Duration::from_secs(30))
        .await;
    let outer = hook.child.id().unwrap();
    let children = std::fs::read_to_string(format!("/proc/{outer}/task/{outer}/children")).unwrap();
    let pid: u32 = children.split_whitespace().next().unwrap().parse().unwrap();
    signal(pid, "TERM");
    let status = tokio::time::timeout(Duration::from_secs(5), hook.child.wait())
        .await
        .unwrap_or_else(|_| panic!("SIGTERM during the start was not honoured: {}", hook.log()))
        .unwrap();
    assert!(status.success(), "{status}: {}", hook.log());
    assert!(hook.log().contains("SIGTERM received"), "{}", hook.log());
    drop(held);
}

/// `order-guard webhook` started with only `vars` set, in a directory of
/// its own: `Err` with its output when it refuses to start, `Ok` once it
/// listens (then it is stopped).
async fn start_with(vars: &[(String, String)]) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("webhook.log");
    let out = std::fs::File::create(&log).unwrap();
    let mut child = tokio::process::Command::new(common::handler_binary())
        .arg("webhook")
        .env_clear()
        .env("WEBHOOK_PORT", free_port().to_string())
        .envs(vars.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .current_dir(dir.path())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(status) = child.try_wait().unwrap() {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(!status.success(), "exited 0 without serving: {text}");
            return Err(text);
        }
        if text.contains("order-guard webhook listening on") {
            return Ok(());
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "neither refused nor listening: {text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn where_several_replicas_may_run_nothing_per_replica_and_no_open_door_is_accepted() {
    let issuer = Issuer::start().await;
    let with_entra = |place: &[(&str, &str)]| -> Vec<(String, String)> {
        let mut vars = issuer.settings();
        vars.extend(place.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        vars
    };
    // (the place, its platform's variables, what the refusal names)
    type Place<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
    let places: [Place; 5] = [
        (
            "a Kubernetes pod of another image",
            &[("KUBERNETES_SERVICE_HOST", "10.0.0.1")],
            "KUBERNETES_SERVICE_HOST",
        ),
        (
            "this image built without its version",
            &[("ORDER_GUARD_IMAGE", "")],
            "ORDER_GUARD_IMAGE",
        ),
        (
            "a Container App revision",
            &[("CONTAINER_APP_REVISION", "orders--r1")],
            "CONTAINER_APP_REVISION",
        ),
        (
            "Core Tools' mark in a pod, for a command Core Tools never starts",
            &[
                ("FUNCTIONS_CORETOOLS_ENVIRONMENT", "true"),
                ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
            ],
            "KUBERNETES_SERVICE_HOST",
        ),
        (
            "a Container App",
            &[("CONTAINER_APP_NAME", "orders")],
            "CONTAINER_APP_NAME",
        ),
    ];
    for (place, vars, names) in places {
        // The embedded state: refused, naming the place and the opt-in.
        let out = start_with(&with_entra(vars))
            .await
            .err()
            .unwrap_or_else(|| panic!("{place}: started on the embedded state"));
        assert!(
            out.contains("REDIS_URL")
                && out.contains(names)
                && out.contains("ORDER_GUARD_ALLOW_EMBEDDED_STATE=true"),
            "{place}: {out}"
        );
        // No authentication: refused even with the state elsewhere.
        let mut off = vars.to_vec();
        off.extend([
            ("WEBHOOK_AUTH", "off"),
            ("REDIS_URL", "redis://127.0.0.1:1"),
            (
                "SQL_CONNECTION_STRING",
                "Server=tcp:127.0.0.1,1;User ID=u;Password=p",
            ),
        ]);
        let out = start_with(&with_entra(&off))
            .await
            .err()
            .unwrap_or_else(|| panic!("{place}: started with no authentication"));
        assert!(
            out.contains("WEBHOOK_AUTH") && out.contains(names),
            "{place}: {out}"
        );
    }
    // Not every container: a dev container or a CI runner (this machine
    // has /.dockerenv and CONTAINER_NAME) runs one process on one disk.
    let redis = RedisServer::start();
    let url = redis.url();
    let runner = [
        ("CONTAINER_NAME", "uid-runner-1"),
        ("WEBHOOK_AUTH", "off"),
        ("REDIS_URL", url.as_str()),
        ("SQL_CONNECTION_STRING", "sqlite:./orders.db?mode=rwc"),
    ];
    start_with(&with_entra(&runner))
        .await
        .expect("a CI runner's container");
    // A deliberate single replica says so.
    let pod = [
        ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
        ("ORDER_GUARD_ALLOW_EMBEDDED_STATE", "true"),
        ("SQL_CONNECTION_STRING", "sqlite:./orders.db?mode=rwc"),
    ];
    start_with(&with_entra(&pod))
        .await
        .expect("a single-replica pod that opted in");
}

#[tokio::test]
async fn a_key_endpoint_outage_costs_one_fetch_however_many_deliveries_come() {
    let redis = RedisServer::start();
    let issuer = Issuer::start().await;
    // The key endpoint answers 500, slowly.
    issuer.answer_keys(500, Duration::from_millis(500));
    let hook = Webhook::start(&redis, &issuer.settings()).await;
    let events = json!([eg_event(order("outage"))]);
    let token = issuer.token();
    // Four at once: one fetch, which all four wait for together.
    let at_once =
        futures::future::join_all((0..4).map(|_| deliver(&hook.base, Some(&token), &events))).await;
    assert_eq!(issuer.fetches(), 1, "one fetch for everyone");
    for answer in at_once {
        assert_eq!(
            (answer.status, answer.body),
            (503, json!({ "error": "keys unavailable" }))
        );
    }
    // A failed fetch moments ago: 503 at once, without another.
    for _ in 0..6 {
        assert_eq!(deliver(&hook.base, Some(&token), &events).await.status, 503);
    }
    assert_eq!(issuer.fetches(), 1, "a floor between fetches");
}

/// Deliver `events` with `token` until `done` says the answer ends the
/// wait, asserting each answer's status is `status` until then.
#[cfg(feature = "failpoints")]
async fn deliver_until(
    base: &str,
    token: &str,
    events: &Value,
    status: u16,
    done: impl Fn(&WebhookAnswer) -> bool,
) -> WebhookAnswer {
    let started = std::time::Instant::now();
    loop {
        let answer = deliver(base, Some(token), events).await;
        if done(&answer) {
            return answer;
        }
        assert_eq!(answer.status, status, "{}", answer.body);
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "never done: {}",
            answer.body
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(feature = "failpoints")]
#[tokio::test]
async fn held_keys_serve_through_a_key_endpoint_outage_and_an_unknown_key_id_is_503_not_401() {
    let redis = RedisServer::start();
    let issuer = Issuer::start().await;
    // Half a second between fetches in place of 30.
    let mut settings = issuer.settings();
    settings.push((
        "FAILPOINTS".into(),
        "webhook_keys_floor_ms=return(500)".into(),
    ));
    let hook = Webhook::start(&redis, &settings).await;
    let first = deliver(
        &hook.base,
        Some(&issuer.token()),
        &json!([eg_event(order("held"))]),
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(issuer.fetches(), 1);

    // The key endpoint fails; Entra ID has rolled its keys meanwhile.
    issuer.answer_keys(500, Duration::ZERO);
    let rolled = issuer.new_key("key-2");
    let by_rolled = rolled.sign(&event_grid_claims());
    let events = json!([eg_event(order("rolled"))]);
    // A token of the keys held: served, the outage changes nothing.
    let held = deliver(
        &hook.base,
        Some(&issuer.token()),
        &json!([eg_event(order("held2"))]),
    )
    .await;
    assert_eq!(held.status, 200, "{}", held.body);
    // The rolled key id: 503 while the keys cannot be fetched, through the
    // floor and through a failed fetch (never 401, never retried).
    deliver_until(&hook.base, &by_rolled, &events, 503, |_| {
        issuer.fetches() >= 2
    })
    .await;
    let answer = deliver(&hook.base, Some(&by_rolled), &events).await;
    assert_eq!(
        (answer.status, answer.body),
        (503, json!({ "error": "keys unavailable" }))
    );
    // The endpoint is back with the rolled key: found once the floor allows.
    issuer.publish(&[&issuer.key, &rolled]);
    issuer.answer_keys(200, Duration::ZERO);
    let done = deliver_until(&hook.base, &by_rolled, &events, 503, |a| a.status != 503).await;
    assert_eq!(
        (done.status, outcomes(&done)),
        (200, vec!["executed".to_string()])
    );
}

#[cfg(feature = "failpoints")]
#[tokio::test]
async fn keys_held_too_long_are_refreshed_behind_the_deliveries_once_per_floor() {
    let redis = RedisServer::start();
    let issuer = Issuer::start().await;
    // Keys always held too long; a second between fetches.
    let mut settings = issuer.settings();
    settings.push((
        "FAILPOINTS".into(),
        "webhook_keys_floor_ms=return(1000);webhook_keys_kept_ms=return(0)".into(),
    ));
    let hook = Webhook::start(&redis, &settings).await;
    let token = issuer.token();
    let first = deliver(&hook.base, Some(&token), &json!([eg_event(order("old"))])).await;
    assert_eq!(first.status, 200, "{}", first.body);
    // The identity provider's incident: each fetch hangs, then fails.
    issuer.answer_keys(500, Duration::from_secs(3));
    let started = std::time::Instant::now();
    for _ in 0..10 {
        let answer = deliver(&hook.base, Some(&token), &json!([eg_event(order("old"))])).await;
        assert_eq!(answer.status, 200, "the keys held serve: {}", answer.body);
    }
    let floors = started.elapsed().as_millis() / 1000 + 1;
    let refreshes = issuer.fetches() - 1;
    assert!(
        refreshes as u128 <= floors,
        "{refreshes} refreshes in {:?}: at most one per second",
        started.elapsed()
    );
}

#[tokio::test]
async fn both_audience_forms_and_the_issuers_the_authority_publishes_are_taken() {
    let redis = RedisServer::start();
    let issuer = Issuer::start().await;
    // A sovereign cloud: its own issuers, in its OpenID configuration.
    let (v1, v2) = (
        format!("https://sts.chinacloudapi.cn/{TENANT}/"),
        format!("https://login.chinacloudapi.cn/{TENANT}/v2.0"),
    );
    issuer.set_issuers(&v1, &v2);
    let app = "5b3c7f3e-8a52-4c1e-9f0e-0d1c2b3a4f5e";
    let mut settings = issuer.settings();
    settings.retain(|(k, _)| k != "WEBHOOK_AUDIENCE");
    settings.push((
        "WEBHOOK_AUDIENCE".into(),
        format!("api://{app}, api://other-name"),
    ));
    let hook = Webhook::start(&redis, &settings).await;
    let token = |aud: &str, iss: &str, v2: bool| {
        let mut claims = event_grid_claims();
        claims["aud"] = json!(aud);
        claims["iss"] = json!(iss);
        if v2 {
            claims.as_object_mut().unwrap().remove("appid");
            claims["azp"] = json!(EVENT_GRID_APP_ID);
        }
        issuer.key.sign(&claims)
    };
    let api = format!("api://{app}");
    for (what, token, status) in [
        ("v1, the app id URI", token(&api, &v1, false), 200),
        ("v2, the bare app id", token(app, &v2, true), 200),
        ("v1, the bare app id", token(app, &v1, false), 200),
        (
            "the other name listed",
            token("api://other-name", &v1, false),
            200,
        ),
        ("another app", token("api://another-app", &v1, false), 401),
        (
            "the public cloud's issuer",
            token(
                app,
                &format!("https://login.microsoftonline.com/{TENANT}/v2.0"),
                true,
            ),
            401,
        ),
    ] {
        let answer = deliver(&hook.base, Some(&token), &json!([eg_event(order("aud"))])).await;
        assert_eq!(answer.status, status, "{what}: {}", answer.body);
    }
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
