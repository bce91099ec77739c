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
    /// The facts of an event whose steps began at `started`, now (`timed`:
    /// telemetry is on).
    pub(super) fn new(guard_label: &'static str, timed: bool, started: Instant) -> Facts {
        Facts {
            arrived: timed.then(|| (SystemTime::now(), started)),
            decided_by: "none",
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
    /// start from the event's arrival (one clock read per event, not two
    /// per step).
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
    pub(super) fn report_order(
        &self,
        order_id: &str,
        outcome: &Outcome,
        facts: &Facts,
        started: Instant,
    ) {
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
            elapsed: started.elapsed(),
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
        let event_id = event_id.map(crate::event::shown);
        t.event(&EventReport {
            order_id,
            event_id: event_id.as_deref(),
            outcome: kind.as_str(),
            guard: self.guard.name(),
            decided_by: "none",
            started: arrived.0,
            elapsed,
            steps: &[StepTiming {
                step: "reject",
                component: self.store.name(),
                started: arrived.0,
                elapsed,
            }],
        });
    }

    /// A failed store call, counted by operation and kind.
    pub(super) fn store_error(&self, operation: &'static str, e: &StoreError) {
        if let Some(t) = &self.telemetry {
            let kind = match e {
                StoreError::Transient(_) => "transient",
                StoreError::Permanent(_) => "permanent",
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
