//! The retention: what keeps the `Outbox` table bounded, wherever the
//! store runs. Once an hour, rows past `OUTBOX_RETENTION_HOURS` are
//! deleted in small batches (the store's purge: one instance at a time, a
//! short transaction each), each followed by a rest a few times as long as
//! it took ([`purge_pause`]), on a task of its own: dispatch never waits
//! for a purge to end, and the orders keep most of the store's time while
//! it runs.
//!
//! Which rows ([`Expired`]): with a destination, those dispatched more than
//! the retention ago; a row not sent waits for its destination however
//! long. With none (`serve` runs the retention all the same), also those
//! due for more than the retention and never sent: nothing would send
//! them, the table would grow by a row an execution for good, and a
//! destination set later would send the whole history to a new consumer.
//! So a destination set later sends what fell due within the retention.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::task::AbortOnDropHandle;

use crate::store::{Expired, OrderStore, StoreError};

/// How often the retention runs.
pub const PURGE_EVERY: Duration = Duration::from_secs(3600);

/// How long a retention task that ended by itself (a panic) waits before
/// it is started again.
const RESTART_AFTER: Duration = Duration::from_secs(5);

/// After a purge call that deleted `deleted` of at most `batch` rows in
/// `took`: `None` when the retention is done (a short batch: nothing more
/// is due, or another instance holds the purge), else how long to rest
/// before the next call (`rest` times `took`).
pub fn purge_pause(deleted: u64, batch: u32, took: Duration, rest: u32) -> Option<Duration> {
    (deleted >= u64::from(batch)).then(|| took.saturating_mul(rest))
}

/// Which rows past the retention go: with a destination only the sent
/// ones, with none the unsent ones due for longer too.
pub fn expired(has_destination: bool) -> Expired {
    if has_destination {
        Expired::Sent
    } else {
        Expired::SentAndUnsent
    }
}

/// What the retention keeps and how it paces itself (from the dispatch
/// settings: `DispatchSettings::retention_settings`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionSettings {
    /// How long rows are kept (`OUTBOX_RETENTION_HOURS`).
    pub keep: Duration,
    /// Rows per purge call: each one short transaction.
    pub batch: u32,
    /// The rest after each call, as a multiple of the call's time.
    pub rest: u32,
}

pub struct Retention {
    store: Arc<dyn OrderStore>,
    settings: RetentionSettings,
    expired: Expired,
}

impl Retention {
    pub fn new(store: Arc<dyn OrderStore>, settings: RetentionSettings, expired: Expired) -> Self {
        Retention {
            store,
            settings,
            expired,
        }
    }

    /// One pass: delete the rows past the retention, a batch at a time,
    /// paced ([`purge_pause`]) so the orders keep most of the store.
    pub async fn purge(&self) -> Result<u64, StoreError> {
        let RetentionSettings { keep, batch, rest } = self.settings;
        let mut purged = 0;
        loop {
            let started = Instant::now();
            let n = self
                .store
                .purge_announced(keep, batch, self.expired)
                .await?;
            purged += n;
            match purge_pause(n, batch, started.elapsed(), rest) {
                Some(rest) => tokio::time::sleep(rest).await,
                None => return Ok(purged),
            }
        }
    }

    /// A pass at once, then every [`PURGE_EVERY`], for good.
    async fn run(self: Arc<Self>) {
        loop {
            match self.purge().await {
                Ok(0) => {}
                Ok(n) => log::info!(
                    "outbox: {n} announcements past the retention ({} h) deleted",
                    self.settings.keep.as_secs() / 3600
                ),
                Err(e) => {
                    log::warn!("outbox: retention purge failed ({e}); tried again in an hour")
                }
            }
            tokio::time::sleep(PURGE_EVERY).await;
        }
    }

    /// Run the retention on a task of its own, started again (with an
    /// error logged) if it ever ends by itself: it never stops unseen.
    /// Aborting the handle stops it.
    pub fn spawn(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                // Aborted with this task (dropped with it).
                let ended = AbortOnDropHandle::new(tokio::spawn(Arc::clone(&me).run())).await;
                log::error!(
                    "outbox: the retention task ended unexpectedly ({}); started again",
                    match ended {
                        Err(e) if e.is_panic() => "a panic",
                        _ => "no reason given",
                    }
                );
                tokio::time::sleep(RESTART_AFTER).await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_purge_rests_a_multiple_of_each_full_batch_and_stops_at_a_short_one() {
        let took = Duration::from_millis(4);
        assert_eq!(
            purge_pause(100, 100, took, 3),
            Some(Duration::from_millis(12))
        );
        assert_eq!(purge_pause(100, 100, took, 0), Some(Duration::ZERO));
        // Fewer than a batch: nothing more is due (or another instance
        // holds the purge's lock and this one deleted nothing).
        assert_eq!(purge_pause(99, 100, took, 3), None);
        assert_eq!(purge_pause(0, 100, took, 3), None);
        assert_eq!(
            purge_pause(1, 1, Duration::MAX, u32::MAX),
            Some(Duration::MAX)
        );
    }

    #[test]
    fn unsent_rows_expire_only_where_nothing_would_send_them() {
        assert_eq!(expired(true), Expired::Sent);
        assert_eq!(expired(false), Expired::SentAndUnsent);
    }
}
