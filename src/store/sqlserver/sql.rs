//! Every T-SQL statement the SQL Server store sends, in one place.
//!
//! Why one file: `tests/sqlserver.rs` parses each of them (and every batch
//! of the schema) with `sqlparser`'s `MsSqlDialect` in every test run, so a
//! syntax slip fails CI even where no server is available. Anything sent to
//! the server must be listed in [`ALL`] or come from [`schema_batches`].
//!
//! Rules (docs/sqlserver.md, "The portable T-SQL subset"): parameters only (`@P1`…, tiberius sends them
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

/// The procedure's name as a literal, so the statements naming it are
/// built from it (`concat!`) and cannot drift apart when it is renamed.
macro_rules! execute_procedure {
    () => {
        "dbo.OrderGuard_Execute_v2"
    };
}

use std::borrow::Cow;

/// The schema, idempotent, batches separated by lines holding only `GO`.
pub const SCHEMA: &str = include_str!("../../../sql/sqlserver/schema.sql");

/// The line of [`SCHEMA`] where `migrate` converts rows in batches
/// ([`CONVERT_POSITIONS`]): the batches before it run in the migration's
/// first transaction, those after it in its last one, with the version row.
pub const REWRITE_MARKER: &str = "-- order-guard: rows are rewritten here";

/// The batches of one migration, in the order they are sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    /// The first transaction: the cheap schema changes, the role and its
    /// grants, then the execution procedure dropped if there, created and
    /// granted ([`execute_procedure_batches`]).
    pub setup: Vec<Cow<'static, str>>,
    /// The last transaction, after every row is converted: the batches
    /// after [`REWRITE_MARKER`], the version row last.
    pub finish: Vec<Cow<'static, str>>,
}

/// [`SCHEMA`] as [`Migration`]: the text between `GO` lines, without empty
/// or comment-only batches, split at [`REWRITE_MARKER`].
pub fn migration() -> Migration {
    let (before, after) = SCHEMA
        .split_once(REWRITE_MARKER)
        .expect("schema.sql holds the rewrite marker");
    let mut setup = batches_of(before);
    setup.extend(execute_procedure_batches().map(Cow::Owned));
    Migration {
        setup,
        finish: batches_of(after),
    }
}

/// Every batch `migrate` may send from the schema, in order (the parse
/// check in `tests/sqlserver.rs`).
pub fn schema_batches() -> Vec<Cow<'static, str>> {
    let Migration { mut setup, finish } = migration();
    setup.extend(finish);
    setup
}

fn batches_of(text: &'static str) -> Vec<Cow<'static, str>> {
    let mut batches = Vec::new();
    let mut start = 0;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if line.trim().eq_ignore_ascii_case("GO") {
            batches.push(&text[start..offset]);
            start = offset + line.len();
        }
        offset += line.len();
    }
    batches.push(&text[start..]);
    batches
        .into_iter()
        .map(str::trim)
        .filter(|b| {
            b.lines()
                .any(|l| !l.trim().is_empty() && !l.trim().starts_with("--"))
        })
        .map(Cow::Borrowed)
        .collect()
}

/// The procedure `execute` calls ([`EXECUTE_ORDER`]), holding
/// [`EXECUTE_ORDER_BODY`]. A procedure rather than the batch itself: the
/// server parses and plans it once, when `migrate` creates it, instead of on
/// every connection (measured on the CI's engine: the batch sent as text
/// costs its parse on each new connection, and 40 new connections parsing
/// it at once starved the engine; see docs/benchmarks.md). Versioned by
/// name: a later body is a new procedure, so instances of this version keep
/// theirs during a rolling upgrade (version 2 writes the announcement; the
/// `_v1` that schema version 3 made is left in place for the instances of
/// that version still running, whose executions are not announced).
pub const EXECUTE_PROCEDURE: &str = execute_procedure!();

/// The procedure's parameters: the body's `@P1`…`@P21`, typed as the
/// columns they are written to.
const EXECUTE_PARAMETERS: &str = "@P1 NVARCHAR(128), @P2 NVARCHAR(128), @P3 NVARCHAR(MAX), \
     @P4 NVARCHAR(128), @P5 NVARCHAR(8), @P6 NVARCHAR(128), @P7 DECIMAL(28, 10), \
     @P8 DECIMAL(28, 10), @P9 NVARCHAR(16), @P10 NVARCHAR(64), @P11 DECIMAL(38, 0), \
     @P12 NVARCHAR(128), @P13 NVARCHAR(MAX), @P14 NVARCHAR(MAX), @P15 DECIMAL(38, 0), \
     @P16 NVARCHAR(64), @P17 NVARCHAR(64), @P18 NVARCHAR(MAX), @P19 NVARCHAR(MAX), @P20 INT, \
     @P21 NVARCHAR(36)";

/// Drop (when `migrate` runs again on a partly migrated database), create
/// [`EXECUTE_PROCEDURE`] and grant it to [`APP_ROLE`] (a dropped procedure
/// takes its grants with it); `CREATE PROCEDURE` must open its batch, and
/// `CREATE OR ALTER` is not portable.
pub fn execute_procedure_batches() -> [String; 3] {
    [
        format!(
            "IF OBJECT_ID(N'{EXECUTE_PROCEDURE}', N'P') IS NOT NULL DROP PROCEDURE {EXECUTE_PROCEDURE}"
        ),
        format!(
            "CREATE PROCEDURE {EXECUTE_PROCEDURE} {EXECUTE_PARAMETERS}\nAS\nBEGIN\n{EXECUTE_ORDER_BODY}\nEND"
        ),
        format!("GRANT EXECUTE ON {EXECUTE_PROCEDURE} TO {APP_ROLE}"),
    ]
}

/// The call a new connection makes once, before it serves anyone: an
/// empty order id, which the procedure answers `ready` at once, touching no
/// table. It makes the server compile the procedure for the connection
/// inside the paced login (`pool.rs`), not inside the first caller's query
/// timeout: on the CI's engine (Babelfish) each new session compiles it
/// again (0.7 to 2.8 s of CPU, measured on different days:
/// `docs/sqlserver.md`), against about 1.5 ms for a call after it;
/// SQL Server compiles it once for all sessions and answers this in a
/// round trip.
/// Skipped on a database `migrate` has not made it in yet.
pub const WARM_EXECUTE: &str = concat!(
    "IF OBJECT_ID(N'",
    execute_procedure!(),
    "', N'P') IS NOT NULL EXEC ",
    execute_procedure!(),
    " N'', N'', N'', N'', N'', N'', 0, 0, N'', N'', 0, N'', N'', N'', 0, N'', N'', N'', N'', 0, N''"
);

/// What `execute` sends: one call of [`EXECUTE_PROCEDURE`], one round trip.
pub const EXECUTE_ORDER: &str = concat!(
    "EXEC ",
    execute_procedure!(),
    " @P1, @P2, @P3, @P4, @P5, @P6, @P7, @P8, @P9, @P10, @P11, @P12, @P13, @P14, @P15, \
     @P16, @P17, @P18, @P19, @P20, @P21"
);

/// Serializes `migrate` across processes: an exclusive application lock
/// owned by the session (a migration spans several transactions: the
/// schema changes, the row batches, the version row), released by
/// [`UNLOCK_SCHEMA`] or by the session's end (a discarded connection).
/// P1 how long the server may wait for it, in ms. Answers
/// `sp_getapplock`'s result: 0 or 1 granted, below 0 refused (-1 timed
/// out, -2 cancelled, -3 deadlock victim, -999 invalid call), never ignored
/// (`migrate::lock_refused`).
pub const LOCK_SCHEMA: &str = "DECLARE @Result INT; \
     EXEC @Result = sp_getapplock @Resource = N'order-guard:schema', @LockMode = N'Exclusive', \
     @LockOwner = N'Session', @LockTimeout = @P1; \
     SELECT @Result AS Result";

/// Releases [`LOCK_SCHEMA`] once the migration is over.
pub const UNLOCK_SCHEMA: &str =
    "EXEC sp_releaseapplock @Resource = N'order-guard:schema', @LockOwner = N'Session'";

/// The schema version this build writes (the last batch of [`SCHEMA`]).
pub const SCHEMA_VERSION: i32 = 6;

/// `migrate`'s fast path, one round trip without locks: whether the
/// current version's row is there (written last, in the migration's last
/// transaction, so everything before it is there too), and the highest
/// version this user sees (0: none, or SchemaVersion not visible to it).
/// A start, a restart or a scale-out then costs one query instead of
/// queueing on the migration's lock. In the same round trip, when the
/// schema is current (so `StoreIdentity` is there, readable by whoever may
/// read `SchemaVersion`: the same role grants both), the store's identity
/// as [`SELECT_IDENTITY`] reads it (a second result set), so the first
/// completed order of a new instance need not ask. P1 the version.
pub const SCHEMA_STATE: &str = "IF OBJECT_ID(N'dbo.SchemaVersion', N'U') IS NULL \
     SELECT 0 AS IsCurrent, 0 AS Version \
     ELSE SELECT (SELECT COUNT(*) FROM dbo.SchemaVersion WHERE Version = @P1) AS IsCurrent, \
     (SELECT ISNULL(MAX(Version), 0) FROM dbo.SchemaVersion) AS Version; \
     IF OBJECT_ID(N'dbo.SchemaVersion', N'U') IS NOT NULL \
     IF EXISTS (SELECT 1 FROM dbo.SchemaVersion WHERE Version = @P1) \
     SELECT TOP 1 Id, CONVERT(NVARCHAR(256), @@SERVERNAME) AS ServerName, \
     CONVERT(NVARCHAR(256), DB_NAME()) AS DatabaseName FROM dbo.StoreIdentity";

/// One batch of the version 2 → 3 conversion of positions, its own
/// transaction (autocommit): at most P1 rows not converted yet (`Units IS
/// NULL`) get their exact value in units, read through the text of the
/// version-2 value (style 0 writes all ten decimals: `-12.5000000000`
/// becomes `-125000000000`). A row is converted once: it leaves the
/// `WHERE` as it is written. Answers how many rows it converted (0: done).
/// (`UPDATE TOP` would do, but the parse check's dialect does not take it.)
pub const CONVERT_POSITIONS: &str = "UPDATE p \
     SET Units = CONVERT(DECIMAL(38, 0), REPLACE(CONVERT(VARCHAR(64), p.QuantityV2), '.', '')) \
     FROM dbo.Positions AS p \
     JOIN (SELECT TOP (@P1) AccountId, Symbol FROM dbo.Positions WHERE Units IS NULL) AS b \
     ON b.AccountId = p.AccountId AND b.Symbol = p.Symbol \
     WHERE p.Units IS NULL; \
     SELECT @@ROWCOUNT AS Converted";

/// Does the version-2 column wait for [`CONVERT_POSITIONS`]? (1: yes.)
pub const POSITIONS_TO_CONVERT: &str = "SELECT COUNT(*) AS Pending FROM sys.columns \
     WHERE object_id = OBJECT_ID(N'dbo.Positions') AND name = N'QuantityV2'";

/// The role `migrate` makes and grants [`APP_RIGHTS`] to; the app's
/// database user is made a member of it (docs/deploy.md step 4).
pub const APP_ROLE: &str = "order_guard_app";

/// Every right `serve`, `replay`, the dead-letter sweep and `status` use,
/// as (right, object): the statements of this file, read one by one. The
/// grants are in `schema.sql` (and [`execute_procedure_batches`]); a test
/// checks the two lists agree.
pub const APP_RIGHTS: &[(&str, &str)] = &[
    ("EXECUTE", EXECUTE_PROCEDURE),
    ("SELECT", "dbo.SchemaVersion"),
    ("SELECT", "dbo.StoreIdentity"),
    ("SELECT", "dbo.Orders"),
    ("INSERT", "dbo.Orders"),
    ("UPDATE", "dbo.Orders"),
    ("SELECT", "dbo.Positions"),
    ("INSERT", "dbo.Positions"),
    ("UPDATE", "dbo.Positions"),
    ("SELECT", "dbo.RejectedEvents"),
    ("INSERT", "dbo.RejectedEvents"),
    ("UPDATE", "dbo.RejectedEvents"),
    ("SELECT", "dbo.Outbox"),
    ("INSERT", "dbo.Outbox"),
    ("UPDATE", "dbo.Outbox"),
    ("DELETE", "dbo.Outbox"),
    ("SELECT", "dbo.OutboxPurge"),
    ("INSERT", "dbo.OutboxPurge"),
    ("UPDATE", "dbo.OutboxPurge"),
    ("SELECT", "dbo.OutboxEpoch"),
    ("INSERT", "dbo.OutboxEpoch"),
    ("DELETE", "dbo.OutboxEpoch"),
];

/// The operator's read-only role: `migrate` makes it and grants it SELECT
/// on [`READER_TABLES`], what `status` and `outbox list` read, and nothing
/// else, so an operator who only looks is made a member of it instead of
/// [`APP_ROLE`] (docs/sqlserver.md, "Least privilege").
pub const READER_ROLE: &str = "order_guard_reader";

/// Every table `status` and `outbox list` read (the schema's state and
/// identity, the order, its position and rejections, the outbox).
pub const READER_TABLES: &[&str] = &[
    "dbo.SchemaVersion",
    "dbo.StoreIdentity",
    "dbo.Orders",
    "dbo.Positions",
    "dbo.RejectedEvents",
    "dbo.Outbox",
    "dbo.OutboxPurge",
    "dbo.OutboxEpoch",
];

/// 1 when [`READER_ROLE`] exists, else 0.
pub const READER_ROLE_EXISTS: &str =
    "SELECT CASE WHEN DATABASE_PRINCIPAL_ID(N'order_guard_reader') IS NULL THEN 0 ELSE 1 END";

/// What `migrate` runs, as the admin, every time (the schema current or
/// not): [`READER_ROLE`] made if missing, then its grants, one batch each
/// (a role is granted to once it exists). Idempotent.
pub fn reader_role_batches() -> Vec<String> {
    let mut batches = vec![format!(
        "IF DATABASE_PRINCIPAL_ID(N'{READER_ROLE}') IS NULL CREATE ROLE {READER_ROLE}"
    )];
    batches.push(
        READER_TABLES
            .iter()
            .map(|t| format!("GRANT SELECT ON {t} TO {READER_ROLE};"))
            .collect::<Vec<_>>()
            .join("\n"),
    );
    batches
}

/// The connected user's name and each right of [`APP_RIGHTS`] it lacks,
/// in one round trip: one row per missing right, or one row with NULL
/// right and object when none is missing. Run at every start once the
/// schema is current (`rights.rs`).
pub const MISSING_RIGHTS: &str = concat!(
    "SELECT CONVERT(NVARCHAR(256), USER_NAME()) AS UserName, r.RightName, r.ObjectName ",
    "FROM (SELECT 1 AS One) AS u LEFT JOIN (VALUES ",
    "(N'EXECUTE', N'",
    execute_procedure!(),
    "'), ",
    "(N'SELECT', N'dbo.SchemaVersion'), (N'SELECT', N'dbo.StoreIdentity'), ",
    "(N'SELECT', N'dbo.Orders'), (N'INSERT', N'dbo.Orders'), (N'UPDATE', N'dbo.Orders'), ",
    "(N'SELECT', N'dbo.Positions'), (N'INSERT', N'dbo.Positions'), (N'UPDATE', N'dbo.Positions'), ",
    "(N'SELECT', N'dbo.RejectedEvents'), (N'INSERT', N'dbo.RejectedEvents'), ",
    "(N'UPDATE', N'dbo.RejectedEvents'), ",
    "(N'SELECT', N'dbo.Outbox'), (N'INSERT', N'dbo.Outbox'), (N'UPDATE', N'dbo.Outbox'), ",
    "(N'DELETE', N'dbo.Outbox'), ",
    "(N'SELECT', N'dbo.OutboxPurge'), (N'INSERT', N'dbo.OutboxPurge'), (N'UPDATE', N'dbo.OutboxPurge'), ",
    "(N'SELECT', N'dbo.OutboxEpoch'), (N'INSERT', N'dbo.OutboxEpoch'), (N'DELETE', N'dbo.OutboxEpoch')",
    ") AS r (RightName, ObjectName) ",
    "ON ISNULL(HAS_PERMS_BY_NAME(r.ObjectName, N'OBJECT', r.RightName), 0) = 0"
);

/// After a migration this user may not run: can it read the schema's
/// version table at all? (An error saying permission denied: the schema is
/// there and the user lacks its rights; saying no such object: there is
/// no schema yet.)
pub const PROBE_SCHEMA_VERSION: &str = "SELECT TOP (0) Version FROM dbo.SchemaVersion";

/// Starts each explicit transaction of `migrate` (sent as a
/// plain batch so the transaction outlives it; later RPCs carry its
/// descriptor).
pub const BEGIN: &str = "BEGIN TRANSACTION";

/// Ends a transaction and says how many are still open, in one round trip.
/// A transaction is never assumed to be over: anything but 0 means the
/// COMMIT did not end it, and the connection is discarded (closing it rolls
/// the transaction back) instead of going back to the pool.
pub const COMMIT_AND_COUNT: &str = "COMMIT TRANSACTION; SELECT @@TRANCOUNT AS OpenTransactions";

/// Ends a transaction an error may or may not have ended already (under
/// `XACT_ABORT ON` most errors roll it back; a few leave it open) and says
/// how many are still open, in one round trip: after a migration this user
/// was refused, before the same session says why.
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

/// Run once on every new connection of a user that may write the outbox,
/// before anyone uses it: the outbox's epoch raised (`store::next_epoch`,
/// here by the server's clock), covering every `Seq` from one past the
/// highest committed. A database restored, copied or failed over numbers
/// again from an earlier point, and is only reached through connections
/// opened afterwards: each raises an epoch above every one the lost history
/// raised before the first row it numbers. Raises are one at a time (a
/// transaction-owned application lock), so epochs grow with the `Seq`s
/// they cover. Skipped, answering nothing, where the table is not there
/// yet (a database `migrate` has not brought to version 6: its migration
/// raises the first) or the user may not insert into it (the operator's
/// read-only role). A refused lock fails the connection's set-up: the pool
/// tries another.
pub const RAISE_EPOCH: &str = "SET NOCOUNT ON;
IF OBJECT_ID(N'dbo.OutboxEpoch', N'U') IS NOT NULL
   AND ISNULL(HAS_PERMS_BY_NAME(N'dbo.OutboxEpoch', N'OBJECT', N'INSERT'), 0) = 1
BEGIN
    DECLARE @Lock INT;
    BEGIN TRANSACTION;
    EXEC @Lock = sp_getapplock @Resource = N'order-guard:outbox-epoch', @LockMode = N'Exclusive',
        @LockOwner = N'Transaction', @LockTimeout = 5000;
    IF @Lock < 0 THROW 50002, N'order-guard: the outbox epoch''s lock was not granted', 1;
    INSERT INTO dbo.OutboxEpoch (Epoch, FirstSeq)
    SELECT CASE WHEN n.Now > ISNULL(e.Newest, 0) THEN n.Now ELSE e.Newest + 1 END,
           (SELECT ISNULL(MAX(Seq), 0) FROM dbo.Outbox) + 1
      FROM (SELECT DATEDIFF_BIG(MILLISECOND, '19700101', SYSUTCDATETIME()) AS Now) AS n
     CROSS JOIN (SELECT MAX(Epoch) AS Newest FROM dbo.OutboxEpoch) AS e;
    COMMIT TRANSACTION;
END;";

/// The pool's check of a connection that sat idle: alive, and no
/// transaction left open on it.
pub const OPEN_TRANSACTIONS: &str = "SELECT @@TRANCOUNT AS OpenTransactions";

/// The order row by id (P1). Timestamps come back as ISO 8601 text (style
/// 126) so the store needs no date/time crate feature; they are UTC.
pub const SELECT_ORDER: &str = "SELECT OrderId, Fingerprint, AccountId, Side, Symbol, \
     Quantity, LimitPrice, Currency, Status, Attempts, \
     CONVERT(NVARCHAR(40), ReceivedAt, 126) AS ReceivedAt, \
     CONVERT(NVARCHAR(40), ExecutedAt, 126) AS ExecutedAt, PlacedAt \
     FROM dbo.Orders WHERE OrderId = @P1";

/// The whole of `execute` in one round trip and one transaction:
/// insert the order under the unique index, or find the row holding its id;
/// if that row is this order and not yet terminal, apply the position
/// change and move it `Received → Executed` (or `Received → Rejected` with
/// the event stored, when the position would leave `DECIMAL(38,10)`); a row
/// of another order in the current fingerprint version is stored as a
/// conflict; then answer in one result set. A duplicate reads and writes
/// nothing else.
///
/// Why it is safe and exact:
/// - the unique index on `OrderId` admits one row; two first deliveries
///   racing both find no row, one INSERT waits on the other's key lock and
///   fails with 2601/2627, which `XACT_ABORT ON` turns into a doomed
///   transaction: the CATCH rolls back and answers `raced`, and the caller
///   sends the batch again, which finds the row;
/// - `Received → Executed` is conditional and must change one row, else the
///   batch THROWs: the position moves only with it, in one transaction;
/// - the position is in integer units (`Units DECIMAL(38,0)`): `@Current +
///   @Change` keeps scale 0 (SQL Server's rule for `+`: scale max(s1, s2),
///   precision capped at 38 by lowering the scale, and there is none to
///   lower), and the bound is checked by comparison before it, on the
///   side's branch only (`@Current > @Max - @Change` for a buy, `@Current <
///   -@Max - @Change` for a sell: each stays within ±@Max there, the other
///   would not, and T-SQL does not promise to evaluate `AND` left to right),
///   because an overflow error cannot be relied on (Babelfish does not catch
///   8115 in TRY…CATCH);
/// - READ COMMITTED whatever the session says: the first read must never
///   see an uncommitted row;
/// - locks: the order row (insert or claim), then the position row (an
///   UPDATE that changes only `UpdatedAt`: Babelfish ignores lock hints), in
///   that order in every transaction, so two never wait for each other in a
///   cycle; a first trade of an account and symbol inserts its position row,
///   and two racing there are `raced` the same way;
/// - the COMMIT is the batch's own and `@@TRANCOUNT` comes back in the result,
///   which must be 0.
///
/// What the caller decides (the batch cannot, or it would cost a write):
/// `row` hands back a row whose fingerprint is of another version (the
/// caller fingerprints it again from its columns, `OrderRecord::
/// current_fingerprint`); `overflow` hands back the position the order would
/// overflow, rolled back, for the caller to write the reason and send the
/// batch again with it (P14, P15: rejected only if the position is still
/// that one).
///
/// P1 OrderId, P2 Fingerprint, P3 EventId, P4 AccountId, P5 Side, P6 Symbol,
/// P7 Quantity, P8 LimitPrice (0: none), P9 Currency (empty: none),
/// P10 PlacedAt (empty: none), P11 the signed change in units
/// (`DECIMAL(38,0)`), P12 a stored fingerprint of another version that is
/// this order (empty: none), P13 the raw event, P14 the overflow reason
/// (empty: not known yet), P15 the position in units that reason is about,
/// P16 the overflow rejection's EventHash, P17 the conflict's EventHash,
/// P18 and P19 the conflict reason around the existing fingerprint's first
/// P20 characters, P21 the announcement's message id (`store::message_id`):
/// an execution writes its outbox row in the same transaction, with the
/// position after it and the same `ExecutedAt` as the order's row.
pub const EXECUTE_ORDER_BODY: &str = "SET NOCOUNT ON;
SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
IF @P1 = N''
BEGIN
    SELECT N'ready' AS Result, @@TRANCOUNT AS OpenTransactions;
    RETURN;
END;
DECLARE @Result NVARCHAR(16) = NULL, @Status NVARCHAR(16) = NULL, @Fingerprint NVARCHAR(128) = NULL;
DECLARE @Current DECIMAL(38, 0) = NULL, @Change DECIMAL(38, 0) = CONVERT(DECIMAL(38, 0), @P11);
DECLARE @Max DECIMAL(38, 0) = 99999999999999999999999999999999999999, @Over BIT = 0;
DECLARE @Now DATETIME2(3) = NULL, @After DECIMAL(38, 0) = NULL;
SELECT @Status = Status, @Fingerprint = Fingerprint FROM dbo.Orders WHERE OrderId = @P1;
IF @Status IS NOT NULL AND @Fingerprint <> @P2 AND @Fingerprint <> @P12
BEGIN
    IF LEFT(@Fingerprint, 3) = LEFT(@P2, 3)
    BEGIN
        SET @Result = N'conflict';
        UPDATE dbo.RejectedEvents SET Deliveries = Deliveries + 1, LastSeenAt = SYSUTCDATETIME()
         WHERE EventHash = @P17;
        IF @@ROWCOUNT = 0
        BEGIN
            BEGIN TRY
                INSERT INTO dbo.RejectedEvents (EventHash, Kind, OrderId, EventId, Reason, Fingerprint,
                    ExistingFingerprint, RawEvent, Deliveries, FirstSeenAt, LastSeenAt)
                VALUES (@P17, N'conflict', @P1, NULLIF(@P3, N''), @P18 + LEFT(@Fingerprint, @P20) + @P19,
                    @P2, @Fingerprint, @P13, 1, SYSUTCDATETIME(), SYSUTCDATETIME());
            END TRY
            BEGIN CATCH
                IF ERROR_NUMBER() NOT IN (2601, 2627) THROW;
                UPDATE dbo.RejectedEvents SET Deliveries = Deliveries + 1, LastSeenAt = SYSUTCDATETIME()
                 WHERE EventHash = @P17;
            END CATCH;
        END;
    END
    ELSE SET @Result = N'row';
END
ELSE IF @Status IS NOT NULL AND @Status <> N'Received'
    SET @Result = N'done';
ELSE
BEGIN
    BEGIN TRY
        BEGIN TRANSACTION;
        IF @Status IS NULL
            INSERT INTO dbo.Orders (OrderId, Fingerprint, EventId, AccountId, Side, Symbol, Quantity,
                LimitPrice, Currency, PlacedAt, Status, Attempts, ReceivedAt)
            VALUES (@P1, @P2, @P3, @P4, @P5, @P6, @P7, NULLIF(@P8, 0), NULLIF(@P9, N''),
                NULLIF(@P10, N''), N'Received', 1, SYSUTCDATETIME());
        ELSE
        BEGIN
            UPDATE dbo.Orders SET Attempts = Attempts + 1 WHERE OrderId = @P1 AND Status = N'Received';
            IF @@ROWCOUNT = 0 SET @Result = N'row';
        END;
        IF @Result IS NULL
        BEGIN
            UPDATE dbo.Positions SET UpdatedAt = SYSUTCDATETIME() WHERE AccountId = @P4 AND Symbol = @P6;
            IF @@ROWCOUNT = 0
                INSERT INTO dbo.Positions (AccountId, Symbol, Units, UpdatedAt)
                VALUES (@P4, @P6, 0, SYSUTCDATETIME());
            SELECT @Current = Units FROM dbo.Positions WHERE AccountId = @P4 AND Symbol = @P6;
            IF @Change > 0
            BEGIN
                IF @Current > @Max - @Change SET @Over = 1;
            END
            ELSE IF @Current < -@Max - @Change SET @Over = 1;
            IF @Over = 1
            BEGIN
                IF @P14 = N'' OR @Current <> CONVERT(DECIMAL(38, 0), @P15)
                    SET @Result = N'overflow';
                ELSE
                BEGIN
                    UPDATE dbo.Orders SET Status = N'Rejected' WHERE OrderId = @P1 AND Status = N'Received';
                    IF @@ROWCOUNT <> 1 THROW 50001, N'order-guard: the update to Rejected changed no row', 1;
                    UPDATE dbo.RejectedEvents SET Deliveries = Deliveries + 1, LastSeenAt = SYSUTCDATETIME()
                     WHERE EventHash = @P16;
                    IF @@ROWCOUNT = 0
                        INSERT INTO dbo.RejectedEvents (EventHash, Kind, OrderId, EventId, Reason, Fingerprint,
                            ExistingFingerprint, RawEvent, Deliveries, FirstSeenAt, LastSeenAt)
                        VALUES (@P16, N'poison', @P1, NULLIF(@P3, N''), @P14, @P2, NULL, @P13, 1,
                            SYSUTCDATETIME(), SYSUTCDATETIME());
                    SET @Result = N'rejected';
                END;
            END
            ELSE
            BEGIN
                -- Taken here, with the position row locked: two orders of
                -- one position get their ExecutedAt in execution order.
                SET @Now = SYSUTCDATETIME();
                SET @After = @Current + @Change;
                UPDATE dbo.Positions SET Units = @After, UpdatedAt = SYSUTCDATETIME()
                 WHERE AccountId = @P4 AND Symbol = @P6;
                UPDATE dbo.Orders SET Status = N'Executed', ExecutedAt = @Now
                 WHERE OrderId = @P1 AND Status = N'Received';
                IF @@ROWCOUNT <> 1 THROW 50001, N'order-guard: the update to Executed changed no row', 1;
                INSERT INTO dbo.Outbox (MessageId, Kind, OrderId, AccountId, Side, Symbol, Quantity,
                    PositionUnits, Fingerprint, ExecutedAt, CreatedAt, Attempts, NextAttemptAt,
                    LeaseUntil, Parked)
                VALUES (@P21, N'OrderExecuted', @P1, @P4, @P5, @P6, @P7, @After, @P2,
                    @Now, @Now, 0, @Now, @Now, 0);
                SET @Result = N'executed';
            END;
        END;
        IF @Result IN (N'executed', N'rejected')
            COMMIT TRANSACTION;
        ELSE
            ROLLBACK TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
        IF ERROR_NUMBER() NOT IN (2601, 2627) THROW;
        SET @Result = N'raced';
    END CATCH;
END;
SELECT @Result AS Result, @@TRANCOUNT AS OpenTransactions,
    CONVERT(NVARCHAR(48), @Current) AS CurrentUnits,
    o.OrderId, o.Fingerprint, o.AccountId, o.Side, o.Symbol, o.Quantity, o.LimitPrice, o.Currency,
    o.Status, o.Attempts, CONVERT(NVARCHAR(40), o.ReceivedAt, 126) AS ReceivedAt,
    CONVERT(NVARCHAR(40), o.ExecutedAt, 126) AS ExecutedAt, o.PlacedAt
FROM (SELECT 1 AS One) AS One
LEFT JOIN dbo.Orders AS o ON o.OrderId = @P1 AND @Result IN (N'conflict', N'row', N'done');";

/// The COMMIT inside [`EXECUTE_ORDER_BODY`], which the `sqlserver_commit`
/// fault point replaces (tests only: the body is then sent as a batch of its
/// own, with the same parameters, instead of the procedure call).
pub const EXECUTE_ORDER_COMMIT: &str = "COMMIT TRANSACTION;";

/// Put in place of [`EXECUTE_ORDER_COMMIT`] by the `skip` and `cut` fault
/// points (tests only): a statement that changes nothing, so the batch
/// answers with its transaction still open.
pub const FAULT_NO_COMMIT: &str = "SET @Result = @Result;";

/// The net position. P1 AccountId, P2 Symbol.
pub const SELECT_POSITION: &str =
    "SELECT Units FROM dbo.Positions WHERE AccountId = @P1 AND Symbol = @P2";

/// `reject`: keep the event once, keyed by its hash (unique index), in one
/// round trip: a delivery of an event already kept is counted
/// (`Deliveries`); a new one is inserted, and if a racing delivery inserted
/// it first (2601/2627, caught: no transaction is open), counted.
/// P1 EventHash, P2 Kind, P3 OrderId, P4 EventId, P5 Reason, P6 Fingerprint,
/// P7 ExistingFingerprint, P8 RawEvent; an empty P3, P4, P6 or P7 is stored
/// as NULL.
pub const REJECT: &str = "SET NOCOUNT ON;
UPDATE dbo.RejectedEvents SET Deliveries = Deliveries + 1, LastSeenAt = SYSUTCDATETIME()
 WHERE EventHash = @P1;
IF @@ROWCOUNT = 0
BEGIN
    BEGIN TRY
        INSERT INTO dbo.RejectedEvents (EventHash, Kind, OrderId, EventId, Reason, Fingerprint,
            ExistingFingerprint, RawEvent, Deliveries, FirstSeenAt, LastSeenAt)
        VALUES (@P1, @P2, NULLIF(@P3, N''), NULLIF(@P4, N''), @P5, NULLIF(@P6, N''),
            NULLIF(@P7, N''), @P8, 1, SYSUTCDATETIME(), SYSUTCDATETIME());
    END TRY
    BEGIN CATCH
        IF ERROR_NUMBER() NOT IN (2601, 2627) THROW;
        UPDATE dbo.RejectedEvents SET Deliveries = Deliveries + 1, LastSeenAt = SYSUTCDATETIME()
         WHERE EventHash = @P1;
    END CATCH;
END;";

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

/// Put in place of [`EXECUTE_ORDER_COMMIT`] by the
/// `sqlserver_commit=return(fail)` fault point (tests only): a statement the
/// server fails (8134), which under `XACT_ABORT ON` aborts the transaction,
/// as a failed COMMIT does.
pub const FAULT_FAILING_COMMIT: &str = "SELECT 1 / 0 AS FaultInjectedInsteadOfCommit;";

// The outbox's statements: the dispatcher's claim, mark, defer and purge,
// the operator's listings, retries, resends and backfill.
mod outbox;
pub use outbox::*;

/// Every single statement above, for the parse check in `tests/sqlserver.rs`.
pub const ALL: &[&str] = &[
    EXECUTE_ORDER,
    WARM_EXECUTE,
    SCHEMA_STATE,
    UNLOCK_SCHEMA,
    CONVERT_POSITIONS,
    POSITIONS_TO_CONVERT,
    MISSING_RIGHTS,
    PROBE_SCHEMA_VERSION,
    BEGIN,
    COMMIT_AND_COUNT,
    ROLLBACK_AND_COUNT,
    SESSION_COUNT_ROWS,
    SESSION_XACT_ABORT,
    OPEN_TRANSACTIONS,
    SELECT_ORDER,
    SELECT_POSITION,
    SELECT_REJECTIONS,
    SELECT_REJECTIONS_WITHOUT_ORDER,
    SELECT_IDENTITY,
    FAULT_FAILING_COMMIT,
    FAULT_NO_COMMIT,
    DEFER_ANNOUNCEMENT,
    SELECT_UNDISPATCHED,
    SELECT_ANNOUNCEMENT_OF_ORDER,
    OUTBOX_COUNTS,
    BACKFILL_WRITE,
];

/// The batches with `DECLARE`, `IF … BEGIN … END` and `TRY…CATCH`:
/// `sqlparser`'s MS SQL dialect does not parse all of their control flow,
/// so the engine tests (`tests/store_conformance.rs`,
/// `tests/sqlserver_engine.rs` on the T-SQL engine in CI) are their check,
/// each path of them run there.
/// [`LOCK_SCHEMA`] too: the parser does not take `EXEC @Result = …`; it
/// runs on the engine at every migration.
/// The outbox's claim, retry, purge, backfill's read and the epoch's raise too (`DECLARE`,
/// `TOP (@Pn)` in a derived table, `EXEC @Lock = …`, a `WITH` after a
/// `DECLARE`); [`mark_announced`] is parsed for a
/// few sizes.
pub const BATCHES: &[&str] = &[
    EXECUTE_ORDER_BODY,
    REJECT,
    LOCK_SCHEMA,
    CLAIM_ANNOUNCEMENTS,
    PURGE_ANNOUNCED,
    RETRY_ANNOUNCEMENTS,
    RESEND_ANNOUNCEMENTS,
    BACKFILL_READ,
    RAISE_EPOCH,
];
