//! The SDK's providers and their exporters: OTLP/HTTP (protobuf), and
//! Application Insights' ingestion API.
//!
//! Spans: a batch span processor (its own thread; a bounded queue of
//! `span_queue` spans, a full queue drops the span). Metrics: a periodic
//! reader (its own thread), cumulative temporality for OTLP (what a
//! collector expects). Each OTLP export is one attempt bounded by the
//! timeout (no retry: the next export carries the cumulative counts
//! anyway); the Application Insights exporter retries a failed upload
//! itself, with backoff, for up to about 35 s. Both are sent by
//! reqwest's blocking client on the exporter's thread, never on the
//! handler's runtime. Every pipeline is counted (`pipeline.rs`): what its
//! queue dropped, what each export carried and lost. One sampler
//! (`sampling.rs`) decides for both pipelines which traces are exported.

use std::collections::HashMap;
use std::sync::Arc;

use opentelemetry::metrics::{Meter, MeterProvider};
use opentelemetry::trace::TracerProvider;
use opentelemetry::KeyValue;
use opentelemetry_http::HttpClient;
use opentelemetry_otlp::{Protocol, RetryPolicy, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{
    MeterProviderBuilder, PeriodicReader, SdkMeterProvider, Temporality,
};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider, SpanExporter, Tracer,
    TracerProviderBuilder,
};
use opentelemetry_sdk::Resource;

use super::entra::{IngestionTokens, SignedIn};
use super::pipeline::{self, Counted, Kind};
use super::{AppInsightsSettings, OtlpSettings, Sampling, TelemetryError, TelemetrySettings};

/// The instrumentation scope of everything this crate records.
const SCOPE: &str = "order-guard";

pub(super) struct Providers {
    meters: SdkMeterProvider,
    tracers: SdkTracerProvider,
}

impl Providers {
    /// A tracer and a meter provider with one processor and one reader per
    /// configured exporter (OTLP, Application Insights, or both).
    pub(super) fn new<C, F>(
        settings: &TelemetrySettings,
        client: F,
        tokens: Option<Arc<dyn IngestionTokens>>,
    ) -> Result<Providers, TelemetryError>
    where
        C: HttpClient + Clone + 'static,
        F: FnOnce() -> Result<C, TelemetryError>,
    {
        // The OTLP exporters build reqwest clients of their own.
        crate::tls::install_crypto_provider();
        let resource = Resource::builder_empty()
            .with_service_name(settings.service_name.clone())
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        // Our sampler, always: without one the SDK would read
        // OTEL_TRACES_SAMPLER itself (`config` reads it, and refuses what
        // it cannot honour).
        let mut tracers = SdkTracerProvider::builder()
            .with_resource(resource.clone())
            .with_sampler(settings.sampling.sampler());
        let mut meters = SdkMeterProvider::builder().with_resource(resource);
        let mut pipelines = Vec::new();
        if let Some(otlp) = &settings.otlp {
            let (spans, metrics) = otlp_exporters(otlp)?;
            let counted = Counted::new(
                Kind::Otlp,
                settings.span_queue,
                &otlp.traces_endpoint,
                &otlp.metrics_endpoint,
            );
            tracers = tracers
                .with_span_processor(counted.gate(batch(settings, counted.span_exporter(spans))));
            meters = meters.with_reader(periodic(settings, counted.metric_exporter(metrics)));
            pipelines.push(counted);
        }
        if let Some(ai) = &settings.application_insights {
            let to = format!("Application Insights at {}", ai.ingestion_endpoint);
            let counted = Counted::new(Kind::ApplicationInsights, settings.span_queue, &to, &to);
            let client = client()?;
            (tracers, meters) = if ai.entra.is_some() {
                let tokens = tokens.ok_or_else(|| {
                    TelemetryError(
                        "APPLICATIONINSIGHTS_AUTHENTICATION_STRING asks for Entra ID and no token source was given".into(),
                    )
                })?;
                let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
                    TelemetryError("Entra ID sign-in needs the tokio runtime to be running".into())
                })?;
                let signed_in = SignedIn::new(client, tokens, runtime);
                let exporter = app_insights_exporter(ai, signed_in, settings.sampling)?;
                with_exporter(settings, &counted, tracers, meters, exporter)
            } else {
                let exporter = app_insights_exporter(ai, client, settings.sampling)?;
                with_exporter(settings, &counted, tracers, meters, exporter)
            };
            pipelines.push(counted);
        }
        let providers = Providers {
            meters: meters.build(),
            tracers: tracers.build(),
        };
        pipeline::observe(&providers.meter(), pipelines);
        Ok(providers)
    }

    pub(super) fn meter(&self) -> Meter {
        self.meters.meter(SCOPE)
    }

    pub(super) fn tracer(&self) -> Tracer {
        self.tracers.tracer(SCOPE)
    }

    /// Export what is buffered, then stop both (blocking, bounded by the
    /// exporters' timeout).
    pub(super) fn shutdown(self) -> Result<(), String> {
        let spans = self.tracers.shutdown();
        let metrics = self.meters.shutdown();
        match (spans, metrics) {
            (Ok(()), Ok(())) => Ok(()),
            (spans, metrics) => Err(format!("spans: {spans:?}; metrics: {metrics:?}")),
        }
    }
}

/// The providers' builders with `exporter` (both signals) added, counted
/// by `counted`.
fn with_exporter<E>(
    settings: &TelemetrySettings,
    counted: &Counted,
    tracers: TracerProviderBuilder,
    meters: MeterProviderBuilder,
    exporter: E,
) -> (TracerProviderBuilder, MeterProviderBuilder)
where
    E: SpanExporter + PushMetricExporter + Clone + 'static,
{
    let tracers = tracers.with_span_processor(
        counted.gate(batch(settings, counted.span_exporter(exporter.clone()))),
    );
    let meters = meters.with_reader(periodic(settings, counted.metric_exporter(exporter)));
    (tracers, meters)
}

/// The batch span processor: a bounded queue, its own thread (its queue's
/// size is also the gate's, `pipeline::Counted`).
fn batch(
    settings: &TelemetrySettings,
    exporter: impl SpanExporter + 'static,
) -> BatchSpanProcessor {
    let config = BatchConfigBuilder::default()
        .with_max_queue_size(settings.span_queue.max(1))
        .with_max_export_batch_size(settings.span_queue.clamp(1, 512))
        .build();
    BatchSpanProcessor::builder(exporter)
        .with_batch_config(config)
        .build()
}

/// The periodic metric reader: its own thread, every `metric_interval`.
fn periodic(
    settings: &TelemetrySettings,
    exporter: impl PushMetricExporter + 'static,
) -> PeriodicReader<impl PushMetricExporter> {
    PeriodicReader::builder(exporter)
        .with_interval(settings.metric_interval)
        .build()
}

/// OTLP/HTTP protobuf exporters of spans and metrics.
fn otlp_exporters(
    otlp: &OtlpSettings,
) -> Result<
    (
        opentelemetry_otlp::SpanExporter,
        opentelemetry_otlp::MetricExporter,
    ),
    TelemetryError,
> {
    let headers: HashMap<String, String> = otlp.headers.iter().cloned().collect();
    let spans = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(otlp.traces_endpoint.clone())
        .with_timeout(otlp.timeout)
        .with_headers(headers.clone())
        .with_retry_policy(RetryPolicy::disabled())
        .build()
        .map_err(|e| TelemetryError(format!("spans to {}: {e}", otlp.traces_endpoint)))?;
    let metrics = opentelemetry_otlp::MetricExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(otlp.metrics_endpoint.clone())
        .with_timeout(otlp.timeout)
        .with_headers(headers)
        .with_retry_policy(RetryPolicy::disabled())
        .with_temporality(Temporality::Cumulative)
        .build()
        .map_err(|e| TelemetryError(format!("metrics to {}: {e}", otlp.metrics_endpoint)))?;
    Ok((spans, metrics))
}

/// The Application Insights exporter (`opentelemetry-application-insights`:
/// spans become `requests` (the event, a consumer span) and `dependencies`
/// (its steps), metrics `customMetrics`, in delta temporality as the
/// ingestion API wants). Its error never quotes the connection string.
///
/// A fixed sampling share is its `sampleRate` (each span's envelope says
/// it stands for `1 / share` events: Application Insights' `itemCount`).
/// The exporter reads no per-span rate (it drops `_MS.*` attributes and
/// sets one rate for all), so under a rate limit, whose share follows the
/// load, the envelopes say 100 % and the counts are the metrics'.
fn app_insights_exporter<C: HttpClient + 'static>(
    ai: &AppInsightsSettings,
    client: C,
    sampling: Sampling,
) -> Result<opentelemetry_application_insights::Exporter<C>, TelemetryError> {
    let exporter = opentelemetry_application_insights::Exporter::new_from_connection_string(
        &ai.connection_string,
        client,
    )
    .map_err(|_| {
        TelemetryError(
            "APPLICATIONINSIGHTS_CONNECTION_STRING is not a connection string the Application Insights exporter accepts (the value is not shown)".into(),
        )
    })?;
    // 1 is the exporter's default (100 %); 0 exports no span to carry it.
    Ok(match sampling.fixed_ratio() {
        Some(share) => exporter.with_sample_rate(share),
        None => exporter,
    })
}

/// reqwest's blocking client, built on a thread of its own: it owns a
/// runtime, which must not be made (or dropped) on the handler's.
pub(super) fn blocking_client() -> Result<reqwest::blocking::Client, TelemetryError> {
    std::thread::spawn(|| {
        reqwest::blocking::Client::builder()
            .timeout(std::time::Duration::from_secs(10))
            .build()
    })
    .join()
    .map_err(|_| TelemetryError("the thread building the HTTP client panicked".into()))?
    .map_err(|e| TelemetryError(format!("cannot build the HTTP client: {e}")))
}
