//! All settings, from the environment only, with defaults and clear errors.
//!
//! An invalid value fails at start with a message naming the variable and what
//! it expected. Secrets (passwords, access keys) never appear in messages.

use std::time::Duration;

use crate::body::Limits;
use crate::deadletter::DeadLetterSettings;
use crate::finished::FinishedCacheSettings;
use crate::guard::GuardSettings;
use crate::guard::MEMORY_GUARD_MAX_COMPLETED;
use crate::hosting;
use crate::order::FractionalNumbers;
use crate::outbox::OutboxSettings;
use crate::processor::{GuardPolicy, ProcessorSettings};
use crate::store::sqlserver::SqlServerSettings;
use crate::telemetry::TelemetrySettings;
use crate::webhook::WebhookSettings;

mod dead_letter;
mod guard;
mod outbox;
mod state;
mod telemetry;
mod webhook;

pub use self::webhook::{DEFAULT_WEBHOOK_PORT, WEBHOOK_VARIABLES};

pub use dead_letter::DEFAULT_DEAD_LETTER_CONTAINER;
pub use guard::{redis_url, GuardConfig, RedisAuth};
pub use outbox::DEFAULT_OUTBOX_QUEUE;
pub use state::{StoreConfig, DEFAULT_SQLITE_PATH};

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
    /// Where executions are announced (`OUTBOX_*`; kept, not sent, by default).
    pub outbox: OutboxSettings,
    /// Event Grid's webhook (`WEBHOOK_*`), or what is missing for it: only
    /// the `webhook` command needs it.
    pub webhook: Result<WebhookSettings, ConfigError>,
    /// The state settings left unset (`REDIS_URL`, `SQL_CONNECTION_STRING`),
    /// so on their embedded default: operator commands that act on
    /// production data refuse to run that way by accident.
    pub defaulted_state: Vec<&'static str>,
}

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
        // The app's user-assigned identity, as Azure's SDKs and Microsoft's
        // templates name it: every Azure client signs in as it (Redis
        // unless REDIS_CLIENT_ID names another; SQL takes `User ID`).
        let azure_client_id = match val("AZURE_CLIENT_ID") {
            Some(id) if uuid::Uuid::parse_str(&id).is_err() => {
                return Err(err(
                    "AZURE_CLIENT_ID",
                    format!("expected the user-assigned identity's client id, a GUID (az identity show --query clientId), got {id:?}"),
                ))
            }
            id => id,
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
                    let auth = guard::redis_auth(
                        val("REDIS_AUTH"),
                        val("REDIS_CLIENT_ID"),
                        azure_client_id.clone(),
                        &url,
                    )?;
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
        let runs = hosting::runs(&get, hosting::Door::Host);
        let store = state::store(&val, &runs)?;
        // The webhook's own place: Core Tools never starts it, so its mark
        // does not make the embedded state or an open door safe there.
        let webhook_runs = hosting::runs(&get, hosting::Door::Webhook);
        let webhook = state::embedded_state_allowed(&val, &webhook_runs, &store)
            .and_then(|()| webhook::webhook(&val, &webhook_runs));
        let dead_letter = dead_letter::dead_letter(
            val("DEAD_LETTER_STORAGE"),
            azure_client_id.as_deref(),
            val("DEAD_LETTER_CONTAINER"),
            num(
                "DEAD_LETTER_MAX_BLOB_BYTES",
                crate::deadletter::DEFAULT_MAX_BLOB_BYTES,
                64 * 1024,
                32 * 1024 * 1024,
            )?,
        )?;
        let telemetry = telemetry::telemetry(&val)?;
        // Dispatched announcements are kept at least as long as Event Grid
        // retries a delivery (24 h): a week by default.
        let mut outbox = outbox::outbox(
            &val,
            azure_client_id.as_deref(),
            num("OUTBOX_RETENTION_HOURS", 168, 24, 24 * 365)?,
        )?;
        // Longer than a round's sends (eight at a time, each bounded by
        // the client's own timeouts); shorter means quicker re-sends after
        // a dispatcher dies, and more copies when a round is slow.
        outbox.dispatch.lease = Duration::from_secs(num("OUTBOX_LEASE_SECONDS", 30, 1, 600)?);
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
                // `order-guard migrate` may rewrite every position row of an
                // old schema: its own bound, far above a query's.
                migrate_timeout: Duration::from_secs(num(
                    "SQL_MIGRATE_TIMEOUT_SECONDS",
                    crate::store::sqlserver::DEFAULT_MIGRATE_TIMEOUT.as_secs(),
                    1,
                    7 * 24 * 3600,
                )?),
                migrate_batch_rows: num(
                    "SQL_MIGRATE_BATCH_ROWS",
                    u64::from(crate::store::sqlserver::DEFAULT_MIGRATE_BATCH_ROWS),
                    1,
                    1_000_000,
                )? as u32,
                // At most 235 s: under the 4 minutes after which Azure's
                // load balancers and gateway drop an idle connection silently.
                idle_timeout: Duration::from_secs(num(
                    "SQL_IDLE_TIMEOUT_SECONDS",
                    crate::store::sqlserver::DEFAULT_IDLE_TIMEOUT.as_secs(),
                    5,
                    235,
                )?),
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
            outbox,
            webhook,
            defaulted_state: ["REDIS_URL", "SQL_CONNECTION_STRING"]
                .into_iter()
                .filter(|var| val(var).is_none())
                .collect(),
        })
    }
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::HashMap;

    pub(crate) fn config(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
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
                path: DEFAULT_SQLITE_PATH.into(),
                create_if_missing: true,
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
            // Azure drops a connection idle for 4 minutes without a word.
            ("SQL_IDLE_TIMEOUT_SECONDS", "240"),
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
}
