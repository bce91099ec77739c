//! Log lines reach the Functions host at their own
//! severity. The host makes every stdout line Information and every stderr
//! line Warning when it contains "warn" (any case), else Error
//! (`order_guard::logging::host_severity`, the host's rule). The real
//! binary's two streams are read apart and each line classified by that
//! rule.

mod common;

use order_guard::logging::{host_severity, HostSeverity, Stream};
use serde_json::{json, Value};

/// Each line the binary printed, with the stream it came on.
fn replay(deliveries: &Value, vars: &[(&str, &str)]) -> (Vec<(Stream, String)>, bool) {
    let out = common::replay_binary(deliveries, "info", vars);
    let lines = |stream, bytes: &[u8]| {
        String::from_utf8_lossy(bytes)
            .lines()
            .map(|l| (stream, l.to_string()))
            .collect::<Vec<_>>()
    };
    let mut all = lines(Stream::Stdout, &out.stdout);
    all.extend(lines(Stream::Stderr, &out.stderr));
    (all, out.status.success())
}

use common::eg_event_with_id as event;

fn order(id: &str, quantity: &str) -> Value {
    json!({"orderId": id, "accountId": "acc-1", "side": "buy", "symbol": "MSFT", "quantity": quantity})
}

/// The severity the host gives the one line holding `needle`.
fn severity_of(lines: &[(Stream, String)], needle: &str) -> HostSeverity {
    let holding: Vec<_> = lines.iter().filter(|(_, l)| l.contains(needle)).collect();
    assert!(!holding.is_empty(), "no line holds {needle:?}: {lines:#?}");
    let severities: Vec<HostSeverity> = holding
        .iter()
        .map(|(stream, line)| host_severity(*stream, line))
        .collect();
    assert!(
        severities.windows(2).all(|w| w[0] == w[1]),
        "lines holding {needle:?} differ in severity: {holding:#?}"
    );
    severities[0]
}

/// Every record's level tag matches the severity the host gives its line.
fn assert_levels_match(lines: &[(Stream, String)]) {
    for (stream, line) in lines {
        let want = if line.contains(" ERROR ") {
            HostSeverity::Error
        } else if line.contains(" WARN ") {
            HostSeverity::Warning
        } else if line.contains(" INFO ") || line.contains(" DEBUG ") {
            HostSeverity::Information
        } else {
            continue;
        };
        assert_eq!(
            host_severity(*stream, line),
            want,
            "{stream:?} line {line:?}"
        );
    }
}

#[test]
fn executed_is_information_conflict_and_poison_are_warnings() {
    let (lines, ok) = replay(
        &json!([
            event("e-1", order("o-1", "1")),
            event("e-2", order("o-1", "2")),
            event("e-3", json!({"orderId": "o-2"})),
        ]),
        &[],
    );
    assert!(ok, "replay failed: {lines:#?}");
    assert_eq!(
        severity_of(&lines, "outcome=executed"),
        HostSeverity::Information
    );
    assert_eq!(
        severity_of(&lines, "outcome=conflict"),
        HostSeverity::Warning
    );
    assert_eq!(
        severity_of(&lines, "(order o-2): rejected"),
        HostSeverity::Warning
    );
    assert_eq!(
        severity_of(&lines, "deliveries=3"),
        HostSeverity::Information
    );
    assert_levels_match(&lines);
}

/// `event` replayed against a Redis that refuses connections, under the
/// policy that answers `retry` without it; the lines, the run having failed.
fn replay_without_its_guard(event: Value) -> Vec<(Stream, String)> {
    let port = common::free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let (lines, ok) = replay(
        &json!([event]),
        &[
            ("REDIS_URL", &url),
            ("GUARD_UNAVAILABLE", "retry"),
            ("REDIS_TIMEOUT_MS", "100"),
        ],
    );
    assert!(
        !ok,
        "the delivery cannot succeed without its guard: {lines:#?}"
    );
    lines
}

#[test]
fn a_retry_is_an_error() {
    // Without its guard, under the `retry` policy: an error-level line.
    let lines = replay_without_its_guard(event("e-1", order("o-1", "1")));
    assert_eq!(severity_of(&lines, "outcome=retry"), HostSeverity::Error);
    assert!(
        !lines.iter().any(|(_, l)| l.contains("proceeding")),
        "the retry policy does not proceed: {lines:#?}"
    );
    assert_levels_match(&lines);
}

#[test]
fn proceeding_without_the_guard_is_a_warning() {
    // The `proceed` policy executes on the store's unique index alone, and
    // says so at warning level: an operator sees the degraded period.
    let port = common::free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let (lines, ok) = replay(
        &json!([event("e-1", order("o-1", "1"))]),
        &[
            ("REDIS_URL", &url),
            ("GUARD_UNAVAILABLE", "proceed"),
            ("REDIS_TIMEOUT_MS", "100"),
        ],
    );
    assert!(ok, "the store alone executes the order: {lines:#?}");
    assert_eq!(
        severity_of(&lines, "order o-1: guard unavailable"),
        HostSeverity::Warning
    );
    assert!(
        lines
            .iter()
            .any(|(_, l)| l.contains("proceeding on the store's unique index")),
        "{lines:#?}"
    );
    assert_eq!(
        severity_of(&lines, "outcome=executed"),
        HostSeverity::Information
    );
    assert_levels_match(&lines);
}

/// An order id holding the word the host reads as a
/// warning ("warn", any case) does not lower an error's severity: the word
/// is written with an escape (`w\u{61}rn`), in the human part and the tail.
#[test]
fn an_order_id_saying_warn_leaves_a_retry_an_error() {
    let lines = replay_without_its_guard(event("e-warn", order("o-WARNING-1", "1")));
    assert_eq!(severity_of(&lines, "outcome=retry"), HostSeverity::Error);
    let line = &lines
        .iter()
        .find(|(_, l)| l.contains("outcome=retry"))
        .unwrap()
        .1;
    assert!(
        line.contains("order o-W\\u{41}RNING-1 event e-w\\u{61}rn")
            && line.contains("order_id=\"o-W\\u{41}RNING-1\""),
        "{line}"
    );
    assert_levels_match(&lines);
}
