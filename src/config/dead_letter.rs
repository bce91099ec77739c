//! `DEAD_LETTER_STORAGE` and `DEAD_LETTER_CONTAINER`: the container the
//! sweep replays.

use super::{err, ConfigError};
use crate::deadletter::DeadLetterSettings;
use crate::storage::{check_container, parse_storage, StorageTarget};

/// Default `DEAD_LETTER_CONTAINER`.
pub const DEFAULT_DEAD_LETTER_CONTAINER: &str = "deadletters";

/// `DEAD_LETTER_STORAGE` and `DEAD_LETTER_CONTAINER`: the sweep's
/// settings, or `None` when no storage is given. Messages never quote the
/// storage value (it may hold a key or a SAS).
pub(super) fn dead_letter(
    storage: Option<String>,
    client_id: Option<&str>,
    container: Option<String>,
    max_blob_bytes: u64,
) -> Result<Option<DeadLetterSettings>, ConfigError> {
    if let Some(c) = &container {
        check_container(c).map_err(|p| err("DEAD_LETTER_CONTAINER", p))?;
    }
    let Some(storage) = storage else {
        return Ok(None);
    };
    let target = parse_storage(&storage).map_err(|p| {
        err(
            "DEAD_LETTER_STORAGE",
            format!("{p}; expected the storage account's connection string, UseDevelopmentStorage=true, or the container's URL https://<account>.blob.core.windows.net/<container>[?<SAS>] (the value is not shown)"),
        )
    })?;
    let container = match (&target.container, container) {
        (Some(in_url), Some(set)) if *in_url != set => {
            return Err(err(
                "DEAD_LETTER_CONTAINER",
                format!("is {set:?} but DEAD_LETTER_STORAGE's URL names the container {in_url:?}; set one of them"),
            ))
        }
        (Some(in_url), _) => in_url.clone(),
        (None, Some(set)) => set,
        (None, None) => DEFAULT_DEAD_LETTER_CONTAINER.to_string(),
    };
    let target = StorageTarget {
        credential: target.credential.with_client_id(client_id),
        ..target
    };
    Ok(Some(DeadLetterSettings {
        storage: target,
        container,
        max_blob_bytes,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::config;
    use crate::deadletter::DEFAULT_MAX_BLOB_BYTES;

    #[test]
    fn the_dead_letter_settings() {
        assert_eq!(config(&[]).unwrap().dead_letter, None);
        let c = config(&[("DEAD_LETTER_STORAGE", "UseDevelopmentStorage=true")]).unwrap();
        let d = c.dead_letter.unwrap();
        assert_eq!(d.container, DEFAULT_DEAD_LETTER_CONTAINER);
        assert_eq!(d.storage.account, "devstoreaccount1");
        assert_eq!(d.max_blob_bytes, DEFAULT_MAX_BLOB_BYTES);
        let c = config(&[
            ("DEAD_LETTER_STORAGE", "UseDevelopmentStorage=true"),
            ("DEAD_LETTER_MAX_BLOB_BYTES", "65536"),
        ])
        .unwrap();
        assert_eq!(c.dead_letter.unwrap().max_blob_bytes, 65_536);
        for bad in ["1000", "0", "many"] {
            let e = config(&[
                ("DEAD_LETTER_STORAGE", "UseDevelopmentStorage=true"),
                ("DEAD_LETTER_MAX_BLOB_BYTES", bad),
            ])
            .unwrap_err();
            assert_eq!(e.var, "DEAD_LETTER_MAX_BLOB_BYTES", "{bad}");
        }
        assert_eq!(d.max_blob_bytes, DEFAULT_MAX_BLOB_BYTES);
        let c = config(&[
            ("DEAD_LETTER_STORAGE", "UseDevelopmentStorage=true"),
            ("DEAD_LETTER_MAX_BLOB_BYTES", "65536"),
        ])
        .unwrap();
        assert_eq!(c.dead_letter.unwrap().max_blob_bytes, 65_536);
        for bad in ["1000", "0", "many"] {
            let e = config(&[
                ("DEAD_LETTER_STORAGE", "UseDevelopmentStorage=true"),
                ("DEAD_LETTER_MAX_BLOB_BYTES", bad),
            ])
            .unwrap_err();
            assert_eq!(e.var, "DEAD_LETTER_MAX_BLOB_BYTES", "{bad}");
        }
        let c = config(&[
            (
                "DEAD_LETTER_STORAGE",
                "https://ordersdl.blob.core.windows.net/orders-dlq",
            ),
            ("DEAD_LETTER_CONTAINER", "orders-dlq"),
        ])
        .unwrap();
        assert_eq!(c.dead_letter.unwrap().container, "orders-dlq");
        let e = config(&[
            (
                "DEAD_LETTER_STORAGE",
                "https://ordersdl.blob.core.windows.net/orders-dlq",
            ),
            ("DEAD_LETTER_CONTAINER", "other"),
        ])
        .unwrap_err();
        assert_eq!(e.var, "DEAD_LETTER_CONTAINER");
        let key = "c2VjcmV0LWtleS1vZi10aGUtYWNjb3VudC0xMjM0NTY3ODkwYWJjZA==";
        let e = config(&[(
            "DEAD_LETTER_STORAGE",
            &format!("AccountName=Bad_Name;AccountKey={key}"),
        )])
        .unwrap_err();
        assert_eq!(e.var, "DEAD_LETTER_STORAGE");
        assert!(!e.to_string().contains(key), "{e}");
        let c = config(&[(
            "DEAD_LETTER_STORAGE",
            &format!("AccountName=ordersdl;AccountKey={key}"),
        )])
        .unwrap();
        assert!(!format!("{c:?}").contains(key));
        let e = config(&[("DEAD_LETTER_CONTAINER", "Bad")]).unwrap_err();
        assert_eq!(e.var, "DEAD_LETTER_CONTAINER");
    }
}
