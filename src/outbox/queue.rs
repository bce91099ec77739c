//! The outbox's destination: an Azure Storage Queue, through Microsoft's
//! `azure_storage_queue` client.
//!
//! `OUTBOX_STORAGE` takes the forms `DEAD_LETTER_STORAGE` takes (a
//! connection string, `UseDevelopmentStorage=true`, or a queue URL with a
//! SAS or without one for Entra ID), read by the same parser for the queue
//! service. The client signs in with Entra ID or a SAS in the URL only, so
//! an account key never leaves this process: it signs a service SAS scoped
//! to this one queue with the add right only ([`queue_sas`]), valid for
//! [`SAS_LIFETIME`] and made anew before it ends.
//!
//! The queue has no batch send, so a round's announcements go packed:
//! each message's text is a JSON array of CloudEvents (their JSON batch
//! format), as many as fit in a message ([`MAX_MESSAGE_JSON_BYTES`]), a
//! few messages in flight at once. One request a message costs the
//! client about what an order's execution costs; one a pack divides that
//! by the pack's size, and a queue's 2 000 messages a second (Azure's
//! scalability target for one queue) carry a hundred thousand
//! announcements. Storage Queues promise no order: a consumer orders an
//! account's executions by `(data.epoch, data.sequence)`, never by arrival.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use azure_core::http::{RequestContent, XmlFormat};
use azure_storage_queue::models::{QueueClientSendMessageOptions, QueueMessage};
use azure_storage_queue::{QueueClient, QueueClientOptions};
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::envelope::Form;
use super::pack::{pack, Refusal};
use crate::storage::{Credential, StorageTarget};

/// The service version the SAS is signed for.
const SAS_VERSION: &str = "2021-08-06";

/// How long a SAS made from an account key is valid; a new one is made
/// when less than a quarter of it is left.
pub const SAS_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// The most JSON one message carries. The queue takes 64 KiB of text
/// (413 RequestBodyTooLarge past it); base64 writes 48 KiB of JSON in
/// exactly that, and without it the JSON keeps the room for the XML
/// escapes of its text.
pub const MAX_MESSAGE_JSON_BYTES: usize = 48 * 1024;

/// How a message's text is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Base64 of the JSON: what a Functions Queue trigger reads by default
    /// (`extensions.queues.messageEncoding`, default `base64`).
    Base64,
    /// The JSON itself (`messageEncoding: none`, or another consumer).
    None,
}

/// Where announcements go (built by `config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSettings {
    /// The account's queue service and how to sign in.
    pub storage: StorageTarget,
    pub queue: String,
    pub encoding: Encoding,
    /// How long a message lives on the queue unread: `None`, for ever
    /// (`messagettl=-1`). Azure's default when none is sent is 7 days, and
    /// a row is marked sent at once, then purged after the retention: a
    /// consumer away longer would lose the announcement with no record.
    pub message_ttl: Option<Duration>,
}

/// The `messagettl` of `Put Message` for a message's time to live: `-1`
/// for none (the message never expires), else whole seconds, at least one.
pub fn messagettl(ttl: Option<Duration>) -> i32 {
    match ttl {
        None => -1,
        Some(d) => i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX),
    }
}

/// A queue client, made anew when its SAS is about to end.
pub struct QueueDestination {
    settings: QueueSettings,
    client: Mutex<Option<(Arc<QueueClient>, SystemTime)>>,
}

impl QueueDestination {
    pub fn new(settings: QueueSettings) -> QueueDestination {
        QueueDestination {
            settings,
            client: Mutex::new(None),
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "Storage Queue {} at {} ({}, {} messages, {})",
            self.settings.queue,
            self.settings.storage.endpoint,
            self.settings.storage.credential.kind(),
            match self.settings.encoding {
                Encoding::Base64 => "base64",
                Encoding::None => "JSON",
            },
            match self.settings.message_ttl {
                None => "never expiring".to_string(),
                Some(ttl) => format!("expiring after {} s", ttl.as_secs()),
            }
        )
    }

    fn client(&self) -> Result<Arc<QueueClient>, String> {
        let now = SystemTime::now();
        let mut slot = self.client.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((client, renew_at)) = slot.as_ref() {
            if now < *renew_at {
                return Ok(Arc::clone(client));
            }
        }
        let s = &self.settings;
        let base = format!("{}/{}", s.storage.endpoint, s.queue);
        let (url, credential, renew_at) = match &s.storage.credential {
            Credential::AccountKey(key) => {
                let expiry = now + SAS_LIFETIME;
                let sas = queue_sas(&s.storage.account, &s.queue, key.expose(), "a", expiry)?;
                (format!("{base}?{sas}"), None, now + SAS_LIFETIME * 3 / 4)
            }
            Credential::Sas(sas) => (
                format!("{base}?{}", sas.expose()),
                None,
                now + Duration::from_secs(365 * 24 * 3600),
            ),
            // The chain SQL's `Active Directory Default` and the dead-letter
            // sweep use (role: Storage Queue Data Message Sender).
            Credential::EntraId { client_id } => (
                base,
                Some(Arc::new(crate::entra::default_chain_credential(
                    client_id.clone(),
                    Duration::from_secs(10),
                ))
                    as Arc<dyn azure_core::credentials::TokenCredential>),
                now + Duration::from_secs(365 * 24 * 3600),
            ),
        };
        let url = azure_core::http::Url::parse(&url)
            .map_err(|e| format!("the queue URL is not a URL: {e}"))?;
        let mut options = QueueClientOptions::default();
        // The outbox retries by itself, row by row, with its own back-off.
        options.client_options.retry = azure_core::http::RetryOptions::none();
        crate::tls::install_crypto_provider();
        let client = Arc::new(
            QueueClient::new(url, credential, Some(options))
                .map_err(|e| format!("cannot make the queue client: {e}"))?,
        );
        *slot = Some((Arc::clone(&client), renew_at));
        Ok(client)
    }

    /// The form of its events: CloudEvents, in their JSON batch format.
    pub fn form(&self) -> Form {
        Form::CloudEvent
    }

    /// The most JSON one message carries.
    pub fn pack_limit(&self) -> usize {
        MAX_MESSAGE_JSON_BYTES
    }

    /// Send one pack of events (each a CloudEvent's JSON) as one message.
    pub async fn post(&self, events: &[String]) -> Result<(), Refusal> {
        let client = self.client().map_err(Refusal::Request)?;
        let body =
            message_body(pack(events), self.settings.encoding).map_err(|e| Refusal::Events {
                message: format!("cannot encode the message: {e}"),
                certain: true,
            })?;
        let options = QueueClientSendMessageOptions {
            message_time_to_live: Some(messagettl(self.settings.message_ttl)),
            ..Default::default()
        };
        let Err(e) = client.send_message(body, Some(options)).await else {
            return Ok(());
        };
        let status = e.http_status().map(u16::from);
        let message = match status {
            Some(404) => format!(
                "the queue {} does not exist (404): create it (docs/deploy.md step 6: a PUT of queueServices/default/queues/{} on the account)",
                self.settings.queue, self.settings.queue
            ),
            Some(code) => format!("the queue answered {code}: {e}"),
            None => format!("the queue could not be reached: {e}"),
        };
        Err(refusal(status, message))
    }
}

/// The XML of the message `Put Message` takes: the message's text, the
/// JSON's base64 (what a Functions Queue trigger reads by default) or the
/// JSON itself, written by the queue client's serializer (which escapes
/// it).
fn message_body(
    json: String,
    encoding: Encoding,
) -> azure_core::Result<RequestContent<QueueMessage, XmlFormat>> {
    let text = match encoding {
        Encoding::Base64 => base64::engine::general_purpose::STANDARD.encode(json),
        Encoding::None => json,
    };
    QueueMessage {
        message_text: Some(text),
    }
    .try_into()
}

/// The queue's reading of a refused `Put Message`: only a 413
/// (RequestBodyTooLarge) judges the message, for sure; a pack so refused
/// is sent again one event a message, and an event refused alone is
/// refused for its content. Everything else is the destination's state or
/// the request's, never the message's (a 400 also answers an unsupported
/// version or a malformed SAS, which would refuse every row at once;
/// rights, a missing queue, throttling, server errors): the rows wait.
pub fn refusal(status: Option<u16>, message: String) -> Refusal {
    match status {
        Some(413) => Refusal::Events {
            message,
            certain: true,
        },
        _ => Refusal::Request(message),
    }
}

/// A service SAS for `queue` with `permissions` (the dispatcher asks for
/// `a`, add, only), valid until `expiry`, signed with the account key (the string to sign of a queue
/// service SAS, versions 2015-04-05 and later: permissions, start, expiry,
/// the canonical resource `/queue/<account>/<queue>`, identifier, IP,
/// protocol, version). Answers the query, without `?`.
pub fn queue_sas(
    account: &str,
    queue: &str,
    key: &str,
    permissions: &str,
    expiry: SystemTime,
) -> Result<String, String> {
    let key = base64::engine::general_purpose::STANDARD
        .decode(key)
        .map_err(|_| "AccountKey is not base64".to_string())?;
    let expiry = time::OffsetDateTime::from(expiry)
        .replace_nanosecond(0)
        .map_err(|e| e.to_string())?
        .format(&time::format_description::well_known::Rfc3339)
        .map_err(|e| e.to_string())?;
    let to_sign =
        format!("{permissions}\n\n{expiry}\n/queue/{account}/{queue}\n\n\n\n{SAS_VERSION}");
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).map_err(|e| e.to_string())?;
    mac.update(to_sign.as_bytes());
    let signature = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    // Unreserved characters (RFC 3986) stay as they are.
    const VALUE: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    let enc = |v: &str| percent_encoding::utf8_percent_encode(v, VALUE).to_string();
    Ok(format!(
        "sv={SAS_VERSION}&se={}&sp={permissions}&sig={}",
        enc(&expiry),
        enc(&signature)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_oversized_message_is_judged_by_its_content() {
        let judged = |status| matches!(refusal(status, "m".into()), Refusal::Events { .. });
        assert_eq!(
            refusal(Some(413), "m".into()),
            Refusal::Events {
                message: "m".into(),
                certain: true
            }
        );
        for code in [400, 401, 403, 404, 408, 429, 500, 503] {
            assert!(!judged(Some(code)), "{code}");
        }
        assert!(!judged(None), "not reached: the destination's state");
    }

    #[test]
    fn a_message_never_expires_unless_a_ttl_is_set() {
        assert_eq!(messagettl(None), -1);
        assert_eq!(messagettl(Some(Duration::from_secs(86_400))), 86_400);
        assert_eq!(
            messagettl(Some(Duration::from_millis(10))),
            1,
            "at least a second"
        );
        assert_eq!(messagettl(Some(Duration::from_secs(u64::MAX))), i32::MAX);
    }

    /// The signature over the documented string to sign, computed here with
    /// Python's `hmac` (`hmac.new(b64decode(key), s, sha256)`), so a change
    /// of a field or of its order shows.
    #[test]
    fn the_sas_signs_the_queue_service_string() {
        let expiry = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let sas = queue_sas(
            "devstoreaccount1",
            "order-executed",
            crate::storage::EMULATOR_KEY,
            "a",
            expiry,
        )
        .unwrap();
        assert_eq!(sas, PINNED_SAS);
        assert!(queue_sas("a", "q", "not base64!", "a", expiry).is_err());
    }

    fn body_bytes(content: RequestContent<QueueMessage, XmlFormat>) -> Vec<u8> {
        match azure_core::http::Body::from(content) {
            azure_core::http::Body::Bytes(b) => b.to_vec(),
            #[allow(unreachable_patterns)]
            _ => panic!("a message body is bytes"),
        }
    }

    /// A base64 message carries the JSON's base64 as its text, whatever
    /// the JSON holds (markup, quotes, non-ASCII); JSON sent as it is
    /// comes out escaped.
    #[test]
    fn a_message_carries_the_json_as_its_encoding_says() {
        for json in [
            r#"[{"id":"m-1","data":{"symbol":"<A&B>"}}]"#,
            r#"[{"quote":"\"", "é":"ü"}]"#,
            "[]",
        ] {
            let body = String::from_utf8(body_bytes(
                message_body(json.into(), Encoding::Base64).unwrap(),
            ))
            .unwrap();
            let text = body
                .split_once("<MessageText>")
                .and_then(|(_, rest)| rest.split_once("</MessageText>"))
                .map(|(text, _)| text)
                .unwrap_or_else(|| panic!("no message text in {body}"));
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(text)
                .unwrap();
            assert_eq!(String::from_utf8(decoded).unwrap(), json);
        }
        let plain = body_bytes(message_body(r#"[{"s":"<A&B>"}]"#.into(), Encoding::None).unwrap());
        let plain = String::from_utf8(plain).unwrap();
        assert!(plain.contains("&lt;A&amp;B&gt;"), "{plain}");
    }

    const PINNED_SAS: &str = "sv=2021-08-06&se=2027-01-15T08%3A00%3A00Z&sp=a&sig=jD4yf5r%2B4RJgQ8U8olN3gfNnn1dyFDwpjRfwrjl4aLM%3D";
}
