//! The SDK's providers and their OTLP/HTTP (protobuf) exporters.
//!
//! Spans: a batch span processor (its own thread; a bounded queue of
//! `span_queue` spans, a full queue drops the span and the SDK counts it in
//! its shutdown log). Metrics: a periodic reader (its own thread), cumulative
//! temporality (what a collector and Azure Monitor expect). Each export is
//! one attempt bounded by the timeout (no retry: the next export carries
//! the cumulative counts anyway), sent by reqwest's blocking client on the
//! exporter's thread, never on the handler's runtime.

use std::collections::HashMap;

use opentelemetry::metrics::{Meter, MeterProvider};
use opentelemetry::trace::TracerProvider;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{Protocol, RetryPolicy, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider, Temporality};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider, Tracer};
use opentelemetry_sdk::Resource;

use super::{OtlpSettings, TelemetryError, TelemetrySettings};

/// The instrumentation scope of everything this crate records.
const SCOPE: &str = "order-guard";

pub(super) struct Providers {
    meters: SdkMeterProvider,
    tracers: SdkTracerProvider,
}

impl Providers {
    pub(super) fn otlp(
        settings: &TelemetrySettings,
        otlp: &OtlpSettings,
    ) -> Result<Providers, TelemetryError> {
        let resource = Resource::builder_empty()
            .with_service_name(settings.service_name.clone())
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
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
        let batch = BatchConfigBuilder::default()
            .with_max_queue_size(settings.span_queue.max(1))
            .with_max_export_batch_size(settings.span_queue.clamp(1, 512))
            .build();
        let tracers = SdkTracerProvider::builder()
            .with_resource(resource.clone())
            .with_span_processor(
                BatchSpanProcessor::builder(spans)
                    .with_batch_config(batch)
                    .build(),
            )
            .build();
        let meters = SdkMeterProvider::builder()
            .with_resource(resource)
            .with_reader(
                PeriodicReader::builder(metrics)
                    .with_interval(settings.metric_interval)
                    .build(),
            )
            .build();
        Ok(Providers { meters, tracers })
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
