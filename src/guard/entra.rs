//! Entra ID for Redis (`REDIS_AUTH=entra-id`): Azure Managed Redis and
//! Azure Cache for Redis take an access token as the password and the
//! identity's object id (the token's `oid` claim) as the user name.
//!
//! The redis crate does the connection side (its `token-based-authentication`
//! support): each new connection, single node or cluster, takes the current
//! credentials before it authenticates, and every live connection sends
//! `AUTH` again whenever new credentials arrive. This module supplies them: a
//! task that takes tokens from [`TokenSource`] (the same credentials as SQL's
//! `Active Directory Default`), publishes each new one, and sleeps until
//! [`REFRESH_MARGIN`] before it expires, so live connections are
//! re-authenticated minutes before the server would drop them. When no new
//! token can be had, the kept one serves while it is valid, refreshes
//! retried at pauses doubling from 1 s to 30 s (never past its end); once it
//! has expired, subscribers get the error (a new connection fails with it,
//! so the guard is unavailable and `GUARD_UNAVAILABLE` applies; a live one
//! keeps its last authentication until the server ends it) and the task
//! tries again at the same pauses.
//!
//! Neither token nor secret is logged: `BasicAuth`'s `Debug` hides the
//! password, and errors are [`crate::entra::TokenError`]'s.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use azure_core::time::OffsetDateTime;
use base64::Engine;
use futures::Stream;
use redis::auth::{BasicAuth, StreamingCredentialsProvider};
use redis::{ErrorKind, RedisError, RedisResult};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

use crate::entra::{TokenSource, REFRESH_MARGIN};

/// What subscribers see: nothing yet, credentials, or why there are none.
type Latest = Option<Result<BasicAuth, String>>;

/// Streams of Redis credentials from Entra ID tokens, for redis-rs.
#[derive(Clone)]
pub struct EntraCredentials {
    latest: watch::Receiver<Latest>,
    _refresh: Arc<AbortOnDropHandle<()>>,
}

impl EntraCredentials {
    /// Start taking tokens from `source` (inside a tokio runtime). The first
    /// is asked for at once; connections wait for it.
    pub fn start(source: TokenSource) -> EntraCredentials {
        log::info!("Redis: Entra ID tokens from {}", source.description());
        let (publish, latest) = watch::channel(None);
        let refresh = tokio::spawn(refresh(source, publish));
        EntraCredentials {
            latest,
            _refresh: Arc::new(AbortOnDropHandle::new(refresh)),
        }
    }
}

async fn refresh(source: TokenSource, publish: watch::Sender<Latest>) {
    let mut failures = 0u32;
    loop {
        let next = match source.token_until().await {
            Ok((token, expires_on)) => match object_id(&token) {
                Ok(oid) => {
                    let fresh = BasicAuth::new(oid, token);
                    // The kept token handed out again re-authenticates no one.
                    let changed = publish.send_if_modified(|latest| {
                        let same = matches!(latest, Some(Ok(kept))
                            if kept.username() == fresh.username() && kept.password() == fresh.password());
                        if !same {
                            *latest = Some(Ok(fresh));
                        }
                        !same
                    });
                    Ok((expires_on, changed))
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e.to_string()),
        };
        let now = OffsetDateTime::now_utc();
        let pause = match next {
            Ok((expires_on, false)) if expires_on - now <= REFRESH_MARGIN => {
                // The source handed the kept token back inside its margin:
                // its refresh failed (it logged why). Back off as for any
                // failure, but never past the kept token's end.
                failures += 1;
                kept_token_pause(failures, expires_on, now)
            }
            Ok((expires_on, _)) => {
                failures = 0;
                refresh_after(expires_on, now)
            }
            Err(e) => {
                // No valid token left (a kept one still valid would have
                // been handed out): new connections fail with why.
                log::warn!("Redis: {e}");
                publish.send_replace(Some(Err(e)));
                failures += 1;
                retry_pause(failures)
            }
        };
        tokio::time::sleep(pause).await;
    }
}

/// The pause after the `failures`-th failed refresh while the kept token
/// still serves: [`retry_pause`], but at most until 5 s before it expires
/// (and at least 1 s).
pub fn kept_token_pause(
    failures: u32,
    expires_on: OffsetDateTime,
    now: OffsetDateTime,
) -> Duration {
    let left =
        Duration::try_from(expires_on - now - Duration::from_secs(5)).unwrap_or(Duration::ZERO);
    retry_pause(failures).min(left).max(Duration::from_secs(1))
}

/// How long to wait before asking for the next token: until
/// [`REFRESH_MARGIN`] before this one expires, at least 1 s.
pub fn refresh_after(expires_on: OffsetDateTime, now: OffsetDateTime) -> Duration {
    let left = expires_on - now - REFRESH_MARGIN;
    Duration::try_from(left)
        .unwrap_or(Duration::ZERO)
        .max(Duration::from_secs(1))
}

/// The pause after the `failures`-th failure in a row (from 1): 1 s,
/// doubling, at most 30 s.
pub fn retry_pause(failures: u32) -> Duration {
    Duration::from_secs(1)
        .saturating_mul(1u32 << failures.saturating_sub(1).min(5))
        .min(Duration::from_secs(30))
}

/// The `oid` claim of an access token (a JWT): the identity's object id,
/// which Azure's Redis takes as the user name. The signature is not checked
/// here (the server checks the token); only the payload is read.
pub fn object_id(token: &str) -> Result<String, String> {
    let bad = |why: &str| {
        format!(
            "the Entra ID token is not usable for Redis: {why} (Azure's Redis takes the \
             identity's object id, the token's `oid` claim, as the user name)"
        )
    };
    let payload = token
        .split('.')
        .nth(1)
        .ok_or_else(|| bad("it is not a JWT"))?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .map_err(|_| bad("its payload is not base64url"))?;
    let claims: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|_| bad("its payload is not JSON"))?;
    match claims.get("oid").and_then(|v| v.as_str()) {
        Some(oid) if !oid.is_empty() => Ok(oid.to_string()),
        _ => Err(bad("it has no `oid` claim")),
    }
}

impl StreamingCredentialsProvider for EntraCredentials {
    fn subscribe(&self) -> Pin<Box<dyn Stream<Item = RedisResult<BasicAuth>> + Send + 'static>> {
        let mut latest = self.latest.clone();
        // The current value first (a new connection authenticates with it),
        // then every change.
        latest.mark_changed();
        Box::pin(futures::stream::unfold(latest, |mut latest| async move {
            loop {
                latest.changed().await.ok()?;
                let current = latest.borrow_and_update().clone();
                match current {
                    None => continue,
                    Some(Ok(auth)) => return Some((Ok(auth), latest)),
                    Some(Err(e)) => {
                        let e = RedisError::from((
                            ErrorKind::AuthenticationFailed,
                            "no Entra ID token for Redis",
                            e,
                        ));
                        return Some((Err(e), latest));
                    }
                }
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(claims: &str) -> String {
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        format!("{}.{}.sig", b64(r#"{"alg":"RS256"}"#), b64(claims))
    }

    #[test]
    fn the_user_name_is_the_tokens_object_id() {
        let oid = "6f1c7a36-0e3b-4b8e-9a55-1d2c3b4a5f60";
        assert_eq!(
            object_id(&jwt(&format!(r#"{{"oid":"{oid}"}}"#))).unwrap(),
            oid
        );
        for (token, why) in [
            ("opaque-token", "not a JWT"),
            ("a.!!!.c", "not base64url"),
            (&jwt("not json") as &str, "not JSON"),
            (&jwt(r#"{"sub":"x"}"#), "no `oid` claim"),
            (&jwt(r#"{"oid":""}"#), "no `oid` claim"),
        ] {
            let e = object_id(token).unwrap_err();
            assert!(e.contains(why), "{token}: {e}");
            assert!(e.contains("user name"), "{e}");
        }
    }

    #[test]
    fn a_token_is_refreshed_its_margin_before_expiry_and_never_in_a_busy_loop() {
        let now = OffsetDateTime::now_utc();
        let hour = Duration::from_secs(3600);
        assert_eq!(refresh_after(now + hour, now), hour - REFRESH_MARGIN);
        assert_eq!(
            refresh_after(now + REFRESH_MARGIN, now),
            Duration::from_secs(1)
        );
        assert_eq!(refresh_after(now - hour, now), Duration::from_secs(1));
    }

    #[test]
    fn a_failing_refresh_backs_off_while_the_kept_token_serves() {
        let now = OffsetDateTime::now_utc();
        let minute = now + Duration::from_secs(60);
        assert_eq!(kept_token_pause(1, minute, now), Duration::from_secs(1));
        assert_eq!(kept_token_pause(4, minute, now), Duration::from_secs(8));
        // Never past 5 s before the kept token's end, never a busy loop.
        assert_eq!(kept_token_pause(9, minute, now), Duration::from_secs(30));
        let soon = now + Duration::from_secs(20);
        assert_eq!(kept_token_pause(9, soon, now), Duration::from_secs(15));
        assert_eq!(kept_token_pause(9, now, now), Duration::from_secs(1));
    }

    #[test]
    fn failures_are_retried_at_pauses_doubling_to_half_a_minute() {
        let pauses: Vec<u64> = (1..=8).map(|n| retry_pause(n).as_secs()).collect();
        assert_eq!(pauses, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(retry_pause(u32::MAX), Duration::from_secs(30));
    }
}
