//! The outbox on SQLite: the row `execute` writes with an execution, and
//! the dispatcher's claim, mark, defer and purge (`store::announcement`).
//! Each runs on the writer thread, inside the writer's group commit, so a
//! claim and a mark are serialized with every other write of every process
//! sharing the file (`BEGIN IMMEDIATE`): two dispatchers never claim one row.

use std::time::Duration;

use rusqlite::{params, Connection, Row};

use super::{decimal, position, NOW};
use crate::order::Order;
use crate::position::Position;
use crate::store::walk_back::{walk_back, Executed};
use crate::store::{
    message_id, Announcement, Deferral, Expired, Listing, OutboxCounts, Resend, ORDER_EXECUTED,
};

/// `strftime` of now plus a signed SQLite modifier (`?n` = `+1.500 seconds`).
fn now_plus(param: usize) -> String {
    format!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?{param})")
}

/// A duration as a SQLite date modifier, to the millisecond.
fn modifier(d: Duration, sign: char) -> String {
    format!("{sign}{}.{:03} seconds", d.as_secs(), d.subsec_millis())
}

/// Raise the outbox's epoch (`store::next_epoch`): a new one, covering
/// every `Seq` from one past the highest kept (the purge keeps the highest
/// row, so that is the next `Seq` SQLite hands out). What a process does
/// once, before the first row it writes (`SqliteStore::execute` and
/// `backfill`), inside that row's transaction; the writer's transaction
/// (`BEGIN IMMEDIATE`) orders it with every other process's.
pub(super) fn raise_epoch(conn: &Connection) -> Result<i64, rusqlite::Error> {
    let newest: Option<i64> = conn
        .prepare_cached("SELECT MAX(Epoch) FROM OutboxEpoch")?
        .query_row([], |r| r.get(0))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let epoch = crate::store::next_epoch(now, newest);
    conn.prepare_cached(
        "INSERT INTO OutboxEpoch (Epoch, FirstSeq)
         SELECT ?1, COALESCE(MAX(Seq), 0) + 1 FROM Outbox",
    )?
    .execute([epoch])?;
    Ok(epoch)
}

/// The epoch of the row numbered `seq`: the newest raised at or below it.
/// (In [`COLUMNS`] the same, as a subquery.)
fn epoch_of(conn: &Connection, seq: i64) -> Result<Option<i64>, rusqlite::Error> {
    conn.prepare_cached("SELECT MAX(Epoch) FROM OutboxEpoch WHERE FirstSeq <= ?1")?
        .query_row([seq], |r| r.get(0))
}

/// The announcement of an order this transaction just executed at `now`
/// (the text the order's row holds): its `ExecutedAt` copied from that
/// row, so the two agree. Born leased (`Some(until)`, the lease's end, for
/// a [`crate::store::Handoff`]): the row is written under that lease, with
/// no claim's token (`ClaimToken` NULL until a claim takes it: a token
/// would put every born row into the claim token's index, an index write
/// and a page more in each first delivery's commit, callgrind), and
/// answered as a claim would read it, for the dispatcher to send. `fresh`:
/// this call inserted the order's row.
pub(super) fn announce(
    conn: &Connection,
    o: &Order,
    position_after: Position,
    now: &str,
    born: Option<String>,
    fresh: bool,
) -> Result<Option<Announcement>, rusqlite::Error> {
    let id = message_id(&o.order_id);
    // Claimable at once (its lease ends as it is written), or leased to
    // this process's dispatcher.
    let leased_until = born.as_deref().unwrap_or(now);
    let written = conn
        .prepare_cached(
            "INSERT INTO Outbox (MessageId, Kind, OrderId, AccountId, Side, Symbol, Quantity,
                                 PositionAfter, Fingerprint, ExecutedAt, CreatedAt, NextAttemptAt,
                                 LeaseUntil)
             SELECT ?1, ?2, OrderId, AccountId, Side, Symbol, Quantity, ?3, ?4, ExecutedAt,
                    ?6, ?6, ?7
               FROM Orders WHERE OrderId = ?5",
        )?
        .execute(params![
            id,
            ORDER_EXECUTED,
            position_after.to_string(),
            o.fingerprint(),
            o.order_id,
            now,
            leased_until,
        ])?;
    if written != 1 {
        return Err(super::protocol_error(format!(
            "order {}: its announcement wrote {written} rows",
            o.order_id
        )));
    }
    if born.is_none() {
        return Ok(None);
    }
    // The row as a claim would read it, from what this call holds: the
    // order, `now` (the order's `ExecutedAt`, which the row copies). Only
    // the quantity's text may differ, in a row that an earlier version
    // inserted (`fresh` false): that one is read back. (Reading the row
    // back each time, or `RETURNING` it, cost more: callgrind.)
    let seq = conn.last_insert_rowid();
    let quantity = if fresh {
        o.quantity
    } else {
        let text: String = conn
            .prepare_cached("SELECT Quantity FROM Outbox WHERE Seq = ?1")?
            .query_row([seq], |r| r.get(0))?;
        decimal(&text)?
    };
    let epoch = epoch_of(conn, seq)?;
    Ok(Some(Announcement {
        message_id: id,
        seq,
        epoch,
        kind: ORDER_EXECUTED.to_string(),
        order_id: o.order_id.clone(),
        account_id: o.account_id.clone(),
        side: o.side.as_str().to_string(),
        symbol: o.symbol.clone(),
        quantity,
        position_after,
        executed_at: now.to_string(),
        fingerprint: o.fingerprint().to_string(),
        attempts: 0,
        last_error: None,
        parked: false,
        dispatched_at: None,
    }))
}

/// The columns every read of rows takes, in [`row`]'s order, and the
/// row's epoch ([`epoch_of`]).
const COLUMNS: &str = "MessageId, Seq, Kind, OrderId, AccountId, Side, Symbol, Quantity, \
     PositionAfter, ExecutedAt, Fingerprint, Attempts, LastError, Parked, DispatchedAt, \
     (SELECT MAX(e.Epoch) FROM OutboxEpoch AS e WHERE e.FirstSeq <= Outbox.Seq)";

fn row(r: &Row<'_>) -> Result<Announcement, rusqlite::Error> {
    Ok(Announcement {
        message_id: r.get(0)?,
        seq: r.get(1)?,
        kind: r.get(2)?,
        order_id: r.get(3)?,
        account_id: r.get(4)?,
        side: r.get(5)?,
        symbol: r.get(6)?,
        quantity: decimal(&r.get::<_, String>(7)?)?,
        position_after: position(&r.get::<_, String>(8)?)?,
        executed_at: r.get(9)?,
        fingerprint: r.get(10)?,
        attempts: r.get(11)?,
        last_error: r.get(12)?,
        parked: r.get::<_, i64>(13)? != 0,
        dispatched_at: r.get(14)?,
        epoch: r.get(15)?,
    })
}

pub(super) fn claim(
    conn: &Connection,
    token: &str,
    limit: u32,
    lease: Duration,
) -> Result<Vec<Announcement>, rusqlite::Error> {
    // `RETURNING` hands back exactly the rows this statement claimed, in
    // one statement, not a second read by `ClaimToken`. The limit is in
    // the text, not bound: SQLite prepares a statement again every time a
    // value its plan reads is bound, as a `LIMIT` is (callgrind); one
    // dispatcher claims with one limit, so one cached statement.
    let mut stmt = conn.prepare_cached(&format!(
        "UPDATE Outbox SET LeaseUntil = {}, ClaimToken = ?1
          WHERE Seq IN (SELECT Seq FROM Outbox
                         WHERE DispatchedAt IS NULL AND NextAttemptAt <= {NOW}
                           AND Parked = 0 AND LeaseUntil <= {NOW}
                         ORDER BY NextAttemptAt, Seq LIMIT {limit})
         RETURNING {COLUMNS}",
        now_plus(2)
    ))?;
    let mut rows: Vec<Announcement> = stmt
        .query_map(params![token, modifier(lease, '+')], row)?
        .collect::<Result<_, _>>()?;
    // `RETURNING` promises no order; a round sends in the order of the rows.
    rows.sort_by_key(|a| a.seq);
    Ok(rows)
}

/// The mark at `?1` (now) of the undispatched rows whose `Seq` runs from
/// `?2` to `?3`, every one of them sent. Each row is found by its place in
/// the table, not through the message id's index, and a run of them by one
/// range of it: a round's rows are mostly one run (consecutive executions),
/// marked in one statement. Listing the `Seq`s instead (`IN (SELECT value
/// FROM json_each(?))`, the mark before) cost half as much again a row: the
/// list is made into a temporary index and each row sought through it
/// (callgrind, docs/benchmarks.md); one statement a row, more still. A
/// `Seq` names one row for good: the sender holds an undispatched row, which
/// nothing deletes, and a new row takes a `Seq` past every one kept.
pub(super) fn mark_sql() -> String {
    "UPDATE Outbox SET DispatchedAt = ?1, LeaseUntil = ?1
      WHERE Seq BETWEEN ?2 AND ?3 AND DispatchedAt IS NULL"
        .to_string()
}

/// The runs of consecutive numbers in `seqs`, each as its first and last,
/// in order (duplicates counted once).
fn runs(seqs: &[i64]) -> Vec<(i64, i64)> {
    let mut sorted = seqs.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut runs: Vec<(i64, i64)> = Vec::new();
    for seq in sorted {
        match runs.last_mut() {
            Some((_, last)) if last.checked_add(1) == Some(seq) => *last = seq,
            _ => runs.push((seq, seq)),
        }
    }
    runs
}

pub(super) fn mark(conn: &Connection, seqs: &[i64]) -> Result<u64, rusqlite::Error> {
    if seqs.is_empty() {
        return Ok(0);
    }
    let now = super::instant_text(std::time::SystemTime::now());
    let mut statement = conn.prepare_cached(&mark_sql())?;
    let mut marked = 0;
    for (first, last) in runs(seqs) {
        marked += statement.execute(params![now, first, last])?;
    }
    Ok(marked as u64)
}

/// The defer of one row still held where its send failed: by a claim
/// (`?2` its token) or since its birth (`?2` NULL: no claim has taken it
/// since), by message id among undispatched rows (the filter that lets it
/// use the message id's partial index: `schema::tests`).
pub(super) fn defer_sql() -> String {
    format!(
        "UPDATE Outbox SET Attempts = Attempts + 1, LastError = ?3,
                NextAttemptAt = CASE WHEN ?5 = 1 THEN '9999-12-31T00:00:00.000Z' ELSE {} END,
                LeaseUntil = {NOW}, Parked = ?5
          WHERE MessageId = ?1 AND ClaimToken IS ?2 AND DispatchedAt IS NULL",
        now_plus(4)
    )
}

pub(super) fn defer(
    conn: &Connection,
    token: Option<&str>,
    d: &Deferral,
) -> Result<(), rusqlite::Error> {
    conn.prepare_cached(&defer_sql())?.execute(params![
        d.message_id,
        token,
        d.error,
        modifier(d.retry_in, '+'),
        i64::from(d.park)
    ])?;
    Ok(())
}

/// The retention's delete: up to `limit` rows dispatched more than
/// `retention` ago, oldest first, and with [`Expired::SentAndUnsent`] (no
/// destination) up to the rest of `limit` due for more than `retention`
/// and never sent (not parked, not leased: on the due rows' index), but
/// never the row of the highest `Seq`. `Seq` is SQLite's rowid (`INTEGER
/// PRIMARY KEY`): a new row takes one past the highest kept, so the top
/// row kept for good is what makes a new announcement's `sequence` greater
/// than every one sent before, whatever the purge deleted
/// (`AUTOINCREMENT` would do it with a write to `sqlite_sequence` in every
/// execution's commit; this costs one row).
/// The unsent rows' delete (no destination): `?1` the retention as a date
/// modifier, `?2` the most rows; found on the due rows' index
/// (`IX_Outbox_Due`, a test reads the plan), oldest due first.
fn purge_unsent_sql() -> String {
    format!(
        "DELETE FROM Outbox
          WHERE Seq IN (SELECT Seq FROM Outbox
                         WHERE DispatchedAt IS NULL AND NextAttemptAt < {}
                           AND Parked = 0 AND LeaseUntil <= {NOW}
                           AND Seq < (SELECT MAX(Seq) FROM Outbox)
                         ORDER BY NextAttemptAt, Seq LIMIT ?2)",
        now_plus(1)
    )
}

/// The retention's purge; the watermark (`OutboxPurge`) raised to the
/// newest `ExecutedAt` it deleted, in the same call (one writer call: one
/// transaction).
pub(super) fn purge(
    conn: &Connection,
    retention: Duration,
    limit: u32,
    expired: Expired,
) -> Result<u64, rusqlite::Error> {
    let sent = format!(
        "DELETE FROM Outbox
          WHERE Seq IN (SELECT Seq FROM Outbox
                         WHERE DispatchedAt IS NOT NULL AND DispatchedAt < {}
                           AND Seq < (SELECT MAX(Seq) FROM Outbox)
                         ORDER BY DispatchedAt LIMIT ?2)
         RETURNING ExecutedAt",
        now_plus(1)
    );
    let mut gone = deleted_executions(conn, &sent, &modifier(retention, '-'), limit)?;
    let left = limit.saturating_sub(gone.count);
    if expired == Expired::SentAndUnsent && left > 0 {
        let unsent = format!("{} RETURNING ExecutedAt", purge_unsent_sql());
        let more = deleted_executions(conn, &unsent, &modifier(retention, '-'), left)?;
        gone.count += more.count;
        gone.newest = gone.newest.max(more.newest);
    }
    if let Some(newest) = &gone.newest {
        conn.prepare_cached(
            "INSERT INTO OutboxPurge (Id, ExecutedThrough) VALUES (1, ?1)
             ON CONFLICT (Id) DO UPDATE
                SET ExecutedThrough = max(ExecutedThrough, excluded.ExecutedThrough)",
        )?
        .execute([newest])?;
        prune_epochs(conn)?;
    }
    Ok(gone.count.into())
}

/// The epochs no kept row needs deleted: those below the one covering the
/// lowest `Seq` kept (every kept row's epoch is that one or later), and
/// raised over an hour ago (a margin no transaction's row stays unwritten
/// for). The newest always stays.
fn prune_epochs(conn: &Connection) -> Result<usize, rusqlite::Error> {
    conn.prepare_cached(
        "DELETE FROM OutboxEpoch
          WHERE Epoch < (SELECT MAX(Epoch) FROM OutboxEpoch
                          WHERE FirstSeq <= (SELECT COALESCE(MIN(Seq), 9223372036854775807)
                                               FROM Outbox))
            AND Epoch < CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) - 3600000",
    )?
    .execute([])
}

/// What one of the purge's deletes took: how many rows, and the newest
/// `ExecutedAt` among them (times compare as text: one format).
struct Gone {
    count: u32,
    newest: Option<String>,
}

fn deleted_executions(
    conn: &Connection,
    delete: &str,
    before: &str,
    limit: u32,
) -> Result<Gone, rusqlite::Error> {
    let mut statement = conn.prepare_cached(delete)?;
    let mut rows = statement.query(params![before, limit])?;
    let mut gone = Gone {
        count: 0,
        newest: None,
    };
    while let Some(row) = rows.next()? {
        let executed: String = row.get(0)?;
        gone.count += 1;
        if gone.newest.as_ref().is_none_or(|n| executed > *n) {
            gone.newest = Some(executed);
        }
    }
    Ok(gone)
}

/// `outbox backfill`: the orders executed `within` ago or later that have
/// no announcement (executed by an earlier version, which wrote none) get
/// one, as their execution would have written it, oldest first (so their
/// new `Seq`s follow their execution order); with `write` false only
/// counted. In one writer call, so no execution lands between the read
/// and the writes: each `PositionAfter` is the position now walked back
/// through the position's executions since then ([`walk_back`], which the
/// announced ones' rows, `Seq` and `PositionAfter`, place exactly).
/// Answers how many.
pub(super) fn backfill(
    conn: &Connection,
    within: Duration,
    write: bool,
) -> Result<u64, rusqlite::Error> {
    let since: String = conn.query_row(
        &format!("SELECT {}", now_plus(1)),
        [modifier(within, '-')],
        |r| r.get(0),
    )?;
    // The executions since `since` of every position that has one without
    // an announcement, by position: each with its millisecond's rank
    // (`Tie`), its `Orders.Id`, its announcement's `Seq` and
    // `PositionAfter` if it has one, and the position now.
    let mut select = conn.prepare(
        "SELECT o.AccountId, o.Symbol, o.OrderId, o.Side, o.Quantity, o.Id,
                DENSE_RANK() OVER (ORDER BY o.ExecutedAt) AS Tie,
                x.Seq, x.PositionAfter, COALESCE(p.Quantity, '0')
           FROM Orders AS o
           LEFT JOIN Outbox AS x
                  ON x.Seq = (SELECT MIN(y.Seq) FROM Outbox AS y WHERE y.OrderId = o.OrderId)
           LEFT JOIN Positions AS p ON p.AccountId = o.AccountId AND p.Symbol = o.Symbol
          WHERE o.Status = 'Executed' AND o.ExecutedAt >= ?1
            AND EXISTS (SELECT 1 FROM Orders AS u
                         WHERE u.AccountId = o.AccountId AND u.Symbol = o.Symbol
                           AND u.Status = 'Executed' AND u.ExecutedAt >= ?1
                           AND NOT EXISTS (SELECT 1 FROM Outbox AS v WHERE v.OrderId = u.OrderId))
          ORDER BY o.AccountId, o.Symbol",
    )?;
    struct Row {
        position: (String, String),
        order_id: String,
        executed: Executed,
        now: String,
    }
    let rows: Vec<Row> = select
        .query_map([&since], |r| {
            let side: String = r.get(3)?;
            let seq: Option<i64> = r.get(7)?;
            let announced = match seq {
                Some(seq) => Some((seq, position(&r.get::<_, String>(8)?)?)),
                None => None,
            };
            Ok(Row {
                position: (r.get(0)?, r.get(1)?),
                order_id: r.get(2)?,
                executed: Executed {
                    tie: r.get(6)?,
                    id: r.get(5)?,
                    side: side
                        .parse()
                        .map_err(|e: String| super::protocol_error(format!("Orders.Side: {e}")))?,
                    quantity: decimal(&r.get::<_, String>(4)?)?,
                    announced,
                },
                now: r.get(9)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    let count = rows
        .iter()
        .filter(|r| r.executed.announced.is_none())
        .count() as u64;
    if !write || count == 0 {
        return Ok(count);
    }
    // Each position's unannounced executions oldest first, then all of
    // them by millisecond (a stable sort: one position's keep their order).
    let mut due: Vec<(i64, &str, Position)> = Vec::new();
    for group in rows.chunk_by(|a, b| a.position == b.position) {
        let now = position(&group[0].now)?;
        let executions: Vec<Executed> = group.iter().map(|r| r.executed.clone()).collect();
        let placed = walk_back(now, &executions).ok_or_else(|| {
            super::protocol_error(format!(
                "the executions of account {:?} in {:?} do not lead to its position {now}",
                group[0].position.0, group[0].position.1
            ))
        })?;
        due.extend(
            placed
                .into_iter()
                .map(|(i, after)| (group[i].executed.tie, group[i].order_id.as_str(), after)),
        );
    }
    due.sort_by_key(|(tie, _, _)| *tie);
    let now = super::instant_text(std::time::SystemTime::now());
    let mut insert = conn.prepare(
        "INSERT INTO Outbox (MessageId, Kind, OrderId, AccountId, Side, Symbol, Quantity,
                             PositionAfter, Fingerprint, ExecutedAt, CreatedAt, NextAttemptAt,
                             LeaseUntil)
         SELECT ?1, ?2, OrderId, AccountId, Side, Symbol, Quantity, ?3, Fingerprint, ExecutedAt,
                ?4, ?4, ?4
           FROM Orders WHERE OrderId = ?5",
    )?;
    let mut written = 0;
    for (_, id, after) in &due {
        written += insert.execute(params![
            message_id(id),
            ORDER_EXECUTED,
            after.to_string(),
            now,
            id
        ])?;
    }
    Ok(written as u64)
}

pub(super) fn list(
    conn: &Connection,
    listing: &Listing,
    limit: u32,
) -> Result<Vec<Announcement>, rusqlite::Error> {
    let (filter, id) = match listing {
        Listing::Undispatched => ("DispatchedAt IS NULL", None),
        // A scan of the kept rows: the message id's index holds undispatched
        // rows only (sql/sqlite/schema.sql says why). Only an operator's
        // `status ORDER_ID` asks, on a read connection of its own, off the
        // writer (`SqliteStore::read`).
        Listing::Order(id) => ("MessageId = ?2", Some(message_id(id))),
        Listing::Message(id) => ("MessageId = ?2", Some(id.clone())),
    };
    let mut stmt = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM Outbox WHERE {filter} ORDER BY Seq LIMIT ?1"
    ))?;
    let rows = match id {
        Some(id) => stmt.query_map(params![limit, id.as_str()], row)?.collect(),
        None => stmt.query_map(params![limit], row)?.collect(),
    };
    rows
}

pub(super) fn counts(conn: &Connection) -> Result<OutboxCounts, rusqlite::Error> {
    conn.query_row(
        "SELECT COALESCE(SUM(DispatchedAt IS NULL), 0),
                COALESCE(SUM(DispatchedAt IS NULL AND Parked <> 0), 0),
                COALESCE(SUM(DispatchedAt IS NOT NULL), 0),
                (SELECT ExecutedThrough FROM OutboxPurge WHERE Id = 1)
           FROM Outbox",
        [],
        |r| {
            Ok(OutboxCounts {
                undispatched: r.get::<_, i64>(0)? as u64,
                parked: r.get::<_, i64>(1)? as u64,
                dispatched: r.get::<_, i64>(2)? as u64,
                purged_through: r.get(3)?,
            })
        },
    )
}

pub(super) fn retry(conn: &Connection, id: Option<&str>) -> Result<u64, rusqlite::Error> {
    let changed = conn
        .prepare_cached(&format!(
            "UPDATE Outbox SET Parked = 0, NextAttemptAt = {NOW}
              WHERE DispatchedAt IS NULL AND (?1 IS NULL OR MessageId = ?1)"
        ))?
        .execute([id])?;
    Ok(changed as u64)
}

/// Dispatched rows made undispatched and due now, unparked, with their
/// lease ended: the claim takes them as it takes any due row.
pub(super) fn resend(conn: &Connection, which: &Resend) -> Result<u64, rusqlite::Error> {
    const SET: &str = "UPDATE Outbox SET DispatchedAt = NULL, Parked = 0, LastError = NULL";
    let changed = match which {
        Resend::Message(id) => conn
            .prepare_cached(&format!(
                "{SET}, NextAttemptAt = {NOW}, LeaseUntil = {NOW}
                  WHERE DispatchedAt IS NOT NULL AND MessageId = ?1"
            ))?
            .execute([id])?,
        Resend::DispatchedWithin(age) => conn
            .prepare_cached(&format!(
                "{SET}, NextAttemptAt = {NOW}, LeaseUntil = {NOW}
                  WHERE DispatchedAt IS NOT NULL AND DispatchedAt >= {}",
                now_plus(1)
            ))?
            .execute([modifier(*age, '-')])?,
    };
    Ok(changed as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A migrated database in memory holding one row per `(order, due)`:
    /// undispatched, due since `due` (a SQLite date modifier), in order.
    fn outbox_of(rows: &[(&str, &str)]) -> Connection {
        let mut conn = Connection::open_in_memory().unwrap();
        super::super::schema::migrate(&mut conn).unwrap();
        for (order, due) in rows {
            conn.execute(
                &format!(
                    "INSERT INTO Outbox (MessageId, Kind, OrderId, AccountId, Side, Symbol,
                         Quantity, PositionAfter, Fingerprint, ExecutedAt, CreatedAt,
                         NextAttemptAt, LeaseUntil)
                     VALUES (?1, 'OrderExecuted', ?2, 'a', 'buy', 's', '1', '1', 'f', {NOW},
                             {NOW}, strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?3), {NOW})"
                ),
                params![message_id(order), order, due],
            )
            .unwrap();
        }
        conn
    }

    fn orders(conn: &Connection) -> Vec<String> {
        let mut select = conn
            .prepare("SELECT OrderId FROM Outbox ORDER BY Seq")
            .unwrap();
        let orders = select
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        orders
    }

    /// With no destination, the rows due past the retention and never
    /// sent go, oldest due first, up to the limit; parked and leased ones
    /// stay; and never the row of the highest `Seq`, the sequence's mark,
    /// even when it too is past the retention.
    #[test]
    fn the_unsent_purge_keeps_parked_leased_and_the_sequences_mark() {
        let day = Duration::from_secs(86_400);
        let conn = outbox_of(&[
            ("old", "-3 days"),
            ("older", "-4 days"),
            ("parked", "-3 days"),
            ("leased", "-3 days"),
            ("recent", "-1 hours"),
            ("last", "-2 days"),
        ]);
        conn.execute_batch(
            "UPDATE Outbox SET Parked = 1 WHERE OrderId = 'parked';
             UPDATE Outbox SET LeaseUntil = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '+1 minutes')
              WHERE OrderId = 'leased';",
        )
        .unwrap();
        assert_eq!(purge(&conn, day, 500, Expired::Sent).unwrap(), 0);
        assert_eq!(purge(&conn, day, 1, Expired::SentAndUnsent).unwrap(), 1);
        assert_eq!(
            orders(&conn),
            ["old", "parked", "leased", "recent", "last"],
            "the oldest due first, one call's limit"
        );
        assert_eq!(purge(&conn, day, 500, Expired::SentAndUnsent).unwrap(), 1);
        assert_eq!(
            orders(&conn),
            ["parked", "leased", "recent", "last"],
            "the last row kept though past the retention: the sequence's mark"
        );
        let top: i64 = conn
            .query_row("SELECT MAX(Seq) FROM Outbox", [], |r| r.get(0))
            .unwrap();
        conn.execute(
            &format!(
                "INSERT INTO Outbox (MessageId, Kind, OrderId, AccountId, Side, Symbol, Quantity,
                     PositionAfter, Fingerprint, ExecutedAt, CreatedAt, NextAttemptAt, LeaseUntil)
                 VALUES ('m', 'OrderExecuted', 'next', 'a', 'buy', 's', '1', '1', 'f', {NOW},
                         {NOW}, {NOW}, {NOW})"
            ),
            [],
        )
        .unwrap();
        assert_eq!(conn.last_insert_rowid(), top + 1);
    }

    /// The unsent rows' purge seeks the due rows' index from its oldest
    /// end, rather than scanning the table an hour at a time.
    #[test]
    fn the_unsent_purge_reads_the_due_rows_index() {
        let conn = outbox_of(&[]);
        let mut explain = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {}", purge_unsent_sql()))
            .unwrap();
        let mut rows = explain.raw_query();
        let mut plan = Vec::new();
        while let Some(r) = rows.next().unwrap() {
            plan.push(r.get::<_, String>(3).unwrap());
        }
        let plan = plan.join("; ");
        assert!(
            plan.contains("USING INDEX IX_Outbox_Due (NextAttemptAt<?)"),
            "{plan}"
        );
    }

    /// The epochs of `conn`, oldest first.
    fn epochs(conn: &Connection) -> Vec<(i64, i64)> {
        let mut select = conn
            .prepare("SELECT Epoch, FirstSeq FROM OutboxEpoch ORDER BY Epoch")
            .unwrap();
        let epochs = select
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        epochs
    }

    fn now_millis() -> i64 {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        i64::try_from(since.as_millis()).unwrap()
    }

    /// A purge deletes the epochs below the one the lowest kept row has,
    /// and keeps that one and every later one: each kept row's epoch is
    /// the same before and after.
    #[test]
    fn a_purge_deletes_the_epochs_no_kept_row_needs() {
        let day = Duration::from_secs(86_400);
        let conn = outbox_of(&[
            ("a", "-3 days"),
            ("b", "-3 days"),
            ("c", "-3 days"),
            ("d", "-1 hours"),
            ("e", "-1 hours"),
        ]);
        conn.execute_batch(
            "INSERT INTO OutboxEpoch (Epoch, FirstSeq)
             VALUES (1000, 1), (2000, 2), (3000, 4), (4000, 5);",
        )
        .unwrap();
        let before: Vec<(i64, Option<i64>)> = (4..=5)
            .map(|seq| (seq, epoch_of(&conn, seq).unwrap()))
            .collect();
        assert_eq!(before, [(4, Some(3000)), (5, Some(4000))]);
        assert_eq!(purge(&conn, day, 500, Expired::SentAndUnsent).unwrap(), 3);
        assert_eq!(epochs(&conn), [(3000, 4), (4000, 5)]);
        let after: Vec<(i64, Option<i64>)> = (4..=5)
            .map(|seq| (seq, epoch_of(&conn, seq).unwrap()))
            .collect();
        assert_eq!(after, before);
    }

    /// An epoch raised within the hour stays, needed or not: a row it
    /// numbered may still be uncommitted in another process.
    #[test]
    fn a_purge_keeps_the_epochs_of_the_last_hour() {
        let day = Duration::from_secs(86_400);
        let conn = outbox_of(&[("a", "-3 days"), ("b", "-3 days"), ("c", "-1 hours")]);
        let recent = now_millis() - 30 * 60 * 1000;
        conn.execute(
            "INSERT INTO OutboxEpoch (Epoch, FirstSeq) VALUES (?1, 1), (?2, 3)",
            [recent, recent + 1],
        )
        .unwrap();
        assert_eq!(purge(&conn, day, 500, Expired::SentAndUnsent).unwrap(), 2);
        assert_eq!(epochs(&conn), [(recent, 1), (recent + 1, 3)]);
    }

    /// A raise covers every `Seq` from one past the highest kept, and
    /// grows past the newest however the clock stands.
    #[test]
    fn a_raise_covers_the_next_seq_and_grows_past_the_newest() {
        let conn = outbox_of(&[("a", "-1 hours"), ("b", "-1 hours")]);
        let first = raise_epoch(&conn).unwrap();
        let second = raise_epoch(&conn).unwrap();
        assert!(second > first, "{first} then {second}");
        assert_eq!(epochs(&conn), [(first, 3), (second, 3)]);
        assert_eq!(
            epoch_of(&conn, 2).unwrap(),
            None,
            "numbered before any epoch"
        );
        assert_eq!(epoch_of(&conn, 3).unwrap(), Some(second));
        let ahead = now_millis() + 3_600_000;
        conn.execute(
            "INSERT INTO OutboxEpoch (Epoch, FirstSeq) VALUES (?1, 3)",
            [ahead],
        )
        .unwrap();
        assert_eq!(
            raise_epoch(&conn).unwrap(),
            ahead + 1,
            "a clock behind the newest"
        );
    }

    #[test]
    fn runs_are_the_consecutive_stretches_of_a_rounds_rows() {
        assert_eq!(runs(&[]), vec![]);
        assert_eq!(runs(&[7]), vec![(7, 7)]);
        assert_eq!(runs(&[3, 4, 5, 6]), vec![(3, 6)]);
        assert_eq!(
            runs(&[9, 3, 4, 11, 5, 10, 20]),
            vec![(3, 5), (9, 11), (20, 20)],
            "unordered, with a row held back between runs"
        );
        assert_eq!(runs(&[4, 4, 5]), vec![(4, 5)], "a duplicate counted once");
        assert_eq!(
            runs(&[i64::MAX - 1, i64::MAX]),
            vec![(i64::MAX - 1, i64::MAX)]
        );
    }
}
