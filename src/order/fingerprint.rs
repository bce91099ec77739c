//! An order's fingerprint: the hash of what it asks for, in one canonical
//! form, so a redelivery with its keys in another order, its numbers in
//! another form or its instant in another offset is the same order, and
//! other content under the same id is a conflict.

use rust_decimal::Decimal;
use sha2::{Digest, Sha256};

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
