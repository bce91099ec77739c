//! What the handler exports through OpenTelemetry, read by a local
//! OTLP/HTTP receiver (`receiver.rs`) with the official protobuf
//! definitions. The real binary runs on real components (a redis-server
//! from tests/common, a SQLite file); the receiver gets everything at the
//! process's exit (the exporters' shutdown exports what is left), so no
//! test waits for a period.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::Span;
use order_guard::telemetry::{OtlpSettings, TelemetrySettings};
use serde_json::{json, Value};

mod app_insights;
mod app_insights_entra;
#[path = "../common/mod.rs"]
mod common;
mod losses;
mod pool;
mod receiver;

use receiver::{attributes, double_points, histogram_counts, points, Receiver};

use common::eg_event_with_id as event;

fn order(id: &str, quantity: &str) -> Value {
    json!({"orderId": id, "accountId": "acc-1", "side": "buy", "symbol": "MSFT",
           "quantity": quantity, "limitPrice": "431.15"})
}

/// A first delivery, its duplicate (answered from the cache), another
/// order reusing the id (a conflict) and a poison event.
fn four_kinds() -> Value {
    json!([
        event("e-1", order("o-1", "7")),
        event("e-1", order("o-1", "7")),
        event("e-3", order("o-1", "9")),
        event("e-4", json!({"orderId": "o-9", "side": "sideways"})),
    ])
}

/// `order-guard replay` of `deliveries` with `vars` on a fresh SQLite file;
/// its summary line (the last of stdout).
async fn replay(deliveries: &Value, vars: &[(&str, String)]) -> String {
    let (stdout, _) = replay_streams(deliveries, vars).await;
    stdout.lines().last().unwrap_or_default().to_string()
}

/// [`replay`]'s whole stdout and stderr.
async fn replay_streams(deliveries: &Value, vars: &[(&str, String)]) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.json");
    std::fs::write(&file, deliveries.to_string()).unwrap();
    let db = format!("sqlite:{}?mode=rwc", dir.path().join("orders.db").display());
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_order-guard"))
        .arg("replay")
        .arg(&file)
        .env_clear()
        .env("RUST_LOG", "warn")
        .env("SQL_CONNECTION_STRING", db)
        .envs(vars.iter().map(|(k, v)| (k, v)))
        .current_dir(dir.path())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("replay finished within 60 s")
        .expect("run order-guard");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "replay failed: {stdout}{stderr}");
    (stdout, stderr)
}

/// What `config` builds for `OTEL_EXPORTER_OTLP_ENDPOINT` = `collector`,
/// for the tests that start telemetry in-process.
fn otlp_settings(collector: &Receiver) -> TelemetrySettings {
    TelemetrySettings {
        otlp: Some(OtlpSettings {
            traces_endpoint: format!("{}/v1/traces", collector.endpoint()),
            metrics_endpoint: format!("{}/v1/metrics", collector.endpoint()),
            headers: Vec::new(),
            timeout: Duration::from_secs(10),
        }),
        ..TelemetrySettings::default()
    }
}

fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn attrs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn event_spans(spans: &[Span]) -> Vec<&Span> {
    spans
        .iter()
        .filter(|s| s.name == "process OrderTrigger")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_exports_outcomes_durations_and_a_span_per_event() {
    let redis = common::RedisServer::start();
    let collector = Receiver::start();
    let summary = replay(
        &four_kinds(),
        &[
            ("REDIS_URL", redis.url()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint()),
            ("OTEL_SERVICE_NAME", "orders-test".into()),
        ],
    )
    .await;
    assert!(
        summary.contains("executed=1 duplicates=1 conflicts=1 rejected=1"),
        "{summary}"
    );

    let metrics = collector.last_metrics();
    assert!(!metrics.is_empty(), "no metrics were exported");
    let mut events = points(&metrics["order_guard.events"]);
    events.sort();
    let want = |outcome: &str, decided_by: &str| {
        (
            attrs(&[
                ("messaging.system", "eventgrid"),
                ("order_guard.decided_by", decided_by),
                ("order_guard.outcome", outcome),
            ]),
            1,
        )
    };
    let mut expected = vec![
        want("executed", "store"),
        want("duplicate", "cache"),
        want("conflict", "cache"),
        want("rejected", "none"),
    ];
    expected.sort();
    assert_eq!(events, expected);

    let durations = histogram_counts(&metrics["messaging.process.duration"]);
    let total: u64 = durations.iter().map(|(_, n)| n).sum();
    assert_eq!(total, 4, "one duration per event: {durations:?}");
    for (a, _) in &durations {
        assert_eq!(a["messaging.operation.name"], "process", "{a:?}");
        assert_eq!(a["messaging.destination.name"], "OrderTrigger", "{a:?}");
    }
    let steps = histogram_counts(&metrics["order_guard.step.duration"]);
    let step = |name: &str, system: Option<&str>| -> u64 {
        steps
            .iter()
            .filter(|(a, _)| {
                a["order_guard.step"] == name
                    && a.get("db.system.name").map(String::as_str) == system
            })
            .map(|(_, n)| n)
            .sum()
    };
    assert_eq!(step("recall", None), 3, "{steps:?}");
    assert_eq!(step("acquire", Some("redis")), 1, "{steps:?}");
    assert_eq!(step("execute", Some("sqlite")), 1, "{steps:?}");
    assert_eq!(step("complete", Some("redis")), 1, "{steps:?}");
    assert_eq!(step("store_conflict", Some("sqlite")), 1, "{steps:?}");
    assert_eq!(step("reject", Some("sqlite")), 1, "{steps:?}");
    let cache = points(&metrics["order_guard.cache.entries"]);
    assert_eq!(cache.len(), 1, "{cache:?}");
    // The first delivery missed the cache; its duplicate and the conflict
    // were answered from it; the poison event never looked.
    let mut lookups = points(&metrics["order_guard.cache.lookups"]);
    lookups.sort();
    assert_eq!(
        lookups,
        vec![
            (attrs(&[("order_guard.cache.result", "hit")]), 2),
            (attrs(&[("order_guard.cache.result", "miss")]), 1),
        ]
    );
    let ratio = double_points(&metrics["order_guard.cache.hit_ratio"]);
    assert_eq!(ratio.len(), 1, "{ratio:?}");
    assert!((ratio[0].1 - 2.0 / 3.0).abs() < 1e-9, "{ratio:?}");
    let writer = points(&metrics["order_guard.sqlite.writer.refused"]);
    assert_eq!(writer, vec![(BTreeMap::new(), 0)]);

    let spans = collector.spans();
    let parents = event_spans(&spans);
    assert_eq!(parents.len(), 4, "{spans:#?}");
    let seen: Vec<BTreeMap<String, String>> =
        parents.iter().map(|s| attributes(&s.attributes)).collect();
    let kinds: Vec<(&str, &str, &str)> = seen
        .iter()
        .map(|a| {
            (
                a["messaging.message.id"].as_str(),
                a.get("order_guard.order_id").map_or("", String::as_str),
                a["order_guard.outcome"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("e-1", "o-1", "executed"),
            ("e-1", "o-1", "duplicate"),
            ("e-3", "o-1", "conflict"),
            ("e-4", "o-9", "rejected"),
        ]
    );
    for a in &seen {
        assert_eq!(a["messaging.system"], "eventgrid");
        assert_eq!(a["messaging.operation.type"], "process");
        // No amounts: nothing of the order's content but its id.
        for (k, v) in a {
            assert!(
                !["7", "9", "431.15"].contains(&v.as_str()) && !k.contains("quantity"),
                "an amount was exported: {k}={v}"
            );
        }
        assert!(!a.contains_key("faas.invocation_id"), "replay has no host");
    }
    // The first delivery's calls to Redis and the store are its children,
    // in order (the cache's recall is in the step histogram only).
    let first = parents[0];
    let children: Vec<(&str, SpanKind)> = spans
        .iter()
        .filter(|s| s.parent_span_id == first.span_id && s.trace_id == first.trace_id)
        .map(|s| (s.name.as_str(), s.kind()))
        .collect();
    assert_eq!(
        children,
        vec![
            ("acquire", SpanKind::Client),
            ("execute", SpanKind::Client),
            ("complete", SpanKind::Client),
        ]
    );
    // Each step's span lies inside its event's, after the step before it
    // (their wall-clock starts are derived from the event's arrival).
    let mut after = first.start_time_unix_nano;
    for child in spans
        .iter()
        .filter(|s| s.parent_span_id == first.span_id && s.trace_id == first.trace_id)
    {
        assert!(
            child.start_time_unix_nano >= after
                && child.end_time_unix_nano >= child.start_time_unix_nano
                && child.end_time_unix_nano <= first.end_time_unix_nano,
            "{} [{}, {}] is not inside its event's [{}, {}] after {after}",
            child.name,
            child.start_time_unix_nano,
            child.end_time_unix_nano,
            first.start_time_unix_nano,
            first.end_time_unix_nano
        );
        after = child.end_time_unix_nano;
    }
    assert_eq!(first.kind(), SpanKind::Consumer);
    assert!(collector.service_names().iter().all(|n| n == "orders-test"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_span_carries_the_hosts_invocation_id() {
    let collector = Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let mut env = common::handler_env(port, dir.path());
    env.push(("OTEL_EXPORTER_OTLP_ENDPOINT".into(), collector.endpoint()));
    let log = dir.path().join("handler.log");
    let mut child = common::spawn_handler(&common::handler_binary(), &env, &log);
    common::wait_ready(port, &mut child, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("{e}: {}", std::fs::read_to_string(&log).unwrap_or_default()));

    let body = common::invocation(event("e-1", order("o-1", "1")));
    let request = hyper::Request::post(format!("http://127.0.0.1:{port}/OrderTrigger"))
        .header("Content-Type", "application/json; charset=utf-8")
        .header("X-Azure-Functions-InvocationId", "3f2c9a5e-inv-42")
        .body(hyper::Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap();
    let answer = hyper::Client::new()
        .request(request)
        .await
        .expect("an answer");
    assert_eq!(answer.status(), 200);

    common::signal(child.id().expect("running"), "TERM");
    let exit = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the handler stopped within 30 s of SIGTERM")
        .unwrap();
    assert!(
        exit.success(),
        "{exit}: {}",
        std::fs::read_to_string(&log).unwrap()
    );

    let spans = collector.spans();
    let parents = event_spans(&spans);
    assert_eq!(parents.len(), 1, "{spans:#?}");
    let a = attributes(&parents[0].attributes);
    assert_eq!(a["faas.invocation_id"], "3f2c9a5e-inv-42", "{a:?}");
    assert_eq!(a["order_guard.outcome"], "executed", "{a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exporter_at_a_closed_port_changes_no_answer() {
    let redis = common::RedisServer::start();
    let without = replay(&four_kinds(), &[("REDIS_URL", redis.url())]).await;
    redis.cmd(&["FLUSHALL"]);
    let endpoint = format!("http://127.0.0.1:{}", closed_port());
    let with = replay(
        &four_kinds(),
        &[
            ("REDIS_URL", redis.url()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
        ],
    )
    .await;
    assert_eq!(with, without);
    assert!(
        without.contains("executed=1 duplicates=1 conflicts=1 rejected=1 retries=0 unresolved=0"),
        "{without}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_degraded_decision_is_counted() {
    // Redis refuses connections; GUARD_UNAVAILABLE=proceed (the default)
    // lets the store's unique index decide alone.
    let collector = Receiver::start();
    let summary = replay(
        &json!([event("e-1", order("o-1", "7"))]),
        &[
            ("REDIS_URL", format!("redis://127.0.0.1:{}", closed_port())),
            ("REDIS_TIMEOUT_MS", "200".into()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint()),
        ],
    )
    .await;
    assert!(summary.contains("executed=1"), "{summary}");
    let metrics = collector.last_metrics();
    assert_eq!(
        points(&metrics["order_guard.guard.unavailable"]),
        vec![(attrs(&[("order_guard.policy", "proceed")]), 1)]
    );
    assert_eq!(
        points(&metrics["order_guard.events"]),
        vec![(
            attrs(&[
                ("messaging.system", "eventgrid"),
                ("order_guard.decided_by", "store"),
                ("order_guard.outcome", "executed"),
            ]),
            1
        )]
    );
    let spans = collector.spans();
    let parents = event_spans(&spans);
    assert_eq!(parents.len(), 1, "{spans:#?}");
    assert_eq!(
        attributes(&parents[0].attributes)["order_guard.guard"],
        "unavailable"
    );
}

/// The "done when": one replay of `samples/events.json` (every
/// form of delivery the host may send) gives counters, durations and spans
/// that agree with the replay's own summary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_samples_replay_exports_what_it_answered() {
    let redis = common::RedisServer::start();
    let collector = Receiver::start();
    let samples: Value = serde_json::from_str(include_str!("../../samples/events.json")).unwrap();
    let summary = replay(
        &samples,
        &[
            ("REDIS_URL", redis.url()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint()),
        ],
    )
    .await;
    let field = |name: &str| -> i64 {
        summary
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name}= in {summary:?}"))
    };
    assert_eq!(field("unresolved"), 0, "{summary}");
    let metrics = collector.last_metrics();
    let events = points(&metrics["order_guard.events"]);
    let counted = |outcome: &str| -> i64 {
        events
            .iter()
            .filter(|(a, _)| a["order_guard.outcome"] == outcome)
            .map(|(_, n)| n)
            .sum()
    };
    assert_eq!(
        counted("executed"),
        field("executed"),
        "{summary} {events:?}"
    );
    assert_eq!(
        counted("duplicate"),
        field("duplicates"),
        "{summary} {events:?}"
    );
    assert_eq!(
        counted("conflict"),
        field("conflicts"),
        "{summary} {events:?}"
    );
    assert_eq!(
        counted("rejected"),
        field("rejected"),
        "{summary} {events:?}"
    );
    let answered: i64 = events.iter().map(|(_, n)| n).sum();
    assert_eq!(
        answered,
        field("events") + field("retries"),
        "{summary} {events:?}"
    );
    let durations: u64 = histogram_counts(&metrics["messaging.process.duration"])
        .iter()
        .map(|(_, n)| n)
        .sum();
    assert_eq!(durations as i64, answered);
    let spans = collector.spans();
    assert_eq!(event_spans(&spans).len() as i64, answered, "{spans:#?}");
}

/// Microsoft's sampler names through the real binary and OTLP: the rate
/// limit holds (at most its burst plus its rate over the run), the
/// counters count every event, and the SDK's own warning about a sampler
/// name it does not know (it reads the variable too, before ours replaces
/// its choice) is not written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_named_as_microsoft_names_it_holds_through_otlp() {
    let collector = Receiver::start();
    let deliveries: Vec<Value> = (0..40)
        .map(|i| event(&format!("e-{i}"), order("o-1", "7")))
        .collect();
    let began = Instant::now();
    let (stdout, stderr) = replay_streams(
        &Value::Array(deliveries),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint()),
            ("OTEL_TRACES_SAMPLER", "microsoft.rate_limited".into()),
            ("OTEL_TRACES_SAMPLER_ARG", "2".into()),
            ("RUST_LOG", "info".into()),
        ],
    )
    .await;
    let elapsed = began.elapsed();
    assert!(
        stdout.contains("2 traces a second exported on average"),
        "{stdout}"
    );
    assert!(
        !stderr.contains("TracerProvider.Config") && !stderr.contains("sampler"),
        "{stderr}"
    );
    let spans = collector.spans();
    let traced = event_spans(&spans).len();
    let bound = 2.0 + 2.0 * elapsed.as_secs_f64();
    assert!(
        traced >= 1 && traced as f64 <= bound,
        "{traced} of 40 events traced in {elapsed:?} (at most {bound})"
    );
    let events: i64 = points(&collector.last_metrics()["order_guard.events"])
        .iter()
        .map(|(_, n)| n)
        .sum();
    assert_eq!(events, 40);
}
