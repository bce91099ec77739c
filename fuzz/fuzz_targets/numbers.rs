//! Bytes → an order whose `quantity` is the input, as a JSON number text and
//! as a JSON string (`Order::from_data_with`, both fraction policies). Never
//! a panic; when accepted, the `Decimal` is the exact value of the text,
//! checked by an independent exact comparison (string arithmetic below):
//! never a rounded value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use order_guard::order::{FractionalNumbers, Order};
use rust_decimal::Decimal;
use serde_json::Value;

/// The exact value of a JSON number text as (significant digits without
/// leading/trailing zeros, power of ten), `None` when not JSON number
/// grammar: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`. Zero is
/// `("", 0)`. The sign is returned apart.
fn exact(text: &str) -> Option<(bool, String, i128)> {
    let b = text.as_bytes();
    let mut i = 0;
    let neg = b.first() == Some(&b'-');
    if neg {
        i += 1;
    }
    let int_start = i;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    let int = &text[int_start..i];
    if int.is_empty() || (int.len() > 1 && int.starts_with('0')) {
        return None;
    }
    let mut frac = "";
    if i < b.len() && b[i] == b'.' {
        i += 1;
        let s = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        frac = &text[s..i];
        if frac.is_empty() {
            return None;
        }
    }
    let mut exp: i128 = 0;
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        i += 1;
        let mut eneg = false;
        if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
            eneg = b[i] == b'-';
            i += 1;
        }
        let s = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let digits = text[s..i].trim_start_matches('0');
        if s == i {
            return None;
        }
        if digits.len() > 30 {
            // Far beyond any Decimal: the value cannot be accepted exactly
            // unless it is zero.
            exp = if eneg {
                -(10i128.pow(30))
            } else {
                10i128.pow(30)
            };
        } else if !digits.is_empty() {
            exp = digits.parse::<i128>().ok()?;
            if eneg {
                exp = -exp;
            }
        }
    }
    if i != b.len() {
        return None;
    }
    let all = format!("{int}{frac}");
    let mut power = exp - frac.len() as i128;
    let lead = all.trim_start_matches('0');
    let sig = lead.trim_end_matches('0');
    power += (lead.len() - sig.len()) as i128;
    if sig.is_empty() {
        return Some((neg, String::new(), 0));
    }
    Some((neg, sig.to_string(), power))
}

/// The same normal form for a `Decimal`.
fn of_decimal(d: Decimal) -> (bool, String, i128) {
    let neg = d.is_sign_negative() && !d.is_zero();
    let digits = d.mantissa().unsigned_abs().to_string();
    let mut power = -(d.scale() as i128);
    let sig = digits.trim_end_matches('0');
    power += (digits.len() - sig.len()) as i128;
    if sig.is_empty() || sig == "0" {
        return (false, String::new(), 0);
    }
    (neg, sig.to_string(), power)
}

fn order(quantity: Value) -> Value {
    serde_json::json!({
        "orderId": "ord-1",
        "accountId": "acct-1",
        "side": "buy",
        "symbol": "MSFT",
        "quantity": quantity,
    })
}

fn check(text: &str, data: &Value, as_number: bool) {
    for fractions in [
        FractionalNumbers::UpToFifteenDigits,
        FractionalNumbers::Refused,
    ] {
        let Ok(o) = Order::from_data_with(data, fractions) else {
            continue;
        };
        let got = of_decimal(o.quantity);
        let want = exact(text).unwrap_or_else(|| {
            panic!(
                "quantity {text:?} is not JSON number grammar but was accepted as {}",
                o.quantity
            )
        });
        assert_eq!(
            got,
            want,
            "quantity {text:?} (as {}, {fractions:?}) accepted as {}: not its exact value",
            if as_number { "number" } else { "string" },
            o.quantity
        );
        assert!(
            !got.0 && !got.1.is_empty(),
            "quantity {text:?} accepted as {} (not positive)",
            o.quantity
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // As a JSON number: only when serde_json reads it as exactly one number.
    if let Ok(Value::Number(n)) = serde_json::from_str::<Value>(text) {
        // serde_json keeps the text (arbitrary_precision); compare with
        // the text it kept, and with the input itself when they agree.
        let kept = n.to_string();
        assert_eq!(
            exact(&kept),
            exact(text.trim()),
            "serde_json changed the value of {text:?} to {kept:?}"
        );
        check(text.trim(), &order(Value::Number(n)), true);
    }
    // As a JSON string: the text as it is.
    check(text, &order(Value::String(text.to_string())), false);
});
