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

/// Starts the explicit transactions of `migrate` and `execute` (sent as a
/// plain batch so the transaction outlives it; later RPCs carry its
/// descriptor).
pub const BEGIN: &str = "BEGIN TRANSACTION";

/// Ends a transaction successfully.
pub const COMMIT: &str = "COMMIT TRANSACTION";

/// Undoes a failed transaction; harmless when the server already rolled it
/// back (a deadlock victim's transaction is gone, for example).
pub const ROLLBACK: &str = "IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION";

/// Run once on every new connection: the row counts `execute` relies on
/// must be reported even if the server's default user options say NOCOUNT.
pub const SESSION_COUNT_ROWS: &str = "SET NOCOUNT OFF";

/// Run once on every new connection: a failed statement (the unique
/// violation of a racing position insert) must end only that statement, not
/// the whole transaction, whatever the server's default.
pub const SESSION_NO_XACT_ABORT: &str = "SET XACT_ABORT OFF";

/// Connection health check used by the pool.
pub const PING: &str = "SELECT 1";

/// `accept`: insert the order `Received`. A duplicate id fails on the unique
/// index (2601/2627) and is then classified from the existing row.
/// P1 OrderId, P2 Fingerprint, P3 EventId, P4 AccountId, P5 Side, P6 Symbol,
/// P7 Quantity, P8 LimitPrice, P9 Currency, P10 PlacedAt.
pub const INSERT_ORDER: &str = "INSERT INTO dbo.Orders \
     (OrderId, Fingerprint, EventId, AccountId, Side, Symbol, Quantity, LimitPrice, \
      Currency, PlacedAt, Status, Attempts, ReceivedAt) \
     VALUES (@P1, @P2, @P3, @P4, @P5, @P6, @P7, @P8, @P9, @P10, N'Received', 1, SYSUTCDATETIME())";

/// The order row by id (P1). Timestamps come back as ISO 8601 text (style
/// 126) so the store needs no date/time crate feature; they are UTC.
pub const SELECT_ORDER: &str = "SELECT OrderId, Fingerprint, AccountId, Side, Symbol, \
     Quantity, LimitPrice, Currency, Status, Attempts, \
     CONVERT(NVARCHAR(40), ReceivedAt, 126) AS ReceivedAt, \
     CONVERT(NVARCHAR(40), ExecutedAt, 126) AS ExecutedAt \
     FROM dbo.Orders WHERE OrderId = @P1";

/// `accept` found the same order still `Received` (a crashed worker's row):
/// count the attempt. P1 OrderId.
pub const RESUME_ORDER: &str = "UPDATE dbo.Orders SET Attempts = Attempts + 1 \
     WHERE OrderId = @P1 AND Status = N'Received'";

/// `execute`, step 1: the forward-only transition. Only the caller that
/// changes exactly one row applies the effect. P1 OrderId.
pub const MARK_EXECUTED: &str = "UPDATE dbo.Orders \
     SET Status = N'Executed', ExecutedAt = SYSUTCDATETIME() \
     WHERE OrderId = @P1 AND Status = N'Received'";

/// `execute`, step 2: add the signed quantity to an existing position. The
/// arithmetic happens in the UPDATE under its exclusive row lock, so two
/// transactions can never lose each other's change. P1 AccountId, P2 Symbol,
/// P3 signed quantity.
pub const ADD_TO_POSITION: &str = "UPDATE dbo.Positions \
     SET Quantity = Quantity + @P3, UpdatedAt = SYSUTCDATETIME() \
     WHERE AccountId = @P1 AND Symbol = @P2";

/// `execute`, step 2 when no position row existed. A concurrent first trade
/// makes one of the two inserts fail on the primary key (2627); that one
/// then runs [`ADD_TO_POSITION`] again. P1 AccountId, P2 Symbol, P3 quantity.
pub const INSERT_POSITION: &str =
    "INSERT INTO dbo.Positions (AccountId, Symbol, Quantity, UpdatedAt) \
     VALUES (@P1, @P2, @P3, SYSUTCDATETIME())";

/// The net position. P1 AccountId, P2 Symbol.
pub const SELECT_POSITION: &str =
    "SELECT Quantity FROM dbo.Positions WHERE AccountId = @P1 AND Symbol = @P2";

/// `reject`: keep the event once, keyed by its hash (unique index).
/// P1 EventHash, P2 Kind, P3 OrderId, P4 EventId, P5 Reason, P6 Fingerprint,
/// P7 ExistingFingerprint, P8 RawEvent.
pub const INSERT_REJECTED: &str = "INSERT INTO dbo.RejectedEvents \
     (EventHash, Kind, OrderId, EventId, Reason, Fingerprint, ExistingFingerprint, RawEvent, \
      Deliveries, FirstSeenAt, LastSeenAt) \
     VALUES (@P1, @P2, @P3, @P4, @P5, @P6, @P7, @P8, 1, SYSUTCDATETIME(), SYSUTCDATETIME())";

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

/// Every statement above, for the parse check in `tests/sqlserver.rs`.
pub const ALL: &[&str] = &[
    LOCK_SCHEMA,
    BEGIN,
    COMMIT,
    ROLLBACK,
    SESSION_COUNT_ROWS,
    SESSION_NO_XACT_ABORT,
    PING,
    INSERT_ORDER,
    SELECT_ORDER,
    RESUME_ORDER,
    MARK_EXECUTED,
    ADD_TO_POSITION,
    INSERT_POSITION,
    SELECT_POSITION,
    INSERT_REJECTED,
    COUNT_REJECTED_DELIVERY,
    SELECT_REJECTIONS,
    SELECT_REJECTIONS_WITHOUT_ORDER,
];
