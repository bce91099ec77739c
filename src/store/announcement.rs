//! The outbox's rows: an execution announced.
//!
//! `execute` writes one row in the same transaction as the execution (the
//! same procedure call on SQL Server, the same commit on SQLite), and only
//! then: a duplicate, a conflict, a rejection or a failed call never write
//! one. The row holds the facts a consumer acts on; the message sent is
//! built from them (`crate::outbox::envelope`), so every copy of it (a
//! dispatch retried, a lease taken over, an operator's retry) has the same
//! id and the same payload. Dispatching (`crate::outbox`) holds rows under
//! a lease (claimed, or born leased to it: [`Handoff`]), sends them, and
//! marks them dispatched; dispatched rows are deleted after a retention.
//! The store holds the rows and hands over births; the rules of leases
//! (which births go, within what time) are the outbox's.

use std::time::{Duration, Instant};

use rust_decimal::Decimal;

use crate::position::Position;

/// The kind of every row written today (the event type is
/// `<prefix>.<kind>`, the prefix a dispatch setting).
pub const ORDER_EXECUTED: &str = "OrderExecuted";

/// The namespace of [`message_id`]'s name-based UUIDs: fixed forever, or
/// the ids of rows written before and after a change would differ.
const MESSAGE_ID_NAMESPACE: uuid::Uuid = uuid::uuid!("5d0f3e0b-7f3c-4c8e-9a51-0b6f2b1e6a27");

/// The announcement's id for an order: a name-based UUID (RFC 9562 version
/// 5) of the kind and the order id, so every retry, replay and redelivery
/// of the order names the same message, on any instance and any store, and
/// a consumer deduplicates on it.
pub fn message_id(order_id: &str) -> String {
    let name = format!("{ORDER_EXECUTED}\u{0}{order_id}");
    uuid::Uuid::new_v5(&MESSAGE_ID_NAMESPACE, name.as_bytes())
        .hyphenated()
        .to_string()
}

/// The epoch a raise opens: the time now in milliseconds since 1970 (UTC),
/// or one past the newest epoch when the clock is not past it (two raises
/// in one millisecond, a clock behind another's), so epochs only grow.
///
/// Why epochs: a row's `seq` never goes back while the database keeps its
/// history, but a database restored to an earlier point, copied, or failed
/// over with data loss numbers again from that point: numbers already
/// announced are handed out once more, to other executions. Whatever
/// brings such a database into use breaks every connection to it, so each
/// writer raises the epoch before it numbers anything on a connection (on
/// SQL Server every connection the pool opens, before anyone uses it; on
/// SQLite each process, before its first row), and a row's epoch is the
/// newest raised before its number (`OutboxEpoch`: each epoch with the
/// first `seq` it covers). A raise after a restore is later, by the clock,
/// than every raise the lost history made, so every number handed out
/// again carries a higher epoch than its first use: `(epoch, seq)` never
/// goes back, and within one history it orders rows as `seq` does. A
/// raise where nothing was lost costs a consumer nothing. Pure.
pub fn next_epoch(now_millis: i64, newest: Option<i64>) -> i64 {
    match newest {
        Some(newest) if newest >= now_millis => newest + 1,
        _ => now_millis,
    }
}

/// An outbox row as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announcement {
    /// [`message_id`] of the order.
    pub message_id: String,
    /// Insertion order in this store (the order claims follow).
    pub seq: i64,
    /// The store's epoch for this row's `seq` (see [`epoch`]): the newest
    /// epoch raised before the row was numbered. `None` for a row numbered
    /// before the store kept epochs (an earlier version's).
    pub epoch: Option<i64>,
    /// [`ORDER_EXECUTED`].
    pub kind: String,
    pub order_id: String,
    pub account_id: String,
    /// `buy` or `sell`.
    pub side: String,
    pub symbol: String,
    pub quantity: Decimal,
    /// The account's position in the symbol right after this order.
    pub position_after: Position,
    /// When the order was executed (UTC, RFC 3339), as its row says.
    pub executed_at: String,
    pub fingerprint: String,
    /// Sends tried and failed.
    pub attempts: i64,
    /// Why the last send failed.
    pub last_error: Option<String>,
    /// Left for an operator (`order-guard outbox retry`): no dispatcher
    /// claims it until then.
    pub parked: bool,
    /// When it was dispatched (`None`: not yet).
    pub dispatched_at: Option<String>,
}

#[cfg(test)]
impl Announcement {
    /// An undispatched row of `order_id` with placeholder facts, for unit
    /// tests of what is done with rows.
    pub(crate) fn sample(order_id: &str) -> Announcement {
        Announcement {
            message_id: message_id(order_id),
            seq: 1,
            epoch: Some(1),
            kind: ORDER_EXECUTED.into(),
            order_id: order_id.into(),
            account_id: "a".into(),
            side: "buy".into(),
            symbol: "s".into(),
            quantity: Decimal::ONE,
            position_after: Position::ZERO,
            executed_at: "t".into(),
            fingerprint: "f".into(),
            attempts: 0,
            last_error: None,
            parked: false,
            dispatched_at: None,
        }
    }
}

/// Rows claimed by one dispatcher, under one lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// What the claim wrote on its rows: a deferral names it, so a
    /// dispatcher whose lease ran out cannot defer a row another claimed.
    pub token: String,
    pub rows: Vec<Announcement>,
}

/// The hand-over of the rows a store's `execute` writes born leased to its
/// process's dispatcher (`OrderStore::hand_over_announcements`): each row
/// is written already leased for its `lease` (under no claim's token), in
/// the transaction that executes its order, and handed over once that
/// transaction has committed. The dispatcher sends it as it is, with no
/// claim (on SQLite a claim rewrote every row of its round, and its
/// statement was prepared again on every call, its bound `LIMIT`: a fifth
/// of what dispatch added to a first delivery's CPU, docs/benchmarks.md,
/// "Born leased"); which births it sends, and within what time, are the
/// outbox's lease rules (`crate::outbox::lease`).
///
/// Nothing here is needed for correctness: a row never handed over (the
/// caller gone before it, the hand-off full, the process dead) or taken too
/// late to send within its lease is claimed like any other once its lease
/// ends. The lease column, not this memory, keeps one dispatcher per row.
pub type Handoff = crate::handoff::Handoff<Birth>;

/// A row handed over, and when its lease ends by this process's monotonic
/// clock (timed from the instant the row's lease is, to within the
/// millisecond the row's text keeps).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Birth {
    pub row: Announcement,
    pub leased_until: Instant,
}

/// What happens to a row whose send failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deferral {
    pub message_id: String,
    /// The failure, for `outbox list` and the log.
    pub error: String,
    /// Claimable again after this long (ignored when `park`).
    pub retry_in: Duration,
    /// Left for an operator: the destination refused this row for good
    /// (too large, say), or it failed too many times.
    pub park: bool,
}

/// Which rows past the retention a purge deletes (`OrderStore::purge_announced`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// Rows dispatched more than the retention ago; a row not sent waits
    /// for its destination however long (a destination down for a month
    /// keeps a month of rows).
    Sent,
    /// Those, and rows due for more than the retention and never sent
    /// (neither parked nor leased): with no destination nothing sends
    /// them, and a destination set later sends what fell due within the
    /// retention, not the whole history.
    SentAndUnsent,
}

/// Which rows `announcements` lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listing {
    /// Not dispatched yet, parked ones included, oldest first.
    Undispatched,
    /// The row of one order, dispatched or not.
    Order(String),
    /// The row of one message id, dispatched or not.
    Message(String),
}

/// Which dispatched rows `outbox resend` makes due again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resend {
    /// The row of one message id.
    Message(String),
    /// Every row dispatched this long ago or later (the store's clock).
    DispatchedWithin(Duration),
}

/// The outbox at a glance (`status`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutboxCounts {
    /// Waiting to be dispatched (parked ones included).
    pub undispatched: u64,
    /// Of which parked for an operator.
    pub parked: u64,
    /// Dispatched, kept until the retention ends.
    pub dispatched: u64,
    /// The purge's watermark: the newest `executedAt` (UTC text, as
    /// [`Announcement::executed_at`]) among the rows the retention deleted;
    /// `None` while it has deleted none. An order executed then or before
    /// may have had its announcement sent and deleted: `outbox backfill`
    /// never reaches back to it.
    pub purged_through: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `message_id("ORD-1")`, as Python's `uuid.uuid5` computes it: it must
    /// never change.
    const PINNED_ORD_1: &str = "eec40ef8-f4e4-53b0-b4e0-bffbccde185c";

    #[test]
    fn an_epoch_is_the_clock_unless_the_newest_is_not_behind_it() {
        assert_eq!(next_epoch(1_000, None), 1_000, "the first: the clock");
        assert_eq!(
            next_epoch(1_000, Some(999)),
            1_000,
            "the clock past the newest"
        );
        assert_eq!(
            next_epoch(1_000, Some(1_000)),
            1_001,
            "two in one millisecond"
        );
        assert_eq!(
            next_epoch(1_000, Some(5_000)),
            5_001,
            "a clock behind the newest"
        );
    }

    #[test]
    fn the_message_id_is_a_function_of_the_order_id_alone() {
        let a = message_id("ORD-1");
        assert_eq!(a, message_id("ORD-1"));
        assert_ne!(a, message_id("ORD-2"));
        assert_ne!(a, message_id("ord-1"), "ids are exact, as everywhere");
        // Fixed forever: a row written by an earlier build names the same
        // message as a copy sent by a later one.
        assert_eq!(a, PINNED_ORD_1);
        let parsed = uuid::Uuid::parse_str(&a).unwrap();
        assert_eq!(parsed.get_version_num(), 5);
    }
}
