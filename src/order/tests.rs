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
                format!("{field} is 129 characters (UTF-16 units) long; at most 128 are allowed")
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
