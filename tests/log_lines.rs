//! No value an event carries can forge a log line. The
//! Functions host makes every stdout line of the handler a log entry of its
//! own, so an event id of `"e1\nFORGED order o-9 executed"` written raw would
//! be a line saying an order executed. The real binary replays events whose
//! logged fields (event id, order id, reason) carry line breaks and other
//! control characters; every line it prints must be one of its own.

mod common;

use serde_json::{json, Value};

/// What an attacker wants a line of its own to say.
const FORGED: &str = "FORGED order o-9 executed";

/// `order-guard replay` of `deliveries` on the embedded defaults, with every
/// log level on; everything it printed.
fn replay(deliveries: &Value, vars: &[(&str, &str)]) -> String {
    let out = common::replay_binary(deliveries, "trace", vars);
    assert!(out.status.success(), "replay failed: {out:?}");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

use common::eg_event_with_id as event;

fn order(id: &str) -> Value {
    json!({"orderId": id, "accountId": "acc-1", "side": "buy", "symbol": "MSFT", "quantity": "1"})
}

/// Every line holding the forged text also holds the escape that kept it on
/// its line, and no line starts with it.
fn assert_not_forged(output: &str, escape: &str) {
    let holding: Vec<&str> = output.lines().filter(|l| l.contains(FORGED)).collect();
    assert!(
        !holding.is_empty(),
        "the forged text was not logged at all (the test proves nothing): {output}"
    );
    for line in holding {
        assert!(
            !line.trim_start().starts_with(FORGED),
            "a line of the event's own making: {line:?} in\n{output}"
        );
        assert!(
            line.contains(&format!("{escape}{FORGED}")),
            "not escaped: {line:?}"
        );
    }
}

#[test]
fn an_event_id_cannot_forge_a_line() {
    let out = replay(&json!([event(&format!("e1\n{FORGED}"), order("o-1"))]), &[]);
    assert!(out.contains("executed"), "{out}");
    assert_not_forged(&out, "\\n");
}

#[test]
fn an_event_id_of_a_poison_event_cannot_forge_a_line() {
    // Poison (no quantity): logged by the rejection path, with its own line format.
    let out = replay(
        &json!([event(
            &format!("e2\r\n{FORGED}"),
            json!({"orderId": "o-2", "accountId": "a", "side": "buy", "symbol": "X"})
        )]),
        &[],
    );
    assert!(out.contains("rejected"), "{out}");
    assert_not_forged(&out, "\\r\\n");
}

#[test]
fn an_order_id_with_a_line_break_is_refused_not_logged() {
    let out = replay(&json!([event("e3", order(&format!("o-3\n{FORGED}")))]), &[]);
    assert!(
        out.contains("orderId must not contain control characters"),
        "{out}"
    );
    assert!(
        out.lines().all(|l| !l.trim_start().starts_with(FORGED)),
        "{out}"
    );
}

#[test]
fn a_reason_cannot_forge_a_line() {
    // The reason quotes what the event sent: an unknown field's name, an
    // event type, a side.
    let mut unknown = order("o-4");
    unknown[format!("x\n{FORGED}")] = json!(1);
    let mut side = order("o-5");
    side["side"] = json!(format!("b\n{FORGED}"));
    let typed = json!({
        "id": "e6", "eventType": format!("T\u{2028}{FORGED}"), "subject": "s",
        "eventTime": "2025-06-14T09:30:02Z", "dataVersion": "1", "data": order("o-6"),
    });
    let out = replay(
        &json!([event("e4", unknown), event("e5", side), typed]),
        &[("ORDER_EVENT_TYPES", "Trading.Order.Placed")],
    );
    assert!(out.matches("rejected").count() >= 3, "{out}");
    for line in out.lines() {
        assert!(!line.trim_start().starts_with(FORGED), "{line:?} in\n{out}");
    }
    assert!(out.contains(&format!("\\u{{2028}}{FORGED}")), "{out}");
}

/// The per-event line keeps its human form and
/// carries its fields in a stable `key=value` tail, quoted and escaped.
#[test]
fn the_per_event_line_ends_in_a_stable_key_value_tail() {
    let mut poison = order("o-8");
    poison["side"] = json!(format!("b\n{FORGED}"));
    let began = std::time::Instant::now();
    let out = replay(
        &json!([event("e7", order("o-7")), event("e8", poison)]),
        &[],
    );
    let whole_run = began.elapsed();
    let executed = out
        .lines()
        .find(|l| l.contains("order o-7 event e7: executed"))
        .unwrap_or_else(|| panic!("no line for o-7 in\n{out}"));
    let tail = executed.split(" | ").nth(1).expect("a key=value tail");
    assert!(
        tail.starts_with(r#"order_id="o-7" event_id="e7" outcome=executed guard=memory ms="#),
        "{tail}"
    );
    assert!(!tail.contains("reason="), "{tail}");
    // `ms` is the event's own time in milliseconds: some (a first delivery
    // commits to SQLite), and less than the whole process took.
    let ms: f64 = tail
        .split(" ms=")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no ms=<number> in {tail}"));
    assert!(
        ms > 0.0 && ms <= whole_run.as_secs_f64() * 1e3,
        "ms={ms} for an event of a {whole_run:?} run: {tail}"
    );
    // A refused order is logged by the rejection path, not here; a conflict
    // carries its reason in the tail.
    let conflict = replay(
        &json!([
            event("e9", order("o-9")),
            event("e10", {
                let mut other = order("o-9");
                other["quantity"] = json!("2");
                other
            })
        ]),
        &[],
    );
    let line = conflict
        .lines()
        .find(|l| l.contains("event e10: conflict"))
        .unwrap_or_else(|| panic!("no conflict line in\n{conflict}"));
    let tail = line.split(" | ").nth(1).expect("a key=value tail");
    assert!(tail.contains(r#"outcome=conflict"#), "{tail}");
    assert!(
        tail.contains(r#" reason="order id o-9 is already used by a different order"#),
        "{tail}"
    );
}

/// An order id may hold characters that are not control
/// characters (so it is valid) but that a log viewer acts on: a line or
/// paragraph separator (many viewers split there) and the bidirectional
/// controls (which reorder what a reader sees). None of them reaches any
/// line raw, in the human part or the tail; each is written as its escape.
#[test]
fn separators_and_bidi_controls_in_an_order_id_are_escaped_everywhere() {
    let cases = [
        ("line separator", '\u{2028}'),
        ("paragraph separator", '\u{2029}'),
        ("right-to-left override", '\u{202e}'),
        ("left-to-right isolate", '\u{2066}'),
        ("right-to-left mark", '\u{200f}'),
    ];
    let deliveries: Vec<Value> = cases
        .iter()
        .enumerate()
        .map(|(i, (_, c))| event(&format!("e-{i}"), order(&format!("r{i}-{c}{FORGED}"))))
        .collect();
    let out = replay(&json!(deliveries), &[]);
    assert_eq!(out.matches(": executed").count(), cases.len(), "{out}");
    for (what, c) in cases {
        assert!(!out.contains(c), "a raw {what} in the output:\n{out}");
        let escape = c.escape_unicode().to_string();
        let lines: Vec<&str> = out.lines().filter(|l| l.contains(&escape)).collect();
        assert!(
            lines.iter().any(|l| {
                let (human, tail) = l.split_once(" | ").unwrap_or((l, ""));
                human.contains(&format!("{escape}{FORGED}"))
                    && tail.contains(&format!("{escape}{FORGED}"))
            }),
            "no per-event line shows the {what} escaped in both parts: {lines:#?}"
        );
    }
}
