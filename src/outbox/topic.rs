//! The outbox's other destination: an Event Grid custom topic, through its
//! documented publish API (`POST <endpoint>?api-version=2018-01-01`, a JSON
//! array of events, at most 1 MB a request; `aeg-sas-key: <key>` or
//! `Authorization: Bearer <Entra ID token>` with the role EventGrid Data
//! Sender; 200 accepted, 400 malformed, 401/403 not allowed, 404 no such
//! topic, 413 too large). Contract-tested against a local endpoint that
//! enforces that contract (`tests/common/event_grid.rs`), not emulated.
//!
//! A round's events go in as few requests as fit in 1 MB (the
//! destination's packs); a request's answer is each of its events' answer.
//! Event Grid promises no order of delivery either.

use std::time::Duration;

use super::envelope::Form;
use super::pack::{pack, Refusal};
use crate::storage::Secret;

/// The API version of the publish call.
pub const API_VERSION: &str = "2018-01-01";
/// Event Grid's limit on one publish request (and one event).
pub const MAX_REQUEST_BYTES: usize = 1024 * 1024;
/// Entra ID scope of Event Grid's data plane.
const EVENT_GRID_SCOPE: &str = "https://eventgrid.azure.net/.default";

/// The topic's input schema (what it was created with).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schema {
    /// `--input-schema eventgridschema` (the default of `az eventgrid topic create`).
    EventGrid,
    /// `--input-schema cloudeventschemav1_0`.
    CloudEvents,
}

impl Schema {
    fn content_type(self) -> &'static str {
        match self {
            Schema::EventGrid => "application/json",
            Schema::CloudEvents => "application/cloudevents-batch+json; charset=utf-8",
        }
    }
}

/// How the dispatcher signs in to the topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicAuth {
    /// The topic's access key (`aeg-sas-key`).
    Key(Secret),
    /// The app's identity (role EventGrid Data Sender on the topic):
    /// `client_id` names a user-assigned one (`AZURE_CLIENT_ID`).
    EntraId { client_id: Option<String> },
}

/// An Event Grid custom topic (built by `config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSettings {
    /// `https://<topic>.<region>-1.eventgrid.azure.net/api/events`.
    pub endpoint: String,
    pub auth: TopicAuth,
    pub schema: Schema,
}

pub struct TopicDestination {
    settings: TopicSettings,
    client: reqwest::Client,
    entra: Option<crate::entra::ChainCredential>,
}

impl TopicDestination {
    pub fn new(settings: TopicSettings) -> Result<TopicDestination, String> {
        crate::tls::install_crypto_provider();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("cannot make the HTTP client: {e}"))?;
        let entra = match &settings.auth {
            TopicAuth::EntraId { client_id } => Some(crate::entra::default_chain_credential(
                client_id.clone(),
                Duration::from_secs(10),
            )),
            TopicAuth::Key(_) => None,
        };
        Ok(TopicDestination {
            settings,
            client,
            entra,
        })
    }

    /// The form of its events: the topic's input schema's.
    pub fn form(&self) -> Form {
        match self.settings.schema {
            Schema::EventGrid => Form::EventGrid,
            Schema::CloudEvents => Form::CloudEvent,
        }
    }

    /// The most bytes one request carries.
    pub fn pack_limit(&self) -> usize {
        MAX_REQUEST_BYTES
    }

    pub fn describe(&self) -> String {
        format!(
            "Event Grid topic {} ({} schema, {})",
            self.settings.endpoint,
            match self.settings.schema {
                Schema::EventGrid => "Event Grid",
                Schema::CloudEvents => "CloudEvents",
            },
            match self.settings.auth {
                TopicAuth::Key(_) => "access key",
                TopicAuth::EntraId { .. } => "Entra ID",
            }
        )
    }

    /// Publish one pack of events (each a JSON event of the topic's
    /// schema) in one request.
    pub async fn post(&self, events: &[String]) -> Result<(), Refusal> {
        let body = pack(events);
        let mut request = self
            .client
            .post(format!(
                "{}?api-version={API_VERSION}",
                self.settings.endpoint
            ))
            .header("content-type", self.settings.schema.content_type())
            .body(body);
        request = match (&self.settings.auth, &self.entra) {
            (TopicAuth::Key(key), _) => request.header("aeg-sas-key", key.expose()),
            (TopicAuth::EntraId { .. }, Some(chain)) => {
                use azure_core::credentials::TokenCredential;
                let token = chain
                    .get_token(&[EVENT_GRID_SCOPE], None)
                    .await
                    .map_err(|e| Refusal::Request(format!("no Entra ID token for Event Grid ({e}); on Azure give the app's identity the EventGrid Data Sender role on the topic; locally run `az login`")))?;
                request.bearer_auth(token.token.secret())
            }
            (TopicAuth::EntraId { .. }, None) => unreachable!("made with the credential"),
        };
        let response = request
            .send()
            .await
            .map_err(|e| Refusal::Request(format!("the topic could not be reached: {e}")))?;
        let status = response.status().as_u16();
        if response.status().is_success() {
            return Ok(());
        }
        let body = head(response, ERROR_DETAIL_BYTES).await;
        let detail = crate::text::escaped(&body);
        let message = match status {
            401 | 403 => format!("the topic refused the credential ({status}): check OUTBOX_TOPIC_KEY, or the app's EventGrid Data Sender role; {detail}"),
            404 => format!("no topic at OUTBOX_TOPIC_ENDPOINT (404): {detail}"),
            400 => format!("the topic answered 400: {detail}; if every event is refused so, check OUTBOX_TOPIC_SCHEMA against the topic's input schema"),
            _ => format!("the topic answered {status}: {detail}"),
        };
        Err(refusal(status, message))
    }
}

/// The most of an error's body kept in the row's error (and read at all).
const ERROR_DETAIL_BYTES: usize = 300;

/// The first `at_most` bytes of `response`'s body (cut at a character's
/// boundary), reading no more of it than that: an error page can be large.
async fn head(mut response: reqwest::Response, at_most: usize) -> String {
    let mut bytes = Vec::new();
    while bytes.len() < at_most {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            _ => break,
        }
    }
    bytes.truncate(at_most);
    match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            let valid = e.utf8_error().valid_up_to();
            let mut bytes = e.into_bytes();
            bytes.truncate(valid);
            String::from_utf8(bytes).unwrap_or_default()
        }
    }
}

/// The topic's reading of a refused publish request: a 413 judges its
/// events for sure (too large); a 400 judges them too, but is also the
/// answer to a request the topic cannot read at all (a content type, an
/// input schema it was not created with), so an event refused alone with
/// it is its own fault only when another event of the round went
/// (`destination.rs`). 401, 403, 404, 5xx: the request's or the topic's
/// state; the rows wait.
pub fn refusal(status: u16, message: String) -> Refusal {
    match status {
        413 => Refusal::Events {
            message,
            certain: true,
        },
        400 => Refusal::Events {
            message,
            certain: false,
        },
        _ => Refusal::Request(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topic_judges_events_by_413_for_sure_and_by_400_in_doubt() {
        assert_eq!(
            refusal(413, "m".into()),
            Refusal::Events {
                message: "m".into(),
                certain: true
            }
        );
        assert_eq!(
            refusal(400, "m".into()),
            Refusal::Events {
                message: "m".into(),
                certain: false
            }
        );
        for code in [401, 403, 404, 408, 429, 500, 503] {
            assert_eq!(refusal(code, "m".into()), Refusal::Request("m".into()));
        }
    }
}
