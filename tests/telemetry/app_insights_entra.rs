//! Application Insights with local authentication off, as the azd template
//! creates it: an ingestion stand-in that takes only Entra ID bearer tokens
//! on `/v2.1/track` (a key-only upload gets 401, a bearer token on
//! `/v2/track` 400, as Microsoft's ingestion answers), and the tokens from
//! a local managed-identity endpoint (`IDENTITY_ENDPOINT` /
//! `IDENTITY_HEADER`, as App Service and Functions provide) through the
//! handler's own token source (`app::ingestion_tokens`). The exporter's
//! HTTP client sends over plain HTTP to the loopback stand-in, as in
//! `app_insights.rs`.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use order_guard::config::Config;
use order_guard::processor::{Processor, ProcessorSettings};
use order_guard::telemetry::Telemetry;
use serde_json::{json, Value};
use warp::http::StatusCode;
use warp::Filter;

use super::app_insights::{plain_http, uploaded};
use super::{common, event, order};
use common::identity::{identity_endpoint, IdentityEnv, HEADER_SECRET};

const KEY: &str = "0f1e2d3c-aaaa-bbbb-cccc-123456789abc";
const CLIENT_ID: &str = "11111111-2222-3333-4444-555555555555";

/// What the stand-in was sent: the envelopes it accepted with the token
/// each upload carried, and the answers it refused with.
#[derive(Default)]
struct Seen {
    accepted: Vec<(String, Value)>,
    refused: Vec<u16>,
}

struct EntraIngestion {
    port: u16,
    seen: Arc<Mutex<Seen>>,
}

impl EntraIngestion {
    /// `refuse`: answer every signed-in upload 403, as for an identity
    /// without the Monitoring Metrics Publisher role.
    fn start(refuse: bool) -> EntraIngestion {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let kept = Arc::clone(&seen);
        let route = warp::post()
            .and(warp::path::full())
            .and(warp::header::optional::<String>("authorization"))
            .and(warp::body::bytes())
            .map(
                move |path: warp::path::FullPath, auth: Option<String>, body: bytes::Bytes| {
                    let bearer = auth.and_then(|a| a.strip_prefix("Bearer ").map(str::to_string));
                    let status = match (path.as_str(), &bearer) {
                        (_, None) => StatusCode::UNAUTHORIZED,
                        ("/v2/track", Some(_)) => StatusCode::BAD_REQUEST,
                        ("/v2.1/track", Some(_)) if refuse => StatusCode::FORBIDDEN,
                        ("/v2.1/track", Some(_)) => StatusCode::OK,
                        _ => StatusCode::NOT_FOUND,
                    };
                    let mut seen = kept.lock().unwrap();
                    if status != StatusCode::OK {
                        seen.refused.push(status.as_u16());
                        return warp::reply::with_status(
                            warp::reply::json(&json!({"error": "refused"})),
                            status,
                        );
                    }
                    let items = uploaded(&body);
                    let n = items.len();
                    let token = bearer.unwrap();
                    seen.accepted
                        .extend(items.into_iter().map(|i| (token.clone(), i)));
                    warp::reply::with_status(
                        warp::reply::json(
                            &json!({"itemsReceived": n, "itemsAccepted": n, "errors": []}),
                        ),
                        StatusCode::OK,
                    )
                },
            );
        let (addr, server) = warp::serve(route).bind_ephemeral(([127, 0, 0, 1], 0));
        tokio::spawn(server);
        EntraIngestion {
            port: addr.port(),
            seen,
        }
    }

    fn of_type(&self, base_type: &str) -> usize {
        let seen = self.seen.lock().unwrap();
        seen.accepted
            .iter()
            .filter(|(_, e)| e["data"]["baseType"] == base_type)
            .count()
    }

    fn tokens(&self) -> BTreeSet<String> {
        let seen = self.seen.lock().unwrap();
        seen.accepted.iter().map(|(t, _)| t.clone()).collect()
    }
}

/// The configuration the Functions platform gives an app whose
/// Application Insights has local authentication off.
fn config(ingestion: &EntraIngestion) -> Config {
    let connection = format!(
        "InstrumentationKey={KEY};IngestionEndpoint=https://127.0.0.1:{}/",
        ingestion.port
    );
    Config::from_lookup(|k| match k {
        "APPLICATIONINSIGHTS_CONNECTION_STRING" => Some(connection.clone()),
        "APPLICATIONINSIGHTS_AUTHENTICATION_STRING" => {
            Some(format!("Authorization=AAD;ClientId={CLIENT_ID}"))
        }
        "OTEL_METRIC_EXPORT_INTERVAL" => Some("300".into()),
        "OTEL_TRACES_SAMPLER" => Some("always_on".into()),
        _ => None,
    })
    .expect("the settings are accepted")
}

/// Every log line of this test binary, from the first call on.
fn log_lines() -> &'static Mutex<Vec<String>> {
    struct Capture(Mutex<Vec<String>>);
    impl log::Log for Capture {
        fn enabled(&self, m: &log::Metadata) -> bool {
            m.level() <= log::Level::Info
        }
        fn log(&self, r: &log::Record) {
            if self.enabled(r.metadata()) {
                self.0
                    .lock()
                    .unwrap()
                    .push(format!("{} {}", r.level(), r.args()));
            }
        }
        fn flush(&self) {}
    }
    static CAPTURE: OnceLock<&'static Capture> = OnceLock::new();
    let capture = CAPTURE.get_or_init(|| {
        let capture: &'static Capture = Box::leak(Box::new(Capture(Mutex::new(Vec::new()))));
        log::set_logger(capture).expect("no other logger in this test binary");
        log::set_max_level(log::LevelFilter::Info);
        capture
    });
    &capture.0
}

/// Wait for `done`, polling; false when `within` passed first.
async fn until(within: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while !done() {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_local_auth_off_metrics_and_spans_arrive_signed_in_and_the_token_is_refreshed() {
    // Each token is kept until 5 minutes before it expires: one that lives
    // 5 minutes and 1 second is asked for again a second later.
    let identity = identity_endpoint(301).await;
    let _env = IdentityEnv::set(Some(&identity.url), Some(HEADER_SECRET)).await;
    let ingestion = EntraIngestion::start(false);
    let config = config(&ingestion);
    let tokens = order_guard::app::ingestion_tokens(&config)
        .expect("a token source")
        .expect("Authorization=AAD asks for one");
    let telemetry = Telemetry::start_with(&config.telemetry, plain_http, Some(tokens))
        .expect("the exporter starts")
        .expect("a connection string turns telemetry on");
    let (store, _dir) = common::sqlite_store().await;
    let processor = Processor::new(common::memory_guard(), store, ProcessorSettings::default())
        .with_telemetry(Some(telemetry.events()));
    let outcome = processor
        .process_event(&event("e-entra-1", order("o-entra-1", "3")))
        .await;
    assert_eq!(outcome.outcome.as_str(), "executed");

    // Metrics are exported every 300 ms: the uploads go on until a second
    // token has signed one in.
    let refreshed = until(Duration::from_secs(30), || ingestion.tokens().len() >= 2).await;
    telemetry.shutdown().await;
    assert!(
        refreshed,
        "no upload carried a second token within 30 s: tokens {:?}, identity asked {} times",
        ingestion.tokens(),
        identity.tokens_handed_out()
    );
    assert!(
        ingestion.of_type("RequestData") >= 1,
        "the event's span arrived"
    );
    assert!(ingestion.of_type("MetricData") >= 1, "metrics arrived");
    let refused = ingestion.seen.lock().unwrap().refused.clone();
    assert!(refused.is_empty(), "uploads were refused: {refused:?}");
    // Every token handed out was for Azure Monitor, for the named identity.
    let requests = identity.requests.lock().unwrap().clone();
    assert!(requests.len() >= 2, "{requests:?}");
    for r in &requests {
        assert_eq!(
            r.resource.as_deref(),
            Some("https://monitor.azure.com/"),
            "{r:?}"
        );
        assert_eq!(r.client_id.as_deref(), Some(CLIENT_ID), "{r:?}");
    }
    for token in ingestion.tokens() {
        assert!(token.starts_with("token-"), "{token}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_is_logged_once_with_its_cause() {
    let lines = log_lines();
    let identity = identity_endpoint(3600).await;
    let _env = IdentityEnv::set(Some(&identity.url), Some(HEADER_SECRET)).await;
    let ingestion = EntraIngestion::start(true);
    let config = config(&ingestion);
    let tokens = order_guard::app::ingestion_tokens(&config)
        .unwrap()
        .unwrap();
    let telemetry = Telemetry::start_with(&config.telemetry, plain_http, Some(tokens))
        .expect("the exporter starts")
        .expect("a connection string turns telemetry on");
    let exports = until(Duration::from_secs(30), || {
        ingestion.seen.lock().unwrap().refused.len() >= 4
    })
    .await;
    telemetry.shutdown().await;
    assert!(exports, "fewer than 4 uploads were tried within 30 s");
    let refused = ingestion.seen.lock().unwrap().refused.clone();
    assert!(refused.iter().all(|s| *s == 403), "{refused:?}");

    let lines = lines.lock().unwrap().clone();
    let causes: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("refused the Entra ID token"))
        .collect();
    assert_eq!(
        causes.len(),
        1,
        "{} refused uploads, the cause logged {} times: {lines:#?}",
        refused.len(),
        causes.len()
    );
    assert!(
        causes[0].contains("Monitoring Metrics Publisher") && causes[0].contains(CLIENT_ID),
        "{}",
        causes[0]
    );
    // This test's start line (the binary's other tests log theirs too).
    let endpoint = format!("https://127.0.0.1:{}", ingestion.port);
    let started = lines
        .iter()
        .find(|l| l.contains("telemetry: Application Insights at") && l.contains(&endpoint))
        .unwrap_or_else(|| panic!("no start line names {endpoint}: {lines:#?}"));
    assert!(started.contains("signed in with Entra ID"), "{started}");
}
