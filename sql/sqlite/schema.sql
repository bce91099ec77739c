-- order-guard schema for the embedded SQLite store (version 1).
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

INSERT OR IGNORE INTO SchemaVersion (Version, AppliedAt)
VALUES (1, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));
