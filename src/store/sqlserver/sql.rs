//! Every T-SQL statement the SQL Server store sends, in one place.
//!
//! Why one file: `tests/sqlserver.rs` parses each of them (and every batch
//! of the schema) with `sqlparser`'s `MsSqlDialect` in every test run, so a
//! syntax slip fails CI even where no server is available. Anything sent to
//! the server must be listed in [`ALL`] or come from [`schema_batches`].
//!
//! Rules (docs/protocol.md 7.4): parameters only (`@P1`…, tiberius sends them
//! through `sp_executesql`), portable T-SQL (no MERGE, no CREATE OR ALTER, no
//! SERIALIZABLE/REPEATABLE READ, no ROWVERSION, no `sys.dm_*`), and no
//! `UPDATE … OUTPUT` at all, so the unqualified-column pitfall cannot arise.
//! Everything here runs unchanged on SQL Server, Azure SQL and Babelfish
//! (the CI's engine).
//!
//! **No NULL parameter is ever sent.** tiberius sends a `None` as an untyped
//! NULL (TDS type 0x1F), which SQL Server tolerates and stricter engines
//! refuse (error 8009). An optional value therefore travels as a typed value
//! that can never be a real one, and the statement turns it back into NULL:
//! `NULLIF(@Pn, N'')` for text (every optional text we store is non-empty
//! when present), `NULLIF(@Pn, 0)` for the limit price (always > 0).

/// The schema, idempotent, batches separated by lines holding only `GO`.
pub const SCHEMA: &str = include_str!("../../../sql/sqlserver/schema.sql");

/// The schema split into the batches sent one by one during `migrate`: the
/// text between `GO` lines, without empty or comment-only batches.
pub fn schema_batches() -> Vec<&'static str> {
    let mut batches = Vec::new();
    let mut start = 0;
    let mut offset = 0;
    for line in SCHEMA.split_inclusive('\n') {
        if line.trim().eq_ignore_ascii_case("GO") {
            batches.push(&SCHEMA[start..offset]);
            start = offset + line.len();
        }
        offset += line.len();
    }
    batches.push(&SCHEMA[start..]);
    batches
        .into_iter()
        .map(str::trim)
        .filter(|b| {
            b.lines()
                .any(|l| !l.trim().is_empty() && !l.trim().starts_with("--"))
        })
        .collect()
}

/// Serializes `migrate` across processes: an exclusive application lock owned
/// by the migration's transaction, released by its COMMIT or ROLLBACK. It
/// waits without a server-side limit (`-1`); the client's query timeout
/// bounds the wait and closes the connection, which releases everything.
pub const LOCK_SCHEMA: &str = "EXEC sp_getapplock @Resource = N'order-guard:schema', \
     @LockMode = N'Exclusive', @LockOwner = N'Transaction', @LockTimeout = -1";

/// The schema version this build writes (the last batch of [`SCHEMA`]).
pub const SCHEMA_VERSION: i32 = 2;

/// `migrate`'s fast path, one round trip without locks: 1 when the current
/// version's row is there (written last, in the migration's transaction, so
/// everything before it is there too). A start, a restart or a scale-out
/// then costs one query instead of queueing on the migration's lock.
/// P1 the version.
pub const SCHEMA_IS_CURRENT: &str = "IF OBJECT_ID(N'dbo.SchemaVersion', N'U') IS NULL \
     SELECT 0 AS IsCurrent \
     ELSE SELECT COUNT(*) AS IsCurrent FROM dbo.SchemaVersion WHERE Version = @P1";

/// Starts the explicit transactions of `migrate` and `execute` (sent as a
/// plain batch so the transaction outlives it; later RPCs carry its
/// descriptor).
pub const BEGIN: &str = "BEGIN TRANSACTION";

/// Ends a transaction and says how many are still open, in one round trip.
/// A transaction is never assumed to be over: anything but 0 means the
/// COMMIT did not end it, and the connection is discarded (closing it rolls
/// the transaction back) instead of going back to the pool.
pub const COMMIT_AND_COUNT: &str = "COMMIT TRANSACTION; SELECT @@TRANCOUNT AS OpenTransactions";

/// Ends a transaction that must not take effect (the order was not
/// `Received` any more), checked the same way. Harmless when the server
/// already rolled it back.
pub const ROLLBACK_AND_COUNT: &str =
    "IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION; SELECT @@TRANCOUNT AS OpenTransactions";

/// Run once on every new connection: the row counts `execute` relies on
/// must be reported even if the server's default user options say NOCOUNT.
pub const SESSION_COUNT_ROWS: &str = "SET NOCOUNT OFF";

/// Run once on every new connection: any error inside a transaction ends
/// the whole transaction (rolled back), never just the statement, so no
/// transaction can go on half-applied. The store also never sends another
/// statement after an error inside a transaction: it discards the connection.
pub const SESSION_XACT_ABORT: &str = "SET XACT_ABORT ON";

/// The pool's check of a connection that sat idle: alive, and no
/// transaction left open on it.
pub const OPEN_TRANSACTIONS: &str = "SELECT @@TRANCOUNT AS OpenTransactions";

/// `accept`: insert the order `Received`. A duplicate id fails on the unique
/// index (2601/2627) and is then classified from the existing row.
/// P1 OrderId, P2 Fingerprint, P3 EventId, P4 AccountId, P5 Side, P6 Symbol,
/// P7 Quantity, P8 LimitPrice (0: none), P9 Currency (empty: none),
/// P10 PlacedAt (empty: none).
pub const INSERT_ORDER: &str = "INSERT INTO dbo.Orders \
     (OrderId, Fingerprint, EventId, AccountId, Side, Symbol, Quantity, LimitPrice, \
      Currency, PlacedAt, Status, Attempts, ReceivedAt) \
     VALUES (@P1, @P2, @P3, @P4, @P5, @P6, @P7, NULLIF(@P8, 0), NULLIF(@P9, N''), \
      NULLIF(@P10, N''), N'Received', 1, SYSUTCDATETIME())";

/// The order row by id (P1). Timestamps come back as ISO 8601 text (style
/// 126) so the store needs no date/time crate feature; they are UTC.
pub const SELECT_ORDER: &str = "SELECT OrderId, Fingerprint, AccountId, Side, Symbol, \
     Quantity, LimitPrice, Currency, Status, Attempts, \
     CONVERT(NVARCHAR(40), ReceivedAt, 126) AS ReceivedAt, \
     CONVERT(NVARCHAR(40), ExecutedAt, 126) AS ExecutedAt, PlacedAt \
     FROM dbo.Orders WHERE OrderId = @P1";

/// `accept` found the same order still `Received` (a crashed worker's row):
/// count the attempt. P1 OrderId.
pub const RESUME_ORDER: &str = "UPDATE dbo.Orders SET Attempts = Attempts + 1 \
     WHERE OrderId = @P1 AND Status = N'Received'";

/// `execute`, step 1 (first in its transaction): claim the order. An UPDATE
/// that changes no value but takes the row's exclusive lock, held to the
/// end of the transaction, and only on a `Received` row: 1 row means this
/// transaction alone decides the order; 0 means it is not `Received` (or
/// not there). An UPDATE rather than a lock hint: Babelfish accepts and
/// ignores table hints such as UPDLOCK. The order row is locked before the
/// position row, as every `execute` of this and earlier versions does, so
/// two of them never wait for each other in a cycle. P1 OrderId.
pub const CLAIM_ORDER: &str = "UPDATE dbo.Orders SET Attempts = Attempts \
     WHERE OrderId = @P1 AND Status = N'Received'";

/// `execute`, step 2: lock the position row (same UPDATE-for-a-lock as
/// [`CLAIM_ORDER`]) and read it. The new value is computed in Rust from this
/// read: T-SQL's `DECIMAL(38,10) + DECIMAL(p,10)` has precision 39, which
/// SQL Server cuts to scale 9 or less (rounding), and Babelfish differs
/// again. Holding the row's lock, the read sees the last committed value
/// under READ COMMITTED and READ_COMMITTED_SNAPSHOT alike, and nobody can
/// change it before this transaction ends. P1 AccountId, P2 Symbol.
pub const LOCK_AND_READ_POSITION: &str = "UPDATE dbo.Positions SET UpdatedAt = SYSUTCDATETIME() \
     WHERE AccountId = @P1 AND Symbol = @P2; \
     SELECT Quantity FROM dbo.Positions WHERE AccountId = @P1 AND Symbol = @P2";

/// `execute`, step 3 when the new position fits: the forward-only
/// transition (1 row: the claim holds the row). P1 OrderId.
pub const MARK_EXECUTED: &str = "UPDATE dbo.Orders \
     SET Status = N'Executed', ExecutedAt = SYSUTCDATETIME() \
     WHERE OrderId = @P1 AND Status = N'Received'";

/// `execute`, step 3 when the position would overflow: `Received →
/// Rejected`, no effect; the event is stored in the same transaction
/// ([`COUNT_REJECTED_DELIVERY`], else [`INSERT_REJECTED`]). P1 OrderId.
pub const MARK_REJECTED: &str = "UPDATE dbo.Orders SET Status = N'Rejected' \
     WHERE OrderId = @P1 AND Status = N'Received'";

/// `execute`, before its transaction: make sure the position row exists, so
/// the transaction never has to survive an error. Two first trades racing
/// here make one INSERT fail on the primary key (2627), which means the row
/// exists: the caller ignores it. A row created here for an order that then
/// does not execute holds 0. P1 AccountId, P2 Symbol.
pub const ENSURE_POSITION: &str =
    "INSERT INTO dbo.Positions (AccountId, Symbol, Quantity, UpdatedAt) \
     SELECT @P1, @P2, 0, SYSUTCDATETIME() \
     WHERE NOT EXISTS (SELECT 1 FROM dbo.Positions WHERE AccountId = @P1 AND Symbol = @P2)";

/// `execute`, step 4 after [`MARK_EXECUTED`]: write the new position,
/// computed exactly in Rust (a `DECIMAL(38,10)` parameter, no arithmetic
/// in T-SQL). P1 AccountId, P2 Symbol, P3 the new quantity.
pub const SET_POSITION: &str = "UPDATE dbo.Positions \
     SET Quantity = @P3, UpdatedAt = SYSUTCDATETIME() \
     WHERE AccountId = @P1 AND Symbol = @P2";

/// The net position. P1 AccountId, P2 Symbol.
pub const SELECT_POSITION: &str =
    "SELECT Quantity FROM dbo.Positions WHERE AccountId = @P1 AND Symbol = @P2";

/// `reject`: keep the event once, keyed by its hash (unique index).
/// P1 EventHash, P2 Kind, P3 OrderId, P4 EventId, P5 Reason, P6 Fingerprint,
/// P7 ExistingFingerprint, P8 RawEvent; an empty P3, P4, P6 or P7 is stored
/// as NULL.
pub const INSERT_REJECTED: &str = "INSERT INTO dbo.RejectedEvents \
     (EventHash, Kind, OrderId, EventId, Reason, Fingerprint, ExistingFingerprint, RawEvent, \
      Deliveries, FirstSeenAt, LastSeenAt) \
     VALUES (@P1, @P2, NULLIF(@P3, N''), NULLIF(@P4, N''), @P5, NULLIF(@P6, N''), \
      NULLIF(@P7, N''), @P8, 1, SYSUTCDATETIME(), SYSUTCDATETIME())";

/// `reject` of an event already kept: count the delivery. P1 EventHash.
pub const COUNT_REJECTED_DELIVERY: &str = "UPDATE dbo.RejectedEvents \
     SET Deliveries = Deliveries + 1, LastSeenAt = SYSUTCDATETIME() \
     WHERE EventHash = @P1";

/// Rejected events of one order, oldest first. P1 OrderId.
pub const SELECT_REJECTIONS: &str = "SELECT Kind, OrderId, Reason, Fingerprint, \
     ExistingFingerprint, RawEvent, Deliveries \
     FROM dbo.RejectedEvents WHERE OrderId = @P1 ORDER BY Id";

/// Rejected events that carried no usable order id, oldest first.
pub const SELECT_REJECTIONS_WITHOUT_ORDER: &str = "SELECT Kind, OrderId, Reason, Fingerprint, \
     ExistingFingerprint, RawEvent, Deliveries \
     FROM dbo.RejectedEvents WHERE OrderId IS NULL ORDER BY Id";

/// This database's identity as made with the schema, and where the
/// database lives now: the server's name and the database's (a copy, a
/// restore as a new database or an import has another name or another
/// server; see `store::bound_identity`).
pub const SELECT_IDENTITY: &str =
    "SELECT TOP 1 Id, CONVERT(NVARCHAR(256), @@SERVERNAME) AS ServerName, \
     CONVERT(NVARCHAR(256), DB_NAME()) AS DatabaseName FROM dbo.StoreIdentity";

/// Sent instead of the COMMIT by the `sqlserver_commit=return(fail)` fault
/// point (tests only): a statement the server fails (8134), which under
/// `XACT_ABORT ON` aborts the transaction, as a failed COMMIT does.
pub const FAULT_FAILING_COMMIT: &str = "SELECT 1 / 0 AS FaultInjectedInsteadOfCommit";

/// Every statement above, for the parse check in `tests/sqlserver.rs`.
pub const ALL: &[&str] = &[
    SCHEMA_IS_CURRENT,
    LOCK_SCHEMA,
    BEGIN,
    COMMIT_AND_COUNT,
    ROLLBACK_AND_COUNT,
    SESSION_COUNT_ROWS,
    SESSION_XACT_ABORT,
    OPEN_TRANSACTIONS,
    INSERT_ORDER,
    SELECT_ORDER,
    RESUME_ORDER,
    CLAIM_ORDER,
    LOCK_AND_READ_POSITION,
    MARK_EXECUTED,
    MARK_REJECTED,
    ENSURE_POSITION,
    SET_POSITION,
    SELECT_POSITION,
    INSERT_REJECTED,
    COUNT_REJECTED_DELIVERY,
    SELECT_REJECTIONS,
    SELECT_REJECTIONS_WITHOUT_ORDER,
    SELECT_IDENTITY,
    FAULT_FAILING_COMMIT,
];
