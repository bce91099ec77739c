//! A bounded hand-over of items from the code that makes them to the task
//! that takes them, oldest first, with the lease the items are made under;
//! full, it refuses and counts. A leaf that imports nothing of the crate:
//! the store hands its births over through it (`store::Handoff`), and the
//! outbox takes them (its lease rules in `outbox::lease`), neither
//! importing the other for it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

#[derive(Debug)]
pub struct Handoff<T> {
    /// How long an item is made leased to the taker.
    pub lease: Duration,
    items: Mutex<VecDeque<T>>,
    /// Items not handed over because it was full (cumulative).
    refused: AtomicU64,
}

impl<T> Handoff<T> {
    /// Items held at most; past it an item is not handed over (the taker
    /// is that far behind: for the outbox, failing to send, and the row
    /// waits for its lease to end).
    pub const CAPACITY: usize = 16_384;

    pub fn new(lease: Duration) -> Handoff<T> {
        Handoff {
            lease,
            items: Mutex::new(VecDeque::new()),
            refused: AtomicU64::new(0),
        }
    }

    /// An item, for the taker; `false` when full ([`Self::refused`]
    /// counts it).
    pub fn hand(&self, item: T) -> bool {
        let mut items = self.items.lock().unwrap_or_else(|e| e.into_inner());
        if items.len() >= Self::CAPACITY {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        items.push_back(item);
        true
    }

    /// The oldest items handed over, at most `limit`.
    pub fn take(&self, limit: usize) -> Vec<T> {
        let mut items = self.items.lock().unwrap_or_else(|e| e.into_inner());
        let n = items.len().min(limit);
        items.drain(..n).collect()
    }

    /// Items not handed over because it was full, so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_hand_off_refuses_and_counts_an_item_and_take_gives_the_oldest() {
        let h: Handoff<usize> = Handoff::new(Duration::from_secs(30));
        for i in 0..Handoff::<usize>::CAPACITY {
            assert!(h.hand(i));
        }
        assert_eq!(h.refused(), 0);
        assert!(!h.hand(usize::MAX), "full: refused");
        assert_eq!(h.refused(), 1);
        assert_eq!(h.take(64), (0..64).collect::<Vec<_>>(), "the oldest first");
        assert_eq!(h.take(usize::MAX).len(), Handoff::<usize>::CAPACITY - 64);
        assert!(h.take(64).is_empty());
        assert!(h.hand(7));
    }
}
