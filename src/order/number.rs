//! An order's quantity and price: exact decimals read from a JSON number or
//! a numeric string by one grammar, never through a float.

use rust_decimal::Decimal;
use serde_json::Value;

use super::{
    FractionalNumbers, InvalidOrder, MAX_FRACTIONAL_NUMBER_DIGITS, MAX_INTEGER_DIGITS, MAX_SCALE,
};
use crate::text::{json_kind, truncate};

/// Parse an exact decimal from a JSON number or a numeric string; refuse
/// anything that is not a positive decimal that fits `DECIMAL(28,10)`.
///
/// One grammar for both forms: the JSON number grammar (RFC 8259 §6) and
/// nothing else. `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`: no
/// `+` sign, no leading zeros, digits on both sides of a point, no spaces.
/// The exponent is expanded exactly (the Functions host re-serializes numbers
/// through .NET doubles, which writes `0.000001` as `1E-06`); its value (not
/// its digits: `1e0002` is `1e2`) must be at most [`MAX_EXPONENT`].
pub(super) fn positive_decimal(
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
