//! The outbox's statements (`src/store/sqlserver/outbox.rs` runs them):
//! the dispatcher's claim, mark, defer and purge, and the operator's
//! listings, counts, retries, resends and backfill.

/// The outbox columns every listing reads from `dbo.Outbox AS o`, in
/// [`outbox::row`]'s order (`src/store/sqlserver/outbox.rs`); times as UTC
/// text (style 126); last the row's epoch, the newest raised at or below
/// its `Seq` (`RAISE_EPOCH`).
macro_rules! outbox_columns {
    () => {
        "MessageId, Seq, Kind, OrderId, AccountId, Side, Symbol, Quantity, \
         CONVERT(NVARCHAR(48), PositionUnits) AS PositionUnits, \
         CONVERT(NVARCHAR(40), ExecutedAt, 126) AS ExecutedAt, Fingerprint, Attempts, LastError, \
         CONVERT(INT, Parked) AS Parked, CONVERT(NVARCHAR(40), DispatchedAt, 126) AS DispatchedAt, \
         (SELECT MAX(e.Epoch) FROM dbo.OutboxEpoch AS e WHERE e.FirstSeq <= o.Seq) AS Epoch"
    };
}

/// The dispatcher's claim, one round trip: up to P3 announcements due
/// (undispatched, not parked, past their retry time, no live lease), in
/// the order they fall due (`IX_Outbox_Due`: the scan stops at the first
/// row not due yet, however large a backlog waits behind it; a parked row
/// is never due), leased for P2 ms under the token P1, then the rows this
/// token holds (`IX_Outbox_ClaimToken`). The outer `WHERE` is checked again
/// on each row as it is locked, so of two dispatchers claiming at once each
/// row goes to one (were both to send it, the copies carry one message id:
/// at least once holds).
pub const CLAIM_ANNOUNCEMENTS: &str = concat!(
    "SET NOCOUNT ON; ",
    "DECLARE @Now DATETIME2(3) = SYSUTCDATETIME(); ",
    "UPDATE o SET LeaseUntil = DATEADD(MILLISECOND, @P2, @Now), ClaimToken = @P1 ",
    "FROM dbo.Outbox AS o ",
    "JOIN (SELECT TOP (@P3) Seq FROM dbo.Outbox ",
    "WHERE DispatchedAt IS NULL AND NextAttemptAt <= @Now AND Parked = 0 AND LeaseUntil <= @Now ",
    "ORDER BY NextAttemptAt, Seq) AS b ON b.Seq = o.Seq ",
    "WHERE o.DispatchedAt IS NULL AND o.NextAttemptAt <= @Now AND o.Parked = 0 ",
    "AND o.LeaseUntil <= @Now; ",
    "SELECT ",
    outbox_columns!(),
    " FROM dbo.Outbox AS o WHERE ClaimToken = @P1 AND DispatchedAt IS NULL ORDER BY Seq"
);

/// Most announcements one mark names (one parameter each).
pub const MARK_AT_MOST: usize = 100;

/// Mark `n` announcements (P1…Pn, their message ids) dispatched, one round
/// trip; answers how many were still undispatched. `n` is 1 to
/// [`MARK_AT_MOST`].
pub fn mark_announced(n: usize) -> String {
    let ids: Vec<String> = (1..=n.clamp(1, MARK_AT_MOST))
        .map(|i| format!("@P{i}"))
        .collect();
    format!(
        "SET NOCOUNT ON; \
         UPDATE dbo.Outbox SET DispatchedAt = SYSUTCDATETIME(), LeaseUntil = SYSUTCDATETIME() \
         WHERE DispatchedAt IS NULL AND MessageId IN ({}); \
         SELECT @@ROWCOUNT AS Marked",
        ids.join(", ")
    )
}

/// A failed send: P1 message id, P2 the claim's token, P3 why, P4 ms until
/// it is due again, P5 1 to park it for an operator (then never due:
/// `NextAttemptAt` at the end of time, so no claim's scan meets it).
pub const DEFER_ANNOUNCEMENT: &str = "UPDATE dbo.Outbox SET Attempts = Attempts + 1, \
     LastError = LEFT(@P3, 1024), \
     NextAttemptAt = CASE WHEN @P5 = 1 THEN CONVERT(DATETIME2(3), '9999-12-31T00:00:00') \
     ELSE DATEADD(MILLISECOND, @P4, SYSUTCDATETIME()) END, \
     LeaseUntil = SYSUTCDATETIME(), Parked = @P5 \
     WHERE MessageId = @P1 AND ClaimToken = @P2 AND DispatchedAt IS NULL";

/// The retention: up to P2 announcements dispatched more than P1 seconds
/// ago deleted, oldest first, and with P3 = 1 (no destination) up to the
/// rest of P2 due for more than P1 seconds and never sent (not parked, not
/// leased; on `IX_Outbox_Due`), in one short transaction; one instance at a
/// time (a transaction-owned application lock, not waited for: another
/// instance purging meanwhile makes this call delete nothing). Answers how
/// many it deleted.
pub const PURGE_ANNOUNCED: &str = "SET NOCOUNT ON;
DECLARE @Lock INT, @Deleted INT = 0, @Newest DATETIME2(3), @More DATETIME2(3);
BEGIN TRANSACTION;
EXEC @Lock = sp_getapplock @Resource = N'order-guard:outbox-purge', @LockMode = N'Exclusive',
    @LockOwner = N'Transaction', @LockTimeout = 0;
IF @Lock >= 0
BEGIN
    -- The newest execution among the rows each delete takes, read first
    -- with the same selection (no OUTPUT: outside the portable subset). A
    -- row that changes in between (`outbox resend`) can only make it newer
    -- than the rows deleted: the watermark errs towards refusing.
    SELECT @Newest = MAX(b.ExecutedAt)
      FROM (SELECT TOP (@P2) ExecutedAt FROM dbo.Outbox
             WHERE DispatchedAt < DATEADD(SECOND, -@P1, SYSUTCDATETIME())
             ORDER BY DispatchedAt, Seq) AS b;
    DELETE o FROM dbo.Outbox AS o
    JOIN (SELECT TOP (@P2) Seq FROM dbo.Outbox
           WHERE DispatchedAt < DATEADD(SECOND, -@P1, SYSUTCDATETIME())
           ORDER BY DispatchedAt, Seq) AS b ON b.Seq = o.Seq;
    SET @Deleted = @@ROWCOUNT;
    IF @P3 = 1 AND @Deleted < @P2
    BEGIN
        SELECT @More = MAX(b.ExecutedAt)
          FROM (SELECT TOP (@P2 - @Deleted) ExecutedAt FROM dbo.Outbox
                 WHERE DispatchedAt IS NULL AND Parked = 0
                   AND NextAttemptAt < DATEADD(SECOND, -@P1, SYSUTCDATETIME())
                   AND LeaseUntil <= SYSUTCDATETIME()
                 ORDER BY NextAttemptAt, Seq) AS b;
        DELETE o FROM dbo.Outbox AS o
        JOIN (SELECT TOP (@P2 - @Deleted) Seq FROM dbo.Outbox
               WHERE DispatchedAt IS NULL AND Parked = 0
                 AND NextAttemptAt < DATEADD(SECOND, -@P1, SYSUTCDATETIME())
                 AND LeaseUntil <= SYSUTCDATETIME()
               ORDER BY NextAttemptAt, Seq) AS b ON b.Seq = o.Seq
         WHERE o.DispatchedAt IS NULL AND o.LeaseUntil <= SYSUTCDATETIME();
        SET @Deleted = @Deleted + @@ROWCOUNT;
        IF @More IS NOT NULL AND (@Newest IS NULL OR @More > @Newest) SET @Newest = @More;
    END;
    -- The watermark: raised to the newest execution deleted, never lowered.
    IF @Deleted > 0 AND @Newest IS NOT NULL
    BEGIN
        UPDATE dbo.OutboxPurge SET ExecutedThrough = @Newest
         WHERE Id = 1 AND ExecutedThrough < @Newest;
        IF NOT EXISTS (SELECT 1 FROM dbo.OutboxPurge WHERE Id = 1)
            INSERT INTO dbo.OutboxPurge (Id, ExecutedThrough) VALUES (1, @Newest);
        -- The epochs no kept row needs: below the one covering the lowest
        -- Seq kept (every kept row's is that one or later), and raised
        -- over an hour ago (a margin no transaction's row stays
        -- uncommitted for). The newest always stays.
        DELETE FROM dbo.OutboxEpoch
         WHERE Epoch < (SELECT MAX(c.Epoch) FROM dbo.OutboxEpoch AS c
                         WHERE c.FirstSeq <= (SELECT ISNULL(MIN(Seq), 9223372036854775807)
                                                FROM dbo.Outbox))
           AND Epoch < DATEDIFF_BIG(MILLISECOND, '19700101', SYSUTCDATETIME()) - 3600000;
    END;
END;
COMMIT TRANSACTION;
SELECT @Deleted AS Deleted, @@TRANCOUNT AS OpenTransactions;";

/// `outbox backfill`'s read, one statement (one snapshot where reads are
/// versioned, as on Azure SQL): the executions since P1 seconds ago of
/// every position that has one without an announcement, by position, each
/// with its `Orders.Id`, its millisecond's rank (`Tie`: equal within one
/// `ExecutedAt`), its announcement's `Seq` and `PositionUnits` if it has
/// one (NULL: none), and the position now in units
/// (`store::walk_back` takes them).
pub const BACKFILL_READ: &str = "SET NOCOUNT ON;
DECLARE @Since DATETIME2(3) = DATEADD(SECOND, -@P1, SYSUTCDATETIME());
WITH e AS (
    SELECT o.Id, o.OrderId, o.AccountId, o.Symbol, o.Side, o.Quantity, o.ExecutedAt,
           (SELECT MIN(x.Seq) FROM dbo.Outbox AS x WHERE x.OrderId = o.OrderId) AS Seq
      FROM dbo.Orders AS o
     WHERE o.Status = N'Executed' AND o.ExecutedAt >= @Since),
p AS (SELECT DISTINCT AccountId, Symbol FROM e WHERE Seq IS NULL)
SELECT e.AccountId, e.Symbol, e.OrderId, e.Side, e.Quantity,
       CONVERT(BIGINT, e.Id) AS Id,
       CONVERT(BIGINT, DENSE_RANK() OVER (ORDER BY e.ExecutedAt)) AS Tie,
       CONVERT(BIGINT, e.Seq) AS Seq,
       CONVERT(NVARCHAR(48), x.PositionUnits) AS PositionUnits,
       CONVERT(NVARCHAR(64), ISNULL(s.Units, 0)) AS Units
  FROM e
  JOIN p ON p.AccountId = e.AccountId AND p.Symbol = e.Symbol
  LEFT JOIN dbo.Outbox AS x ON x.Seq = e.Seq
  LEFT JOIN dbo.Positions AS s ON s.AccountId = e.AccountId AND s.Symbol = e.Symbol
 ORDER BY e.AccountId, e.Symbol;";

/// `outbox backfill`'s write of one announcement: P1 its message id, P2
/// the position after it in units, P3 the order id; nothing when the
/// message id already has a row (a backfill run twice, or at once).
/// Answers how many it wrote.
pub const BACKFILL_WRITE: &str =
    "SET NOCOUNT ON; INSERT INTO dbo.Outbox (MessageId, Kind, OrderId, AccountId, \
     Side, Symbol, Quantity, PositionUnits, Fingerprint, ExecutedAt, CreatedAt, NextAttemptAt, \
     LeaseUntil) \
     SELECT @P1, N'OrderExecuted', o.OrderId, o.AccountId, o.Side, o.Symbol, o.Quantity, \
     CAST(@P2 AS DECIMAL(38, 0)), o.Fingerprint, o.ExecutedAt, SYSUTCDATETIME(), \
     SYSUTCDATETIME(), SYSUTCDATETIME() \
     FROM dbo.Orders AS o WHERE o.OrderId = @P3 AND o.Status = N'Executed' \
     AND NOT EXISTS (SELECT 1 FROM dbo.Outbox AS x WHERE x.MessageId = @P1); \
     SELECT @@ROWCOUNT AS Written";

/// Undispatched announcements, oldest first, at most P1.
pub const SELECT_UNDISPATCHED: &str = concat!(
    "SELECT TOP (@P1) ",
    outbox_columns!(),
    " FROM dbo.Outbox AS o WHERE DispatchedAt IS NULL ORDER BY Seq"
);

/// The announcement of one order, by its message id (P2, the unique
/// index; `store::message_id` of the order), at most P1 rows.
pub const SELECT_ANNOUNCEMENT_OF_ORDER: &str = concat!(
    "SELECT TOP (@P1) ",
    outbox_columns!(),
    " FROM dbo.Outbox AS o WHERE MessageId = @P2 ORDER BY Seq"
);

/// Undispatched, of which parked, and dispatched announcements.
pub const OUTBOX_COUNTS: &str = "SELECT \
     CONVERT(BIGINT, ISNULL(SUM(CASE WHEN DispatchedAt IS NULL THEN 1 ELSE 0 END), 0)) AS Undispatched, \
     CONVERT(BIGINT, ISNULL(SUM(CASE WHEN DispatchedAt IS NULL AND Parked = 1 THEN 1 ELSE 0 END), 0)) AS Parked, \
     CONVERT(BIGINT, ISNULL(SUM(CASE WHEN DispatchedAt IS NOT NULL THEN 1 ELSE 0 END), 0)) AS Dispatched, \
     (SELECT CONVERT(NVARCHAR(40), ExecutedThrough, 126) FROM dbo.OutboxPurge WHERE Id = 1) AS PurgedThrough \
     FROM dbo.Outbox";

/// `outbox retry`: undispatched announcements made due now and unparked
/// (a live lease is left alone: its dispatcher is sending); P1 one message
/// id, or empty for all. Answers how many.
pub const RETRY_ANNOUNCEMENTS: &str = "SET NOCOUNT ON; \
     UPDATE dbo.Outbox SET Parked = 0, NextAttemptAt = SYSUTCDATETIME() \
     WHERE DispatchedAt IS NULL AND (@P1 = N'' OR MessageId = @P1); \
     SELECT @@ROWCOUNT AS Retried";

/// `outbox resend`: dispatched rows made undispatched and due now, by
/// message id (P1), or every one dispatched within the last P2 seconds
/// (P1 empty).
pub const RESEND_ANNOUNCEMENTS: &str = "SET NOCOUNT ON; \
     UPDATE dbo.Outbox SET DispatchedAt = NULL, Parked = 0, LastError = NULL, \
         NextAttemptAt = SYSUTCDATETIME(), LeaseUntil = SYSUTCDATETIME() \
     WHERE DispatchedAt IS NOT NULL AND ((@P1 <> N'' AND MessageId = @P1) \
         OR (@P1 = N'' AND DispatchedAt >= DATEADD(SECOND, -@P2, SYSUTCDATETIME()))); \
     SELECT @@ROWCOUNT AS Resent";
