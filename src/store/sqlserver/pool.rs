//! The bb8 connection manager for tiberius: where connections are opened.
//!
//! Why our own manager (small, on bb8's `ManageConnection`) rather than
//! `bb8-tiberius`: the login needs a current Entra ID token per
//! connection, a caller's wait must be bounded by its call's budget while
//! logins are paced (below), every socket needs TCP keep-alive,
//! and a connection interrupted mid-request (query timeout, dropped socket)
//! must never go back into the pool. Azure SQL's redirect
//! (`Error::Routing { host, port }`, the default policy inside Azure) is
//! followed by reconnecting there and logging in again.
//!
//! A connection goes back to the pool only when its last request finished
//! without an error and no transaction is open on it (`broken` is cleared
//! only then); any error discards it. A connection that sat idle for
//! [`CHECK_AFTER_IDLE`] is checked on checkout (`SELECT @@TRANCOUNT`: alive
//! and no transaction open); a busy one is not, which saves a round trip per
//! statement. Recovery after a server restart: idle connections fail their
//! check and are replaced; a busy one fails its next statement, which is
//! sent again on another connection and otherwise answered `retry`. A
//! suspicion of a dead network path (`silence.rs`) is settled here, on
//! checkout. [`MIN_IDLE`] connections are reopened in the background.
//! Nothing needs a handler restart.
//!
//! Logins are the costliest thing a client asks of the server (TCP, TLS,
//! authentication, session setup), so they are paced: at most
//! [`LOGINS_AT_ONCE`] per pool, and a login once started is allowed
//! [`login_budget`] (longer than the caller waits): a caller stops waiting at
//! its call's budget and its event answers `retry`, but the login
//! goes on in bb8's background task and its connection joins the pool for the
//! next caller. Without both, an overloaded server (or one just restarted)
//! gets a login per waiting caller, each abandoned at the timeout and started
//! again from zero: a reconnection storm that keeps the server saturated with
//! logins that never finish (seen in the SQL Server chaos run: 7 377 logins
//! abandoned, 618 orders executed in 47 min).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio_util::compat::{Compat, TokioAsyncWriteCompatExt};

use super::silence::{self, Checkout, Silences};
use super::sql;
use crate::entra::TokenSource;

/// The tiberius client over a tokio TCP stream.
pub type Client = tiberius::Client<Compat<TcpStream>>;

/// A pooled connection plus whether it may be reused.
pub struct SqlConnection {
    /// The driver's client.
    pub client: Client,
    /// Set while a request is in flight and cleared only when it completed
    /// without an error and with no transaction open, so a request abandoned
    /// half-way (timeout, cancellation), any error, or a transaction left
    /// open leaves it set and bb8 discards the connection.
    pub broken: bool,
    /// When the last request finished cleanly: a connection idle for longer
    /// than [`CHECK_AFTER_IDLE`] is checked before it is handed out again.
    pub last_used: Instant,
    /// Whether a request has completed on it: a connection lost after
    /// serving went stale in the pool (a server restart cuts them all at
    /// once), one lost before serving says the server is not there.
    pub served: bool,
    /// When it was opened: one opened before a call started sat in the
    /// pool (the background keeps [`MIN_IDLE`] there), so losing it says as
    /// little about the server now as losing one that served.
    pub opened: Instant,
}

/// A pooled connection unused for this long is checked on checkout (a
/// server restart or an idle-timeout on the network path may have cut it).
pub const CHECK_AFTER_IDLE: Duration = Duration::from_secs(5);

/// How long that check may take: `SELECT @@TRANCOUNT` answers in
/// milliseconds on a live session, so no answer within this says the path
/// is dead (a silent drop) or the server saturated, and a new connection is
/// the better bet either way.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// TCP keep-alive on every SQL socket: the first probe after this long
/// without traffic, then every [`KEEPALIVE_INTERVAL`], the connection
/// reset by the kernel after [`KEEPALIVE_RETRIES`] unanswered: a peer that
/// vanished without a FIN or RST (a silent drop behind a load balancer) is
/// found in about 30 s instead of never (on Linux in about 20 s: with
/// [`UNACKNOWLEDGED_LIMIT`] set, the kernel resets at the first probe tick
/// past it, one probe unanswered), and the probes keep a NAT or load
/// balancer's idle timer (Azure's: 4 minutes) from expiring.
pub const KEEPALIVE_TIME: Duration = Duration::from_secs(15);
/// See [`KEEPALIVE_TIME`].
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// See [`KEEPALIVE_TIME`].
pub const KEEPALIVE_RETRIES: u32 = 3;

/// Longest a request's bytes may go unacknowledged by the server's kernel
/// (`TCP_USER_TIMEOUT`, Linux) before the kernel resets the connection:
/// keep-alive covers an idle connection, this one a request or a login in
/// flight on a path that died (a busy server still acknowledges at once, so
/// a slow statement or login never meets it). Without it such a login held
/// a login turn for its whole budget (30 s).
pub const UNACKNOWLEDGED_LIMIT: Duration = Duration::from_secs(15);

/// Logins in flight per pool, at most.
pub const LOGINS_AT_ONCE: usize = 2;

/// Idle connections the pool keeps open, reopening them in the background
/// (bb8's `min_idle`): one, so a pool emptied by an outage starts refilling
/// the moment the server takes logins again. Not two: measured in the SQL
/// Server chaos run (seed 42), two doubled the logins of every start (each
/// new session compiles the procedure on Babelfish, 0.7 to 2.8 s of CPU,
/// measured on different days: `docs/sqlserver.md`, "A new session's cost
/// on the engine"), and with handlers killed and restarted the starts'
/// schema checks missed their 3 s (attempts 3 614 to 4 096 for 691
/// deliveries, against 2 088 with one).
pub const MIN_IDLE: u32 = 1;

/// How long one login may run once it has its turn: the connect timeout,
/// but never less than 30 s, so a slow login under load completes (and
/// serves the next caller) instead of being abandoned and retried; bounded,
/// so a black-holed server cannot hold a login turn forever.
pub fn login_budget(connect_timeout: Duration) -> Duration {
    connect_timeout.max(Duration::from_secs(30))
}

/// The pause after the `failures`-th failed login in a row (from 0): 250 ms,
/// doubling, at most 1 s, so a server that comes back is found within a
/// second while one that stays down sees an attempt a second per pool slot.
pub fn reconnect_pause(failures: u32) -> Duration {
    let first = Duration::from_millis(250);
    first
        .saturating_mul(1u32 << failures.min(8))
        .min(Duration::from_secs(1))
}

/// Why a connection could not be opened or checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectError {
    /// The driver's error (I/O, TLS, login refused …).
    Sql(tiberius::error::Error),
    /// No Entra ID token.
    Token(String),
    /// Connecting took longer than the connect timeout.
    Timeout(Duration),
    /// A pooled connection's check got no answer within [`CHECK_TIMEOUT`].
    Silent(Duration),
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectError::Sql(e) => write!(f, "{e}"),
            ConnectError::Token(e) => write!(f, "{e}"),
            ConnectError::Timeout(t) => write!(
                f,
                "connecting took longer than {} ms (the login budget: SQL_CONNECT_TIMEOUT_SECONDS, at least 30 s)",
                t.as_millis()
            ),
            ConnectError::Silent(t) => write!(
                f,
                "a pooled connection did not answer its check within {} ms",
                t.as_millis()
            ),
        }
    }
}

impl std::error::Error for ConnectError {}

/// The logins in flight of one pool: the connects bb8 has asked the
/// manager for and that have not returned, of which `running` hold one of
/// the [`LOGINS_AT_ONCE`] turns (TCP, TLS, token, authentication, session
/// setup); the others wait for a turn or pause after a failed attempt.
/// Read by telemetry's gauges (`OrderStore::load`).
#[derive(Debug, Default)]
pub struct Logins {
    connects: AtomicU64,
    running: AtomicU64,
}

impl Logins {
    /// `(running, waiting)` now. The two counts are read one after the
    /// other: a login that changes state in between may be seen in either.
    pub fn now(&self) -> (u64, u64) {
        let connects = self.connects.load(Ordering::Relaxed);
        let running = self.running.load(Ordering::Relaxed);
        (running, connects.saturating_sub(running))
    }
}

/// One count of [`Logins`], held for as long as the guard lives: a connect
/// that returns, fails or is dropped half-way (bb8's task aborted) all give
/// it back.
struct Counted<'a>(&'a AtomicU64);

impl<'a> Counted<'a> {
    fn enter(count: &'a AtomicU64) -> Counted<'a> {
        count.fetch_add(1, Ordering::Relaxed);
        Counted(count)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Opens, checks and discards connections for bb8.
pub struct SqlConnectionManager {
    config: tiberius::Config,
    identity: Option<Arc<TokenSource>>,
    connect_timeout: Duration,
    /// The query timeout: a login unanswered this long when a served
    /// connection's silence raises a suspicion settles it dead
    /// (`silence::login_settles`).
    query_timeout: Duration,
    last_error: Arc<Mutex<Option<String>>>,
    /// Turns to log in ([`LOGINS_AT_ONCE`]).
    turns: tokio::sync::Semaphore,
    logins: Arc<Logins>,
    silences: Arc<Silences>,
}

impl SqlConnectionManager {
    /// `config` is the first server and its settings (with the SQL login, if
    /// any); `identity` supplies an Entra ID access token per login instead.
    pub fn new(
        config: tiberius::Config,
        identity: Option<Arc<TokenSource>>,
        connect_timeout: Duration,
        query_timeout: Duration,
    ) -> SqlConnectionManager {
        SqlConnectionManager {
            config,
            identity,
            connect_timeout,
            query_timeout,
            last_error: Arc::new(Mutex::new(None)),
            turns: tokio::sync::Semaphore::new(LOGINS_AT_ONCE),
            logins: Arc::new(Logins::default()),
            silences: Arc::new(Silences::default()),
        }
    }

    /// The silences seen, shared with the store (the manager itself moves
    /// into the pool).
    pub fn silences(&self) -> Arc<Silences> {
        Arc::clone(&self.silences)
    }

    /// The logins in flight, for the store's load (the manager itself moves
    /// into the pool).
    pub fn logins(&self) -> Arc<Logins> {
        Arc::clone(&self.logins)
    }

    /// The most recent connect failure, to explain a pool timeout (bb8 itself
    /// only reports that it timed out).
    pub fn last_error(&self) -> Arc<Mutex<Option<String>>> {
        Arc::clone(&self.last_error)
    }

    async fn open(&self) -> Result<Client, ConnectError> {
        // Wait for a turn (never closed, so this cannot fail); the budget
        // starts with the turn.
        let _turn = self.turns.acquire().await;
        let _running = Counted::enter(&self.logins.running);
        let budget = login_budget(self.connect_timeout);
        let mut config = self.config.clone();
        if let Some(identity) = &self.identity {
            let token = identity
                .token()
                .await
                .map_err(|e| ConnectError::Token(e.to_string()))?;
            config.authentication(tiberius::AuthMethod::aad_token(token));
        }
        // From here the login waits on the server (a token may take long
        // to come, and says nothing about the server's path).
        let started = Instant::now();
        // The driver panics when the server cannot encrypt but the string
        // says Encrypt=True; a task turns that into an error, not a crash.
        let task = tokio::spawn(open_following_redirect(config));
        let abort = task.abort_handle();
        // When the server last answered this login (the login itself, then
        // each statement of its session setup): a login that hears from it
        // is slow, not silent.
        let last_heard = Mutex::new(started);
        let heard = || *last_heard.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        let login = async {
            match tokio::time::timeout(budget, task).await {
            Err(_) => {
                abort.abort();
                Err(ConnectError::Timeout(budget))
            }
            Ok(Err(join)) => Err(ConnectError::Sql(tiberius::error::Error::Protocol(
                format!(
                    "connecting failed inside the driver ({}); check Encrypt= against what the server supports",
                    if join.is_panic() { "panic" } else { "cancelled" }
                )
                .into(),
            ))),
            Ok(Ok(result)) => {
                let mut client = result.map_err(ConnectError::Sql)?;
                heard();
                let setup = async {
                    // The epoch's raise is no best effort: a connection
                    // that cannot raise it numbers nothing (`sql::RAISE_EPOCH`).
                    for statement in [
                        sql::SESSION_COUNT_ROWS,
                        sql::SESSION_XACT_ABORT,
                        sql::RAISE_EPOCH,
                    ] {
                        client.simple_query(statement).await?.into_results().await?;
                        heard();
                    }
                    // Best effort: before `migrate` has made the procedure
                    // (the first connection of a new database) this fails,
                    // and the connection is as good as before.
                    let warmed = async {
                        client
                            .simple_query(sql::WARM_EXECUTE)
                            .await?
                            .into_results()
                            .await
                    };
                    if let Err(e) = warmed.await {
                        log::debug!("new SQL Server connection: the execution procedure not warmed ({e})");
                    }
                    Ok::<_, tiberius::error::Error>(())
                };
                match tokio::time::timeout(budget, setup).await {
                    Ok(Ok(())) => Ok(client),
                    Ok(Err(e)) => Err(ConnectError::Sql(e)),
                    Err(_) => Err(ConnectError::Timeout(budget)),
                }
            }
        }
        };
        // A login whose connection was open when a silent drop was found
        // (by a check, or by this login: unanswered for a query timeout,
        // every turn taken, no idle connection left to check) is on the
        // dead path too: it would hold its turn for the whole budget, and
        // with every turn so held no login could replace the dead
        // connections. It is abandoned, and the next attempt opens a new
        // connection.
        tokio::select! {
            opened = login => opened,
            () = self.silences.found_dead_since(
                started,
                self.query_timeout,
                || {
                    let quiet = *last_heard.lock().unwrap_or_else(|p| p.into_inner());
                    (quiet, self.turns.available_permits() == 0)
                },
            ) => {
                abort.abort();
                Err(ConnectError::Sql(tiberius::error::Error::Protocol(
                    "login abandoned: its network path was found dead".into(),
                )))
            }
        }
    }
}

/// TCP connect and log in; on a redirect, once more at the given address.
pub async fn open_following_redirect(
    mut config: tiberius::Config,
) -> Result<Client, tiberius::error::Error> {
    match open_once(config.clone()).await {
        Err(tiberius::error::Error::Routing { host, port }) => {
            log::info!("SQL Server redirected the connection to {host}:{port}; reconnecting there");
            config.host(&host);
            config.port(port);
            match open_once(config).await {
                Err(tiberius::error::Error::Routing { host, port }) => {
                    Err(tiberius::error::Error::Protocol(
                        format!("redirected twice (second time to {host}:{port})").into(),
                    ))
                }
                other => other,
            }
        }
        other => other,
    }
}

async fn open_once(config: tiberius::Config) -> Result<Client, tiberius::error::Error> {
    let tcp = TcpStream::connect(config.get_addr()).await?;
    tcp.set_nodelay(true)?;
    // tokio sets keep-alive on or off only; socket2 sets its timings.
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_TIME)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_RETRIES);
    let socket = socket2::SockRef::from(&tcp);
    socket.set_tcp_keepalive(&keepalive)?;
    #[cfg(target_os = "linux")]
    socket.set_tcp_user_timeout(Some(UNACKNOWLEDGED_LIMIT))?;
    tiberius::Client::connect(config, tcp.compat_write()).await
}

impl bb8::ManageConnection for SqlConnectionManager {
    type Connection = SqlConnection;
    type Error = ConnectError;

    async fn connect(&self) -> Result<SqlConnection, ConnectError> {
        // bb8's own retry (`retry_connection`, off in the store) doubles its
        // pause up to half the connect timeout, so a server back from an
        // outage waited seconds for the next attempt; this one keeps trying
        // at short, bounded pauses until the connect timeout has passed.
        let _in_flight = Counted::enter(&self.logins.connects);
        let started = Instant::now();
        let mut failures = 0;
        loop {
            match self.open().await {
                Ok(client) => {
                    return Ok(SqlConnection {
                        client,
                        broken: false,
                        last_used: Instant::now(),
                        served: false,
                        opened: Instant::now(),
                    })
                }
                Err(e) => {
                    log::warn!("cannot connect to SQL Server: {e}");
                    *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(e.to_string());
                    let pause = reconnect_pause(failures);
                    failures += 1;
                    if started.elapsed() + pause >= self.connect_timeout {
                        return Err(e);
                    }
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    async fn is_valid(&self, conn: &mut SqlConnection) -> Result<(), ConnectError> {
        if conn.broken {
            return Err(ConnectError::Sql(tiberius::error::Error::Protocol(
                "connection marked broken".into(),
            )));
        }
        // A suspicion of a dead path decides first (a connection idle
        // since before it is discarded, or checked now), then its idle
        // time (`silence::on_checkout`).
        let decision = silence::on_checkout(
            conn.last_used,
            Instant::now(),
            CHECK_AFTER_IDLE,
            self.silences.latest(),
        );
        match decision {
            Checkout::Drop => {
                return Err(ConnectError::Sql(tiberius::error::Error::Protocol(
                    "idle on a network path since found dead".into(),
                )))
            }
            Checkout::Keep => return Ok(()),
            Checkout::Check | Checkout::Settle => {}
        }
        let last_used = conn.last_used;
        let settle = |answered: bool| {
            if decision == Checkout::Settle {
                self.silences.settle(last_used, answered);
            }
        };
        conn.broken = true;
        let check = async {
            let row = conn
                .client
                .simple_query(sql::OPEN_TRANSACTIONS)
                .await?
                .into_row()
                .await?;
            Ok::<_, tiberius::error::Error>(row.and_then(|r| r.get::<i32, _>(0)))
        };
        match tokio::time::timeout(CHECK_TIMEOUT, check).await {
            Ok(Ok(Some(0))) => {
                settle(true);
                conn.broken = false;
                conn.last_used = Instant::now();
                Ok(())
            }
            Ok(Ok(open)) => {
                settle(true);
                Err(ConnectError::Sql(tiberius::error::Error::Protocol(
                    format!("pooled connection has a transaction open (@@TRANCOUNT {open:?})")
                        .into(),
                )))
            }
            // An error is an answer of sorts (a cut, a killed session): not
            // a silence, and no verdict on the path.
            Ok(Err(e)) => Err(ConnectError::Sql(e)),
            // Silent: for the suspicion it was checked for, the path is
            // dead; otherwise it raises one, which the next connection
            // idle beside it settles (bb8 checks it next, in this checkout).
            Err(_) => {
                if decision == Checkout::Settle {
                    settle(false);
                } else {
                    self.silences.suspect(CHECK_TIMEOUT);
                }
                Err(ConnectError::Silent(CHECK_TIMEOUT))
            }
        }
    }

    fn has_broken(&self, conn: &mut SqlConnection) -> bool {
        conn.broken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_login_is_retried_within_a_second_whatever_the_run_of_failures() {
        let pauses: Vec<u128> = (0..6).map(|n| reconnect_pause(n).as_millis()).collect();
        assert_eq!(pauses, [250, 500, 1000, 1000, 1000, 1000]);
        assert_eq!(reconnect_pause(u32::MAX), Duration::from_secs(1));
    }

    /// A server that accepts TCP (the kernel's backlog) and never answers
    /// the PRELOGIN, so every login hangs until its budget (30 s), and a
    /// manager logging in to it with this query timeout.
    fn silent_server(
        query_timeout: Duration,
    ) -> (std::net::TcpListener, Arc<SqlConnectionManager>) {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut config = tiberius::Config::new();
        config.host("127.0.0.1");
        config.port(silent.local_addr().unwrap().port());
        config.authentication(tiberius::AuthMethod::sql_server("u", "pw"));
        config.encryption(tiberius::EncryptionLevel::NotSupported);
        let manager =
            SqlConnectionManager::new(config, None, Duration::from_secs(30), query_timeout);
        (silent, Arc::new(manager))
    }

    /// `Logins` counts every connect bb8 is running: those holding a login
    /// turn as running, the rest as waiting; a connect dropped half-way
    /// (its task aborted) gives its counts back.
    #[tokio::test]
    async fn logins_in_flight_are_counted_running_or_waiting() {
        let (_silent, manager) = silent_server(Duration::from_secs(8));
        let logins = manager.logins();
        assert_eq!(logins.now(), (0, 0));
        let connects: Vec<_> = (0..LOGINS_AT_ONCE + 1)
            .map(|_| {
                let m = Arc::clone(&manager);
                tokio::spawn(async move { bb8::ManageConnection::connect(m.as_ref()).await })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        while logins.now() != (LOGINS_AT_ONCE as u64, 1) {
            assert!(Instant::now() < deadline, "{:?}", logins.now());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for c in connects {
            c.abort();
            assert!(matches!(c.await, Err(e) if e.is_cancelled()));
        }
        assert_eq!(logins.now(), (0, 0));
    }

    /// With every connection busy nothing idle is left to settle a
    /// suspicion: once every login turn is taken, a login caught by the
    /// silent drop settles it itself, when unanswered for a query timeout
    /// as it is raised and the suspicion has stayed open a check's time,
    /// and the logins on the path are abandoned (their turns given back),
    /// not held for their 30 s budget. With a turn free beside it, a login
    /// is left to run (the pool still logs in) and the suspicion stays open.
    #[tokio::test]
    async fn a_login_unanswered_for_a_query_timeout_with_no_turn_free_settles_a_suspicion_dead() {
        let query_timeout = Duration::from_millis(300);
        let (_silent, manager) = silent_server(query_timeout);
        let (logins, silences, last_error) =
            (manager.logins(), manager.silences(), manager.last_error());
        let connect = || {
            let m = Arc::clone(&manager);
            tokio::spawn(async move { bb8::ManageConnection::connect(m.as_ref()).await })
        };
        let running = |n: u64| {
            let logins = Arc::clone(&logins);
            async move {
                let deadline = Instant::now() + Duration::from_secs(10);
                while logins.now() != (n, 0) {
                    assert!(Instant::now() < deadline, "{:?}", logins.now());
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        };
        let abandoned = || {
            last_error
                .lock()
                .unwrap()
                .as_deref()
                .is_some_and(|e| e.contains("login abandoned"))
        };

        let first = connect();
        running(1).await;
        // The rule is about time: the login unanswered for a query timeout,
        // the suspicion open for a check's time.
        tokio::time::sleep(query_timeout).await;
        silences.suspect(query_timeout);
        tokio::time::sleep(silence::CHECK_TIME).await;
        // One thread: the login's task runs its check within these yields.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            silences.latest().map(|s| s.verdict),
            Some(silence::Verdict::Open),
            "a turn was free: the login is left to run"
        );
        assert!(!abandoned());

        let second = connect();
        running(2).await;
        let raised = Instant::now();
        silences.suspect(query_timeout);
        while !abandoned() {
            assert!(
                raised.elapsed() < silence::CHECK_TIME + Duration::from_secs(5),
                "the login still held its turn: {:?}",
                last_error.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            raised.elapsed() >= silence::CHECK_TIME,
            "settled before an idle connection's check could have"
        );
        assert_eq!(
            silences.latest().map(|s| s.verdict),
            Some(silence::Verdict::Dead)
        );
        first.abort();
        second.abort();
    }
}
