//! One conformance suite for `OrderStore`, written once and run against every
//! store: SQLite (real files) always; SQL Server when `ORDER_GUARD_TEST_MSSQL`
//! holds an ADO.NET connection string (see `sqlserver_store` below).

mod common;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use order_guard::order::{Order, OrderStatus};
use order_guard::position::Position;
use order_guard::store::{
    message_id, Announcement, Claim, Deferral, Execution, Expired, Listing, OrderStore, Rejection,
    RejectionKind, Resend, ORDER_EXECUTED,
};
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

fn pos(s: &str) -> Position {
    s.parse().unwrap()
}

/// The suite. Each check uses fresh ids, so a shared database is fine.
mod suite {
    use super::*;

    pub async fn execute_moves_position_once(store: Arc<dyn OrderStore>) {
        let account = unique_id("acct");
        let o = order(&unique_id("ord"), &account, "buy", "25");
        assert_eq!(
            store.execute(&o, "e", "{}").await.unwrap(),
            Execution::Executed
        );
        assert_eq!(
            store.execute(&o, "e", "{}").await.unwrap(),
            Execution::AlreadyDone
        );
        let row = store.order(&o.order_id).await.unwrap().unwrap();
        assert_eq!(row.status, OrderStatus::Executed);
        assert_eq!(row.quantity, dec("25"));
        assert!(row.executed_at.is_some());
        assert_eq!(
            store.position(&account, "MSFT").await.unwrap(),
            Some(pos("25"))
        );
        let sell = order(&unique_id("ord"), &account, "sell", "10.5");
        store.execute(&sell, "e", "{}").await.unwrap();
        assert_eq!(
            store.position(&account, "MSFT").await.unwrap(),
            Some(pos("14.5"))
        );
    }

    /// A missing row is never taken for a done order (answering `duplicate` would mark it `COMPLETADA` and cache it with no
    /// effect, after a file replaced or restored under a running process):
    /// the one call inserts it and executes it.
    pub async fn an_order_with_no_row_is_executed_never_a_duplicate(store: Arc<dyn OrderStore>) {
        let account = unique_id("acct");
        let o = order(&unique_id("ord"), &account, "buy", "3");
        assert_eq!(
            store.execute(&o, "e", "{}").await.unwrap(),
            Execution::Executed
        );
        assert_eq!(
            store.position(&account, "MSFT").await.unwrap(),
            Some(pos("3"))
        );
    }

    pub async fn duplicates_and_conflicts_are_answered_not_errors(store: Arc<dyn OrderStore>) {
        let account = unique_id("acct");
        let id = unique_id("ord");
        let o = order(&id, &account, "buy", "1");
        assert_eq!(
            store.execute(&o, "e1", "{}").await.unwrap(),
            Execution::Executed
        );
        // Same order after execution: a duplicate, nothing written.
        assert_eq!(
            store.execute(&o, "e1", "{}").await.unwrap(),
            Execution::AlreadyDone
        );
        assert_eq!(store.order(&id).await.unwrap().unwrap().attempts, 1);
        // Different content under the same id: a conflict, with the stored
        // fingerprint, and the event stored once (a redelivery counted).
        let other = order(&id, &account, "buy", "2");
        let raw = json!({"id": "e9", "data": {"orderId": id, "quantity": "2"}}).to_string();
        for _ in 0..2 {
            assert_eq!(
                store.execute(&other, "e9", &raw).await.unwrap(),
                Execution::Conflict {
                    existing_fingerprint: o.fingerprint().to_string()
                }
            );
        }
        let stored = store.rejections(Some(&id)).await.unwrap();
        assert_eq!(stored.len(), 1, "{stored:?}");
        assert_eq!(stored[0].kind, "conflict");
        assert_eq!(
            stored[0].reason,
            order_guard::store::conflict_reason(&other, o.fingerprint())
        );
        assert_eq!(stored[0].fingerprint.as_deref(), Some(other.fingerprint()));
        assert_eq!(
            stored[0].existing_fingerprint.as_deref(),
            Some(o.fingerprint())
        );
        assert_eq!(stored[0].raw_event, raw);
        assert_eq!(stored[0].deliveries, 2);
        // The same conflict stored the other way (decided from a Redis
        // marker, through `reject`) is the same row: one key for both paths.
        store
            .reject(&Rejection::conflict(&other, "e9", &raw, o.fingerprint()))
            .await
            .unwrap();
        let stored = store.rejections(Some(&id)).await.unwrap();
        assert_eq!((stored.len(), stored[0].deliveries), (1, 3), "{stored:?}");
        assert_eq!(
            store.position(&account, "MSFT").await.unwrap(),
            Some(pos("1"))
        );
    }

    pub async fn concurrent_executions_take_effect_once(store: Arc<dyn OrderStore>) {
        let account = unique_id("acct");
        let o = order(&unique_id("ord"), &account, "buy", "3");
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let (store, o) = (Arc::clone(&store), o.clone());
                tokio::spawn(async move { store.execute(&o, "e", "{}").await.unwrap() })
            })
            .collect();
        let mut executed = 0;
        for t in tasks {
            match t.await.unwrap() {
                Execution::Executed => executed += 1,
                Execution::AlreadyDone => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(executed, 1, "exactly one execution takes effect");
        assert_eq!(
            store.position(&account, "MSFT").await.unwrap(),
            Some(pos("3"))
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
        assert_eq!(
            store.execute(&o, "e", "{}").await.unwrap(),
            Execution::Executed
        );
    }

    pub async fn ids_differing_only_in_case_are_different(store: Arc<dyn OrderStore>) {
        let id = unique_id("Ord");
        let account = unique_id("Acct");
        let upper = order(&id.to_uppercase(), &account.to_uppercase(), "buy", "2");
        let lower = order(&id.to_lowercase(), &account.to_lowercase(), "buy", "5");
        for o in [&upper, &lower] {
            assert_eq!(
                store.execute(o, "e", "{}").await.unwrap(),
                Execution::Executed,
                "{}",
                o.order_id
            );
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
            Some(pos("2")),
            "accounts differing in case never share a position"
        );
        assert_eq!(
            store.position(&lower.account_id, "MSFT").await.unwrap(),
            Some(pos("5"))
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
        store.execute(&o, "e", "{}").await.unwrap();
        let row = store.order(&o.order_id).await.unwrap().unwrap();
        assert_eq!(row.quantity.to_string(), "123456789012345678.0000000001");
        assert_eq!(row.limit_price, Some(dec("431.15")));
        assert_eq!(
            store.position(&account, "MSFT").await.unwrap(),
            Some(pos("123456789012345678.0000000001"))
        );
    }

    /// Positions are exact to DECIMAL(38,10), beyond the 28-29 digits of a
    /// 96-bit decimal.
    pub async fn positions_stay_exact_beyond_28_digits(store: Arc<dyn OrderStore>) {
        let account = unique_id("acct");
        for _ in 0..9 {
            let o = order(
                &unique_id("ord"),
                &account,
                "buy",
                "999999999999999999.0000000001",
            );
            assert_eq!(
                store.execute(&o, "e", "{}").await.unwrap(),
                Execution::Executed
            );
        }
        assert_eq!(
            store.position(&account, "MSFT").await.unwrap(),
            Some(pos("8999999999999999991.0000000009"))
        );
        let account = unique_id("acct");
        let quantities = std::iter::once("0.0000000002").chain(["999999999999999999"; 8]);
        for q in quantities {
            let o = order(&unique_id("ord"), &account, "buy", q);
            store.execute(&o, "e", "{}").await.unwrap();
        }
        assert_eq!(
            store.position(&account, "MSFT").await.unwrap(),
            Some(pos("7999999999999999992.0000000002")),
            "0.0000000002 must not vanish next to eight 999999999999999999"
        );
    }

    /// The announcement of one order, dispatched or not (at most one).
    pub async fn announcement_of(store: &dyn OrderStore, order_id: &str) -> Option<Announcement> {
        let rows = store
            .announcements(&Listing::Order(order_id.to_string()), 10)
            .await
            .unwrap();
        assert!(rows.len() <= 1, "one announcement per order: {rows:?}");
        rows.into_iter().next()
    }

    /// The call that executes an order writes its announcement,
    /// in the same transaction, with the facts a consumer acts on; a
    /// duplicate, a conflict and a redelivery write none.
    pub async fn an_execution_is_announced_once_and_nothing_else_is(store: Arc<dyn OrderStore>) {
        let account = unique_id("acct");
        let o = order(&unique_id("ord"), &account, "buy", "25.5");
        assert_eq!(
            store.execute(&o, "e", "{}").await.unwrap(),
            Execution::Executed
        );
        let a = announcement_of(store.as_ref(), &o.order_id)
            .await
            .expect("an executed order is announced");
        let row = store.order(&o.order_id).await.unwrap().unwrap();
        assert_eq!(a.message_id, message_id(&o.order_id));
        assert_eq!(a.kind, ORDER_EXECUTED);
        assert_eq!(
            (a.account_id.as_str(), a.side.as_str(), a.symbol.as_str()),
            (account.as_str(), "buy", "MSFT")
        );
        assert_eq!(a.quantity, dec("25.5"));
        assert_eq!(a.position_after, pos("25.5"));
        assert_eq!(Some(a.executed_at.clone()), row.executed_at, "one instant");
        assert_eq!(a.fingerprint, o.fingerprint());
        assert_eq!(
            (a.attempts, a.parked, a.dispatched_at.clone()),
            (0, false, None)
        );
        // The position after each order, in order.
        let sell = order(&unique_id("ord"), &account, "sell", "30");
        store.execute(&sell, "e", "{}").await.unwrap();
        let b = announcement_of(store.as_ref(), &sell.order_id)
            .await
            .unwrap();
        assert_eq!(b.position_after, pos("-4.5"));
        assert!(b.seq > a.seq, "announced in execution order");
        // A duplicate writes nothing.
        assert_eq!(
            store.execute(&o, "e", "{}").await.unwrap(),
            Execution::AlreadyDone
        );
        assert_eq!(announcement_of(store.as_ref(), &o.order_id).await, Some(a));
        // A conflict (another order under this id) writes none either.
        let other = order(&o.order_id, &account, "sell", "1");
        assert!(matches!(
            store.execute(&other, "e2", "{}").await.unwrap(),
            Execution::Conflict { .. }
        ));
        assert_eq!(
            store
                .announcements(&Listing::Order(o.order_id.clone()), 10)
                .await
                .unwrap()
                .len(),
            1
        );
    }

    /// The dispatcher's side: a claim leases each due row to one claimer;
    /// a mark ends it; a deferral counts, keeps why and makes it due again
    /// later (or parks it for an operator, whose retry makes it due now);
    /// the retention deletes only what was dispatched before it.
    pub async fn announcements_are_claimed_once_marked_deferred_and_purged(
        store: Arc<dyn OrderStore>,
    ) {
        let account = unique_id("acct");
        let orders: Vec<_> = (0..3)
            .map(|_| order(&unique_id("ord"), &account, "buy", "1"))
            .collect();
        for o in &orders {
            store.execute(o, "e", "{}").await.unwrap();
        }
        let ids: Vec<String> = orders.iter().map(|o| message_id(&o.order_id)).collect();
        // The rows of these orders a claim gave (the mark takes those), and
        // their ids.
        let rows_of = |claim: &Claim| -> Vec<Announcement> {
            claim
                .rows
                .iter()
                .filter(|r| ids.contains(&r.message_id))
                .cloned()
                .collect()
        };
        let mine = |claim: &Claim| -> Vec<String> {
            rows_of(claim).into_iter().map(|r| r.message_id).collect()
        };
        let lease = Duration::from_secs(60);
        // Other checks' rows may share this database: claim them all.
        let first = store.claim_announcements(10_000, lease).await.unwrap();
        assert_eq!(mine(&first), ids, "due, oldest first");
        let second = store.claim_announcements(10_000, lease).await.unwrap();
        assert!(mine(&second).is_empty(), "leased: {second:?}");
        assert_ne!(first.token, second.token);

        // Sent: marked, once.
        let claimed = rows_of(&first);
        assert_eq!(store.mark_announced(&claimed[..1]).await.unwrap(), 1);
        assert_eq!(store.mark_announced(&claimed[..1]).await.unwrap(), 0);
        let sent = announcement_of(store.as_ref(), &orders[0].order_id)
            .await
            .unwrap();
        assert!(sent.dispatched_at.is_some());

        // Failed: counted, due again at once here (retry_in 0).
        let failed = Deferral {
            message_id: ids[1].clone(),
            error: "503 from the queue".into(),
            retry_in: Duration::ZERO,
            park: false,
        };
        // Another claim's token defers nothing.
        store
            .defer_announcement(Some(&second.token), &failed)
            .await
            .unwrap();
        let row = announcement_of(store.as_ref(), &orders[1].order_id)
            .await
            .unwrap();
        assert_eq!(row.attempts, 0, "deferred under another claim's token");
        store
            .defer_announcement(Some(&first.token), &failed)
            .await
            .unwrap();
        let row = announcement_of(store.as_ref(), &orders[1].order_id)
            .await
            .unwrap();
        assert_eq!(
            (row.attempts, row.last_error.as_deref()),
            (1, Some("503 from the queue"))
        );
        // Parked: left for an operator.
        let parked = Deferral {
            message_id: ids[2].clone(),
            error: "413: too large".into(),
            retry_in: Duration::ZERO,
            park: true,
        };
        store
            .defer_announcement(Some(&first.token), &parked)
            .await
            .unwrap();
        let third = store.claim_announcements(10_000, lease).await.unwrap();
        assert_eq!(
            mine(&third),
            vec![ids[1].clone()],
            "the deferred row, not the parked one"
        );
        let undispatched: Vec<String> = store
            .announcements(&Listing::Undispatched, 10_000)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.message_id)
            .filter(|id| ids.contains(id))
            .collect();
        assert_eq!(undispatched, ids[1..].to_vec());
        let counts = store.outbox_counts().await.unwrap();
        assert!(counts.parked >= 1 && counts.undispatched >= 2 && counts.dispatched >= 1);
        // The operator's retry: due now, unparked.
        assert_eq!(store.retry_announcements(Some(&ids[2])).await.unwrap(), 1);
        let fourth = store.claim_announcements(10_000, lease).await.unwrap();
        assert_eq!(mine(&fourth), vec![ids[2].clone()]);
        let rest = [rows_of(&third), rows_of(&fourth)].concat();
        assert_eq!(
            rest.iter().map(|r| &r.message_id).collect::<Vec<_>>(),
            ids[1..].iter().collect::<Vec<_>>()
        );
        assert_eq!(store.mark_announced(&rest).await.unwrap(), 2);

        // The retention: nothing dispatched a day ago here; everything
        // dispatched before now goes, and nothing undispatched ever.
        let day = Duration::from_secs(86_400);
        store
            .purge_announced(day, 10_000, Expired::Sent)
            .await
            .unwrap();
        assert!(announcement_of(store.as_ref(), &orders[0].order_id)
            .await
            .is_some());
        let late = order(&unique_id("ord"), &account, "buy", "1");
        store.execute(&late, "e", "{}").await.unwrap();
        // DispatchedAt is stored to the millisecond: be past it.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let mut purged = 0;
        loop {
            let n = store
                .purge_announced(Duration::ZERO, 2, Expired::Sent)
                .await
                .unwrap();
            assert!(n <= 2, "a purge deletes at most its limit");
            purged += n;
            if n == 0 {
                break;
            }
        }
        assert!(purged >= 3, "{purged}");
        for o in &orders {
            assert_eq!(announcement_of(store.as_ref(), &o.order_id).await, None);
        }
        assert!(announcement_of(store.as_ref(), &late.order_id)
            .await
            .is_some());
    }

    /// An account's announcements carry a `sequence` (the row's `Seq`)
    /// that consumers order its executions by: once every sent row is
    /// purged, the next execution's is still above every one sent before.
    /// And the purge leaves a watermark, the newest execution it deleted,
    /// which `outbox backfill` never reaches back to.
    pub async fn the_sequence_only_grows_past_a_purge(store: Arc<dyn OrderStore>) {
        let account = unique_id("acct");
        let lease = Duration::from_secs(60);
        let mut sent = Vec::new();
        for _ in 0..3 {
            let o = order(&unique_id("ord"), &account, "buy", "1");
            store.execute(&o, "e", "{}").await.unwrap();
            sent.push(announcement_of(store.as_ref(), &o.order_id).await.unwrap());
        }
        // Sent: these rows marked (a database other checks share may hold
        // rows of theirs, which this claim leases and leaves alone).
        let ids: Vec<&str> = sent.iter().map(|r| r.message_id.as_str()).collect();
        let claim = store.claim_announcements(10_000, lease).await.unwrap();
        let mine: Vec<Announcement> = claim
            .rows
            .into_iter()
            .filter(|r| ids.contains(&r.message_id.as_str()))
            .collect();
        assert_eq!(mine.len(), 3, "due, claimed once");
        assert_eq!(store.mark_announced(&mine).await.unwrap(), 3);
        let highest = sent.iter().map(|r| r.seq).max().unwrap();
        // DispatchedAt is stored to the millisecond: be past it.
        tokio::time::sleep(Duration::from_millis(5)).await;
        while store
            .purge_announced(Duration::ZERO, 500, Expired::Sent)
            .await
            .unwrap()
            > 0
        {}
        for row in &sent[..2] {
            assert_eq!(
                announcement_of(store.as_ref(), &row.order_id).await,
                None,
                "purged"
            );
        }
        // The store remembers what it purged: its watermark is at or after
        // the newest execution whose row went (other checks sharing the
        // database may have had newer ones purged), and a purge that
        // deletes nothing leaves it as it is.
        let utc = |t: &str| {
            time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
                .unwrap_or_else(|e| panic!("{t}: {e}"))
        };
        let through = store.outbox_counts().await.unwrap().purged_through;
        let through = through.expect("a purge that deleted rows sets the watermark");
        assert!(
            utc(&through) >= utc(&sent[1].executed_at),
            "purged through {through}, but {} was deleted",
            sent[1].executed_at
        );
        assert_eq!(
            store
                .purge_announced(Duration::from_secs(3600), 500, Expired::Sent)
                .await
                .unwrap(),
            0
        );
        assert_eq!(
            store.outbox_counts().await.unwrap().purged_through,
            Some(through),
            "never lowered, never moved by a purge that deleted nothing"
        );
        let next = order(&unique_id("ord"), &account, "buy", "1");
        store.execute(&next, "e", "{}").await.unwrap();
        let row = announcement_of(store.as_ref(), &next.order_id)
            .await
            .unwrap();
        assert!(
            row.seq > highest,
            "sequence {} after a purge; {highest} was sent before",
            row.seq
        );
    }

    /// `outbox resend`: a dispatched row made due again as it was (same id,
    /// same `Seq`), by its id or by when it was dispatched; an undispatched
    /// or unknown one is not touched.
    pub async fn a_resent_announcement_is_due_again_as_it_was(store: Arc<dyn OrderStore>) {
        let account = unique_id("acct");
        let orders: Vec<Order> = (0..2)
            .map(|_| order(&unique_id("ord"), &account, "buy", "1"))
            .collect();
        for o in &orders {
            store.execute(o, "e", "{}").await.unwrap();
        }
        let ids: Vec<String> = orders.iter().map(|o| message_id(&o.order_id)).collect();
        let lease = Duration::from_secs(60);
        let claim = store.claim_announcements(10_000, lease).await.unwrap();
        let mine: Vec<Announcement> = claim
            .rows
            .into_iter()
            .filter(|r| ids.contains(&r.message_id))
            .collect();
        assert_eq!(mine.len(), 2);
        // Not dispatched yet: nothing to resend.
        let first = Resend::Message(ids[0].clone());
        assert_eq!(store.resend_announcements(&first).await.unwrap(), 0);
        assert_eq!(store.mark_announced(&mine).await.unwrap(), 2);
        let unknown = Resend::Message("no-such-message".into());
        assert_eq!(store.resend_announcements(&unknown).await.unwrap(), 0);
        assert_eq!(store.resend_announcements(&first).await.unwrap(), 1);
        let again = announcement_of(store.as_ref(), &orders[0].order_id)
            .await
            .unwrap();
        assert_eq!(again.dispatched_at, None);
        assert_eq!(again.seq, mine[0].seq, "its place kept");
        let claim = store.claim_announcements(10_000, lease).await.unwrap();
        let due: Vec<&Announcement> = claim
            .rows
            .iter()
            .filter(|r| ids.contains(&r.message_id))
            .collect();
        assert_eq!(due.len(), 1, "due now, claimed as any row");
        assert_eq!((due[0].seq, &due[0].message_id), (mine[0].seq, &ids[0]));
        store.mark_announced(&claim.rows).await.unwrap();
        // By when they were dispatched: both, within the last hour.
        let recent = Resend::DispatchedWithin(Duration::from_secs(3600));
        assert!(store.resend_announcements(&recent).await.unwrap() >= 2);
        for o in &orders {
            let row = announcement_of(store.as_ref(), &o.order_id).await.unwrap();
            assert_eq!(row.dispatched_at, None);
        }
    }
}

/// What a check needs beyond the store: direct access to its database, for
/// a state no order can reach (a position near the top of DECIMAL(38,10)
/// takes 10^10 of the largest orders).
pub enum Backend {
    Sqlite(tempfile::TempDir),
    SqlServer(String),
}

impl Backend {
    /// Set (insert) a position row to exactly `quantity`.
    async fn set_position(&self, account: &str, symbol: &str, quantity: &str) {
        match self {
            Backend::Sqlite(dir) => {
                let conn = rusqlite::Connection::open(dir.path().join("orders.db")).unwrap();
                conn.busy_timeout(std::time::Duration::from_secs(5))
                    .unwrap();
                conn.execute(
                    "INSERT INTO Positions (AccountId, Symbol, Quantity, UpdatedAt)
                     VALUES (?1, ?2, ?3, 'seeded')",
                    [account, symbol, quantity],
                )
                .unwrap();
            }
            Backend::SqlServer(cs) => {
                let units = pos(quantity).units().to_string();
                let mut client = common::mssql_raw_client(cs).await;
                client
                    .execute(
                        "INSERT INTO dbo.Positions (AccountId, Symbol, Units, UpdatedAt) \
                         VALUES (@P1, @P2, CAST(@P3 AS DECIMAL(38, 0)), SYSUTCDATETIME())",
                        &[&account, &symbol, &units.as_str()],
                    )
                    .await
                    .unwrap();
            }
        }
    }

    /// Insert `o`'s row `Received` with `fingerprint`, as an earlier version
    /// did before executing it (its accept step, which a crash could leave
    /// alone; version 1 fingerprints were 64 hex digits without a prefix).
    async fn insert_received(&self, o: &Order, fingerprint: &str) {
        let quantity = o.quantity.to_string();
        let price = o.limit_price.map(|p| p.to_string()).unwrap_or_default();
        let currency = o.currency.clone().unwrap_or_default();
        match self {
            Backend::Sqlite(dir) => {
                let conn = rusqlite::Connection::open(dir.path().join("orders.db")).unwrap();
                conn.busy_timeout(std::time::Duration::from_secs(5))
                    .unwrap();
                conn.execute(
                    "INSERT INTO Orders (OrderId, Fingerprint, EventId, AccountId, Side, Symbol,
                        Quantity, LimitPrice, Currency, Status, ReceivedAt)
                     VALUES (?1, ?2, 'e0', ?3, ?4, ?5, ?6, NULLIF(?7, ''), NULLIF(?8, ''),
                        'Received', 'seeded')",
                    [
                        o.order_id.as_str(),
                        fingerprint,
                        &o.account_id,
                        o.side.as_str(),
                        &o.symbol,
                        &quantity,
                        &price,
                        &currency,
                    ],
                )
                .unwrap();
            }
            Backend::SqlServer(cs) => {
                let mut client = common::mssql_raw_client(cs).await;
                client
                    .execute(
                        "INSERT INTO dbo.Orders (OrderId, Fingerprint, EventId, AccountId, Side, \
                         Symbol, Quantity, LimitPrice, Currency, Status, Attempts, ReceivedAt) \
                         VALUES (@P1, @P2, N'e0', @P3, @P4, @P5, CAST(@P6 AS DECIMAL(28, 10)), \
                         CAST(NULLIF(@P7, N'') AS DECIMAL(28, 10)), NULLIF(@P8, N''), \
                         N'Received', 1, SYSUTCDATETIME())",
                        &[
                            &o.order_id.as_str(),
                            &fingerprint,
                            &o.account_id.as_str(),
                            &o.side.as_str(),
                            &o.symbol.as_str(),
                            &quantity.as_str(),
                            &price.as_str(),
                            &currency.as_str(),
                        ],
                    )
                    .await
                    .unwrap();
            }
        }
    }
}

/// The outbox's history: rows past the retention, executions an earlier
/// version left unannounced (checks that seed state through [`Backend`]).
#[path = "store_conformance/history.rs"]
mod history;

/// The checks that seed state through [`Backend`].
mod seeded {
    use super::*;

    /// An order that would take a position beyond DECIMAL(38,10) is
    /// rejected and stored with its reason, in the transaction that moves it
    /// to `Rejected`; never rounded, never executed, and only once.
    pub async fn an_overflowing_order_is_rejected_and_stored(
        store: Arc<dyn OrderStore>,
        backend: &Backend,
    ) {
        for (side, seed, would_be) in [
            (
                "buy",
                "9999999999999999999999999999.9999999999",
                "10000000000000000000000000000.9999999999",
            ),
            (
                "sell",
                "-9999999999999999999999999999",
                "-10000000000000000000000000000",
            ),
        ] {
            let account = unique_id("acct");
            backend.set_position(&account, "MSFT", seed).await;
            assert_eq!(
                store.position(&account, "MSFT").await.unwrap(),
                Some(pos(seed)),
                "a 38-digit position reads back exactly"
            );
            let o = order(&unique_id("ord"), &account, side, "1");
            let raw = json!({"id": "e-overflow", "data": {"orderId": o.order_id}}).to_string();
            let Execution::Rejected(overflow) =
                store.execute(&o, "e-overflow", &raw).await.unwrap()
            else {
                panic!("{side} next to {seed} must be rejected");
            };
            assert_eq!(overflow.current, pos(seed));
            assert_eq!(overflow.would_be(), would_be);
            let row = store.order(&o.order_id).await.unwrap().unwrap();
            assert_eq!(row.status, OrderStatus::Rejected);
            assert_eq!(row.executed_at, None);
            assert_eq!(
                store.position(&account, "MSFT").await.unwrap(),
                Some(pos(seed)),
                "never rounded, never applied"
            );
            let stored = store.rejections(Some(&o.order_id)).await.unwrap();
            assert_eq!(stored.len(), 1, "{stored:?}");
            assert_eq!(stored[0].kind, "poison");
            assert_eq!(stored[0].reason, overflow.reason(&account, "MSFT"));
            assert!(
                stored[0]
                    .reason
                    .contains(&format!(" to {would_be}, beyond DECIMAL(38,10)")),
                "{}",
                stored[0].reason
            );
            assert_eq!(stored[0].raw_event, raw);
            assert_eq!(stored[0].fingerprint.as_deref(), Some(o.fingerprint()));
            assert_eq!(
                store
                    .announcements(&Listing::Order(o.order_id.clone()), 10)
                    .await
                    .unwrap(),
                vec![],
                "a rejected order is not announced"
            );
            // Terminal: a redelivery is a duplicate, nothing more is stored.
            assert_eq!(
                store.execute(&o, "e-overflow", &raw).await.unwrap(),
                Execution::AlreadyDone
            );
            assert_eq!(store.rejections(Some(&o.order_id)).await.unwrap().len(), 1);
            // The other way still executes, exactly.
            let back = order(
                &unique_id("ord"),
                &account,
                if side == "buy" { "sell" } else { "buy" },
                "0.0000000001",
            );
            assert_eq!(
                store.execute(&back, "e", "{}").await.unwrap(),
                Execution::Executed
            );
            let moved = pos(seed)
                .apply(back.side, back.quantity)
                .expect("inside the range");
            assert_eq!(store.position(&account, "MSFT").await.unwrap(), Some(moved));
        }
    }

    /// A row an earlier version inserted `Received` and never executed (its
    /// worker died between its two calls) is executed by the one call, once.
    pub async fn a_row_an_earlier_version_left_received_is_resumed(
        store: Arc<dyn OrderStore>,
        backend: &Backend,
    ) {
        let account = unique_id("acct");
        let o = order(&unique_id("ord"), &account, "buy", "4");
        backend.insert_received(&o, o.fingerprint()).await;
        assert_eq!(
            store.execute(&o, "e", "{}").await.unwrap(),
            Execution::Executed
        );
        let row = store.order(&o.order_id).await.unwrap().unwrap();
        assert_eq!(row.status, OrderStatus::Executed);
        assert_eq!(row.attempts, 2);
        assert_eq!(
            store.execute(&o, "e", "{}").await.unwrap(),
            Execution::AlreadyDone
        );
        assert_eq!(
            store.position(&account, "MSFT").await.unwrap(),
            Some(pos("4"))
        );
    }

    /// A row whose fingerprint is of another version is fingerprinted again
    /// from its columns (`OrderRecord::current_fingerprint`), never called a
    /// conflict by its hash: the same order is executed, another order's
    /// delivery is a conflict.
    pub async fn a_row_of_an_older_fingerprint_version_is_judged_by_its_columns(
        store: Arc<dyn OrderStore>,
        backend: &Backend,
    ) {
        let v1 = "ab".repeat(32);
        let account = unique_id("acct");
        let o = order(&unique_id("ord"), &account, "buy", "6");
        backend.insert_received(&o, &v1).await;
        assert_eq!(
            store.execute(&o, "e", "{}").await.unwrap(),
            Execution::Executed,
            "the same order under a version-1 fingerprint"
        );
        assert_eq!(
            store.execute(&o, "e", "{}").await.unwrap(),
            Execution::AlreadyDone
        );
        let other = order(&o.order_id, &account, "buy", "7");
        // A rejection is keyed by its raw event: one of this order's own
        // (a shared `{}` is counted on another test's row, or an earlier run's).
        let raw = format!("{{\"id\": \"{}\"}}", unique_id("e2"));
        assert_eq!(
            store.execute(&other, "e2", &raw).await.unwrap(),
            Execution::Conflict {
                existing_fingerprint: v1.clone()
            }
        );
        assert_eq!(store.rejections(Some(&o.order_id)).await.unwrap().len(), 1);
        assert_eq!(
            store.position(&account, "MSFT").await.unwrap(),
            Some(pos("6"))
        );
    }
}

/// Generate one `#[tokio::test]` per suite check for a backend.
macro_rules! conformance {
    ($backend:ident, $make:expr) => {
        mod $backend {
            use super::*;
            conformance!(@tests $make;
                execute_moves_position_once,
                an_order_with_no_row_is_executed_never_a_duplicate,
                duplicates_and_conflicts_are_answered_not_errors,
                concurrent_executions_take_effect_once,
                rejections_are_stored_once_with_their_reason,
                migrate_is_idempotent,
                ids_differing_only_in_case_are_different,
                identity_is_made_once_with_the_schema,
                exact_decimals_round_trip,
                positions_stay_exact_beyond_28_digits,
                an_execution_is_announced_once_and_nothing_else_is,
                announcements_are_claimed_once_marked_deferred_and_purged,
                the_sequence_only_grows_past_a_purge,
                a_resent_announcement_is_due_again_as_it_was);
            conformance!(@seeded $make;
                an_overflowing_order_is_rejected_and_stored,
                a_row_an_earlier_version_left_received_is_resumed,
                a_row_of_an_older_fingerprint_version_is_judged_by_its_columns);
            conformance!(@history $make;
                unsent_rows_past_the_retention_go_only_where_nothing_sends_them,
                a_backfill_announces_what_an_earlier_version_executed_once,
                a_backfill_places_executions_of_one_millisecond_by_the_recorded_positions);
        }
    };
    (@tests $make:expr; $($check:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $check() {
                if let Some((store, _backend)) = $make.await {
                    suite::$check(store).await;
                }
            }
        )*
    };
    (@history $make:expr; $($check:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $check() {
                if let Some((store, backend)) = $make.await {
                    history::$check(store, &backend).await;
                }
            }
        )*
    };
    (@seeded $make:expr; $($check:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $check() {
                if let Some((store, backend)) = $make.await {
                    seeded::$check(store, &backend).await;
                }
            }
        )*
    };
}

async fn sqlite_store() -> Option<(Arc<dyn OrderStore>, Backend)> {
    let (store, dir) = common::sqlite_store().await;
    Some((store as Arc<dyn OrderStore>, Backend::Sqlite(dir)))
}

conformance!(sqlite, sqlite_store());

/// The SQL Server store when `ORDER_GUARD_TEST_MSSQL` holds an ADO.NET
/// connection string (migrated first); otherwise `None`, after saying so: the
/// checks then do not run, they do not pass.
async fn sqlserver_store() -> Option<(Arc<dyn OrderStore>, Backend)> {
    let cs = common::mssql_connection_string()?;
    let store = common::mssql_store(&cs, std::time::Duration::from_secs(20)).await;
    Some((store as Arc<dyn OrderStore>, Backend::SqlServer(cs)))
}

conformance!(sqlserver, sqlserver_store());
