//! One store call on the pool: its budget, its attempts on pooled
//! connections, and when it is sent again ([`SqlServerStore::with_client`]);
//! the decisions it asks are pure functions in [`super::retry`] and
//! [`super::silence`].

use std::marker::PhantomData;
use std::time::Duration;

use tiberius::error::Error as SqlError;

use super::pool::{Client, SqlConnectionManager};
use super::retry::{call_budget, resend_after_silence, send_again, Loss};
use super::{classify, silence, SqlServerStore};
use crate::store::StoreError;

/// Pause before the one retry on a dropped connection.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// One attempt of a call: its connection, borrowed for the attempt (`'c`),
/// which lies within the call (`'a`, the lifetime of what the call's
/// future borrows: its order, its ids). The marker says so to the compiler
/// (`'a: 'c`), so an attempt's future may hold both.
pub(super) struct Attempt<'c, 'a> {
    pub(super) client: &'c mut Client,
    _call: PhantomData<&'c &'a ()>,
}

/// An attempt's future, sent between threads as every store call is.
type BoxFuture<'c, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'c>>;

impl SqlServerStore {
    /// Run `body` on a pooled connection, each attempt within `timeout`, the
    /// whole call by one deadline ([`call_budget`]: the wait for a
    /// connection, every attempt and every re-send draw from it). A
    /// connection that had served (or sat in the pool since before the call)
    /// and then broke (its transport cut, its session killed or shut down)
    /// went stale in the pool: a server restart takes every idle one at
    /// once, so the call moves on to the next, up to the pool's size
    /// ([`send_again`]). One such that gave no answer in time raises a
    /// suspicion of a dead network path ([`silence`]), which the next
    /// checkout settles: the call is sent again on another connection
    /// unless the path answered (a slow statement), once per call and only
    /// for a call bounded by the query timeout ([`resend_after_silence`]: a
    /// migration that runs out of its bound is not on a dead path). Any
    /// other lost connection is retried once, after a pause. (A call sent
    /// again after a cut or silence that followed its commit answers what
    /// the row says: `done` for an execute, one more delivery counted for a
    /// rejection.) A connection goes back to the pool only after a request
    /// that finished without any error: one that timed out, was cancelled
    /// or failed (inside a transaction or not) is discarded, and closing it
    /// makes the server roll back whatever it had open.
    pub(super) async fn with_client<'a, T>(
        &self,
        what: &str,
        timeout: Duration,
        mut body: impl for<'c> FnMut(Attempt<'c, 'a>) -> BoxFuture<'c, Result<T, SqlError>>,
    ) -> Result<T, StoreError> {
        let called = std::time::Instant::now();
        let deadline = tokio::time::Instant::now() + call_budget(self.connect_timeout, timeout);
        let mut stale = 0u32;
        let mut fresh_lost = false;
        let mut first = true;
        // The suspicion this call raised, until its re-send's checkout
        // settled it; and whether it raised one at all.
        let mut suspicion: Option<u64> = None;
        let mut suspected = false;
        loop {
            let mut conn = self
                .checkout(what, (!std::mem::take(&mut first)).then_some(deadline))
                .await?;
            if let Some(id) = suspicion.take() {
                if !silence::send_again_after(id, self.silences.latest()) {
                    // The path answered its check: the statement was slow,
                    // not lost; sending it again would only add load.
                    return Err(classify::query_timeout(what, timeout));
                }
            }
            conn.broken = true;
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let attempt = Attempt {
                client: &mut conn.client,
                _call: PhantomData,
            };
            let result = tokio::time::timeout(timeout.min(left), body(attempt)).await;
            // Stale-eligible: it served, or sat in the pool since before
            // this call (one opened for it says the server is not there).
            let served = conn.served || conn.opened < called;
            let time_left = tokio::time::Instant::now() < deadline;
            match result {
                Err(_) if served => {
                    let id = self.silences.suspect(timeout.min(left));
                    if !resend_after_silence(suspected, time_left, timeout, self.query_timeout) {
                        return Err(classify::query_timeout(what, timeout));
                    }
                    (suspicion, suspected) = (Some(id), true);
                    log::warn!(
                        "{what}: a pooled connection gave no answer within {} ms; \
                         sending again on another unless its network path answers",
                        timeout.min(left).as_millis()
                    );
                }
                Err(_) => return Err(classify::query_timeout(what, timeout)),
                Ok(Ok(value)) => {
                    conn.broken = false;
                    conn.served = true;
                    conn.last_used = std::time::Instant::now();
                    return Ok(value);
                }
                Ok(Err(e))
                    if send_again(Loss::of(&e), served, stale, self.pool_size, time_left) =>
                {
                    stale += 1;
                    log::warn!("{what}: a pooled connection was lost ({e}); trying the next");
                }
                Ok(Err(e)) if classify::is_connection_lost(&e) && !fresh_lost && time_left => {
                    fresh_lost = true;
                    log::warn!("{what}: connection lost ({e}); retrying once on a new connection");
                    drop(conn);
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Ok(Err(e)) => return Err(classify::classify(what, &e)),
            }
        }
    }

    /// A pooled connection: the first wait of a call (`deadline` `None`) is
    /// bb8's own (its bound is the whole budget, [`call_budget`]); a later
    /// one, with less left, waits in a task of its own that the call stops
    /// waiting for at the deadline: bb8's wait then ends by itself, counted
    /// and with any connection it got returned to the pool, where dropping
    /// it half-way would leave it counted as pending.
    async fn checkout(
        &self,
        what: &str,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<bb8::PooledConnection<'static, SqlConnectionManager>, StoreError> {
        let budget = call_budget(self.connect_timeout, self.query_timeout);
        let got = if let Some(deadline) = deadline {
            let pool = self.pool.clone();
            let wait = tokio::spawn(async move { pool.get_owned().await });
            match tokio::time::timeout_at(deadline, wait).await {
                Ok(Ok(got)) => got,
                Ok(Err(_)) | Err(_) => Err(bb8::RunError::TimedOut),
            }
        } else {
            self.pool.get_owned().await
        };
        match got {
            Ok(conn) => Ok(conn),
            Err(bb8::RunError::User(e)) => Err(StoreError::Transient(format!("{what}: {e}"))),
            Err(bb8::RunError::TimedOut) => {
                let last = self
                    .last_connect_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                Err(classify::pool_timeout(what, budget, last))
            }
        }
    }
}
