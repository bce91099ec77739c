//! Who may deliver: Event Grid's token for this app from this tenant,
//! checked against the keys one refresher holds.

use super::*;

#[tokio::test]
async fn only_event_grids_valid_token_for_this_app_may_deliver() {
    let redis = RedisServer::start();
    let issuer = Issuer::start().await;
    let hook = Webhook::start(&redis, &issuer.settings()).await;
    let events = || json!([eg_event(order("auth"))]);
    let with = |claims: Value| issuer.key.sign(&claims);
    let change = |k: &str, v: Value| {
        let mut c = event_grid_claims();
        c[k] = v;
        c
    };
    let without = |k: &str| {
        let mut c = event_grid_claims();
        c.as_object_mut().unwrap().remove(k);
        c
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let stranger = issuer.new_key("key-1");
    let cases: Vec<(&str, Option<String>, u16)> = vec![
        ("no token", None, 401),
        ("not a JWT", Some("not-a-token".into()), 401),
        (
            "signed by another key under the same kid",
            Some(stranger.sign(&event_grid_claims())),
            401,
        ),
        (
            "for another audience",
            Some(with(change("aud", json!("api://another-app")))),
            401,
        ),
        (
            "from another tenant",
            Some(with(change(
                "iss",
                json!("https://sts.windows.net/99999999-2222-3333-4444-555555555555/"),
            ))),
            401,
        ),
        ("expired", Some(with(change("exp", json!(now - 600)))), 401),
        (
            "not yet valid",
            Some(with(change("nbf", json!(now + 600)))),
            401,
        ),
        (
            "without the role",
            Some(with(change("roles", json!(["Reader"])))),
            403,
        ),
        ("without roles", Some(with(without("roles"))), 403),
        (
            "issued to another app",
            Some(with(change(
                "appid",
                json!("00000000-0000-0000-0000-000000000001"),
            ))),
            403,
        ),
    ];
    for (what, token, status) in cases {
        let answer = deliver(&hook.base, token.as_deref(), &events()).await;
        assert_eq!(answer.status, status, "{what}: {}", answer.body);
    }
    // A v2 token names its caller in `azp` and its issuer so.
    let mut v2 = without("appid");
    v2["azp"] = json!(EVENT_GRID_APP_ID);
    v2["iss"] = json!(format!("https://login.microsoftonline.com/{TENANT}/v2.0"));
    let answer = deliver(&hook.base, Some(&with(v2)), &events()).await;
    assert_eq!(
        (answer.status, outcomes(&answer)),
        (200, vec!["executed".to_string()])
    );
    // Nothing refused was executed: the refused order is still new.
    let refused_then_good = events();
    let _ = deliver(&hook.base, None, &refused_then_good).await;
    let good = deliver(&hook.base, Some(&issuer.token()), &refused_then_good).await;
    assert_eq!(outcomes(&good), vec!["executed".to_string()]);
}

#[tokio::test]
async fn rolled_keys_are_fetched_again_and_keys_that_cannot_be_had_are_503() {
    let redis = RedisServer::start();
    let mut issuer = Issuer::start().await;
    let hook = Webhook::start(&redis, &issuer.settings()).await;
    let ok = deliver(
        &hook.base,
        Some(&issuer.token()),
        &json!([eg_event(order("k"))]),
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    let again = deliver(
        &hook.base,
        Some(&issuer.token()),
        &json!([eg_event(order("k1"))]),
    )
    .await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(issuer.fetches(), 1, "the keys are fetched once and kept");
    // Entra ID rolls its keys. A token signed by the new key, so soon after
    // the fetch, is answered 503 (Event Grid delivers again later, when the
    // keys may be fetched again), never 401, which Event Grid never retries;
    // and it costs no fetch (a flood of made-up key ids costs none either).
    let rolled = issuer.new_key("key-2");
    issuer.publish(&[&issuer.key, &rolled]);
    let later = json!([eg_event(order("k2"))]);
    let answer = deliver(&hook.base, Some(&rolled.sign(&event_grid_claims())), &later).await;
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert_eq!(issuer.fetches(), 1);
    // A process that starts after the roll fetches the keys at its first
    // token and takes the new key.
    drop(hook);
    let hook = Webhook::start(&redis, &issuer.settings()).await;
    let answer = deliver(&hook.base, Some(&rolled.sign(&event_grid_claims())), &later).await;
    assert_eq!(
        (answer.status, outcomes(&answer)),
        (200, vec!["executed".to_string()])
    );
    assert_eq!(issuer.fetches(), 2);
    drop(hook);

    // A webhook whose keys cannot be fetched answers 503 (Event Grid
    // retries), never 401 or 403 (which it never retries).
    issuer.stop();
    let hook = Webhook::start(&redis, &issuer.settings()).await;
    let answer = deliver(
        &hook.base,
        Some(&issuer.token()),
        &json!([eg_event(order("down"))]),
    )
    .await;
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert!(hook.log().contains("signing keys"), "{}", hook.log());
}

#[tokio::test]
async fn a_key_endpoint_outage_costs_one_fetch_however_many_deliveries_come() {
    let redis = RedisServer::start();
    let issuer = Issuer::start().await;
    // The key endpoint answers 500, slowly.
    issuer.answer_keys(500, Duration::from_millis(500));
    let hook = Webhook::start(&redis, &issuer.settings()).await;
    let events = json!([eg_event(order("outage"))]);
    let token = issuer.token();
    // Four at once: one fetch, which all four wait for together.
    let at_once =
        futures::future::join_all((0..4).map(|_| deliver(&hook.base, Some(&token), &events))).await;
    assert_eq!(issuer.fetches(), 1, "one fetch for everyone");
    for answer in at_once {
        assert_eq!(
            (answer.status, answer.body),
            (503, json!({ "error": "keys unavailable" }))
        );
    }
    // A failed fetch moments ago: 503 at once, without another.
    for _ in 0..6 {
        assert_eq!(deliver(&hook.base, Some(&token), &events).await.status, 503);
    }
    assert_eq!(issuer.fetches(), 1, "a floor between fetches");
}

/// Deliver `events` with `token` until `done` says the answer ends the
/// wait, asserting each answer's status is `status` until then.
#[cfg(feature = "failpoints")]
async fn deliver_until(
    base: &str,
    token: &str,
    events: &Value,
    status: u16,
    done: impl Fn(&WebhookAnswer) -> bool,
) -> WebhookAnswer {
    let started = std::time::Instant::now();
    loop {
        let answer = deliver(base, Some(token), events).await;
        if done(&answer) {
            return answer;
        }
        assert_eq!(answer.status, status, "{}", answer.body);
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "never done: {}",
            answer.body
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(feature = "failpoints")]
#[tokio::test]
async fn held_keys_serve_through_a_key_endpoint_outage_and_an_unknown_key_id_is_503_not_401() {
    let redis = RedisServer::start();
    let issuer = Issuer::start().await;
    // Half a second between fetches in place of 30.
    let mut settings = issuer.settings();
    settings.push((
        "FAILPOINTS".into(),
        "webhook_keys_floor_ms=return(500)".into(),
    ));
    let hook = Webhook::start(&redis, &settings).await;
    let first = deliver(
        &hook.base,
        Some(&issuer.token()),
        &json!([eg_event(order("held"))]),
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(issuer.fetches(), 1);

    // The key endpoint fails; Entra ID has rolled its keys meanwhile.
    issuer.answer_keys(500, Duration::ZERO);
    let rolled = issuer.new_key("key-2");
    let by_rolled = rolled.sign(&event_grid_claims());
    let events = json!([eg_event(order("rolled"))]);
    // A token of the keys held: served, the outage changes nothing.
    let held = deliver(
        &hook.base,
        Some(&issuer.token()),
        &json!([eg_event(order("held2"))]),
    )
    .await;
    assert_eq!(held.status, 200, "{}", held.body);
    // The rolled key id: 503 while the keys cannot be fetched, through the
    // floor and through a failed fetch (never 401, never retried).
    deliver_until(&hook.base, &by_rolled, &events, 503, |_| {
        issuer.fetches() >= 2
    })
    .await;
    let answer = deliver(&hook.base, Some(&by_rolled), &events).await;
    assert_eq!(
        (answer.status, answer.body),
        (503, json!({ "error": "keys unavailable" }))
    );
    // The endpoint is back with the rolled key: found once the floor allows.
    issuer.publish(&[&issuer.key, &rolled]);
    issuer.answer_keys(200, Duration::ZERO);
    let done = deliver_until(&hook.base, &by_rolled, &events, 503, |a| a.status != 503).await;
    assert_eq!(
        (done.status, outcomes(&done)),
        (200, vec!["executed".to_string()])
    );
}

#[cfg(feature = "failpoints")]
#[tokio::test]
async fn keys_held_too_long_are_refreshed_behind_the_deliveries_once_per_floor() {
    let redis = RedisServer::start();
    let issuer = Issuer::start().await;
    // Keys always held too long; a second between fetches.
    let mut settings = issuer.settings();
    settings.push((
        "FAILPOINTS".into(),
        "webhook_keys_floor_ms=return(1000);webhook_keys_kept_ms=return(0)".into(),
    ));
    let hook = Webhook::start(&redis, &settings).await;
    let token = issuer.token();
    let first = deliver(&hook.base, Some(&token), &json!([eg_event(order("old"))])).await;
    assert_eq!(first.status, 200, "{}", first.body);
    // The identity provider's incident: each fetch hangs, then fails.
    issuer.answer_keys(500, Duration::from_secs(3));
    let started = std::time::Instant::now();
    for _ in 0..10 {
        let answer = deliver(&hook.base, Some(&token), &json!([eg_event(order("old"))])).await;
        assert_eq!(answer.status, 200, "the keys held serve: {}", answer.body);
    }
    let floors = started.elapsed().as_millis() / 1000 + 1;
    let refreshes = issuer.fetches() - 1;
    assert!(
        refreshes as u128 <= floors,
        "{refreshes} refreshes in {:?}: at most one per second",
        started.elapsed()
    );
}

#[tokio::test]
async fn both_audience_forms_and_the_issuers_the_authority_publishes_are_taken() {
    let redis = RedisServer::start();
    let issuer = Issuer::start().await;
    // A sovereign cloud: its own issuers, in its OpenID configuration.
    let (v1, v2) = (
        format!("https://sts.chinacloudapi.cn/{TENANT}/"),
        format!("https://login.chinacloudapi.cn/{TENANT}/v2.0"),
    );
    issuer.set_issuers(&v1, &v2);
    let app = "5b3c7f3e-8a52-4c1e-9f0e-0d1c2b3a4f5e";
    let mut settings = issuer.settings();
    settings.retain(|(k, _)| k != "WEBHOOK_AUDIENCE");
    settings.push((
        "WEBHOOK_AUDIENCE".into(),
        format!("api://{app}, api://other-name"),
    ));
    let hook = Webhook::start(&redis, &settings).await;
    let token = |aud: &str, iss: &str, v2: bool| {
        let mut claims = event_grid_claims();
        claims["aud"] = json!(aud);
        claims["iss"] = json!(iss);
        if v2 {
            claims.as_object_mut().unwrap().remove("appid");
            claims["azp"] = json!(EVENT_GRID_APP_ID);
        }
        issuer.key.sign(&claims)
    };
    let api = format!("api://{app}");
    for (what, token, status) in [
        ("v1, the app id URI", token(&api, &v1, false), 200),
        ("v2, the bare app id", token(app, &v2, true), 200),
        ("v1, the bare app id", token(app, &v1, false), 200),
        (
            "the other name listed",
            token("api://other-name", &v1, false),
            200,
        ),
        ("another app", token("api://another-app", &v1, false), 401),
        (
            "the public cloud's issuer",
            token(
                app,
                &format!("https://login.microsoftonline.com/{TENANT}/v2.0"),
                true,
            ),
            401,
        ),
    ] {
        let answer = deliver(&hook.base, Some(&token), &json!([eg_event(order("aud"))])).await;
        assert_eq!(answer.status, status, "{what}: {}", answer.body);
    }
}
