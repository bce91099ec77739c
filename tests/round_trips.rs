//! What each kind of delivery costs the SQL Server store in round
//! trips, counted on the wire by a TCP proxy between the store and the
//! server (`common::proxy`: protocol-agnostic, TLS included). A first
//! delivery is one round trip, and so are a duplicate that reaches the
//! store, a conflict (stored by the same call) and a poison event. Issue
//! 31: the store's identity comes with the schema's state at a start, in
//! no round trip of its own.
//!
//! Runs when `ORDER_GUARD_TEST_MSSQL` names a server (`scripts/test.sh`
//! starts the T-SQL engine and sets it); says so and runs nothing otherwise.

mod common;

use std::time::Duration;

use common::proxy::{server_of, via, TurnProxy};
use common::unique_id;
use order_guard::order::Order;
use order_guard::store::sqlserver::sql;
use order_guard::store::{
    bound_identity, Execution, OrderStore, Rejection, RejectionKind, SqlServerStore,
};
use serde_json::json;

fn order(id: &str, account: &str, quantity: &str) -> Order {
    Order::from_data(&json!({
        "orderId": id, "accountId": account, "side": "buy", "symbol": "MSFT",
        "quantity": quantity
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_delivery_costs_the_sql_server_store_one_round_trip() {
    let Some(cs) = common::mssql_connection_string() else {
        return;
    };
    let server = server_of(&cs).expect("a Server=host,port in ORDER_GUARD_TEST_MSSQL");
    let proxy = TurnProxy::start(server, Duration::ZERO).await;
    let through = via(&cs, proxy.port);
    // Migrated and connected (login, session settings, the procedure
    // warmed): the turns from here on are the calls'.
    let store = common::mssql_store(&through, Duration::from_secs(20)).await;
    store.identity().await.unwrap();
    common::mssql_pool_at_rest(&store).await;
    let cost = |before: u64| proxy.turns() - before;

    let account = unique_id("acct");
    let id = unique_id("ord");
    let o = order(&id, &account, "3");
    let before = proxy.turns();
    assert_eq!(
        store.execute(&o, "e1", "{}").await.unwrap(),
        Execution::Executed
    );
    assert_eq!(cost(before), 1, "a first delivery");

    let before = proxy.turns();
    assert_eq!(
        store.execute(&o, "e1", "{}").await.unwrap(),
        Execution::AlreadyDone
    );
    assert_eq!(cost(before), 1, "a duplicate that reaches the store");

    let before = proxy.turns();
    let other = order(&id, &account, "4");
    // A rejection is keyed by its raw event: one of this order's own.
    let raw = json!({"id": "e2", "data": {"orderId": id, "quantity": "4"}}).to_string();
    assert!(matches!(
        store.execute(&other, "e2", &raw).await.unwrap(),
        Execution::Conflict { .. }
    ));
    assert_eq!(cost(before), 1, "a conflict, stored by the same call");
    assert_eq!(store.rejections(Some(&id)).await.unwrap().len(), 1);

    let poison = Rejection {
        kind: RejectionKind::Poison,
        order_id: Some(unique_id("bad")),
        event_id: Some("e3".into()),
        reason: "invalid order: quantity is required".into(),
        fingerprint: None,
        existing_fingerprint: None,
        raw_event: json!({"id": unique_id("e3")}).to_string(),
    };
    for delivery in ["a poison event", "its redelivery"] {
        let before = proxy.turns();
        store.reject(&poison).await.unwrap();
        assert_eq!(cost(before), 1, "{delivery}");
    }

    // A first trade of a new account (its position row made in the call).
    let before = proxy.turns();
    let fresh = order(&unique_id("ord"), &unique_id("acct"), "1");
    assert_eq!(
        store.execute(&fresh, "e4", "{}").await.unwrap(),
        Execution::Executed
    );
    assert_eq!(cost(before), 1, "a first trade");
}

/// A start (`migrate` on a current schema) reads the store's identity in
/// the same round trip as the schema's state, so the first completed order
/// of a new instance does not ask for it; and it is the identity a read of
/// its own gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_reads_the_store_identity_with_the_schema_state() {
    let Some(cs) = common::mssql_connection_string() else {
        return;
    };
    let server = server_of(&cs).expect("a Server=host,port in ORDER_GUARD_TEST_MSSQL");
    let proxy = TurnProxy::start(server, Duration::ZERO).await;
    let app = via(&common::mssql_app_connection_string(&cs).await, proxy.port);
    let store =
        SqlServerStore::connect(&app, &common::mssql_settings(Duration::from_secs(20))).unwrap();
    store.migrate().await.unwrap();
    common::mssql_pool_at_rest(&store).await;
    let before = proxy.turns();
    let identity = store.identity().await.unwrap();
    assert_eq!(
        proxy.turns() - before,
        0,
        "the identity came with the schema's state"
    );

    let mut owner = common::mssql_raw_client(&cs).await;
    let row = owner
        .simple_query(sql::SELECT_IDENTITY)
        .await
        .unwrap()
        .into_row()
        .await
        .unwrap()
        .expect("a StoreIdentity row");
    let text = |i: usize| row.get::<&str, _>(i).unwrap_or_default().to_string();
    assert_eq!(identity, bound_identity(&text(0), &[&text(1), &text(2)]));
}
