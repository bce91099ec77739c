//! What a request to the webhook is, and the status each result gets, by
//! Event Grid's rules (pure functions: no I/O, no clock).
//!
//! Event Grid reads a webhook's answer so: 200 to 204 delivered; 400 and
//! 413 never retried, the delivery dead-lettered at once; 401 and 403 never
//! retried; 503 retried after at least 30 s, 408 after 2 min, any other
//! after 10 s. A batch is delivered all or none. So a delivery is answered
//! 200 only when every event in it has a final answer that is durable,
//! 503 when one must come again, and 400 only when the delivery as a whole
//! can never be read (the dead-letter sweep keeps it then).

use serde_json::Value;
use warp::http::StatusCode;

use crate::processor::TriggerResult;

/// `aeg-event-type`: what an Event Grid schema request carries.
pub const EVENT_TYPE_HEADER: &str = "aeg-event-type";
/// The event type of the validation handshake's event.
pub const VALIDATION_EVENT: &str = "Microsoft.EventGrid.SubscriptionValidationEvent";
/// The event type Event Grid sends when a subscription is deleted.
pub const DELETION_EVENT: &str = "Microsoft.EventGrid.SubscriptionDeletedEvent";

/// A request's body, read.
#[derive(Debug, Clone, PartialEq)]
pub enum Delivery {
    /// The validation handshake (Event Grid schema): answered with the code.
    Validation { code: String },
    /// A subscription deleted: nothing to process.
    Deletion,
    /// Events to process: one object (a CloudEvent) or an array of them
    /// (Event Grid schema, or a CloudEvents batch).
    Events(Value),
}

/// Read a request's body (pure): `event_type` is its `aeg-event-type`
/// header. `Err` is why the delivery is poison as a whole (answered 400).
pub fn read(event_type: Option<&str>, body: &[u8]) -> Result<Delivery, String> {
    if body.is_empty() {
        return Err("empty request body: expected an Event Grid delivery (a JSON array of events, or a CloudEvent)".into());
    }
    let text = std::str::from_utf8(body)
        .map_err(|e| format!("request body is not valid JSON: it is not UTF-8 ({e})"))?;
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("request body is not valid JSON: {e}"))?;
    match &value {
        Value::Array(events) if events.is_empty() => {
            return Err("the delivery is an empty array: no event to process".into())
        }
        Value::Array(_) | Value::Object(_) => {}
        other => {
            return Err(format!(
                "the delivery is JSON but not an event or an array of events: got {}",
                crate::text::json_kind(other)
            ))
        }
    }
    let kind = kind(event_type, &value);
    match kind {
        Kind::Validation => {
            let code = only_event(&value)
                .filter(|e| e.get("eventType").and_then(Value::as_str) == Some(VALIDATION_EVENT))
                .and_then(|e| e.pointer("/data/validationCode"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    format!("a validation request holds exactly one {VALIDATION_EVENT} event, with data.validationCode")
                })?;
            Ok(Delivery::Validation {
                code: code.to_string(),
            })
        }
        Kind::Deletion => Ok(Delivery::Deletion),
        Kind::Events => Ok(Delivery::Events(value)),
    }
}

/// What a request is, by its header first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Validation,
    Deletion,
    Events,
}

/// The event of a one-event delivery: a one-element array, or one object.
fn only_event(value: &Value) -> Option<&Value> {
    match value {
        Value::Array(events) if events.len() == 1 => events.first(),
        Value::Array(_) => None,
        one => Some(one),
    }
}

/// What a request is (pure). The `aeg-event-type` header decides when it
/// is there: `Notification` (or any value but the two handshakes) is always
/// events, whatever their types, so an event typed as a handshake cannot
/// hide the orders delivered with it. Without the header (a CloudEvents
/// delivery, or a client of its own) a handshake is only a one-event
/// delivery of that event's type, as Event Grid sends it.
fn kind(event_type: Option<&str>, value: &Value) -> Kind {
    match event_type.map(str::trim) {
        Some(t) if t.eq_ignore_ascii_case("SubscriptionValidation") => Kind::Validation,
        Some(t)
            if t.eq_ignore_ascii_case("SubscriptionDeletion")
                || t.eq_ignore_ascii_case("Unsubscribe") =>
        {
            Kind::Deletion
        }
        Some(_) => Kind::Events,
        None => match only_event(value)
            .and_then(|e| e.get("eventType"))
            .and_then(Value::as_str)
        {
            Some(VALIDATION_EVENT) => Kind::Validation,
            Some(DELETION_EVENT) => Kind::Deletion,
            _ => Kind::Events,
        },
    }
}

/// The status of a processed delivery: 200 when every event's answer is
/// final (executed, duplicate, conflict or rejected, each stored), else
/// 503 so Event Grid delivers the whole batch again (the events already
/// done then answer `duplicate`).
pub fn status(result: &TriggerResult) -> StatusCode {
    if result.needs_redelivery() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processor::{Outcome, OutcomeKind};
    use serde_json::json;

    fn events(v: Value) -> Delivery {
        Delivery::Events(v)
    }

    #[test]
    fn the_validation_handshake_gives_its_code() {
        let body = json!([{
            "id": "v1", "eventType": VALIDATION_EVENT, "subject": "",
            "data": {"validationCode": "512d38b6", "validationUrl": "https://x/validate"},
            "dataVersion": "2", "eventTime": "2026-12-05T10:00:00Z"
        }])
        .to_string();
        let code = Delivery::Validation {
            code: "512d38b6".into(),
        };
        assert_eq!(
            read(Some("SubscriptionValidation"), body.as_bytes()),
            Ok(code.clone())
        );
        assert_eq!(read(None, body.as_bytes()), Ok(code), "by its event type");
        let no_code = json!([{"id": "v1", "eventType": VALIDATION_EVENT, "data": {}}]).to_string();
        assert!(read(Some("SubscriptionValidation"), no_code.as_bytes())
            .unwrap_err()
            .contains("validationCode"));
    }

    #[test]
    fn the_header_decides_and_a_handshake_typed_event_never_hides_a_batch() {
        let order = json!({"id": "e1", "eventType": "Trading.Order.Placed", "data": {}});
        let validation =
            json!({"id": "v", "eventType": VALIDATION_EVENT, "data": {"validationCode": "c"}});
        let deleted = json!({"id": "d", "eventType": DELETION_EVENT, "data": {}});
        for first in [&validation, &deleted] {
            let batch = json!([first, order]);
            let body = batch.to_string();
            assert_eq!(
                read(Some("Notification"), body.as_bytes()),
                Ok(events(batch.clone())),
                "Notification is always events"
            );
            assert_eq!(
                read(None, body.as_bytes()),
                Ok(events(batch.clone())),
                "without the header, only a one-event delivery is a handshake"
            );
            let alone = json!([first]).to_string();
            assert_eq!(
                read(Some("Notification"), alone.as_bytes()),
                Ok(events(json!([first])))
            );
        }
        let mixed = json!([validation, order]).to_string();
        assert!(read(Some("SubscriptionValidation"), mixed.as_bytes())
            .unwrap_err()
            .contains("exactly one"));
        assert_eq!(
            read(None, json!([deleted]).to_string().as_bytes()),
            Ok(Delivery::Deletion)
        );
        assert_eq!(
            read(Some("Unsubscribe"), json!([order]).to_string().as_bytes()),
            Ok(Delivery::Deletion)
        );
    }

    #[test]
    fn events_of_either_schema_are_handed_on_as_they_came() {
        let eg = json!([{"id": "e1", "eventType": "Trading.Order.Placed", "data": {}}]);
        assert_eq!(
            read(Some("Notification"), eg.to_string().as_bytes()),
            Ok(events(eg))
        );
        let ce = json!({"specversion": "1.0", "id": "c1", "type": "T", "source": "/s", "data": {}});
        assert_eq!(
            read(None, ce.to_string().as_bytes()),
            Ok(events(ce.clone()))
        );
        let batch = json!([ce.clone(), ce]);
        assert_eq!(read(None, batch.to_string().as_bytes()), Ok(events(batch)));
        let deleted = json!([{"id": "d", "eventType": DELETION_EVENT, "data": {}}]);
        assert_eq!(
            read(Some("SubscriptionDeletion"), deleted.to_string().as_bytes()),
            Ok(Delivery::Deletion)
        );
    }

    #[test]
    fn a_delivery_that_can_never_be_read_is_poison_as_a_whole() {
        for (body, says) in [
            (&b""[..], "empty"),
            (&b"{not json"[..], "not valid JSON"),
            (&b"\xff\xfe"[..], "UTF-8"),
            (&b"[]"[..], "empty array"),
            (&b"42"[..], "a number"),
            (&b"\"text\""[..], "a string"),
        ] {
            let e = read(None, body).unwrap_err();
            assert!(e.contains(says), "{body:?}: {e}");
        }
    }

    fn result(kinds: &[OutcomeKind]) -> TriggerResult {
        TriggerResult {
            batch: kinds.len() > 1,
            outcomes: kinds
                .iter()
                .map(|k| Outcome {
                    order_id: None,
                    event_id: None,
                    outcome: *k,
                    reason: None,
                    guard: "memory",
                })
                .collect(),
        }
    }

    #[test]
    fn a_delivery_succeeds_only_when_every_event_is_final() {
        use OutcomeKind::*;
        for done in [Executed, Duplicate, Conflict, Rejected] {
            assert_eq!(status(&result(&[done])), StatusCode::OK, "{done:?}");
        }
        assert_eq!(
            status(&result(&[Executed, Duplicate, Rejected])),
            StatusCode::OK
        );
        for again in [Retry, InProgress] {
            assert_eq!(
                status(&result(&[Executed, again])),
                StatusCode::SERVICE_UNAVAILABLE,
                "{again:?}: the whole batch again"
            );
        }
    }
}
