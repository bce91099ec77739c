//! `SQL_CONNECTION_STRING`, and where the embedded state (in-memory guard,
//! SQLite file) may run.

use std::path::PathBuf;

use super::{err, ConfigError};
use crate::hosting::Runs;

/// Default SQLite file when `SQL_CONNECTION_STRING` is empty.
pub const DEFAULT_SQLITE_PATH: &str = "./order-guard.db";

/// Where the orders live. `Debug` never shows the connection string.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreConfig {
    /// Embedded SQLite file. `create_if_missing`: whether a command that
    /// executes orders may create the file (the local default, or
    /// `sqlite:PATH?mode=rwc`); otherwise a missing file stops it, since an
    /// unmounted volume looks the same as a first start, and a new empty
    /// database would execute every order again.
    Sqlite {
        path: PathBuf,
        create_if_missing: bool,
    },
    /// SQL Server / Azure SQL, ADO.NET connection string.
    SqlServer { connection_string: String },
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreConfig::Sqlite {
                path,
                create_if_missing,
            } => f
                .debug_struct("Sqlite")
                .field("path", path)
                .field("create_if_missing", create_if_missing)
                .finish(),
            StoreConfig::SqlServer { .. } => f
                .debug_struct("SqlServer")
                .field("connection_string", &"(not shown)")
                .finish(),
        }
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

/// `SQL_CONNECTION_STRING` read, the embedded state refused where it is
/// unsafe. `val` answers a variable's trimmed, non-empty value; `runs` is
/// where the handler runs ([`crate::hosting::runs`]).
///
/// Where a Functions host other than Core Tools runs us (an Azure plan, a
/// container of the user's own) the embedded state is wrong: a memory guard
/// or a local file is one per instance (an order retried onto another
/// replica executes again, a restart forgets every order), and the app root
/// may be a read-only package mount or a shared file system where SQLite's
/// locks are unsafe. So `REDIS_URL` and a SQL Server
/// `SQL_CONNECTION_STRING` are required there, and an explicit `sqlite:`
/// is refused too, unless `ORDER_GUARD_ALLOW_EMBEDDED_STATE=true`.
pub(super) fn store(
    val: &dyn Fn(&str) -> Option<String>,
    runs: &Runs,
) -> Result<StoreConfig, ConfigError> {
    let store = match val("SQL_CONNECTION_STRING") {
        // The local default is created on first use; where the embedded
        // state is only allowed (a hosted instance), it is not.
        None => StoreConfig::Sqlite {
            path: PathBuf::from(DEFAULT_SQLITE_PATH),
            create_if_missing: runs.embedded_state_is_safe(),
        },
        Some(v) => match v.strip_prefix("sqlite:") {
            Some(file) => sqlite_file(file)?,
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
    embedded_state_allowed(val, runs, &store)?;
    Ok(store)
}

/// `store` refused when it is the embedded state (an in-memory guard
/// without `REDIS_URL`, a SQLite file) and `runs` is where several
/// replicas, or a fresh disk, may run, unless
/// `ORDER_GUARD_ALLOW_EMBEDDED_STATE=true` says this deployment is one
/// replica on a disk of its own.
pub(super) fn embedded_state_allowed(
    val: &dyn Fn(&str) -> Option<String>,
    runs: &Runs,
    store: &StoreConfig,
) -> Result<(), ConfigError> {
    if runs.embedded_state_is_safe() || allowed(val("ORDER_GUARD_ALLOW_EMBEDDED_STATE"))? {
        return Ok(());
    }
    let fix = "set it in the app's settings (Application settings in Azure, the container's environment elsewhere), or, for a deliberate single-replica deployment on a disk of its own, set ORDER_GUARD_ALLOW_EMBEDDED_STATE=true to run on one process's own state anyway";
    for var in ["REDIS_URL", "SQL_CONNECTION_STRING"] {
        if val(var).is_none() {
            return Err(err(
                var,
                format!("is not set, and this runs {runs}, where the embedded default (in-memory guard, SQLite file in the app root) is per instance and unsafe; {fix}"),
            ));
        }
    }
    if let StoreConfig::Sqlite { .. } = store {
        return Err(err(
            "SQL_CONNECTION_STRING",
            format!("is a SQLite file (sqlite:…), and this runs {runs}, where a SQLite file is one per instance or shared unsafely between instances; give Azure SQL's (or SQL Server's) ADO.NET connection string, or, for a deliberate single-replica deployment, set ORDER_GUARD_ALLOW_EMBEDDED_STATE=true to run on a SQLite file anyway"),
        ));
    }
    Ok(())
}

/// `sqlite:PATH`, `sqlite:PATH?mode=rw` (the file must exist) or
/// `sqlite:PATH?mode=rwc` (created when missing), after SQLite's own URI
/// modes.
fn sqlite_file(setting: &str) -> Result<StoreConfig, ConfigError> {
    let (path, create_if_missing) = match setting.split_once('?') {
        None => (setting, false),
        Some((path, "mode=rw")) => (path, false),
        Some((path, "mode=rwc")) => (path, true),
        Some((_, other)) => {
            return Err(err(
                "SQL_CONNECTION_STRING",
                format!("sqlite:PATH takes ?mode=rwc (create the file when missing) or ?mode=rw (the default: the file must exist), got ?{other}"),
            ))
        }
    };
    if path.is_empty() {
        return Err(err(
            "SQL_CONNECTION_STRING",
            "sqlite: needs a file path, e.g. sqlite:./order-guard.db",
        ));
    }
    Ok(StoreConfig::Sqlite {
        path: path.into(),
        create_if_missing,
    })
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::config;
    use crate::config::GuardConfig;

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
        // A SQLite file of its own is refused too, once Redis is given.
        let e = with(&[
            ("REDIS_URL", "redis://cache:6379"),
            ("SQL_CONNECTION_STRING", "sqlite:/home/orders.db"),
        ])
        .unwrap_err();
        assert_eq!(e.var, "SQL_CONNECTION_STRING", "{name}: {e}");
        assert!(e.to_string().contains("SQLite file"), "{name}: {e}");
        assert!(e.to_string().contains(name), "{name}: {e}");
        let allowed = with(&[
            ("REDIS_URL", "redis://cache:6379"),
            ("SQL_CONNECTION_STRING", "sqlite:/home/orders.db"),
            ("ORDER_GUARD_ALLOW_EMBEDDED_STATE", "true"),
        ]);
        assert!(allowed.is_ok(), "{name}: {allowed:?}");
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
                path: "/tmp/x.db".into(),
                create_if_missing: false,
            }
        );
        let ado = "Server=tcp:s.database.windows.net,1433;Initial Catalog=o;User ID=u;Password=p;Encrypt=True;";
        let c = config(&[("SQL_CONNECTION_STRING", ado)]).unwrap();
        assert!(matches!(c.store, StoreConfig::SqlServer { .. }));
    }

    /// Functions containers hosted by their users: a Functions
    /// host that is not Core Tools refuses the embedded state as a plan does.
    #[test]
    fn refused_in_self_hosted_functions_containers() {
        refused_on(
            "FUNCTIONS_WORKER_RUNTIME=custom without FUNCTIONS_CORETOOLS_ENVIRONMENT=true; KUBERNETES_SERVICE_HOST is set",
            &[
                ("FUNCTIONS_WORKER_RUNTIME", "custom"),
                ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
                ("AzureWebJobsScriptRoot", "/home/site/wwwroot"),
            ],
        );
        refused_on(
            "CONTAINER_APP_NAME is set: Azure Container Apps",
            &[
                ("FUNCTIONS_WORKER_RUNTIME", "custom"),
                ("CONTAINER_APP_NAME", "orders"),
            ],
        );
        refused_on(
            "AzureWebJobsScriptRoot is set: a Functions container image",
            &[
                ("FUNCTIONS_WORKER_RUNTIME", "custom"),
                ("AzureWebJobsScriptRoot", "/home/site/wwwroot"),
            ],
        );
    }

    /// Core Tools (`func start` with local.settings.json as shipped) and no
    /// Functions host at all run on the embedded defaults, SQLite files too.
    #[test]
    fn core_tools_and_no_host_run_on_the_embedded_state() {
        for env in [
            &[
                ("FUNCTIONS_WORKER_RUNTIME", "custom"),
                ("FUNCTIONS_CORETOOLS_ENVIRONMENT", "true"),
            ][..],
            &[],
        ] {
            let c = config(env).unwrap();
            assert_eq!(c.guard, GuardConfig::Memory, "{env:?}");
            let mut with_file = env.to_vec();
            with_file.push(("SQL_CONNECTION_STRING", "sqlite:./x.db"));
            assert!(config(&with_file).is_ok(), "{env:?}");
        }
    }

    /// `Debug` locates the store and never shows a connection string (the
    /// secret test elsewhere only proves the latter, which an empty output
    /// would pass too).
    #[test]
    fn debug_shows_where_the_store_is_and_no_connection_string() {
        let file = StoreConfig::Sqlite {
            path: "/data/o.db".into(),
            create_if_missing: false,
        };
        assert_eq!(
            format!("{file:?}"),
            r#"Sqlite { path: "/data/o.db", create_if_missing: false }"#
        );
        let server = StoreConfig::SqlServer {
            connection_string: "Server=tcp:db;Password=hunter2".into(),
        };
        assert_eq!(
            format!("{server:?}"),
            r#"SqlServer { connection_string: "(not shown)" }"#
        );
    }

    /// A named file is created only when asked: an unmounted volume would
    /// otherwise get a new, empty database (every order executed again).
    #[test]
    fn a_named_sqlite_file_is_created_only_with_mode_rwc() {
        let file = |setting: &str| match config(&[("SQL_CONNECTION_STRING", setting)]) {
            Ok(c) => Ok(c.store),
            Err(e) => Err(e.to_string()),
        };
        let sqlite = |path: &str, create_if_missing| {
            Ok(StoreConfig::Sqlite {
                path: path.into(),
                create_if_missing,
            })
        };
        assert_eq!(file("sqlite:/d/o.db"), sqlite("/d/o.db", false));
        assert_eq!(file("sqlite:/d/o.db?mode=rw"), sqlite("/d/o.db", false));
        assert_eq!(file("sqlite:/d/o.db?mode=rwc"), sqlite("/d/o.db", true));
        let e = file("sqlite:/d/o.db?mode=ro").unwrap_err();
        assert!(e.contains("?mode=rwc") && e.contains("got ?mode=ro"), "{e}");
        let e = file("sqlite:?mode=rwc").unwrap_err();
        assert!(e.contains("needs a file path"), "{e}");
    }

    /// The default file is created where the embedded state is safe (a
    /// local run, Core Tools), not where it is only allowed.
    #[test]
    fn the_default_file_is_created_only_where_the_embedded_state_is_safe() {
        let created = |env: &[(&str, &str)]| match config(env).unwrap().store {
            StoreConfig::Sqlite {
                create_if_missing, ..
            } => create_if_missing,
            StoreConfig::SqlServer { .. } => panic!("the default is SQLite"),
        };
        assert!(created(&[]));
        assert!(created(&[
            ("FUNCTIONS_WORKER_RUNTIME", "custom"),
            ("FUNCTIONS_CORETOOLS_ENVIRONMENT", "true"),
        ]));
        assert!(!created(&[
            ("FUNCTIONS_WORKER_RUNTIME", "custom"),
            ("CONTAINER_APP_NAME", "orders"),
            ("REDIS_URL", "redis://r:6379"),
            ("ORDER_GUARD_ALLOW_EMBEDDED_STATE", "true"),
        ]));
    }
}
