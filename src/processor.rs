//! The processor: the steps of one order and the outcome table.
//!
//! ```text
//! 0. finished.recall(id)  — this instance's cache of finished orders (if on)
//! 1. guard.acquire(id)    — Redis SET NX EX (owner token)
//! 2. store.execute(order) — one call: INSERT under the unique index, the
//!                           forward-only transition and the position effect
//! 3. guard.complete(id)   — COMPLETADA, long TTL
//! ```
//!
//! It depends only on the two traits and on `event`/`order`; it knows no wire
//! format. Every event ends in exactly one [`OutcomeKind`], and every event
//! that is not executed is accounted for: counted (duplicate), stored with its
//! reason (conflict, rejected) or handed back for a retry (in progress, retry).

use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use fail::fail_point;
use serde_json::Value;

use crate::decision::{
    completed_verdict, held_elsewhere_verdict, recollection, CompletedVerdict, Decision,
    HeldElsewhere, Recollection, Reply, Step, Why,
};
pub use crate::decision::{completion_marker, GuardPolicy, OutcomeKind};
use crate::event::{check_type, normalize, parse_envelope, Delivery};
use crate::faults;
use crate::finished::{FinishedCacheSettings, FinishedOrders};
use crate::guard::{Acquisition, IdempotencyGuard, Token};
use crate::order::{probable_order_id, FractionalNumbers, Order};
use crate::outbox::Announcer;
use crate::store::{conflict_reason, Execution, OrderStore, Rejection, RejectionKind, StoreError};
use crate::telemetry::{EventTelemetry, StepTiming};
use crate::text::{escaped, shown, Quoted};

mod outcome;
mod report;

pub use self::outcome::{Counters, CountersSnapshot, Outcome, TriggerResult};
use report::STORE;

/// Processor settings.
#[derive(Debug, Clone)]
pub struct ProcessorSettings {
    pub on_guard_unavailable: GuardPolicy,
    /// Internal deadline per event, well inside Event Grid's 30 s.
    pub deadline: Duration,
    /// The event types that carry orders (`None`: every type). An event of
    /// another type is rejected with its reason, never executed.
    pub event_types: Option<Vec<String>>,
    /// How amounts sent as fractional JSON numbers are read.
    pub fractional_numbers: FractionalNumbers,
    /// This instance's cache of finished orders (`max_bytes` 0: none).
    pub finished_cache: FinishedCacheSettings,
}

impl Default for ProcessorSettings {
    fn default() -> Self {
        ProcessorSettings {
            on_guard_unavailable: GuardPolicy::Proceed,
            deadline: Duration::from_secs(20),
            event_types: None,
            fractional_numbers: FractionalNumbers::default(),
            finished_cache: FinishedCacheSettings::default(),
        }
    }
}

/// Executes orders exactly once in effect.
pub struct Processor {
    guard: Arc<dyn IdempotencyGuard>,
    store: Arc<dyn OrderStore>,
    settings: ProcessorSettings,
    counters: Counters,
    /// The store's identity, read at first use (see [`completion_marker`]).
    store_id: tokio::sync::OnceCell<String>,
    /// Orders this instance saw finish (`None`: cache off).
    finished: Option<FinishedOrders>,
    /// Where each event is reported (`None`: telemetry off, nothing timed).
    telemetry: Option<Arc<EventTelemetry>>,
    /// Store failures no retry can fix (`StoreError::needs_operator`):
    /// how many so far, and the last one.
    operator_needed: std::sync::Mutex<(u64, Option<String>)>,
    /// Wakes the outbox's dispatcher after an execution (`None`: nothing
    /// is dispatched by this process).
    announcer: Option<Announcer>,
}

/// An order and the event it came in, ready for the four steps.
struct Work<'a> {
    order: Order,
    event_id: &'a str,
    raw: &'a Value,
    /// When this event's answer is due: one bound for every step of it.
    deadline: Instant,
}

impl Processor {
    pub fn new(
        guard: Arc<dyn IdempotencyGuard>,
        store: Arc<dyn OrderStore>,
        settings: ProcessorSettings,
    ) -> Processor {
        Processor {
            guard,
            store,
            finished: FinishedOrders::new(settings.finished_cache),
            settings,
            counters: Counters::default(),
            store_id: tokio::sync::OnceCell::new(),
            telemetry: None,
            operator_needed: std::sync::Mutex::new((0, None)),
            announcer: None,
        }
    }

    /// Wake `announcer` after each execution, so its announcement is sent
    /// right after the commit (the reply never waits for it).
    pub fn with_announcer(mut self, announcer: Option<Announcer>) -> Processor {
        self.announcer = announcer;
        self
    }

    /// The last store failure this processor met that no retry can fix
    /// (a right or the schema missing: `StoreError::needs_operator`), with
    /// the fix; `None` while there was none. Its events were answered
    /// `retry` like any store failure (nothing is lost); a command that
    /// retries by itself (`replay`, the dead-letter sweep) stops on it.
    pub fn operator_needed(&self) -> Option<String> {
        self.operator_needed_since(0)
    }

    /// How many failures no retry can fix this processor met so far: a
    /// task of a long-running `serve` (a sweep) takes the count as it
    /// starts and asks [`Self::operator_needed_since`] it, so one met
    /// before it (and fixed since) does not stop it and a new one does.
    pub fn operator_needed_count(&self) -> u64 {
        self.operator_needed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
    }

    /// The last failure no retry can fix, if any came after the first
    /// `count` ([`Self::operator_needed_count`]).
    pub fn operator_needed_since(&self, count: u64) -> Option<String> {
        let state = self
            .operator_needed
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        (state.0 > count).then(|| state.1.clone()).flatten()
    }

    /// Report every event to `telemetry` (metrics and spans).
    pub fn with_telemetry(mut self, telemetry: Option<Arc<EventTelemetry>>) -> Processor {
        self.telemetry = telemetry;
        self
    }

    /// Whether events are reported to telemetry (what is read only for it,
    /// such as the host's invocation id, is skipped when not).
    pub fn reports_telemetry(&self) -> bool {
        self.telemetry.is_some()
    }

    pub fn counters(&self) -> CountersSnapshot {
        self.counters.snapshot()
    }

    pub fn guard(&self) -> &dyn IdempotencyGuard {
        self.guard.as_ref()
    }

    pub fn store(&self) -> &dyn OrderStore {
        self.store.as_ref()
    }

    /// Process a trigger value (`Data.eventGridEvent`): one event or a batch.
    /// A batch's events run concurrently; the caller answers it all-or-none.
    pub async fn process_trigger(&self, trigger: Value) -> TriggerResult {
        // The usual trigger is one event object: no copy, no decoding. Only
        // the other forms go through `normalize`, which needs its own copy
        // because a poison trigger is stored as it arrived.
        if trigger.is_object() {
            let outcome = self.process_event(&trigger).await;
            return TriggerResult {
                batch: false,
                outcomes: vec![outcome],
            };
        }
        let (batch, outcomes) = match normalize(trigger.clone()) {
            Ok(Delivery::Single(event)) => (false, vec![self.process_event(&event).await]),
            Ok(Delivery::Batch(events)) if events.is_empty() => {
                let reason = "the event batch is empty".to_string();
                let due = self.due();
                (
                    true,
                    vec![self.poison(&trigger, None, None, reason, due).await],
                )
            }
            Ok(Delivery::Batch(events)) => {
                // At the store's parallelism, in order: a batch of
                // thousands is one delivery, answered once.
                // (The futures made first: a stream over a borrowing
                // closure is not `Send` for every lifetime, as warp needs.)
                use futures::StreamExt;
                let all: Vec<_> = events.iter().map(|e| self.process_event(e)).collect();
                let outcomes = futures::stream::iter(all)
                    .buffered(self.store.parallelism().max(1))
                    .collect()
                    .await;
                (true, outcomes)
            }
            Err(e) => {
                let due = self.due();
                (
                    false,
                    vec![self.poison(&trigger, None, None, e.0, due).await],
                )
            }
        };
        TriggerResult { batch, outcomes }
    }

    /// Process one event (an envelope object).
    pub async fn process_event(&self, event: &Value) -> Outcome {
        let deadline = self.due();
        let envelope = match parse_envelope(event) {
            Ok(env) => env,
            Err(e) => {
                let id = event.get("data").and_then(probable_order_id);
                let eid = event.get("id").and_then(Value::as_str).map(str::to_string);
                return self.poison(event, id, eid, e.0, deadline).await;
            }
        };
        if let Err(e) = check_type(&envelope.event_type, self.settings.event_types.as_deref()) {
            let id = probable_order_id(&envelope.data);
            return self
                .poison(event, id, Some(envelope.event_id.clone()), e.0, deadline)
                .await;
        }
        let order = match Order::from_data_with(&envelope.data, self.settings.fractional_numbers) {
            Ok(o) => o,
            Err(e) => {
                let id = probable_order_id(&envelope.data);
                return self
                    .poison(
                        event,
                        id,
                        Some(envelope.event_id.clone()),
                        format!("invalid order: {e}"),
                        deadline,
                    )
                    .await;
            }
        };
        let work = Work {
            order,
            event_id: &envelope.event_id,
            raw: event,
            deadline,
        };
        let started = Instant::now();
        let mut facts = Facts::new(self.guard.name(), self.telemetry.is_some(), started);
        let outcome = self.process_order(&work, &mut facts).await;
        self.counters.count(outcome.outcome);
        self.report_order(&work.order.order_id, &outcome, &facts);
        let level = match outcome.outcome {
            OutcomeKind::Executed | OutcomeKind::Duplicate => log::Level::Info,
            OutcomeKind::InProgress | OutcomeKind::Conflict | OutcomeKind::Rejected => {
                log::Level::Warn
            }
            OutcomeKind::Retry => log::Level::Error,
        };
        // `log!` formats only when the level is enabled: the hot duplicate
        // path builds no line at RUST_LOG=warn.
        // The human form, then the same fields as a stable `key=value` tail
        // for log queries (values quoted and escaped as Rust strings: one
        // line whatever they hold).
        let ms = started.elapsed().as_secs_f64() * 1e3;
        log::log!(
            level,
            "order {} event {}: {} (guard={}, {:.1} ms){}{} | order_id={} event_id={} outcome={} guard={} ms={:.1}{}",
            escaped(&work.order.order_id),
            escaped(outcome.event_id.as_deref().unwrap_or("?")),
            outcome.outcome.as_str(),
            outcome.guard,
            ms,
            if outcome.reason.is_some() { ": " } else { "" },
            escaped(outcome.reason.as_deref().unwrap_or("")),
            Quoted(&work.order.order_id),
            Quoted(outcome.event_id.as_deref().unwrap_or("")),
            outcome.outcome.as_str(),
            outcome.guard,
            ms,
            ReasonField(outcome.reason.as_deref()),
        );
        outcome
    }

    /// The steps, as [`Decision`] orders them: this function only performs
    /// each step and hands its answer back.
    async fn process_order(&self, w: &Work<'_>, facts: &mut Facts) -> Outcome {
        let (mut decision, mut step) =
            Decision::start(self.settings.on_guard_unavailable, self.finished.is_some());
        loop {
            let began = facts.arrived.map(|arrived| (Instant::now(), arrived));
            let reply = match step {
                Step::Answer(kind, why) => {
                    if let Some(finished) = &self.finished {
                        if kind.proves_finished() && facts.guard_label != RECALLED {
                            finished.remember(&w.order.order_id, w.order.fingerprint());
                        }
                    }
                    return self.answer(w, kind, why, facts);
                }
                Step::Recall => self.recall(w, facts),
                Step::Acquire => self.acquire(w, facts).await,
                Step::ReadRow => self.read_row(w, facts).await,
                Step::Execute => self.execute(w, facts).await,
                Step::StoreConflict => self.store_conflict(w, facts).await,
                Step::MarkCompleted => {
                    if tokio::time::timeout_at(w.deadline, self.mark_completed(w))
                        .await
                        .is_err()
                    {
                        log::warn!(
                            "order {}: done, but the guard was not marked {} by the internal deadline",
                            escaped(&w.order.order_id),
                            crate::guard::COMPLETED
                        );
                    }
                    Reply::Done
                }
                Step::Release => {
                    self.release(&w.order, facts.token.take().as_ref()).await;
                    Reply::Done
                }
            };
            if let Some((began, arrived)) = began {
                facts.steps.push(self.timing(step, began, arrived));
            }
            (decision, step) = decision.next(&reply);
        }
    }

    /// Step 0: what this instance remembers of the order (no I/O).
    fn recall(&self, w: &Work<'_>, facts: &mut Facts) -> Reply {
        let cached = self
            .finished
            .as_ref()
            .and_then(|f| f.recall(&w.order.order_id));
        let verdict = recollection(cached.as_deref(), w.order.fingerprint());
        match &verdict {
            Recollection::Unknown => {}
            Recollection::Finished => facts.guard_label = RECALLED,
            Recollection::FinishedOther(fp) => {
                facts.guard_label = RECALLED;
                facts.existing = Some(fp.clone());
            }
        }
        if facts.guard_label == RECALLED {
            self.counters.cache_hits.fetch_add(1, Ordering::Relaxed);
            facts.decided_by = RECALLED;
        } else if self.finished.is_some() {
            // With the hits, the cache's hit ratio (telemetry, /stats).
            self.counters.cache_misses.fetch_add(1, Ordering::Relaxed);
        }
        Reply::Recalled(verdict)
    }

    /// Step 1: reserve the id (bounded by the event's deadline).
    async fn acquire(&self, w: &Work<'_>, facts: &mut Facts) -> Reply {
        let order = &w.order;
        let acquired = tokio::time::timeout_at(w.deadline, self.guard.acquire(&order.order_id))
            .await
            .unwrap_or_else(|_| Acquisition::Unavailable("internal deadline passed".into()));
        match acquired {
            Acquisition::Acquired(t) => {
                facts.token = Some(t);
                Reply::Acquired { taken_over: false }
            }
            Acquisition::TakenOver(t) => {
                self.counters.takeovers.fetch_add(1, Ordering::Relaxed);
                if let Some(t) = &self.telemetry {
                    t.takeover();
                }
                log::warn!(
                    "order {}: took over a reservation whose owner passed its deadline (a worker killed or stuck); the store decides what is left to do",
                    escaped(&order.order_id)
                );
                facts.token = Some(t);
                Reply::Acquired { taken_over: true }
            }
            Acquisition::Completed { fingerprint } => {
                facts.decided_by = self.guard.name();
                let ours = self.store_identity(w.deadline).await;
                let verdict = completed_verdict(fingerprint.as_deref(), ours, order.fingerprint());
                if let CompletedVerdict::Conflict(fp) = &verdict {
                    facts.existing = Some(fp.clone());
                }
                Reply::Completed(verdict)
            }
            Acquisition::InProgress => {
                facts.decided_by = self.guard.name();
                Reply::Held
            }
            Acquisition::Unavailable(why) => {
                self.counters
                    .guard_unavailable
                    .fetch_add(1, Ordering::Relaxed);
                facts.guard_label = "unavailable";
                if let Some(t) = &self.telemetry {
                    t.guard_unavailable(match self.settings.on_guard_unavailable {
                        GuardPolicy::Proceed => "proceed",
                        GuardPolicy::Retry => "retry",
                    });
                }
                if self.settings.on_guard_unavailable == GuardPolicy::Proceed {
                    log::warn!(
                        "order {}: guard unavailable ({why}); proceeding on the store's unique index",
                        escaped(&order.order_id)
                    );
                }
                facts.failure = Some(format!("guard unavailable ({why})"));
                Reply::GuardUnavailable
            }
        }
    }

    /// Another reservation holds the order; its owner may be dead with the
    /// order already done (killed after the commit, or its `COMPLETADA` lost
    /// in a Redis outage): read the row. An unreadable row is no evidence.
    async fn read_row(&self, w: &Work<'_>, facts: &mut Facts) -> Reply {
        let row = tokio::time::timeout_at(w.deadline, self.store.order(&w.order.order_id)).await;
        let row = match row {
            Ok(Ok(row)) => row,
            Ok(Err(e)) => {
                self.store_error("read_row", &e);
                None
            }
            Err(_) => None,
        };
        if row.is_some() {
            facts.decided_by = STORE;
        }
        // The row's fingerprint in the current version: a row stored under
        // an older normalization is fingerprinted again from its columns.
        let current = row.as_ref().map(|r| (r.current_fingerprint(), r.status));
        let verdict = held_elsewhere_verdict(
            current.as_ref().map(|(fp, status)| (fp.as_ref(), *status)),
            w.order.fingerprint(),
        );
        if let HeldElsewhere::Conflict(fp) = &verdict {
            facts.existing = Some(fp.clone());
        }
        Reply::Row(verdict)
    }

    /// Step 2: the store's one call: the order inserted (or its row found)
    /// and executed once, or a conflict stored.
    async fn execute(&self, w: &Work<'_>, facts: &mut Facts) -> Reply {
        let executed = self
            .by_deadline(w, async {
                fail_point!(faults::AFTER_GUARD_ACQUIRE, |arg| Err(fault(
                    faults::AFTER_GUARD_ACQUIRE,
                    arg
                )));
                let raw = w.raw.to_string();
                let execution = self.store.execute(&w.order, w.event_id, &raw).await?;
                // The store committed: a fault here is a commit whose answer was lost.
                fail_point!(faults::BEFORE_COMPLETE, |arg| Err(fault(
                    faults::BEFORE_COMPLETE,
                    arg
                )));
                Ok(execution)
            })
            .await;
        facts.decided_by = STORE;
        match executed {
            Ok(execution) => {
                match &execution {
                    Execution::Rejected(overflow) => {
                        facts.failure = Some(overflow.reason(&w.order.account_id, &w.order.symbol));
                    }
                    Execution::Conflict {
                        existing_fingerprint,
                    } => facts.existing = Some(existing_fingerprint.clone()),
                    Execution::Executed => {
                        if let Some(a) = &self.announcer {
                            a.executed();
                        }
                    }
                    Execution::AlreadyDone => {}
                }
                Reply::Executed(execution)
            }
            Err(e) => {
                self.store_error("execute", &e);
                facts.failure = Some(e.to_string());
                Reply::Failed
            }
        }
    }

    /// A different order uses this id: store this event with both fingerprints.
    async fn store_conflict(&self, w: &Work<'_>, facts: &mut Facts) -> Reply {
        let existing = facts.existing.clone().unwrap_or_default();
        let rejection = Rejection::conflict(&w.order, w.event_id, &w.raw.to_string(), &existing);
        match self.reject_by(&rejection, w.deadline).await {
            Ok(()) => Reply::Stored,
            Err(e) => {
                self.store_error("reject", &e);
                facts.failure = Some(e.to_string());
                Reply::Failed
            }
        }
    }

    /// A store step bounded by the event's deadline: past it, the step
    /// failed (its effect may still land; the store keeps that harmless).
    async fn by_deadline<T>(
        &self,
        w: &Work<'_>,
        step: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout_at(w.deadline, step).await {
            Ok(done) => done,
            Err(_) => Err(StoreError::Transient(self.deadline_passed())),
        }
    }

    fn deadline_passed(&self) -> String {
        format!(
            "internal deadline of {} ms passed; Event Grid will retry",
            self.settings.deadline.as_millis()
        )
    }

    /// The event's answer, with the reason its [`Why`] calls for.
    fn answer(&self, w: &Work<'_>, kind: OutcomeKind, why: Why, facts: &Facts) -> Outcome {
        let failure = facts.failure.as_deref().unwrap_or("unknown failure");
        let reason = match why {
            Why::Done => None,
            Why::GuardUnavailable => Some(format!("{failure} and GUARD_UNAVAILABLE=retry")),
            Why::HeldElsewhere => Some("another worker holds this order; retry later".into()),
            Why::StoreFailed => Some(failure.to_string()),
            Why::Conflict => Some(conflict_reason(
                &w.order,
                facts.existing.as_deref().unwrap_or(""),
            )),
            Why::ConflictNotStored => Some(format!("conflict not stored ({failure}); will retry")),
            Why::Refused => Some(failure.to_string()),
        };
        self.outcome(w, kind, reason, facts.guard_label)
    }

    /// `COMPLETADA` with this store's completion marker. Skipped (logged)
    /// when the store's identity cannot be read: an unbound marker would
    /// answer another database's orders.
    async fn mark_completed(&self, w: &Work<'_>) {
        let order = &w.order;
        let Some(store_id) = self.store_identity(w.deadline).await else {
            log::warn!(
                "order {}: done, but the guard was not marked {}: the store's identity could not be read",
                escaped(&order.order_id),
                crate::guard::COMPLETED
            );
            return;
        };
        let marker = completion_marker(store_id, order.fingerprint());
        if let Err(e) = self.guard.complete(&order.order_id, &marker).await {
            self.counters.guard_errors.fetch_add(1, Ordering::Relaxed);
            if let Some(t) = &self.telemetry {
                t.guard_error("complete");
            }
            log::warn!(
                "order {}: done, but the guard was not marked {}: {e}",
                escaped(&order.order_id),
                crate::guard::COMPLETED
            );
        }
    }

    /// The store's identity, read once (bounded by `deadline`); `None` while
    /// it cannot be read.
    async fn store_identity(&self, deadline: Instant) -> Option<&str> {
        let read = async {
            self.store_id
                .get_or_try_init(|| self.store.identity())
                .await
        };
        match tokio::time::timeout_at(deadline, read).await {
            Ok(Ok(id)) => Some(id.as_str()),
            Ok(Err(_)) | Err(_) => None,
        }
    }

    /// Store a poison event with its reason. If even that fails, answer
    /// `retry`: the event must not be lost.
    async fn poison(
        &self,
        raw: &Value,
        order_id: Option<String>,
        event_id: Option<String>,
        reason: String,
        deadline: Instant,
    ) -> Outcome {
        let arrived = self
            .telemetry
            .as_ref()
            .map(|_| (SystemTime::now(), Instant::now()));
        let rejection = Rejection {
            kind: RejectionKind::Poison,
            order_id: order_id.clone(),
            event_id: event_id.clone(),
            reason: reason.clone(),
            fingerprint: None,
            existing_fingerprint: None,
            raw_event: raw.to_string(),
        };
        let (kind, reason) = match self.reject_by(&rejection, deadline).await {
            Ok(()) => (OutcomeKind::Rejected, reason),
            Err(e) => {
                self.store_error("reject", &e);
                (
                    OutcomeKind::Retry,
                    format!("{reason}; and the rejection could not be stored ({e})"),
                )
            }
        };
        if let Some(arrived) = arrived {
            self.report_poison(order_id.as_deref(), event_id.as_deref(), kind, arrived);
        }
        // Stored whole above; answered and logged bounded.
        let event_id = event_id.as_deref().map(shown);
        self.counters.count(kind);
        log::warn!(
            "event {} (order {}): {}: {}",
            event_id.as_deref().map_or(Cow::Borrowed("?"), escaped),
            order_id.as_deref().map_or(Cow::Borrowed("?"), escaped),
            kind.as_str(),
            escaped(&reason)
        );
        Outcome {
            order_id,
            event_id,
            outcome: kind,
            reason: Some(reason),
            guard: self.guard.name(),
        }
    }

    /// When an event arriving now must be answered.
    fn due(&self) -> Instant {
        Instant::now() + self.settings.deadline
    }

    /// Store a rejection by the event's deadline: a locked or hung store must
    /// yield `retry`, not an invocation stuck past Event Grid's 30 s (store
    /// calls queue behind each other, so one busy timeout each can add up to
    /// much more than the deadline).
    async fn reject_by(&self, rejection: &Rejection, deadline: Instant) -> Result<(), StoreError> {
        match tokio::time::timeout_at(deadline, self.store.reject(rejection)).await {
            Ok(stored) => stored,
            Err(_) => Err(StoreError::Transient(format!(
                "internal deadline of {} ms passed; Event Grid will retry",
                self.settings.deadline.as_millis()
            ))),
        }
    }

    /// Compare-and-delete our reservation so a retry need not wait for the TTL.
    async fn release(&self, order: &Order, token: Option<&Token>) {
        let Some(token) = token else { return };
        let released: Result<bool, String> = async {
            fail_point!(faults::IN_RELEASE, |arg| Err(faults::crash_or_error(
                faults::IN_RELEASE,
                arg
            )));
            self.guard
                .release(&order.order_id, token)
                .await
                .map_err(|e| e.to_string())
        }
        .await;
        if let Err(e) = released {
            self.counters.guard_errors.fetch_add(1, Ordering::Relaxed);
            if let Some(t) = &self.telemetry {
                t.guard_error("release");
            }
            log::warn!(
                "order {}: reservation not released ({e}); it expires by its TTL",
                escaped(&order.order_id)
            );
        }
    }

    fn outcome(
        &self,
        w: &Work<'_>,
        kind: OutcomeKind,
        reason: Option<String>,
        guard: &'static str,
    ) -> Outcome {
        Outcome {
            order_id: Some(w.order.order_id.clone()),
            event_id: Some(shown(w.event_id)),
            outcome: kind,
            reason,
            guard,
        }
    }
}

/// What one event's steps learned that its later steps and its answer need.
struct Facts {
    /// When the event's steps began, by the wall clock (for its span) and
    /// by the monotonic one (only while telemetry is on).
    arrived: Option<(SystemTime, Instant)>,
    /// Who decided the answer (see `EventReport::decided_by`).
    decided_by: &'static str,
    /// The steps, timed (only while telemetry is on).
    steps: Vec<StepTiming>,
    /// Our reservation, while we hold one.
    token: Option<Token>,
    /// The fingerprint of the other order using this id.
    existing: Option<String>,
    /// Why the guard or the last store step failed.
    failure: Option<String>,
    /// Which guard decided: `redis`, `memory`, `unavailable` or [`RECALLED`].
    guard_label: &'static str,
}

/// ` reason="…"` in a log line's `key=value` tail (nothing without a reason).
struct ReasonField<'a>(Option<&'a str>);

impl std::fmt::Display for ReasonField<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(reason) => write!(f, " reason={}", Quoted(reason)),
            None => Ok(()),
        }
    }
}

/// The `guard` of an answer decided by this instance's cache of finished orders.
pub const RECALLED: &str = "cache";

/// A fault point's error, as the store step it stands in for would fail.
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
fn fault(point: &str, arg: Option<String>) -> StoreError {
    StoreError::Transient(faults::crash_or_error(point, arg))
}
