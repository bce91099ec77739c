-- order-guard schema for the embedded SQLite store (version 2: version 1
-- plus the outbox).
-- Applied by `order-guard migrate` (and at `serve` start) inside one
-- IMMEDIATE transaction, so it is idempotent and safe from two processes.
-- Decimals are kept as exact decimal text, never as REAL.

CREATE TABLE IF NOT EXISTS SchemaVersion (
    Version   INTEGER PRIMARY KEY,
    AppliedAt TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS Orders (
    Id          INTEGER PRIMARY KEY,
    OrderId     TEXT NOT NULL,
    Fingerprint TEXT NOT NULL,
    EventId     TEXT,
    AccountId   TEXT NOT NULL,
    Side        TEXT NOT NULL CHECK (Side IN ('buy', 'sell')),
    Symbol      TEXT NOT NULL,
    Quantity    TEXT NOT NULL,
    LimitPrice  TEXT,
    Currency    TEXT,
    PlacedAt    TEXT,
    Status      TEXT NOT NULL CHECK (Status IN ('Received', 'Executed', 'Rejected')),
    Attempts    INTEGER NOT NULL DEFAULT 1,
    ReceivedAt  TEXT NOT NULL,
    ExecutedAt  TEXT
);

-- The last line of defence: a duplicate that got past the guard fails here.
CREATE UNIQUE INDEX IF NOT EXISTS UX_Orders_OrderId ON Orders (OrderId);

CREATE TABLE IF NOT EXISTS Positions (
    AccountId TEXT NOT NULL,
    Symbol    TEXT NOT NULL,
    Quantity  TEXT NOT NULL,
    UpdatedAt TEXT NOT NULL,
    PRIMARY KEY (AccountId, Symbol)
);

CREATE TABLE IF NOT EXISTS RejectedEvents (
    Id                  INTEGER PRIMARY KEY,
    EventHash           TEXT NOT NULL,
    Kind                TEXT NOT NULL CHECK (Kind IN ('poison', 'conflict')),
    OrderId             TEXT,
    EventId             TEXT,
    Reason              TEXT NOT NULL,
    Fingerprint         TEXT,
    ExistingFingerprint TEXT,
    RawEvent            TEXT NOT NULL,
    Deliveries          INTEGER NOT NULL DEFAULT 1,
    FirstSeenAt         TEXT NOT NULL,
    LastSeenAt          TEXT NOT NULL
);

CREATE UNIQUE INDEX IF NOT EXISTS UX_RejectedEvents_EventHash ON RejectedEvents (EventHash);
CREATE INDEX IF NOT EXISTS IX_RejectedEvents_OrderId ON RejectedEvents (OrderId);

-- This database's identity, made once with the schema: the guard's
-- completion markers carry it, so two databases sharing one cache (dev and
-- prod, a blue/green pair) never answer each other's orders `duplicate`.
CREATE TABLE IF NOT EXISTS StoreIdentity (
    Id TEXT NOT NULL PRIMARY KEY
);
INSERT INTO StoreIdentity (Id)
SELECT lower(hex(randomblob(16))) WHERE NOT EXISTS (SELECT 1 FROM StoreIdentity);

-- The outbox (version 2): one row per executed order, written in the
-- transaction that executes it, dispatched after the commit, deleted after
-- a retention (src/store/announcement.rs). Times are UTC text of one
-- format, so they compare as text. IX_Outbox_DispatchedAt serves the purge
-- (oldest DispatchedAt); IX_Outbox_Due the claim (undispatched rows in the
-- order they fall due: the scan stops at the first not due yet; a parked
-- row's NextAttemptAt is the end of time); IX_Outbox_ClaimToken the
-- read-back of earlier versions' claims (this one's claim is one UPDATE …
-- RETURNING). It is kept: an earlier version on the same file (a rolling
-- deploy, a rollback, an older CLI) reads by it, and its migrate would
-- rebuild it over the whole table under the write lock (docs/benchmarks.md,
-- "Where the writer's CPU goes"). A row born leased to its process's
-- dispatcher has no token (NULL until a claim takes it), so it never goes
-- into this index. UX_Outbox_MessageId serves the
-- dispatcher's defer (and earlier versions' mark; this one's finds its
-- rows by Seq), both of undispatched rows. All four are
-- partial, each over the rows its queries read (whose filters imply its
-- own): a new row goes only into the small indexes of undispatched rows,
-- where full ones put it into indexes of every row kept (at the far left,
-- or for the message id at a random place), which with a million rows
-- slowed the purge threefold and the first rounds of first deliveries
-- after a start. The message id stays unique over every row through the
-- orders' unique id it is derived from: an order is executed, and
-- announced, once. Earlier versions made the four full; migrate remakes
-- those (src/store/sqlite/schema.rs).
CREATE TABLE IF NOT EXISTS Outbox (
    Seq           INTEGER PRIMARY KEY,
    MessageId     TEXT NOT NULL,
    Kind          TEXT NOT NULL,
    OrderId       TEXT NOT NULL,
    AccountId     TEXT NOT NULL,
    Side          TEXT NOT NULL,
    Symbol        TEXT NOT NULL,
    Quantity      TEXT NOT NULL,
    PositionAfter TEXT NOT NULL,
    Fingerprint   TEXT NOT NULL,
    ExecutedAt    TEXT NOT NULL,
    CreatedAt     TEXT NOT NULL,
    Attempts      INTEGER NOT NULL DEFAULT 0,
    NextAttemptAt TEXT NOT NULL,
    LeaseUntil    TEXT NOT NULL,
    ClaimToken    TEXT,
    LastError     TEXT,
    Parked        INTEGER NOT NULL DEFAULT 0,
    DispatchedAt  TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS UX_Outbox_MessageId ON Outbox (MessageId) WHERE DispatchedAt IS NULL;
CREATE INDEX IF NOT EXISTS IX_Outbox_DispatchedAt ON Outbox (DispatchedAt, Seq) WHERE DispatchedAt IS NOT NULL;
CREATE INDEX IF NOT EXISTS IX_Outbox_Due ON Outbox (NextAttemptAt, Seq) WHERE DispatchedAt IS NULL;
CREATE INDEX IF NOT EXISTS IX_Outbox_ClaimToken ON Outbox (ClaimToken) WHERE ClaimToken IS NOT NULL;

-- The outbox's purge watermark: the newest ExecutedAt among the rows the
-- retention deleted, raised by each purge, never lowered. `outbox
-- backfill` refuses to reach back to it: an order executed then may have
-- had its announcement sent and deleted, and would be announced twice.
CREATE TABLE IF NOT EXISTS OutboxPurge (
    Id              INTEGER PRIMARY KEY CHECK (Id = 1),
    ExecutedThrough TEXT NOT NULL
);

-- The outbox's epochs: each the milliseconds since 1970 when a writer
-- raised it (or one past the newest), with the first Seq it covers. A
-- row's epoch is the newest raised at or below its Seq. Each process
-- raises one before the first row it writes, so a file restored from a
-- backup (which numbers again from the backup's point) numbers under a
-- higher epoch than the history it lost (src/store/announcement.rs,
-- `next_epoch`). The purge deletes the epochs no kept row needs.
CREATE TABLE IF NOT EXISTS OutboxEpoch (
    Epoch    INTEGER PRIMARY KEY,
    FirstSeq INTEGER NOT NULL
);

INSERT OR IGNORE INTO SchemaVersion (Version, AppliedAt)
VALUES (1, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));
INSERT OR IGNORE INTO SchemaVersion (Version, AppliedAt)
VALUES (2, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));
