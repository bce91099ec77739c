//! The order store: the source of truth.
//!
//! Protocol (docs/architecture.md, "The map: the path of one event"), in one call:
//! `execute` inserts the order under a unique index on its id or finds the
//! row that holds it, and in the same transaction moves a row of this order
//! `Received → Executed` with a conditional update, applying the position
//! change only if that update changed exactly one row (or `Received →
//! Rejected`, the event stored with its reason, when the position would
//! leave `DECIMAL(38,10)`); a row of another order is answered a conflict,
//! the event stored in `RejectedEvents`; a terminal row of this order is a
//! duplicate, with no write. So a first delivery costs the store one call
//! (one round trip on SQL Server, one durable commit on SQLite), and
//! repeating it is harmless. `reject` keeps every other event we will not
//! execute, with its reason. Every backend runs the same conformance suite
//! (`tests/store_conformance.rs`).
//!
//! The same call announces the execution: an outbox row ([`announcement`])
//! is written in the transaction that executes the order, and only then;
//! the outbox operations below claim, mark, defer and purge those rows for
//! the dispatcher (`crate::outbox`).

pub mod announcement;
mod sqlite;
pub mod sqlserver;
pub mod walk_back;

use async_trait::async_trait;
use rust_decimal::Decimal;
use sha2::{Digest, Sha256};

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use crate::order::{
    canonical_instant, fingerprint_of, fingerprint_version, hex, FingerprintParts, Order,
    OrderStatus, FINGERPRINT_VERSION,
};
use crate::position::{Overflow, Position};

pub use self::announcement::{
    message_id, next_epoch, Announcement, Birth, Claim, Deferral, Expired, Handoff, Listing,
    OutboxCounts, Resend, ORDER_EXECUTED,
};
pub use self::sqlite::{
    Pressure, SqliteStore, MAX_GROUP as SQLITE_MAX_GROUP, MAX_QUEUED as SQLITE_MAX_QUEUED,
};
pub use self::sqlserver::SqlServerStore;

/// What `execute` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Execution {
    /// This call executed the order: inserted it (or found it `Received`,
    /// left by an earlier version's worker that died), applied its effect
    /// and wrote its announcement (the outbox row), in one transaction.
    Executed,
    /// The order would take its position beyond `DECIMAL(38,10)`: this call
    /// stored it `Rejected` and the event in `RejectedEvents` with the
    /// reason ([`Overflow::reason`]), in one transaction; no effect.
    Rejected(Overflow),
    /// The order was already terminal: a duplicate; nothing written.
    AlreadyDone,
    /// Another order holds this id: this event is stored in
    /// `RejectedEvents` as a conflict (once; a redelivery is counted).
    Conflict { existing_fingerprint: String },
}

/// Most times a store sends its execution again within one call: after a
/// race lost on a unique index (the row is then there), for a row of an
/// older fingerprint version that is this order, or to store an overflow
/// with its reason. Each needs one more at most; more means the row keeps
/// changing, and the call fails (`retry`).
pub const MAX_EXECUTION_TRIES: usize = 4;

/// Why an event is kept in `RejectedEvents`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectionKind {
    /// The event or its order is invalid, or the order cannot be executed
    /// (its position would overflow): retrying cannot fix it.
    Poison,
    /// Same order id, different content.
    Conflict,
}

impl RejectionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RejectionKind::Poison => "poison",
            RejectionKind::Conflict => "conflict",
        }
    }
}

/// An event we will not execute, with everything needed to look into it later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub kind: RejectionKind,
    pub order_id: Option<String>,
    pub event_id: Option<String>,
    pub reason: String,
    pub fingerprint: Option<String>,
    pub existing_fingerprint: Option<String>,
    /// The event as it arrived (JSON text).
    pub raw_event: String,
}

impl Rejection {
    /// The rejection `execute` stores with an order it refuses because its
    /// position would overflow.
    pub fn position_overflow(
        order: &Order,
        event_id: &str,
        raw_event: &str,
        overflow: &Overflow,
    ) -> Rejection {
        Rejection {
            kind: RejectionKind::Poison,
            order_id: Some(order.order_id.clone()),
            event_id: Some(event_id.to_string()),
            reason: overflow.reason(&order.account_id, &order.symbol),
            fingerprint: Some(order.fingerprint().to_string()),
            existing_fingerprint: None,
            raw_event: raw_event.to_string(),
        }
    }

    /// The conflict `execute` stores when another order (`existing`, its
    /// fingerprint) holds this order's id.
    pub fn conflict(order: &Order, event_id: &str, raw_event: &str, existing: &str) -> Rejection {
        Rejection {
            kind: RejectionKind::Conflict,
            order_id: Some(order.order_id.clone()),
            event_id: Some(event_id.to_string()),
            reason: conflict_reason(order, existing),
            fingerprint: Some(order.fingerprint().to_string()),
            existing_fingerprint: Some(existing.to_string()),
            raw_event: raw_event.to_string(),
        }
    }

    /// Identity of this rejection: a redelivered poison event is stored once
    /// (its delivery count goes up), not once per delivery.
    pub fn event_hash(&self) -> String {
        event_hash(self.kind, &self.raw_event)
    }
}

/// The `EventHash` a rejection of `kind` for the event `raw_event` is kept
/// under (see [`Rejection::event_hash`]).
pub fn event_hash(kind: RejectionKind, raw_event: &str) -> String {
    let mut h = Sha256::new();
    h.update(kind.as_str());
    h.update([0]);
    h.update(raw_event.as_bytes());
    hex(&h.finalize())
}

/// Why a conflicting event is refused: both fingerprints, shortened.
pub fn conflict_reason(order: &Order, existing: &str) -> String {
    let (head, tail) = conflict_reason_around(order);
    format!("{head}{}{tail}", short_fingerprint(existing))
}

/// [`conflict_reason`] without the existing fingerprint, which goes between
/// the two parts (for a store that learns it only inside its transaction).
pub fn conflict_reason_around(order: &Order) -> (String, String) {
    (
        format!(
            "order id {} is already used by a different order (fingerprint ",
            order.order_id
        ),
        format!(" ≠ {})", short_fingerprint(order.fingerprint())),
    )
}

/// A fingerprint's version prefix (`v2:`, none for version 1) and the first
/// 12 digits of its hash.
pub fn short_fingerprint(fp: &str) -> &str {
    let version = fp.find(':').filter(|&i| i <= 4).map_or(0, |i| i + 1);
    fp.get(..fp.len().min(version + 12)).unwrap_or(fp)
}

/// An order row as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderRecord {
    pub order_id: String,
    pub fingerprint: String,
    pub account_id: String,
    pub side: String,
    pub symbol: String,
    pub quantity: Decimal,
    pub limit_price: Option<Decimal>,
    pub currency: Option<String>,
    pub status: OrderStatus,
    pub attempts: i64,
    pub received_at: String,
    pub executed_at: Option<String>,
    /// `placedAt` as stored (canonical UTC text since fingerprint v2).
    pub placed_at: Option<String>,
}

impl OrderRecord {
    /// The row's fingerprint in the current version: the stored one when it
    /// is of this version, else recomputed from the row's columns (which hold
    /// every field a fingerprint covers) under today's normalization. So a
    /// change of normalization never turns the redelivery of an order stored
    /// before it into a conflict: the row decides, not the old hash.
    pub fn current_fingerprint(&self) -> Cow<'_, str> {
        if fingerprint_version(&self.fingerprint) == FINGERPRINT_VERSION {
            return Cow::Borrowed(&self.fingerprint);
        }
        let placed_at = self
            .placed_at
            .as_deref()
            .map(|p| canonical_instant(p).unwrap_or_else(|_| p.to_string()));
        Cow::Owned(fingerprint_of(&FingerprintParts {
            order_id: &self.order_id,
            account_id: &self.account_id,
            side: &self.side,
            symbol: &self.symbol,
            quantity: self.quantity,
            limit_price: self.limit_price,
            currency: self.currency.as_deref(),
            placed_at: placed_at.as_deref(),
        }))
    }
}

/// A stored rejected event (for tests, audits and `status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedRecord {
    pub kind: String,
    pub order_id: Option<String>,
    pub reason: String,
    pub fingerprint: Option<String>,
    pub existing_fingerprint: Option<String>,
    pub raw_event: String,
    pub deliveries: i64,
}

/// The identity a store reports: the id its schema made once, bound to
/// where the database lives now (`place`: what a copy cannot share). A
/// copy of the database (`CREATE DATABASE … AS COPY OF`, a restore as a new
/// database, a BACPAC import, a copied SQLite file) carries the stored id
/// but lives elsewhere, so its identity differs, and the completion markers
/// one writes never answer for the other. `<stored id>.<16 hex digits>`:
/// no `/`, which separates a marker's identity from its fingerprint.
pub fn bound_identity(stored: &str, place: &[&str]) -> String {
    let mut h = Sha256::new();
    for part in place {
        h.update(part.as_bytes());
        h.update([0]);
    }
    let digest = hex(&h.finalize());
    format!("{stored}.{}", &digest[..16])
}

/// A store failure, classified for the processor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// Worth retrying later (busy, deadlock, timeout, connection lost).
    #[error("transient store failure: {0}")]
    Transient(String),
    /// Retrying the same call will not help until someone fixes something.
    #[error("store failure: {0}")]
    Permanent(String),
    /// The deployment is wrong: the database user lacks a right order-guard
    /// needs, or the schema's objects are not there. No call of any order
    /// can succeed until an operator acts; the message names what is
    /// missing and the fix. A start refuses to go on.
    #[error("store misconfigured: {0}")]
    Misconfigured(String),
    /// The schema is older than this build and the database user may not
    /// upgrade it: the database admin's `order-guard migrate` fixes it (the
    /// message says so), and a running `serve` picks that up by itself.
    #[error("store schema not migrated: {0}")]
    Unmigrated(String),
}

impl StoreError {
    /// No retry can fix this until an operator acts (a right or the schema
    /// missing): a command stops at once instead of retrying.
    pub fn needs_operator(&self) -> bool {
        matches!(
            self,
            StoreError::Misconfigured(_) | StoreError::Unmigrated(_)
        )
    }
}

/// A store's [`OrderStore::parallelism`] unless it says otherwise.
pub const DEFAULT_PARALLELISM: usize = 64;

/// The store's operations; see the module documentation for the protocol.
#[async_trait]
pub trait OrderStore: Send + Sync {
    /// `"sqlite"` or `"sqlserver"`, for logs.
    fn name(&self) -> &'static str;

    /// How many events of one delivery are processed at once against this
    /// store: as many as it serves together (its connections, or one
    /// commit's group), so a batch of thousands neither overflows its queue
    /// nor waits in one.
    fn parallelism(&self) -> usize {
        DEFAULT_PARALLELISM
    }

    /// Create or upgrade the schema and check this process may use it (its
    /// rights); idempotent and safe to run concurrently. What every start
    /// runs, bounded as a start must be.
    async fn migrate(&self) -> Result<(), StoreError>;

    /// `order-guard migrate`: [`OrderStore::migrate`] however long the
    /// upgrade takes (a store may bound it by a setting of its own).
    async fn upgrade(&self) -> Result<(), StoreError> {
        self.migrate().await
    }

    /// What a command that only reads (`status`, `outbox list`) runs
    /// first: the schema is current, with no right to write asked for (an
    /// operator's read-only login; on SQL Server the role
    /// `order_guard_reader`). By default [`OrderStore::migrate`].
    async fn check_for_reading(&self) -> Result<(), StoreError> {
        self.migrate().await
    }

    /// This database's identity ([`bound_identity`]): made once with the
    /// schema and bound to where the database lives, so an in-place restore
    /// keeps it and a copy or another database has another. What binds the
    /// guard's completion markers to this store.
    async fn identity(&self) -> Result<String, StoreError>;

    /// Execute the order once, in one call: see the module documentation
    /// and [`Execution`]. `event_id` and `raw_event` (the event as it
    /// arrived) are kept with a rejection or a conflict.
    async fn execute(
        &self,
        order: &Order,
        event_id: &str,
        raw_event: &str,
    ) -> Result<Execution, StoreError>;

    /// Keep an event we will not execute.
    async fn reject(&self, rejection: &Rejection) -> Result<(), StoreError>;

    /// The order row, if any.
    async fn order(&self, order_id: &str) -> Result<Option<OrderRecord>, StoreError>;

    /// The net position of an account in a symbol, exact (`None`: never traded).
    async fn position(
        &self,
        account_id: &str,
        symbol: &str,
    ) -> Result<Option<Position>, StoreError>;

    /// Rejected events stored for an order id (`None`: those without an id).
    async fn rejections(&self, order_id: Option<&str>) -> Result<Vec<RejectedRecord>, StoreError>;

    /// From now on the rows `execute` writes are born leased for `lease` to
    /// this process's dispatcher and handed to it once committed
    /// ([`Handoff`]), so it sends them without claiming. `None`: this store
    /// does not (its rows are claimed). The dispatcher that runs in this
    /// process calls it once, as it starts; a second call answers the same
    /// hand-off.
    fn hand_over_announcements(&self, lease: Duration) -> Option<Arc<Handoff>> {
        let _ = lease;
        None
    }

    /// The outbox: claim up to `limit` announcements due for dispatch
    /// (not dispatched, not parked, past their retry time, no live lease),
    /// oldest first, under a lease of `lease` written on the rows with a
    /// new token, so no other dispatcher claims them until it runs out.
    async fn claim_announcements(&self, limit: u32, lease: Duration) -> Result<Claim, StoreError>;

    /// Mark these announcements (as a claim or a hand-off gave them)
    /// dispatched, in one call (one round trip, one commit); answers how
    /// many were still undispatched.
    async fn mark_announced(&self, sent: &[Announcement]) -> Result<u64, StoreError>;

    /// A send failed: count it, keep why, and make the row claimable again
    /// after `retry_in` (or park it for an operator). Only while the row is
    /// still held as its sender held it: under `Some(token)`, a claim's, or
    /// `None` for a row born leased to this process ([`Handoff`]) that no
    /// claim has taken since.
    async fn defer_announcement(
        &self,
        token: Option<&str>,
        deferral: &Deferral,
    ) -> Result<(), StoreError>;

    /// Delete up to `limit` announcements dispatched more than `retention`
    /// ago, oldest first, and with [`Expired::SentAndUnsent`] those due
    /// for more than `retention` and never sent, in one short transaction;
    /// answers how many. One instance at a time (another's call meanwhile
    /// deletes nothing).
    async fn purge_announced(
        &self,
        retention: Duration,
        limit: u32,
        expired: Expired,
    ) -> Result<u64, StoreError>;

    /// Announcements, for `outbox list`, `status` and audits (at most `limit`).
    async fn announcements(
        &self,
        listing: &Listing,
        limit: u32,
    ) -> Result<Vec<Announcement>, StoreError>;

    /// How many announcements wait, are parked, and are kept dispatched.
    async fn outbox_counts(&self) -> Result<OutboxCounts, StoreError>;

    /// `outbox retry`: make parked or waiting announcements (one, or all)
    /// due now; answers how many.
    async fn retry_announcements(&self, message_id: Option<&str>) -> Result<u64, StoreError>;

    /// `outbox resend`: make dispatched announcements undispatched and due
    /// now, as they were (same id, same `Seq`), so the dispatchers send
    /// them again; answers how many.
    async fn resend_announcements(&self, which: &Resend) -> Result<u64, StoreError>;

    /// `outbox backfill`: give the orders executed `within` ago or later
    /// that have no announcement (executed by an earlier version's
    /// instances, which wrote none) the one their execution would have
    /// written: the same message id, its facts, the position right after
    /// it; a new sequence, above every earlier one, in their execution
    /// order. Born due, for the serving instances' dispatchers. With
    /// `write` false only counts them. Answers how many; once given, an
    /// order is never given another.
    async fn backfill_announcements(
        &self,
        within: Duration,
        write: bool,
    ) -> Result<u64, StoreError>;

    /// What the store can show of its load, for telemetry's gauges (no I/O;
    /// nothing by default).
    fn load(&self) -> StoreLoad {
        StoreLoad::default()
    }
}

/// A connection pool's state (bb8's), read without I/O.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolLoad {
    /// Connections open, idle or in use.
    pub open: u64,
    /// Of which idle.
    pub idle: u64,
    /// Callers waiting for a connection now.
    pub pending: u64,
    /// Callers that stopped waiting at the connect timeout (cumulative).
    pub timeouts: u64,
    /// Logins in flight now: holding one of the pool's login turns, and
    /// waiting for one (or pausing after a failed attempt).
    pub logins_running: u64,
    pub logins_waiting: u64,
}

/// A store's load, read without I/O (`OrderStore::load`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreLoad {
    /// The connection pool (SQL Server).
    pub pool: Option<PoolLoad>,
    /// The writer's queue: calls refused because it was full, calls skipped
    /// because their caller had stopped waiting; cumulative (SQLite).
    pub writer: Option<(u64, u64)>,
}
