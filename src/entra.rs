//! Entra ID access tokens, for Azure SQL (the store) and Azure Redis (the
//! guard), from Microsoft's `azure_identity` credentials.
//!
//! Why the official crate: the settings then mean what they mean in
//! Microsoft's drivers (Microsoft.Data.SqlClient, ODBC, JDBC) — managed
//! identity on App Service / Functions and VMs, workload identity on AKS,
//! the developer's `az login` locally — and the request shapes, retries and
//! platform quirks are Microsoft's to keep right.
//!
//! A [`TokenSource`] asks for one scope: [`SQL_SCOPE`]
//! (`https://database.windows.net/.default`) for the store, [`REDIS_SCOPE`]
//! (`https://redis.azure.com/.default`) for the guard; the managed-identity
//! endpoints are asked for the scope's resource. Which credential: for SQL,
//! the connection string's `Authentication` keyword; for Redis,
//! `REDIS_AUTH=entra-id` takes the `Active Directory Default` chain below.
//!
//! **`Active Directory Managed Identity`** (alias `Active Directory MSI`):
//! `ManagedIdentityCredential`. The crate picks the endpoint from the
//! environment when the store is built: `IDENTITY_ENDPOINT` +
//! `IDENTITY_HEADER` (App Service, Functions, Container Apps) or, without
//! them, the Instance Metadata Service (VMs, scale sets, AKS node identity).
//! `User ID` is the client id of a user-assigned identity; without it, the
//! system-assigned identity is used. Deviation: `IDENTITY_ENDPOINT` without
//! `IDENTITY_HEADER` is refused at start (the crate would quietly fall back
//! to the Instance Metadata Service; here that is a misconfiguration).
//!
//! **`Active Directory Default`**: the 1.0 crate has no
//! `DefaultAzureCredential`, so [`ChainCredential`] builds one, tried in this
//! order, the first that gives a token winning:
//! 1. `WorkloadIdentityCredential`, when `AZURE_FEDERATED_TOKEN_FILE` is set
//!    (AKS workload identity; `AZURE_TENANT_ID`, `AZURE_CLIENT_ID` or `User ID`
//!    for the client id);
//! 2. `ManagedIdentityCredential` through `IDENTITY_ENDPOINT`, when it is set
//!    (App Service / Functions), with `User ID` as a user-assigned client id;
//! 3. `DeveloperToolsCredential`: the Azure CLI (`az login`), then the Azure
//!    Developer CLI (`azd auth login`);
//! 4. `ManagedIdentityCredential` through the Instance Metadata Service, when
//!    `IDENTITY_ENDPOINT` is not set.
//!
//! Deviations from .NET's `DefaultAzureCredential` (which SqlClient uses):
//! no `EnvironmentCredential` (client secret / certificate in `AZURE_*`
//! variables), no Visual Studio / VS Code / PowerShell / shared-cache
//! credentials, and the Instance Metadata Service is asked last, after the
//! developer tools, so a developer's machine is not held up probing it
//! (each link is bounded by the connect timeout). Any failure moves
//! on to the next link (.NET stops at a credential that is present but
//! fails). As in .NET, once a link has given a token it is the only one used
//! from then on.
//!
//! Caching: [`TokenSource`] keeps the last token and asks the credential
//! again only when it is within [`REFRESH_MARGIN`] of expiry (the
//! managed-identity and workload-identity credentials cache as well, with the
//! same margin, but the az/azd credentials run the tool on every call), one
//! request at a time; if a refresh fails while the kept token is still valid,
//! that one is used. Tokens are only checked at login, so pooled connections
//! outlive them; each new login takes the current token.
//!
//! Neither a token nor the `IDENTITY_HEADER` secret is ever logged or shown:
//! `Debug` shows neither, and error messages are the credentials' own
//! (which carry neither) with the header value scrubbed all the same, plus
//! what to fix.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use azure_core::credentials::{AccessToken, TokenCredential, TokenRequestOptions};
use azure_core::time::OffsetDateTime;
use azure_identity::{
    DeveloperToolsCredential, ManagedIdentityCredential, ManagedIdentityCredentialOptions,
    UserAssignedId, WorkloadIdentityCredential, WorkloadIdentityCredentialOptions,
};
use tokio::sync::Mutex;

/// The scope of an Azure SQL access token.
pub const SQL_SCOPE: &str = "https://database.windows.net/.default";
/// The scope of an Azure Cache for Redis / Azure Managed Redis token.
pub const REDIS_SCOPE: &str = "https://redis.azure.com/.default";
/// A kept token is replaced this long before it expires (the crate's own
/// caches use the same margin).
pub const REFRESH_MARGIN: Duration = Duration::from_secs(300);

/// What to do for local development, appended to the errors where it helps.
const LOCAL_HINT: &str = "for local development use Authentication=Active Directory Default \
     and sign in with `az login` (or `azd auth login`)";

/// A token could not be had. The message names the credential and what to
/// fix; it never holds a token or the identity header secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Entra ID token: {0}")]
pub struct TokenError(pub String);

fn env_set(key: &str) -> bool {
    std::env::var_os(key).is_some()
}

/// One line, without the `IDENTITY_HEADER` value (it is not expected in any
/// message of the crate; this makes sure).
fn clean(message: &str) -> String {
    let mut text = message.split_whitespace().collect::<Vec<_>>().join(" ");
    if let Ok(secret) = std::env::var("IDENTITY_HEADER") {
        let secret = secret.trim();
        if secret.len() >= 4 {
            text = text.replace(secret, "<IDENTITY_HEADER hidden>");
        }
    }
    text
}

/// A credential's error for a message: its text (which, for an HTTP
/// answer, has no status of its own) with the status of the first HTTP
/// answer in its chain, cleaned by [`clean`].
fn describe(e: &azure_core::Error) -> String {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut status = None;
    while let Some(err) = current {
        if let Some(azure) = err.downcast_ref::<azure_core::Error>() {
            if let azure_core::error::ErrorKind::HttpResponse { status: s, .. } = azure.kind() {
                status = Some(*s);
                break;
            }
        }
        current = err.source();
    }
    match status {
        Some(status) => format!("HTTP {status}: {}", clean(&e.to_string())),
        None => clean(&e.to_string()),
    }
}

fn core_error(message: String) -> azure_core::Error {
    azure_core::Error::with_message(azure_core::error::ErrorKind::Credential, message)
}

// ------------------------------------------------------------------ chain

/// One link of a [`ChainCredential`]: a credential, or why it is not there.
pub struct ChainLink {
    name: String,
    credential: Result<Arc<dyn TokenCredential>, String>,
}

impl ChainLink {
    /// A credential to try, under a name shown in messages.
    pub fn new(name: impl Into<String>, credential: Arc<dyn TokenCredential>) -> ChainLink {
        ChainLink {
            name: name.into(),
            credential: Ok(credential),
        }
    }

    /// A credential that is not tried, and why (shown when the chain fails).
    pub fn unavailable(name: impl Into<String>, reason: impl Into<String>) -> ChainLink {
        ChainLink {
            name: name.into(),
            credential: Err(reason.into()),
        }
    }
}

/// Tries its links in order; the first that gives a token wins and is the
/// only one used from then on. When none does, the error lists every link
/// with its reason.
pub struct ChainCredential {
    links: Vec<ChainLink>,
    link_timeout: Duration,
    chosen: AtomicUsize,
}

const NONE_CHOSEN: usize = usize::MAX;

impl fmt::Debug for ChainCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChainCredential")
            .field(
                "links",
                &self
                    .links
                    .iter()
                    .map(|l| l.name.as_str())
                    .collect::<Vec<_>>(),
            )
            .field("chosen", &self.chosen())
            .finish()
    }
}

impl ChainCredential {
    /// A chain of `links`, each given at most `link_timeout` per request.
    pub fn new(links: Vec<ChainLink>, link_timeout: Duration) -> ChainCredential {
        ChainCredential {
            links,
            link_timeout,
            chosen: AtomicUsize::new(NONE_CHOSEN),
        }
    }

    /// The name of the link that gave the first token, once one has.
    pub fn chosen(&self) -> Option<&str> {
        self.links
            .get(self.chosen.load(Ordering::Acquire))
            .map(|l| l.name.as_str())
    }

    /// The names of the links that are tried (not those unavailable), in order.
    pub fn tried_names(&self) -> Vec<&str> {
        self.links
            .iter()
            .filter(|l| l.credential.is_ok())
            .map(|l| l.name.as_str())
            .collect()
    }

    async fn ask(
        &self,
        credential: &Arc<dyn TokenCredential>,
        scopes: &[&str],
        options: Option<TokenRequestOptions<'_>>,
    ) -> Result<AccessToken, String> {
        match tokio::time::timeout(self.link_timeout, credential.get_token(scopes, options)).await {
            Ok(Ok(token)) => Ok(token),
            Ok(Err(e)) => Err(describe(&e)),
            Err(_) => Err(format!(
                "no answer within {} ms",
                self.link_timeout.as_millis()
            )),
        }
    }
}

#[async_trait::async_trait]
impl TokenCredential for ChainCredential {
    async fn get_token(
        &self,
        scopes: &[&str],
        options: Option<TokenRequestOptions<'_>>,
    ) -> azure_core::Result<AccessToken> {
        let chosen = self.chosen.load(Ordering::Acquire);
        if let Some(ChainLink {
            name,
            credential: Ok(credential),
        }) = self.links.get(chosen)
        {
            return self
                .ask(credential, scopes, options)
                .await
                .map_err(|e| core_error(format!("{name}: {e}")));
        }
        let mut reasons = Vec::new();
        for (index, link) in self.links.iter().enumerate() {
            match &link.credential {
                Err(reason) => reasons.push(format!("{}: {reason}", link.name)),
                Ok(credential) => match self.ask(credential, scopes, options.clone()).await {
                    Ok(token) => {
                        self.chosen.store(index, Ordering::Release);
                        log::info!(
                            "Entra ID: {} gave the token; it is the one used from now on",
                            link.name
                        );
                        return Ok(token);
                    }
                    Err(e) => reasons.push(format!("{}: {e}", link.name)),
                },
            }
        }
        Err(core_error(format!(
            "no credential of the chain gave a token ({})",
            reasons.join("; ")
        )))
    }
}

// ------------------------------------------------------------ the source

/// The tokens of one scope: a credential, the last token kept until
/// [`REFRESH_MARGIN`] before it expires, and what to fix on failure.
pub struct TokenSource {
    credential: Arc<dyn TokenCredential>,
    scope: &'static str,
    description: String,
    hint: String,
    timeout: Duration,
    cached: Mutex<Option<AccessToken>>,
}

impl fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenSource")
            .field("credential", &self.description)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl TokenSource {
    /// Tokens of `scope` from any credential (tests use this with their
    /// own). Each request is bounded by `timeout`; `hint` is appended to its
    /// errors.
    pub fn new(
        credential: Arc<dyn TokenCredential>,
        scope: &'static str,
        description: impl Into<String>,
        hint: impl Into<String>,
        timeout: Duration,
    ) -> TokenSource {
        TokenSource {
            credential,
            scope,
            description: description.into(),
            hint: hint.into(),
            timeout,
            cached: Mutex::new(None),
        }
    }

    /// A managed identity's tokens (SQL's `Authentication=Active Directory
    /// Managed Identity`): `client_id` names a user-assigned one.
    pub fn managed_identity(
        client_id: Option<String>,
        scope: &'static str,
        timeout: Duration,
    ) -> Result<TokenSource, TokenError> {
        check_identity_env()?;
        let credential = managed_identity_credential(client_id.clone())
            .map_err(|e| TokenError(format!("ManagedIdentityCredential: {}", clean(&e))))?;
        let who = match &client_id {
            Some(id) => format!("user-assigned identity {id}"),
            None => "the system-assigned identity".to_string(),
        };
        let (description, hint) = if env_set("IDENTITY_ENDPOINT") {
            (
                format!("managed identity ({who}) through the App Service / Functions identity endpoint (IDENTITY_ENDPOINT)"),
                format!("check that {who} is enabled on (assigned to) the app; {LOCAL_HINT}"),
            )
        } else {
            (
                format!("managed identity ({who}) through the Azure Instance Metadata Service"),
                format!(
                    "IDENTITY_ENDPOINT and IDENTITY_HEADER are not set, so the Instance Metadata \
                     Service was asked: on App Service / Functions enable a managed identity on the \
                     app (the platform then sets both); on a VM or AKS node assign {who} to it; \
                     {LOCAL_HINT}"
                ),
            )
        };
        Ok(TokenSource::new(
            credential,
            scope,
            description,
            hint,
            timeout,
        ))
    }

    /// The `Active Directory Default` chain described in the module
    /// documentation, built from the environment as it is now.
    pub fn default_chain(
        client_id: Option<String>,
        scope: &'static str,
        timeout: Duration,
    ) -> Result<TokenSource, TokenError> {
        check_identity_env()?;
        let chain = default_chain_credential(client_id, timeout);
        let tried = chain.tried_names();
        let size = tried.len().max(1) as u32;
        let description = format!("Active Directory Default (tries {})", tried.join(", then "));
        Ok(TokenSource::new(
            Arc::new(chain),
            scope,
            description,
            "on Azure enable a managed identity for the app (workload identity on AKS); \
             locally sign in with `az login` (or `azd auth login`)",
            timeout.saturating_mul(size),
        ))
    }

    /// What the tokens come from, for logs (no secrets).
    pub fn description(&self) -> &str {
        &self.description
    }

    /// A token valid for at least [`REFRESH_MARGIN`], the kept one when
    /// possible.
    pub async fn token(&self) -> Result<String, TokenError> {
        self.token_until().await.map(|(token, _)| token)
    }

    /// [`TokenSource::token`] and when it expires.
    pub async fn token_until(&self) -> Result<(String, OffsetDateTime), TokenError> {
        let mut cached = self.cached.lock().await;
        let now = OffsetDateTime::now_utc();
        if let Some(t) = cached.as_ref() {
            if t.expires_on > now + REFRESH_MARGIN {
                return Ok((t.token.secret().to_string(), t.expires_on));
            }
        }
        match self.fetch().await {
            Ok(fresh) => {
                let kept = (fresh.token.secret().to_string(), fresh.expires_on);
                *cached = Some(fresh);
                Ok(kept)
            }
            Err(e) => match cached.as_ref() {
                Some(t) if t.expires_on > now + Duration::from_secs(5) => {
                    log::warn!("{e}; using the kept token until it expires");
                    Ok((t.token.secret().to_string(), t.expires_on))
                }
                _ => Err(e),
            },
        }
    }

    async fn fetch(&self) -> Result<AccessToken, TokenError> {
        let scopes = [self.scope];
        let asked = self.credential.get_token(&scopes, None);
        let failed = |what: String| {
            TokenError(format!(
                "{} failed: {what}; {}",
                self.description, self.hint
            ))
        };
        match tokio::time::timeout(self.timeout, asked).await {
            Ok(Ok(token)) if !token.token.secret().is_empty() => Ok(token),
            Ok(Ok(_)) => Err(failed("the credential gave an empty token".into())),
            Ok(Err(e)) => Err(failed(describe(&e))),
            Err(_) => Err(failed(format!(
                "no token within {} ms (the connect timeout)",
                self.timeout.as_millis()
            ))),
        }
    }
}

/// `IDENTITY_ENDPOINT` without `IDENTITY_HEADER` is a misconfiguration here
/// (the crate would use the Instance Metadata Service instead).
fn check_identity_env() -> Result<(), TokenError> {
    if env_set("IDENTITY_ENDPOINT") && !env_set("IDENTITY_HEADER") {
        return Err(TokenError(
            "IDENTITY_ENDPOINT is set but IDENTITY_HEADER is not; App Service / Functions set \
             both when a managed identity is enabled on the app: set both or neither"
                .into(),
        ));
    }
    Ok(())
}

fn managed_identity_credential(
    client_id: Option<String>,
) -> Result<Arc<dyn TokenCredential>, String> {
    crate::tls::install_crypto_provider();
    let options = ManagedIdentityCredentialOptions {
        user_assigned_id: client_id.map(UserAssignedId::ClientId),
        ..Default::default()
    };
    match ManagedIdentityCredential::new(Some(options)) {
        Ok(c) => Ok(c),
        Err(e) => Err(e.to_string()),
    }
}

/// The user-assigned identity to sign in with when the caller names none:
/// `AZURE_CLIENT_ID`, as Microsoft's own `DefaultAzureCredential` reads it.
/// An app whose only identity is user-assigned (the azd template's) has no
/// system-assigned one for the managed-identity endpoint to answer for, so
/// the storage clients and the topic's sign-in need it named.
fn client_id_from_env() -> Option<String> {
    std::env::var("AZURE_CLIENT_ID")
        .ok()
        .filter(|v| !v.is_empty())
}

/// The `Active Directory Default` chain for the environment as it is now;
/// `client_id` (else `AZURE_CLIENT_ID`) names a user-assigned identity.
pub fn default_chain_credential(client_id: Option<String>, timeout: Duration) -> ChainCredential {
    crate::tls::install_crypto_provider();
    let client_id = client_id.or_else(client_id_from_env);
    let mut links = Vec::new();
    const WORKLOAD: &str = "WorkloadIdentityCredential";
    if env_set("AZURE_FEDERATED_TOKEN_FILE") {
        let options = WorkloadIdentityCredentialOptions {
            client_id: client_id.clone(),
            ..Default::default()
        };
        links.push(match WorkloadIdentityCredential::new(Some(options)) {
            Ok(c) => ChainLink::new(WORKLOAD, c),
            Err(e) => ChainLink::unavailable(
                WORKLOAD,
                format!(
                    "{} (AZURE_FEDERATED_TOKEN_FILE is set; AZURE_TENANT_ID and AZURE_CLIENT_ID \
                     or User ID are needed too)",
                    clean(&e.to_string())
                ),
            ),
        });
    } else {
        links.push(ChainLink::unavailable(
            WORKLOAD,
            "not tried: AZURE_FEDERATED_TOKEN_FILE is not set (no AKS workload identity)",
        ));
    }
    const APP_SERVICE: &str = "ManagedIdentityCredential (App Service / Functions)";
    let app_service = env_set("IDENTITY_ENDPOINT");
    if app_service {
        links.push(match managed_identity_credential(client_id.clone()) {
            Ok(c) => ChainLink::new(APP_SERVICE, c),
            Err(e) => ChainLink::unavailable(APP_SERVICE, clean(&e)),
        });
    } else {
        links.push(ChainLink::unavailable(
            APP_SERVICE,
            "not tried: IDENTITY_ENDPOINT is not set (no managed identity enabled on an App Service / Functions app)",
        ));
    }
    const DEVELOPER: &str = "DeveloperToolsCredential (az, azd)";
    links.push(match DeveloperToolsCredential::new(None) {
        Ok(c) => ChainLink::new(DEVELOPER, c),
        Err(e) => ChainLink::unavailable(DEVELOPER, clean(&e.to_string())),
    });
    const IMDS: &str = "ManagedIdentityCredential (Instance Metadata Service)";
    if !app_service {
        links.push(match managed_identity_credential(client_id) {
            Ok(c) => ChainLink::new(IMDS, c),
            Err(e) => ChainLink::unavailable(IMDS, clean(&e)),
        });
    }
    ChainCredential::new(links, timeout)
}
