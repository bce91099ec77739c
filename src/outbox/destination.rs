//! Where announcements go: a Storage Queue or an Event Grid topic, one per
//! deployment, behind one enum (the two traits stay the only seams).
//!
//! Both take a round's events packed: as few messages (a queue) or
//! requests (a topic) as fit the destination's size limit, each a JSON
//! array of events ([`pack`]). One request carries many announcements, so
//! the client's CPU per announcement (an HTTP request to a queue costs
//! about what an order's execution does) is divided by the pack's size.

use std::future::Future;
use std::ops::Range;
use std::time::Duration;

use futures::stream::{self, StreamExt};
use tokio::time::Instant;

use super::envelope::{event_text, Form, Naming};
use super::queue::{QueueDestination, QueueSettings};
use super::topic::{Schema, TopicDestination, TopicSettings};
use crate::store::Announcement;

/// Why a send failed, as the dispatcher needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendFailure {
    pub message: String,
    /// The destination refused this message for good (too large, not
    /// acceptable): sending it again cannot help; it is parked.
    pub refused: bool,
}

/// A pack the destination did not take, and whether it judged the pack's
/// events (too large, malformed) rather than the request (a credential,
/// the service's state): then each event is sent alone, so that only the
/// one at fault is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub failure: SendFailure,
    pub per_event: bool,
}

impl Refusal {
    /// A failure of the request or of the destination, not of its events.
    pub fn of_request(message: String) -> Refusal {
        Refusal {
            failure: SendFailure {
                message,
                refused: false,
            },
            per_event: false,
        }
    }

    /// The destination judged the events of a pack of `events`: one event
    /// alone so judged is refused for good.
    pub fn of_events(message: String, events: usize) -> Refusal {
        Refusal {
            failure: SendFailure {
                message,
                refused: events == 1,
            },
            per_event: true,
        }
    }
}

/// The destination's settings (built by `config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DestinationSettings {
    Queue(QueueSettings),
    Topic(TopicSettings),
}

pub enum Destination {
    Queue(QueueDestination),
    Topic(TopicDestination),
}

impl Destination {
    pub fn new(settings: &DestinationSettings) -> Result<Destination, String> {
        Ok(match settings {
            DestinationSettings::Queue(q) => Destination::Queue(QueueDestination::new(q.clone())),
            DestinationSettings::Topic(t) => Destination::Topic(TopicDestination::new(t.clone())?),
        })
    }

    pub fn describe(&self) -> String {
        match self {
            Destination::Queue(q) => q.describe(),
            Destination::Topic(t) => t.describe(),
        }
    }

    /// Send `rows`, one answer each in their order, packed ([`packs`]),
    /// `in_flight` packs at a time. A pack refused for its events is sent
    /// again one event a pack, so only the event at fault is refused (and
    /// parked) and the others go. Nothing is started after `within`, and
    /// nothing runs past it: those rows answer that the round ran out of
    /// time (the claim's lease must not end while its rows are still being
    /// sent).
    pub async fn send_all(
        &self,
        naming: &Naming,
        rows: &[Announcement],
        in_flight: usize,
        within: Duration,
    ) -> Vec<Result<(), SendFailure>> {
        let deadline = Instant::now() + within;
        let events: Vec<String> = rows.iter().map(|row| self.event(naming, row)).collect();
        let post = |pack| self.post_by(deadline, pack, within);
        send_packed(&events, self.pack_limit(), in_flight, post).await
    }

    /// A row as this destination's event: a CloudEvent, or an Event Grid
    /// schema event for a topic created with that schema.
    fn event(&self, naming: &Naming, row: &Announcement) -> String {
        match self {
            Destination::Topic(t) if t.schema() == Schema::EventGrid => {
                event_text(Form::EventGrid, naming, row)
            }
            _ => event_text(Form::CloudEvent, naming, row),
        }
    }

    /// The most bytes one pack's JSON array may hold.
    fn pack_limit(&self) -> usize {
        match self {
            Destination::Queue(_) => super::queue::MAX_MESSAGE_JSON_BYTES,
            Destination::Topic(_) => super::topic::MAX_REQUEST_BYTES,
        }
    }

    /// Post one pack, given up at `deadline`.
    async fn post_by(
        &self,
        deadline: Instant,
        pack: &[String],
        within: Duration,
    ) -> Result<(), Refusal> {
        let post = async {
            #[cfg(feature = "failpoints")]
            if let Some(injected) = injected_send_fault(pack.len()).await {
                return injected;
            }
            match self {
                Destination::Queue(q) => q.post(pack).await,
                Destination::Topic(t) => t.post(pack).await,
            }
        };
        tokio::time::timeout_at(deadline, post)
            .await
            .unwrap_or_else(|_| {
                Err(Refusal::of_request(format!(
                    "not sent: the round's sends ran past {} ms (half the lease)",
                    within.as_millis()
                )))
            })
    }
}

/// `events` sent in packs of at most `limit` bytes through `post`,
/// `in_flight` packs at a time; one answer per event, in their order. A
/// pack refused for its events is posted again one event at a time.
async fn send_packed<'a, F, Fut>(
    events: &'a [String],
    limit: usize,
    in_flight: usize,
    post: F,
) -> Vec<Result<(), SendFailure>>
where
    F: Fn(&'a [String]) -> Fut,
    Fut: Future<Output = Result<(), Refusal>>,
{
    let post = &post;
    let answers: Vec<Vec<Result<(), SendFailure>>> =
        stream::iter(packs(events, limit).into_iter().map(|range| async move {
            let pack = &events[range];
            match post(pack).await {
                Err(r) if r.per_event && pack.len() > 1 => {
                    let mut alone = Vec::with_capacity(pack.len());
                    for e in pack {
                        alone.push(post(std::slice::from_ref(e)).await.map_err(|r| r.failure));
                    }
                    alone
                }
                answer => {
                    let answer = answer.map_err(|r| r.failure);
                    pack.iter().map(|_| answer.clone()).collect()
                }
            }
        }))
        .buffered(in_flight.max(1))
        .collect()
        .await;
    answers.into_iter().flatten().collect()
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

/// The `outbox_send` fault point (tests only), on each pack of `events`:
/// a status the destination answers (`503`, `413`, …; a 413 judges the
/// pack's events, as both destinations' own 413 does), a slow send (two
/// seconds, then the real one), or a crash.
#[cfg(feature = "failpoints")]
async fn injected_send_fault(events: usize) -> Option<Result<(), Refusal>> {
    let arg = fail::eval(crate::faults::OUTBOX_SEND, |arg| arg)?;
    match arg.as_deref() {
        Some("slow") => {
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            None
        }
        Some(code) if code.parse::<u16>().is_ok() => {
            let message =
                format!("the destination answered {code} (fault injected at outbox_send)");
            Some(Err(if super::queue::refused_for_good(code.parse().ok()) {
                Refusal::of_events(message, events)
            } else {
                Refusal::of_request(message)
            }))
        }
        _ => Some(Err(Refusal::of_request(crate::faults::crash_or_error(
            crate::faults::OUTBOX_SEND,
            arg,
        )))),
    }
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
        // Too large alone: its own pack, the rest unaffected.
        assert_eq!(packs(&events(&[2, 50, 2]), 10), vec![0..1, 1..2, 2..3]);
    }

    #[test]
    fn every_pack_of_a_real_round_fits_its_destination() {
        let round = events(&[700; 3000]);
        for limit in [
            crate::outbox::topic::MAX_REQUEST_BYTES,
            crate::outbox::queue::MAX_MESSAGE_JSON_BYTES,
        ] {
            let ranges = packs(&round, limit);
            assert_eq!(ranges.iter().map(|r| r.len()).sum::<usize>(), round.len());
            for r in ranges {
                assert!(pack(&round[r]).len() <= limit);
            }
        }
    }

    /// A destination that takes any pack without "bad" in it, refuses a
    /// pack with it for its events (as a 413 does), and records each post.
    async fn judged(
        events: &[String],
        limit: usize,
        refusal: fn(String, usize) -> Refusal,
    ) -> (Vec<Result<(), SendFailure>>, Vec<usize>) {
        let posts = std::sync::Mutex::new(Vec::new());
        let answers = send_packed(events, limit, 2, |pack: &[String]| {
            posts.lock().unwrap().push(pack.len());
            let bad = pack.iter().any(|e| e.contains("bad"));
            async move {
                match bad {
                    true => Err(refusal("refused".into(), pack.len())),
                    false => Ok(()),
                }
            }
        })
        .await;
        (answers, posts.into_inner().unwrap())
    }

    fn named(names: &[&str]) -> Vec<String> {
        names
            .iter()
            .map(|n| format!("{{\"id\":\"{n}\"}}"))
            .collect()
    }

    #[tokio::test]
    async fn a_round_goes_in_one_pack_when_it_fits() {
        let (answers, posts) = judged(&named(&["a", "b", "c"]), 1024, Refusal::of_events).await;
        assert_eq!(answers, vec![Ok(()), Ok(()), Ok(())]);
        assert_eq!(posts, vec![3]);
    }

    #[tokio::test]
    async fn a_pack_refused_for_its_events_is_sent_singly_and_only_the_one_at_fault_parks() {
        let events = named(&["a", "bad", "c", "d"]);
        // Two packs of two (`[a,bad]` is 25 bytes): the first refused,
        // then sent one event at a time.
        let (answers, mut posts) = judged(&events, 25, Refusal::of_events).await;
        posts.sort();
        assert_eq!(posts, vec![1, 1, 2, 2]);
        assert_eq!(answers[0], Ok(()));
        let refused = answers[1].clone().unwrap_err();
        assert!(refused.refused, "alone and refused: parked");
        assert_eq!(&answers[2..], &[Ok(()), Ok(())]);
    }

    #[tokio::test]
    async fn a_request_refused_fails_its_whole_pack_and_parks_nothing() {
        let (answers, posts) = judged(&named(&["a", "bad", "c"]), 1024, |m, _| {
            Refusal::of_request(m)
        })
        .await;
        assert_eq!(posts, vec![3], "not sent again singly");
        for a in answers {
            assert!(!a.unwrap_err().refused);
        }
    }

    #[test]
    fn a_pack_is_a_json_array_of_its_events() {
        let events = vec![r#"{"id":"a"}"#.to_string(), r#"{"id":"b"}"#.to_string()];
        let v: serde_json::Value = serde_json::from_str(&pack(&events)).unwrap();
        assert_eq!(v, serde_json::json!([{"id": "a"}, {"id": "b"}]));
        assert_eq!(pack(&events[..1]), r#"[{"id":"a"}]"#);
    }
}
