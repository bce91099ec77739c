//! The order: what one event asks us to do, validated and normalized.
//!
//! Nothing here does I/O. Quantities and prices are parsed **exactly** from the
//! JSON text (`serde_json` keeps number text with `arbitrary_precision`), so no
//! binary floating point ever touches money. The canonical [`Order::fingerprint`]
//! lets the processor tell a redelivery (same fingerprint) from a different order
//! reusing an id (a conflict).
//!
//! By step: [`Order::from_data`] here parses a payload; `validate.rs` checks
//! its fields and ids, `number.rs` reads its numbers exactly, and
//! `fingerprint.rs` makes its fingerprint.

use std::fmt;
use std::str::FromStr;

use rust_decimal::Decimal;
use serde_json::Value;

use crate::text::{json_kind, truncate};

mod fingerprint;
mod number;
mod validate;

pub use fingerprint::{
    canonical_instant, fingerprint_of, fingerprint_version, hex, FingerprintParts,
    FINGERPRINT_VERSION,
};
use number::positive_decimal;
pub use validate::json_net_reads_as_date;
use validate::{has_control, refuse_unknown_fields, required_id, valid_id};

/// Longest accepted `orderId`, `accountId`, `symbol` in UTF-16 units (they are
/// keys and index columns: `NVARCHAR(128)` on SQL Server).
pub const MAX_ID_LEN: usize = 128;
/// Most digits after the decimal point: the stores keep `DECIMAL(28,10)`.
pub const MAX_SCALE: u32 = 10;
/// Most digits before the decimal point (28 - 10).
pub const MAX_INTEGER_DIGITS: usize = 18;

/// Every field an order (`data`) may hold, exactly as spelled here (names
/// are case-sensitive, without aliases). Any other field is refused: a field
/// this version does not know (`orderType`, `stopPrice`) would otherwise be
/// ignored, and two orders differing only in it would be taken for one.
pub const ORDER_FIELDS: [&str; 8] = [
    "orderId",
    "accountId",
    "side",
    "symbol",
    "quantity",
    "limitPrice",
    "currency",
    "placedAt",
];

/// Most significant digits a JSON number with a fraction or an exponent may
/// have. The Functions host's Event Grid extension parses the webhook body
/// with Json.NET's defaults, which read such a number as a .NET `double` and
/// write it back for the handler: a double keeps every decimal of at most 15
/// significant digits, so such a number arrives as it was sent, and one with
/// more was rounded on the way (`1234567890.123456789` arrives as
/// `1234567890.1234567`) or is about to be misread by another reader.
/// Integers are exact through Json.NET (`Int64`, `BigInteger`).
pub const MAX_FRACTIONAL_NUMBER_DIGITS: usize = 15;

/// How amounts (`quantity`, `limitPrice`) sent as JSON numbers with a
/// fraction or an exponent are read (`ORDER_FRACTIONAL_NUMBERS`). Strings
/// and integers are always exact and always accepted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FractionalNumbers {
    /// Accepted with at most [`MAX_FRACTIONAL_NUMBER_DIGITS`] significant
    /// digits (a double's exact range); more is refused (`accept`, the default).
    #[default]
    UpToFifteenDigits,
    /// Refused whatever their digits: a producer that wants certainty sends
    /// amounts as strings or integers only (`refuse`). No check on our side
    /// can tell `10000000.0000000001`, which arrives as `10000000.0`, from
    /// an honest `10000000.0`.
    Refused,
}

/// Buy or sell. A buy adds to the position, a sell takes from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Buy,
    Sell,
}

impl Side {
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Buy => "buy",
            Side::Sell => "sell",
        }
    }

    /// The signed change this side makes to a position.
    pub fn signed(self, quantity: Decimal) -> Decimal {
        match self {
            Side::Buy => quantity,
            Side::Sell => -quantity,
        }
    }
}

impl FromStr for Side {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "buy" => Ok(Side::Buy),
            "sell" => Ok(Side::Sell),
            _ => Err(format!(
                "side must be \"buy\" or \"sell\", got {:?}",
                truncate(s, 40)
            )),
        }
    }
}

/// State of an order in the store. It only ever moves forward:
/// `Received → Executed` or `Received → Rejected`; never back, never twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OrderStatus {
    Received,
    Executed,
    Rejected,
}

impl OrderStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Received => "Received",
            OrderStatus::Executed => "Executed",
            OrderStatus::Rejected => "Rejected",
        }
    }

    /// Whether `self → next` is allowed by the forward-only rule.
    pub fn can_move_to(self, next: OrderStatus) -> bool {
        matches!(
            (self, next),
            (OrderStatus::Received, OrderStatus::Executed)
                | (OrderStatus::Received, OrderStatus::Rejected)
        )
    }

    /// Terminal states: a redelivery of such an order is a duplicate.
    pub fn is_terminal(self) -> bool {
        self != OrderStatus::Received
    }
}

impl FromStr for OrderStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "Received" => Ok(OrderStatus::Received),
            "Executed" => Ok(OrderStatus::Executed),
            "Rejected" => Ok(OrderStatus::Rejected),
            other => Err(format!("unknown order status {other:?}")),
        }
    }
}

/// Why an order payload was refused. The message says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidOrder(pub String);

/// A validated, normalized order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Order {
    pub order_id: String,
    pub account_id: String,
    pub side: Side,
    /// Upper-cased.
    pub symbol: String,
    /// Exact, > 0, normalized (no trailing zeros).
    pub quantity: Decimal,
    pub limit_price: Option<Decimal>,
    /// Upper-cased ISO code when given.
    pub currency: Option<String>,
    /// The instant as one canonical UTC text ([`canonical_instant`]).
    pub placed_at: Option<String>,
    fingerprint: String,
}

impl Order {
    /// Parse and validate the event's `data` object, with the default
    /// reading of fractional JSON numbers.
    pub fn from_data(data: &Value) -> Result<Order, InvalidOrder> {
        Order::from_data_with(data, FractionalNumbers::default())
    }

    /// Parse and validate the event's `data` object; `fractions` says how
    /// amounts sent as fractional JSON numbers are read.
    pub fn from_data_with(
        data: &Value,
        fractions: FractionalNumbers,
    ) -> Result<Order, InvalidOrder> {
        let obj = data.as_object().ok_or_else(|| {
            InvalidOrder(format!(
                "event data must be a JSON object holding the order, got {}",
                json_kind(data)
            ))
        })?;
        refuse_unknown_fields(obj)?;
        let order_id = required_id(obj, "orderId")?;
        let account_id = required_id(obj, "accountId")?;
        let side = match obj.get("side") {
            None | Some(Value::Null) => return Err(InvalidOrder("side is required".into())),
            Some(Value::String(s)) => s.parse::<Side>().map_err(InvalidOrder)?,
            Some(other) => {
                return Err(InvalidOrder(format!(
                    "side must be the string \"buy\" or \"sell\", got {}",
                    json_kind(other)
                )))
            }
        };
        let symbol = required_id(obj, "symbol")?.to_ascii_uppercase();
        let quantity = match obj.get("quantity") {
            None | Some(Value::Null) => return Err(InvalidOrder("quantity is required".into())),
            Some(v) => positive_decimal("quantity", v, fractions)?,
        };
        let limit_price = match obj.get("limitPrice") {
            None | Some(Value::Null) => None,
            Some(v) => Some(positive_decimal("limitPrice", v, fractions)?),
        };
        let currency = match obj.get("currency") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => {
                let c = s.trim();
                if c.len() != 3 || !c.chars().all(|ch| ch.is_ascii_alphabetic()) {
                    return Err(InvalidOrder(format!(
                        "currency must be a 3-letter ISO 4217 code, got {:?}",
                        truncate(s, 40)
                    )));
                }
                Some(c.to_ascii_uppercase())
            }
            Some(other) => {
                return Err(InvalidOrder(format!(
                    "currency must be a string, got {}",
                    json_kind(other)
                )))
            }
        };
        let placed_at = match obj.get("placedAt") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.len() <= 64 && !has_control(s) => {
                Some(canonical_instant(s.trim()).map_err(|why| {
                    InvalidOrder(format!(
                        "placedAt must be an RFC 3339 timestamp with an offset (e.g. 2025-06-14T09:30:02.118Z), got {:?}: {why}",
                        truncate(s, 64)
                    ))
                })?)
            }
            Some(_) => {
                return Err(InvalidOrder(
                    "placedAt must be a timestamp string of at most 64 characters".into(),
                ))
            }
        };
        let mut order = Order {
            order_id,
            account_id,
            side,
            symbol,
            quantity,
            limit_price,
            currency,
            placed_at,
            fingerprint: String::new(),
        };
        order.fingerprint = order.compute_fingerprint();
        Ok(order)
    }

    /// `v2:` and the hex SHA-256 of the canonical form: equal for the same
    /// order whatever the JSON key order, number formatting (`10` vs
    /// `"10.0"`), letter case of symbol, side and currency, or the way
    /// `placedAt` writes its instant (see [`fingerprint_of`]).
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    fn compute_fingerprint(&self) -> String {
        fingerprint_of(&FingerprintParts {
            order_id: &self.order_id,
            account_id: &self.account_id,
            side: self.side.as_str(),
            symbol: &self.symbol,
            quantity: self.quantity,
            limit_price: self.limit_price,
            currency: self.currency.as_deref(),
            placed_at: self.placed_at.as_deref(),
        })
    }
}

impl fmt::Display for Order {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {} {} for {}",
            self.order_id,
            self.side.as_str(),
            self.quantity,
            self.symbol,
            self.account_id
        )
    }
}

/// The best-effort order id of a payload that failed validation, so a rejected
/// event can still be found by id. Only a sane string id is returned.
pub fn probable_order_id(data: &Value) -> Option<String> {
    match data.get("orderId") {
        Some(Value::String(s)) if valid_id(s).is_ok() => Some(s.trim().to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
