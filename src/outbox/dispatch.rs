//! The dispatcher: announcements sent after their commit, at least once.
//!
//! One task per instance. It wakes when this instance executes an order
//! (the processor's [`Announcer`], off the reply's path: the answer to
//! Event Grid never waits for the queue) and lingers a few milliseconds so
//! that one round covers the executions that follow. Those rows were born
//! leased to it (the store's [`Handoff`], where it has one: SQLite) and
//! handed over once committed: the round sends them as they are, with no
//! claim. A claim runs at start-up and then every `poll`, for every other
//! row that is due: rows left by an instance that died between its commit
//! and its send, rows a command executed, deferred rows come due, and
//! births too old to send within their lease (where the store hands
//! nothing over, every wake claims). A claim leases due rows (one
//! dispatcher per row at a time, across instances: the lease column, not
//! this memory). A round sends a few packs at a time, marks the sent rows
//! in one call and defers each failed one with back-off ([`retry_in`]); a
//! row the destination refuses for good (too large) is parked for an
//! operator (`order-guard outbox retry`), and the rows behind it go on. A
//! failure that is the destination's state (down, slow, a missing queue or
//! right, a 5xx) never parks: the rows wait, their back-off capped at
//! 5 min, and go when it is fixed. A round ends its sends by half its
//! rows' lease: rows it did not get to are deferred, not sent late under a
//! lease another dispatcher may hold by then.
//! A dispatcher killed between a send and its mark leaves the row leased:
//! when the lease ends it is sent again, with the same id and payload;
//! consumers deduplicate on the id.
//!
//! The retention runs beside the rounds, on a task of its own
//! ([`super::retention`]): dispatch never waits for a purge to end.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::task::AbortOnDropHandle;

use super::destination::Destination;
use super::envelope::Naming;
use super::lease::{claimed_window, sendable};
use super::pack::{parks, SendFailure};
use super::retention::{expired, Retention, RetentionSettings};
use crate::store::{Announcement, Deferral, Handoff, OrderStore, StoreError};

/// How the dispatcher runs (built by `config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DispatchSettings {
    pub naming: Naming,
    /// Rows per claim.
    pub batch: u32,
    /// How long a claim holds its rows, and how long a row is born leased
    /// to this process's dispatcher: longer than a round's sends.
    pub lease: Duration,
    /// How often a dispatcher looks for rows nobody woke it for.
    pub poll: Duration,
    /// How long dispatched rows are kept (`OUTBOX_RETENTION_HOURS`).
    pub retention: Duration,
    /// Sends in flight at once.
    pub in_flight: usize,
    /// How long a woken dispatcher waits for the executions that follow
    /// before its round: one round and one mark then cover them all, so
    /// the writes the outbox adds stay a small fraction of the executions'
    /// (measured: without it, SQLite's first deliveries ran at half the
    /// rate, a claim and a mark per order).
    pub linger: Duration,
    /// Rows the retention deletes per call: each one short transaction.
    pub purge_batch: u32,
    /// After each purge call the retention rests this many times as long
    /// as the call took, so it holds the store at most 1 / (1 + rest) of
    /// the time (0: unpaced). Measured on SQLite with a million rows:
    /// unpaced, first deliveries ran at a seventh to a tenth of their rate
    /// while it lasted; with a rest of 3, at 84 to 91 %.
    pub purge_rest: u32,
}

impl Default for DispatchSettings {
    fn default() -> DispatchSettings {
        DispatchSettings {
            naming: Naming::default(),
            batch: 64,
            lease: Duration::from_secs(30),
            poll: Duration::from_secs(5),
            retention: Duration::from_secs(7 * 24 * 3600),
            in_flight: 8,
            linger: Duration::from_millis(20),
            purge_batch: 500,
            purge_rest: 3,
        }
    }
}

impl DispatchSettings {
    /// The retention's part of these settings.
    pub fn retention_settings(&self) -> RetentionSettings {
        RetentionSettings {
            keep: self.retention,
            batch: self.purge_batch,
            rest: self.purge_rest,
        }
    }
}

/// The back-off of a row after its `attempts`-th failed send: 1 s doubling
/// to 5 min.
pub fn retry_in(attempts: i64) -> Duration {
    let exponent = u32::try_from(attempts.clamp(1, 20) - 1).unwrap_or(0);
    Duration::from_secs(1u64 << exponent.min(9)).min(Duration::from_secs(300))
}

/// What to do with a row whose send failed, its `attempts` counting this
/// failure: parked only when the destination refused it alone, for its
/// content, twice running ([`parks`]).
pub fn deferral(row: &Announcement, failure: &SendFailure, attempts: i64) -> Deferral {
    Deferral {
        message_id: row.message_id.clone(),
        error: failure.message.clone(),
        retry_in: retry_in(attempts),
        park: parks(failure, row.last_error.as_deref()),
    }
}

/// The births the hand-off refused since the last round (`before` of the
/// `now` it has refused in all), if any: what a round says once.
pub fn newly_refused(before: u64, now: u64) -> Option<u64> {
    now.checked_sub(before).filter(|&n| n > 0)
}

/// Whether a round that took `taken` rows of a `batch` was full: then more
/// may wait, and another round follows at once.
pub fn full(taken: usize, batch: u32) -> bool {
    taken >= batch as usize
}

/// Whether a drain ends after `round`: it was not full (nothing more is
/// due), or it sent nothing (the destination fails: the rows wait out
/// their back-off rather than be claimed again at once).
pub fn drained(round: &Round, batch: u32) -> bool {
    !full(round.claimed, batch) || round.sent == 0
}

/// When a running dispatcher claims: at once, then a `poll` after each
/// claim ends; where the store hands nothing over (its births are not
/// leased to this process), on every wake too. Pure: the caller says when
/// it is.
#[derive(Debug, Clone, Copy)]
pub struct ClaimTimer {
    poll: Duration,
    next: Instant,
    hands_over: bool,
}

impl ClaimTimer {
    pub fn new(poll: Duration, now: Instant, hands_over: bool) -> ClaimTimer {
        ClaimTimer {
            poll,
            next: now,
            hands_over,
        }
    }

    /// Whether a claim runs in a round at `now`.
    pub fn due(&self, now: Instant) -> bool {
        !self.hands_over || now >= self.next
    }

    /// A claim ended at `now`.
    pub fn claimed(&mut self, now: Instant) {
        self.next = now + self.poll;
    }

    /// When the next claim is due, woken or not.
    pub fn next(&self) -> Instant {
        self.next
    }
}

/// What a round says in the log, `failing` since an earlier round and
/// `error` its failure now (`None`: it worked): a store that cannot be
/// used (down, or its schema not verified yet) is said once, as a warning,
/// and its return once, not every `poll`.
pub fn said(failing: bool, error: Option<&str>, poll: Duration) -> Option<(log::Level, String)> {
    match error {
        Some(e) if !failing => Some((
            log::Level::Warn,
            format!(
                "outbox: dispatch round failed ({e}); the rows stay and are tried again every {} s",
                poll.as_secs()
            ),
        )),
        Some(e) => Some((
            log::Level::Debug,
            format!("outbox: dispatch round failed again ({e})"),
        )),
        None if failing => Some((
            log::Level::Info,
            "outbox: dispatch rounds work again".to_string(),
        )),
        None => None,
    }
}

/// The one line a round says of its failed sends, `deferrals` of the
/// `held` rows it held (`None`: none failed): an outage of the destination
/// fails every row of every round alike, so one line a round, not a row.
pub fn failures_line(deferrals: &[Deferral], held: usize) -> Option<String> {
    let first = deferrals.first()?;
    let parked = deferrals.iter().filter(|d| d.park).count();
    Some(format!(
        "outbox: {} of {held} announcements not sent in this dispatch round ({parked} parked): {}; the others are tried again from {} s on",
        deferrals.len(),
        first.error,
        first.retry_in.as_secs()
    ))
}

/// Wakes the dispatcher when an order was executed (held by the processor).
#[derive(Debug, Default, Clone)]
pub struct Announcer(Arc<Notify>);

impl Announcer {
    pub fn executed(&self) {
        self.0.notify_one();
    }
}

/// One round's result.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Round {
    /// Rows the round held: claimed, or born leased to this dispatcher.
    pub claimed: usize,
    pub sent: usize,
    pub failed: usize,
}

pub struct Dispatcher {
    store: Arc<dyn OrderStore>,
    destination: Destination,
    settings: DispatchSettings,
    announcer: Announcer,
    /// Announcements sent since this started.
    sent: AtomicU64,
    /// Dispatched rows past the retention deleted, beside the rounds.
    retention: Arc<Retention>,
    /// The hand-off's refusals already logged.
    refused_seen: AtomicU64,
}

impl Dispatcher {
    pub fn new(
        store: Arc<dyn OrderStore>,
        destination: Destination,
        settings: DispatchSettings,
    ) -> Dispatcher {
        let retention = Arc::new(Retention::new(
            Arc::clone(&store),
            settings.retention_settings(),
            expired(true),
        ));
        Dispatcher {
            store,
            destination,
            settings,
            retention,
            announcer: Announcer::default(),
            sent: AtomicU64::new(0),
            refused_seen: AtomicU64::new(0),
        }
    }

    /// What the processor calls after each execution.
    pub fn announcer(&self) -> Announcer {
        self.announcer.clone()
    }

    pub fn describe(&self) -> String {
        self.destination.describe()
    }

    /// Announcements this dispatcher sent (and marked) since it started:
    /// what the outbox bench waits on without a scan of the outbox.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// One claim's worth: send, mark the sent, defer the failed.
    pub async fn round(&self) -> Result<Round, StoreError> {
        let s = &self.settings;
        let claim = self.store.claim_announcements(s.batch, s.lease).await?;
        self.send(claim.rows, Some(&claim.token), claimed_window(s.lease))
            .await
    }

    /// A round of the rows this process executed, born leased to it
    /// ([`Handoff`]), at most `batch` of them: sent as they are, with no
    /// claim; those too old to send within their lease ([`sendable`]) are
    /// left for a claim once it ends. `claimed` counts the rows taken.
    pub async fn send_born(&self, handoff: &Handoff) -> Result<Round, StoreError> {
        let taken = handoff.take(self.settings.batch as usize);
        let count = taken.len();
        let (rows, within) = sendable(taken, Instant::now(), handoff.lease);
        // No token: these rows are this process's own births, which no
        // claim has taken (a claim that took one over wins its defer).
        let round = self.send(rows, None, within).await?;
        Ok(Round {
            claimed: count,
            ..round
        })
    }

    /// Rounds of born rows until fewer than a round's worth wait; says once
    /// a round when the hand-off was full (those rows go after their lease).
    async fn drain_born(&self, handoff: &Handoff) -> Result<(), StoreError> {
        let refused = handoff.refused();
        let before = self.refused_seen.swap(refused, Ordering::Relaxed);
        if let Some(new) = newly_refused(before, refused) {
            log::warn!(
                "outbox: {new} announcements not handed to the dispatcher ({} wait already): it is behind; they are sent once their lease ends ({} s)",
                Handoff::CAPACITY,
                handoff.lease.as_secs()
            );
        }
        while full(self.send_born(handoff).await?.claimed, self.settings.batch) {}
        Ok(())
    }

    /// Send `rows`, held under a claim's `token` (or, `None`, since their
    /// birth), within `within`; mark the sent in one call, defer each
    /// failed one.
    async fn send(
        &self,
        rows: Vec<Announcement>,
        token: Option<&str>,
        within: Duration,
    ) -> Result<Round, StoreError> {
        let s = &self.settings;
        let mut round = Round {
            claimed: rows.len(),
            ..Round::default()
        };
        if rows.is_empty() {
            return Ok(round);
        }
        let answers = self
            .destination
            .send_all(&s.naming, &rows, s.in_flight, within)
            .await;
        let results: Vec<(Announcement, Result<(), SendFailure>)> =
            rows.into_iter().zip(answers).collect();
        // Sent, not marked yet: a dispatcher killed here (tests: `crash`)
        // leaves its rows leased, sent again when the lease ends.
        fail::fail_point!(crate::faults::OUTBOX_AFTER_SEND, |arg| Err(
            StoreError::Transient(crate::faults::crash_or_error(
                crate::faults::OUTBOX_AFTER_SEND,
                arg
            ))
        ));
        let mut sent = Vec::new();
        let mut failed = Vec::new();
        for (row, result) in results {
            match result {
                Ok(()) => sent.push(row),
                Err(failure) => failed.push((row, failure)),
            }
        }
        if !sent.is_empty() {
            self.store.mark_announced(&sent).await?;
            round.sent = sent.len();
            self.sent.fetch_add(sent.len() as u64, Ordering::Relaxed);
        }
        let deferrals: Vec<Deferral> = failed
            .iter()
            .map(|(row, failure)| deferral(row, failure, row.attempts + 1))
            .collect();
        for ((row, _), d) in failed.iter().zip(&deferrals) {
            if d.park {
                log::error!(
                    "announcement {} of order {} parked: {}; `order-guard outbox retry {}` sends it again once the cause is fixed",
                    row.message_id,
                    crate::text::Quoted(&row.order_id),
                    d.error,
                    row.message_id
                );
            }
            self.store.defer_announcement(token, d).await?;
        }
        if let Some(line) = failures_line(&deferrals, round.claimed) {
            log::warn!("{line}");
        }
        round.failed = failed.len();
        Ok(round)
    }

    /// Rounds until nothing is due (or a round fails).
    pub async fn drain(&self) -> Result<usize, StoreError> {
        let mut sent = 0;
        loop {
            let round = self.round().await?;
            sent += round.sent;
            if drained(&round, self.settings.batch) {
                return Ok(sent);
            }
        }
    }

    /// Start [`Self::run`] on a task of its own. The rows this process
    /// executes from the moment this returns are born leased to it.
    pub fn spawn(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let _ = self.store.hand_over_announcements(self.settings.lease);
        tokio::spawn(Arc::clone(self).run())
    }

    /// The dispatcher's life. The rows this process executes from now on
    /// are born leased to it ([`Handoff`], where the store can): each wake
    /// sends them, with no claim. A claim runs at once, then every `poll`
    /// (on every wake too where the store hands nothing over), for the
    /// rest: rows left by an instance that died or written by a command,
    /// deferred rows come due, births too old to send from memory. The
    /// retention runs hourly, on a task of its own (a purge of a busy
    /// day's rows takes seconds, and the announcements of those seconds
    /// must not wait behind it). Store failures are logged and waited out
    /// (the rows stay; nothing is lost).
    pub async fn run(self: Arc<Self>) {
        // Ends with this loop (dropped with it).
        let _retention = AbortOnDropHandle::new(self.retention.spawn());
        let handoff = self.store.hand_over_announcements(self.settings.lease);
        let wake = Arc::clone(&self.announcer.0);
        let mut claims = ClaimTimer::new(self.settings.poll, Instant::now(), handoff.is_some());
        let mut failing = false;
        loop {
            let born = match &handoff {
                Some(h) => self.drain_born(h).await,
                None => Ok(()),
            };
            // The claim runs whatever the born rows' round did.
            let claimed = if claims.due(Instant::now()) {
                let claimed = self.drain().await.map(|_| ());
                claims.claimed(Instant::now());
                claimed
            } else {
                Ok(())
            };
            let error = born.and(claimed).err().map(|e| e.to_string());
            if let Some((level, line)) = said(failing, error.as_deref(), self.settings.poll) {
                log::log!(level, "{line}");
            }
            failing = error.is_some();
            tokio::select! {
                // Batching, not synchronisation: the orders executed in the
                // next few milliseconds share the dispatch round.
                () = wake.notified() => tokio::time::sleep(self.settings.linger).await,
                () = tokio::time::sleep_until(claims.next().into()) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_back_off_doubles_from_a_second_to_five_minutes() {
        let secs: Vec<u64> = (1..=12).map(|n| retry_in(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        assert_eq!(retry_in(0), Duration::from_secs(1));
        assert_eq!(retry_in(i64::MAX), Duration::from_secs(300));
    }

    #[test]
    fn only_a_full_round_is_followed_by_another_at_once() {
        assert!(full(64, 64));
        assert!(!full(63, 64));
        assert!(!full(0, 64));
        assert!(full(1, 1));
    }

    #[test]
    fn a_drain_goes_on_only_after_a_full_round_that_sent() {
        let round = |claimed, sent| Round {
            claimed,
            sent,
            failed: claimed - sent,
        };
        assert!(!drained(&round(64, 64), 64));
        assert!(!drained(&round(64, 1), 64));
        assert!(drained(&round(63, 63), 64));
        assert!(drained(&round(64, 0), 64));
        assert!(drained(&round(0, 0), 64));
    }

    #[test]
    fn a_claim_runs_at_once_then_a_poll_after_each_claim_ends() {
        let (t0, poll) = (Instant::now(), Duration::from_secs(5));
        let mut claims = ClaimTimer::new(poll, t0, true);
        assert!(claims.due(t0));
        claims.claimed(t0 + Duration::from_secs(1));
        assert_eq!(claims.next(), t0 + Duration::from_secs(6));
        assert!(!claims.due(t0 + Duration::from_secs(5)));
        assert!(claims.due(t0 + Duration::from_secs(6)));
        // Where the store hands nothing over, every round claims.
        let mut every = ClaimTimer::new(poll, t0, false);
        every.claimed(t0);
        assert!(every.due(t0));
    }

    #[test]
    fn a_failing_store_is_said_once_and_its_return_once() {
        let poll = Duration::from_secs(5);
        assert_eq!(said(false, None, poll), None);
        assert_eq!(
            said(false, Some("down"), poll),
            Some((
                log::Level::Warn,
                "outbox: dispatch round failed (down); the rows stay and are tried again every 5 s"
                    .into()
            ))
        );
        assert_eq!(
            said(true, Some("down"), poll),
            Some((
                log::Level::Debug,
                "outbox: dispatch round failed again (down)".into()
            ))
        );
        assert_eq!(
            said(true, None, poll),
            Some((
                log::Level::Info,
                "outbox: dispatch rounds work again".into()
            ))
        );
    }

    #[test]
    fn a_round_says_its_failures_in_one_line() {
        let row = crate::store::Announcement::sample("o");
        assert_eq!(failures_line(&[], 3), None);
        let down = deferral(&row, &SendFailure::waits("503"), 2);
        let too_large = SendFailure::refused("413");
        let refused = crate::store::Announcement {
            last_error: Some(deferral(&row, &too_large, 1).error),
            ..row.clone()
        };
        let parked = deferral(&refused, &too_large, 2);
        assert!(parked.park);
        assert_eq!(
            failures_line(&[down, parked], 3).as_deref(),
            Some("outbox: 2 of 3 announcements not sent in this dispatch round (1 parked): 503; the others are tried again from 2 s on")
        );
    }

    #[test]
    fn a_round_says_only_the_refusals_new_since_the_last() {
        assert_eq!(newly_refused(0, 0), None);
        assert_eq!(newly_refused(0, 1), Some(1));
        assert_eq!(newly_refused(3, 5), Some(2));
        assert_eq!(newly_refused(5, 5), None);
    }

    #[test]
    fn a_row_is_parked_only_when_refused_for_its_content_twice_running() {
        let row = crate::store::Announcement::sample("o");
        let down = SendFailure::waits("503");
        let too_large = SendFailure::refused("413");
        // The destination's state never parks, however long it lasts.
        assert!(!deferral(&row, &down, 1).park);
        assert!(!deferral(&row, &down, 1_000).park);
        // Refused once: it waits; refused again, running: parked.
        let first = deferral(&row, &too_large, 1);
        assert!(!first.park);
        let again = crate::store::Announcement {
            last_error: Some(first.error.clone()),
            attempts: 1,
            ..row.clone()
        };
        assert!(deferral(&again, &too_large, 2).park);
        assert!(!deferral(&again, &down, 2).park);
        let d = deferral(&row, &down, 3);
        assert_eq!(
            (d.message_id.as_str(), d.error.as_str()),
            (row.message_id.as_str(), "503")
        );
        assert_eq!(d.retry_in, Duration::from_secs(4));
    }
}
