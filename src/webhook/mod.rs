//! Event Grid's webhook protocol: the second front door, for where no
//! Functions host runs (Azure Container Apps, AKS, a container anywhere).
//! The processor, guard, store, outbox and telemetry behind it are the ones
//! `host` serves; only the wire differs (docs/webhook.md).
//!
//! - `POST /events`: a delivery. Event Grid schema (a JSON array, the
//!   `aeg-event-type` header saying what it is), one CloudEvent
//!   (`application/cloudevents+json`) or a CloudEvents batch (an array).
//!   The validation handshake is answered with its code in the same
//!   request; the token is checked first ([`auth`]), then the body is read
//!   within [`Limits`], then the events are processed as one trigger:
//!   [`delivery::status`] maps the outcomes to Event Grid's codes.
//! - `OPTIONS /events`: the CloudEvents abuse-protection handshake.
//! - `GET /healthz` (alive) and `GET /readyz` (the guard and the store
//!   answer, and no drain under way).
//!
//! On the shutdown signal the door drains ([`drain_step`]): `readyz` says
//! 503 at once, deliveries are still taken for most of the grace (until
//! the ingress stops routing here: a run of 503s would have Event Grid
//! delay every delivery to the endpoint), its last stretch answers new
//! ones 503, and the listener closes once nothing is in flight after
//! deliveries stop coming, or the grace has passed.

pub mod auth;
pub mod delivery;
mod keys;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;
use serde_json::json;
use warp::http::StatusCode;
use warp::{Filter, Reply};

use self::auth::{Refusal, Verifier};
use self::delivery::Delivery;
use crate::body::Limits;
use crate::processor::Processor;

/// The path Event Grid delivers to.
pub const PATH: &str = "events";
/// The CloudEvents handshake's request header.
pub const REQUEST_ORIGIN: &str = "webhook-request-origin";
/// How long a readiness check waits for the guard and the store.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// How deliveries are authenticated (built by `config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhookAuth {
    /// Event Grid's Microsoft Entra ID token, required on every request.
    Entra(auth::EntraSettings),
    /// None: for a developer's machine only (`config` refuses it elsewhere).
    Off,
}

/// The webhook's settings (built by `config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookSettings {
    /// The port it listens on, on every interface (`WEBHOOK_PORT`).
    pub port: u16,
    pub auth: WebhookAuth,
}

/// The door: what every request shares.
pub struct Door {
    processor: Arc<Processor>,
    verifier: Option<Verifier>,
    limits: Limits,
    /// When the drain began, and its grace.
    drain: std::sync::OnceLock<(Instant, Duration)>,
    /// When the last delivery began, in ns since `origin`.
    last_delivery: AtomicU64,
    origin: Instant,
    in_flight: AtomicUsize,
    idle: tokio::sync::Notify,
}

/// One delivery in flight, counted until it is answered.
struct InFlight<'a>(&'a Door);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

fn answer(status: StatusCode, body: serde_json::Value) -> warp::reply::Response {
    warp::reply::with_status(warp::reply::json(&body), status).into_response()
}

/// A refusal: the detail to the log line (escaped: it may quote what the
/// caller sent), the body only `class`. A caller with a bad token learns
/// nothing of the configuration (tenant, audience, key endpoint).
fn refused(status: StatusCode, class: &str, why: &str) -> warp::reply::Response {
    log::warn!(
        "webhook request refused ({} {class}): {}",
        status.as_u16(),
        crate::text::escaped(why)
    );
    answer(status, json!({ "error": class }))
}

/// A refusal of a request already authenticated (or with the
/// authentication off): its detail is about the request itself, so the
/// caller gets it too (Event Grid's delivery log shows it).
fn refused_with_detail(status: StatusCode, why: &str) -> warp::reply::Response {
    log::warn!(
        "webhook delivery refused ({}): {}",
        status.as_u16(),
        crate::text::escaped(why)
    );
    answer(status, json!({ "error": why }))
}

/// The routes, each path with the methods it serves (its `Allow` header).
const ROUTES: [(&str, &str); 3] = [
    ("/events", "POST, OPTIONS"),
    ("/healthz", "GET"),
    ("/readyz", "GET"),
];

/// What a request no route took gets (pure): a path this webhook does not
/// serve is 404; a path it serves with another method is 405 with the
/// methods it takes (`Allow`); a served method on its path was refused
/// for its headers: 400.
fn misrouted(path: &str, method: &str) -> (StatusCode, Option<&'static str>) {
    let path = match path.strip_suffix('/') {
        Some(p) if !p.is_empty() => p,
        _ => path,
    };
    match ROUTES.iter().find(|(p, _)| *p == path) {
        None => (StatusCode::NOT_FOUND, None),
        Some((_, allow)) if allow.split(", ").any(|m| m == method) => {
            (StatusCode::BAD_REQUEST, None)
        }
        Some((_, allow)) => (StatusCode::METHOD_NOT_ALLOWED, Some(allow)),
    }
}

impl Door {
    pub fn new(processor: Arc<Processor>, verifier: Option<Verifier>, limits: Limits) -> Door {
        Door {
            processor,
            verifier,
            limits,
            drain: std::sync::OnceLock::new(),
            last_delivery: AtomicU64::new(0),
            origin: Instant::now(),
            in_flight: AtomicUsize::new(0),
            idle: tokio::sync::Notify::new(),
        }
    }

    /// Deliveries being processed now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// One `POST /events`.
    async fn deliver<S, B>(
        &self,
        authorization: Option<String>,
        event_type: Option<String>,
        length: Option<u64>,
        body: S,
    ) -> warp::reply::Response
    where
        S: Stream<Item = Result<B, warp::Error>> + Unpin,
        B: bytes::Buf,
    {
        // Counted before the drain is looked at: a drain that begins now
        // waits for this delivery, or this delivery sees the drain.
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let _counted = InFlight(self);
        self.last_delivery
            .store(self.origin.elapsed().as_nanos() as u64, Ordering::SeqCst);
        if !matches!(self.drain_step(), None | Some(DrainStep::Take(_))) {
            return refused(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting down",
                "this instance is shutting down; Event Grid delivers again",
            );
        }
        if let Some(verifier) = &self.verifier {
            if let Err(refusal) = verifier.check(authorization.as_deref()).await {
                let status = match refusal {
                    Refusal::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
                    Refusal::Forbidden(_) => StatusCode::FORBIDDEN,
                    Refusal::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
                };
                return refused(status, refusal.class(), refusal.detail());
            }
        }
        let bytes = match crate::body::read(body, length, self.limits).await {
            Ok(bytes) => bytes,
            Err(e) => return refused_with_detail(e.status(), &e.to_string()),
        };
        match delivery::read(event_type.as_deref(), &bytes) {
            Err(why) => refused_with_detail(StatusCode::BAD_REQUEST, &why),
            Ok(Delivery::Validation { code }) => {
                log::info!("Event Grid subscription validated (synchronous handshake)");
                answer(StatusCode::OK, json!({ "validationResponse": code }))
            }
            Ok(Delivery::Deletion) => {
                log::warn!("Event Grid says the subscription delivering here was deleted");
                answer(StatusCode::OK, json!({}))
            }
            Ok(Delivery::Events(events)) => {
                let result = self.processor.process_trigger(events).await;
                let status = delivery::status(&result);
                answer(status, json!({ "results": result.outcomes }))
            }
        }
    }

    /// `GET /readyz`: the guard and the store answer, and no drain.
    async fn ready(&self) -> Result<(), String> {
        if self.draining() {
            return Err("shutting down".into());
        }
        let probe = "readiness-probe";
        let guard = tokio::time::timeout(READY_TIMEOUT, self.processor.guard().inspect(probe));
        let store = tokio::time::timeout(READY_TIMEOUT, self.processor.store().identity());
        let (guard, store) = tokio::join!(guard, store);
        match guard {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(format!("the guard does not answer: {e}")),
            Err(_) => return Err("the guard does not answer in time".into()),
        }
        match store {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("the store does not answer: {e}")),
            Err(_) => Err("the store does not answer in time".into()),
        }
    }

    /// Whether a drain has begun (readiness fails from then on).
    fn draining(&self) -> bool {
        self.drain.get().is_some()
    }

    /// Where the drain is now, if one has begun.
    fn drain_step(&self) -> Option<DrainStep> {
        let &(began, grace) = self.drain.get()?;
        let now = self.origin.elapsed();
        let last = Duration::from_nanos(self.last_delivery.load(Ordering::SeqCst));
        let since_signal = began.elapsed();
        // Since the later of the signal and the last delivery's start.
        let since_last = since_signal.min(now.saturating_sub(last));
        Some(drain_step(
            since_signal,
            since_last,
            self.in_flight(),
            grace,
        ))
    }

    /// The drain ([`drain_step`]): readiness fails at once; deliveries are
    /// still taken for most of `grace` (until the ingress stops routing
    /// here); the last stretch answers new ones 503. Returns once none is
    /// in flight after deliveries stop coming, or once `grace` has passed.
    pub async fn drain(&self, grace: Duration) {
        let _ = self.drain.set((Instant::now(), grace));
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            let wait = match self.drain_step() {
                None | Some(DrainStep::Done) => break,
                Some(DrainStep::Take(d) | DrainStep::Refuse(d)) => d,
            };
            tokio::select! {
                () = idle => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
        match self.in_flight() {
            0 => log::info!("all deliveries drained"),
            n => log::warn!(
                "shutdown grace of {} s passed with {n} deliveries in flight",
                grace.as_secs()
            ),
        }
    }
}

/// Where a drain is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DrainStep {
    /// New deliveries are still taken; look again in this long at most.
    Take(Duration),
    /// New deliveries are answered 503; the drain ends once none is in
    /// flight, or in this long.
    Refuse(Duration),
    /// The drain is over.
    Done,
}

/// The last stretch of the grace, when new deliveries are refused: a
/// fifth of it, at most 5 s.
fn refusing_tail(grace: Duration) -> Duration {
    (grace / 5).min(Duration::from_secs(5))
}

/// The drain's step (pure): `since_signal` since it began, `since_last`
/// since the later of that and the last delivery's start, `in_flight`
/// deliveries being processed. Deliveries are taken until the refusing
/// tail ([`refusing_tail`]): Event Grid delays every delivery to an
/// endpoint that fails several times, so a drain that refused for the
/// whole grace would be a run of failures on every scale-in and revision.
/// Taking ends early once the door is quiet (none in flight, none begun
/// for a tail's length: the ingress has stopped routing here); the tail
/// ends once none is in flight; the grace ends it all.
fn drain_step(
    since_signal: Duration,
    since_last: Duration,
    in_flight: usize,
    grace: Duration,
) -> DrainStep {
    let tail = refusing_tail(grace);
    let taking_until = grace.saturating_sub(tail);
    if since_signal >= grace {
        return DrainStep::Done;
    }
    if since_signal < taking_until {
        if in_flight == 0 && since_last >= tail {
            return DrainStep::Done;
        }
        let phase_end = taking_until - since_signal;
        return DrainStep::Take(match tail.checked_sub(since_last) {
            Some(quiet_in) if !quiet_in.is_zero() => quiet_in.min(phase_end),
            _ => phase_end,
        });
    }
    if in_flight == 0 {
        return DrainStep::Done;
    }
    DrainStep::Refuse(grace - since_signal)
}

/// The webhook's routes.
pub fn routes(
    door: Arc<Door>,
) -> impl Filter<Extract = (warp::reply::Response,), Error = Infallible> + Clone {
    let with_door = warp::any().map(move || Arc::clone(&door));
    let deliver = warp::post()
        .and(warp::path(PATH))
        .and(warp::path::end())
        .and(with_door.clone())
        .and(warp::header::optional::<String>("authorization"))
        .and(warp::header::optional::<String>(
            delivery::EVENT_TYPE_HEADER,
        ))
        .and(warp::header::optional::<u64>("content-length"))
        .and(warp::body::stream())
        .then(
            |door: Arc<Door>, authorization, event_type, length, body| async move {
                door.deliver(authorization, event_type, length, Box::pin(body))
                    .await
            },
        );
    let handshake = warp::options()
        .and(warp::path(PATH))
        .and(warp::path::end())
        .and(warp::header::optional::<String>(REQUEST_ORIGIN))
        .map(|origin: Option<String>| match origin {
            Some(origin) => {
                let mut response = warp::reply::with_status("", StatusCode::OK).into_response();
                let headers = response.headers_mut();
                if let Ok(v) = origin.parse() {
                    headers.insert("WebHook-Allowed-Origin", v);
                }
                headers.insert("WebHook-Allowed-Rate", warp::http::HeaderValue::from_static("*"));
                headers.insert("Allow", warp::http::HeaderValue::from_static("POST, OPTIONS"));
                response
            }
            None => refused(
                StatusCode::BAD_REQUEST,
                "bad request",
                "an OPTIONS request without WebHook-Request-Origin: not the CloudEvents webhook handshake",
            ),
        });
    let alive = warp::get()
        .and(warp::path("healthz"))
        .and(warp::path::end())
        .and(with_door.clone())
        .map(|door: Arc<Door>| {
            answer(
                StatusCode::OK,
                json!({
                    "status": "alive",
                    "inFlight": door.in_flight(),
                    "draining": door.draining(),
                }),
            )
        });
    let ready = warp::get()
        .and(warp::path("readyz"))
        .and(warp::path::end())
        .and(with_door)
        .then(|door: Arc<Door>| async move {
            match door.ready().await {
                Ok(()) => answer(StatusCode::OK, json!({ "status": "ready" })),
                Err(why) => answer(
                    StatusCode::SERVICE_UNAVAILABLE,
                    json!({ "status": "not ready", "reason": why }),
                ),
            }
        });
    // Whatever no route took: by its path and method, never warp's
    // rejection (which names its internals, and says 405 for any path).
    let fallback = warp::method().and(warp::path::full()).map(
        |method: warp::http::Method, path: warp::path::FullPath| {
            let (status, allow) = misrouted(path.as_str(), method.as_str());
            let class = match status {
                StatusCode::NOT_FOUND => "not found",
                StatusCode::METHOD_NOT_ALLOWED => "method not allowed",
                _ => "bad request",
            };
            let mut response = refused(status, class, &format!("{method} {}", path.as_str()));
            if let Some(allow) = allow {
                response
                    .headers_mut()
                    .insert("Allow", warp::http::HeaderValue::from_static(allow));
            }
            response
        },
    );
    deliver
        .or(handshake)
        .unify()
        .or(alive)
        .unify()
        .or(ready)
        .unify()
        .or(fallback)
        .unify()
}

/// Bind `addr` and serve until `shutdown` resolves, then drain for at most
/// `grace`. Returns the bound address and the server future.
pub fn bind(
    door: Arc<Door>,
    addr: SocketAddr,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> anyhow::Result<(SocketAddr, impl Future<Output = ()>)> {
    let closed = tokio_util::sync::CancellationToken::new();
    let close = closed.clone();
    let closing = closed.clone();
    let drained = Arc::clone(&door);
    let drain = async move {
        shutdown.await;
        log::info!(
            "shutting down: not ready from now on; {} deliveries in flight, new ones taken for {} s more, then answered 503",
            drained.in_flight(),
            grace.saturating_sub(refusing_tail(grace)).as_secs()
        );
        drained.drain(grace).await;
        close.cancel();
    };
    let (bound, server) = warp::serve(routes(door))
        .try_bind_with_graceful_shutdown(addr, async move { closed.cancelled().await })
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    let run = async move {
        tokio::spawn(drain);
        // Past the grace a delivery still running is left unanswered (Event
        // Grid delivers it again): the listener is gone, the process ends.
        let overdue = async {
            closing.cancelled().await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        };
        tokio::select! {
            () = server => {}
            () = overdue => log::warn!("connections still open after the drain; closing them"),
        }
    };
    Ok((bound, run))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drain_takes_deliveries_until_its_last_stretch_and_ends_when_quiet() {
        let s = Duration::from_secs;
        let grace = s(25);
        assert_eq!(refusing_tail(grace), s(5));
        assert_eq!(refusing_tail(s(5)), s(1));
        // Just signalled, a delivery in flight: taking, for 5 s of quiet.
        assert_eq!(drain_step(s(0), s(0), 1, grace), DrainStep::Take(s(5)));
        // Deliveries keep coming: taken until the tail.
        assert_eq!(drain_step(s(18), s(1), 3, grace), DrainStep::Take(s(2)));
        assert_eq!(drain_step(s(12), s(9), 1, grace), DrainStep::Take(s(8)));
        // Quiet: none in flight, none begun for a tail's length.
        assert_eq!(drain_step(s(5), s(5), 0, grace), DrainStep::Done);
        assert_eq!(drain_step(s(3), s(1), 0, grace), DrainStep::Take(s(4)));
        // The tail: new ones refused, over once none is in flight.
        assert_eq!(drain_step(s(21), s(0), 2, grace), DrainStep::Refuse(s(4)));
        assert_eq!(drain_step(s(21), s(0), 0, grace), DrainStep::Done);
        assert_eq!(drain_step(s(25), s(0), 2, grace), DrainStep::Done);
    }

    #[test]
    fn a_request_no_route_took_is_404_by_path_and_405_by_method() {
        assert_eq!(misrouted("/", "GET"), (StatusCode::NOT_FOUND, None));
        assert_eq!(misrouted("/nope", "POST"), (StatusCode::NOT_FOUND, None));
        assert_eq!(
            misrouted("/events/x", "POST"),
            (StatusCode::NOT_FOUND, None)
        );
        assert_eq!(
            misrouted("/events", "GET"),
            (StatusCode::METHOD_NOT_ALLOWED, Some("POST, OPTIONS"))
        );
        assert_eq!(
            misrouted("/healthz", "POST"),
            (StatusCode::METHOD_NOT_ALLOWED, Some("GET"))
        );
        assert_eq!(
            misrouted("/readyz/", "DELETE"),
            (StatusCode::METHOD_NOT_ALLOWED, Some("GET"))
        );
        assert_eq!(
            misrouted("/events", "POST"),
            (StatusCode::BAD_REQUEST, None),
            "a served method on its path was refused for its headers"
        );
    }
}
