//! What a dead-letter blob holds, as pure functions: the original events,
//! each with every dead-letter field taken off, and those fields as
//! [`Metadata`].
//!
//! The shapes Event Grid writes (Microsoft's pages on dead-lettering):
//! - **Topics and system topics, Event Grid schema**: a JSON array of the
//!   original events, each with `deadLetterReason`, `deliveryAttempts`,
//!   `lastDeliveryOutcome`, `lastHttpStatusCode`, `publishTime` and
//!   `lastDeliveryAttemptTime` added at the top level.
//! - **Topics, CloudEvents 1.0 schema**: the same as lowercase extension
//!   attributes (`deadletterreason`, `deliveryattempts`,
//!   `lastdeliveryoutcome`, `lasthttpstatuscode`, `publishtime`,
//!   `lastdeliveryattempttime`).
//! - **Namespace topics**: one CloudEvent per blob, either flattened (the
//!   event's attributes at the top, beside `deadletterProperties` and
//!   `customDeliveryProperties`) or wrapped (`{"event": {…},
//!   "deadletterProperties": {…}, …}`); the properties are
//!   `deadletterreason`, `deliveryattempts`, `deliveryresult`, `publishutc`,
//!   `deliveryattemptutc`, and some pages call the object `brokerProperties`.
//!
//! A single object is accepted where an array is documented and the
//! reverse. The dead-letter fields are never part of an order's meaning:
//! the event handed on is the one Event Grid first delivered, so its order
//! has the same fingerprint, and a rejection stored from it (keyed by a
//! hash of its text) is the same row as the live delivery's.

use serde_json::{Map, Value};

use crate::text::{json_kind, truncate};

/// Top-level fields Event Grid adds to an Event Grid schema event.
const EVENT_GRID_FIELDS: [&str; 6] = [
    "deadLetterReason",
    "deliveryAttempts",
    "lastDeliveryOutcome",
    "lastHttpStatusCode",
    "publishTime",
    "lastDeliveryAttemptTime",
];

/// Extension attributes Event Grid adds to a CloudEvent (topics), and the
/// names namespace topics use inside `deadletterProperties`.
const CLOUDEVENTS_FIELDS: [&str; 9] = [
    "deadletterreason",
    "deliveryattempts",
    "lastdeliveryoutcome",
    "lasthttpstatuscode",
    "publishtime",
    "lastdeliveryattempttime",
    "deliveryresult",
    "publishutc",
    "deliveryattemptutc",
];

/// Objects namespace topics write beside the event.
const NAMESPACE_OBJECTS: [&str; 3] = [
    "deadletterProperties",
    "brokerProperties",
    "customDeliveryProperties",
];

/// Why Event Grid gave up on an event, as the blob says it. Every field is
/// optional: what a blob leaves out is simply unknown.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Metadata {
    /// `deadLetterReason` (`MaxDeliveryAttemptsExceeded`, `TimeToLiveExceeded`,
    /// `UndeliverableDueToHttpBadRequest`, …).
    pub reason: Option<String>,
    /// `deliveryAttempts`.
    pub attempts: Option<u64>,
    /// `lastDeliveryOutcome` (namespace topics: `deliveryresult`).
    pub last_outcome: Option<String>,
    /// `lastHttpStatusCode`.
    pub last_status: Option<u16>,
    /// `publishTime` (namespace topics: `publishutc`), as written.
    pub publish_time: Option<String>,
    /// `lastDeliveryAttemptTime` (namespace topics: `deliveryattemptutc`).
    pub last_attempt_time: Option<String>,
}

impl Metadata {
    /// The reason as logs and `list` show it.
    pub fn reason_or_unknown(&self) -> &str {
        self.reason.as_deref().unwrap_or("(no reason given)")
    }
}

/// One dead-lettered event: the original event and why it was dead-lettered.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLettered {
    /// The event as Event Grid delivered it, every dead-letter field removed.
    pub event: Value,
    pub metadata: Metadata,
}

/// A blob that holds no dead-lettered events: not UTF-8, not JSON, or not an
/// event or an array of events. Retrying cannot change it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unreadable(pub String);

/// The events of one dead-letter blob, in the blob's order.
pub fn parse_blob(bytes: &[u8]) -> Result<Vec<DeadLettered>, Unreadable> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| Unreadable(format!("the blob is not UTF-8 text ({e})")))?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let value: Value = serde_json::from_str(text)
        .map_err(|e| Unreadable(format!("the blob is not valid JSON ({e})")))?;
    match value {
        Value::Array(items) if items.is_empty() => Err(Unreadable(
            "the blob is an empty array: it holds no event".into(),
        )),
        Value::Array(items) => items
            .into_iter()
            .enumerate()
            .map(|(i, item)| {
                parse_entry(item).map_err(|e| Unreadable(format!("item {i} of the array: {e}")))
            })
            .collect(),
        Value::Object(_) => Ok(vec![parse_entry(value)?]),
        other => Err(Unreadable(format!(
            "the blob holds {}, not a dead-lettered event or an array of them",
            json_kind(&other)
        ))),
    }
}

/// One dead-lettered event (any of the documented shapes), split into the
/// original event and its metadata.
pub fn parse_entry(value: Value) -> Result<DeadLettered, Unreadable> {
    let Value::Object(mut obj) = value else {
        return Err(Unreadable(format!(
            "expected a dead-lettered event (a JSON object), got {}",
            json_kind(&value)
        )));
    };
    let mut metadata = Metadata::default();
    // Namespace topics: the properties in an object of their own.
    for key in NAMESPACE_OBJECTS {
        if let Some(v) = obj.remove(key) {
            if key != "customDeliveryProperties" {
                if let Value::Object(props) = v {
                    read_lowercase(&props, &mut metadata);
                }
            }
        }
    }
    let is_event =
        |o: &Map<String, Value>| o.contains_key("specversion") || o.contains_key("eventType");
    let mut event = if is_event(&obj) {
        obj
    } else {
        match obj.remove("event") {
            // The wrapped form: the event itself, nothing else of the wrapper.
            Some(Value::Object(inner)) if is_event(&inner) => inner,
            Some(Value::Object(_)) => {
                return Err(Unreadable(
                    "its \"event\" member is neither an Event Grid event ('eventType') nor a CloudEvent ('specversion')"
                        .into(),
                ))
            }
            Some(other) => {
                return Err(Unreadable(format!(
                    "its \"event\" member must be an object, got {}",
                    json_kind(&other)
                )))
            }
            None => {
                let keys: Vec<String> = obj.keys().take(8).map(|k| truncate(k, 40)).collect();
                return Err(Unreadable(format!(
                    "not a dead-lettered event: neither an Event Grid event ('eventType'), a CloudEvent ('specversion') nor a namespace topic's {{\"event\": …}} (members: {keys:?})"
                )));
            }
        }
    };
    if event.contains_key("specversion") {
        let taken = take(&mut event, &CLOUDEVENTS_FIELDS);
        read_lowercase(&taken, &mut metadata);
    } else {
        let taken = take(&mut event, &EVENT_GRID_FIELDS);
        let text = |k: &str| taken.get(k).map(as_text);
        fill(&mut metadata.reason, text("deadLetterReason"));
        fill(
            &mut metadata.attempts,
            taken.get("deliveryAttempts").and_then(as_u64),
        );
        fill(&mut metadata.last_outcome, text("lastDeliveryOutcome"));
        fill(
            &mut metadata.last_status,
            taken
                .get("lastHttpStatusCode")
                .and_then(as_u64)
                .and_then(|n| u16::try_from(n).ok()),
        );
        fill(&mut metadata.publish_time, text("publishTime"));
        fill(
            &mut metadata.last_attempt_time,
            text("lastDeliveryAttemptTime"),
        );
    }
    Ok(DeadLettered {
        event: Value::Object(event),
        metadata,
    })
}

/// Remove `keys` from `obj`; what was removed.
fn take(obj: &mut Map<String, Value>, keys: &[&str]) -> Map<String, Value> {
    keys.iter()
        .filter_map(|k| obj.remove(*k).map(|v| (k.to_string(), v)))
        .collect()
}

/// The lowercase names (CloudEvents extensions, namespace properties).
fn read_lowercase(props: &Map<String, Value>, m: &mut Metadata) {
    let text = |k: &str| props.get(k).map(as_text);
    fill(&mut m.reason, text("deadletterreason"));
    fill(
        &mut m.attempts,
        props.get("deliveryattempts").and_then(as_u64),
    );
    fill(&mut m.last_outcome, text("lastdeliveryoutcome"));
    fill(&mut m.last_outcome, text("deliveryresult"));
    fill(
        &mut m.last_status,
        props
            .get("lasthttpstatuscode")
            .and_then(as_u64)
            .and_then(|n| u16::try_from(n).ok()),
    );
    fill(&mut m.publish_time, text("publishtime"));
    fill(&mut m.publish_time, text("publishutc"));
    fill(&mut m.last_attempt_time, text("lastdeliveryattempttime"));
    fill(&mut m.last_attempt_time, text("deliveryattemptutc"));
}

fn fill<T>(slot: &mut Option<T>, value: Option<T>) {
    if slot.is_none() {
        *slot = value;
    }
}

/// A string as it is, anything else as its JSON text (bounded).
fn as_text(v: &Value) -> String {
    match v {
        Value::String(s) => truncate(s, 256),
        other => truncate(&other.to_string(), 256),
    }
}

/// A count written as a number or as a string of digits.
fn as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn original_eg() -> Value {
        json!({"id":"e1","topic":"/subscriptions/s/resourceGroups/rg/providers/Microsoft.EventGrid/topics/orders","subject":"orders/o1","eventType":"Trading.Order.Placed","eventTime":"2025-06-14T09:30:02.118Z","data":{"orderId":"o1","side":"buy","symbol":"MSFT","quantity":25,"accountId":"a1"},"dataVersion":"1.0","metadataVersion":"1"})
    }

    fn original_ce() -> Value {
        json!({"specversion":"1.0","id":"c1","source":"/orders","type":"Trading.Order.Placed","time":"2025-06-14T09:30:02Z","comexampleextension1":"value","datacontenttype":"application/json","data":{"orderId":"o2","side":"sell","symbol":"MSFT","quantity":"1.5","accountId":"a1"}})
    }

    #[test]
    fn event_grid_schema_array() {
        let mut dl = original_eg();
        let o = dl.as_object_mut().unwrap();
        o.insert(
            "deadLetterReason".into(),
            json!("MaxDeliveryAttemptsExceeded"),
        );
        o.insert("deliveryAttempts".into(), json!(30));
        o.insert("lastDeliveryOutcome".into(), json!("TimedOut"));
        o.insert("lastHttpStatusCode".into(), json!(408));
        o.insert("publishTime".into(), json!("2025-06-14T09:30:02.2Z"));
        o.insert(
            "lastDeliveryAttemptTime".into(),
            json!("2025-06-15T09:30:02.9Z"),
        );
        let blob = json!([dl.clone(), dl]).to_string();
        let events = parse_blob(blob.as_bytes()).unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].event, original_eg());
        assert_eq!(
            events[0].metadata,
            Metadata {
                reason: Some("MaxDeliveryAttemptsExceeded".into()),
                attempts: Some(30),
                last_outcome: Some("TimedOut".into()),
                last_status: Some(408),
                publish_time: Some("2025-06-14T09:30:02.2Z".into()),
                last_attempt_time: Some("2025-06-15T09:30:02.9Z".into()),
            }
        );
        // The text the processor hashes for a rejection is the live delivery's.
        assert_eq!(events[0].event.to_string(), original_eg().to_string());
    }

    #[test]
    fn a_single_object_where_an_array_is_documented() {
        let mut dl = original_eg();
        dl["deadLetterReason"] = json!("UndeliverableDueToHttpBadRequest");
        dl["deliveryAttempts"] = json!("1");
        let events = parse_blob(dl.to_string().as_bytes()).unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].event, original_eg());
        assert_eq!(events[0].metadata.attempts, Some(1));
    }

    #[test]
    fn cloudevents_extension_attributes() {
        let mut dl = original_ce();
        let o = dl.as_object_mut().unwrap();
        for (k, v) in [
            ("deadletterreason", json!("TimeToLiveExceeded")),
            ("deliveryattempts", json!(7)),
            ("lastdeliveryoutcome", json!("Busy")),
            ("lasthttpstatuscode", json!(503)),
            ("publishtime", json!("2025-06-14T09:30:02Z")),
            ("lastdeliveryattempttime", json!("2025-06-15T09:30:00Z")),
        ] {
            o.insert(k.into(), v);
        }
        let events = parse_blob(json!([dl]).to_string().as_bytes()).unwrap();
        assert_eq!(events[0].event, original_ce());
        assert_eq!(
            events[0].metadata.reason.as_deref(),
            Some("TimeToLiveExceeded")
        );
        assert_eq!(events[0].metadata.attempts, Some(7));
        assert_eq!(events[0].metadata.last_status, Some(503));
        assert_eq!(
            events[0].metadata.last_attempt_time.as_deref(),
            Some("2025-06-15T09:30:00Z")
        );
    }

    fn namespace_properties() -> Value {
        json!({"deadletterreason":"Undeliverable due to client error","deliveryattempts":3,"deliveryresult":"Unauthorized","publishutc":"2023-06-19T23:28:08.3063899Z","deliveryattemptutc":"2023-06-09T23:28:08.3220145Z"})
    }

    #[test]
    fn namespace_topic_wrapped_and_flattened() {
        let expected = Metadata {
            reason: Some("Undeliverable due to client error".into()),
            attempts: Some(3),
            last_outcome: Some("Unauthorized".into()),
            last_status: None,
            publish_time: Some("2023-06-19T23:28:08.3063899Z".into()),
            last_attempt_time: Some("2023-06-09T23:28:08.3220145Z".into()),
        };
        for props in ["deadletterProperties", "brokerProperties"] {
            let wrapped = json!({"event": original_ce(), "customDeliveryProperties": {"custom-header-1": "value1"}, props: namespace_properties()});
            let mut flat = original_ce();
            flat["customDeliveryProperties"] = json!({"custom-header-1": "value1"});
            flat[props] = namespace_properties();
            for blob in [wrapped, flat] {
                let events = parse_blob(blob.to_string().as_bytes()).unwrap();
                assert_eq!(events.len(), 1);
                assert_eq!(events[0].event, original_ce(), "{props}");
                assert_eq!(events[0].metadata, expected, "{props}");
            }
        }
    }

    #[test]
    fn what_is_not_events_is_unreadable() {
        for (blob, says) in [
            (&b"\xff\xfe"[..], "not UTF-8"),
            (b"{\"id\": ", "not valid JSON"),
            (b"[]", "empty array"),
            (b"42", "holds a number"),
            (
                b"[{\"id\":\"x\"}]",
                "item 0 of the array: not a dead-lettered event",
            ),
            (
                b"[\"text\"]",
                "item 0 of the array: expected a dead-lettered event",
            ),
            (
                b"{\"event\": {\"id\": \"x\"}}",
                "neither an Event Grid event",
            ),
            (b"{\"event\": 3}", "must be an object"),
        ] {
            let e = parse_blob(blob).unwrap_err();
            assert!(e.0.contains(says), "{e} (expected {says:?})");
        }
    }

    /// The order of a replayed event has the fingerprint of its live
    /// delivery, although the blob keeps the publisher's text and the live
    /// delivery went through the host's Json.NET (numbers as doubles, date
    /// strings rewritten).
    #[test]
    fn a_replayed_order_has_the_fingerprint_of_its_live_delivery() {
        use crate::event::parse_envelope;
        use crate::order::Order;
        let original = r#"{"id":"e9","eventType":"Trading.Order.Placed","subject":"orders/o9","eventTime":"2025-06-14T11:30:02.1180000+02:00","dataVersion":"1.0","metadataVersion":"1","topic":"/t",
            "data":{"orderId":"o9","side":"buy","symbol":"MSFT","quantity":0.000001,"limitPrice":431.150,"accountId":"a1","placedAt":"2025-06-14T11:30:02.1180000+02:00"}"#;
        let published = format!(
            r#"{original},"deadLetterReason":"MaxDeliveryAttemptsExceeded","deliveryAttempts":30,"lastDeliveryOutcome":"Busy","lastHttpStatusCode":500,"publishTime":"2025-06-14T09:30:02.2Z","lastDeliveryAttemptTime":"2025-06-15T09:30:02Z"}}"#
        );
        // What the handler got live: Json.NET's doubles and its date format.
        let live = json!({"id":"e9","eventType":"Trading.Order.Placed","subject":"orders/o9","eventTime":"2025-06-14T09:30:02.118Z","dataVersion":"1.0","metadataVersion":"1","topic":"/t",
            "data":{"orderId":"o9","side":"buy","symbol":"MSFT","quantity":serde_json::from_str::<Value>("1E-06").unwrap(),"limitPrice":431.15,"accountId":"a1","placedAt":"2025-06-14T09:30:02.118Z"}});
        let blob = format!("[{published}]");
        let replayed = parse_blob(blob.as_bytes()).unwrap().remove(0).event;
        let fp = |event: &Value| {
            let env = parse_envelope(event).unwrap();
            Order::from_data(&env.data)
                .unwrap()
                .fingerprint()
                .to_string()
        };
        assert_eq!(fp(&replayed), fp(&live));
        // With the publisher's own text on both sides the raw events are
        // equal too, so a stored rejection is the same row.
        let original: Value = serde_json::from_str(&format!("{original}}}")).unwrap();
        assert_eq!(replayed.to_string(), original.to_string());
    }

    #[test]
    fn a_byte_order_mark_is_not_content() {
        let mut text = "\u{feff}".to_string();
        text.push_str(&json!([original_eg()]).to_string());
        assert_eq!(parse_blob(text.as_bytes()).unwrap()[0].event, original_eg());
    }

    #[test]
    fn a_publishers_own_fields_stay() {
        // A CloudEvent's own extension of another name is the publisher's.
        let mut ce = original_ce();
        ce["deliveryattemptsx"] = json!(1);
        let events = parse_blob(ce.to_string().as_bytes()).unwrap();
        assert_eq!(events[0].event["deliveryattemptsx"], json!(1));
        // CloudEvents names are not Event Grid names and the reverse.
        let mut eg = original_eg();
        eg["deadletterreason"] = json!("x");
        let events = parse_blob(eg.to_string().as_bytes()).unwrap();
        assert_eq!(events[0].event["deadletterreason"], json!("x"));
        assert_eq!(events[0].metadata.reason, None);
    }
}
