//! The custom-handler protocol over real HTTP: a warp server on an ephemeral
//! port receiving host-shaped invocations (docs/host-protocol.md), judged the
//! way the Functions host judges them.

mod common;

use std::sync::Arc;

use order_guard::processor::OutcomeKind;
use order_guard::store::OrderStore;
use serde_json::{json, Value};

use common::{
    cloud_event, eg_event, invocation, invoke, order_data, send, unique_id, Answer, Handler,
};

const LIMIT: usize = 64 * 1024;

async fn handler() -> (Handler, tempfile::TempDir) {
    let (store, dir) = common::sqlite_store().await;
    let p = common::processor(common::memory_guard(), store);
    (Handler::start(p, LIMIT).await, dir)
}

/// What the host requires of every answer (§6.3): JSON-typed, a JSON object.
fn assert_host_accepts_shape(a: &Answer) {
    assert!(
        a.content_type.starts_with("application/json"),
        "content type {:?}",
        a.content_type
    );
    assert!(a.body.is_object(), "body must be a JSON object: {}", a.body);
    assert!(a.body["Logs"].is_array(), "{}", a.body);
    assert!(a.body["Outputs"].is_object(), "{}", a.body);
}

fn outcome(a: &Answer) -> &str {
    a.body["ReturnValue"]["outcome"].as_str().unwrap_or("")
}

#[tokio::test]
async fn readiness_probe_answers_json() {
    let (h, _d) = handler().await;
    let a = send("GET", &h.url("/"), vec![], false).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.body["status"], "ready");
}

#[tokio::test]
async fn every_encoding_of_one_event_gives_the_same_outcome() {
    let (h, _d) = handler().await;
    let account = unique_id("acct");
    let id = unique_id("ord");
    let event = eg_event(order_data(&id, "buy", "MSFT", "25", &account));
    let once = Value::String(event.to_string());
    let twice = Value::String(once.to_string());
    let first = invoke(&h, &invocation(event.clone())).await;
    assert_host_accepts_shape(&first);
    assert_eq!((first.status, outcome(&first)), (200, "executed"));
    assert_eq!(first.body["ReturnValue"]["orderId"], id.as_str());
    for trigger in [event.clone(), once, twice] {
        let a = invoke(&h, &invocation(trigger)).await;
        assert_host_accepts_shape(&a);
        assert_eq!((a.status, outcome(&a)), (200, "duplicate"), "{}", a.body);
    }
    // CloudEvents 1.0 carrying the same order.
    let ce = cloud_event(order_data(&id, "buy", "MSFT", "25", &account));
    let a = invoke(&h, &invocation(ce)).await;
    assert_eq!((a.status, outcome(&a)), (200, "duplicate"), "{}", a.body);
    assert_eq!(h.processor.counters().executed, 1);
}

#[tokio::test]
async fn keys_in_other_case_and_missing_metadata_are_accepted() {
    let (h, _d) = handler().await;
    let event = eg_event(order_data(&unique_id("ord"), "buy", "MSFT", "1", "a"));
    let a = invoke(&h, &json!({ "data": { "EventGridEvent": event } })).await;
    assert_eq!((a.status, outcome(&a)), (200, "executed"), "{}", a.body);
}

#[tokio::test]
async fn a_chunked_body_without_content_length_is_read() {
    let (h, _d) = handler().await;
    let body = invocation(eg_event(order_data(
        &unique_id("ord"),
        "sell",
        "X",
        "3",
        "a",
    )));
    let a = send(
        "POST",
        &h.url("/OrderTrigger"),
        serde_json::to_vec(&body).unwrap(),
        true,
    )
    .await;
    assert_eq!((a.status, outcome(&a)), (200, "executed"), "{}", a.body);
}

#[tokio::test]
async fn an_array_is_answered_per_event_all_or_none() {
    let (h, _d) = handler().await;
    let a1 = eg_event(order_data(&unique_id("ord"), "buy", "X", "1", "a"));
    let a2 = cloud_event(order_data(&unique_id("ord"), "sell", "X", "2", "a"));
    // `cardinality: many`: a string holding the array.
    let a = invoke(&h, &invocation(Value::String(json!([a1, a2]).to_string()))).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let results = a.body["ReturnValue"]["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    assert!(results.iter().all(|r| r["outcome"] == "executed"));
    // A bare array where one event's order is held by a live worker: the whole
    // delivery must be retried (500), the others are reported as done.
    let busy_id = unique_id("ord");
    let busy = eg_event(order_data(&busy_id, "buy", "X", "1", "a"));
    let held = h.processor.guard().acquire(&busy_id).await;
    assert!(matches!(held, order_guard::guard::Acquisition::Acquired(_)));
    let fresh = eg_event(order_data(&unique_id("ord"), "buy", "X", "1", "a"));
    let a = invoke(&h, &invocation(json!([fresh, busy]))).await;
    assert_eq!(a.status, 500, "{}", a.body);
    assert_host_accepts_shape(&a);
    let results = a.body["ReturnValue"]["results"].as_array().unwrap();
    assert_eq!(results[0]["outcome"], "executed");
    assert_eq!(results[1]["outcome"], "in_progress");
}

#[tokio::test]
async fn statuses_follow_the_outcome_table() {
    let (h, _d) = handler().await;
    let id = unique_id("ord");
    // in_progress → 500
    let held = h.processor.guard().acquire(&id).await;
    assert!(
        matches!(held, order_guard::guard::Acquisition::Acquired(_)),
        "{held:?}"
    );
    let a = invoke(
        &h,
        &invocation(eg_event(order_data(&id, "buy", "X", "1", "a"))),
    )
    .await;
    assert_eq!((a.status, outcome(&a)), (500, "in_progress"));
    // rejected → 200 with the reason
    let a = invoke(
        &h,
        &invocation(eg_event(order_data(&unique_id("o"), "buy", "X", "0", "a"))),
    )
    .await;
    assert_eq!((a.status, outcome(&a)), (200, "rejected"));
    assert!(a.body["ReturnValue"]["reason"]
        .as_str()
        .unwrap()
        .contains("greater than 0"));
    // conflict → 200
    let id = unique_id("ord");
    let a = invoke(
        &h,
        &invocation(eg_event(order_data(&id, "buy", "X", "1", "a"))),
    )
    .await;
    assert_eq!((a.status, outcome(&a)), (200, "executed"), "{}", a.body);
    let a = invoke(
        &h,
        &invocation(eg_event(order_data(&id, "buy", "X", "2", "a"))),
    )
    .await;
    assert_eq!((a.status, outcome(&a)), (200, "conflict"));
    assert_eq!(
        serde_json::from_value::<OutcomeKind>(a.body["ReturnValue"]["outcome"].clone()).unwrap(),
        OutcomeKind::Conflict
    );
}

#[tokio::test]
async fn bodies_that_are_not_invocations_get_400_with_a_reason() {
    let (h, _d) = handler().await;
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"not json".to_vec(), "not valid JSON"),
        (b"[1,2]".to_vec(), "not a host invocation"),
        (br#"{"Metadata":{}}"#.to_vec(), "no \"Data\""),
        (
            br#"{"Data":{"other":{}}}"#.to_vec(),
            "no \"eventGridEvent\" binding",
        ),
        (br#"{"Data":{}}"#.to_vec(), "no \"eventGridEvent\" binding"),
        (b"".to_vec(), "empty request body"),
    ];
    for (body, want) in cases {
        let a = send("POST", &h.url("/OrderTrigger"), body.clone(), false).await;
        assert_eq!(a.status, 400, "{:?}", String::from_utf8_lossy(&body));
        assert_host_accepts_shape(&a);
        let msg = a.body["ReturnValue"]["error"].as_str().unwrap();
        assert!(msg.contains(want), "{msg:?} lacks {want:?}");
    }
}

/// Bytes that are not an HTTP/1.1 request at all (a garbage request line, a
/// negative or doubled `Content-Length`) never reach the handler: the HTTP
/// stack (hyper) answers them itself with a bare 400, no body, and closes the
/// connection. The README documents this one exception to "every answer is a
/// JSON object"; the Functions host never sends such requests.
#[tokio::test]
async fn requests_that_are_not_http_get_a_bare_400_from_the_http_stack() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (h, _d) = handler().await;
    let cases: [&[u8]; 3] = [
        b"GARBAGE\r\n\r\n",
        b"POST /OrderTrigger HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        b"POST /OrderTrigger HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    ];
    for wire in cases {
        let mut stream = tokio::net::TcpStream::connect(h.addr).await.unwrap();
        stream.write_all(wire).await.unwrap();
        // The server closes after answering: read to the end.
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        let text = String::from_utf8_lossy(&answer).to_ascii_lowercase();
        let shown = String::from_utf8_lossy(wire);
        assert!(text.starts_with("http/1.1 400 "), "{shown:?}: {text:?}");
        assert!(
            text.contains("content-length: 0\r\n"),
            "{shown:?}: {text:?}"
        );
        assert!(text.ends_with("\r\n\r\n"), "no body expected: {text:?}");
    }
}

#[tokio::test]
async fn oversized_bodies_get_413_with_or_without_content_length() {
    let (h, _d) = handler().await;
    let mut data = order_data(&unique_id("ord"), "buy", "X", "1", "a");
    data["padding"] = json!("x".repeat(LIMIT));
    let body = serde_json::to_vec(&invocation(eg_event(data))).unwrap();
    for chunked in [false, true] {
        let a = send("POST", &h.url("/OrderTrigger"), body.clone(), chunked).await;
        assert_eq!(a.status, 413, "chunked={chunked}");
        assert!(a.body["ReturnValue"]["error"]
            .as_str()
            .unwrap()
            .contains("MAX_BODY_BYTES"));
    }
    // The handler still serves afterwards.
    let a = invoke(
        &h,
        &invocation(eg_event(order_data(&unique_id("o"), "buy", "X", "1", "a"))),
    )
    .await;
    assert_eq!(a.status, 200);
}

#[tokio::test]
async fn other_paths_and_methods_answer_json_errors() {
    let (h, _d) = handler().await;
    let a = send("POST", &h.url("/OtherFunction"), b"{}".to_vec(), false).await;
    assert_eq!(a.status, 404);
    assert_host_accepts_shape(&a);
    let a = send(
        "POST",
        &h.url("/ordertrigger"),
        serde_json::to_vec(&invocation(json!(7))).unwrap(),
        false,
    )
    .await;
    assert_eq!(
        (a.status, outcome(&a)),
        (200, "rejected"),
        "route is case-insensitive"
    );
    let a = send("GET", &h.url("/nope"), vec![], false).await;
    assert_eq!(a.status, 405);
    assert!(a.body["ReturnValue"]["error"]
        .as_str()
        .unwrap()
        .contains("POST /OrderTrigger"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_waits_for_in_flight_invocations() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders.db");
    let store = Arc::new(
        order_guard::store::SqliteStore::open(&path, std::time::Duration::from_secs(10)).unwrap(),
    );
    store.migrate().await.unwrap();
    let guard = common::memory_guard();
    let p = common::processor(guard.clone(), store.clone());
    let h = Handler::start(p, LIMIT).await;
    // Hold the database so the invocation stays in flight inside the store.
    let blocker = rusqlite::Connection::open(&path).unwrap();
    blocker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let id = unique_id("ord");
    let url = h.url("/OrderTrigger");
    let body =
        serde_json::to_vec(&invocation(eg_event(order_data(&id, "buy", "X", "1", "a")))).unwrap();
    let in_flight = tokio::spawn(async move { send("POST", &url, body, false).await });
    // In flight once its reservation exists.
    use order_guard::guard::IdempotencyGuard;
    while guard.inspect(&id).await.unwrap().value.is_none() {
        assert!(
            !in_flight.is_finished(),
            "invocation ended before it was in flight"
        );
        tokio::task::yield_now().await;
    }
    let addr = h.addr;
    let shutdown = tokio::spawn(h.shutdown());
    // Shutdown has begun once the listener refuses new connections (or
    // resets one it had queued but will never accept: it was closed).
    loop {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(_) => tokio::task::yield_now().await,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::ConnectionReset
                ) =>
            {
                break
            }
            Err(e) => panic!("connecting to {addr} failed other than by a refusal or a reset: {e}"),
        }
    }
    assert!(
        !in_flight.is_finished(),
        "the invocation must still be in flight"
    );
    blocker.execute_batch("ROLLBACK").unwrap();
    let a = in_flight.await.unwrap();
    shutdown.await.unwrap();
    assert_eq!((a.status, outcome(&a)), (200, "executed"), "{}", a.body);
    assert!(store.order(&id).await.unwrap().is_some());
    assert_eq!(
        guard.inspect(&id).await.unwrap().value.as_deref(),
        Some("COMPLETADA")
    );
}
