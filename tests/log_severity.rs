//! Issue 22 point 4: log lines reach the Functions host at their own
//! severity. The host makes every stdout line Information and every stderr
//! line Warning when it contains "warn" (any case), else Error
//! (`order_guard::logging::host_severity`, the host's rule). The real
//! binary's two streams are read apart and each line classified by that
//! rule.

use std::net::TcpListener;
use std::process::Command;

use order_guard::logging::{host_severity, HostSeverity, Stream};
use serde_json::{json, Value};

/// Each line the binary printed, with the stream it came on.
fn replay(deliveries: &Value, vars: &[(&str, &str)]) -> (Vec<(Stream, String)>, bool) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.json");
    std::fs::write(&file, deliveries.to_string()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_order-guard"))
        .arg("replay")
        .arg(&file)
        .env_clear()
        .env("RUST_LOG", "info")
        .envs(vars.iter().copied())
        .current_dir(dir.path())
        .output()
        .expect("run order-guard");
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

fn event(id: &str, data: Value) -> Value {
    json!({
        "id": id,
        "eventType": "Trading.Order.Placed",
        "subject": "orders",
        "eventTime": "2025-06-14T09:30:02Z",
        "dataVersion": "1.0",
        "data": data,
    })
}

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

#[test]
fn a_retry_is_an_error() {
    // A Redis that refuses connections, and a policy that answers `retry`
    // without it: every delivery is an error-level line.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let (lines, ok) = replay(
        &json!([event("e-1", order("o-1", "1"))]),
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
    assert_eq!(severity_of(&lines, "outcome=retry"), HostSeverity::Error);
    assert_levels_match(&lines);
}
