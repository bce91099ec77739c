//! The Application Insights path: a local endpoint in the shape of the
//! ingestion API (`POST /v2/track`, gzipped JSON envelopes, answered with
//! a track response) receives what the exporter sends for the same four
//! events, configured by a connection string as the Functions platform sets
//! it. The exporter insists on `https://` for the ingestion endpoint; the
//! test's HTTP client (reqwest's, as in production) sends the same request
//! over plain HTTP to the loopback endpoint, the only difference.

use std::collections::BTreeSet;
use std::io::Read;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use order_guard::config::Config;
use order_guard::processor::{Processor, ProcessorSettings};
use order_guard::telemetry::{Telemetry, TelemetryError};
use serde_json::{json, Value};
use warp::Filter;

use super::{common, event, four_kinds, order};

const KEY: &str = "0f1e2d3c-aaaa-bbbb-cccc-123456789abc";

/// Every envelope posted to `/v2/track`.
struct Ingestion {
    port: u16,
    envelopes: Arc<Mutex<Vec<Value>>>,
}

impl Ingestion {
    fn start() -> Ingestion {
        let envelopes = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&envelopes);
        let track = warp::post()
            .and(warp::path!("v2" / "track"))
            .and(warp::header::exact("content-encoding", "gzip"))
            .and(warp::body::bytes())
            .map(move |body: bytes::Bytes| {
                let items = uploaded(&body);
                let n = items.len();
                kept.lock().unwrap().extend(items);
                warp::reply::json(&json!({"itemsReceived": n, "itemsAccepted": n, "errors": []}))
            });
        let (addr, server) = warp::serve(track).bind_ephemeral(([127, 0, 0, 1], 0));
        tokio::spawn(server);
        Ingestion {
            port: addr.port(),
            envelopes,
        }
    }

    fn of_type(&self, base_type: &str) -> Vec<Value> {
        self.envelopes
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e["data"]["baseType"] == base_type)
            .cloned()
            .collect()
    }
}

/// The envelopes of one upload: a gzipped JSON array, as the ingestion
/// API takes it.
pub(super) fn uploaded(body: &[u8]) -> Vec<Value> {
    let mut text = String::new();
    flate2::read::GzDecoder::new(body)
        .read_to_string(&mut text)
        .expect("a gzipped body");
    serde_json::from_str(&text).expect("a JSON array")
}

/// reqwest's blocking client, sending what the exporter asks for over
/// plain HTTP (the loopback endpoint has no certificate).
#[derive(Debug, Clone)]
pub(super) struct PlainHttp(reqwest::blocking::Client);

#[async_trait]
impl HttpClient for PlainHttp {
    async fn send_bytes(&self, mut request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let uri = request.uri().to_string().replacen("https://", "http://", 1);
        *request.uri_mut() = uri.parse()?;
        self.0.send_bytes(request).await
    }
}

pub(super) fn plain_http() -> Result<PlainHttp, TelemetryError> {
    order_guard::tls::install_crypto_provider();
    std::thread::spawn(reqwest::blocking::Client::new)
        .join()
        .map(PlainHttp)
        .map_err(|_| TelemetryError("the client's thread panicked".into()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_insights_receives_requests_and_metrics() {
    let ingestion = Ingestion::start();
    let connection = format!(
        "InstrumentationKey={KEY};IngestionEndpoint=https://127.0.0.1:{}/",
        ingestion.port
    );
    let config = Config::from_lookup(|k| {
        (k == "APPLICATIONINSIGHTS_CONNECTION_STRING").then(|| connection.clone())
    })
    .expect("the connection string is accepted");
    assert!(
        !format!("{config:?}").contains(KEY),
        "the configuration shows the instrumentation key"
    );
    let telemetry = Telemetry::start_with(&config.telemetry, plain_http, None)
        .expect("the exporter starts")
        .expect("a connection string turns telemetry on");

    let redis = common::RedisServer::start();
    let (store, _dir) = common::sqlite_store().await;
    let guard = common::redis_guard(&redis, Default::default());
    let processor = Processor::new(guard, store, ProcessorSettings::default())
        .with_telemetry(Some(telemetry.events()));
    // Four events, within the burst of the default rate limit (5 traces a
    // second, a second's worth at once): every one is traced.
    let mut outcomes = Vec::new();
    for event in four_kinds().as_array().unwrap() {
        outcomes.push(processor.process_event(event).await.outcome.as_str());
    }
    assert_eq!(outcomes, ["executed", "duplicate", "conflict", "rejected"]);
    telemetry.shutdown().await;

    let requests = ingestion.of_type("RequestData");
    let mut seen: Vec<(String, String)> = requests
        .iter()
        .map(|r| {
            let p = &r["data"]["baseData"]["properties"];
            (
                p["messaging.message.id"].as_str().unwrap_or("").to_string(),
                p["order_guard.outcome"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("e-1", "duplicate"),
            ("e-1", "executed"),
            ("e-3", "conflict"),
            ("e-4", "rejected")
        ]
        .map(|(a, b)| (a.to_string(), b.to_string())),
        "{requests:#?}"
    );
    for r in &requests {
        assert_eq!(r["data"]["baseData"]["name"], "process OrderTrigger");
        assert_eq!(r["iKey"], KEY, "the key goes only where it belongs");
        assert_eq!(r["tags"]["ai.cloud.role"], "order-guard", "{r:#}");
    }
    let steps = ingestion.of_type("RemoteDependencyData");
    assert!(
        steps
            .iter()
            .any(|d| d["data"]["baseData"]["name"] == "execute"),
        "the steps are dependencies: {steps:#?}"
    );

    let metrics = ingestion.of_type("MetricData");
    assert_eq!(events_counted(&ingestion), 4.0, "{metrics:#?}");

    // The pipeline's own counts (`otel.sdk.*`): every span handed to the
    // exporter and exported, none lost, as the envelopes received say.
    let sdk = |name: &str, component: &str| -> f64 {
        metrics
            .iter()
            .filter(|m| {
                let p = &m["data"]["baseData"]["properties"];
                p["otel.component.name"] == component && p.get("error.type").is_none()
            })
            .flat_map(|m| {
                m["data"]["baseData"]["metrics"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter(|m| m["name"] == name)
            .map(|m| m["value"].as_f64().unwrap_or(0.0))
            .sum()
    };
    let spans = (requests.len() + steps.len()) as f64;
    assert_eq!(
        sdk(
            "otel.sdk.processor.span.processed",
            "batching_span_processor/application_insights"
        ),
        spans,
        "{metrics:#?}"
    );
    assert_eq!(
        sdk(
            "otel.sdk.exporter.span.exported",
            "application_insights_span_exporter/application_insights"
        ),
        spans,
        "{metrics:#?}"
    );
    let lost = metrics
        .iter()
        .filter(|m| {
            m["data"]["baseData"]["properties"]
                .get("error.type")
                .is_some()
        })
        .count();
    assert_eq!(lost, 0, "{metrics:#?}");
}

/// The `order_guard.events` data points' sum in what `ingestion` received.
fn events_counted(ingestion: &Ingestion) -> f64 {
    ingestion
        .of_type("MetricData")
        .iter()
        .flat_map(|m| {
            m["data"]["baseData"]["metrics"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|m| m["name"] == "order_guard.events")
        .map(|m| m["value"].as_f64().unwrap_or(0.0))
        .sum()
}

/// `n` deliveries of one order (a first delivery, then duplicates answered
/// from the cache, as fast as the processor answers them) with Application
/// Insights configured by its connection string and `vars`; what the
/// ingestion endpoint received once telemetry has shut down, and the time
/// from before telemetry started (its sampler with it) to the last answer.
async fn burst(n: usize, vars: &[(&str, &str)]) -> (Ingestion, Duration) {
    let ingestion = Ingestion::start();
    let connection = format!(
        "InstrumentationKey={KEY};IngestionEndpoint=https://127.0.0.1:{}/",
        ingestion.port
    );
    let config = Config::from_lookup(|k| {
        if k == "APPLICATIONINSIGHTS_CONNECTION_STRING" {
            return Some(connection.clone());
        }
        vars.iter()
            .find(|(name, _)| *name == k)
            .map(|(_, v)| v.to_string())
    })
    .expect("the settings are accepted");
    let (store, _dir) = common::sqlite_store().await;
    let began = Instant::now();
    let telemetry = Telemetry::start_with(&config.telemetry, plain_http, None)
        .expect("the exporter starts")
        .expect("a connection string turns telemetry on");
    let processor = Processor::new(common::memory_guard(), store, ProcessorSettings::default())
        .with_telemetry(Some(telemetry.events()));
    for i in 0..n {
        let outcome = processor
            .process_event(&event(&format!("e-{i}"), order("o-1", "7")))
            .await;
        let want = if i == 0 { "executed" } else { "duplicate" };
        assert_eq!(outcome.outcome.as_str(), want, "event {i}");
    }
    let elapsed = began.elapsed();
    telemetry.shutdown().await;
    (ingestion, elapsed)
}

/// The trace ids (`ai.operation.id`) of `envelopes`.
fn operations(envelopes: &[Value]) -> BTreeSet<String> {
    envelopes
        .iter()
        .map(|e| {
            e["tags"]["ai.operation.id"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_application_insights_traces_are_rate_limited_by_default_and_counts_exact() {
    const EVENTS: usize = 400;
    let (ingestion, elapsed) = burst(EVENTS, &[]).await;
    let requests = ingestion.of_type("RequestData");
    // Microsoft's default, 5 traces a second: at most the burst of one
    // second's worth at the start, plus 5 for every second since.
    let bound = 5.0 + 5.0 * elapsed.as_secs_f64();
    assert!(
        !requests.is_empty() && requests.len() as f64 <= bound,
        "{} of {EVENTS} events traced in {elapsed:?} (at most {bound})",
        requests.len()
    );
    assert!(
        (requests.len() as f64) < EVENTS as f64 / 4.0,
        "the burst was too slow to show the limit: {elapsed:?}"
    );
    // Metrics are not sampled.
    assert_eq!(events_counted(&ingestion), EVENTS as f64);
    // A trace is whole or absent: each step's span belongs to an exported
    // event's, and the first delivery (its store call) is always traced.
    let steps = ingestion.of_type("RemoteDependencyData");
    assert!(
        !steps.is_empty() && operations(&steps).is_subset(&operations(&requests)),
        "{steps:#?}"
    );
    for r in &requests {
        // A rate's share follows the load: the envelopes say 100 %.
        assert_eq!(r["sampleRate"], 100.0, "{r:#}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_on_exports_every_trace_and_a_ratio_tells_application_insights_its_share() {
    const EVENTS: usize = 200;
    let (ingestion, _) = burst(EVENTS, &[("OTEL_TRACES_SAMPLER", "always_on")]).await;
    let requests = ingestion.of_type("RequestData");
    assert_eq!(requests.len(), EVENTS);
    let ids: BTreeSet<&str> = requests
        .iter()
        .filter_map(|r| r["data"]["baseData"]["properties"]["messaging.message.id"].as_str())
        .collect();
    assert_eq!(ids.len(), EVENTS, "one span per event");
    assert!(requests.iter().all(|r| r["sampleRate"] == 100.0));
    assert_eq!(events_counted(&ingestion), EVENTS as f64);

    let (ingestion, _) = burst(
        EVENTS,
        &[
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.5"),
        ],
    )
    .await;
    let requests = ingestion.of_type("RequestData");
    // Random trace ids: some of them, not all (the chance of either is 2^-200).
    assert!(
        !requests.is_empty() && requests.len() < EVENTS,
        "{}",
        requests.len()
    );
    for e in requests
        .iter()
        .chain(ingestion.of_type("RemoteDependencyData").iter())
    {
        // Each exported span stands for two events (`itemCount` = 2).
        assert_eq!(e["sampleRate"], 50.0, "{e:#}");
    }
    assert_eq!(events_counted(&ingestion), EVENTS as f64);
}
