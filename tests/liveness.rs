//! Liveness at the edges (no order stuck, none acknowledged without its
//! effect), with real components: a real `redis-server`, real SQLite files,
//! the real HTTP host.

mod common;

use std::sync::Arc;
use std::time::Duration;

use order_guard::guard::{Acquisition, GuardSettings, IdempotencyGuard, RedisGuard};
use order_guard::order::Order;
use order_guard::processor::OutcomeKind;
use order_guard::store::OrderStore;

use common::{eg_event, order_data, unique_id, RedisServer};

/// A reservation left by a worker that died after the commit (its
/// `complete` never ran): a redelivery is a `duplicate` at once, not
/// `in_progress` for the whole processing TTL, and `COMPLETADA` is written
/// again; a different order under that id is a stored `conflict`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_reservation_never_blocks_an_order_that_is_already_done() {
    let redis = RedisServer::start();
    let (store, _dir) = common::sqlite_store().await;
    let guard = common::redis_guard(&redis, GuardSettings::default());
    let processor = common::processor(guard, store.clone());
    let id = unique_id("orphan");
    let data = order_data(&id, "buy", "MSFT", "3", "acct-orphan");
    let order = Order::from_data(&data).unwrap();
    // The dead worker: reserved and executed, then killed.
    store.execute(&order, "e-first", "{}").await.unwrap();
    let key = GuardSettings::default().key(&id);
    redis.cmd(&["SET", &key, "PROCESANDO:dead-worker-token", "EX", "300"]);

    let o = processor.process_event(&eg_event(data.clone())).await;
    assert_eq!(o.outcome, OutcomeKind::Duplicate, "{o:?}");
    assert_eq!(redis.get(&key).as_deref(), Some("COMPLETADA"));
    assert!(
        redis.ttl(&key) > 300,
        "the completed TTL, not the reservation's"
    );

    // The same reservation held over a different order with this id.
    redis.cmd(&["SET", &key, "PROCESANDO:dead-worker-token", "EX", "300"]);
    let other = order_data(&id, "sell", "MSFT", "9", "acct-orphan");
    let o = processor.process_event(&eg_event(other)).await;
    assert_eq!(o.outcome, OutcomeKind::Conflict, "{o:?}");
    assert_eq!(store.rejections(Some(&id)).await.unwrap().len(), 1);

    // A reservation over an order the store has not finished (no row: its
    // holder is still at it) stays `in_progress`.
    let pending = unique_id("pending");
    let pending_data = order_data(&pending, "buy", "MSFT", "1", "acct-orphan");
    let pending_key = GuardSettings::default().key(&pending);
    redis.cmd(&["SET", &pending_key, "PROCESANDO:live-token", "EX", "300"]);
    let o = processor.process_event(&eg_event(pending_data)).await;
    assert_eq!(o.outcome, OutcomeKind::InProgress, "{o:?}");
    assert_eq!(
        redis.get(&pending_key).as_deref(),
        Some("PROCESANDO:live-token"),
        "a live holder's reservation is left alone"
    );
}

/// An acquire whose future is dropped before Redis answered (the event's
/// deadline, a cancelled invocation) is disowned like one that timed out:
/// when the hung Redis resumes and runs the queued acquire, the reservation
/// it makes is deleted right after, instead of blocking every redelivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_acquire_is_always_disowned() {
    let redis = RedisServer::start();
    // The guard's own timeout is long: only the cancellation can end the call.
    let guard = Arc::new(
        RedisGuard::new(
            &redis.url(),
            GuardSettings::default(),
            Duration::from_secs(30),
        )
        .unwrap(),
    );
    let id = unique_id("cancelled");
    // Connect and load the acquire script first (an acquire of another
    // order), so the acquire below is queued on a live connection as an
    // EVALSHA that Redis runs as soon as it resumes.
    assert!(matches!(
        guard.acquire(&unique_id("warm-up")).await,
        Acquisition::Acquired(_)
    ));
    let pid = redis.pid().expect("redis-server is running");
    common::signal(pid, "STOP");
    let acquire = tokio::time::timeout(Duration::from_millis(200), guard.acquire(&id)).await;
    assert!(
        acquire.is_err(),
        "Redis is paused: the acquire cannot finish"
    );
    common::signal(pid, "CONT");
    // Redis now runs the queued acquire, then the disowning delete. Wait for
    // the key to be gone (bounded): the observable outcome, not a guess.
    let started = std::time::Instant::now();
    loop {
        match guard.inspect(&id).await.unwrap().value {
            None => break,
            Some(v) => assert!(
                started.elapsed() < Duration::from_secs(10),
                "the cancelled acquire's reservation is still there: {v}"
            ),
        }
        tokio::task::yield_now().await;
    }
    // And the order can be reserved at once.
    assert!(matches!(guard.acquire(&id).await, Acquisition::Acquired(_)));
}

/// A body that never finishes arriving (a `Content-Length` larger than what
/// is sent) is answered 408 with a JSON reason within the body read timeout,
/// instead of holding the connection until the client gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incomplete_body_cannot_hold_a_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (store, _dir) = common::sqlite_store().await;
    let processor = common::processor(common::memory_guard(), store);
    let limits = order_guard::host::Limits {
        body_read_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let handler = common::Handler::start_with(processor, limits).await;
    let mut conn = tokio::net::TcpStream::connect(handler.addr).await.unwrap();
    conn.write_all(
        b"POST /OrderTrigger HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 1000\r\n\r\n{\"Data\":",
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), conn.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "no answer: the connection is held");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("BODY_READ_TIMEOUT_MS"), "{text}");
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    let json: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
    assert!(json["ReturnValue"]["error"].is_string(), "{json}");
}

/// Both guards: a reservation whose owner's deadline has passed is taken
/// over in the acquire itself (not at the processing TTL); the overtaken
/// owner's release cannot delete the new owner's reservation, the new
/// owner's can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_owners_reservation_is_taken_over_at_its_deadline() {
    let redis = RedisServer::start();
    let settings = GuardSettings {
        lease: Duration::from_millis(300),
        ..GuardSettings::default() // processing TTL 300 s
    };
    let guards: Vec<Arc<dyn IdempotencyGuard>> = vec![
        Arc::new(RedisGuard::new(&redis.url(), settings.clone(), Duration::from_secs(2)).unwrap()),
        Arc::new(order_guard::guard::MemoryGuard::new(settings.clone())),
    ];
    for guard in guards {
        let id = unique_id("takeover");
        let Acquisition::Acquired(dead) = guard.acquire(&id).await else {
            panic!("{}: first acquire", guard.name())
        };
        assert_eq!(
            guard.acquire(&id).await,
            Acquisition::InProgress,
            "{}",
            guard.name()
        );
        // Let the owner's deadline pass: the very thing under test.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let Acquisition::TakenOver(next) = guard.acquire(&id).await else {
            panic!("{}: want a takeover after the deadline", guard.name())
        };
        let entry = guard.inspect(&id).await.unwrap();
        assert!(
            entry
                .value
                .as_deref()
                .unwrap_or("")
                .starts_with(&next.value()),
            "{}: {entry:?}",
            guard.name()
        );
        assert!(
            entry.ttl_seconds.unwrap_or(0) > 250,
            "{}: a fresh TTL",
            guard.name()
        );
        assert!(
            !guard.release(&id, &dead).await.unwrap(),
            "{}",
            guard.name()
        );
        assert!(
            guard.inspect(&id).await.unwrap().value.is_some(),
            "{}",
            guard.name()
        );
        assert!(guard.release(&id, &next).await.unwrap(), "{}", guard.name());
        assert_eq!(
            guard.inspect(&id).await.unwrap().value,
            None,
            "{}",
            guard.name()
        );
    }
}

/// A worker killed after acquiring: its order is executed by the first
/// redelivery after the owner's deadline, exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_order_executes_after_the_deadline_not_the_ttl() {
    let redis = RedisServer::start();
    let (store, _dir) = common::sqlite_store().await;
    let settings = GuardSettings {
        lease: Duration::from_millis(300),
        ..GuardSettings::default()
    };
    let guard = common::redis_guard(&redis, settings);
    let processor = common::processor(guard.clone(), store.clone());
    let id = unique_id("killed");
    let data = order_data(&id, "buy", "MSFT", "2", "acct-killed");
    // The killed worker: reserved, never executed or released.
    assert!(matches!(guard.acquire(&id).await, Acquisition::Acquired(_)));
    let event = eg_event(data);
    assert_eq!(
        processor.process_event(&event).await.outcome,
        OutcomeKind::InProgress
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        processor.process_event(&event).await.outcome,
        OutcomeKind::Executed
    );
    assert_eq!(processor.counters().takeovers, 1);
    assert_eq!(
        processor.process_event(&event).await.outcome,
        OutcomeKind::Duplicate
    );
    assert_eq!(
        store.position("acct-killed", "MSFT").await.unwrap(),
        Some(2.into())
    );
}

/// A burst of several times the SQLite writer's capacity, from callers that
/// give up after a short deadline as the processor does: the writer sheds
/// (calls past the queue bound are answered `retry` at once, calls whose
/// caller is gone are skipped), and right after the burst a call succeeds
/// again instead of waiting behind work nobody waits for. Prints the
/// figures; `BURST_SECONDS` (default 2) sets the burst's length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_beyond_the_sqlite_writers_capacity_is_shed_and_recovers() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let seconds: u64 = std::env::var("BURST_SECONDS")
        .ok()
        .map(|v| v.parse().expect("BURST_SECONDS must be a whole number"))
        .unwrap_or(2);
    let (store, _dir) = common::sqlite_store().await;
    let deadline = Duration::from_millis(100);
    let (ok, late, refused) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    async fn call(
        store: Arc<order_guard::store::SqliteStore>,
        deadline: Duration,
    ) -> Result<
        Result<order_guard::store::Execution, order_guard::store::StoreError>,
        tokio::time::error::Elapsed,
    > {
        let data = order_data(&unique_id("burst"), "buy", "MSFT", "1", "acct-burst");
        let order = Order::from_data(&data).unwrap();
        tokio::time::timeout(deadline, store.execute(&order, "e", "{}")).await
    }
    let run = |callers: usize, length: Duration| {
        let ends = tokio::time::Instant::now() + length;
        let tasks: Vec<_> = (0..callers)
            .map(|_| {
                let (store, ok, late, refused) =
                    (store.clone(), ok.clone(), late.clone(), refused.clone());
                tokio::spawn(async move {
                    while tokio::time::Instant::now() < ends {
                        match call(store.clone(), deadline).await {
                            Ok(Ok(_)) => ok.fetch_add(1, Ordering::Relaxed),
                            Ok(Err(e)) if e.to_string().contains("calls waiting") => {
                                refused.fetch_add(1, Ordering::Relaxed)
                            }
                            Ok(Err(e)) => panic!("unexpected store error: {e}"),
                            Err(_) => late.fetch_add(1, Ordering::Relaxed),
                        };
                    }
                })
            })
            .collect();
        futures::future::join_all(tasks)
    };
    let take = |c: &AtomicU64| c.swap(0, Ordering::Relaxed);

    // The burst: far more callers than the writer's queue holds.
    run(
        4 * order_guard::store::SQLITE_MAX_QUEUED,
        Duration::from_secs(seconds),
    )
    .await;
    let burst = (take(&ok), take(&late), take(&refused));
    let shed = store.pressure();
    // Right after it: one caller, then a normal load for as long.
    let first = call(store.clone(), deadline).await;
    run(32, Duration::from_secs(seconds)).await;
    let after = (take(&ok), take(&late), take(&refused));
    let per_s = |n: u64| n as f64 / seconds as f64;
    eprintln!(
        "sqlite burst: {seconds} s × {} callers (deadline {} ms): ok {:.0}/s, gave up {:.0}/s, \
         refused at once {:.0}/s; writer skipped {} abandoned and refused {} calls; \
         then {seconds} s × 32 callers: ok {:.0}/s, gave up {:.0}/s, refused {:.0}/s",
        4 * order_guard::store::SQLITE_MAX_QUEUED,
        deadline.as_millis(),
        per_s(burst.0),
        per_s(burst.1),
        per_s(burst.2),
        shed.skipped,
        shed.refused,
        per_s(after.0),
        per_s(after.1),
        per_s(after.2),
    );
    assert!(
        shed.refused + shed.skipped > 0,
        "a burst of {}× the queue bound was neither refused nor skipped: {shed:?}",
        4
    );
    assert!(
        matches!(first, Ok(Ok(_))),
        "the first call after the burst waited behind abandoned work: {first:?}"
    );
    assert!(after.0 > 0, "no call succeeded after the burst");
}

/// Two databases sharing one cache with the default prefix (dev and prod, a
/// blue/green pair): an order completed in one is not a `duplicate` in the
/// other; each store's completion markers carry its identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_databases_sharing_one_cache_never_answer_each_others_orders() {
    let redis = RedisServer::start();
    let (dev_store, _dev) = common::sqlite_store().await;
    let (prod_store, _prod) = common::sqlite_store().await;
    let dev = common::processor(
        common::redis_guard(&redis, GuardSettings::default()),
        dev_store.clone(),
    );
    let prod = common::processor(
        common::redis_guard(&redis, GuardSettings::default()),
        prod_store.clone(),
    );
    let id = unique_id("shared");
    let event = eg_event(order_data(&id, "buy", "MSFT", "4", "acct-shared"));
    assert_eq!(
        dev.process_event(&event).await.outcome,
        OutcomeKind::Executed
    );
    assert_eq!(
        dev.process_event(&event).await.outcome,
        OutcomeKind::Duplicate
    );
    assert_eq!(
        prod.process_event(&event).await.outcome,
        OutcomeKind::Executed,
        "prod must not take dev's completion for its own"
    );
    assert_eq!(
        prod.process_event(&event).await.outcome,
        OutcomeKind::Duplicate
    );
    assert_eq!(
        prod_store.position("acct-shared", "MSFT").await.unwrap(),
        Some(4.into())
    );
    let marker = redis
        .get(&GuardSettings::default().fingerprint_key(&id))
        .unwrap();
    let prod_id = prod_store.identity().await.unwrap();
    assert!(marker.starts_with(&format!("{prod_id}/")), "{marker}");
    assert_ne!(dev_store.identity().await.unwrap(), prod_id);
}

/// After a restore to an earlier point, `prune-guard` removes this store's
/// `COMPLETADA` keys whose order is no longer in the database (so their
/// redeliveries execute again), and leaves every other key alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_guard_forgets_completions_lost_by_a_restore() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let (db, backup) = (dir.path().join("orders.db"), dir.path().join("backup.db"));
    let store =
        Arc::new(order_guard::store::SqliteStore::open(&db, Duration::from_secs(5)).unwrap());
    store.migrate().await.unwrap();
    let processor = common::processor(
        common::redis_guard(&redis, GuardSettings::default()),
        store.clone(),
    );
    let kept = eg_event(order_data(&unique_id("kept"), "buy", "MSFT", "1", "acct-r"));
    let lost_id = unique_id("lost");
    let lost = eg_event(order_data(&lost_id, "buy", "MSFT", "2", "acct-r"));
    assert_eq!(
        processor.process_event(&kept).await.outcome,
        OutcomeKind::Executed
    );
    // The backup, taken before the second order.
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute("VACUUM INTO ?1", [backup.to_str().unwrap()])
        .unwrap();
    assert_eq!(
        processor.process_event(&lost).await.outcome,
        OutcomeKind::Executed
    );
    // Another database's completion in the same cache.
    let (other_store, _other) = common::sqlite_store().await;
    let other = common::processor(
        common::redis_guard(&redis, GuardSettings::default()),
        other_store,
    );
    let foreign = eg_event(order_data(
        &unique_id("foreign"),
        "buy",
        "MSFT",
        "1",
        "acct-f",
    ));
    assert_eq!(
        other.process_event(&foreign).await.outcome,
        OutcomeKind::Executed
    );

    // Restore in place (the SQLite backup API, as an operator restores a
    // live file): the same database file holds the backup's content now, so
    // the store is the same store, with its identity.
    rusqlite::Connection::open(&db)
        .unwrap()
        .restore(
            rusqlite::MAIN_DB,
            &backup,
            None::<fn(rusqlite::backup::Progress)>,
        )
        .unwrap();
    let config = order_guard::config::Config::from_lookup(|k| match k {
        "REDIS_URL" => Some(redis.url()),
        "SQL_CONNECTION_STRING" => Some(format!("sqlite:{}", db.display())),
        _ => None,
    })
    .unwrap();
    let prune = |dry: bool| order_guard::app::prune_guard(&config, dry);
    let dry = prune(true).await.unwrap();
    assert_eq!(dry.orphaned, vec![lost_id.clone()], "{dry}");
    assert_eq!((dry.completed, dry.ours), (3, 2), "{dry}");
    let lost_key = GuardSettings::default().key(&lost_id);
    assert_eq!(
        redis.get(&lost_key).as_deref(),
        Some("COMPLETADA"),
        "dry run removes nothing"
    );
    let pruned = prune(false).await.unwrap();
    assert_eq!(pruned.orphaned, vec![lost_id.clone()], "{pruned}");
    assert!(
        pruned.to_string().contains(&format!("removed {lost_id}")),
        "{pruned}"
    );
    assert_eq!(redis.get(&lost_key), None);

    // The restored database executes the lost order again; the kept one
    // stays a duplicate.
    let restored =
        Arc::new(order_guard::store::SqliteStore::open(&db, Duration::from_secs(5)).unwrap());
    restored.migrate().await.unwrap();
    let processor = common::processor(
        common::redis_guard(&redis, GuardSettings::default()),
        restored,
    );
    assert_eq!(
        processor.process_event(&lost).await.outcome,
        OutcomeKind::Executed
    );
    assert_eq!(
        processor.process_event(&kept).await.outcome,
        OutcomeKind::Duplicate
    );
}

/// A store that cannot answer within the internal deadline (its file
/// locked by another process) makes the event `retry`, saying which
/// deadline passed, and leaves no reservation behind.
#[tokio::test]
async fn a_store_slower_than_the_deadline_answers_retry_naming_the_deadline() {
    use order_guard::processor::{Processor, ProcessorSettings};
    use order_guard::store::SqliteStore;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders.db");
    let store = SqliteStore::open(&path, Duration::from_secs(60)).unwrap();
    store.migrate().await.unwrap();
    let settings = ProcessorSettings {
        deadline: Duration::from_millis(200),
        ..ProcessorSettings::default()
    };
    let guard = common::memory_guard();
    let processor = Processor::new(guard.clone(), Arc::new(store), settings);
    let id = unique_id("slow");

    let lock = rusqlite::Connection::open(&path).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    let result = processor
        .process_trigger(eg_event(order_data(&id, "buy", "MSFT", "1", "acct-slow")))
        .await;
    lock.execute_batch("ROLLBACK").unwrap();

    let outcome = &result.outcomes[0];
    assert_eq!(outcome.outcome, OutcomeKind::Retry, "{outcome:?}");
    assert_eq!(
        outcome.reason.as_deref(),
        Some("transient store failure: internal deadline of 200 ms passed; Event Grid will retry"),
        "{outcome:?}"
    );
    assert!(result.needs_redelivery());
    // Released: the redelivery is not held off as `in_progress`.
    let again = processor
        .process_trigger(eg_event(order_data(&id, "buy", "MSFT", "1", "acct-slow")))
        .await;
    assert_eq!(
        again.outcomes[0].outcome,
        OutcomeKind::Executed,
        "{again:?}"
    );
}
