//! Metrics and traces through OpenTelemetry.
//!
//! ```text
//! config ──TelemetrySettings──▶ Telemetry::start ──▶ OTLP/HTTP exporters (export.rs)
//!                                      │
//! processor ──EventReport, counters──▶ EventTelemetry (instruments.rs) ──▶ SDK
//! host ──X-Azure-Functions-InvocationId──▶ with_invocation_id (task-local)
//! ```
//!
//! Architecture invariants:
//! - this module imports nothing of the project: `config` builds its
//!   [`TelemetrySettings`] from the standard `OTEL_*` variables, the
//!   processor hands it plain values ([`EventReport`]); no decision code sees
//!   an exporter;
//! - nothing configured, nothing runs: [`Telemetry::start`] answers `None`,
//!   the processor holds no [`EventTelemetry`] and its hot path pays one
//!   branch per event (no no-op instruments called, no attributes built);
//! - export never blocks or fails an event: spans go to the SDK's batch
//!   processor (a bounded queue, drained on a thread of its own, full means
//!   dropped), metrics are aggregated in memory and read by the SDK's
//!   periodic reader on its thread; a collector that is down costs the
//!   telemetry only;
//! - what is lost is counted (`otel.sdk.*`) and logged once per run of
//!   failures, from the exporters' threads (`pipeline.rs`);
//! - traces are head-sampled ([`Sampling`], `sampling.rs`): a span sampled
//!   out is dropped where it starts and costs the decision; metrics are
//!   never sampled.

mod entra;
mod export;
mod instruments;
mod pipeline;
mod sampling;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use entra::{IngestionTokens, MONITOR_SCOPE};
pub use instruments::{
    CacheReport, EventReport, EventTelemetry, LoadReport, LoadSource, PoolReport, StepTiming,
};
/// The attribute values the per-event instruments are bound to (the
/// processor's tests check it reports no other).
#[cfg(test)]
pub(crate) use instruments::{COMPONENTS, DECIDERS, OUTCOMES, STEPS};
pub use sampling::{Sampling, DEFAULT_TRACES_PER_SECOND};

/// What to export, built by `config` from the standard `OTEL_*` variables.
#[derive(Clone, PartialEq, Eq)]
pub struct TelemetrySettings {
    /// `service.name` of every span and metric (`OTEL_SERVICE_NAME`).
    pub service_name: String,
    /// The OTLP/HTTP collector, if one is configured.
    pub otlp: Option<OtlpSettings>,
    /// Application Insights, if a connection string is set.
    pub application_insights: Option<AppInsightsSettings>,
    /// How often metrics are exported (`OTEL_METRIC_EXPORT_INTERVAL`).
    pub metric_interval: Duration,
    /// At most this many finished spans wait for export; past it, spans
    /// are dropped (`OTEL_BSP_MAX_QUEUE_SIZE`).
    pub span_queue: usize,
    /// Which events' traces are exported (`OTEL_TRACES_SAMPLER`,
    /// `OTEL_TRACES_SAMPLER_ARG`); metrics are never sampled.
    pub sampling: Sampling,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        TelemetrySettings {
            service_name: "order-guard".into(),
            otlp: None,
            application_insights: None,
            metric_interval: Duration::from_secs(60),
            span_queue: 2048,
            sampling: Sampling::AlwaysOn,
        }
    }
}

/// An OTLP collector reached over HTTP/protobuf.
#[derive(Clone, PartialEq, Eq)]
pub struct OtlpSettings {
    /// Where spans are posted (`<OTEL_EXPORTER_OTLP_ENDPOINT>/v1/traces`).
    pub traces_endpoint: String,
    /// Where metrics are posted (`<OTEL_EXPORTER_OTLP_ENDPOINT>/v1/metrics`).
    pub metrics_endpoint: String,
    /// Headers sent with every export (`OTEL_EXPORTER_OTLP_HEADERS`): often
    /// an API key, so never shown by `Debug`.
    pub headers: Vec<(String, String)>,
    /// How long one export may take (`OTEL_EXPORTER_OTLP_TIMEOUT`).
    pub timeout: Duration,
}

/// Application Insights, reached with its connection string
/// (`APPLICATIONINSIGHTS_CONNECTION_STRING`, which the Functions platform
/// sets for every app with Application Insights enabled).
#[derive(Clone, PartialEq, Eq)]
pub struct AppInsightsSettings {
    /// The whole connection string: it holds the instrumentation key, so it
    /// is never shown (not by `Debug`, not in a log line).
    pub connection_string: String,
    /// Where the telemetry goes (its `IngestionEndpoint`, with the scheme
    /// the exporter uses: always `https://`), for the logs.
    pub ingestion_endpoint: String,
    /// Sign in with Microsoft Entra ID
    /// (`APPLICATIONINSIGHTS_AUTHENTICATION_STRING=Authorization=AAD`):
    /// uploads carry an identity's token, not only the key (`entra.rs`).
    pub entra: Option<EntraSignIn>,
}

/// Which identity signs the uploads in: `ClientId=` of the authentication
/// string names a user-assigned one; without it, the system-assigned one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntraSignIn {
    pub client_id: Option<String>,
}

impl std::fmt::Debug for AppInsightsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppInsightsSettings")
            .field("connection_string", &"(not shown)")
            .field("ingestion_endpoint", &self.ingestion_endpoint)
            .field("entra", &self.entra)
            .finish()
    }
}

impl std::fmt::Debug for TelemetrySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelemetrySettings")
            .field("service_name", &self.service_name)
            .field("otlp", &self.otlp)
            .field("application_insights", &self.application_insights)
            .field("metric_interval", &self.metric_interval)
            .field("span_queue", &self.span_queue)
            .field("sampling", &self.sampling)
            .finish()
    }
}

impl std::fmt::Debug for OtlpSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("OtlpSettings")
            .field("traces_endpoint", &self.traces_endpoint)
            .field("metrics_endpoint", &self.metrics_endpoint)
            .field("headers", &names)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// The running exporters of this process.
pub struct Telemetry {
    providers: export::Providers,
    events: Arc<EventTelemetry>,
}

impl Telemetry {
    /// Start the exporters `settings` asks for; `None` when it asks for
    /// none. An exporter that cannot be built (a malformed endpoint) is an
    /// error: the start stops, naming it.
    ///
    /// `tokens` signs Application Insights' uploads in when the settings
    /// ask for Entra ID ([`AppInsightsSettings::entra`]); called within the
    /// tokio runtime, which then runs the token requests.
    pub fn start(
        settings: &TelemetrySettings,
        tokens: Option<Arc<dyn IngestionTokens>>,
    ) -> Result<Option<Telemetry>, TelemetryError> {
        Telemetry::start_with(settings, export::blocking_client, tokens)
    }

    /// [`Telemetry::start`] with the Application Insights exporter's HTTP
    /// client made by `client` (the tests give one that reaches a local
    /// endpoint in the shape of the ingestion API over plain HTTP).
    pub fn start_with<C, F>(
        settings: &TelemetrySettings,
        client: F,
        tokens: Option<Arc<dyn IngestionTokens>>,
    ) -> Result<Option<Telemetry>, TelemetryError>
    where
        C: opentelemetry_http::HttpClient + Clone + 'static,
        F: FnOnce() -> Result<C, TelemetryError>,
    {
        if settings.otlp.is_none() && settings.application_insights.is_none() {
            return Ok(None);
        }
        let tokens_from = tokens.as_ref().map(|t| t.description());
        let providers = export::Providers::new(settings, client, tokens)?;
        let events = Arc::new(EventTelemetry::new(providers.meter(), providers.tracer()));
        let every = settings.metric_interval.as_secs_f64();
        if let Some(otlp) = &settings.otlp {
            log::info!(
                "telemetry: OTLP/HTTP to {} and {} (metrics every {every} s)",
                otlp.traces_endpoint,
                otlp.metrics_endpoint,
            );
        }
        if let Some(ai) = &settings.application_insights {
            let signed = match (&ai.entra, &tokens_from) {
                (Some(_), Some(from)) => format!("signed in with Entra ID: {from}"),
                _ => "with the connection string's key".to_string(),
            };
            log::info!(
                "telemetry: Application Insights at {}, {signed} (metrics every {every} s)",
                ai.ingestion_endpoint
            );
        }
        log::info!(
            "telemetry: {} (OTEL_TRACES_SAMPLER); metrics count every event",
            settings.sampling
        );
        Ok(Some(Telemetry { providers, events }))
    }

    /// What the processor reports each event to.
    pub fn events(&self) -> Arc<EventTelemetry> {
        Arc::clone(&self.events)
    }

    /// Observe `source`'s load (cache, store) at each metric export.
    pub fn observe(&self, source: Arc<dyn LoadSource>) {
        instruments::observe(&self.providers.meter(), source);
    }

    /// Export what is left and stop the exporters, bounded by their
    /// timeout. Runs the SDK's blocking shutdown off the async threads.
    pub async fn shutdown(self) {
        let providers = self.providers;
        let done = tokio::task::spawn_blocking(move || providers.shutdown()).await;
        if let Ok(Err(e)) = done {
            log::warn!("telemetry: not all of it was exported at shutdown: {e}");
        }
    }
}

/// Why the exporters could not be started.
#[derive(Debug, thiserror::Error)]
#[error("telemetry exporter: {0}")]
pub struct TelemetryError(pub String);

tokio::task_local! {
    static INVOCATION_ID: Option<Arc<str>>;
}

/// Run `f` with the host's `X-Azure-Functions-InvocationId` as the id the
/// events it processes carry on their spans (the host sends no
/// `traceparent` to a custom handler: this id is what joins a span to the
/// host's own request telemetry).
pub async fn with_invocation_id<F: Future>(id: Option<Arc<str>>, f: F) -> F::Output {
    INVOCATION_ID.scope(id, f).await
}

/// The invocation id of the current task, if the host sent one.
pub fn invocation_id() -> Option<Arc<str>> {
    INVOCATION_ID.try_with(Clone::clone).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_configured_starts_nothing() {
        let started = Telemetry::start(&TelemetrySettings::default(), None).expect("no error");
        assert!(started.is_none(), "an exporter ran with nothing configured");
    }

    #[test]
    fn secrets_are_not_in_debug() {
        let settings = TelemetrySettings {
            otlp: Some(OtlpSettings {
                traces_endpoint: "http://c/v1/traces".into(),
                metrics_endpoint: "http://c/v1/metrics".into(),
                headers: vec![("api-key".into(), "s3cret".into())],
                timeout: Duration::from_secs(1),
            }),
            application_insights: Some(AppInsightsSettings {
                connection_string: "InstrumentationKey=0f1e2d3c".into(),
                ingestion_endpoint: "https://x".into(),
                entra: None,
            }),
            ..TelemetrySettings::default()
        };
        let shown = format!("{settings:?}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("0f1e2d3c"),
            "{shown}"
        );
        assert!(
            shown.contains("api-key") && shown.contains("https://x"),
            "{shown}"
        );
    }
}
