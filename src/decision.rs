//! What the processor decides, as pure functions: no I/O, no clock, no async.
//!
//! [`Decision`] is the state machine of one order event: it says which step
//! comes next ([`Step`]) from what the previous step answered ([`Reply`]).
//! The processor performs the steps (Redis, the store) and feeds the answers
//! back; `tests/model.rs` drives the very same machine from a model checker
//! through every interleaving of workers, crashes, key loss and late writes.
//! So the rules below are written once and checked where they run.
//!
//! ```text
//! Recall ──┬─ finished here, same content ────────► answer duplicate
//!          ├─ finished here, other content ───────► StoreConflict
//!          └─ not known here ─────────────────────► Acquire
//! Acquire ─┬─ acquired / taken over ──────────────► Execute (holding a token)
//!          ├─ COMPLETADA, same content ───────────► answer duplicate
//!          ├─ COMPLETADA, other content ──────────► StoreConflict
//!          ├─ COMPLETADA, marker not usable ──────► Execute (no token)
//!          ├─ held by another reservation ────────► ReadRow
//!          └─ guard unreachable ─── policy ───────► answer retry | Execute (no guard)
//! ReadRow ─┬─ same order, terminal ───────────────► MarkCompleted → duplicate
//!          ├─ other content ──────────────────────► StoreConflict
//!          └─ anything else ──────────────────────► answer in_progress
//! Execute ─┬─ executed (inserted or resumed) ─────► MarkCompleted → executed
//!          ├─ already terminal ───────────────────► MarkCompleted → duplicate
//!          ├─ rejected (position overflow, stored) ► MarkCompleted → rejected
//!          ├─ other content (conflict, stored) ───► Release → conflict
//!          └─ failed ─────────────────────────────► Release → retry
//! StoreConflict ─ stored / failed ────────────────► Release → conflict / retry
//! ```
//!
//! `Recall` (this instance's cache of finished orders, [`crate::finished`]) is
//! the first step when the cache is on. `MarkCompleted` is skipped when the
//! guard was not used (unreachable, policy `proceed`); `Release` only runs
//! when this event holds a reservation token.

use serde::Serialize;

use crate::order::{fingerprint_version, OrderStatus};
use crate::store::Execution;

/// How one event ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeKind {
    /// This delivery did the work.
    Executed,
    /// Already done; nothing happened.
    Duplicate,
    /// Another live worker holds the order: try again later.
    InProgress,
    /// Same id, different content: stored in `RejectedEvents`.
    Conflict,
    /// Invalid event or order (poison): stored in `RejectedEvents`.
    Rejected,
    /// A dependency failed: try again later.
    Retry,
}

impl OutcomeKind {
    pub const ALL: [OutcomeKind; 6] = [
        OutcomeKind::Executed,
        OutcomeKind::Duplicate,
        OutcomeKind::InProgress,
        OutcomeKind::Conflict,
        OutcomeKind::Rejected,
        OutcomeKind::Retry,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeKind::Executed => "executed",
            OutcomeKind::Duplicate => "duplicate",
            OutcomeKind::InProgress => "in_progress",
            OutcomeKind::Conflict => "conflict",
            OutcomeKind::Rejected => "rejected",
            OutcomeKind::Retry => "retry",
        }
    }

    /// Must Event Grid deliver this event again? Only if its effect is not
    /// durable yet: never acknowledge work that might not happen.
    pub fn needs_redelivery(self) -> bool {
        matches!(self, OutcomeKind::InProgress | OutcomeKind::Retry)
    }

    /// Is this answer proof that the store holds the order terminal with the
    /// delivered content? Only then may an instance remember the order as
    /// finished ([`crate::finished`]).
    pub fn proves_finished(self) -> bool {
        matches!(self, OutcomeKind::Executed | OutcomeKind::Duplicate)
    }
}

/// What to do when the guard cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GuardPolicy {
    /// Go on without it: the unique index and forward-only status still keep
    /// the effect single; only the fast duplicate path is lost.
    Proceed,
    /// Answer `retry` and let Event Grid come back later.
    Retry,
}

/// The next thing the processor must do for the event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// Look the order up in this instance's cache of finished orders.
    Recall,
    /// Reserve the order id in the guard.
    Acquire,
    /// Another reservation holds the id: read the order's row.
    ReadRow,
    /// The store's one call: insert the order under the unique index (or
    /// find the row holding its id) and, in the same transaction, move it
    /// `Received → Executed` with its position effect, once (or `Rejected`,
    /// stored with its reason, when the position would overflow); a row of
    /// another order is stored as a conflict.
    Execute,
    /// Write `COMPLETADA` with this store's marker (its failure changes nothing:
    /// the store already holds the truth).
    MarkCompleted,
    /// Store the event in `RejectedEvents` as a conflict.
    StoreConflict,
    /// Compare-and-delete this event's reservation so a retry need not wait.
    Release,
    /// Done: answer the event.
    Answer(OutcomeKind, Why),
}

/// Why an event is answered as it is, for the reason the processor writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Why {
    /// `executed` and `duplicate` need no reason.
    Done,
    /// The guard could not be reached and the policy is `retry`.
    GuardUnavailable,
    /// Another worker's reservation holds the order and the store does not
    /// show it done.
    HeldElsewhere,
    /// A store step failed or the event's deadline passed.
    StoreFailed,
    /// Another order uses this id; the event is stored as a conflict.
    Conflict,
    /// Another order uses this id, and storing the conflict failed.
    ConflictNotStored,
    /// The store refused the order (its position would overflow) and kept
    /// it `Rejected` with the reason, in one transaction.
    Refused,
}

/// What a step answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// [`Step::Recall`]: what the cache says, judged by [`recollection`].
    Recalled(Recollection),
    /// [`Step::Acquire`]: the id is ours (`taken_over`: from an owner past its deadline).
    Acquired { taken_over: bool },
    /// [`Step::Acquire`]: the guard says `COMPLETADA`, judged by [`completed_verdict`].
    Completed(CompletedVerdict),
    /// [`Step::Acquire`]: another reservation holds the id.
    Held,
    /// [`Step::Acquire`]: the guard could not be reached in time.
    GuardUnavailable,
    /// [`Step::ReadRow`]: the row judged by [`held_elsewhere_verdict`].
    Row(HeldElsewhere),
    /// [`Step::Execute`].
    Executed(Execution),
    /// [`Step::Execute`] or [`Step::StoreConflict`] failed
    /// (an error, a fault, or the deadline): its effect may still happen.
    Failed,
    /// [`Step::StoreConflict`] stored the conflict.
    Stored,
    /// [`Step::MarkCompleted`] or [`Step::Release`] returned (done or not:
    /// both are best effort).
    Done,
}

/// Where one event is in its steps: small, `Copy` and hashable, so a model
/// checker can keep millions of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decision {
    policy: GuardPolicy,
    /// The step whose reply is awaited.
    awaiting: Step,
    /// This event owns a reservation (and must release it unless it marks
    /// the order completed).
    holds_token: bool,
    /// The guard answered: a finished order is marked `COMPLETADA`.
    use_guard: bool,
    /// The answer, once decided, while bookkeeping steps remain.
    answer: Option<(OutcomeKind, Why)>,
}

impl Decision {
    /// The first step of an event: [`Step::Recall`] when this instance keeps
    /// a cache of finished orders (`cache`), else [`Step::Acquire`].
    pub fn start(policy: GuardPolicy, cache: bool) -> (Decision, Step) {
        let first = if cache { Step::Recall } else { Step::Acquire };
        let d = Decision {
            policy,
            awaiting: first,
            holds_token: false,
            use_guard: true,
            answer: None,
        };
        (d, first)
    }

    /// The next step, given what the awaited step answered. A reply that does
    /// not belong to the awaited step is a bug in the caller: answered `retry`
    /// (never acknowledged), and caught by a debug assertion.
    pub fn next(mut self, reply: &Reply) -> (Decision, Step) {
        use OutcomeKind as K;
        let step = match (self.awaiting, reply) {
            (Step::Recall, Reply::Recalled(r)) => match r {
                // Already marked COMPLETADA (or the guard was down) when it
                // finished: nothing to mark, nothing held.
                Recollection::Finished => Step::Answer(K::Duplicate, Why::Done),
                Recollection::FinishedOther(_) => Step::StoreConflict,
                Recollection::Unknown => Step::Acquire,
            },
            (Step::Acquire, Reply::Acquired { .. }) => {
                self.holds_token = true;
                Step::Execute
            }
            (Step::Acquire, Reply::Completed(v)) => match v {
                CompletedVerdict::Duplicate => Step::Answer(K::Duplicate, Why::Done),
                CompletedVerdict::Conflict(_) => Step::StoreConflict,
                CompletedVerdict::AskStore => Step::Execute,
            },
            (Step::Acquire, Reply::Held) => Step::ReadRow,
            (Step::Acquire, Reply::GuardUnavailable) => match self.policy {
                GuardPolicy::Retry => Step::Answer(K::Retry, Why::GuardUnavailable),
                GuardPolicy::Proceed => {
                    self.use_guard = false;
                    Step::Execute
                }
            },
            (Step::ReadRow, Reply::Row(v)) => match v {
                HeldElsewhere::Done => self.finish(K::Duplicate),
                HeldElsewhere::Conflict(_) => Step::StoreConflict,
                HeldElsewhere::InProgress => Step::Answer(K::InProgress, Why::HeldElsewhere),
            },
            (Step::Execute, Reply::Executed(Execution::Executed)) => self.finish(K::Executed),
            (Step::Execute, Reply::Executed(Execution::AlreadyDone)) => self.finish(K::Duplicate),
            // Stored by the store in the same call: nothing executed, the
            // reservation released so the id's owner is the store's row.
            (Step::Execute, Reply::Executed(Execution::Conflict { .. })) => {
                self.release_then(K::Conflict, Why::Conflict)
            }
            // Terminal and stored like an executed order: marked completed,
            // so a redelivery is a duplicate.
            (Step::Execute, Reply::Executed(Execution::Rejected(_))) => {
                self.finish_because(K::Rejected, Why::Refused)
            }
            (Step::Execute, Reply::Failed) => self.release_then(K::Retry, Why::StoreFailed),
            (Step::StoreConflict, Reply::Stored) => self.release_then(K::Conflict, Why::Conflict),
            (Step::StoreConflict, Reply::Failed) => {
                self.release_then(K::Retry, Why::ConflictNotStored)
            }
            (Step::MarkCompleted, Reply::Done) => {
                // COMPLETADA replaced our reservation: nothing left to release.
                self.holds_token = false;
                self.decided()
            }
            (Step::Release, Reply::Done) => {
                self.holds_token = false;
                self.decided()
            }
            (awaiting, reply) => {
                debug_assert!(false, "reply {reply:?} while awaiting {awaiting:?}");
                Step::Answer(K::Retry, Why::StoreFailed)
            }
        };
        self.awaiting = step;
        (self, step)
    }

    /// The work is done (durable in the store): mark it in the guard when
    /// the guard is in use, then answer.
    fn finish(&mut self, kind: OutcomeKind) -> Step {
        self.finish_because(kind, Why::Done)
    }

    /// [`Decision::finish`] with the answer's reason.
    fn finish_because(&mut self, kind: OutcomeKind, why: Why) -> Step {
        self.answer = Some((kind, why));
        if self.use_guard {
            Step::MarkCompleted
        } else {
            Step::Answer(kind, why)
        }
    }

    /// Answer `kind`, releasing our reservation first if we hold one.
    fn release_then(&mut self, kind: OutcomeKind, why: Why) -> Step {
        self.answer = Some((kind, why));
        if self.holds_token {
            Step::Release
        } else {
            Step::Answer(kind, why)
        }
    }

    fn decided(&self) -> Step {
        let (kind, why) = self
            .answer
            .unwrap_or((OutcomeKind::Retry, Why::StoreFailed));
        Step::Answer(kind, why)
    }
}

/// What the guard keeps beside `COMPLETADA`: `<store identity>/<fingerprint>`.
/// The identity binds the marker to one database: two databases sharing a
/// cache (dev and prod, a blue/green pair) never answer each other's orders.
pub fn completion_marker(store_id: &str, fingerprint: &str) -> String {
    format!("{store_id}/{fingerprint}")
}

/// What this instance's cache of finished orders means for the order being
/// delivered.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Recollection {
    /// Finished with the same content: a duplicate.
    Finished,
    /// Finished with other content (its fingerprint): a conflict.
    FinishedOther(String),
    /// Not remembered, or remembered under another fingerprint version (its
    /// hash cannot be compared): the guard and the store decide.
    Unknown,
}

/// Decide on a cached fingerprint (`None`: not in the cache).
pub fn recollection(cached: Option<&str>, fingerprint: &str) -> Recollection {
    match cached {
        Some(fp) if fingerprint_version(fp) != fingerprint_version(fingerprint) => {
            Recollection::Unknown
        }
        Some(fp) if fp == fingerprint => Recollection::Finished,
        Some(fp) => Recollection::FinishedOther(fp.to_string()),
        None => Recollection::Unknown,
    }
}

/// What a `COMPLETADA` key means for the order being delivered.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CompletedVerdict {
    /// Completed in this store with the same content.
    Duplicate,
    /// Completed in this store with other content (its fingerprint).
    Conflict(String),
    /// No usable marker (missing, unbound, another database's, or this
    /// store's identity unknown): the store decides.
    AskStore,
}

/// Decide on a completion marker (see [`completion_marker`]).
pub fn completed_verdict(
    marker: Option<&str>,
    store_id: Option<&str>,
    fingerprint: &str,
) -> CompletedVerdict {
    match (marker.and_then(|m| m.split_once('/')), store_id) {
        // A marker of another fingerprint version cannot be compared by its
        // hash: the store's row decides.
        (Some((_, fp)), _) if fingerprint_version(fp) != fingerprint_version(fingerprint) => {
            CompletedVerdict::AskStore
        }
        (Some((id, fp)), Some(ours)) if id == ours => {
            if fp == fingerprint {
                CompletedVerdict::Duplicate
            } else {
                CompletedVerdict::Conflict(fp.to_string())
            }
        }
        _ => CompletedVerdict::AskStore,
    }
}

/// What a held reservation means, given the order's row (if it could be
/// read) and the fingerprint of the order being delivered.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HeldElsewhere {
    /// The same order is terminal in the store: a duplicate, whoever holds the key.
    Done,
    /// A different order holds this id in the store.
    Conflict(String),
    /// Nothing says the work is done: the holder may still be at it.
    InProgress,
}

/// Decide on a held reservation from the row's fingerprint and status
/// (`None`: no row, or it could not be read). The holder may be dead with
/// the order done (killed after the commit, or its `COMPLETADA` lost).
pub fn held_elsewhere_verdict(
    row: Option<(&str, OrderStatus)>,
    fingerprint: &str,
) -> HeldElsewhere {
    match row {
        Some((fp, _)) if fp != fingerprint => HeldElsewhere::Conflict(fp.to_string()),
        Some((_, status)) if status.is_terminal() => HeldElsewhere::Done,
        _ => HeldElsewhere::InProgress,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drive the machine through `replies`, returning every step it asked for.
    fn run(policy: GuardPolicy, replies: &[Reply]) -> Vec<Step> {
        run_from(Decision::start(policy, false), replies)
    }

    fn run_from((mut d, first): (Decision, Step), replies: &[Reply]) -> Vec<Step> {
        let mut steps = vec![first];
        for r in replies {
            let (next, step) = d.next(r);
            d = next;
            steps.push(step);
        }
        steps
    }

    const P: GuardPolicy = GuardPolicy::Proceed;

    /// The labels are the wire names (the answer's `outcome`, the log
    /// line's `outcome=`, the README's outcomes table), and which outcomes
    /// ask for a redelivery or prove the order finished.
    #[test]
    fn outcome_labels_are_the_wire_names() {
        let labels: Vec<&str> = OutcomeKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(
            labels,
            [
                "executed",
                "duplicate",
                "in_progress",
                "conflict",
                "rejected",
                "retry"
            ]
        );
        let redeliver: Vec<bool> = OutcomeKind::ALL
            .iter()
            .map(|k| k.needs_redelivery())
            .collect();
        assert_eq!(redeliver, [false, false, true, false, false, true]);
        let finished: Vec<bool> = OutcomeKind::ALL
            .iter()
            .map(|k| k.proves_finished())
            .collect();
        assert_eq!(finished, [true, true, false, false, false, false]);
    }

    #[test]
    fn first_delivery_executes_in_one_store_call_and_marks_completed() {
        let steps = run(
            P,
            &[
                Reply::Acquired { taken_over: false },
                Reply::Executed(Execution::Executed),
                Reply::Done,
            ],
        );
        assert_eq!(
            steps,
            [
                Step::Acquire,
                Step::Execute,
                Step::MarkCompleted,
                Step::Answer(OutcomeKind::Executed, Why::Done)
            ]
        );
    }

    #[test]
    fn a_refused_execution_is_marked_completed_and_answered_rejected() {
        use crate::position::{Overflow, Position};
        let overflow = Overflow {
            current: Position::ZERO,
            change: Position::ZERO,
        };
        let steps = run(
            P,
            &[
                Reply::Acquired { taken_over: false },
                Reply::Executed(Execution::Rejected(overflow)),
                Reply::Done,
            ],
        );
        assert_eq!(
            &steps[2..],
            [
                Step::MarkCompleted,
                Step::Answer(OutcomeKind::Rejected, Why::Refused)
            ]
        );
        // Without the guard: answered at once.
        let steps = run(
            P,
            &[
                Reply::GuardUnavailable,
                Reply::Executed(Execution::Rejected(overflow)),
            ],
        );
        assert_eq!(
            steps.last(),
            Some(&Step::Answer(OutcomeKind::Rejected, Why::Refused))
        );
    }

    #[test]
    fn a_failed_store_step_releases_the_token_and_answers_retry() {
        for taken_over in [false, true] {
            let replies = [Reply::Acquired { taken_over }, Reply::Failed, Reply::Done];
            let steps = run(P, &replies);
            assert_eq!(
                &steps[steps.len() - 2..],
                [
                    Step::Release,
                    Step::Answer(OutcomeKind::Retry, Why::StoreFailed)
                ]
            );
        }
    }

    #[test]
    fn without_a_token_nothing_is_released() {
        // COMPLETADA without a usable marker: the store decides, no token held.
        let steps = run(
            P,
            &[Reply::Completed(CompletedVerdict::AskStore), Reply::Failed],
        );
        assert_eq!(
            steps.last(),
            Some(&Step::Answer(OutcomeKind::Retry, Why::StoreFailed))
        );
    }

    #[test]
    fn guard_unavailable_follows_the_policy() {
        assert_eq!(
            run(GuardPolicy::Retry, &[Reply::GuardUnavailable]).last(),
            Some(&Step::Answer(OutcomeKind::Retry, Why::GuardUnavailable))
        );
        // proceed: the store alone decides, and COMPLETADA is not written.
        let steps = run(
            P,
            &[
                Reply::GuardUnavailable,
                Reply::Executed(Execution::Executed),
            ],
        );
        assert_eq!(
            steps.last(),
            Some(&Step::Answer(OutcomeKind::Executed, Why::Done))
        );
    }

    #[test]
    fn a_held_order_is_judged_by_its_row() {
        let done = run(
            P,
            &[Reply::Held, Reply::Row(HeldElsewhere::Done), Reply::Done],
        );
        assert_eq!(
            &done[1..],
            [
                Step::ReadRow,
                Step::MarkCompleted,
                Step::Answer(OutcomeKind::Duplicate, Why::Done)
            ]
        );
        let busy = run(P, &[Reply::Held, Reply::Row(HeldElsewhere::InProgress)]);
        assert_eq!(
            busy.last(),
            Some(&Step::Answer(OutcomeKind::InProgress, Why::HeldElsewhere))
        );
    }

    #[test]
    fn a_conflict_is_stored_then_the_token_released() {
        // Found and stored by the store's one call.
        let steps = run(
            P,
            &[
                Reply::Acquired { taken_over: false },
                Reply::Executed(Execution::Conflict {
                    existing_fingerprint: "other".into(),
                }),
                Reply::Done,
            ],
        );
        assert_eq!(
            &steps[1..],
            [
                Step::Execute,
                Step::Release,
                Step::Answer(OutcomeKind::Conflict, Why::Conflict)
            ]
        );
        let unstored = run(
            P,
            &[
                Reply::Completed(CompletedVerdict::Conflict("other".into())),
                Reply::Failed,
            ],
        );
        assert_eq!(
            unstored.last(),
            Some(&Step::Answer(OutcomeKind::Retry, Why::ConflictNotStored))
        );
    }

    #[test]
    fn completed_with_our_marker_is_a_duplicate_without_the_store() {
        assert_eq!(
            run(P, &[Reply::Completed(CompletedVerdict::Duplicate)]).last(),
            Some(&Step::Answer(OutcomeKind::Duplicate, Why::Done))
        );
    }

    #[test]
    fn a_marker_of_another_fingerprint_version_makes_the_store_decide() {
        let v1 = "a".repeat(64);
        let v2 = format!("v2:{}", "a".repeat(64));
        assert_eq!(
            completed_verdict(Some(&format!("s/{v1}")), Some("s"), &v2),
            CompletedVerdict::AskStore
        );
        assert_eq!(
            completed_verdict(Some(&format!("s/{v2}")), Some("s"), &v2),
            CompletedVerdict::Duplicate
        );
        let other = format!("v2:{}", "b".repeat(64));
        assert_eq!(
            completed_verdict(Some(&format!("s/{other}")), Some("s"), &v2),
            CompletedVerdict::Conflict(other.clone())
        );
    }

    #[test]
    fn a_finished_order_in_the_cache_is_answered_without_the_guard() {
        let start = || Decision::start(P, true);
        assert_eq!(
            run_from(start(), &[Reply::Recalled(Recollection::Finished)]),
            [
                Step::Recall,
                Step::Answer(OutcomeKind::Duplicate, Why::Done)
            ]
        );
        // Other content: stored as a conflict, with no token to release.
        assert_eq!(
            run_from(
                start(),
                &[
                    Reply::Recalled(Recollection::FinishedOther("fpB".into())),
                    Reply::Stored
                ]
            ),
            [
                Step::Recall,
                Step::StoreConflict,
                Step::Answer(OutcomeKind::Conflict, Why::Conflict)
            ]
        );
        // Not known here: the usual path.
        assert_eq!(
            run_from(start(), &[Reply::Recalled(Recollection::Unknown)]),
            [Step::Recall, Step::Acquire]
        );
    }

    #[test]
    fn recollection_verdicts() {
        let v2a = format!("v2:{}", "a".repeat(64));
        let v2b = format!("v2:{}", "b".repeat(64));
        let v1a = "a".repeat(64);
        assert_eq!(recollection(None, &v2a), Recollection::Unknown);
        assert_eq!(recollection(Some(&v2a), &v2a), Recollection::Finished);
        assert_eq!(
            recollection(Some(&v2b), &v2a),
            Recollection::FinishedOther(v2b.clone())
        );
        assert_eq!(recollection(Some(&v1a), &v2a), Recollection::Unknown);
    }

    #[test]
    fn only_executed_and_duplicate_prove_an_order_finished() {
        let proving: Vec<_> = OutcomeKind::ALL
            .into_iter()
            .filter(|k| k.proves_finished())
            .collect();
        assert_eq!(proving, [OutcomeKind::Executed, OutcomeKind::Duplicate]);
        assert!(proving.iter().all(|k| !k.needs_redelivery()));
    }

    #[test]
    fn held_elsewhere_verdicts() {
        use OrderStatus::*;
        assert_eq!(held_elsewhere_verdict(None, "a"), HeldElsewhere::InProgress);
        assert_eq!(
            held_elsewhere_verdict(Some(("a", Received)), "a"),
            HeldElsewhere::InProgress
        );
        assert_eq!(
            held_elsewhere_verdict(Some(("a", Executed)), "a"),
            HeldElsewhere::Done
        );
        assert_eq!(
            held_elsewhere_verdict(Some(("b", Executed)), "a"),
            HeldElsewhere::Conflict("b".into())
        );
    }
}
