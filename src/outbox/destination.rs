//! Where announcements go: a Storage Queue or an Event Grid topic, one per
//! deployment, behind one enum (the two traits stay the only seams).

use std::time::Duration;

use futures::stream::{self, StreamExt};
use tokio::time::Instant;

use super::envelope::{cloud_event, event_grid_event, Naming};
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

    /// Send `rows`, one answer each in their order: to a queue a message
    /// each, `in_flight` at a time; to a topic in as few requests as fit.
    /// Nothing is started after `within`, and nothing runs past it: those
    /// rows answer that the round ran out of time (the claim's lease must
    /// not end while its rows are still being sent).
    pub async fn send_all(
        &self,
        naming: &Naming,
        rows: &[Announcement],
        in_flight: usize,
        within: Duration,
    ) -> Vec<Result<(), SendFailure>> {
        let deadline = Instant::now() + within;
        let late = || SendFailure {
            message: format!(
                "not sent: the round's sends ran past {} ms (half the lease)",
                within.as_millis()
            ),
            refused: false,
        };
        match self {
            Destination::Queue(q) => {
                // Each send owns its text: no future borrows a row.
                let texts: Vec<String> = rows
                    .iter()
                    .map(|row| cloud_event(naming, row).to_string())
                    .collect();
                stream::iter(texts.into_iter().map(|text| async move {
                    match tokio::time::timeout_at(deadline, q.send(&text)).await {
                        Ok(sent) => sent,
                        Err(_) => Err(late()),
                    }
                }))
                .buffered(in_flight.max(1))
                .collect()
                .await
            }
            Destination::Topic(t) => {
                let events: Vec<String> = rows
                    .iter()
                    .map(|row| match t.schema() {
                        Schema::EventGrid => event_grid_event(naming, row).to_string(),
                        Schema::CloudEvents => cloud_event(naming, row).to_string(),
                    })
                    .collect();
                match tokio::time::timeout_at(deadline, t.send_all(&events)).await {
                    Ok(answers) => answers,
                    Err(_) => events.iter().map(|_| Err(late())).collect(),
                }
            }
        }
    }
}

/// The `outbox_send` fault point (tests only): a status the destination
/// answers (`503`, `413`, …), a slow send (two seconds, then the real
/// one), or a crash.
#[cfg(feature = "failpoints")]
pub(super) async fn injected_send_fault() -> Option<Result<(), SendFailure>> {
    let arg = fail::eval(crate::faults::OUTBOX_SEND, |arg| arg)?;
    match arg.as_deref() {
        Some("slow") => {
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            None
        }
        Some(code) if code.parse::<u16>().is_ok() => Some(Err(SendFailure {
            message: format!("the destination answered {code} (fault injected at outbox_send)"),
            refused: super::queue::refused_for_good(code.parse::<u16>().ok()),
        })),
        _ => Some(Err(SendFailure {
            message: crate::faults::crash_or_error(crate::faults::OUTBOX_SEND, arg),
            refused: false,
        })),
    }
}
