//! Finished orders this instance has seen: a redelivery of one is answered
//! from memory, with no Redis round trip.
//!
//! Why it is safe: an order enters only once the store holds it terminal with
//! that fingerprint (the processor remembers only `executed` and `duplicate`
//! answers, see [`OutcomeKind::proves_finished`]). A row never leaves the
//! terminal state and never changes its fingerprint, so what an entry says
//! stays true for as long as the database exists: on every instance, however
//! many run, and whatever Redis loses. Each instance keeps its own; a restart
//! starts empty and learns again through Redis and the store. An entry only
//! ever saves work; a miss (evicted, expired, another instance's order) takes
//! the usual path.
//!
//! Bounded twice: by bytes ([`FinishedCacheSettings::max_bytes`], the weigher
//! counts the id, the fingerprint and [`ENTRY_OVERHEAD_BYTES`]) and by age
//! ([`FinishedCacheSettings::ttl`], at most the `COMPLETADA` TTL, so the cache
//! never answers for longer than the shared guard would).
//!
//! [`OutcomeKind::proves_finished`]: crate::decision::OutcomeKind::proves_finished

use std::sync::Arc;
use std::time::Duration;

use moka::sync::Cache;

/// What one entry costs beyond its id and fingerprint: moka's entry, its
/// hash-table slot and its place in the access and expiry queues. Measured
/// (docs/benchmarks.md): 100 000 entries with 20-byte ids and 67-byte
/// fingerprints grew the resident set by 461 bytes each, 300 000 by 434.
pub const ENTRY_OVERHEAD_BYTES: u32 = 352;

/// Size and age bounds of the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FinishedCacheSettings {
    /// Memory bound, in bytes (0: no cache).
    pub max_bytes: u64,
    /// How long an entry is trusted; at most the `COMPLETADA` TTL.
    pub ttl: Duration,
}

impl Default for FinishedCacheSettings {
    fn default() -> Self {
        FinishedCacheSettings {
            max_bytes: 64 * 1024 * 1024,
            ttl: Duration::from_secs(3_600),
        }
    }
}

/// Order id → the fingerprint the order finished with.
pub struct FinishedOrders {
    cache: Cache<String, Arc<str>>,
}

impl FinishedOrders {
    /// A cache with these bounds, or `None` when `max_bytes` is 0.
    pub fn new(settings: FinishedCacheSettings) -> Option<FinishedOrders> {
        if settings.max_bytes == 0 {
            return None;
        }
        let cache = Cache::builder()
            .max_capacity(settings.max_bytes)
            .weigher(|id: &String, fp: &Arc<str>| {
                let bytes = id.len() + fp.len();
                u32::try_from(bytes)
                    .unwrap_or(u32::MAX)
                    .saturating_add(ENTRY_OVERHEAD_BYTES)
            })
            .time_to_live(settings.ttl)
            .build();
        Some(FinishedOrders { cache })
    }

    /// The fingerprint `order_id` finished with, if this instance saw it finish.
    pub fn recall(&self, order_id: &str) -> Option<Arc<str>> {
        self.cache.get(order_id)
    }

    /// Entries and weighted bytes now (moka's estimates, for telemetry).
    pub fn size(&self) -> (u64, u64) {
        (self.cache.entry_count(), self.cache.weighted_size())
    }

    /// `order_id` is terminal in the store with `fingerprint`.
    pub fn remember(&self, order_id: &str, fingerprint: &str) {
        self.cache
            .insert(order_id.to_string(), Arc::from(fingerprint));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_the_fingerprint_an_order_finished_with() {
        let c = FinishedOrders::new(FinishedCacheSettings::default()).expect("enabled");
        assert_eq!(c.recall("o-1"), None);
        c.remember("o-1", "v2:abc");
        assert_eq!(c.recall("o-1").as_deref(), Some("v2:abc"));
        assert_eq!(c.recall("O-1"), None, "ids are case-sensitive");
    }

    #[test]
    fn size_counts_the_entries_and_their_weighed_bytes() {
        let c = FinishedOrders::new(FinishedCacheSettings::default()).expect("enabled");
        assert_eq!(c.size(), (0, 0));
        c.remember("o-1", "v2:abc");
        c.remember("order-22", "v2:defg");
        // moka counts on its maintenance pass (telemetry reads estimates).
        c.cache.run_pending_tasks();
        let overhead = u64::from(ENTRY_OVERHEAD_BYTES);
        assert_eq!(c.size(), (2, (3 + 6 + overhead) + (8 + 7 + overhead)));
    }

    #[test]
    fn zero_bytes_means_no_cache() {
        let off = FinishedCacheSettings {
            max_bytes: 0,
            ..FinishedCacheSettings::default()
        };
        assert!(FinishedOrders::new(off).is_none());
    }

    #[test]
    fn the_byte_bound_holds() {
        // Room for about ten entries of this size.
        let per_entry = u64::from(ENTRY_OVERHEAD_BYTES) + 8 + 67;
        let c = FinishedOrders::new(FinishedCacheSettings {
            max_bytes: 10 * per_entry,
            ttl: Duration::from_secs(60),
        })
        .expect("enabled");
        for i in 0..1_000 {
            c.remember(&format!("order-{i:02}"), &format!("v2:{:064}", i));
        }
        c.cache.run_pending_tasks();
        assert!(
            c.cache.weighted_size() <= 10 * per_entry,
            "weighted size {} over the bound {}",
            c.cache.weighted_size(),
            10 * per_entry
        );
        assert!(c.cache.entry_count() <= 10);
    }
}
