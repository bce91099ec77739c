//! The outbox's rows: an execution announced (issue 32).
//!
//! `execute` writes one row in the same transaction as the execution (the
//! same procedure call on SQL Server, the same commit on SQLite), and only
//! then: a duplicate, a conflict, a rejection or a failed call never write
//! one. The row holds the facts a consumer acts on; the message sent is
//! built from them (`crate::outbox::envelope`), so every copy of it (a
//! dispatch retried, a lease taken over, an operator's retry) has the same
//! id and the same payload. Dispatching (`crate::outbox`) claims rows under
//! a lease, sends them, and marks them dispatched; dispatched rows are
//! deleted after a retention.

use std::time::Duration;

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

/// An outbox row as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announcement {
    /// [`message_id`] of the order.
    pub message_id: String,
    /// Insertion order in this store (the order claims follow).
    pub seq: i64,
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

/// Rows claimed by one dispatcher, under one lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// What the claim wrote on its rows: a deferral names it, so a
    /// dispatcher whose lease ran out cannot defer a row another claimed.
    pub token: String,
    pub rows: Vec<Announcement>,
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

/// Which rows `announcements` lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listing {
    /// Not dispatched yet, parked ones included, oldest first.
    Undispatched,
    /// The row of one order, dispatched or not.
    Order(String),
}

/// The outbox at a glance (`status`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutboxCounts {
    /// Waiting to be dispatched (parked ones included).
    pub undispatched: u64,
    /// Of which parked for an operator.
    pub parked: u64,
    /// Dispatched, kept until the retention ends.
    pub dispatched: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `message_id("ORD-1")`, as Python's `uuid.uuid5` computes it: it must
    /// never change.
    const PINNED_ORD_1: &str = "eec40ef8-f4e4-53b0-b4e0-bffbccde185c";

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
