//! Bytes → what the dead-letter sweep reads from Blob Storage: a blob's body
//! (`parse_blob`), a blob's name (`name::parse`) and the storage setting
//! (`DEAD_LETTER_STORAGE`, `parse_storage`). Never a panic; the same bytes
//! read the same twice; an accepted name reads back from its own text; a
//! key or signature placed in the setting (the marker below) never appears
//! in an error or in the accepted value's `Debug`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use order_guard::deadletter::name;
use order_guard::deadletter::parse_blob;
use order_guard::storage::parse_storage;

const MARKER: &str = "S3cr3tMarker";

fn leaks(text: &str) -> bool {
    text.to_ascii_lowercase()
        .contains(&MARKER.to_ascii_lowercase())
}

fn check_storage(value: &str) {
    let shown = match parse_storage(value) {
        Ok(target) => format!("{target:?}"),
        Err(e) => e,
    };
    assert!(
        !leaks(&shown),
        "DEAD_LETTER_STORAGE={value:?} shows the secret: {shown}"
    );
}

fuzz_target!(|data: &[u8]| {
    let first = parse_blob(data);
    assert_eq!(first, parse_blob(data), "one blob, two readings");
    match &first {
        Ok(events) => assert!(!events.is_empty(), "a readable blob holds an event"),
        Err(e) => assert!(!e.0.is_empty(), "an unreadable blob says why"),
    }

    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(parsed) = name::parse(s) {
        let text = parsed.to_string();
        assert_eq!(
            name::parse(&text).as_ref(),
            Some(&parsed),
            "{s:?} → {text:?}"
        );
    }

    if leaks(s) {
        return;
    }
    check_storage(s);
    for value in [
        format!("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={MARKER};{s}"),
        format!("{s};AccountKey={MARKER}"),
        format!("AccountName={s};SharedAccessSignature=sv=2022&sig={MARKER}"),
        format!("BlobEndpoint={s};SharedAccessSignature=sig={MARKER}{s}"),
        format!("https://acct.blob.core.windows.net/{s}?sv=2022&sig={MARKER}"),
        format!("https://{s}/dead-letters?sig={MARKER}"),
    ] {
        check_storage(&value);
    }
});
