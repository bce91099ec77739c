-- order-guard schema for SQL Server / Azure SQL (version 3).
--
-- Applied by `order-guard migrate` (and at `serve` start) inside one
-- transaction that first takes an exclusive application lock
-- (sp_getapplock), so two processes migrating at once run one after the
-- other, and checks the version again under the lock. Every batch checks
-- before it creates (the execution procedure, made by `migrate` after these
-- batches, is dropped and created), so running it twice changes nothing.
-- Batches are separated by lines holding only GO; each is sent on its own.
--
-- Portable T-SQL only (docs/protocol.md 7.4): no MERGE, no CREATE OR ALTER,
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

-- Version 2 → 3: Quantity DECIMAL(38,10) becomes Units DECIMAL(38,0). The
-- column is added NOT NULL with a default (ALTER COLUMN … NOT NULL is not
-- portable), each value then converted exactly through its text (style 0
-- writes all ten decimals: '-12.5000000000' becomes -125000000000), and
-- Quantity dropped in the same transaction, so an instance of an earlier
-- version still running fails on every position statement (and answers
-- retry) instead of writing a column nobody reads. Dynamic SQL: a statement
-- naming a column that is not there does not compile.
IF NOT EXISTS (SELECT 1 FROM sys.columns
                WHERE object_id = OBJECT_ID(N'dbo.Positions') AND name = N'Units')
    ALTER TABLE dbo.Positions
        ADD Units DECIMAL(38, 0) NOT NULL CONSTRAINT DF_Positions_Units DEFAULT 0;
GO

IF EXISTS (SELECT 1 FROM sys.columns
            WHERE object_id = OBJECT_ID(N'dbo.Positions') AND name = N'Quantity')
BEGIN
    EXEC sp_executesql N'UPDATE dbo.Positions
        SET Units = CONVERT(DECIMAL(38, 0), REPLACE(CONVERT(VARCHAR(64), Quantity), ''.'', ''''))';
    EXEC sp_executesql N'ALTER TABLE dbo.Positions DROP COLUMN Quantity';
END
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

-- Version 2: version 1 plus StoreIdentity. Version 3: positions in units
-- (above). The row is written last, in the migration's transaction: when it
-- is there, everything above is.
IF NOT EXISTS (SELECT 1 FROM dbo.SchemaVersion WHERE Version = 3)
    INSERT INTO dbo.SchemaVersion (Version, AppliedAt) VALUES (3, SYSUTCDATETIME());
GO
