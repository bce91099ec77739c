//! A secret is never shown. The real binary, with every
//! log level on, is started with secrets in the settings that hold them:
//! refused values stop the start without echoing them, and accepted ones
//! are never logged or printed.

mod common;

/// As Azure shows an access key: base64, ending in `=`.
const KEY: &str = "Zm9vYmFyU2VjcmV0S2V5MTIzNDU2Nzg5MGFiY2RlZg9=";

/// Run `order-guard ARGS` with only `vars` set (and every log level on);
/// its exit code and output.
fn run(args: &[&str], vars: &[(&str, String)]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut all = vec![("RUST_LOG", "trace")];
    all.extend(vars.iter().map(|(k, v)| (*k, v.as_str())));
    let (status, text) = common::run_command(dir.path(), args, &all);
    (status.code(), text)
}

#[test]
fn a_secret_is_never_printed_or_logged() {
    let sqlite = ("SQL_CONNECTION_STRING", "sqlite:./orders.db".to_string());
    // Refused at start, the value not shown: an access key pasted alone (as
    // the whole value, or with a port), in a URL's host, as the connection
    // string.
    for (var, value) in [
        ("REDIS_URL", KEY.to_string()),
        ("REDIS_URL", format!("{KEY}:6380")),
        ("REDIS_URL", format!("{KEY},ssl=True")),
        ("REDIS_URL", format!("redis://{KEY}:6379")),
        ("SQL_CONNECTION_STRING", KEY.to_string()),
    ] {
        let mut vars = vec![sqlite.clone()];
        vars.retain(|(k, _)| *k != var);
        vars.push((var, value.clone()));
        let (code, text) = run(&["migrate"], &vars);
        assert_eq!(code, Some(2), "{var}={value} must stop the start: {text}");
        assert!(
            text.contains(&format!("invalid configuration: {var}: ")),
            "{text}"
        );
        assert!(!text.contains(&KEY[..40]), "{var} shown: {text}");
    }
    // Accepted, and never shown: the start line names the host only.
    for redis in [
        format!("rediss://:{KEY}@cache.redis.cache.windows.net:6380"),
        format!("cache.redis.cache.windows.net:6380,password={KEY},ssl=True"),
    ] {
        let (code, text) = run(&["migrate"], &[sqlite.clone(), ("REDIS_URL", redis)]);
        assert_eq!(code, Some(0), "{text}");
        assert!(
            text.contains("guard=redis (rediss://cache.redis.cache.windows.net:6380)"),
            "{text}"
        );
        assert!(!text.contains(&KEY[..40]), "shown: {text}");
    }
}

/// Telemetry's secrets: the Application Insights connection string (its
/// instrumentation key) and the OTLP headers (an API key) are never printed,
/// whether the value is refused or accepted and exported to.
#[test]
fn telemetry_secrets_are_never_printed() {
    // An instrumentation key is a GUID.
    const IKEY: &str = "5d3f0a1b-7c2e-4e9a-b8d1-3f6a2c9e0b47";
    let sqlite = (
        "SQL_CONNECTION_STRING",
        "sqlite:./orders.db?mode=rwc".to_string(),
    );
    let (code, text) = run(
        &["migrate"],
        &[
            sqlite.clone(),
            (
                "APPLICATIONINSIGHTS_CONNECTION_STRING",
                format!("Key={KEY}"),
            ),
        ],
    );
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("invalid configuration: APPLICATIONINSIGHTS_CONNECTION_STRING: "),
        "{text}"
    );
    assert!(!text.contains(&KEY[..40]), "shown: {text}");

    // Accepted: a replay of nothing, exporting to endpoints nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("none.json");
    std::fs::write(&file, "[]").unwrap();
    let (code, text) = run(
        &["replay", file.to_str().unwrap()],
        &[
            sqlite,
            (
                "APPLICATIONINSIGHTS_CONNECTION_STRING",
                format!("InstrumentationKey={IKEY};IngestionEndpoint=https://127.0.0.1:{closed}/"),
            ),
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                format!("http://127.0.0.1:{closed}"),
            ),
            ("OTEL_EXPORTER_OTLP_HEADERS", format!("api-key={KEY}")),
        ],
    );
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains(&format!(
            "telemetry: Application Insights at https://127.0.0.1:{closed}"
        )),
        "{text}"
    );
    assert!(!text.contains(&KEY[..40]), "shown: {text}");
    assert!(!text.contains(IKEY), "shown: {text}");
}
