//! `OUTBOX_*`: where executions are announced (issue 32).

use std::time::Duration;

use super::{err, ConfigError};
use crate::deadletter::storage::{check_container, parse_storage_of, Service};
use crate::outbox::{DispatchSettings, Encoding, Naming, OutboxSettings, QueueSettings};

/// Default `OUTBOX_QUEUE`.
pub const DEFAULT_OUTBOX_QUEUE: &str = "order-executed";

/// The outbox's settings. `val` reads a trimmed, non-empty setting;
/// `retention_hours` is `OUTBOX_RETENTION_HOURS` already bounded. Messages
/// never quote `OUTBOX_STORAGE` (it may hold a key or a SAS).
pub(super) fn outbox(
    val: &impl Fn(&str) -> Option<String>,
    retention_hours: u64,
) -> Result<OutboxSettings, ConfigError> {
    let queue_name = val("OUTBOX_QUEUE");
    if let Some(q) = &queue_name {
        check_container(q).map_err(|_| {
            err(
                "OUTBOX_QUEUE",
                "expected a queue name: 3 to 63 lowercase letters, digits and single hyphens, starting and ending with a letter or digit",
            )
        })?;
    }
    let encoding = match val("OUTBOX_MESSAGE_ENCODING").as_deref() {
        None | Some("base64") => Encoding::Base64,
        Some("none") => Encoding::None,
        Some(other) => {
            return Err(err(
                "OUTBOX_MESSAGE_ENCODING",
                format!("expected \"base64\" (what a Functions Queue trigger reads by default) or \"none\" (host.json's messageEncoding: none), got {other:?}"),
            ))
        }
    };
    let naming = Naming {
        type_prefix: word(
            val("OUTBOX_EVENT_TYPE_PREFIX"),
            "OUTBOX_EVENT_TYPE_PREFIX",
            "OrderGuard",
        )?,
        source: word(
            val("OUTBOX_EVENT_SOURCE"),
            "OUTBOX_EVENT_SOURCE",
            "/order-guard",
        )?,
    };
    let queue = match val("OUTBOX_STORAGE") {
        // Like DEAD_LETTER_CONTAINER: the queue's name alone sends nothing
        // (`local.settings.json.example` shows it with no storage).
        None => None,
        Some(storage) => {
            let target = parse_storage_of(&storage, Service::Queue).map_err(|p| {
                err(
                    "OUTBOX_STORAGE",
                    format!("{p}; expected the storage account's connection string, UseDevelopmentStorage=true, or the queue's URL https://<account>.queue.core.windows.net/<queue>[?<SAS>] (the value is not shown)"),
                )
            })?;
            let queue = match (&target.container, queue_name) {
                (Some(in_url), Some(set)) if *in_url != set => {
                    return Err(err(
                        "OUTBOX_QUEUE",
                        format!("is {set:?} but OUTBOX_STORAGE's URL names the queue {in_url:?}; set one of them"),
                    ))
                }
                (Some(in_url), _) => in_url.clone(),
                (None, Some(set)) => set,
                (None, None) => DEFAULT_OUTBOX_QUEUE.to_string(),
            };
            Some(QueueSettings {
                storage: target,
                queue,
                encoding,
            })
        }
    };
    Ok(OutboxSettings {
        queue,
        dispatch: DispatchSettings {
            naming,
            retention: Duration::from_secs(retention_hours * 3600),
            ..DispatchSettings::default()
        },
    })
}

/// A name without white space or control characters, or `default`.
fn word(v: Option<String>, var: &'static str, default: &str) -> Result<String, ConfigError> {
    match v {
        None => Ok(default.to_string()),
        Some(v) if v.chars().any(|c| c.is_control() || c.is_whitespace()) => Err(err(
            var,
            format!("expected a name without spaces or control characters, such as {default}"),
        )),
        Some(v) => Ok(v),
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::config;
    use crate::outbox::Encoding;

    #[test]
    fn no_storage_no_dispatch_and_the_rows_kept_a_week() {
        let c = config(&[]).unwrap();
        assert_eq!(c.outbox.queue, None);
        assert_eq!(c.outbox.dispatch.retention.as_secs(), 7 * 24 * 3600);
        assert_eq!(c.outbox.dispatch.naming.type_prefix, "OrderGuard");
    }

    #[test]
    fn a_connection_string_names_the_accounts_queue_service() {
        let c = config(&[("OUTBOX_STORAGE", "UseDevelopmentStorage=true")]).unwrap();
        let q = c.outbox.queue.unwrap();
        assert_eq!(q.queue, "order-executed");
        assert_eq!(
            q.storage.endpoint,
            "http://127.0.0.1:10001/devstoreaccount1"
        );
        assert_eq!(q.encoding, Encoding::Base64);
        let c = config(&[
            ("OUTBOX_STORAGE", "DefaultEndpointsProtocol=https;AccountName=ordersprod;AccountKey=a2V5;EndpointSuffix=core.windows.net"),
            ("OUTBOX_QUEUE", "executions"),
            ("OUTBOX_MESSAGE_ENCODING", "none"),
            ("OUTBOX_EVENT_TYPE_PREFIX", "Contoso.Trading"),
            ("OUTBOX_RETENTION_HOURS", "48"),
        ])
        .unwrap();
        let q = c.outbox.queue.unwrap();
        assert_eq!(
            q.storage.endpoint,
            "https://ordersprod.queue.core.windows.net"
        );
        assert_eq!(
            (q.queue.as_str(), q.encoding),
            ("executions", Encoding::None)
        );
        assert_eq!(c.outbox.dispatch.naming.type_prefix, "Contoso.Trading");
        assert_eq!(c.outbox.dispatch.retention.as_secs(), 48 * 3600);
        // A queue URL without a SAS: Entra ID.
        let c = config(&[(
            "OUTBOX_STORAGE",
            "https://ordersprod.queue.core.windows.net/executions",
        )])
        .unwrap();
        assert_eq!(c.outbox.queue.unwrap().queue, "executions");
    }

    #[test]
    fn mistakes_name_the_setting_and_never_the_secret() {
        for (pairs, var) in [
            (vec![("OUTBOX_QUEUE", "Executions")], "OUTBOX_QUEUE"),
            (
                vec![
                    ("OUTBOX_STORAGE", "UseDevelopmentStorage=true"),
                    ("OUTBOX_QUEUE", "Bad_Name"),
                ],
                "OUTBOX_QUEUE",
            ),
            (
                vec![("OUTBOX_STORAGE", "AccountKey=c2VjcmV0LWtleQ==")],
                "OUTBOX_STORAGE",
            ),
            (
                vec![
                    ("OUTBOX_STORAGE", "UseDevelopmentStorage=true"),
                    ("OUTBOX_MESSAGE_ENCODING", "xml"),
                ],
                "OUTBOX_MESSAGE_ENCODING",
            ),
            (
                vec![("OUTBOX_RETENTION_HOURS", "12")],
                "OUTBOX_RETENTION_HOURS",
            ),
            (
                vec![("OUTBOX_EVENT_TYPE_PREFIX", "Order Guard")],
                "OUTBOX_EVENT_TYPE_PREFIX",
            ),
        ] {
            let e = config(&pairs).unwrap_err();
            assert_eq!(e.var, var, "{e}");
            assert!(!e.problem.contains("c2VjcmV0LWtleQ"), "{e}");
        }
    }
}
