//! The pool: connect timeouts, paced logins, the schema gate, Azure's redirect.

use super::*;

#[tokio::test]
async fn an_unreachable_server_is_a_transient_failure_within_the_connect_timeout() {
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port(); // listener dropped: nobody listens there now
    let cs = format!("Server=tcp:127.0.0.1,{port};Database=d;User ID=u;Password=Hunter2!x;Encrypt=DANGER_PLAINTEXT");
    let store = SqlServerStore::connect(&cs, &settings(1)).unwrap();
    let started = std::time::Instant::now();
    let e = store.migrate().await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    match e {
        StoreError::Transient(m) => {
            assert!(m.contains("no SQL Server connection"), "{m}");
            assert!(!m.contains("Hunter2"), "{m}");
        }
        other => panic!("{other:?}"),
    }
    // Telemetry's view of the pool (`db.client.connection.*`): nothing
    // open, nobody waiting any more, the wait that timed out counted.
    let pool = store.load().pool.expect("a SQL Server store has a pool");
    assert_eq!((pool.open, pool.idle, pool.pending), (0, 0, 0), "{pool:?}");
    assert!(pool.timeouts >= 1, "{pool:?}");
}

/// Logins are paced: however many callers wait for a connection, at most
/// `LOGINS_AT_ONCE` logins are in flight per pool, and a caller still gives
/// up at the connect timeout. Without this an overloaded server gets one
/// login per waiting caller, each abandoned and started again (a
/// reconnection storm).
#[tokio::test]
async fn logins_are_paced_whatever_the_number_of_waiting_callers() {
    use order_guard::store::sqlserver::pool::LOGINS_AT_ONCE;
    let fake = FakeTds::start(LoginAnswer::Never).await;
    let cs = format!(
        "Server=tcp:127.0.0.1,{};Database=d;User ID=u;Password=pw;Encrypt=DANGER_PLAINTEXT",
        fake.port
    );
    let store = SqlServerStore::connect(
        &cs,
        &SqlServerSettings {
            connect_timeout: Duration::from_secs(1),
            query_timeout: Duration::from_secs(2),
            pool_size: 8,
            migrate_timeout: order_guard::store::sqlserver::DEFAULT_MIGRATE_TIMEOUT,
            migrate_batch_rows: order_guard::store::sqlserver::DEFAULT_MIGRATE_BATCH_ROWS,
            idle_timeout: order_guard::store::sqlserver::DEFAULT_IDLE_TIMEOUT,
        },
    )
    .unwrap();
    let started = std::time::Instant::now();
    let callers = futures::future::join_all((0..8).map(|_| store.migrate()));
    // Meanwhile telemetry's gauge (`order_guard.sql.logins_in_flight`)
    // shows the paced logins running and the rest waiting for a turn.
    let watch = async {
        loop {
            let pool = store.load().pool.expect("a pool");
            if pool.logins_running == LOGINS_AT_ONCE as u64 && pool.logins_waiting > 0 {
                return pool;
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "logins in flight: {pool:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let (results, _) = tokio::join!(callers, watch);
    for result in results {
        match result {
            Err(StoreError::Transient(m)) => assert!(m.contains("no SQL Server connection"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        fake.login_count(),
        LOGINS_AT_ONCE,
        "logins started for 8 waiting callers"
    );
    // The callers gave up; the logins go on within their budget, still
    // counted (bb8 keeps its connects running for the next caller).
    let after = store.load().pool.expect("a pool");
    assert_eq!(after.logins_running, LOGINS_AT_ONCE as u64, "{after:?}");
    assert!(after.logins_waiting > 0, "{after:?}");
}

#[tokio::test]
async fn a_refused_login_explains_the_pool_timeout() {
    let fake = FakeTds::start(LoginAnswer::Error(18456, "Login failed for user 'u'.")).await;
    let cs = format!(
        "Server=tcp:127.0.0.1,{};Database=d;User ID=u;Password=Hunter2!x;Encrypt=DANGER_PLAINTEXT",
        fake.port
    );
    let store = SqlServerStore::connect(&cs, &settings(1)).unwrap();
    let e = store.migrate().await.unwrap_err();
    let m = e.to_string();
    assert!(m.contains("18456") && m.contains("Login failed"), "{m}");
    assert!(!m.contains("Hunter2"), "{m}");
    assert!(fake.login_count() >= 1);
}

#[tokio::test]
async fn nothing_is_read_or_written_before_the_schema_is_verified() {
    // The fake accepts logins but is no database: `migrate` cannot succeed,
    // so every other call must refuse (retry) without sending anything.
    let fake = FakeTds::start(LoginAnswer::Accept).await;
    let cs = format!(
        "Server=tcp:127.0.0.1,{};Database=d;User ID=u;Password=pw;Encrypt=DANGER_PLAINTEXT",
        fake.port
    );
    let store = SqlServerStore::connect(&cs, &settings(2)).unwrap();
    let e = store.migrate().await.unwrap_err();
    assert!(e.to_string().contains("migrate"), "{e}");
    let logins = fake.login_count();
    for e in [
        store.execute(&order(), "e", "{}").await.unwrap_err(),
        store.order("o-1").await.unwrap_err(),
    ] {
        match e {
            StoreError::Transient(m) => assert!(m.contains("schema is not verified"), "{m}"),
            other => panic!("want a transient refusal, got {other:?}"),
        }
    }
    assert_eq!(
        fake.login_count(),
        logins,
        "no connection used for a refused call"
    );
}

// ---------------------------------------------------------------- redirect

#[tokio::test]
async fn azure_redirect_is_followed_with_a_new_login() {
    let node = FakeTds::start(LoginAnswer::Accept).await;
    let gateway = FakeTds::start(LoginAnswer::Route("127.0.0.1".into(), node.port)).await;
    let client = open_following_redirect(gateway.config()).await;
    assert!(client.is_ok(), "{:?}", client.err());
    assert_eq!(gateway.login_count(), 1);
    assert_eq!(node.login_count(), 1, "the login is repeated at the node");

    // A node that redirects again is an error, not a loop.
    let again = FakeTds::start(LoginAnswer::Route("127.0.0.1".into(), node.port)).await;
    let first = FakeTds::start(LoginAnswer::Route("127.0.0.1".into(), again.port)).await;
    let e = open_following_redirect(first.config()).await.err().unwrap();
    assert!(e.to_string().contains("redirected twice"), "{e}");
}
