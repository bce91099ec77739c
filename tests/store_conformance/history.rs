//! The outbox's history, on every store: rows past the retention where
//! nothing sends them, and executions an earlier version left without an
//! announcement (`outbox backfill`). Each check works on a database of its
//! own (`Backend::apart`): a shared one's other checks claim, mark and
//! purge every due row.

use super::*;

impl Backend {
    /// For a check whose rows no other check may claim, mark or purge
    /// (their claims take every due row of a shared database): the store
    /// on a database of its own. `None` for SQLite, whose file already is.
    async fn apart(&self) -> Option<(Arc<dyn OrderStore>, Backend)> {
        match self {
            Backend::Sqlite(_) => None,
            Backend::SqlServer(cs) => {
                let cs = common::mssql_fresh_database(cs).await;
                let store = common::mssql_store(&cs, Duration::from_secs(20)).await;
                Some((store as Arc<dyn OrderStore>, Backend::SqlServer(cs)))
            }
        }
    }

    /// Run `sqlite` on the file, or `tsql` on the database, with `order_id`
    /// as ?1 / @P1 and `n` as ?2 / @P2; answers the rows changed.
    async fn change(&self, sqlite: &str, tsql: &str, order_id: &str, n: i32) -> u64 {
        match self {
            Backend::Sqlite(dir) => {
                let conn = rusqlite::Connection::open(dir.path().join("orders.db")).unwrap();
                conn.busy_timeout(std::time::Duration::from_secs(5))
                    .unwrap();
                conn.execute(sqlite, rusqlite::params![order_id, n])
                    .unwrap() as u64
            }
            Backend::SqlServer(cs) => {
                let mut client = common::mssql_raw_client(cs).await;
                client
                    .execute(tsql, &[&order_id, &n])
                    .await
                    .unwrap()
                    .total()
            }
        }
    }

    /// Delete the announcement of `order_id`, as if an earlier version,
    /// which wrote none, had executed it.
    async fn forget_announcement(&self, order_id: &str) {
        let sqlite = "DELETE FROM Outbox WHERE OrderId = ?1 AND ?2 = 0";
        let tsql = "DELETE FROM dbo.Outbox WHERE OrderId = @P1 AND @P2 = 0";
        assert_eq!(self.change(sqlite, tsql, order_id, 0).await, 1);
    }

    /// Make `order_id` executed `hours` hours ago.
    async fn backdate_execution(&self, order_id: &str, hours: i32) {
        let sqlite = "UPDATE Orders SET ExecutedAt =
                          strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-' || ?2 || ' hours')
                       WHERE OrderId = ?1";
        let tsql = "UPDATE dbo.Orders SET ExecutedAt = DATEADD(HOUR, -@P2, SYSUTCDATETIME()) \
                    WHERE OrderId = @P1";
        assert_eq!(self.change(sqlite, tsql, order_id, hours).await, 1);
    }

    /// Make `order_id` executed `seconds` seconds ago.
    async fn execute_seconds_ago(&self, order_id: &str, seconds: i32) {
        let sqlite = "UPDATE Orders SET ExecutedAt =
                          strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-' || ?2 || ' seconds')
                       WHERE OrderId = ?1";
        let tsql = "UPDATE dbo.Orders SET ExecutedAt = DATEADD(SECOND, -@P2, SYSUTCDATETIME()) \
                    WHERE OrderId = @P1";
        assert_eq!(self.change(sqlite, tsql, order_id, seconds).await, 1);
    }

    /// Give `order_id` the `ExecutedAt` of `as_of`: executed in the same
    /// millisecond.
    async fn same_millisecond(&self, order_id: &str, as_of: &str) {
        let sqlite = "UPDATE Orders SET ExecutedAt =
                          (SELECT ExecutedAt FROM Orders WHERE OrderId = ?2)
                       WHERE OrderId = ?1";
        let tsql = "UPDATE dbo.Orders SET ExecutedAt = \
                        (SELECT ExecutedAt FROM dbo.Orders WHERE OrderId = @P2) \
                    WHERE OrderId = @P1";
        let changed = match self {
            Backend::Sqlite(dir) => {
                let conn = rusqlite::Connection::open(dir.path().join("orders.db")).unwrap();
                conn.busy_timeout(std::time::Duration::from_secs(5))
                    .unwrap();
                conn.execute(sqlite, rusqlite::params![order_id, as_of])
                    .unwrap() as u64
            }
            Backend::SqlServer(cs) => {
                let mut client = common::mssql_raw_client(cs).await;
                client
                    .execute(tsql, &[&order_id, &as_of])
                    .await
                    .unwrap()
                    .total()
            }
        };
        assert_eq!(changed, 1);
    }

    /// Make the announcement of `order_id` due since `days` days ago, as if
    /// it had waited that long unsent.
    async fn backdate_due(&self, order_id: &str, days: i32) {
        match self {
            Backend::Sqlite(dir) => {
                let conn = rusqlite::Connection::open(dir.path().join("orders.db")).unwrap();
                conn.busy_timeout(std::time::Duration::from_secs(5))
                    .unwrap();
                let changed = conn
                    .execute(
                        "UPDATE Outbox SET NextAttemptAt =
                             strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?2)
                          WHERE OrderId = ?1",
                        rusqlite::params![order_id, format!("-{days} days")],
                    )
                    .unwrap();
                assert_eq!(changed, 1);
            }
            Backend::SqlServer(cs) => {
                let mut client = common::mssql_raw_client(cs).await;
                let done = client
                    .execute(
                        "UPDATE dbo.Outbox SET NextAttemptAt = DATEADD(DAY, -@P2, SYSUTCDATETIME()) \
                         WHERE OrderId = @P1",
                        &[&order_id, &days],
                    )
                    .await
                    .unwrap();
                assert_eq!(done.total(), 1);
            }
        }
    }
}

/// The retention keeps the table bounded with no destination too: a
/// row due for longer than the retention and never sent is deleted
/// where nothing would send it ([`Expired::SentAndUnsent`]), never
/// where a destination waits for it ([`Expired::Sent`]); rows due
/// within the retention stay, and the sequence still only grows.
pub async fn unsent_rows_past_the_retention_go_only_where_nothing_sends_them(
    store: Arc<dyn OrderStore>,
    backend: &Backend,
) {
    let apart = backend.apart().await;
    let (store, backend) = match &apart {
        Some((store, backend)) => (Arc::clone(store), backend),
        None => (store, backend),
    };
    let account = unique_id("acct");
    let day = Duration::from_secs(86_400);
    let orders: Vec<Order> = (0..3)
        .map(|_| order(&unique_id("ord"), &account, "buy", "1"))
        .collect();
    for o in &orders {
        store.execute(o, "e", "{}").await.unwrap();
    }
    let mut seqs = Vec::new();
    for o in &orders {
        let row = suite::announcement_of(store.as_ref(), &o.order_id).await;
        seqs.push(row.unwrap().seq);
    }
    // The first two waited three days unsent; the last is new.
    for o in &orders[..2] {
        backend.backdate_due(&o.order_id, 3).await;
    }
    let kept = || async {
        let mut kept = Vec::new();
        for o in &orders {
            let row = suite::announcement_of(store.as_ref(), &o.order_id).await;
            kept.push(row.is_some());
        }
        kept
    };
    // A destination waits for its rows however long.
    while store
        .purge_announced(day, 500, Expired::Sent)
        .await
        .unwrap()
        > 0
    {}
    assert_eq!(kept().await, [true, true, true]);
    // With none, the rows due past the retention go, a call's limit
    // at a time; the new one stays.
    let mut calls = 0;
    loop {
        let n = store
            .purge_announced(day, 1, Expired::SentAndUnsent)
            .await
            .unwrap();
        assert!(n <= 1, "a purge deletes at most its limit");
        if n == 0 {
            break;
        }
        calls += 1;
    }
    assert!(calls >= 2, "{calls}");
    assert_eq!(kept().await, [false, false, true]);
    let waiting: Vec<String> = store
        .announcements(&Listing::Undispatched, 10_000)
        .await
        .unwrap()
        .into_iter()
        .filter(|a| a.account_id == account)
        .map(|a| a.order_id)
        .collect();
    assert_eq!(
        waiting,
        [orders[2].order_id.clone()],
        "what a destination set now sends"
    );
    let next = order(&unique_id("ord"), &account, "buy", "1");
    store.execute(&next, "e", "{}").await.unwrap();
    let row = suite::announcement_of(store.as_ref(), &next.order_id)
        .await
        .unwrap();
    assert!(
        row.seq > *seqs.iter().max().unwrap(),
        "{} after {seqs:?}",
        row.seq
    );
}

/// `outbox backfill`: the orders executed within the window that have
/// no announcement (an earlier version executed them) get the one
/// their execution would have written, once: the same message id and
/// facts, the position right after each, new sequences above every
/// earlier one in their execution order, due now; counted first with
/// nothing written, and a second run adds nothing.
pub async fn a_backfill_announces_what_an_earlier_version_executed_once(
    store: Arc<dyn OrderStore>,
    backend: &Backend,
) {
    let apart = backend.apart().await;
    let (store, backend) = match &apart {
        Some((store, backend)) => (Arc::clone(store), backend),
        None => (store, backend),
    };
    let account = unique_id("acct");
    let hour = Duration::from_secs(3600);
    let orders = [
        order(&unique_id("ord"), &account, "buy", "10"),
        order(&unique_id("ord"), &account, "buy", "5"),
        order(&unique_id("ord"), &account, "sell", "1.5"),
        order(&unique_id("ord"), &account, "buy", "0.0000000002"),
    ];
    for o in &orders {
        store.execute(o, "e", "{}").await.unwrap();
    }
    let kept = suite::announcement_of(store.as_ref(), &orders[2].order_id)
        .await
        .unwrap();
    // Executed by an earlier version: the first three hours ago, the
    // second and the fourth within the hour.
    for o in [&orders[0], &orders[1], &orders[3]] {
        backend.forget_announcement(&o.order_id).await;
    }
    backend.backdate_execution(&orders[0].order_id, 3).await;
    assert_eq!(store.backfill_announcements(hour, false).await.unwrap(), 2);
    assert_eq!(
        suite::announcement_of(store.as_ref(), &orders[1].order_id).await,
        None,
        "counted, not written"
    );
    assert_eq!(store.backfill_announcements(hour, true).await.unwrap(), 2);
    assert_eq!(store.backfill_announcements(hour, true).await.unwrap(), 0);
    assert_eq!(store.backfill_announcements(hour, false).await.unwrap(), 0);
    assert_eq!(
        suite::announcement_of(store.as_ref(), &orders[0].order_id).await,
        None,
        "executed before the window"
    );
    let second = suite::announcement_of(store.as_ref(), &orders[1].order_id)
        .await
        .unwrap();
    let fourth = suite::announcement_of(store.as_ref(), &orders[3].order_id)
        .await
        .unwrap();
    let row = store.order(&orders[1].order_id).await.unwrap().unwrap();
    assert_eq!(second.message_id, message_id(&orders[1].order_id));
    assert_eq!(
        (second.side.as_str(), second.quantity, &second.account_id),
        ("buy", dec("5"), &account)
    );
    assert_eq!(Some(&second.executed_at), row.executed_at.as_ref());
    assert_eq!(second.fingerprint, row.fingerprint);
    assert_eq!(second.position_after, pos("15"), "10 + 5");
    assert_eq!(fourth.position_after, pos("13.5000000002"));
    assert_eq!(
        (second.dispatched_at.as_ref(), second.parked),
        (None, false)
    );
    assert!(
        kept.seq < second.seq && second.seq < fourth.seq,
        "new, above every earlier, in execution order: {} {} {}",
        kept.seq,
        second.seq,
        fourth.seq
    );
    // Due now: a dispatcher's claim takes them.
    let claim = store.claim_announcements(100, hour).await.unwrap();
    let mut claimed: Vec<&str> = claim
        .rows
        .iter()
        .filter(|r| r.account_id == account)
        .map(|r| r.order_id.as_str())
        .collect();
    claimed.sort_unstable();
    let mut want = vec![
        orders[1].order_id.as_str(),
        orders[2].order_id.as_str(),
        orders[3].order_id.as_str(),
    ];
    want.sort_unstable();
    assert_eq!(claimed, want);
}

/// `outbox backfill` places an execution of an earlier version by what
/// the store recorded under the position's lock, not by `Orders.Id`: an
/// order whose row was inserted first (`Received`, by an earlier version's
/// worker) but executed after another, announced one, in the same
/// millisecond, gets the position after its own execution, because the
/// announced row's recorded position says which came first.
pub async fn a_backfill_places_executions_of_one_millisecond_by_the_recorded_positions(
    store: Arc<dyn OrderStore>,
    backend: &Backend,
) {
    let apart = backend.apart().await;
    let (store, backend) = match &apart {
        Some((store, backend)) => (Arc::clone(store), backend),
        None => (store, backend),
    };
    let account = unique_id("acct");
    let hour = Duration::from_secs(3600);
    // Executed in this order: buy 10; then, in one millisecond, sell 1.5
    // (announced) and buy 5, whose row was inserted before the sell's (a
    // lower `Orders.Id`); then buy 2.
    let first = order(&unique_id("ord"), &account, "buy", "10");
    let sell = order(&unique_id("ord"), &account, "sell", "1.5");
    let late = order(&unique_id("ord"), &account, "buy", "5");
    let last = order(&unique_id("ord"), &account, "buy", "2");
    store.execute(&first, "e", "{}").await.unwrap();
    backend.insert_received(&late, late.fingerprint()).await;
    for o in [&sell, &late, &last] {
        assert_eq!(
            store.execute(o, "e", "{}").await.unwrap(),
            Execution::Executed
        );
    }
    assert_eq!(
        store.position(&account, "MSFT").await.unwrap(),
        Some(pos("15.5"))
    );
    let recorded = suite::announcement_of(store.as_ref(), &sell.order_id)
        .await
        .unwrap();
    assert_eq!(recorded.position_after, pos("8.5"), "10 - 1.5");
    for o in [&first, &late, &last] {
        backend.forget_announcement(&o.order_id).await;
    }
    backend.execute_seconds_ago(&first.order_id, 40).await;
    backend.execute_seconds_ago(&sell.order_id, 30).await;
    backend
        .same_millisecond(&late.order_id, &sell.order_id)
        .await;
    backend.execute_seconds_ago(&last.order_id, 20).await;
    assert_eq!(store.backfill_announcements(hour, true).await.unwrap(), 3);
    let mut rows = Vec::new();
    for o in [&first, &late, &last] {
        let row = suite::announcement_of(store.as_ref(), &o.order_id)
            .await
            .unwrap();
        rows.push(row);
    }
    let after: Vec<Position> = rows.iter().map(|r| r.position_after).collect();
    assert_eq!(
        after,
        [pos("10"), pos("13.5"), pos("15.5")],
        "buy 10; sell 1.5 (recorded 8.5), buy 5; buy 2"
    );
    assert!(
        rows[0].seq < rows[1].seq && rows[1].seq < rows[2].seq,
        "written in execution order: {:?}",
        rows.iter().map(|r| r.seq).collect::<Vec<_>>()
    );
    let unchanged = suite::announcement_of(store.as_ref(), &sell.order_id)
        .await
        .unwrap();
    assert_eq!(unchanged, recorded, "the announced row is left as it was");
}
