//! Text shown to people: in log lines, answers and error messages. Values
//! from events are escaped so that no value can start a log line of its
//! own, hide the text around it or lower an error's severity, and long ones
//! are cut. A leaf: it imports nothing of the crate, and every layer that
//! shows text (event, order, processor, host, logging, outbox, app) imports
//! it.

use std::borrow::Cow;

use serde_json::Value;

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

/// A short name for a JSON value's type, for error messages.
pub fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// At most `max` characters of `s`, with an ellipsis when cut (for messages).
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max).collect();
        t.push('…');
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
