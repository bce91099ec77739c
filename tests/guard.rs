//! The guard protocol, run against a real `redis-server` (started by the test
//! on a free loopback port) and against the in-memory guard: same semantics.

mod common;

use std::sync::Arc;
use std::time::Duration;

use order_guard::guard::{Acquisition, GuardSettings, IdempotencyGuard, MemoryGuard, Token};

use common::{unique_id, RedisServer};

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

guard_suite!(memory_guard, memory());
guard_suite!(redis_guard, redis());

#[tokio::test]
async fn redis_keys_follow_the_seed_protocol() {
    let server = RedisServer::start();
    let g = common::redis_guard(&server, settings(300, 86_400));
    let id = unique_id("o");
    let t = token(g.acquire(&id).await);
    assert!(t.value().starts_with("PROCESANDO:"));
    // PROCESANDO:<token>:<owner's deadline, ms on the server's clock>.
    let value = server.get(&format!("orden:{id}")).expect("reservation");
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
    let ttl = server.ttl(&format!("orden:{id}"));
    assert!((295..=300).contains(&ttl), "processing TTL {ttl}");
    g.complete(&id, "abc").await.unwrap();
    assert_eq!(
        server.get(&format!("orden:{id}")).as_deref(),
        Some("COMPLETADA")
    );
    assert_eq!(
        server.get(&format!("orden-fp:{id}")).as_deref(),
        Some("abc")
    );
    let ttl = server.ttl(&format!("orden:{id}"));
    assert!((86_390..=86_400).contains(&ttl), "COMPLETADA TTL {ttl}");
}

#[tokio::test]
async fn another_owners_reservation_is_in_progress() {
    let server = RedisServer::start();
    let g = common::redis_guard(&server, settings(300, 86_400));
    let id = unique_id("o");
    server.cmd(&[
        "SET",
        &format!("orden:{id}"),
        "PROCESANDO:someone-else",
        "EX",
        "300",
    ]);
    assert_eq!(g.acquire(&id).await, Acquisition::InProgress);
    assert!(!g.release(&id, &Token::new()).await.unwrap());
    assert_eq!(
        server.get(&format!("orden:{id}")).as_deref(),
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
    let key = format!("orden:{id}");

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
