//! Event envelopes: Event Grid schema or CloudEvents 1.0, as an object, a
//! JSON-encoded string (possibly twice), or an array of them.
//!
//! This module turns the trigger value the host hands us into events, and an
//! event into the order payload (`data`). It knows nothing of HTTP, Redis or SQL.

use std::borrow::Cow;

use base64::Engine;
use serde_json::Value;

use crate::order::{json_kind, truncate};

/// How many times a string is decoded before we give up (host encodes at most
/// twice; one more round tolerates a hand-made payload).
const MAX_DECODE_ROUNDS: usize = 3;

/// Most characters of an event id (or type) shown in answers and logs; the
/// stored rejection and the raw event keep it whole.
pub const MAX_SHOWN_ID: usize = 128;

/// An event id (or any other value from the event) as answers and logs show
/// it: escaped ([`escaped`]), at most [`MAX_SHOWN_ID`] characters, marked `…`
/// when cut.
pub fn shown(s: &str) -> String {
    truncate(&escaped(s), MAX_SHOWN_ID)
}

/// Text from an event made safe for one log line: every control character
/// (`\n`, `\r`, `\t`, `\u{1b}` …), every Unicode line or paragraph
/// separator and every bidirectional control (which reorders what a viewer
/// shows) is written as its Rust escape, so no value an event carries can
/// start a line of its own (the Functions host makes each stdout line a log
/// entry; many viewers split at U+2028), hide or reorder the text around it,
/// or drive a terminal. And the word `warn` (any case) is broken by writing
/// its `a` as `\u{61}` (`\u{41}`): the host makes a stderr line a Warning
/// when it holds that word ([`crate::logging::host_severity`]), so an id
/// holding it would lower an error's severity. Text without any of these is
/// returned as it is, without a copy.
pub fn escaped(s: &str) -> Cow<'_, str> {
    escape(s, true)
}

/// [`escaped`] without breaking `warn`: for a whole line whose severity is
/// a warning anyway.
pub fn one_line(s: &str) -> Cow<'_, str> {
    escape(s, false)
}

fn escape(s: &str, break_warn: bool) -> Cow<'_, str> {
    let break_warn = break_warn && holds_warn(s);
    if !break_warn && !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    push_escaped(&mut out, s, break_warn);
    Cow::Owned(out)
}

/// A value as the stable `key=value` tail of a log line shows it: quoted
/// and escaped as a Rust string (`{:?}`), with `warn` broken as in
/// [`escaped`] (`\u{61}` is a Rust string escape, so a reader that unquotes
/// the value gets the text back).
pub struct Quoted<'a>(pub &'a str);

impl std::fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The usual value needs nothing but `{:?}`: no copy on the line's path.
        if !holds_warn(self.0) && !self.0.chars().any(needs_escape) {
            return write!(f, "{:?}", self.0);
        }
        let debug = format!("{:?}", self.0);
        // `{:?}` leaves bidi controls and separators it deems printable as
        // they are: escape whatever it left, as `escaped` does.
        f.write_str(&escaped(&debug))
    }
}

/// Characters [`escaped`] writes as their escape.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            // Line and paragraph separators.
            '\u{2028}' | '\u{2029}'
            // Bidirectional controls: the Arabic letter mark, the implicit
            // marks, the embeddings and overrides, the isolates.
            | '\u{061c}' | '\u{200e}' | '\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2066}'..='\u{2069}'
        )
}

fn holds_warn(s: &str) -> bool {
    s.as_bytes()
        .windows(4)
        .any(|w| w.eq_ignore_ascii_case(b"warn"))
}

fn push_escaped(out: &mut String, s: &str, break_warn: bool) {
    let bytes = s.as_bytes();
    for (i, c) in s.char_indices() {
        if needs_escape(c) {
            // `\n`, `\r`, `\t`, else `\u{…}`: never a character of its own.
            out.extend(c.escape_default());
        } else if break_warn
            && (c == 'a' || c == 'A')
            && i >= 1
            && bytes.len() >= i + 3
            && bytes[i - 1].eq_ignore_ascii_case(&b'w')
            && bytes[i + 1..i + 3].eq_ignore_ascii_case(b"rn")
        {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
}

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
    fn separators_bidi_controls_and_the_severity_word_are_escaped() {
        let cases = [
            ("line separator", "o\u{2028}FORGED", "o\\u{2028}FORGED"),
            ("paragraph separator", "o\u{2029}x", "o\\u{2029}x"),
            ("next line", "o\u{85}x", "o\\u{85}x"),
            ("right-to-left override", "o\u{202e}x", "o\\u{202e}x"),
            ("left-to-right embedding", "o\u{202a}x", "o\\u{202a}x"),
            ("pop directional formatting", "o\u{202c}x", "o\\u{202c}x"),
            ("first strong isolate", "o\u{2068}x", "o\\u{2068}x"),
            ("pop directional isolate", "o\u{2069}x", "o\\u{2069}x"),
            ("right-to-left mark", "o\u{200f}x", "o\\u{200f}x"),
            ("Arabic letter mark", "o\u{61c}x", "o\\u{61c}x"),
            ("the word warn", "o-warn-1", "o-w\\u{61}rn-1"),
            ("the word in capitals", "WARNING", "W\\u{41}RNING"),
            ("the word in mixed case", "fore-wArNed", "fore-w\\u{41}rNed"),
            ("twice", "warnwarn", "w\\u{61}rnw\\u{61}rn"),
        ];
        for (what, raw, want) in cases {
            assert_eq!(escaped(raw), want, "{what}");
            let quoted = Quoted(raw).to_string();
            assert_eq!(quoted, format!("\"{want}\""), "{what}, quoted");
            assert!(
                !crate::logging::host_severity(crate::logging::Stream::Stderr, &quoted)
                    .eq(&crate::logging::HostSeverity::Warning),
                "{what}: the quoted form still reads as a warning"
            );
        }
        // Almost the word is left alone, without a copy.
        for plain in ["war", "wa rn", "w-arn", "arn"] {
            assert!(matches!(escaped(plain), Cow::Borrowed(_)), "{plain}");
        }
        // The quoted tail stays what `{:?}` writes for ordinary text.
        assert_eq!(Quoted("o-1 \"q\"\\").to_string(), "\"o-1 \\\"q\\\"\\\\\"");
    }

    #[test]
    fn values_are_escaped_for_one_log_line() {
        assert!(matches!(escaped("e-1 ok"), Cow::Borrowed("e-1 ok")));
        assert_eq!(
            escaped("e1\nFORGED order o-9 executed"),
            "e1\\nFORGED order o-9 executed"
        );
        assert_eq!(escaped("a\r\tb\u{1b}[31m"), "a\\r\\tb\\u{1b}[31m");
        assert_eq!(escaped("a\u{2028}b\u{85}"), "a\\u{2028}b\\u{85}");
        // Bounded after escaping: the cut cannot split an escape into a raw character.
        assert!(!shown(&"\n".repeat(1000)).contains('\n'));
    }

    #[test]
    fn shown_ids_are_bounded() {
        assert_eq!(shown("e-1"), "e-1");
        let long = "x".repeat(100_000);
        assert_eq!(shown(&long), format!("{}…", "x".repeat(MAX_SHOWN_ID)));
    }

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
