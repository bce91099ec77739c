//! Positions, exact to `DECIMAL(38,10)`: the sum of every executed order of
//! an account in a symbol.
//!
//! An order's quantity fits `DECIMAL(28,10)` (a 96-bit `Decimal`), but a
//! position, the sum of many of them, needs up to 38 significant digits,
//! more than `Decimal` keeps (28-29: it rounds beyond, so nine orders of
//! `999999999999999999.0000000001` would lose their last digit). A
//! [`Position`] is a fixed-point `i128` counting units of 10^-10, so every
//! sum is exact or refused, never rounded. Pure: no I/O.

use std::fmt;
use std::str::FromStr;

use rust_decimal::Decimal;

use crate::order::Side;

/// Digits after the point a position keeps.
pub const SCALE: u32 = 10;
/// Most digits before the point (38 - 10).
pub const MAX_INTEGER_DIGITS: u32 = 28;
/// One unit of the integer part, in units of 10^-[`SCALE`].
const ONE: i128 = 10_i128.pow(SCALE);
/// The largest magnitude `DECIMAL(38,10)` holds: 10^28 - 10^-10.
const MAX_UNITS: i128 = 10_i128.pow(SCALE + MAX_INTEGER_DIGITS) - 1;

/// An exact amount within `DECIMAL(38,10)`: `units` × 10^-10, |units| < 10^38.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    units: i128,
}

/// A value that is not a position: out of `DECIMAL(38,10)`, more than 10
/// decimal places, or not a plain decimal text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidPosition(pub String);

/// Applying an order would take a position beyond `DECIMAL(38,10)`. The
/// order is rejected, never rounded and never executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Overflow {
    /// The position before the order.
    pub current: Position,
    /// The order's signed change.
    pub change: Position,
}

impl Overflow {
    /// The value the position would have had, exactly (for any order that
    /// passed validation it fits an `i128`, only not the column).
    pub fn would_be(&self) -> String {
        self.current
            .units
            .checked_add(self.change.units)
            .map_or_else(|| "a value of more than 38 digits".into(), units_text)
    }

    /// Why the order is rejected, as stored and answered.
    pub fn reason(&self, account_id: &str, symbol: &str) -> String {
        format!(
            "position overflow: the order would take the position of account {account_id:?} in {symbol:?} from {} to {}, beyond DECIMAL(38,10) (at most {MAX_INTEGER_DIGITS} digits before the point); rejected, not executed",
            self.current,
            self.would_be()
        )
    }
}

impl Position {
    /// Zero: the position of an account that never traded the symbol.
    pub const ZERO: Position = Position { units: 0 };

    /// A position of `units` × 10^-10, if it fits `DECIMAL(38,10)`.
    pub fn from_units(units: i128) -> Option<Position> {
        // `unsigned_abs`: `i128::MIN.abs()` would overflow.
        (units.unsigned_abs() <= MAX_UNITS.unsigned_abs()).then_some(Position { units })
    }

    /// The value in units of 10^-10 (what a `DECIMAL(38,10)` parameter carries).
    pub fn units(self) -> i128 {
        self.units
    }

    /// A decimal as a position, exactly: refused if it has non-zero digits
    /// beyond the 10th decimal place (never rounded).
    pub fn from_decimal(d: Decimal) -> Result<Position, InvalidPosition> {
        let d = d.normalize();
        let scale = d.scale();
        if scale > SCALE {
            return Err(InvalidPosition(format!(
                "{d} has {scale} decimal places; a position keeps {SCALE}"
            )));
        }
        // |mantissa| < 2^96 and the factor at most 10^10: no i128 overflow.
        Position::from_units(d.mantissa() * 10_i128.pow(SCALE - scale))
            .ok_or_else(|| InvalidPosition(format!("{d} is beyond DECIMAL(38,10)")))
    }

    /// What an order of `side` and `quantity` adds to a position: the
    /// quantity for a buy, its negation for a sell. A validated quantity
    /// fits DECIMAL(28,10); one that does not becomes a change no position
    /// can take (refused as an overflow by [`Position::apply`]) rather than
    /// a rounded one.
    pub fn change_of(side: Side, quantity: Decimal) -> Position {
        let magnitude = Position::from_decimal(quantity).map_or(i128::MAX, |p| p.units);
        Position {
            units: match side {
                Side::Buy => magnitude,
                Side::Sell => -magnitude,
            },
        }
    }

    /// The position after an order of `side` and `quantity`, or the
    /// [`Overflow`] that refuses it.
    pub fn apply(self, side: Side, quantity: Decimal) -> Result<Position, Overflow> {
        let change = Position::change_of(side, quantity);
        self.units
            .checked_add(change.units)
            .and_then(Position::from_units)
            .ok_or(Overflow {
                current: self,
                change,
            })
    }
}

impl From<i64> for Position {
    /// A whole number: every `i64` fits (19 digits of the 28).
    fn from(n: i64) -> Position {
        Position {
            units: i128::from(n) * ONE,
        }
    }
}

/// `units` × 10^-10 as plain decimal text, without trailing zeros.
fn units_text(units: i128) -> String {
    let sign = if units < 0 { "-" } else { "" };
    let magnitude = units.unsigned_abs();
    let (int, frac) = (magnitude / ONE as u128, magnitude % ONE as u128);
    if frac == 0 {
        return format!("{sign}{int}");
    }
    let frac = format!("{frac:010}");
    format!("{sign}{int}.{}", frac.trim_end_matches('0'))
}

impl fmt::Display for Position {
    /// Exact plain decimal text without trailing zeros (`-12.5`, `0`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&units_text(self.units))
    }
}

impl FromStr for Position {
    type Err = InvalidPosition;

    /// Plain decimal text (`-?digits(.digits)?`, as stores keep it): digits
    /// beyond the 10th decimal place must be zeros, at most 28 before the point.
    fn from_str(text: &str) -> Result<Position, InvalidPosition> {
        let bad = |why: &str| InvalidPosition(format!("position {text:?}: {why}"));
        let (negative, unsigned) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let (int, frac) = unsigned.split_once('.').unwrap_or((unsigned, ""));
        let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if int.is_empty()
            || !digits(int)
            || !digits(frac)
            || (unsigned.contains('.') && frac.is_empty())
        {
            return Err(bad("not a plain decimal number"));
        }
        let int = int.trim_start_matches('0');
        let frac = frac.trim_end_matches('0');
        if int.len() > MAX_INTEGER_DIGITS as usize {
            return Err(bad("beyond DECIMAL(38,10)"));
        }
        if frac.len() > SCALE as usize {
            return Err(bad("more than 10 decimal places"));
        }
        // At most 28 + 10 digits: below 10^38, within i128.
        let joined = format!("{int}{frac:0<10}");
        let magnitude: i128 = joined
            .parse()
            .map_err(|_| bad("not a plain decimal number"))?;
        Ok(Position {
            units: if negative { -magnitude } else { magnitude },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(text: &str) -> Decimal {
        Decimal::from_str_exact(text).unwrap()
    }

    fn p(text: &str) -> Position {
        text.parse().unwrap()
    }

    #[test]
    fn sums_stay_exact_beyond_28_digits() {
        let mut pos = Position::ZERO;
        for _ in 0..9 {
            pos = pos
                .apply(Side::Buy, d("999999999999999999.0000000001"))
                .unwrap();
        }
        assert_eq!(pos.to_string(), "8999999999999999991.0000000009");
        let mut pos = Position::ZERO.apply(Side::Buy, d("0.0000000002")).unwrap();
        for _ in 0..8 {
            pos = pos.apply(Side::Buy, d("999999999999999999")).unwrap();
        }
        assert_eq!(pos.to_string(), "7999999999999999992.0000000002");
        let back = pos.apply(Side::Sell, d("999999999999999999")).unwrap();
        assert_eq!(back.to_string(), "6999999999999999993.0000000002");
    }

    #[test]
    fn units_outside_the_column_are_refused_without_panicking() {
        assert_eq!(Position::from_units(i128::MIN), None);
        assert_eq!(Position::from_units(i128::MAX), None);
        assert_eq!(
            Position::from_units(MAX_UNITS).map(Position::units),
            Some(MAX_UNITS)
        );
        assert_eq!(
            Position::from_units(-MAX_UNITS).map(Position::units),
            Some(-MAX_UNITS)
        );
        assert_eq!(Position::from_units(MAX_UNITS + 1), None);
    }

    #[test]
    fn text_round_trips_exactly() {
        for text in [
            "0",
            "-0.5",
            "25",
            "0.0000000001",
            "-9999999999999999999999999999.9999999999",
            "9999999999999999999999999999.9999999999",
            "8999999999999999991.0000000009",
        ] {
            assert_eq!(p(text).to_string(), text);
        }
        // As stores may keep them: trailing zeros, leading zeros, `-0`.
        assert_eq!(p("25.0000000000").to_string(), "25");
        assert_eq!(p("007.50").to_string(), "7.5");
        assert_eq!(p("-0").to_string(), "0");
        assert_eq!(p("1.000000000100000").to_string(), "1.0000000001");
        for bad in [
            "",
            "-",
            "1.",
            ".5",
            "+1",
            "1e5",
            " 1",
            "1.00000000001",
            "10000000000000000000000000000",
            "--1",
            "1.2.3",
        ] {
            assert!(bad.parse::<Position>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn decimals_convert_exactly() {
        assert_eq!(
            Position::from_decimal(d("123456789012345678.0000000001"))
                .unwrap()
                .units(),
            1_234_567_890_123_456_780_000_000_001
        );
        assert_eq!(Position::from_decimal(d("2.50")).unwrap(), p("2.5"));
        assert!(Position::from_decimal(d("0.00000000001")).is_err());
    }

    #[test]
    fn an_overflow_is_refused_never_rounded() {
        let top = p("9999999999999999999999999999.9999999999");
        let o = top.apply(Side::Buy, d("0.0000000001")).unwrap_err();
        assert_eq!(o.current, top);
        assert_eq!(o.would_be(), "10000000000000000000000000000");
        assert_eq!(
            o.reason("a-1", "MSFT"),
            "position overflow: the order would take the position of account \"a-1\" in \"MSFT\" from 9999999999999999999999999999.9999999999 to 10000000000000000000000000000, beyond DECIMAL(38,10) (at most 28 digits before the point); rejected, not executed"
        );
        // A sell from the top is fine; the bottom overflows the other way.
        assert!(top.apply(Side::Sell, d("1")).is_ok());
        let bottom = p("-9999999999999999999999999999");
        let o = bottom.apply(Side::Sell, d("1")).unwrap_err();
        assert_eq!(o.would_be(), "-10000000000000000000000000000");
        // The largest order still fits next to a position one below the top.
        let near = p("9999999999999999999999999999")
            .apply(Side::Sell, d("999999999999999999.9999999999"))
            .unwrap();
        assert_eq!(near.to_string(), "9999999998999999999999999999.0000000001");
    }
}
