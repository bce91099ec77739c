//! Migrations that finish, on the T-SQL engine: a version-2
//! database (`tests/fixtures/sqlserver-schema-v2.sql`) with many positions
//! is upgraded in batches that each commit; a migration killed half-way and
//! run again finishes with every position exactly its old value in units,
//! no row converted twice; a start's migration keeps its short bound and
//! says to run `order-guard migrate`; a migration lock held elsewhere makes
//! `migrate` fail with a clear error instead of going on.
//!
//! Runs when `ORDER_GUARD_TEST_MSSQL` names a server (`scripts/test.sh`
//! starts the T-SQL engine and sets it), as its owner; says so and runs
//! nothing otherwise. Each test works in a fresh database of its own.

mod common;

use std::collections::HashMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use order_guard::store::sqlserver::pool::Client;
use order_guard::store::{Execution, OrderStore, SqlServerStore, StoreError};
use serde_json::json;

/// Positions in the version-2 database: enough that one batch is clearly
/// not all of them.
const POSITIONS: usize = 50_000;

/// Babelfish keeps `sp_getapplock`'s locks per server, not per database:
/// each test here takes or waits on the schema's lock, so they run one at a
/// time, or one's holder would be another's "another migration".
static SCHEMA_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn batch(client: &mut Client, sql: &str) -> Result<(), tiberius::error::Error> {
    client.simple_query(sql).await?.into_results().await?;
    Ok(())
}

/// One integer from a one-row query.
async fn count(client: &mut Client, sql: &str) -> Result<i64, tiberius::error::Error> {
    let row = client.simple_query(sql).await?.into_row().await?.unwrap();
    Ok(row
        .try_get::<i32, _>(0)
        .ok()
        .flatten()
        .map(i64::from)
        .or_else(|| row.try_get::<i64, _>(0).ok().flatten())
        .unwrap())
}

/// A decimal's text (`-12.5000000000`, `3`) in units of 10^-10, exactly.
fn units(text: &str) -> i128 {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    assert!(frac.len() <= 10, "{text}");
    let value: i128 = format!("{int}{frac:0<10}").parse().unwrap();
    if negative {
        -value
    } else {
        value
    }
}

/// A fresh database at schema version 2 with [`POSITIONS`] positions
/// (fractions, signs, and the extremes of `DECIMAL(38,10)`); its owner's
/// connection string and each account's position in units.
async fn version_2_database(cs: &str, positions: usize) -> (String, HashMap<String, i128>) {
    let db = common::mssql_fresh_database(cs).await;
    let mut owner = common::mssql_raw_client(&db).await;
    for b in common::mssql_v2_schema_batches() {
        batch(&mut owner, &b).await.unwrap();
    }
    // n = 0 … positions-1, from five digits; quantities built as text so
    // each is exact: ±(n × 7919).(n × 104729 mod 10^10, ten digits).
    batch(
        &mut owner,
        &format!(
            "WITH d AS (SELECT v FROM (VALUES (0),(1),(2),(3),(4),(5),(6),(7),(8),(9)) AS t (v)), \
             n AS (SELECT a.v * 10000 + b.v * 1000 + c.v * 100 + e.v * 10 + f.v AS n \
                   FROM d AS a CROSS JOIN d AS b CROSS JOIN d AS c CROSS JOIN d AS e CROSS JOIN d AS f) \
             INSERT INTO dbo.Positions (AccountId, Symbol, Quantity, UpdatedAt) \
             SELECT CONCAT(N'acct-', n), N'MSFT', CONVERT(DECIMAL(38, 10), CONCAT( \
                 CASE WHEN n % 2 = 0 THEN '' ELSE '-' END, CONVERT(VARCHAR(20), CONVERT(BIGINT, n) * 7919), '.', \
                 RIGHT(CONCAT('0000000000', CONVERT(VARCHAR(20), (CONVERT(BIGINT, n) * 104729) % 10000000000)), 10))), \
                 SYSUTCDATETIME() \
             FROM n WHERE n < {}",
            positions - 4
        ),
    )
    .await
    .unwrap();
    batch(
        &mut owner,
        "INSERT INTO dbo.Positions (AccountId, Symbol, Quantity, UpdatedAt) VALUES \
         (N'max', N'MSFT', 9999999999999999999999999999.9999999999, SYSUTCDATETIME()), \
         (N'min', N'MSFT', -9999999999999999999999999999.9999999999, SYSUTCDATETIME()), \
         (N'tiny', N'MSFT', -0.0000000001, SYSUTCDATETIME()), \
         (N'zero', N'MSFT', 0, SYSUTCDATETIME())",
    )
    .await
    .unwrap();
    let rows = owner
        .simple_query("SELECT AccountId, CONVERT(VARCHAR(64), Quantity) FROM dbo.Positions")
        .await
        .unwrap()
        .into_first_result()
        .await
        .unwrap();
    let old: HashMap<String, i128> = rows
        .iter()
        .map(|r| {
            (
                r.get::<&str, _>(0).unwrap().to_string(),
                units(r.get::<&str, _>(1).unwrap()),
            )
        })
        .collect();
    assert_eq!(old.len(), positions);
    assert_eq!(old["max"], 10_i128.pow(38) - 1);
    assert_eq!(old["tiny"], -1);
    (db, old)
}

/// Each account's position in units as stored now (`None`: not converted).
async fn stored_units(owner: &mut Client) -> HashMap<String, Option<i128>> {
    owner
        .simple_query("SELECT AccountId, CONVERT(VARCHAR(64), Units) FROM dbo.Positions")
        .await
        .unwrap()
        .into_first_result()
        .await
        .unwrap()
        .iter()
        .map(|r| {
            (
                r.get::<&str, _>(0).unwrap().to_string(),
                r.get::<&str, _>(1).map(|u| u.parse::<i128>().unwrap()),
            )
        })
        .collect()
}

fn migrate_command(cs: &str, batch_rows: u32) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(common::handler_binary());
    cmd.arg("migrate")
        .env_remove("REDIS_URL")
        .env_remove("FAILPOINTS")
        .env("SQL_CONNECTION_STRING", cs)
        .env("SQL_MIGRATE_BATCH_ROWS", batch_rows.to_string())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

const CONVERTED: &str = "SELECT COUNT(*) FROM dbo.Positions WHERE Units IS NOT NULL";

/// The migration's lock, taken by `owner` once the session holding it is
/// gone (a killed process's session ends with its last statement), then
/// given back: after this, nothing of that migration can still commit.
async fn wait_for_the_lock(owner: &mut Client) {
    let granted = count(
        owner,
        "DECLARE @r INT; EXEC @r = sp_getapplock @Resource = N'order-guard:schema', \
         @LockMode = N'Exclusive', @LockOwner = N'Session', @LockTimeout = 30000; SELECT @r",
    )
    .await
    .unwrap();
    assert!(
        granted >= 0,
        "the killed migration's lock was never released"
    );
    batch(
        owner,
        "EXEC sp_releaseapplock @Resource = N'order-guard:schema', @LockOwner = N'Session'",
    )
    .await
    .unwrap();
}

/// `order-guard migrate` killed (SIGKILL) half-way through the conversion,
/// then run again: every position is its old value × 10^10 exactly, the
/// second run converts exactly the rows the first left, nothing of version
/// 3 is current before the end, and an instance of version 2 cannot write
/// a position meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_killed_half_way_resumes_and_converts_every_position_once_and_exactly() {
    let _one_at_a_time = SCHEMA_LOCK.lock().await;
    let Some(cs) = common::mssql_connection_string() else {
        return;
    };
    let (db, old) = version_2_database(&cs, POSITIONS).await;
    let mut owner = common::mssql_raw_client(&db).await;

    let mut first = migrate_command(&db, 500).spawn().unwrap();
    // Wait (watching the committed rows) until some batches have committed
    // and most are still to come, then kill the process.
    let started = Instant::now();
    let converted = loop {
        // Before the first transaction commits there is no Units column.
        if let Ok(n) = count(&mut owner, CONVERTED).await {
            if n >= 2_000 {
                break n;
            }
        }
        if let Ok(Some(status)) = first.try_wait() {
            panic!("the migration ended ({status}) before it could be cut: use more rows");
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no progress in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    first.start_kill().unwrap();
    let status = first.wait().await.unwrap();
    assert!(!status.success(), "killed");
    wait_for_the_lock(&mut owner).await;
    let cut = count(&mut owner, CONVERTED).await.unwrap();
    assert!(
        cut >= converted && cut < POSITIONS as i64,
        "cut half-way: {cut} of {POSITIONS} converted"
    );
    // Half-way, nothing says version 3 is there, and a version-2 writer
    // fails (its column was renamed) rather than write a converted row.
    assert_eq!(
        count(
            &mut owner,
            "SELECT COUNT(*) FROM dbo.SchemaVersion WHERE Version = 3"
        )
        .await
        .unwrap(),
        0
    );
    let v2_write = batch(
        &mut owner,
        "UPDATE dbo.Positions SET Quantity = Quantity + 1 WHERE AccountId = N'acct-1'",
    )
    .await;
    assert!(v2_write.is_err(), "a version-2 writer still writes");
    // What was converted is exact already.
    for (account, units) in stored_units(&mut owner).await {
        if let Some(units) = units {
            assert_eq!(units, old[&account], "{account}");
        }
    }

    let second = migrate_command(&db, 1_000).output().await.unwrap();
    let said = String::from_utf8_lossy(&second.stdout).to_string()
        + &String::from_utf8_lossy(&second.stderr);
    assert!(second.status.success(), "{said}");
    let left = POSITIONS as i64 - cut;
    assert!(
        said.contains(&format!("migrate: {left} positions converted to units")),
        "the second run converts exactly the {left} rows left: {said}"
    );
    let now = stored_units(&mut owner).await;
    assert_eq!(now.len(), POSITIONS);
    for (account, units) in &now {
        assert_eq!(*units, Some(old[account]), "{account}");
    }
    assert_eq!(
        count(
            &mut owner,
            "SELECT COUNT(*) FROM sys.columns WHERE object_id = OBJECT_ID(N'dbo.Positions') \
             AND name = N'QuantityV2'"
        )
        .await
        .unwrap(),
        0,
        "the version-2 column is dropped"
    );
    assert!(
        batch(
            &mut owner,
            "INSERT INTO dbo.Positions (AccountId, Symbol, Units, UpdatedAt) \
             VALUES (N'null', N'MSFT', NULL, SYSUTCDATETIME())"
        )
        .await
        .is_err(),
        "Units is NOT NULL after the upgrade"
    );

    // The app, least privileged, executes on an upgraded position.
    let app = common::mssql_app_connection_string(&db).await;
    let store =
        SqlServerStore::connect(&app, &common::mssql_settings(Duration::from_secs(20))).unwrap();
    store.migrate().await.unwrap();
    let order = order_guard::order::Order::from_data(&json!({
        "orderId": common::unique_id("ord"), "accountId": "tiny", "side": "buy",
        "symbol": "MSFT", "quantity": "2"
    }))
    .unwrap();
    assert_eq!(
        store.execute(&order, "e", "{}").await.unwrap(),
        Execution::Executed
    );
    assert_eq!(
        store.position("tiny", "MSFT").await.unwrap(),
        Some("1.9999999999".parse().unwrap())
    );
}

/// A start's migration keeps its short bound (3 × the query timeout): a
/// conversion that cannot finish in it (here: a row locked by another
/// session) fails `retry`-able, saying to run `order-guard migrate` as the
/// admin; what it committed stays, and `migrate` then finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starts_migration_keeps_its_bound_and_says_to_run_migrate() {
    let _one_at_a_time = SCHEMA_LOCK.lock().await;
    let Some(cs) = common::mssql_connection_string() else {
        return;
    };
    let (db, old) = version_2_database(&cs, 100).await;
    let mut blocker = common::mssql_raw_client(&db).await;
    // The first transaction must be able to rename the column: lock the
    // row only once it has (rename waits for the lock otherwise).
    let store =
        SqlServerStore::connect(&db, &common::mssql_settings(Duration::from_secs(1))).unwrap();
    let mut owner = common::mssql_raw_client(&db).await;
    batch(
        &mut owner,
        "EXEC sp_rename N'dbo.Positions.Quantity', N'QuantityV2', N'COLUMN'",
    )
    .await
    .unwrap();
    batch(
        &mut owner,
        "ALTER TABLE dbo.Positions ADD Units DECIMAL(38, 0) NULL",
    )
    .await
    .unwrap();
    batch(&mut blocker, "BEGIN TRANSACTION").await.unwrap();
    batch(
        &mut blocker,
        "UPDATE dbo.Positions SET UpdatedAt = UpdatedAt WHERE AccountId = N'zero'",
    )
    .await
    .unwrap();
    let started = Instant::now();
    match store.migrate().await {
        Err(StoreError::Transient(m)) => {
            assert!(m.contains("did not finish within 3 s"), "{m}");
            assert!(
                m.contains("run `order-guard migrate` as the database admin"),
                "{m}"
            );
            assert!(m.contains("resumes"), "{m}");
        }
        other => panic!("want the start's bound and the fix, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    batch(&mut blocker, "ROLLBACK TRANSACTION").await.unwrap();
    let admin =
        SqlServerStore::connect(&db, &common::mssql_settings(Duration::from_secs(20))).unwrap();
    admin.upgrade().await.unwrap();
    for (account, units) in stored_units(&mut owner).await {
        assert_eq!(units, Some(old[&account]), "{account}");
    }
}

/// Another session holding the migration lock past the wait: `migrate`
/// fails with `sp_getapplock`'s result and what to do, changing nothing
/// (it never goes on without the lock), and succeeds once it is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_migration_lock_makes_migrate_fail_clearly_and_change_nothing() {
    let _one_at_a_time = SCHEMA_LOCK.lock().await;
    let Some(cs) = common::mssql_connection_string() else {
        return;
    };
    let db = common::mssql_fresh_database(&cs).await;
    let mut holder = common::mssql_raw_client(&db).await;
    let held = count(
        &mut holder,
        "DECLARE @r INT; EXEC @r = sp_getapplock @Resource = N'order-guard:schema', \
         @LockMode = N'Exclusive', @LockOwner = N'Session', @LockTimeout = 0; SELECT @r",
    )
    .await
    .unwrap();
    assert!(held >= 0);
    let mut settings = common::mssql_settings(Duration::from_secs(20));
    settings.migrate_timeout = Duration::from_secs(2);
    let store = SqlServerStore::connect(&db, &settings).unwrap();
    let started = Instant::now();
    match store.upgrade().await {
        Err(StoreError::Transient(m)) => {
            assert!(m.contains("was not granted (result -1"), "{m}");
            // Three quarters of the 2 s bound at most, of what was left
            // after the login and the schema's state: under load, less.
            let waited: u64 = m
                .split("more than ")
                .nth(1)
                .and_then(|t| t.split(" ms").next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no wait in {m}"));
            assert!((1..=1500).contains(&waited), "{m}");
            assert!(m.contains("nothing was changed"), "{m}");
        }
        other => panic!("want the refused lock, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    let mut owner = common::mssql_raw_client(&db).await;
    assert_eq!(
        count(
            &mut owner,
            "SELECT COUNT(*) FROM sys.tables WHERE name = N'SchemaVersion'"
        )
        .await
        .unwrap(),
        0,
        "nothing was created without the lock"
    );
    batch(
        &mut holder,
        "EXEC sp_releaseapplock @Resource = N'order-guard:schema', @LockOwner = N'Session'",
    )
    .await
    .unwrap();
    let admin =
        SqlServerStore::connect(&db, &common::mssql_settings(Duration::from_secs(20))).unwrap();
    admin.upgrade().await.unwrap();
}
