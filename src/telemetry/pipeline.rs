//! What each export pipeline hands on and loses: counted as OpenTelemetry's
//! conventions for an SDK's own metrics name it (`otel.sdk.*`, status
//! development), and said once per burst in the log.
//!
//! Why our own counting: the SDK's batch span processor counts the spans its
//! full queue drops in a private field (logged at shutdown only), its
//! `otel.sdk.processor.span.processed` is behind an experimental feature and
//! goes to the global meter provider, and nothing counts failed exports. So
//! each pipeline (OTLP, Application Insights) is wrapped:
//! - [`Gated`], before the batch processor, admits a span only while fewer
//!   than the queue's size wait for the exporter; otherwise it drops it,
//!   counted (`error.type = queue_full`). Exact: a span leaves the count only
//!   when the processor hands it to the exporter, after it has left the SDK's
//!   queue of the same size, so that queue is never full and drops nothing
//!   uncounted. On the event's path this costs one atomic add.
//! - [`CountedSpans`] and [`CountedMetrics`], around the exporters, count
//!   the spans and metric data points each export carried, exported or
//!   failed (by `error.type`), and log one warning when a pipeline's exports
//!   start failing and one line when one succeeds again, never one per
//!   export. The queue's drops are logged the same way, from the exporter's
//!   thread: an event never writes a log line for telemetry.
//!
//! The counts are read by observable instruments at each metric export, so
//! a loss is exported by every reader, and a failing one carries it once
//! its collector is back (cumulative).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::metrics::Meter;
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::Temporality;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;

/// Which exporter a pipeline ends in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Otlp,
    ApplicationInsights,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Otlp => "otlp",
            Kind::ApplicationInsights => "application_insights",
        }
    }

    /// `otel.component.type` of its exporters (the conventions' value for
    /// OTLP/HTTP protobuf; ours for Application Insights, which has none).
    fn exporter_type(self, signal: Signal) -> &'static str {
        match (self, signal) {
            (Kind::Otlp, Signal::Spans) => "otlp_http_span_exporter",
            (Kind::Otlp, Signal::Metrics) => "otlp_http_metric_exporter",
            (Kind::ApplicationInsights, Signal::Spans) => "application_insights_span_exporter",
            (Kind::ApplicationInsights, Signal::Metrics) => "application_insights_metric_exporter",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    Spans,
    Metrics,
}

/// `otel.component.type` of the batch span processor.
const PROCESSOR: &str = "batching_span_processor";

/// `error.type` of a failed export, by [`failure`].
const FAILURES: [&str; 3] = ["timeout", "already_shutdown", "export_failed"];

fn failure(e: &OTelSdkError) -> usize {
    match e {
        OTelSdkError::Timeout(_) => 0,
        OTelSdkError::AlreadyShutdown => 1,
        // The OTLP exporter says "network error" or the HTTP status only in
        // its text: the text goes to the log line, not to an attribute.
        _ => 2,
    }
}

/// The spans admitted to a batch processor's queue and not yet handed to
/// its exporter, and what became of the others.
#[derive(Debug)]
struct SpanQueue {
    capacity: u64,
    waiting: AtomicU64,
    /// Handed to the exporter (the conventions' "processed").
    processed: AtomicU64,
    queue_full: AtomicU64,
    /// The drops already seen, for the log.
    logged: Mutex<DropBurst>,
}

#[derive(Debug, Default)]
struct DropBurst {
    /// `queue_full` at the last export.
    seen: u64,
    /// While spans are being dropped: `queue_full` when it began.
    since: Option<u64>,
}

impl SpanQueue {
    /// On the event's path: one atomic add (three when full). A span
    /// refused while another is being refused may find the count one over
    /// for an instant: dropped a little early, still counted, never
    /// dropped uncounted.
    fn admit(&self) -> bool {
        // AcqRel: a slot freed by `handed_on` (after the SDK's queue gave
        // the span up) is seen with that queue's own state.
        if self.waiting.fetch_add(1, Ordering::AcqRel) < self.capacity {
            return true;
        }
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        self.queue_full.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// On the exporter's thread: `n` spans left the queue for the exporter.
    fn handed_on(&self, n: u64, destination: &str) {
        self.waiting.fetch_sub(n, Ordering::AcqRel);
        self.processed.fetch_add(n, Ordering::Relaxed);
        let dropped = self.queue_full.load(Ordering::Relaxed);
        let mut burst = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        match burst.since {
            None if dropped > burst.seen => {
                log::warn!(
                    "telemetry: the span queue for {destination} is full (OTEL_BSP_MAX_QUEUE_SIZE = {}): spans are dropped, counted in otel.sdk.processor.span.processed (error.type = queue_full), and not logged again until it has room",
                    self.capacity
                );
                burst.since = Some(burst.seen);
            }
            Some(since) if dropped == burst.seen => {
                log::info!(
                    "telemetry: the span queue for {destination} has room again ({} spans dropped)",
                    dropped - since
                );
                burst.since = None;
            }
            _ => {}
        }
        burst.seen = dropped;
    }
}

/// What one exporter's exports carried (spans or data points), exported or
/// failed by `error.type`, and its current run of failures for the log.
#[derive(Debug)]
struct Exports {
    signal: Signal,
    destination: String,
    exported: AtomicU64,
    failed: [AtomicU64; FAILURES.len()],
    burst: Mutex<FailureBurst>,
}

#[derive(Debug, Default)]
struct FailureBurst {
    exports: u64,
    items: u64,
}

impl Exports {
    fn new(signal: Signal, destination: String) -> Exports {
        Exports {
            signal,
            destination,
            exported: AtomicU64::new(0),
            failed: Default::default(),
            burst: Mutex::new(FailureBurst::default()),
        }
    }

    /// An export of `items` ended with `result` (on the exporter's thread).
    fn record(&self, items: u64, result: &OTelSdkResult) {
        let (what, metric) = match self.signal {
            Signal::Spans => ("spans", "otel.sdk.exporter.span.exported"),
            Signal::Metrics => (
                "metric data points",
                "otel.sdk.exporter.metric_data_point.exported",
            ),
        };
        let mut burst = self.burst.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(()) => {
                self.exported.fetch_add(items, Ordering::Relaxed);
                if burst.exports > 0 {
                    log::info!(
                        "telemetry: {what} to {} exported again, after {} failed exports ({} {what} lost)",
                        self.destination,
                        burst.exports,
                        burst.items
                    );
                    *burst = FailureBurst::default();
                }
            }
            Err(e) => {
                self.failed[failure(e)].fetch_add(items, Ordering::Relaxed);
                if burst.exports == 0 {
                    log::warn!(
                        "telemetry: {what} to {} not exported ({e}); until an export succeeds, what fails is dropped, counted in {metric} (error.type), and not logged again",
                        self.destination
                    );
                }
                burst.exports += 1;
                burst.items += items;
            }
        }
    }

    /// `[otel.component.type, otel.component.name]` of this exporter.
    fn component(&self, kind: Kind) -> Vec<KeyValue> {
        let kind_of = kind.exporter_type(self.signal);
        vec![
            KeyValue::new("otel.component.type", kind_of),
            KeyValue::new("otel.component.name", format!("{kind_of}/{}", kind.name())),
        ]
    }

    /// Its data points: exported, and each `error.type` once it has lost any.
    fn observe(&self, kind: Kind, o: &dyn opentelemetry::metrics::AsyncInstrument<u64>) {
        let component = self.component(kind);
        o.observe(self.exported.load(Ordering::Relaxed), &component);
        for (i, count) in self.failed.iter().enumerate() {
            let n = count.load(Ordering::Relaxed);
            if n > 0 {
                let mut a = component.clone();
                a.push(KeyValue::new("error.type", FAILURES[i]));
                o.observe(n, &a);
            }
        }
    }
}

/// The counts of one pipeline: its span queue, its two exporters.
#[derive(Debug)]
pub(super) struct Counted {
    kind: Kind,
    queue: Arc<SpanQueue>,
    spans: Arc<Exports>,
    metrics: Arc<Exports>,
}

impl Counted {
    /// A pipeline of `kind` whose span queue holds `capacity` spans;
    /// `spans_to` and `metrics_to` say where its exports go, for the log.
    pub(super) fn new(kind: Kind, capacity: usize, spans_to: &str, metrics_to: &str) -> Counted {
        Counted {
            kind,
            queue: Arc::new(SpanQueue {
                capacity: capacity.max(1) as u64,
                waiting: AtomicU64::new(0),
                processed: AtomicU64::new(0),
                queue_full: AtomicU64::new(0),
                logged: Mutex::new(DropBurst::default()),
            }),
            spans: Arc::new(Exports::new(Signal::Spans, spans_to.to_string())),
            metrics: Arc::new(Exports::new(Signal::Metrics, metrics_to.to_string())),
        }
    }

    /// `processor` (a batch processor of `capacity` spans, exporting through
    /// [`Counted::span_exporter`]) behind this pipeline's gate.
    pub(super) fn gate<P: SpanProcessor>(&self, processor: P) -> Gated<P> {
        Gated {
            inner: processor,
            queue: Arc::clone(&self.queue),
        }
    }

    pub(super) fn span_exporter<E: SpanExporter>(&self, exporter: E) -> CountedSpans<E> {
        CountedSpans {
            inner: exporter,
            queue: Arc::clone(&self.queue),
            exports: Arc::clone(&self.spans),
        }
    }

    pub(super) fn metric_exporter<E: PushMetricExporter>(&self, exporter: E) -> CountedMetrics<E> {
        CountedMetrics {
            inner: exporter,
            exports: Arc::clone(&self.metrics),
        }
    }

    fn processor_attributes(&self) -> Vec<KeyValue> {
        vec![
            KeyValue::new("otel.component.type", PROCESSOR),
            KeyValue::new(
                "otel.component.name",
                format!("{PROCESSOR}/{}", self.kind.name()),
            ),
        ]
    }
}

/// Register the instruments that export what `pipelines` handed on and lost.
pub(super) fn observe(meter: &Meter, pipelines: Vec<Counted>) {
    let pipelines = Arc::new(pipelines);
    let p = Arc::clone(&pipelines);
    meter
        .u64_observable_counter("otel.sdk.processor.span.processed")
        .with_unit("{span}")
        .with_description("Spans handed to the exporter, or dropped (error.type = queue_full) because the span queue was full")
        .with_callback(move |o| {
            for c in p.iter() {
                let a = c.processor_attributes();
                o.observe(c.queue.processed.load(Ordering::Relaxed), &a);
                let dropped = c.queue.queue_full.load(Ordering::Relaxed);
                if dropped > 0 {
                    let mut a = a;
                    a.push(KeyValue::new("error.type", "queue_full"));
                    o.observe(dropped, &a);
                }
            }
        })
        .build();
    let p = Arc::clone(&pipelines);
    meter
        .i64_observable_up_down_counter("otel.sdk.processor.span.queue.size")
        .with_unit("{span}")
        .with_description("Spans in the span queue, waiting for the exporter")
        .with_callback(move |o| {
            for c in p.iter() {
                let waiting = c.queue.waiting.load(Ordering::Relaxed);
                o.observe(
                    i64::try_from(waiting).unwrap_or(i64::MAX),
                    &c.processor_attributes(),
                );
            }
        })
        .build();
    let p = Arc::clone(&pipelines);
    meter
        .u64_observable_counter("otel.sdk.exporter.span.exported")
        .with_unit("{span}")
        .with_description("Spans whose export ended: exported, or lost (error.type)")
        .with_callback(move |o| {
            for c in p.iter() {
                c.spans.observe(c.kind, o);
            }
        })
        .build();
    meter
        .u64_observable_counter("otel.sdk.exporter.metric_data_point.exported")
        .with_unit("{data_point}")
        .with_description("Metric data points whose export ended: exported, or lost (error.type)")
        .with_callback(move |o| {
            for c in pipelines.iter() {
                c.metrics.observe(c.kind, o);
            }
        })
        .build();
}

/// A span processor behind its pipeline's count of waiting spans.
#[derive(Debug)]
pub(super) struct Gated<P> {
    inner: P,
    queue: Arc<SpanQueue>,
}

impl<P: SpanProcessor> SpanProcessor for Gated<P> {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        // The batch processor takes sampled spans only: a span it would
        // ignore must not hold a slot (the sampler drops the others where
        // they start, so none arrives here today).
        if span.span_context.is_sampled() && self.queue.admit() {
            self.inner.on_end(span);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn shutdown(&self) -> OTelSdkResult {
        self.inner.shutdown()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// A span exporter whose batches are counted.
#[derive(Debug)]
pub(super) struct CountedSpans<E> {
    inner: E,
    queue: Arc<SpanQueue>,
    exports: Arc<Exports>,
}

impl<E: SpanExporter> SpanExporter for CountedSpans<E> {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        let n = batch.len() as u64;
        self.queue.handed_on(n, &self.exports.destination);
        let export = self.inner.export(batch);
        async move {
            let result = export.await;
            self.exports.record(n, &result);
            result
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn shutdown(&self) -> OTelSdkResult {
        self.inner.shutdown()
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// A metric exporter whose data points are counted.
#[derive(Debug)]
pub(super) struct CountedMetrics<E> {
    inner: E,
    exports: Arc<Exports>,
}

impl<E: PushMetricExporter> PushMetricExporter for CountedMetrics<E> {
    fn export(&self, metrics: &ResourceMetrics) -> impl Future<Output = OTelSdkResult> + Send {
        let n = data_points(metrics);
        let export = self.inner.export(metrics);
        async move {
            let result = export.await;
            self.exports.record(n, &result);
            result
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn shutdown(&self) -> OTelSdkResult {
        self.inner.shutdown()
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}

/// The data points of one export (what a collector receives as points).
fn data_points(metrics: &ResourceMetrics) -> u64 {
    fn of<T>(data: &MetricData<T>) -> usize {
        match data {
            MetricData::Gauge(g) => g.data_points().count(),
            MetricData::Sum(s) => s.data_points().count(),
            MetricData::Histogram(h) => h.data_points().count(),
            MetricData::ExponentialHistogram(e) => e.data_points().count(),
        }
    }
    metrics
        .scope_metrics()
        .flat_map(|s| s.metrics())
        .map(|m| match m.data() {
            AggregatedMetrics::F64(d) => of(d),
            AggregatedMetrics::U64(d) => of(d),
            AggregatedMetrics::I64(d) => of(d),
        } as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(capacity: usize) -> Arc<SpanQueue> {
        Counted::new(Kind::Otlp, capacity, "t", "m").queue
    }

    #[test]
    fn a_full_queue_drops_and_counts_until_the_exporter_takes_a_batch() {
        let q = queue(2);
        assert!(q.admit() && q.admit());
        assert!(!q.admit() && !q.admit(), "a third and a fourth span");
        assert_eq!(q.queue_full.load(Ordering::Relaxed), 2);
        assert_eq!(q.waiting.load(Ordering::Relaxed), 2);
        q.handed_on(2, "t");
        assert_eq!(q.processed.load(Ordering::Relaxed), 2);
        assert!(q.admit(), "room again");
        assert_eq!(q.waiting.load(Ordering::Relaxed), 1);
    }

    /// A processor that counts what it is handed.
    #[derive(Debug, Default)]
    struct Taken(AtomicU64);

    impl SpanProcessor for &Taken {
        fn on_start(&self, _: &mut Span, _: &Context) {}
        fn on_end(&self, _: SpanData) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        fn force_flush(&self) -> OTelSdkResult {
            Ok(())
        }
        fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
            Ok(())
        }
    }

    fn span_data(sampled: bool) -> SpanData {
        use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId};
        let flags = if sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        SpanData {
            span_context: SpanContext::new(
                TraceId::from(1u128),
                SpanId::from(1u64),
                flags,
                false,
                Default::default(),
            ),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Consumer,
            name: "process OrderTrigger".into(),
            start_time: std::time::SystemTime::UNIX_EPOCH,
            end_time: std::time::SystemTime::UNIX_EPOCH,
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: Status::Unset,
            instrumentation_scope: Default::default(),
        }
    }

    #[test]
    fn the_gate_admits_sampled_spans_only() {
        let taken = Taken::default();
        let counted = Counted::new(Kind::Otlp, 4, "t", "m");
        let gate = counted.gate(&taken);
        gate.on_end(span_data(false));
        assert_eq!(
            taken.0.load(Ordering::Relaxed),
            0,
            "not sampled: not queued"
        );
        assert_eq!(
            counted.queue.waiting.load(Ordering::Relaxed),
            0,
            "no slot held"
        );
        gate.on_end(span_data(true));
        assert_eq!(taken.0.load(Ordering::Relaxed), 1);
        assert_eq!(counted.queue.waiting.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn failures_are_counted_by_error_type_and_their_run_reset_by_a_success() {
        let e = Exports::new(Signal::Spans, "t".into());
        e.record(
            3,
            &Err(OTelSdkError::InternalFailure("network error".into())),
        );
        e.record(2, &Err(OTelSdkError::Timeout(Duration::from_secs(1))));
        assert_eq!(e.failed[2].load(Ordering::Relaxed), 3);
        assert_eq!(e.failed[0].load(Ordering::Relaxed), 2);
        {
            let burst = e.burst.lock().unwrap();
            assert_eq!((burst.exports, burst.items), (2, 5));
        }
        e.record(4, &Ok(()));
        assert_eq!(e.exported.load(Ordering::Relaxed), 4);
        let burst = e.burst.lock().unwrap();
        assert_eq!((burst.exports, burst.items), (0, 0), "the run ended");
    }
}
