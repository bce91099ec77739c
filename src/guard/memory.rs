//! `MemoryGuard`: the embedded default. Same semantics as Redis (NX, owner
//! token, owner's deadline and takeover, TTL expiry) inside one process;
//! nothing is shared between processes.
//!
//! Bounded: it keeps at most `max_completed` `COMPLETADA` markers (default
//! [`MEMORY_GUARD_MAX_COMPLETED`], `MEMORY_GUARD_MAX_COMPLETED`), the
//! oldest forgotten first, so a day of orders in a long `replay` or `serve`
//! does not grow memory with the 24 h TTL. Forgetting a marker costs only
//! speed: the next delivery of that order acquires, and the store, which
//! holds the order terminal, answers `duplicate`. A live reservation is
//! never forgotten for room (that could let a second worker in while the
//! first is still at it); reservations are bounded by their own short TTL.

use std::collections::{HashMap, VecDeque};
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

/// The default bound on `COMPLETADA` markers: about 20 MB of ids and
/// markers, a few hours of a busy day.
pub const MEMORY_GUARD_MAX_COMPLETED: u64 = 100_000;

/// In-process guard with TTL expiry.
pub struct MemoryGuard {
    settings: GuardSettings,
    max_completed: usize,
    entries: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    map: HashMap<String, Entry>,
    /// Size after the last sweep: sweep again when the map has doubled, so
    /// expired keys cost amortised O(1) and memory stays bounded by live keys.
    swept_at_len: usize,
    /// Markers in the order they were written (id and its expiry, which
    /// tells a marker from a later one of the same id). An entry whose
    /// marker is gone or was written again is stale and skipped; the queue
    /// never holds more than the bound.
    completed: VecDeque<(String, Instant)>,
}

impl Entries {
    /// Write a `COMPLETADA` marker, forgetting the oldest markers past
    /// `max`: never a reservation.
    fn complete(&mut self, order_id: &str, entry: Entry, max: usize) {
        let expires_at = entry.expires_at;
        self.map.insert(order_id.to_string(), entry);
        self.completed.push_back((order_id.to_string(), expires_at));
        while self.completed.len() > max {
            let Some((id, at)) = self.completed.pop_front() else {
                break;
            };
            let same_marker = self
                .map
                .get(&id)
                .is_some_and(|e| e.value == COMPLETED && e.expires_at == at);
            if same_marker {
                self.map.remove(&id);
            }
        }
    }

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
    /// A guard keeping at most [`MEMORY_GUARD_MAX_COMPLETED`] markers.
    pub fn new(settings: GuardSettings) -> MemoryGuard {
        MemoryGuard::bounded(settings, MEMORY_GUARD_MAX_COMPLETED as usize)
    }

    /// A guard keeping at most `max_completed` (at least 1) markers.
    pub fn bounded(settings: GuardSettings, max_completed: usize) -> MemoryGuard {
        MemoryGuard {
            settings,
            max_completed: max_completed.max(1),
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
        let entry = Entry {
            value: COMPLETED.to_string(),
            fingerprint: Some(fingerprint.to_string()),
            expires_at: now + self.settings.completed_ttl,
            owner_deadline: None,
        };
        self.entries().complete(order_id, entry, self.max_completed);
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Reservations live this long in these tests; completed markers an hour.
    const PROCESSING_TTL: Duration = Duration::from_millis(400);

    fn guard() -> MemoryGuard {
        MemoryGuard::new(GuardSettings {
            prefix: "orden:".into(),
            processing_ttl: PROCESSING_TTL,
            completed_ttl: Duration::from_secs(3600),
            ..GuardSettings::default()
        })
    }

    #[tokio::test]
    async fn completed_markers_are_bounded_oldest_first_and_reservations_never_forgotten() {
        let g = MemoryGuard::bounded(
            GuardSettings {
                prefix: "orden:".into(),
                processing_ttl: Duration::from_secs(3600),
                completed_ttl: Duration::from_secs(3600),
                ..GuardSettings::default()
            },
            100,
        );
        // Live reservations beyond the bound, then markers beyond it.
        reserve(&g, ids("live", 150)).await;
        complete(&g, ids("done", 250)).await;
        // A marker written again is the newest, whatever its first write.
        complete(&g, ids("done", 1)).await;
        complete(&g, ids("late", 10)).await;
        let kept = g.completed_orders().await.unwrap();
        assert_eq!(kept.len(), 100, "markers kept");
        assert_eq!(held(&g), 250, "150 reservations and 100 markers");
        for id in ids("live", 150) {
            assert_eq!(g.acquire(&id).await, Acquisition::InProgress, "{id}");
        }
        // The newest are kept; the oldest forgotten (free to acquire: the store decides).
        for id in ids("late", 10).chain(["done-0".to_string(), "done-249".to_string()]) {
            assert!(
                matches!(g.acquire(&id).await, Acquisition::Completed { .. }),
                "{id}"
            );
        }
        assert!(matches!(
            g.acquire("done-1").await,
            Acquisition::Acquired(_)
        ));
    }

    /// Entries held in memory, live or not (what the sweep bounds).
    fn held(g: &MemoryGuard) -> usize {
        g.entries().map.len()
    }

    async fn reserve(g: &MemoryGuard, ids: impl IntoIterator<Item = String>) {
        for id in ids {
            match g.acquire(&id).await {
                Acquisition::Acquired(_) => {}
                other => panic!("{id}: want Acquired, got {other:?}"),
            }
        }
    }

    async fn complete(g: &MemoryGuard, ids: impl IntoIterator<Item = String>) {
        for id in ids {
            g.complete(&id, &format!("fp-{id}")).await.unwrap();
        }
    }

    fn ids(tag: &str, n: usize) -> impl Iterator<Item = String> + '_ {
        (0..n).map(move |i| format!("{tag}-{i}"))
    }

    /// Let every reservation taken so far expire (the TTL is under test).
    async fn outlive_reservations() {
        tokio::time::sleep(PROCESSING_TTL + Duration::from_millis(50)).await;
    }

    /// Live reservations and completed markers answer as before a sweep;
    /// expired reservations are gone.
    async fn assert_survivors(g: &MemoryGuard, live: &[String], done: &[String], gone: &[String]) {
        for id in live {
            assert_eq!(g.acquire(id).await, Acquisition::InProgress, "{id}");
        }
        for id in done {
            assert_eq!(
                g.acquire(id).await,
                Acquisition::Completed {
                    fingerprint: Some(format!("fp-{id}"))
                },
                "{id}"
            );
        }
        for id in gone {
            assert_eq!(g.inspect(id).await.unwrap().value, None, "{id}");
        }
    }

    /// An entry is expired from its expiry instant on (as a Redis key is):
    /// lookups and sweeps agree on that instant, so a sweep keeps no entry
    /// that a lookup would already treat as gone.
    #[test]
    fn an_entry_is_expired_at_its_expiry_instant_for_lookups_and_sweeps() {
        let now = Instant::now();
        let entry = |expires_at| Entry {
            value: COMPLETED.to_string(),
            fingerprint: None,
            expires_at,
            owner_deadline: None,
        };
        let mut entries = Entries::default();
        entries.map.insert("due".into(), entry(now));
        entries
            .map
            .insert("later".into(), entry(now + Duration::from_nanos(1)));
        assert!(entries.live("due", now).is_none());
        assert!(entries.live("later", now).is_some());

        let mut entries = Entries::default();
        for i in 0..2049 {
            let at = if i % 2 == 0 {
                now
            } else {
                now + Duration::from_nanos(1)
            };
            entries.map.insert(format!("o{i}"), entry(at));
        }
        entries.maybe_sweep(now);
        assert_eq!(entries.map.len(), 1024, "only the entries not yet due");
        assert!(entries.map.values().all(|e| e.expires_at > now));
    }

    /// Expired keys are dropped in sweeps, not one by one: a sweep runs when
    /// an acquire finds the map past twice its size after the last sweep (at
    /// least 2 × 1024), and keeps exactly the live entries. Memory stays
    /// bounded by the live keys while sweeping costs amortised O(1).
    #[tokio::test]
    async fn sweeps_wait_for_the_map_to_double_and_keep_only_live_entries() {
        let g = guard();

        // Round 1: the first sweep waits for 2 × 1024 entries.
        let gone1: Vec<String> = ids("gone1", 1000).collect();
        reserve(&g, gone1.clone()).await;
        outlive_reservations().await;
        let live1: Vec<String> = ids("live1", 400).collect();
        let done1: Vec<String> = ids("done1", 648).collect();
        reserve(&g, live1.clone()).await;
        complete(&g, done1.clone()).await;
        assert_eq!(held(&g), 2048, "no sweep below the threshold");
        reserve(&g, ["t1".to_string()]).await;
        assert_eq!(held(&g), 2049, "no sweep at the threshold itself");
        reserve(&g, ["t2".to_string()]).await;
        // Swept before t2 was added: live1 + done1 + t1 stay, gone1 is dropped.
        assert_eq!(held(&g), 400 + 648 + 1 + 1);
        assert_survivors(&g, &live1, &done1, &gone1[..50]).await;

        // Round 2: the next sweep waits for twice the 1049 entries the last
        // one kept (2098), not for the 2048 floor.
        let gone2: Vec<String> = ids("gone2", 2098 - 1050).collect();
        reserve(&g, gone2.clone()).await;
        assert_eq!(held(&g), 2098);
        outlive_reservations().await;
        // Every reservation is expired now; only done1 is live.
        reserve(&g, ["t3".to_string()]).await;
        assert_eq!(held(&g), 2099, "no sweep at twice the last kept size");
        reserve(&g, ["t4".to_string()]).await;
        assert_eq!(held(&g), 648 + 1 + 1, "done1 + t3, then t4");
        let gone: Vec<String> = live1.iter().chain(&gone2[..50]).cloned().collect();
        assert_survivors(&g, &["t3".into(), "t4".into()], &done1, &gone).await;
    }
}
