//! Silent connections: what a request that got no answer in time says
//! about the connections idle beside it. The rules are pure functions of
//! what a connection or a login last heard and when, the latest suspicion
//! and the settings ([`on_checkout`], [`send_again_after`],
//! [`login_settles`], [`Ledger`]'s methods, each given the instant it
//! decides at); [`Silences`] only holds the ledger behind a lock and wakes
//! the logins waiting on it.
//!
//! A timeout on a connection that has served is either a slow statement (a
//! lock wait, a busy server) or a dead network path (a load balancer or NAT
//! that dropped the flow without a RST or FIN: nothing ever comes back). The
//! two call for opposite answers: a dead path takes every connection that
//! was idle on it, so those must be discarded rather than each waited on
//! for another timeout, and the call sent again on a new connection; a slow
//! statement says nothing about the others, and sending it again only adds
//! load. So a timeout raises a *suspicion* ([`Ledger::raise`]), and the
//! next checkout settles it on a connection idle since before it, with a
//! check bounded by `pool::CHECK_TIMEOUT` ([`on_checkout`]): answered, the
//! path is alive (the call answers `retry`, as a slow statement should);
//! not answered, it is dead from then on (every older connection is
//! discarded unchecked, and the call is sent again). With no older
//! connection left to check, the call answers `retry` (every connection
//! was busy: a loaded server explains that as well as a dead path). A
//! login in flight on a path found dead is abandoned
//! ([`Ledger::on_login`]): it would hold one of the pool's few login turns
//! for its whole budget. With every connection busy and every login turn
//! taken, a login in flight settles the suspicion itself when it has heard
//! nothing from the server for as long as a statement may run, and no
//! check has settled it within [`CHECK_TIME`] ([`login_settles`]):
//! otherwise logins caught by the drop would hold every turn for their
//! whole budget, and nothing could replace the dead connections until
//! then. With a turn free the pool still logs in, and a login is not begun
//! again beside it (on the CI's engine each new session costs about 1.5 s
//! of CPU).
//!
//! What the rules guarantee: a slow statement is never sent twice (only a
//! check that went unanswered, or a login as silent as a whole statement
//! with no check possible, finds a path dead); a path found dead stays dead
//! for every connection and login open on it then, whatever suspicion comes
//! next; and a connection used since a suspicion is never touched by it.

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
    /// Hand it out as it is: used recently, on no path in doubt.
    Keep,
    /// Check it first (`SELECT @@TRANCOUNT`): it sat idle long enough for a
    /// server restart or an idle timeout on the path to have cut it.
    Check,
    /// Check it now, whatever its idle time: its answer settles a suspicion.
    Settle,
    /// Discard it unchecked: it sat on a path found dead.
    Drop,
}

/// The decision on checkout, at `now`, for a connection last used at
/// `last_used`, given the latest suspicion: a suspicion concerns only a
/// connection idle since before it (one used since answered after it);
/// otherwise a connection idle for `check_after_idle` or longer is checked.
pub fn on_checkout(
    last_used: Instant,
    now: Instant,
    check_after_idle: Duration,
    latest: Option<Suspicion>,
) -> Checkout {
    match latest {
        Some(s) if last_used <= s.since && s.verdict == Verdict::Open => Checkout::Settle,
        Some(s) if last_used <= s.since && s.verdict == Verdict::Dead => Checkout::Drop,
        _ if now.saturating_duration_since(last_used) < check_after_idle => Checkout::Keep,
        _ => Checkout::Check,
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

/// Whether a connection opened at `opened` is on a path found dead by a
/// suspicion raised at `dead_since`: it was open at that time.
pub fn opened_on_dead_path(opened: Instant, dead_since: Option<Instant>) -> bool {
    dead_since.is_some_and(|since| opened <= since)
}

/// A login in flight, as [`Ledger::on_login`] weighs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Login {
    /// When its connection was begun.
    pub opened: Instant,
    /// When it last heard from the server (its start if never).
    pub quiet: Instant,
    /// Whether every login turn of the pool is taken.
    pub every_turn_taken: bool,
}

/// What a login in flight does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginStep {
    /// Give up: its path was found dead while it was open.
    Abandon,
    /// Give up: it found the path dead itself ([`login_settles`]), after
    /// the suspicion raised by a silence this long.
    FoundDead { silence: Duration },
    /// Go on, and ask again at this instant (when the latest suspicion may
    /// be settled by it), or when the ledger changes.
    Wait { until: Option<Instant> },
}

/// The silence rules' memory: the latest suspicion, and when the newest
/// one found dead was raised. Every change takes the instant it happens at
/// or is decided at: no clock, no I/O, no lock.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Ledger {
    latest: Option<Suspicion>,
    /// When the newest suspicion found dead was raised: kept apart from
    /// `latest`, which the next timeout replaces (a login woken by the
    /// verdict must still see it then).
    dead_since: Option<Instant>,
}

impl Ledger {
    /// The latest suspicion.
    pub fn latest(&self) -> Option<Suspicion> {
        self.latest
    }

    /// A served connection got no answer for `silence`, until `now`: a
    /// suspicion on every connection idle since before `now`. Its id.
    pub fn raise(&mut self, silence: Duration, now: Instant) -> u64 {
        let id = self.latest.map_or(1, |s| s.id + 1);
        self.latest = Some(Suspicion {
            id,
            since: now,
            silence,
            verdict: Verdict::Open,
        });
        id
    }

    /// The check of a connection last used at `last_used` (decided by
    /// [`on_checkout`] as [`Checkout::Settle`]) answered or not: the
    /// verdict of the suspicion it was checked for, if still the latest
    /// and still open. Whether it found the path dead.
    pub fn settle(&mut self, last_used: Instant, answered: bool) -> bool {
        let Some(s) = self.latest.as_mut() else {
            return false;
        };
        if s.verdict != Verdict::Open || last_used > s.since {
            return false;
        }
        if answered {
            s.verdict = Verdict::Alive;
            false
        } else {
            s.verdict = Verdict::Dead;
            let since = s.since;
            self.dead_since = self.dead_since.max(Some(since));
            true
        }
    }

    /// What `login` does at `now`: abandoned when open on a path found
    /// dead; settling the latest suspicion dead itself when
    /// [`login_settles`] holds and every turn is taken (with one free the
    /// pool still logs in); otherwise waiting, until the instant the
    /// latest suspicion may be settled by it, if it may.
    pub fn on_login(&mut self, login: &Login, query_timeout: Duration, now: Instant) -> LoginStep {
        if opened_on_dead_path(login.opened, self.dead_since) {
            return LoginStep::Abandon;
        }
        let Some(s) = self.latest.as_mut() else {
            return LoginStep::Wait { until: None };
        };
        if !login_settles(
            login.quiet,
            query_timeout,
            Duration::ZERO,
            Some(*s),
            s.since,
        ) {
            return LoginStep::Wait { until: None };
        }
        let settles_at = s.since + CHECK_TIME;
        if settles_at > now {
            return LoginStep::Wait {
                until: Some(settles_at),
            };
        }
        if !login.every_turn_taken {
            return LoginStep::Wait { until: None };
        }
        s.verdict = Verdict::Dead;
        let (since, silence) = (s.since, s.silence);
        self.dead_since = self.dead_since.max(Some(since));
        LoginStep::FoundDead { silence }
    }
}

/// The ledger, shared by the pool's manager (which settles suspicions on
/// checkout, and whose logins wait on it) and the store (which raises them
/// and reads their verdict).
#[derive(Debug, Default)]
pub struct Silences {
    ledger: Mutex<Ledger>,
    /// Woken when a suspicion is found dead.
    found_dead: tokio::sync::Notify,
    /// Woken when a suspicion is raised.
    raised: tokio::sync::Notify,
}

impl Silences {
    fn lock(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`Ledger::raise`], now.
    pub fn suspect(&self, silence: Duration) -> u64 {
        let id = self.lock().raise(silence, Instant::now());
        self.raised.notify_waiters();
        id
    }

    /// [`Ledger::settle`]; the logins open on a path found dead are woken,
    /// and give up.
    pub fn settle(&self, last_used: Instant, answered: bool) {
        if self.lock().settle(last_used, answered) {
            self.found_dead.notify_waiters();
        }
    }

    /// The latest suspicion.
    pub fn latest(&self) -> Option<Suspicion> {
        self.lock().latest()
    }

    /// Returns once a login begun at `opened` is to be abandoned
    /// ([`Ledger::on_login`]), asked again whenever a suspicion is raised
    /// or found dead and at the instant the login may settle one. `heard`
    /// says when the server last answered the login (its start if never),
    /// and whether every login turn is taken.
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
            // Registered before the ledger is read, so a change in between
            // wakes it.
            dead.as_mut().enable();
            raised.as_mut().enable();
            let (quiet, every_turn_taken) = heard();
            let login = Login {
                opened,
                quiet,
                every_turn_taken,
            };
            let now = Instant::now();
            let step = self.lock().on_login(&login, query_timeout, now);
            let until = match step {
                LoginStep::Abandon => return,
                LoginStep::FoundDead { silence } => {
                    log::warn!(
                        "SQL Server: a login unanswered for {} ms while a served connection was \
                         silent for {} ms, and no idle connection left to check; the network \
                         path is taken for dead, and logins on it are begun again",
                        now.saturating_duration_since(quiet).as_millis(),
                        silence.as_millis()
                    );
                    self.found_dead.notify_waiters();
                    return;
                }
                LoginStep::Wait { until } => until,
            };
            tokio::select! {
                () = dead => {}
                () = raised => {}
                () = async {
                    match until {
                        Some(at) => tokio::time::sleep_until(at.into()).await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const QUERY_TIMEOUT: Duration = Duration::from_secs(8);
    const CHECK_AFTER_IDLE: Duration = Duration::from_secs(5);

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn at(since: Instant, id: u64, verdict: Verdict) -> Option<Suspicion> {
        Some(Suspicion {
            id,
            since,
            silence: QUERY_TIMEOUT,
            verdict,
        })
    }

    #[test]
    fn only_connections_idle_since_before_a_suspicion_are_concerned() {
        let t = Instant::now();
        let before = t - secs(1);
        let after = t + secs(1);
        let now = t + secs(2);
        let decide = |last_used, latest| on_checkout(last_used, now, CHECK_AFTER_IDLE, latest);
        assert_eq!(decide(before, None), Checkout::Keep);
        assert_eq!(decide(before, at(t, 1, Verdict::Open)), Checkout::Settle);
        assert_eq!(decide(t, at(t, 1, Verdict::Open)), Checkout::Settle);
        assert_eq!(decide(before, at(t, 1, Verdict::Dead)), Checkout::Drop);
        assert_eq!(decide(before, at(t, 1, Verdict::Alive)), Checkout::Keep);
        for verdict in [Verdict::Open, Verdict::Dead, Verdict::Alive] {
            assert_eq!(decide(after, at(t, 1, verdict)), Checkout::Keep);
        }
    }

    #[test]
    fn a_connection_idle_for_the_check_time_is_checked_unless_a_suspicion_decides() {
        let t = Instant::now();
        let decide = |now, latest| on_checkout(t, now, CHECK_AFTER_IDLE, latest);
        let just_under = t + CHECK_AFTER_IDLE - Duration::from_millis(1);
        assert_eq!(decide(just_under, None), Checkout::Keep);
        assert_eq!(decide(t + CHECK_AFTER_IDLE, None), Checkout::Check);
        assert_eq!(decide(t + secs(60), None), Checkout::Check);
        let long = t + secs(60);
        assert_eq!(
            decide(long, at(t + secs(1), 1, Verdict::Alive)),
            Checkout::Check,
            "a path found alive leaves the idle check as it was"
        );
        assert_eq!(
            decide(long, at(t + secs(1), 1, Verdict::Open)),
            Checkout::Settle
        );
        assert_eq!(
            decide(long, at(t + secs(1), 1, Verdict::Dead)),
            Checkout::Drop
        );
        assert_eq!(
            decide(t, at(t - secs(1), 1, Verdict::Dead)),
            Checkout::Keep,
            "used since the path was found dead"
        );
        // A clock read before `last_used` (another thread's) is no idle time.
        assert_eq!(decide(t - secs(1), None), Checkout::Keep);
    }

    #[test]
    fn a_login_open_when_its_path_was_found_dead_is_on_it() {
        let t = Instant::now();
        let before = t - secs(1);
        let after = t + secs(1);
        assert!(opened_on_dead_path(before, Some(t)));
        assert!(opened_on_dead_path(t, Some(t)));
        assert!(!opened_on_dead_path(after, Some(t)), "opened since");
        assert!(!opened_on_dead_path(before, None));
    }

    #[test]
    fn a_login_settles_only_a_statement_long_silence_no_check_settled_when_as_silent() {
        let t = Instant::now();
        let check = CHECK_TIME;
        let later = t + check;
        let long_before = t - QUERY_TIMEOUT;
        let settles = |began, latest, now| login_settles(began, QUERY_TIMEOUT, check, latest, now);
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
            !settles(t - secs(7), at(t, 1, Verdict::Open), later),
            "a login not yet as silent as the statement"
        );
        assert!(
            !settles(
                t + QUERY_TIMEOUT,
                at(t, 1, Verdict::Open),
                later + QUERY_TIMEOUT
            ),
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
        let t = Instant::now();
        let idle = t - secs(10);
        let mut ledger = Ledger::default();
        let id = ledger.raise(QUERY_TIMEOUT, t);
        assert_eq!(ledger.latest(), at(t, id, Verdict::Open));
        assert!(ledger.settle(idle, false), "found dead");
        assert_eq!(ledger.latest().map(|s| s.verdict), Some(Verdict::Dead));
        // A later answer does not revive a path found dead.
        assert!(!ledger.settle(idle, true));
        assert_eq!(ledger.latest().map(|s| s.verdict), Some(Verdict::Dead));
        let next = ledger.raise(QUERY_TIMEOUT, t + secs(1));
        assert_eq!(next, id + 1);
        // A connection used after the suspicion settles nothing.
        assert!(!ledger.settle(t + secs(2), true));
        assert_eq!(ledger.latest().map(|s| s.verdict), Some(Verdict::Open));
        assert!(!ledger.settle(idle, true));
        assert_eq!(ledger.latest().map(|s| s.verdict), Some(Verdict::Alive));
    }

    /// The next timeout replaces the latest suspicion at once (eight calls
    /// time out together after a drop): a login open when the path was
    /// found dead must still find it dead then.
    #[test]
    fn a_path_found_dead_stays_dead_for_logins_after_a_newer_suspicion() {
        let t = Instant::now();
        let login = Login {
            opened: t,
            quiet: t,
            every_turn_taken: false,
        };
        let mut ledger = Ledger::default();
        ledger.raise(Duration::from_secs(2), t + secs(1));
        assert_eq!(
            ledger.on_login(&login, QUERY_TIMEOUT, t + secs(1)),
            LoginStep::Wait { until: None }
        );
        assert!(ledger.settle(t, false));
        ledger.raise(QUERY_TIMEOUT, t + secs(2));
        assert_eq!(ledger.latest().map(|s| s.verdict), Some(Verdict::Open));
        assert_eq!(
            ledger.on_login(&login, QUERY_TIMEOUT, t + secs(2)),
            LoginStep::Abandon
        );
        let since = Login {
            opened: t + secs(2),
            quiet: t + secs(2),
            ..login
        };
        assert_eq!(
            ledger.on_login(&since, QUERY_TIMEOUT, t + secs(2)),
            LoginStep::Wait { until: None },
            "a login begun after the path was found dead"
        );
    }

    /// With every connection busy, nothing idle is left to settle a
    /// suspicion: a login as silent as the statement waits a check's time,
    /// then settles it dead if every turn is taken, and so do the logins
    /// open beside it; with a turn free the pool still logs in.
    #[test]
    fn a_silent_login_settles_a_suspicion_a_check_time_after_it_only_with_every_turn_taken() {
        let t = Instant::now();
        let raised = t + QUERY_TIMEOUT;
        let settles_at = raised + CHECK_TIME;
        let login = |every_turn_taken| Login {
            opened: t,
            quiet: t,
            every_turn_taken,
        };
        let mut ledger = Ledger::default();
        assert_eq!(
            ledger.on_login(&login(true), QUERY_TIMEOUT, raised),
            LoginStep::Wait { until: None },
            "nothing suspected"
        );
        ledger.raise(QUERY_TIMEOUT, raised);
        assert_eq!(
            ledger.on_login(&login(true), QUERY_TIMEOUT, raised),
            LoginStep::Wait {
                until: Some(settles_at)
            }
        );
        assert_eq!(
            ledger.on_login(&login(false), QUERY_TIMEOUT, settles_at),
            LoginStep::Wait { until: None },
            "a turn free: the pool still logs in"
        );
        assert_eq!(ledger.latest().map(|s| s.verdict), Some(Verdict::Open));
        assert_eq!(
            ledger.on_login(&login(true), QUERY_TIMEOUT, settles_at),
            LoginStep::FoundDead {
                silence: QUERY_TIMEOUT
            }
        );
        assert_eq!(ledger.latest().map(|s| s.verdict), Some(Verdict::Dead));
        assert_eq!(
            ledger.on_login(&login(false), QUERY_TIMEOUT, settles_at),
            LoginStep::Abandon,
            "the other logins open on the path"
        );
        assert!(send_again_after(1, ledger.latest()));
    }

    #[test]
    fn a_login_that_heard_the_server_lately_or_a_path_found_alive_settles_nothing() {
        let t = Instant::now();
        let raised = t + QUERY_TIMEOUT;
        let late = raised + CHECK_TIME + secs(30);
        let mut ledger = Ledger::default();
        ledger.raise(QUERY_TIMEOUT, raised);
        let heard_lately = Login {
            opened: t,
            quiet: raised - secs(1),
            every_turn_taken: true,
        };
        assert_eq!(
            ledger.on_login(&heard_lately, QUERY_TIMEOUT, late),
            LoginStep::Wait { until: None }
        );
        let silent = Login {
            quiet: t,
            ..heard_lately
        };
        assert!(!ledger.settle(raised - secs(1), true), "found alive");
        assert_eq!(
            ledger.on_login(&silent, QUERY_TIMEOUT, late),
            LoginStep::Wait { until: None }
        );
        ledger.raise(CHECK_TIME, late);
        assert_eq!(
            ledger.on_login(&silent, QUERY_TIMEOUT, late + CHECK_TIME),
            LoginStep::Wait { until: None },
            "raised by a missed check, not a statement's silence"
        );
    }
}
