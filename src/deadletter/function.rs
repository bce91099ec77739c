//! The `DeadLetterSweep` timer function (`DeadLetterSweep/function.json`):
//! what the host's invocation of it looks like and what it answers. The
//! host routes `POST /DeadLetterSweep` here; this module owns the binding
//! and the answer, [`sweep`](super::sweep) does the work.
//!
//! The host sends `{"Data": {"timer": {"Schedule": …, "ScheduleStatus": …,
//! "IsPastDue": …}}, "Metadata": {…}}`; nothing in it changes what the sweep
//! does. The answer is an InvokeResponse (`Outputs`, `Logs`, `ReturnValue`):
//! 200 with the summary, also when some blobs stay for the next sweep (a
//! timer is never retried by the host; the next tick is the retry); 500
//! when the container could not even be listed, so the invocation shows as
//! failed in the host's logs. Without `DEAD_LETTER_STORAGE` the sweep is
//! off and says so (200).
//!
//! With an outbox destination the same tick then sends what the outbox
//! holds (`ReturnValue.outbox`): on plans that scale to zero, the timer is
//! what starts an instance when no event does, so announcements left by a
//! dead instance, a command or an operator's retry go within its schedule.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::blobs::Container;
use super::sweep::{sweep, Silent, SweepOptions, SweepSummary};
use crate::outbox::Dispatcher;
use crate::processor::Processor;

/// The function's folder name and request path.
pub const FUNCTION_NAME: &str = "DeadLetterSweep";
/// The trigger's `name` in `DeadLetterSweep/function.json`.
pub const BINDING_NAME: &str = "timer";
/// How long one sweep may run: under host.json's `functionTimeout` (5 min),
/// with a minute for the event in flight and the answer.
pub const SWEEP_DEADLINE: Duration = Duration::from_secs(240);
/// How long one tick may spend sending the outbox (after the sweep, inside
/// the same `functionTimeout`).
pub const OUTBOX_DEADLINE: Duration = Duration::from_secs(30);

/// The sweep as a function of this handler.
pub struct SweepFunction {
    processor: Arc<Processor>,
    container: Option<Container>,
    deadline: Duration,
    /// One sweep at a time in this process (another process may sweep at
    /// once: that is safe, this only saves the duplicate work).
    running: tokio::sync::Mutex<()>,
    /// The outbox's dispatcher, drained at each tick (`None`: no destination).
    outbox: Option<Arc<Dispatcher>>,
}

impl SweepFunction {
    /// `container` `None`: off (no `DEAD_LETTER_STORAGE`).
    pub fn new(processor: Arc<Processor>, container: Option<Container>) -> SweepFunction {
        SweepFunction {
            processor,
            container,
            deadline: SWEEP_DEADLINE,
            running: tokio::sync::Mutex::new(()),
            outbox: None,
        }
    }

    /// Also send what the outbox holds at each tick: on plans
    /// that scale to zero the timer starts an instance when no event does.
    pub fn with_outbox(mut self, outbox: Option<Arc<Dispatcher>>) -> SweepFunction {
        self.outbox = outbox;
        self
    }

    /// Answer one invocation: (HTTP status, InvokeResponse body): the
    /// sweep's, then, with an outbox, what it sent (bounded like the sweep).
    pub async fn invoke(&self, body: &[u8]) -> (u16, Value) {
        let (status, mut answer) = self.sweep_invocation(body).await;
        let Some(outbox) = &self.outbox else {
            return (status, answer);
        };
        if status == 400 {
            return (status, answer);
        }
        let (line, figure) = match tokio::time::timeout(OUTBOX_DEADLINE, outbox.drain()).await {
            Ok(Ok(sent)) => (
                format!("{FUNCTION_NAME}: outbox: {sent} announcements sent"),
                json!({"sent": sent}),
            ),
            Ok(Err(e)) => (
                format!("{FUNCTION_NAME}: outbox: not drained ({e}); the serving instances go on trying"),
                json!({"error": e.to_string()}),
            ),
            Err(_) => (
                format!(
                    "{FUNCTION_NAME}: outbox: still sending after {} s; the rest goes at the next tick",
                    OUTBOX_DEADLINE.as_secs()
                ),
                json!({"timedOut": true}),
            ),
        };
        log::info!("{line}");
        if let Some(logs) = answer["Logs"].as_array_mut() {
            logs.push(Value::String(line));
        }
        answer["ReturnValue"]["outbox"] = figure;
        (status, answer)
    }

    async fn sweep_invocation(&self, body: &[u8]) -> (u16, Value) {
        let answer = |status: u16, log: String, ret: Value| {
            (
                status,
                json!({"Outputs": {}, "Logs": [log], "ReturnValue": ret}),
            )
        };
        let parsed: Result<Value, _> = serde_json::from_slice(body);
        let has_data = parsed
            .as_ref()
            .ok()
            .and_then(Value::as_object)
            .is_some_and(|o| o.keys().any(|k| k.eq_ignore_ascii_case("Data")));
        if !has_data {
            let message = format!("request body is not a host invocation of {FUNCTION_NAME}: expected a JSON object with \"Data\" (the timer binding, \"{BINDING_NAME}\")");
            log::warn!("invocation refused (400): {message}");
            return answer(400, message.clone(), json!({"error": message}));
        }
        let Some(container) = &self.container else {
            let message = format!("{FUNCTION_NAME} is off: DEAD_LETTER_STORAGE is not set (give the dead-letter storage account's connection string or the container's URL to replay dead-lettered orders)");
            log::info!("{message}");
            return answer(
                200,
                message.clone(),
                json!({"sweep": "off", "reason": message}),
            );
        };
        let Ok(_one) = self.running.try_lock() else {
            let message = format!("{FUNCTION_NAME}: a sweep is already running in this instance; this one did nothing");
            log::info!("{message}");
            return answer(
                200,
                message.clone(),
                json!({"sweep": "skipped", "reason": message}),
            );
        };
        let options = SweepOptions {
            prefix: None,
            max_blobs: None,
            deadline: Some(self.deadline),
        };
        log::info!("{FUNCTION_NAME}: sweeping {}", container.describe());
        match sweep(&self.processor, container, &options, &Silent).await {
            Ok(summary) => {
                let line = format!("{FUNCTION_NAME}: {summary}");
                // A sweep stopped by a missing right or schema needs an
                // operator; blobs left or set aside deserve a look.
                let level = if summary.stopped.is_some() {
                    log::Level::Error
                } else if summary.unresolved > 0 || summary.unreadable > 0 {
                    log::Level::Warn
                } else {
                    log::Level::Info
                };
                log::log!(level, "{line}");
                for left in &summary.left {
                    log::warn!("{FUNCTION_NAME}: {left}");
                }
                let shown = shown_left(summary);
                answer(200, line, json!({"sweep": "done", "summary": shown}))
            }
            Err(e) => {
                let message = format!("{FUNCTION_NAME}: {e}");
                log::error!("{message}");
                answer(500, message.clone(), json!({"error": message}))
            }
        }
    }
}

/// Blobs left that the timer's answer names, at most: every one is logged,
/// and `dead-letters list` counts them; a sweep that left thousands must
/// not answer the host with all their names.
pub const LEFT_SHOWN: usize = 20;

/// `summary` as the timer answers it: its first [`LEFT_SHOWN`] blobs left,
/// and how many more there were (`leftNotShown`).
pub fn shown_left(mut summary: SweepSummary) -> Value {
    let more = summary.left.len().saturating_sub(LEFT_SHOWN);
    summary.left.truncate(LEFT_SHOWN);
    let mut value = serde_json::to_value(&summary).unwrap_or(Value::Null);
    if let Some(o) = value.as_object_mut() {
        o.insert("leftNotShown".into(), json!(more));
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sweep that left many blobs answers the host with a few of their
    /// names and the count of the rest (each is logged).
    #[test]
    fn the_timer_answer_names_at_most_a_few_blobs_left() {
        let summary = SweepSummary {
            unresolved: 1000,
            left: (0..1000).map(|i| format!("B/{i}: w")).collect(),
            ..SweepSummary::default()
        };
        let shown = shown_left(summary);
        assert_eq!(shown["left"].as_array().unwrap().len(), LEFT_SHOWN);
        assert_eq!(shown["left"][0], "B/0: w");
        assert_eq!(shown["leftNotShown"], 1000 - LEFT_SHOWN);
        assert_eq!(shown["unresolved"], 1000);
        let few = shown_left(SweepSummary {
            left: vec!["B/1: w".into()],
            ..SweepSummary::default()
        });
        assert_eq!(
            (few["left"].as_array().unwrap().len(), &few["leftNotShown"]),
            (1, &json!(0))
        );
    }
}
