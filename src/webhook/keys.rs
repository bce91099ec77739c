//! The tenant's signing keys, held by one refresher, with the issuers its
//! OpenID configuration documents (v1, v2) name, fetched with them.
//!
//! The keys are read on the request path without waiting (a snapshot
//! under a short lock, never held across a fetch). A fetch is one task for
//! everyone: requests that need it join it ([`futures::future::Shared`]
//! over a spawned task), so N requests at once cost one fetch and wait for
//! it once, not one behind another. Fetches are at least
//! [`REFETCH_AT_MOST_EVERY`] apart whatever the state (no keys, keys held
//! too long, a key id they lack), so tokens made up by anyone cost no
//! fetch, and an identity provider that is down is asked once per floor.
//! Keys held are used while a refresh fails: a key endpoint outage changes
//! nothing for tokens its held keys signed; keys held past [`KEYS_KEPT_FOR`]
//! are refreshed in the background, never in a delivery's way. What to do
//! for a key id is one pure decision, [`key_step`].

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, FutureExt, Shared};
use jsonwebtoken::jwk::{Jwk, JwkSet};

/// Two fetches of the keys are at least this far apart.
pub const REFETCH_AT_MOST_EVERY: Duration = Duration::from_secs(30);
/// Keys held longer than this are fetched again (in the background; the
/// keys held serve meanwhile).
pub const KEYS_KEPT_FOR: Duration = Duration::from_secs(24 * 3600);

/// The floor between fetches (a test build may shorten it: the fault
/// point `webhook_keys_floor_ms`).
fn floor() -> Duration {
    fail::fail_point!(crate::faults::WEBHOOK_KEYS_FLOOR_MS, |ms| {
        Duration::from_millis(ms.and_then(|m| m.parse().ok()).unwrap_or(0))
    });
    REFETCH_AT_MOST_EVERY
}

/// How long keys are kept (a test build may shorten it: the fault point
/// `webhook_keys_kept_ms`).
fn kept_for() -> Duration {
    fail::fail_point!(crate::faults::WEBHOOK_KEYS_KEPT_MS, |ms| {
        Duration::from_millis(ms.and_then(|m| m.parse().ok()).unwrap_or(0))
    });
    KEYS_KEPT_FOR
}

/// What to do for a token's key id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KeyStep {
    /// Check the token with the key held.
    Use,
    /// Check it with the key held, and refresh the keys in the background
    /// (held too long).
    UseAndRefresh,
    /// Fetch the keys and wait for them (none held, or a key id they lack).
    Fetch,
    /// Wait for the fetch under way.
    Join,
    /// Keys are held but lack the key id, and were fetched too lately to
    /// fetch them again: `503` (Event Grid delivers again later, when a
    /// rolled key is found; a made-up id is then `401`).
    AskAgainIn(Duration),
    /// No keys held, and a fetch failed too lately to try again: `503`
    /// without a fetch.
    Unavailable(Duration),
}

/// The step for a key id (pure). `held`: whether the keys held have the
/// key id, and their age; `since_fetch`: how long ago a fetch last began;
/// `in_flight`: whether one is under way.
pub(super) fn key_step(
    held: Option<(bool, Duration)>,
    since_fetch: Option<Duration>,
    in_flight: bool,
    floor: Duration,
    kept_for: Duration,
) -> KeyStep {
    let may_fetch = !in_flight && since_fetch.is_none_or(|s| s >= floor);
    let wait = floor.saturating_sub(since_fetch.unwrap_or(floor));
    match held {
        Some((true, age)) if age >= kept_for && may_fetch => KeyStep::UseAndRefresh,
        Some((true, _)) => KeyStep::Use,
        _ if in_flight => KeyStep::Join,
        _ if may_fetch => KeyStep::Fetch,
        Some((false, _)) => KeyStep::AskAgainIn(wait),
        None => KeyStep::Unavailable(wait),
    }
}

/// The issuers a token of the tenant may name (v1, v2).
pub(super) type Issuers = Arc<[String]>;

/// Keys fetched, the issuers the OpenID configuration named, and when.
struct Held {
    set: JwkSet,
    issuers: Issuers,
    fetched: Instant,
}

/// A fetch's outcome, shared by everyone waiting for it.
type Fetched = Result<Arc<Held>, String>;
type Flight = Shared<BoxFuture<'static, Fetched>>;

#[derive(Default)]
struct State {
    held: Option<Arc<Held>>,
    last_fetch: Option<Instant>,
    in_flight: Option<Flight>,
}

/// Why a key cannot be had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum NoKey {
    /// The keys were had, and lack the key id: `401`.
    Unknown(String),
    /// The keys cannot be had now: `503`.
    Unavailable(String),
}

/// The keys of one JWKS document, refreshed by one task at a time.
pub(super) struct Keys {
    url: String,
    configurations: Arc<[String; 2]>,
    client: reqwest::Client,
    state: Arc<Mutex<State>>,
}

impl Keys {
    /// The keys of the JWKS document at `url`, with the issuers the OpenID
    /// configuration documents at `configurations` name.
    pub(super) fn new(url: String, configurations: [String; 2], client: reqwest::Client) -> Keys {
        Keys {
            url,
            configurations: Arc::new(configurations),
            client,
            state: Arc::default(),
        }
    }

    /// The key `kid` names and the tenant's issuers, by [`key_step`].
    pub(super) async fn key(&self, kid: &str) -> Result<(Jwk, Issuers), NoKey> {
        let now = Instant::now();
        let (step, held, flight) = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let held = state.held.clone();
            let step = key_step(
                held.as_ref().map(|h| {
                    (
                        h.set.find(kid).is_some(),
                        now.saturating_duration_since(h.fetched),
                    )
                }),
                state.last_fetch.map(|at| now.saturating_duration_since(at)),
                state.in_flight.is_some(),
                floor(),
                kept_for(),
            );
            let flight = match step {
                KeyStep::Fetch | KeyStep::UseAndRefresh => Some(self.begin(&mut state, now)),
                KeyStep::Join => state.in_flight.clone(),
                _ => None,
            };
            (step, held, flight)
        };
        let found = |held: &Held| {
            held.set
                .find(kid)
                .map(|k| (k.clone(), Arc::clone(&held.issuers)))
        };
        match step {
            KeyStep::Use | KeyStep::UseAndRefresh => held
                .as_deref()
                .and_then(found)
                .ok_or_else(|| NoKey::Unknown(kid.to_string())),
            KeyStep::AskAgainIn(wait) => Err(NoKey::Unavailable(format!(
                "the token's signing key {kid:?} is not among the keys held; they are fetched again in {} s at the earliest (Entra ID may have rolled them)",
                wait.as_secs().max(1)
            ))),
            KeyStep::Unavailable(wait) => Err(NoKey::Unavailable(format!(
                "no signing keys held: the last fetch from {} failed; the next is in {} s at the earliest",
                self.url,
                wait.as_secs().max(1)
            ))),
            KeyStep::Fetch | KeyStep::Join => {
                let Some(flight) = flight else {
                    return Err(NoKey::Unavailable("no fetch under way".into()));
                };
                match flight.await {
                    Ok(held) => found(&held).ok_or_else(|| {
                        NoKey::Unknown(format!(
                            "the token's signing key {kid:?} is not among the keys of {}",
                            self.url
                        ))
                    }),
                    // A key id the keys held lack, and no fresh keys: it
                    // may be a roll not yet seen, so Event Grid must retry.
                    Err(e) => Err(NoKey::Unavailable(e)),
                }
            }
        }
    }

    /// A fetch begun now, as one task whatever waits for it: it replaces
    /// the keys held when it succeeds, and leaves them when it fails.
    fn begin(&self, state: &mut State, now: Instant) -> Flight {
        state.last_fetch = Some(now);
        let (url, configurations, client, shared) = (
            self.url.clone(),
            Arc::clone(&self.configurations),
            self.client.clone(),
            Arc::clone(&self.state),
        );
        let task = tokio::spawn(async move {
            let [v1, v2] = &*configurations;
            let fetched = futures::try_join!(
                fetch::<JwkSet>(&client, &url),
                fetch::<Configuration>(&client, v1),
                fetch::<Configuration>(&client, v2),
            )
            .map(|(set, v1, v2)| {
                Arc::new(Held {
                    set,
                    issuers: Arc::from([v1.issuer, v2.issuer]),
                    fetched: Instant::now(),
                })
            });
            let mut state = shared.lock().unwrap_or_else(|p| p.into_inner());
            match &fetched {
                Ok(held) => state.held = Some(Arc::clone(held)),
                Err(e) if state.held.is_some() => {
                    log::warn!("{e}; the keys held are used meanwhile")
                }
                Err(e) => log::warn!("{e}"),
            }
            state.in_flight = None;
            fetched
        });
        let flight = async move {
            task.await
                .unwrap_or_else(|e| Err(format!("the key fetch failed: {e}")))
        }
        .boxed()
        .shared();
        state.in_flight = Some(flight.clone());
        flight
    }
}

/// What is read of an OpenID configuration document.
#[derive(serde::Deserialize)]
struct Configuration {
    issuer: String,
}

async fn fetch<T: serde::de::DeserializeOwned>(
    client: &reqwest::Client,
    url: &str,
) -> Result<T, String> {
    let failed = |e: String| format!("cannot fetch Entra ID's signing keys from {url}: {e}");
    let response = client
        .get(url)
        .send()
        .await
        .map_err(|e| failed(e.to_string()))?;
    if !response.status().is_success() {
        return Err(failed(format!("HTTP {}", response.status())));
    }
    let body = response.bytes().await.map_err(|e| failed(e.to_string()))?;
    serde_json::from_slice(&body).map_err(|e| failed(format!("not the document expected: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: Duration = REFETCH_AT_MOST_EVERY;
    const K: Duration = KEYS_KEPT_FOR;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn step(held: Option<(bool, Duration)>, since: Option<Duration>, flying: bool) -> KeyStep {
        key_step(held, since, flying, F, K)
    }

    #[test]
    fn keys_held_serve_without_a_fetch_and_old_ones_are_refreshed_behind() {
        assert_eq!(step(Some((true, s(5))), Some(s(5)), false), KeyStep::Use);
        assert_eq!(
            step(Some((true, K)), Some(K), false),
            KeyStep::UseAndRefresh,
            "held too long: used, and refreshed in the background"
        );
        assert_eq!(
            step(Some((true, K)), Some(s(3)), false),
            KeyStep::Use,
            "a refresh failed 3 s ago: the floor holds, the keys held serve"
        );
        assert_eq!(
            step(Some((true, K)), Some(K), true),
            KeyStep::Use,
            "a refresh under way: not another"
        );
    }

    #[test]
    fn a_fetch_is_one_for_everyone_and_a_floor_apart_whatever_the_state() {
        // None held: the first fetches, the others join it.
        assert_eq!(step(None, None, false), KeyStep::Fetch);
        assert_eq!(step(None, Some(s(0)), true), KeyStep::Join);
        // None held, a fetch failed moments ago: 503 without a fetch.
        assert_eq!(
            step(None, Some(s(4)), false),
            KeyStep::Unavailable(F - s(4))
        );
        assert_eq!(step(None, Some(F), false), KeyStep::Fetch);
        // A key id the keys held lack.
        assert_eq!(
            step(Some((false, s(10))), Some(s(10)), false),
            KeyStep::AskAgainIn(F - s(10)),
            "too soon: ask again later, not 401"
        );
        assert_eq!(step(Some((false, F)), Some(F), false), KeyStep::Fetch);
        assert_eq!(step(Some((false, s(1))), Some(s(1)), true), KeyStep::Join);
        assert_eq!(step(Some((false, K)), None, false), KeyStep::Fetch);
    }
}
