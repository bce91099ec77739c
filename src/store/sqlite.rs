//! `SqliteStore`: the embedded default store, one SQLite file.
//!
//! WAL with `synchronous=FULL` so a commit is durable before we answer the
//! host; a busy timeout so several handler processes can share the file;
//! every write in an `IMMEDIATE` transaction so two writers never deadlock on a
//! lock upgrade. rusqlite is blocking, so calls run on tokio's blocking pool.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{params, Connection, ErrorCode, OptionalExtension, TransactionBehavior};
use rust_decimal::Decimal;

use super::{Admission, Execution, OrderRecord, OrderStore, RejectedRecord, Rejection, StoreError};
use crate::order::{Order, OrderStatus};

const SCHEMA: &str = include_str!("../../sql/sqlite/schema.sql");
const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

/// SQLite-backed store.
pub struct SqliteStore {
    path: PathBuf,
    conn: Arc<Mutex<Connection>>,
}

impl SqliteStore {
    /// Open (creating if needed) the database file at `path`. `busy_timeout`
    /// bounds how long a write waits for another process's lock before the
    /// call fails as transient.
    pub fn open(path: &Path, busy_timeout: Duration) -> Result<SqliteStore, StoreError> {
        let conn = Connection::open(path).map_err(|e| {
            StoreError::Permanent(format!(
                "cannot open SQLite database {}: {e}",
                path.display()
            ))
        })?;
        conn.busy_timeout(busy_timeout).map_err(classify)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(classify)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(classify)?;
        Ok(SqliteStore {
            path: path.to_path_buf(),
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Run `f` with the connection on the blocking pool.
    async fn with<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, rusqlite::Error> + Send + 'static,
    {
        let conn = Arc::clone(&self.conn);
        tokio::task::spawn_blocking(move || {
            let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut conn).map_err(classify)
        })
        .await
        .map_err(|e| StoreError::Transient(format!("store task failed: {e}")))?
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

fn is_unique_violation(e: &rusqlite::Error) -> bool {
    matches!(
        e,
        rusqlite::Error::SqliteFailure(f, _)
            if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                || f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
    )
}

fn decimal(text: &str) -> Result<Decimal, rusqlite::Error> {
    Decimal::from_str(text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e))
    })
}

fn status(text: &str) -> Result<OrderStatus, rusqlite::Error> {
    OrderStatus::from_str(text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, e.into())
    })
}

fn read_order(conn: &Connection, order_id: &str) -> Result<Option<OrderRecord>, rusqlite::Error> {
    conn.query_row(
        "SELECT OrderId, Fingerprint, AccountId, Side, Symbol, Quantity, LimitPrice, Currency,
                Status, Attempts, ReceivedAt, ExecutedAt
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
        self.with(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute_batch(SCHEMA)?;
            tx.commit()
        })
        .await
    }

    async fn accept(&self, order: &Order, event_id: &str) -> Result<Admission, StoreError> {
        let o = order.clone();
        let event_id = event_id.to_string();
        self.with(move |conn| {
            let inserted = conn.execute(
                &format!(
                    "INSERT INTO Orders (OrderId, Fingerprint, EventId, AccountId, Side, Symbol,
                                         Quantity, LimitPrice, Currency, PlacedAt, Status, ReceivedAt)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 'Received', {NOW})"
                ),
                params![
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
                ],
            );
            match inserted {
                Ok(_) => return Ok(Admission::New),
                Err(e) if is_unique_violation(&e) => {}
                Err(e) => return Err(e),
            }
            let existing = read_order(conn, &o.order_id)?.ok_or_else(|| {
                // The row that violated the index cannot vanish: rows are never deleted.
                rusqlite::Error::QueryReturnedNoRows
            })?;
            if existing.fingerprint != o.fingerprint() {
                return Ok(Admission::Conflict {
                    existing_fingerprint: existing.fingerprint,
                });
            }
            if existing.status.is_terminal() {
                return Ok(Admission::AlreadyDone(existing.status));
            }
            conn.execute(
                "UPDATE Orders SET Attempts = Attempts + 1 WHERE OrderId = ?1 AND Status = 'Received'",
                [&o.order_id],
            )?;
            Ok(Admission::Resumed)
        })
        .await
    }

    async fn execute(&self, order: &Order) -> Result<Execution, StoreError> {
        let o = order.clone();
        self.with(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let changed = tx.execute(
                &format!(
                    "UPDATE Orders SET Status = 'Executed', ExecutedAt = {NOW}
                      WHERE OrderId = ?1 AND Status = 'Received'"
                ),
                [&o.order_id],
            )?;
            if changed != 1 {
                return Ok(Execution::AlreadyDone);
            }
            let current: Option<String> = tx
                .query_row(
                    "SELECT Quantity FROM Positions WHERE AccountId = ?1 AND Symbol = ?2",
                    params![o.account_id, o.symbol],
                    |r| r.get(0),
                )
                .optional()?;
            let current = current
                .as_deref()
                .map(decimal)
                .transpose()?
                .unwrap_or_default();
            let next = (current + o.side.signed(o.quantity)).normalize();
            tx.execute(
                &format!(
                    "INSERT INTO Positions (AccountId, Symbol, Quantity, UpdatedAt)
                     VALUES (?1, ?2, ?3, {NOW})
                     ON CONFLICT (AccountId, Symbol)
                     DO UPDATE SET Quantity = excluded.Quantity, UpdatedAt = excluded.UpdatedAt"
                ),
                params![o.account_id, o.symbol, next.to_string()],
            )?;
            tx.commit()?;
            Ok(Execution::Executed)
        })
        .await
    }

    async fn reject(&self, rejection: &Rejection) -> Result<(), StoreError> {
        let r = rejection.clone();
        let hash = r.event_hash();
        self.with(move |conn| {
            conn.execute(
                &format!(
                    "INSERT INTO RejectedEvents (EventHash, Kind, OrderId, EventId, Reason, Fingerprint,
                                                 ExistingFingerprint, RawEvent, FirstSeenAt, LastSeenAt)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, {NOW}, {NOW})
                     ON CONFLICT (EventHash)
                     DO UPDATE SET Deliveries = Deliveries + 1, LastSeenAt = excluded.LastSeenAt"
                ),
                params![
                    hash,
                    r.kind.as_str(),
                    r.order_id,
                    r.event_id,
                    r.reason,
                    r.fingerprint,
                    r.existing_fingerprint,
                    r.raw_event,
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn order(&self, order_id: &str) -> Result<Option<OrderRecord>, StoreError> {
        let id = order_id.to_string();
        self.with(move |conn| read_order(conn, &id)).await
    }

    async fn position(
        &self,
        account_id: &str,
        symbol: &str,
    ) -> Result<Option<Decimal>, StoreError> {
        let (a, s) = (account_id.to_string(), symbol.to_string());
        self.with(move |conn| {
            let q: Option<String> = conn
                .query_row(
                    "SELECT Quantity FROM Positions WHERE AccountId = ?1 AND Symbol = ?2",
                    params![a, s],
                    |r| r.get(0),
                )
                .optional()?;
            q.as_deref().map(decimal).transpose()
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
}
