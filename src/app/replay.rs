//! `replay FILE`: events from a file through the same processor `serve`
//! runs, with the summary it prints.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use serde::Serialize;
use serde_json::Value;

use crate::processor::{Outcome, OutcomeKind, Processor};

/// What `replay` did, by final outcome.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct ReplaySummary {
    pub deliveries: u64,
    pub events: u64,
    pub executed: u64,
    pub duplicates: u64,
    pub conflicts: u64,
    pub rejected: u64,
    /// Deliveries that still needed a retry after every redelivery.
    pub unresolved: u64,
    /// Redeliveries made because an answer was `in_progress` or `retry`.
    pub retries: u64,
    /// Why the replay stopped early: a store failure no retry can fix (a
    /// right or the schema missing; `Processor::operator_needed`). The
    /// deliveries it left are counted `unresolved`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

impl std::fmt::Display for ReplaySummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "deliveries={} events={} executed={} duplicates={} conflicts={} rejected={} retries={} unresolved={}",
            self.deliveries,
            self.events,
            self.executed,
            self.duplicates,
            self.conflicts,
            self.rejected,
            self.retries,
            self.unresolved
        )
    }
}

/// How often `replay` redelivers a delivery whose answer asked for a retry.
const REPLAY_MAX_ATTEMPTS: u32 = 40;

/// Read a replay file: a JSON array of deliveries (each an event object, a
/// string holding one, or an array of them), or a single delivery.
pub fn read_replay_file(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read replay file {}", path.display()))?;
    let value: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    Ok(match value {
        Value::Array(items) => items,
        other => vec![other],
    })
}

/// Push deliveries through the processor as Event Grid would: up to
/// `concurrency` at once, redelivering (with a short back-off) any delivery
/// answered `in_progress` or `retry`, all-or-none. Stops at the first store
/// failure no retry can fix (`Processor::operator_needed`): no delivery is
/// started or redelivered after it, and those left count as unresolved.
pub async fn replay(
    processor: &Processor,
    deliveries: Vec<Value>,
    concurrency: usize,
) -> ReplaySummary {
    // A delivery's outcomes (`None`: not started, the replay having
    // stopped) and its redeliveries.
    let results: Vec<(Option<Vec<Outcome>>, u64)> = futures::stream::iter(deliveries)
        .map(|delivery| async move {
            let mut redeliveries = 0;
            loop {
                if processor.operator_needed().is_some() {
                    return (None, redeliveries);
                }
                let result = processor.process_trigger(delivery.clone()).await;
                if !result.needs_redelivery()
                    || redeliveries + 1 >= u64::from(REPLAY_MAX_ATTEMPTS)
                    || processor.operator_needed().is_some()
                {
                    return (Some(result.outcomes), redeliveries);
                }
                redeliveries += 1;
                let backoff = Duration::from_millis(10 * redeliveries.min(20));
                tokio::time::sleep(backoff).await;
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let mut summary = ReplaySummary::default();
    for (outcomes, redeliveries) in results {
        summary.deliveries += 1;
        summary.retries += redeliveries;
        // Not started counts as unresolved, like one that kept failing.
        let Some(outcomes) = outcomes else {
            summary.unresolved += 1;
            continue;
        };
        if outcomes.iter().any(|o| o.outcome.needs_redelivery()) {
            summary.unresolved += 1;
        }
        for o in outcomes {
            summary.events += 1;
            match o.outcome {
                OutcomeKind::Executed => summary.executed += 1,
                OutcomeKind::Duplicate => summary.duplicates += 1,
                OutcomeKind::Conflict => summary.conflicts += 1,
                OutcomeKind::Rejected => summary.rejected += 1,
                OutcomeKind::InProgress | OutcomeKind::Retry => {}
            }
        }
    }
    summary.stopped = processor.operator_needed();
    summary
}
