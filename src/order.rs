//! The order: what one event asks us to do, validated and normalized.
//!
//! Nothing here does I/O. Quantities and prices are parsed **exactly** from the
//! JSON text (`serde_json` keeps number text with `arbitrary_precision`), so no
//! binary floating point ever touches money. The canonical [`Order::fingerprint`]
//! lets the processor tell a redelivery (same fingerprint) from a different order
//! reusing an id (a conflict).

use std::fmt;
use std::str::FromStr;

use rust_decimal::Decimal;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::text::{json_kind, truncate};

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

/// Most unknown field names one refusal names (each shown at most
/// [`crate::text::MAX_SHOWN_ID`] characters long).
const MAX_NAMED_UNKNOWN: usize = 5;

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

/// The fingerprint version [`fingerprint_of`] writes. Version 1 (no prefix,
/// 64 hex digits) hashed `placedAt` as sent; version 2 hashes its canonical
/// UTC text. A stored fingerprint of another version is never compared with
/// a new one: the stored row is fingerprinted again (`OrderRecord::current_fingerprint`).
pub const FINGERPRINT_VERSION: u32 = 2;

/// The version of a fingerprint: `vN:` before the hash, none for version 1.
pub fn fingerprint_version(fp: &str) -> u32 {
    fp.strip_prefix('v')
        .and_then(|rest| rest.split_once(':'))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or(1)
}

/// What a fingerprint covers, normalized (as [`Order`] holds it or a stored
/// row keeps it).
#[derive(Debug, Clone, Copy)]
pub struct FingerprintParts<'a> {
    pub order_id: &'a str,
    pub account_id: &'a str,
    pub side: &'a str,
    pub symbol: &'a str,
    pub quantity: Decimal,
    pub limit_price: Option<Decimal>,
    pub currency: Option<&'a str>,
    /// Canonical UTC text ([`canonical_instant`]).
    pub placed_at: Option<&'a str>,
}

/// The current-version fingerprint of an order's parts.
pub fn fingerprint_of(p: &FingerprintParts<'_>) -> String {
    // Length-prefixed fields: no separator inside a value can make two
    // different orders share a canonical text. Decimals normalized (a SQL
    // Server row reads back `25.0000000000`).
    let fields = [
        p.order_id,
        p.account_id,
        p.side,
        p.symbol,
        &p.quantity.normalize().to_string(),
        &p.limit_price
            .map(|d| d.normalize().to_string())
            .unwrap_or_default(),
        p.currency.unwrap_or(""),
        p.placed_at.unwrap_or(""),
    ];
    let mut hasher = Sha256::new();
    hasher.update(format!("order-guard/v{FINGERPRINT_VERSION}").as_bytes());
    for f in fields {
        hasher.update((f.len() as u64).to_be_bytes());
        hasher.update(f.as_bytes());
    }
    format!("v{FINGERPRINT_VERSION}:{}", hex(&hasher.finalize()))
}

/// An RFC 3339 timestamp (offset required) as one canonical text of its
/// instant: UTC, `Z`, seconds always, a fraction only when not zero and
/// without trailing zeros. `2025-06-14T11:30:02.1180000+02:00` and
/// `2025-06-14T09:30:02.118Z` are both `2025-06-14T09:30:02.118Z`. Parsing is
/// the `time` crate's; the text is written here (a fixed, documented form).
pub fn canonical_instant(text: &str) -> Result<String, String> {
    use time::format_description::well_known::Rfc3339;
    let t = time::OffsetDateTime::parse(text, &Rfc3339).map_err(|e| e.to_string())?;
    let u = t
        .checked_to_offset(time::UtcOffset::UTC)
        .filter(|u| (0..=9999).contains(&u.year()))
        .ok_or("the instant in UTC is outside the years 0000 to 9999")?;
    let mut out = format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        u.year(),
        u8::from(u.month()),
        u.day(),
        u.hour(),
        u.minute(),
        u.second()
    );
    if u.nanosecond() != 0 {
        let fraction = format!("{:09}", u.nanosecond());
        out.push('.');
        out.push_str(fraction.trim_end_matches('0'));
    }
    out.push('Z');
    Ok(out)
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

/// Lower-case hex of a byte string.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// The best-effort order id of a payload that failed validation, so a rejected
/// event can still be found by id. Only a sane string id is returned.
pub fn probable_order_id(data: &Value) -> Option<String> {
    match data.get("orderId") {
        Some(Value::String(s)) if valid_id(s).is_ok() => Some(s.trim().to_string()),
        _ => None,
    }
}

/// Refuse a payload holding any field outside [`ORDER_FIELDS`], whatever its
/// value (`null` too: only a documented optional field's `null` means
/// "absent"). The reason names the fields (a bounded number, each bounded)
/// and lists those this version accepts.
fn refuse_unknown_fields(obj: &Map<String, Value>) -> Result<(), InvalidOrder> {
    let unknown: Vec<&String> = obj
        .keys()
        .filter(|k| !ORDER_FIELDS.contains(&k.as_str()))
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    let mut named = unknown
        .iter()
        .take(MAX_NAMED_UNKNOWN)
        .map(|k| format!("{:?}", crate::text::shown(k)))
        .collect::<Vec<_>>()
        .join(", ");
    if unknown.len() > MAX_NAMED_UNKNOWN {
        named.push_str(&format!(" and {} more", unknown.len() - MAX_NAMED_UNKNOWN));
    }
    Err(InvalidOrder(format!(
        "unknown field{} {named} in the order; this version accepts only {} (names are case-sensitive); not executed",
        if unknown.len() == 1 { "" } else { "s" },
        ORDER_FIELDS.join(", ")
    )))
}

fn required_id(obj: &Map<String, Value>, field: &str) -> Result<String, InvalidOrder> {
    match obj.get(field) {
        None | Some(Value::Null) => Err(InvalidOrder(format!("{field} is required"))),
        Some(Value::String(s)) if json_net_reads_as_date(s) => Err(InvalidOrder(format!(
            "{field} {:?} looks like a date to the Functions host's JSON parser (Json.NET), which \
             rewrites such strings in its own format before the handler sees them, so this order \
             would not be recognised when it comes back another way (a dead-lettered copy holds the \
             text as sent); use an {field} that does not start with yyyy-MM-ddTHH:mm:ss or /Date(",
            truncate(s, 48)
        ))),
        Some(Value::String(s)) => valid_id(s)
            .map(|()| s.trim().to_string())
            .map_err(|why| InvalidOrder(format!("{field} {why}"))),
        Some(other) => Err(InvalidOrder(format!(
            "{field} must be a string, got {}",
            json_kind(other)
        ))),
    }
}

fn valid_id(s: &str) -> Result<(), String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("must not be empty".into());
    }
    // Counted in UTF-16 units, as SQL Server's NVARCHAR(128) counts them.
    let units = t.encode_utf16().count();
    if units > MAX_ID_LEN {
        return Err(format!(
            "is {units} characters (UTF-16 units) long; at most {MAX_ID_LEN} are allowed"
        ));
    }
    if has_control(t) {
        return Err("must not contain control characters".into());
    }
    Ok(())
}

/// Would Json.NET, with its default `DateParseHandling.DateTime`, read this
/// JSON string as a date (and so write it back in its own format)? Its
/// reader tries a string as a date when it is `/Date(…)/` (at least 9
/// characters), or 19 to 40 characters long with a digit first and `T` at
/// index 10, parsing `yyyy-MM-ddTHH:mm:ss[.fff…][Z|±HH:mm]`
/// (Newtonsoft.Json `Utilities/DateTimeUtils.cs`, `TryParseDateTime`, and
/// `DateTimeParser.cs`). This answers yes for every string of that shape,
/// a little more than Json.NET parses (an impossible month, an odd tail):
/// refusing a strange id costs its producer a change, keying an id that the
/// host rewrites can execute an order twice.
pub fn json_net_reads_as_date(s: &str) -> bool {
    if s.starts_with("/Date(") && s.ends_with(")/") && s.len() >= 9 {
        return true;
    }
    let b = s.as_bytes();
    let digit = |i: usize| b.get(i).is_some_and(u8::is_ascii_digit);
    let at = |i: usize, c: u8| b.get(i) == Some(&c);
    (19..=40).contains(&s.encode_utf16().count())
        && (0..4).all(digit)
        && at(4, b'-')
        && (5..7).all(digit)
        && at(7, b'-')
        && (8..10).all(digit)
        && at(10, b'T')
        && (11..13).all(digit)
        && at(13, b':')
        && (14..16).all(digit)
        && at(16, b':')
        && (17..19).all(digit)
}

fn has_control(s: &str) -> bool {
    s.chars().any(char::is_control)
}

/// Parse an exact decimal from a JSON number or a numeric string; refuse
/// anything that is not a positive decimal that fits `DECIMAL(28,10)`.
///
/// One grammar for both forms: the JSON number grammar (RFC 8259 §6) and
/// nothing else. `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`: no
/// `+` sign, no leading zeros, digits on both sides of a point, no spaces.
/// The exponent is expanded exactly (the Functions host re-serializes numbers
/// through .NET doubles, which writes `0.000001` as `1E-06`); its value (not
/// its digits: `1e0002` is `1e2`) must be at most [`MAX_EXPONENT`].
fn positive_decimal(
    field: &str,
    v: &Value,
    fractions: FractionalNumbers,
) -> Result<Decimal, InvalidOrder> {
    let (text, shown) = match v {
        // With `arbitrary_precision` this is the number's text as serde_json
        // read it (it may rewrite an exponent's sign, never the value).
        Value::Number(n) => {
            let text = n.to_string();
            let shown = truncate(&text, 48);
            (text, shown)
        }
        Value::String(s) => (s.clone(), format!("{:?}", truncate(s, 48))),
        other => {
            return Err(InvalidOrder(format!(
                "{field} must be a number or a numeric string, got {}",
                json_kind(other)
            )))
        }
    };
    let number = JsonNumber::parse(&text).ok_or_else(|| {
        InvalidOrder(format!(
            "{field} {shown}: is not a decimal number (JSON number syntax, e.g. 25, 0.5, 1E-06: no '+', no leading zeros, digits on both sides of a point, no spaces)"
        ))
    })?;
    if matches!(v, Value::Number(_)) && (!number.frac.is_empty() || number.exp.is_some()) {
        let digits = number.significant_digits();
        match fractions {
            FractionalNumbers::Refused => {
                return Err(InvalidOrder(format!(
                    "{field} {shown}: a JSON number with a fraction or an exponent is refused \
                     (ORDER_FRACTIONAL_NUMBERS=refuse); send the amount as a string (\"{shown}\") \
                     or an integer"
                )))
            }
            FractionalNumbers::UpToFifteenDigits if digits > MAX_FRACTIONAL_NUMBER_DIGITS => {
                return Err(InvalidOrder(format!(
                    "{field} {shown}: a JSON number with a fraction or an exponent and {digits} \
                     significant digits; the Functions host reads such numbers as doubles, which \
                     keep {MAX_FRACTIONAL_NUMBER_DIGITS}, so it may have been rounded on the way; \
                     send the amount as a string (e.g. \"1234567890.123456789\"); not executed"
                )))
            }
            FractionalNumbers::UpToFifteenDigits => {}
        }
    }
    let unsigned = number.plain().ok_or_else(|| {
        InvalidOrder(format!(
            "{field} {shown}: the exponent is out of range (at most {MAX_EXPONENT} either way)"
        ))
    })?;
    let int_digits = unsigned
        .split('.')
        .next()
        .unwrap_or("")
        .trim_start_matches('0')
        .len();
    if int_digits > MAX_INTEGER_DIGITS {
        return Err(InvalidOrder(format!(
            "{field} {shown} has {int_digits} digits before the decimal point; at most {MAX_INTEGER_DIGITS} are allowed"
        )));
    }
    let frac_digits = unsigned
        .split_once('.')
        .map(|(_, f)| f.trim_end_matches('0').len())
        .unwrap_or(0);
    if frac_digits > MAX_SCALE as usize {
        return Err(InvalidOrder(format!(
            "{field} {shown} has {frac_digits} decimal places; at most {MAX_SCALE} are allowed"
        )));
    }
    // Zeros beyond the scale or before the integer are harmless: drop them
    // before parsing so the exact parse cannot overflow.
    let trimmed = match unsigned.split_once('.') {
        Some((i, f)) => {
            let i = i.trim_start_matches('0');
            let f = f.trim_end_matches('0');
            match (i.is_empty(), f.is_empty()) {
                (_, true) if i.is_empty() => "0".to_string(),
                (_, true) => i.to_string(),
                (true, false) => format!("0.{f}"),
                (false, false) => format!("{i}.{f}"),
            }
        }
        None => match unsigned.trim_start_matches('0') {
            "" => "0".to_string(),
            i => i.to_string(),
        },
    };
    let mut d = Decimal::from_str_exact(&trimmed)
        .map_err(|e| InvalidOrder(format!("{field} {shown}: {e}")))?;
    if number.negative {
        d.set_sign_negative(true);
    }
    if d <= Decimal::ZERO {
        return Err(InvalidOrder(format!(
            "{field} must be greater than 0, got {shown}"
        )));
    }
    Ok(d.normalize())
}

/// Largest exponent magnitude accepted: anything beyond is far outside
/// `DECIMAL(28,10)` anyway, and the bound keeps the expansion small.
const MAX_EXPONENT: u32 = 40;

/// The parts of a text that follows the JSON number grammar (RFC 8259 §6).
#[derive(Debug, PartialEq, Eq)]
struct JsonNumber<'a> {
    negative: bool,
    /// `0` or digits without a leading zero.
    int: &'a str,
    /// The digits after the point (empty: no point).
    frac: &'a str,
    /// Exponent sign (true: negative) and digits, if any.
    exp: Option<(bool, &'a str)>,
}

impl<'a> JsonNumber<'a> {
    /// `None` unless the whole of `t` is a JSON number.
    fn parse(t: &'a str) -> Option<JsonNumber<'a>> {
        let b = t.as_bytes();
        let digits_from = |mut i: usize| {
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            i
        };
        let negative = b.first() == Some(&b'-');
        let start = usize::from(negative);
        let mut i = digits_from(start);
        let int = &t[start..i];
        if int.is_empty() || (int.len() > 1 && int.starts_with('0')) {
            return None;
        }
        let mut frac = "";
        if b.get(i) == Some(&b'.') {
            let end = digits_from(i + 1);
            frac = &t[i + 1..end];
            if frac.is_empty() {
                return None;
            }
            i = end;
        }
        let mut exp = None;
        if matches!(b.get(i), Some(b'e' | b'E')) {
            i += 1;
            let neg = b.get(i) == Some(&b'-');
            if matches!(b.get(i), Some(b'-' | b'+')) {
                i += 1;
            }
            let end = digits_from(i);
            if end == i {
                return None;
            }
            exp = Some((neg, &t[i..end]));
            i = end;
        }
        (i == b.len()).then_some(JsonNumber {
            negative,
            int,
            frac,
            exp,
        })
    }

    /// How many significant digits the number is written with: its digits
    /// without the zeros before the first and after the last non-zero one
    /// (`0.000120` has 2; zero has 0). The exponent does not count.
    fn significant_digits(&self) -> usize {
        let digits = format!("{}{}", self.int, self.frac);
        digits.trim_start_matches('0').trim_end_matches('0').len()
    }

    /// The unsigned plain decimal text this number denotes (`1.5E-06` →
    /// `0.0000015`), digit for digit; `None` when the exponent's value is
    /// beyond [`MAX_EXPONENT`].
    fn plain(&self) -> Option<String> {
        let exp: i64 = match self.exp {
            None => 0,
            Some((neg, digits)) => {
                let digits = digits.trim_start_matches('0');
                if digits.len() > 3 {
                    return None;
                }
                let value: u32 = if digits.is_empty() {
                    0
                } else {
                    digits.parse().ok()?
                };
                if value > MAX_EXPONENT {
                    return None;
                }
                if neg {
                    -i64::from(value)
                } else {
                    i64::from(value)
                }
            }
        };
        if exp == 0 {
            return Some(if self.frac.is_empty() {
                self.int.to_string()
            } else {
                format!("{}.{}", self.int, self.frac)
            });
        }
        let digits = format!("{}{}", self.int, self.frac);
        // Position of the decimal point within `digits` after the shift.
        let point = self.int.len() as i64 + exp;
        Some(if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if point as usize >= digits.len() {
            format!("{digits}{}", "0".repeat(point as usize - digits.len()))
        } else {
            let (i, f) = digits.split_at(point as usize);
            format!("{i}.{f}")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn order(v: Value) -> Result<Order, InvalidOrder> {
        Order::from_data(&v)
    }

    fn base() -> Value {
        json!({"orderId":"o-1","accountId":"a-1","side":"buy","symbol":"msft","quantity":25,"limitPrice":431.15,"currency":"usd"})
    }

    fn with(field: &str, v: Value) -> Value {
        let mut b = base();
        b[field] = v;
        b
    }

    fn parsed(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn parses_and_normalizes_a_valid_order() {
        let o = order(base()).unwrap();
        assert_eq!(o.order_id, "o-1");
        assert_eq!(o.side, Side::Buy);
        assert_eq!(o.symbol, "MSFT");
        assert_eq!(o.quantity, Decimal::from(25));
        assert_eq!(o.limit_price, Some(Decimal::from_str("431.15").unwrap()));
        assert_eq!(o.currency.as_deref(), Some("USD"));
    }

    #[test]
    fn fractional_json_numbers_beyond_a_doubles_digits_are_refused() {
        let quantity = |text: &str, fractions| {
            Order::from_data_with(
                &parsed(&format!(
                    r#"{{"orderId":"o","accountId":"a","side":"buy","symbol":"X","quantity":{text}}}"#
                )),
                fractions,
            )
            .map(|o| o.quantity.to_string())
            .map_err(|e| e.0)
        };
        let checked = FractionalNumbers::UpToFifteenDigits;
        // What the host hands over for 1234567890.123456789 (a double's 17 digits).
        let e = quantity("1234567890.1234567", checked).unwrap_err();
        assert!(e.contains("17 significant digits"), "{e}");
        assert!(e.contains("send the amount as a string"), "{e}");
        assert!(quantity("12345678901.23456", checked).is_err(), "16 digits");
        assert!(quantity("1.234567890123456E+3", checked).is_err());
        // At most 15: exact through a double, so accepted as sent.
        assert_eq!(
            quantity("1234567890.12345", checked).unwrap(),
            "1234567890.12345"
        );
        assert_eq!(quantity("1E-06", checked).unwrap(), "0.000001");
        assert_eq!(quantity("0.000120", checked).unwrap(), "0.00012");
        assert_eq!(quantity("100.500000000000000", checked).unwrap(), "100.5");
        // Integers and strings are exact through Json.NET: any digits.
        assert_eq!(
            quantity("123456789012345678", checked).unwrap(),
            "123456789012345678"
        );
        assert_eq!(
            quantity(r#""1234567890.123456789""#, checked).unwrap(),
            "1234567890.123456789"
        );
        // ORDER_FRACTIONAL_NUMBERS=refuse: strings and integers only.
        let refused = FractionalNumbers::Refused;
        for text in ["1.5", "1E+2", "2.0"] {
            let e = quantity(text, refused).unwrap_err();
            assert!(e.contains("ORDER_FRACTIONAL_NUMBERS=refuse"), "{text}: {e}");
        }
        assert_eq!(quantity("15", refused).unwrap(), "15");
        assert_eq!(quantity(r#""1.5""#, refused).unwrap(), "1.5");
        // The limit price follows the same rule.
        let e = Order::from_data_with(&with("limitPrice", parsed("431.1500000000001")), checked)
            .unwrap_err();
        assert!(e.0.starts_with("limitPrice"), "{e}");
    }

    #[test]
    fn ids_that_json_net_reads_as_dates_are_refused() {
        for date in [
            "2026-12-01T10:00:00Z",
            "2026-12-01T10:00:00",
            "2026-12-01T10:00:00.1234567+01:00",
            "1999-99-99T99:99:99-tail",
            "/Date(1234567890)/",
            "/Date(1234567890+0100)/",
        ] {
            assert!(json_net_reads_as_date(date), "{date}");
            for field in ["orderId", "accountId", "symbol"] {
                let e = order(with(field, json!(date))).unwrap_err();
                assert!(e.0.starts_with(&format!("{field} ")), "{e}");
                assert!(e.0.contains("looks like a date"), "{e}");
            }
        }
        for id in [
            "ord-2026-12-01T10:00:00Z",
            "2026-12-01 10:00:00",
            "2026-12-01T10:00",
            " 2026-12-01T10:00:00Z",
            "20261201T100000Z",
            "2026-12-01T10:00:00Z-and-more-than-forty-characters",
            "/Date(1)",
        ] {
            assert!(!json_net_reads_as_date(id), "{id}");
        }
        assert_eq!(
            order(with("orderId", json!("2026-12-01 10:00:00")))
                .unwrap()
                .order_id,
            "2026-12-01 10:00:00"
        );
    }

    #[test]
    fn numbers_are_exact_not_floating_point() {
        let o = order(parsed(
            r#"{"orderId":"o","accountId":"a","side":"sell","symbol":"X","quantity":0.1000000001,"limitPrice":"123456789012345678.0000000001"}"#,
        ))
        .unwrap();
        assert_eq!(o.quantity.to_string(), "0.1000000001");
        assert_eq!(
            o.limit_price.unwrap().to_string(),
            "123456789012345678.0000000001"
        );
    }

    #[test]
    fn exponent_forms_are_expanded_exactly() {
        for (text, want) in [
            ("1E-06", "0.000001"),
            ("1.5e-6", "0.0000015"),
            ("2e3", "2000"),
            ("4.3115E+2", "431.15"),
            ("12.5e1", "125"),
        ] {
            let o = order(with("quantity", parsed(text))).unwrap();
            assert_eq!(o.quantity.to_string(), want, "{text}");
        }
        let a = order(with("quantity", parsed("1E-06"))).unwrap();
        let b = order(with("quantity", json!("0.000001"))).unwrap();
        assert_eq!(a.fingerprint(), b.fingerprint());
    }

    #[test]
    fn fingerprint_ignores_key_order_number_format_and_case() {
        let a = order(parsed(
            r#"{"orderId":"o","accountId":"a","side":"buy","symbol":"msft","quantity":10,"limitPrice":5.5}"#,
        ))
        .unwrap();
        let b = order(parsed(
            r#"{"limitPrice":"5.50","quantity":"10.0","symbol":"MSFT","side":"BUY","accountId":"a","orderId":"o"}"#,
        ))
        .unwrap();
        assert_eq!(a.fingerprint(), b.fingerprint());
        let c = order(parsed(
            r#"{"orderId":"o","accountId":"a","side":"buy","symbol":"msft","quantity":11,"limitPrice":5.5}"#,
        ))
        .unwrap();
        assert_ne!(a.fingerprint(), c.fingerprint());
    }

    #[test]
    fn bad_quantities_are_refused_with_a_reason() {
        let cases = [
            (json!(0), "greater than 0"),
            (json!(-3), "greater than 0"),
            (json!("abc"), "not a decimal number"),
            (json!("NaN"), "not a decimal number"),
            (parsed("1e40"), "at most 18"),
            (parsed("1E-11"), "decimal places"),
            (parsed("1e999"), "exponent is out of range"),
            (json!("1e"), "not a decimal number"),
            (
                json!("1234567890123456789012345678901234567890"),
                "at most 18",
            ),
            (json!("0.00000000001"), "decimal places"),
            (json!(true), "must be a number"),
            (json!(""), "not a decimal number"),
        ];
        for (q, want) in cases {
            let err = order(with("quantity", q.clone())).unwrap_err();
            assert!(err.0.contains(want), "quantity {q}: {err} lacks {want:?}");
        }
    }

    #[test]
    fn bad_ids_and_sides_are_refused_with_a_reason() {
        assert!(order(with("orderId", json!("")))
            .unwrap_err()
            .0
            .contains("orderId must not be empty"));
        assert!(order(with("orderId", json!("x".repeat(10_000))))
            .unwrap_err()
            .0
            .contains("at most 128"));
        assert!(order(with("orderId", json!("a\u{0007}b")))
            .unwrap_err()
            .0
            .contains("control characters"));
        assert!(order(with("orderId", json!(42)))
            .unwrap_err()
            .0
            .contains("must be a string"));
        assert!(order(with("side", json!("hold")))
            .unwrap_err()
            .0
            .contains("\"buy\" or \"sell\""));
        let mut no_symbol = base();
        no_symbol.as_object_mut().unwrap().remove("symbol");
        assert_eq!(order(no_symbol).unwrap_err().0, "symbol is required");
        assert!(order(json!("text")).unwrap_err().0.contains("JSON object"));
    }

    /// The refusal message for `field` set to `v`, or a panic if accepted.
    fn refused(field: &str, v: Value) -> String {
        match order(with(field, v.clone())) {
            Err(e) => e.to_string(),
            Ok(o) => panic!("{field} {v} must be refused, got {o:?}"),
        }
    }

    #[test]
    fn currency_is_exactly_three_ascii_letters() {
        for (sent, kept) in [("usd", "USD"), (" eur ", "EUR"), ("GbP", "GBP")] {
            let o = order(with("currency", json!(sent))).unwrap();
            assert_eq!(o.currency.as_deref(), Some(kept), "{sent:?}");
        }
        let o = order(with("currency", Value::Null)).unwrap();
        assert_eq!(o.currency, None);
        // Too short, too long, digits, symbols, non-ASCII letters.
        for bad in [
            "US", "USDX", "12$", "U5D", "US$", "", "   ", "€UR", "ÉUR", "U D",
        ] {
            assert_eq!(
                refused("currency", json!(bad)),
                format!("currency must be a 3-letter ISO 4217 code, got {bad:?}"),
            );
        }
        assert_eq!(
            refused("currency", json!(840)),
            "currency must be a string, got a number"
        );
        // A long value is shown cut to 40 characters, marked as cut.
        let long = "X".repeat(100);
        assert_eq!(
            refused("currency", json!(long)),
            format!(
                "currency must be a 3-letter ISO 4217 code, got \"{}…\"",
                "X".repeat(40)
            )
        );
    }

    #[test]
    fn placed_at_is_one_canonical_utc_instant() {
        // The same instant as the host and publishers write it.
        let same = [
            "2025-06-14T09:30:02.118Z",
            "2025-06-14T09:30:02.1180000Z",
            "2025-06-14T11:30:02.118+02:00",
            "2025-06-14T09:30:02.118+00:00",
            "2025-06-14T04:00:02.118000000-05:30",
            "2025-06-14t09:30:02.118z",
            " 2025-06-14T09:30:02.118Z ",
        ];
        let first = order(with("placedAt", json!(same[0]))).unwrap();
        for text in same {
            let o = order(with("placedAt", json!(text))).unwrap();
            assert_eq!(
                o.placed_at.as_deref(),
                Some("2025-06-14T09:30:02.118Z"),
                "{text}"
            );
            assert_eq!(o.fingerprint(), first.fingerprint(), "{text}");
        }
        for (text, canonical) in [
            ("2025-06-14T09:30:02Z", "2025-06-14T09:30:02Z"),
            ("2025-06-14T09:30:02.000Z", "2025-06-14T09:30:02Z"),
            // RFC 3339 §5.6 allows a space for the `T`.
            ("2025-06-14 09:30:02Z", "2025-06-14T09:30:02Z"),
            ("2025-06-14T09:30:02.1Z", "2025-06-14T09:30:02.1Z"),
            (
                "2025-06-14T09:30:02.123456789Z",
                "2025-06-14T09:30:02.123456789Z",
            ),
            ("2025-01-01T00:30:00+01:00", "2024-12-31T23:30:00Z"),
        ] {
            assert_eq!(canonical_instant(text).as_deref(), Ok(canonical), "{text}");
        }
        // A different instant is a different order.
        let later = order(with("placedAt", json!("2025-06-14T09:30:02.119Z"))).unwrap();
        assert_ne!(later.fingerprint(), first.fingerprint());
        assert_eq!(
            order(with("placedAt", Value::Null)).unwrap().placed_at,
            None
        );
        // Not an RFC 3339 instant with an offset.
        for bad in [
            "2025-06-14T09:30:02",
            "2025-06-14",
            "yesterday",
            "2025-02-30T09:30:02Z",
            "2025-06-14T25:30:02Z",
            "0000-01-01T00:30:00+01:00",
        ] {
            let e = refused("placedAt", json!(bad));
            assert!(
                e.starts_with(&format!("placedAt must be an RFC 3339 timestamp with an offset (e.g. 2025-06-14T09:30:02.118Z), got {bad:?}: ")),
                "{bad}: {e}"
            );
        }
        let want = "placedAt must be a timestamp string of at most 64 characters";
        for bad in [
            json!(format!("2025-06-14T09:30:02.118Z{}", "0".repeat(41))),
            json!("2025-06-14\n09:30:02Z"),
            json!("2025-06-14T09:30:02Z\u{0}"),
            json!(1718357402),
        ] {
            assert_eq!(refused("placedAt", bad), want);
        }
    }

    #[test]
    fn fingerprints_carry_their_version() {
        let o = order(base()).unwrap();
        assert!(o.fingerprint().starts_with("v2:"), "{}", o.fingerprint());
        assert_eq!(o.fingerprint().len(), 3 + 64);
        assert_eq!(fingerprint_version(o.fingerprint()), FINGERPRINT_VERSION);
        assert_eq!(fingerprint_version(&"ab".repeat(32)), 1);
        assert_eq!(fingerprint_version("v17:ab"), 17);
        assert_eq!(fingerprint_version("vx:ab"), 1);
    }

    #[test]
    fn ids_are_at_most_128_utf16_units() {
        // 😀 is outside the BMP: two UTF-16 units, as SQL Server counts it.
        let accepted = [
            "a".repeat(128),
            "😀".repeat(64),
            format!("{}😀", "a".repeat(126)),
            format!("  {}  ", "a".repeat(128)),
        ];
        for field in ["orderId", "accountId", "symbol"] {
            for id in &accepted {
                let o = order(with(field, json!(id)))
                    .unwrap_or_else(|e| panic!("{field} of {} chars: {e}", id.len()));
                let kept = match field {
                    "orderId" => o.order_id,
                    "accountId" => o.account_id,
                    _ => o.symbol.to_lowercase(),
                };
                assert_eq!(kept, id.trim());
            }
            for id in [
                "a".repeat(129),
                format!("{}😀", "a".repeat(127)),
                format!("{}a", "😀".repeat(64)),
            ] {
                assert_eq!(
                    refused(field, json!(id)),
                    format!(
                        "{field} is 129 characters (UTF-16 units) long; at most 128 are allowed"
                    )
                );
            }
        }
    }

    #[test]
    fn only_a_storable_id_is_kept_for_a_rejected_payload() {
        assert_eq!(
            probable_order_id(&json!({"orderId": " o-1 ", "side": "hold"})),
            Some("o-1".to_string())
        );
        assert_eq!(
            probable_order_id(&json!({"orderId": "a".repeat(128)})),
            Some("a".repeat(128))
        );
        for bad in [
            json!({"orderId": "a".repeat(129)}),
            json!({"orderId": format!("{}😀", "a".repeat(127))}),
            json!({"orderId": "o\u{7}1"}),
            json!({"orderId": "   "}),
            json!({"orderId": 42}),
            json!({"orderId": null}),
            json!({"side": "buy"}),
            json!("o-1"),
        ] {
            assert_eq!(probable_order_id(&bad), None, "{bad}");
        }
    }

    /// The number grammar at its edges (RFC 8259's, nothing else), for JSON
    /// numbers and for numeric strings alike: both go through the same rule.
    #[test]
    fn number_grammar_edges() {
        // (text, Ok(value) or Err(part of the message))
        let syntax = "is not a decimal number";
        let range = "the exponent is out of range";
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("25", Ok("25")),
            ("0.5", Ok("0.5")),
            ("2.50", Ok("2.5")),
            ("1E-06", Ok("0.000001")),
            ("1e2", Ok("100")),
            ("1E+002", Ok("100")),
            ("1e0002", Ok("100")),
            ("25e-002", Ok("0.25")),
            ("1.5e1", Ok("15")),
            ("0e5", Err("greater than 0")),
            ("-0", Err("greater than 0")),
            ("-5", Err("greater than 0")),
            ("1e40", Err("at most 18")),
            ("1e41", Err(range)),
            ("1e-41", Err(range)),
            ("1e0000000041", Err(range)),
            ("1e999999", Err(range)),
            // Not the JSON grammar, whichever way it is sent.
            ("+5", Err(syntax)),
            ("5.", Err(syntax)),
            (".5", Err(syntax)),
            ("1.", Err(syntax)),
            ("1.e5", Err(syntax)),
            ("1.e2", Err(syntax)),
            (".5e1", Err(syntax)),
            ("007", Err(syntax)),
            ("00.5", Err(syntax)),
            ("1e", Err(syntax)),
            ("1e+", Err(syntax)),
            ("1.5x", Err(syntax)),
            ("x1e2", Err(syntax)),
            ("1_000", Err(syntax)),
            (" 5", Err(syntax)),
            ("5 ", Err(syntax)),
            ("", Err(syntax)),
            ("-", Err(syntax)),
            ("0x10", Err(syntax)),
            ("Infinity", Err(syntax)),
            ("NaN", Err(syntax)),
            ("１２", Err(syntax)),
        ];
        for &(text, want) in cases {
            let mut forms = vec![("string", json!(text), format!("{text:?}"))];
            // Whatever serde_json reads as a number goes through the same rule.
            // (Around a JSON number white space is JSON's, not the number's.)
            let parsed = (text.trim() == text).then(|| serde_json::from_str::<Value>(text));
            if let Some(Ok(n @ Value::Number(_))) = parsed {
                let shown = n.to_string();
                forms.push(("number", n, shown));
            }
            for (form, v, shown) in forms {
                for field in ["quantity", "limitPrice"] {
                    match (order(with(field, v.clone())), want) {
                        (Ok(o), Ok(value)) => {
                            let got = match field {
                                "quantity" => o.quantity,
                                _ => o.limit_price.unwrap(),
                            };
                            assert_eq!(got.to_string(), value, "{field} as {form} {text}");
                        }
                        (Err(e), Err(part)) => {
                            assert!(e.0.contains(part), "{field} as {form} {text}: {e}");
                            // A string is quoted as sent; a number shown as read.
                            assert!(e.0.contains(&shown), "{field} as {form} {text}: {e}");
                        }
                        (got, _) => panic!("{field} as {form} {text}: want {want:?}, got {got:?}"),
                    }
                }
            }
        }
    }

    #[test]
    fn json_numbers_and_strings_are_one_grammar() {
        // Every JSON number serde_json reads is accepted by the grammar,
        // and a string of the same text means the same value.
        for text in ["1", "0.1", "1e5", "1E-06", "12.5e+1", "1e0002", "431.15"] {
            let n: Value = serde_json::from_str(text).unwrap();
            let a = order(with("quantity", n)).unwrap();
            let b = order(with("quantity", json!(text))).unwrap();
            assert_eq!(a.quantity, b.quantity, "{text}");
            assert_eq!(a.fingerprint(), b.fingerprint(), "{text}");
        }
    }

    #[test]
    fn unknown_fields_are_refused_naming_them() {
        let accepts = "this version accepts only orderId, accountId, side, symbol, quantity, limitPrice, currency, placedAt (names are case-sensitive); not executed";
        for (field, value) in [
            ("orderType", json!("stop")),
            ("stopPrice", json!(420.5)),
            ("stopPrice", Value::Null),
            ("OrderId", json!("o-1")),
            ("LimitPrice", json!(431.15)),
            ("limitprice", json!(431.15)),
            ("quantity ", json!(25)),
            ("", json!(1)),
        ] {
            assert_eq!(
                refused(field, value),
                format!("unknown field {field:?} in the order; {accepts}"),
            );
        }
        // Several are named, in the order serde_json keeps them (sorted).
        let mut two = base();
        two["stopPrice"] = json!(1);
        two["orderType"] = json!("stop");
        assert_eq!(
            order(two).unwrap_err().0,
            format!("unknown fields \"orderType\", \"stopPrice\" in the order; {accepts}")
        );
        // Bounded: at most five names, each at most 128 characters.
        let mut many = base();
        for i in 0..7 {
            many[format!("x{i}{}", "n".repeat(300))] = json!(i);
        }
        let e = order(many).unwrap_err().0;
        assert!(
            e.ends_with(&format!(" and 2 more in the order; {accepts}")),
            "{e}"
        );
        assert!(e.len() < 5 * 140 + 300, "{} bytes", e.len());
        assert!(e.contains(&format!("\"x0{}…\"", "n".repeat(126))), "{e}");
    }

    #[test]
    fn documented_fields_keep_their_meaning() {
        // An explicit null of an optional field still means absent.
        let mut nulls = base();
        for f in ["limitPrice", "currency", "placedAt"] {
            nulls[f] = Value::Null;
        }
        let o = order(nulls).unwrap();
        assert_eq!(
            (o.limit_price, o.currency.as_deref(), o.placed_at.as_deref()),
            (None, None, None)
        );
        let mut absent = base();
        for f in ["limitPrice", "currency"] {
            absent.as_object_mut().unwrap().remove(f);
        }
        assert_eq!(order(absent).unwrap().fingerprint(), o.fingerprint());
        // What the Functions host makes of an order (Newtonsoft: dates with
        // seven fraction digits, numbers through doubles) is still accepted,
        // every field of it known, and the same order.
        let sent = parsed(
            r#"{"orderId":"o-1","accountId":"a-1","side":"buy","symbol":"msft","quantity":0.000001,"limitPrice":431.15,"currency":"usd","placedAt":"2025-06-14T11:30:02.118+02:00"}"#,
        );
        let hosted = parsed(
            r#"{"orderId":"o-1","accountId":"a-1","side":"buy","symbol":"msft","quantity":1E-06,"limitPrice":431.15,"currency":"usd","placedAt":"2025-06-14T09:30:02.1180000Z"}"#,
        );
        assert_eq!(
            order(sent).unwrap().fingerprint(),
            order(hosted).unwrap().fingerprint()
        );
        // Every documented field at once is accepted.
        let mut all = base();
        all["placedAt"] = json!("2025-06-14T09:30:02Z");
        assert_eq!(all.as_object().unwrap().len(), ORDER_FIELDS.len());
        order(all).unwrap();
    }

    #[test]
    fn an_order_displays_as_one_line_naming_it() {
        let o = order(with("side", json!("SELL"))).unwrap();
        assert_eq!(o.to_string(), "o-1 sell 25 MSFT for a-1");
    }

    #[test]
    fn status_only_moves_forward() {
        use OrderStatus::*;
        assert!(Received.can_move_to(Executed));
        assert!(Received.can_move_to(Rejected));
        for s in [Executed, Rejected] {
            for t in [Received, Executed, Rejected] {
                assert!(!s.can_move_to(t), "{s:?} -> {t:?} must be refused");
            }
        }
    }
}
