//! The announcement stream across a restore: a store brought back to a
//! backup taken mid-run numbers its rows again from the backup's point, and
//! a consumer following docs/outbox.md ("Order": deduplicate by `id`, order
//! by `(epoch, sequence)`) still never takes two executions for one place
//! in the stream, nor an earlier one for the latest. On SQLite the file is
//! restored while the handler is stopped (a restore needs the file
//! closed); on the T-SQL engine the data files are restored under a store
//! that keeps serving, as instances meet a database restored in place or
//! failed over: their connections break and they reconnect. And the
//! retention's purge keeps every epoch a kept row needs.

mod common;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use order_guard::order::Order;
use order_guard::outbox::{
    Destination, DispatchSettings, Dispatcher, Encoding, QueueDestination, QueueSettings,
};
use order_guard::position::Position;
use order_guard::store::{Execution, OrderStore, SqliteStore};
use serde_json::{json, Value};

use common::azurite::Azurite;
use common::unique_id;

const QUEUE: &str = "order-executed";

fn order(account: &str, side: &str, quantity: &str) -> Order {
    Order::from_data(&json!({
        "orderId": unique_id("ord"), "accountId": account, "side": side,
        "symbol": "MSFT", "quantity": quantity
    }))
    .unwrap()
}

fn dispatcher(store: &Arc<dyn OrderStore>, azurite: &Azurite) -> Dispatcher {
    let settings = QueueSettings {
        storage: order_guard::storage::parse_storage_of(
            &azurite.queue_connection_string(),
            order_guard::storage::Service::Queue,
        )
        .unwrap(),
        queue: QUEUE.into(),
        encoding: Encoding::Base64,
        message_ttl: None,
    };
    Dispatcher::new(
        Arc::clone(store),
        Destination::Queue(QueueDestination::new(settings)),
        DispatchSettings::default(),
    )
}

/// `f` until it succeeds: a store whose database just came back answers
/// transient failures until its pool has reconnected (bounded).
async fn until_ok<T, E: std::fmt::Debug, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match f().await {
            Ok(t) => return t,
            Err(e) if Instant::now() < deadline => {
                eprintln!("{what}: {e:?}; again");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{what}: {e:?}"),
        }
    }
}

/// Execute `orders` (each executed once) and send their announcements.
async fn execute_and_send(store: &Arc<dyn OrderStore>, azurite: &Azurite, orders: &[Order]) {
    for o in orders {
        let done = until_ok("execute", || store.execute(o, "e", "{}")).await;
        assert_eq!(done, Execution::Executed, "{}", o.order_id);
    }
    let d = dispatcher(store, azurite);
    let mut sent = 0;
    while sent < orders.len() {
        sent += until_ok("dispatch", || d.drain()).await;
    }
    assert_eq!(sent, orders.len());
}

/// One announcement as a consumer keeps it.
#[derive(Debug, Clone)]
struct Seen {
    order_id: String,
    epoch: Option<i64>,
    sequence: i64,
    position_after: Position,
}

/// The queue's events, one per id (copies of an id are one announcement).
async fn received(azurite: &Azurite) -> BTreeMap<String, Seen> {
    let mut out = BTreeMap::new();
    for text in azurite.drain_queue(QUEUE, true).await {
        let Ok(Value::Array(events)) = serde_json::from_str::<Value>(&text) else {
            panic!("a message is a JSON array of events: {text}");
        };
        for e in events {
            let d = &e["data"];
            out.insert(
                e["id"].as_str().unwrap().to_string(),
                Seen {
                    order_id: d["orderId"].as_str().unwrap().to_string(),
                    epoch: d["epoch"].as_i64(),
                    sequence: d["sequence"].as_i64().unwrap(),
                    position_after: d["positionAfter"].as_str().unwrap().parse().unwrap(),
                },
            );
        }
    }
    out
}

/// The consumer's rule, checked on what each phase announced: no two
/// announcements share `(epoch, sequence)`; every event carries an epoch; what
/// the restored store numbered comes, by that pair, after everything
/// announced before the restore; and the latest announcement by that pair
/// says the position the store holds now.
fn check_the_stream(
    before: &BTreeMap<String, Seen>,
    after: &BTreeMap<String, Seen>,
    position_now: Position,
) {
    let all: Vec<&Seen> = before.values().chain(after.values()).collect();
    let mut places: BTreeMap<(Option<i64>, i64), &str> = BTreeMap::new();
    for s in &all {
        if let Some(other) = places.insert((s.epoch, s.sequence), &s.order_id) {
            panic!(
                "epoch {:?} sequence {} announces two executions: {other} and {}",
                s.epoch, s.sequence, s.order_id
            );
        }
    }
    for s in &all {
        assert!(
            s.epoch.is_some(),
            "order {} announced with no epoch",
            s.order_id
        );
    }
    let newest_before = before
        .values()
        .map(|s| (s.epoch, s.sequence))
        .max()
        .unwrap();
    for s in after.values() {
        assert!(
            (s.epoch, s.sequence) > newest_before,
            "order {} numbered after the restore at {:?}, not after {newest_before:?}",
            s.order_id,
            (s.epoch, s.sequence)
        );
    }
    let latest = all.iter().max_by_key(|s| (s.epoch, s.sequence)).unwrap();
    assert_eq!(
        latest.position_after, position_now,
        "the latest announcement (order {}) is not the store's position",
        latest.order_id
    );
}

/// Three buys, a backup, four buys more (announced, then lost to the
/// restore), two sells on the restored store. The sells number from the
/// backup's point: without epochs their sequences are the lost buys'.
struct Phases {
    account: String,
    first: Vec<Order>,
    lost: Vec<Order>,
    after: Vec<Order>,
}

impl Phases {
    fn new() -> Phases {
        let account = unique_id("acct");
        Phases {
            first: ["1", "2", "3"].map(|q| order(&account, "buy", q)).to_vec(),
            lost: ["10", "20", "30", "40"]
                .map(|q| order(&account, "buy", q))
                .to_vec(),
            after: ["0.5", "0.25"].map(|q| order(&account, "sell", q)).to_vec(),
            account,
        }
    }

    /// The position once the restored store executed `after`: the first
    /// three buys less the two sells (the lost buys are not in it).
    fn position_now(&self) -> Position {
        "5.25".parse().unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_file_restored_from_a_mid_run_backup_numbers_under_a_later_epoch() {
    let azurite = Azurite::start_queue();
    azurite.create_queue(QUEUE).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders.db");
    let backup = dir.path().join("backup.db");
    let phases = Phases::new();
    let open = || async {
        let store = SqliteStore::open(&path, Duration::from_secs(5)).unwrap();
        store.migrate().await.unwrap();
        Arc::new(store) as Arc<dyn OrderStore>
    };

    let store = open().await;
    execute_and_send(&store, &azurite, &phases.first).await;
    // The backup, taken while the handler runs (SQLite's online backup).
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute("VACUUM INTO ?1", [backup.to_str().unwrap()])
        .unwrap();
    execute_and_send(&store, &azurite, &phases.lost).await;
    let before = received(&azurite).await;
    assert_eq!(before.len(), 7);
    // The handler stopped: its writer closes the file, and SQLite, closing
    // the last connection, checkpoints the log into it and deletes it.
    drop(store);
    let wal = format!("{}-wal", path.display());
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::path::Path::new(&wal).exists() {
        assert!(Instant::now() < deadline, "the store never closed {wal}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // The restore: the file replaced by the backup.
    std::fs::copy(&backup, &path).unwrap();
    let store = open().await;
    execute_and_send(&store, &azurite, &phases.after).await;
    let after = received(&azurite).await;
    assert_eq!(after.len(), 2);

    let now = store.position(&phases.account, "MSFT").await.unwrap();
    assert_eq!(now, Some(phases.position_now()));
    check_the_stream(&before, &after, phases.position_now());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sql_server_database_restored_under_a_serving_store_numbers_under_a_later_epoch() {
    if common::mssql_connection_string().is_none() {
        return;
    }
    let azurite = Azurite::start_queue();
    azurite.create_queue(QUEUE).await;
    let engine = common::OwnEngine::new();
    let database = "og_restore";
    let admin = engine.command(&["start", "--database", database]);
    let store: Arc<dyn OrderStore> = common::mssql_store(&admin, Duration::from_secs(10)).await;
    let phases = Phases::new();

    execute_and_send(&store, &azurite, &phases.first).await;
    // The backup: the engine's data files, copied while it is stopped.
    let backup = tempfile::Builder::new()
        .prefix("og-backup-")
        .tempdir_in("/tmp")
        .unwrap();
    engine.command(&["stop"]);
    copy_tree(&engine.state(), backup.path());
    engine.command(&["start", "--database", database]);
    execute_and_send(&store, &azurite, &phases.lost).await;
    let before = received(&azurite).await;
    assert_eq!(before.len(), 7);

    // The restore in place: the same store keeps serving, its
    // connections broken, as a database restored or failed over meets
    // the instances that use it.
    engine.command(&["stop"]);
    std::fs::remove_dir_all(engine.state()).unwrap();
    copy_tree(backup.path(), &engine.state());
    engine.command(&["start", "--database", database]);
    execute_and_send(&store, &azurite, &phases.after).await;
    let after = received(&azurite).await;
    assert_eq!(after.len(), 2);

    let now = until_ok("position", || store.position(&phases.account, "MSFT")).await;
    assert_eq!(now, Some(phases.position_now()));
    check_the_stream(&before, &after, phases.position_now());
}

/// `cp -a FROM/. TO`: the engine's files with their owner and modes.
fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", from.display()))
        .arg(to)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "cp -a {} {}",
        from.display(),
        to.display()
    );
}

/// The epochs on SQL Server, oldest first (as the owner reads them).
async fn epochs_on(cs: &str) -> Vec<i64> {
    let mut client = common::mssql_raw_client(cs).await;
    let rows = client
        .simple_query("SELECT Epoch FROM dbo.OutboxEpoch ORDER BY Epoch")
        .await
        .unwrap()
        .into_first_result()
        .await
        .unwrap();
    rows.iter().map(|r| r.get::<i64, _>(0).unwrap()).collect()
}

/// The retention's purge on SQL Server deletes the epochs below the one
/// the lowest kept row has, raised over an hour ago, and no other: the
/// kept rows keep their epochs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_on_sql_server_deletes_only_the_epochs_no_kept_row_needs() {
    let Some(cs) = common::mssql_connection_string() else {
        return;
    };
    let db = common::mssql_fresh_database(&cs).await;
    let store = common::mssql_store(&db, Duration::from_secs(20)).await;
    let account = unique_id("acct");
    for q in ["1", "2", "3"] {
        assert_eq!(
            store
                .execute(&order(&account, "buy", q), "e", "{}")
                .await
                .unwrap(),
            Execution::Executed
        );
    }
    let rows = store
        .announcements(&order_guard::store::Listing::Undispatched, 10)
        .await
        .unwrap();
    assert_eq!(rows.len(), 3);
    assert!(rows.iter().all(|r| r.epoch.is_some()), "{rows:#?}");
    // The two oldest rows sent ten days ago, and an epoch from 1970 below
    // every one raised: the purge's to delete.
    let mut owner = common::mssql_raw_client(&db).await;
    owner
        .simple_query(
            "UPDATE dbo.Outbox SET DispatchedAt = DATEADD(DAY, -10, SYSUTCDATETIME()) \
             WHERE Seq IN (SELECT TOP 2 Seq FROM dbo.Outbox ORDER BY Seq); \
             INSERT INTO dbo.OutboxEpoch (Epoch, FirstSeq) VALUES (1000, 1);",
        )
        .await
        .unwrap()
        .into_results()
        .await
        .unwrap();
    let before = epochs_on(&db).await;
    assert_eq!(before[0], 1000);
    let purged = store
        .purge_announced(
            Duration::from_secs(86_400),
            500,
            order_guard::store::Expired::Sent,
        )
        .await
        .unwrap();
    assert_eq!(purged, 2);
    assert_eq!(
        epochs_on(&db).await,
        before[1..],
        "only the 1970 epoch goes"
    );
    let kept = store
        .announcements(&order_guard::store::Listing::Undispatched, 10)
        .await
        .unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].epoch, rows[2].epoch, "the kept row keeps its epoch");
}
