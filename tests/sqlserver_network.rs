//! The SQL Server store on a network that fails as Azure's does.
//! A proxy of the tests' own (`common::proxy`) stands between the store and
//! the server and drops every connection silently: no RST, no FIN, the
//! bytes just go nowhere, as a load balancer that lost its state does. The
//! store must find it by its own timeout, on one connection only, and go on
//! on new ones. Or it closes them all and refuses new ones for a while (an
//! outage): the pool must refill itself once the server is back, and serve
//! a call that waited through it. And once on a real drop (a route that
//! discards the packets, `common::blackhole`): the kernel's keep-alive must
//! find idle connections dead by itself.
//!
//! Runs when `ORDER_GUARD_TEST_MSSQL` names a server (`scripts/test.sh`
//! starts the T-SQL engine and sets it); says so and runs nothing otherwise.

mod common;

use std::net::SocketAddrV4;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::blackhole::{established_to, private_loopback, Blackhole};
use common::proxy::{server_of, via, via_address, TurnProxy};
use common::unique_id;
use order_guard::order::Order;
use order_guard::store::sqlserver::pool::{
    KEEPALIVE_INTERVAL, KEEPALIVE_RETRIES, KEEPALIVE_TIME, MIN_IDLE,
};
use order_guard::store::sqlserver::{retry::call_budget, SqlServerSettings};
use order_guard::store::{Execution, OrderStore, SqlServerStore};
use serde_json::json;

fn order(account: &str) -> Order {
    Order::from_data(&json!({
        "orderId": unique_id("ord"), "accountId": account, "side": "buy",
        "symbol": "MSFT", "quantity": "1"
    }))
    .unwrap()
}

/// `n` orders executed at once, so the pool holds up to `n` connections
/// that have each served; then the pool at rest (no login in flight).
async fn served_connections(store: &Arc<SqlServerStore>, account: &str, n: usize) {
    let served = futures::future::join_all((0..n).map(|_| {
        let (store, o) = (store.clone(), order(account));
        async move { store.execute(&o, "e", "{}").await }
    }))
    .await;
    assert!(
        served.iter().all(|r| r == &Ok(Execution::Executed)),
        "{served:?}"
    );
    common::mssql_pool_at_rest(store).await;
}

/// After a silent drop of every connection in the pool, no call waits on a
/// dead connection longer than one query timeout: the first call meets one
/// (its request unanswered, or its check on checkout), and sends again on a
/// new connection within its budget; the connections idle beside it are
/// taken for dead without being waited on, so every later call is served
/// by a new connection within one query timeout. Every call succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_silent_drop_no_call_waits_longer_than_a_query_timeout_and_every_call_succeeds() {
    let Some(cs) = common::mssql_connection_string() else {
        return;
    };
    let server = server_of(&cs).expect("a Server=host,port in ORDER_GUARD_TEST_MSSQL");
    let proxy = TurnProxy::start(server, Duration::ZERO).await;
    let query_timeout = Duration::from_secs(4);
    let settings = common::mssql_settings(query_timeout);
    let store = common::mssql_store(&via(&cs, proxy.port), query_timeout).await;
    let account = unique_id("acct");
    served_connections(&store, &account, 4).await;
    let before = store.load().pool.expect("a pool");

    proxy.silence();

    let mut waits = Vec::new();
    for call in 0..6 {
        let started = Instant::now();
        let result = store.execute(&order(&account), "e", "{}").await;
        let waited = started.elapsed();
        waits.push(waited);
        assert_eq!(
            result,
            Ok(Execution::Executed),
            "call {call} after the drop"
        );
        // The first call's budget: one query timeout on the dead
        // connection, the rest to connect and send again.
        let bound = if call == 0 {
            settings.query_timeout + settings.connect_timeout
        } else {
            settings.query_timeout
        };
        assert!(
            waited < bound,
            "call {call} after the drop waited {waited:?} (bound {bound:?}; all: {waits:?})"
        );
    }
    println!(
        "silent drop of {} pooled connections, query timeout {} ms: calls answered in {:?}",
        before.open,
        query_timeout.as_millis(),
        waits
            .iter()
            .map(|w| format!("{} ms", w.as_millis()))
            .collect::<Vec<_>>()
    );
}

/// A real silent drop, not the proxy's emulation (whose kernel still
/// acknowledges every byte): every packet to the server's address is
/// discarded. TCP keep-alive on the pooled sockets finds the idle
/// connections dead by itself, with no call made: on Linux at the first
/// probe tick past `TCP_USER_TIMEOUT` (15 s + one 5 s interval), elsewhere
/// after `KEEPALIVE_TIME + KEEPALIVE_INTERVAL × KEEPALIVE_RETRIES` (30 s),
/// the test's bound. Once the path is back, a call is served within one
/// query timeout: a dead connection fails at its first write, it is not
/// waited on. (The query timeout is long here, 12 s, so that the new
/// session the call needs, which compiles the procedure for seconds on the
/// CI's engine, is never what the bound measures.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_finds_idle_connections_dead_across_a_real_silent_drop() {
    let Some(cs) = common::mssql_connection_string() else {
        return;
    };
    let server = server_of(&cs).expect("a Server=host,port in ORDER_GUARD_TEST_MSSQL");
    let address = private_loopback();
    let proxy = TurnProxy::start_on(address, server, Duration::ZERO).await;
    let path = SocketAddrV4::new(address, proxy.port);
    let query_timeout = Duration::from_secs(12);
    let store = common::mssql_store(&via_address(&cs, address, proxy.port), query_timeout).await;
    let account = unique_id("acct");
    served_connections(&store, &account, 3).await;
    let open = established_to(path);
    assert!(
        open > 0,
        "no connection of the pool to {path} in /proc/net/tcp"
    );

    let blackhole = Blackhole::drop_all_to(address);
    let dropped = Instant::now();
    let bound = KEEPALIVE_TIME + KEEPALIVE_INTERVAL * KEEPALIVE_RETRIES;
    // The kernel's table is the signal: polled, not slept on.
    while established_to(path) > 0 {
        assert!(
            dropped.elapsed() < bound + Duration::from_secs(10),
            "{} of {open} idle connections to {path} still open {:?} after a real silent drop: \
             keep-alive ({bound:?}) did not reset them",
            established_to(path),
            dropped.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let found = dropped.elapsed();
    drop(blackhole);

    let started = Instant::now();
    let result = store.execute(&order(&account), "e", "{}").await;
    let waited = started.elapsed();
    assert_eq!(
        result,
        Ok(Execution::Executed),
        "the first call after the drop"
    );
    assert!(
        waited < query_timeout,
        "the first call after the drop waited {waited:?} (query timeout {query_timeout:?})"
    );
    println!(
        "real silent drop: {open} idle connections reset by keep-alive {} ms after the drop \
         (bound {} ms from their last traffic); the next call answered in {} ms",
        found.as_millis(),
        bound.as_millis(),
        waited.as_millis()
    );
}

/// An outage closes every connection and refuses new ones for twice the
/// connect timeout, so the connects started for a call made during it fail
/// and the pool has to ask again by itself. Once the server is back the
/// pool reopens connections in the background, the first login that
/// succeeds serves the waiting call (within its budget), and the pool is
/// back to its reserve of idle connections with no other call made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_outage_a_waiting_call_is_served_by_the_first_login_that_succeeds() {
    let Some(cs) = common::mssql_connection_string() else {
        return;
    };
    let server = server_of(&cs).expect("a Server=host,port in ORDER_GUARD_TEST_MSSQL");
    let proxy = TurnProxy::start(server, Duration::ZERO).await;
    let app = via(&common::mssql_app_connection_string(&cs).await, proxy.port);
    let settings = SqlServerSettings {
        connect_timeout: Duration::from_secs(2),
        ..common::mssql_settings(Duration::from_secs(8))
    };
    let store = Arc::new(SqlServerStore::connect(&app, &settings).unwrap());
    store.migrate().await.unwrap();
    let account = unique_id("acct");
    served_connections(&store, &account, 3).await;

    proxy.outage();
    let started = Instant::now();
    let call = tokio::spawn({
        let (store, o) = (store.clone(), order(&account));
        async move { store.execute(&o, "e", "{}").await }
    });
    // How long the outage lasts: the scenario, not a synchronisation.
    tokio::time::sleep(settings.connect_timeout * 2).await;
    if call.is_finished() {
        panic!("the call did not wait through the outage: {:?}", call.await);
    }
    let back = Instant::now();
    proxy.restore();
    let result = call.await.unwrap();
    let (waited, after_back) = (started.elapsed(), back.elapsed());
    assert_eq!(result, Ok(Execution::Executed));
    let budget = call_budget(settings.connect_timeout, settings.query_timeout);
    assert!(waited < budget, "waited {waited:?}, budget {budget:?}");
    println!(
        "outage of {} ms: the waiting call answered {} ms after the server came back ({} ms in all)",
        (back - started).as_millis(),
        after_back.as_millis(),
        waited.as_millis()
    );
    // No other call: the reserve was reopened in the background.
    common::mssql_pool_at_rest(&store).await;
    let pool = store.load().pool.expect("a pool");
    assert!(pool.idle > u64::from(MIN_IDLE), "{pool:?}");
}

/// The other reading of a timeout: a statement blocked on a lock on a live
/// path. The suspicion it raises is settled by a connection idle beside it,
/// which answers its check: the call answers `retry` at its query timeout
/// and is not sent again (which would only queue a second time on the same
/// lock), and the connections idle beside it are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_blocked_on_a_lock_is_not_taken_for_a_dead_path() {
    let Some(cs) = common::mssql_connection_string() else {
        return;
    };
    let query_timeout = Duration::from_secs(3);
    let store = common::mssql_store(&cs, query_timeout).await;
    let account = unique_id("acct");
    served_connections(&store, &account, 3).await;
    let before = store.load().pool.expect("a pool");
    // Another session holds the position row: the call's UPDATE waits.
    let mut blocker = common::mssql_raw_client(&cs).await;
    for statement in [
        "BEGIN TRANSACTION",
        "UPDATE dbo.Positions SET Units = Units WHERE AccountId = '{account}'",
    ] {
        let statement = statement.replace("{account}", &account);
        blocker
            .simple_query(statement)
            .await
            .unwrap()
            .into_results()
            .await
            .unwrap();
    }
    let started = Instant::now();
    let answer = store.execute(&order(&account), "e", "{}").await;
    let waited = started.elapsed();
    blocker
        .simple_query("ROLLBACK TRANSACTION")
        .await
        .unwrap()
        .into_results()
        .await
        .unwrap();
    match answer {
        Err(order_guard::store::StoreError::Transient(m)) => {
            assert!(m.contains("SQL_QUERY_TIMEOUT_SECONDS"), "{m}")
        }
        other => panic!("want retry at the query timeout, got {other:?}"),
    }
    // Sent again, it would have waited a second query timeout on the lock.
    assert!(
        waited < query_timeout * 3 / 2,
        "answered after {waited:?}: sent again? (query timeout {query_timeout:?})"
    );
    // At most the connection that timed out was discarded (the pool may
    // have opened one since, to keep its reserve).
    let after = store.load().pool.expect("a pool");
    assert!(
        after.open + 1 >= before.open,
        "before {before:?}, after {after:?}"
    );
    println!(
        "a statement blocked past its query timeout of {} ms answered retry in {} ms",
        query_timeout.as_millis(),
        waited.as_millis()
    );
}
