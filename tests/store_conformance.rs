//! One conformance suite for `OrderStore`, written once and run against every
//! store: SQLite (real files) always; SQL Server when `ORDER_GUARD_TEST_MSSQL`
//! holds an ADO.NET connection string (see `sqlserver_store` below).

mod common;

use std::str::FromStr;
use std::sync::Arc;

use order_guard::order::{Order, OrderStatus};
use order_guard::store::{Admission, Execution, OrderStore, Rejection, RejectionKind};
use rust_decimal::Decimal;
use serde_json::json;

use common::unique_id;

fn order(id: &str, account: &str, side: &str, qty: &str) -> Order {
    Order::from_data(&json!({
        "orderId": id, "accountId": account, "side": side, "symbol": "MSFT",
        "quantity": qty, "limitPrice": "431.15", "currency": "USD"
    }))
    .unwrap()
}

fn dec(s: &str) -> Decimal {
    Decimal::from_str(s).unwrap()
}

/// The suite. Each check uses fresh ids, so a shared database is fine.
mod suite {
    use super::*;

    pub async fn accept_then_execute_moves_position_once(store: Arc<dyn OrderStore>) {
        let account = unique_id("acct");
        let o = order(&unique_id("ord"), &account, "buy", "25");
        assert_eq!(store.accept(&o, "e1").await.unwrap(), Admission::New);
        assert_eq!(store.execute(&o).await.unwrap(), Execution::Executed);
        assert_eq!(store.execute(&o).await.unwrap(), Execution::AlreadyDone);
        let row = store.order(&o.order_id).await.unwrap().unwrap();
        assert_eq!(row.status, OrderStatus::Executed);
        assert_eq!(row.quantity, dec("25"));
        assert!(row.executed_at.is_some());
        assert_eq!(
            store.position(&account, "MSFT").await.unwrap(),
            Some(dec("25"))
        );
        let sell = order(&unique_id("ord"), &account, "sell", "10.5");
        store.accept(&sell, "e2").await.unwrap();
        store.execute(&sell).await.unwrap();
        assert_eq!(
            store.position(&account, "MSFT").await.unwrap(),
            Some(dec("14.5"))
        );
    }

    pub async fn unique_violation_is_classified_not_an_error(store: Arc<dyn OrderStore>) {
        let account = unique_id("acct");
        let id = unique_id("ord");
        let o = order(&id, &account, "buy", "1");
        assert_eq!(store.accept(&o, "e1").await.unwrap(), Admission::New);
        // Same order again while Received: a crashed worker's row, resume it.
        assert_eq!(store.accept(&o, "e1").await.unwrap(), Admission::Resumed);
        assert_eq!(store.order(&id).await.unwrap().unwrap().attempts, 2);
        store.execute(&o).await.unwrap();
        // Same order after execution: a duplicate.
        assert_eq!(
            store.accept(&o, "e1").await.unwrap(),
            Admission::AlreadyDone(OrderStatus::Executed)
        );
        // Different content under the same id: a conflict, with the stored fingerprint.
        let other = order(&id, &account, "buy", "2");
        assert_eq!(
            store.accept(&other, "e9").await.unwrap(),
            Admission::Conflict {
                existing_fingerprint: o.fingerprint().to_string()
            }
        );
        assert_eq!(
            store.position(&account, "MSFT").await.unwrap(),
            Some(dec("1"))
        );
    }

    pub async fn concurrent_accept_and_execute_take_effect_once(store: Arc<dyn OrderStore>) {
        let account = unique_id("acct");
        let o = order(&unique_id("ord"), &account, "buy", "3");
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let (store, o) = (Arc::clone(&store), o.clone());
                tokio::spawn(async move {
                    let a = store.accept(&o, "e").await.unwrap();
                    let e = match a {
                        Admission::New | Admission::Resumed => {
                            Some(store.execute(&o).await.unwrap())
                        }
                        _ => None,
                    };
                    (a, e)
                })
            })
            .collect();
        let mut news = 0;
        let mut executed = 0;
        for t in tasks {
            let (a, e) = t.await.unwrap();
            news += usize::from(a == Admission::New);
            executed += usize::from(e == Some(Execution::Executed));
        }
        assert_eq!(news, 1, "exactly one insert wins the unique index");
        assert_eq!(executed, 1, "exactly one execution takes effect");
        assert_eq!(
            store.position(&account, "MSFT").await.unwrap(),
            Some(dec("3"))
        );
    }

    pub async fn rejections_are_stored_once_with_their_reason(store: Arc<dyn OrderStore>) {
        let id = unique_id("ord");
        let r = Rejection {
            kind: RejectionKind::Poison,
            order_id: Some(id.clone()),
            event_id: Some("e1".into()),
            reason: "invalid order: quantity must be greater than 0, got 0".into(),
            fingerprint: None,
            existing_fingerprint: None,
            raw_event: json!({"id":"e1","data":{"orderId": id, "quantity": 0}}).to_string(),
        };
        store.reject(&r).await.unwrap();
        store.reject(&r).await.unwrap();
        let conflict = Rejection {
            kind: RejectionKind::Conflict,
            fingerprint: Some("f2".into()),
            existing_fingerprint: Some("f1".into()),
            reason: "different order".into(),
            ..r.clone()
        };
        store.reject(&conflict).await.unwrap();
        let rows = store.rejections(Some(&id)).await.unwrap();
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!(rows[0].kind, "poison");
        assert_eq!(rows[0].reason, r.reason);
        assert_eq!(rows[0].raw_event, r.raw_event);
        assert_eq!(
            rows[0].deliveries, 2,
            "a redelivered poison event is counted, not duplicated"
        );
        assert_eq!(rows[1].kind, "conflict");
        assert_eq!(rows[1].existing_fingerprint.as_deref(), Some("f1"));
    }

    pub async fn migrate_is_idempotent(store: Arc<dyn OrderStore>) {
        store.migrate().await.unwrap();
        let (a, b) = tokio::join!(store.migrate(), store.migrate());
        a.unwrap();
        b.unwrap();
        let o = order(&unique_id("ord"), &unique_id("acct"), "buy", "1");
        assert_eq!(store.accept(&o, "e").await.unwrap(), Admission::New);
    }

    pub async fn ids_differing_only_in_case_are_different(store: Arc<dyn OrderStore>) {
        let id = unique_id("Ord");
        let account = unique_id("Acct");
        let upper = order(&id.to_uppercase(), &account.to_uppercase(), "buy", "2");
        let lower = order(&id.to_lowercase(), &account.to_lowercase(), "buy", "5");
        for o in [&upper, &lower] {
            assert_eq!(
                store.accept(o, "e").await.unwrap(),
                Admission::New,
                "{}",
                o.order_id
            );
            assert_eq!(store.execute(o).await.unwrap(), Execution::Executed);
        }
        assert_eq!(
            store
                .order(&upper.order_id)
                .await
                .unwrap()
                .unwrap()
                .quantity,
            dec("2")
        );
        assert_eq!(
            store
                .order(&lower.order_id)
                .await
                .unwrap()
                .unwrap()
                .quantity,
            dec("5")
        );
        assert_eq!(
            store.position(&upper.account_id, "MSFT").await.unwrap(),
            Some(dec("2")),
            "accounts differing in case never share a position"
        );
        assert_eq!(
            store.position(&lower.account_id, "MSFT").await.unwrap(),
            Some(dec("5"))
        );
    }

    pub async fn identity_is_made_once_with_the_schema(store: Arc<dyn OrderStore>) {
        let id = store.identity().await.unwrap();
        assert!(id.len() >= 32 && !id.contains('/'), "{id:?}");
        store.migrate().await.unwrap();
        assert_eq!(
            store.identity().await.unwrap(),
            id,
            "migrate keeps the identity"
        );
    }

    pub async fn exact_decimals_round_trip(store: Arc<dyn OrderStore>) {
        let account = unique_id("acct");
        let o = order(
            &unique_id("ord"),
            &account,
            "buy",
            "123456789012345678.0000000001",
        );
        store.accept(&o, "e").await.unwrap();
        store.execute(&o).await.unwrap();
        let row = store.order(&o.order_id).await.unwrap().unwrap();
        assert_eq!(row.quantity.to_string(), "123456789012345678.0000000001");
        assert_eq!(row.limit_price, Some(dec("431.15")));
        assert_eq!(
            store.position(&account, "MSFT").await.unwrap(),
            Some(dec("123456789012345678.0000000001"))
        );
    }
}

/// Generate one `#[tokio::test]` per suite check for a backend.
macro_rules! conformance {
    ($backend:ident, $make:expr) => {
        mod $backend {
            use super::*;
            conformance!(@tests $make;
                accept_then_execute_moves_position_once,
                unique_violation_is_classified_not_an_error,
                concurrent_accept_and_execute_take_effect_once,
                rejections_are_stored_once_with_their_reason,
                migrate_is_idempotent,
                ids_differing_only_in_case_are_different,
                identity_is_made_once_with_the_schema,
                exact_decimals_round_trip);
        }
    };
    (@tests $make:expr; $($check:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $check() {
                if let Some((store, _keep)) = $make.await {
                    suite::$check(store).await;
                }
            }
        )*
    };
}

async fn sqlite_store() -> Option<(Arc<dyn OrderStore>, tempfile::TempDir)> {
    let (store, dir) = common::sqlite_store().await;
    Some((store as Arc<dyn OrderStore>, dir))
}

conformance!(sqlite, sqlite_store());

/// The SQL Server store when `ORDER_GUARD_TEST_MSSQL` holds an ADO.NET
/// connection string (migrated first); otherwise `None`, after saying so: the
/// checks then do not run, they do not pass.
async fn sqlserver_store() -> Option<(Arc<dyn OrderStore>, ())> {
    let cs = common::mssql_connection_string()?;
    let store = common::mssql_store(&cs, std::time::Duration::from_secs(20)).await;
    Some((store as Arc<dyn OrderStore>, ()))
}

conformance!(sqlserver, sqlserver_store());
