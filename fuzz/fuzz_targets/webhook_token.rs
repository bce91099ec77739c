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
            // checking its UTF-8 (a first run found claims accepted with an
            // invalid byte in `tid`): the fields read are checked, so the
            // others are read lossily here.
            let claims: Value = serde_json::from_str(&String::from_utf8_lossy(data))
                .expect("claims accepted from no JSON");
            // An object, or (as serde reads a struct) its fields in order.
            let field = |name: &str, at: usize| match &claims {
                Value::Array(a) => a.get(at).cloned().unwrap_or(Value::Null),
                other => other[name].clone(),
            };
            assert_eq!(field("iss", 0), ISSUER);
            let caller = field("appid", 1)
                .as_str()
                .or(field("azp", 2).as_str())
                .map(str::to_string);
            assert!(
                caller.is_some_and(|c| c.eq_ignore_ascii_case(EVENT_GRID_APP_ID)),
                "{claims}"
            );
            assert!(
                field("roles", 3)
                    .as_array()
                    .is_some_and(|r| r.iter().any(|x| x == SUBSCRIBER_ROLE)),
                "{claims}"
            );
        }
        Err(Refusal::Unavailable(why)) => panic!("claims alone cannot be unavailable: {why}"),
        Err(_) => {}
    }
});
