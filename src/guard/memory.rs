//! `MemoryGuard`: the embedded default. Same semantics as Redis (NX, owner
//! token, owner's deadline and takeover, TTL expiry) inside one process;
//! nothing is shared between processes.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use async_trait::async_trait;

use super::{
    classify_existing, Acquisition, GuardEntry, GuardError, GuardSettings, IdempotencyGuard, Token,
    COMPLETED,
};

struct Entry {
    value: String,
    fingerprint: Option<String>,
    expires_at: Instant,
    /// A reservation's owner's deadline: past it, it may be taken over.
    owner_deadline: Option<Instant>,
}

/// In-process guard with TTL expiry.
pub struct MemoryGuard {
    settings: GuardSettings,
    entries: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    map: HashMap<String, Entry>,
    /// Size after the last sweep: sweep again when the map has doubled, so
    /// expired keys cost amortised O(1) and memory stays bounded by live keys.
    swept_at_len: usize,
}

impl Entries {
    /// The live entry for `order_id`, dropping it first if it has expired.
    fn live(&mut self, order_id: &str, now: Instant) -> Option<&mut Entry> {
        if self.map.get(order_id).is_some_and(|e| e.expires_at <= now) {
            self.map.remove(order_id);
        }
        self.map.get_mut(order_id)
    }

    fn maybe_sweep(&mut self, now: Instant) {
        if self.map.len() > 2 * self.swept_at_len.max(1024) {
            self.map.retain(|_, e| e.expires_at > now);
            self.swept_at_len = self.map.len();
        }
    }
}

impl MemoryGuard {
    pub fn new(settings: GuardSettings) -> MemoryGuard {
        MemoryGuard {
            settings,
            entries: Mutex::new(Entries::default()),
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Entries> {
        // A panic while holding the lock cannot leave an entry half-written.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl IdempotencyGuard for MemoryGuard {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn acquire(&self, order_id: &str) -> Acquisition {
        let now = Instant::now();
        let mut entries = self.entries();
        entries.maybe_sweep(now);
        let mut taken_over = false;
        if let Some(e) = entries.live(order_id, now) {
            match e.owner_deadline {
                Some(deadline) if deadline < now => taken_over = true,
                _ => return classify_existing(Some(e.value.clone()), e.fingerprint.clone()),
            }
        }
        let token = Token::new();
        entries.map.insert(
            order_id.to_string(),
            Entry {
                value: token.value(),
                fingerprint: None,
                expires_at: now + self.settings.processing_ttl,
                owner_deadline: Some(now + self.settings.lease.min(self.settings.processing_ttl)),
            },
        );
        if taken_over {
            Acquisition::TakenOver(token)
        } else {
            Acquisition::Acquired(token)
        }
    }

    async fn complete(&self, order_id: &str, fingerprint: &str) -> Result<(), GuardError> {
        let now = Instant::now();
        self.entries().map.insert(
            order_id.to_string(),
            Entry {
                value: COMPLETED.to_string(),
                fingerprint: Some(fingerprint.to_string()),
                expires_at: now + self.settings.completed_ttl,
                owner_deadline: None,
            },
        );
        Ok(())
    }

    async fn release(&self, order_id: &str, token: &Token) -> Result<bool, GuardError> {
        let now = Instant::now();
        let mut entries = self.entries();
        let ours = entries
            .live(order_id, now)
            .is_some_and(|e| e.value == token.value());
        if ours {
            entries.map.remove(order_id);
        }
        Ok(ours)
    }

    async fn extend(&self, order_id: &str, token: &Token) -> Result<bool, GuardError> {
        let now = Instant::now();
        let ttl = self.settings.processing_ttl;
        let mut entries = self.entries();
        match entries.live(order_id, now) {
            Some(e) if e.value == token.value() => {
                e.expires_at = now + ttl;
                e.owner_deadline = Some(now + self.settings.lease.min(ttl));
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn completed_orders(&self) -> Result<Vec<(String, Option<String>)>, GuardError> {
        let now = Instant::now();
        Ok(self
            .entries()
            .map
            .iter()
            .filter(|(_, e)| e.expires_at > now && e.value == COMPLETED)
            .map(|(id, e)| (id.clone(), e.fingerprint.clone()))
            .collect())
    }

    async fn forget_completed(
        &self,
        order_id: &str,
        marker: Option<&str>,
    ) -> Result<bool, GuardError> {
        let now = Instant::now();
        let mut entries = self.entries();
        let same = entries
            .live(order_id, now)
            .is_some_and(|e| e.value == COMPLETED && e.fingerprint.as_deref() == marker);
        if same {
            entries.map.remove(order_id);
        }
        Ok(same)
    }

    async fn inspect(&self, order_id: &str) -> Result<GuardEntry, GuardError> {
        let now = Instant::now();
        let mut entries = self.entries();
        Ok(match entries.live(order_id, now) {
            Some(e) => GuardEntry {
                value: Some(e.value.clone()),
                ttl_seconds: Some(e.expires_at.duration_since(now).as_secs() as i64),
                fingerprint: e.fingerprint.clone(),
            },
            None => GuardEntry {
                value: None,
                ttl_seconds: None,
                fingerprint: None,
            },
        })
    }
}
