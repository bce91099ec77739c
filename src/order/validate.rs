//! The checks of an order's fields that are not numbers: only documented
//! fields, ids a Functions host passes through unchanged and a store keeps
//! whole.

use serde_json::{Map, Value};

use super::{InvalidOrder, MAX_ID_LEN, ORDER_FIELDS};
use crate::text::{json_kind, truncate};

/// Most unknown field names one refusal names (each shown at most
/// [`crate::text::MAX_SHOWN_ID`] characters long).
const MAX_NAMED_UNKNOWN: usize = 5;

/// Refuse a payload holding any field outside [`ORDER_FIELDS`], whatever its
/// value (`null` too: only a documented optional field's `null` means
/// "absent"). The reason names the fields (a bounded number, each bounded)
/// and lists those this version accepts.
pub(super) fn refuse_unknown_fields(obj: &Map<String, Value>) -> Result<(), InvalidOrder> {
    let unknown: Vec<&String> = obj
        .keys()
        .filter(|k| !ORDER_FIELDS.contains(&k.as_str()))
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    let mut named = unknown
        .iter()
        .take(MAX_NAMED_UNKNOWN)
        .map(|k| format!("{:?}", crate::text::shown(k)))
        .collect::<Vec<_>>()
        .join(", ");
    if unknown.len() > MAX_NAMED_UNKNOWN {
        named.push_str(&format!(" and {} more", unknown.len() - MAX_NAMED_UNKNOWN));
    }
    Err(InvalidOrder(format!(
        "unknown field{} {named} in the order; this version accepts only {} (names are case-sensitive); not executed",
        if unknown.len() == 1 { "" } else { "s" },
        ORDER_FIELDS.join(", ")
    )))
}

pub(super) fn required_id(obj: &Map<String, Value>, field: &str) -> Result<String, InvalidOrder> {
    match obj.get(field) {
        None | Some(Value::Null) => Err(InvalidOrder(format!("{field} is required"))),
        Some(Value::String(s)) if json_net_reads_as_date(s) => Err(InvalidOrder(format!(
            "{field} {:?} looks like a date to the Functions host's JSON parser (Json.NET), which \
             rewrites such strings in its own format before the handler sees them, so this order \
             would not be recognised when it comes back another way (a dead-lettered copy holds the \
             text as sent); use an {field} that does not start with yyyy-MM-ddTHH:mm:ss or /Date(",
            truncate(s, 48)
        ))),
        Some(Value::String(s)) => valid_id(s)
            .map(|()| s.trim().to_string())
            .map_err(|why| InvalidOrder(format!("{field} {why}"))),
        Some(other) => Err(InvalidOrder(format!(
            "{field} must be a string, got {}",
            json_kind(other)
        ))),
    }
}

pub(super) fn valid_id(s: &str) -> Result<(), String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("must not be empty".into());
    }
    // Counted in UTF-16 units, as SQL Server's NVARCHAR(128) counts them.
    let units = t.encode_utf16().count();
    if units > MAX_ID_LEN {
        return Err(format!(
            "is {units} characters (UTF-16 units) long; at most {MAX_ID_LEN} are allowed"
        ));
    }
    if has_control(t) {
        return Err("must not contain control characters".into());
    }
    Ok(())
}

/// Would Json.NET, with its default `DateParseHandling.DateTime`, read this
/// JSON string as a date (and so write it back in its own format)? Its
/// reader tries a string as a date when it is `/Date(…)/` (at least 9
/// characters), or 19 to 40 characters long with a digit first and `T` at
/// index 10, parsing `yyyy-MM-ddTHH:mm:ss[.fff…][Z|±HH:mm]`
/// (Newtonsoft.Json `Utilities/DateTimeUtils.cs`, `TryParseDateTime`, and
/// `DateTimeParser.cs`). This answers yes for every string of that shape,
/// a little more than Json.NET parses (an impossible month, an odd tail):
/// refusing a strange id costs its producer a change, keying an id that the
/// host rewrites can execute an order twice.
pub fn json_net_reads_as_date(s: &str) -> bool {
    if s.starts_with("/Date(") && s.ends_with(")/") && s.len() >= 9 {
        return true;
    }
    let b = s.as_bytes();
    let digit = |i: usize| b.get(i).is_some_and(u8::is_ascii_digit);
    let at = |i: usize, c: u8| b.get(i) == Some(&c);
    (19..=40).contains(&s.encode_utf16().count())
        && (0..4).all(digit)
        && at(4, b'-')
        && (5..7).all(digit)
        && at(7, b'-')
        && (8..10).all(digit)
        && at(10, b'T')
        && (11..13).all(digit)
        && at(13, b':')
        && (14..16).all(digit)
        && at(16, b':')
        && (17..19).all(digit)
}

pub(super) fn has_control(s: &str) -> bool {
    s.chars().any(char::is_control)
}
