//! Bytes → the ADO.NET connection-string parser (`SqlConnInfo::parse`) and
//! the Redis URL / Azure form parser (`Config::from_lookup` with `REDIS_URL`
//! and `SQL_CONNECTION_STRING` set). Never a panic, and a secret given in the
//! input (the marker below, placed as the password around the fuzzed text)
//! never appears in an error's `Display`/`Debug` or an accepted value's
//! `Debug`/`Display`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use order_guard::config::Config;
use order_guard::store::sqlserver::connstr::SqlConnInfo;

const MARKER: &str = "S3cr3tMarker";

fn leaks(text: &str) -> bool {
    text.to_ascii_lowercase()
        .contains(&MARKER.to_ascii_lowercase())
}

fn check_sql(s: &str) {
    match SqlConnInfo::parse(s) {
        Ok(info) => {
            let shown = format!("{info:?} {info}");
            assert!(!leaks(&shown), "accepted {s:?} shows the secret: {shown}");
        }
        Err(e) => {
            let shown = format!("{e} {e:?}");
            assert!(!leaks(&shown), "refusing {s:?} shows the secret: {shown}");
        }
    }
}

fn check_config(redis: Option<&str>, sql: Option<&str>) {
    let got = Config::from_lookup(|k| match k {
        "REDIS_URL" => redis.map(str::to_string),
        "SQL_CONNECTION_STRING" => sql.map(str::to_string),
        _ => None,
    });
    let shown = match &got {
        Ok(c) => format!("{c:?}"),
        Err(e) => format!("{e} {e:?}"),
    };
    assert!(
        !leaks(&shown),
        "REDIS_URL={redis:?} SQL_CONNECTION_STRING={sql:?} shows the secret: {shown}"
    );
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    // The fuzzed text alone: it may not contain the marker (else it is the
    // input's own text, not a secret we placed), not even once a URL parser
    // has removed its tabs and newlines, as WHATWG URLs do ("s3cr3tm\narker"
    // in a host is shown as the host "s3cr3tmarker").
    if leaks(s) || leaks(&s.replace(['\t', '\n', '\r'], "")) {
        return;
    }
    check_sql(s);
    check_config(Some(s), None);
    check_config(None, Some(s));
    // The marker as the password, before and after the fuzzed text.
    for sql in [
        format!("Server=tcp:db.example.net,1433;{s};Password={MARKER}"),
        format!("Password={MARKER};{s}"),
        format!("{s};Pwd={MARKER};"),
        format!("Server=db;User ID=u;Password=\"{MARKER}{s}\""),
        format!("Server=db;Password={MARKER}{s}"),
    ] {
        check_sql(&sql);
        // `sqlite:PATH` is a file path, shown as given: not a secret's place.
        if !sql.trim_start().starts_with("sqlite:") {
            check_config(None, Some(&sql));
        }
    }
    for url in [
        format!("redis://:{MARKER}@{s}"),
        format!("rediss://user:{MARKER}@{s}"),
        format!("redis://{s}:{MARKER}@cache.example.net:6379"),
        format!("{s},password={MARKER},ssl=True"),
        format!("cache.example.net:6380,password={MARKER},{s}"),
        format!("cache.example.net:6380,password={MARKER}{s}"),
    ] {
        check_config(Some(&url), None);
    }
});
