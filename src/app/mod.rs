//! Wiring: build the guard, store and processor from [`Config`], and the
//! commands the binary runs (`serve`, `migrate`, `replay`, `status`).

mod outbox;

pub use self::outbox::{
    outbox_backfill, outbox_dispatch, outbox_list, outbox_resend, outbox_retry, BackfillRun,
    DispatchRun,
};

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use serde::Serialize;
use serde_json::Value;

use crate::config::{Config, GuardConfig, RedisAuth, StoreConfig};
use crate::entra::{TokenSource, REDIS_SCOPE};
use crate::guard::{EntraCredentials, IdempotencyGuard, MemoryGuard, RedisGuard, Topology};
use crate::processor::{Outcome, OutcomeKind, Processor};
use crate::store::{OrderStore, SqlServerStore, SqliteStore};
use crate::telemetry::Telemetry;

/// Log each record on the stream that gives it its severity on the
/// Functions host (`crate::logging`): warnings and errors on stderr, the
/// rest on stdout. `RUST_LOG` sets the filter (default `info`).
pub fn init_logging() {
    crate::logging::init();
}

/// How long one Entra ID token request for Redis may take (per link of the
/// credential chain): an identity endpoint is slower than a Redis call.
const ENTRA_TOKEN_TIMEOUT: Duration = Duration::from_secs(10);

/// The guard the configuration asks for.
pub fn build_guard(config: &Config) -> anyhow::Result<Arc<dyn IdempotencyGuard>> {
    crate::tls::install_crypto_provider();
    Ok(match &config.guard {
        GuardConfig::Memory => Arc::new(MemoryGuard::bounded(
            config.guard_settings.clone(),
            config.memory_guard_max_completed,
        )),
        GuardConfig::Redis { url, cluster, auth } => {
            let entra = match auth {
                RedisAuth::AccessKey => None,
                RedisAuth::EntraId { client_id } => Some(EntraCredentials::start(
                    TokenSource::default_chain(client_id.clone(), REDIS_SCOPE, ENTRA_TOKEN_TIMEOUT)
                        .context("REDIS_AUTH")?,
                )),
            };
            let topology = if *cluster {
                Topology::Cluster
            } else {
                Topology::Single
            };
            Arc::new(
                RedisGuard::connect(
                    url,
                    topology,
                    entra,
                    config.guard_settings.clone(),
                    config.redis_timeout,
                )
                .context("REDIS_URL")?,
            )
        }
    })
}

/// The guard the configuration asks for, checked against what the backend
/// is: a Redis cluster reached without `REDIS_CLUSTER=true` (or the reverse)
/// stops the start with the setting to change, rather than running with a
/// guard that never works. An unreachable Redis does not stop it.
pub async fn build_checked_guard(config: &Config) -> anyhow::Result<Arc<dyn IdempotencyGuard>> {
    let guard = build_guard(config)?;
    guard.preflight().await.context("REDIS_CLUSTER")?;
    Ok(guard)
}

/// Whether a command may create a SQLite file that is not there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NewFile {
    /// Commands that execute orders: as `SQL_CONNECTION_STRING` says (the
    /// local default, or `?mode=rwc`).
    AsConfigured,
    /// `migrate`: creating the schema is its job.
    Created,
    /// Commands that read or tidy: a missing file is their answer.
    Refused,
}

/// The store the configuration asks for (not migrated).
pub async fn build_store(
    config: &Config,
    new_file: NewFile,
) -> anyhow::Result<Arc<dyn OrderStore>> {
    Ok(match &config.store {
        // Opening reads the journal mode, which another process's lock can
        // refuse past the busy timeout: waited out like the schema check.
        StoreConfig::Sqlite {
            path,
            create_if_missing,
        } => {
            let create = match new_file {
                NewFile::AsConfigured => *create_if_missing,
                NewFile::Created => true,
                NewFile::Refused => false,
            };
            let opened = patiently("sqlite", || async {
                if create {
                    SqliteStore::open(path, config.sqlite_busy_timeout)
                } else {
                    SqliteStore::open_existing(path, config.sqlite_busy_timeout)
                }
            })
            .await;
            match opened {
                Ok(store) => Arc::new(store),
                Err(e) if !create && !path.exists() => {
                    let p = path.display();
                    let fix = if new_file == NewFile::Refused {
                        "this command never creates one: check SQL_CONNECTION_STRING (a relative path is read from the directory it runs in)".to_string()
                    } else {
                        format!("on a first start create it with `order-guard migrate` (same settings) or SQL_CONNECTION_STRING=sqlite:{p}?mode=rwc; if it should be there, its volume may not be mounted yet, and a new, empty database would execute every order again")
                    };
                    anyhow::bail!("SQL_CONNECTION_STRING: {e}; {fix}")
                }
                Err(e) => return Err(e.into()),
            }
        }
        StoreConfig::SqlServer { connection_string } => Arc::new(SqlServerStore::connect(
            connection_string,
            &config.sqlserver,
        )?),
    })
}

/// A short description of where state lives, for logs (no secrets).
pub fn describe(config: &Config) -> String {
    let guard = match &config.guard {
        GuardConfig::Memory => "memory".to_string(),
        GuardConfig::Redis {
            url,
            cluster: false,
            auth,
        } => format!("redis ({}{})", redact_url(url), auth_note(auth)),
        GuardConfig::Redis {
            url,
            cluster: true,
            auth,
        } => format!("redis cluster ({}{})", redact_url(url), auth_note(auth)),
    };
    let store = match &config.store {
        StoreConfig::Sqlite { path, .. } => format!("sqlite ({})", path.display()),
        StoreConfig::SqlServer { .. } => "sqlserver".to_string(),
    };
    format!("guard={guard} store={store}")
}

fn auth_note(auth: &RedisAuth) -> &'static str {
    match auth {
        RedisAuth::AccessKey => "",
        RedisAuth::EntraId { .. } => ", Entra ID",
    }
}

/// `scheme://host:port` of a Redis URL, without credentials.
fn redact_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
            format!("{scheme}://{host}")
        }
        None => "?".into(),
    }
}

/// Guard + store + processor, with the store's schema created or checked
/// first (idempotent and serialized across processes on both stores), so a
/// fresh database just works. A SQL Server that cannot be migrated at start
/// does not stop the handler: the migration goes on in the background and
/// invocations answer `retry` (Event Grid keeps the events) until it is done.
/// But a database user that lacks a right stops the start, naming each
/// right and the fix (`StoreError::Misconfigured`): answering `retry` for
/// every order would fix nothing.
pub async fn build_processor(config: &Config) -> anyhow::Result<Arc<Processor>> {
    build_processor_with(config, None).await
}

/// How a start treats a store it cannot use yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// `serve`: listen anyway, migrating in the background, while a retry
    /// may fix it (a store not reachable yet, a schema the admin has still
    /// to migrate); stop when only an operator can (a right missing).
    Serve,
    /// `replay`, the dead-letter sweep's CLI: stop at once when only an
    /// operator can fix it (a right or the schema missing).
    Command,
}

/// The exporters `config.telemetry` asks for (`None`: nothing exported).
pub fn start_telemetry(config: &Config) -> anyhow::Result<Option<Telemetry>> {
    Ok(Telemetry::start(&config.telemetry)?)
}

/// [`build_processor`], reporting to `telemetry` (its events and the
/// processor's load) when there is one.
pub async fn build_processor_with(
    config: &Config,
    telemetry: Option<&Telemetry>,
) -> anyhow::Result<Arc<Processor>> {
    // The background migration, if any, goes on detached.
    Ok(build_processor_as(config, telemetry, Start::Serve)
        .await?
        .processor)
}

/// [`build_processor_with`] for a command (`replay`, `dead-letters
/// replay`): no background migration; a store not ready is waited out for
/// a bounded time, and one only an operator can fix (a right missing, the
/// schema older than this build) stops it at once, with the fix, instead of
/// retrying every delivery.
pub async fn build_command_processor(
    config: &Config,
    telemetry: Option<&Telemetry>,
) -> anyhow::Result<Arc<Processor>> {
    Ok(build_processor_as(config, telemetry, Start::Command)
        .await?
        .processor)
}

/// A background migration that ends only when it gives up: with the
/// failure no retry can fix (`serve` then stops, saying it).
type GiveUp = tokio::task::JoinHandle<crate::store::StoreError>;

/// What `build_processor_as` makes: the processor, the background
/// migration (if the first failed), and the outbox's dispatcher (`serve`
/// with a destination).
struct Built {
    processor: Arc<Processor>,
    background: Option<GiveUp>,
    dispatcher: Option<Arc<crate::outbox::Dispatcher>>,
}

async fn build_processor_as(
    config: &Config,
    telemetry: Option<&Telemetry>,
    start: Start,
) -> anyhow::Result<Built> {
    let guard = build_checked_guard(config).await?;
    let store = build_store(config, NewFile::AsConfigured).await?;
    let mut background = None;
    match (&config.store, start) {
        // SQLite waits out a briefly locked file, then must succeed; so
        // must any store for a command.
        (StoreConfig::Sqlite { .. }, _) | (_, Start::Command) => migrate_at_start(store.as_ref())
            .await
            .with_context(|| format!("checking the {} schema", store.name()))?,
        // SQL Server may be paused or failing over: give it a bounded first
        // try (the host allows 30 s to start), then keep trying in the
        // background. Until it succeeds, invocations answer `retry`.
        (StoreConfig::SqlServer { .. }, Start::Serve) => {
            // The check runs in a task of its own: when the start stops
            // waiting for it, it goes on (within its own bound) instead of
            // being abandoned half-way and begun again on a new session.
            let mut first = tokio::spawn({
                let store = Arc::clone(&store);
                async move { store.migrate().await }
            });
            match tokio::time::timeout(SQLSERVER_MIGRATE_AT_START, &mut first).await {
                Ok(checked) => match checked.unwrap_or_else(|e| Err(check_task_failed(&e))) {
                    Ok(()) => {}
                    Err(e) if refuses_start(&e, start) => {
                        return Err(e).context("the SQL Server store cannot be used");
                    }
                    Err(e) => {
                        background = Some(migrate_in_background(
                            Arc::clone(&store),
                            e.to_string(),
                            None,
                        ))
                    }
                },
                Err(_) => {
                    background = Some(migrate_in_background(
                        Arc::clone(&store),
                        format!(
                            "no answer within {} s; the check goes on",
                            SQLSERVER_MIGRATE_AT_START.as_secs()
                        ),
                        Some(first),
                    ))
                }
            }
        }
    }
    // `serve` announces what it executes; a command's executions are sent
    // by the dispatchers of the instances that serve.
    let dispatcher = match start {
        Start::Serve => outbox::start_dispatcher(config, &store)?,
        Start::Command => None,
    };
    let processor = Arc::new(
        Processor::new(guard, store, config.processor.clone())
            .with_telemetry(telemetry.map(Telemetry::events))
            .with_announcer(dispatcher.as_ref().map(|d| d.announcer())),
    );
    if let Some(t) = telemetry {
        t.observe(Arc::clone(&processor) as Arc<dyn crate::telemetry::LoadSource>);
    }
    Ok(Built {
        processor,
        background,
        dispatcher,
    })
}

/// Whether a store failure at start stops it: a missing right always (no
/// retry fixes it, and `serve` would answer `retry` for every order); a
/// schema older than this build only a command (a running `serve` goes on
/// answering `retry`, with the fix in its log, and picks up the admin's
/// `migrate` by itself).
fn refuses_start(e: &crate::store::StoreError, start: Start) -> bool {
    use crate::store::StoreError::{Misconfigured, Unmigrated};
    match e {
        Misconfigured(_) => true,
        Unmigrated(_) => start == Start::Command,
        _ => false,
    }
}

/// How long a start waits out a database that is briefly busy or locked
/// (another process's transaction, a failover) before giving up: well inside
/// the host's 30 s start limit, so one start does not become a failed start
/// (the host shuts down after 3 of those).
const MIGRATE_AT_START_PATIENCE: Duration = Duration::from_secs(20);

/// How long `serve` waits for the SQL Server schema before it listens anyway:
/// short, since nothing is executed or stored before the schema is verified
/// (the store's gate answers `retry`), and a handler that is not listening
/// fails every delivery sent to it meanwhile.
const SQLSERVER_MIGRATE_AT_START: Duration = Duration::from_secs(3);

/// Keep migrating until it succeeds, logging each miss (its message says
/// the fix: the admin's `migrate`, a right to grant); give up only on a
/// failure a start refuses (a right missing), which the returned task then
/// answers. Paced as the pool's logins are (`pool::reconnect_pause`: 250 ms,
/// 500 ms, then every second): every order waits on the gate, so a database
/// that comes back must be found within a second, and an attempt costs one
/// connection's worth of work (the pool's own logins are paced apart).
///
/// `in_flight`: the start's own check, still running, is awaited first (on
/// this engine and under load a new session's first statements take the
/// longest: begun again from zero after each timeout, a check may never
/// finish).
fn migrate_in_background(
    store: Arc<dyn OrderStore>,
    first_error: String,
    in_flight: Option<tokio::task::JoinHandle<Result<(), crate::store::StoreError>>>,
) -> GiveUp {
    use crate::store::sqlserver::pool::reconnect_pause;
    log::error!(
        "{} schema not checked at start ({first_error}); retrying in the background, and invocations answer `retry` until it succeeds",
        store.name()
    );
    tokio::spawn(async move {
        let mut failures = 0;
        let mut in_flight = in_flight;
        loop {
            let checked = match in_flight.take() {
                Some(first) => first.await.unwrap_or_else(|e| Err(check_task_failed(&e))),
                None => {
                    tokio::time::sleep(reconnect_pause(failures)).await;
                    store.migrate().await
                }
            };
            match checked {
                Ok(()) => {
                    log::info!("{} schema is up to date", store.name());
                    return std::future::pending().await;
                }
                Err(e) if refuses_start(&e, Start::Serve) => return e,
                Err(e) => log::error!(
                    "{} schema still not checked ({e}); next try in {} ms",
                    store.name(),
                    reconnect_pause(failures + 1).as_millis()
                ),
            }
            failures = failures.saturating_add(1);
        }
    })
}

/// A schema check whose task panicked or was cancelled: tried again.
fn check_task_failed(e: &tokio::task::JoinError) -> crate::store::StoreError {
    crate::store::StoreError::Transient(format!("the schema check stopped: {e}"))
}

/// `migrate`, retrying transient failures with back-off for a bounded time.
async fn migrate_at_start(store: &dyn OrderStore) -> Result<(), crate::store::StoreError> {
    patiently(store.name(), || store.migrate()).await
}

/// `attempt` again while it fails transiently (a locked file), pausing 100 ms
/// doubling to 2 s, within [`MIGRATE_AT_START_PATIENCE`].
async fn patiently<T, F, Fut>(store: &str, mut attempt: F) -> Result<T, crate::store::StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, crate::store::StoreError>>,
{
    let started = std::time::Instant::now();
    let mut pause = Duration::from_millis(100);
    loop {
        match attempt().await {
            Err(crate::store::StoreError::Transient(e))
                if started.elapsed() + pause < MIGRATE_AT_START_PATIENCE =>
            {
                log::warn!(
                    "{store} store not ready yet ({e}); retrying in {} ms",
                    pause.as_millis()
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            other => return other,
        }
    }
}

/// `serve`: listen on 127.0.0.1:$FUNCTIONS_CUSTOMHANDLER_PORT until SIGTERM/SIGINT.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    let telemetry = start_telemetry(&config)?;
    let Built {
        processor,
        background,
        dispatcher,
    } = build_processor_as(&config, telemetry.as_ref(), Start::Serve).await?;
    // A background migration that gives up (a right missing, found after
    // the first try) stops the handler like a signal, then fails the start.
    let gave_up = Arc::new(std::sync::OnceLock::<String>::new());
    let stop = {
        let gave_up = Arc::clone(&gave_up);
        async move {
            let given_up = async {
                match background {
                    Some(task) => match task.await {
                        Ok(e) => e.to_string(),
                        Err(e) => format!("the background migration failed: {e}"),
                    },
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown_signal() => {}
                e = given_up => {
                    log::error!("stopping: {e}");
                    let _ = gave_up.set(e);
                }
            }
        }
    };
    let container = match &config.dead_letter {
        Some(_) => Some(dead_letter_container(&config)?),
        None => None,
    };
    let sweep = Arc::new(
        crate::deadletter::function::SweepFunction::new(Arc::clone(&processor), container)
            .with_outbox(dispatcher),
    );
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, config.port));
    let (bound, server) = crate::host::bind_with(
        processor,
        sweep,
        addr,
        config.limits,
        stop,
        config.shutdown_grace,
    )?;
    log::info!(
        "order-guard listening on http://{bound} ({})",
        describe(&config)
    );
    server.await;
    if let Some(t) = telemetry {
        t.shutdown().await;
    }
    match gave_up.get() {
        Some(e) => Err(anyhow::anyhow!("{e}")).context("the SQL Server store cannot be used"),
        None => Ok(()),
    }
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                log::error!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => log::info!("SIGINT received"),
        () = term => log::info!("SIGTERM received"),
    }
}

/// What `replay` did, by final outcome.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct ReplaySummary {
    pub deliveries: u64,
    pub events: u64,
    pub executed: u64,
    pub duplicates: u64,
    pub conflicts: u64,
    pub rejected: u64,
    /// Deliveries that still needed a retry after every redelivery.
    pub unresolved: u64,
    /// Redeliveries made because an answer was `in_progress` or `retry`.
    pub retries: u64,
    /// Why the replay stopped early: a store failure no retry can fix (a
    /// right or the schema missing; `Processor::operator_needed`). The
    /// deliveries it left are counted `unresolved`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

impl std::fmt::Display for ReplaySummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "deliveries={} events={} executed={} duplicates={} conflicts={} rejected={} retries={} unresolved={}",
            self.deliveries,
            self.events,
            self.executed,
            self.duplicates,
            self.conflicts,
            self.rejected,
            self.retries,
            self.unresolved
        )
    }
}

/// How often `replay` redelivers a delivery whose answer asked for a retry.
const REPLAY_MAX_ATTEMPTS: u32 = 40;

/// Read a replay file: a JSON array of deliveries (each an event object, a
/// string holding one, or an array of them), or a single delivery.
pub fn read_replay_file(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read replay file {}", path.display()))?;
    let value: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    Ok(match value {
        Value::Array(items) => items,
        other => vec![other],
    })
}

/// Push deliveries through the processor as Event Grid would: up to
/// `concurrency` at once, redelivering (with a short back-off) any delivery
/// answered `in_progress` or `retry`, all-or-none. Stops at the first store
/// failure no retry can fix (`Processor::operator_needed`): no delivery is
/// started or redelivered after it, and those left count as unresolved.
pub async fn replay(
    processor: &Processor,
    deliveries: Vec<Value>,
    concurrency: usize,
) -> ReplaySummary {
    // A delivery's outcomes (`None`: not started, the replay having
    // stopped) and its redeliveries.
    let results: Vec<(Option<Vec<Outcome>>, u64)> = futures::stream::iter(deliveries)
        .map(|delivery| async move {
            let mut redeliveries = 0;
            loop {
                if processor.operator_needed().is_some() {
                    return (None, redeliveries);
                }
                let result = processor.process_trigger(delivery.clone()).await;
                if !result.needs_redelivery()
                    || redeliveries + 1 >= u64::from(REPLAY_MAX_ATTEMPTS)
                    || processor.operator_needed().is_some()
                {
                    return (Some(result.outcomes), redeliveries);
                }
                redeliveries += 1;
                let backoff = Duration::from_millis(10 * redeliveries.min(20));
                tokio::time::sleep(backoff).await;
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let mut summary = ReplaySummary::default();
    for (outcomes, redeliveries) in results {
        summary.deliveries += 1;
        summary.retries += redeliveries;
        // Not started counts as unresolved, like one that kept failing.
        let Some(outcomes) = outcomes else {
            summary.unresolved += 1;
            continue;
        };
        if outcomes.iter().any(|o| o.outcome.needs_redelivery()) {
            summary.unresolved += 1;
        }
        for o in outcomes {
            summary.events += 1;
            match o.outcome {
                OutcomeKind::Executed => summary.executed += 1,
                OutcomeKind::Duplicate => summary.duplicates += 1,
                OutcomeKind::Conflict => summary.conflicts += 1,
                OutcomeKind::Rejected => summary.rejected += 1,
                OutcomeKind::InProgress | OutcomeKind::Retry => {}
            }
        }
    }
    summary.stopped = processor.operator_needed();
    summary
}

/// Guard and store for an operator command, the store's schema verified
/// first (idempotent): the store answers nothing before that.
async fn open_checked(
    config: &Config,
) -> anyhow::Result<(Arc<dyn IdempotencyGuard>, Arc<dyn OrderStore>)> {
    let guard = build_checked_guard(config).await?;
    let store = build_store(config, NewFile::Refused).await?;
    store
        .migrate()
        .await
        .with_context(|| format!("checking the {} schema", store.name()))?;
    Ok((guard, store))
}

/// [`open_checked`] for a command that only reads (`status`, `outbox
/// list`): the schema current, no right to write asked for.
async fn open_for_reading(
    config: &Config,
) -> anyhow::Result<(Arc<dyn IdempotencyGuard>, Arc<dyn OrderStore>)> {
    let guard = build_checked_guard(config).await?;
    let store = build_store(config, NewFile::Refused).await?;
    store
        .check_for_reading()
        .await
        .with_context(|| format!("checking the {} schema", store.name()))?;
    Ok((guard, store))
}

/// `status ORDER_ID`: the guard key beside the store's row, as text.
pub async fn status(config: &Config, order_id: &str) -> anyhow::Result<Status> {
    use std::fmt::Write;
    // As the processor keeps ids: without surrounding white space.
    let order_id = order_id.trim();
    let (guard, store) = open_for_reading(config).await?;
    let mut out = String::new();
    let key = config.guard_settings.key(order_id);
    match (&config.guard, guard.inspect(order_id).await) {
        (GuardConfig::Memory, _) => writeln!(
            out,
            "guard   memory guard: state lives only inside a running `serve` process"
        )?,
        (_, Ok(entry)) => match entry.value {
            Some(v) => writeln!(
                out,
                "guard   {key} = {v} (ttl {} s){}",
                entry.ttl_seconds.unwrap_or(-1),
                entry
                    .fingerprint
                    .map(|f| format!(" fingerprint {f}"))
                    .unwrap_or_default()
            )?,
            None => writeln!(
                out,
                "guard   {key}: no key (never seen, expired, or released)"
            )?,
        },
        (_, Err(e)) => writeln!(out, "guard   {key}: {e}")?,
    }
    let mut known = match store.order(order_id).await? {
        Some(o) => {
            writeln!(
                out,
                "order   {} {} {} {} {} for {} (fingerprint {}, attempts {}, received {}{})",
                o.order_id,
                o.status.as_str(),
                o.side,
                o.quantity,
                o.symbol,
                o.account_id,
                o.fingerprint,
                o.attempts,
                o.received_at,
                o.executed_at
                    .map(|t| format!(", executed {t}"))
                    .unwrap_or_default()
            )?;
            let pos = store.position(&o.account_id, &o.symbol).await?;
            writeln!(
                out,
                "position {} {} = {}",
                o.account_id,
                o.symbol,
                pos.map(|p| p.to_string()).unwrap_or_else(|| "none".into())
            )?;
            true
        }
        None => {
            writeln!(out, "order   {order_id}: no row in {}", store.name())?;
            false
        }
    };
    for r in store.rejections(Some(order_id)).await? {
        known = true;
        writeln!(
            out,
            "rejected {} ({} deliveries): {}",
            r.kind, r.deliveries, r.reason
        )?;
    }
    let listing = crate::store::Listing::Order(order_id.to_string());
    for a in store.announcements(&listing, 1).await? {
        writeln!(
            out,
            "announced {} {}",
            a.message_id,
            match (&a.dispatched_at, a.parked) {
                (Some(t), _) => format!("dispatched {t}"),
                (None, true) => format!(
                    "parked after {} attempts: {} (`order-guard outbox retry {}`)",
                    a.attempts,
                    a.last_error
                        .as_deref()
                        .map(crate::text::escaped)
                        .unwrap_or_default(),
                    a.message_id
                ),
                (None, false) => format!(
                    "waiting ({} attempts so far; destination {})",
                    a.attempts,
                    outbox::destination(config)
                ),
            }
        )?;
    }
    Ok(Status { text: out, known })
}

/// What `status ORDER_ID` shows, and whether the store knows the order at
/// all (a row, or a rejected event naming it): an id it has never seen
/// makes the command fail, so a script that checks an order notices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub text: String,
    pub known: bool,
}

/// What `prune-guard` found and did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PruneSummary {
    /// `COMPLETADA` keys seen.
    pub completed: u64,
    /// Of those, marked by this store (its identity).
    pub ours: u64,
    /// Of ours, whose order has no row here: removed (or, dry run, listed).
    pub orphaned: Vec<String>,
    /// Whether they were removed.
    pub removed: bool,
}

impl std::fmt::Display for PruneSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for id in &self.orphaned {
            writeln!(
                f,
                "{} {id}",
                if self.removed {
                    "removed"
                } else {
                    "would remove"
                }
            )?;
        }
        write!(
            f,
            "completed={} ours={} without_row={} removed={}",
            self.completed,
            self.ours,
            self.orphaned.len(),
            if self.removed { self.orphaned.len() } else { 0 }
        )
    }
}

/// `prune-guard`: remove this store's `COMPLETADA` keys whose order has no
/// row in the store. After a database is restored to an earlier point, the
/// cache still says the orders of the lost interval are done, and their
/// redeliveries would be answered `duplicate` without ever executing.
/// Markers of other databases sharing the cache, and unbound ones, are left
/// alone (the processor already asks the store about those).
pub async fn prune_guard(config: &Config, dry_run: bool) -> anyhow::Result<PruneSummary> {
    let (guard, store) = open_checked(config).await?;
    let identity = store.identity().await?;
    let prefix = format!("{identity}/");
    let mut summary = PruneSummary {
        removed: !dry_run,
        ..PruneSummary::default()
    };
    for (order_id, marker) in guard.completed_orders().await? {
        summary.completed += 1;
        if !marker.as_deref().is_some_and(|m| m.starts_with(&prefix)) {
            continue;
        }
        summary.ours += 1;
        if store.order(&order_id).await?.is_some() {
            continue;
        }
        if !dry_run && !guard.forget_completed(&order_id, marker.as_deref()).await? {
            continue; // changed meanwhile: completed again, leave it
        }
        summary.orphaned.push(order_id);
    }
    Ok(summary)
}

/// Whether an operator command that takes events out of production (the
/// dead-letter container) may run on the state of `config` (pure): not on
/// an embedded default by accident, where the orders would execute in a
/// local file while the blobs are moved away from production for good.
pub fn refuse_embedded_state(
    command: &str,
    defaulted: &[&str],
    allowed: bool,
) -> anyhow::Result<()> {
    if defaulted.is_empty() || allowed {
        return Ok(());
    }
    anyhow::bail!(
        "{command}: {} not set, so this would run on the embedded defaults (an in-memory guard, the SQLite file {}) and the dead letters' orders would execute there, not in production, while their blobs leave the container; set {} as the app has them (README, Operate), or pass --allow-embedded-state to replay into the embedded state on purpose. Nothing was read or moved",
        defaulted.join(" and "),
        crate::config::DEFAULT_SQLITE_PATH,
        if defaulted.len() > 1 { "them" } else { "it" },
    )
}

/// The dead-letter container of the configuration, or what to set.
pub fn dead_letter_container(config: &Config) -> anyhow::Result<crate::deadletter::Container> {
    let settings = config.dead_letter.as_ref().ok_or_else(|| {
        anyhow::anyhow!("DEAD_LETTER_STORAGE is not set: give the dead-letter storage account's connection string or the container's URL (and DEAD_LETTER_CONTAINER, default {})", crate::config::DEFAULT_DEAD_LETTER_CONTAINER)
    })?;
    Ok(crate::deadletter::Container::open(settings)?)
}

/// `dead-letters replay`: every dead-lettered event through the processor;
/// finished blobs moved under `replayed/`, unreadable ones under `unreadable/`.
pub async fn dead_letters_replay(
    config: &Config,
    options: &crate::deadletter::SweepOptions,
    allow_embedded_state: bool,
) -> anyhow::Result<crate::deadletter::SweepSummary> {
    refuse_embedded_state(
        "dead-letters replay",
        &config.defaulted_state,
        allow_embedded_state,
    )?;
    let container = dead_letter_container(config)?;
    let telemetry = start_telemetry(config)?;
    let processor = build_command_processor(config, telemetry.as_ref()).await?;
    println!(
        "replaying dead letters from {} ({})",
        container.describe(),
        describe(config)
    );
    let progress = crate::deadletter::progress::for_stderr();
    let swept = crate::deadletter::sweep(&processor, &container, options, progress.as_ref()).await;
    if let Some(t) = telemetry {
        t.shutdown().await;
    }
    Ok(swept?)
}

/// `dead-letters list`: counts by reason and by the outcome a replay would
/// get (from the store's rows), oldest and newest; changes nothing.
pub async fn dead_letters_list(
    config: &Config,
    options: &crate::deadletter::SweepOptions,
    allow_embedded_state: bool,
) -> anyhow::Result<crate::deadletter::ListSummary> {
    // The outcomes it shows are read from the store: from a local file they
    // would say every order is still to execute.
    refuse_embedded_state(
        "dead-letters list",
        &config.defaulted_state,
        allow_embedded_state,
    )?;
    let container = dead_letter_container(config)?;
    let store = build_store(config, NewFile::Refused).await?;
    store
        .migrate()
        .await
        .with_context(|| format!("checking the {} schema", store.name()))?;
    println!(
        "dead letters in {} ({})",
        container.describe(),
        describe(config)
    );
    Ok(crate::deadletter::list(&container, store.as_ref(), &config.processor, options).await?)
}
