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
//! login turns for its whole budget. With every connection busy and every
//! login turn taken, a login in flight settles the suspicion itself when it
//! has heard nothing from the server for as long as a statement may run,
//! and no check has settled it within [`CHECK_TIME`]
//! ([`login_settles`]): otherwise logins caught by the drop would hold
//! every turn for their whole budget, and nothing could replace the dead
//! connections until then. With a turn free the pool still logs in, and a
//! login is not begun again beside it (on the CI's engine each new session
//! costs about 1.5 s of CPU).

use std::sync::Mutex;
use std::time::{Duration, Instant};

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
/// (`since`) by how long a silence, and its verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Suspicion {
    pub id: u64,
    pub since: Instant,
    /// How long the request that raised it went unanswered.
    pub silence: Duration,
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

/// How long a suspicion stays open before a login may settle it: the
/// pool's check of an idle connection (`pool::CHECK_TIMEOUT`) and a margin,
/// so a connection left idle to check always settles it first.
pub const CHECK_TIME: Duration = Duration::from_millis(2_500);

/// Whether a login that has heard nothing from the server since `quiet`
/// (its start, its turn taken and its token in hand, or the server's last
/// answer to it: the login itself, a statement of its session setup)
/// settles `latest` as dead at `now`: the suspicion was raised by a served
/// connection silent for a whole query timeout (`query_timeout`; a missed
/// 2 s check or a call's last seconds say less), the login had itself
/// heard nothing that long when it was raised, and the suspicion has
/// stayed open for `check_time` since (no idle connection was left to
/// check, or its check would have settled it by then). A live server
/// answers a login in well under a query timeout: two requests that silent
/// at once are the dead path an idle connection's check would have shown.
pub fn login_settles(
    quiet: Instant,
    query_timeout: Duration,
    check_time: Duration,
    latest: Option<Suspicion>,
    now: Instant,
) -> bool {
    latest.is_some_and(|s| {
        s.verdict == Verdict::Open
            && s.silence >= query_timeout
            && s.since.saturating_duration_since(quiet) >= query_timeout
            && now.saturating_duration_since(s.since) >= check_time
    })
}

/// The latest suspicion, shared by the pool's manager (which settles it on
/// checkout) and the store (which raises it and reads its verdict).
#[derive(Debug, Default)]
pub struct Silences {
    state: Mutex<State>,
    /// Woken when a suspicion is found dead.
    found_dead: tokio::sync::Notify,
    /// Woken when a suspicion is raised.
    raised: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct State {
    latest: Option<Suspicion>,
    /// When the newest suspicion found dead was raised: kept apart from
    /// `latest`, which the next timeout replaces (a login woken by the
    /// verdict must still see it then).
    dead_since: Option<Instant>,
}

/// Whether a connection opened at `opened` is on a path found dead by a
/// suspicion raised at `dead_since`: it was open at that time.
pub fn opened_on_dead_path(opened: Instant, dead_since: Option<Instant>) -> bool {
    dead_since.is_some_and(|since| opened <= since)
}

impl Silences {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The suspicion raised at `since` found dead: the logins open then
    /// are woken, and give up.
    fn mark_dead(&self, state: &mut State, since: Instant) {
        state.dead_since = state.dead_since.max(Some(since));
        self.found_dead.notify_waiters();
    }

    /// A served connection got no answer for `silence`, until now: raise a
    /// suspicion on every connection idle since before now. Its id.
    pub fn suspect(&self, silence: Duration) -> u64 {
        let mut state = self.lock();
        let id = state.latest.map_or(1, |s| s.id + 1);
        state.latest = Some(Suspicion {
            id,
            since: Instant::now(),
            silence,
            verdict: Verdict::Open,
        });
        self.raised.notify_waiters();
        id
    }

    /// The check of a connection last used at `last_used` (decided by
    /// [`on_checkout`] as [`Checkout::Settle`]) answered or not: the
    /// verdict of the suspicion it was checked for, if still the latest.
    pub fn settle(&self, last_used: Instant, answered: bool) {
        let mut state = self.lock();
        let Some(s) = state.latest.as_mut() else {
            return;
        };
        if s.verdict != Verdict::Open || last_used > s.since {
            return;
        }
        if answered {
            s.verdict = Verdict::Alive;
        } else {
            s.verdict = Verdict::Dead;
            let since = s.since;
            self.mark_dead(&mut state, since);
        }
    }

    /// Returns once a path is found dead with a login begun at `opened` on
    /// it ([`opened_on_dead_path`]): by a check, or by this login itself
    /// ([`login_settles`]). `heard` says when the server last answered the
    /// login (its start if never), and whether every login turn is taken:
    /// with one free the pool still logs in, and the login settles nothing.
    /// The login is then to be abandoned.
    pub async fn found_dead_since(
        &self,
        opened: Instant,
        query_timeout: Duration,
        heard: impl Fn() -> (Instant, bool),
    ) {
        loop {
            let dead = self.found_dead.notified();
            let raised = self.raised.notified();
            tokio::pin!(dead, raised);
            // Registered before the checks, so a change in between wakes it.
            dead.as_mut().enable();
            raised.as_mut().enable();
            let (latest, dead_since) = {
                let state = self.lock();
                (state.latest, state.dead_since)
            };
            if opened_on_dead_path(opened, dead_since) {
                return;
            }
            // A suspicion this login may settle once it has stayed open
            // for a check's time: when that is.
            let (quiet, _) = heard();
            let settles_at = latest
                .filter(|s| login_settles(quiet, query_timeout, Duration::ZERO, Some(*s), s.since))
                .map(|s| s.since + CHECK_TIME);
            let now = Instant::now();
            if settles_at.is_some_and(|at| at <= now) {
                let (quiet, every_turn_taken) = heard();
                if every_turn_taken && self.settle_by_login(quiet, query_timeout, now) {
                    return;
                }
            }
            let timer = settles_at.filter(|at| *at > now);
            tokio::select! {
                () = dead => {}
                () = raised => {}
                () = async {
                    match timer {
                        Some(at) => tokio::time::sleep_until(at.into()).await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
        }
    }

    /// The suspicion found dead by a login ([`login_settles`]), if it
    /// settles it now.
    fn settle_by_login(&self, quiet: Instant, query_timeout: Duration, now: Instant) -> bool {
        let mut state = self.lock();
        match state.latest.as_mut() {
            Some(s) if login_settles(quiet, query_timeout, CHECK_TIME, Some(*s), now) => {
                log::warn!(
                    "SQL Server: a login unanswered for {} ms while a served connection was silent \
                     for {} ms, and no idle connection left to check; the network path is taken \
                     for dead, and logins on it are begun again",
                    now.saturating_duration_since(quiet).as_millis(),
                    s.silence.as_millis()
                );
                s.verdict = Verdict::Dead;
                let since = s.since;
                self.mark_dead(&mut state, since);
                true
            }
            _ => false,
        }
    }

    /// The latest suspicion.
    pub fn latest(&self) -> Option<Suspicion> {
        self.lock().latest
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(since: Instant, id: u64, verdict: Verdict) -> Option<Suspicion> {
        Some(Suspicion {
            id,
            since,
            silence: Duration::from_secs(8),
            verdict,
        })
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
        assert!(opened_on_dead_path(before, Some(t)));
        assert!(opened_on_dead_path(t, Some(t)));
        assert!(!opened_on_dead_path(after, Some(t)), "opened since");
        assert!(!opened_on_dead_path(before, None));
    }

    /// The next timeout replaces the latest suspicion at once (eight calls
    /// time out together after a drop): a login woken by a dead verdict
    /// must still find its path dead then.
    #[test]
    fn a_path_found_dead_stays_dead_for_logins_after_a_newer_suspicion() {
        let silences = Silences::default();
        let login = Instant::now();
        let idle = Instant::now();
        silences.suspect(Duration::from_secs(8));
        assert!(!opened_on_dead_path(login, silences.lock().dead_since));
        silences.settle(idle, false);
        silences.suspect(Duration::from_secs(8));
        assert_eq!(silences.latest().map(|s| s.verdict), Some(Verdict::Open));
        assert!(opened_on_dead_path(login, silences.lock().dead_since));
        assert!(!opened_on_dead_path(
            Instant::now(),
            silences.lock().dead_since
        ));
    }

    #[test]
    fn a_login_settles_only_a_statement_long_silence_no_check_settled_when_as_silent() {
        let t = Instant::now();
        let timeout = Duration::from_secs(8);
        let check = CHECK_TIME;
        let later = t + check;
        let long_before = t - timeout;
        let settles = |began, latest, now| login_settles(began, timeout, check, latest, now);
        assert!(settles(long_before, at(t, 1, Verdict::Open), later));
        assert!(
            !settles(
                long_before,
                at(t, 1, Verdict::Open),
                later - Duration::from_millis(1)
            ),
            "an idle connection's check may still settle it"
        );
        assert!(
            !settles(t - Duration::from_secs(7), at(t, 1, Verdict::Open), later),
            "a login not yet as silent as the statement"
        );
        assert!(
            !settles(t + timeout, at(t, 1, Verdict::Open), later + timeout),
            "a login begun after the suspicion"
        );
        let short = at(t, 1, Verdict::Open).map(|s| Suspicion {
            silence: CHECK_TIME,
            ..s
        });
        assert!(
            !settles(long_before, short, later),
            "raised by a silence shorter than a query timeout (a missed check)"
        );
        assert!(
            !settles(long_before, at(t, 1, Verdict::Alive), later),
            "a path that answered its check"
        );
        assert!(
            !settles(long_before, at(t, 1, Verdict::Dead), later),
            "settled already"
        );
        assert!(!settles(long_before, None, later));
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
        let id = silences.suspect(Duration::from_secs(8));
        assert_eq!(
            silences.latest().map(|s| (s.id, s.verdict)),
            Some((id, Verdict::Open))
        );
        silences.settle(idle, false);
        assert_eq!(silences.latest().map(|s| s.verdict), Some(Verdict::Dead));
        // A later answer does not revive a path found dead.
        silences.settle(idle, true);
        assert_eq!(silences.latest().map(|s| s.verdict), Some(Verdict::Dead));
        let next = silences.suspect(Duration::from_secs(8));
        assert_eq!(next, id + 1);
        // A connection used after the suspicion settles nothing.
        silences.settle(Instant::now() + Duration::from_secs(1), true);
        assert_eq!(silences.latest().map(|s| s.verdict), Some(Verdict::Open));
        silences.settle(idle, true);
        assert_eq!(silences.latest().map(|s| s.verdict), Some(Verdict::Alive));
    }
}
