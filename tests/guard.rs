//! The guard protocol, run against a real `redis-server` (started by the test
//! on a free loopback port), a real Redis cluster (three masters, three
//! replicas, started by the test) and the in-memory guard: same semantics.

mod common;

use std::sync::Arc;
use std::time::Duration;

use order_guard::guard::{Acquisition, GuardSettings, IdempotencyGuard, MemoryGuard, Token};

use common::{unique_id, RedisCluster, RedisServer};

/// The error-level records this test binary logged, as `target: message`
/// (a process has one logger: installed once, shared by every test, so a
/// test picks its own records out by what only they contain).
fn logged_errors() -> &'static std::sync::Mutex<Vec<String>> {
    struct Capture(std::sync::Mutex<Vec<String>>);
    impl log::Log for Capture {
        fn enabled(&self, m: &log::Metadata) -> bool {
            m.level() == log::Level::Error
        }
        fn log(&self, r: &log::Record) {
            if self.enabled(r.metadata()) {
                let line = format!("{}: {}", r.target(), r.args());
                self.0.lock().unwrap().push(line);
            }
        }
        fn flush(&self) {}
    }
    static CAPTURE: std::sync::OnceLock<&'static Capture> = std::sync::OnceLock::new();
    let capture = CAPTURE.get_or_init(|| {
        let c: &'static Capture = Box::leak(Box::new(Capture(Default::default())));
        log::set_logger(c).expect("no other logger in this test binary");
        log::set_max_level(log::LevelFilter::Error);
        c
    });
    &capture.0
}

fn settings(processing: u64, completed: u64) -> GuardSettings {
    GuardSettings {
        prefix: "orden:".into(),
        processing_ttl: Duration::from_secs(processing),
        completed_ttl: Duration::from_secs(completed),
        ..GuardSettings::default()
    }
}

fn token(a: Acquisition) -> Token {
    match a {
        Acquisition::Acquired(t) => t,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

/// Checks shared by both guards.
mod suite {
    use super::*;

    pub async fn acquire_then_duplicate_then_in_progress(g: Arc<dyn IdempotencyGuard>) {
        let id = unique_id("o");
        let t = token(g.acquire(&id).await);
        assert_eq!(g.acquire(&id).await, Acquisition::InProgress);
        g.complete(&id, "fp-1").await.unwrap();
        assert_eq!(
            g.acquire(&id).await,
            Acquisition::Completed {
                fingerprint: Some("fp-1".into())
            }
        );
        // Completed keys are not ours to release any more.
        assert!(!g.release(&id, &t).await.unwrap());
        let e = g.inspect(&id).await.unwrap();
        assert_eq!(e.value.as_deref(), Some("COMPLETADA"));
    }

    pub async fn release_only_by_owner(g: Arc<dyn IdempotencyGuard>) {
        let id = unique_id("o");
        let t = token(g.acquire(&id).await);
        assert!(
            !g.release(&id, &Token::new()).await.unwrap(),
            "a stranger's token must not release"
        );
        assert_eq!(g.acquire(&id).await, Acquisition::InProgress);
        assert!(
            !g.extend(&id, &Token::new()).await.unwrap(),
            "a stranger's token must not extend"
        );
        assert!(g.extend(&id, &t).await.unwrap());
        assert!(g.release(&id, &t).await.unwrap());
        assert!(g.inspect(&id).await.unwrap().value.is_none());
        token(g.acquire(&id).await);
    }

    pub async fn concurrent_acquires_have_one_winner(g: Arc<dyn IdempotencyGuard>) {
        let id = unique_id("o");
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let (g, id) = (Arc::clone(&g), id.clone());
                tokio::spawn(async move { g.acquire(&id).await })
            })
            .collect();
        let mut winners = 0;
        for t in tasks {
            match t.await.unwrap() {
                Acquisition::Acquired(_) => winners += 1,
                Acquisition::InProgress => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(winners, 1);
    }

    /// The processing TTL bounds a dead owner's reservation (the TTL itself is
    /// under test here, so the test waits it out).
    pub async fn reservation_expires_after_its_ttl(g: Arc<dyn IdempotencyGuard>) {
        let id = unique_id("o");
        let dead_owner = token(g.acquire(&id).await);
        let ttl = g.inspect(&id).await.unwrap().ttl_seconds.unwrap();
        assert!((0..=1).contains(&ttl), "processing TTL {ttl}");
        tokio::time::sleep(Duration::from_millis(2_100)).await;
        let t = token(g.acquire(&id).await);
        assert_ne!(t, dead_owner);
        assert!(
            !g.release(&id, &dead_owner).await.unwrap(),
            "the dead owner cannot release the new reservation"
        );
    }

    pub async fn completed_key_has_the_long_ttl(g: Arc<dyn IdempotencyGuard>) {
        let id = unique_id("o");
        token(g.acquire(&id).await);
        g.complete(&id, "fp").await.unwrap();
        let e = g.inspect(&id).await.unwrap();
        assert_eq!(e.value.as_deref(), Some("COMPLETADA"));
        assert_eq!(e.fingerprint.as_deref(), Some("fp"));
        let ttl = e.ttl_seconds.unwrap();
        assert!((3590..=3600).contains(&ttl), "COMPLETADA TTL {ttl}");
    }
}

macro_rules! guard_suite {
    ($backend:ident, $make:expr) => {
        mod $backend {
            use super::*;
            guard_suite!(@tests $make;
                acquire_then_duplicate_then_in_progress,
                release_only_by_owner,
                concurrent_acquires_have_one_winner,
                reservation_expires_after_its_ttl,
                completed_key_has_the_long_ttl);
        }
    };
    (@tests $make:expr; $($check:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $check() {
                let (guard, _keep) = $make;
                suite::$check(guard).await;
            }
        )*
    };
}

fn memory() -> (Arc<dyn IdempotencyGuard>, ()) {
    (Arc::new(MemoryGuard::new(settings(1, 3600))), ())
}

fn redis() -> (Arc<dyn IdempotencyGuard>, RedisServer) {
    let server = RedisServer::start();
    (common::redis_guard(&server, settings(1, 3600)), server)
}

/// `cluster-node-timeout` of the suite's clusters: long enough that a busy
/// machine never fails a master over by accident.
const SUITE_NODE_TIMEOUT_MS: u64 = 5_000;

fn redis_cluster() -> (Arc<dyn IdempotencyGuard>, RedisCluster) {
    let cluster = RedisCluster::start(SUITE_NODE_TIMEOUT_MS);
    (
        common::redis_cluster_guard(&cluster, settings(1, 3600)),
        cluster,
    )
}

guard_suite!(memory_guard, memory());
guard_suite!(redis_guard, redis());
guard_suite!(redis_cluster_guard, redis_cluster());

/// On a cluster, the two keys of an order are in one slot (the script runs),
/// the orders spread over the masters, and `prune-guard`'s listing scans
/// every master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_orders_spread_over_masters_and_all_are_listed() {
    let cluster = RedisCluster::start(SUITE_NODE_TIMEOUT_MS);
    let g = common::redis_cluster_guard(&cluster, settings(300, 86_400));
    g.preflight()
        .await
        .expect("a cluster with REDIS_CLUSTER=true");
    let ids: Vec<String> = (0..30).map(|_| unique_id("o")).collect();
    for id in &ids {
        token(g.acquire(id).await);
        g.complete(id, &format!("fp-{id}")).await.unwrap();
    }
    let mut masters = std::collections::HashSet::new();
    for id in &ids {
        let (key, fp) = (format!("orden:{{{id}}}"), format!("orden-fp:{{{id}}}"));
        let port = cluster.master_port_of(&key);
        assert_eq!(port, cluster.master_port_of(&fp), "{key} and {fp}");
        assert_eq!(
            cluster.keys_holding(port, &key, "COMPLETADA"),
            vec![key.clone()],
            "{key} on its master"
        );
        masters.insert(port);
    }
    assert_eq!(masters.len(), 3, "30 orders should use all three masters");
    // Bounded: a scan that never ends (a cursor loop gone wrong) must fail
    // the test, not hang it. Thirty keys take milliseconds.
    let mut listed = tokio::time::timeout(Duration::from_secs(30), g.completed_orders())
        .await
        .expect("listing 30 completed orders did not end in 30 s")
        .unwrap();
    listed.sort();
    let mut want: Vec<(String, Option<String>)> = ids
        .iter()
        .map(|id| (id.clone(), Some(format!("fp-{id}"))))
        .collect();
    want.sort();
    assert_eq!(listed, want);
    assert!(g
        .forget_completed(&ids[0], Some(&format!("fp-{}", ids[0])))
        .await
        .unwrap());
    assert!(g.inspect(&ids[0]).await.unwrap().value.is_none());
    // Another marker (another database's completion): nothing forgotten,
    // and it says so.
    assert!(!g
        .forget_completed(&ids[1], Some("fp-of-another-database"))
        .await
        .unwrap());
    assert_eq!(
        g.inspect(&ids[1]).await.unwrap().value.as_deref(),
        Some("COMPLETADA")
    );
}

/// The mismatch the issue is about: the plain client on a cluster. The
/// start check says which setting to use, and so does an operation whose
/// key lives on another node (`MOVED`), instead of failing obscurely.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plain_client_on_a_cluster_says_set_redis_cluster_true() {
    let cluster = RedisCluster::start(SUITE_NODE_TIMEOUT_MS);
    let seed = cluster.url();
    let seed_port: u16 = seed.rsplit(':').next().unwrap().parse().unwrap();
    let g = order_guard::guard::RedisGuard::new(
        &seed,
        settings(300, 86_400),
        Duration::from_millis(500),
    )
    .unwrap();
    logged_errors();
    let e = g.preflight().await.expect_err("a cluster seen as one node");
    assert!(
        e.0.contains("is a cluster") && e.0.contains("set REDIS_CLUSTER=true"),
        "{e}"
    );
    assert!(e.0.contains(&format!("127.0.0.1:{seed_port}")), "{e}");
    let elsewhere = (0..)
        .map(|_| unique_id("o"))
        .find(|id| cluster.master_port_of(&format!("orden:{{{id}}}")) != seed_port)
        .unwrap();
    match g.acquire(&elsewhere).await {
        Acquisition::Unavailable(why) => assert!(
            why.contains("is a cluster") && why.contains("set REDIS_CLUSTER=true"),
            "{why}"
        ),
        other => panic!("want Unavailable naming REDIS_CLUSTER, got {other:?}"),
    }
    // Said at error level once per guard (one per process), not once per operation.
    let _ = g.acquire(&elsewhere).await;
    let hints: Vec<String> = logged_errors()
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(&format!("127.0.0.1:{seed_port} is a cluster")))
        .cloned()
        .collect();
    assert_eq!(hints.len(), 1, "{hints:#?}");
    assert!(
        hints[0].starts_with("order_guard::guard::redis: "),
        "{hints:#?}"
    );
}

/// The reverse: REDIS_CLUSTER=true on a single node.
#[tokio::test]
async fn the_cluster_client_on_one_node_says_set_redis_cluster_false() {
    let server = RedisServer::start();
    let g = order_guard::guard::RedisGuard::with_topology(
        &server.url(),
        order_guard::guard::Topology::Cluster,
        settings(300, 86_400),
        Duration::from_millis(500),
    )
    .unwrap();
    let e = g.preflight().await.expect_err("one node seen as a cluster");
    assert!(
        e.0.contains("is not a cluster") && e.0.contains("set REDIS_CLUSTER=false"),
        "{e}"
    );
}

/// A master killed: once its replica is promoted, the same guard (no new
/// connection built) works on that slot range again, and the old master
/// comes back as a replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_guard_follows_a_failover() {
    let mut cluster = RedisCluster::start(1_000);
    let g = common::redis_cluster_guard(&cluster, settings(300, 86_400));
    let id = unique_id("o");
    let key = format!("orden:{{{id}}}");
    token(g.acquire(&id).await);
    g.complete(&id, "fp").await.unwrap();
    let master = cluster.master_port_of(&key);
    // Replication is asynchronous: wait (replication offsets) until the
    // replica has the keys, so this test is about the failover, not a loss.
    cluster.wait_replicated(master);
    let promoted =
        tokio::task::block_in_place(|| cluster.kill_master_and_wait_for_failover(master));
    assert_eq!(cluster.master_port_of(&key), promoted);
    let mut last = None;
    for _ in 0..100 {
        match g.acquire(&id).await {
            Acquisition::Completed { fingerprint } => {
                assert_eq!(fingerprint.as_deref(), Some("fp"));
                last = None;
                break;
            }
            other => last = Some(other),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        last.is_none(),
        "the guard did not follow the failover: {last:?}"
    );
    let fresh = (0..)
        .map(|_| unique_id("o"))
        .find(|id| cluster.master_port_of(&format!("orden:{{{id}}}")) == promoted)
        .unwrap();
    token(g.acquire(&fresh).await);
    tokio::task::block_in_place(|| cluster.bring_back(master));
    g.complete(&fresh, "fp2").await.unwrap();
    assert_eq!(
        g.acquire(&fresh).await,
        Acquisition::Completed {
            fingerprint: Some("fp2".into())
        }
    );
}

#[tokio::test]
async fn redis_keys_follow_the_seed_protocol() {
    let server = RedisServer::start();
    let g = common::redis_guard(&server, settings(300, 86_400));
    let id = unique_id("o");
    let t = token(g.acquire(&id).await);
    assert!(t.value().starts_with("PROCESANDO:"));
    // PROCESANDO:<token>:<owner's deadline, ms on the server's clock>.
    let value = server.get(&format!("orden:{{{id}}}")).expect("reservation");
    let deadline: u64 = value
        .strip_prefix(&format!("{}:", t.value()))
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("want PROCESANDO:<token>:<deadline ms>, got {value}"));
    let now_ms = match server.cmd(&["TIME"]) {
        redis::Value::Array(parts) => {
            let n = |v: &redis::Value| match v {
                redis::Value::BulkString(b) => String::from_utf8_lossy(b).parse::<u64>().unwrap(),
                other => panic!("TIME part {other:?}"),
            };
            n(&parts[0]) * 1000 + n(&parts[1]) / 1000
        }
        other => panic!("TIME answered {other:?}"),
    };
    let lease = GuardSettings::default().lease.as_millis() as u64;
    assert!(
        deadline <= now_ms + lease && deadline + 5_000 >= now_ms + lease,
        "deadline {deadline} vs now {now_ms} + lease {lease}"
    );
    let ttl = server.ttl(&format!("orden:{{{id}}}"));
    assert!((295..=300).contains(&ttl), "processing TTL {ttl}");
    g.complete(&id, "abc").await.unwrap();
    assert_eq!(
        server.get(&format!("orden:{{{id}}}")).as_deref(),
        Some("COMPLETADA")
    );
    assert_eq!(
        server.get(&format!("orden-fp:{{{id}}}")).as_deref(),
        Some("abc")
    );
    let ttl = server.ttl(&format!("orden:{{{id}}}"));
    assert!((86_390..=86_400).contains(&ttl), "COMPLETADA TTL {ttl}");
}

#[tokio::test]
async fn another_owners_reservation_is_in_progress() {
    let server = RedisServer::start();
    let g = common::redis_guard(&server, settings(300, 86_400));
    let id = unique_id("o");
    server.cmd(&[
        "SET",
        &format!("orden:{{{id}}}"),
        "PROCESANDO:someone-else",
        "EX",
        "300",
    ]);
    assert_eq!(g.acquire(&id).await, Acquisition::InProgress);
    assert!(!g.release(&id, &Token::new()).await.unwrap());
    assert_eq!(
        server.get(&format!("orden:{{{id}}}")).as_deref(),
        Some("PROCESANDO:someone-else")
    );
}

#[tokio::test]
async fn redis_down_is_unavailable_and_recovers_after_restart() {
    let mut server = RedisServer::start();
    let g = common::redis_guard(&server, settings(300, 86_400));
    token(g.acquire(&unique_id("o")).await);
    server.stop();
    match g.acquire(&unique_id("o")).await {
        Acquisition::Unavailable(why) => assert!(!why.is_empty()),
        other => panic!("expected Unavailable with Redis stopped, got {other:?}"),
    }
    assert!(g.complete("x", "fp").await.is_err());
    server.restart();
    // The connection manager reconnects by itself: no new guard is built.
    let mut last = None;
    for _ in 0..50 {
        match g.acquire(&unique_id("o")).await {
            Acquisition::Acquired(_) => return,
            other => last = Some(other),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("guard did not recover after Redis restarted: {last:?}");
}

#[tokio::test]
async fn guard_works_when_redis_starts_after_it() {
    let mut server = RedisServer::start();
    server.stop();
    // Built while Redis is down: no error, just Unavailable until it is up.
    let g = common::redis_guard(&server, settings(300, 86_400));
    assert!(matches!(g.acquire("o").await, Acquisition::Unavailable(_)));
    server.restart();
    for _ in 0..50 {
        if let Acquisition::Acquired(_) = g.acquire(&unique_id("o")).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("guard never connected after Redis came up");
}

/// An acquire that times out on a hung Redis (paused, not down) still runs
/// when Redis resumes. It must not leave a reservation nobody owns: that
/// would answer every redelivery `in_progress` for the whole processing TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_timed_out_on_a_hung_redis_leaves_no_reservation() {
    let server = RedisServer::start();
    let g = common::redis_guard(&server, settings(300, 86_400));
    token(g.acquire(&unique_id("warm")).await);
    let id = unique_id("o");
    let key = format!("orden:{{{id}}}");

    let pid = server.pid().unwrap();
    // Resumed when dropped, even if an assertion below fails.
    let cont = common::pause(pid);
    match g.acquire(&id).await {
        // Whichever timeout fires first: redis-rs' response timeout or ours.
        Acquisition::Unavailable(why) => assert!(
            why.contains("timed out") || why.contains("did not answer within"),
            "{why}"
        ),
        other => panic!("want Unavailable while Redis is hung, got {other:?}"),
    }
    drop(cont);

    // A command on the guard's connection runs after the late acquire: once
    // it is answered, the late acquire has run too.
    g.inspect(&unique_id("after")).await.unwrap();
    let started = std::time::Instant::now();
    while let Some(value) = server.get(&key) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{key} still holds {value:?} (TTL {} s): a reservation nobody owns",
            server.ttl(&key)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The redelivery gets the order.
    token(g.acquire(&id).await);
}
