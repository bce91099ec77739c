//! A local OTLP/HTTP receiver: `POST /v1/traces` and `POST /v1/metrics`
//! decoded with the official protobuf definitions (`opentelemetry-proto`),
//! on a free loopback port; answered as a collector does (200, an empty
//! protobuf response).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

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
    metrics: Vec<ExportMetricsServiceRequest>,
}

pub struct Receiver {
    pub addr: SocketAddr,
    received: Arc<Mutex<Received>>,
}

impl Receiver {
    /// Listen on a free loopback port (on the current tokio runtime).
    pub fn start() -> Receiver {
        let received = Arc::new(Mutex::new(Received::default()));
        let traces = {
            let received = Arc::clone(&received);
            warp::post()
                .and(warp::path!("v1" / "traces"))
                .and(warp::body::bytes())
                .map(move |body: bytes::Bytes| {
                    let request = ExportTraceServiceRequest::decode(body)
                        .expect("the exporter posted a valid ExportTraceServiceRequest");
                    received.lock().unwrap().traces.push(request);
                    protobuf(ExportTraceServiceResponse::default().encode_to_vec())
                })
        };
        let metrics = {
            let received = Arc::clone(&received);
            warp::post()
                .and(warp::path!("v1" / "metrics"))
                .and(warp::body::bytes())
                .map(move |body: bytes::Bytes| {
                    let request = ExportMetricsServiceRequest::decode(body)
                        .expect("the exporter posted a valid ExportMetricsServiceRequest");
                    received.lock().unwrap().metrics.push(request);
                    protobuf(ExportMetricsServiceResponse::default().encode_to_vec())
                })
        };
        let (addr, server) = warp::serve(traces.or(metrics)).bind_ephemeral(([127, 0, 0, 1], 0));
        tokio::spawn(server);
        Receiver { addr, received }
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
