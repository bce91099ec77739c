//! The bad-input corpus: every malformed invocation or event gets
//! the right status and a message saying what is wrong; event-level problems
//! are acknowledged (200, outcome `rejected`) and stored in `RejectedEvents`
//! with their reason; invocation-level garbage is refused (400 / 413); none
//! crashes or hangs the handler, none leaves a guard reservation behind, and
//! the handler still executes a valid order correctly afterwards.
//!
//! The handler runs in-process (warp on an ephemeral port) over a real SQLite
//! file and a real Redis guard; answers are judged as the host judges them
//! (docs/host-protocol.md, "The answer").

mod common;

use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};

use common::{RedisServer, Verdict};

/// Small, so the over-limit cases stay cheap.
const MAX_BODY: usize = 64 * 1024;
/// The harness's function timeout: an invocation not answered by then hangs.
const FUNCTION_TIMEOUT: Duration = Duration::from_secs(30);

/// A valid order payload with one field replaced (or removed with `Null`).
fn data_with(order_id: &str, field: &str, value: Option<Value>) -> Value {
    let mut d = common::order_data(order_id, "buy", "MSFT", "25", "acct-bad");
    match value {
        Some(v) => d[field] = v,
        None => {
            d.as_object_mut().unwrap().remove(field);
        }
    }
    d
}

/// An Event Grid event with a fixed, findable id around `data`.
fn event(event_id: &str, data: Value) -> Value {
    let mut e = common::eg_event(data);
    e["id"] = json!(event_id);
    e
}

fn body_of(trigger: Value) -> Vec<u8> {
    serde_json::to_vec(&common::invocation(trigger)).unwrap()
}

/// A JSON number with exactly this text.
fn number(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

/// How a stored rejection is found again.
enum Row {
    EventId(String),
    Raw(String),
}

/// An event-level problem: 200, outcome `rejected`, stored with its reason.
struct Poison {
    name: &'static str,
    trigger: Value,
    reason: &'static str,
    row: Row,
}

fn poison_cases() -> Vec<Poison> {
    let mut cases = Vec::new();
    let mut n = 0;
    let mut next_id = || {
        n += 1;
        format!("bad-{n:03}-{}", uuid::Uuid::new_v4().simple())
    };
    // Field-level problems in an otherwise valid Event Grid event.
    let field_cases: Vec<(&'static str, &'static str, Option<Value>, &'static str)> = vec![
        ("missing orderId", "orderId", None, "orderId is required"),
        (
            "empty orderId",
            "orderId",
            Some(json!("")),
            "orderId must not be empty",
        ),
        (
            "blank orderId",
            "orderId",
            Some(json!("   ")),
            "orderId must not be empty",
        ),
        (
            "10 KB orderId",
            "orderId",
            Some(json!("x".repeat(10 * 1024))),
            "at most 128",
        ),
        (
            "orderId not a string",
            "orderId",
            Some(json!(12345)),
            "orderId must be a string",
        ),
        (
            "NUL in orderId",
            "orderId",
            Some(json!("ord\u{0}1")),
            "orderId must not contain control characters",
        ),
        (
            "newline in accountId",
            "accountId",
            Some(json!("acct\nevil")),
            "accountId must not contain control characters",
        ),
        (
            "bell in symbol",
            "symbol",
            Some(json!("MS\u{7}FT")),
            "symbol must not contain control characters",
        ),
        (
            "zero quantity",
            "quantity",
            Some(json!(0)),
            "quantity must be greater than 0",
        ),
        (
            "negative quantity",
            "quantity",
            Some(json!(-3)),
            "quantity must be greater than 0",
        ),
        (
            "non-numeric quantity",
            "quantity",
            Some(json!("abc")),
            "not a decimal number",
        ),
        (
            "40-digit quantity",
            "quantity",
            Some(number("1234567890123456789012345678901234567890")),
            "at most 18 are allowed",
        ),
        (
            // Exponent forms are expanded exactly (the host writes small
            // doubles as 1E-06); one beyond DECIMAL(28,10) is refused.
            "exponent quantity out of range",
            "quantity",
            Some(number("1e25")),
            "has 26 digits before the decimal point; at most 18 are allowed",
        ),
        (
            "boolean quantity",
            "quantity",
            Some(json!(true)),
            "quantity must be a number or a numeric string",
        ),
        (
            "unknown side",
            "side",
            Some(json!("hold")),
            "side must be \"buy\" or \"sell\"",
        ),
        (
            "price NaN",
            "limitPrice",
            Some(json!("NaN")),
            "limitPrice \"NaN\": is not a decimal number",
        ),
        (
            "price Infinity",
            "limitPrice",
            Some(json!("Infinity")),
            "limitPrice \"Infinity\": is not a decimal number",
        ),
        // Fields outside the documented set are refused:
        // names are exact, no alias, whatever the value (null too).
        (
            "unknown field orderType",
            "orderType",
            Some(json!("stop")),
            "unknown field \"orderType\" in the order; this version accepts only orderId, accountId, side, symbol, quantity, limitPrice, currency, placedAt (names are case-sensitive)",
        ),
        (
            "unknown field stopPrice as the host writes a double",
            "stopPrice",
            Some(number("4.2E+2")),
            "unknown field \"stopPrice\" in the order",
        ),
        (
            "unknown field that is null",
            "stopPrice",
            Some(Value::Null),
            "unknown field \"stopPrice\" in the order",
        ),
        (
            "documented field in another letter case",
            "LimitPrice",
            Some(json!(431.15)),
            "unknown field \"LimitPrice\" in the order",
        ),
    ];
    for (name, field, value, reason) in field_cases {
        let eid = next_id();
        let order_id = format!("ord-{eid}");
        cases.push(Poison {
            name,
            trigger: event(&eid, data_with(&order_id, field, value)),
            reason,
            row: Row::EventId(eid),
        });
    }
    // A 10 KB unknown field name is named cut to 128 characters.
    let eid = next_id();
    let mut long_name = data_with(&format!("ord-{eid}"), "side", Some(json!("buy")));
    long_name[format!("x{}", "y".repeat(10 * 1024))] = json!(1);
    cases.push(Poison {
        name: "10 KB unknown field name",
        trigger: event(&eid, long_name),
        reason: "yyyyyyyyyyyyyyyyyyyyyyy…\" in the order; this version accepts only",
        row: Row::EventId(eid),
    });
    // Envelope-level problems.
    let eid = next_id();
    let mut no_data = event(&eid, json!({}));
    no_data.as_object_mut().unwrap().remove("data");
    cases.push(Poison {
        name: "event without data",
        trigger: no_data,
        reason: "has no 'data': the order payload is missing",
        row: Row::EventId(eid),
    });
    for (name, data, reason) in [
        (
            "data a number",
            json!(42),
            "event data must be a JSON object holding the order, got a number",
        ),
        (
            "data an array",
            json!([1, 2]),
            "event data must be a JSON object holding the order, got an array",
        ),
        (
            "data a string that is not JSON",
            json!("hello"),
            "event 'data' is a string that is not JSON",
        ),
    ] {
        let eid = next_id();
        cases.push(Poison {
            name,
            trigger: event(&eid, data),
            reason,
            row: Row::EventId(eid),
        });
    }
    let eid = next_id();
    let ce = json!({
        "id": eid, "source": "/topics/orders", "type": "Trading.Order.Placed",
        "data": data_with(&format!("ord-{eid}"), "orderId", None)
    });
    cases.push(Poison {
        name: "CloudEvent without specversion",
        trigger: ce,
        reason: "neither 'eventType' (Event Grid schema) nor 'specversion' (CloudEvents 1.0)",
        row: Row::EventId(eid),
    });
    let eid = next_id();
    let ce = json!({
        "specversion": "0.3", "id": eid, "source": "/topics/orders", "type": "T",
        "data": data_with(&format!("ord-{eid}"), "side", Some(json!("buy")))
    });
    cases.push(Poison {
        name: "CloudEvent with specversion 0.3",
        trigger: ce,
        reason: "specversion must be \"1.0\"",
        row: Row::EventId(eid),
    });
    // CloudEvents JSON format: `data` and `data_base64` are mutually
    // exclusive; with both, which one holds the order cannot be known.
    let eid = next_id();
    let ce = json!({
        "specversion": "1.0", "id": eid, "source": "/topics/orders", "type": "Trading.Order.Placed",
        "data": data_with(&format!("ord-{eid}"), "side", Some(json!("buy"))),
        "data_base64": base64::engine::general_purpose::STANDARD.encode(
            data_with(&format!("ord-{eid}"), "side", Some(json!("sell"))).to_string()
        )
    });
    cases.push(Poison {
        name: "CloudEvent with both data and data_base64",
        trigger: ce,
        reason: "has both 'data' and 'data_base64'",
        row: Row::EventId(eid),
    });
    let eid = next_id();
    let mut no_id = event(&eid, data_with(&format!("ord-{eid}"), "side", None));
    no_id["id"] = json!("");
    cases.push(Poison {
        name: "empty event id",
        trigger: no_id.clone(),
        reason: "'id' must not be empty",
        row: Row::Raw(no_id.to_string()),
    });
    // Trigger values that are not events at all.
    let marker = uuid::Uuid::new_v4().simple().to_string();
    let not_json = Value::String(format!("{{\"id\":\"{marker}\", oops"));
    cases.push(Poison {
        name: "string-encoded event that is not JSON",
        trigger: not_json.clone(),
        reason: "the event is a string that is not JSON",
        row: Row::Raw(not_json.to_string()),
    });
    let empty_object = json!({ "unrelated": marker });
    cases.push(Poison {
        name: "empty event object",
        trigger: empty_object.clone(),
        reason: "neither 'eventType'",
        row: Row::Raw(empty_object.to_string()),
    });
    cases.push(Poison {
        name: "event a number",
        trigger: json!(42),
        reason: "the event must be a JSON object (or a string or array of them), got a number",
        row: Row::Raw("42".into()),
    });
    cases.push(Poison {
        name: "event null",
        trigger: Value::Null,
        reason: "got null",
        row: Row::Raw("null".into()),
    });
    cases.push(Poison {
        name: "empty batch",
        trigger: json!([]),
        reason: "the event batch is empty",
        row: Row::Raw("[]".into()),
    });
    // Deep nesting inside a string-encoded event: the decoder stops, it does
    // not recurse 10 000 levels.
    let deep = Value::String(format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)));
    cases.push(Poison {
        name: "10 000-deep nesting in a string-encoded event",
        trigger: deep.clone(),
        reason: "recursion limit exceeded",
        row: Row::Raw(deep.to_string()),
    });
    cases
}

/// An invocation-level problem: refused with `status` and a message.
struct Refused {
    name: &'static str,
    path: &'static str,
    body: Vec<u8>,
    chunked: bool,
    status: u16,
    message: &'static str,
}

fn refused_cases() -> Vec<Refused> {
    let valid = event("e-valid", common::order_data("o", "buy", "MSFT", "1", "a"));
    let r = |name, body: Vec<u8>, status, message| Refused {
        name,
        path: "/OrderTrigger",
        body,
        chunked: false,
        status,
        message,
    };
    let mut cases = vec![
        r(
            "empty body",
            Vec::new(),
            400,
            "empty request body; expected a Functions host invocation",
        ),
        r(
            "not JSON",
            b"this is not json".to_vec(),
            400,
            "request body is not valid JSON",
        ),
        r(
            "truncated JSON",
            b"{\"Data\":{\"eventGridEvent\":".to_vec(),
            400,
            "request body is not valid JSON",
        ),
        r(
            "JSON array, not an invocation",
            b"[1,2,3]".to_vec(),
            400,
            "request body is JSON but not a host invocation: expected an object with \"Data\", got an array",
        ),
        r(
            "JSON string, not an invocation",
            b"\"hello\"".to_vec(),
            400,
            "not a host invocation",
        ),
        r(
            "object without Data",
            serde_json::to_vec(&json!({"Metadata": {}, "eventGridEvent": valid})).unwrap(),
            400,
            "it has no \"Data\" member",
        ),
        r(
            "Data not an object",
            br#"{"Data": 5, "Metadata": {}}"#.to_vec(),
            400,
            "invocation \"Data\" must be an object keyed by binding name, got a number",
        ),
        r(
            "wrong binding name",
            serde_json::to_vec(&json!({"Data": {"eventGridEvents": valid}, "Metadata": {}}))
                .unwrap(),
            400,
            "has no \"eventGridEvent\" binding (found: [\"eventGridEvents\"])",
        ),
        r(
            "empty Data",
            br#"{"Data": {}, "Metadata": {}}"#.to_vec(),
            400,
            "has no \"eventGridEvent\" binding (found: [])",
        ),
        r(
            "NaN literal (not JSON)",
            br#"{"Data":{"eventGridEvent":{"id":"e","eventType":"T","data":{"limitPrice": NaN}}}}"#
                .to_vec(),
            400,
            "request body is not valid JSON",
        ),
        r(
            "10 000-deep nesting",
            format!(
                r#"{{"Data":{{"eventGridEvent":{{"id":"e","eventType":"T","data":{}{}}}}}}}"#,
                "[".repeat(10_000),
                "]".repeat(10_000)
            )
            .into_bytes(),
            400,
            "recursion limit exceeded",
        ),
        r(
            "invalid UTF-8",
            b"{\"Data\":{\"eventGridEvent\":\"\xff\xfe\xfd\"}}".to_vec(),
            400,
            "request body is not valid JSON",
        ),
        r(
            "body over the limit (Content-Length)",
            body_of(json!({"pad": "x".repeat(MAX_BODY)})),
            413,
            "request body exceeds MAX_BODY_BYTES (65536 bytes)",
        ),
    ];
    cases.push(Refused {
        name: "body over the limit (chunked, no Content-Length)",
        path: "/OrderTrigger",
        body: body_of(json!({"pad": "x".repeat(2 * MAX_BODY)})),
        chunked: true,
        status: 413,
        message: "request body exceeds MAX_BODY_BYTES (65536 bytes)",
    });
    cases.push(Refused {
        name: "unknown function",
        path: "/NoSuchFunction",
        body: body_of(valid),
        chunked: false,
        status: 404,
        message: "no function named \"NoSuchFunction\"",
    });
    cases
}

/// The stored rejection rows `(Kind, Reason, Deliveries)` for a case.
fn stored(db: &std::path::Path, row: &Row) -> Vec<(String, String, i64)> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let (sql, key) = match row {
        Row::EventId(e) => (
            "SELECT Kind, Reason, Deliveries FROM RejectedEvents WHERE EventId = ?1",
            e.as_str(),
        ),
        Row::Raw(r) => (
            "SELECT Kind, Reason, Deliveries FROM RejectedEvents WHERE RawEvent = ?1",
            r.as_str(),
        ),
    };
    let mut stmt = conn.prepare(sql).unwrap();
    let rows = stmt
        .query_map([key], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap();
    rows.map(Result::unwrap).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_the_right_status_a_reason_and_a_stored_row() {
    let redis = RedisServer::start();
    let guard = common::redis_guard(&redis, Default::default());
    let (store, dir) = common::sqlite_store().await;
    let db = dir.path().join("orders.db");
    let handler = common::Handler::start(common::processor(guard, store), MAX_BODY).await;
    let url = |path: &str| handler.url(path);
    let client = hyper::Client::new();
    let mut failures = Vec::new();

    // Event-level problems: acknowledged and stored, never retried forever.
    let poison = poison_cases();
    for case in &poison {
        for delivery in 1..=2 {
            let chunked = delivery == 2;
            let answer = common::try_send(
                &client,
                &url("/OrderTrigger"),
                body_of(case.trigger.clone()),
                chunked,
                FUNCTION_TIMEOUT,
            )
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "{}: no answer ({e}): the handler crashed or hung",
                    case.name
                )
            });
            match answer.verdict() {
                Verdict::Succeeded(body) => {
                    // An (empty) batch is answered as `{"results": [...]}`.
                    let rv = match &body["ReturnValue"]["results"] {
                        Value::Array(r) if r.len() == 1 => &r[0],
                        _ => &body["ReturnValue"],
                    };
                    let reason = rv["reason"].as_str().unwrap_or("");
                    if rv["outcome"] != "rejected" || !reason.contains(case.reason) {
                        failures.push(format!(
                            "{}: want outcome rejected saying {:?}, got {rv}",
                            case.name, case.reason
                        ));
                    }
                    let logs = body["Logs"].to_string();
                    if !logs.contains("rejected") {
                        failures.push(format!("{}: Logs do not say rejected: {logs}", case.name));
                    }
                }
                other => failures.push(format!(
                    "{}: want 200 rejected, the host judges {other:?}",
                    case.name
                )),
            }
        }
        // One row per event, its redelivery counted, with the reason.
        match stored(&db, &case.row).as_slice() {
            [(kind, reason, deliveries)]
                if kind == "poison" && reason.contains(case.reason) && *deliveries == 2 => {}
            other => failures.push(format!(
                "{}: want one poison row saying {:?} with 2 deliveries, found {other:?}",
                case.name, case.reason
            )),
        }
    }

    // Invocation-level problems: refused with a message, nothing stored.
    let rejected_before = count_rejected(&db);
    for case in refused_cases() {
        // Read the way real clients do: an early answer (413 before the whole
        // body was sent) counts; a write cut off after it does not matter.
        let answer = common::send_reading_early_answer(
            handler.addr,
            case.path,
            case.body.clone(),
            case.chunked,
            FUNCTION_TIMEOUT,
        )
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{}: no answer ({e}): the handler crashed or hung",
                case.name
            )
        });
        let body = answer.json();
        let error = body
            .as_ref()
            .and_then(|b| b["ReturnValue"]["error"].as_str().map(str::to_string))
            .unwrap_or_default();
        if answer.status != case.status
            || !answer.content_type.starts_with("application/json")
            || !error.contains(case.message)
        {
            failures.push(format!(
                "{}: want {} saying {:?} as JSON, got {} ({}) {}",
                case.name,
                case.status,
                case.message,
                answer.status,
                answer.content_type,
                String::from_utf8_lossy(&answer.bytes[..answer.bytes.len().min(300)])
            ));
        }
    }
    let get = common::send("GET", &url("/OrderTrigger"), Vec::new(), false).await;
    if get.status != 405
        || !get.body["ReturnValue"]["error"]
            .to_string()
            .contains("POST")
    {
        failures.push(format!(
            "GET /OrderTrigger: want 405 naming POST, got {get:?}"
        ));
    }
    assert_eq!(
        count_rejected(&db),
        rejected_before,
        "invocation-level refusals must not store rejected events"
    );

    // No poison event left a guard reservation (or any key) behind.
    let keys = redis.keys_with_ttl("orden*");
    if !keys.is_empty() {
        failures.push(format!("poison events left guard keys: {keys:?}"));
    }

    // The handler still serves correctly.
    let id = common::unique_id("after-bad");
    let good = body_of(common::eg_event(common::order_data(
        &id,
        "sell",
        "NVDA",
        "7.25",
        "acct-after",
    )));
    let first = common::try_send(
        &client,
        &url("/OrderTrigger"),
        good.clone(),
        false,
        FUNCTION_TIMEOUT,
    )
    .await
    .expect("valid order after the corpus");
    let again = common::try_send(&client, &url("/OrderTrigger"), good, true, FUNCTION_TIMEOUT)
        .await
        .expect("redelivery after the corpus");
    match (first.verdict(), again.verdict()) {
        (Verdict::Succeeded(a), Verdict::Succeeded(b)) => {
            assert_eq!(a["ReturnValue"]["outcome"], "executed", "{a}");
            assert_eq!(a["ReturnValue"]["guard"], "redis", "{a}");
            assert_eq!(b["ReturnValue"]["outcome"], "duplicate", "{b}");
        }
        other => panic!("a valid order after the corpus was not served: {other:?}"),
    }
    let row = handler.processor.store().order(&id).await.unwrap().unwrap();
    assert_eq!(row.status.as_str(), "Executed");
    assert_eq!(
        handler
            .processor
            .store()
            .position("acct-after", "NVDA")
            .await
            .unwrap()
            .map(|d| d.to_string()),
        Some("-7.25".to_string())
    );
    assert_eq!(
        redis.get(&format!("orden:{{{id}}}")).as_deref(),
        Some("COMPLETADA")
    );
    let stats = handler.processor.counters();
    assert_eq!(stats.rejected, 2 * poison.len() as u64, "{stats:?}");
    assert_eq!((stats.executed, stats.duplicate), (1, 1), "{stats:?}");

    handler.shutdown().await;
    assert!(
        failures.is_empty(),
        "{} bad-input cases misbehaved:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
}

fn count_rejected(db: &std::path::Path) -> i64 {
    rusqlite::Connection::open(db)
        .unwrap()
        .query_row("SELECT COUNT(*) FROM RejectedEvents", [], |r| r.get(0))
        .unwrap()
}

/// An event id of 100 000 characters is kept whole where
/// it is stored, and shown bounded in the answer (and so in the host's log).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_event_ids_are_stored_whole_and_answered_bounded() {
    let (store, dir) = common::sqlite_store().await;
    let db = dir.path().join("orders.db");
    let handler = common::Handler::start(
        common::processor(common::memory_guard(), store),
        1024 * 1024,
    )
    .await;
    let client = hyper::Client::new();
    let long_id = format!("{}{}", "e".repeat(100_000), uuid::Uuid::new_v4().simple());
    let shown = format!("{}…", &long_id[..order_guard::text::MAX_SHOWN_ID]);
    let valid_id = common::unique_id("long-eid");
    let poison_data = data_with(&common::unique_id("long-eid"), "side", Some(json!("hold")));
    for (data, outcome) in [
        (data_with(&valid_id, "side", Some(json!("buy"))), "executed"),
        (poison_data, "rejected"),
    ] {
        let answer = common::try_send(
            &client,
            &handler.url("/OrderTrigger"),
            body_of(event(&long_id, data)),
            false,
            FUNCTION_TIMEOUT,
        )
        .await
        .expect("an answer");
        assert!(
            answer.bytes.len() < 2_000,
            "{outcome}: a {}-byte answer echoes the id",
            answer.bytes.len()
        );
        let Verdict::Succeeded(body) = answer.verdict() else {
            panic!("{outcome}: not a success: {}", answer.status);
        };
        assert_eq!(body["ReturnValue"]["outcome"], outcome, "{body}");
        assert_eq!(body["ReturnValue"]["eventId"], json!(shown), "{body}");
    }
    let conn = rusqlite::Connection::open(&db).unwrap();
    let kept: String = conn
        .query_row(
            "SELECT EventId FROM Orders WHERE OrderId = ?1",
            [&valid_id],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(kept, long_id, "the order row keeps the whole event id");
    assert_eq!(
        stored(&db, &Row::EventId(long_id.clone())).len(),
        1,
        "the rejection keeps the whole event id"
    );
    // A binding name of 100 000 characters is not echoed whole either.
    let name = "b".repeat(100_000);
    let body = serde_json::to_vec(&json!({"Data": {name: 1}, "Metadata": {}})).unwrap();
    let answer = common::try_send(
        &client,
        &handler.url("/OrderTrigger"),
        body,
        false,
        FUNCTION_TIMEOUT,
    )
    .await
    .expect("an answer");
    assert_eq!(answer.status, 400);
    assert!(answer.bytes.len() < 2_000, "{} bytes", answer.bytes.len());
    handler.shutdown().await;
}
