//! `SqliteStore`: the embedded default store, one SQLite file.
//!
//! WAL with `synchronous=FULL` so a commit is durable before we answer the
//! host; a busy timeout so several handler processes can share the file;
//! every write in an `IMMEDIATE` transaction so two writers never deadlock on a
//! lock upgrade. rusqlite is blocking, so calls run on one writer thread that
//! owns the connection.
//!
//! Group commit: the writer takes every call that is waiting (up to
//! [`MAX_GROUP`]) and runs them in one `IMMEDIATE` transaction, each inside its
//! own savepoint (a failed call is rolled back alone, exactly as if it had run
//! by itself), then commits once. No call is answered before that commit is
//! durable; if the commit fails, every call of the group gets the error. So
//! each call keeps its own all-or-nothing effect and its durability, but under
//! load one fsync covers many calls instead of one each. Calls run in arrival
//! order, one at a time, as they did behind the old mutex.
//!
//! Back-pressure instead of collapse: the queue holds at most
//! [`MAX_QUEUED`] calls, and a call that finds it full is answered `retry` at
//! once (Event Grid redelivers later) instead of waiting behind work it
//! cannot outlast; and a call whose caller has stopped waiting (its deadline
//! passed, so it was already answered `retry`) is skipped, not run. After a
//! burst beyond the writer's capacity the queue holds no abandoned work, so
//! throughput recovers at once.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension};
use rust_decimal::Decimal;

mod outbox;
mod schema;

use super::{
    Announcement, Claim, Deferral, Execution, Listing, OrderRecord, OrderStore, OutboxCounts,
    RejectedRecord, Rejection, StoreError, StoreLoad,
};
use crate::order::{Order, OrderStatus};
use crate::position::Position;

const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

/// At most this many calls share one commit.
pub const MAX_GROUP: usize = 64;

/// At most this many calls wait for the writer; more are answered `retry` at
/// once. Sixteen full groups: at a few milliseconds per durable commit, well
/// inside any caller's deadline.
pub const MAX_QUEUED: usize = 1024;

/// One call for the writer thread.
trait Call: Send {
    /// The caller stopped waiting: skip the call.
    fn abandoned(&self) -> bool;
    /// Whether its effect must be on disk before it is answered (see
    /// [`Durability`]).
    fn durability(&self) -> Durability;
    /// Given the connection, run inside the call's own savepoint and hand
    /// back its failure, if any (then its savepoint is rolled back); given
    /// `None`, do not run. Either way hand back how to answer once the
    /// group's commit (or failure) is known.
    fn run(self: Box<Self>, conn: Option<&mut Connection>) -> (Option<StoreError>, Reply);
}

type Job = Box<dyn Call>;
type Reply = Box<dyn FnOnce(Option<&StoreError>) + Send>;

/// Whether a call's commit waits for the disk.
///
/// The outbox's bookkeeping (a claim's lease, a row marked sent, deferred,
/// purged) may be lost in a power cut without harm: a lost claim or mark
/// means a row sent again (announcements are at least once, consumers
/// deduplicate by message id), a lost deferral a retry sooner, a lost
/// purge a delete done again. Such a group commits with `synchronous =
/// NORMAL` (in WAL mode: atomic, durable against a crash of the process,
/// made durable on disk by the next `FULL` commit, which syncs the whole
/// log) and does not make the orders behind it wait for two more fsyncs a
/// dispatch round. Everything else is `Full`; a group holding any `Full`
/// call commits `FULL`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Durability {
    Full,
    Relaxed,
}

/// A call and where its answer goes.
struct Pending<T, F> {
    tx: tokio::sync::oneshot::Sender<Result<T, StoreError>>,
    f: F,
    durability: Durability,
}

impl<T, F> Call for Pending<T, F>
where
    T: Send + 'static,
    F: FnOnce(&mut Connection) -> Result<T, rusqlite::Error> + Send + 'static,
{
    fn abandoned(&self) -> bool {
        self.tx.is_closed()
    }

    fn durability(&self) -> Durability {
        self.durability
    }

    fn run(self: Box<Self>, conn: Option<&mut Connection>) -> (Option<StoreError>, Reply) {
        let Pending { tx, f, .. } = *self;
        let Some(conn) = conn else {
            let reply: Reply = Box::new(move |e| {
                let e = e
                    .cloned()
                    .unwrap_or_else(|| StoreError::Transient("store call not run".into()));
                let _ = tx.send(Err(e));
            });
            return (None, reply);
        };
        let result = match catch_unwind(AssertUnwindSafe(|| f(conn))) {
            Ok(r) => r.map_err(classify),
            Err(_) => Err(StoreError::Transient(
                "store task failed: it panicked".into(),
            )),
        };
        let failed = result.as_ref().err().cloned();
        let reply: Reply = Box::new(move |commit_failed| {
            let _ = tx.send(match commit_failed {
                Some(e) => Err(e.clone()),
                None => result,
            });
        });
        (failed, reply)
    }
}

/// How the writer has shed load (for tests, figures and operators).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pressure {
    /// Calls answered `retry` at once because the queue was full.
    pub refused: u64,
    /// Calls skipped because their caller had stopped waiting.
    pub skipped: u64,
    /// Commits of groups that ran at least one call (tried: a failed commit
    /// counts too): calls ÷ commits is about how many calls one fsync
    /// served.
    pub commits: u64,
    /// The most calls the writer took from its queue for one transaction
    /// (at most [`MAX_GROUP`]; a call found abandoned inside it is skipped).
    pub largest_group: u64,
}

#[derive(Default)]
struct PressureCounters {
    refused: AtomicU64,
    skipped: AtomicU64,
    commits: AtomicU64,
    largest_group: AtomicU64,
}

/// SQLite-backed store.
pub struct SqliteStore {
    jobs: mpsc::SyncSender<Job>,
    pressure: Arc<PressureCounters>,
    /// Where the file lives, for [`super::bound_identity`].
    place: [String; 3],
    /// The file and the busy timeout, for [`Self::read`]'s connections.
    path: std::path::PathBuf,
    busy_timeout: Duration,
}

/// What a copy of the file cannot share with the original: its full path,
/// its device and inode (another file, even at the same path after a move),
/// and the machine (its `/etc/machine-id`, else its host name: the same
/// path on another machine is another database).
fn place_of(path: &Path) -> [String; 3] {
    let full = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let file = std::fs::metadata(&full).map_or_else(
        |_| String::new(),
        |m| {
            #[cfg(unix)]
            {
                use std::os::unix::fs::MetadataExt;
                format!("{}:{}", m.dev(), m.ino())
            }
            #[cfg(not(unix))]
            {
                let _ = m;
                String::new()
            }
        },
    );
    let machine = [
        "/etc/machine-id",
        "/var/lib/dbus/machine-id",
        "/proc/sys/kernel/hostname",
    ]
    .iter()
    .find_map(|f| {
        std::fs::read_to_string(f)
            .ok()
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
    })
    .unwrap_or_default();
    [full.display().to_string(), file, machine]
}

impl SqliteStore {
    /// Open (creating if needed) the database file at `path`. `busy_timeout`
    /// bounds how long a write waits for another process's lock before the
    /// call fails as transient.
    pub fn open(path: &Path, busy_timeout: Duration) -> Result<SqliteStore, StoreError> {
        Self::open_with(path, busy_timeout, OpenFlags::default())
    }

    /// [`Self::open`] for a file that must exist already: a missing one is a
    /// permanent error and nothing is created (a volume not mounted yet
    /// looks like an empty directory; a new database there would hold none
    /// of the executed orders).
    pub fn open_existing(path: &Path, busy_timeout: Duration) -> Result<SqliteStore, StoreError> {
        Self::open_with(
            path,
            busy_timeout,
            OpenFlags::default().difference(OpenFlags::SQLITE_OPEN_CREATE),
        )
    }

    fn open_with(
        path: &Path,
        busy_timeout: Duration,
        flags: OpenFlags,
    ) -> Result<SqliteStore, StoreError> {
        let conn = Connection::open_with_flags(path, flags).map_err(|e| {
            if !flags.contains(OpenFlags::SQLITE_OPEN_CREATE) && !path.exists() {
                return StoreError::Permanent(format!(
                    "no SQLite database at {}: the file does not exist",
                    path.display()
                ));
            }
            // Opening reads the file's header: a disk briefly away (a
            // network volume's hiccup) or a lock is worth waiting out.
            let message = format!("cannot open SQLite database {}: {e}", path.display());
            match classify(e) {
                StoreError::Transient(_) => StoreError::Transient(message),
                _ => StoreError::Permanent(message),
            }
        })?;
        conn.busy_timeout(busy_timeout).map_err(classify)?;
        // Set only when not WAL yet: asking to change the journal mode
        // takes a lock and, under another process's write lock, fails at
        // once ("database is locked") without waiting for the busy timeout:
        // a handler starting during another's long write must not exit.
        let mode: String = conn
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .map_err(classify)?;
        if !mode.eq_ignore_ascii_case("wal") {
            conn.pragma_update(None, "journal_mode", "WAL")
                .map_err(classify)?;
        }
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(classify)?;
        let place = place_of(path);
        let (jobs, queue) = mpsc::sync_channel::<Job>(MAX_QUEUED);
        let pressure = Arc::new(PressureCounters::default());
        let counters = Arc::clone(&pressure);
        std::thread::Builder::new()
            .name("sqlite-writer".into())
            .spawn(move || writer(conn, queue, &counters))
            .map_err(|e| StoreError::Permanent(format!("cannot start the SQLite writer: {e}")))?;
        Ok(SqliteStore {
            jobs,
            pressure,
            place,
            path: path.to_path_buf(),
            busy_timeout,
        })
    }

    /// Calls refused (queue full) and skipped (caller gone) so far.
    pub fn pressure(&self) -> Pressure {
        Pressure {
            refused: self.pressure.refused.load(Ordering::Relaxed),
            skipped: self.pressure.skipped.load(Ordering::Relaxed),
            commits: self.pressure.commits.load(Ordering::Relaxed),
            largest_group: self.pressure.largest_group.load(Ordering::Relaxed),
        }
    }

    /// Run `f` with the connection on the writer thread, atomically (in its
    /// own savepoint), and answer once its group's commit is durable.
    async fn with<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, rusqlite::Error> + Send + 'static,
    {
        self.call(f, Durability::Full).await
    }

    /// [`Self::with`] for the outbox's bookkeeping: answered once committed,
    /// without waiting for the disk ([`Durability::Relaxed`]).
    async fn with_relaxed<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, rusqlite::Error> + Send + 'static,
    {
        self.call(f, Durability::Relaxed).await
    }

    /// Run the read-only `f` on a connection of its own, off the writer:
    /// an operator's listing that scans the outbox (`status`'s counts, one
    /// order's announcement) must not hold the write lock that every
    /// process sharing the file waits on. In WAL mode a read takes no lock
    /// a writer waits for; it sees every commit answered before it began.
    async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, rusqlite::Error> + Send + 'static,
    {
        let (path, busy_timeout) = (self.path.clone(), self.busy_timeout);
        tokio::task::spawn_blocking(move || {
            let conn = Connection::open_with_flags(
                &path,
                OpenFlags::default().difference(OpenFlags::SQLITE_OPEN_CREATE),
            )?;
            conn.busy_timeout(busy_timeout)?;
            f(&conn)
        })
        .await
        .map_err(|e| StoreError::Transient(format!("store task failed: {e}")))?
        .map_err(classify)
    }

    async fn call<T, F>(&self, f: F, durability: Durability) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, rusqlite::Error> + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel::<Result<T, StoreError>>();
        match self.jobs.try_send(Box::new(Pending { tx, f, durability })) {
            Ok(()) => {}
            Err(mpsc::TrySendError::Full(_)) => {
                self.pressure.refused.fetch_add(1, Ordering::Relaxed);
                return Err(StoreError::Transient(format!(
                    "the SQLite writer has {MAX_QUEUED} calls waiting, more than it can commit in \
                     time; try again later"
                )));
            }
            Err(mpsc::TrySendError::Disconnected(_)) => {
                return Err(StoreError::Transient(
                    "store task failed: the SQLite writer stopped".into(),
                ))
            }
        }
        rx.await.map_err(|_| {
            StoreError::Transient("store task failed: no answer from the SQLite writer".into())
        })?
    }
}

/// The writer thread: groups waiting calls into one transaction each.
fn writer(mut conn: Connection, queue: mpsc::Receiver<Job>, pressure: &PressureCounters) {
    // The connection is opened `FULL` (`SqliteStore::open`).
    let mut synchronous = Durability::Full;
    while let Ok(first) = queue.recv() {
        let mut group = Vec::with_capacity(MAX_GROUP);
        let mut next = Some(first);
        while let Some(job) = next.take() {
            if job.abandoned() {
                // Already answered `retry` by its caller's deadline.
                pressure.skipped.fetch_add(1, Ordering::Relaxed);
            } else {
                group.push(job);
            }
            if group.len() < MAX_GROUP {
                next = queue.try_recv().ok();
            }
        }
        if !group.is_empty() {
            pressure
                .largest_group
                .fetch_max(group.len() as u64, Ordering::Relaxed);
            run_group(&mut conn, group, pressure, &mut synchronous);
        }
    }
}

fn run_group(
    conn: &mut Connection,
    group: Vec<Job>,
    pressure: &PressureCounters,
    synchronous: &mut Durability,
) {
    let fail_all = |replies: Vec<Reply>, e: &StoreError| {
        for r in replies {
            r(Some(e));
        }
    };
    let wanted = group_durability(group.iter().map(|job| job.durability()));
    let switched = if wanted == *synchronous {
        Ok(())
    } else {
        conn.execute_batch(match wanted {
            Durability::Full => "PRAGMA synchronous = FULL",
            Durability::Relaxed => "PRAGMA synchronous = NORMAL",
        })
        .map(|()| *synchronous = wanted)
    };
    if let Err(e) = switched.and_then(|()| conn.execute_batch("BEGIN IMMEDIATE")) {
        let replies = group.into_iter().map(|job| job.run(None).1).collect();
        fail_all(replies, &classify(e));
        return;
    }
    let mut replies = Vec::with_capacity(group.len());
    let mut jobs = group.into_iter();
    while let Some(job) = jobs.next() {
        // Asked again now that the group holds the write lock (taking it may
        // have waited out another process): a caller that stopped waiting
        // meanwhile was answered `retry`, and its redelivery will do the
        // work. Best effort (a caller may give up just after this check):
        // correctness never depends on it, a late effect is harmless.
        if job.abandoned() {
            pressure.skipped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let step = conn
            .execute_batch("SAVEPOINT job")
            .map_err(classify)
            .and_then(|()| {
                let (failed, reply) = job.run(Some(&mut *conn));
                replies.push(reply);
                if conn.is_autocommit() {
                    // SQLite ended the transaction itself: an I/O error (a
                    // disk gone away) or a full disk rolls back the whole
                    // transaction, not the statement, and every savepoint with
                    // it. The group's calls share its fate, and its cause.
                    return Err(failed.unwrap_or_else(|| {
                        StoreError::Transient("SQLite rolled the transaction back".into())
                    }));
                }
                conn.execute_batch(if failed.is_none() {
                    "RELEASE job"
                } else {
                    "ROLLBACK TO job; RELEASE job"
                })
                .map_err(classify)
            });
        if let Err(e) = step {
            // The transaction is in an unknown state: abandon the whole group.
            let _ = conn.execute_batch("ROLLBACK");
            replies.extend(jobs.map(|job| job.run(None).1));
            fail_all(replies, &e);
            return;
        }
    }
    if !replies.is_empty() {
        pressure.commits.fetch_add(1, Ordering::Relaxed);
    }
    match conn.execute_batch("COMMIT") {
        Ok(()) => {
            for r in replies {
                r(None);
            }
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            fail_all(replies, &classify(e));
        }
    }
}

/// A group commits `Relaxed` only when every call of it may. Pure.
fn group_durability(calls: impl IntoIterator<Item = Durability>) -> Durability {
    if calls.into_iter().all(|d| d == Durability::Relaxed) {
        Durability::Relaxed
    } else {
        Durability::Full
    }
}

/// Busy and locked are worth a retry; I/O trouble too (disk briefly away);
/// everything else needs a fix.
fn classify(e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked | ErrorCode::SystemIoFailure) => {
            StoreError::Transient(e.to_string())
        }
        _ => StoreError::Permanent(e.to_string()),
    }
}

fn decimal(text: &str) -> Result<Decimal, rusqlite::Error> {
    Decimal::from_str(text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e))
    })
}

fn position(text: &str) -> Result<Position, rusqlite::Error> {
    Position::from_str(text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e))
    })
}

/// Keep a rejected event once: a redelivery counts (`Deliveries`).
fn insert_rejection(conn: &Connection, r: &Rejection) -> Result<(), rusqlite::Error> {
    conn.prepare_cached(&format!(
        "INSERT INTO RejectedEvents (EventHash, Kind, OrderId, EventId, Reason, Fingerprint,
                                     ExistingFingerprint, RawEvent, FirstSeenAt, LastSeenAt)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, {NOW}, {NOW})
         ON CONFLICT (EventHash)
         DO UPDATE SET Deliveries = Deliveries + 1, LastSeenAt = excluded.LastSeenAt"
    ))?
    .execute(params![
        r.event_hash(),
        r.kind.as_str(),
        r.order_id,
        r.event_id,
        r.reason,
        r.fingerprint,
        r.existing_fingerprint,
        r.raw_event,
    ])?;
    Ok(())
}

/// An error of ours, with its message, as the writer's calls return them.
fn protocol_error(message: String) -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
        Some(message),
    )
}

fn status(text: &str) -> Result<OrderStatus, rusqlite::Error> {
    OrderStatus::from_str(text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, e.into())
    })
}

fn read_order(conn: &Connection, order_id: &str) -> Result<Option<OrderRecord>, rusqlite::Error> {
    conn.query_row(
        "SELECT OrderId, Fingerprint, AccountId, Side, Symbol, Quantity, LimitPrice, Currency,
                Status, Attempts, ReceivedAt, ExecutedAt, PlacedAt
           FROM Orders WHERE OrderId = ?1",
        [order_id],
        |r| {
            Ok(OrderRecord {
                order_id: r.get(0)?,
                fingerprint: r.get(1)?,
                account_id: r.get(2)?,
                side: r.get(3)?,
                symbol: r.get(4)?,
                quantity: decimal(&r.get::<_, String>(5)?)?,
                limit_price: r
                    .get::<_, Option<String>>(6)?
                    .as_deref()
                    .map(decimal)
                    .transpose()?,
                currency: r.get(7)?,
                status: status(&r.get::<_, String>(8)?)?,
                attempts: r.get(9)?,
                received_at: r.get(10)?,
                executed_at: r.get(11)?,
                placed_at: r.get(12)?,
            })
        },
    )
    .optional()
}

#[async_trait]
impl OrderStore for SqliteStore {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        self.with(schema::migrate).await
    }

    async fn identity(&self) -> Result<String, StoreError> {
        let stored: String = self
            .with(|conn| conn.query_row("SELECT Id FROM StoreIdentity LIMIT 1", [], |r| r.get(0)))
            .await?;
        let place: Vec<&str> = self.place.iter().map(String::as_str).collect();
        Ok(super::bound_identity(&stored, &place))
    }

    async fn execute(
        &self,
        order: &Order,
        event_id: &str,
        raw_event: &str,
    ) -> Result<Execution, StoreError> {
        let o = order.clone();
        let (event_id, raw_event) = (event_id.to_string(), raw_event.to_string());
        // One call, one savepoint: the insert (or the row found), the
        // position and the status change commit together, in the writer's
        // group commit (one durable commit for the whole group).
        self.with(move |conn| {
            let tx = conn.savepoint()?;
            match read_order(&tx, &o.order_id)? {
                None => {
                    // Cached statements: parsed once per connection, not per call.
                    tx.prepare_cached(&format!(
                        "INSERT INTO Orders (OrderId, Fingerprint, EventId, AccountId, Side, Symbol,
                                             Quantity, LimitPrice, Currency, PlacedAt, Status, ReceivedAt)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 'Received', {NOW})"
                    ))?
                    .execute(params![
                        o.order_id,
                        o.fingerprint(),
                        event_id,
                        o.account_id,
                        o.side.as_str(),
                        o.symbol,
                        o.quantity.to_string(),
                        o.limit_price.map(|p| p.to_string()),
                        o.currency,
                        o.placed_at,
                    ])?;
                }
                Some(existing) if existing.current_fingerprint() != o.fingerprint() => {
                    let conflict =
                        Rejection::conflict(&o, &event_id, &raw_event, &existing.fingerprint);
                    insert_rejection(&tx, &conflict)?;
                    tx.commit()?;
                    return Ok(Execution::Conflict {
                        existing_fingerprint: existing.fingerprint,
                    });
                }
                // A duplicate: nothing written.
                Some(existing) if existing.status.is_terminal() => return Ok(Execution::AlreadyDone),
                Some(_) => {
                    // Left `Received` by an earlier version's worker that died.
                    tx.execute(
                        "UPDATE Orders SET Attempts = Attempts + 1 WHERE OrderId = ?1 AND Status = 'Received'",
                        [&o.order_id],
                    )?;
                }
            }
            // The writer holds the database's write lock (BEGIN IMMEDIATE):
            // the position read here is the one this call changes.
            let current: Option<String> = tx
                .prepare_cached(
                    "SELECT Quantity FROM Positions WHERE AccountId = ?1 AND Symbol = ?2",
                )?
                .query_row(params![o.account_id, o.symbol], |r| r.get(0))
                .optional()?;
            let current = current
                .as_deref()
                .map(position)
                .transpose()?
                .unwrap_or(Position::ZERO);
            let next = match current.apply(o.side, o.quantity) {
                Ok(next) => next,
                Err(overflow) => {
                    let changed = tx
                        .prepare_cached(
                            "UPDATE Orders SET Status = 'Rejected'
                              WHERE OrderId = ?1 AND Status = 'Received'",
                        )?
                        .execute([&o.order_id])?;
                    if changed != 1 {
                        return Err(protocol_error(format!(
                            "order {}: the update to Rejected changed {changed} rows",
                            o.order_id
                        )));
                    }
                    let rejection =
                        Rejection::position_overflow(&o, &event_id, &raw_event, &overflow);
                    insert_rejection(&tx, &rejection)?;
                    tx.commit()?;
                    return Ok(Execution::Rejected(overflow));
                }
            };
            let changed = tx
                .prepare_cached(&format!(
                    "UPDATE Orders SET Status = 'Executed', ExecutedAt = {NOW}
                      WHERE OrderId = ?1 AND Status = 'Received'"
                ))?
                .execute([&o.order_id])?;
            if changed != 1 {
                return Err(protocol_error(format!(
                    "order {}: the update to Executed changed {changed} rows",
                    o.order_id
                )));
            }
            tx.prepare_cached(&format!(
                "INSERT INTO Positions (AccountId, Symbol, Quantity, UpdatedAt)
                 VALUES (?1, ?2, ?3, {NOW})
                 ON CONFLICT (AccountId, Symbol)
                 DO UPDATE SET Quantity = excluded.Quantity, UpdatedAt = excluded.UpdatedAt"
            ))?
            .execute(params![o.account_id, o.symbol, next.to_string()])?;
            // The announcement, in the same commit as the execution.
            outbox::announce(&tx, &o, next)?;
            tx.commit()?;
            Ok(Execution::Executed)
        })
        .await
    }

    async fn reject(&self, rejection: &Rejection) -> Result<(), StoreError> {
        let r = rejection.clone();
        self.with(move |conn| insert_rejection(conn, &r)).await
    }

    async fn order(&self, order_id: &str) -> Result<Option<OrderRecord>, StoreError> {
        let id = order_id.to_string();
        self.with(move |conn| read_order(conn, &id)).await
    }

    async fn position(
        &self,
        account_id: &str,
        symbol: &str,
    ) -> Result<Option<Position>, StoreError> {
        let (a, s) = (account_id.to_string(), symbol.to_string());
        self.with(move |conn| {
            let q: Option<String> = conn
                .query_row(
                    "SELECT Quantity FROM Positions WHERE AccountId = ?1 AND Symbol = ?2",
                    params![a, s],
                    |r| r.get(0),
                )
                .optional()?;
            q.as_deref().map(position).transpose()
        })
        .await
    }

    async fn rejections(&self, order_id: Option<&str>) -> Result<Vec<RejectedRecord>, StoreError> {
        let id = order_id.map(str::to_string);
        self.with(move |conn| {
            let mut stmt = conn.prepare(
                "SELECT Kind, OrderId, Reason, Fingerprint, ExistingFingerprint, RawEvent, Deliveries
                   FROM RejectedEvents WHERE OrderId IS ?1 ORDER BY Id",
            )?;
            let rows = stmt.query_map([id], |r| {
                Ok(RejectedRecord {
                    kind: r.get(0)?,
                    order_id: r.get(1)?,
                    reason: r.get(2)?,
                    fingerprint: r.get(3)?,
                    existing_fingerprint: r.get(4)?,
                    raw_event: r.get(5)?,
                    deliveries: r.get(6)?,
                })
            })?;
            rows.collect()
        })
        .await
    }

    async fn claim_announcements(&self, limit: u32, lease: Duration) -> Result<Claim, StoreError> {
        let token = uuid::Uuid::new_v4().to_string();
        let t = token.clone();
        let rows = self
            .with_relaxed(move |conn| outbox::claim(conn, &t, limit, lease))
            .await?;
        Ok(Claim { token, rows })
    }

    async fn mark_announced(&self, message_ids: &[String]) -> Result<u64, StoreError> {
        let ids = message_ids.to_vec();
        self.with_relaxed(move |conn| outbox::mark(conn, &ids))
            .await
    }

    async fn defer_announcement(&self, token: &str, deferral: &Deferral) -> Result<(), StoreError> {
        let (t, d) = (token.to_string(), deferral.clone());
        self.with_relaxed(move |conn| outbox::defer(conn, &t, &d))
            .await
    }

    async fn purge_announced(&self, retention: Duration, limit: u32) -> Result<u64, StoreError> {
        self.with_relaxed(move |conn| outbox::purge(conn, retention, limit))
            .await
    }

    async fn announcements(
        &self,
        listing: &Listing,
        limit: u32,
    ) -> Result<Vec<Announcement>, StoreError> {
        let listing = listing.clone();
        self.read(move |conn| outbox::list(conn, &listing, limit))
            .await
    }

    async fn outbox_counts(&self) -> Result<OutboxCounts, StoreError> {
        self.read(outbox::counts).await
    }

    async fn retry_announcements(&self, message_id: Option<&str>) -> Result<u64, StoreError> {
        let id = message_id.map(str::to_string);
        self.with(move |conn| outbox::retry(conn, id.as_deref()))
            .await
    }

    fn load(&self) -> StoreLoad {
        let p = self.pressure();
        StoreLoad {
            pool: None,
            writer: Some((p.refused, p.skipped)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_waits_for_the_disk_unless_every_call_may_not() {
        use Durability::{Full, Relaxed};
        assert_eq!(group_durability([Relaxed, Relaxed]), Relaxed);
        assert_eq!(group_durability([Relaxed, Full, Relaxed]), Full);
        assert_eq!(group_durability([Full]), Full);
    }

    /// A disk gone in the middle of a group, an I/O error in one call's own
    /// statement: SQLite rolls the whole transaction back, savepoints and
    /// all, so every call of the group fails, as transient and with the
    /// error that ended it (not "no such savepoint", taken for permanent),
    /// and nothing of the group is kept. The same connection serves again
    /// once the disk is back. The same when it goes just before the
    /// group's commit.
    #[cfg(feature = "failpoints")]
    #[test]
    fn a_disk_gone_mid_group_fails_the_whole_group_as_transient_and_keeps_none_of_it() {
        let dir = tempfile::tempdir().unwrap();
        let away = dir.path().join("disk-away");
        // Not the default VFS: other tests of this process are untouched.
        crate::faults::disk::arm(away.clone(), false).unwrap();
        let mut conn = Connection::open_with_flags_and_vfs(
            dir.path().join("t.db"),
            OpenFlags::default(),
            crate::faults::disk::NAME,
        )
        .unwrap();
        // A table bigger than the page cache: reading it goes to the file.
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             CREATE TABLE t (x INTEGER);
             CREATE TABLE big (b BLOB);
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200)
             INSERT INTO big SELECT zeroblob(4000) FROM n;
             PRAGMA cache_size = 10;",
        )
        .unwrap();
        type Answer = tokio::sync::oneshot::Receiver<Result<(), StoreError>>;
        fn job<F>(f: F) -> (Job, Answer)
        where
            F: FnOnce(&mut Connection) -> Result<(), rusqlite::Error> + Send + 'static,
        {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let durability = Durability::Full;
            (Box::new(Pending { tx, f, durability }), rx)
        }
        let insert = |x: i64| {
            job(move |conn: &mut Connection| {
                conn.execute("INSERT INTO t VALUES (?1)", [x]).map(|_| ())
            })
        };
        let gone = away.clone();
        let (first, second, third) = (
            insert(1),
            job(move |conn: &mut Connection| {
                std::fs::write(&gone, b"").unwrap();
                conn.query_row("SELECT sum(length(b)) FROM big", [], |r| r.get::<_, i64>(0))
                    .map(|_| ())
            }),
            insert(3),
        );
        let (pressure, mut synchronous) = (PressureCounters::default(), Durability::Full);
        run_group(
            &mut conn,
            vec![first.0, second.0, third.0],
            &pressure,
            &mut synchronous,
        );
        for (name, mut answer) in [("first", first.1), ("second", second.1), ("third", third.1)] {
            match answer.try_recv() {
                Ok(Err(StoreError::Transient(e))) if e.contains("disk I/O error") => {}
                other => panic!(
                    "the {name} call of the group: want a transient I/O error, got {other:?}"
                ),
            }
        }

        std::fs::remove_file(&away).unwrap();
        let mut after = insert(4);
        run_group(&mut conn, vec![after.0], &pressure, &mut synchronous);
        assert_eq!(after.1.try_recv().unwrap(), Ok(()));

        // Gone at the commit: its write or sync of the WAL fails, the group is
        // rolled back, every call answered the commit's I/O error.
        let gone = away.clone();
        let (fifth, sixth) = (
            insert(5),
            job(move |conn: &mut Connection| {
                conn.execute("INSERT INTO t VALUES (6)", [])?;
                std::fs::write(&gone, b"").unwrap();
                Ok(())
            }),
        );
        run_group(
            &mut conn,
            vec![fifth.0, sixth.0],
            &pressure,
            &mut synchronous,
        );
        for (name, mut answer) in [("fifth", fifth.1), ("sixth", sixth.1)] {
            match answer.try_recv() {
                Ok(Err(StoreError::Transient(e))) if e.contains("disk I/O error") => {}
                other => panic!(
                    "the {name} call, its commit failed: want a transient I/O error, got {other:?}"
                ),
            }
        }
        std::fs::remove_file(&away).unwrap();
        let kept: Vec<i64> = conn
            .prepare("SELECT x FROM t")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(kept, vec![4], "nothing of the failed group is kept");
    }

    /// A relaxed call commits `NORMAL`; the next call that must be durable
    /// (after a bookkeeping call too) finds the connection `FULL` again.
    /// Which calls are relaxed is counted in fsyncs (docs/benchmarks.md).
    #[tokio::test]
    async fn a_relaxed_call_commits_normal_and_the_next_durable_one_full() {
        let dir = tempfile::tempdir().unwrap();
        let store =
            SqliteStore::open(&dir.path().join("orders.db"), Duration::from_secs(5)).expect("open");
        store.migrate().await.expect("migrate");
        let synchronous = |conn: &mut Connection| {
            conn.pragma_query_value(None, "synchronous", |r| r.get::<_, i64>(0))
        };
        // 2 is FULL, 1 is NORMAL.
        assert_eq!(store.with(synchronous).await.unwrap(), 2);
        assert_eq!(store.with_relaxed(synchronous).await.unwrap(), 1);
        assert_eq!(store.mark_announced(&[]).await.unwrap(), 0);
        assert_eq!(store.with(synchronous).await.unwrap(), 2);
    }

    /// `status`'s outbox counts and one order's announcement (a scan of
    /// the kept rows) are read off the writer: they answer while another
    /// process holds the file's write lock, where a call on the writer
    /// would wait for it and fail at the busy timeout. And they see what
    /// the writer committed.
    #[tokio::test]
    async fn the_outbox_listings_answer_under_another_process_write_lock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("orders.db");
        let store = SqliteStore::open(&path, Duration::from_millis(200)).expect("open");
        store.migrate().await.expect("migrate");
        store
            .with(|conn| {
                conn.execute(
                    "INSERT INTO Outbox (MessageId, Kind, OrderId, AccountId, Side, Symbol,
                         Quantity, PositionAfter, Fingerprint, ExecutedAt, CreatedAt,
                         NextAttemptAt, LeaseUntil)
                     VALUES (?1, 'OrderExecuted', 'o1', 'a', 'buy', 'MSFT', '1', '1', 'v2:x',
                             't', 't', 't', 't')",
                    [crate::store::message_id("o1")],
                )
            })
            .await
            .unwrap();
        let other = Connection::open(&path).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        // The writer cannot begin a transaction now: the lock is held.
        let blocked = store.with(|_| Ok(())).await;
        assert!(blocked.is_err(), "the other connection's lock did not hold");
        let counts = store.outbox_counts().await.expect("counts under the lock");
        assert_eq!(counts.undispatched, 1);
        let found = store
            .announcements(&Listing::Order("o1".into()), 10)
            .await
            .expect("one order's announcement under the lock");
        assert_eq!(found.len(), 1, "o1's announcement: {found:?}");
        assert_eq!(found[0].order_id, "o1");
        other.execute_batch("ROLLBACK").unwrap();
    }

    /// The claim is one `UPDATE … RETURNING`: it hands back exactly the
    /// rows it leased, the oldest due first, no more than its limit, in
    /// `Seq` order; rows under another claim's lease are not handed back.
    #[tokio::test]
    async fn a_claim_returns_exactly_the_rows_it_leased_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let store =
            SqliteStore::open(&dir.path().join("orders.db"), Duration::from_secs(5)).expect("open");
        store.migrate().await.expect("migrate");
        let ids: Vec<String> = (1..=5).map(|i| format!("ord-{i}")).collect();
        for id in &ids {
            let order = Order::from_data(&serde_json::json!({
                "orderId": id, "accountId": "acct", "side": "buy",
                "symbol": "MSFT", "quantity": "2"
            }))
            .expect("an order");
            store.execute(&order, "evt", "{}").await.unwrap();
        }
        let lease = Duration::from_secs(60);
        let claimed = |claim: &crate::store::Claim| -> Vec<String> {
            claim.rows.iter().map(|r| r.order_id.clone()).collect()
        };
        let first = store.claim_announcements(3, lease).await.unwrap();
        assert_eq!(claimed(&first), ids[..3]);
        assert!(first.rows.windows(2).all(|w| w[0].seq < w[1].seq));
        let second = store.claim_announcements(10, lease).await.unwrap();
        assert_eq!(claimed(&second), ids[3..], "the rest, not the leased");
        let third = store.claim_announcements(10, lease).await.unwrap();
        assert!(third.rows.is_empty(), "all leased: {:?}", third.rows);
    }

    /// The place a copy cannot share: the canonical path, the file's device
    /// and inode, and this machine's id (a copy on another machine at the
    /// same path is another database).
    #[cfg(unix)]
    #[test]
    fn the_place_is_the_full_path_the_inode_and_the_machine() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("orders.db");
        std::fs::write(&path, b"").unwrap();
        let [full, file, machine] = place_of(&path);
        let canonical = std::fs::canonicalize(&path).unwrap();
        assert_eq!(full, canonical.display().to_string());
        let m = std::fs::metadata(&path).unwrap();
        assert_eq!(file, format!("{}:{}", m.dev(), m.ino()));
        // The first of these that says something (a container may have
        // only the host name).
        let id = [
            "/etc/machine-id",
            "/var/lib/dbus/machine-id",
            "/proc/sys/kernel/hostname",
        ]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .map(|t| t.trim().to_string())
        .find(|t| !t.is_empty())
        .expect("this test needs a machine id or a host name");
        assert_eq!(machine, id);
    }
}
