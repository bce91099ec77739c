//! The Functions custom-handler protocol over warp (docs/host-protocol.md, "One invocation", "The answer").
//!
//! `POST /OrderTrigger` with `{"Data":{"eventGridEvent":…},"Metadata":{…}}` is
//! answered with `{"Outputs":{},"Logs":[…],"ReturnValue":…}`: 200 when every
//! event's effect is durable or it can never be (duplicates, conflicts, poison
//! stored), 500 when Event Grid must deliver again. Every answer is a JSON
//! object: the host hangs on an empty or `null` 2xx body. `GET /` answers the
//! host's readiness probe. This module knows nothing of Redis or SQL.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Buf;
use futures::Stream;

use serde::Serialize;
use serde_json::error::Category;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use warp::http::{HeaderValue, StatusCode};
use warp::{Filter, Rejection, Reply};

use crate::deadletter::function::{SweepFunction, FUNCTION_NAME as SWEEP_FUNCTION};
use crate::processor::{Outcome, Processor, TriggerResult};

/// The function this handler serves (folder name and request path).
pub const FUNCTION_NAME: &str = "OrderTrigger";
/// The trigger's `name` in `OrderTrigger/function.json`: the key under `Data`.
pub const BINDING_NAME: &str = "eventGridEvent";

/// A request we refuse before any event is looked at.
#[derive(Debug)]
struct Refusal {
    status: StatusCode,
    message: String,
}

impl Refusal {
    fn new(status: StatusCode, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            message: message.into(),
        }
    }
}

/// The custom-handler answer (`HttpScriptInvocationResult`), serialized
/// straight from borrowed parts (no intermediate JSON tree).
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct InvokeResponse<R: Serialize> {
    /// No output bindings: always `{}`.
    outputs: BTreeMap<(), ()>,
    logs: Vec<String>,
    return_value: R,
}

/// `ReturnValue` of a batch: one outcome per event.
#[derive(Serialize)]
struct BatchReturn<'a> {
    results: &'a [Outcome],
}

/// `ReturnValue` of a refused request.
#[derive(Serialize)]
struct ErrorReturn<'a> {
    error: &'a str,
}

fn invoke_response<R: Serialize>(
    status: StatusCode,
    logs: Vec<String>,
    return_value: R,
) -> warp::reply::Response {
    let body = InvokeResponse {
        outputs: BTreeMap::new(),
        logs,
        return_value,
    };
    warp::reply::with_status(warp::reply::json(&body), status).into_response()
}

fn refusal_response(r: Refusal) -> warp::reply::Response {
    log::warn!(
        "invocation refused ({}): {}",
        r.status.as_u16(),
        crate::text::escaped(&r.message)
    );
    let error = ErrorReturn { error: &r.message };
    invoke_response(r.status, vec![r.message.clone()], error)
}

pub use crate::body::Limits;

/// All routes, the dead-letter sweep off (see [`routes_with`]).
pub fn routes(
    processor: Arc<Processor>,
    limits: Limits,
) -> impl Filter<Extract = (warp::reply::Response,), Error = Infallible> + Clone {
    let sweep = Arc::new(SweepFunction::new(Arc::clone(&processor), None));
    routes_with(processor, sweep, limits)
}

/// All routes: readiness, counters, the two functions (`OrderTrigger`,
/// `DeadLetterSweep`), and JSON for everything else.
pub fn routes_with(
    processor: Arc<Processor>,
    sweep: Arc<SweepFunction>,
    limits: Limits,
) -> impl Filter<Extract = (warp::reply::Response,), Error = Infallible> + Clone {
    let ready = warp::get().and(warp::path::end()).map(|| {
        warp::reply::json(&json!({ "status": "ready", "function": FUNCTION_NAME })).into_response()
    });
    let stats_processor = Arc::clone(&processor);
    let stats = warp::get()
        .and(warp::path("stats"))
        .and(warp::path::end())
        .map(move || warp::reply::json(&stats_processor.counters()).into_response());
    let invoke =
        warp::post()
            .and(warp::path::param::<String>())
            .and(warp::path::end())
            .and(warp::header::optional::<u64>("content-length"))
            .and(
                warp::header::value(INVOCATION_ID)
                    .map(Some)
                    .or(warp::any().map(|| None))
                    .unify(),
            )
            .and(warp::body::stream())
            .and_then(
                move |function: String, length: Option<u64>, id: Option<HeaderValue>, body| {
                    let processor = Arc::clone(&processor);
                    let sweep = Arc::clone(&sweep);
                    async move {
                        // Read only for telemetry's spans: nothing when it is off.
                        let id = id.filter(|_| processor.reports_telemetry());
                        let invoked = invoke(&processor, &sweep, &function, length, body, limits);
                        let response =
                            match crate::telemetry::with_invocation_id(invocation_id(id), invoked)
                                .await
                            {
                                Ok(r) => r,
                                Err(refusal) => refusal_response(refusal),
                            };
                        Ok::<_, Rejection>(response)
                    }
                },
            );
    ready
        .or(stats)
        .unify()
        .or(invoke)
        .unify()
        .recover(recover)
        .unify()
}

/// The host's invocation id header: telemetry's join to the host's own
/// request telemetry, never needed for an answer.
const INVOCATION_ID: &str = "x-azure-functions-invocationid";

/// The invocation id, when it is text of at most 128 characters (anything
/// else is ignored, never refused).
fn invocation_id(header: Option<HeaderValue>) -> Option<Arc<str>> {
    let header = header?;
    let id = header.to_str().ok()?;
    (id.len() <= 128).then(|| Arc::from(id))
}

/// Anything that matched no route: a JSON error, never an empty body.
async fn recover(rejection: Rejection) -> Result<warp::reply::Response, Infallible> {
    let (status, message) = if rejection.is_not_found() {
        (
            StatusCode::NOT_FOUND,
            format!("no such route; this handler serves POST /{FUNCTION_NAME} and GET /"),
        )
    } else if rejection.find::<warp::reject::MethodNotAllowed>().is_some() {
        (
            StatusCode::METHOD_NOT_ALLOWED,
            format!("method not allowed; functions are invoked with POST /{FUNCTION_NAME}"),
        )
    } else if let Some(e) = rejection.find::<warp::reject::InvalidHeader>() {
        (StatusCode::BAD_REQUEST, e.to_string())
    } else {
        (StatusCode::BAD_REQUEST, format!("{rejection:?}"))
    };
    Ok(refusal_response(Refusal::new(status, message)))
}

async fn invoke<S, B>(
    processor: &Processor,
    sweep: &SweepFunction,
    function: &str,
    length: Option<u64>,
    body: S,
    limits: Limits,
) -> Result<warp::reply::Response, Refusal>
where
    S: Stream<Item = Result<B, warp::Error>> + Unpin,
    B: Buf,
{
    let is_sweep = function.eq_ignore_ascii_case(SWEEP_FUNCTION);
    if !function.eq_ignore_ascii_case(FUNCTION_NAME) && !is_sweep {
        return Err(Refusal::new(
            StatusCode::NOT_FOUND,
            format!(
                "no function named {:?}; this handler serves {FUNCTION_NAME} and {SWEEP_FUNCTION}",
                crate::text::shown(function)
            ),
        ));
    }
    let bytes = crate::body::read(body, length, limits)
        .await
        .map_err(|e| Refusal::new(e.status(), e.to_string()))?;
    if is_sweep {
        let (status, body) = sweep.invoke(&bytes).await;
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return Ok(warp::reply::with_status(warp::reply::json(&body), status).into_response());
    }
    let trigger = trigger_value(&bytes)?;
    let result = processor.process_trigger(trigger).await;
    Ok(answer(result))
}

/// One level of a JSON object, its members left as unparsed text: the
/// invocation's `Metadata` (a second copy of the event's data) is never
/// turned into a tree, which is most of the work on the duplicate path.
type Members<'a> = BTreeMap<String, &'a RawValue>;

/// Parse `text` as one object level; when it is JSON but not an object,
/// `not_object` says so given the kind of value it is.
fn members<'a>(
    text: &'a str,
    not_object: impl FnOnce(&str) -> String,
) -> Result<Members<'a>, Refusal> {
    serde_json::from_str(text).map_err(|e| {
        let message = match e.classify() {
            Category::Data => not_object(
                serde_json::from_str::<Value>(text)
                    .map(|v| crate::text::json_kind(&v))
                    .unwrap_or("something else"),
            ),
            _ => format!("request body is not valid JSON: {e}"),
        };
        Refusal::new(StatusCode::BAD_REQUEST, message)
    })
}

/// Take `key` from `map`, matching its case exactly first, then without case.
fn take_ci<'a>(map: &mut Members<'a>, key: &str) -> Option<&'a RawValue> {
    if let Some(v) = map.remove(key) {
        return Some(v);
    }
    let actual = map.keys().find(|k| k.eq_ignore_ascii_case(key))?.clone();
    map.remove(&actual)
}

/// `Data.eventGridEvent` from an invocation body (keys matched without case).
fn trigger_value(body: &[u8]) -> Result<Value, Refusal> {
    let bad = |m: String| Refusal::new(StatusCode::BAD_REQUEST, m);
    if body.is_empty() {
        return Err(bad("empty request body; expected a Functions host invocation {\"Data\":{\"eventGridEvent\":…},\"Metadata\":{…}}".into()));
    }
    let text = std::str::from_utf8(body).map_err(|e| {
        bad(format!(
            "request body is not valid JSON: it is not UTF-8 ({e})"
        ))
    })?;
    let mut top = members(text, |kind| {
        format!("request body is JSON but not a host invocation: expected an object with \"Data\", got {kind}")
    })?;
    let data = take_ci(&mut top, "Data").ok_or_else(|| {
        bad("request body is not a host invocation: it has no \"Data\" member".into())
    })?;
    let mut data = members(data.get(), |kind| {
        format!("invocation \"Data\" must be an object keyed by binding name, got {kind}")
    })?;
    let Some(trigger) = take_ci(&mut data, BINDING_NAME) else {
        // Bounded: the names are the sender's, of any number and length.
        let mut found: Vec<String> = data.keys().take(8).map(|k| crate::text::shown(k)).collect();
        if data.len() > 8 {
            found.push(format!("… {} more", data.len() - 8));
        }
        return Err(bad(format!(
            "invocation \"Data\" has no {BINDING_NAME:?} binding (found: {found:?}); the trigger in OrderTrigger/function.json must be named {BINDING_NAME}"
        )));
    };
    serde_json::from_str(trigger.get())
        .map_err(|e| bad(format!("request body is not valid JSON: {e}")))
}

/// Map the outcomes to the host's answer: all-or-none per invocation.
fn answer(result: TriggerResult) -> warp::reply::Response {
    let status = if result.needs_redelivery() {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    };
    let logs = result
        .outcomes
        .iter()
        .map(|o| {
            format!(
                "order {} {}{}",
                o.order_id.as_deref().unwrap_or("?"),
                o.outcome.as_str(),
                o.reason
                    .as_deref()
                    .map(|r| format!(": {}", crate::text::escaped(r)))
                    .unwrap_or_default()
            )
        })
        .collect();
    if result.batch {
        let results = BatchReturn {
            results: &result.outcomes,
        };
        invoke_response(status, logs, results)
    } else {
        invoke_response(status, logs, &result.outcomes[0])
    }
}

/// Bind `addr` and serve until `shutdown` resolves, then drain in-flight
/// invocations for at most `grace`. Returns the bound address (port 0 picks a
/// free one) and the server future.
pub fn bind(
    processor: Arc<Processor>,
    addr: SocketAddr,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> anyhow::Result<(SocketAddr, impl Future<Output = ()>)> {
    let sweep = Arc::new(SweepFunction::new(Arc::clone(&processor), None));
    bind_with(processor, sweep, addr, limits, shutdown, grace)
}

/// [`bind`], with the `DeadLetterSweep` function given.
pub fn bind_with(
    processor: Arc<Processor>,
    sweep: Arc<SweepFunction>,
    addr: SocketAddr,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> anyhow::Result<(SocketAddr, impl Future<Output = ()>)> {
    // Cancellation is sticky: whoever looks after the signal still sees it.
    let stop = tokio_util::sync::CancellationToken::new();
    let signalled = stop.clone();
    let trigger = async move {
        shutdown.await;
        log::info!("shutting down: no new connections; draining in-flight invocations");
        signalled.cancel();
    };
    let drained = stop.clone();
    let (bound, server) = warp::serve(routes_with(processor, sweep, limits))
        .try_bind_with_graceful_shutdown(addr, async move { drained.cancelled().await })
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    let run = async move {
        tokio::spawn(trigger);
        let deadline = async {
            stop.cancelled().await;
            tokio::time::sleep(grace).await;
        };
        tokio::select! {
            () = server => log::info!("all invocations drained"),
            () = deadline => log::warn!("shutdown grace of {} s passed with invocations still running", grace.as_secs()),
        }
    };
    Ok((bound, run))
}
