//! Building the parts from [`Config`]: the guard, the store (its schema
//! checked or migrated as the command needs), the processor with its
//! telemetry and dispatcher, and the guard and store of an operator
//! command.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use super::outbox;
use crate::config::{Config, GuardConfig, RedisAuth, StoreConfig};
use crate::entra::{TokenSource, REDIS_SCOPE};
use crate::guard::{EntraCredentials, IdempotencyGuard, MemoryGuard, RedisGuard, Topology};
use crate::processor::Processor;
use crate::store::{OrderStore, SqlServerStore, SqliteStore};
use crate::telemetry::{IngestionTokens, Telemetry, MONITOR_SCOPE};

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
pub(super) enum Start {
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
    Ok(Telemetry::start(
        &config.telemetry,
        ingestion_tokens(config)?,
    )?)
}

/// Application Insights' upload tokens, when its authentication string asks
/// for Entra ID: the managed identity it names, as the Functions host signs
/// in with.
pub fn ingestion_tokens(config: &Config) -> anyhow::Result<Option<Arc<dyn IngestionTokens>>> {
    let sign_in = config
        .telemetry
        .application_insights
        .as_ref()
        .and_then(|ai| ai.entra.as_ref());
    let tokens = match sign_in {
        None => None,
        Some(sign_in) => {
            let source = TokenSource::managed_identity(
                sign_in.client_id.clone(),
                MONITOR_SCOPE,
                ENTRA_TOKEN_TIMEOUT,
            )
            .context("APPLICATIONINSIGHTS_AUTHENTICATION_STRING")?;
            Some(Arc::new(MonitorTokens(source)) as Arc<dyn IngestionTokens>)
        }
    };
    Ok(tokens)
}

/// Application Insights' ingestion tokens from an Entra ID token source.
struct MonitorTokens(TokenSource);

#[async_trait::async_trait]
impl IngestionTokens for MonitorTokens {
    async fn token(&self) -> Result<String, String> {
        self.0.token().await.map_err(|e| e.to_string())
    }

    fn description(&self) -> String {
        self.0.description().to_string()
    }
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
pub(super) type GiveUp = tokio::task::JoinHandle<crate::store::StoreError>;

/// What `build_processor_as` makes: the processor, the background
/// migration (if the first failed), and the outbox's dispatcher (`serve`
/// with a destination).
pub(super) struct Built {
    pub(super) processor: Arc<Processor>,
    pub(super) background: Option<GiveUp>,
    pub(super) dispatcher: Option<Arc<crate::outbox::Dispatcher>>,
}

pub(super) async fn build_processor_as(
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

/// Guard and store for an operator command, the store's schema verified
/// first (idempotent): the store answers nothing before that.
pub(super) async fn open_checked(
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
pub(super) async fn open_for_reading(
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
