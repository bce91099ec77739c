//! Shared test harness: a real `redis-server` on a free loopback port, real
//! SQLite files, a real handler on an ephemeral port, and a host-like client.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

pub mod azurite;
pub mod identity;
pub mod proxy;

use order_guard::guard::{GuardSettings, IdempotencyGuard, MemoryGuard, RedisGuard};
use order_guard::processor::{Processor, ProcessorSettings};
use order_guard::store::{OrderStore, SqliteStore};
use serde_json::{json, Value};

/// A loopback port nobody listens on right now, and never handed out
/// before in this process: the kernel may give a port just released to the
/// next `bind(0)`, and tests running in parallel (each starting servers,
/// cluster nodes with their bus ports) must not pick one port twice.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("cannot bind a loopback port")
            .port();
        if GIVEN.lock().unwrap_or_else(|p| p.into_inner()).insert(port) {
            return port;
        }
    }
}

/// The `redis-server` binary, or a panic that says how to get one.
pub fn redis_server_binary() -> String {
    let bin = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into());
    match Command::new(&bin).arg("--version").output() {
        Ok(o) if o.status.success() => bin,
        _ => panic!(
            "redis-server is missing: these tests need a real Redis. Install it \
             (`apt-get install -y redis-server`) or run `scripts/test.sh`, which does; \
             REDIS_SERVER_BIN may point at another binary"
        ),
    }
}

/// A real `redis-server` owned by one test, on its own port, no persistence.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_on(free_port())
    }

    /// Start on a given port (e.g. one a handler was already told to use).
    pub fn start_on(port: u16) -> RedisServer {
        let mut server = RedisServer {
            port,
            child: None,
            dir: tempfile::tempdir().expect("temp dir"),
        };
        server.launch();
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's process id (for SIGSTOP/SIGCONT), `None` while stopped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Every key matching `pattern` with its value (strings only) and TTL.
    pub fn keys_with_ttl(&self, pattern: &str) -> Vec<(String, Option<String>, i64)> {
        let keys: Vec<String> = match self.cmd(&["KEYS", pattern]) {
            redis::Value::Array(items) => items
                .into_iter()
                .map(|v| match v {
                    redis::Value::BulkString(b) => String::from_utf8(b).unwrap(),
                    other => panic!("KEYS {pattern}: unexpected {other:?}"),
                })
                .collect(),
            other => panic!("KEYS {pattern}: unexpected {other:?}"),
        };
        keys.into_iter()
            .map(|k| {
                let v = self.get(&k);
                let ttl = self.ttl(&k);
                (k, v, ttl)
            })
            .collect()
    }

    /// Start the process and wait for its "Ready to accept connections" line.
    fn launch(&mut self) {
        let child = start_redis_server(self.port, self.dir.path(), &[], "redis-server");
        self.child = Some(child);
    }

    /// Kill the server (like a crash or a failover).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start it again on the same port, empty.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// Run a redis-cli-like command synchronously through redis-rs.
    pub fn cmd(&self, args: &[&str]) -> redis::Value {
        let client = redis::Client::open(self.url()).unwrap();
        let mut con = client.get_connection().expect("connect to test redis");
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        c.query(&mut con).expect("redis command")
    }

    pub fn get(&self, key: &str) -> Option<String> {
        match self.cmd(&["GET", key]) {
            redis::Value::Nil => None,
            redis::Value::BulkString(b) => Some(String::from_utf8(b).unwrap()),
            other => panic!("GET {key}: unexpected {other:?}"),
        }
    }

    pub fn ttl(&self, key: &str) -> i64 {
        match self.cmd(&["TTL", key]) {
            redis::Value::Int(n) => n,
            other => panic!("TTL {key}: unexpected {other:?}"),
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The `redis-cli` binary (it creates clusters), or a panic that says how
/// to get one.
pub fn redis_cli_binary() -> String {
    let bin = std::env::var("REDIS_CLI_BIN").unwrap_or_else(|_| "redis-cli".into());
    match Command::new(&bin).arg("--version").output() {
        Ok(o) if o.status.success() => bin,
        _ => panic!(
            "redis-cli is missing: the cluster tests create a real Redis cluster with \
             `redis-cli --cluster create`. Install it (`apt-get install -y redis-tools`, \
             which redis-server brings) or run `scripts/test.sh`; REDIS_CLI_BIN may point \
             at another binary"
        ),
    }
}

/// One `redis-server --cluster-enabled yes` process of a [`RedisCluster`].
struct ClusterNode {
    port: u16,
    bus_port: u16,
    dir: std::path::PathBuf,
    child: Option<Child>,
}

/// A real Redis cluster of three masters and three replicas on loopback
/// ports, each node in its own folder of a temp dir, no persistence (a
/// restarted node comes back empty and resyncs from its master). Killed when
/// dropped.
pub struct RedisCluster {
    nodes: Vec<ClusterNode>,
    node_timeout_ms: u64,
    _dir: tempfile::TempDir,
}

/// What `CLUSTER NODES` says of one node.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub id: String,
    pub port: u16,
    pub master: bool,
    /// The master's id, for a replica.
    pub master_id: Option<String>,
    pub failed: bool,
    pub connected: bool,
}

impl RedisCluster {
    /// Start six nodes and join them (`redis-cli --cluster create …
    /// --cluster-replicas 1`); returns once every node says
    /// `cluster_state:ok` and knows all six. `node_timeout_ms` is
    /// `cluster-node-timeout`: how long a master may be unreachable before
    /// its replica is promoted.
    pub fn start(node_timeout_ms: u64) -> RedisCluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut cluster = RedisCluster {
            nodes: (0..6)
                .map(|i| {
                    let node_dir = dir.path().join(format!("node-{i}"));
                    std::fs::create_dir(&node_dir).expect("node dir");
                    ClusterNode {
                        port: free_port(),
                        bus_port: free_port(),
                        dir: node_dir,
                        child: None,
                    }
                })
                .collect(),
            node_timeout_ms,
            _dir: dir,
        };
        for i in 0..cluster.nodes.len() {
            cluster.launch(i);
        }
        let mut create = Command::new(redis_cli_binary());
        create.arg("--cluster").arg("create");
        for n in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("cannot run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.wait_until("every node in a healthy cluster of six", |c| {
            c.live_ports().iter().all(|p| {
                c.state_ok(*p)
                    && c.nodes_of(*p)
                        .is_some_and(|n| n.len() == 6 && n.iter().all(|i| i.connected && !i.failed))
            })
        });
        cluster.wait_until("every replica's link to its master up", |c| {
            c.live_ports().iter().all(|p| {
                let info = c.info_replication(*p);
                !info.contains("role:slave") || info.contains("master_link_status:up")
            })
        });
        cluster
    }

    fn info_replication(&self, port: u16) -> String {
        self.text_on(port, &["INFO", "replication"])
            .unwrap_or_default()
    }

    fn info_number(info: &str, field: &str) -> Option<i64> {
        info.lines().find_map(|l| {
            l.trim()
                .strip_prefix(field)?
                .strip_prefix(':')?
                .parse()
                .ok()
        })
    }

    /// Wait until the replica of the master on `port` has everything the
    /// master had written when this was called (replication offsets).
    pub fn wait_replicated(&self, port: u16) {
        let target = Self::info_number(&self.info_replication(port), "master_repl_offset")
            .expect("master_repl_offset");
        let id = self
            .nodes_of(port)
            .expect("CLUSTER NODES")
            .into_iter()
            .find(|n| n.port == port)
            .expect("the node itself")
            .id;
        let replica = self
            .nodes_of(port)
            .unwrap()
            .into_iter()
            .find(|n| n.master_id.as_deref() == Some(id.as_str()))
            .expect("a replica")
            .port;
        self.wait_until("the replica caught up with its master", |c| {
            Self::info_number(&c.info_replication(replica), "slave_repl_offset")
                .is_some_and(|o| o >= target)
        });
    }

    /// A seed URL (any node; the client finds the others).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.live_ports()[0])
    }

    /// Ports of the nodes whose process runs.
    pub fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.port)
            .collect()
    }

    fn launch(&mut self, i: usize) {
        let n = &self.nodes[i];
        let (bus, timeout) = (n.bus_port.to_string(), self.node_timeout_ms.to_string());
        let cluster = [
            "--cluster-enabled",
            "yes",
            "--cluster-port",
            &bus,
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &timeout,
        ];
        let child = start_redis_server(n.port, &n.dir, &cluster, "cluster node");
        self.nodes[i].child = Some(child);
    }

    /// A command to the node on `port`; `None` when it cannot be reached.
    pub fn cmd_on(&self, port: u16, args: &[&str]) -> Option<redis::Value> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
        let mut con = client
            .get_connection_with_timeout(Duration::from_secs(2))
            .ok()?;
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        c.query(&mut con).ok()
    }

    fn text_on(&self, port: u16, args: &[&str]) -> Option<String> {
        match self.cmd_on(port, args)? {
            redis::Value::BulkString(b) => Some(String::from_utf8_lossy(&b).into_owned()),
            redis::Value::VerbatimString { text, .. } => Some(text),
            redis::Value::SimpleString(s) => Some(s),
            _ => None,
        }
    }

    fn state_ok(&self, port: u16) -> bool {
        self.text_on(port, &["CLUSTER", "INFO"])
            .is_some_and(|t| t.lines().any(|l| l.trim() == "cluster_state:ok"))
    }

    /// `CLUSTER NODES` as seen by the node on `port`.
    pub fn nodes_of(&self, port: u16) -> Option<Vec<NodeInfo>> {
        let text = self.text_on(port, &["CLUSTER", "NODES"])?;
        Some(
            text.lines()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    let addr = f.get(1)?.split('@').next()?;
                    let flags = f.get(2)?;
                    Some(NodeInfo {
                        id: f[0].to_string(),
                        port: addr.rsplit(':').next()?.parse().ok()?,
                        master: flags.contains("master"),
                        master_id: f.get(3).filter(|m| **m != "-").map(|m| m.to_string()),
                        failed: flags.contains("fail"),
                        connected: f.get(7) == Some(&"connected"),
                    })
                })
                .collect(),
        )
    }

    /// Poll (every 50 ms, up to 60 s) until `done` holds; panics naming `what`.
    pub fn wait_until(&self, what: &str, done: impl Fn(&RedisCluster) -> bool) {
        let started = std::time::Instant::now();
        while !done(self) {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the Redis cluster did not reach {what} within 60 s; nodes: {:?}",
                self.live_ports()
                    .first()
                    .and_then(|p| self.text_on(*p, &["CLUSTER", "NODES"]))
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The port of the master that holds `key`'s slot, per a live node.
    pub fn master_port_of(&self, key: &str) -> u16 {
        let port = self.live_ports()[0];
        let slot = match self.cmd_on(port, &["CLUSTER", "KEYSLOT", key]) {
            Some(redis::Value::Int(s)) => s,
            other => panic!("CLUSTER KEYSLOT {key}: {other:?}"),
        };
        let slots = self
            .cmd_on(port, &["CLUSTER", "SLOTS"])
            .expect("CLUSTER SLOTS");
        let ranges: Vec<(i64, i64, Vec<redis::Value>)> = match slots {
            redis::Value::Array(rs) => rs
                .into_iter()
                .map(|r| match r {
                    redis::Value::Array(mut v) => {
                        let m = match v.remove(2) {
                            redis::Value::Array(m) => m,
                            other => panic!("{other:?}"),
                        };
                        let int = |v: &redis::Value| match v {
                            redis::Value::Int(i) => *i,
                            other => panic!("{other:?}"),
                        };
                        (int(&v[0]), int(&v[1]), m)
                    }
                    other => panic!("{other:?}"),
                })
                .collect(),
            other => panic!("CLUSTER SLOTS: {other:?}"),
        };
        let (_, _, m) = ranges
            .into_iter()
            .find(|(a, b, _)| (*a..=*b).contains(&slot))
            .expect("slot covered");
        match &m[1] {
            redis::Value::Int(p) => *p as u16,
            other => panic!("{other:?}"),
        }
    }

    /// The master ports, per a live node.
    pub fn master_ports(&self) -> Vec<u16> {
        let port = self.live_ports()[0];
        self.nodes_of(port)
            .expect("CLUSTER NODES")
            .into_iter()
            .filter(|n| n.master && !n.failed)
            .map(|n| n.port)
            .collect()
    }

    /// SIGKILL the master on `port` and wait (polling `CLUSTER NODES`) until
    /// its replica was promoted by the cluster's own failover and every live
    /// node says `cluster_state:ok`. Returns the promoted replica's port.
    pub fn kill_master_and_wait_for_failover(&mut self, port: u16) -> u16 {
        let i = self
            .nodes
            .iter()
            .position(|n| n.port == port)
            .expect("a node of this cluster");
        let live = *self.live_ports().iter().find(|p| **p != port).unwrap();
        let before = self.nodes_of(live).expect("CLUSTER NODES");
        let id = before
            .iter()
            .find(|n| n.port == port && n.master)
            .unwrap_or_else(|| panic!("node {port} is not a master: {before:?}"))
            .id
            .clone();
        let replica = before
            .iter()
            .find(|n| n.master_id.as_deref() == Some(id.as_str()))
            .expect("the master has a replica")
            .port;
        if let Some(mut c) = self.nodes[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.wait_until("the replica promoted and cluster_state:ok", |c| {
            c.nodes_of(replica)
                .is_some_and(|ns| ns.iter().any(|n| n.port == replica && n.master))
                && c.live_ports().iter().all(|p| c.state_ok(*p))
        });
        replica
    }

    /// Start the killed node on `port` again (same folder, so the same
    /// node id) and wait until it rejoined as a connected replica and every
    /// node says `cluster_state:ok`.
    pub fn bring_back(&mut self, port: u16) {
        let i = self
            .nodes
            .iter()
            .position(|n| n.port == port)
            .expect("a node of this cluster");
        self.launch(i);
        self.wait_until("the old master back as a connected replica", |c| {
            c.live_ports().iter().all(|p| {
                c.state_ok(*p)
                    && c.nodes_of(*p).is_some_and(|ns| {
                        ns.iter()
                            .any(|n| n.port == port && !n.master && n.connected && !n.failed)
                    })
            })
        });
    }

    /// Every key matching `pattern` on every master, with its value (strings
    /// only) and TTL.
    pub fn keys_with_ttl(&self, pattern: &str) -> Vec<(String, Option<String>, i64)> {
        let mut all = Vec::new();
        for port in self.master_ports() {
            let keys: Vec<String> = match self.cmd_on(port, &["KEYS", pattern]) {
                Some(redis::Value::Array(items)) => items
                    .into_iter()
                    .map(|v| match v {
                        redis::Value::BulkString(b) => String::from_utf8(b).unwrap(),
                        other => panic!("KEYS {pattern}: unexpected {other:?}"),
                    })
                    .collect(),
                other => panic!("KEYS {pattern} on {port}: unexpected {other:?}"),
            };
            for k in keys {
                let v = match self.cmd_on(port, &["GET", &k]) {
                    Some(redis::Value::BulkString(b)) => Some(String::from_utf8(b).unwrap()),
                    _ => None,
                };
                let ttl = match self.cmd_on(port, &["TTL", &k]) {
                    Some(redis::Value::Int(t)) => t,
                    other => panic!("TTL {k}: {other:?}"),
                };
                all.push((k, v, ttl));
            }
        }
        all
    }

    /// Keys matching `pattern` whose value is `value`, on the node on `port`.
    pub fn keys_holding(&self, port: u16, pattern: &str, value: &str) -> Vec<String> {
        let keys: Vec<String> = match self.cmd_on(port, &["KEYS", pattern]) {
            Some(redis::Value::Array(items)) => items
                .into_iter()
                .filter_map(|v| match v {
                    redis::Value::BulkString(b) => String::from_utf8(b).ok(),
                    _ => None,
                })
                .collect(),
            other => panic!("KEYS {pattern} on {port}: unexpected {other:?}"),
        };
        keys.into_iter()
            .filter(|k| {
                matches!(self.cmd_on(port, &["GET", k]), Some(redis::Value::BulkString(b)) if b == value.as_bytes())
            })
            .collect()
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut c) = n.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// A guard on a test Redis cluster with short timeouts.
pub fn redis_cluster_guard(cluster: &RedisCluster, settings: GuardSettings) -> Arc<RedisGuard> {
    Arc::new(
        RedisGuard::with_topology(
            &cluster.url(),
            order_guard::guard::Topology::Cluster,
            settings,
            Duration::from_millis(500),
        )
        .unwrap(),
    )
}

/// A guard on a test Redis with short timeouts.
pub fn redis_guard(server: &RedisServer, settings: GuardSettings) -> Arc<RedisGuard> {
    Arc::new(RedisGuard::new(&server.url(), settings, Duration::from_millis(500)).unwrap())
}

pub fn memory_guard() -> Arc<MemoryGuard> {
    Arc::new(MemoryGuard::new(GuardSettings::default()))
}

/// A migrated SQLite store in a fresh temp dir (kept alive by the returned dir).
pub async fn sqlite_store() -> (Arc<SqliteStore>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("orders.db"), Duration::from_secs(5)).unwrap();
    store.migrate().await.unwrap();
    (Arc::new(store), dir)
}

pub fn processor(guard: Arc<dyn IdempotencyGuard>, store: Arc<dyn OrderStore>) -> Arc<Processor> {
    Arc::new(Processor::new(guard, store, ProcessorSettings::default()))
}

/// A processor with its cache of finished orders off: for tests of what the
/// guard and the store decide, which a cache hit would answer first.
pub fn processor_without_cache(
    guard: Arc<dyn IdempotencyGuard>,
    store: Arc<dyn OrderStore>,
) -> Arc<Processor> {
    let mut settings = ProcessorSettings::default();
    settings.finished_cache.max_bytes = 0;
    Arc::new(Processor::new(guard, store, settings))
}

/// A process stopped with SIGSTOP, resumed (SIGCONT) when this is dropped,
/// so an assertion that fails meanwhile cannot leave it hung.
pub struct Paused(u32);

/// SIGSTOP `pid` until the returned guard is dropped.
pub fn pause(pid: u32) -> Paused {
    signal(pid, "STOP");
    Paused(pid)
}

impl Drop for Paused {
    fn drop(&mut self) {
        signal(self.0, "CONT");
    }
}

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

/// The connection string of the app as README step 4 deploys it, on `cs`'s
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

/// A unique order id for one test.
pub fn unique_id(tag: &str) -> String {
    format!("{tag}-{}", uuid::Uuid::new_v4().simple())
}

/// An order payload (`data`).
pub fn order_data(id: &str, side: &str, symbol: &str, quantity: &str, account: &str) -> Value {
    json!({
        "orderId": id, "accountId": account, "side": side, "symbol": symbol,
        "quantity": serde_json::from_str::<Value>(quantity).unwrap(),
        "limitPrice": 431.15, "currency": "USD", "placedAt": "2025-06-14T09:30:02.118Z"
    })
}

/// An Event Grid schema event with a fixed `id` around `data` (the fields
/// the replay tests read back).
pub fn eg_event_with_id(id: &str, data: Value) -> Value {
    json!({
        "id": id,
        "eventType": "Trading.Order.Placed",
        "subject": "orders",
        "eventTime": "2025-06-14T09:30:02Z",
        "dataVersion": "1.0",
        "data": data,
    })
}

/// `order-guard replay` of `deliveries` (a JSON array of events) on the
/// embedded defaults in a temp dir, a clean environment plus `RUST_LOG`
/// and `vars`; what it printed, each stream apart.
pub fn replay_binary(
    deliveries: &Value,
    rust_log: &str,
    vars: &[(&str, &str)],
) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.json");
    std::fs::write(&file, deliveries.to_string()).unwrap();
    Command::new(env!("CARGO_BIN_EXE_order-guard"))
        .arg("replay")
        .arg(&file)
        .env_clear()
        .env("RUST_LOG", rust_log)
        .envs(vars.iter().copied())
        .current_dir(dir.path())
        .output()
        .expect("run order-guard")
}

/// An Event Grid schema event around `data`.
pub fn eg_event(data: Value) -> Value {
    json!({
        "id": uuid::Uuid::new_v4().to_string(),
        "topic": "/subscriptions/1111/resourceGroups/rg/providers/Microsoft.EventGrid/topics/orders",
        "subject": format!("orders/{}", data["orderId"].as_str().unwrap_or("?")),
        "eventType": "Trading.Order.Placed",
        "eventTime": "2025-06-14T09:30:02.1180000Z",
        "data": data, "dataVersion": "1.0", "metadataVersion": "1"
    })
}

/// A CloudEvents 1.0 event around `data`.
pub fn cloud_event(data: Value) -> Value {
    json!({
        "specversion": "1.0", "type": "Trading.Order.Placed",
        "source": "/subscriptions/1111/resourceGroups/rg/providers/Microsoft.EventGrid/topics/orders",
        "id": uuid::Uuid::new_v4().to_string(), "time": "2025-06-14T09:31:45.902Z",
        "subject": "orders/x", "datacontenttype": "application/json", "data": data
    })
}

/// The body the Functions host sends for a trigger value (docs/host-protocol.md, "One invocation").
pub fn invocation(trigger: Value) -> Value {
    let data = trigger.get("data").cloned().unwrap_or(Value::Null);
    json!({
        "Data": { "eventGridEvent": trigger },
        "Metadata": { "data": data, "sys": {
            "MethodName": "OrderTrigger", "UtcNow": "2025-06-14T09:30:02.4471234Z",
            "RandGuid": uuid::Uuid::new_v4().to_string() } }
    })
}

/// A handler served on an ephemeral loopback port, stopped on drop.
pub struct Handler {
    pub addr: SocketAddr,
    pub processor: Arc<Processor>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Handler {
    pub async fn start(processor: Arc<Processor>, max_body: usize) -> Handler {
        let limits = order_guard::host::Limits {
            max_body_bytes: max_body,
            ..Default::default()
        };
        Handler::start_with(processor, limits).await
    }

    pub async fn start_with(
        processor: Arc<Processor>,
        limits: order_guard::host::Limits,
    ) -> Handler {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (addr, server) = order_guard::host::bind(
            Arc::clone(&processor),
            SocketAddr::from(([127, 0, 0, 1], 0)),
            limits,
            async move {
                let _ = rx.await;
            },
            Duration::from_secs(5),
        )
        .unwrap();
        let task = tokio::spawn(server);
        Handler {
            addr,
            processor,
            stop: Some(tx),
            task: Some(task),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Signal shutdown and wait until the server has drained.
    pub async fn shutdown(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.unwrap();
        }
    }
}

/// What the handler answered.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub content_type: String,
    pub body: Value,
}

/// A request the way the host sends it (the headers of docs/host-protocol.md, "One invocation"); a
/// chunked body is streamed in `chunk`-byte pieces with no Content-Length.
pub fn host_request(
    method: &str,
    url: &str,
    body: Vec<u8>,
    chunked: Option<usize>,
) -> hyper::Request<hyper::Body> {
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(url)
        .header("Content-Type", "application/json; charset=utf-8")
        .header(
            "X-Azure-Functions-InvocationId",
            uuid::Uuid::new_v4().to_string(),
        )
        .header("X-Azure-Functions-HostVersion", "4.1037.0.0")
        .header("User-Agent", "Azure-Functions-Host/4.1037.0.0");
    let body = match chunked {
        // A streamed body: no Content-Length, Transfer-Encoding: chunked.
        Some(chunk) => {
            let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
                body.chunks(chunk).map(|c| Ok(c.to_vec())).collect();
            hyper::Body::wrap_stream(futures::stream::iter(chunks))
        }
        None => {
            req = req.header("Content-Length", body.len());
            hyper::Body::from(body)
        }
    };
    req.body(body).expect("a valid request")
}

/// Send a request the way the host does and read the JSON answer.
pub async fn send(method: &str, url: &str, body: Vec<u8>, chunked: bool) -> Answer {
    let client = hyper::Client::new();
    let req = host_request(method, url, body, chunked.then_some(7));
    let resp = client.request(req).await.expect("request");
    let status = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let bytes = hyper::body::to_bytes(resp.into_body()).await.unwrap();
    let body = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "answer is not JSON ({e}): {:?} — the host would fail or hang on it",
            String::from_utf8_lossy(&bytes)
        )
    });
    Answer {
        status,
        content_type,
        body,
    }
}

/// POST an invocation body to /OrderTrigger.
pub async fn invoke(handler: &Handler, body: &Value) -> Answer {
    send(
        "POST",
        &handler.url("/OrderTrigger"),
        serde_json::to_vec(body).unwrap(),
        false,
    )
    .await
}

/// Send `signal` (a name such as `TERM`, `STOP`, `CONT`, `KILL`) to a process
/// with the system's `kill`, failing loudly when that is not possible.
pub fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args(["-s", signal, &pid.to_string()])
        .status()
        .unwrap_or_else(|e| panic!("cannot run `kill` to send SIG{signal}: {e}"));
    assert!(status.success(), "kill -s {signal} {pid} failed: {status}");
}

/// An answer as raw bytes, for judging it the way the host does.
#[derive(Debug, Clone)]
pub struct RawAnswer {
    pub status: u16,
    pub content_type: String,
    pub bytes: Vec<u8>,
}

/// What the Functions host makes of an answer (docs/host-protocol.md, "The answer").
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// 2xx, JSON-typed, a JSON object: the invocation succeeded.
    Succeeded(Value),
    /// Non-2xx, wrong content type or unparsable body: the invocation failed
    /// and Event Grid will deliver again (the body, when JSON, for diagnosis).
    Failed { status: u16, body: Option<Value> },
    /// 2xx with an empty or `null` body: the host would hang until its
    /// function timeout. Always a test failure.
    Hang,
}

impl RawAnswer {
    /// The body as JSON, if it is.
    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.bytes).ok()
    }

    /// Judge the answer as the host does (docs/host-protocol.md, "The answer").
    pub fn verdict(&self) -> Verdict {
        let text = String::from_utf8_lossy(&self.bytes);
        if !(200..=299).contains(&self.status) {
            return Verdict::Failed {
                status: self.status,
                body: self.json(),
            };
        }
        if text.trim().is_empty() || text.trim() == "null" {
            return Verdict::Hang;
        }
        let ct = self.content_type.to_ascii_lowercase();
        let media = ct.split(';').next().unwrap_or("").trim();
        if media != "application/json" && media != "text/json" {
            return Verdict::Failed {
                status: self.status,
                body: None,
            };
        }
        match self.json() {
            Some(v @ Value::Object(_)) => Verdict::Succeeded(v),
            _ => Verdict::Failed {
                status: self.status,
                body: None,
            },
        }
    }
}

/// Send a request the way the host does, without judging or panicking:
/// connection errors and `timeout` (the harness's function timeout) come
/// back as `Err`.
pub async fn try_send(
    client: &hyper::Client<hyper::client::HttpConnector>,
    url: &str,
    body: Vec<u8>,
    chunked: bool,
    timeout: Duration,
) -> Result<RawAnswer, String> {
    let request = host_request("POST", url, body, chunked.then_some(4096));
    let exchange = async {
        let resp = client.request(request).await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let bytes = hyper::body::to_bytes(resp.into_body())
            .await
            .map_err(|e| e.to_string())?;
        Ok(RawAnswer {
            status,
            content_type,
            bytes: bytes.to_vec(),
        })
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "no answer within the harness's function timeout ({} ms)",
            timeout.as_millis()
        )),
    }
}

/// Send a POST over a raw TCP connection and read the answer while the body
/// is still being written, the way curl and the Functions host's HttpClient
/// read an early answer (a 413 sent before the whole body arrived).
///
/// The server may close, and the kernel reset, the connection while the
/// client is still writing: a failed write is expected then and ignored. What
/// counts is the answer: a complete response (head, and a body as long as its
/// `Content-Length`) is returned; no answer, or a cut-off one, is an error.
pub async fn send_reading_early_answer(
    addr: SocketAddr,
    path: &str,
    body: Vec<u8>,
    chunked: bool,
    timeout: Duration,
) -> Result<RawAnswer, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let (mut reader, mut writer) = stream.into_split();
    let framing = if chunked {
        "Transfer-Encoding: chunked".to_string()
    } else {
        format!("Content-Length: {}", body.len())
    };
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json; charset=utf-8\r\n\
         X-Azure-Functions-InvocationId: {}\r\n{framing}\r\nConnection: close\r\n\r\n",
        uuid::Uuid::new_v4()
    );
    let mut wire = head.into_bytes();
    if chunked {
        for chunk in body.chunks(4096) {
            wire.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            wire.extend_from_slice(chunk);
            wire.extend_from_slice(b"\r\n");
        }
        wire.extend_from_slice(b"0\r\n\r\n");
    } else {
        wire.extend_from_slice(&body);
    }
    // The write may fail once the server has answered and closed: expected.
    let write = tokio::spawn(async move {
        let _ = writer.write_all(&wire).await;
        writer
    });
    let read = async {
        let mut received = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) => return (received, None),
                Ok(n) => {
                    received.extend_from_slice(&buf[..n]);
                    if complete_response(&received).is_some() {
                        return (received, None);
                    }
                }
                Err(e) => return (received, Some(e)),
            }
        }
    };
    let (received, read_error) = tokio::time::timeout(timeout, read).await.map_err(|_| {
        format!(
            "no answer within the harness's function timeout ({} ms)",
            timeout.as_millis()
        )
    })?;
    write.abort();
    complete_response(&received).ok_or_else(|| {
        format!(
            "no complete answer ({} bytes received{})",
            received.len(),
            read_error
                .map(|e| format!(", then {e}"))
                .unwrap_or_default()
        )
    })
}

/// The response in `bytes`, if its head and its whole body (by
/// `Content-Length`) have arrived.
fn complete_response(bytes: &[u8]) -> Option<RawAnswer> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(head_len) = response.parse(bytes).ok()? else {
        return None;
    };
    let header = |name: &str| {
        response
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).to_string())
    };
    let length: usize = header("content-length")?.trim().parse().ok()?;
    let body = bytes.get(head_len..head_len + length)?;
    Some(RawAnswer {
        status: response.code?,
        content_type: header("content-type").unwrap_or_default(),
        bytes: body.to_vec(),
    })
}

/// The `order-guard` binary cargo built for this test run.
pub fn handler_binary() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_order-guard"))
}

/// Environment for one handler process, as the Functions host sets it
/// (docs/host-protocol.md, "Starting the handler") plus the app settings given.
pub fn handler_env(port: u16, app_root: &std::path::Path) -> Vec<(String, String)> {
    let worker = uuid::Uuid::new_v4().to_string();
    vec![
        ("FUNCTIONS_CUSTOMHANDLER_PORT".into(), port.to_string()),
        ("FUNCTIONS_HTTPWORKER_PORT".into(), port.to_string()),
        ("FUNCTIONS_CUSTOMHANDLER_WORKER_ID".into(), worker.clone()),
        ("FUNCTIONS_HTTPWORKER_ID".into(), worker),
        (
            "FUNCTIONS_APP_ROOT_PATH".into(),
            app_root.display().to_string(),
        ),
    ]
}

/// Start `order-guard serve` with `env` (on top of a clean environment for
/// the handler's own settings), stdout and stderr appended to `log`. The
/// child is killed when dropped.
pub fn spawn_handler(
    binary: &std::path::Path,
    env: &[(String, String)],
    log: &std::path::Path,
) -> tokio::process::Child {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap_or_else(|e| panic!("cannot open handler log {}: {e}", log.display()));
    let err = out.try_clone().expect("clone log handle");
    let mut cmd = tokio::process::Command::new(binary);
    cmd.arg("serve")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true);
    for var in [
        "REDIS_URL",
        "SQL_CONNECTION_STRING",
        "FAILPOINTS",
        "GUARD_UNAVAILABLE",
        "GUARD_KEY_PREFIX",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    if let Some(root) = env.iter().find(|(k, _)| k == "FUNCTIONS_APP_ROOT_PATH") {
        cmd.current_dir(&root.1);
    }
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()))
}

/// Probe `GET /` like the host (every 25 ms, any HTTP answer means ready)
/// until the handler answers, its process exits, or `limit` passes.
pub async fn wait_ready(
    port: u16,
    child: &mut tokio::process::Child,
    limit: Duration,
) -> Result<(), String> {
    let client = hyper::Client::new();
    let url: hyper::Uri = format!("http://127.0.0.1:{port}/").parse().unwrap();
    let started = std::time::Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("the handler exited before it was ready: {status}"));
        }
        let probe = tokio::time::timeout(Duration::from_secs(2), client.get(url.clone())).await;
        if let Ok(Ok(_)) = probe {
            return Ok(());
        }
        if started.elapsed() > limit {
            return Err(format!(
                "the handler did not answer GET / on port {port} within {} s",
                limit.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Start `redis-server` on loopback `port` (no persistence, files in `dir`,
/// `extra` arguments) and wait until it is ready; `what` names it in the panic.
fn start_redis_server(
    port: u16,
    dir: &std::path::Path,
    extra: &[&str],
    what: &str,
) -> std::process::Child {
    let mut child = Command::new(redis_server_binary())
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(extra)
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("cannot start redis-server");
    if !redis_ready(&mut child) {
        let _ = child.kill();
        panic!("{what} on port {port} did not become ready in 20 s");
    }
    child
}

/// Wait (at most 20 s) for a `redis-server` started with piped stdout to log
/// "Ready to accept connections"; its output keeps being drained after that,
/// so the server never blocks on a full pipe.
fn redis_ready(child: &mut std::process::Child) -> bool {
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("Ready to accept connections") {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(());
                }
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(20)).is_ok()
}
