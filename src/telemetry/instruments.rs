//! The instruments, their names and attributes (the README's metric table),
//! and the span of one event.
//!
//! Names follow OpenTelemetry's semantic conventions where one exists:
//! `messaging.process.duration` for the whole event (Event Grid is
//! `messaging.system = eventgrid`), `db.client.connection.count` for the
//! SQL Server pool, `db.system.name` / `db.operation.name` on the steps that
//! call Redis or a database, `faas.invocation_id` for the host's invocation
//! id. The rest is ours, under `order_guard.` (no convention counts a
//! cache's lookups or a pool's logins in flight).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use opentelemetry::metrics::{BoundCounter, BoundHistogram, Counter, Histogram, Meter};
use opentelemetry::trace::{Span, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::Tracer;

/// The function whose events these are (`messaging.destination.name`).
const DESTINATION: &str = "OrderTrigger";
/// The event's span name, as the conventions make it:
/// `{messaging.operation.name} {messaging.destination.name}`.
const SPAN_NAME: &str = "process OrderTrigger";

/// `messaging.system` of every event (semantic conventions' value for Event Grid).
fn system() -> KeyValue {
    KeyValue::new("messaging.system", "eventgrid")
}

/// Bucket bounds in seconds: from a cached duplicate (tens of µs) to an
/// event at Event Grid's 30 s limit.
const SECONDS: [f64; 19] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 10.0, 30.0,
];

/// One step of an event, timed (recorded only while telemetry is on).
#[derive(Debug, Clone)]
pub struct StepTiming {
    /// `recall`, `acquire`, `read_row`, `execute`, `store_conflict`,
    /// `complete`, `release`, `reject`.
    pub step: &'static str,
    /// What the step called: the guard's or the store's name (`redis`,
    /// `memory`, `sqlite`, `sqlserver`), `cache` for the recall.
    pub component: &'static str,
    pub started: SystemTime,
    pub elapsed: Duration,
}

/// One event's end, as the processor saw it. No amounts: the order's
/// content never reaches telemetry, only its id.
#[derive(Debug)]
pub struct EventReport<'a> {
    pub order_id: Option<&'a str>,
    pub event_id: Option<&'a str>,
    /// The answer (`executed`, `duplicate`, `in_progress`, `conflict`,
    /// `rejected`, `retry`).
    pub outcome: &'static str,
    /// The answer's `guard` field, as on the log line.
    pub guard: &'static str,
    /// Who decided the answer: `cache`, the guard (`redis`, `memory`), the
    /// `store`, or `none` (the event itself: poison, or the guard down
    /// under `GUARD_UNAVAILABLE=retry`).
    pub decided_by: &'static str,
    pub started: SystemTime,
    pub elapsed: Duration,
    pub steps: &'a [StepTiming],
}

/// The values the per-event attributes take, in their bound handles'
/// order (a value not listed is recorded unbound, never lost; the
/// processor's tests check that it reports none).
pub(crate) const OUTCOMES: [&str; 6] = [
    "executed",
    "duplicate",
    "in_progress",
    "conflict",
    "rejected",
    "retry",
];
pub(crate) const DECIDERS: [&str; 5] = ["cache", "redis", "memory", "store", "none"];
pub(crate) const STEPS: [&str; 8] = [
    "recall",
    "acquire",
    "read_row",
    "execute",
    "store_conflict",
    "complete",
    "release",
    "reject",
];
pub(crate) const COMPONENTS: [&str; 5] = ["cache", "redis", "memory", "sqlite", "sqlserver"];

/// The place of `(a, b)` in a table of `a_values` × `b_values`.
fn place(a_values: &[&str], a: &str, b_values: &[&str], b: &str) -> Option<usize> {
    let a = a_values.iter().position(|v| *v == a)?;
    let b = b_values.iter().position(|v| *v == b)?;
    Some(a * b_values.len() + b)
}

/// An instrument's handles bound to each attribute set an event can have,
/// each bound at its set's first use. A bound handle records without
/// hashing and looking up its attributes under the SDK's lock: that lookup
/// was most of what metrics cost a cache-hit duplicate (docs/benchmarks.md).
/// Bound lazily, so no series is exported before an event had it.
struct Bound<H> {
    slots: Box<[OnceLock<H>]>,
}

impl<H> Bound<H> {
    fn new(len: usize) -> Bound<H> {
        Bound {
            slots: (0..len).map(|_| OnceLock::new()).collect(),
        }
    }

    /// The handle at `place`, bound by `bind` the first time.
    fn get(&self, place: usize, bind: impl FnOnce() -> H) -> &H {
        self.slots[place].get_or_init(bind)
    }
}

/// What the processor reports each event to.
pub struct EventTelemetry {
    tracer: Tracer,
    events: Counter<u64>,
    /// `events` by outcome × who decided.
    events_bound: Bound<BoundCounter<u64>>,
    duration: Histogram<f64>,
    /// `duration` by outcome.
    duration_bound: Bound<BoundHistogram<f64>>,
    steps: Histogram<f64>,
    /// `steps` by step × component.
    steps_bound: Bound<BoundHistogram<f64>>,
    takeovers: Counter<u64>,
    guard_unavailable: Counter<u64>,
    guard_errors: Counter<u64>,
    store_errors: Counter<u64>,
}

impl EventTelemetry {
    pub(super) fn new(meter: Meter, tracer: Tracer) -> EventTelemetry {
        EventTelemetry {
            tracer,
            events: meter
                .u64_counter("order_guard.events")
                .with_unit("{event}")
                .with_description("Events answered, by outcome and by who decided")
                .build(),
            events_bound: Bound::new(OUTCOMES.len() * DECIDERS.len()),
            duration_bound: Bound::new(OUTCOMES.len()),
            steps_bound: Bound::new(STEPS.len() * COMPONENTS.len()),
            duration: meter
                .f64_histogram("messaging.process.duration")
                .with_unit("s")
                .with_description("Duration of one event, from its arrival to its answer")
                .with_boundaries(SECONDS.to_vec())
                .build(),
            steps: meter
                .f64_histogram("order_guard.step.duration")
                .with_unit("s")
                .with_description("Duration of one step of an event (recall, acquire, the store call, complete, …)")
                .with_boundaries(SECONDS.to_vec())
                .build(),
            takeovers: meter
                .u64_counter("order_guard.guard.takeovers")
                .with_unit("{reservation}")
                .with_description("Reservations taken over from an owner past its deadline")
                .build(),
            guard_unavailable: meter
                .u64_counter("order_guard.guard.unavailable")
                .with_unit("{event}")
                .with_description("Acquires that found the guard unreachable (degraded decisions), by GUARD_UNAVAILABLE policy")
                .build(),
            guard_errors: meter
                .u64_counter("order_guard.guard.errors")
                .with_unit("{call}")
                .with_description("Guard calls after the store's answer that failed (complete, release)")
                .build(),
            store_errors: meter
                .u64_counter("order_guard.store.errors")
                .with_unit("{call}")
                .with_description("Store calls that failed, by operation and kind")
                .build(),
        }
    }

    /// One event answered: its counter, its histograms, its span.
    pub fn event(&self, report: &EventReport<'_>) {
        let event_attributes = || {
            [
                system(),
                KeyValue::new("order_guard.outcome", report.outcome),
                KeyValue::new("order_guard.decided_by", report.decided_by),
            ]
        };
        match place(&OUTCOMES, report.outcome, &DECIDERS, report.decided_by) {
            Some(p) => self
                .events_bound
                .get(p, || self.events.bind(&event_attributes()))
                .add(1),
            None => self.events.add(1, &event_attributes()),
        }
        let seconds = report.elapsed.as_secs_f64();
        let duration_attributes = || {
            [
                system(),
                KeyValue::new("messaging.operation.name", "process"),
                KeyValue::new("messaging.destination.name", DESTINATION),
                KeyValue::new("order_guard.outcome", report.outcome),
            ]
        };
        match OUTCOMES.iter().position(|o| *o == report.outcome) {
            Some(p) => self
                .duration_bound
                .get(p, || self.duration.bind(&duration_attributes()))
                .record(seconds),
            None => self.duration.record(seconds, &duration_attributes()),
        }
        for step in report.steps {
            let seconds = step.elapsed.as_secs_f64();
            match place(&STEPS, step.step, &COMPONENTS, step.component) {
                Some(p) => self
                    .steps_bound
                    .get(p, || self.steps.bind(&step_attributes(step)))
                    .record(seconds),
                None => self.steps.record(seconds, &step_attributes(step)),
            }
        }
        self.span(report);
    }

    /// The event's span (`process OrderTrigger`, kind consumer) and one
    /// client child per step that called Redis or a database, made with the
    /// times the processor measured. The sampler decides when the span
    /// starts: a span sampled out gets no attribute and no child.
    fn span(&self, report: &EventReport<'_>) {
        let mut span = self
            .tracer
            .span_builder(SPAN_NAME)
            .with_kind(SpanKind::Consumer)
            .with_start_time(report.started)
            .start(&self.tracer);
        if !span.is_recording() {
            return;
        }
        let mut attributes = vec![
            system(),
            KeyValue::new("messaging.operation.type", "process"),
            KeyValue::new("messaging.operation.name", "process"),
            KeyValue::new("messaging.destination.name", DESTINATION),
            KeyValue::new("order_guard.outcome", report.outcome),
            KeyValue::new("order_guard.guard", report.guard),
            KeyValue::new("order_guard.decided_by", report.decided_by),
        ];
        if let Some(id) = report.event_id {
            attributes.push(KeyValue::new("messaging.message.id", id.to_string()));
        }
        if let Some(id) = report.order_id {
            attributes.push(KeyValue::new("order_guard.order_id", id.to_string()));
        }
        if let Some(id) = super::invocation_id() {
            attributes.push(KeyValue::new("faas.invocation_id", id.to_string()));
        }
        span.set_attributes(attributes);
        if report.outcome == "retry" {
            span.set_status(Status::error("the event needs a redelivery"));
        }
        let cx = Context::current_with_span(span);
        for step in report.steps {
            // A call to Redis or a database is a client span. The in-process
            // steps (the cache's recall, the memory guard) take microseconds,
            // less than a span costs: their durations are in the step
            // histogram, not in spans (a cache-hit duplicate paid 12-19 %
            // more CPU with them, measured by scripts/bench.sh).
            let Some(system) = db_system(step.component) else {
                continue;
            };
            let attributes = vec![
                KeyValue::new("order_guard.component", step.component),
                KeyValue::new("db.system.name", system),
                KeyValue::new("db.operation.name", step.step),
            ];
            let mut child = self
                .tracer
                .span_builder(step.step)
                .with_kind(SpanKind::Client)
                .with_start_time(step.started)
                .with_attributes(attributes)
                .start_with_context(&self.tracer, &cx);
            child.end_with_timestamp(step.started + step.elapsed);
        }
        cx.span()
            .end_with_timestamp(report.started + report.elapsed);
    }

    /// A reservation taken over from an owner past its deadline.
    pub fn takeover(&self) {
        self.takeovers.add(1, &[]);
    }

    /// An acquire found the guard unreachable; `policy` is what
    /// `GUARD_UNAVAILABLE` does about it (`proceed`, `retry`).
    pub fn guard_unavailable(&self, policy: &'static str) {
        self.guard_unavailable
            .add(1, &[KeyValue::new("order_guard.policy", policy)]);
    }

    /// A guard call after the store's answer failed (`complete`, `release`).
    pub fn guard_error(&self, operation: &'static str) {
        self.guard_errors
            .add(1, &[KeyValue::new("db.operation.name", operation)]);
    }

    /// A store call failed; `kind` is `transient` or `permanent`.
    pub fn store_error(&self, operation: &'static str, kind: &'static str) {
        self.store_errors.add(
            1,
            &[
                KeyValue::new("db.operation.name", operation),
                KeyValue::new("error.type", kind),
            ],
        );
    }
}

/// A step's histogram attributes: the step, and the database it called.
fn step_attributes(step: &StepTiming) -> Vec<KeyValue> {
    let mut attributes = vec![KeyValue::new("order_guard.step", step.step)];
    if let Some(system) = db_system(step.component) {
        attributes.push(KeyValue::new("db.system.name", system));
    }
    attributes
}

/// `db.system.name` of a guard or store (semantic conventions' values);
/// `None` for what is no database (the memory guard, the cache).
fn db_system(component: &str) -> Option<&'static str> {
    match component {
        "redis" => Some("redis"),
        "sqlite" => Some("sqlite"),
        "sqlserver" => Some("microsoft.sql_server"),
        _ => None,
    }
}

/// What a component can show of its load, read at each metric export.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// This instance's cache of finished orders.
    pub cache: Option<CacheReport>,
    /// A connection pool.
    pub pool: Option<PoolReport>,
    /// The SQLite writer's queue: calls refused because it was full, calls
    /// skipped because their caller had stopped waiting (cumulative).
    pub writer: Option<(u64, u64)>,
}

/// The cache of finished orders: its size now, its lookups so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheReport {
    /// Entries and weighted bytes (moka's estimates).
    pub entries: u64,
    pub bytes: u64,
    /// Lookups that answered the event, and those that could not
    /// (cumulative).
    pub hits: u64,
    pub misses: u64,
}

/// A connection pool's state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolReport {
    /// Its database (`sqlserver`: `db.system.name` = `microsoft.sql_server`).
    pub system: &'static str,
    /// Connections open, of which `idle`.
    pub open: u64,
    pub idle: u64,
    /// Callers waiting for a connection now.
    pub pending: u64,
    /// Callers that stopped waiting at the connect timeout (cumulative).
    pub timeouts: u64,
    /// Logins in flight: running (holding one of the pool's login turns)
    /// and waiting (for a turn, or pausing after a failed attempt).
    pub logins_running: u64,
    pub logins_waiting: u64,
}

/// Something whose load telemetry observes (the processor: its cache and
/// its store).
pub trait LoadSource: Send + Sync {
    fn load(&self) -> LoadReport;
}

/// `db.system.name` and `db.client.connection.pool.name` of a pool.
fn pool_attributes(p: &PoolReport) -> [KeyValue; 2] {
    [
        KeyValue::new("db.system.name", db_system(p.system).unwrap_or(p.system)),
        KeyValue::new("db.client.connection.pool.name", "order-guard"),
    ]
}

/// Register the observable instruments of `source`'s load.
pub(super) fn observe(meter: &Meter, source: Arc<dyn LoadSource>) {
    let s = Arc::clone(&source);
    meter
        .u64_observable_gauge("order_guard.cache.entries")
        .with_unit("{order}")
        .with_description("Orders in this instance's cache of finished orders")
        .with_callback(move |o| {
            if let Some(c) = s.load().cache {
                o.observe(c.entries, &[]);
            }
        })
        .build();
    let s = Arc::clone(&source);
    meter
        .u64_observable_gauge("order_guard.cache.size")
        .with_unit("By")
        .with_description("Weighted size of this instance's cache of finished orders")
        .with_callback(move |o| {
            if let Some(c) = s.load().cache {
                o.observe(c.bytes, &[]);
            }
        })
        .build();
    let s = Arc::clone(&source);
    meter
        .u64_observable_counter("order_guard.cache.lookups")
        .with_unit("{lookup}")
        .with_description("Lookups in this instance's cache of finished orders, by result: hit (the event answered from it) or miss")
        .with_callback(move |o| {
            if let Some(c) = s.load().cache {
                o.observe(c.hits, &[KeyValue::new("order_guard.cache.result", "hit")]);
                o.observe(c.misses, &[KeyValue::new("order_guard.cache.result", "miss")]);
            }
        })
        .build();
    let s = Arc::clone(&source);
    meter
        .f64_observable_gauge("order_guard.cache.hit_ratio")
        .with_unit("1")
        .with_description("Hits per lookup in this instance's cache of finished orders, since the process started")
        .with_callback(move |o| {
            // Since the start, so that every reader sees the same value; a
            // recent ratio is the lookups counter's rates, hit over all.
            if let Some(c) = s.load().cache {
                let lookups = c.hits + c.misses;
                if lookups > 0 {
                    o.observe(c.hits as f64 / lookups as f64, &[]);
                }
            }
        })
        .build();
    let s = Arc::clone(&source);
    meter
        .u64_observable_gauge("db.client.connection.count")
        .with_unit("{connection}")
        .with_description("Connections of the store's pool, by state")
        .with_callback(move |o| {
            if let Some(p) = s.load().pool {
                let attributes = |state| {
                    let mut a = pool_attributes(&p).to_vec();
                    a.push(KeyValue::new("db.client.connection.state", state));
                    a
                };
                o.observe(p.idle, &attributes("idle"));
                o.observe(p.open.saturating_sub(p.idle), &attributes("used"));
            }
        })
        .build();
    let s = Arc::clone(&source);
    meter
        .u64_observable_gauge("db.client.connection.pending_requests")
        .with_unit("{request}")
        .with_description("Callers waiting for a connection of the store's pool")
        .with_callback(move |o| {
            if let Some(p) = s.load().pool {
                o.observe(p.pending, &pool_attributes(&p));
            }
        })
        .build();
    let s = Arc::clone(&source);
    meter
        .u64_observable_gauge("order_guard.sql.logins_in_flight")
        .with_unit("{login}")
        .with_description("Logins the store's pool has in flight, running (holding a login turn) or waiting (for a turn, or to try again)")
        .with_callback(move |o| {
            if let Some(p) = s.load().pool {
                let attributes = |state| {
                    let mut a = pool_attributes(&p).to_vec();
                    a.push(KeyValue::new("order_guard.login.state", state));
                    a
                };
                o.observe(p.logins_running, &attributes("running"));
                o.observe(p.logins_waiting, &attributes("waiting"));
            }
        })
        .build();
    let s = Arc::clone(&source);
    meter
        .u64_observable_counter("db.client.connection.timeouts")
        .with_unit("{timeout}")
        .with_description("Callers that stopped waiting for a connection at the connect timeout")
        .with_callback(move |o| {
            if let Some(p) = s.load().pool {
                o.observe(p.timeouts, &pool_attributes(&p));
            }
        })
        .build();
    let s = Arc::clone(&source);
    meter
        .u64_observable_counter("order_guard.sqlite.writer.refused")
        .with_unit("{call}")
        .with_description("SQLite calls answered retry at once because the writer's queue was full")
        .with_callback(move |o| {
            if let Some((refused, _)) = s.load().writer {
                o.observe(refused, &[]);
            }
        })
        .build();
    meter
        .u64_observable_counter("order_guard.sqlite.writer.skipped")
        .with_unit("{call}")
        .with_description("SQLite calls skipped because their caller had stopped waiting")
        .with_callback(move |o| {
            if let Some((_, skipped)) = source.load().writer {
                o.observe(skipped, &[]);
            }
        })
        .build();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pair_of_listed_values_has_a_place_of_its_own() {
        let mut seen = std::collections::BTreeSet::new();
        for a in OUTCOMES {
            for b in DECIDERS {
                let p = place(&OUTCOMES, a, &DECIDERS, b).expect("listed values have a place");
                assert!(p < OUTCOMES.len() * DECIDERS.len(), "{a} × {b} at {p}");
                assert!(seen.insert(p), "{a} × {b} shares place {p}");
            }
        }
    }

    #[test]
    fn a_value_not_listed_has_no_place() {
        // Recorded unbound, with its attributes looked up: counted all the same.
        assert_eq!(place(&OUTCOMES, "executed", &DECIDERS, "a-new-guard"), None);
        assert_eq!(place(&STEPS, "a-new-step", &COMPONENTS, "redis"), None);
    }
}
