//! A local OTLP/HTTP receiver: `POST /v1/traces` and `POST /v1/metrics`
//! decoded with the official protobuf definitions (`opentelemetry-proto`),
//! on a free loopback port; answered as a collector does (200, an empty
//! protobuf response). For the tests of what is lost, it can hold trace
//! exports unanswered and refuse metric exports (503, as a collector that
//! cannot take them), keeping what it refused.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point, Metric};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use warp::Filter;

#[derive(Default)]
struct Received {
    traces: Vec<ExportTraceServiceRequest>,
    /// Trace exports that arrived, answered or still held.
    trace_posts: usize,
    metrics: Vec<ExportMetricsServiceRequest>,
    refused_metrics: Vec<ExportMetricsServiceRequest>,
}

pub struct Receiver {
    pub addr: SocketAddr,
    received: Arc<Mutex<Received>>,
    hold_traces: tokio::sync::watch::Sender<bool>,
    refuse_metrics: Arc<AtomicBool>,
}

impl Receiver {
    /// Listen on a free loopback port (on the current tokio runtime).
    pub fn start() -> Receiver {
        let received = Arc::new(Mutex::new(Received::default()));
        let (hold_traces, held) = tokio::sync::watch::channel(false);
        let refuse_metrics = Arc::new(AtomicBool::new(false));
        let traces = {
            let received = Arc::clone(&received);
            warp::post()
                .and(warp::path!("v1" / "traces"))
                .and(warp::body::bytes())
                .and_then(move |body: bytes::Bytes| {
                    let received = Arc::clone(&received);
                    let mut held = held.clone();
                    async move {
                        let request = ExportTraceServiceRequest::decode(body)
                            .expect("the exporter posted a valid ExportTraceServiceRequest");
                        received.lock().unwrap().trace_posts += 1;
                        // Unanswered while held: the exporter's thread waits.
                        let _ = held.wait_for(|held| !held).await;
                        received.lock().unwrap().traces.push(request);
                        Ok::<_, Infallible>(protobuf(
                            ExportTraceServiceResponse::default().encode_to_vec(),
                        ))
                    }
                })
        };
        let metrics = {
            let received = Arc::clone(&received);
            let refuse = Arc::clone(&refuse_metrics);
            warp::post()
                .and(warp::path!("v1" / "metrics"))
                .and(warp::body::bytes())
                .map(move |body: bytes::Bytes| {
                    let request = ExportMetricsServiceRequest::decode(body)
                        .expect("the exporter posted a valid ExportMetricsServiceRequest");
                    let mut received = received.lock().unwrap();
                    if refuse.load(Ordering::SeqCst) {
                        received.refused_metrics.push(request);
                        let mut refused = warp::reply::Response::new("".into());
                        *refused.status_mut() = warp::http::StatusCode::SERVICE_UNAVAILABLE;
                        return refused;
                    }
                    received.metrics.push(request);
                    protobuf(ExportMetricsServiceResponse::default().encode_to_vec())
                })
        };
        let (addr, server) = warp::serve(traces.or(metrics)).bind_ephemeral(([127, 0, 0, 1], 0));
        tokio::spawn(server);
        Receiver {
            addr,
            received,
            hold_traces,
            refuse_metrics,
        }
    }

    /// Leave trace exports unanswered (`true`) until called with `false`.
    pub fn hold_traces(&self, hold: bool) {
        self.hold_traces.send_replace(hold);
    }

    /// Trace exports that arrived, answered or held.
    pub fn trace_posts(&self) -> usize {
        self.received.lock().unwrap().trace_posts
    }

    /// Answer metric exports 503 (`true`) until called with `false`.
    pub fn refuse_metrics(&self, refuse: bool) {
        self.refuse_metrics.store(refuse, Ordering::SeqCst);
    }

    /// Metric exports taken and refused so far.
    pub fn metric_posts(&self) -> (usize, usize) {
        let received = self.received.lock().unwrap();
        (received.metrics.len(), received.refused_metrics.len())
    }

    /// Data points in the metric exports refused, and in those taken but
    /// the last.
    pub fn metric_points(&self) -> (usize, usize) {
        let received = self.received.lock().unwrap();
        let count = |requests: &[ExportMetricsServiceRequest]| -> usize {
            requests.iter().map(data_points).sum()
        };
        let taken = received.metrics.len().saturating_sub(1);
        (
            count(&received.refused_metrics),
            count(&received.metrics[..taken]),
        )
    }

    /// `OTEL_EXPORTER_OTLP_ENDPOINT` for this receiver.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received, in arrival order.
    pub fn spans(&self) -> Vec<Span> {
        let received = self.received.lock().unwrap();
        received
            .traces
            .iter()
            .flat_map(|r| &r.resource_spans)
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| s.spans.clone())
            .collect()
    }

    /// The metrics of the last export (cumulative: the totals at exit),
    /// by name.
    pub fn last_metrics(&self) -> BTreeMap<String, Metric> {
        let received = self.received.lock().unwrap();
        let Some(last) = received.metrics.last() else {
            return BTreeMap::new();
        };
        last.resource_metrics
            .iter()
            .flat_map(|r| &r.scope_metrics)
            .flat_map(|s| s.metrics.clone())
            .map(|m| (m.name.clone(), m))
            .collect()
    }

    /// The `service.name` of every export received.
    pub fn service_names(&self) -> Vec<String> {
        let received = self.received.lock().unwrap();
        let traces = received
            .traces
            .iter()
            .flat_map(|r| &r.resource_spans)
            .filter_map(|r| r.resource.as_ref());
        let metrics = received
            .metrics
            .iter()
            .flat_map(|r| &r.resource_metrics)
            .filter_map(|r| r.resource.as_ref());
        traces
            .chain(metrics)
            .filter_map(|r| attributes(&r.attributes).get("service.name").cloned())
            .collect()
    }
}

/// Poll `done` until it holds, for at most `limit` (what it waits for is
/// in another process or on an exporter's thread: no signal to await).
pub async fn wait_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The data points of one metric export, as the exporter counts them.
fn data_points(request: &ExportMetricsServiceRequest) -> usize {
    request
        .resource_metrics
        .iter()
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .map(|m| match &m.data {
            Some(metric::Data::Gauge(g)) => g.data_points.len(),
            Some(metric::Data::Sum(s)) => s.data_points.len(),
            Some(metric::Data::Histogram(h)) => h.data_points.len(),
            Some(metric::Data::ExponentialHistogram(e)) => e.data_points.len(),
            Some(metric::Data::Summary(s)) => s.data_points.len(),
            None => 0,
        })
        .sum()
}

fn protobuf(body: Vec<u8>) -> warp::reply::Response {
    let mut response = warp::reply::Response::new(body.into());
    response.headers_mut().insert(
        "content-type",
        warp::http::HeaderValue::from_static("application/x-protobuf"),
    );
    response
}

/// Attributes as text (strings as they are, numbers and booleans printed).
pub fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValue(s)) => s.clone(),
                Some(any_value::Value::IntValue(i)) => i.to_string(),
                Some(any_value::Value::BoolValue(b)) => b.to_string(),
                Some(any_value::Value::DoubleValue(d)) => d.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

/// The data points of a sum (counter) or gauge: attributes → value.
pub fn points(metric: &Metric) -> Vec<(BTreeMap<String, String>, i64)> {
    let points = match &metric.data {
        Some(metric::Data::Sum(sum)) => &sum.data_points,
        Some(metric::Data::Gauge(gauge)) => &gauge.data_points,
        other => panic!("{} is not a sum or a gauge: {other:?}", metric.name),
    };
    points
        .iter()
        .map(|p| {
            let value = match p.value {
                Some(number_data_point::Value::AsInt(i)) => i,
                Some(number_data_point::Value::AsDouble(d)) => d as i64,
                None => panic!("{}: a data point without a value", metric.name),
            };
            (attributes(&p.attributes), value)
        })
        .collect()
}

/// The data points of a gauge of doubles: attributes → value.
pub fn double_points(metric: &Metric) -> Vec<(BTreeMap<String, String>, f64)> {
    let Some(metric::Data::Gauge(gauge)) = &metric.data else {
        panic!("{} is not a gauge: {:?}", metric.name, metric.data);
    };
    gauge
        .data_points
        .iter()
        .map(|p| match p.value {
            Some(number_data_point::Value::AsDouble(d)) => (attributes(&p.attributes), d),
            other => panic!("{}: not a double: {other:?}", metric.name),
        })
        .collect()
}

/// The data points of a histogram: attributes → count.
pub fn histogram_counts(metric: &Metric) -> Vec<(BTreeMap<String, String>, u64)> {
    match &metric.data {
        Some(metric::Data::Histogram(h)) => h
            .data_points
            .iter()
            .map(|p| (attributes(&p.attributes), p.count))
            .collect(),
        other => panic!("{} is not a histogram: {other:?}", metric.name),
    }
}
