//! Where announcements go: a Storage Queue or an Event Grid topic, one per
//! deployment, behind one enum (the two traits stay the only seams).
//!
//! Both take a round's events packed: as few messages (a queue) or
//! requests (a topic) as fit the destination's size limit, each a JSON
//! array of events ([`pack`]). One request carries many announcements, so
//! the client's CPU per announcement (an HTTP request to a queue costs
//! about what an order's execution does) is divided by the pack's size.

use std::future::Future;
use std::time::Duration;

use futures::stream::{self, StreamExt};
use tokio::time::Instant;

use super::envelope::{cloud_event, event_grid_event, to_text, Form, Naming};
use super::pack::{packs, Refusal, SendFailure};
use super::queue::{QueueDestination, QueueSettings};
use super::topic::{TopicDestination, TopicSettings};
use crate::store::Announcement;

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

    /// A row as this destination's event, in the form it takes.
    fn event(&self, naming: &Naming, row: &Announcement) -> String {
        let form = match self {
            Destination::Queue(q) => q.form(),
            Destination::Topic(t) => t.form(),
        };
        match form {
            Form::CloudEvent => to_text(&cloud_event(naming, row)),
            Form::EventGrid => to_text(&event_grid_event(naming, row)),
        }
    }

    /// The most bytes one pack's JSON array may hold.
    fn pack_limit(&self) -> usize {
        match self {
            Destination::Queue(q) => q.pack_limit(),
            Destination::Topic(t) => t.pack_limit(),
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
            if let Some(injected) = injected_send_fault().await {
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
                Err(Refusal::Request(format!(
                    "not sent: the round's sends ran past {} ms (half the lease)",
                    within.as_millis()
                )))
            })
    }
}

/// One event's answer within a round, before the round is judged whole.
#[derive(Debug, Clone)]
enum Answer {
    Taken,
    Failed(SendFailure),
    /// Refused alone on a status that may be the request's fault as well
    /// as the event's ([`Refusal::Events`] not `certain`).
    Doubtful(String),
}

/// The answer of an event sent alone, or of each event of a pack refused
/// as a request.
fn answer(result: Result<(), Refusal>) -> Answer {
    match result {
        Ok(()) => Answer::Taken,
        Err(Refusal::Request(message)) => Answer::Failed(SendFailure::waits(message)),
        Err(Refusal::Events {
            message,
            certain: true,
        }) => Answer::Failed(SendFailure::refused(&message)),
        Err(Refusal::Events { message, .. }) => Answer::Doubtful(message),
    }
}

/// `events` sent in packs of at most `limit` bytes through `post`,
/// `in_flight` packs at a time; one answer per event, in their order. A
/// pack refused for its events is posted again one event at a time. An
/// event refused alone on a doubtful status is taken as refused for its
/// content only when the destination took another event of the round;
/// when it took none, the refusals are the request's (a setting that does
/// not match the destination), and every row waits for it to be fixed.
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
    let answers: Vec<Vec<Answer>> =
        stream::iter(packs(events, limit).into_iter().map(|range| async move {
            let pack = &events[range];
            match post(pack).await {
                Err(Refusal::Events { .. }) if pack.len() > 1 => {
                    let mut alone = Vec::with_capacity(pack.len());
                    for e in pack {
                        alone.push(answer(post(std::slice::from_ref(e)).await));
                    }
                    alone
                }
                result => vec![answer(result); pack.len()],
            }
        }))
        .buffered(in_flight.max(1))
        .collect()
        .await;
    let answers: Vec<Answer> = answers.into_iter().flatten().collect();
    let any_taken = answers.iter().any(|a| matches!(a, Answer::Taken));
    answers
        .into_iter()
        .map(|a| match a {
            Answer::Taken => Ok(()),
            Answer::Failed(failure) => Err(failure),
            Answer::Doubtful(message) if any_taken => Err(SendFailure::refused(&message)),
            Answer::Doubtful(message) => Err(SendFailure::waits(format!(
                "{message} (the destination refused every event of the round alike: the request's fault, a setting that does not match it, not the events')"
            ))),
        })
        .collect()
}

/// The `outbox_send` fault point (tests only), on each pack:
/// a status the destination answers (`503`, `413`, …; a 413 judges the
/// pack's events, as both destinations' own 413 does), a slow send (two
/// seconds, then the real one), or a crash.
#[cfg(feature = "failpoints")]
async fn injected_send_fault() -> Option<Result<(), Refusal>> {
    let arg = fail::eval(crate::faults::OUTBOX_SEND, |arg| arg)?;
    match arg.as_deref() {
        Some("slow") => {
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            None
        }
        Some(code) if code.parse::<u16>().is_ok() => {
            let message =
                format!("the destination answered {code} (fault injected at outbox_send)");
            Some(Err(super::queue::refusal(code.parse().ok(), message)))
        }
        _ => Some(Err(Refusal::Request(crate::faults::crash_or_error(
            crate::faults::OUTBOX_SEND,
            arg,
        )))),
    }
}

#[cfg(test)]
mod tests {
    use super::super::pack::{pack, REFUSED};
    use super::*;

    /// The `outbox_send` fault point answers as the chaos audit sets it: a
    /// status as the destination's answer (a 413 refuses the pack's
    /// events), `slow` as the real send two seconds late, anything else
    /// as a failed request. (No other test of this binary posts.)
    #[cfg(feature = "failpoints")]
    #[tokio::test]
    async fn the_send_fault_point_answers_as_it_is_set() {
        async fn set(action: &str) -> (Option<Result<(), Refusal>>, Duration) {
            fail::cfg(crate::faults::OUTBOX_SEND, action).unwrap();
            let started = std::time::Instant::now();
            let got = injected_send_fault().await;
            fail::remove(crate::faults::OUTBOX_SEND);
            (got, started.elapsed())
        }
        assert!(set("off").await.0.is_none());
        let (slow, took) = set("return(slow)").await;
        assert!(slow.is_none() && took >= Duration::from_secs(2), "{took:?}");
        assert!(matches!(
            set("return(413)").await.0,
            Some(Err(Refusal::Events { certain: true, .. }))
        ));
        assert!(matches!(
            set("return(503)").await.0,
            Some(Err(Refusal::Request(m))) if m.contains("answered 503")
        ));
        assert!(matches!(
            set("return(error)").await.0,
            Some(Err(Refusal::Request(m))) if m == "fault injected at outbox_send"
        ));
    }

    fn events(sizes: &[usize]) -> Vec<String> {
        sizes.iter().map(|n| "x".repeat(*n)).collect()
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
    /// pack with it as `refusal` says, and records each post's size.
    async fn judged(
        events: &[String],
        limit: usize,
        refusal: fn(String) -> Refusal,
    ) -> (Vec<Result<(), SendFailure>>, Vec<usize>) {
        let posts = std::sync::Mutex::new(Vec::new());
        let answers = send_packed(events, limit, 2, |pack: &[String]| {
            posts.lock().unwrap().push(pack.len());
            let bad = pack.iter().any(|e| e.contains("bad"));
            async move {
                match bad {
                    true => Err(refusal("refused".into())),
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

    fn too_large(message: String) -> Refusal {
        Refusal::Events {
            message,
            certain: true,
        }
    }

    fn malformed(message: String) -> Refusal {
        Refusal::Events {
            message,
            certain: false,
        }
    }

    #[tokio::test]
    async fn an_event_refused_alone_in_its_pack_is_not_posted_again() {
        // `[a]` fits, `[a,bad]` would not: each event its own pack.
        let (answers, posts) = judged(&named(&["a", "bad"]), 12, too_large).await;
        assert_eq!(posts, vec![1, 1], "one post a pack, none again");
        assert_eq!(answers[0], Ok(()));
        assert!(answers[1].clone().unwrap_err().refused);
    }

    #[tokio::test]
    async fn a_round_goes_in_one_pack_when_it_fits() {
        let (answers, posts) = judged(&named(&["a", "b", "c"]), 1024, too_large).await;
        assert_eq!(answers, vec![Ok(()), Ok(()), Ok(())]);
        assert_eq!(posts, vec![3]);
    }

    #[tokio::test]
    async fn a_pack_refused_for_its_events_is_sent_singly_and_only_the_one_at_fault_is_refused() {
        for refusal in [too_large, malformed] {
            let events = named(&["a", "bad", "c", "d"]);
            // Two packs of two (`[a,bad]` is 25 bytes): the first refused,
            // then sent one event at a time.
            let (answers, mut posts) = judged(&events, 25, refusal).await;
            posts.sort();
            assert_eq!(posts, vec![1, 1, 2, 2]);
            assert_eq!(answers[0], Ok(()));
            let refused = answers[1].clone().unwrap_err();
            assert!(refused.refused, "alone, and others taken: refused");
            assert!(refused.message.starts_with(REFUSED), "{refused:?}");
            assert_eq!(&answers[2..], &[Ok(()), Ok(())]);
        }
    }

    /// A topic's 400 to every event, each alone too: the request's fault
    /// (an input schema or content type the topic was not made with), so
    /// nothing is refused and every row waits for the setting's fix. A
    /// 413 to an event alone is its own, whatever the others got.
    #[tokio::test]
    async fn a_doubtful_refusal_of_every_event_is_the_requests() {
        let (answers, posts) = judged(&named(&["bad1", "bad2", "bad3"]), 1024, malformed).await;
        assert_eq!(posts, vec![3, 1, 1, 1]);
        for a in &answers {
            let failure = a.clone().unwrap_err();
            assert!(!failure.refused, "{failure:?}");
            assert!(
                failure.message.contains("the request's fault"),
                "{failure:?}"
            );
        }
        let (answers, _) = judged(&named(&["bad"]), 1024, malformed).await;
        assert!(
            !answers[0].clone().unwrap_err().refused,
            "alone in its round"
        );
        let (answers, _) = judged(&named(&["bad"]), 1024, too_large).await;
        assert!(
            answers[0].clone().unwrap_err().refused,
            "too large is its own"
        );
    }

    #[tokio::test]
    async fn a_request_refused_fails_its_whole_pack_and_refuses_nothing() {
        let (answers, posts) = judged(&named(&["a", "bad", "c"]), 1024, Refusal::Request).await;
        assert_eq!(posts, vec![3], "not sent again singly");
        for a in answers {
            assert!(!a.unwrap_err().refused);
        }
    }
}
