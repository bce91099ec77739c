//! What a consumer receives for an announcement: pure functions of the
//! outbox row, so every copy of a message (a retry, a lease taken over, an
//! operator's retry) carries the same id and the same bytes.
//!
//! On a Storage Queue the message is a CloudEvents 1.0 JSON event (the
//! structured mode), base64-encoded by default as a Functions Queue trigger
//! expects. `id` is the row's message id: consumers deduplicate on it.
//! Decimals travel as strings, exactly as stored.
//!
//! The events are typed ([`CloudEvent`], [`EventGridEvent`]), their
//! fields declared in the byte order of their names: the order in which
//! earlier versions, which built a `serde_json::Value`, wrote them, so a
//! copy sent by this version and one sent by an earlier one carry the same
//! bytes (tested). What is sent is serde_json's text of the typed event
//! ([`to_text`]).

use std::fmt;

use serde::{Serialize, Serializer};

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

/// The event type of a row: `<prefix>.<kind>`.
pub fn event_type<'a>(naming: &'a Naming, a: &'a Announcement) -> Shown<Joined<'a>> {
    Shown(Joined(&naming.type_prefix, ".", &a.kind))
}

/// The subject of a row's event: `orders/<order id>`.
fn subject(a: &Announcement) -> Shown<Joined<'_>> {
    Shown(Joined("orders", "/", &a.order_id))
}

/// A value serialised as the string its `Display` writes, written into
/// the event's text as it goes: no `String` made and dropped for it.
#[derive(Debug)]
pub struct Shown<T>(pub T);

impl<T: fmt::Display> Serialize for Shown<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

impl<T: fmt::Display> fmt::Display for Shown<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Two texts and the separator between them.
#[derive(Debug)]
pub struct Joined<'a>(&'a str, &'static str, &'a str);

impl fmt::Display for Joined<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)?;
        f.write_str(self.1)?;
        f.write_str(self.2)
    }
}

/// The facts a consumer acts on. `sequence` is the row's place in this
/// store's outbox: one position's orders execute one at a time (its row is
/// locked), so within an account and symbol it grows with execution order.
/// `epoch` is the store's epoch for that number (`store::next_epoch`): a
/// database restored, copied or failed over numbers again under a higher
/// one. `(epoch, sequence)` is the order key a consumer needs (arrival
/// order is not one). A row numbered before the store kept epochs has
/// none, and its event no `epoch` field: the bytes an earlier version sent
/// for it (a consumer reads a missing epoch as 0).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Data<'a> {
    account_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    epoch: Option<i64>,
    executed_at: &'a str,
    fingerprint: &'a str,
    order_id: &'a str,
    position_after: Shown<crate::position::Position>,
    quantity: Shown<rust_decimal::Decimal>,
    sequence: i64,
    side: &'a str,
    symbol: &'a str,
}

pub fn data(a: &Announcement) -> Data<'_> {
    Data {
        account_id: &a.account_id,
        epoch: a.epoch,
        executed_at: &a.executed_at,
        fingerprint: &a.fingerprint,
        order_id: &a.order_id,
        position_after: Shown(a.position_after),
        quantity: Shown(a.quantity.normalize()),
        sequence: a.seq,
        side: &a.side,
        symbol: &a.symbol,
    }
}

/// The row as a CloudEvents 1.0 event (JSON, structured mode).
#[derive(Debug, Serialize)]
pub struct CloudEvent<'a> {
    data: Data<'a>,
    datacontenttype: &'static str,
    id: &'a str,
    source: &'a str,
    specversion: &'static str,
    subject: Shown<Joined<'a>>,
    time: &'a str,
    #[serde(rename = "type")]
    kind: Shown<Joined<'a>>,
}

pub fn cloud_event<'a>(naming: &'a Naming, a: &'a Announcement) -> CloudEvent<'a> {
    CloudEvent {
        data: data(a),
        datacontenttype: "application/json",
        id: &a.message_id,
        source: &naming.source,
        specversion: "1.0",
        subject: subject(a),
        time: &a.executed_at,
        kind: event_type(naming, a),
    }
}

/// The row as an Event Grid schema event (a topic created with the Event
/// Grid input schema).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventGridEvent<'a> {
    data: Data<'a>,
    data_version: &'static str,
    event_time: &'a str,
    event_type: Shown<Joined<'a>>,
    id: &'a str,
    subject: Shown<Joined<'a>>,
}

pub fn event_grid_event<'a>(naming: &'a Naming, a: &'a Announcement) -> EventGridEvent<'a> {
    EventGridEvent {
        data: data(a),
        data_version: "1.0",
        event_time: &a.executed_at,
        event_type: event_type(naming, a),
        id: &a.message_id,
        subject: subject(a),
    }
}

/// An event's text: what serde_json writes of the typed event. Strings
/// and integers only: serialising cannot fail.
pub fn to_text(event: &impl Serialize) -> String {
    serde_json::to_string(event).expect("an event of strings and integers serialises")
}

/// The two forms of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// [`CloudEvent`]: a queue, a topic with the CloudEvents schema.
    CloudEvent,
    /// [`EventGridEvent`]: a topic with the Event Grid schema.
    EventGrid,
}

#[cfg(test)]
mod tests {
    use super::*;
    use rust_decimal::Decimal;
    use serde_json::{json, Value};
    use std::str::FromStr;

    fn value(event: &impl Serialize) -> Value {
        serde_json::to_value(event).unwrap()
    }

    fn row() -> Announcement {
        Announcement {
            message_id: crate::store::message_id("ORD-1"),
            seq: 7,
            epoch: Some(1_796_617_421_598),
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
        let e = value(&cloud_event(&Naming::default(), &row()));
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
                    "sequence": 7, "epoch": 1_796_617_421_598_i64,
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
            to_text(&cloud_event(&Naming::default(), &later)),
            to_text(&cloud_event(&Naming::default(), &row()))
        );
    }

    #[test]
    fn the_event_grid_form_carries_the_same_facts() {
        let e = value(&event_grid_event(&Naming::default(), &row()));
        let c = value(&cloud_event(&Naming::default(), &row()));
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
        let e = value(&cloud_event(&naming, &row()));
        assert_eq!(e["type"], "Contoso.Trading.OrderExecuted");
        assert_eq!(e["source"], "/contoso/orders");
    }

    /// What versions before the typed events sent: a `json!` `Value`,
    /// its keys in byte order. The typed events must give the same bytes,
    /// so a copy sent by either version is the same message.
    fn earlier_cloud_event(naming: &Naming, a: &Announcement) -> String {
        json!({
            "specversion": "1.0",
            "id": a.message_id,
            "source": naming.source,
            "type": format!("{}.{}", naming.type_prefix, a.kind),
            "subject": format!("orders/{}", a.order_id),
            "time": a.executed_at,
            "datacontenttype": "application/json",
            "data": earlier_data(a),
        })
        .to_string()
    }

    fn earlier_event_grid_event(naming: &Naming, a: &Announcement) -> String {
        json!({
            "id": a.message_id,
            "subject": format!("orders/{}", a.order_id),
            "eventType": format!("{}.{}", naming.type_prefix, a.kind),
            "eventTime": a.executed_at,
            "data": earlier_data(a),
            "dataVersion": "1.0",
        })
        .to_string()
    }

    /// Earlier versions' data, with this version's `epoch` when the row
    /// has one: a `Value`'s keys in byte order, where the typed event must
    /// write it too.
    fn earlier_data(a: &Announcement) -> Value {
        let mut data = json!({
            "sequence": a.seq,
            "orderId": a.order_id,
            "accountId": a.account_id,
            "side": a.side,
            "symbol": a.symbol,
            "quantity": a.quantity.normalize().to_string(),
            "positionAfter": a.position_after.to_string(),
            "executedAt": a.executed_at,
            "fingerprint": a.fingerprint,
        });
        if let Some(epoch) = a.epoch {
            data["epoch"] = json!(epoch);
        }
        data
    }

    /// A row numbered before the store kept epochs is sent as earlier
    /// versions sent it, byte for byte; one with an epoch carries it in
    /// its place among the keys in byte order.
    #[test]
    fn the_bytes_are_those_earlier_versions_sent() {
        let mut before_epochs = row();
        before_epochs.epoch = None;
        assert!(!to_text(&cloud_event(&Naming::default(), &before_epochs)).contains("epoch"));
        let mut odd = row();
        // Text that JSON escapes, and text it does not.
        odd.order_id = "ORD \"1\"\\\n\u{1}é😀".into();
        odd.account_id = "</script>".into();
        odd.seq = i64::MAX;
        odd.quantity = Decimal::from_str("0.0000000001").unwrap();
        let naming = Naming {
            type_prefix: "Contoso \"Trading\"".into(),
            source: "/a/b?c=d".into(),
        };
        for (naming, a) in [
            (Naming::default(), row()),
            (Naming::default(), before_epochs),
            (naming, odd),
        ] {
            assert_eq!(
                to_text(&cloud_event(&naming, &a)),
                earlier_cloud_event(&naming, &a)
            );
            assert_eq!(
                to_text(&event_grid_event(&naming, &a)),
                earlier_event_grid_event(&naming, &a)
            );
        }
    }
}
