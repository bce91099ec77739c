//! Who may deliver: Event Grid's Microsoft Entra ID token on every request.
//!
//! With Entra ID on a webhook subscription, Event Grid asks Entra ID for a
//! token for the webhook's app and sends it as `Authorization: Bearer …`
//! with every request, the validation handshake included. A delivery is
//! taken only when its token
//! - is signed (RS256) by one of the tenant's signing keys, held by one
//!   refresher ([`super::keys`]: fetched once for everyone, at most once
//!   per [`REFETCH_AT_MOST_EVERY`] whatever the state, the keys held used
//!   while a fetch fails; a key id the keys lack when they cannot be
//!   fetched again yet is answered `503`: Event Grid delivers again later,
//!   when a rolled key is found);
//! - is for this app (`aud`: its application id or application id URI, as
//!   the subscription names it: for an app id either form, since v2 tokens
//!   carry the bare id; one of a list), from the tenant (`iss`: the v1 or
//!   v2 issuer the authority's OpenID configuration documents name, so a
//!   sovereign cloud's authority brings its own), within its lifetime
//!   (`exp`, `nbf`, with [`CLOCK_SKEW`]);
//! - was issued to Event Grid ([`EVENT_GRID_APP_ID`] in `appid` or `azp`)
//!   and carries the [`SUBSCRIBER_ROLE`] app role.
//!
//! What fails is said apart ([`Refusal`]): a token missing, malformed,
//! badly signed, expired, or for another app or tenant is `401`; a valid
//! token of another caller or without the role is `403`; keys that cannot be
//! fetched are `503`, never `401` or `403`, which Event Grid does not retry.

use std::time::Duration;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use super::keys::{Issuers, Keys, NoKey};
pub use super::keys::{KEYS_KEPT_FOR, REFETCH_AT_MOST_EVERY};

/// Event Grid's own application id: the service principal Entra ID issues
/// its delivery tokens to.
pub const EVENT_GRID_APP_ID: &str = "4962773b-9cdb-44cf-a8bf-237846a00ab7";
/// The app role the webhook's app assigns to Event Grid's service principal.
pub const SUBSCRIBER_ROLE: &str = "AzureEventGridSecureWebhookSubscriber";
/// Entra ID's authority, where a tenant's signing keys are published.
pub const DEFAULT_AUTHORITY: &str = "https://login.microsoftonline.com";
/// Leeway on `exp` and `nbf`: clocks of two machines disagree a little.
pub const CLOCK_SKEW: Duration = Duration::from_secs(60);
/// How long one fetch of the keys may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// The Entra ID settings of the webhook (built by `config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntraSettings {
    /// The tenant of the webhook's app (a GUID).
    pub tenant_id: String,
    /// The webhook's app as the subscriptions name it: its application id
    /// or application id URI, one or more (a token for any is taken).
    pub audiences: Vec<String>,
    /// Where the tenant's keys and OpenID configuration are published:
    /// `{authority}/{tenant}/…`.
    pub authority: String,
}

impl EntraSettings {
    fn base(&self) -> String {
        format!(
            "{}/{}",
            self.authority.trim_end_matches('/'),
            self.tenant_id
        )
    }

    /// The JWKS document's address.
    pub fn keys_url(&self) -> String {
        format!("{}/discovery/v2.0/keys", self.base())
    }

    /// The OpenID configuration documents of the tenant's v1 and v2
    /// tokens: each names its tokens' issuer (`sts.windows.net` and
    /// `login.microsoftonline.com` in the public cloud, others in the
    /// sovereign clouds), as Microsoft's token validation guidance reads it.
    pub fn configuration_urls(&self) -> [String; 2] {
        [
            format!("{}/.well-known/openid-configuration", self.base()),
            format!("{}/v2.0/.well-known/openid-configuration", self.base()),
        ]
    }

    /// The audiences a token may name (pure): each configured one, and for
    /// an app's id its other form: `id` and `api://id` are one app (Event
    /// Grid asks for the form the subscription names; Entra ID's v2 tokens
    /// always carry the bare id).
    pub fn accepted_audiences(&self) -> Vec<String> {
        let mut accepted = Vec::new();
        for a in &self.audiences {
            let bare = a.strip_prefix("api://").unwrap_or(a);
            let forms = if uuid::Uuid::parse_str(bare).is_ok() {
                vec![bare.to_string(), format!("api://{bare}")]
            } else {
                vec![a.clone()]
            };
            for f in forms {
                if !accepted.contains(&f) {
                    accepted.push(f);
                }
            }
        }
        accepted
    }
}

/// Why a delivery is refused before any event is looked at, with the
/// detail for the log (never for the caller: it names the configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 401: no valid token for this app from this tenant.
    Unauthenticated(String),
    /// 403: a valid token, but not Event Grid's, or without the role.
    Forbidden(String),
    /// 503: the signing keys could not be had; Event Grid retries.
    Unavailable(String),
}

impl Refusal {
    /// What the caller is told: the class alone.
    pub fn class(&self) -> &'static str {
        match self {
            Refusal::Unauthenticated(_) => "unauthorized",
            Refusal::Forbidden(_) => "forbidden",
            Refusal::Unavailable(_) => "keys unavailable",
        }
    }

    /// What the log is told.
    pub fn detail(&self) -> &str {
        match self {
            Refusal::Unauthenticated(d) | Refusal::Forbidden(d) | Refusal::Unavailable(d) => d,
        }
    }
}

/// The claims checked beyond what [`Validation`] checks.
#[derive(Debug, Deserialize)]
struct Claims {
    iss: String,
    /// v1 tokens: the caller's application id.
    appid: Option<String>,
    /// v2 tokens: the same.
    azp: Option<String>,
    #[serde(default)]
    roles: Vec<String>,
}

/// Whether a token's caller and roles are Event Grid's delivering as a
/// subscriber (pure): the caller's application id is Event Grid's, and the
/// subscriber role is among its roles.
fn caller_refusal(appid: Option<&str>, roles: &[String]) -> Option<String> {
    match appid {
        Some(id) if id.eq_ignore_ascii_case(EVENT_GRID_APP_ID) => {}
        Some(id) => {
            return Some(format!(
                "the token was issued to application {id}, not to Event Grid ({EVENT_GRID_APP_ID})"
            ))
        }
        None => {
            return Some(format!(
                "the token names no caller (appid or azp); Event Grid's is {EVENT_GRID_APP_ID}"
            ))
        }
    }
    if roles.iter().any(|r| r == SUBSCRIBER_ROLE) {
        None
    } else {
        Some(format!(
            "the token does not carry the {SUBSCRIBER_ROLE} app role (assign it to Event Grid's service principal on the webhook's app)"
        ))
    }
}

/// The bearer token of an `Authorization` header and the key id its
/// header names (pure: no signature checked yet), or why it is no token
/// Entra ID issues: not a bearer token, not a JWT, not RS256, no `kid`.
pub fn bearer_key_id(authorization: Option<&str>) -> Result<(&str, String), Refusal> {
    let Some(value) = authorization else {
        return Err(Refusal::Unauthenticated(
            "no Authorization header: Event Grid sends a bearer token when the subscription uses Microsoft Entra ID".into(),
        ));
    };
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            Refusal::Unauthenticated("the Authorization header is not a bearer token".into())
        })?;
    let header = jsonwebtoken::decode_header(token)
        .map_err(|e| Refusal::Unauthenticated(format!("the bearer token is not a JWT: {e}")))?;
    if header.alg != Algorithm::RS256 {
        return Err(Refusal::Unauthenticated(format!(
            "the token is signed with {:?}; Entra ID signs with RS256",
            header.alg
        )));
    }
    let kid = header
        .kid
        .ok_or_else(|| Refusal::Unauthenticated("the token names no signing key (kid)".into()))?;
    Ok((token, kid))
}

/// Why a signed token's claims are refused (pure), beyond what
/// [`Validation`] checks: an issuer not among `issuers` (401), a caller
/// that is not Event Grid or lacks the role (403).
fn claims_refusal(claims: &Claims, issuers: &[String]) -> Result<(), Refusal> {
    if !issuers.contains(&claims.iss) {
        return Err(Refusal::Unauthenticated(format!(
            "the token's issuer {:?} is not the tenant's ({})",
            claims.iss,
            issuers.join(", ")
        )));
    }
    let caller = claims.appid.as_deref().or(claims.azp.as_deref());
    match caller_refusal(caller, &claims.roles) {
        Some(why) => Err(Refusal::Forbidden(why)),
        None => Ok(()),
    }
}

/// A token's claims as JSON (its payload, decoded) checked as a signed
/// token's are once [`Validation`] has passed (the fuzz target's way in:
/// no key needed): the claims read (`iss`, `appid`/`azp`, `roles`), then
/// [`claims_refusal`]. Claims that cannot be read are 401.
pub fn check_claims(payload: &[u8], issuers: &[String]) -> Result<(), Refusal> {
    let claims: Claims = serde_json::from_slice(payload)
        .map_err(|e| Refusal::Unauthenticated(format!("the token's claims cannot be read: {e}")))?;
    claims_refusal(&claims, issuers)
}

/// Checks delivery tokens against the tenant's signing keys.
pub struct Verifier {
    settings: EntraSettings,
    validation: Validation,
    keys: Keys,
}

impl Verifier {
    pub fn new(settings: EntraSettings) -> anyhow::Result<Verifier> {
        crate::tls::install_crypto_provider();
        let mut validation = Validation::new(Algorithm::RS256);
        validation.set_audience(&settings.accepted_audiences());
        // `iss` is checked against the issuers the authority's OpenID
        // configuration names, fetched with the keys (see `check`).
        validation.set_required_spec_claims(&["exp", "aud", "iss"]);
        validation.validate_nbf = true;
        validation.leeway = CLOCK_SKEW.as_secs();
        let client = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .build()
            .map_err(|e| {
                anyhow::anyhow!("cannot build the HTTP client for Entra ID's keys: {e}")
            })?;
        Ok(Verifier {
            keys: Keys::new(settings.keys_url(), settings.configuration_urls(), client),
            settings,
            validation,
        })
    }

    pub fn settings(&self) -> &EntraSettings {
        &self.settings
    }

    /// The delivery's `Authorization` header checked: `Ok` when Event Grid
    /// sent it for this app.
    pub async fn check(&self, authorization: Option<&str>) -> Result<(), Refusal> {
        let (token, kid) = bearer_key_id(authorization)?;
        let (key, issuers) = self.key(&kid).await?;
        let data = jsonwebtoken::decode::<Claims>(token, &key, &self.validation).map_err(|e| {
            Refusal::Unauthenticated(format!(
                "the token is not valid for {} in tenant {}: {e}",
                self.settings.audiences.join(", "),
                self.settings.tenant_id
            ))
        })?;
        claims_refusal(&data.claims, &issuers)
    }

    /// The key `kid` names, and the tenant's issuers: from the keys held,
    /// or from a fetch of them.
    async fn key(&self, kid: &str) -> Result<(DecodingKey, Issuers), Refusal> {
        match self.keys.key(kid).await {
            Ok((jwk, issuers)) => Ok((decoding_key(&jwk)?, issuers)),
            Err(NoKey::Unknown(why)) => Err(Refusal::Unauthenticated(format!(
                "{why} (tenant {})",
                self.settings.tenant_id
            ))),
            Err(NoKey::Unavailable(why)) => Err(Refusal::Unavailable(why)),
        }
    }
}

fn decoding_key(jwk: &jsonwebtoken::jwk::Jwk) -> Result<DecodingKey, Refusal> {
    DecodingKey::from_jwk(jwk).map_err(|e| {
        Refusal::Unauthenticated(format!("the token's signing key cannot be used: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roles(r: &[&str]) -> Vec<String> {
        r.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn only_event_grid_with_the_subscriber_role_may_deliver() {
        assert_eq!(
            caller_refusal(Some(EVENT_GRID_APP_ID), &roles(&[SUBSCRIBER_ROLE])),
            None
        );
        assert_eq!(
            caller_refusal(
                Some(&EVENT_GRID_APP_ID.to_uppercase()),
                &roles(&["Other", SUBSCRIBER_ROLE])
            ),
            None
        );
        let other = caller_refusal(
            Some("00000000-0000-0000-0000-000000000001"),
            &roles(&[SUBSCRIBER_ROLE]),
        )
        .unwrap();
        assert!(other.contains("not to Event Grid"), "{other}");
        assert!(caller_refusal(None, &roles(&[SUBSCRIBER_ROLE]))
            .unwrap()
            .contains("names no caller"));
        let no_role = caller_refusal(Some(EVENT_GRID_APP_ID), &roles(&["Reader"])).unwrap();
        assert!(no_role.contains(SUBSCRIBER_ROLE), "{no_role}");
        assert!(caller_refusal(Some(EVENT_GRID_APP_ID), &[]).is_some());
    }

    #[test]
    fn the_keys_and_configuration_are_the_tenants_and_both_audience_forms_are_taken() {
        let s = EntraSettings {
            tenant_id: "t1".into(),
            audiences: vec![
                "api://5b3c7f3e-8a52-4c1e-9f0e-0d1c2b3a4f5e".into(),
                "api://orders".into(),
            ],
            authority: "https://login.microsoftonline.com/".into(),
        };
        assert_eq!(
            s.keys_url(),
            "https://login.microsoftonline.com/t1/discovery/v2.0/keys"
        );
        assert_eq!(
            s.configuration_urls(),
            [
                "https://login.microsoftonline.com/t1/.well-known/openid-configuration".to_string(),
                "https://login.microsoftonline.com/t1/v2.0/.well-known/openid-configuration"
                    .to_string()
            ]
        );
        assert_eq!(
            s.accepted_audiences(),
            [
                "5b3c7f3e-8a52-4c1e-9f0e-0d1c2b3a4f5e",
                "api://5b3c7f3e-8a52-4c1e-9f0e-0d1c2b3a4f5e",
                "api://orders"
            ]
        );
        let bare = EntraSettings {
            audiences: vec!["5B3C7F3E-8A52-4C1E-9F0E-0D1C2B3A4F5E".into()],
            ..s
        };
        assert_eq!(
            bare.accepted_audiences(),
            [
                "5B3C7F3E-8A52-4C1E-9F0E-0D1C2B3A4F5E",
                "api://5B3C7F3E-8A52-4C1E-9F0E-0D1C2B3A4F5E"
            ]
        );
    }
}
