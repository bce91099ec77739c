//! Event envelopes: Event Grid schema or CloudEvents 1.0, as an object, a
//! JSON-encoded string (possibly twice), or an array of them.
//!
//! This module turns the trigger value the host hands us into events, and an
//! event into the order payload (`data`). It knows nothing of HTTP, Redis or SQL.

use std::borrow::Cow;

use base64::Engine;
use serde_json::Value;

use crate::text::{json_kind, truncate};

/// How many times a string is decoded before we give up (host encodes at most
/// twice; one more round tolerates a hand-made payload).
const MAX_DECODE_ROUNDS: usize = 3;

/// Refuse an event whose type is not in `allowed` (`None`: every type is an
/// order). Types compare exactly, as Event Grid filters them.
pub fn check_type(event_type: &str, allowed: Option<&[String]>) -> Result<(), InvalidEvent> {
    match allowed {
        Some(types) if !types.iter().any(|t| t == event_type) => Err(InvalidEvent(format!(
            "event type {:?} is not an order event type (ORDER_EVENT_TYPES: {}); not executed",
            truncate(event_type, 64),
            truncate(&types.join(","), 256)
        ))),
        _ => Ok(()),
    }
}

/// Which envelope an event came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schema {
    EventGrid,
    CloudEvents,
}

impl Schema {
    pub fn as_str(self) -> &'static str {
        match self {
            Schema::EventGrid => "eventgrid",
            Schema::CloudEvents => "cloudevents",
        }
    }
}

/// Why a trigger value or event is not usable. Retrying cannot fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidEvent(pub String);

/// The trigger value, normalized: one event, or a batch (all-or-none).
#[derive(Debug, Clone, PartialEq)]
pub enum Delivery {
    Single(Value),
    Batch(Vec<Value>),
}

/// Normalize `Data.eventGridEvent` per docs/host-protocol.md ("One invocation"): object → one event;
/// array → a batch; string → decode and repeat; anything else → invalid.
pub fn normalize(mut value: Value) -> Result<Delivery, InvalidEvent> {
    for _ in 0..=MAX_DECODE_ROUNDS {
        match value {
            Value::Object(_) => return Ok(Delivery::Single(value)),
            Value::Array(items) => return Ok(Delivery::Batch(items)),
            Value::String(s) => {
                value = serde_json::from_str(&s).map_err(|e| {
                    InvalidEvent(format!(
                        "the event is a string that is not JSON ({e}): {:?}",
                        truncate(&s, 80)
                    ))
                })?;
            }
            other => {
                return Err(InvalidEvent(format!(
                    "the event must be a JSON object (or a string or array of them), got {}",
                    json_kind(&other)
                )))
            }
        }
    }
    Err(InvalidEvent(format!(
        "the event is still a string after {MAX_DECODE_ROUNDS} rounds of JSON decoding"
    )))
}

/// One event's envelope, checked, with its order payload decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope<'a> {
    pub schema: Schema,
    pub event_id: String,
    /// `eventType` (Event Grid) or `type` (CloudEvents).
    pub event_type: String,
    /// The order payload (`data`): borrowed from the event, or decoded when
    /// it arrived as a string or as `data_base64`.
    pub data: Cow<'a, Value>,
}

/// Check an event's envelope and extract its `data`.
pub fn parse_envelope(event: &Value) -> Result<Envelope<'_>, InvalidEvent> {
    let obj = event.as_object().ok_or_else(|| {
        InvalidEvent(format!(
            "each event must be a JSON object, got {}",
            json_kind(event)
        ))
    })?;
    let schema = if obj.contains_key("specversion") {
        Schema::CloudEvents
    } else if obj.contains_key("eventType") {
        Schema::EventGrid
    } else {
        return Err(InvalidEvent(
            "not an Event Grid or CloudEvents event: it has neither 'eventType' (Event Grid schema) nor 'specversion' (CloudEvents 1.0)"
                .into(),
        ));
    };
    let text = |key: &str| -> Result<String, InvalidEvent> {
        match obj.get(key) {
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.clone()),
            Some(Value::String(_)) => Err(InvalidEvent(format!(
                "{} event: '{key}' must not be empty",
                schema.as_str()
            ))),
            Some(other) => Err(InvalidEvent(format!(
                "{} event: '{key}' must be a string, got {}",
                schema.as_str(),
                json_kind(other)
            ))),
            None => Err(InvalidEvent(format!(
                "{} event: '{key}' is required",
                schema.as_str()
            ))),
        }
    };
    let event_id = text("id")?;
    let event_type;
    let data = match schema {
        Schema::EventGrid => {
            event_type = text("eventType")?;
            obj.get("data").map(Cow::Borrowed)
        }
        Schema::CloudEvents => {
            let version = text("specversion")?;
            if version != "1.0" {
                return Err(InvalidEvent(format!(
                    "cloudevents event: specversion must be \"1.0\", got {:?}",
                    truncate(&version, 20)
                )));
            }
            text("source")?;
            event_type = text("type")?;
            match (obj.get("data"), obj.get("data_base64")) {
                // CloudEvents 1.0 JSON format §3.1: the two are mutually
                // exclusive. Which one the publisher meant cannot be known.
                (Some(_), Some(_)) => {
                    return Err(InvalidEvent(
                        "cloudevents event has both 'data' and 'data_base64'; the CloudEvents JSON format allows one of them, not both (which one holds the order cannot be known)"
                            .into(),
                    ))
                }
                (Some(d), None) => Some(Cow::Borrowed(d)),
                (None, Some(Value::String(b64))) => Some(Cow::Owned(decode_base64_data(b64)?)),
                (None, Some(other)) => {
                    return Err(InvalidEvent(format!(
                        "cloudevents event: 'data_base64' must be a string, got {}",
                        json_kind(other)
                    )))
                }
                (None, None) => None,
            }
        }
    };
    let data = match data {
        None => None,
        Some(d) if d.is_null() => None,
        Some(d) => Some(d),
    };
    let data = match data {
        None => {
            return Err(InvalidEvent(format!(
                "{} event {:?} has no 'data': the order payload is missing",
                schema.as_str(),
                truncate(&event_id, 64)
            )))
        }
        // Custom topics may carry `data` as a string holding the JSON object.
        Some(d) => match d.as_ref() {
            Value::String(s) => Cow::Owned(serde_json::from_str(s).map_err(|e| {
                InvalidEvent(format!(
                    "event 'data' is a string that is not JSON ({e}): {:?}",
                    truncate(s, 80)
                ))
            })?),
            _ => d,
        },
    };
    Ok(Envelope {
        schema,
        event_id,
        event_type,
        data,
    })
}

fn decode_base64_data(b64: &str) -> Result<Value, InvalidEvent> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|e| InvalidEvent(format!("cloudevents 'data_base64' is not base64: {e}")))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| InvalidEvent(format!("cloudevents 'data_base64' does not hold JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn eg() -> Value {
        json!({"id":"e1","eventType":"Trading.Order.Placed","subject":"orders/o1","eventTime":"2025-06-14T09:30:02Z","data":{"orderId":"o1"},"dataVersion":"1.0"})
    }

    #[test]
    fn normalizes_object_string_double_string_and_array() {
        let obj = eg();
        let once = Value::String(obj.to_string());
        let twice = Value::String(once.to_string());
        for v in [obj.clone(), once, twice] {
            assert_eq!(normalize(v).unwrap(), Delivery::Single(obj.clone()));
        }
        let arr = json!([eg(), eg()]);
        assert_eq!(
            normalize(Value::String(arr.to_string())).unwrap(),
            Delivery::Batch(vec![eg(), eg()])
        );
        assert!(matches!(normalize(arr).unwrap(), Delivery::Batch(v) if v.len() == 2));
    }

    #[test]
    fn refuses_numbers_and_non_json_strings() {
        assert!(normalize(json!(42)).unwrap_err().0.contains("got a number"));
        assert!(normalize(json!("not json"))
            .unwrap_err()
            .0
            .contains("string that is not JSON"));
        let deep = (0..6).fold(eg(), |v, _| Value::String(v.to_string()));
        assert!(normalize(deep).unwrap_err().0.contains("still a string"));
    }

    #[test]
    fn reads_both_schemas() {
        let event = eg();
        let e = parse_envelope(&event).unwrap();
        assert_eq!((e.schema, e.event_id.as_str()), (Schema::EventGrid, "e1"));
        let ce = json!({"specversion":"1.0","id":"c1","source":"/t","type":"Trading.Order.Placed","data":{"orderId":"o1"}});
        let e = parse_envelope(&ce).unwrap();
        assert_eq!(e.schema, Schema::CloudEvents);
        assert_eq!(*e.data, json!({"orderId":"o1"}));
        let b64 = base64::engine::general_purpose::STANDARD.encode(br#"{"orderId":"o2"}"#);
        let ce = json!({"specversion":"1.0","id":"c2","source":"/t","type":"T","data_base64":b64});
        assert_eq!(*parse_envelope(&ce).unwrap().data, json!({"orderId":"o2"}));
    }

    #[test]
    fn data_and_data_base64_together_are_refused() {
        let b64 = base64::engine::general_purpose::STANDARD.encode(br#"{"orderId":"o2"}"#);
        for data in [json!({"orderId": "o1"}), Value::Null] {
            let ce = json!({"specversion":"1.0","id":"c3","source":"/t","type":"T","data":data,"data_base64":b64});
            let e = parse_envelope(&ce).unwrap_err();
            assert!(e.0.contains("both 'data' and 'data_base64'"), "{e}");
        }
    }

    #[test]
    fn only_allowed_types_pass_when_a_list_is_set() {
        let allowed = vec![
            "Trading.Order.Placed".to_string(),
            "Order.Placed".to_string(),
        ];
        assert!(check_type("Order.Cancelled", None).is_ok());
        assert!(check_type("Order.Placed", Some(&allowed)).is_ok());
        for bad in ["Order.Cancelled", "order.placed", "Trading.Order.Placed "] {
            let e = check_type(bad, Some(&allowed)).unwrap_err();
            assert!(
                e.0.starts_with(&format!("event type {bad:?} is not an order event type (ORDER_EVENT_TYPES: Trading.Order.Placed,Order.Placed)")),
                "{e}"
            );
        }
        let long = "T".repeat(100_000);
        assert!(check_type(&long, Some(&allowed)).unwrap_err().0.len() < 400);
    }

    /// Each character class a log viewer acts on, in the human form and in
    /// the quoted tail alike.
    #[test]
    fn the_event_type_is_kept() {
        assert_eq!(
            parse_envelope(&eg()).unwrap().event_type,
            "Trading.Order.Placed"
        );
        let ce =
            json!({"specversion":"1.0","id":"c1","source":"/t","type":"Order.Cancelled","data":{}});
        assert_eq!(parse_envelope(&ce).unwrap().event_type, "Order.Cancelled");
    }

    #[test]
    fn decodes_data_held_as_a_string() {
        let mut e = eg();
        e["data"] = Value::String(r#"{"orderId":"o9"}"#.into());
        assert_eq!(*parse_envelope(&e).unwrap().data, json!({"orderId":"o9"}));
    }

    #[test]
    fn explains_what_is_missing() {
        let mut e = eg();
        e.as_object_mut().unwrap().remove("data");
        assert!(parse_envelope(&e).unwrap_err().0.contains("has no 'data'"));
        let ce = json!({"id":"c1","source":"/t","type":"T","data":{}});
        assert!(parse_envelope(&ce)
            .unwrap_err()
            .0
            .contains("neither 'eventType'"));
        let ce = json!({"specversion":"0.3","id":"c1","source":"/t","type":"T","data":{}});
        assert!(parse_envelope(&ce).unwrap_err().0.contains("specversion"));
        let mut e = eg();
        e["id"] = json!("");
        assert!(parse_envelope(&e)
            .unwrap_err()
            .0
            .contains("'id' must not be empty"));
    }
}
