//! Silent connections: what a request that got no answer in time says
//! about the connections idle beside it.
//!
//! A timeout on a connection that has served is either a slow statement (a
//! lock wait, a busy server) or a dead network path (a load balancer or NAT
//! that dropped the flow without a RST or FIN: nothing ever comes back). The
//! two call for opposite answers: a dead path takes every connection that
//! was idle on it, so those must be discarded rather than each waited on
//! for another timeout, and the call sent again on a new connection; a slow
//! statement says nothing about the others, and sending it again only adds
//! load. So a timeout raises a *suspicion* ([`Silences::suspect`]), and the
//! next checkout settles it on a connection idle since before it, with a
//! check bounded by `pool::CHECK_TIMEOUT` ([`on_checkout`]): answered, the
//! path is alive (the call answers `retry`, as a slow statement should);
//! not answered, it is dead from then on (every older connection is
//! discarded unchecked, and the call is sent again). With no older
//! connection left to check, the call answers `retry` (every connection
//! was busy: a loaded server explains that as well as a dead path). A
//! login in flight on a path found dead is abandoned
//! ([`Silences::found_dead_since`]): it would hold one of the pool's few
//! login turns for its whole budget.

use std::sync::Mutex;
use std::time::Instant;

/// Where the latest suspicion stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not settled yet: no connection idle since before it was checked.
    Open,
    /// A connection idle since before it answered its check.
    Alive,
    /// One did not: connections idle since before it are on a dead path.
    Dead,
}

/// The latest suspicion: which (`id`, counting from 1), raised when
/// (`since`), and its verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Suspicion {
    pub id: u64,
    pub since: Instant,
    pub verdict: Verdict,
}

/// What to do with a pooled connection on checkout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checkout {
    /// Hand it out (the usual checks apply).
    Use,
    /// Check it now, whatever its idle time: it settles a suspicion.
    Settle,
    /// Discard it unchecked: it sat on a path found dead.
    Discard,
}

/// The decision on checkout for a connection last used at `last_used`,
/// given the latest suspicion: only a connection idle since before it is
/// concerned (one used since answered after it).
pub fn on_checkout(last_used: Instant, latest: Option<Suspicion>) -> Checkout {
    match latest {
        Some(s) if last_used <= s.since => match s.verdict {
            Verdict::Open => Checkout::Settle,
            Verdict::Dead => Checkout::Discard,
            Verdict::Alive => Checkout::Use,
        },
        _ => Checkout::Use,
    }
}

/// Whether a call whose served connection timed out, raising suspicion
/// `id`, sends its request again: only when the path was found dead (by a
/// check for this suspicion or a later one, which covers the same
/// connections and more). Not when found alive (a slow statement), nor
/// when not settled: with no idle connection left to check, every
/// connection was busy, which a loaded server explains as well as a dead
/// path, and a re-send would cost a login (on Babelfish, a compile of the
/// procedure) on the server least able to afford it.
pub fn send_again_after(id: u64, latest: Option<Suspicion>) -> bool {
    matches!(latest, Some(s) if s.id >= id && s.verdict == Verdict::Dead)
}

/// The latest suspicion, shared by the pool's manager (which settles it on
/// checkout) and the store (which raises it and reads its verdict).
#[derive(Debug, Default)]
pub struct Silences {
    latest: Mutex<Option<Suspicion>>,
    /// Woken when a suspicion is found dead.
    found_dead: tokio::sync::Notify,
}

/// Whether a connection opened at `opened` is on a path `latest` found
/// dead: it was open at the suspicion's time.
pub fn opened_on_dead_path(opened: Instant, latest: Option<Suspicion>) -> bool {
    latest.is_some_and(|s| s.verdict == Verdict::Dead && opened <= s.since)
}

impl Silences {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Suspicion>> {
        self.latest.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A served connection got no answer in time, now: raise a suspicion
    /// on every connection idle since before now. Its id.
    pub fn suspect(&self) -> u64 {
        let mut latest = self.lock();
        let id = latest.map_or(1, |s| s.id + 1);
        *latest = Some(Suspicion {
            id,
            since: Instant::now(),
            verdict: Verdict::Open,
        });
        id
    }

    /// The check of a connection last used at `last_used` (decided by
    /// [`on_checkout`] as [`Checkout::Settle`]) answered or not: the
    /// verdict of the suspicion it was checked for, if still the latest.
    pub fn settle(&self, last_used: Instant, answered: bool) {
        let mut latest = self.lock();
        if let Some(s) = latest.as_mut() {
            if s.verdict == Verdict::Open && last_used <= s.since {
                s.verdict = if answered {
                    Verdict::Alive
                } else {
                    self.found_dead.notify_waiters();
                    Verdict::Dead
                };
            }
        }
    }

    /// Returns once a path is found dead with a connection opened at
    /// `opened` on it ([`opened_on_dead_path`]): a login in flight then.
    pub async fn found_dead_since(&self, opened: Instant) {
        loop {
            let woken = self.found_dead.notified();
            tokio::pin!(woken);
            // Registered before the check, so a verdict in between wakes it.
            woken.as_mut().enable();
            if opened_on_dead_path(opened, self.latest()) {
                return;
            }
            woken.await;
        }
    }

    /// The latest suspicion.
    pub fn latest(&self) -> Option<Suspicion> {
        *self.lock()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(since: Instant, id: u64, verdict: Verdict) -> Option<Suspicion> {
        Some(Suspicion { id, since, verdict })
    }

    #[test]
    fn only_connections_idle_since_before_a_suspicion_are_concerned() {
        let t = Instant::now();
        let before = t - Duration::from_secs(1);
        let after = t + Duration::from_secs(1);
        assert_eq!(on_checkout(before, None), Checkout::Use);
        assert_eq!(
            on_checkout(before, at(t, 1, Verdict::Open)),
            Checkout::Settle
        );
        assert_eq!(on_checkout(t, at(t, 1, Verdict::Open)), Checkout::Settle);
        assert_eq!(
            on_checkout(before, at(t, 1, Verdict::Dead)),
            Checkout::Discard
        );
        assert_eq!(on_checkout(before, at(t, 1, Verdict::Alive)), Checkout::Use);
        for verdict in [Verdict::Open, Verdict::Dead, Verdict::Alive] {
            assert_eq!(on_checkout(after, at(t, 1, verdict)), Checkout::Use);
        }
    }

    #[test]
    fn a_login_open_when_its_path_was_found_dead_is_on_it() {
        let t = Instant::now();
        let before = t - Duration::from_secs(1);
        let after = t + Duration::from_secs(1);
        assert!(opened_on_dead_path(before, at(t, 1, Verdict::Dead)));
        assert!(
            !opened_on_dead_path(after, at(t, 1, Verdict::Dead)),
            "opened since"
        );
        assert!(!opened_on_dead_path(before, at(t, 1, Verdict::Open)));
        assert!(!opened_on_dead_path(before, at(t, 1, Verdict::Alive)));
        assert!(!opened_on_dead_path(before, None));
    }

    #[test]
    fn a_call_is_sent_again_only_when_its_path_was_found_dead() {
        let t = Instant::now();
        assert!(
            !send_again_after(3, at(t, 3, Verdict::Alive)),
            "a slow statement"
        );
        assert!(send_again_after(3, at(t, 3, Verdict::Dead)), "a dead path");
        assert!(
            !send_again_after(3, at(t, 3, Verdict::Open)),
            "nothing older left to check: every connection busy"
        );
        assert!(
            !send_again_after(3, at(t, 4, Verdict::Alive)),
            "alive since"
        );
        assert!(send_again_after(3, at(t, 4, Verdict::Dead)), "dead since");
        assert!(!send_again_after(3, None));
    }

    #[test]
    fn a_check_settles_the_suspicion_it_was_made_for_once() {
        let silences = Silences::default();
        let idle = Instant::now();
        let id = silences.suspect();
        assert_eq!(
            silences.latest().map(|s| (s.id, s.verdict)),
            Some((id, Verdict::Open))
        );
        silences.settle(idle, false);
        assert_eq!(silences.latest().map(|s| s.verdict), Some(Verdict::Dead));
        // A later answer does not revive a path found dead.
        silences.settle(idle, true);
        assert_eq!(silences.latest().map(|s| s.verdict), Some(Verdict::Dead));
        let next = silences.suspect();
        assert_eq!(next, id + 1);
        // A connection used after the suspicion settles nothing.
        silences.settle(Instant::now() + Duration::from_secs(1), true);
        assert_eq!(silences.latest().map(|s| s.verdict), Some(Verdict::Open));
        silences.settle(idle, true);
        assert_eq!(silences.latest().map(|s| s.verdict), Some(Verdict::Alive));
    }
}
