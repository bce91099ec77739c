//! The SQL Server pool's gauges as the receiver gets them, from a real
//! store whose server accepts TCP and never answers a login (no SQL Server
//! needed: what is observed is the pool, not the database).

use std::sync::Arc;
use std::time::Duration;

use order_guard::processor::{Processor, ProcessorSettings};
use order_guard::store::sqlserver::pool::LOGINS_AT_ONCE;
use order_guard::store::sqlserver::SqlServerSettings;
use order_guard::store::{OrderStore, SqlServerStore};
use order_guard::telemetry::{LoadSource, Telemetry};

use super::{attrs, common, otlp_settings, points, Receiver};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pools_logins_in_flight_are_a_gauge_by_state() {
    // The kernel completes the TCP handshake into the backlog; nobody reads
    // the PRELOGIN: each login hangs until its budget (at least 30 s).
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let cs = format!(
        "Server=tcp:127.0.0.1,{};Database=d;User ID=u;Password=pw;Encrypt=DANGER_PLAINTEXT",
        silent.local_addr().unwrap().port()
    );
    let store = SqlServerStore::connect(
        &cs,
        &SqlServerSettings {
            connect_timeout: Duration::from_secs(1),
            query_timeout: Duration::from_secs(2),
            pool_size: 4,
            migrate_timeout: order_guard::store::sqlserver::DEFAULT_MIGRATE_TIMEOUT,
            migrate_batch_rows: order_guard::store::sqlserver::DEFAULT_MIGRATE_BATCH_ROWS,
            idle_timeout: order_guard::store::sqlserver::DEFAULT_IDLE_TIMEOUT,
        },
    )
    .unwrap();
    let callers = LOGINS_AT_ONCE + 1;
    let tried = futures::future::join_all((0..callers).map(|_| store.migrate())).await;
    assert!(tried.iter().all(Result::is_err), "{tried:?}");

    let collector = Receiver::start();
    let telemetry = Telemetry::start(&otlp_settings(&collector), None)
        .unwrap()
        .expect("an endpoint turns telemetry on");
    let store: Arc<dyn OrderStore> = Arc::new(store);
    let processor = Arc::new(Processor::new(
        common::memory_guard(),
        Arc::clone(&store),
        ProcessorSettings::default(),
    ));
    // The callers gave up at the connect timeout; their logins go on in
    // the pool's background (two running, paced, the other waiting).
    let load = processor.load().pool.expect("a pool");
    assert_eq!(
        (load.logins_running, load.logins_waiting),
        (LOGINS_AT_ONCE as u64, (callers - LOGINS_AT_ONCE) as u64),
        "{load:?}"
    );
    telemetry.observe(processor);
    telemetry.shutdown().await;

    let metrics = collector.last_metrics();
    let pool = |state: &str| {
        attrs(&[
            ("db.client.connection.pool.name", "order-guard"),
            ("db.system.name", "microsoft.sql_server"),
            ("order_guard.login.state", state),
        ])
    };
    let mut logins = points(&metrics["order_guard.sql.logins_in_flight"]);
    logins.sort();
    assert_eq!(
        logins,
        vec![
            (pool("running"), LOGINS_AT_ONCE as i64),
            (pool("waiting"), (callers - LOGINS_AT_ONCE) as i64),
        ]
    );
    let timeouts = points(&metrics["db.client.connection.timeouts"]);
    assert_eq!(timeouts.len(), 1, "{timeouts:?}");
    assert_eq!(timeouts[0].1, callers as i64, "{timeouts:?}");
    drop(silent);
}
