//! Bytes → a request to the webhook as `webhook::delivery::read` reads it:
//! the first byte picks the `aeg-event-type` header (none, each value
//! Event Grid sends, or one it does not), the rest is the body. Never a
//! panic; the same request reads the same twice; a `Notification` is
//! always events (no event typed as a handshake hides a batch); a
//! handshake without the header is one event only; events handed on are
//! an object or a non-empty array.
#![no_main]

use libfuzzer_sys::fuzz_target;
use order_guard::webhook::delivery::{read, Delivery};
use serde_json::Value;

const HEADERS: [Option<&str>; 7] = [
    None,
    Some("Notification"),
    Some("SubscriptionValidation"),
    Some("SubscriptionDeletion"),
    Some("Unsubscribe"),
    Some("notification"),
    Some("SomethingElse"),
];

/// How many events a body holds, if it is JSON.
fn events_in(body: &[u8]) -> Option<usize> {
    match serde_json::from_slice::<Value>(body).ok()? {
        Value::Array(a) => Some(a.len()),
        _ => Some(1),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let header = HEADERS[pick as usize % HEADERS.len()];
    let read_once = read(header, body);
    assert_eq!(read_once, read(header, body), "not the same twice");
    match (&read_once, header) {
        (Ok(Delivery::Validation { .. } | Delivery::Deletion), Some(h))
            if h.eq_ignore_ascii_case("Notification") || h == "SomethingElse" =>
        {
            panic!("{h}: read as a handshake: {read_once:?}")
        }
        (Ok(Delivery::Validation { .. } | Delivery::Deletion), None) => {
            assert_eq!(events_in(body), Some(1), "a handshake of several events")
        }
        (Ok(Delivery::Events(Value::Array(a))), _) => assert!(!a.is_empty()),
        (Ok(Delivery::Events(v)), _) => assert!(v.is_object(), "{v}"),
        _ => {}
    }
});
