//! What every destination shares: a pack of events (one message, one
//! request) and a destination's answer to it. A leaf: it imports nothing
//! of the outbox, so the destinations and the dispatcher that drives them
//! all import it and none imports another back.
//!
//! A destination reads its own status codes into a [`Refusal`] (the queue
//! in `queue.rs`, the topic in `topic.rs`); what a round makes of the
//! refusals of all its packs is `destination.rs`'s, and whether a row
//! waits or is parked is the dispatcher's ([`SendFailure::refused`],
//! [`parks`]).

use std::ops::Range;

/// How a destination refused one pack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The request or the destination's state, not its events: a
    /// credential, a missing queue or topic, throttling, a 5xx, a network
    /// failure. Every event of the pack waits; none is ever parked for it.
    Request(String),
    /// The destination judged the pack's events: each is sent again alone,
    /// so that only one at fault is refused. `certain`: an event refused
    /// alone so is at fault for sure (a 413: too large). Not certain: the
    /// same status also answers a mistake of the request (a topic's 400
    /// for a content type or an input schema it was not created with), so
    /// an event so refused alone is at fault only when the destination
    /// took another event of the same round.
    Events { message: String, certain: bool },
}

/// Why the send of one event failed, as the dispatcher needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendFailure {
    pub message: String,
    /// The destination refused this event alone, for its own content:
    /// sending it again as it is cannot help. Its message then starts with
    /// [`REFUSED`], which its row keeps, so that a second such refusal
    /// parks it ([`parks`]).
    pub refused: bool,
}

impl SendFailure {
    /// A failure of the request or of the destination's state.
    pub fn waits(message: impl Into<String>) -> SendFailure {
        SendFailure {
            message: message.into(),
            refused: false,
        }
    }

    /// The destination refused this event alone, for its content.
    pub fn refused(message: &str) -> SendFailure {
        SendFailure {
            message: format!("{REFUSED}{message}"),
            refused: true,
        }
    }
}

/// How the message of a refusal of an event's content begins.
pub const REFUSED: &str = "refused for its content: ";

/// Whether a row whose send failed with `failure`, the last failure its
/// row kept being `last_error`, is parked for an operator: when the
/// destination refused it alone for its content twice running. Once may
/// be a refusal misread (a destination's state that answered as for
/// content); twice, and the row would only be refused again. Pure.
pub fn parks(failure: &SendFailure, last_error: Option<&str>) -> bool {
    failure.refused && last_error.is_some_and(|e| e.starts_with(REFUSED))
}

/// The JSON array of `events` (each one event's JSON): one pack, what a
/// queue message's text or a topic request's body holds (for CloudEvents,
/// their JSON batch format).
pub fn pack(events: &[String]) -> String {
    format!("[{}]", events.join(","))
}

/// The ranges of `events` that each fit in one pack of at most `limit`
/// bytes ([`pack`]: `[` + events joined by `,` + `]`), in order; an event
/// too large alone is a range of its own (the destination refuses it).
pub fn packs(events: &[String], limit: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut size = 2;
    for (i, e) in events.iter().enumerate() {
        let added = e.len() + usize::from(i > start);
        if i > start && size + added > limit {
            out.push(start..i);
            start = i;
            size = 2 + e.len();
        } else {
            size += added;
        }
    }
    if start < events.len() {
        out.push(start..events.len());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(sizes: &[usize]) -> Vec<String> {
        sizes.iter().map(|n| "x".repeat(*n)).collect()
    }

    #[test]
    fn packs_are_filled_up_to_the_limit_in_order() {
        // [a,b] = 2 + 3 + 1 + 3 = 9 bytes.
        assert_eq!(packs(&events(&[3, 3]), 9), vec![0..2]);
        assert_eq!(packs(&events(&[3, 3]), 8), vec![0..1, 1..2]);
        assert_eq!(packs(&events(&[3, 3, 3]), 13), vec![0..3]);
        assert_eq!(packs(&events(&[3, 3, 3]), 12), vec![0..2, 2..3]);
        assert_eq!(packs(&events(&[]), 10), Vec::<Range<usize>>::new());
        // Too large alone: its own pack, the rest unaffected; first or
        // not, never after an empty pack.
        assert_eq!(packs(&events(&[2, 50, 2]), 10), vec![0..1, 1..2, 2..3]);
        assert_eq!(packs(&events(&[50, 2]), 10), vec![0..1, 1..2]);
    }

    #[test]
    fn a_pack_is_a_json_array_of_its_events() {
        let events = vec![r#"{"id":"a"}"#.to_string(), r#"{"id":"b"}"#.to_string()];
        let v: serde_json::Value = serde_json::from_str(&pack(&events)).unwrap();
        assert_eq!(v, serde_json::json!([{"id": "a"}, {"id": "b"}]));
        assert_eq!(pack(&events[..1]), r#"[{"id":"a"}]"#);
    }

    #[test]
    fn a_row_parks_on_its_second_refusal_for_content_running() {
        let refused = SendFailure::refused("413: too large");
        let waits = SendFailure::waits("503");
        assert!(refused.message.starts_with(REFUSED));
        assert!(!parks(&refused, None), "the first refusal waits");
        assert!(!parks(&refused, Some("503 from the topic")));
        assert!(parks(&refused, Some(&refused.message)), "the second parks");
        assert!(!parks(&waits, Some(&refused.message)));
        assert!(!parks(&waits, None));
    }
}
