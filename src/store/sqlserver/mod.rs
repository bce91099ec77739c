//! `SqlServerStore`: SQL Server / Azure SQL as the source of truth.
//!
//! Same protocol as the SQLite store (see `store/mod.rs`): `accept` inserts
//! and lets the unique index on `OrderId` answer duplicates (2601/2627 → read
//! the row and classify); `execute` is one transaction whose conditional
//! `UPDATE … WHERE Status='Received'` decides whether the position changes;
//! `reject` keeps each rejected event once, counting redeliveries.
//!
//! Every call takes a pooled connection (bb8, [`pool`]), runs under the
//! query timeout, and retries at most once, at once, when the connection
//! turned out to be dead; longer back-off is Event Grid's job. Statements
//! live in [`sql`], error numbers in [`classify`], the connection string in
//! [`connstr`], Entra ID tokens in [`aad`].

pub mod aad;
pub mod classify;
pub mod connstr;
pub mod pool;
pub mod sql;

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rust_decimal::Decimal;
use tiberius::error::Error as SqlError;
use tiberius::numeric::Numeric;
use tiberius::Row;

use self::aad::TokenSource;
use self::connstr::SqlConnInfo;
use self::pool::{Client, SqlConnectionManager};
use super::{Admission, Execution, OrderRecord, OrderStore, RejectedRecord, Rejection, StoreError};
#[cfg(feature = "failpoints")]
use crate::faults;
use crate::order::{Order, OrderStatus};
use crate::position::{self, Position};

/// Pooled connections are replaced after this long, so a failover or a
/// rebalanced gateway is picked up even on a busy, never-idle pool.
const MAX_CONNECTION_LIFETIME: Duration = Duration::from_secs(30 * 60);
/// Idle connections are closed after this long.
const IDLE_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// Pause before the one retry on a dropped connection.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// SQL Server timeouts and pool size (built from the environment by `config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlServerSettings {
    /// TCP connect plus login, per connection (SQL_CONNECT_TIMEOUT_SECONDS).
    pub connect_timeout: Duration,
    /// One store call, all its statements (SQL_QUERY_TIMEOUT_SECONDS).
    pub query_timeout: Duration,
    /// Most connections open at once (SQL_POOL_SIZE).
    pub pool_size: u32,
}

/// SQL Server-backed store.
///
/// Nothing is read or written before [`OrderStore::migrate`] has succeeded
/// once in this process: until then every call answers a transient error
/// (`retry`), so no order is executed or stored against a schema that was
/// never verified, whatever command (`serve`, `replay`, `status`) runs.
pub struct SqlServerStore {
    pool: bb8::Pool<SqlConnectionManager>,
    schema_verified: AtomicBool,
    last_connect_error: Arc<Mutex<Option<String>>>,
    connect_timeout: Duration,
    query_timeout: Duration,
}

/// Run `$body` (an expression using `$client: &mut Client`) on a pooled
/// connection within `$timeout`, retrying once on a fresh connection when
/// the first one was dead. A connection goes back to the pool only after a
/// request that finished without any error: one that timed out, was
/// cancelled or failed (inside a transaction or not) is discarded, and
/// closing it makes the server roll back whatever it had open.
macro_rules! with_client {
    ($self:ident, $what:expr, $timeout:expr, |$client:ident| $body:expr) => {{
        let what: &str = $what;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut conn = $self.checkout(what).await?;
            conn.broken = true;
            let result = {
                let $client: &mut Client = &mut conn.client;
                tokio::time::timeout($timeout, $body).await
            };
            match result {
                Err(_) => break Err(classify::query_timeout(what, $timeout)),
                Ok(Ok(value)) => {
                    conn.broken = false;
                    conn.last_used = std::time::Instant::now();
                    break Ok(value);
                }
                Ok(Err(e)) if classify::is_connection_lost(&e) && attempt == 1 => {
                    log::warn!("{what}: connection lost ({e}); retrying once on a new connection");
                    drop(conn);
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Ok(Err(e)) => break Err(classify::classify(what, &e)),
            }
        }
    }};
}

impl SqlServerStore {
    /// Parse the connection string (failing at once, naming the problem and
    /// never the password) and set up the pool. No connection is opened yet:
    /// the first call (normally `migrate`) opens one.
    pub fn connect(
        connection_string: &str,
        settings: &SqlServerSettings,
    ) -> Result<Self, StoreError> {
        let info = SqlConnInfo::parse(connection_string)
            .map_err(|e| StoreError::Permanent(e.to_string()))?;
        let identity = TokenSource::for_auth(&info.auth, settings.connect_timeout)
            .map_err(|e| StoreError::Permanent(e.to_string()))?
            .map(Arc::new);
        if let Some(source) = &identity {
            log::info!(
                "SQL Server store: Entra ID tokens from {}",
                source.description()
            );
        }
        Ok(Self::with_manager(
            SqlConnectionManager::new(info.tiberius_config(), identity, settings.connect_timeout),
            settings,
            info.to_string(),
        ))
    }

    /// A store over an explicit connection manager (tests use it to supply
    /// their own token source).
    pub fn with_manager(
        manager: SqlConnectionManager,
        settings: &SqlServerSettings,
        description: String,
    ) -> Self {
        let last_connect_error = manager.last_error();
        let pool = bb8::Pool::builder()
            .max_size(settings.pool_size.max(1))
            .min_idle(None)
            .connection_timeout(settings.connect_timeout)
            .test_on_check_out(true)
            .max_lifetime(Some(MAX_CONNECTION_LIFETIME))
            .idle_timeout(Some(IDLE_TIMEOUT))
            .build_unchecked(manager);
        log::info!(
            "SQL Server store: {description}, pool of {}, connect timeout {} s, query timeout {} s",
            settings.pool_size,
            settings.connect_timeout.as_secs(),
            settings.query_timeout.as_secs()
        );
        SqlServerStore {
            pool,
            schema_verified: AtomicBool::new(false),
            last_connect_error,
            connect_timeout: settings.connect_timeout,
            query_timeout: settings.query_timeout,
        }
    }

    /// The schema gate: `Err(retry)` until `migrate` has succeeded.
    fn schema_gate(&self, what: &str) -> Result<(), StoreError> {
        if self.schema_verified.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(StoreError::Transient(format!(
                "{what}: the SQL Server schema is not verified yet (`migrate` has not \
                 succeeded; see the log); nothing is read or written until it is"
            )))
        }
    }

    async fn checkout(
        &self,
        what: &str,
    ) -> Result<bb8::PooledConnection<'_, SqlConnectionManager>, StoreError> {
        match self.pool.get().await {
            Ok(conn) => Ok(conn),
            Err(bb8::RunError::User(e)) => Err(StoreError::Transient(format!("{what}: {e}"))),
            Err(bb8::RunError::TimedOut) => {
                let last = self
                    .last_connect_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                Err(classify::pool_timeout(what, self.connect_timeout, last))
            }
        }
    }
}

fn conversion(msg: String) -> SqlError {
    SqlError::Conversion(msg.into())
}

fn text(row: &Row, idx: usize, name: &str) -> Result<String, SqlError> {
    row.try_get::<&str, _>(idx)?
        .map(str::to_string)
        .ok_or_else(|| conversion(format!("{name} is NULL")))
}

fn opt_text(row: &Row, idx: usize) -> Result<Option<String>, SqlError> {
    Ok(row.try_get::<&str, _>(idx)?.map(str::to_string))
}

fn decimal(row: &Row, idx: usize, name: &str) -> Result<Decimal, SqlError> {
    row.try_get::<Decimal, _>(idx)?
        .map(|d| d.normalize())
        .ok_or_else(|| conversion(format!("{name} is NULL")))
}

fn int(row: &Row, idx: usize, name: &str) -> Result<i64, SqlError> {
    row.try_get::<i64, _>(idx)?
        .ok_or_else(|| conversion(format!("{name} is NULL")))
}

/// `DATETIME2` converted with style 126 has no zone; the store writes UTC.
fn utc(t: Option<String>) -> Option<String> {
    t.map(|t| format!("{t}Z"))
}

async fn run(client: &mut Client, statement: &str) -> Result<(), SqlError> {
    client.simple_query(statement).await?.into_results().await?;
    Ok(())
}

/// Run a batch that ends a transaction and reports `@@TRANCOUNT`
/// ([`sql::COMMIT_AND_COUNT`], [`sql::ROLLBACK_AND_COUNT`]); an error unless
/// no transaction is left open, so the caller discards the connection.
async fn end_transaction(client: &mut Client, batch: &str) -> Result<(), SqlError> {
    let open = client
        .simple_query(batch)
        .await?
        .into_results()
        .await?
        .last()
        .and_then(|rows| rows.first())
        .and_then(|row| row.get::<i32, _>(0));
    match open {
        Some(0) => Ok(()),
        other => Err(SqlError::Protocol(
            format!("a transaction is still open after ending it (@@TRANCOUNT {other:?})").into(),
        )),
    }
}

async fn read_order(client: &mut Client, order_id: &str) -> Result<Option<OrderRecord>, SqlError> {
    let row = client
        .query(sql::SELECT_ORDER, &[&order_id])
        .await?
        .into_row()
        .await?;
    let Some(r) = row else { return Ok(None) };
    let status = text(&r, 8, "Status")?;
    Ok(Some(OrderRecord {
        order_id: text(&r, 0, "OrderId")?,
        fingerprint: text(&r, 1, "Fingerprint")?,
        account_id: text(&r, 2, "AccountId")?,
        side: text(&r, 3, "Side")?,
        symbol: text(&r, 4, "Symbol")?,
        quantity: decimal(&r, 5, "Quantity")?,
        limit_price: r.try_get::<Decimal, _>(6)?.map(|d| d.normalize()),
        currency: opt_text(&r, 7)?,
        status: OrderStatus::from_str(&status).map_err(conversion)?,
        attempts: int(&r, 9, "Attempts")?,
        received_at: utc(opt_text(&r, 10)?).unwrap_or_default(),
        executed_at: utc(opt_text(&r, 11)?),
        placed_at: opt_text(&r, 12)?,
    }))
}

async fn accept_on(client: &mut Client, o: &Order, event_id: &str) -> Result<Admission, SqlError> {
    let inserted = client
        .execute(
            sql::INSERT_ORDER,
            &[
                &o.order_id.as_str(),
                &o.fingerprint(),
                &event_id,
                &o.account_id.as_str(),
                &o.side.as_str(),
                &o.symbol.as_str(),
                &o.quantity,
                &o.limit_price.unwrap_or(Decimal::ZERO),
                &o.currency.as_deref().unwrap_or(""),
                &o.placed_at.as_deref().unwrap_or(""),
            ],
        )
        .await;
    match inserted {
        Ok(_) => return Ok(Admission::New),
        Err(e) if classify::is_unique_violation(&e) => {}
        Err(e) => return Err(e),
    }
    // Rows are never deleted, so the row that violated the index is there.
    let existing = read_order(client, &o.order_id).await?.ok_or_else(|| {
        conversion(format!(
            "order {}: unique violation but no row found",
            o.order_id
        ))
    })?;
    if existing.current_fingerprint() != o.fingerprint() {
        return Ok(Admission::Conflict {
            existing_fingerprint: existing.fingerprint,
        });
    }
    if existing.status.is_terminal() {
        return Ok(Admission::AlreadyDone(existing.status));
    }
    client
        .execute(sql::RESUME_ORDER, &[&o.order_id.as_str()])
        .await?;
    Ok(Admission::Resumed)
}

/// `execute`: the position row is made to exist first, outside the
/// transaction (a racing first trade's unique violation only means it
/// exists). The transaction then claims the order row ([`sql::CLAIM_ORDER`]),
/// locks and reads the position, computes the new one exactly in Rust
/// ([`Position::apply`]) and either marks the order `Executed` and writes the
/// position, or, when it would overflow, marks it `Rejected` and stores the
/// event with the reason; a COMMIT that must leave no transaction open ends
/// it. Any error inside the transaction returns at once: the connection is
/// discarded (closing it rolls the transaction back) and no further
/// statement is sent on it.
async fn execute_on(
    client: &mut Client,
    o: &Order,
    event_id: &str,
    raw_event: &str,
) -> Result<Execution, SqlError> {
    let (account, symbol) = (o.account_id.as_str(), o.symbol.as_str());
    match client
        .execute(sql::ENSURE_POSITION, &[&account, &symbol])
        .await
    {
        Ok(_) => {}
        Err(e) if classify::is_unique_violation(&e) => {}
        Err(e) => return Err(e),
    }
    run(client, sql::BEGIN).await?;
    let claimed = client
        .execute(sql::CLAIM_ORDER, &[&o.order_id.as_str()])
        .await?
        .total();
    if claimed != 1 {
        end_transaction(client, sql::ROLLBACK_AND_COUNT).await?;
        // Not `Received` any more: done by another worker, unless the row is
        // not there at all (never a duplicate then: the caller retries).
        return match read_order(client, &o.order_id).await? {
            Some(row) if row.status.is_terminal() => Ok(Execution::AlreadyDone),
            Some(row) => Err(conversion(format!(
                "order {}: the claim of a Received order changed {claimed} rows but the order is {}",
                o.order_id,
                row.status.as_str()
            ))),
            None => Err(conversion(format!(
                "order {}: no row to execute (was it accepted?)",
                o.order_id
            ))),
        };
    }
    let rows = client
        .query(sql::LOCK_AND_READ_POSITION, &[&account, &symbol])
        .await?
        .into_results()
        .await?;
    let current = match rows.iter().flatten().next() {
        Some(row) => position_column(row, 0, "Quantity")?,
        None => {
            return Err(conversion(format!(
                "position {account}/{symbol}: no row after making sure it exists"
            )))
        }
    };
    let one_row = |what: &str, changed: u64| {
        if changed == 1 {
            Ok(())
        } else {
            Err(conversion(format!(
                "order {}: {what} changed {changed} rows, want 1",
                o.order_id
            )))
        }
    };
    let execution = match current.apply(o.side, o.quantity) {
        Ok(next) => {
            let marked = client
                .execute(sql::MARK_EXECUTED, &[&o.order_id.as_str()])
                .await?
                .total();
            one_row("the update to Executed", marked)?;
            // Scale 10 as the column: the value is sent exactly, unconverted.
            let quantity = Numeric::new_with_scale(next.units(), position::SCALE as u8);
            let updated = client
                .execute(sql::SET_POSITION, &[&account, &symbol, &quantity])
                .await?
                .total();
            one_row("the position update", updated)?;
            Execution::Executed
        }
        Err(overflow) => {
            let marked = client
                .execute(sql::MARK_REJECTED, &[&o.order_id.as_str()])
                .await?
                .total();
            one_row("the update to Rejected", marked)?;
            let rejection = Rejection::position_overflow(o, event_id, raw_event, &overflow);
            let hash = rejection.event_hash();
            // Counted if kept before, else inserted: no statement in the
            // transaction may fail on the unique index.
            let counted = client
                .execute(sql::COUNT_REJECTED_DELIVERY, &[&hash.as_str()])
                .await?
                .total();
            if counted == 0 {
                insert_rejected(client, &rejection, &hash).await?;
            }
            Execution::Rejected(overflow)
        }
    };
    end_transaction(client, commit_batch()?).await?;
    Ok(execution)
}

/// The batch that ends `execute`'s transaction: [`sql::COMMIT_AND_COUNT`].
/// With the `sqlserver_commit` fault point armed (tests only): `fail` sends
/// a statement the server fails in its place (the transaction is aborted);
/// `skip` sends no COMMIT, only the count, so nothing but the
/// open-transaction check stands between the caller and a false `executed`;
/// `cut` reports the connection lost; `crash` aborts the process.
fn commit_batch() -> Result<&'static str, SqlError> {
    #[cfg(feature = "failpoints")]
    if let Some(batch) = fail::eval(faults::SQLSERVER_COMMIT, |arg| match arg.as_deref() {
        Some("fail") => Ok(sql::FAULT_FAILING_COMMIT),
        Some("skip") => Ok(sql::OPEN_TRANSACTIONS),
        Some("cut") => Err(SqlError::Io {
            kind: std::io::ErrorKind::ConnectionReset,
            message: "fault injected at sqlserver_commit: connection cut".into(),
        }),
        _ => Err(SqlError::Protocol(
            faults::crash_or_error(faults::SQLSERVER_COMMIT, arg).into(),
        )),
    }) {
        return batch;
    }
    Ok(sql::COMMIT_AND_COUNT)
}

async fn migrate_on(client: &mut Client) -> Result<(), SqlError> {
    let current = client
        .query(sql::SCHEMA_IS_CURRENT, &[&sql::SCHEMA_VERSION])
        .await?
        .into_row()
        .await?
        .and_then(|r| r.get::<i32, _>(0));
    if current.unwrap_or(0) > 0 {
        return Ok(());
    }
    run(client, sql::BEGIN).await?;
    run(client, sql::LOCK_SCHEMA).await?;
    for batch in sql::schema_batches() {
        run(client, batch).await?;
    }
    end_transaction(client, sql::COMMIT_AND_COUNT).await
}

async fn insert_rejected(client: &mut Client, r: &Rejection, hash: &str) -> Result<(), SqlError> {
    client
        .execute(
            sql::INSERT_REJECTED,
            &[
                &hash,
                &r.kind.as_str(),
                &r.order_id.as_deref().unwrap_or(""),
                &r.event_id.as_deref().unwrap_or(""),
                &r.reason.as_str(),
                &r.fingerprint.as_deref().unwrap_or(""),
                &r.existing_fingerprint.as_deref().unwrap_or(""),
                &r.raw_event.as_str(),
            ],
        )
        .await?;
    Ok(())
}

async fn reject_on(client: &mut Client, r: &Rejection, hash: &str) -> Result<(), SqlError> {
    match insert_rejected(client, r, hash).await {
        Ok(()) => Ok(()),
        Err(e) if classify::is_unique_violation(&e) => {
            client
                .execute(sql::COUNT_REJECTED_DELIVERY, &[&hash])
                .await?;
            Ok(())
        }
        Err(e) => Err(e),
    }
}

async fn identity_on(client: &mut Client) -> Result<String, SqlError> {
    let row = client
        .simple_query(sql::SELECT_IDENTITY)
        .await?
        .into_row()
        .await?
        .ok_or_else(|| conversion("StoreIdentity has no row".into()))?;
    let stored = text(&row, 0, "Id")?;
    let server = opt_text(&row, 1)?.unwrap_or_default();
    let database = opt_text(&row, 2)?.unwrap_or_default();
    Ok(super::bound_identity(&stored, &[&server, &database]))
}

async fn position_on(
    client: &mut Client,
    account_id: &str,
    symbol: &str,
) -> Result<Option<Position>, SqlError> {
    let row = client
        .query(sql::SELECT_POSITION, &[&account_id, &symbol])
        .await?
        .into_row()
        .await?;
    row.map(|r| position_column(&r, 0, "Quantity")).transpose()
}

/// A `DECIMAL(38,10)` column (positions), exactly: read as tiberius'
/// `Numeric` (its conversion to `Decimal` would panic past 2^96 at scale 10,
/// and `Decimal` keeps fewer digits than the column).
fn position_column(row: &Row, idx: usize, name: &str) -> Result<Position, SqlError> {
    let n = row
        .try_get::<Numeric, _>(idx)?
        .ok_or_else(|| conversion(format!("{name} is NULL")))?;
    let scale = u32::from(n.scale());
    let units = if scale <= position::SCALE {
        n.value()
            .checked_mul(10_i128.pow(position::SCALE - scale))
            .and_then(Position::from_units)
    } else {
        None
    };
    units.ok_or_else(|| conversion(format!("{name} {n} is not a DECIMAL(38,10) value")))
}

async fn rejections_on(
    client: &mut Client,
    order_id: Option<&str>,
) -> Result<Vec<RejectedRecord>, SqlError> {
    let rows = match order_id {
        Some(id) => {
            client
                .query(sql::SELECT_REJECTIONS, &[&id])
                .await?
                .into_first_result()
                .await?
        }
        None => {
            client
                .query(sql::SELECT_REJECTIONS_WITHOUT_ORDER, &[])
                .await?
                .into_first_result()
                .await?
        }
    };
    rows.iter()
        .map(|r| {
            Ok(RejectedRecord {
                kind: text(r, 0, "Kind")?,
                order_id: opt_text(r, 1)?,
                reason: text(r, 2, "Reason")?,
                fingerprint: opt_text(r, 3)?,
                existing_fingerprint: opt_text(r, 4)?,
                raw_event: text(r, 5, "RawEvent")?,
                deliveries: int(r, 6, "Deliveries")?,
            })
        })
        .collect()
}

#[async_trait]
impl OrderStore for SqlServerStore {
    fn name(&self) -> &'static str {
        "sqlserver"
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        // Waiting for another process's migration counts against the bound.
        let bound = self.query_timeout * 3;
        with_client!(self, "migrate", bound, |client| migrate_on(client))?;
        self.schema_verified.store(true, Ordering::Release);
        Ok(())
    }

    async fn identity(&self) -> Result<String, StoreError> {
        self.schema_gate("read identity")?;
        with_client!(self, "read identity", self.query_timeout, |client| {
            identity_on(client)
        })
    }

    async fn accept(&self, order: &Order, event_id: &str) -> Result<Admission, StoreError> {
        self.schema_gate("accept")?;
        with_client!(self, "accept", self.query_timeout, |client| accept_on(
            client, order, event_id
        ))
    }

    async fn execute(
        &self,
        order: &Order,
        event_id: &str,
        raw_event: &str,
    ) -> Result<Execution, StoreError> {
        self.schema_gate("execute")?;
        with_client!(self, "execute", self.query_timeout, |client| execute_on(
            client, order, event_id, raw_event
        ))
    }

    async fn reject(&self, rejection: &Rejection) -> Result<(), StoreError> {
        let hash = rejection.event_hash();
        self.schema_gate("reject")?;
        with_client!(self, "reject", self.query_timeout, |client| reject_on(
            client, rejection, &hash
        ))
    }

    async fn order(&self, order_id: &str) -> Result<Option<OrderRecord>, StoreError> {
        self.schema_gate("read order")?;
        with_client!(self, "read order", self.query_timeout, |client| read_order(
            client, order_id
        ))
    }

    async fn position(
        &self,
        account_id: &str,
        symbol: &str,
    ) -> Result<Option<Position>, StoreError> {
        self.schema_gate("read position")?;
        with_client!(self, "read position", self.query_timeout, |client| {
            position_on(client, account_id, symbol)
        })
    }

    async fn rejections(&self, order_id: Option<&str>) -> Result<Vec<RejectedRecord>, StoreError> {
        self.schema_gate("read rejections")?;
        with_client!(self, "read rejections", self.query_timeout, |client| {
            rejections_on(client, order_id)
        })
    }
}
