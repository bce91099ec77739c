//! The ADO.NET connection string parser.

use super::*;

// ------------------------------------------------------ connection strings

const PORTAL: &str = "Server=tcp:myserver.database.windows.net,1433;Initial Catalog=orders;Persist Security Info=False;User ID=appuser;Password=p@ss;w0rd=x;MultipleActiveResultSets=False;Encrypt=True;TrustServerCertificate=False;Connection Timeout=30;";

#[test]
fn azure_portal_form_parses() {
    // The portal's form, with an unquoted ';' in the password fixed by quoting:
    let cs = PORTAL.replace("Password=p@ss;w0rd=x;", "Password=\"p@ss;w0rd=x\";");
    let c = SqlConnInfo::parse(&cs).unwrap();
    assert_eq!(c.host, "myserver.database.windows.net");
    assert_eq!(c.port, 1433);
    assert_eq!(c.database.as_deref(), Some("orders"));
    assert_eq!(c.encrypt, Encrypt::Required);
    assert!(!c.trust_server_certificate);
    assert_eq!(
        c.auth,
        Auth::SqlPassword {
            user: "appuser".into(),
            password: "p@ss;w0rd=x".into()
        }
    );
    assert_eq!(
        c.tiberius_config().get_addr(),
        "myserver.database.windows.net:1433"
    );
}

#[test]
fn server_forms_prefixes_ports_and_defaults() {
    let parse = |s: &str| SqlConnInfo::parse(&format!("{s};User ID=u;Password=p")).unwrap();
    let c = parse("Server=tcp:db.example.net,14330");
    assert_eq!((c.host.as_str(), c.port), ("db.example.net", 14330));
    let c = parse("Data Source=db.example.net");
    assert_eq!((c.host.as_str(), c.port), ("db.example.net", 1433));
    let c = parse("server = TCP:127.0.0.1 , 1533");
    assert_eq!((c.host.as_str(), c.port), ("127.0.0.1", 1533));
    let c = parse("Server=(local)");
    assert_eq!(c.host, "localhost");
    let c = parse("Server=host\\INST,1500");
    assert_eq!((c.host.as_str(), c.port), ("host", 1500));
    assert_eq!(
        c.encrypt,
        Encrypt::Required,
        "absent Encrypt means encrypted, as in Microsoft.Data.SqlClient since v4"
    );
    let c = parse("Server=h;Encrypt=False");
    assert_eq!(c.encrypt, Encrypt::Off, "unencrypted only when said");
    let c = parse("Server=h;Encrypt=yes;TrustServerCertificate=true;ApplicationIntent=ReadOnly;Application Name=og");
    assert_eq!(c.encrypt, Encrypt::Required);
    assert!(c.trust_server_certificate && c.read_only);
    assert_eq!(c.application_name.as_deref(), Some("og"));
}

#[test]
fn quoted_values_keep_separators_and_doubled_quotes() {
    let c = SqlConnInfo::parse(
        "Server=h;User ID='o''brien';Password=\"a;b=\"\"c\"\"\";Database=\"my db\"",
    )
    .unwrap();
    assert_eq!(
        c.auth,
        Auth::SqlPassword {
            user: "o'brien".into(),
            password: "a;b=\"c\"".into()
        }
    );
    assert_eq!(c.database.as_deref(), Some("my db"));
    // An unquoted '=' inside a value is fine, as in ADO.NET.
    let c = SqlConnInfo::parse("Server=h;User ID=u;Password=abc==;").unwrap();
    assert!(matches!(c.auth, Auth::SqlPassword { ref password, .. } if password == "abc=="));
}

#[test]
fn missing_or_malformed_parts_are_named_without_the_password() {
    let secret = "Sup3r$ecretPw";
    // (connection string, what the error must mention, text it must never
    // contain: the password, or whatever the malformed value holds).
    let cases: Vec<(String, &str, &str)> = vec![
        (
            format!("Initial Catalog=o;User ID=u;Password={secret}"),
            "Server",
            secret,
        ),
        (
            format!("Server=tcp:h,1433;Password={secret}"),
            "User ID",
            secret,
        ),
        (
            "Server=tcp:h,1433;User ID=u".to_string(),
            "Password",
            secret,
        ),
        (
            format!("Server=tcp:h,port;User ID=u;Password={secret}"),
            "port",
            secret,
        ),
        (
            format!("Server=tcp:h,99999;User ID=u;Password={secret}"),
            "port",
            secret,
        ),
        (
            format!("Server=tcp:,1433;User ID=u;Password={secret}"),
            "host",
            secret,
        ),
        (
            format!("Server=h\\inst;User ID=u;Password={secret}"),
            "named instance",
            secret,
        ),
        (
            format!("Server=np:h;User ID=u;Password={secret}"),
            "only TCP",
            secret,
        ),
        (
            format!("Server=h;User ID=u;Password=\"{secret}"),
            "quote",
            secret,
        ),
        (
            format!("Server=h;User ID=u;Password='{secret}"),
            "Password",
            secret,
        ),
        (
            format!("Server=h;User ID=u;Password=\"{secret}\"x;Encrypt=True"),
            "closing quote",
            secret,
        ),
        (
            format!("Server=h;User ID=u;Password={secret};Encrypt=maybe"),
            "Encrypt",
            secret,
        ),
        (
            format!("Server=h;User ID=u;Password={secret};Encrypt=Strict"),
            "Strict",
            secret,
        ),
        (
            format!("Server=h;User ID=u;Password={secret};TrustServerCertificate=sure"),
            "TrustServerCertificate",
            secret,
        ),
        (
            format!(
                "Server=h;User ID=u;Password={secret};Authentication=Active Directory Password"
            ),
            "Authentication",
            secret,
        ),
        (
            format!("Server=h;User ID=u;Password={secret};Integrated Security=SSPI"),
            "Integrated Security",
            secret,
        ),
        // An unquoted ';' splits the password: the fragment must not be shown.
        (
            format!("Server=h;User ID=u;Password=ab;{secret};Encrypt=True"),
            "no '='",
            secret,
        ),
        (
            format!("Server=h;User ID=u;Password=ab;{secret}=\"x;Encrypt=True"),
            "part 4",
            secret,
        ),
        // A missing ';' glues the password onto the value before it (the
        // reviewer's two cases, then the same for every kept value).
        (
            "Server=tcp:srv,1433 Password=S3cret!;Initial Catalog=o;User ID=u;".to_string(),
            "Server",
            "S3cret!",
        ),
        (
            "Server=srv Pwd=S3cret!;Initial Catalog=o;User ID=u;".to_string(),
            "Server",
            "S3cret!",
        ),
        (
            "Server=srvPassword=S3cret!;Initial Catalog=o;User ID=u;".to_string(),
            "Server",
            "S3cret!",
        ),
        (
            "Server=srv;Initial Catalog=o PWD = S3cret!;User ID=u;Password=p".to_string(),
            "Initial Catalog",
            "S3cret!",
        ),
        (
            "Server=srv;Initial Catalog=o;User ID=u Password=S3cret!;".to_string(),
            "User ID",
            "S3cret!",
        ),
        (
            "Server=srv;Authentication=Active Directory Default;User ID=c Pwd=S3cret!".to_string(),
            "User ID",
            "S3cret!",
        ),
        (
            "Server=srv;User ID=u;Password=p;Application Name=og Password=S3cret!".to_string(),
            "Application Name",
            "S3cret!",
        ),
        (
            "Server=srv;User ID=u;Password=p;TrustServerCertificateCA=ca.pem Pwd=S3cret!"
                .to_string(),
            "TrustServerCertificateCA",
            "S3cret!",
        ),
        // Malformed Server values holding a secret without any keyword:
        // neither the port, the host nor the instance text is shown.
        (
            format!("Server=tcp:srv,{secret};User ID=u;Password=p"),
            "port",
            secret,
        ),
        (
            format!("Server=tcp:srv,1433 {secret};User ID=u;Password=p"),
            "port",
            secret,
        ),
        (
            format!("Server=srv {secret};User ID=u;Password=p"),
            "host",
            secret,
        ),
        (
            format!("Server=tcp:{secret}@srv,1433;User ID=u;Password=p"),
            "host",
            secret,
        ),
        (
            format!("Server={secret}\\inst;User ID=u;Password=p"),
            "named instance",
            secret,
        ),
    ];
    for (cs, expected, hidden) in cases {
        let e = SqlConnInfo::parse(&cs).unwrap_err().to_string();
        assert!(e.starts_with("SQL_CONNECTION_STRING: "), "{e}");
        assert!(
            e.contains(expected),
            "{cs:?} gave {e:?}, expected it to mention {expected:?}"
        );
        // Not the text, and no piece of it either (any 4 characters in a row).
        let chars: Vec<char> = hidden.chars().collect();
        for piece in chars.windows(4.min(chars.len())) {
            let piece: String = piece.iter().collect();
            assert!(
                !e.contains(&piece),
                "{cs:?}: {piece:?} of the hidden text echoed in {e:?}"
            );
        }
        assert!(!e.contains("ab;"), "password fragment echoed: {e}");
        // Nor through the Debug form of the error.
        assert!(
            !format!("{:?}", SqlConnInfo::parse(&cs).unwrap_err()).contains(hidden),
            "{cs:?}"
        );
    }
}

#[test]
fn values_with_an_equals_sign_but_no_password_setting_still_parse() {
    let c = SqlConnInfo::parse(
        "Server=h;User ID=u;Password=p;Application Name=a=b;Initial Catalog=\"db;x\"",
    )
    .unwrap();
    assert_eq!(c.application_name.as_deref(), Some("a=b"));
    assert_eq!(c.database.as_deref(), Some("db;x"));
    // A password that itself contains "Password=" is the password's business.
    let c = SqlConnInfo::parse("Server=h;User ID=u;Password=\"x;Password=y\"").unwrap();
    assert!(matches!(c.auth, Auth::SqlPassword { ref password, .. } if password == "x;Password=y"));
}

#[test]
fn debug_and_display_never_show_the_password() {
    let c = SqlConnInfo::parse("Server=h,1;Database=d;User ID=u;Password=TopSecret#1").unwrap();
    for shown in [format!("{c:?}"), format!("{c}"), format!("{:?}", c.auth)] {
        assert!(!shown.contains("TopSecret"), "{shown}");
    }
    assert!(format!("{c}").contains("h:1/d"));
    let e = SqlServerStore::connect(
        "Server=h;User ID=u;Password=TopSecret#1;Encrypt=bogus",
        &settings(1),
    )
    .err()
    .unwrap();
    assert!(!format!("{e:?} {e}").contains("TopSecret"));
}

#[test]
fn managed_identity_strings() {
    let c = SqlConnInfo::parse(
        "Server=tcp:s.database.windows.net,1433;Initial Catalog=o;Authentication=Active Directory Managed Identity;Encrypt=True",
    )
    .unwrap();
    assert_eq!(c.auth, Auth::ManagedIdentity { client_id: None });
    let c = SqlConnInfo::parse("Server=s;Authentication=active directory msi;User ID=uai-client")
        .unwrap();
    assert_eq!(
        c.auth,
        Auth::ManagedIdentity {
            client_id: Some("uai-client".into())
        }
    );
    let c = SqlConnInfo::parse(
        "Server=s;Authentication=\"Active Directory Default\";User ID=1b2c3d4e-client",
    )
    .unwrap();
    assert_eq!(
        c.auth,
        Auth::ActiveDirectoryDefault {
            client_id: Some("1b2c3d4e-client".into())
        }
    );
    assert!(c.to_string().contains("Active Directory Default"), "{c}");
    for kind in ["Managed Identity", "Default"] {
        let e = SqlConnInfo::parse(&format!(
            "Server=s;Authentication=Active Directory {kind};Password=x"
        ))
        .unwrap_err();
        assert!(e.to_string().contains("Password must not be set"), "{e}");
        let e = SqlConnInfo::parse(&format!(
            "Server=s;Authentication=Active Directory {kind};Encrypt=DANGER_PLAINTEXT"
        ))
        .unwrap_err();
        assert!(e.to_string().contains("access token"), "{e}");
    }
}
