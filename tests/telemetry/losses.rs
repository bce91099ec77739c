//! Telemetry that is lost is counted: spans the full
//! queue dropped, spans and metric data points whose export failed, read
//! back by the receiver (`otel.sdk.*`, OpenTelemetry's conventions for an
//! SDK's own metrics) from an export that got through; and said once per
//! run of failures in the handler's log, never once per export.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use order_guard::telemetry::{EventReport, Telemetry, TelemetrySettings};

use super::receiver::wait_until;
use super::{attrs, closed_port, common, otlp_settings, points, Receiver};

/// One event's report: one span (no steps), named by its event id.
fn report(event_id: &str) -> EventReport<'_> {
    EventReport {
        order_id: Some("o-1"),
        event_id: Some(event_id),
        outcome: "executed",
        guard: "memory",
        decided_by: "store",
        started: SystemTime::now(),
        elapsed: Duration::from_millis(1),
        steps: &[],
    }
}

fn start(settings: &TelemetrySettings) -> Telemetry {
    Telemetry::start(settings, None)
        .expect("the exporters start")
        .expect("an endpoint turns telemetry on")
}

/// `otel.component.*` of the OTLP pipeline's part `kind`, plus `error`.
fn component(kind: &str, error: Option<&str>) -> BTreeMap<String, String> {
    let name = format!("{kind}/otlp");
    let mut a = attrs(&[
        ("otel.component.type", kind),
        ("otel.component.name", &name),
    ]);
    if let Some(e) = error {
        a.insert("error.type".into(), e.into());
    }
    a
}

fn sorted(mut v: Vec<(BTreeMap<String, String>, i64)>) -> Vec<(BTreeMap<String, String>, i64)> {
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_a_full_queue_dropped_are_counted_exactly() {
    let collector = Receiver::start();
    let telemetry = start(&TelemetrySettings {
        span_queue: 1,
        ..otlp_settings(&collector)
    });
    let events = telemetry.events();
    // The exporter takes the first span and waits on the collector...
    collector.hold_traces(true);
    events.event(&report("e-0"));
    wait_until(Duration::from_secs(10), "the first span's export", || {
        collector.trace_posts() == 1
    })
    .await;
    // ... so the queue (one span) takes the second, and drops the rest.
    for id in ["e-1", "e-2", "e-3", "e-4"] {
        events.event(&report(id));
    }
    collector.hold_traces(false);
    telemetry.shutdown().await;

    let ids: Vec<String> = collector
        .spans()
        .iter()
        .map(|s| super::attributes(&s.attributes)["messaging.message.id"].clone())
        .collect();
    assert_eq!(ids, ["e-0", "e-1"]);
    let metrics = collector.last_metrics();
    let processor = "batching_span_processor";
    assert_eq!(
        sorted(points(&metrics["otel.sdk.processor.span.processed"])),
        sorted(vec![
            (component(processor, None), 2),
            (component(processor, Some("queue_full")), 3),
        ])
    );
    assert_eq!(
        points(&metrics["otel.sdk.processor.span.queue.size"]),
        vec![(component(processor, None), 0)]
    );
    assert_eq!(
        points(&metrics["otel.sdk.exporter.span.exported"]),
        vec![(component("otlp_http_span_exporter", None), 2)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_sent_to_a_collector_that_is_down_are_counted() {
    // Spans to a closed port; metrics to the receiver, which reads the count.
    let collector = Receiver::start();
    let mut settings = otlp_settings(&collector);
    if let Some(otlp) = settings.otlp.as_mut() {
        otlp.traces_endpoint = format!("http://127.0.0.1:{}/v1/traces", closed_port());
    }
    let telemetry = start(&settings);
    let events = telemetry.events();
    for id in ["e-1", "e-2", "e-3", "e-4", "e-5"] {
        events.event(&report(id));
    }
    telemetry.shutdown().await;

    let metrics = collector.last_metrics();
    assert_eq!(
        points(&metrics["otel.sdk.processor.span.processed"]),
        vec![(component("batching_span_processor", None), 5)],
        "all handed to the exporter, none dropped by the queue"
    );
    assert_eq!(
        sorted(points(&metrics["otel.sdk.exporter.span.exported"])),
        sorted(vec![
            (component("otlp_http_span_exporter", None), 0),
            (
                component("otlp_http_span_exporter", Some("export_failed")),
                5
            ),
        ])
    );
    // The events themselves were counted as ever.
    assert_eq!(points(&metrics["order_guard.events"]).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_exports_a_collector_refused_are_counted_once_it_takes_them_again() {
    let collector = Receiver::start();
    collector.refuse_metrics(true);
    let telemetry = start(&TelemetrySettings {
        metric_interval: Duration::from_millis(50),
        ..otlp_settings(&collector)
    });
    telemetry.events().event(&report("e-1"));
    wait_until(
        Duration::from_secs(20),
        "two refused metric exports",
        || collector.metric_posts().1 >= 2,
    )
    .await;
    collector.refuse_metrics(false);
    wait_until(Duration::from_secs(20), "a metric export taken", || {
        collector.metric_posts().0 >= 1
    })
    .await;
    telemetry.shutdown().await;

    // Every point the collector refused is counted lost; every point of the
    // exports it took, but the last (whose outcome it cannot carry), exported.
    let (refused, taken) = collector.metric_points();
    assert!(refused > 0);
    let metrics = collector.last_metrics();
    assert_eq!(
        sorted(points(
            &metrics["otel.sdk.exporter.metric_data_point.exported"]
        )),
        sorted(vec![
            (component("otlp_http_metric_exporter", None), taken as i64),
            (
                component("otlp_http_metric_exporter", Some("export_failed")),
                refused as i64
            ),
        ])
    );
}

/// The real binary's log while a collector refuses metric exports: one
/// warning when they start failing, one line when one gets through again
/// (however many failed in between), and none of the SDK's error lines per
/// failed export.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_of_failed_exports_is_logged_once() {
    let collector = Receiver::start();
    collector.refuse_metrics(true);
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let mut env = common::handler_env(port, dir.path());
    env.push(("OTEL_EXPORTER_OTLP_ENDPOINT".into(), collector.endpoint()));
    env.push(("OTEL_METRIC_EXPORT_INTERVAL".into(), "100".into()));
    let log = dir.path().join("handler.log");
    let mut child = common::spawn_handler(&common::handler_binary(), &env, &log);
    common::wait_ready(port, &mut child, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("{e}: {}", std::fs::read_to_string(&log).unwrap_or_default()));
    wait_until(
        Duration::from_secs(30),
        "three refused metric exports",
        || collector.metric_posts().1 >= 3,
    )
    .await;
    collector.refuse_metrics(false);
    wait_until(Duration::from_secs(30), "a metric export taken", || {
        collector.metric_posts().0 >= 1
    })
    .await;
    common::signal(child.id().expect("running"), "TERM");
    let exit = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the handler stopped within 30 s of SIGTERM")
        .unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(exit.success(), "{exit}: {text}");

    let lines =
        |needle: &str| -> Vec<&str> { text.lines().filter(|l| l.contains(needle)).collect() };
    let failing = lines("not exported");
    assert_eq!(failing.len(), 1, "{text}");
    assert!(
        failing[0].contains(" WARN ") && failing[0].contains("metric data points to"),
        "{text}"
    );
    let again = lines("exported again");
    assert_eq!(again.len(), 1, "{text}");
    let refused = collector.metric_posts().1;
    assert!(
        again[0].contains(&format!("after {refused} failed exports")),
        "{refused} refused: {text}"
    );
    assert!(lines("ExportError").is_empty(), "{text}");
}
