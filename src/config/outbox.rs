//! `OUTBOX_*`: where executions are announced.

use std::time::Duration;

use super::{err, ConfigError};
use crate::outbox::{
    DestinationSettings, DispatchSettings, Encoding, Naming, OutboxSettings, QueueSettings, Schema,
    TopicAuth, TopicSettings,
};
use crate::storage::{check_container, parse_storage_of, Secret, Service, StorageTarget};

/// Default `OUTBOX_QUEUE`.
pub const DEFAULT_OUTBOX_QUEUE: &str = "order-executed";

/// The outbox's settings. `val` reads a trimmed, non-empty setting;
/// `retention_hours` is `OUTBOX_RETENTION_HOURS` already bounded. Messages
/// never quote `OUTBOX_STORAGE` (it may hold a key or a SAS).
pub(super) fn outbox(
    val: &impl Fn(&str) -> Option<String>,
    client_id: Option<&str>,
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
    let message_ttl = message_ttl(val("OUTBOX_MESSAGE_TTL_SECONDS"))?;
    let ttl_under_retention = match val("OUTBOX_MESSAGE_TTL_UNDER_RETENTION").as_deref() {
        None | Some("refuse") => false,
        Some("accept") => true,
        Some(other) => {
            return Err(err(
                "OUTBOX_MESSAGE_TTL_UNDER_RETENTION",
                format!("expected \"refuse\" (the default) or \"accept\", got {other:?}"),
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
            if let Some(ttl) = message_ttl {
                check_ttl(ttl, retention_hours, ttl_under_retention)?;
            }
            Some(QueueSettings {
                storage: StorageTarget {
                    credential: target.credential.with_client_id(client_id),
                    ..target
                },
                queue,
                encoding,
                message_ttl,
            })
        }
    };
    let topic = topic(val, client_id)?;
    let destination = match (queue, topic) {
        (Some(_), Some(_)) => {
            return Err(err(
                "OUTBOX_TOPIC_ENDPOINT",
                "and OUTBOX_STORAGE are both set: announcements go to one destination, a Storage Queue or an Event Grid topic; unset one",
            ))
        }
        (Some(q), None) => Some(DestinationSettings::Queue(q)),
        (None, Some(t)) => Some(DestinationSettings::Topic(t)),
        (None, None) => None,
    };
    Ok(OutboxSettings {
        destination,
        dispatch: DispatchSettings {
            naming,
            retention: Duration::from_secs(retention_hours * 3600),
            ..DispatchSettings::default()
        },
    })
}

/// `OUTBOX_TOPIC_ENDPOINT`, `OUTBOX_TOPIC_KEY`, `OUTBOX_TOPIC_SCHEMA`: an
/// Event Grid custom topic, or `None`. The key is never shown.
fn topic(
    val: &impl Fn(&str) -> Option<String>,
    client_id: Option<&str>,
) -> Result<Option<TopicSettings>, ConfigError> {
    let schema = match val("OUTBOX_TOPIC_SCHEMA").as_deref() {
        None | Some("eventgrid") => Schema::EventGrid,
        Some("cloudevents") => Schema::CloudEvents,
        Some(other) => {
            return Err(err(
                "OUTBOX_TOPIC_SCHEMA",
                format!("expected \"eventgrid\" or \"cloudevents\" (the topic's input schema), got {other:?}"),
            ))
        }
    };
    let Some(endpoint) = val("OUTBOX_TOPIC_ENDPOINT") else {
        if val("OUTBOX_TOPIC_KEY").is_some() {
            return Err(err(
                "OUTBOX_TOPIC_KEY",
                "is set but OUTBOX_TOPIC_ENDPOINT is not: give the topic's endpoint (az eventgrid topic show --query endpoint)",
            ));
        }
        return Ok(None);
    };
    let loopback = ["http://127.", "http://localhost", "http://[::1]"]
        .iter()
        .any(|p| endpoint.starts_with(p));
    if !(endpoint.starts_with("https://") || loopback) || endpoint.contains('?') {
        return Err(err(
            "OUTBOX_TOPIC_ENDPOINT",
            "expected the topic's endpoint, https://<topic>.<region>-1.eventgrid.azure.net/api/events (no query; http only to this machine)",
        ));
    }
    let auth = match val("OUTBOX_TOPIC_KEY") {
        Some(key) => TopicAuth::Key(Secret::new(key)),
        None if loopback => {
            return Err(err(
                "OUTBOX_TOPIC_KEY",
                "is needed for a plain-http endpoint: Entra ID tokens are never sent over http",
            ))
        }
        None => TopicAuth::EntraId {
            client_id: client_id.map(str::to_string),
        },
    };
    Ok(Some(TopicSettings {
        endpoint,
        auth,
        schema,
    }))
}

/// `OUTBOX_MESSAGE_TTL_SECONDS`: how long a queue message lives unread;
/// `-1` (the default) for ever.
fn message_ttl(v: Option<String>) -> Result<Option<Duration>, ConfigError> {
    const VAR: &str = "OUTBOX_MESSAGE_TTL_SECONDS";
    match v.as_deref() {
        None | Some("-1") => Ok(None),
        Some(text) => match text.parse::<u32>() {
            Ok(n) if n >= 1 && n <= i32::MAX as u32 => Ok(Some(Duration::from_secs(n.into()))),
            _ => Err(err(
                VAR,
                format!("expected -1 (messages never expire, the default) or a number of seconds from 1 to {}, got {text:?}", i32::MAX),
            )),
        },
    }
}

/// A message that may expire unread before its row is purged is an
/// announcement that can be lost with the row saying "sent": refused,
/// unless `OUTBOX_MESSAGE_TTL_UNDER_RETENTION=accept` says it is meant
/// (consumers away longer than the lifetime may then miss announcements).
fn check_ttl(ttl: Duration, retention_hours: u64, accepted: bool) -> Result<(), ConfigError> {
    let retention = retention_hours * 3600;
    if accepted || ttl.as_secs() >= retention {
        return Ok(());
    }
    Err(err(
        "OUTBOX_MESSAGE_TTL_SECONDS",
        format!(
            "is {} s, shorter than the outbox's retention ({retention_hours} h, OUTBOX_RETENTION_HOURS): a message could expire unread while its row says sent, and the row is then purged, the announcement lost with no record; set -1 (never expire, the default) or at least {retention} s, or OUTBOX_MESSAGE_TTL_UNDER_RETENTION=accept if consumers away that long may miss announcements",
            ttl.as_secs()
        ),
    ))
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
    use crate::config::Config;
    use crate::outbox::{DestinationSettings, Encoding, QueueSettings, Schema, TopicAuth};

    fn queue(c: &Config) -> QueueSettings {
        match c.outbox.destination.clone() {
            Some(DestinationSettings::Queue(q)) => q,
            other => panic!("want a queue, got {other:?}"),
        }
    }

    #[test]
    fn an_event_grid_topic_by_key_or_by_identity() {
        let endpoint = "https://orders.westeurope-1.eventgrid.azure.net/api/events";
        let c = config(&[
            ("OUTBOX_TOPIC_ENDPOINT", endpoint),
            ("OUTBOX_TOPIC_KEY", "c2VjcmV0LWtleQ=="),
            ("OUTBOX_TOPIC_SCHEMA", "cloudevents"),
        ])
        .unwrap();
        let Some(DestinationSettings::Topic(t)) = c.outbox.destination else {
            panic!("want a topic")
        };
        assert_eq!(
            (t.endpoint.as_str(), t.schema),
            (endpoint, Schema::CloudEvents)
        );
        assert!(matches!(t.auth, TopicAuth::Key(_)));
        assert!(
            !format!("{t:?}").contains("c2VjcmV0LWtleQ"),
            "the key is never shown"
        );
        let c = config(&[("OUTBOX_TOPIC_ENDPOINT", endpoint)]).unwrap();
        let Some(DestinationSettings::Topic(t)) = c.outbox.destination else {
            panic!("want a topic")
        };
        assert_eq!(
            (t.auth, t.schema),
            (TopicAuth::EntraId { client_id: None }, Schema::EventGrid)
        );
    }

    #[test]
    fn no_storage_no_dispatch_and_the_rows_kept_a_week() {
        let c = config(&[]).unwrap();
        assert_eq!(c.outbox.destination, None);
        assert_eq!(c.outbox.dispatch.retention.as_secs(), 7 * 24 * 3600);
        assert_eq!(c.outbox.dispatch.naming.type_prefix, "OrderGuard");
    }

    #[test]
    fn a_connection_string_names_the_accounts_queue_service() {
        let c = config(&[("OUTBOX_STORAGE", "UseDevelopmentStorage=true")]).unwrap();
        let q = queue(&c);
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
        let q = queue(&c);
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
        assert_eq!(queue(&c).queue, "executions");
        assert_eq!(queue(&c).message_ttl, None, "messages never expire");
        let ttl = |v: &str| {
            config(&[
                ("OUTBOX_STORAGE", "UseDevelopmentStorage=true"),
                ("OUTBOX_MESSAGE_TTL_SECONDS", v),
            ])
        };
        assert_eq!(queue(&ttl("-1").unwrap()).message_ttl, None);
        // Shorter than the retention (a week by default): refused, naming
        // both, unless accepted on purpose.
        let short = ttl("3600").unwrap_err();
        assert_eq!(short.var, "OUTBOX_MESSAGE_TTL_SECONDS");
        assert!(
            short.problem.contains("OUTBOX_RETENTION_HOURS")
                && short
                    .problem
                    .contains("OUTBOX_MESSAGE_TTL_UNDER_RETENTION=accept"),
            "{short}"
        );
        let accepted = config(&[
            ("OUTBOX_STORAGE", "UseDevelopmentStorage=true"),
            ("OUTBOX_MESSAGE_TTL_SECONDS", "3600"),
            ("OUTBOX_MESSAGE_TTL_UNDER_RETENTION", "accept"),
        ])
        .unwrap();
        assert_eq!(
            queue(&accepted).message_ttl,
            Some(std::time::Duration::from_secs(3600))
        );
        let bad = config(&[("OUTBOX_MESSAGE_TTL_UNDER_RETENTION", "yes")]).unwrap_err();
        assert_eq!(bad.var, "OUTBOX_MESSAGE_TTL_UNDER_RETENTION");
        // As long as the retention, or longer: accepted as it is.
        assert_eq!(
            queue(&ttl(&(7 * 24 * 3600).to_string()).unwrap()).message_ttl,
            Some(std::time::Duration::from_secs(7 * 24 * 3600))
        );
        let day = config(&[
            ("OUTBOX_STORAGE", "UseDevelopmentStorage=true"),
            ("OUTBOX_MESSAGE_TTL_SECONDS", "86400"),
            ("OUTBOX_RETENTION_HOURS", "24"),
        ])
        .unwrap();
        assert_eq!(
            queue(&day).message_ttl,
            Some(std::time::Duration::from_secs(86_400))
        );
        for bad in ["0", "-2", "7d", "2147483648"] {
            assert_eq!(
                ttl(bad).unwrap_err().var,
                "OUTBOX_MESSAGE_TTL_SECONDS",
                "{bad}"
            );
        }
    }

    /// `AZURE_CLIENT_ID`, the app's user-assigned identity, signs every
    /// Azure client in: the queue, the topic and the dead-letter blobs (a
    /// key or a SAS is kept as it is).
    #[test]
    fn the_user_assigned_identity_signs_every_storage_client_in() {
        use crate::storage::Credential;
        let id = "6f1c3b52-8d1e-4c5a-9f43-2b7d0e9a1c11";
        let c = config(&[
            ("AZURE_CLIENT_ID", id),
            (
                "OUTBOX_STORAGE",
                "https://ordersprod.queue.core.windows.net/executions",
            ),
            (
                "DEAD_LETTER_STORAGE",
                "https://ordersprod.blob.core.windows.net/deadletters",
            ),
        ])
        .unwrap();
        let named = Credential::EntraId {
            client_id: Some(id.into()),
        };
        assert_eq!(queue(&c).storage.credential, named);
        assert_eq!(c.dead_letter.unwrap().storage.credential, named);
        let c = config(&[
            ("AZURE_CLIENT_ID", id),
            ("OUTBOX_STORAGE", "UseDevelopmentStorage=true"),
        ])
        .unwrap();
        assert!(matches!(
            queue(&c).storage.credential,
            Credential::AccountKey(_)
        ));
        let e = config(&[("AZURE_CLIENT_ID", "my-identity")]).unwrap_err();
        assert_eq!(e.var, "AZURE_CLIENT_ID");
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
