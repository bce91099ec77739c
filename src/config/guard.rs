//! `REDIS_URL` and the settings beside it: where the guard lives and how it
//! signs in. Messages and `Debug` never show a password or an access key.

use super::{err, ConfigError};

/// Where the guard lives. `Debug` never shows credentials.
#[derive(Clone, PartialEq, Eq)]
pub enum GuardConfig {
    /// In-process guard (`REDIS_URL` empty or unset).
    Memory,
    /// A redis-rs URL (`redis://…` or `rediss://…`); `cluster` when
    /// `REDIS_CLUSTER=true`: the URL is one node of an OSS cluster (the
    /// others are found from it), reached with redis-rs' cluster client.
    Redis {
        url: String,
        cluster: bool,
        auth: RedisAuth,
    },
}

/// How the guard authenticates to Redis (`REDIS_AUTH`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisAuth {
    /// `access-key` (the default): the URL's password, if any.
    AccessKey,
    /// `entra-id`: Entra ID tokens from the `Active Directory Default` chain
    /// (workload identity, the app's managed identity, `az`/`azd`, the
    /// Instance Metadata Service); `client_id` (`REDIS_CLIENT_ID`) names a
    /// user-assigned identity.
    EntraId { client_id: Option<String> },
}

impl std::fmt::Debug for GuardConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GuardConfig::Memory => f.write_str("Memory"),
            GuardConfig::Redis { url, cluster, auth } => f
                .debug_struct("Redis")
                .field("url", &without_credentials(url))
                .field("cluster", cluster)
                .field("auth", auth)
                .finish(),
        }
    }
}

/// A URL with whatever precedes its last `@` (user and password) replaced.
fn without_credentials(url: &str) -> String {
    // Only what locates the server: scheme, host, port, database; never the
    // user, the password or anything else the text holds.
    match redis::parse_redis_url(url) {
        Some(u) => {
            let credentials = if u.username().is_empty() && u.password().is_none() {
                ""
            } else {
                "(credentials not shown)@"
            };
            let port = u.port().map(|p| format!(":{p}")).unwrap_or_default();
            format!(
                "{}://{credentials}{}{port}{}",
                u.scheme(),
                u.host_str().unwrap_or(""),
                u.path()
            )
        }
        None => "(not a URL; not shown)".into(),
    }
}

/// Whether `h` can be a host: an IPv6 literal in brackets, or dot-separated
/// labels of letters, digits and `-`, and not a lone mixed-case token that
/// looks like an access key (Azure's keys are 44 base64 characters).
fn plausible_host(h: &str) -> bool {
    if let Some(inner) = h.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        return inner.parse::<std::net::Ipv6Addr>().is_ok();
    }
    let labels_ok = !h.is_empty()
        && h.len() <= 253
        && h.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    let key_like = !h.contains('.')
        && h.len() >= 20
        && h.bytes().any(|b| b.is_ascii_uppercase())
        && h.bytes().any(|b| b.is_ascii_lowercase())
        && h.bytes().any(|b| b.is_ascii_digit());
    labels_ok && !key_like
}

/// `REDIS_AUTH` and `REDIS_CLIENT_ID` for the (already checked) `url`;
/// with Entra ID and no `REDIS_CLIENT_ID`, `app_identity`
/// (`AZURE_CLIENT_ID`, the app's user-assigned identity) signs in.
pub(super) fn redis_auth(
    auth: Option<String>,
    client_id: Option<String>,
    app_identity: Option<String>,
    url: &str,
) -> Result<RedisAuth, ConfigError> {
    match auth.map(|a| a.to_ascii_lowercase()).as_deref() {
        None | Some("access-key") => match client_id {
            Some(_) => Err(err(
                "REDIS_CLIENT_ID",
                "names a user-assigned identity for REDIS_AUTH=entra-id, but REDIS_AUTH is not entra-id",
            )),
            None => Ok(RedisAuth::AccessKey),
        },
        Some("entra-id") => {
            let parsed = redis::parse_redis_url(url);
            let user = parsed.as_ref().is_some_and(|u| !u.username().is_empty());
            let password = parsed.as_ref().is_some_and(|u| u.password().is_some());
            if user || password {
                return Err(err(
                    "REDIS_URL",
                    "carries a user name or password, but REDIS_AUTH=entra-id takes both from the Entra ID token (the identity's object id and the token): remove them from the URL (the value is not shown)",
                ));
            }
            Ok(RedisAuth::EntraId {
                client_id: client_id.or(app_identity),
            })
        }
        Some(other) => Err(err(
            "REDIS_AUTH",
            format!("expected access-key (the password in REDIS_URL: an access key) or entra-id (Microsoft Entra ID tokens of the app's identity, Azure Managed Redis' default), got {other:?}"),
        )),
    }
}

/// Accept a redis-rs URL, or translate Azure's StackExchange.Redis form
/// `host:6380,password=KEY,ssl=True,abortConnect=False` into one.
pub fn redis_url(v: &str) -> Result<String, ConfigError> {
    const VAR: &str = "REDIS_URL";
    if v.starts_with("redis://") || v.starts_with("rediss://") || v.starts_with("redis+unix://") {
        let url = redis::parse_redis_url(v).ok_or_else(|| {
            err(
                VAR,
                "not a valid redis:// or rediss:// URL (the value is not shown)",
            )
        })?;
        if url.host_str().is_some_and(|h| !plausible_host(h)) {
            return Err(err(
                VAR,
                "the URL's host is not a host name (an access key in the host's place?); expected redis://HOST:PORT or rediss://:KEY@HOST:6380 (the value is not shown)",
            ));
        }
        // After HOST:PORT only a database number: anything else is a form
        // mixed up with Azure's (`…:6380,password=KEY,ssl=True` after a
        // URL), which would carry the key where no one redacts it.
        let path = url.path();
        let db_only = path.is_empty()
            || path == "/"
            || path
                .strip_prefix('/')
                .is_some_and(|d| d.bytes().all(|b| b.is_ascii_digit()));
        if !db_only || url.fragment().is_some() {
            return Err(err(
                VAR,
                "after redis://HOST:PORT only /DB (a database number) may follow; for Azure's form give HOST:6380,password=KEY,ssl=True without the scheme (the value is not shown)",
            ));
        }
        return Ok(v.to_string());
    }
    let mut parts = v.split(',');
    let endpoint = parts.next().unwrap_or("").trim();
    // Messages never quote the value: a mistyped separator can put the access
    // key where the port or host should be.
    let form = "expected redis://HOST:PORT, rediss://:KEY@HOST:6380, or Azure's HOST:6380,password=KEY,ssl=True form (the value is not shown)";
    let (host, port) = match endpoint.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse::<u16>()
                .map_err(|_| err(VAR, format!("the port after ':' is not a number; {form}")))?,
        ),
        None => (endpoint, 6379),
    };
    if !plausible_host(host) {
        return Err(err(
            VAR,
            format!("not a host name (an access key pasted alone?); {form}"),
        ));
    }
    let (mut password, mut ssl, mut user) = (None, port == 6380, None);
    for part in parts {
        let Some((k, val)) = part.split_once('=') else {
            continue;
        };
        match k.trim().to_ascii_lowercase().as_str() {
            "password" => password = Some(val.trim().to_string()),
            "user" => user = Some(val.trim().to_string()),
            "ssl" => ssl = val.trim().eq_ignore_ascii_case("true"),
            _ => {}
        }
    }
    let enc = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    let auth = match (user, password) {
        (u, Some(p)) => format!("{}:{}@", enc(u.as_deref().unwrap_or("")), enc(&p)),
        (Some(u), None) => format!("{}@", enc(&u)),
        (None, None) => String::new(),
    };
    let scheme = if ssl { "rediss" } else { "redis" };
    Ok(format!("{scheme}://{auth}{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::config;

    #[test]
    fn hosts_are_host_names_or_addresses() {
        for ok in [
            "cache",
            "127.0.0.1",
            "[::1]",
            "my-cache.redis.cache.windows.net",
            "redis-7",
        ] {
            assert!(plausible_host(ok), "{ok}");
        }
        for bad in [
            "",
            "a b",
            "Zm9vYmFyU2VjcmV0S2V5MTIz",
            "key=",
            "a..b",
            "x/y",
            "[nope]",
        ] {
            assert!(!plausible_host(bad), "{bad}");
        }
    }

    /// Found by the `connection_strings` fuzz target: a URL with Azure's
    /// form after it was accepted, and its `Debug` showed the key.
    #[test]
    fn a_url_mixed_with_azures_form_is_refused_without_showing_the_key() {
        let mixed = "rediss://:key@cache.example.net:6380/0,password=S3cr3tMarker,ssl=True";
        let e = config(&[("REDIS_URL", mixed)]).unwrap_err();
        assert_eq!(e.var, "REDIS_URL");
        assert!(!format!("{e} {e:?}").contains("S3cr3tMarker"), "{e}");
        for fine in [
            "redis://cache:6379",
            "rediss://:k@cache:6380/0",
            "redis://cache:6379/",
        ] {
            let c = config(&[("REDIS_URL", fine)]).unwrap();
            let shown = format!("{c:?}");
            assert!(!shown.contains(":k@"), "{shown}");
            assert!(shown.contains("cache:63"), "{shown}");
        }
    }

    #[test]
    fn redis_cluster_is_a_setting_beside_the_url() {
        let c = config(&[("REDIS_URL", "redis://cache:6379")]).unwrap();
        assert_eq!(
            c.guard,
            GuardConfig::Redis {
                url: "redis://cache:6379".into(),
                cluster: false,
                auth: RedisAuth::AccessKey,
            }
        );
        let azure =
            "amr.westeurope.redis.azure.net:10000,password=S3cretKey,ssl=True,abortConnect=False";
        let c = config(&[("REDIS_URL", azure), ("REDIS_CLUSTER", "True")]).unwrap();
        assert_eq!(
            c.guard,
            GuardConfig::Redis {
                url: "rediss://:S3cretKey@amr.westeurope.redis.azure.net:10000".into(),
                cluster: true,
                auth: RedisAuth::AccessKey,
            }
        );
        let e = config(&[("REDIS_URL", azure), ("REDIS_CLUSTER", "yes")]).unwrap_err();
        assert_eq!(e.var, "REDIS_CLUSTER");
        assert!(!e.to_string().contains("S3cretKey"), "{e}");
        let e = config(&[("REDIS_CLUSTER", "true")]).unwrap_err();
        assert_eq!(e.var, "REDIS_CLUSTER");
        for bad in ["ord{", "o}", "{x}:"] {
            let e = config(&[("GUARD_KEY_PREFIX", bad)]).unwrap_err();
            assert_eq!(e.var, "GUARD_KEY_PREFIX", "{bad}");
        }
    }

    #[test]
    fn redis_auth_selects_entra_id_tokens_instead_of_an_access_key() {
        let amr = "amr.westeurope.redis.azure.net:10000,ssl=True";
        let c = config(&[("REDIS_URL", amr), ("REDIS_AUTH", "entra-id")]).unwrap();
        assert_eq!(
            c.guard,
            GuardConfig::Redis {
                url: "rediss://amr.westeurope.redis.azure.net:10000".into(),
                cluster: false,
                auth: RedisAuth::EntraId { client_id: None },
            }
        );
        let c = config(&[
            ("REDIS_URL", amr),
            ("REDIS_AUTH", "Entra-ID"),
            ("REDIS_CLIENT_ID", "uai-client"),
        ])
        .unwrap();
        assert!(matches!(
            c.guard,
            GuardConfig::Redis { auth: RedisAuth::EntraId { client_id: Some(ref id) }, .. } if id == "uai-client"
        ));
        let c = config(&[("REDIS_URL", amr), ("REDIS_AUTH", "access-key")]).unwrap();
        assert!(matches!(
            c.guard,
            GuardConfig::Redis {
                auth: RedisAuth::AccessKey,
                ..
            }
        ));
        // A password beside the token is a mistake, and never echoed.
        for url in [
            "rediss://:S3cretKey@amr.westeurope.redis.azure.net:10000",
            "amr.westeurope.redis.azure.net:10000,password=S3cretKey,ssl=True",
            "rediss://someone@amr.westeurope.redis.azure.net:10000",
        ] {
            let e = config(&[("REDIS_URL", url), ("REDIS_AUTH", "entra-id")]).unwrap_err();
            assert_eq!(e.var, "REDIS_URL", "{url}");
            assert!(e.to_string().contains("remove them"), "{e}");
            assert!(!e.to_string().contains("S3cretKey"), "{e}");
        }
        let e = config(&[("REDIS_URL", amr), ("REDIS_AUTH", "aad")]).unwrap_err();
        assert_eq!(e.var, "REDIS_AUTH");
        assert!(e.to_string().contains("entra-id"), "{e}");
        let e = config(&[("REDIS_URL", amr), ("REDIS_CLIENT_ID", "x")]).unwrap_err();
        assert_eq!(e.var, "REDIS_CLIENT_ID");
        let e = config(&[("REDIS_AUTH", "entra-id")]).unwrap_err();
        assert_eq!(e.var, "REDIS_AUTH");
        assert!(e.to_string().contains("REDIS_URL is not set"), "{e}");
        // The example settings' `access-key` with no cache is the default.
        assert!(config(&[("REDIS_AUTH", "access-key")]).is_ok());
    }

    #[test]
    fn azure_redis_form_becomes_a_tls_url_with_an_encoded_key() {
        let url = redis_url(
            "cache.redis.cache.windows.net:6380,password=ab+c/d=,ssl=True,abortConnect=False",
        )
        .unwrap();
        assert_eq!(
            url,
            "rediss://:ab%2Bc%2Fd%3D@cache.redis.cache.windows.net:6380"
        );
        assert_eq!(
            redis_url("127.0.0.1:6379").unwrap(),
            "redis://127.0.0.1:6379"
        );
        assert_eq!(
            redis_url("redis://127.0.0.1:7000/0").unwrap(),
            "redis://127.0.0.1:7000/0"
        );
        for bad in [
            "cache:6380;password=S3cretKey",
            "default:S3cretKey@host",
            "cache S3cretKey:6380",
            "http://S3cretKey@host",
            "redis://:S3cretKey@host:notaport",
        ] {
            let e = redis_url(bad).unwrap_err().to_string();
            assert!(e.starts_with("REDIS_URL: "), "{e}");
            assert!(!e.contains("S3cretKey"), "{bad} leaked into {e}");
        }
    }
}
