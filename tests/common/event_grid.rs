//! A local endpoint that enforces Event Grid's publish contract for custom
//! topics, as Microsoft documents it ("Publish events to Azure Event Grid
//! custom topics using access keys"; the event schemas): `POST
//! /api/events?api-version=2018-01-01`; the `aeg-sas-key` header (or a
//! bearer token) or 401; the content type of the topic's input schema; a
//! JSON array of events, at most 1 MB a request (413 beyond), each event
//! with the schema's required fields (400 naming what is wrong); 200 with
//! an empty body when accepted. Not an emulator: nothing is delivered
//! anywhere; accepted events are kept for the test to read, and a test may
//! script the next answers (500, 503, 413) to play the service failing.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use warp::http::StatusCode;
use warp::Filter;

/// Event Grid's limit on one publish request.
pub const MAX_REQUEST_BYTES: usize = 1024 * 1024;

#[derive(Default)]
struct State {
    accepted: Vec<Value>,
    requests: u64,
    scripted: VecDeque<u16>,
}

pub struct EventGridTopic {
    pub port: u16,
    key: String,
    cloud_events: bool,
    state: Arc<Mutex<State>>,
    _server: tokio::task::JoinHandle<()>,
}

impl EventGridTopic {
    /// A topic with access key `key`, of the Event Grid input schema, or
    /// CloudEvents 1.0 when `cloud_events`.
    pub async fn start(key: &str, cloud_events: bool) -> EventGridTopic {
        let state = Arc::new(Mutex::new(State::default()));
        let (k, s) = (key.to_string(), Arc::clone(&state));
        let route = warp::path!("api" / "events")
            .and(warp::post())
            .and(warp::query::raw().or(warp::any().map(String::new)).unify())
            .and(warp::header::optional::<String>("aeg-sas-key"))
            .and(warp::header::optional::<String>("content-type"))
            .and(warp::body::content_length_limit(
                8 * MAX_REQUEST_BYTES as u64,
            ))
            .and(warp::body::bytes())
            .map(
                move |query: String,
                      sas: Option<String>,
                      ct: Option<String>,
                      body: bytes::Bytes| {
                    let mut st = s.lock().unwrap();
                    st.requests += 1;
                    let (status, message) =
                        judge(&k, cloud_events, &query, sas, ct, &body, &mut st);
                    warp::reply::with_status(message, status)
                },
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let incoming = tokio_stream_of(listener);
        let server = tokio::spawn(warp::serve(route).run_incoming(incoming));
        EventGridTopic {
            port,
            key: key.to_string(),
            cloud_events,
            state,
            _server: server,
        }
    }

    /// The endpoint, as `OUTBOX_TOPIC_ENDPOINT` takes it.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/api/events", self.port)
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn cloud_events(&self) -> bool {
        self.cloud_events
    }

    /// The next requests are answered these statuses, whatever they hold.
    pub fn answer_next(&self, statuses: &[u16]) {
        self.state.lock().unwrap().scripted.extend(statuses);
    }

    /// Every event accepted so far.
    pub fn accepted(&self) -> Vec<Value> {
        self.state.lock().unwrap().accepted.clone()
    }

    pub fn requests(&self) -> u64 {
        self.state.lock().unwrap().requests
    }
}

fn tokio_stream_of(
    listener: tokio::net::TcpListener,
) -> impl futures::Stream<Item = Result<tokio::net::TcpStream, Infallible>> {
    futures::stream::unfold(listener, |l| async move {
        loop {
            if let Ok((socket, _)) = l.accept().await {
                return Some((Ok(socket), l));
            }
        }
    })
}

/// The answer the contract gives this request.
fn judge(
    key: &str,
    cloud_events: bool,
    query: &str,
    sas: Option<String>,
    content_type: Option<String>,
    body: &[u8],
    st: &mut State,
) -> (StatusCode, String) {
    let status = |code: u16| StatusCode::from_u16(code).unwrap();
    if let Some(code) = st.scripted.pop_front() {
        return (status(code), format!("scripted {code}"));
    }
    if !query.split('&').any(|p| p == "api-version=2018-01-01") {
        return (status(400), "api-version=2018-01-01 is required".into());
    }
    if sas.as_deref() != Some(key) {
        return (
            status(401),
            "the request is not authorized (aeg-sas-key)".into(),
        );
    }
    let ct = content_type.unwrap_or_default();
    let want = if cloud_events {
        "application/cloudevents-batch+json"
    } else {
        "application/json"
    };
    if !ct.starts_with(want) {
        return (
            status(400),
            format!("content type {ct:?}: this topic takes {want}"),
        );
    }
    if body.len() > MAX_REQUEST_BYTES {
        return (status(413), format!("{} bytes: more than 1 MB", body.len()));
    }
    let Ok(Value::Array(events)) = serde_json::from_slice::<Value>(body) else {
        return (status(400), "the body is not a JSON array of events".into());
    };
    for e in &events {
        if let Err(why) = check_event(e, cloud_events) {
            return (status(400), why);
        }
    }
    st.accepted.extend(events);
    (status(200), String::new())
}

fn check_event(e: &Value, cloud_events: bool) -> Result<(), String> {
    let text = |field: &str| -> Result<&str, String> {
        e.get(field)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| format!("the event has no {field}: {e}"))
    };
    if cloud_events {
        if text("specversion")? != "1.0" {
            return Err(format!("specversion must be 1.0: {e}"));
        }
        text("id")?;
        text("source")?;
        text("type")?;
    } else {
        for field in ["id", "subject", "eventType", "eventTime", "dataVersion"] {
            text(field)?;
        }
        time::OffsetDateTime::parse(
            text("eventTime")?,
            &time::format_description::well_known::Rfc3339,
        )
        .map_err(|_| format!("eventTime is not RFC 3339: {e}"))?;
        if e.get("data").is_none() {
            return Err(format!("the event has no data: {e}"));
        }
    }
    Ok(())
}
