//! The idempotency guard: a fast, shared "who is working on this order" flag.
//!
//! Protocol (docs/architecture.md, "The map: the path of one event"): `acquire` sets
//! `{prefix}{orderId} = PROCESANDO:<token>` only if absent (`SET NX EX`); the
//! winner processes the order, `complete` turns the key into `COMPLETADA` with
//! a long TTL to absorb late duplicates, and `release` deletes the key only if
//! it still holds our token (compare-and-delete). The guard is an optimisation,
//! never the source of truth: the store's unique index and forward-only status
//! keep the effect single even when the guard is lost or unavailable.
//!
//! Beside the guard key, `complete` stores the order's fingerprint under a
//! companion key so that a *different* order reusing a completed id is reported
//! as a conflict without a database round trip.
//!
//! **Takeover at the owner's deadline.** A reservation carries its owner's
//! deadline (`PROCESANDO:<token>:<deadline>`, the guard's clock: Redis'
//! `TIME`): the owner answers its event by then, done or not
//! ([`GuardSettings::lease`] = the processor's per-event deadline). An acquire
//! that finds a reservation past its deadline replaces it in the same atomic
//! step, so a killed worker's order waits for its deadline, not for the
//! processing TTL. An owner still alive after being overtaken is harmless:
//! the store's unique index and forward-only update decide who executes, its
//! `release` deletes only its own token, and its `complete` records only
//! what the store made true.

mod entra;
mod memory;
mod redis;

use std::time::Duration;

use async_trait::async_trait;

pub use self::entra::{object_id, EntraCredentials};
pub use self::memory::{MemoryGuard, MEMORY_GUARD_MAX_COMPLETED};
pub use self::redis::{RedisGuard, Topology};

/// Value prefix of a key held by a worker; the token follows it.
pub const PROCESSING: &str = "PROCESANDO";
/// Value of a key whose order is durably done.
pub const COMPLETED: &str = "COMPLETADA";

/// Proof of ownership of one reservation: unique per attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    pub fn new() -> Token {
        // 122 random bits from the thread-local CSPRNG: unique per attempt
        // without a getrandom system call on every acquire.
        let bytes: [u8; 16] = rand::random();
        Token(
            uuid::Builder::from_random_bytes(bytes)
                .into_uuid()
                .simple()
                .to_string(),
        )
    }

    /// What identifies this token's reservation: `PROCESANDO:<token>`; the
    /// stored value adds the owner's deadline after one more `:`.
    pub fn value(&self) -> String {
        format!("{PROCESSING}:{}", self.0)
    }
}

impl Default for Token {
    fn default() -> Self {
        Token::new()
    }
}

/// What `acquire` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquisition {
    /// The reservation is ours: process the order.
    Acquired(Token),
    /// The reservation is ours, taken over from an owner past its deadline
    /// (dead, or alive and harmless): process the order.
    TakenOver(Token),
    /// The order is done; `fingerprint` is the completion marker stored
    /// beside it (`<store identity>/<fingerprint>`), when there is one.
    Completed { fingerprint: Option<String> },
    /// Another worker holds the reservation.
    InProgress,
    /// The guard could not be reached; the reason is for the logs.
    Unavailable(String),
}

/// What a guard key holds right now (for `order-guard status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardEntry {
    pub value: Option<String>,
    /// Seconds left, `None` when the key does not exist.
    pub ttl_seconds: Option<i64>,
    pub fingerprint: Option<String>,
}

/// The guard could not do what was asked (Redis down, timeout).
#[derive(Debug, Clone, thiserror::Error)]
#[error("guard unavailable: {0}")]
pub struct GuardError(pub String);

/// Time-to-live settings shared by every guard.
#[derive(Debug, Clone)]
pub struct GuardSettings {
    /// Key prefix, default `orden:`.
    pub prefix: String,
    /// Bound for a dead owner's reservation (default 300 s).
    pub processing_ttl: Duration,
    /// How long `COMPLETADA` absorbs late duplicates (default 24 h).
    pub completed_ttl: Duration,
    /// The owner's deadline, counted from the acquire: past it the
    /// reservation may be taken over. The processor's per-event deadline
    /// (default 20 s); never longer than `processing_ttl` in effect.
    pub lease: Duration,
}

impl Default for GuardSettings {
    fn default() -> Self {
        GuardSettings {
            prefix: "orden:".into(),
            processing_ttl: Duration::from_secs(300),
            completed_ttl: Duration::from_secs(86_400),
            lease: Duration::from_secs(20),
        }
    }
}

impl GuardSettings {
    /// `{prefix}{{orderId}}`, e.g. `orden:{o-1}`: the order id is a Redis
    /// hash tag, so the guard key and the fingerprint key of one order hash
    /// to the same cluster slot (a script may only touch keys of one slot).
    pub fn key(&self, order_id: &str) -> String {
        format!("{}{}", self.prefix, hash_tagged(order_id))
    }

    /// The companion key holding a completed order's fingerprint,
    /// `orden-fp:{orderId}`. Its prefix differs from the guard prefix in its
    /// last character, so neither is a prefix of the other and no order id
    /// can make the two key spaces meet; the same hash tag puts it in the
    /// guard key's slot.
    pub fn fingerprint_key(&self, order_id: &str) -> String {
        format!("{}{}", self.fingerprint_prefix(), hash_tagged(order_id))
    }

    fn fingerprint_prefix(&self) -> String {
        let mut p = self.prefix.clone();
        let last = p.pop().unwrap_or(':');
        p.push(if last == '-' { '_' } else { '-' });
        p.push_str("fp:");
        p
    }

    /// The order id of a guard key made by [`GuardSettings::key`]; `None`
    /// for any other key (another prefix, a fingerprint key, a key in the
    /// format before hash tags: `orden:<id>`).
    pub fn order_id_of(&self, key: &str) -> Option<String> {
        let rest = key.strip_prefix(self.prefix.as_str())?;
        if let Some(id) = rest.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
            if !id.is_empty() && !id.starts_with('}') {
                return Some(id.to_string());
            }
        }
        let id = rest.strip_prefix(CLOSING_BRACE_TAG)?.strip_suffix('~')?;
        (id.is_empty() || id.starts_with('}')).then(|| id.to_string())
    }
}

/// The tag of ids that begin with `}`: Redis reads `{}…` as an empty tag
/// and would hash the whole key, putting an order's two keys in different
/// slots.
const CLOSING_BRACE_TAG: &str = "{~}";

/// `{id}`, whose hash tag (the text up to the first `}`) is never empty;
/// for an id that begins with `}` it is `{~}id~` (tag `~`; it ends in `~`,
/// never `}`, so it cannot be the `{id}` form of another id).
fn hash_tagged(order_id: &str) -> String {
    if order_id.starts_with('}') || order_id.is_empty() {
        format!("{CLOSING_BRACE_TAG}{order_id}~")
    } else {
        format!("{{{order_id}}}")
    }
}

/// The guard's operations. Implementations must be atomic per key across every
/// process that shares them.
#[async_trait]
pub trait IdempotencyGuard: Send + Sync {
    /// `"redis"` or `"memory"`, for logs and answers.
    fn name(&self) -> &'static str;

    /// Check, before serving, that the backend is the kind configured (a
    /// Redis cluster reached with the cluster client, a single endpoint with
    /// the plain one): `Err` says which setting to change. An unreachable
    /// backend is not an error here (its operations answer `Unavailable`).
    async fn preflight(&self) -> Result<(), GuardError> {
        Ok(())
    }

    /// Reserve the order, or say why not, in one round trip.
    async fn acquire(&self, order_id: &str) -> Acquisition;

    /// Mark the order done (`COMPLETADA`, long TTL) with its completion
    /// marker beside it (`<store identity>/<fingerprint>`, opaque here).
    /// Unconditional: it is only called after the store committed.
    async fn complete(&self, order_id: &str, marker: &str) -> Result<(), GuardError>;

    /// Delete the reservation if it is still `token`'s; `Ok(false)` when it
    /// was not (expired, taken over, completed).
    async fn release(&self, order_id: &str, token: &Token) -> Result<bool, GuardError>;

    /// Push the reservation's expiry out by the processing TTL while the owner
    /// is alive; `Ok(false)` when it is no longer ours.
    async fn extend(&self, order_id: &str, token: &Token) -> Result<bool, GuardError>;

    /// What the key holds now.
    async fn inspect(&self, order_id: &str) -> Result<GuardEntry, GuardError>;

    /// Every order marked `COMPLETADA`, with its completion marker (for the
    /// operator's `prune-guard`; a full scan, never on the request path).
    async fn completed_orders(&self) -> Result<Vec<(String, Option<String>)>, GuardError>;

    /// Remove an order's `COMPLETADA` key and its marker, only if they still
    /// hold what was listed; `Ok(false)` when they changed meanwhile.
    async fn forget_completed(
        &self,
        order_id: &str,
        marker: Option<&str>,
    ) -> Result<bool, GuardError>;
}

/// Interpret a guard value found by a failed acquire.
pub(crate) fn classify_existing(value: Option<String>, fingerprint: Option<String>) -> Acquisition {
    match value.as_deref() {
        Some(COMPLETED) => Acquisition::Completed { fingerprint },
        // A PROCESANDO value, or anything unexpected: somebody else's.
        _ => Acquisition::InProgress,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_keys_never_meet_guard_keys() {
        for prefix in ["orden:", "x-", "a", "fp:"] {
            let s = GuardSettings {
                prefix: prefix.into(),
                ..GuardSettings::default()
            };
            let fp = s.fingerprint_key("id");
            let fp_prefix = fp.strip_suffix("{id}").unwrap();
            assert!(
                !fp_prefix.starts_with(prefix),
                "{fp_prefix} starts with {prefix}"
            );
            assert!(
                !prefix.starts_with(fp_prefix),
                "{prefix} starts with {fp_prefix}"
            );
        }
        assert_eq!(
            GuardSettings::default().fingerprint_key("o1"),
            "orden-fp:{o1}"
        );
    }

    /// The two keys of an order share a cluster slot for every id (Redis'
    /// hash tag: the text between the first `{` and the first `}` after it,
    /// when not empty), and a key gives back its order id.
    #[test]
    fn both_keys_of_an_order_share_a_slot_and_give_back_the_id() {
        use ::redis::cluster_routing::Slot;
        let default = GuardSettings::default();
        assert_eq!(default.key("o-1"), "orden:{o-1}");
        assert_eq!(default.key("}x"), "orden:{~}}x~");
        for prefix in ["orden:", "ordms:", "x-"] {
            let s = GuardSettings {
                prefix: prefix.into(),
                ..GuardSettings::default()
            };
            for id in [
                "o-1",
                "ord-20250614-00731",
                "a}b",
                "}x",
                "}",
                "{",
                "{}",
                "a{b}c",
                "~",
                "{~}",
                "x~",
                "ü€",
                "a b",
            ] {
                let (k, fp) = (s.key(id), s.fingerprint_key(id));
                assert_eq!(Slot::for_key(&k), Slot::for_key(&fp), "{k} / {fp}");
                assert_eq!(s.order_id_of(&k).as_deref(), Some(id), "{k}");
                assert_eq!(s.order_id_of(&fp), None, "{fp} is not a guard key");
            }
            // Distinct ids, distinct keys (the `}` form never ends in `}`).
            assert_ne!(s.key("}x"), s.key("~}}x~"));
            assert_ne!(s.key("}x~"), s.key("~}}x"));
            // A key in the format before hash tags is not listed.
            assert_eq!(s.order_id_of(&format!("{prefix}o-1")), None);
        }
        // Ids spread over slots: the tag is the id, not a constant.
        assert_ne!(
            Slot::for_key(default.key("o-1")),
            Slot::for_key(default.key("o-2"))
        );
    }

    #[test]
    fn tokens_are_unique_and_prefixed() {
        let (a, b) = (Token::new(), Token::new());
        assert_ne!(a, b);
        assert!(a.value().starts_with("PROCESANDO:"));
    }
}
