//! The SQLite store's own tests: what only its file, its writer and its
//! pragmas can show (the behaviour both stores share is in
//! `tests/store_conformance.rs`).

use super::*;

/// A store on a new file at `path`, its schema made.
async fn migrated(path: &Path, busy_timeout: Duration) -> SqliteStore {
    let store = SqliteStore::open(path, busy_timeout).expect("open");
    store.migrate().await.expect("migrate");
    store
}

/// A relaxed call commits `NORMAL`; the next call that must be durable
/// (after a bookkeeping call too) finds the connection `FULL` again.
/// Which calls are relaxed is counted in fsyncs (docs/benchmarks.md).
#[tokio::test]
async fn a_relaxed_call_commits_normal_and_the_next_durable_one_full() {
    let dir = tempfile::tempdir().unwrap();
    let store = migrated(&dir.path().join("orders.db"), Duration::from_secs(5)).await;
    let synchronous = |conn: &mut Connection| {
        conn.pragma_query_value(None, "synchronous", |r| r.get::<_, i64>(0))
    };
    // 2 is FULL, 1 is NORMAL.
    assert_eq!(store.with(synchronous).await.unwrap(), 2);
    assert_eq!(store.with_relaxed(synchronous).await.unwrap(), 1);
    assert_eq!(store.mark_announced(&[]).await.unwrap(), 0);
    assert_eq!(store.with(synchronous).await.unwrap(), 2);
}

/// `status`'s outbox counts and one order's announcement (a scan of
/// the kept rows) are read off the writer: they answer while another
/// process holds the file's write lock, where a call on the writer
/// would wait for it and fail at the busy timeout. And they see what
/// the writer committed.
#[tokio::test]
async fn the_outbox_listings_answer_under_another_process_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders.db");
    let store = migrated(&path, Duration::from_millis(200)).await;
    store
        .with(|conn| {
            conn.execute(
                "INSERT INTO Outbox (MessageId, Kind, OrderId, AccountId, Side, Symbol,
                     Quantity, PositionAfter, Fingerprint, ExecutedAt, CreatedAt,
                     NextAttemptAt, LeaseUntil)
                 VALUES (?1, 'OrderExecuted', 'o1', 'a', 'buy', 'MSFT', '1', '1', 'v2:x',
                         't', 't', 't', 't')",
                [crate::store::message_id("o1")],
            )
        })
        .await
        .unwrap();
    let other = Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    // The writer cannot begin a transaction now: the lock is held.
    let blocked = store.with(|_| Ok(())).await;
    assert!(blocked.is_err(), "the other connection's lock did not hold");
    let counts = store.outbox_counts().await.expect("counts under the lock");
    assert_eq!(counts.undispatched, 1);
    let found = store
        .announcements(&Listing::Order("o1".into()), 10)
        .await
        .expect("one order's announcement under the lock");
    assert_eq!(found.len(), 1, "o1's announcement: {found:?}");
    assert_eq!(found[0].order_id, "o1");
    other.execute_batch("ROLLBACK").unwrap();
}

/// The instant bound in place of `strftime('…', 'now')` is the same
/// text on the same clock: SQLite's `now`, read between two of ours,
/// sorts between them, and has the same shape.
#[test]
fn the_instant_bound_is_the_text_strftime_writes() {
    let epoch = SystemTime::UNIX_EPOCH;
    assert_eq!(
        instant_text(epoch + Duration::from_millis(1_764_932_842_123)),
        "2025-12-05T11:07:22.123Z"
    );
    assert_eq!(
        instant_text(epoch + Duration::from_nanos(999_999_999)),
        "1970-01-01T00:00:00.999Z",
        "milliseconds truncated, as SQLite's clock gives them"
    );
    assert_eq!(
        instant_text(epoch + Duration::from_millis(951_782_400_000)),
        "2000-02-29T00:00:00.000Z",
        "a leap day"
    );
    assert_eq!(
        instant_text(epoch - Duration::from_millis(1)),
        "1969-12-31T23:59:59.999Z",
        "a clock before 1970 is written too, not a panic"
    );
    let conn = Connection::open_in_memory().unwrap();
    let before = instant_text(SystemTime::now());
    let sqlite: String = conn
        .query_row(&format!("SELECT {NOW}"), [], |r| r.get(0))
        .unwrap();
    let after = instant_text(SystemTime::now());
    assert!(
        before <= sqlite && sqlite <= after,
        "{before} {sqlite} {after}"
    );
    assert_eq!(sqlite.len(), before.len());
}

/// A row left `Received` by an earlier version keeps the quantity's
/// text it was written with; the row handed over carries that text, as
/// a claim would read it (every copy of an announcement has the same
/// bytes).
#[tokio::test]
async fn a_resumed_row_is_handed_over_with_the_quantity_its_row_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders.db");
    let store = migrated(&path, Duration::from_secs(5)).await;
    let order = Order::from_data(&serde_json::json!({
        "orderId": "resumed", "accountId": "acct", "side": "buy",
        "symbol": "MSFT", "quantity": "2.50"
    }))
    .expect("an order");
    Connection::open(&path)
        .unwrap()
        .execute(
            "INSERT INTO Orders (OrderId, Fingerprint, AccountId, Side, Symbol, Quantity,
                                 Status, ReceivedAt)
             VALUES ('resumed', ?1, 'acct', 'buy', 'MSFT', '2.50', 'Received',
                     '2026-12-05T00:00:00.000Z')",
            [order.fingerprint()],
        )
        .unwrap();
    let lease = Duration::from_secs(60);
    let handoff = store.hand_over_announcements(lease).unwrap();
    assert_eq!(
        store.execute(&order, "e", "{}").await.unwrap(),
        Execution::Executed
    );
    let births = handoff.take(usize::MAX);
    assert_eq!(births.len(), 1, "{births:?}");
    let born = &births[0].row;
    assert_eq!(born.quantity.to_string(), "2.50", "the row's text");
    let stored = store
        .announcements(&crate::store::Listing::Order("resumed".into()), 1)
        .await
        .unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0], *born, "handed over as a claim reads it");
}

/// With a dispatcher running (a hand-off), an execution's row is born
/// leased to it and handed over once committed, as a claim would read
/// it; no claim takes it while the lease holds, and a duplicate hands
/// nothing over.
#[tokio::test]
async fn a_row_born_leased_is_handed_over_as_a_claim_reads_it_and_not_claimed_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let store = migrated(&dir.path().join("orders.db"), Duration::from_secs(5)).await;
    let order = |id: &str, qty: &str| {
        Order::from_data(&serde_json::json!({
            "orderId": id, "accountId": "acct", "side": "sell",
            "symbol": "MSFT", "quantity": qty
        }))
        .expect("an order")
    };
    // Before a dispatcher runs, rows are claimable at once.
    store
        .execute(&order("before", "1"), "e", "{}")
        .await
        .unwrap();
    let lease = Duration::from_secs(60);
    let handoff = store
        .hand_over_announcements(lease)
        .expect("SQLite hands over");
    assert!(
        handoff.take(usize::MAX).is_empty(),
        "nothing executed since"
    );
    let before = Instant::now();
    let placed = order("born", "2.50");
    store.execute(&placed, "e", "{}").await.unwrap();
    let births = handoff.take(usize::MAX);
    assert_eq!(births.len(), 1, "{births:?}");
    assert!(births[0].leased_until <= Instant::now() + lease);
    assert!(births[0].leased_until >= before + lease);
    let born = &births[0].row;
    assert_eq!(born.order_id, "born");
    assert_eq!(born.quantity, placed.quantity);
    assert_eq!(born.position_after.to_string(), "-3.5");
    let claim = store.claim_announcements(10, lease).await.unwrap();
    let claimed: Vec<&str> = claim.rows.iter().map(|r| r.order_id.as_str()).collect();
    assert_eq!(
        claimed,
        ["before"],
        "the born row is leased to its dispatcher"
    );
    // Held since its birth, under no claim's token: a claim's token
    // defers nothing; a deferral as its birth's holder (no token)
    // applies (and makes it claimable now), and the claim then reads
    // the same row.
    let deferral = Deferral {
        message_id: born.message_id.clone(),
        error: "503".into(),
        retry_in: Duration::ZERO,
        park: false,
    };
    store
        .defer_announcement(Some(&claim.token), &deferral)
        .await
        .unwrap();
    let still = store.claim_announcements(10, lease).await.unwrap();
    assert!(
        still.rows.is_empty(),
        "deferred under another's token: {still:?}"
    );
    store.defer_announcement(None, &deferral).await.unwrap();
    let reclaimed = store.claim_announcements(10, lease).await.unwrap();
    assert_eq!(reclaimed.rows.len(), 1, "{reclaimed:?}");
    let again = &reclaimed.rows[0];
    assert_eq!(again.attempts, 1);
    assert_eq!(
        Announcement {
            attempts: 0,
            last_error: None,
            ..again.clone()
        },
        *born,
        "handed over as a claim reads it"
    );
    // A duplicate writes nothing and hands nothing over.
    assert_eq!(
        store.execute(&placed, "e", "{}").await.unwrap(),
        Execution::AlreadyDone
    );
    assert!(handoff.take(usize::MAX).is_empty());
    assert!(Arc::ptr_eq(
        &handoff,
        &store.hand_over_announcements(lease).unwrap()
    ));
}

/// A born row whose lease ended and which a claim then took is the
/// claim's: the process it was born to (deferring with no token) no
/// longer holds it and defers nothing; the claim's own defer applies.
#[tokio::test]
async fn a_born_row_a_claim_took_over_is_not_deferred_by_the_process_it_was_born_to() {
    let dir = tempfile::tempdir().unwrap();
    let store = migrated(&dir.path().join("orders.db"), Duration::from_secs(5)).await;
    // A lease of zero: the row is claimable as soon as it is written.
    let handoff = store.hand_over_announcements(Duration::ZERO).unwrap();
    let placed = Order::from_data(&serde_json::json!({
        "orderId": "taken-over", "accountId": "acct", "side": "buy",
        "symbol": "MSFT", "quantity": "1"
    }))
    .expect("an order");
    store.execute(&placed, "e", "{}").await.unwrap();
    let born = handoff.take(usize::MAX).pop().expect("handed over").row;
    let claim = store
        .claim_announcements(10, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claim.rows.len(), 1, "{claim:?}");
    let deferral = Deferral {
        message_id: born.message_id.clone(),
        error: "503".into(),
        retry_in: Duration::ZERO,
        park: false,
    };
    let attempts = || async {
        store
            .announcements(&crate::store::Listing::Order("taken-over".into()), 1)
            .await
            .unwrap()[0]
            .attempts
    };
    store.defer_announcement(None, &deferral).await.unwrap();
    assert_eq!(attempts().await, 0, "deferred by a holder it no longer has");
    store
        .defer_announcement(Some(&claim.token), &deferral)
        .await
        .unwrap();
    assert_eq!(attempts().await, 1, "the claim's defer");
}

/// The claim is one `UPDATE … RETURNING`: it hands back exactly the
/// rows it leased, the oldest due first, no more than its limit, in
/// `Seq` order; rows under another claim's lease are not handed back.
#[tokio::test]
async fn a_claim_returns_exactly_the_rows_it_leased_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let store = migrated(&dir.path().join("orders.db"), Duration::from_secs(5)).await;
    let ids: Vec<String> = (1..=5).map(|i| format!("ord-{i}")).collect();
    for id in &ids {
        let order = Order::from_data(&serde_json::json!({
            "orderId": id, "accountId": "acct", "side": "buy",
            "symbol": "MSFT", "quantity": "2"
        }))
        .expect("an order");
        store.execute(&order, "evt", "{}").await.unwrap();
    }
    let lease = Duration::from_secs(60);
    let claimed = |claim: &crate::store::Claim| -> Vec<String> {
        claim.rows.iter().map(|r| r.order_id.clone()).collect()
    };
    let first = store.claim_announcements(3, lease).await.unwrap();
    assert_eq!(claimed(&first), ids[..3]);
    assert!(first.rows.windows(2).all(|w| w[0].seq < w[1].seq));
    let second = store.claim_announcements(10, lease).await.unwrap();
    assert_eq!(claimed(&second), ids[3..], "the rest, not the leased");
    let third = store.claim_announcements(10, lease).await.unwrap();
    assert!(third.rows.is_empty(), "all leased: {:?}", third.rows);
}

/// The mark takes exactly the rows sent: a row between two sent ones
/// that was not (its send failed) stays undispatched, though the mark
/// finds rows by ranges of `Seq`.
#[tokio::test]
async fn the_mark_leaves_a_row_between_sent_ones_undispatched() {
    let dir = tempfile::tempdir().unwrap();
    let store = migrated(&dir.path().join("orders.db"), Duration::from_secs(5)).await;
    for i in 1..=5 {
        let order = Order::from_data(&serde_json::json!({
            "orderId": format!("ord-{i}"), "accountId": "acct", "side": "buy",
            "symbol": "MSFT", "quantity": "2"
        }))
        .expect("an order");
        store.execute(&order, "evt", "{}").await.unwrap();
    }
    let claim = store
        .claim_announcements(10, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claim.rows.len(), 5);
    let sent: Vec<Announcement> = claim
        .rows
        .iter()
        .filter(|r| r.order_id != "ord-3")
        .cloned()
        .collect();
    assert_eq!(store.mark_announced(&sent).await.unwrap(), 4);
    let left: Vec<String> = store
        .announcements(&Listing::Undispatched, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.order_id)
        .collect();
    assert_eq!(left, ["ord-3"]);
}

/// The place a copy cannot share: the canonical path, the file's device
/// and inode, and this machine's id (a copy on another machine at the
/// same path is another database).
#[cfg(unix)]
#[test]
fn the_place_is_the_full_path_the_inode_and_the_machine() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders.db");
    std::fs::write(&path, b"").unwrap();
    let [full, file, machine] = place_of(&path);
    let canonical = std::fs::canonicalize(&path).unwrap();
    assert_eq!(full, canonical.display().to_string());
    let m = std::fs::metadata(&path).unwrap();
    assert_eq!(file, format!("{}:{}", m.dev(), m.ino()));
    // The first of these that says something (a container may have
    // only the host name).
    let id = [
        "/etc/machine-id",
        "/var/lib/dbus/machine-id",
        "/proc/sys/kernel/hostname",
    ]
    .iter()
    .filter_map(|f| std::fs::read_to_string(f).ok())
    .map(|t| t.trim().to_string())
    .find(|t| !t.is_empty())
    .expect("this test needs a machine id or a host name");
    assert_eq!(machine, id);
}
