//! Application Insights' ingestion signed in with Microsoft Entra ID.
//!
//! A resource with local authentication off (the azd template's) refuses
//! telemetry that carries only the connection string's key. Microsoft's
//! ingestion takes a bearer token of the identity's instead, for the scope
//! [`MONITOR_SCOPE`], on `/v2.1/track` only (`/v2/track` answers 400
//! "Authentication not supported"); the identity needs the Monitoring
//! Metrics Publisher role on the resource. The exporter crate posts to
//! `/v2/track` with the key and knows no tokens, so [`SignedIn`] wraps its
//! HTTP client: each upload goes to `/v2.1/track` with `Authorization:
//! Bearer`, the token from [`IngestionTokens`] (the app gives Microsoft's
//! managed identity credential, which keeps a token until shortly before
//! it expires). What the ingestion answers is handed back to the exporter
//! as it is (its retries and its failure counts stay the exporter's); a
//! refusal of the token (401, 403) is logged once with its cause and what
//! to fix, again only after an upload has passed.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};

/// The scope of an Azure Monitor ingestion token (the double slash is
/// Microsoft's: the resource is `https://monitor.azure.com/`).
pub const MONITOR_SCOPE: &str = "https://monitor.azure.com//.default";

/// Where the uploads' tokens come from. The app gives one built on
/// Microsoft's managed identity credential; this module knows no
/// credential.
#[async_trait]
pub trait IngestionTokens: Send + Sync {
    /// A token for [`MONITOR_SCOPE`], valid for a while yet; the error
    /// names the credential and what to fix, never a secret.
    async fn token(&self) -> Result<String, String>;

    /// What the tokens come from, for the logs (no secret).
    fn description(&self) -> String;
}

/// The exporter's HTTP client, signing every upload in with a token.
/// `runtime` runs the token requests: the exporter calls from a thread of
/// its own, outside any runtime, and the credential needs one.
#[derive(Clone)]
pub(super) struct SignedIn<C> {
    inner: C,
    tokens: Arc<dyn IngestionTokens>,
    runtime: tokio::runtime::Handle,
    /// A refusal was logged and no upload has passed since.
    refused: Arc<AtomicBool>,
}

impl<C: fmt::Debug> fmt::Debug for SignedIn<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SignedIn")
            .field("inner", &self.inner)
            .field("tokens", &self.tokens.description())
            .finish_non_exhaustive()
    }
}

impl<C> SignedIn<C> {
    pub(super) fn new(
        inner: C,
        tokens: Arc<dyn IngestionTokens>,
        runtime: tokio::runtime::Handle,
    ) -> SignedIn<C> {
        SignedIn {
            inner,
            tokens,
            runtime,
            refused: Arc::new(AtomicBool::new(false)),
        }
    }
}

#[async_trait]
impl<C: HttpClient> HttpClient for SignedIn<C> {
    async fn send_bytes(&self, mut request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let uri = entra_track_uri(&request.uri().to_string());
        *request.uri_mut() = uri.parse()?;
        let tokens = Arc::clone(&self.tokens);
        let token = self
            .runtime
            .spawn(async move { tokens.token().await })
            .await
            .map_err(|e| format!("the token request did not finish: {e}"))?
            .map_err(|e| format!("no Entra ID token for Application Insights: {e}"))?;
        let mut bearer = http::HeaderValue::try_from(format!("Bearer {token}"))
            .map_err(|_| "the Entra ID token is not a valid header value")?;
        bearer.set_sensitive(true);
        request
            .headers_mut()
            .insert(http::header::AUTHORIZATION, bearer);
        let response = self.inner.send_bytes(request).await?;
        let status = response.status().as_u16();
        if let Some(line) = refusal_line(status, &self.tokens.description()) {
            if !self.refused.swap(true, Ordering::Relaxed) {
                log::warn!("{line}");
            }
        } else if response.status().is_success() {
            self.refused.store(false, Ordering::Relaxed);
        }
        Ok(response)
    }
}

/// The exporter's upload address with Entra ID's path: `…/v2/track`
/// becomes `…/v2.1/track`; any other address is left as it is.
fn entra_track_uri(uri: &str) -> String {
    match uri.strip_suffix("/v2/track") {
        Some(base) => format!("{base}/v2.1/track"),
        None => uri.to_string(),
    }
}

/// What an answer of `status` to a signed-in upload says about the token,
/// when it is a refusal of it.
fn refusal_line(status: u16, tokens: &str) -> Option<String> {
    let cause = match status {
        401 => "did not accept the Entra ID token (401 Unauthorized)",
        403 => "refused the Entra ID token's identity (403 Forbidden)",
        _ => return None,
    };
    Some(format!(
        "telemetry: Application Insights {cause} from {tokens}: the identity needs the \
         Monitoring Metrics Publisher role on the Application Insights resource, and \
         APPLICATIONINSIGHTS_AUTHENTICATION_STRING's ClientId must name that identity; \
         logged once until an upload passes"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uploads_go_to_the_entra_path() {
        assert_eq!(
            entra_track_uri("https://westeurope-5.in.applicationinsights.azure.com/v2/track"),
            "https://westeurope-5.in.applicationinsights.azure.com/v2.1/track"
        );
        assert_eq!(
            entra_track_uri("https://x.example/v2.1/track"),
            "https://x.example/v2.1/track"
        );
        assert_eq!(
            entra_track_uri("https://x.example/QuickPulseService.svc/post"),
            "https://x.example/QuickPulseService.svc/post"
        );
    }

    #[test]
    fn only_401_and_403_are_refusals_of_the_token() {
        let who = "managed identity (user-assigned identity abc)";
        let unauthorized = refusal_line(401, who).expect("401 is a refusal");
        let forbidden = refusal_line(403, who).expect("403 is a refusal");
        for line in [&unauthorized, &forbidden] {
            assert!(line.contains("Monitoring Metrics Publisher"), "{line}");
            assert!(line.contains(who), "{line}");
        }
        assert!(unauthorized.contains("401"), "{unauthorized}");
        assert!(forbidden.contains("403"), "{forbidden}");
        for status in [200, 206, 400, 408, 429, 439, 500, 503] {
            assert_eq!(refusal_line(status, who), None, "{status}");
        }
    }
}
