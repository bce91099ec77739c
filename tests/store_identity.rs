//! A copied database is another database. Its stored id
//! came along with the copy (the SQLite backup API, `VACUUM INTO`, a copied
//! file; on SQL Server `AS COPY OF`, a restore as a new database, a BACPAC
//! import), but the completion markers one writes must never answer the
//! other's orders: staging made as a copy of production, sharing its Redis
//! and key prefix, would otherwise have production answer `duplicate` for
//! an order it never executed.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{eg_event, order_data, processor_without_cache, redis_guard, unique_id, RedisServer};
use order_guard::guard::GuardSettings;
use order_guard::processor::OutcomeKind;
use order_guard::store::{OrderStore, SqliteStore};

fn open(path: &std::path::Path) -> Arc<SqliteStore> {
    Arc::new(SqliteStore::open(path, Duration::from_secs(5)).unwrap())
}

#[tokio::test]
async fn an_order_executed_on_a_copy_is_executed_on_the_original_too() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let original_path = dir.path().join("production.db");
    let original = open(&original_path);
    original.migrate().await.unwrap();
    // Staging: a copy of production's file, its StoreIdentity row included.
    let copy_path = dir.path().join("staging.db");
    rusqlite::Connection::open(&original_path)
        .unwrap()
        .execute("VACUUM INTO ?1", [copy_path.to_str().unwrap()])
        .unwrap();
    let copy = open(&copy_path);
    copy.migrate().await.unwrap();
    let stored_id = |p: &std::path::Path| -> String {
        rusqlite::Connection::open(p)
            .unwrap()
            .query_row("SELECT Id FROM StoreIdentity", [], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(
        stored_id(&original_path),
        stored_id(&copy_path),
        "the copy carries the stored id (what this test is about)"
    );
    assert_ne!(
        original.identity().await.unwrap(),
        copy.identity().await.unwrap()
    );

    // Both handlers share one Redis and one key prefix.
    let settings = GuardSettings::default();
    let staging = processor_without_cache(redis_guard(&redis, settings.clone()), copy.clone());
    let production = processor_without_cache(redis_guard(&redis, settings), original.clone());
    let id = unique_id("copied");
    let event = eg_event(order_data(&id, "buy", "MSFT", "10", "acc-1"));

    let on_staging = staging.process_event(&event).await;
    assert_eq!(on_staging.outcome, OutcomeKind::Executed);
    assert!(
        redis.get(&format!("orden:{{{id}}}")).as_deref() == Some("COMPLETADA"),
        "staging marked the order completed in the shared Redis"
    );

    // Production sees staging's COMPLETADA, but its marker names another store.
    let on_production = production.process_event(&event).await;
    assert_eq!(
        on_production.outcome,
        OutcomeKind::Executed,
        "{on_production:?}"
    );
    let row = original
        .order(&id)
        .await
        .unwrap()
        .expect("a row in production");
    assert!(row.status.is_terminal());
    assert_eq!(
        original.position("acc-1", "MSFT").await.unwrap(),
        copy.position("acc-1", "MSFT").await.unwrap(),
        "each database executed the order once"
    );
    // And now production's own marker answers its redeliveries.
    assert_eq!(
        production.process_event(&event).await.outcome,
        OutcomeKind::Duplicate
    );
}

#[tokio::test]
async fn the_identity_is_stable_for_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders.db");
    let first = open(&path);
    first.migrate().await.unwrap();
    let id = first.identity().await.unwrap();
    assert!(
        !id.contains('/'),
        "a marker splits identity/fingerprint at '/': {id}"
    );
    // Opened again where it is (a restart): the same database, the same identity.
    assert_eq!(open(&path).identity().await.unwrap(), id);
}

/// On SQL Server: a database whose `StoreIdentity` row came from another
/// (what `AS COPY OF`, a restore as a new database or a BACPAC import
/// leave) reports another identity, because it has another name. Runs when
/// `ORDER_GUARD_TEST_MSSQL` names a server, and says so otherwise.
#[tokio::test]
async fn a_copied_sql_server_database_has_another_identity() {
    let Some(cs) = common::mssql_connection_string() else {
        return;
    };
    let original = common::mssql_store(&cs, Duration::from_secs(20)).await;
    let copy_cs = common::mssql_fresh_database(&cs).await;
    // The schema made on the copy's database by a first start.
    drop(common::mssql_store(&copy_cs, Duration::from_secs(20)).await);
    let original_id = original.identity().await.unwrap();
    let stored = original_id.split('.').next().unwrap().to_string();
    // The copy's row is the original's, as a copy of the database holds it.
    let mut client = common::mssql_raw_client(&copy_cs).await;
    client
        .execute("UPDATE dbo.StoreIdentity SET Id = @P1", &[&stored.as_str()])
        .await
        .unwrap();
    drop(client);
    // A store started on the copy (it reads the identity once, at start).
    let copy = common::mssql_store(&copy_cs, Duration::from_secs(20)).await;
    let copy_id = copy.identity().await.unwrap();
    assert!(copy_id.starts_with(&format!("{stored}.")), "{copy_id}");
    assert_ne!(copy_id, original_id);
    assert!(!copy_id.contains('/'), "{copy_id}");
}
