//! Bytes → what the webhook reads of a bearer token before and after its
//! signature: the `Authorization` header (`bearer_key_id`: a bearer token,
//! a JWT header, RS256, a key id) and the claims of its payload
//! (`check_claims`: the issuer, the caller, the role). Never a panic; a
//! key id only for a header that is RS256 and names one; claims accepted
//! only when they name an issuer given, Event Grid as the caller and the
//! subscriber role.
#![no_main]

use base64::Engine;
use libfuzzer_sys::fuzz_target;
use order_guard::webhook::auth::{
    bearer_key_id, check_claims, Refusal, EVENT_GRID_APP_ID, SUBSCRIBER_ROLE,
};
use std::collections::BTreeMap;

use serde_json::value::RawValue;
use serde_json::Value;

const ISSUER: &str = "https://sts.windows.net/11111111-2222-3333-4444-555555555555/";

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    // The header as sent, and as a bearer token of these bytes.
    for header in [text.to_string(), format!("Bearer {text}")] {
        if let Ok((token, kid)) = bearer_key_id(Some(&header)) {
            // The header is what precedes the last two dots (as
            // jsonwebtoken splits a token).
            let head = token.rsplitn(3, '.').nth(2).unwrap_or_default();
            let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(head)
                .expect("a key id from a header that is not base64url");
            // Lossily, as the claims below: a field the header does not
            // read is skipped without its UTF-8 checked.
            let head: Value = serde_json::from_str(&String::from_utf8_lossy(&decoded))
                .expect("a key id from no JSON");
            assert_eq!(head["alg"], "RS256");
            assert_eq!(head["kid"].as_str(), Some(kid.as_str()));
        }
    }
    // The bytes as a token's claims.
    let issuers = [ISSUER.to_string()];
    match check_claims(data, &issuers) {
        Ok(()) => {
            // serde_json skips a field the claims do not read without
            // checking it: neither its UTF-8 (claims were accepted with an
            // invalid byte in `tid`) nor its escapes (and with a lone
            // surrogate `\ud8c5` there). So the bytes are read lossily, and
            // each value only as raw JSON (skipped as serde skips it), and
            // the fields the webhook reads are then parsed, and checked.
            let text = String::from_utf8_lossy(data);
            let parsed = |raw: &RawValue| -> Value {
                serde_json::from_str(raw.get()).expect("a field read from no JSON")
            };
            // An object, or (as serde reads a struct) its fields in order.
            let field: Box<dyn Fn(&str, usize) -> Value> =
                match serde_json::from_str::<BTreeMap<String, &RawValue>>(&text) {
                    Ok(object) => Box::new(move |name: &str, _| {
                        object.get(name).map_or(Value::Null, |raw| parsed(raw))
                    }),
                    Err(_) => {
                        let array: Vec<&RawValue> =
                            serde_json::from_str(&text).expect("claims accepted from no JSON");
                        Box::new(move |_: &str, at: usize| {
                            array.get(at).map_or(Value::Null, |raw| parsed(raw))
                        })
                    }
                };
            assert_eq!(field("iss", 0), ISSUER);
            let caller = field("appid", 1)
                .as_str()
                .or(field("azp", 2).as_str())
                .map(str::to_string);
            assert!(
                caller.is_some_and(|c| c.eq_ignore_ascii_case(EVENT_GRID_APP_ID)),
                "{text}"
            );
            assert!(
                field("roles", 3)
                    .as_array()
                    .is_some_and(|r| r.iter().any(|x| x == SUBSCRIBER_ROLE)),
                "{text}"
            );
        }
        Err(Refusal::Unavailable(why)) => panic!("claims alone cannot be unavailable: {why}"),
        Err(_) => {}
    }
});
