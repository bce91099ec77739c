//! The SQL Server under test (`ORDER_GUARD_TEST_MSSQL`, the T-SQL engine in
//! CI): stores on it, fresh databases, least-privileged logins, a raw
//! client of the owner's, and an engine of a test's own.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use order_guard::store::OrderStore;

use super::free_port;

/// The SQL Server to test against: `ORDER_GUARD_TEST_MSSQL` (an ADO.NET
/// string; `scripts/test.sh` starts the T-SQL engine and sets it). `None`
/// after saying, once and on the real stderr, that the SQL Server tests of
/// this binary do not run: they then neither run nor pass.
pub fn mssql_connection_string() -> Option<String> {
    match std::env::var("ORDER_GUARD_TEST_MSSQL") {
        Ok(cs) if !cs.trim().is_empty() => Some(cs),
        _ => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "SQL Server tests NOT RUN: set ORDER_GUARD_TEST_MSSQL to an ADO.NET connection \
                     string, or run scripts/test.sh, which starts the T-SQL engine and sets it"
                );
            });
            None
        }
    }
}

/// Settings for SQL Server stores in tests.
pub fn mssql_settings(query_timeout: Duration) -> order_guard::store::sqlserver::SqlServerSettings {
    order_guard::store::sqlserver::SqlServerSettings {
        connect_timeout: Duration::from_secs(10),
        query_timeout,
        pool_size: 20,
        migrate_timeout: order_guard::store::sqlserver::DEFAULT_MIGRATE_TIMEOUT,
        migrate_batch_rows: order_guard::store::sqlserver::DEFAULT_MIGRATE_BATCH_ROWS,
        idle_timeout: order_guard::store::sqlserver::DEFAULT_IDLE_TIMEOUT,
    }
}

/// A migrated SQL Server store on `cs`, used as it is deployed (README
/// step 4): `cs` (the owner) runs `migrate`, and the store logs in as the
/// app, a login whose database user has only the role `order_guard_app`
/// ([`mssql_app_connection_string`]).
pub async fn mssql_store(
    cs: &str,
    query_timeout: Duration,
) -> Arc<order_guard::store::SqlServerStore> {
    let app = mssql_app_connection_string(cs).await;
    let store = order_guard::store::SqlServerStore::connect(&app, &mssql_settings(query_timeout))
        .expect("ORDER_GUARD_TEST_MSSQL is not a usable connection string");
    store
        .migrate()
        .await
        .expect("the app's login cannot use the SQL Server named by ORDER_GUARD_TEST_MSSQL");
    Arc::new(store)
}

/// Wait until `store`'s pool is at rest: no login in flight, and more idle
/// connections than it keeps in reserve (`pool::MIN_IDLE`, reopened in the
/// background), so the next call that takes one starts no login. Tests
/// that count what goes over the wire, or drop it, start from here.
pub async fn mssql_pool_at_rest(store: &order_guard::store::SqlServerStore) {
    let reserve = u64::from(order_guard::store::sqlserver::pool::MIN_IDLE);
    let given_up = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let pool = store.load().pool.expect("a SQL Server store has a pool");
        if pool.idle > reserve && pool.logins_running + pool.logins_waiting == 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < given_up,
            "the pool never came to rest: {pool:?}"
        );
        // Polling the pool's own gauge: bb8 has no event for "at rest".
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The password of the tests' least-privileged logins (a test server's).
pub const MSSQL_APP_PASSWORD: &str = "OgApp!Test-Pass1";

/// `cs`'s database name (`Initial Catalog` or `Database`).
pub fn mssql_database_of(cs: &str) -> String {
    cs.split(';')
        .find_map(|p| {
            let (k, v) = p.split_once('=')?;
            matches!(
                k.trim().to_ascii_lowercase().as_str(),
                "initial catalog" | "database"
            )
            .then(|| v.trim().to_string())
        })
        .expect("an Initial Catalog in the connection string")
}

/// `cs` logged in as `login` with [`MSSQL_APP_PASSWORD`].
pub fn mssql_as_login(cs: &str, login: &str) -> String {
    ado_without(
        cs,
        &["user id", "uid", "user", "password", "pwd"],
        &format!("User ID={login};Password={MSSQL_APP_PASSWORD}"),
    )
}

/// A login of the tests' own for `cs`'s database and a user `user` for it
/// there (`CREATE LOGIN` is server-wide: named after the database), made
/// once; `roles` it is made a member of. Its connection string.
pub async fn mssql_login(cs: &str, user: &str, roles: &[&str]) -> String {
    let database = mssql_database_of(cs);
    let login = format!("{user}_{database}");
    let mut owner = mssql_raw_client(cs).await;
    let mut batch = format!(
        "IF NOT EXISTS (SELECT 1 FROM sys.server_principals WHERE name = N'{login}') \
         CREATE LOGIN [{login}] WITH PASSWORD = '{MSSQL_APP_PASSWORD}';\n\
         IF DATABASE_PRINCIPAL_ID(N'{user}') IS NULL CREATE USER [{user}] FOR LOGIN [{login}];\n"
    );
    for role in roles {
        batch.push_str(&format!("ALTER ROLE {role} ADD MEMBER [{user}];\n"));
    }
    let made = async {
        owner
            .simple_query(batch.as_str())
            .await?
            .into_results()
            .await
    };
    made.await
        .unwrap_or_else(|e| panic!("cannot make the login {login} and its user: {e}\n{batch}"));
    mssql_as_login(cs, &login)
}

/// The connection string of the app as docs/deploy.md step 4 deploys it, on `cs`'s
/// database: migrated first as `cs` (the owner, as `order-guard migrate`
/// does), then a login whose user is only a member of `order_guard_app`.
/// Made once per database and test process.
pub async fn mssql_app_connection_string(cs: &str) -> String {
    static DONE: tokio::sync::Mutex<Vec<(String, String)>> =
        tokio::sync::Mutex::const_new(Vec::new());
    let mut done = DONE.lock().await;
    if let Some((_, app)) = done.iter().find(|(owner, _)| owner == cs) {
        return app.clone();
    }
    let owner =
        order_guard::store::SqlServerStore::connect(cs, &mssql_settings(Duration::from_secs(30)))
            .expect("ORDER_GUARD_TEST_MSSQL is not a usable connection string");
    owner
        .upgrade()
        .await
        .expect("cannot migrate the SQL Server named by ORDER_GUARD_TEST_MSSQL");
    let app = mssql_login(
        cs,
        "og_app",
        &[order_guard::store::sqlserver::sql::APP_ROLE],
    )
    .await;
    done.push((cs.to_string(), app.clone()));
    app
}

/// A plain connection of the test's own on `cs`, outside any store (to hold
/// locks, create databases, audit tables).
pub async fn mssql_raw_client(cs: &str) -> order_guard::store::sqlserver::pool::Client {
    let info = order_guard::store::sqlserver::connstr::SqlConnInfo::parse(cs).unwrap();
    order_guard::store::sqlserver::pool::open_following_redirect(info.tiberius_config())
        .await
        .expect("cannot open a test connection to the SQL Server under test")
}

/// `cs` without the settings named by `keys` (any case), plus `extra`.
pub fn ado_without(cs: &str, keys: &[&str], extra: &str) -> String {
    let mut parts: Vec<String> = cs
        .split(';')
        .filter(|p| {
            let key = p
                .split('=')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            !p.trim().is_empty() && !keys.contains(&key.as_str())
        })
        .map(str::to_string)
        .collect();
    parts.push(extra.to_string());
    parts.join(";")
}

/// The version-2 schema (`tests/fixtures/sqlserver-schema-v2.sql`, from git
/// history) as its batches, to build a database an upgrade starts from.
pub fn mssql_v2_schema_batches() -> Vec<String> {
    include_str!("../fixtures/sqlserver-schema-v2.sql")
        .split("\nGO\n")
        .map(str::trim)
        .filter(|b| {
            b.lines()
                .any(|l| !l.trim().is_empty() && !l.trim().starts_with("--"))
        })
        .map(str::to_string)
        .collect()
}

/// A new, empty database on the server of `cs`, and its connection string.
pub async fn mssql_fresh_database(cs: &str) -> String {
    // One at a time: Babelfish refuses concurrent CREATE DATABASEs
    // ("tuple concurrently updated").
    static CREATING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _one = CREATING.lock().await;
    let name = format!("og_{}", uuid::Uuid::new_v4().simple());
    let mut admin = mssql_raw_client(cs).await;
    let created = async {
        admin
            .simple_query(format!("CREATE DATABASE [{name}]"))
            .await?
            .into_results()
            .await
    };
    created.await.expect("CREATE DATABASE on the test server");
    ado_without(
        cs,
        &["initial catalog", "database"],
        &format!("Initial Catalog={name}"),
    )
}

/// A T-SQL engine of a test's own on a free port, in its own state folder,
/// which the test may stop and start (`tsql-server`, named by
/// `ORDER_GUARD_TSQL_SERVER`; `scripts/test.sh` sets it). Stopped when dropped.
pub struct OwnEngine {
    tool: String,
    pub port: u16,
    dir: tempfile::TempDir,
}

impl OwnEngine {
    /// Panics, saying what is missing, when the engine's command is not known.
    pub fn new() -> OwnEngine {
        let tool = std::env::var("ORDER_GUARD_TSQL_SERVER").unwrap_or_else(|_| {
            panic!(
                "ORDER_GUARD_TSQL_SERVER is not set: this test stops and starts a T-SQL engine \
                 of its own and needs the tsql-server command (scripts/test.sh sets it)"
            )
        });
        // Reachable by the engine's system user (so not under /root).
        let dir = tempfile::Builder::new()
            .prefix("og-engine-")
            .tempdir_in("/tmp")
            .expect("temp dir for the engine");
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .expect("chmod the engine's folder");
        OwnEngine {
            tool,
            port: free_port(),
            dir,
        }
    }

    /// Where the engine keeps its state: its data files, copied while it is
    /// stopped, are a backup of every database on it.
    pub fn state(&self) -> std::path::PathBuf {
        self.dir.path().join(self.port.to_string())
    }

    /// `start --database DB` (prints the ADO.NET string, returned) or `stop`.
    pub fn command(&self, args: &[&str]) -> String {
        let out = Command::new(&self.tool)
            .args(args)
            .args(["--port", &self.port.to_string()])
            .env("TSQL_SERVER_DIR", self.dir.path())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.tool));
        assert!(
            out.status.success(),
            "tsql-server {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for OwnEngine {
    fn drop(&mut self) {
        let _ = Command::new(&self.tool)
            .args(["stop", "--port", &self.port.to_string()])
            .env("TSQL_SERVER_DIR", self.dir.path())
            .output();
    }
}
