//! Azure Storage: where an account's blob or queue service is and how to
//! sign in, read by pure functions from a setting's value (`config` calls
//! [`parse_storage`] for `DEAD_LETTER_STORAGE` and [`parse_storage_of`] for
//! `OUTBOX_STORAGE`). Shared by the dead-letter sweep and the outbox; it
//! imports neither.
//!
//! Accepted forms:
//! - a storage connection string, as the portal shows it
//!   (`DefaultEndpointsProtocol=https;AccountName=…;AccountKey=…;EndpointSuffix=core.windows.net`),
//!   with `BlobEndpoint=` (Azurite's full form, a private endpoint) and/or
//!   `SharedAccessSignature=` instead of the key;
//! - `UseDevelopmentStorage=true`: the local emulator (Azurite) on its
//!   default port with its well-known account;
//! - a container URL, `https://<account>.blob.core.windows.net/<container>`,
//!   with a SAS query (`?sv=…&sig=…`) or without one: then Entra ID (the
//!   app's managed identity, workload identity, or `az login`, as for SQL).
//!
//! The key and the SAS are [`Secret`]s: never shown by `Debug` or by an
//! error, which names what is wrong and never quotes the value.

use std::fmt;

/// Azurite's documented account and key (public, the same everywhere).
pub const EMULATOR_ACCOUNT: &str = "devstoreaccount1";
pub const EMULATOR_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// The storage service a value names: the dead letters' blobs, or the
/// outbox's queue (`crate::outbox::queue`). The two read the same forms;
/// only the names differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    Blob,
    Queue,
}

impl Service {
    /// The host label (`<account>.blob.core.windows.net`).
    fn label(self) -> &'static str {
        match self {
            Service::Blob => "blob",
            Service::Queue => "queue",
        }
    }
    /// The connection string's key for the service's own endpoint.
    fn endpoint_key(self) -> &'static str {
        match self {
            Service::Blob => "BlobEndpoint",
            Service::Queue => "QueueEndpoint",
        }
    }
    /// Azurite's default endpoint for the service.
    fn emulator_endpoint(self) -> &'static str {
        match self {
            Service::Blob => "http://127.0.0.1:10000/devstoreaccount1",
            Service::Queue => "http://127.0.0.1:10001/devstoreaccount1",
        }
    }
    fn emulator_port(self) -> u16 {
        match self {
            Service::Blob => 10000,
            Service::Queue => 10001,
        }
    }
    /// What a URL of the service names last.
    fn resource(self) -> &'static str {
        match self {
            Service::Blob => "container",
            Service::Queue => "queue",
        }
    }
}

/// A value that is never shown.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(not shown)")
    }
}

/// How the sweep signs in to Blob Storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// Shared key (`AccountKey=`).
    AccountKey(Secret),
    /// A shared access signature (the query, without `?`).
    Sas(Secret),
    /// Entra ID tokens for the app's identity (role Storage Blob Data
    /// Contributor on the container or account): `client_id` names a
    /// user-assigned one (`AZURE_CLIENT_ID`), else the system-assigned one
    /// or the developer's sign-in.
    EntraId { client_id: Option<String> },
}

impl Credential {
    /// This credential with `client_id` naming the user-assigned identity
    /// when it signs in with Entra ID (a key or a SAS is left as it is).
    pub fn with_client_id(self, client_id: Option<&str>) -> Credential {
        match self {
            Credential::EntraId { .. } => Credential::EntraId {
                client_id: client_id.map(str::to_string),
            },
            other => other,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Credential::AccountKey(_) => "account key",
            Credential::Sas(_) => "shared access signature",
            Credential::EntraId { .. } => "Entra ID",
        }
    }
}

/// Where the dead letters are, from `DEAD_LETTER_STORAGE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageTarget {
    pub account: String,
    /// The blob service URL, without a trailing `/`:
    /// `https://<account>.blob.core.windows.net`, or a path-style one
    /// (`http://127.0.0.1:10000/devstoreaccount1`, Azurite).
    pub endpoint: String,
    pub credential: Credential,
    /// The container, when the value was a container URL.
    pub container: Option<String>,
}

/// A connection string's `key=value` pairs, keys as written (compare them
/// without case), values trimmed; a value may hold `=` (base64 keys end
/// with `==`). Empty parts (a trailing `;`) are skipped; a part without
/// `=` is an error naming its position, never its text.
pub fn split_connection_string(v: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    for (i, part) in v.split(';').enumerate() {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let Some((k, val)) = part.split_once('=') else {
            return Err(format!(
                "part {} of the connection string has no '=' (expected Key=Value pairs separated by ';')",
                i + 1
            ));
        };
        let k = k.trim();
        if k.is_empty() {
            return Err(format!(
                "part {} of the connection string has no key",
                i + 1
            ));
        }
        pairs.push((k.to_string(), val.trim().to_string()));
    }
    Ok(pairs)
}

/// Read `DEAD_LETTER_STORAGE` (see the module documentation). Errors never
/// quote the value.
pub fn parse_storage(v: &str) -> Result<StorageTarget, String> {
    parse_storage_of(v, Service::Blob)
}

/// [`parse_storage`] for `service`: its endpoint key (`QueueEndpoint`), its
/// host label, its emulator port; a URL names a queue instead of a
/// container (`container` then holds the queue).
pub fn parse_storage_of(v: &str, service: Service) -> Result<StorageTarget, String> {
    let v = v.trim();
    if v.starts_with("https://") || v.starts_with("http://") {
        return parse_container_url(v, service);
    }
    let pairs = split_connection_string(v)?;
    let get = |key: &str| {
        pairs
            .iter()
            .rev()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    };
    if pairs.is_empty() {
        return Err("is empty".into());
    }
    if get("UseDevelopmentStorage").is_some_and(|u| u.eq_ignore_ascii_case("true")) {
        let endpoint = match get("DevelopmentStorageProxyUri") {
            Some(proxy) => format!("{}/{EMULATOR_ACCOUNT}", proxy.trim_end_matches('/')),
            None => service.emulator_endpoint().to_string(),
        };
        return Ok(StorageTarget {
            account: EMULATOR_ACCOUNT.into(),
            endpoint,
            credential: Credential::AccountKey(Secret::new(EMULATOR_KEY)),
            container: None,
        });
    }
    let endpoint_key = service.endpoint_key();
    let endpoint = match get(endpoint_key) {
        Some(e) => {
            check_endpoint(e, endpoint_key)?;
            e.trim_end_matches('/').to_string()
        }
        None => {
            let account = get("AccountName").ok_or_else(|| format!(
                "the connection string has neither AccountName nor {endpoint_key} (expected DefaultEndpointsProtocol=https;AccountName=…;AccountKey=…;EndpointSuffix=core.windows.net, as the portal's Access keys page shows it)",
            ))?;
            check_account(account)?;
            let protocol = get("DefaultEndpointsProtocol").unwrap_or("https");
            if !protocol.eq_ignore_ascii_case("https") && !protocol.eq_ignore_ascii_case("http") {
                return Err(
                    "DefaultEndpointsProtocol must be https (or http for an emulator)".into(),
                );
            }
            let suffix = get("EndpointSuffix").unwrap_or("core.windows.net");
            format!(
                "{}://{account}.{}.{suffix}",
                protocol.to_ascii_lowercase(),
                service.label()
            )
        }
    };
    let account = match get("AccountName") {
        Some(a) => {
            check_account(a)?;
            a.to_string()
        }
        None => account_of_endpoint(&endpoint, service).ok_or_else(|| format!(
            "the connection string has no AccountName, and the account cannot be read from its {endpoint_key}",
        ))?,
    };
    let credential = match (get("AccountKey"), get("SharedAccessSignature")) {
        (Some(key), _) => {
            if !plausible_base64(key) {
                return Err("AccountKey is not a base64 key (copy key1 or key2 from the storage account's Access keys page)".into());
            }
            Credential::AccountKey(Secret::new(key))
        }
        (None, Some(sas)) => Credential::Sas(Secret::new(sas.trim_start_matches('?'))),
        (None, None) => Credential::EntraId { client_id: None },
    };
    if endpoint.starts_with("http://") && matches!(credential, Credential::EntraId { .. }) {
        return Err(format!("Entra ID tokens are never sent over plain http: use an https {endpoint_key}, or give an AccountKey (an emulator)"));
    }
    Ok(StorageTarget {
        account,
        endpoint,
        credential,
        container: None,
    })
}

/// `https://<account>.blob.core.windows.net/<container>[?<sas>]`, or a
/// path-style `http://127.0.0.1:<port>/<account>/<container>` (an emulator).
fn parse_container_url(v: &str, service: Service) -> Result<StorageTarget, String> {
    let (label, resource) = (service.label(), service.resource());
    let (base, query) = match v.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (v, None),
    };
    let (scheme, rest) = base.split_once("://").ok_or("not a URL")?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    if host.contains('@') {
        return Err(
            "the container URL must not hold a user or password; give a SAS query or use Entra ID"
                .into(),
        );
    }
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let path_style = !host.contains(&format!(".{label}."));
    let (account, container, endpoint) = match (path_style, segments.as_slice()) {
        (false, [container]) => {
            let account = host.split('.').next().unwrap_or("").to_string();
            (account, *container, format!("{scheme}://{host}"))
        }
        (true, [account, container]) => (
            account.to_string(),
            *container,
            format!("{scheme}://{host}/{account}"),
        ),
        _ => {
            let port = service.emulator_port();
            return Err(format!("a {resource} URL must name one {resource}: https://<account>.{label}.core.windows.net/<{resource}> (a path-style emulator URL: http://127.0.0.1:{port}/<account>/<{resource}>)"));
        }
    };
    check_account(&account)?;
    check_endpoint(&endpoint, &format!("the {resource} URL"))?;
    // Not quoted: an operator who pastes `URL;AccountKey=…` would see the
    // key in the error (found by fuzz/fuzz_targets/dead_letters.rs).
    // Queue names follow the rules of container names.
    check_container(container).map_err(|_| {
        format!(
            "the last part of the {resource} URL's path is not a {resource} name: 3 to 63 lowercase \
             letters, digits and single hyphens, starting and ending with a letter or digit"
        )
    })?;
    let credential = match query.filter(|q| !q.is_empty()) {
        Some(q) if q.contains("sig=") => Credential::Sas(Secret::new(q)),
        Some(_) => {
            return Err(format!("the {resource} URL's query is not a shared access signature (no sig=)"))
        }
        None if scheme == "http" => {
            return Err(format!("a plain-http {resource} URL needs a SAS query: Entra ID tokens are never sent over http"))
        }
        None => Credential::EntraId { client_id: None },
    };
    Ok(StorageTarget {
        account,
        endpoint,
        credential,
        container: Some(container.to_string()),
    })
}

/// `https://…`, or `http://` to a loopback address only (an emulator).
fn check_endpoint(e: &str, what: &str) -> Result<(), String> {
    let host = |rest: &str| {
        let hostport = rest.split('/').next().unwrap_or("");
        hostport
            .rsplit_once(':')
            .map_or(hostport, |(h, _)| h)
            .to_string()
    };
    if let Some(rest) = e.strip_prefix("https://") {
        if host(rest).is_empty() {
            return Err(format!("{what} has no host"));
        }
        return Ok(());
    }
    if let Some(rest) = e.strip_prefix("http://") {
        let h = host(rest);
        if h == "localhost" || h == "[::1]" || h.starts_with("127.") {
            return Ok(());
        }
        return Err(format!(
            "{what} is plain http to a host that is not loopback: use https (http is for an emulator on this machine)"
        ));
    }
    Err(format!("{what} must start with https://"))
}

/// The account of `https://<account>.blob.…` or of path-style
/// `http://127.0.0.1:10000/<account>`.
fn account_of_endpoint(endpoint: &str, service: Service) -> Option<String> {
    let rest = endpoint.split_once("://")?.1;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let account = if host.contains(&format!(".{}.", service.label())) {
        host.split('.').next()?
    } else {
        path.split('/').next()?
    };
    check_account(account).ok()?;
    Some(account.to_string())
}

/// Storage account names: 3-24 lowercase letters and digits.
fn check_account(a: &str) -> Result<(), String> {
    if (3..=24).contains(&a.len())
        && a.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        Ok(())
    } else {
        Err("the storage account name must be 3 to 24 lowercase letters and digits".into())
    }
}

/// Container names: 3-63 lowercase letters, digits and single hyphens,
/// starting and ending with a letter or digit.
pub fn check_container(c: &str) -> Result<(), String> {
    let ok = (3..=63).contains(&c.len())
        && c.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !c.starts_with('-')
        && !c.ends_with('-')
        && !c.contains("--");
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{c:?} is not a container name: 3 to 63 lowercase letters, digits and single hyphens, starting and ending with a letter or digit"
        ))
    }
}

fn plausible_base64(k: &str) -> bool {
    !k.is_empty()
        && k.len().is_multiple_of(4)
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/' || b == b'=')
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "c2VjcmV0LWtleS1vZi10aGUtYWNjb3VudC0xMjM0NTY3ODkwYWJjZA==";

    #[test]
    fn splits_pairs_keeping_equals_signs_in_values() {
        let pairs = split_connection_string(&format!(
            " DefaultEndpointsProtocol=https; AccountName=acct ;AccountKey={KEY};;"
        ))
        .unwrap();
        assert_eq!(
            pairs,
            vec![
                ("DefaultEndpointsProtocol".to_string(), "https".to_string()),
                ("AccountName".into(), "acct".into()),
                ("AccountKey".into(), KEY.into()),
            ]
        );
        let e = split_connection_string("AccountName=acct;pasted-secret").unwrap_err();
        assert!(e.contains("part 2"), "{e}");
        assert!(!e.contains("pasted-secret"));
    }

    #[test]
    fn the_portals_connection_string() {
        let t = parse_storage(&format!(
            "DefaultEndpointsProtocol=https;AccountName=ordersdl;AccountKey={KEY};EndpointSuffix=core.windows.net"
        ))
        .unwrap();
        assert_eq!(t.account, "ordersdl");
        assert_eq!(t.endpoint, "https://ordersdl.blob.core.windows.net");
        assert_eq!(t.credential, Credential::AccountKey(Secret::new(KEY)));
        // Keys compare without case; another cloud's suffix is kept.
        let t = parse_storage(&format!(
            "accountname=ordersdl;accountkey={KEY};endpointsuffix=core.chinacloudapi.cn"
        ))
        .unwrap();
        assert_eq!(t.endpoint, "https://ordersdl.blob.core.chinacloudapi.cn");
    }

    #[test]
    fn azurite_forms() {
        let t = parse_storage("UseDevelopmentStorage=true").unwrap();
        assert_eq!(t.account, EMULATOR_ACCOUNT);
        assert_eq!(t.endpoint, "http://127.0.0.1:10000/devstoreaccount1");
        let t = parse_storage(&format!(
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={EMULATOR_KEY};BlobEndpoint=http://127.0.0.1:41234/devstoreaccount1/;"
        ))
        .unwrap();
        assert_eq!(t.endpoint, "http://127.0.0.1:41234/devstoreaccount1");
        assert_eq!(t.account, "devstoreaccount1");
        // Without AccountName the path-style endpoint names the account.
        let t = parse_storage("BlobEndpoint=http://127.0.0.1:41234/devstoreaccount1;SharedAccessSignature=?sv=2024&sig=abc").unwrap();
        assert_eq!(t.account, "devstoreaccount1");
        assert_eq!(
            t.credential,
            Credential::Sas(Secret::new("sv=2024&sig=abc"))
        );
    }

    #[test]
    fn container_urls() {
        let t = parse_storage("https://ordersdl.blob.core.windows.net/dead-letters").unwrap();
        assert_eq!(
            t,
            StorageTarget {
                account: "ordersdl".into(),
                endpoint: "https://ordersdl.blob.core.windows.net".into(),
                credential: Credential::EntraId { client_id: None },
                container: Some("dead-letters".into()),
            }
        );
        let t = parse_storage(
            "https://ordersdl.blob.core.windows.net/dead-letters?sv=2022-11-02&sp=rlwd&sig=AbC%3D",
        )
        .unwrap();
        assert_eq!(t.credential.kind(), "shared access signature");
        let t = parse_storage("http://127.0.0.1:10000/devstoreaccount1/dlq?sv=1&sig=x").unwrap();
        assert_eq!(t.endpoint, "http://127.0.0.1:10000/devstoreaccount1");
        assert_eq!(t.container.as_deref(), Some("dlq"));
    }

    #[test]
    fn what_is_refused_says_why_and_never_shows_the_value() {
        for (v, says) in [
            (
                format!("AccountName=ordersdl;AccountKey={KEY}x"),
                "not a base64 key",
            ),
            (
                format!("AccountKey={KEY}"),
                "neither AccountName nor BlobEndpoint",
            ),
            (
                format!("AccountName=Orders_DL;AccountKey={KEY}"),
                "lowercase letters and digits",
            ),
            (
                format!("BlobEndpoint=http://10.0.0.4/acct;AccountKey={KEY}"),
                "not loopback",
            ),
            (
                "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1".into(),
                "never sent over plain http",
            ),
            (
                "https://ordersdl.blob.core.windows.net/".into(),
                "must name one container",
            ),
            (
                "https://ordersdl.blob.core.windows.net/a/b".into(),
                "must name one container",
            ),
            (
                "https://ordersdl.blob.core.windows.net/Dead_Letters".into(),
                "not a container name",
            ),
            (
                "https://ordersdl.blob.core.windows.net/dlq?sv=1".into(),
                "not a shared access signature",
            ),
            (
                format!("https://u:{KEY}@ordersdl.blob.core.windows.net/dlq"),
                "must not hold a user",
            ),
            // A key pasted alone (base64 ends in '=').
            (KEY.to_string(), "neither AccountName nor BlobEndpoint"),
            ("ab3dc0ffee".into(), "has no '='"),
        ] {
            let e = parse_storage(&v).unwrap_err();
            assert!(e.contains(says), "{v}: {e} (expected {says:?})");
            assert!(!e.contains(KEY), "{e}");
        }
    }

    #[test]
    fn debug_never_shows_a_secret() {
        let t = parse_storage(&format!("AccountName=ordersdl;AccountKey={KEY}")).unwrap();
        let shown = format!("{t:?}");
        assert!(
            !shown.contains(KEY) && shown.contains("(not shown)"),
            "{shown}"
        );
        let t =
            parse_storage("https://ordersdl.blob.core.windows.net/dlq?sv=1&sig=SECRETSIG").unwrap();
        assert!(!format!("{t:?}").contains("SECRETSIG"));
    }

    /// Found by fuzzing: a container URL with a connection string pasted
    /// after it was refused with its path, key and all, in the error.
    #[test]
    fn a_refused_container_url_never_shows_what_follows_it() {
        let e = parse_storage("https://acct.blob.core.windows.net/dead-letters;AccountKey=S3cr3t")
            .unwrap_err();
        assert!(!e.contains("S3cr3t"), "{e}");
        assert!(e.contains("container name"), "{e}");
    }

    #[test]
    fn container_names() {
        for ok in ["dead-letters", "abc", "a1-b2"] {
            check_container(ok).unwrap();
        }
        for bad in ["ab", "-ab", "ab-", "a--b", "Dead", "a_b", &"a".repeat(64)] {
            assert!(check_container(bad).is_err(), "{bad}");
        }
    }
}
