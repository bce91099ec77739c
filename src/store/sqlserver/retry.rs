//! When a store call sends its request again, and by when it gives up:
//! the decisions of `SqlServerStore::with_client` (in `mod.rs`) as pure
//! functions (the silence rules it asks are in `silence.rs`).

use std::time::Duration;

use super::classify;

/// How a request on a connection failed, for [`send_again`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// Its transport broke (I/O, TLS).
    Cut,
    /// The server ended its session (killed, shutting down, a fatal error).
    Ended,
    /// Anything else: an answer to this call.
    Other,
}

impl Loss {
    pub fn of(e: &tiberius::error::Error) -> Loss {
        if classify::is_transport_cut(e) {
            Loss::Cut
        } else if classify::is_session_ended(e) {
            Loss::Ended
        } else {
            Loss::Other
        }
    }
}

/// Whether a call whose connection broke moves on to the next: only after
/// a loss of the connection, not an answer; only if the connection had
/// served (one lost before serving says the server is not there, the
/// call's own retry-once covers it); `tried` times already, of `limit` (the
/// pool's size); only with time left (`allowed`).
pub fn send_again(loss: Loss, served: bool, tried: u32, limit: u32, allowed: bool) -> bool {
    loss != Loss::Other && served && tried < limit && allowed
}

/// Whether a call whose served connection gave no answer within its
/// `timeout` is sent again once the suspicion it raised is settled: once
/// per call (`suspected` already, no), with time left, and only for a call
/// bounded by the query timeout (`query_timeout`): a migration that runs
/// out of its longer bound is not on a dead path.
pub fn resend_after_silence(
    suspected: bool,
    time_left: bool,
    timeout: Duration,
    query_timeout: Duration,
) -> bool {
    !suspected && time_left && timeout <= query_timeout
}

/// The budget of one call: one connect and one attempt (`timeout`), shared
/// by every step of it, so waits never stack per attempt (a call that
/// waited for a connection has that much less to run; a re-send after a
/// silence gets what the first attempt left).
pub fn call_budget(connect_timeout: Duration, timeout: Duration) -> Duration {
    connect_timeout + timeout
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_moves_on_only_after_losing_a_connection_that_had_served() {
        for loss in [Loss::Cut, Loss::Ended] {
            assert!(send_again(loss, true, 0, 10, true), "{loss:?}");
            assert!(
                !send_again(loss, false, 0, 10, true),
                "{loss:?} before serving"
            );
            assert!(
                !send_again(loss, true, 10, 10, true),
                "{loss:?}: every pooled one tried"
            );
            assert!(
                !send_again(loss, true, 0, 10, false),
                "{loss:?}: the deadline passed"
            );
        }
        assert!(!send_again(Loss::Other, true, 0, 10, true), "an answer");
    }

    #[test]
    fn a_silent_call_is_sent_again_once_with_time_left_when_bounded_by_the_query_timeout() {
        let q = Duration::from_secs(8);
        assert!(resend_after_silence(false, true, q, q));
        assert!(resend_after_silence(false, true, q / 2, q));
        assert!(!resend_after_silence(true, true, q, q), "once per call");
        assert!(!resend_after_silence(false, false, q, q), "no time left");
        assert!(
            !resend_after_silence(false, true, q * 3, q),
            "a migration's longer bound"
        );
    }

    #[test]
    fn one_budget_per_call_a_connect_and_an_attempt() {
        assert_eq!(
            call_budget(Duration::from_secs(10), Duration::from_secs(8)),
            Duration::from_secs(18)
        );
    }
}
