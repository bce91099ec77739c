//! A loopback endpoint answering as the App Service / Functions identity
//! endpoint does, and the process environment that points Microsoft's
//! credentials at it (shared by the SQL Server and Redis Entra ID tests).
//!
//! The credentials read IDENTITY_ENDPOINT when built and IDENTITY_HEADER on
//! every request, so a test that sets them holds [`IdentityEnv`]
//! throughout. With IDENTITY_ENDPOINT set neither managed identity nor the
//! Default chain uses the Instance Metadata Service.

#![allow(dead_code)]

use std::collections::HashMap;
use std::ffi::OsString;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::json;

pub const HEADER_SECRET: &str = "hdr-secret-0123";

/// Serializes the tests that change the process environment.
static ENV_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The identity variables as App Service sets them, every other managed
/// identity or workload identity variable removed, and loopback exempt from
/// any proxy; all restored on drop.
pub struct IdentityEnv {
    saved: Vec<(&'static str, Option<OsString>)>,
    _lock: tokio::sync::MutexGuard<'static, ()>,
}

impl IdentityEnv {
    pub async fn set(endpoint: Option<&str>, header: Option<&str>) -> IdentityEnv {
        let lock = ENV_LOCK.lock().await;
        let wanted: [(&'static str, Option<&str>); 10] = [
            ("IDENTITY_ENDPOINT", endpoint),
            ("IDENTITY_HEADER", header),
            ("IDENTITY_SERVER_THUMBPRINT", None),
            ("IMDS_ENDPOINT", None),
            ("MSI_ENDPOINT", None),
            ("MSI_SECRET", None),
            ("AZURE_FEDERATED_TOKEN_FILE", None),
            ("AZURE_CLIENT_ID", None),
            ("NO_PROXY", Some("127.0.0.1,localhost")),
            ("no_proxy", Some("127.0.0.1,localhost")),
        ];
        let mut saved = Vec::new();
        for (key, value) in wanted {
            saved.push((key, std::env::var_os(key)));
            match value {
                Some(v) => std::env::set_var(key, v),
                None => std::env::remove_var(key),
            }
        }
        IdentityEnv { saved, _lock: lock }
    }
}

impl Drop for IdentityEnv {
    fn drop(&mut self) {
        for (key, value) in self.saved.drain(..) {
            match value {
                Some(v) => std::env::set_var(key, v),
                None => std::env::remove_var(key),
            }
        }
    }
}

/// One request the identity endpoint answered with a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRequest {
    pub resource: Option<String>,
    pub api_version: Option<String>,
    pub client_id: Option<String>,
}

/// A loopback endpoint answering as the App Service identity endpoint does
/// (GET, `X-IDENTITY-HEADER`, `resource`, `api-version=2019-08-01`, optional
/// `client_id`; `expires_on` as a string of epoch seconds). Tokens are
/// numbered and expire `lifetime` seconds from when they are handed out; a
/// wrong header gets 401 without a token.
pub struct IdentityEndpoint {
    pub url: String,
    pub requests: Arc<Mutex<Vec<TokenRequest>>>,
    pub refused: Arc<AtomicUsize>,
    pub lifetime: Arc<AtomicUsize>,
}

impl IdentityEndpoint {
    pub fn tokens_handed_out(&self) -> usize {
        self.requests.lock().unwrap().len()
    }
}

pub async fn identity_endpoint(lifetime_secs: usize) -> IdentityEndpoint {
    identity_endpoint_minting(lifetime_secs, |n| format!("token-{n}")).await
}

/// [`identity_endpoint`] handing out `mint(n)` as the n-th token.
pub async fn identity_endpoint_minting(
    lifetime_secs: usize,
    mint: fn(usize) -> String,
) -> IdentityEndpoint {
    use warp::Filter;
    let requests = Arc::new(Mutex::new(Vec::new()));
    let refused = Arc::new(AtomicUsize::new(0));
    let lifetime = Arc::new(AtomicUsize::new(lifetime_secs));
    let (seen, no, l) = (
        Arc::clone(&requests),
        Arc::clone(&refused),
        Arc::clone(&lifetime),
    );
    let route = warp::get()
        .and(warp::path!("msi" / "token"))
        .and(warp::query::<HashMap<String, String>>())
        .and(warp::header::optional::<String>("x-identity-header"))
        .map(move |q: HashMap<String, String>, header: Option<String>| {
            if header.as_deref() != Some(HEADER_SECRET) {
                no.fetch_add(1, Ordering::SeqCst);
                return warp::reply::with_status(
                    warp::reply::json(&json!({"error": {"code": "Unauthorized", "message": "the X-IDENTITY-HEADER value is missing or wrong"}})),
                    warp::http::StatusCode::UNAUTHORIZED,
                );
            }
            let mut seen = seen.lock().unwrap();
            seen.push(TokenRequest {
                resource: q.get("resource").cloned(),
                api_version: q.get("api-version").cloned(),
                client_id: q.get("client_id").cloned(),
            });
            let n = seen.len();
            let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
            let expires_on = now + l.load(Ordering::SeqCst) as u64;
            warp::reply::with_status(
                warp::reply::json(&json!({
                    "access_token": mint(n),
                    "expires_on": expires_on.to_string(),
                    "resource": q.get("resource").cloned().unwrap_or_default(),
                    "token_type": "Bearer",
                    "client_id": "00000000-0000-0000-0000-000000000000"
                })),
                warp::http::StatusCode::OK,
            )
        });
    let (addr, server) = warp::serve(route).bind_ephemeral(([127, 0, 0, 1], 0));
    tokio::spawn(server);
    IdentityEndpoint {
        url: format!("http://{addr}/msi/token"),
        requests,
        refused,
        lifetime,
    }
}

/// An identity endpoint of an app with only a user-assigned identity: it
/// hands out a token only when asked for `client_id` (as App Service
/// answers 400 "Identity not found" when no system-assigned identity is
/// enabled), and counts every request it refused.
pub async fn user_assigned_identity_endpoint(client_id: &'static str) -> IdentityEndpoint {
    use warp::Filter;
    let requests = Arc::new(Mutex::new(Vec::new()));
    let refused = Arc::new(AtomicUsize::new(0));
    let (seen, no) = (Arc::clone(&requests), Arc::clone(&refused));
    let route = warp::get()
        .and(warp::path!("msi" / "token"))
        .and(warp::query::<HashMap<String, String>>())
        .and(warp::header::optional::<String>("x-identity-header"))
        .map(move |q: HashMap<String, String>, header: Option<String>| {
            if header.as_deref() != Some(HEADER_SECRET)
                || q.get("client_id").map(String::as_str) != Some(client_id)
            {
                no.fetch_add(1, Ordering::SeqCst);
                return warp::reply::with_status(
                    warp::reply::json(&json!({"statusCode": 400, "message": "No User Assigned or Delegated Managed Identity found for specified ClientId/ResourceId/PrincipalId."})),
                    warp::http::StatusCode::BAD_REQUEST,
                );
            }
            let mut seen = seen.lock().unwrap();
            seen.push(TokenRequest {
                resource: q.get("resource").cloned(),
                api_version: q.get("api-version").cloned(),
                client_id: q.get("client_id").cloned(),
            });
            let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
            warp::reply::with_status(
                warp::reply::json(&json!({
                    "access_token": format!("token-{}", seen.len()),
                    "expires_on": (now + 3600).to_string(),
                    "resource": q.get("resource").cloned().unwrap_or_default(),
                    "token_type": "Bearer",
                    "client_id": client_id
                })),
                warp::http::StatusCode::OK,
            )
        });
    let (addr, server) = warp::serve(route).bind_ephemeral(([127, 0, 0, 1], 0));
    tokio::spawn(server);
    IdentityEndpoint {
        url: format!("http://{addr}/msi/token"),
        requests,
        refused,
        lifetime: Arc::new(AtomicUsize::new(3600)),
    }
}
