//! What the processor reports: one event's [`Outcome`], a trigger's
//! outcomes in event order, and the [`Counters`] an operator reads.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::decision::OutcomeKind;

/// One event's result, as the host and `replay` report it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub order_id: Option<String>,
    pub event_id: Option<String>,
    pub outcome: OutcomeKind,
    /// Why, for everything but `executed` and `duplicate`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What decided: the guard (`redis`, `memory`), `unavailable` (the store
    /// alone), or `cache` (this instance's cache of finished orders).
    pub guard: &'static str,
}

/// The outcomes of one trigger value, in event order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriggerResult {
    /// The trigger was an array (answered as `{"results": [...]}`).
    pub batch: bool,
    pub outcomes: Vec<Outcome>,
}

impl TriggerResult {
    /// All-or-none: one event that needs redelivery makes the whole delivery
    /// fail, and Event Grid redelivers all of it (the rest are then duplicates).
    pub fn needs_redelivery(&self) -> bool {
        self.outcomes.iter().any(|o| o.outcome.needs_redelivery())
    }
}

/// Counters an operator (and the tests) can read.
#[derive(Debug, Default)]
pub struct Counters {
    outcomes: [AtomicU64; 6],
    pub(super) guard_unavailable: AtomicU64,
    pub(super) guard_errors: AtomicU64,
    pub(super) takeovers: AtomicU64,
    pub(super) cache_hits: AtomicU64,
    pub(super) cache_misses: AtomicU64,
}

/// A point-in-time copy of [`Counters`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CountersSnapshot {
    pub executed: u64,
    pub duplicate: u64,
    pub in_progress: u64,
    pub conflict: u64,
    pub rejected: u64,
    pub retry: u64,
    /// Acquires that found the guard unreachable.
    pub guard_unavailable: u64,
    /// Complete/release calls that failed (the store stayed the truth).
    pub guard_errors: u64,
    /// Reservations taken over from an owner past its deadline.
    pub takeovers: u64,
    /// Events answered from this instance's cache of finished orders.
    pub cache_hits: u64,
    /// Lookups in that cache that could not answer (the order not there,
    /// or remembered under another fingerprint version): the usual path
    /// followed. Both stay 0 with the cache off.
    pub cache_misses: u64,
}

impl Counters {
    pub(super) fn count(&self, kind: OutcomeKind) {
        self.outcomes[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> CountersSnapshot {
        let o = |k: OutcomeKind| self.outcomes[k as usize].load(Ordering::Relaxed);
        CountersSnapshot {
            executed: o(OutcomeKind::Executed),
            duplicate: o(OutcomeKind::Duplicate),
            in_progress: o(OutcomeKind::InProgress),
            conflict: o(OutcomeKind::Conflict),
            rejected: o(OutcomeKind::Rejected),
            retry: o(OutcomeKind::Retry),
            guard_unavailable: self.guard_unavailable.load(Ordering::Relaxed),
            guard_errors: self.guard_errors.load(Ordering::Relaxed),
            takeovers: self.takeovers.load(Ordering::Relaxed),
            cache_hits: self.cache_hits.load(Ordering::Relaxed),
            cache_misses: self.cache_misses.load(Ordering::Relaxed),
        }
    }
}
