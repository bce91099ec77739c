//! The ADO.NET connection string, parsed and checked at start.
//!
//! Why our own parser rather than `tiberius::Config::from_ado_string`: that
//! one cannot say which part of a string is wrong, does not know
//! `Authentication=Active Directory …`, and its lexer rejects values that
//! ADO.NET accepts (an unquoted `=` inside a password, for example). Here a
//! malformed string fails naming the keyword and what was expected, and
//! **never** echoes any part of any value (a missing `;` can glue the
//! password onto a neighbouring value, so every value may hold a secret);
//! `Debug` and `Display` hide the password, and a non-secret value that seems
//! to carry a `Password=`/`Pwd=` setting is refused rather than stored where
//! `Debug`, `Display` or tiberius could show it. The grammar follows ADO.NET: `key=value` pairs separated by
//! `;`, keys case-insensitive, values trimmed, a value may be quoted with
//! `"` or `'` (the quote doubled inside stands for itself), `==` in a key is a
//! literal `=`, and the last occurrence of a key wins.

use std::fmt;

use tiberius::{AuthMethod, EncryptionLevel};

/// What is wrong with a connection string (no values, only names: neither a
/// value nor an unrecognised keyword is ever part of the message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("SQL_CONNECTION_STRING: {0}")]
pub struct ConnStrError(pub String);

fn bad(msg: impl Into<String>) -> ConnStrError {
    ConnStrError(msg.into())
}

/// How the store logs in.
#[derive(Clone, PartialEq, Eq)]
pub enum Auth {
    /// SQL authentication (`User ID` + `Password`).
    SqlPassword {
        /// The login name.
        user: String,
        /// The secret: never shown by `Debug`, `Display` or any error.
        password: String,
    },
    /// `Authentication=Active Directory Managed Identity` (or `… MSI`): an
    /// Entra ID token from the managed identity (App Service / Functions
    /// endpoint, or the Instance Metadata Service); see `aad`.
    ManagedIdentity {
        /// `User ID`: a user-assigned identity's client id; `None`: the
        /// system-assigned identity.
        client_id: Option<String>,
    },
    /// `Authentication=Active Directory Default`: an Entra ID token from the
    /// first of workload identity, managed identity, `az`/`azd` login that
    /// gives one; see `aad`.
    ActiveDirectoryDefault {
        /// `User ID`: the client id of a user-assigned managed identity (or
        /// of the workload identity); `None`: the environment's default.
        client_id: Option<String>,
    },
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Auth::SqlPassword { user, .. } => f
                .debug_struct("SqlPassword")
                .field("user", user)
                .field("password", &"<hidden>")
                .finish(),
            Auth::ManagedIdentity { client_id } => f
                .debug_struct("ManagedIdentity")
                .field("client_id", client_id)
                .finish(),
            Auth::ActiveDirectoryDefault { client_id } => f
                .debug_struct("ActiveDirectoryDefault")
                .field("client_id", client_id)
                .finish(),
        }
    }
}

/// TLS as the string asks for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encrypt {
    /// `Encrypt=True|Yes|Mandatory`, or absent (secure by default, as in
    /// Microsoft.Data.SqlClient since v4): the whole connection is encrypted.
    Required,
    /// `Encrypt=False|No|Optional`, said explicitly: at least the login is
    /// encrypted; everything is if the server insists (Azure).
    Off,
    /// `Encrypt=DANGER_PLAINTEXT`: no TLS at all, for test servers without it.
    Plaintext,
}

/// A parsed, validated SQL Server connection string.
#[derive(Clone, PartialEq, Eq)]
pub struct SqlConnInfo {
    /// Server host (the `tcp:` prefix and any instance name removed).
    pub host: String,
    /// TCP port (1433 when not given).
    pub port: u16,
    /// `Initial Catalog` / `Database`; the login's default when absent.
    pub database: Option<String>,
    /// How to log in.
    pub auth: Auth,
    /// TLS level.
    pub encrypt: Encrypt,
    /// `TrustServerCertificate=True`: accept any server certificate.
    pub trust_server_certificate: bool,
    /// `TrustServerCertificateCA=PATH` (tiberius extension): trust this CA too.
    pub trust_ca: Option<String>,
    pub application_name: Option<String>,
    /// `ApplicationIntent=ReadOnly`.
    pub read_only: bool,
}

impl fmt::Debug for SqlConnInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlConnInfo")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("database", &self.database)
            .field("auth", &self.auth)
            .field("encrypt", &self.encrypt)
            .field("trust_server_certificate", &self.trust_server_certificate)
            .field("trust_ca", &self.trust_ca)
            .field("application_name", &self.application_name)
            .field("read_only", &self.read_only)
            .finish()
    }
}

impl fmt::Display for SqlConnInfo {
    /// `host:port/database (auth kind)`, safe for logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let auth = match &self.auth {
            Auth::SqlPassword { user, .. } => format!("sql login {user}"),
            Auth::ManagedIdentity { .. } => "Entra ID managed identity".to_string(),
            Auth::ActiveDirectoryDefault { .. } => "Entra ID, Active Directory Default".to_string(),
        };
        write!(
            f,
            "{}:{}/{} ({auth})",
            self.host,
            self.port,
            self.database.as_deref().unwrap_or("<default database>")
        )
    }
}

/// The documented name of a recognised keyword, for messages. Unrecognised
/// keywords get `None`: they are never shown, since with an unquoted `;` in
/// a password the "keyword" is a fragment of the password.
fn keyword_name(key: &str) -> Option<&'static str> {
    Some(match key {
        "server" | "data source" | "address" | "addr" | "network address" => "Server",
        "database" | "initial catalog" | "databasename" => "Initial Catalog",
        "user id" | "uid" | "user" | "username" => "User ID",
        "password" | "pwd" => "Password",
        "authentication" => "Authentication",
        "encrypt" => "Encrypt",
        "trustservercertificate" | "trust server certificate" => "TrustServerCertificate",
        "trustservercertificateca" => "TrustServerCertificateCA",
        "application name" | "applicationname" | "app" => "Application Name",
        "applicationintent" | "application intent" => "ApplicationIntent",
        "integrated security" | "integratedsecurity" | "trusted_connection" => {
            "Integrated Security"
        }
        _ => return None,
    })
}

/// "the value of Password" for a recognised keyword, "the value in part N"
/// otherwise (the keyword itself is not shown, see [`keyword_name`]).
fn which_value(key: &str, part: usize) -> String {
    match keyword_name(key) {
        Some(name) => format!("the value of {name} (part {part})"),
        None => format!("the value in part {part}"),
    }
}

/// Whether a value seems to carry a password setting (`Password=…`,
/// `Pwd =…`, any case): what a missing `;` before it leaves behind, as in
/// `Server=srv Pwd=…;`.
fn holds_password_setting(value: &str) -> bool {
    let lower = value.to_ascii_lowercase();
    ["password", "pwd"].iter().any(|word| {
        lower
            .match_indices(word)
            .any(|(at, _)| lower[at + word.len()..].trim_start().starts_with('='))
    })
}

/// A non-secret value that is kept (and shown by `Debug`/`Display`): refused
/// if a password seems glued onto it. The value is not shown.
fn plain_value(name: &str, value: String) -> Result<String, ConnStrError> {
    if holds_password_setting(&value) {
        return Err(bad(format!(
            "{name}: the value seems to contain a Password/Pwd setting; is a ';' missing before it? (value not shown)"
        )));
    }
    Ok(value)
}

/// Keys accepted and deliberately ignored: pooling, timeouts and retry are
/// configured through SQL_POOL_SIZE / SQL_CONNECT_TIMEOUT_SECONDS /
/// SQL_QUERY_TIMEOUT_SECONDS, the rest has no meaning for this client.
const IGNORED: &[&str] = &[
    "persist security info",
    "persistsecurityinfo",
    "multipleactiveresultsets",
    "multiple active result sets",
    "connection timeout",
    "connect timeout",
    "timeout",
    "command timeout",
    "pooling",
    "max pool size",
    "min pool size",
    "connect retry count",
    "connectretrycount",
    "connect retry interval",
    "connectretryinterval",
    "load balance timeout",
    "connection lifetime",
    "packet size",
    "workstation id",
    "wsid",
    "multisubnetfailover",
    "multi subnet failover",
    "transparentnetworkipresolution",
    "transparent network ip resolution",
    "hostnameincertificate",
    "host name in certificate",
    "servercertificate",
    "server certificate",
    "current language",
    "language",
    "enlist",
    "replication",
    "type system version",
    "ipaddresspreference",
    "ip address preference",
    "poolblockingperiod",
    "pool blocking period",
];

/// Split an ADO.NET string into lower-cased keys and raw values.
fn pairs(s: &str) -> Result<Vec<(String, String)>, ConnStrError> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let n = chars.len();
    while i < n {
        // Skip separators and whitespace between pairs.
        while i < n && (chars[i] == ';' || chars[i].is_whitespace()) {
            i += 1;
        }
        if i >= n {
            break;
        }
        // Key: up to a single '=', with "==" standing for a literal '='.
        let mut key = String::new();
        loop {
            if i >= n || chars[i] == ';' {
                // The text is not shown: a stray fragment may be part of a password.
                return Err(bad(format!(
                    "part {} has no '=' (expected KEYWORD=VALUE; quote values that contain ';')",
                    out.len() + 1
                )));
            }
            if chars[i] == '=' {
                if i + 1 < n && chars[i + 1] == '=' {
                    key.push('=');
                    i += 2;
                    continue;
                }
                i += 1;
                break;
            }
            key.push(chars[i]);
            i += 1;
        }
        let key = key.trim().to_ascii_lowercase();
        if key.is_empty() {
            return Err(bad("a pair has an empty keyword before '='"));
        }
        while i < n && chars[i].is_whitespace() && chars[i] != ';' {
            i += 1;
        }
        let mut value = String::new();
        if i < n && (chars[i] == '"' || chars[i] == '\'') {
            let quote = chars[i];
            i += 1;
            let mut closed = false;
            while i < n {
                if chars[i] == quote {
                    if i + 1 < n && chars[i + 1] == quote {
                        value.push(quote);
                        i += 2;
                        continue;
                    }
                    i += 1;
                    closed = true;
                    break;
                }
                value.push(chars[i]);
                i += 1;
            }
            if !closed {
                let quote = if quote == '"' { "double" } else { "single" };
                return Err(bad(format!(
                    "{} opens a {quote} quote that is never closed (value not shown)",
                    which_value(&key, out.len() + 1)
                )));
            }
            while i < n && chars[i].is_whitespace() {
                i += 1;
            }
            if i < n && chars[i] != ';' {
                return Err(bad(format!(
                    "unexpected text after the closing quote of {}; expected ';' (value not shown)",
                    which_value(&key, out.len() + 1)
                )));
            }
        } else {
            while i < n && chars[i] != ';' {
                value.push(chars[i]);
                i += 1;
            }
            value = value.trim().to_string();
        }
        out.push((key, value));
    }
    Ok(out)
}

fn parse_bool(key: &str, v: &str) -> Result<bool, ConnStrError> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" => Ok(true),
        "false" | "no" => Ok(false),
        _ => Err(bad(format!("{key} must be True or False"))),
    }
}

/// `tcp:host,port`, `host,port`, `host`, `(local)`, `.`; named instances
/// need an explicit port (SQL Browser is not used).
fn parse_server(v: &str) -> Result<(String, u16), ConnStrError> {
    let v = v.trim();
    let lower = v.to_ascii_lowercase();
    let v = if lower.starts_with("tcp:") {
        &v[4..]
    } else if lower.starts_with("np:") || lower.starts_with("lpc:") || lower.starts_with("admin:") {
        return Err(bad(
            "Server: only TCP is supported (tcp:HOST,PORT); named pipes, shared memory and the admin connection are not",
        ));
    } else {
        v
    };
    let (host_part, port) = match v.split_once(',') {
        Some((h, p)) => {
            let p = p.trim();
            let port = p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
                bad("Server: the port after the comma is not a number from 1 to 65535 (value not shown)")
            })?;
            (h.trim(), Some(port))
        }
        None => (v, None),
    };
    let host = match host_part.split_once('\\') {
        Some(_) if port.is_none() => {
            return Err(bad(
                "Server: a named instance (HOST\\INSTANCE) needs its TCP port (tcp:HOST,PORT); SQL Browser lookups are not supported (value not shown)",
            ))
        }
        Some((h, _instance)) => h,
        None => host_part,
    };
    let host = match host.trim() {
        "" => return Err(bad("Server has no host name (expected tcp:HOST,PORT)")),
        "." | "(local)" | "(localdb)" => "localhost".to_string(),
        h if h.chars().any(|c| {
            c.is_whitespace() || c.is_control() || "/@=\"'\\,;?#".contains(c)
        }) =>
        {
            return Err(bad(
                "Server: the host name contains a space or a character not allowed in host names (value not shown); expected tcp:HOST,PORT",
            ))
        }
        h => h.to_string(),
    };
    Ok((host, port.unwrap_or(1433)))
}

impl SqlConnInfo {
    /// Parse and check an ADO.NET connection string.
    pub fn parse(s: &str) -> Result<SqlConnInfo, ConnStrError> {
        let mut server = None;
        let mut database = None;
        let mut user = None;
        let mut password = None;
        let mut authentication = None;
        let mut encrypt = Encrypt::Required;
        let mut trust = false;
        let mut trust_ca = None;
        let mut application_name = None;
        let mut read_only = false;
        for (index, (key, value)) in pairs(s)?.into_iter().enumerate() {
            match key.as_str() {
                "server" | "data source" | "address" | "addr" | "network address" => {
                    server = Some(plain_value("Server", value)?)
                }
                "database" | "initial catalog" | "databasename" => {
                    database =
                        Some(plain_value("Initial Catalog", value)?).filter(|v| !v.is_empty())
                }
                "user id" | "uid" | "user" | "username" => {
                    user = Some(plain_value("User ID", value)?).filter(|v| !v.is_empty())
                }
                "password" | "pwd" => password = Some(value),
                "authentication" => authentication = Some(value),
                "encrypt" => encrypt = match value.trim().to_ascii_lowercase().as_str() {
                    "true" | "yes" | "mandatory" => Encrypt::Required,
                    "false" | "no" | "optional" => Encrypt::Off,
                    "danger_plaintext" => Encrypt::Plaintext,
                    "strict" => return Err(bad(
                        "Encrypt=Strict (TDS 8) is not supported by this client; use Encrypt=True",
                    )),
                    _ => {
                        return Err(bad(
                            "Encrypt must be True, False, Mandatory, Optional or DANGER_PLAINTEXT",
                        ))
                    }
                },
                "trustservercertificate" | "trust server certificate" => {
                    trust = parse_bool("TrustServerCertificate", &value)?
                }
                "trustservercertificateca" => {
                    trust_ca = Some(plain_value("TrustServerCertificateCA", value)?)
                        .filter(|v| !v.is_empty())
                }
                "application name" | "applicationname" | "app" => {
                    application_name =
                        Some(plain_value("Application Name", value)?).filter(|v| !v.is_empty())
                }
                "applicationintent" | "application intent" => {
                    read_only = match value.trim().to_ascii_lowercase().as_str() {
                        "readonly" => true,
                        "readwrite" => false,
                        _ => return Err(bad("ApplicationIntent must be ReadWrite or ReadOnly")),
                    }
                }
                "integrated security" | "integratedsecurity" | "trusted_connection" => {
                    let on = matches!(value.trim().to_ascii_lowercase().as_str(), "sspi")
                        || parse_bool("Integrated Security", &value)?;
                    if on {
                        return Err(bad(
                            "Integrated Security (Windows/Kerberos login) is not supported; use a SQL login or Authentication=Active Directory Managed Identity (or Active Directory Default)",
                        ));
                    }
                }
                k if IGNORED.contains(&k) => {
                    if matches!(k, "connection timeout" | "connect timeout" | "timeout")
                        && value.trim().parse::<u32>().is_err()
                    {
                        return Err(bad(format!("{k} must be a whole number of seconds")));
                    }
                }
                _ => {
                    // The keyword is not shown: with an unquoted ';' in a
                    // password, a fragment of it would appear here.
                    log::warn!(
                        "SQL_CONNECTION_STRING: ignoring unknown keyword in part {} (not shown)",
                        index + 1
                    );
                }
            }
        }
        let server = server.ok_or_else(|| {
            bad("Server (or Data Source) is missing; expected Server=tcp:HOST,PORT")
        })?;
        let (host, port) = parse_server(&server)?;
        let auth = match authentication
            .as_deref()
            .map(|a| {
                a.split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
                    .to_ascii_lowercase()
            })
            .as_deref()
        {
            None | Some("") | Some("sql password") | Some("sqlpassword") => {
                let user = user.ok_or_else(|| {
                    bad("User ID is missing (SQL authentication needs User ID and Password, or set Authentication=Active Directory Managed Identity)")
                })?;
                let password = password.ok_or_else(|| {
                    bad("Password is missing (SQL authentication needs User ID and Password)")
                })?;
                Auth::SqlPassword { user, password }
            }
            Some(
                kind @ ("active directory managed identity"
                | "active directory msi"
                | "active directory default"),
            ) => {
                if password.as_deref().is_some_and(|p| !p.is_empty()) {
                    return Err(bad(
                        "Password must not be set with Authentication=Active Directory Managed Identity/Default",
                    ));
                }
                if kind == "active directory default" {
                    Auth::ActiveDirectoryDefault { client_id: user }
                } else {
                    Auth::ManagedIdentity { client_id: user }
                }
            }
            Some(_) => {
                return Err(bad(
                    "Authentication must be Sql Password, Active Directory Managed Identity, Active Directory MSI or Active Directory Default",
                ))
            }
        };
        if trust && trust_ca.is_some() {
            return Err(bad(
                "TrustServerCertificate=True and TrustServerCertificateCA exclude each other",
            ));
        }
        if !matches!(auth, Auth::SqlPassword { .. }) && encrypt == Encrypt::Plaintext {
            return Err(bad(
                "Encrypt=DANGER_PLAINTEXT cannot be used with an access token login",
            ));
        }
        Ok(SqlConnInfo {
            host,
            port,
            database,
            auth,
            encrypt,
            trust_server_certificate: trust,
            trust_ca,
            application_name,
            read_only,
        })
    }

    /// The tiberius configuration for the first server, without credentials
    /// (the pool adds them per connection: an Entra ID token changes).
    pub fn tiberius_config(&self) -> tiberius::Config {
        let mut c = tiberius::Config::new();
        c.host(&self.host);
        c.port(self.port);
        if let Some(db) = &self.database {
            c.database(db);
        }
        c.application_name(self.application_name.as_deref().unwrap_or("order-guard"));
        c.encryption(match self.encrypt {
            Encrypt::Required => EncryptionLevel::Required,
            Encrypt::Off => EncryptionLevel::Off,
            Encrypt::Plaintext => EncryptionLevel::NotSupported,
        });
        if self.trust_server_certificate {
            c.trust_cert();
        } else if let Some(ca) = &self.trust_ca {
            c.trust_cert_ca(ca);
        }
        c.readonly(self.read_only);
        if let Auth::SqlPassword { user, password } = &self.auth {
            c.authentication(AuthMethod::sql_server(user, password));
        }
        c
    }
}
