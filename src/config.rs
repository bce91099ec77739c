//! All settings, from the environment only, with defaults and clear errors.
//!
//! An invalid value fails at start with a message naming the variable and what
//! it expected. Secrets (passwords, access keys) never appear in messages.

use std::path::PathBuf;
use std::time::Duration;

use crate::deadletter::storage::{check_container, parse_storage, DeadLetterSettings};
use crate::finished::FinishedCacheSettings;
use crate::guard::GuardSettings;
use crate::guard::MEMORY_GUARD_MAX_COMPLETED;
use crate::host::Limits;
use crate::hosting;
use crate::order::FractionalNumbers;
use crate::processor::{GuardPolicy, ProcessorSettings};
use crate::store::sqlserver::SqlServerSettings;
use crate::telemetry::TelemetrySettings;

mod telemetry;

/// Default SQLite file when `SQL_CONNECTION_STRING` is empty.
pub const DEFAULT_SQLITE_PATH: &str = "./order-guard.db";

/// A configuration error: which variable, and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}: {problem}")]
pub struct ConfigError {
    pub var: &'static str,
    pub problem: String,
}

fn err(var: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        var,
        problem: problem.into(),
    }
}

/// Where the guard lives. `Debug` never shows credentials.
#[derive(Clone, PartialEq, Eq)]
pub enum GuardConfig {
    /// In-process guard (`REDIS_URL` empty or unset).
    Memory,
    /// A redis-rs URL (`redis://…` or `rediss://…`); `cluster` when
    /// `REDIS_CLUSTER=true`: the URL is one node of an OSS cluster (the
    /// others are found from it), reached with redis-rs' cluster client.
    Redis {
        url: String,
        cluster: bool,
        auth: RedisAuth,
    },
}

/// How the guard authenticates to Redis (`REDIS_AUTH`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisAuth {
    /// `access-key` (the default): the URL's password, if any.
    AccessKey,
    /// `entra-id`: Entra ID tokens from the `Active Directory Default` chain
    /// (workload identity, the app's managed identity, `az`/`azd`, the
    /// Instance Metadata Service); `client_id` (`REDIS_CLIENT_ID`) names a
    /// user-assigned identity.
    EntraId { client_id: Option<String> },
}

/// Where the orders live. `Debug` never shows the connection string.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreConfig {
    /// Embedded SQLite file.
    Sqlite { path: PathBuf },
    /// SQL Server / Azure SQL, ADO.NET connection string.
    SqlServer { connection_string: String },
}

impl std::fmt::Debug for GuardConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GuardConfig::Memory => f.write_str("Memory"),
            GuardConfig::Redis { url, cluster, auth } => f
                .debug_struct("Redis")
                .field("url", &without_credentials(url))
                .field("cluster", cluster)
                .field("auth", auth)
                .finish(),
        }
    }
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreConfig::Sqlite { path } => f.debug_struct("Sqlite").field("path", path).finish(),
            StoreConfig::SqlServer { .. } => f
                .debug_struct("SqlServer")
                .field("connection_string", &"(not shown)")
                .finish(),
        }
    }
}

/// A URL with whatever precedes its last `@` (user and password) replaced.
fn without_credentials(url: &str) -> String {
    // Only what locates the server: scheme, host, port, database; never the
    // user, the password or anything else the text holds.
    match redis::parse_redis_url(url) {
        Some(u) => {
            let credentials = if u.username().is_empty() && u.password().is_none() {
                ""
            } else {
                "(credentials not shown)@"
            };
            let port = u.port().map(|p| format!(":{p}")).unwrap_or_default();
            format!(
                "{}://{credentials}{}{port}{}",
                u.scheme(),
                u.host_str().unwrap_or(""),
                u.path()
            )
        }
        None => "(not a URL; not shown)".into(),
    }
}

/// Whether `h` can be a host: an IPv6 literal in brackets, or dot-separated
/// labels of letters, digits and `-`, and not a lone mixed-case token that
/// looks like an access key (Azure's keys are 44 base64 characters).
fn plausible_host(h: &str) -> bool {
    if let Some(inner) = h.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        return inner.parse::<std::net::Ipv6Addr>().is_ok();
    }
    let labels_ok = !h.is_empty()
        && h.len() <= 253
        && h.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    let key_like = !h.contains('.')
        && h.len() >= 20
        && h.bytes().any(|b| b.is_ascii_uppercase())
        && h.bytes().any(|b| b.is_ascii_lowercase())
        && h.bytes().any(|b| b.is_ascii_digit());
    labels_ok && !key_like
}

/// Everything the binary needs.
#[derive(Debug, Clone)]
pub struct Config {
    pub port: u16,
    pub limits: Limits,
    pub guard: GuardConfig,
    pub guard_settings: GuardSettings,
    pub redis_timeout: Duration,
    pub store: StoreConfig,
    pub sqlserver: SqlServerSettings,
    /// SQLite: how long a write waits for another process's lock.
    pub sqlite_busy_timeout: Duration,
    /// The embedded guard: most `COMPLETADA` markers it keeps.
    pub memory_guard_max_completed: usize,
    pub processor: ProcessorSettings,
    /// How long SIGTERM waits for in-flight invocations.
    pub shutdown_grace: Duration,
    /// The dead-letter container the sweep replays (`None`: off).
    pub dead_letter: Option<DeadLetterSettings>,
    /// Metrics and traces (`OTEL_*`; nothing exported by default).
    pub telemetry: TelemetrySettings,
}

/// Default `DEAD_LETTER_CONTAINER`.
pub const DEFAULT_DEAD_LETTER_CONTAINER: &str = "deadletters";

impl Config {
    /// Read the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_lookup(|k| std::env::var(k).ok())
    }

    /// Read settings through `get` (tests pass a map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let val = |k: &str| {
            get(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let port = match (
            val("FUNCTIONS_CUSTOMHANDLER_PORT"),
            val("FUNCTIONS_HTTPWORKER_PORT"),
        ) {
            (Some(p), _) => parse_num("FUNCTIONS_CUSTOMHANDLER_PORT", &p, 1, 65_535)? as u16,
            (None, Some(p)) => parse_num("FUNCTIONS_HTTPWORKER_PORT", &p, 1, 65_535)? as u16,
            (None, None) => 3000,
        };
        let num =
            |var: &'static str, default: u64, min: u64, max: u64| -> Result<u64, ConfigError> {
                val(var).map_or(Ok(default), |v| parse_num(var, &v, min, max))
            };
        let cluster = match val("REDIS_CLUSTER")
            .map(|v| v.to_ascii_lowercase())
            .as_deref()
        {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => {
                return Err(err(
                    "REDIS_CLUSTER",
                    format!("expected true (the cache is an OSS-protocol cluster: Azure Managed Redis with the OSS cluster policy, Azure Cache for Redis Premium with clustering) or false (one endpoint: a single node, or a proxy cluster such as the Enterprise cluster policy), got {other:?}"),
                ))
            }
        };
        let guard =
            match val("REDIS_URL") {
                None if cluster => return Err(err(
                    "REDIS_CLUSTER",
                    "is true but REDIS_URL is not set: give one node of the cluster in REDIS_URL",
                )),
                None => GuardConfig::Memory,
                Some(v) => {
                    let url = redis_url(&v)?;
                    let auth = redis_auth(val("REDIS_AUTH"), val("REDIS_CLIENT_ID"), &url)?;
                    GuardConfig::Redis { url, cluster, auth }
                }
            };
        if matches!(guard, GuardConfig::Memory) {
            let entra = val("REDIS_AUTH").is_some_and(|a| a.eq_ignore_ascii_case("entra-id"));
            for (var, set) in [
                ("REDIS_AUTH", entra),
                ("REDIS_CLIENT_ID", val("REDIS_CLIENT_ID").is_some()),
            ] {
                if set {
                    return Err(err(
                        var,
                        "asks for Entra ID for Redis but REDIS_URL is not set: set REDIS_URL to the cache, or remove this setting",
                    ));
                }
            }
        }
        let prefix = get("GUARD_KEY_PREFIX").unwrap_or_else(|| "orden:".into());
        if prefix.is_empty()
            || prefix
                .chars()
                .any(|c| c.is_control() || c.is_whitespace() || c == '{' || c == '}')
        {
            return Err(err(
                "GUARD_KEY_PREFIX",
                "expected a non-empty key prefix without spaces, control characters or braces (the order id is the key's hash tag), e.g. orden:",
            ));
        }
        let processing_ttl = num("GUARD_PROCESSING_TTL_SECONDS", 300, 1, 86_400)?;
        let completed_ttl = num("GUARD_COMPLETED_TTL_SECONDS", 86_400, 1, 30 * 86_400)?;
        if completed_ttl < processing_ttl {
            return Err(err(
                "GUARD_COMPLETED_TTL_SECONDS",
                format!("must be at least GUARD_PROCESSING_TTL_SECONDS ({processing_ttl})"),
            ));
        }
        let on_guard_unavailable = match val("GUARD_UNAVAILABLE").as_deref() {
            None | Some("proceed") => GuardPolicy::Proceed,
            Some("retry") => GuardPolicy::Retry,
            Some(other) => {
                return Err(err(
                    "GUARD_UNAVAILABLE",
                    format!("expected \"proceed\" or \"retry\", got {other:?}"),
                ))
            }
        };
        // This instance's cache of finished orders: bounded in bytes, and
        // never trusted longer than COMPLETADA is kept.
        let cache_mb = num("ORDER_CACHE_MB", 64, 0, 4_096)?;
        let cache_ttl = num(
            "ORDER_CACHE_TTL_SECONDS",
            3_600.min(completed_ttl),
            1,
            30 * 86_400,
        )?;
        if cache_ttl > completed_ttl {
            return Err(err(
                "ORDER_CACHE_TTL_SECONDS",
                format!("must be at most GUARD_COMPLETED_TTL_SECONDS ({completed_ttl}): the local cache must not answer for longer than the shared guard; got {cache_ttl}"),
            ));
        }
        let event_types = val("ORDER_EVENT_TYPES")
            .map(|v| event_types(&v))
            .transpose()?;
        let fractional_numbers = match val("ORDER_FRACTIONAL_NUMBERS").as_deref() {
            None | Some("accept") => FractionalNumbers::UpToFifteenDigits,
            Some("refuse") => FractionalNumbers::Refused,
            Some(other) => {
                return Err(err(
                    "ORDER_FRACTIONAL_NUMBERS",
                    format!("expected \"accept\" (at most 15 significant digits) or \"refuse\" (amounts as strings or integers only), got {other:?}"),
                ))
            }
        };
        let deadline = num("INVOCATION_DEADLINE_MS", 20_000, 100, 25_000)?;
        let redis_timeout = num("REDIS_TIMEOUT_MS", 1_000, 10, 10_000)?;
        // Every step of an event runs inside the deadline; only the release of
        // a reservation after a failure may follow it, bounded by the Redis
        // timeout. Both together must stay inside Event Grid's 30 s.
        if deadline + redis_timeout > 28_000 {
            return Err(err(
                "INVOCATION_DEADLINE_MS",
                format!("plus REDIS_TIMEOUT_MS ({redis_timeout}) must be at most 28000 ms, inside Event Grid's 30 s response window; got {deadline}"),
            ));
        }
        if redis_timeout >= deadline {
            return Err(err(
                "REDIS_TIMEOUT_MS",
                format!("must be shorter than INVOCATION_DEADLINE_MS ({deadline}), so a Redis call that hangs times out (and its reservation is disowned) before the event's deadline; got {redis_timeout}"),
            ));
        }
        // On Azure the embedded state is wrong: the app root may be a
        // read-only package mount or a shared file system where SQLite's
        // locks are unsafe, and a memory guard or a local file is one per
        // instance. Refuse to start rather than run that way by accident, on
        // every hosting plan the Functions host itself recognises
        // (`hosting::detect`, from the host's EnvironmentExtensions.cs).
        if let Some(azure) = hosting::detect(&get) {
            if !allowed(val("ORDER_GUARD_ALLOW_EMBEDDED_STATE"))? {
                for var in ["REDIS_URL", "SQL_CONNECTION_STRING"] {
                    if val(var).is_none() {
                        return Err(err(
                            var,
                            format!("is not set, and this runs in Azure on {azure}, where the embedded default (in-memory guard, SQLite file in the app root) is per instance and unsafe; set it in the app's Application settings, or set ORDER_GUARD_ALLOW_EMBEDDED_STATE=true to run on the embedded default anyway"),
                        ));
                    }
                }
            }
        }
        let store = match val("SQL_CONNECTION_STRING") {
            None => StoreConfig::Sqlite {
                path: PathBuf::from(DEFAULT_SQLITE_PATH),
            },
            Some(v) => match v.strip_prefix("sqlite:") {
                Some("") => {
                    return Err(err(
                        "SQL_CONNECTION_STRING",
                        "sqlite: needs a file path, e.g. sqlite:./order-guard.db",
                    ))
                }
                Some(path) => StoreConfig::Sqlite { path: path.into() },
                None => {
                    if !names_a_server(&v) {
                        return Err(err(
                            "SQL_CONNECTION_STRING",
                            "expected an ADO.NET connection string naming its server (Server=tcp:…;Initial Catalog=…;…), sqlite:PATH, or nothing for the embedded default (the value is not shown)",
                        ));
                    }
                    StoreConfig::SqlServer {
                        connection_string: v,
                    }
                }
            },
        };
        let dead_letter = dead_letter(val("DEAD_LETTER_STORAGE"), val("DEAD_LETTER_CONTAINER"))?;
        let telemetry = telemetry::telemetry(&val)?;
        Ok(Config {
            port,
            limits: Limits {
                max_body_bytes: num("MAX_BODY_BYTES", 4 * 1024 * 1024, 1024, 64 * 1024 * 1024)?
                    as usize,
                body_read_timeout: Duration::from_millis(num(
                    "BODY_READ_TIMEOUT_MS",
                    10_000,
                    100,
                    25_000,
                )?),
            },
            guard,
            guard_settings: GuardSettings {
                prefix,
                processing_ttl: Duration::from_secs(processing_ttl),
                completed_ttl: Duration::from_secs(completed_ttl),
                // The owner answers its event by its deadline: past it, its
                // reservation may be taken over.
                lease: Duration::from_millis(deadline),
            },
            redis_timeout: Duration::from_millis(redis_timeout),
            store,
            sqlserver: SqlServerSettings {
                connect_timeout: Duration::from_secs(num(
                    "SQL_CONNECT_TIMEOUT_SECONDS",
                    10,
                    1,
                    60,
                )?),
                query_timeout: Duration::from_secs(num("SQL_QUERY_TIMEOUT_SECONDS", 8, 1, 25)?),
                pool_size: num("SQL_POOL_SIZE", 10, 1, 200)? as u32,
            },
            sqlite_busy_timeout: Duration::from_millis(num(
                "SQLITE_BUSY_TIMEOUT_MS",
                5_000,
                0,
                20_000,
            )?),
            memory_guard_max_completed: num(
                "MEMORY_GUARD_MAX_COMPLETED",
                MEMORY_GUARD_MAX_COMPLETED,
                1,
                100_000_000,
            )? as usize,
            processor: ProcessorSettings {
                on_guard_unavailable,
                deadline: Duration::from_millis(deadline),
                event_types,
                fractional_numbers,
                finished_cache: FinishedCacheSettings {
                    max_bytes: cache_mb * 1024 * 1024,
                    ttl: Duration::from_secs(cache_ttl),
                },
            },
            shutdown_grace: Duration::from_secs(num("SHUTDOWN_GRACE_SECONDS", 25, 0, 300)?),
            dead_letter,
            telemetry,
        })
    }
}

/// `DEAD_LETTER_STORAGE` and `DEAD_LETTER_CONTAINER`: the sweep's
/// settings, or `None` when no storage is given. Messages never quote the
/// storage value (it may hold a key or a SAS).
fn dead_letter(
    storage: Option<String>,
    container: Option<String>,
) -> Result<Option<DeadLetterSettings>, ConfigError> {
    if let Some(c) = &container {
        check_container(c).map_err(|p| err("DEAD_LETTER_CONTAINER", p))?;
    }
    let Some(storage) = storage else {
        return Ok(None);
    };
    let target = parse_storage(&storage).map_err(|p| {
        err(
            "DEAD_LETTER_STORAGE",
            format!("{p}; expected the storage account's connection string, UseDevelopmentStorage=true, or the container's URL https://<account>.blob.core.windows.net/<container>[?<SAS>] (the value is not shown)"),
        )
    })?;
    let container = match (&target.container, container) {
        (Some(in_url), Some(set)) if *in_url != set => {
            return Err(err(
                "DEAD_LETTER_CONTAINER",
                format!("is {set:?} but DEAD_LETTER_STORAGE's URL names the container {in_url:?}; set one of them"),
            ))
        }
        (Some(in_url), _) => in_url.clone(),
        (None, Some(set)) => set,
        (None, None) => DEFAULT_DEAD_LETTER_CONTAINER.to_string(),
    };
    Ok(Some(DeadLetterSettings {
        storage: target,
        container,
    }))
}

fn parse_num(var: &'static str, v: &str, min: u64, max: u64) -> Result<u64, ConfigError> {
    match v.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(err(
            var,
            format!("expected a whole number from {min} to {max}, got {v:?}"),
        )),
    }
}

/// Whether an ADO.NET string has a server key (`Server`, `Data Source`,
/// `Address`, `Addr`, `Network Address`): a pasted password or key has none.
fn names_a_server(v: &str) -> bool {
    v.split(';').any(|part| {
        part.split_once('=').is_some_and(|(k, _)| {
            let k = k.trim().to_ascii_lowercase();
            [
                "server",
                "data source",
                "address",
                "addr",
                "network address",
            ]
            .contains(&k.as_str())
        })
    })
}

/// `ORDER_EVENT_TYPES`: event types separated by commas, each non-empty and
/// without spaces or control characters.
fn event_types(v: &str) -> Result<Vec<String>, ConfigError> {
    let types: Vec<String> = v.split(',').map(|t| t.trim().to_string()).collect();
    if types
        .iter()
        .any(|t| t.is_empty() || t.chars().any(|c| c.is_control() || c.is_whitespace()))
    {
        return Err(err(
            "ORDER_EVENT_TYPES",
            "expected event types separated by commas, none empty and none with spaces, e.g. Trading.Order.Placed (or nothing: every type is an order)",
        ));
    }
    Ok(types)
}

/// Accept a redis-rs URL, or translate Azure's StackExchange.Redis form
/// `host:6380,password=KEY,ssl=True,abortConnect=False` into one.
/// `ORDER_GUARD_ALLOW_EMBEDDED_STATE`: `true` or `false` (absent: false).
fn allowed(v: Option<String>) -> Result<bool, ConfigError> {
    match v.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(err(
            "ORDER_GUARD_ALLOW_EMBEDDED_STATE",
            format!("expected true or false, got {other:?}"),
        )),
    }
}

/// `REDIS_AUTH` and `REDIS_CLIENT_ID` for the (already checked) `url`.
fn redis_auth(
    auth: Option<String>,
    client_id: Option<String>,
    url: &str,
) -> Result<RedisAuth, ConfigError> {
    match auth.map(|a| a.to_ascii_lowercase()).as_deref() {
        None | Some("access-key") => match client_id {
            Some(_) => Err(err(
                "REDIS_CLIENT_ID",
                "names a user-assigned identity for REDIS_AUTH=entra-id, but REDIS_AUTH is not entra-id",
            )),
            None => Ok(RedisAuth::AccessKey),
        },
        Some("entra-id") => {
            let parsed = redis::parse_redis_url(url);
            let user = parsed.as_ref().is_some_and(|u| !u.username().is_empty());
            let password = parsed.as_ref().is_some_and(|u| u.password().is_some());
            if user || password {
                return Err(err(
                    "REDIS_URL",
                    "carries a user name or password, but REDIS_AUTH=entra-id takes both from the Entra ID token (the identity's object id and the token): remove them from the URL (the value is not shown)",
                ));
            }
            Ok(RedisAuth::EntraId { client_id })
        }
        Some(other) => Err(err(
            "REDIS_AUTH",
            format!("expected access-key (the password in REDIS_URL: an access key) or entra-id (Microsoft Entra ID tokens of the app's identity, Azure Managed Redis' default), got {other:?}"),
        )),
    }
}

pub fn redis_url(v: &str) -> Result<String, ConfigError> {
    const VAR: &str = "REDIS_URL";
    if v.starts_with("redis://") || v.starts_with("rediss://") || v.starts_with("redis+unix://") {
        let url = redis::parse_redis_url(v).ok_or_else(|| {
            err(
                VAR,
                "not a valid redis:// or rediss:// URL (the value is not shown)",
            )
        })?;
        if url.host_str().is_some_and(|h| !plausible_host(h)) {
            return Err(err(
                VAR,
                "the URL's host is not a host name (an access key in the host's place?); expected redis://HOST:PORT or rediss://:KEY@HOST:6380 (the value is not shown)",
            ));
        }
        // After HOST:PORT only a database number: anything else is a form
        // mixed up with Azure's (`…:6380,password=KEY,ssl=True` after a
        // URL), which would carry the key where no one redacts it.
        let path = url.path();
        let db_only = path.is_empty()
            || path == "/"
            || path
                .strip_prefix('/')
                .is_some_and(|d| d.bytes().all(|b| b.is_ascii_digit()));
        if !db_only || url.fragment().is_some() {
            return Err(err(
                VAR,
                "after redis://HOST:PORT only /DB (a database number) may follow; for Azure's form give HOST:6380,password=KEY,ssl=True without the scheme (the value is not shown)",
            ));
        }
        return Ok(v.to_string());
    }
    let mut parts = v.split(',');
    let endpoint = parts.next().unwrap_or("").trim();
    // Messages never quote the value: a mistyped separator can put the access
    // key where the port or host should be.
    let form = "expected redis://HOST:PORT, rediss://:KEY@HOST:6380, or Azure's HOST:6380,password=KEY,ssl=True form (the value is not shown)";
    let (host, port) = match endpoint.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse::<u16>()
                .map_err(|_| err(VAR, format!("the port after ':' is not a number; {form}")))?,
        ),
        None => (endpoint, 6379),
    };
    if !plausible_host(host) {
        return Err(err(
            VAR,
            format!("not a host name (an access key pasted alone?); {form}"),
        ));
    }
    let (mut password, mut ssl, mut user) = (None, port == 6380, None);
    for part in parts {
        let Some((k, val)) = part.split_once('=') else {
            continue;
        };
        match k.trim().to_ascii_lowercase().as_str() {
            "password" => password = Some(val.trim().to_string()),
            "user" => user = Some(val.trim().to_string()),
            "ssl" => ssl = val.trim().eq_ignore_ascii_case("true"),
            _ => {}
        }
    }
    let enc = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    let auth = match (user, password) {
        (u, Some(p)) => format!("{}:{}@", enc(u.as_deref().unwrap_or("")), enc(&p)),
        (Some(u), None) => format!("{}@", enc(&u)),
        (None, None) => String::new(),
    };
    let scheme = if ssl { "rediss" } else { "redis" };
    Ok(format!("{scheme}://{auth}{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults_need_nothing() {
        let c = config(&[]).unwrap();
        assert_eq!(c.port, 3000);
        assert_eq!(c.guard, GuardConfig::Memory);
        assert_eq!(
            c.store,
            StoreConfig::Sqlite {
                path: DEFAULT_SQLITE_PATH.into()
            }
        );
        assert_eq!(c.guard_settings.prefix, "orden:");
        assert_eq!(c.guard_settings.processing_ttl, Duration::from_secs(300));
        assert_eq!(c.guard_settings.completed_ttl, Duration::from_secs(86_400));
        assert_eq!(
            c.processor.finished_cache,
            FinishedCacheSettings {
                max_bytes: 64 * 1024 * 1024,
                ttl: Duration::from_secs(3_600)
            }
        );
    }

    #[test]
    fn the_dead_letter_settings() {
        assert_eq!(config(&[]).unwrap().dead_letter, None);
        let c = config(&[("DEAD_LETTER_STORAGE", "UseDevelopmentStorage=true")]).unwrap();
        let d = c.dead_letter.unwrap();
        assert_eq!(d.container, DEFAULT_DEAD_LETTER_CONTAINER);
        assert_eq!(d.storage.account, "devstoreaccount1");
        let c = config(&[
            (
                "DEAD_LETTER_STORAGE",
                "https://ordersdl.blob.core.windows.net/orders-dlq",
            ),
            ("DEAD_LETTER_CONTAINER", "orders-dlq"),
        ])
        .unwrap();
        assert_eq!(c.dead_letter.unwrap().container, "orders-dlq");
        let e = config(&[
            (
                "DEAD_LETTER_STORAGE",
                "https://ordersdl.blob.core.windows.net/orders-dlq",
            ),
            ("DEAD_LETTER_CONTAINER", "other"),
        ])
        .unwrap_err();
        assert_eq!(e.var, "DEAD_LETTER_CONTAINER");
        let key = "c2VjcmV0LWtleS1vZi10aGUtYWNjb3VudC0xMjM0NTY3ODkwYWJjZA==";
        let e = config(&[(
            "DEAD_LETTER_STORAGE",
            &format!("AccountName=Bad_Name;AccountKey={key}"),
        )])
        .unwrap_err();
        assert_eq!(e.var, "DEAD_LETTER_STORAGE");
        assert!(!e.to_string().contains(key), "{e}");
        let c = config(&[(
            "DEAD_LETTER_STORAGE",
            &format!("AccountName=ordersdl;AccountKey={key}"),
        )])
        .unwrap();
        assert!(!format!("{c:?}").contains(key));
        let e = config(&[("DEAD_LETTER_CONTAINER", "Bad")]).unwrap_err();
        assert_eq!(e.var, "DEAD_LETTER_CONTAINER");
    }

    #[test]
    fn the_finished_cache_never_outlives_completada() {
        // The default TTL follows a shorter COMPLETADA TTL down.
        let c = config(&[("GUARD_COMPLETED_TTL_SECONDS", "600")]).unwrap();
        assert_eq!(c.processor.finished_cache.ttl, Duration::from_secs(600));
        let e = config(&[
            ("GUARD_COMPLETED_TTL_SECONDS", "600"),
            ("ORDER_CACHE_TTL_SECONDS", "601"),
        ])
        .unwrap_err();
        assert_eq!(e.var, "ORDER_CACHE_TTL_SECONDS");
        assert!(e.to_string().contains("GUARD_COMPLETED_TTL_SECONDS (600)"));
        let off = config(&[("ORDER_CACHE_MB", "0")]).unwrap();
        assert_eq!(off.processor.finished_cache.max_bytes, 0);
    }

    #[test]
    fn invalid_values_name_the_variable() {
        let e = config(&[("FUNCTIONS_CUSTOMHANDLER_PORT", "http")]).unwrap_err();
        assert_eq!(e.var, "FUNCTIONS_CUSTOMHANDLER_PORT");
        let e = config(&[("GUARD_UNAVAILABLE", "maybe")]).unwrap_err();
        assert!(e.to_string().starts_with("GUARD_UNAVAILABLE: expected"));
        let e = config(&[("SQL_CONNECTION_STRING", "postgres-please")]).unwrap_err();
        assert_eq!(e.var, "SQL_CONNECTION_STRING");
        let e = config(&[
            ("INVOCATION_DEADLINE_MS", "25000"),
            ("REDIS_TIMEOUT_MS", "5000"),
        ])
        .unwrap_err();
        assert_eq!(e.var, "INVOCATION_DEADLINE_MS");
        let e = config(&[
            ("GUARD_PROCESSING_TTL_SECONDS", "600"),
            ("GUARD_COMPLETED_TTL_SECONDS", "60"),
        ])
        .unwrap_err();
        assert_eq!(e.var, "GUARD_COMPLETED_TTL_SECONDS");
        let e = config(&[
            ("INVOCATION_DEADLINE_MS", "1000"),
            ("REDIS_TIMEOUT_MS", "1000"),
        ])
        .unwrap_err();
        assert_eq!(e.var, "REDIS_TIMEOUT_MS");
        assert!(
            e.to_string()
                .contains("shorter than INVOCATION_DEADLINE_MS"),
            "{e}"
        );
    }

    /// A secret as Azure shows an access key: 44 base64 characters.
    const KEY: &str = "Zm9vYmFyU2VjcmV0S2V5MTIzNDU2Nzg5MGFiY2RlZg9=";
    /// The parts of `KEY` that must never be shown (a percent-encoded URL
    /// still shows its first 40 characters as they are).
    fn leaks(text: &str) -> bool {
        text.contains(&KEY[..40])
    }

    /// Every configuration error path, with the secrets set: no message and
    /// no `Debug` shows them; every accepted configuration's `Debug` neither.
    #[test]
    fn no_configuration_error_or_debug_output_shows_a_secret() {
        let redis = format!("rediss://:{KEY}@cache.redis.cache.windows.net:6380");
        let azure = format!("cache.redis.cache.windows.net:6380,password={KEY},ssl=True");
        let sql = format!("Server=tcp:db,1433;Initial Catalog=o;User ID=u;Password={KEY}");
        let secrets: [(&str, &str); 2] = [("REDIS_URL", &redis), ("SQL_CONNECTION_STRING", &sql)];
        // (variable that is wrong, its value): every `err(…)` of this module.
        let redis_bad = [
            KEY.to_string(),
            format!("{KEY}:6380"),
            format!("redis://{KEY}"),
            format!("redis://{KEY}:6379"),
            format!("redis://:{KEY}@host:notaport"),
            format!("cache:6380;password={KEY}"),
            format!("default:{KEY}@host"),
            format!("cache {KEY}:6380"),
            format!("http://{KEY}@host"),
            format!("cache:{KEY},password={KEY}"),
            format!("{KEY},password={KEY},ssl=True"),
        ];
        let mut cases: Vec<(&str, Vec<(&str, String)>)> = redis_bad
            .iter()
            .map(|v| ("REDIS_URL", vec![("REDIS_URL", v.clone())]))
            .collect();
        let plain: Vec<(&str, &str)> = vec![
            ("FUNCTIONS_CUSTOMHANDLER_PORT", "http"),
            ("FUNCTIONS_HTTPWORKER_PORT", "0"),
            ("GUARD_KEY_PREFIX", "a b"),
            ("GUARD_PROCESSING_TTL_SECONDS", "0"),
            ("GUARD_COMPLETED_TTL_SECONDS", "1"),
            ("GUARD_UNAVAILABLE", "maybe"),
            ("ORDER_EVENT_TYPES", "a,,b"),
            ("ORDER_CACHE_MB", "lots"),
            ("ORDER_CACHE_TTL_SECONDS", "0"),
            ("INVOCATION_DEADLINE_MS", "1"),
            ("REDIS_TIMEOUT_MS", "1"),
            ("MAX_BODY_BYTES", "1"),
            ("BODY_READ_TIMEOUT_MS", "1"),
            ("SQL_CONNECT_TIMEOUT_SECONDS", "0"),
            ("SQL_QUERY_TIMEOUT_SECONDS", "0"),
            ("SQL_POOL_SIZE", "0"),
            ("SQLITE_BUSY_TIMEOUT_MS", "x"),
            ("SHUTDOWN_GRACE_SECONDS", "x"),
            ("ORDER_GUARD_ALLOW_EMBEDDED_STATE", "yes"),
        ];
        for (var, v) in plain {
            let mut set = vec![(var, v.to_string())];
            if var == "ORDER_GUARD_ALLOW_EMBEDDED_STATE" {
                set.push(("WEBSITE_INSTANCE_ID", "x".into()));
            }
            cases.push((var, set));
        }
        cases.push((
            "INVOCATION_DEADLINE_MS",
            vec![
                ("INVOCATION_DEADLINE_MS", "25000".into()),
                ("REDIS_TIMEOUT_MS", "5000".into()),
            ],
        ));
        cases.push((
            "SQL_CONNECTION_STRING",
            vec![("SQL_CONNECTION_STRING", KEY.into())],
        ));
        cases.push((
            "SQL_CONNECTION_STRING",
            vec![("SQL_CONNECTION_STRING", "sqlite:".into())],
        ));
        for missing in ["REDIS_URL", "SQL_CONNECTION_STRING"] {
            let present: Vec<(&str, String)> = secrets
                .iter()
                .filter(|(k, _)| *k != missing)
                .map(|(k, v)| (*k, v.to_string()))
                .chain([("WEBSITE_INSTANCE_ID", "x".to_string())])
                .collect();
            cases.push((missing, present));
        }
        for (var, set) in cases {
            // The secrets stay set unless the case replaces or drops them.
            let mut pairs: HashMap<&str, String> =
                secrets.iter().map(|(k, v)| (*k, v.to_string())).collect();
            if set.iter().any(|(k, _)| *k == "WEBSITE_INSTANCE_ID")
                && var != "ORDER_GUARD_ALLOW_EMBEDDED_STATE"
            {
                pairs.remove(var);
            }
            pairs.extend(set.iter().cloned());
            let got = Config::from_lookup(|k| pairs.get(k).cloned());
            let e = match got {
                Err(e) => e,
                Ok(c) => panic!("{set:?} must be refused, got {c:?}"),
            };
            assert_eq!(e.var, var, "{set:?}: {e}");
            for shown in [e.to_string(), format!("{e:?}")] {
                assert!(!leaks(&shown), "{var} error shows the secret: {shown}");
            }
        }
        for redis in [redis.as_str(), azure.as_str()] {
            let c = config(&[("REDIS_URL", redis), ("SQL_CONNECTION_STRING", &sql)]).unwrap();
            let debug = format!("{c:?} {:?} {:?}", c.guard, c.store);
            assert!(!leaks(&debug), "Debug shows the secret: {debug}");
            assert!(
                debug.contains("cache.redis.cache.windows.net:6380"),
                "{debug}"
            );
        }
    }

    #[test]
    fn hosts_are_host_names_or_addresses() {
        for ok in [
            "cache",
            "127.0.0.1",
            "[::1]",
            "my-cache.redis.cache.windows.net",
            "redis-7",
        ] {
            assert!(plausible_host(ok), "{ok}");
        }
        for bad in [
            "",
            "a b",
            "Zm9vYmFyU2VjcmV0S2V5MTIz",
            "key=",
            "a..b",
            "x/y",
            "[nope]",
        ] {
            assert!(!plausible_host(bad), "{bad}");
        }
    }

    /// Found by the `connection_strings` fuzz target: a URL with Azure's
    /// form after it was accepted, and its `Debug` showed the key.
    #[test]
    fn a_url_mixed_with_azures_form_is_refused_without_showing_the_key() {
        let mixed = "rediss://:key@cache.example.net:6380/0,password=S3cr3tMarker,ssl=True";
        let e = config(&[("REDIS_URL", mixed)]).unwrap_err();
        assert_eq!(e.var, "REDIS_URL");
        assert!(!format!("{e} {e:?}").contains("S3cr3tMarker"), "{e}");
        for fine in [
            "redis://cache:6379",
            "rediss://:k@cache:6380/0",
            "redis://cache:6379/",
        ] {
            let c = config(&[("REDIS_URL", fine)]).unwrap();
            let shown = format!("{c:?}");
            assert!(!shown.contains(":k@"), "{shown}");
            assert!(shown.contains("cache:63"), "{shown}");
        }
    }

    #[test]
    fn fractional_numbers_and_the_memory_guard_bound_are_read() {
        let c = config(&[]).unwrap();
        assert_eq!(
            c.processor.fractional_numbers,
            FractionalNumbers::UpToFifteenDigits
        );
        assert_eq!(c.memory_guard_max_completed, 100_000);
        let c = config(&[
            ("ORDER_FRACTIONAL_NUMBERS", "refuse"),
            ("MEMORY_GUARD_MAX_COMPLETED", "10"),
        ])
        .unwrap();
        assert_eq!(c.processor.fractional_numbers, FractionalNumbers::Refused);
        assert_eq!(c.memory_guard_max_completed, 10);
        let e = config(&[("ORDER_FRACTIONAL_NUMBERS", "maybe")]).unwrap_err();
        assert_eq!(e.var, "ORDER_FRACTIONAL_NUMBERS");
        assert!(e.to_string().contains("\"refuse\""), "{e}");
        let e = config(&[("MEMORY_GUARD_MAX_COMPLETED", "0")]).unwrap_err();
        assert_eq!(e.var, "MEMORY_GUARD_MAX_COMPLETED");
    }

    #[test]
    fn order_event_types_is_an_optional_comma_separated_list() {
        assert_eq!(config(&[]).unwrap().processor.event_types, None);
        assert_eq!(
            config(&[("ORDER_EVENT_TYPES", "  ")])
                .unwrap()
                .processor
                .event_types,
            None
        );
        let c = config(&[("ORDER_EVENT_TYPES", "Trading.Order.Placed, Order.Placed")]).unwrap();
        assert_eq!(
            c.processor.event_types,
            Some(vec![
                "Trading.Order.Placed".to_string(),
                "Order.Placed".to_string()
            ])
        );
        for bad in ["A,,B", "A,", "Order Placed"] {
            let e = config(&[("ORDER_EVENT_TYPES", bad)]).unwrap_err();
            assert_eq!(e.var, "ORDER_EVENT_TYPES", "{bad}");
        }
    }

    #[test]
    fn in_azure_the_embedded_state_is_refused_unless_allowed() {
        let e = config(&[("WEBSITE_INSTANCE_ID", "abc123")]).unwrap_err();
        assert_eq!(e.var, "REDIS_URL");
        assert!(
            e.to_string()
                .contains("ORDER_GUARD_ALLOW_EMBEDDED_STATE=true"),
            "{e}"
        );
        let e = config(&[
            ("WEBSITE_INSTANCE_ID", "abc123"),
            ("REDIS_URL", "redis://cache:6379"),
        ])
        .unwrap_err();
        assert_eq!(e.var, "SQL_CONNECTION_STRING");
        let both = config(&[
            ("WEBSITE_INSTANCE_ID", "abc123"),
            ("REDIS_URL", "redis://cache:6379"),
            (
                "SQL_CONNECTION_STRING",
                "Server=tcp:db,1433;Initial Catalog=o;User ID=u;Password=p",
            ),
        ]);
        assert!(both.is_ok(), "{both:?}");
        let allowed = config(&[
            ("WEBSITE_INSTANCE_ID", "abc123"),
            ("ORDER_GUARD_ALLOW_EMBEDDED_STATE", "true"),
        ]);
        assert!(matches!(allowed.map(|c| c.guard), Ok(GuardConfig::Memory)));
        let e = config(&[
            ("WEBSITE_INSTANCE_ID", "abc123"),
            ("ORDER_GUARD_ALLOW_EMBEDDED_STATE", "yes please"),
        ])
        .unwrap_err();
        assert_eq!(e.var, "ORDER_GUARD_ALLOW_EMBEDDED_STATE");
        // Outside Azure the embedded default needs nothing.
        assert!(config(&[]).is_ok());
    }

    /// On a hosting plan (its environment as the platform sets it: the
    /// variables `hosting::detect` reads, beside others the platform sets),
    /// a missing `REDIS_URL` or `SQL_CONNECTION_STRING` is refused with the
    /// plan's name and the variable that showed it, unless allowed.
    fn refused_on(name: &str, plan: &[(&'static str, &'static str)]) {
        let sql = "Server=tcp:db,1433;Initial Catalog=o;User ID=u;Password=p";
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut pairs = plan.to_vec();
            pairs.extend_from_slice(extra);
            config(&pairs)
        };
        let e = with(&[]).unwrap_err();
        assert_eq!(e.var, "REDIS_URL", "{name}: {e}");
        assert!(e.to_string().contains(name), "{name}: {e}");
        let e = with(&[("REDIS_URL", "redis://cache:6379")]).unwrap_err();
        assert_eq!(e.var, "SQL_CONNECTION_STRING", "{name}: {e}");
        assert!(e.to_string().contains(name), "{name}: {e}");
        let shown = plan
            .iter()
            .map(|(k, _)| *k)
            .find(|k| crate::hosting::VARIABLES.contains(k) && e.to_string().contains(k));
        assert!(shown.is_some(), "{name}: {e} names none of {plan:?}");
        let e = with(&[("SQL_CONNECTION_STRING", "sqlite:/home/orders.db")]).unwrap_err();
        assert_eq!(e.var, "REDIS_URL", "{name}: {e}");
        let both = with(&[
            ("REDIS_URL", "redis://cache:6379"),
            ("SQL_CONNECTION_STRING", sql),
        ]);
        assert!(both.is_ok(), "{name}: {both:?}");
        let allowed = with(&[("ORDER_GUARD_ALLOW_EMBEDDED_STATE", "true")]);
        assert!(
            matches!(allowed.map(|c| c.guard), Ok(GuardConfig::Memory)),
            "{name}"
        );
        let e = with(&[("ORDER_GUARD_ALLOW_EMBEDDED_STATE", "yes")]).unwrap_err();
        assert_eq!(e.var, "ORDER_GUARD_ALLOW_EMBEDDED_STATE", "{name}");
    }

    #[test]
    fn refused_on_windows_consumption() {
        refused_on(
            "Consumption (Windows)",
            &[
                ("WEBSITE_INSTANCE_ID", "8c3ab2d1e5f64d7e"),
                ("WEBSITE_SKU", "Dynamic"),
                ("WEBSITE_SITE_NAME", "orders"),
            ],
        );
    }

    #[test]
    fn refused_on_linux_consumption() {
        refused_on(
            "Consumption (Linux)",
            &[
                ("FUNCTIONS_WORKER_RUNTIME", "custom"),
                ("CONTAINER_NAME", "E9A1C2_orders"),
                ("WEBSITE_SITE_NAME", "orders"),
                ("WEBSITE_SKU", "Dynamic"),
            ],
        );
    }

    #[test]
    fn refused_on_flex_consumption() {
        refused_on(
            "Flex Consumption",
            &[
                ("WEBSITE_SKU", "FlexConsumption"),
                ("CONTAINER_NAME", "orders-7f9c"),
                ("LEGION_SERVICE_HOST", "10.1.0.4"),
            ],
        );
        // In placeholder mode, before the site's settings (the SKU) arrive.
        refused_on(
            "Flex Consumption",
            &[
                ("FUNCTIONS_WORKER_RUNTIME", "custom"),
                ("WEBSITE_POD_NAME", "orders-7f9c"),
                ("LEGION_SERVICE_HOST", "10.1.0.4"),
            ],
        );
    }

    #[test]
    fn refused_on_premium() {
        refused_on(
            "Premium (Elastic Premium)",
            &[
                ("WEBSITE_INSTANCE_ID", "8c3ab2d1e5f64d7e"),
                ("WEBSITE_SKU", "ElasticPremium"),
            ],
        );
    }

    #[test]
    fn refused_on_dedicated() {
        refused_on(
            "Dedicated (App Service plan)",
            &[
                ("WEBSITE_INSTANCE_ID", "8c3ab2d1e5f64d7e"),
                ("WEBSITE_SKU", "PremiumV3"),
                ("FUNCTIONS_LOGS_MOUNT_PATH", "/var/log/functionsLogs"),
            ],
        );
    }

    #[test]
    fn refused_on_container_apps() {
        refused_on(
            "Azure Container Apps",
            &[
                ("MANAGED_ENVIRONMENT", "true"),
                ("CONTAINER_APP_NAME", "orders"),
                ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
            ],
        );
    }

    #[test]
    fn refused_on_app_service_on_kubernetes() {
        refused_on(
            "App Service on Kubernetes (Azure Arc)",
            &[
                ("FUNCTIONS_WORKER_RUNTIME", "custom"),
                ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
                ("POD_NAMESPACE", "k8se-apps"),
            ],
        );
    }

    #[test]
    fn store_choice_follows_the_connection_string() {
        let c = config(&[("SQL_CONNECTION_STRING", "sqlite:/tmp/x.db")]).unwrap();
        assert_eq!(
            c.store,
            StoreConfig::Sqlite {
                path: "/tmp/x.db".into()
            }
        );
        let ado = "Server=tcp:s.database.windows.net,1433;Initial Catalog=o;User ID=u;Password=p;Encrypt=True;";
        let c = config(&[("SQL_CONNECTION_STRING", ado)]).unwrap();
        assert!(matches!(c.store, StoreConfig::SqlServer { .. }));
    }

    #[test]
    fn redis_cluster_is_a_setting_beside_the_url() {
        let c = config(&[("REDIS_URL", "redis://cache:6379")]).unwrap();
        assert_eq!(
            c.guard,
            GuardConfig::Redis {
                url: "redis://cache:6379".into(),
                cluster: false,
                auth: RedisAuth::AccessKey,
            }
        );
        let azure =
            "amr.westeurope.redis.azure.net:10000,password=S3cretKey,ssl=True,abortConnect=False";
        let c = config(&[("REDIS_URL", azure), ("REDIS_CLUSTER", "True")]).unwrap();
        assert_eq!(
            c.guard,
            GuardConfig::Redis {
                url: "rediss://:S3cretKey@amr.westeurope.redis.azure.net:10000".into(),
                cluster: true,
                auth: RedisAuth::AccessKey,
            }
        );
        let e = config(&[("REDIS_URL", azure), ("REDIS_CLUSTER", "yes")]).unwrap_err();
        assert_eq!(e.var, "REDIS_CLUSTER");
        assert!(!e.to_string().contains("S3cretKey"), "{e}");
        let e = config(&[("REDIS_CLUSTER", "true")]).unwrap_err();
        assert_eq!(e.var, "REDIS_CLUSTER");
        for bad in ["ord{", "o}", "{x}:"] {
            let e = config(&[("GUARD_KEY_PREFIX", bad)]).unwrap_err();
            assert_eq!(e.var, "GUARD_KEY_PREFIX", "{bad}");
        }
    }

    #[test]
    fn redis_auth_selects_entra_id_tokens_instead_of_an_access_key() {
        let amr = "amr.westeurope.redis.azure.net:10000,ssl=True";
        let c = config(&[("REDIS_URL", amr), ("REDIS_AUTH", "entra-id")]).unwrap();
        assert_eq!(
            c.guard,
            GuardConfig::Redis {
                url: "rediss://amr.westeurope.redis.azure.net:10000".into(),
                cluster: false,
                auth: RedisAuth::EntraId { client_id: None },
            }
        );
        let c = config(&[
            ("REDIS_URL", amr),
            ("REDIS_AUTH", "Entra-ID"),
            ("REDIS_CLIENT_ID", "uai-client"),
        ])
        .unwrap();
        assert!(matches!(
            c.guard,
            GuardConfig::Redis { auth: RedisAuth::EntraId { client_id: Some(ref id) }, .. } if id == "uai-client"
        ));
        let c = config(&[("REDIS_URL", amr), ("REDIS_AUTH", "access-key")]).unwrap();
        assert!(matches!(
            c.guard,
            GuardConfig::Redis {
                auth: RedisAuth::AccessKey,
                ..
            }
        ));
        // A password beside the token is a mistake, and never echoed.
        for url in [
            "rediss://:S3cretKey@amr.westeurope.redis.azure.net:10000",
            "amr.westeurope.redis.azure.net:10000,password=S3cretKey,ssl=True",
            "rediss://someone@amr.westeurope.redis.azure.net:10000",
        ] {
            let e = config(&[("REDIS_URL", url), ("REDIS_AUTH", "entra-id")]).unwrap_err();
            assert_eq!(e.var, "REDIS_URL", "{url}");
            assert!(e.to_string().contains("remove them"), "{e}");
            assert!(!e.to_string().contains("S3cretKey"), "{e}");
        }
        let e = config(&[("REDIS_URL", amr), ("REDIS_AUTH", "aad")]).unwrap_err();
        assert_eq!(e.var, "REDIS_AUTH");
        assert!(e.to_string().contains("entra-id"), "{e}");
        let e = config(&[("REDIS_URL", amr), ("REDIS_CLIENT_ID", "x")]).unwrap_err();
        assert_eq!(e.var, "REDIS_CLIENT_ID");
        let e = config(&[("REDIS_AUTH", "entra-id")]).unwrap_err();
        assert_eq!(e.var, "REDIS_AUTH");
        assert!(e.to_string().contains("REDIS_URL is not set"), "{e}");
        // The example settings' `access-key` with no cache is the default.
        assert!(config(&[("REDIS_AUTH", "access-key")]).is_ok());
    }

    #[test]
    fn azure_redis_form_becomes_a_tls_url_with_an_encoded_key() {
        let url = redis_url(
            "cache.redis.cache.windows.net:6380,password=ab+c/d=,ssl=True,abortConnect=False",
        )
        .unwrap();
        assert_eq!(
            url,
            "rediss://:ab%2Bc%2Fd%3D@cache.redis.cache.windows.net:6380"
        );
        assert_eq!(
            redis_url("127.0.0.1:6379").unwrap(),
            "redis://127.0.0.1:6379"
        );
        assert_eq!(
            redis_url("redis://127.0.0.1:7000/0").unwrap(),
            "redis://127.0.0.1:7000/0"
        );
        for bad in [
            "cache:6380;password=S3cretKey",
            "default:S3cretKey@host",
            "cache S3cretKey:6380",
            "http://S3cretKey@host",
            "redis://:S3cretKey@host:notaport",
        ] {
            let e = redis_url(bad).unwrap_err().to_string();
            assert!(e.starts_with("REDIS_URL: "), "{e}");
            assert!(!e.contains("S3cretKey"), "{bad} leaked into {e}");
        }
    }
}
