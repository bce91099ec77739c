//! What a consumer receives for an announcement: pure functions of the
//! outbox row, so every copy of a message (a retry, a lease taken over, an
//! operator's retry) carries the same id and the same bytes.
//!
//! On a Storage Queue the message is a CloudEvents 1.0 JSON event (the
//! structured mode), base64-encoded by default as a Functions Queue trigger
//! expects. `id` is the row's message id: consumers deduplicate on it.
//! Decimals travel as strings, exactly as stored.

use serde_json::{json, Value};

use crate::store::Announcement;

/// How events are named (settings of the dispatch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Naming {
    /// `<prefix>.<kind>`: `OrderGuard.OrderExecuted` by default.
    pub type_prefix: String,
    /// The CloudEvents `source` (a URI reference naming this producer).
    pub source: String,
}

impl Default for Naming {
    fn default() -> Naming {
        Naming {
            type_prefix: "OrderGuard".into(),
            source: "/order-guard".into(),
        }
    }
}

/// The event type of a row.
pub fn event_type(naming: &Naming, a: &Announcement) -> String {
    format!("{}.{}", naming.type_prefix, a.kind)
}

/// The facts a consumer acts on. `sequence` is the row's place in this
/// store's outbox: one position's orders execute one at a time (its row is
/// locked), so within an account and symbol it grows with execution order,
/// the order key a consumer needs (arrival order is not one).
pub fn data(a: &Announcement) -> Value {
    json!({
        "sequence": a.seq,
        "orderId": a.order_id,
        "accountId": a.account_id,
        "side": a.side,
        "symbol": a.symbol,
        "quantity": a.quantity.normalize().to_string(),
        "positionAfter": a.position_after.to_string(),
        "executedAt": a.executed_at,
        "fingerprint": a.fingerprint,
    })
}

/// The row as a CloudEvents 1.0 event (JSON, structured mode).
pub fn cloud_event(naming: &Naming, a: &Announcement) -> Value {
    json!({
        "specversion": "1.0",
        "id": a.message_id,
        "source": naming.source,
        "type": event_type(naming, a),
        "subject": format!("orders/{}", a.order_id),
        "time": a.executed_at,
        "datacontenttype": "application/json",
        "data": data(a),
    })
}

/// The row as an Event Grid schema event (a topic created with the Event
/// Grid input schema).
pub fn event_grid_event(naming: &Naming, a: &Announcement) -> Value {
    json!({
        "id": a.message_id,
        "subject": format!("orders/{}", a.order_id),
        "eventType": event_type(naming, a),
        "eventTime": a.executed_at,
        "data": data(a),
        "dataVersion": "1.0",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rust_decimal::Decimal;
    use std::str::FromStr;

    fn row() -> Announcement {
        Announcement {
            message_id: crate::store::message_id("ORD-1"),
            seq: 7,
            kind: crate::store::ORDER_EXECUTED.into(),
            order_id: "ORD-1".into(),
            account_id: "ACC-9".into(),
            side: "sell".into(),
            symbol: "MSFT".into(),
            quantity: Decimal::from_str("10.50").unwrap(),
            position_after: "-0.0000000001".parse().unwrap(),
            executed_at: "2026-12-02T08:00:00.123Z".into(),
            fingerprint: "v2:abc".into(),
            attempts: 3,
            last_error: Some("503".into()),
            parked: false,
            dispatched_at: None,
        }
    }

    #[test]
    fn the_event_is_the_rows_facts_and_nothing_of_its_dispatch() {
        let e = cloud_event(&Naming::default(), &row());
        assert_eq!(
            e,
            json!({
                "specversion": "1.0",
                "id": "eec40ef8-f4e4-53b0-b4e0-bffbccde185c",
                "source": "/order-guard",
                "type": "OrderGuard.OrderExecuted",
                "subject": "orders/ORD-1",
                "time": "2026-12-02T08:00:00.123Z",
                "datacontenttype": "application/json",
                "data": {
                    "sequence": 7,
                    "orderId": "ORD-1", "accountId": "ACC-9", "side": "sell", "symbol": "MSFT",
                    "quantity": "10.5", "positionAfter": "-0.0000000001",
                    "executedAt": "2026-12-02T08:00:00.123Z", "fingerprint": "v2:abc"
                }
            })
        );
        // A retry's bookkeeping never reaches the consumer: the same bytes.
        let mut later = row();
        later.attempts = 9;
        later.last_error = None;
        assert_eq!(
            cloud_event(&Naming::default(), &later).to_string(),
            e.to_string()
        );
    }

    #[test]
    fn the_event_grid_form_carries_the_same_facts() {
        let e = event_grid_event(&Naming::default(), &row());
        let c = cloud_event(&Naming::default(), &row());
        assert_eq!(e["id"], c["id"]);
        assert_eq!(e["eventType"], c["type"]);
        assert_eq!(e["subject"], c["subject"]);
        assert_eq!(e["eventTime"], c["time"]);
        assert_eq!(e["data"], c["data"]);
        assert_eq!(e["dataVersion"], "1.0");
        assert_eq!(e.as_object().unwrap().len(), 6);
    }

    #[test]
    fn the_type_takes_the_configured_prefix() {
        let naming = Naming {
            type_prefix: "Contoso.Trading".into(),
            source: "/contoso/orders".into(),
        };
        let e = cloud_event(&naming, &row());
        assert_eq!(e["type"], "Contoso.Trading.OrderExecuted");
        assert_eq!(e["source"], "/contoso/orders");
    }
}
