//! Managed-identity access tokens for Azure SQL (`Authentication=Active
//! Directory Managed Identity`).
//!
//! Why: on App Service / Functions a managed identity replaces the password.
//! The platform sets `IDENTITY_ENDPOINT` and `IDENTITY_HEADER`; a GET on
//! `{endpoint}?resource=https://database.windows.net/&api-version=2019-08-01`
//! with header `X-IDENTITY-HEADER` answers `{"access_token": …, "expires_on":
//! epoch seconds (number or string)}`. Tokens are only checked at login, so
//! pooled connections outlive them; new logins need a fresh one. The token is
//! cached and refreshed a margin before it expires, one refresh at a time;
//! if a refresh fails while the cached token is still valid, that one is used.
//! Neither the header secret nor the token is ever logged or shown in errors.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hyper::client::HttpConnector;
use hyper::{Body, Client, Request, Uri};
use serde_json::Value;
use tokio::sync::Mutex;

/// The Azure SQL resource a token is requested for.
pub const SQL_RESOURCE: &str = "https://database.windows.net/";
/// The App Service identity endpoint's API version.
pub const API_VERSION: &str = "2019-08-01";
/// Default: refresh this long before a token expires (tokens live hours).
pub const DEFAULT_REFRESH_MARGIN: Duration = Duration::from_secs(300);

/// A token could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("managed identity token: {0}")]
pub struct TokenError(pub String);

struct Cached {
    token: String,
    expires_at: SystemTime,
}

/// A cached source of access tokens from the App Service identity endpoint.
pub struct ManagedIdentity {
    endpoint: String,
    header: String,
    client_id: Option<String>,
    request_timeout: Duration,
    refresh_margin: Duration,
    client: Client<HttpConnector, Body>,
    cached: Mutex<Option<Cached>>,
}

impl fmt::Debug for ManagedIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManagedIdentity")
            .field("endpoint", &self.endpoint)
            .field("header", &"<hidden>")
            .field("client_id", &self.client_id)
            .finish()
    }
}

impl ManagedIdentity {
    /// From `IDENTITY_ENDPOINT` and `IDENTITY_HEADER`, which the platform sets
    /// when a managed identity is enabled. `client_id` selects a user-assigned
    /// identity (the connection string's `User ID`).
    pub fn from_env(
        client_id: Option<String>,
        request_timeout: Duration,
    ) -> Result<ManagedIdentity, TokenError> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        match (var("IDENTITY_ENDPOINT"), var("IDENTITY_HEADER")) {
            (Some(endpoint), Some(header)) => {
                ManagedIdentity::new(&endpoint, &header, client_id, request_timeout)
            }
            _ => Err(TokenError(
                "Authentication=Active Directory Managed Identity needs IDENTITY_ENDPOINT and \
                 IDENTITY_HEADER, which App Service / Functions set when a managed identity is \
                 enabled on the app"
                    .into(),
            )),
        }
    }

    /// A source for an explicit endpoint (`http://…`; the platform endpoint
    /// is local plain HTTP) and header secret.
    pub fn new(
        endpoint: &str,
        header: &str,
        client_id: Option<String>,
        request_timeout: Duration,
    ) -> Result<ManagedIdentity, TokenError> {
        let endpoint = endpoint.trim().to_string();
        match endpoint.parse::<Uri>() {
            Ok(u) if u.scheme_str() == Some("http") && u.host().is_some() => {}
            _ => return Err(TokenError(
                "IDENTITY_ENDPOINT must be an http:// URL (the platform's local identity endpoint)"
                    .into(),
            )),
        }
        Ok(ManagedIdentity {
            endpoint,
            header: header.trim().to_string(),
            client_id,
            request_timeout,
            refresh_margin: DEFAULT_REFRESH_MARGIN,
            client: Client::new(),
            cached: Mutex::new(None),
        })
    }

    /// Refresh this long before expiry instead of [`DEFAULT_REFRESH_MARGIN`].
    pub fn with_refresh_margin(mut self, margin: Duration) -> ManagedIdentity {
        self.refresh_margin = margin;
        self
    }

    /// A token valid for at least the refresh margin, from the cache when
    /// possible.
    pub async fn token(&self) -> Result<String, TokenError> {
        let mut cached = self.cached.lock().await;
        let now = SystemTime::now();
        if let Some(c) = cached.as_ref() {
            if c.expires_at > now + self.refresh_margin {
                return Ok(c.token.clone());
            }
        }
        match self.fetch().await {
            Ok(fresh) => {
                let token = fresh.token.clone();
                *cached = Some(fresh);
                Ok(token)
            }
            Err(e) => match cached.as_ref() {
                Some(c) if c.expires_at > now + Duration::from_secs(5) => {
                    log::warn!("{e}; using the cached token until it expires");
                    Ok(c.token.clone())
                }
                _ => Err(e),
            },
        }
    }

    fn url(&self) -> String {
        let enc = |s: &str| {
            percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
        };
        let sep = if self.endpoint.contains('?') {
            '&'
        } else {
            '?'
        };
        let mut url = format!(
            "{}{sep}resource={}&api-version={API_VERSION}",
            self.endpoint,
            enc(SQL_RESOURCE)
        );
        if let Some(id) = &self.client_id {
            url.push_str(&format!("&client_id={}", enc(id)));
        }
        url
    }

    async fn fetch(&self) -> Result<Cached, TokenError> {
        let req = Request::get(self.url())
            .header("X-IDENTITY-HEADER", &self.header)
            .header("Accept", "application/json")
            .body(Body::empty())
            .map_err(|_| TokenError("cannot build the identity endpoint request".into()))?;
        let exchange = async {
            let resp = self.client.request(req).await?;
            let status = resp.status();
            let body = hyper::body::to_bytes(resp.into_body()).await?;
            Ok::<_, hyper::Error>((status, body))
        };
        let (status, body) = tokio::time::timeout(self.request_timeout, exchange)
            .await
            .map_err(|_| {
                TokenError(format!(
                    "the identity endpoint did not answer within {} ms",
                    self.request_timeout.as_millis()
                ))
            })?
            .map_err(|e| TokenError(format!("cannot reach the identity endpoint: {e}")))?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            let shown: String = text.chars().take(300).collect();
            return Err(TokenError(format!(
                "the identity endpoint answered {status}: {shown}"
            )));
        }
        parse_token_response(&body, SystemTime::now())
    }
}

/// Read `access_token` and the expiry (`expires_on` epoch seconds as number
/// or string; else `expires_in` seconds from `now`).
fn parse_token_response(body: &[u8], now: SystemTime) -> Result<Cached, TokenError> {
    let v: Value = serde_json::from_slice(body).map_err(|_| {
        TokenError("the identity endpoint answered with something that is not JSON".into())
    })?;
    let token = v
        .get("access_token")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| TokenError("the identity endpoint's answer has no access_token".into()))?
        .to_string();
    let seconds = |key: &str| -> Option<u64> {
        match v.get(key)? {
            Value::String(s) => s.trim().parse().ok(),
            n @ Value::Number(_) => n.as_u64(),
            _ => None,
        }
    };
    let expires_at = match (seconds("expires_on"), seconds("expires_in")) {
        (Some(on), _) => UNIX_EPOCH + Duration::from_secs(on),
        (None, Some(inn)) => now + Duration::from_secs(inn),
        (None, None) => {
            return Err(TokenError(
                "the identity endpoint's answer has neither expires_on nor expires_in".into(),
            ))
        }
    };
    Ok(Cached { token, expires_at })
}
