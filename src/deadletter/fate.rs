//! What becomes of one dead-letter blob, as pure functions: the sweep
//! (`sweep.rs`) performs the reads, the store calls and the moves; these
//! decide each next step from what the last one found, and count the
//! result in the summary.

use std::fmt;

use serde::Serialize;

use super::blobs::Moved;
use super::name::{REPLAYED, UNREADABLE};
use crate::processor::OutcomeKind;
use crate::text::escaped;

/// What a sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SweepSummary {
    /// Blobs looked at.
    pub blobs: u64,
    pub events: u64,
    pub executed: u64,
    pub duplicates: u64,
    pub conflicts: u64,
    pub rejected: u64,
    /// Events answered `retry` or `in_progress`: their blobs stay.
    pub retries: u64,
    /// Blobs left where they are (an event to retry, a store or storage
    /// failure, a name in no documented layout, a blob listed but neither
    /// found nor moved).
    pub unresolved: u64,
    /// Blobs this sweep moved under `replayed/` (one another sweep moved
    /// first is not counted: each blob is moved once).
    pub moved: u64,
    /// Blobs that held no events or were over the size bound: stored as
    /// poison (name, size, reason), moved by this sweep under `unreadable/`.
    pub unreadable: u64,
    /// Blobs not looked at because of `--max-blobs`, the deadline, or a
    /// stop.
    pub not_reached: u64,
    /// Why the sweep stopped early: a store failure no retry can fix (a
    /// right or the schema missing), with the fix.
    pub stopped: Option<String>,
    /// Each blob left, and why.
    pub left: Vec<String>,
}

impl fmt::Display for SweepSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "blobs={} events={} executed={} duplicates={} conflicts={} rejected={} retries={} unresolved={} moved={} unreadable={}",
            self.blobs,
            self.events,
            self.executed,
            self.duplicates,
            self.conflicts,
            self.rejected,
            self.retries,
            self.unresolved,
            self.moved,
            self.unreadable
        )?;
        if self.not_reached > 0 {
            write!(f, " not_reached={}", self.not_reached)?;
        }
        if let Some(why) = &self.stopped {
            write!(f, " stopped: {}", escaped(why))?;
        }
        Ok(())
    }
}

/// Why a blob named in no documented layout is left.
pub const NOT_A_DEAD_LETTER: &str = "not in a documented dead-letter layout (<SUBSCRIPTION>/<yyyy>/<M>/<d>/<H>/<guid>.json or <namespace>/<topic>/<subscription>/…); move it out of the dead-letter container, or replay its events with `order-guard replay FILE`";

/// The first step for a listed blob, before any byte of it is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum First {
    /// Leave it where it is, for this reason.
    Leave(String),
    /// Too large to read: set it aside unread.
    SetAside { why: String },
    /// Read it (within the bound).
    Read,
}

/// From the listing alone: a name in no layout is left, a blob larger
/// than `max` is set aside by its listed size, anything else is read.
pub fn before_reading(in_a_layout: bool, listed_size: u64, max: u64) -> First {
    if !in_a_layout {
        First::Leave(NOT_A_DEAD_LETTER.into())
    } else if listed_size > max {
        First::SetAside {
            why: too_large(listed_size, max),
        }
    } else {
        First::Read
    }
}

/// The reason a blob of `size` bytes is set aside under a bound of `max`.
pub fn too_large(size: u64, max: u64) -> String {
    format!(
        "is {size} bytes, over the {max} a dead letter can hold (DEAD_LETTER_MAX_BLOB_BYTES); not read"
    )
}

/// What became of one blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// Gone before this sweep read it, its copy under `replayed/` or
    /// `unreadable/`: another sweep moved it. Not counted.
    MovedElsewhere,
    /// Left in place, `unresolved`, for the next sweep; `events` it held
    /// (0 when not read).
    Left { events: u64, why: String },
    /// Stored as poison and moved under `unreadable/` (`why`: over the
    /// bound, or no events in it).
    SetAside { why: String, moved: Moved },
    /// Every event got a final outcome; moved under `replayed/`.
    Replayed { events: u64, moved: Moved },
}

/// A blob gone since it was listed: moved by another sweep when its copy
/// is under either folder (a move writes the copy first), else left as a
/// blob this sweep cannot account for.
pub fn when_gone(copy_found: bool) -> Fate {
    if copy_found {
        Fate::MovedElsewhere
    } else {
        Fate::Left {
            events: 0,
            why: format!("listed but not found, and no copy under {REPLAYED} or {UNREADABLE}"),
        }
    }
}

/// After its events were processed: `pending` of `count` did not get a
/// final outcome (answered `retry` or `in_progress`, or not reached before
/// the deadline): the blob stays, else it is moved.
pub fn after_events(count: u64, pending: u64) -> Option<Fate> {
    (pending > 0).then(|| Fate::Left {
        events: count,
        why: format!(
            "{pending} of {count} events not finished (retry, in_progress, past the deadline or stopped)"
        ),
    })
}

/// Count one event's outcome; whether it still needs a redelivery.
pub fn count_event(s: &mut SweepSummary, outcome: OutcomeKind) -> bool {
    s.events += 1;
    match outcome {
        OutcomeKind::Executed => s.executed += 1,
        OutcomeKind::Duplicate => s.duplicates += 1,
        OutcomeKind::Conflict => s.conflicts += 1,
        OutcomeKind::Rejected => s.rejected += 1,
        OutcomeKind::Retry | OutcomeKind::InProgress => {
            s.retries += 1;
            return true;
        }
    }
    false
}

/// Count a blob's fate in the summary (`shown`: its name as logs show it);
/// the note the progress report gives it.
pub fn record(s: &mut SweepSummary, shown: &str, fate: &Fate) -> String {
    if *fate != Fate::MovedElsewhere {
        s.blobs += 1;
    }
    match fate {
        Fate::MovedElsewhere => "gone (moved by another sweep)".into(),
        Fate::Left { why, .. } => {
            s.unresolved += 1;
            s.left.push(format!("{shown}: {why}"));
            format!("left: {why}")
        }
        Fate::SetAside { why, moved } => {
            if *moved == Moved::Now {
                s.unreadable += 1;
            }
            format!("set aside ({why}): moved under {UNREADABLE}")
        }
        Fate::Replayed { moved, .. } => match moved {
            Moved::Now => {
                s.moved += 1;
                format!("moved under {REPLAYED}")
            }
            Moved::Already => "moved by another sweep meanwhile".into(),
        },
    }
}

/// How many events a fate's blob held.
pub fn events_of(fate: &Fate) -> u64 {
    match fate {
        Fate::Left { events, .. } | Fate::Replayed { events, .. } => *events,
        Fate::MovedElsewhere | Fate::SetAside { .. } => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listing_decides_the_first_step() {
        assert_eq!(
            before_reading(false, 10, 100),
            First::Leave(NOT_A_DEAD_LETTER.into())
        );
        // Not in a layout wins over the size: such a blob is never touched.
        assert_eq!(
            before_reading(false, 1_000, 100),
            First::Leave(NOT_A_DEAD_LETTER.into())
        );
        assert_eq!(
            before_reading(true, 100, 100),
            First::Read,
            "at the bound is read"
        );
        assert_eq!(before_reading(true, 0, 100), First::Read);
        assert_eq!(
            before_reading(true, 101, 100),
            First::SetAside {
                why: "is 101 bytes, over the 100 a dead letter can hold (DEAD_LETTER_MAX_BLOB_BYTES); not read".into()
            }
        );
    }

    #[test]
    fn a_gone_blob_is_fine_only_with_its_copy() {
        assert_eq!(when_gone(true), Fate::MovedElsewhere);
        assert_eq!(
            when_gone(false),
            Fate::Left {
                events: 0,
                why: "listed but not found, and no copy under replayed/ or unreadable/".into()
            }
        );
    }

    #[test]
    fn a_blob_with_unfinished_events_stays() {
        assert_eq!(after_events(3, 0), None);
        assert_eq!(after_events(0, 0), None);
        assert_eq!(
            after_events(3, 1),
            Some(Fate::Left {
                events: 3,
                why:
                    "1 of 3 events not finished (retry, in_progress, past the deadline or stopped)"
                        .into()
            })
        );
    }

    #[test]
    fn each_outcome_is_counted_and_only_retries_are_pending() {
        let mut s = SweepSummary::default();
        let pending: Vec<bool> = [
            OutcomeKind::Executed,
            OutcomeKind::Duplicate,
            OutcomeKind::Duplicate,
            OutcomeKind::Conflict,
            OutcomeKind::Rejected,
            OutcomeKind::Retry,
            OutcomeKind::InProgress,
        ]
        .into_iter()
        .map(|o| count_event(&mut s, o))
        .collect();
        assert_eq!(pending, [false, false, false, false, false, true, true]);
        assert_eq!(
            (
                s.events,
                s.executed,
                s.duplicates,
                s.conflicts,
                s.rejected,
                s.retries
            ),
            (7, 1, 2, 1, 1, 2)
        );
        assert_eq!((s.blobs, s.unresolved, s.moved), (0, 0, 0));
    }

    /// Each fate, recorded alone: the note it gets and what it adds.
    #[test]
    fn each_fate_is_counted_once_where_it_belongs() {
        // (fate, note, blobs, unresolved, unreadable, moved)
        let cases = [
            (
                Fate::MovedElsewhere,
                "gone (moved by another sweep)",
                0,
                0,
                0,
                0,
            ),
            (
                Fate::Left {
                    events: 2,
                    why: "w".into(),
                },
                "left: w",
                1,
                1,
                0,
                0,
            ),
            (
                Fate::SetAside {
                    why: "big".into(),
                    moved: Moved::Now,
                },
                "set aside (big): moved under unreadable/",
                1,
                0,
                1,
                0,
            ),
            (
                Fate::SetAside {
                    why: "big".into(),
                    moved: Moved::Already,
                },
                "set aside (big): moved under unreadable/",
                1,
                0,
                0,
                0,
            ),
            (
                Fate::Replayed {
                    events: 1,
                    moved: Moved::Now,
                },
                "moved under replayed/",
                1,
                0,
                0,
                1,
            ),
            (
                Fate::Replayed {
                    events: 1,
                    moved: Moved::Already,
                },
                "moved by another sweep meanwhile",
                1,
                0,
                0,
                0,
            ),
        ];
        for (fate, note, blobs, unresolved, unreadable, moved) in cases {
            let mut s = SweepSummary::default();
            assert_eq!(record(&mut s, "B/1", &fate), note, "{fate:?}");
            assert_eq!(
                (s.blobs, s.unresolved, s.unreadable, s.moved, s.events),
                (blobs, unresolved, unreadable, moved, 0),
                "{fate:?}"
            );
            let left: &[&str] = if unresolved == 1 { &["B/1: w"] } else { &[] };
            assert_eq!(s.left, left, "{fate:?}");
        }
    }

    #[test]
    fn the_events_of_each_fate() {
        assert_eq!(events_of(&Fate::MovedElsewhere), 0);
        assert_eq!(
            events_of(&Fate::Left {
                events: 4,
                why: String::new()
            }),
            4
        );
        assert_eq!(
            events_of(&Fate::SetAside {
                why: String::new(),
                moved: Moved::Now
            }),
            0
        );
        assert_eq!(
            events_of(&Fate::Replayed {
                events: 3,
                moved: Moved::Now
            }),
            3
        );
    }
}
