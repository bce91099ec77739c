//! The rules of a dispatcher's leases: a round ends its sends by half its
//! rows' lease, so it never sends late under a lease another dispatcher
//! may hold by then; a row born leased to this process (the store's
//! `Handoff`) is sent from memory only while that leaves it time. Pure:
//! the store holds the rows and hands over births, these say what to do
//! with them.

use std::time::{Duration, Instant};

use crate::store::{Announcement, Birth};

/// How long a claimed round may send: half its lease.
pub fn claimed_window(lease: Duration) -> Duration {
    lease / 2
}

/// Which of `births` to send from memory at `now`, and how long the sends
/// may take. A claimed round stops sending at half its lease; so does
/// this one, counted from the oldest row it sends. A row is sent only
/// while that leaves a quarter of the lease or more (it was born at most a
/// quarter of the lease ago); older ones, and every one when the lease is
/// zero, are left to a claim once their lease ends. Pure.
pub fn sendable(
    births: Vec<Birth>,
    now: Instant,
    lease: Duration,
) -> (Vec<Announcement>, Duration) {
    let mut window = claimed_window(lease);
    let mut rows = Vec::with_capacity(births.len());
    for birth in births {
        // The send must end while at least half the lease is left.
        let left = birth
            .leased_until
            .saturating_duration_since(now)
            .saturating_sub(lease / 2);
        if left >= lease / 4 && !left.is_zero() {
            window = window.min(left);
            rows.push(birth.row);
        }
    }
    (rows, window)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sent from memory: rows with at least three quarters of their lease
    /// left; the sends end while half of the oldest one's is left.
    #[test]
    fn births_are_sent_from_memory_only_while_their_lease_leaves_time() {
        let now = Instant::now();
        let lease = Duration::from_secs(40);
        let birth = |id: &str, left: u64| Birth {
            row: Announcement::sample(id),
            leased_until: now + Duration::from_secs(left),
        };
        let (rows, window) = sendable(
            vec![birth("fresh", 40), birth("older", 35), birth("stale", 29)],
            now,
            lease,
        );
        let ids: Vec<&str> = rows.iter().map(|r| r.order_id.as_str()).collect();
        assert_eq!(
            ids,
            ["fresh", "older"],
            "in their order; the stale one left"
        );
        assert_eq!(
            window,
            Duration::from_secs(15),
            "35 s left, less half the lease"
        );
        let (rows, window) = sendable(vec![birth("fresh", 40)], now, lease);
        assert_eq!((rows.len(), window), (1, Duration::from_secs(20)));
        // A lease of 30 s (the default): a quarter is the least window.
        let (rows, window) = sendable(
            vec![birth("edge", 23)],
            now + Duration::from_millis(500),
            Duration::from_secs(30),
        );
        assert_eq!((rows.len(), window), (1, Duration::from_millis(7_500)));
        let (rows, _) = sendable(
            vec![birth("gone", 23)],
            now + Duration::from_millis(501),
            Duration::from_secs(30),
        );
        assert!(rows.is_empty());
        // Past its lease, or none at all: left to a claim.
        let (rows, window) = sendable(vec![birth("past", 0)], now + lease, lease);
        assert!(rows.is_empty());
        assert_eq!(window, lease / 2);
        assert!(sendable(vec![birth("zero", 0)], now, Duration::ZERO)
            .0
            .is_empty());
    }

    #[test]
    fn a_claimed_round_sends_for_half_its_lease() {
        assert_eq!(
            claimed_window(Duration::from_secs(30)),
            Duration::from_secs(15)
        );
        assert_eq!(claimed_window(Duration::ZERO), Duration::ZERO);
    }
}
