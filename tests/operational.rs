//! Operational behaviour of the real binary: it starts and serves
//! (degraded, logged) when Redis is down and uses Redis once it is up; it
//! starts when the database is briefly locked or its disk away; SIGTERM
//! drains an in-flight invocation, which still gets its answer and
//! completes or releases its guard; a hung dependency (Redis stopped with SIGSTOP, a database lock held
//! past the busy timeout) yields an answer (`unavailable` guard or `retry`)
//! while the dependency is still hung, not a stuck invocation.
//!
//! Synchronisation is on signals only: the readiness probe, the guard key
//! appearing in Redis, a log line, the answer, the process exit.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use common::{RedisServer, Verdict};

/// The harness's function timeout (an invocation not answered by then is
/// stuck); Event Grid itself gives up on a delivery after 30 s.
const FUNCTION_TIMEOUT: Duration = Duration::from_secs(30);
/// The host's start limit per attempt (docs/host-protocol.md, "Starting the handler").
const START_LIMIT: Duration = Duration::from_secs(30);

/// One `order-guard serve` process, killed when dropped.
struct Proc {
    port: u16,
    child: tokio::process::Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(dir: &Path, name: &str, settings: &[(&str, String)]) -> Proc {
        let port = common::free_port();
        let mut env = common::handler_env(port, dir);
        env.push(("RUST_LOG".into(), "info".into()));
        for (k, v) in settings {
            env.push((k.to_string(), v.clone()));
        }
        let log = dir.join(format!("{name}.log"));
        let child = common::spawn_handler(&common::handler_binary(), &env, &log);
        Proc { port, child, log }
    }

    async fn start(dir: &Path, name: &str, settings: &[(&str, String)]) -> Proc {
        let mut p = Proc::spawn(dir, name, settings);
        if let Err(e) = common::wait_ready(p.port, &mut p.child, START_LIMIT).await {
            panic!("{name}: {e}; log:\n{}", p.log_text());
        }
        p
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/OrderTrigger", self.port)
    }

    fn pid(&self) -> u32 {
        self.child.id().expect("the handler is running")
    }

    /// The log so far (created before the process started, so a failure to
    /// read it is a real error, not "nothing logged yet").
    fn log_text(&self) -> String {
        let bytes = std::fs::read(&self.log)
            .unwrap_or_else(|e| panic!("cannot read handler log {}: {e}", self.log.display()));
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Wait (bounded) until the log has a line containing `needle`.
    async fn wait_for_log(&self, needle: &str) {
        let started = Instant::now();
        while !self.log_text().contains(needle) {
            assert!(
                started.elapsed() < START_LIMIT,
                "the handler never logged {needle:?}; log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Send an order invocation; `Err` when there is no answer.
    async fn invoke(&self, body: &[u8]) -> Result<common::RawAnswer, String> {
        let client = hyper::Client::new();
        common::try_send(&client, &self.url(), body.to_vec(), false, FUNCTION_TIMEOUT).await
    }
}

fn order_body(id: &str) -> Vec<u8> {
    let event = common::eg_event(common::order_data(id, "buy", "MSFT", "3", "acct-ops"));
    serde_json::to_vec(&common::invocation(event)).unwrap()
}

/// The single event's `ReturnValue` of a 2xx answer, or a panic saying why not.
fn succeeded(answer: &common::RawAnswer) -> Value {
    match answer.verdict() {
        Verdict::Succeeded(body) => body["ReturnValue"].clone(),
        other => panic!("want a successful invocation, the host judges {other:?}"),
    }
}

/// The `ReturnValue` of a 500 answer (the host fails it; Event Grid retries).
fn failed(answer: &common::RawAnswer) -> Value {
    match answer.verdict() {
        Verdict::Failed {
            status: 500,
            body: Some(body),
        } => body["ReturnValue"].clone(),
        other => panic!("want a 500 asking for redelivery, the host judges {other:?}"),
    }
}

fn sqlite(dir: &Path) -> (PathBuf, String) {
    let db = dir.join("orders.db");
    let setting = format!("sqlite:{}?mode=rwc", db.display());
    (db, setting)
}

/// Hold the whole database with `BEGIN EXCLUSIVE` until dropped (or committed).
struct DbLock(Option<rusqlite::Connection>);

impl DbLock {
    fn take(db: &Path) -> DbLock {
        let conn = rusqlite::Connection::open(db).expect("open the database");
        conn.busy_timeout(Duration::from_secs(20)).unwrap();
        conn.execute_batch("BEGIN EXCLUSIVE")
            .expect("BEGIN EXCLUSIVE");
        DbLock(Some(conn))
    }

    fn release(&mut self) {
        if let Some(c) = self.0.take() {
            c.execute_batch("COMMIT").expect("COMMIT");
        }
    }
}

impl Drop for DbLock {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            let _ = c.execute_batch("ROLLBACK");
        }
    }
}

/// Wait (bounded) until the order's guard key holds a reservation: the
/// invocation has passed step 1 and is now in the store.
async fn wait_for_reservation(redis: &RedisServer, id: &str) {
    let key = format!("orden:{{{id}}}");
    let started = Instant::now();
    loop {
        if redis
            .get(&key)
            .is_some_and(|v| v.starts_with("PROCESANDO:"))
        {
            return;
        }
        assert!(
            started.elapsed() < FUNCTION_TIMEOUT,
            "{key} never held a reservation"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_degraded_when_redis_is_down_and_uses_it_once_it_is_up() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store) = sqlite(dir.path());
    let redis_port = common::free_port();
    let handler = Proc::start(
        dir.path(),
        "degraded",
        &[
            ("REDIS_URL", format!("redis://127.0.0.1:{redis_port}")),
            ("SQL_CONNECTION_STRING", store),
            ("REDIS_TIMEOUT_MS", "300".into()),
        ],
    )
    .await;

    // Serving without Redis: the store's unique index keeps the order single.
    let first = common::unique_id("no-redis");
    let rv = succeeded(&handler.invoke(&order_body(&first)).await.unwrap());
    assert_eq!(
        (rv["outcome"].as_str(), rv["guard"].as_str()),
        (Some("executed"), Some("unavailable")),
        "{rv}"
    );
    let again = succeeded(&handler.invoke(&order_body(&first)).await.unwrap());
    assert_eq!(again["outcome"], "duplicate", "{again}");
    handler.wait_for_log("guard unavailable").await;

    // Redis comes up: new orders use it again (the connection recovers by itself).
    let redis = RedisServer::start_on(redis_port);
    let started = Instant::now();
    let id = loop {
        let id = common::unique_id("redis-back");
        let rv = succeeded(&handler.invoke(&order_body(&id)).await.unwrap());
        assert_eq!(rv["outcome"], "executed", "{rv}");
        if rv["guard"] == "redis" {
            break id;
        }
        assert!(
            started.elapsed() < FUNCTION_TIMEOUT,
            "the handler never used Redis after it came up; last answer {rv}"
        );
        // Event Grid's pace between orders, compressed.
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        redis.get(&format!("orden:{{{id}}}")).as_deref(),
        Some("COMPLETADA")
    );
    // The order done while Redis was down is still a duplicate (from the store).
    let late = succeeded(&handler.invoke(&order_body(&first)).await.unwrap());
    assert_eq!(late["outcome"], "duplicate", "{late}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_while_the_database_is_locked() {
    let dir = tempfile::tempdir().unwrap();
    let (db, store) = sqlite(dir.path());
    let redis = RedisServer::start();
    let settings = [
        ("REDIS_URL", redis.url()),
        ("SQL_CONNECTION_STRING", store),
        ("SQLITE_BUSY_TIMEOUT_MS", "200".into()),
    ];
    // The database exists (another instance created it), then is locked for
    // longer than the busy timeout while this instance starts.
    let existing = order_guard::store::SqliteStore::open(&db, Duration::from_secs(5)).unwrap();
    order_guard::store::OrderStore::migrate(&existing)
        .await
        .unwrap();
    drop(existing);
    let mut lock = DbLock::take(&db);
    let mut handler = Proc::spawn(dir.path(), "locked-at-start", &settings);
    // The handler says it is waiting for the database; it has not given up.
    handler.wait_for_log("database is locked").await;
    assert!(
        handler.child.try_wait().unwrap().is_none(),
        "the handler exited while the database was briefly locked (the host would count a failed start); log:\n{}",
        handler.log_text()
    );
    lock.release();
    if let Err(e) = common::wait_ready(handler.port, &mut handler.child, START_LIMIT).await {
        panic!("{e}; log:\n{}", handler.log_text());
    }
    let id = common::unique_id("after-lock");
    let rv = succeeded(&handler.invoke(&order_body(&id)).await.unwrap());
    assert_eq!(rv["outcome"], "executed", "{rv}");
}

/// The disk under the file away while this instance starts (a network
/// volume's hiccup, `faults::disk`): opening the file fails with an I/O
/// error, which the start waits out like a lock instead of exiting.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_while_the_disk_is_away() {
    let dir = tempfile::tempdir().unwrap();
    let (db, store) = sqlite(dir.path());
    let redis = RedisServer::start();
    let away = dir.path().join("disk-away");
    let settings = [
        ("REDIS_URL", redis.url()),
        ("SQL_CONNECTION_STRING", store),
        (
            order_guard::faults::DISK_AWAY_WHILE,
            away.display().to_string(),
        ),
    ];
    let existing = order_guard::store::SqliteStore::open(&db, Duration::from_secs(5)).unwrap();
    order_guard::store::OrderStore::migrate(&existing)
        .await
        .unwrap();
    drop(existing);
    std::fs::write(&away, b"").unwrap();
    let mut handler = Proc::spawn(dir.path(), "disk-away-at-start", &settings);
    handler.wait_for_log("disk I/O error").await;
    assert!(
        handler.child.try_wait().unwrap().is_none(),
        "the handler exited while its disk was briefly away (the host would count a failed start); log:\n{}",
        handler.log_text()
    );
    std::fs::remove_file(&away).unwrap();
    if let Err(e) = common::wait_ready(handler.port, &mut handler.child, START_LIMIT).await {
        panic!("{e}; log:\n{}", handler.log_text());
    }
    let id = common::unique_id("after-disk");
    let rv = succeeded(&handler.invoke(&order_body(&id)).await.unwrap());
    assert_eq!(rv["outcome"], "executed", "{rv}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_an_in_flight_invocation_which_completes_its_guard() {
    let dir = tempfile::tempdir().unwrap();
    let (db, store) = sqlite(dir.path());
    let redis = RedisServer::start();
    let mut handler = Proc::start(
        dir.path(),
        "drain-complete",
        &[
            ("REDIS_URL", redis.url()),
            ("SQL_CONNECTION_STRING", store),
            // Long enough that the invocation is still waiting when the lock goes.
            ("SQLITE_BUSY_TIMEOUT_MS", "20000".into()),
            ("SHUTDOWN_GRACE_SECONDS", "25".into()),
        ],
    )
    .await;
    let id = common::unique_id("drain");
    let mut lock = DbLock::take(&db);
    let body = order_body(&id);
    let url = handler.url();
    let in_flight = tokio::spawn(async move {
        let client = hyper::Client::new();
        common::try_send(&client, &url, body, false, FUNCTION_TIMEOUT).await
    });
    // In flight: it holds the reservation and waits on the database lock.
    wait_for_reservation(&redis, &id).await;
    common::signal(handler.pid(), "TERM");
    handler.wait_for_log("draining in-flight invocations").await;
    // New connections are no longer accepted while it drains.
    let probe = hyper::Client::new()
        .get(
            format!("http://127.0.0.1:{}/", handler.port)
                .parse()
                .unwrap(),
        )
        .await;
    assert!(
        probe.is_err(),
        "still accepting connections after SIGTERM: {probe:?}"
    );
    lock.release();

    let answer = in_flight
        .await
        .unwrap()
        .expect("the in-flight invocation got no answer");
    let rv = succeeded(&answer);
    assert_eq!(rv["outcome"], "executed", "{rv}");
    assert_eq!(
        redis.get(&format!("orden:{{{id}}}")).as_deref(),
        Some("COMPLETADA")
    );
    let status = handler.child.wait().await.unwrap();
    assert!(
        status.success(),
        "exit after draining: {status}; log:\n{}",
        handler.log_text()
    );
    assert!(
        handler.log_text().contains("all invocations drained"),
        "{}",
        handler.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_an_in_flight_invocation_which_releases_its_guard() {
    let dir = tempfile::tempdir().unwrap();
    let (db, store) = sqlite(dir.path());
    let redis = RedisServer::start();
    let mut handler = Proc::start(
        dir.path(),
        "drain-release",
        &[
            ("REDIS_URL", redis.url()),
            ("SQL_CONNECTION_STRING", store),
            ("SQLITE_BUSY_TIMEOUT_MS", "1500".into()),
            ("SHUTDOWN_GRACE_SECONDS", "25".into()),
        ],
    )
    .await;
    let id = common::unique_id("drain-retry");
    let _lock = DbLock::take(&db);
    let body = order_body(&id);
    let url = handler.url();
    let in_flight = tokio::spawn(async move {
        let client = hyper::Client::new();
        common::try_send(&client, &url, body, false, FUNCTION_TIMEOUT).await
    });
    wait_for_reservation(&redis, &id).await;
    common::signal(handler.pid(), "TERM");
    // The lock outlives the busy timeout: the invocation answers retry and
    // gives its reservation back so the redelivery need not wait for the TTL.
    let answer = in_flight
        .await
        .unwrap()
        .expect("the in-flight invocation got no answer");
    let rv = failed(&answer);
    assert_eq!(rv["outcome"], "retry", "{rv}");
    assert!(
        rv["reason"].as_str().unwrap_or("").contains("locked"),
        "{rv}"
    );
    assert_eq!(
        redis.get(&format!("orden:{{{id}}}")),
        None,
        "reservation not released"
    );
    let status = handler.child.wait().await.unwrap();
    assert!(
        status.success(),
        "exit after draining: {status}; log:\n{}",
        handler.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_redis_gives_an_answer_not_a_stuck_invocation() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store) = sqlite(dir.path());
    let redis = RedisServer::start();
    let common_settings = |extra: Option<(&'static str, &'static str)>| {
        let mut s = vec![
            ("REDIS_URL", redis.url()),
            ("SQL_CONNECTION_STRING", store.clone()),
            ("REDIS_TIMEOUT_MS", "300".to_string()),
        ];
        if let Some((k, v)) = extra {
            s.push((k, v.to_string()));
        }
        s
    };
    let proceed = Proc::start(dir.path(), "hung-proceed", &common_settings(None)).await;
    let strict = Proc::start(
        dir.path(),
        "hung-retry",
        &common_settings(Some(("GUARD_UNAVAILABLE", "retry"))),
    )
    .await;
    // Warm: both use Redis.
    for h in [&proceed, &strict] {
        let id = common::unique_id("warm");
        let rv = succeeded(&h.invoke(&order_body(&id)).await.unwrap());
        assert_eq!(
            (rv["outcome"].as_str(), rv["guard"].as_str()),
            (Some("executed"), Some("redis")),
            "{rv}"
        );
    }

    let pid = redis.pid().unwrap();
    // Resumed when dropped, even if an assertion below fails.
    let cont = common::pause(pid);

    // Both answer while Redis is still hung.
    let id = common::unique_id("hung");
    let rv = succeeded(
        &proceed
            .invoke(&order_body(&id))
            .await
            .expect("stuck on a hung Redis"),
    );
    assert_eq!(
        (rv["outcome"].as_str(), rv["guard"].as_str()),
        (Some("executed"), Some("unavailable")),
        "{rv}"
    );
    let strict_id = common::unique_id("hung-strict");
    let rv = failed(
        &strict
            .invoke(&order_body(&strict_id))
            .await
            .expect("stuck on a hung Redis"),
    );
    assert_eq!(rv["outcome"], "retry", "{rv}");
    assert!(
        rv["reason"]
            .as_str()
            .unwrap_or("")
            .contains("guard unavailable"),
        "{rv}"
    );

    drop(cont);
    // Redis back: the strict handler's redelivery goes through (bounded). No
    // worker holds the order, so `in_progress` would mean the acquire that
    // timed out while Redis hung ran late and left a reservation nobody owns.
    let started = Instant::now();
    loop {
        let answer = strict.invoke(&order_body(&strict_id)).await.unwrap();
        match answer.verdict() {
            Verdict::Succeeded(body) => {
                assert_eq!(body["ReturnValue"]["outcome"], "executed", "{body}");
                break;
            }
            Verdict::Failed { body: Some(b), .. } => assert_ne!(
                b["ReturnValue"]["outcome"],
                "in_progress",
                "a reservation nobody owns blocks the order: {b}; key = {:?}",
                redis.get(&format!("orden:{{{strict_id}}}"))
            ),
            other => panic!("{other:?}"),
        }
        assert!(
            started.elapsed() < FUNCTION_TIMEOUT,
            "never recovered: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The order done while Redis was hung is a duplicate everywhere.
    let rv = succeeded(&strict.invoke(&order_body(&id)).await.unwrap());
    assert_eq!(rv["outcome"], "duplicate", "{rv}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_locked_past_the_busy_timeout_gives_retry_and_releases_the_guard() {
    let dir = tempfile::tempdir().unwrap();
    let (db, store) = sqlite(dir.path());
    let redis = RedisServer::start();
    let handler = Proc::start(
        dir.path(),
        "db-locked",
        &[
            ("REDIS_URL", redis.url()),
            ("SQL_CONNECTION_STRING", store),
            ("SQLITE_BUSY_TIMEOUT_MS", "300".into()),
        ],
    )
    .await;
    let id = common::unique_id("locked");
    let mut lock = DbLock::take(&db);
    let rv = failed(
        &handler
            .invoke(&order_body(&id))
            .await
            .expect("stuck on a locked database"),
    );
    assert_eq!(rv["outcome"], "retry", "{rv}");
    assert!(
        rv["reason"].as_str().unwrap_or("").contains("locked"),
        "{rv}"
    );
    assert_eq!(
        redis.get(&format!("orden:{{{id}}}")),
        None,
        "reservation not released"
    );
    // A poison event cannot be acknowledged either while it cannot be stored.
    let poison = common::invocation(Value::String("not json at all".into()));
    let answer = handler
        .invoke(&serde_json::to_vec(&poison).unwrap())
        .await
        .expect("stuck on a locked database");
    let rv = failed(&answer);
    assert_eq!(rv["outcome"], "retry", "{rv}");

    lock.release();
    let rv = succeeded(&handler.invoke(&order_body(&id)).await.unwrap());
    assert_eq!(rv["outcome"], "executed", "{rv}");
    let rv = succeeded(
        &handler
            .invoke(&serde_json::to_vec(&poison).unwrap())
            .await
            .unwrap(),
    );
    assert_eq!(rv["outcome"], "rejected", "{rv}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_database_cannot_hold_an_invocation_past_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let (db, store) = sqlite(dir.path());
    let redis = RedisServer::start();
    let handler = Proc::start(
        dir.path(),
        "deadline",
        &[
            ("REDIS_URL", redis.url()),
            ("SQL_CONNECTION_STRING", store),
            // The busy timeout outlasts the deadline: the deadline must win.
            ("SQLITE_BUSY_TIMEOUT_MS", "20000".into()),
            ("INVOCATION_DEADLINE_MS", "500".into()),
            ("REDIS_TIMEOUT_MS", "300".into()),
        ],
    )
    .await;
    let mut lock = DbLock::take(&db);
    // Both answers come while the lock is still held.
    let id = common::unique_id("deadline");
    let rv = failed(
        &handler
            .invoke(&order_body(&id))
            .await
            .expect("stuck on a locked database"),
    );
    assert_eq!(rv["outcome"], "retry", "{rv}");
    assert!(
        rv["reason"]
            .as_str()
            .unwrap_or("")
            .contains("internal deadline"),
        "{rv}"
    );
    assert_eq!(
        redis.get(&format!("orden:{{{id}}}")),
        None,
        "reservation not released"
    );
    // A poison event must be stored before it is acknowledged, and waiting to
    // store it is bounded by the same deadline.
    let poison =
        serde_json::to_vec(&common::invocation(Value::String("{ not json".into()))).unwrap();
    let rv = failed(
        &handler
            .invoke(&poison)
            .await
            .expect("stuck on a locked database"),
    );
    assert_eq!(rv["outcome"], "retry", "{rv}");
    assert!(
        rv["reason"]
            .as_str()
            .unwrap_or("")
            .contains("internal deadline"),
        "{rv}"
    );

    lock.release();
    let rv = succeeded(&handler.invoke(&order_body(&id)).await.unwrap());
    assert_eq!(rv["outcome"], "executed", "{rv}");
    let rv = succeeded(&handler.invoke(&poison).await.unwrap());
    assert_eq!(rv["outcome"], "rejected", "{rv}");
}

/// A named SQLite file that is not there is created only when asked: a
/// volume not mounted yet looks like a first start, and a new, empty
/// database there would execute every order again. `serve` stops saying
/// how to create it, a read command says it is missing, neither creates
/// it; `migrate` (or `?mode=rwc`) does, and `serve` then starts on it.
#[tokio::test]
async fn a_missing_sqlite_file_is_created_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("orders.db");
    let named = format!("sqlite:{}", db.display());

    let mut serve = Proc::spawn(
        dir.path(),
        "refused",
        &[("SQL_CONNECTION_STRING", named.clone())],
    );
    let exited = tokio::time::timeout(START_LIMIT, serve.child.wait())
        .await
        .expect("serve on a missing file must stop, not wait")
        .unwrap();
    let log = serve.log_text();
    assert!(!exited.success(), "{log}");
    for needle in [
        "no SQLite database at",
        "order-guard migrate",
        &format!("{named}?mode=rwc"),
        "volume may not be mounted",
    ] {
        assert!(log.contains(needle), "want {needle:?} in:\n{log}");
    }
    assert!(!db.exists(), "serve created the file:\n{log}");

    let store = [("SQL_CONNECTION_STRING", named.as_str())];
    let (status, out) = common::run_command(dir.path(), &["status", "ord-1"], &store);
    assert!(
        !status.success() && out.contains("no SQLite database at"),
        "{out}"
    );
    assert!(out.contains("never creates one"), "{out}");
    assert!(!db.exists(), "status created the file: {out}");

    let (status, out) = common::run_command(dir.path(), &["migrate"], &store);
    assert!(
        status.success() && db.exists(),
        "migrate must create the file: {out}"
    );
    // An order the store never saw: said, and the command fails.
    let (status, out) = common::run_command(dir.path(), &["status", "ord-never-seen"], &store);
    assert!(
        !status.success() && out.contains("no order \"ord-never-seen\""),
        "{out}"
    );
    let serve = Proc::start(
        dir.path(),
        "created",
        &[("SQL_CONNECTION_STRING", named.clone())],
    )
    .await;
    drop(serve);

    // `?mode=rwc` creates it from `serve` itself.
    let other = dir.path().join("other.db");
    let asked = format!("sqlite:{}?mode=rwc", other.display());
    let serve = Proc::start(dir.path(), "asked", &[("SQL_CONNECTION_STRING", asked)]).await;
    assert!(other.exists());
    drop(serve);
}
