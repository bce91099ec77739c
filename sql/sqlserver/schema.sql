-- order-guard schema for SQL Server / Azure SQL (version 4).
--
-- Applied by `order-guard migrate` (and at every start, bounded) under an
-- exclusive application lock (sp_getapplock, owned by the session), so two
-- processes migrating at once run one after the other; the version is
-- checked again under the lock. The batches before the rewrite marker run
-- in one transaction, then the execution procedure is created and granted,
-- then rows an upgrade rewrites are converted in batches that each commit
-- (src/store/sqlserver/migrate.rs), then the batches after the marker run
-- in a last transaction that writes the version row. Every batch checks
-- before it creates (the execution procedure is dropped and created), so
-- running it twice, or again after a cut, changes nothing done.
-- Batches are separated by lines holding only GO; each is sent on its own.
--
-- Portable T-SQL only (docs/sqlserver.md, "The portable T-SQL subset"): no MERGE, no CREATE OR ALTER,
-- no ROWVERSION, no sys.dm_* views. Quantities and prices are exact:
-- DECIMAL(28,10) per order (each at most 10^18); a position, the sum of many
-- orders, in integer units of 10^-10 as DECIMAL(38,0): exact to
-- DECIMAL(38,10), which DECIMAL(28,10) would overflow past 10^18.
-- Column names match the SQLite schema (sql/sqlite/schema.sql).
--
-- Identity is exact, as in SQLite and Redis: ids, accounts, symbols and
-- hashes are COLLATE Latin1_General_100_BIN2 (binary: case- and
-- accent-sensitive), so `ORD-1` and `ord-1` are two orders and two accounts
-- never share a position by letter case, whatever the database's default
-- collation (Azure SQL's is case-insensitive).
--
-- Index checks match the name with LIKE: compatible engines (Babelfish)
-- report an index under an internal name that starts with the given one.
-- The `[_]` keeps `_` literal; the trailing `%` takes the engine's suffix.

IF OBJECT_ID(N'dbo.SchemaVersion', N'U') IS NULL
    CREATE TABLE dbo.SchemaVersion (
        Version   INT          NOT NULL,
        AppliedAt DATETIME2(3) NOT NULL,
        CONSTRAINT PK_SchemaVersion PRIMARY KEY (Version)
    );
GO

IF OBJECT_ID(N'dbo.Orders', N'U') IS NULL
    CREATE TABLE dbo.Orders (
        Id          BIGINT IDENTITY(1, 1) NOT NULL,
        OrderId     NVARCHAR(128)  COLLATE Latin1_General_100_BIN2 NOT NULL,
        Fingerprint NVARCHAR(128)  COLLATE Latin1_General_100_BIN2 NOT NULL,
        EventId     NVARCHAR(MAX)  NULL,
        AccountId   NVARCHAR(128)  COLLATE Latin1_General_100_BIN2 NOT NULL,
        Side        NVARCHAR(8)    NOT NULL,
        Symbol      NVARCHAR(128)  COLLATE Latin1_General_100_BIN2 NOT NULL,
        Quantity    DECIMAL(28, 10) NOT NULL,
        LimitPrice  DECIMAL(28, 10) NULL,
        Currency    NVARCHAR(16)   NULL,
        PlacedAt    NVARCHAR(64)   NULL,
        Status      NVARCHAR(16)   NOT NULL,
        Attempts    BIGINT         NOT NULL CONSTRAINT DF_Orders_Attempts DEFAULT 1,
        ReceivedAt  DATETIME2(3)   NOT NULL,
        ExecutedAt  DATETIME2(3)   NULL,
        CONSTRAINT PK_Orders PRIMARY KEY (Id),
        CONSTRAINT CK_Orders_Side CHECK (Side IN (N'buy', N'sell')),
        CONSTRAINT CK_Orders_Status CHECK (Status IN (N'Received', N'Executed', N'Rejected'))
    );
GO

-- The last line of defence: a duplicate that got past the guard fails here
-- with error 2601 (2627 on some compatible engines).
IF NOT EXISTS (SELECT 1 FROM sys.indexes
                WHERE name LIKE N'UX[_]Orders[_]OrderId%' AND object_id = OBJECT_ID(N'dbo.Orders'))
    CREATE UNIQUE INDEX UX_Orders_OrderId ON dbo.Orders (OrderId);
GO

-- A position in integer units of 10^-10 (version 3; version 2 kept
-- DECIMAL(38,10) in a Quantity column). Integers because the execution batch
-- adds in T-SQL: DECIMAL(38,10) + DECIMAL(28,10) has precision 39, which SQL
-- Server cuts to 38 by lowering the scale to 9, rounding the tenth decimal;
-- DECIMAL(38,0) + DECIMAL(38,0) keeps scale 0 and is exact (the batch checks
-- the bound by comparison first, so the sum never leaves 38 digits).
IF OBJECT_ID(N'dbo.Positions', N'U') IS NULL
    CREATE TABLE dbo.Positions (
        AccountId NVARCHAR(128)   COLLATE Latin1_General_100_BIN2 NOT NULL,
        Symbol    NVARCHAR(128)   COLLATE Latin1_General_100_BIN2 NOT NULL,
        Units     DECIMAL(38, 0)  NOT NULL,
        UpdatedAt DATETIME2(3)    NOT NULL,
        CONSTRAINT PK_Positions PRIMARY KEY (AccountId, Symbol)
    );
GO

-- Version 2 → 3: Quantity DECIMAL(38,10) becomes Units DECIMAL(38,0), in
-- three steps, so that a table of any size is converted. Here,
-- in the migration's first transaction (cheap: no row is rewritten): Units
-- is added NULL (NULL means "not converted yet"), and Quantity renamed
-- QuantityV2, so an instance of an earlier version still running fails on
-- every position statement (and answers retry) instead of writing a value
-- the conversion has already read. Then `migrate` converts the rows in
-- batches that each commit (`sql::CONVERT_POSITIONS`: `WHERE Units IS
-- NULL`, so a migration cut half-way and run again converts each row once),
-- and last, in the final transaction with the version row, the batch after
-- the rewrite marker below makes Units NOT NULL and drops QuantityV2. Until
-- that row is written no instance of this version uses the table.
-- Dynamic SQL: a statement naming a column that is not there does not
-- compile.
IF EXISTS (SELECT 1 FROM sys.columns
            WHERE object_id = OBJECT_ID(N'dbo.Positions') AND name = N'Quantity')
   AND NOT EXISTS (SELECT 1 FROM sys.columns
                    WHERE object_id = OBJECT_ID(N'dbo.Positions') AND name = N'Units')
    ALTER TABLE dbo.Positions ADD Units DECIMAL(38, 0) NULL;
GO

IF EXISTS (SELECT 1 FROM sys.columns
            WHERE object_id = OBJECT_ID(N'dbo.Positions') AND name = N'Quantity')
    EXEC sp_rename N'dbo.Positions.Quantity', N'QuantityV2', N'COLUMN';
GO

IF OBJECT_ID(N'dbo.RejectedEvents', N'U') IS NULL
    CREATE TABLE dbo.RejectedEvents (
        Id                  BIGINT IDENTITY(1, 1) NOT NULL,
        EventHash           NVARCHAR(64)  COLLATE Latin1_General_100_BIN2 NOT NULL,
        Kind                NVARCHAR(16)  NOT NULL,
        OrderId             NVARCHAR(128) COLLATE Latin1_General_100_BIN2 NULL,
        EventId             NVARCHAR(MAX) NULL,
        Reason              NVARCHAR(MAX) NOT NULL,
        Fingerprint         NVARCHAR(128) COLLATE Latin1_General_100_BIN2 NULL,
        ExistingFingerprint NVARCHAR(128) COLLATE Latin1_General_100_BIN2 NULL,
        RawEvent            NVARCHAR(MAX) NOT NULL,
        Deliveries          BIGINT        NOT NULL CONSTRAINT DF_RejectedEvents_Deliveries DEFAULT 1,
        FirstSeenAt         DATETIME2(3)  NOT NULL,
        LastSeenAt          DATETIME2(3)  NOT NULL,
        CONSTRAINT PK_RejectedEvents PRIMARY KEY (Id),
        CONSTRAINT CK_RejectedEvents_Kind CHECK (Kind IN (N'poison', N'conflict'))
    );
GO

-- A redelivered rejected event is counted (Deliveries), not stored again.
IF NOT EXISTS (SELECT 1 FROM sys.indexes
                WHERE name LIKE N'UX[_]RejectedEvents[_]EventHash%' AND object_id = OBJECT_ID(N'dbo.RejectedEvents'))
    CREATE UNIQUE INDEX UX_RejectedEvents_EventHash ON dbo.RejectedEvents (EventHash);
GO

IF NOT EXISTS (SELECT 1 FROM sys.indexes
                WHERE name LIKE N'IX[_]RejectedEvents[_]OrderId%' AND object_id = OBJECT_ID(N'dbo.RejectedEvents'))
    CREATE INDEX IX_RejectedEvents_OrderId ON dbo.RejectedEvents (OrderId);
GO

-- This database's identity, made once with the schema: the guard's
-- completion markers carry it, so two databases sharing one cache (dev and
-- prod, a blue/green pair) never answer each other's orders `duplicate`.
IF OBJECT_ID(N'dbo.StoreIdentity', N'U') IS NULL
    CREATE TABLE dbo.StoreIdentity (
        Id NVARCHAR(36) COLLATE Latin1_General_100_BIN2 NOT NULL,
        CONSTRAINT PK_StoreIdentity PRIMARY KEY (Id)
    );
GO

IF NOT EXISTS (SELECT 1 FROM dbo.StoreIdentity)
    INSERT INTO dbo.StoreIdentity (Id) VALUES (LOWER(CONVERT(NVARCHAR(36), NEWID())));
GO

-- The outbox (version 4): one row per executed order, written by
-- the execution procedure in the transaction that executes it, dispatched
-- after the commit, deleted after a retention (src/store/announcement.rs).
-- PositionUnits is the position after the order, in units as in Positions.
-- A claim leases rows (LeaseUntil, ClaimToken); a failed send counts
-- (Attempts, LastError) and waits (NextAttemptAt), or is parked for an
-- operator. IX_Outbox_DispatchedAt serves the retention's purge (oldest
-- DispatchedAt first); the claim has its own two below.
IF OBJECT_ID(N'dbo.Outbox', N'U') IS NULL
    CREATE TABLE dbo.Outbox (
        Seq           BIGINT IDENTITY(1, 1) NOT NULL,
        MessageId     NVARCHAR(36)    COLLATE Latin1_General_100_BIN2 NOT NULL,
        Kind          NVARCHAR(64)    NOT NULL,
        OrderId       NVARCHAR(128)   COLLATE Latin1_General_100_BIN2 NOT NULL,
        AccountId     NVARCHAR(128)   COLLATE Latin1_General_100_BIN2 NOT NULL,
        Side          NVARCHAR(8)     NOT NULL,
        Symbol        NVARCHAR(128)   COLLATE Latin1_General_100_BIN2 NOT NULL,
        Quantity      DECIMAL(28, 10) NOT NULL,
        PositionUnits DECIMAL(38, 0)  NOT NULL,
        Fingerprint   NVARCHAR(128)   COLLATE Latin1_General_100_BIN2 NOT NULL,
        ExecutedAt    DATETIME2(3)    NOT NULL,
        CreatedAt     DATETIME2(3)    NOT NULL,
        Attempts      INT             NOT NULL CONSTRAINT DF_Outbox_Attempts DEFAULT 0,
        NextAttemptAt DATETIME2(3)    NOT NULL,
        LeaseUntil    DATETIME2(3)    NOT NULL,
        ClaimToken    NVARCHAR(36)    NULL,
        LastError     NVARCHAR(1024)  NULL,
        Parked        BIT             NOT NULL CONSTRAINT DF_Outbox_Parked DEFAULT 0,
        DispatchedAt  DATETIME2(3)    NULL,
        CONSTRAINT PK_Outbox PRIMARY KEY (Seq)
    );
GO

-- One announcement per message id (a second execution of an order cannot
-- happen; were it to, this fails it).
IF NOT EXISTS (SELECT 1 FROM sys.indexes
                WHERE name LIKE N'UX[_]Outbox[_]MessageId%' AND object_id = OBJECT_ID(N'dbo.Outbox'))
    CREATE UNIQUE INDEX UX_Outbox_MessageId ON dbo.Outbox (MessageId);
GO

IF NOT EXISTS (SELECT 1 FROM sys.indexes
                WHERE name LIKE N'IX[_]Outbox[_]DispatchedAt%' AND object_id = OBJECT_ID(N'dbo.Outbox'))
    CREATE INDEX IX_Outbox_DispatchedAt ON dbo.Outbox (DispatchedAt, Seq);
GO

-- The claim's scan: undispatched rows in the order they fall due, so it
-- stops at the first row not due yet (a parked row's NextAttemptAt is the
-- end of time), however many wait after an outage.
IF NOT EXISTS (SELECT 1 FROM sys.indexes
                WHERE name LIKE N'IX[_]Outbox[_]Due%' AND object_id = OBJECT_ID(N'dbo.Outbox'))
    CREATE INDEX IX_Outbox_Due ON dbo.Outbox (DispatchedAt, NextAttemptAt, Seq);
GO

-- The claim reads back the rows its token holds.
IF NOT EXISTS (SELECT 1 FROM sys.indexes
                WHERE name LIKE N'IX[_]Outbox[_]ClaimToken%' AND object_id = OBJECT_ID(N'dbo.Outbox'))
    CREATE INDEX IX_Outbox_ClaimToken ON dbo.Outbox (ClaimToken);
GO

-- The outbox's purge watermark (version 5): the newest ExecutedAt among
-- the rows the retention deleted, raised by each purge in its
-- transaction, never lowered. `outbox backfill` refuses to reach back to
-- it: an order executed then may have had its announcement sent and
-- deleted, and would be announced twice.
IF OBJECT_ID(N'dbo.OutboxPurge', N'U') IS NULL
    CREATE TABLE dbo.OutboxPurge (
        Id              TINYINT      NOT NULL,
        ExecutedThrough DATETIME2(3) NOT NULL,
        CONSTRAINT PK_OutboxPurge PRIMARY KEY (Id),
        CONSTRAINT CK_OutboxPurge_One CHECK (Id = 1)
    );
GO

-- The outbox's epochs (version 6): each the milliseconds since 1970 when a
-- connection raised it (or one past the newest), with the first Seq it
-- covers; a row's epoch is the newest raised at or below its Seq. Every
-- connection the app opens raises one before anyone uses it
-- (`sql::RAISE_EPOCH`), so a database restored, copied or failed over with
-- data loss (which numbers again from an earlier point, and which every
-- connection must reach anew) numbers under a higher epoch than the
-- history it lost (src/store/announcement.rs, `next_epoch`). The purge
-- deletes the epochs no kept row needs.
IF OBJECT_ID(N'dbo.OutboxEpoch', N'U') IS NULL
    CREATE TABLE dbo.OutboxEpoch (
        Epoch    BIGINT NOT NULL,
        FirstSeq BIGINT NOT NULL,
        CONSTRAINT PK_OutboxEpoch PRIMARY KEY (Epoch)
    );
GO

-- The application's rights: a role of our own (Babelfish has no
-- db_datareader / db_datawriter, and those grant no EXECUTE), granted
-- exactly what `serve`, `replay`, the dead-letter sweep and `status` need;
-- the app's user is made a member (README step 4). Reads of every table the
-- store reads; RejectedEvents written by `reject`; Orders and Positions
-- written only through the execution procedure, whose EXECUTE is granted
-- where `migrate` creates it (`sql::execute_procedure_batches`), and
-- directly as well, since an engine may run a procedure with its caller's
-- rights (Babelfish does). The outbox is read, claimed, marked and, past
-- its retention, deleted by the dispatcher: the only DELETE granted. No
-- DDL. GRANT is idempotent.
-- `sql::APP_RIGHTS` lists the same rights for the check at every start.
IF DATABASE_PRINCIPAL_ID(N'order_guard_app') IS NULL
    CREATE ROLE order_guard_app;
GO

GRANT SELECT ON dbo.SchemaVersion TO order_guard_app;
GRANT SELECT ON dbo.StoreIdentity TO order_guard_app;
GRANT SELECT, INSERT, UPDATE ON dbo.Orders TO order_guard_app;
GRANT SELECT, INSERT, UPDATE ON dbo.Positions TO order_guard_app;
GRANT SELECT, INSERT, UPDATE ON dbo.RejectedEvents TO order_guard_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON dbo.Outbox TO order_guard_app;
GRANT SELECT, INSERT, UPDATE ON dbo.OutboxPurge TO order_guard_app;
GRANT SELECT, INSERT, DELETE ON dbo.OutboxEpoch TO order_guard_app;
GO

-- order-guard: rows are rewritten here
-- (Everything above runs in the migration's first transaction, then the
-- execution procedure is created and granted; `migrate` then converts the
-- positions in batches, each its own transaction; what follows runs in its
-- last transaction.)

-- Version 2 → 3, last step: every position is converted. Units becomes
-- NOT NULL by a CHECK constraint (ALTER COLUMN … NOT NULL is not portable),
-- which is also the check that no row was left: adding it fails on a NULL.
IF EXISTS (SELECT 1 FROM sys.columns
            WHERE object_id = OBJECT_ID(N'dbo.Positions') AND name = N'QuantityV2')
BEGIN
    EXEC sp_executesql N'ALTER TABLE dbo.Positions ADD CONSTRAINT CK_Positions_Units CHECK (Units IS NOT NULL)';
    EXEC sp_executesql N'ALTER TABLE dbo.Positions DROP COLUMN QuantityV2';
END
GO

-- Version 2: version 1 plus StoreIdentity. Version 3: positions in units
-- (above). Version 4: the outbox and the execution procedure that writes
-- it. The rows are written last, in the migration's transaction: when they
-- are there, everything above is. Version 3's row stays: instances of
-- version 3 still running during a rolling upgrade check for it, and go on
-- with their own procedure (`_v1`, left in place), unannounced. Version 5:
-- the purge's watermark; version 4's instances go on purging without
-- raising it until they are replaced. Version 6: the outbox's epochs, the
-- first raised here; version 5's instances number rows without raising
-- one until they are replaced (their rows take the epoch in force).
IF NOT EXISTS (SELECT 1 FROM dbo.SchemaVersion WHERE Version = 3)
    INSERT INTO dbo.SchemaVersion (Version, AppliedAt) VALUES (3, SYSUTCDATETIME());
GO

IF NOT EXISTS (SELECT 1 FROM dbo.SchemaVersion WHERE Version = 4)
    INSERT INTO dbo.SchemaVersion (Version, AppliedAt) VALUES (4, SYSUTCDATETIME());
GO

IF NOT EXISTS (SELECT 1 FROM dbo.SchemaVersion WHERE Version = 5)
    INSERT INTO dbo.SchemaVersion (Version, AppliedAt) VALUES (5, SYSUTCDATETIME());
GO

IF NOT EXISTS (SELECT 1 FROM dbo.OutboxEpoch)
    INSERT INTO dbo.OutboxEpoch (Epoch, FirstSeq)
    SELECT DATEDIFF_BIG(MILLISECOND, '19700101', SYSUTCDATETIME()),
           (SELECT ISNULL(MAX(Seq), 0) FROM dbo.Outbox) + 1;
GO

IF NOT EXISTS (SELECT 1 FROM dbo.SchemaVersion WHERE Version = 6)
    INSERT INTO dbo.SchemaVersion (Version, AppliedAt) VALUES (6, SYSUTCDATETIME());
GO
