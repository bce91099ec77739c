//! The SQL Server store against a real T-SQL engine, where a fake cannot
//! tell the truth: transactions that fail at their COMMIT, are cut, or time
//! out inside; deadlocks; `migrate` and duplicates from
//! several processes at once; the engine stopped and restarted under load.
//!
//! Runs when `ORDER_GUARD_TEST_MSSQL` names a server (`scripts/test.sh`
//! starts the T-SQL engine and sets it); says so and runs nothing otherwise.
//! The restart test also needs the engine's command (`ORDER_GUARD_TSQL_SERVER`,
//! set by `scripts/test.sh`), since it stops and starts an engine of its own.
//!
//! Fault points are process-wide, so the tests of this binary run one at a
//! time (`SERIAL`).

mod common;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use order_guard::order::{Order, OrderStatus};
use order_guard::position::Position;
use order_guard::store::sqlserver::classify;
use order_guard::store::sqlserver::pool::Client;
use order_guard::store::{Execution, OrderStore, SqlServerStore, StoreError};
use serde_json::json;
use tokio::sync::Notify;

use common::unique_id;

/// One test at a time: fault points are global to the process.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn order(account: &str, qty: &str) -> Order {
    Order::from_data(&json!({
        "orderId": unique_id("ord"), "accountId": account, "side": "buy",
        "symbol": "MSFT", "quantity": qty
    }))
    .unwrap()
}

fn pos(s: &str) -> Position {
    s.parse().unwrap()
}

use common::mssql_raw_client as raw_client;

async fn batch(client: &mut Client, sql: &str) -> Result<(), tiberius::error::Error> {
    client.simple_query(sql).await?.into_results().await?;
    Ok(())
}

/// What a fresh store (new connections) reads: the committed truth (the
/// order's status, if it has a row, and its position).
async fn committed(cs: &str, o: &Order) -> (Option<OrderStatus>, Option<Position>) {
    let store = common::mssql_store(cs, Duration::from_secs(20)).await;
    let row = store.order(&o.order_id).await.unwrap();
    let position = store.position(&o.account_id, &o.symbol).await.unwrap();
    (row.map(|r| r.status), position)
}

#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_fails_or_leaves_the_transaction_open_is_never_answered_executed() {
    let Some(cs) = common::mssql_connection_string() else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let store = common::mssql_store(&cs, Duration::from_secs(20)).await;
    for fault in ["fail", "skip"] {
        let o = order(&unique_id("acct"), "7");
        fail::cfg(
            order_guard::faults::SQLSERVER_COMMIT,
            &format!("return({fault})"),
        )
        .unwrap();
        let answer = store.execute(&o, "e", "{}").await;
        fail::remove(order_guard::faults::SQLSERVER_COMMIT);
        // Each fault is caught by what it tests, never by a malformed batch.
        let why = match (fault, answer) {
            ("fail", Err(e)) => (e.to_string(), "8134"),
            ("skip", Err(e)) => (e.to_string(), "still open"),
            (_, other) => {
                panic!("COMMIT fault {fault}: answered {other:?} for an uncommitted order")
            }
        };
        assert!(why.0.contains(why.1), "COMMIT fault {fault}: {}", why.0);
        // The connection with the open (or aborted) transaction was discarded,
        // which rolled it back: no row, no position (both were written in it).
        assert_eq!(
            committed(&cs, &o).await,
            (None, None),
            "COMMIT fault {fault}: nothing may be committed"
        );
        // The pool holds no connection with a transaction open: the retry
        // executes the order, once.
        assert_eq!(
            store.execute(&o, "e", "{}").await.unwrap(),
            Execution::Executed
        );
        assert_eq!(
            store.execute(&o, "e", "{}").await.unwrap(),
            Execution::AlreadyDone
        );
        assert_eq!(
            committed(&cs, &o).await,
            (Some(OrderStatus::Executed), Some(pos("7"))),
            "COMMIT fault {fault}"
        );
    }
}

#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_inside_the_transaction_is_rolled_back_and_retried_once() {
    let Some(cs) = common::mssql_connection_string() else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let store = common::mssql_store(&cs, Duration::from_secs(20)).await;
    let o = order(&unique_id("acct"), "3");
    // The first attempt's connection is cut before its COMMIT; the store
    // retries once on a new connection, whose batch waits for the first
    // one's rollback on the order's key and then executes it.
    fail::cfg(order_guard::faults::SQLSERVER_COMMIT, "1*return(cut)").unwrap();
    let answer = store.execute(&o, "e", "{}").await;
    fail::remove(order_guard::faults::SQLSERVER_COMMIT);
    assert_eq!(answer.unwrap(), Execution::Executed);
    assert_eq!(
        committed(&cs, &o).await,
        (Some(OrderStatus::Executed), Some(pos("3"))),
        "executed exactly once"
    );
}

/// A statement timeout inside the batch answers `retry`. The batch, COMMIT
/// included, is the server's now: the client's timeout discards the
/// connection but cannot recall a batch blocked on a lock, which may still
/// commit once the lock is free (the model's "a call times out and lands
/// later"). What must hold: the order takes effect once, and its retry says
/// so (`executed` if the late batch did not commit, `duplicate` if it did).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_timeout_inside_the_transaction_is_retry_and_takes_effect_once() {
    let Some(cs) = common::mssql_connection_string() else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let store = common::mssql_store(&cs, Duration::from_secs(2)).await;
    let account = unique_id("acct");
    let first = order(&account, "1");
    store.execute(&first, "e", "{}").await.unwrap();
    let o = order(&account, "4");
    // Another session holds the position row: the batch's UPDATE of it
    // waits past the query timeout, inside the transaction.
    let mut blocker = raw_client(&cs).await;
    batch(&mut blocker, "BEGIN TRANSACTION").await.unwrap();
    blocker
        .execute(
            "UPDATE dbo.Positions SET Units = Units WHERE AccountId = @P1",
            &[&account.as_str()],
        )
        .await
        .unwrap();
    match store.execute(&o, "e", "{}").await {
        Err(StoreError::Transient(m)) => assert!(m.contains("SQL_QUERY_TIMEOUT_SECONDS"), "{m}"),
        other => panic!("want a transient timeout, got {other:?}"),
    }
    batch(&mut blocker, "COMMIT TRANSACTION").await.unwrap();
    let retried = store.execute(&o, "e", "{}").await.unwrap();
    assert!(
        matches!(retried, Execution::Executed | Execution::AlreadyDone),
        "{retried:?}"
    );
    assert_eq!(
        committed(&cs, &o).await,
        (Some(OrderStatus::Executed), Some(pos("5"))),
        "1 + 4, once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlock_is_transient() {
    let Some(cs) = common::mssql_connection_string() else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let store = common::mssql_store(&cs, Duration::from_secs(20)).await;
    let (x, y) = (
        order(&unique_id("acct"), "1"),
        order(&unique_id("acct"), "1"),
    );
    for o in [&x, &y] {
        store.execute(o, "e", "{}").await.unwrap();
    }
    let lock = "UPDATE dbo.Positions SET Units = Units WHERE AccountId = @P1";
    let (mut a, mut b) = (raw_client(&cs).await, raw_client(&cs).await);

    // (A lock timeout, 1222 on SQL Server, is 33557097 on Babelfish: the
    // store sets none and relies on its query timeout, tested above.)
    batch(&mut a, "BEGIN TRANSACTION").await.unwrap();
    a.execute(lock, &[&x.account_id.as_str()]).await.unwrap();

    // Deadlock: a holds x and wants y, b holds y and wants x (1205).
    batch(&mut b, "BEGIN TRANSACTION").await.unwrap();
    b.execute(lock, &[&y.account_id.as_str()]).await.unwrap();
    let (xa, ya) = (x.account_id.as_str(), y.account_id.as_str());
    let (pa, pb): ([&dyn tiberius::ToSql; 1], [&dyn tiberius::ToSql; 1]) = ([&ya], [&xa]);
    let (ra, rb) = tokio::join!(a.execute(lock, &pa), b.execute(lock, &pb));
    let victim = match (ra, rb) {
        (Err(e), Ok(_)) | (Ok(_), Err(e)) => e,
        (ra, rb) => panic!("want exactly one deadlock victim, got {ra:?} and {rb:?}"),
    };
    assert_eq!(victim.code(), Some(1205), "{victim}");
    assert!(
        matches!(classify::classify("t", &victim), StoreError::Transient(_)),
        "{victim}"
    );
}

fn handler_command(cs: &str, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(common::handler_binary());
    cmd.args(args)
        .env_remove("REDIS_URL")
        .env("SQL_CONNECTION_STRING", cs)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_from_three_processes_at_once_on_a_new_database() {
    let Some(cs) = common::mssql_connection_string() else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let db = common::mssql_fresh_database(&cs).await;
    let runs: Vec<_> = (0..3)
        .map(|_| handler_command(&db, &["migrate"]).output())
        .collect();
    for out in futures::future::join_all(runs).await {
        let out = out.unwrap();
        assert!(
            out.status.success(),
            "migrate failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // And again, on the migrated database.
    let again = handler_command(&db, &["migrate"]).output().await.unwrap();
    assert!(again.status.success(), "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_from_several_processes_at_once_execute_each_order_once() {
    let Some(cs) = common::mssql_connection_string() else {
        return;
    };
    let _serial = SERIAL.lock().await;
    // The memory guard is per process: only the database stands between the
    // four processes and a double execution.
    let account = unique_id("acct");
    let ids: Vec<String> = (0..20).map(|_| unique_id("ord")).collect();
    let deliveries: Vec<_> = ids
        .iter()
        .map(|id| common::eg_event(common::order_data(id, "buy", "MSFT", "2", &account)))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("deliveries.json");
    std::fs::write(&file, serde_json::to_vec(&deliveries).unwrap()).unwrap();
    let file = file.display().to_string();
    // As the app is deployed: a user with only the role order_guard_app.
    let app = common::mssql_app_connection_string(&cs).await;
    let runs: Vec<_> = (0..4)
        .map(|_| handler_command(&app, &["replay", &file, "--concurrency", "8"]).output())
        .collect();
    let mut executed = 0;
    for out in futures::future::join_all(runs).await {
        let out = out.unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let summary = stdout.lines().last().unwrap_or_default().to_string();
        let field = |name: &str| -> u64 {
            summary
                .split_whitespace()
                .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {name}= in {summary:?}"))
        };
        assert_eq!(field("unresolved"), 0, "{summary}");
        assert_eq!(field("executed") + field("duplicates"), 20, "{summary}");
        executed += field("executed");
    }
    // No order is answered `executed` twice. (Fewer than 20 `executed`
    // answers is allowed: a call that timed out while its COMMIT went
    // through is answered `retry`, and its redelivery `duplicate`; the
    // database below says whether the effect happened, once.)
    assert!(
        executed <= 20,
        "{executed} `executed` answers for 20 orders"
    );
    let store = common::mssql_store(&cs, Duration::from_secs(20)).await;
    for id in &ids {
        let row = store.order(id).await.unwrap().expect("every order stored");
        assert_eq!(row.status, OrderStatus::Executed, "{id}");
    }
    assert_eq!(
        store.position(&account, "MSFT").await.unwrap(),
        Some(pos("40")),
        "each of the 20 orders took effect exactly once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_stopped_and_restarted_under_load_loses_nothing() {
    let Some(_) = common::mssql_connection_string() else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let engine = common::OwnEngine::new();
    let cs = engine.command(&["start", "--database", "restart_test"]);
    // The schema is created under a generous timeout (a fresh engine on a
    // busy machine compiles its procedures slowly); the store under test
    // then only checks its version, and fails fast while the engine is down.
    common::mssql_store(&cs, Duration::from_secs(30)).await;
    let store: Arc<SqlServerStore> = common::mssql_store(&cs, Duration::from_secs(3)).await;
    let account = unique_id("acct");
    let orders: Vec<Order> = (0..300).map(|_| order(&account, "1")).collect();

    // A worker delivers every order until it is done, as Event Grid would
    // (retrying every failure). A third of the way it waits while the engine
    // stops (every pooled connection is cut), then goes on while the engine
    // is down and after it is back.
    let (at_gate, engine_stopped) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let work = {
        let store = Arc::clone(&store);
        let orders = orders.clone();
        let (at_gate, engine_stopped) = (Arc::clone(&at_gate), Arc::clone(&engine_stopped));
        async move {
            let mut retries = 0u32;
            for (i, o) in orders.iter().enumerate() {
                if i == orders.len() / 3 {
                    at_gate.notify_one();
                    engine_stopped.notified().await;
                }
                loop {
                    let finished = match store.execute(o, "e", "{}").await {
                        Ok(Execution::Executed | Execution::AlreadyDone) => true,
                        Ok(other) => panic!("{other:?} for {}", o.order_id),
                        Err(_) => false,
                    };
                    if finished {
                        break;
                    }
                    retries += 1;
                    assert!(retries < 2_000, "the store never recovered");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            retries
        }
    };
    let worker = tokio::spawn(work);
    at_gate.notified().await;
    engine.command(&["stop"]);
    engine_stopped.notify_one();
    engine.command(&["start", "--database", "restart_test"]);
    let retries = worker.await.unwrap();
    // Every order executed once: the position is the count of orders.
    assert_eq!(
        store.position(&account, "MSFT").await.unwrap(),
        Some(Position::from(orders.len() as i64)),
        "after {retries} failed calls"
    );
    for o in &orders {
        let row = store.order(&o.order_id).await.unwrap().unwrap();
        assert_eq!(row.status, OrderStatus::Executed, "{}", o.order_id);
    }
}
