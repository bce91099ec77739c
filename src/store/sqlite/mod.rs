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

use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension};
use rust_decimal::Decimal;

mod outbox;
mod schema;
mod writer;

use writer::{writer, Durability, Job, Pending, PressureCounters};
pub use writer::{Pressure, MAX_GROUP, MAX_QUEUED};

use super::{
    Announcement, Birth, Claim, Deferral, Execution, Handoff, Listing, OrderRecord, OrderStore,
    OutboxCounts, RejectedRecord, Rejection, Resend, StoreError, StoreLoad,
};
use crate::order::{Order, OrderStatus};
use crate::position::Position;

const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

/// An instant as every `…At` column holds it, the text of [`NOW`]: UTC to
/// the millisecond (`2026-12-05T11:07:22.123Z`). The hot calls (an
/// execution, a mark) take the time once on the writer thread and bind it
/// to each column that records it, rather than run `strftime` in each
/// statement: SQLite's `strftime` cost about 5 000 instructions a call, six
/// a first delivery and two a row marked (callgrind, docs/benchmarks.md).
/// Written by `humantime` (digits into a buffer: about 700 instructions,
/// where `time`'s parts through `format!` cost 3 300, twice a first
/// delivery with dispatch on); `time` writes the instants `humantime` does
/// not take (before 1970, past 9999: a clock that far off).
fn instant_text(at: SystemTime) -> String {
    const YEAR_10000: Duration = Duration::from_secs(253_402_300_800);
    if at
        .duration_since(SystemTime::UNIX_EPOCH)
        .is_ok_and(|d| d < YEAR_10000)
    {
        return humantime::format_rfc3339_millis(at).to_string();
    }
    let t = time::OffsetDateTime::from(at);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
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
    /// Set once this process's dispatcher runs: executions' rows are born
    /// leased to it and handed over after their commit.
    handoff: OnceLock<Arc<Handoff>>,
    /// Whether this process has raised the outbox's epoch in a commit
    /// (`outbox::raise_epoch`): each process does before the first row it
    /// writes, so a file restored from a backup while it was stopped
    /// numbers under a higher epoch than the history it lost.
    epoch_raised: Arc<AtomicBool>,
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
            handoff: OnceLock::new(),
            epoch_raised: Arc::new(AtomicBool::new(false)),
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
    // Cached: every first delivery reads here first (parsed each time, it
    // was 6 % of the writer's CPU, perf on `outbox_bench`).
    conn.prepare_cached(
        "SELECT OrderId, Fingerprint, AccountId, Side, Symbol, Quantity, LimitPrice, Currency,
                Status, Attempts, ReceivedAt, ExecutedAt, PlacedAt
           FROM Orders WHERE OrderId = ?1",
    )?
    .query_row([order_id], |r| {
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
    })
    .optional()
}

#[async_trait]
impl OrderStore for SqliteStore {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    /// One commit's group: the writer serves that many calls together;
    /// more would only queue (and past its queue, be refused).
    fn parallelism(&self) -> usize {
        writer::MAX_GROUP
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
        let handoff = self.handoff.get().cloned();
        let born_to = handoff.clone();
        let raised = self.epoch_raised.load(Ordering::Acquire);
        // One call, one savepoint (the writer's own, around every call: an
        // error rolls back all of it): the insert (or the row found), the
        // position and the status change commit together, in the writer's
        // group commit (one durable commit for the whole group).
        let (execution, birth) = self.with(move |conn| {
            // One instant for the whole call, taken under the write lock (so
            // one position's executions get theirs in execution order).
            let started = Instant::now();
            let at = SystemTime::now();
            let now = instant_text(at);
            let existing = read_order(conn, &o.order_id)?;
            let fresh = existing.is_none();
            match existing {
                None => {
                    // Cached statements: parsed once per connection, not per call.
                    conn.prepare_cached(
                        "INSERT INTO Orders (OrderId, Fingerprint, EventId, AccountId, Side, Symbol,
                                             Quantity, LimitPrice, Currency, PlacedAt, Status, ReceivedAt)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 'Received', ?11)",
                    )?
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
                        now,
                    ])?;
                }
                Some(existing) if existing.current_fingerprint() != o.fingerprint() => {
                    let conflict =
                        Rejection::conflict(&o, &event_id, &raw_event, &existing.fingerprint);
                    insert_rejection(conn, &conflict)?;
                    return Ok((
                        Execution::Conflict {
                            existing_fingerprint: existing.fingerprint,
                        },
                        None,
                    ));
                }
                // A duplicate: nothing written.
                Some(existing) if existing.status.is_terminal() => {
                    return Ok((Execution::AlreadyDone, None))
                }
                Some(_) => {
                    // Left `Received` by an earlier version's worker that died.
                    conn.execute(
                        "UPDATE Orders SET Attempts = Attempts + 1 WHERE OrderId = ?1 AND Status = 'Received'",
                        [&o.order_id],
                    )?;
                }
            }
            // The writer holds the database's write lock (BEGIN IMMEDIATE):
            // the position read here is the one this call changes.
            let current: Option<String> = conn
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
                    let changed = conn
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
                    insert_rejection(conn, &rejection)?;
                    return Ok((Execution::Rejected(overflow), None));
                }
            };
            let changed = conn
                .prepare_cached(
                    "UPDATE Orders SET Status = 'Executed', ExecutedAt = ?2
                      WHERE OrderId = ?1 AND Status = 'Received'",
                )?
                .execute([&o.order_id, &now])?;
            if changed != 1 {
                return Err(protocol_error(format!(
                    "order {}: the update to Executed changed {changed} rows",
                    o.order_id
                )));
            }
            conn.prepare_cached(
                "INSERT INTO Positions (AccountId, Symbol, Quantity, UpdatedAt)
                 VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (AccountId, Symbol)
                 DO UPDATE SET Quantity = excluded.Quantity, UpdatedAt = excluded.UpdatedAt",
            )?
            .execute(params![o.account_id, o.symbol, next.to_string(), now])?;
            // The announcement, in the same commit as the execution; born
            // leased to this process's dispatcher when it runs, its lease
            // timed from the call's instant both in the row and here.
            let born = born_to.as_ref().map(|h| instant_text(at + h.lease));
            if !raised {
                outbox::raise_epoch(conn)?;
            }
            let row = outbox::announce(conn, &o, next, &now, born, fresh)?;
            let birth = row.zip(born_to).map(|(row, h)| Birth {
                row,
                leased_until: started + h.lease,
            });
            Ok((Execution::Executed, birth))
        })
        .await?;
        if execution == Execution::Executed {
            self.epoch_raised.store(true, Ordering::Release);
        }
        // Committed: the dispatcher may send it now (never before: a group
        // whose commit fails answers an error, and hands nothing over).
        if let (Some(h), Some(birth)) = (&handoff, birth) {
            h.hand(birth);
        }
        Ok(execution)
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

    fn hand_over_announcements(&self, lease: Duration) -> Option<Arc<Handoff>> {
        Some(Arc::clone(
            self.handoff.get_or_init(|| Arc::new(Handoff::new(lease))),
        ))
    }

    async fn claim_announcements(&self, limit: u32, lease: Duration) -> Result<Claim, StoreError> {
        let token = uuid::Uuid::new_v4().to_string();
        let t = token.clone();
        let rows = self
            .with_relaxed(move |conn| outbox::claim(conn, &t, limit, lease))
            .await?;
        Ok(Claim { token, rows })
    }

    async fn mark_announced(&self, sent: &[Announcement]) -> Result<u64, StoreError> {
        let seqs: Vec<i64> = sent.iter().map(|a| a.seq).collect();
        self.with_relaxed(move |conn| outbox::mark(conn, &seqs))
            .await
    }

    async fn defer_announcement(
        &self,
        token: Option<&str>,
        deferral: &Deferral,
    ) -> Result<(), StoreError> {
        let (t, d) = (token.map(str::to_string), deferral.clone());
        self.with_relaxed(move |conn| outbox::defer(conn, t.as_deref(), &d))
            .await
    }

    async fn purge_announced(
        &self,
        retention: Duration,
        limit: u32,
        expired: super::Expired,
    ) -> Result<u64, StoreError> {
        self.with_relaxed(move |conn| outbox::purge(conn, retention, limit, expired))
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

    async fn resend_announcements(&self, which: &Resend) -> Result<u64, StoreError> {
        let which = which.clone();
        self.with(move |conn| outbox::resend(conn, &which)).await
    }

    async fn backfill_announcements(
        &self,
        within: Duration,
        write: bool,
    ) -> Result<u64, StoreError> {
        // The count only reads: on the read connection, off the writer.
        if write {
            // A command's process: its epoch raised before the rows it
            // writes, as `execute` does.
            self.with(move |conn| {
                outbox::raise_epoch(conn)?;
                outbox::backfill(conn, within, true)
            })
            .await
        } else {
            self.read(move |conn| outbox::backfill(conn, within, false))
                .await
        }
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
mod tests;
