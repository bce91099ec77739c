//! Real `redis-server`s for the tests: one on a free loopback port, or an
//! OSS cluster of them, and guards on them.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use order_guard::guard::{GuardSettings, RedisGuard};

use super::free_port;

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

/// Start `redis-server` on loopback `port` (no persistence, files in `dir`,
/// `extra` arguments) and wait until it is ready; `what` names it in the panic.
pub(super) fn start_redis_server(
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
