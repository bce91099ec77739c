//! `SqlServerStore`: SQL Server / Azure SQL as the source of truth.
//!
//! Same protocol as the SQLite store (see `store/mod.rs`), each call one
//! round trip: `execute` is one T-SQL batch ([`sql::EXECUTE_ORDER`]) that
//! inserts under the unique index on `OrderId` or finds the row, and in one
//! transaction applies the position change only with the conditional
//! `UPDATE … WHERE Status='Received'`; `reject` keeps each rejected event
//! once, counting redeliveries ([`sql::REJECT`]).
//!
//! Every call takes a pooled connection (bb8, [`pool`]), runs under the
//! query timeout within one budget, moves past pooled connections a server
//! restart cut or a dead network path took ([`silence`]) and retries a lost
//! one once (`call.rs`, its decisions in [`retry`] and [`silence`]); longer back-off
//! is Event Grid's job. Statements
//! live in [`sql`], error numbers in [`classify`], the connection string in
//! [`connstr`], the execution's tries in `execute`, the migration in
//! [`migrate`], the start's rights check in [`rights`], Entra ID tokens
//! from [`crate::entra`].

mod call;
pub mod classify;
pub mod connstr;
mod execute;
pub mod migrate;
mod outbox;
pub mod pool;
pub mod retry;
pub mod rights;
pub mod silence;
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

use self::connstr::{Auth, SqlConnInfo};
use self::pool::{Client, Logins, SqlConnectionManager};
use self::retry::call_budget;
use self::silence::Silences;
use super::{
    Announcement, Claim, Deferral, Execution, Listing, OrderRecord, OrderStore, OutboxCounts,
    RejectedRecord, Rejection, Resend, StoreError,
};
use crate::entra::{TokenError, TokenSource, SQL_SCOPE};
use crate::order::{Order, OrderStatus};
use crate::position::Position;

/// Pooled connections are replaced after this long, so a failover or a
/// rebalanced gateway is picked up even on a busy, never-idle pool.
const MAX_CONNECTION_LIFETIME: Duration = Duration::from_secs(30 * 60);
/// [`SqlServerSettings::idle_timeout`] unless set: under the 4 minutes
/// after which Azure's load balancers and SQL gateway drop an idle TCP
/// connection without telling either end.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(180);
/// How often the pool closes idle and expired connections and reopens
/// [`pool::MIN_IDLE`]: at the reconnect pace, so connections lost in an
/// outage are reopened in the background within a second of the server
/// accepting logins again.
const REFILL_EVERY: Duration = Duration::from_secs(1);

/// SQL Server timeouts and pool size (built from the environment by `config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlServerSettings {
    /// TCP connect plus login, per connection (SQL_CONNECT_TIMEOUT_SECONDS).
    pub connect_timeout: Duration,
    /// One store call, all its statements (SQL_QUERY_TIMEOUT_SECONDS).
    pub query_timeout: Duration,
    /// Most connections open at once (SQL_POOL_SIZE).
    pub pool_size: u32,
    /// `order-guard migrate`, all of it (SQL_MIGRATE_TIMEOUT_SECONDS); a
    /// start's migration has 3 × `query_timeout`.
    pub migrate_timeout: Duration,
    /// Rows a migration rewrites per transaction (SQL_MIGRATE_BATCH_ROWS).
    pub migrate_batch_rows: u32,
    /// Idle connections are closed after this long
    /// (SQL_IDLE_TIMEOUT_SECONDS; [`DEFAULT_IDLE_TIMEOUT`]).
    pub idle_timeout: Duration,
}

/// [`SqlServerSettings::migrate_timeout`] unless set: an hour.
pub const DEFAULT_MIGRATE_TIMEOUT: Duration = Duration::from_secs(3600);
/// [`SqlServerSettings::migrate_batch_rows`] unless set.
pub const DEFAULT_MIGRATE_BATCH_ROWS: u32 = 10_000;

/// SQL Server-backed store.
///
/// Nothing is read or written before [`OrderStore::migrate`] has succeeded
/// once in this process (the schema current and this user's rights all
/// there): until then every call answers a transient error (`retry`), so no
/// order is executed or stored against a schema that was never verified,
/// whatever command (`serve`, `replay`, `status`) runs.
pub struct SqlServerStore {
    pool: bb8::Pool<SqlConnectionManager>,
    schema_verified: AtomicBool,
    last_connect_error: Arc<Mutex<Option<String>>>,
    /// The pool manager's logins in flight (telemetry's gauge).
    logins: Arc<Logins>,
    /// Suspicions of a dead network path (shared with the manager).
    silences: Arc<Silences>,
    /// The store's identity once read (with the schema's state at
    /// `migrate`, or by [`OrderStore::identity`]): it names the database
    /// the pool connects to, which does not change under a running store.
    identity: std::sync::OnceLock<String>,
    connect_timeout: Duration,
    query_timeout: Duration,
    /// SQL_POOL_SIZE: how many stale pooled connections a call may skip.
    pool_size: u32,
    migrate_timeout: Duration,
    migrate_batch_rows: u32,
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
        let identity = token_source(&info.auth, settings.connect_timeout)
            .map_err(|e| StoreError::Permanent(e.to_string()))?
            .map(Arc::new);
        if let Some(source) = &identity {
            log::info!(
                "SQL Server store: Entra ID tokens from {}",
                source.description()
            );
        }
        Ok(Self::with_manager(
            SqlConnectionManager::new(
                info.tiberius_config(),
                identity,
                settings.connect_timeout,
                settings.query_timeout,
            ),
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
        let logins = manager.logins();
        let silences = manager.silences();
        let pool_size = settings.pool_size.max(1);
        // bb8 wakes a waiting caller whenever a connection is put in the
        // pool, a new one included; `min_idle` keeps connects going in the
        // background (re-asked every REFILL_EVERY while they fail), so after
        // an outage the pool refills itself and waiters are served by the
        // first login that succeeds, not only by a connection returned.
        let pool = bb8::Pool::builder()
            .max_size(pool_size)
            .min_idle(Some(pool::MIN_IDLE.min(pool_size)))
            .reaper_rate(REFILL_EVERY)
            // A first wait for a connection may take the whole call's
            // budget; the statements then get what is left of it.
            .connection_timeout(call_budget(
                settings.connect_timeout,
                settings.query_timeout,
            ))
            .test_on_check_out(true)
            .retry_connection(false)
            .max_lifetime(Some(MAX_CONNECTION_LIFETIME))
            .idle_timeout(Some(settings.idle_timeout))
            .build_unchecked(manager);
        log::info!(
            "SQL Server store: {description}, pool of {}, connect timeout {} s, query timeout {} s, idle connections closed after {} s",
            settings.pool_size,
            settings.connect_timeout.as_secs(),
            settings.query_timeout.as_secs(),
            settings.idle_timeout.as_secs()
        );
        SqlServerStore {
            pool,
            schema_verified: AtomicBool::new(false),
            last_connect_error,
            logins,
            silences,
            identity: std::sync::OnceLock::new(),
            connect_timeout: settings.connect_timeout,
            query_timeout: settings.query_timeout,
            pool_size: settings.pool_size.max(1),
            migrate_timeout: settings.migrate_timeout,
            migrate_batch_rows: settings.migrate_batch_rows.max(1),
        }
    }

    /// Migrate within `bound` (the server waits at most three quarters of
    /// it for another process's migration lock), then check this user's
    /// rights; open the schema gate only when both succeed. `hint` says
    /// what to do when the bound passes first. `app_rights`: what a
    /// missing right of the app's does ([`rights::AppRights`]).
    async fn migrate_within(
        &self,
        bound: Duration,
        hint: &str,
        app_rights: rights::AppRights,
    ) -> Result<(), StoreError> {
        let bounds = migrate::Bounds {
            lock_wait: bound * 3 / 4,
            deadline: tokio::time::Instant::now() + bound,
            batch_rows: self.migrate_batch_rows,
        };
        let done = self
            .with_client("migrate", bound, |call| {
                Box::pin(migrate::migrate_on(call.client, &bounds))
            })
            .await;
        match done {
            Ok(migrate::Migrated::LockRefused(result, waited)) => {
                return Err(StoreError::Transient(migrate::lock_refused(result, waited)))
            }
            Ok(migrate::Migrated::Done { converted }) => log::info!(
                "SQL Server schema migrated to version {}{}",
                sql::SCHEMA_VERSION,
                if converted > 0 {
                    format!(" ({converted} positions converted)")
                } else {
                    String::new()
                }
            ),
            Ok(migrate::Migrated::Current { identity }) => {
                if let Some(identity) = identity {
                    // Read with the schema's state: no round trip later.
                    let _ = self.identity.set(identity);
                }
            }
            Ok(migrate::Migrated::Refused { diagnosis, failure }) => {
                return Err(migrate::verdict(&diagnosis, &failure))
            }
            Err(e) if e == classify::query_timeout("migrate", bound) => {
                return Err(StoreError::Transient(format!(
                    "migrate: the schema's migration did not finish within {} s; what it \
                     committed is kept and the next run resumes from there: {hint}",
                    bound.as_secs_f64()
                )))
            }
            Err(e) => return Err(e),
        }
        if app_rights != rights::AppRights::NotNeeded {
            let rights = self
                .with_client("check rights", self.query_timeout, |call| {
                    Box::pin(rights::check_on(call.client))
                })
                .await?;
            match rights::refusal(&rights) {
                Some(refusal) if app_rights == rights::AppRights::Required => {
                    return Err(StoreError::Misconfigured(refusal))
                }
                Some(refusal) => log::warn!(
                    "migrate: the schema is up to date; this user could not run the app itself: {refusal}"
                ),
                None => {}
            }
        }
        self.schema_verified.store(true, Ordering::Release);
        Ok(())
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
}

/// The token source for a connection string's `Authentication`: `None` for
/// a SQL login. Reads the environment now (which managed-identity endpoint,
/// which links of the chain); sends nothing yet.
pub fn token_source(auth: &Auth, timeout: Duration) -> Result<Option<TokenSource>, TokenError> {
    match auth {
        Auth::SqlPassword { .. } => Ok(None),
        Auth::ManagedIdentity { client_id } => {
            TokenSource::managed_identity(client_id.clone(), SQL_SCOPE, timeout).map(Some)
        }
        Auth::ActiveDirectoryDefault { client_id } => {
            TokenSource::default_chain(client_id.clone(), SQL_SCOPE, timeout).map(Some)
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

/// An order row from `row`'s columns starting at `at` (the columns of
/// [`sql::SELECT_ORDER`]); `None` when they are NULL (no row joined).
fn order_record(r: &Row, at: usize) -> Result<Option<OrderRecord>, SqlError> {
    let Some(order_id) = opt_text(r, at)? else {
        return Ok(None);
    };
    let status = text(r, at + 8, "Status")?;
    Ok(Some(OrderRecord {
        order_id,
        fingerprint: text(r, at + 1, "Fingerprint")?,
        account_id: text(r, at + 2, "AccountId")?,
        side: text(r, at + 3, "Side")?,
        symbol: text(r, at + 4, "Symbol")?,
        quantity: decimal(r, at + 5, "Quantity")?,
        limit_price: r.try_get::<Decimal, _>(at + 6)?.map(|d| d.normalize()),
        currency: opt_text(r, at + 7)?,
        status: OrderStatus::from_str(&status).map_err(conversion)?,
        attempts: int(r, at + 9, "Attempts")?,
        received_at: utc(opt_text(r, at + 10)?).unwrap_or_default(),
        executed_at: utc(opt_text(r, at + 11)?),
        placed_at: opt_text(r, at + 12)?,
    }))
}

async fn read_order(client: &mut Client, order_id: &str) -> Result<Option<OrderRecord>, SqlError> {
    let row = client
        .query(sql::SELECT_ORDER, &[&order_id])
        .await?
        .into_row()
        .await?;
    row.map(|r| order_record(&r, 0))
        .transpose()
        .map(Option::flatten)
}

/// `reject` in one round trip ([`sql::REJECT`]).
async fn store_rejection(client: &mut Client, r: &Rejection) -> Result<(), SqlError> {
    let hash = r.event_hash();
    client
        .execute(
            sql::REJECT,
            &[
                &hash.as_str(),
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

async fn identity_on(client: &mut Client) -> Result<String, SqlError> {
    let row = client
        .simple_query(sql::SELECT_IDENTITY)
        .await?
        .into_row()
        .await?
        .ok_or_else(|| conversion("StoreIdentity has no row".into()))?;
    identity_of(&row)
}

/// The store's identity from a row of [`sql::SELECT_IDENTITY`]'s columns
/// (also the second result set of [`sql::SCHEMA_STATE`]).
fn identity_of(row: &Row) -> Result<String, SqlError> {
    let stored = text(row, 0, "Id")?;
    let server = opt_text(row, 1)?.unwrap_or_default();
    let database = opt_text(row, 2)?.unwrap_or_default();
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
    row.map(|r| position_units(&r, 0, "Units")).transpose()
}

/// A position column in units of 10^-10 (`Units DECIMAL(38,0)`), exactly:
/// read as tiberius' `Numeric` (its conversion to `Decimal` would lose
/// digits past 28).
fn position_units(row: &Row, idx: usize, name: &str) -> Result<Position, SqlError> {
    let n = row
        .try_get::<Numeric, _>(idx)?
        .ok_or_else(|| conversion(format!("{name} is NULL")))?;
    (n.scale() == 0)
        .then(|| Position::from_units(n.value()))
        .flatten()
        .ok_or_else(|| {
            conversion(format!(
                "{name} {n} is not a position in units (DECIMAL(38,0))"
            ))
        })
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

    /// Twice the pool: each event holds a connection only for its store
    /// calls, and spends the rest on the guard.
    fn parallelism(&self) -> usize {
        self.pool_size as usize * 2
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        // A start's bound: waiting for another process's migration counts.
        self.migrate_within(
            self.query_timeout * 3,
            "run `order-guard migrate` as the database admin (its bound is \
             SQL_MIGRATE_TIMEOUT_SECONDS; a start's is 3 × SQL_QUERY_TIMEOUT_SECONDS)",
            rights::AppRights::Required,
        )
        .await
    }

    async fn upgrade(&self) -> Result<(), StoreError> {
        self.migrate_within(
            self.migrate_timeout,
            "run `order-guard migrate` again, or raise SQL_MIGRATE_TIMEOUT_SECONDS",
            rights::AppRights::Said,
        )
        .await?;
        // The operator's read-only role, on an existing schema too.
        self.with_client("make the reader role", self.query_timeout, |call| {
            Box::pin(migrate::make_reader_role(call.client))
        })
        .await
    }

    async fn check_for_reading(&self) -> Result<(), StoreError> {
        self.migrate_within(
            self.query_timeout * 3,
            "run `order-guard migrate` as the database admin",
            rights::AppRights::NotNeeded,
        )
        .await
    }

    async fn identity(&self) -> Result<String, StoreError> {
        self.schema_gate("read identity")?;
        if let Some(identity) = self.identity.get() {
            return Ok(identity.clone());
        }
        let identity = self
            .with_client("read identity", self.query_timeout, |call| {
                Box::pin(identity_on(call.client))
            })
            .await?;
        Ok(self.identity.get_or_init(|| identity).clone())
    }

    async fn execute(
        &self,
        order: &Order,
        event_id: &str,
        raw_event: &str,
    ) -> Result<Execution, StoreError> {
        self.schema_gate("execute")?;
        self.with_client("execute", self.query_timeout, |call| {
            Box::pin(execute::execute_on(call.client, order, event_id, raw_event))
        })
        .await
    }

    async fn reject(&self, rejection: &Rejection) -> Result<(), StoreError> {
        self.schema_gate("reject")?;
        self.with_client("reject", self.query_timeout, |call| {
            Box::pin(store_rejection(call.client, rejection))
        })
        .await
    }

    async fn order(&self, order_id: &str) -> Result<Option<OrderRecord>, StoreError> {
        self.schema_gate("read order")?;
        self.with_client("read order", self.query_timeout, |call| {
            Box::pin(read_order(call.client, order_id))
        })
        .await
    }

    async fn position(
        &self,
        account_id: &str,
        symbol: &str,
    ) -> Result<Option<Position>, StoreError> {
        self.schema_gate("read position")?;
        self.with_client("read position", self.query_timeout, |call| {
            Box::pin(position_on(call.client, account_id, symbol))
        })
        .await
    }

    async fn rejections(&self, order_id: Option<&str>) -> Result<Vec<RejectedRecord>, StoreError> {
        self.schema_gate("read rejections")?;
        self.with_client("read rejections", self.query_timeout, |call| {
            Box::pin(rejections_on(call.client, order_id))
        })
        .await
    }

    async fn claim_announcements(&self, limit: u32, lease: Duration) -> Result<Claim, StoreError> {
        self.schema_gate("claim announcements")?;
        let token = uuid::Uuid::new_v4().to_string();
        let rows = self
            .with_client("claim announcements", self.query_timeout, |call| {
                Box::pin(outbox::claim(call.client, &token, limit, lease))
            })
            .await?;
        Ok(Claim { token, rows })
    }

    async fn mark_announced(&self, sent: &[Announcement]) -> Result<u64, StoreError> {
        self.schema_gate("mark announcements")?;
        self.with_client("mark announcements", self.query_timeout, |call| {
            Box::pin(outbox::mark(call.client, sent))
        })
        .await
    }

    async fn defer_announcement(
        &self,
        token: Option<&str>,
        deferral: &Deferral,
    ) -> Result<(), StoreError> {
        self.schema_gate("defer an announcement")?;
        // This store hands nothing over (`hand_over_announcements` is
        // `None`): its rows are sent only by claims, each under a token.
        let Some(token) = token else {
            return Err(StoreError::Permanent(format!(
                "announcement {}: SQL Server's rows are never born leased; a deferral names its claim's token",
                deferral.message_id
            )));
        };
        self.with_client("defer an announcement", self.query_timeout, |call| {
            Box::pin(outbox::defer(call.client, token, deferral))
        })
        .await
    }

    async fn purge_announced(
        &self,
        retention: Duration,
        limit: u32,
        expired: super::Expired,
    ) -> Result<u64, StoreError> {
        self.schema_gate("purge announcements")?;
        self.with_client("purge announcements", self.query_timeout, |call| {
            Box::pin(outbox::purge(call.client, retention, limit, expired))
        })
        .await
    }

    async fn announcements(
        &self,
        listing: &Listing,
        limit: u32,
    ) -> Result<Vec<Announcement>, StoreError> {
        self.schema_gate("list announcements")?;
        self.with_client("list announcements", self.query_timeout, |call| {
            Box::pin(outbox::list(call.client, listing, limit))
        })
        .await
    }

    async fn outbox_counts(&self) -> Result<OutboxCounts, StoreError> {
        self.schema_gate("count announcements")?;
        self.with_client("count announcements", self.query_timeout, |call| {
            Box::pin(outbox::counts(call.client))
        })
        .await
    }

    async fn retry_announcements(&self, message_id: Option<&str>) -> Result<u64, StoreError> {
        self.schema_gate("retry announcements")?;
        self.with_client("retry announcements", self.query_timeout, |call| {
            Box::pin(outbox::retry(call.client, message_id))
        })
        .await
    }

    async fn resend_announcements(&self, which: &Resend) -> Result<u64, StoreError> {
        self.schema_gate("resend announcements")?;
        self.with_client("resend announcements", self.query_timeout, |call| {
            Box::pin(outbox::resend(call.client, which))
        })
        .await
    }

    async fn backfill_announcements(
        &self,
        within: Duration,
        write: bool,
    ) -> Result<u64, StoreError> {
        self.schema_gate("backfill announcements")?;
        // An operator's scan of the orders and a write a row: longer than
        // an execution's bound.
        let bound = self.query_timeout.max(Duration::from_secs(300));
        self.with_client("backfill announcements", bound, |call| {
            Box::pin(outbox::backfill(call.client, within, write))
        })
        .await
    }

    fn load(&self) -> super::StoreLoad {
        let state = self.pool.state();
        let (logins_running, logins_waiting) = self.logins.now();
        super::StoreLoad {
            pool: Some(super::PoolLoad {
                open: u64::from(state.connections),
                idle: u64::from(state.idle_connections),
                pending: state.statistics.pending_gets(),
                timeouts: state.statistics.get_timed_out,
                logins_running,
                logins_waiting,
            }),
            writer: None,
        }
    }
}
