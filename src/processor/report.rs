//! What the processor tells telemetry (`crate::telemetry`): each event's
//! end with its timed steps, failed store calls, and its load for the
//! gauges. Every function here runs only while telemetry is on.

use std::sync::atomic::Ordering;
use std::time::SystemTime;

use tokio::time::Instant;

use super::{Facts, Outcome, OutcomeKind, Processor, Step, StoreError, RECALLED};
use crate::telemetry::{CacheReport, EventReport, LoadReport, LoadSource, PoolReport, StepTiming};

/// The `decided_by` of an answer the store gave.
pub(super) const STORE: &str = "store";
/// The `decided_by` of an answer no one but the event decided.
const NO_ONE: &str = "none";
/// A poison event's one step: the store's `reject`.
const REJECT: &str = "reject";

/// A step's name in telemetry.
fn step_name(step: Step) -> &'static str {
    match step {
        Step::Recall => "recall",
        Step::Acquire => "acquire",
        Step::ReadRow => "read_row",
        Step::Execute => "execute",
        Step::StoreConflict => "store_conflict",
        Step::MarkCompleted => "complete",
        Step::Release => "release",
        Step::Answer(..) => "answer",
    }
}

impl Facts {
    /// The facts of an event whose steps began at `started` (`timed`:
    /// telemetry is on, and reads the wall clock now).
    pub(super) fn new(guard_label: &'static str, timed: bool, started: Instant) -> Facts {
        Facts {
            arrived: timed.then(|| (SystemTime::now(), started)),
            decided_by: NO_ONE,
            steps: Vec::new(),
            token: None,
            existing: None,
            failure: None,
            guard_label,
        }
    }
}

impl Processor {
    /// `step`, begun at `began`, as telemetry times it: its wall-clock
    /// start is the event's arrival plus the monotonic offset (one
    /// wall-clock read per event instead of one per step).
    pub(super) fn timing(
        &self,
        step: Step,
        began: Instant,
        arrived: (SystemTime, Instant),
    ) -> StepTiming {
        StepTiming {
            step: step_name(step),
            component: match step {
                Step::Recall => RECALLED,
                Step::Acquire | Step::MarkCompleted | Step::Release => self.guard.name(),
                _ => self.store.name(),
            },
            started: arrived.0 + began.duration_since(arrived.1),
            elapsed: began.elapsed(),
        }
    }

    /// An order's event answered: its counter, durations and span.
    pub(super) fn report_order(&self, order_id: &str, outcome: &Outcome, facts: &Facts) {
        let (Some(t), Some(arrived)) = (&self.telemetry, facts.arrived) else {
            return;
        };
        t.event(&EventReport {
            order_id: Some(order_id),
            event_id: outcome.event_id.as_deref(),
            outcome: outcome.outcome.as_str(),
            guard: outcome.guard,
            decided_by: facts.decided_by,
            started: arrived.0,
            elapsed: arrived.1.elapsed(),
            steps: &facts.steps,
        });
    }

    /// A poison event answered (stored, or `retry` when it could not be):
    /// one step, the store's `reject`; no one but the event decided.
    pub(super) fn report_poison(
        &self,
        order_id: Option<&str>,
        event_id: Option<&str>,
        kind: OutcomeKind,
        arrived: (SystemTime, Instant),
    ) {
        let Some(t) = &self.telemetry else { return };
        let elapsed = arrived.1.elapsed();
        let event_id = event_id.map(crate::text::shown);
        t.event(&EventReport {
            order_id,
            event_id: event_id.as_deref(),
            outcome: kind.as_str(),
            guard: self.guard.name(),
            decided_by: NO_ONE,
            started: arrived.0,
            elapsed,
            steps: &[StepTiming {
                step: REJECT,
                component: self.store.name(),
                started: arrived.0,
                elapsed,
            }],
        });
    }

    /// A failed store call, counted by operation and kind.
    pub(super) fn store_error(&self, operation: &'static str, e: &StoreError) {
        if e.needs_operator() {
            let mut state = self
                .operator_needed
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            *state = (state.0 + 1, Some(e.to_string()));
        }
        if let Some(t) = &self.telemetry {
            let kind = match e {
                StoreError::Transient(_) => "transient",
                StoreError::Permanent(_) => "permanent",
                StoreError::Misconfigured(_) => "misconfigured",
                StoreError::Unmigrated(_) => "unmigrated",
            };
            t.store_error(operation, kind);
        }
    }
}

/// The processor's load for telemetry's gauges: its cache and its store.
impl LoadSource for Processor {
    fn load(&self) -> LoadReport {
        let store = self.store.load();
        LoadReport {
            cache: self.finished.as_ref().map(|f| {
                let (entries, bytes) = f.size();
                CacheReport {
                    entries,
                    bytes,
                    hits: self.counters.cache_hits.load(Ordering::Relaxed),
                    misses: self.counters.cache_misses.load(Ordering::Relaxed),
                }
            }),
            pool: store.pool.map(|p| PoolReport {
                system: self.store.name(),
                open: p.open,
                idle: p.idle,
                pending: p.pending,
                timeouts: p.timeouts,
                logins_running: p.logins_running,
                logins_waiting: p.logins_waiting,
            }),
            writer: store.writer,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::{COMPONENTS, DECIDERS, OUTCOMES, STEPS};

    /// Telemetry records the values it lists through bound handles, the
    /// others unbound (counted, but at the cost of a lookup): every value
    /// the processor reports is listed.
    #[test]
    fn every_value_reported_is_one_telemetry_binds() {
        for kind in OutcomeKind::ALL {
            assert!(OUTCOMES.contains(&kind.as_str()), "{kind:?}");
        }
        let steps = [
            Step::Recall,
            Step::Acquire,
            Step::ReadRow,
            Step::Execute,
            Step::StoreConflict,
            Step::MarkCompleted,
            Step::Release,
        ];
        for step in steps {
            assert!(STEPS.contains(&step_name(step)), "{step:?}");
        }
        assert!(STEPS.contains(&REJECT), "a poison event's step");
        for decider in [RECALLED, STORE, NO_ONE, "redis", "memory"] {
            assert!(DECIDERS.contains(&decider), "{decider}");
        }
        for component in [RECALLED, "redis", "memory", "sqlite", "sqlserver"] {
            assert!(COMPONENTS.contains(&component), "{component}");
        }
    }
}
