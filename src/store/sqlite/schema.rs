//! The SQLite schema (`sql/sqlite/schema.sql`) and what `migrate` changes
//! in a file an earlier version made.

use rusqlite::Connection;

const SCHEMA: &str = include_str!("../../../sql/sqlite/schema.sql");

/// Outbox indexes an earlier version made over every row and this one makes
/// partial (over the rows their queries read). A full one took each new,
/// undispatched row into an index of every row kept for the retention (at
/// its far left, or for the message id at a random place): with a million
/// rows in the table that slowed the purge threefold and the first rounds
/// of first deliveries after a start (docs/benchmarks.md).
const MADE_PARTIAL: [&str; 4] = [
    "UX_Outbox_MessageId",
    "IX_Outbox_DispatchedAt",
    "IX_Outbox_Due",
    "IX_Outbox_ClaimToken",
];

/// Make or complete the schema in one transaction: an index of
/// [`MADE_PARTIAL`] still in its full form is dropped first, so the
/// schema's `CREATE INDEX IF NOT EXISTS` makes it again, partial (one scan
/// of the table each, once). An earlier version's migrate finds the names
/// and leaves the partial ones be; its queries carry the same filters, so
/// they use them (all but the look-up of one order's announcement,
/// `status ORDER_ID`, which scans).
pub(super) fn migrate(conn: &mut Connection) -> Result<(), rusqlite::Error> {
    let tx = conn.savepoint()?;
    for name in MADE_PARTIAL {
        let full: bool = tx.query_row(
            "SELECT COUNT(*) FROM sqlite_master
              WHERE type = 'index' AND name = ?1 AND instr(upper(sql), ' WHERE ') = 0",
            [name],
            |r| r.get::<_, i64>(0).map(|n| n > 0),
        )?;
        if full {
            tx.execute_batch(&format!("DROP INDEX {name}"))?;
        }
    }
    tx.execute_batch(SCHEMA)?;
    tx.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index_sql(conn: &Connection, name: &str) -> String {
        conn.query_row(
            "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = ?1",
            [name],
            |r| r.get(0),
        )
        .unwrap()
    }

    fn plan(conn: &Connection, query: &str) -> String {
        let mut stmt = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {query}"))
            .unwrap();
        // Parameters left unbound (NULL): the plan does not depend on them.
        let mut rows = stmt.raw_query();
        let mut steps = Vec::new();
        while let Some(r) = rows.next().unwrap() {
            steps.push(r.get::<_, String>(3).unwrap());
        }
        steps.join("; ")
    }

    /// A file with the earlier full indexes and rows in its outbox: migrate
    /// makes the four partial, keeps every row, and the queries of the
    /// claim, the purge, the mark, the defer and an earlier version's
    /// read-back by claim use them.
    #[test]
    fn migrate_makes_the_earlier_full_outbox_indexes_partial() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = Connection::open(dir.path().join("orders.db")).unwrap();
        migrate(&mut conn).unwrap();
        conn.execute_batch(
            "DROP INDEX UX_Outbox_MessageId; DROP INDEX IX_Outbox_DispatchedAt;
             DROP INDEX IX_Outbox_Due; DROP INDEX IX_Outbox_ClaimToken;
             CREATE UNIQUE INDEX UX_Outbox_MessageId ON Outbox (MessageId);
             CREATE INDEX IX_Outbox_DispatchedAt ON Outbox (DispatchedAt, Seq);
             CREATE INDEX IX_Outbox_Due ON Outbox (DispatchedAt, NextAttemptAt, Seq);
             CREATE INDEX IX_Outbox_ClaimToken ON Outbox (ClaimToken);
             INSERT INTO Outbox (MessageId, Kind, OrderId, AccountId, Side, Symbol, Quantity,
                 PositionAfter, Fingerprint, ExecutedAt, CreatedAt, NextAttemptAt,
                 LeaseUntil, DispatchedAt)
             VALUES ('m1', 'OrderExecuted', 'o1', 'a', 'buy', 'MSFT', '1', '1', 'v2:x',
                     't', 't', 't', 't', 't'),
                    ('m2', 'OrderExecuted', 'o2', 'a', 'buy', 'MSFT', '1', '2', 'v2:x',
                     't', 't', 't', 't', NULL);",
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        // Each over the rows its queries read: a new, undispatched row
        // (both NULL) is in the claim's and the message id's only.
        for (name, filter) in MADE_PARTIAL.iter().zip([
            "WHERE DispatchedAt IS NULL",
            "WHERE DispatchedAt IS NOT NULL",
            "WHERE DispatchedAt IS NULL",
            "WHERE ClaimToken IS NOT NULL",
        ]) {
            let sql = index_sql(&conn, name);
            assert!(
                sql.ends_with(filter),
                "{name} is not partial on `{filter}`: {sql}"
            );
        }
        let rows: i64 = conn
            .query_row("SELECT COUNT(*) FROM Outbox", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 2);
        let claim = plan(
            &conn,
            "SELECT Seq FROM Outbox WHERE DispatchedAt IS NULL AND NextAttemptAt <= 'z'
               AND Parked = 0 AND LeaseUntil <= 'z' ORDER BY NextAttemptAt, Seq LIMIT 10",
        );
        assert!(claim.contains("IX_Outbox_Due"), "the claim: {claim}");
        let purge = plan(
            &conn,
            "SELECT Seq FROM Outbox WHERE DispatchedAt IS NOT NULL AND DispatchedAt < 'z'
              ORDER BY DispatchedAt LIMIT 10",
        );
        assert!(
            purge.contains("IX_Outbox_DispatchedAt"),
            "the purge: {purge}"
        );
        // The dispatcher's defer, as outbox.rs prepares it, and an earlier
        // version's mark: by message id among undispatched rows. This
        // version's mark finds its rows by `Seq`.
        for (what, query) in [
            ("the defer", super::super::outbox::defer_sql()),
            (
                "an earlier version's mark",
                "UPDATE Outbox SET DispatchedAt = ?2, LeaseUntil = ?2
                  WHERE MessageId = ?1 AND DispatchedAt IS NULL"
                    .to_string(),
            ),
        ] {
            let by_id = plan(&conn, &query);
            assert!(by_id.contains("UX_Outbox_MessageId"), "{what}: {by_id}");
        }
        let mark = plan(&conn, &super::super::outbox::mark_sql());
        assert!(
            mark.contains("USING INTEGER PRIMARY KEY"),
            "the mark: {mark}"
        );
        let read_back = plan(
            &conn,
            "SELECT Seq FROM Outbox WHERE ClaimToken = 'c' AND DispatchedAt IS NULL ORDER BY Seq",
        );
        assert!(
            read_back.contains("IX_Outbox_ClaimToken") || read_back.contains("IX_Outbox_Due"),
            "an earlier version's read-back by claim scans the table: {read_back}"
        );
        // Migrating again changes nothing.
        let before: Vec<String> = MADE_PARTIAL.iter().map(|n| index_sql(&conn, n)).collect();
        migrate(&mut conn).unwrap();
        let after: Vec<String> = MADE_PARTIAL.iter().map(|n| index_sql(&conn, n)).collect();
        assert_eq!(before, after);
    }
}
