//! The SQL Server store's parts that can be checked without a database:
//! every T-SQL statement parses (sqlparser, MsSqlDialect); errors classify by
//! their real numbers, produced by tiberius itself from a login answered by a
//! minimal TDS endpoint on loopback; the connection string parser; Azure's
//! redirect; Entra ID tokens through `azure_identity`'s credentials against
//! a local HTTP endpoint answering as the App Service identity endpoint
//! does, up to the LOGIN7 packet, and the Default chain's logic.
//!
//! The store's behaviour against a real server is the conformance suite
//! (`tests/store_conformance.rs`, with `ORDER_GUARD_TEST_MSSQL`).

use std::collections::HashMap;
use std::ffi::OsString;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use azure_core::credentials::{AccessToken, TokenCredential, TokenRequestOptions};
use azure_core::time::OffsetDateTime;
use order_guard::order::Order;
use order_guard::store::sqlserver::aad::{ChainCredential, ChainLink, TokenSource, SQL_SCOPE};
use order_guard::store::sqlserver::classify;
use order_guard::store::sqlserver::connstr::{Auth, Encrypt, SqlConnInfo};
use order_guard::store::sqlserver::pool::{
    open_following_redirect, ConnectError, SqlConnectionManager,
};
use order_guard::store::sqlserver::sql;
use order_guard::store::sqlserver::SqlServerSettings;
use order_guard::store::{OrderStore, SqlServerStore, StoreError};
use serde_json::json;
use sqlparser::dialect::MsSqlDialect;
use sqlparser::parser::Parser;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

// ---------------------------------------------------------------- T-SQL

/// A batch parses as exactly the statements it separates with `;` (most are
/// one statement; a few end a transaction and read `@@TRANCOUNT` in one
/// round trip).
fn parse_one(what: &str, statement: &str) {
    let declared = statement.trim_end_matches(';').matches(';').count() + 1;
    parse_as(what, statement, declared);
}

fn parse_as(what: &str, statement: &str, declared: usize) {
    match Parser::parse_sql(&MsSqlDialect {}, statement) {
        Ok(parsed) => assert_eq!(
            parsed.len(),
            declared,
            "{what} must be exactly {declared} statement(s), parsed {}: {statement}",
            parsed.len()
        ),
        Err(e) => panic!("{what} does not parse as T-SQL ({e}):\n{statement}"),
    }
}

#[test]
fn every_statement_parses_as_tsql() {
    assert!(sql::ALL.len() >= 18, "sql::ALL lost statements");
    for (i, statement) in sql::ALL.iter().enumerate() {
        parse_one(&format!("sql::ALL[{i}]"), statement);
    }
}

#[test]
fn every_schema_batch_parses_as_tsql() {
    let batches = sql::schema_batches();
    // SchemaVersion, Orders, its unique index, Positions, RejectedEvents, two
    // indexes, StoreIdentity and its row, the version row: a GO lost or
    // added shows here.
    assert_eq!(batches.len(), 10, "{batches:#?}");
    for (i, batch) in batches.iter().enumerate() {
        parse_as(&format!("schema batch {i}"), batch, 1);
    }
    let schema = sql::SCHEMA.to_ascii_uppercase();
    for table in ["ORDERS", "POSITIONS", "REJECTEDEVENTS", "SCHEMAVERSION"] {
        assert!(
            schema.contains(&format!("IF OBJECT_ID(N'DBO.{table}', N'U') IS NULL")),
            "{table} is not created idempotently"
        );
    }
    assert!(schema.contains("CREATE UNIQUE INDEX UX_ORDERS_ORDERID ON DBO.ORDERS (ORDERID)"));
    assert!(schema.contains("CREATE UNIQUE INDEX UX_REJECTEDEVENTS_EVENTHASH"));
    // Orders keep DECIMAL(28,10) (each order is at most 10^18); a position,
    // the sum of many orders, is DECIMAL(38,10) so the sum cannot overflow
    // (error 8115).
    let batch_of = |table: &str| {
        batches
            .iter()
            .find(|b| {
                b.to_ascii_uppercase()
                    .contains(&format!("CREATE TABLE DBO.{table} ("))
            })
            .unwrap_or_else(|| panic!("no batch creates {table}"))
            .to_ascii_uppercase()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let orders = batch_of("ORDERS");
    assert!(
        orders.contains("QUANTITY DECIMAL(28, 10) NOT NULL"),
        "{orders}"
    );
    assert!(
        orders.contains("LIMITPRICE DECIMAL(28, 10) NULL"),
        "{orders}"
    );
    let positions = batch_of("POSITIONS");
    assert!(
        positions.contains("QUANTITY DECIMAL(38, 10) NOT NULL"),
        "{positions}"
    );
}

/// Constructs outside the portable subset (docs/protocol.md 7.4).
#[test]
fn statements_stay_in_the_portable_subset() {
    let forbidden = [
        "MERGE ",
        "CREATE OR ALTER",
        "SERIALIZABLE",
        "REPEATABLE READ",
        "ROWVERSION",
        "SYS.DM_",
        " OUTPUT ",
        "HOLDLOCK",
    ];
    let schema_code: String = sql::SCHEMA
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    for statement in sql::ALL.iter().copied().chain([schema_code.as_str()]) {
        let upper = statement.to_ascii_uppercase();
        for f in forbidden {
            assert!(!upper.contains(f), "{f:?} in {statement}");
        }
    }
}

// ------------------------------------------------- a minimal TDS endpoint

/// How the fake endpoint answers a LOGIN7.
#[derive(Clone)]
enum LoginAnswer {
    /// An ERROR token with this number and text, then DONE.
    Error(u32, &'static str),
    /// An ENVCHANGE routing token to this host and port, then DONE.
    Route(String, u16),
    /// DONE: logged in.
    Accept,
    /// No answer at all: the login hangs until the client gives up.
    Never,
}

/// A loopback endpoint speaking just enough TDS for a login: PRELOGIN (no
/// encryption), one answer to LOGIN7, then a bare DONE for every request.
/// It keeps every login packet.
struct FakeTds {
    port: u16,
    logins: Arc<Mutex<Vec<Vec<u8>>>>,
}

async fn read_message(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut payload = Vec::new();
    loop {
        let mut header = [0u8; 8];
        s.read_exact(&mut header).await.ok()?;
        let len = u16::from_be_bytes([header[2], header[3]]) as usize;
        let mut body = vec![0u8; len.checked_sub(8)?];
        s.read_exact(&mut body).await.ok()?;
        payload.extend_from_slice(&body);
        if header[1] & 0x01 == 0x01 {
            return Some(payload);
        }
    }
}

fn packet(payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() + 8) as u16;
    let mut p = vec![0x04, 0x01];
    p.extend_from_slice(&len.to_be_bytes());
    p.extend_from_slice(&[0, 0, 1, 0]);
    p.extend_from_slice(payload);
    p
}

fn utf16(s: &str) -> Vec<u8> {
    s.encode_utf16().flat_map(u16::to_le_bytes).collect()
}

fn done(status: u16) -> Vec<u8> {
    let mut t = vec![0xFD];
    t.extend_from_slice(&status.to_le_bytes());
    t.extend_from_slice(&0u16.to_le_bytes());
    t.extend_from_slice(&0u64.to_le_bytes());
    t
}

fn login_answer(answer: &LoginAnswer) -> Vec<u8> {
    match answer {
        LoginAnswer::Error(number, message) => {
            let (msg, server) = (utf16(message), utf16("fake"));
            let mut body = Vec::new();
            body.extend_from_slice(&number.to_le_bytes());
            body.extend_from_slice(&[1, 14]); // state, class
            body.extend_from_slice(&(message.encode_utf16().count() as u16).to_le_bytes());
            body.extend_from_slice(&msg);
            body.push(4);
            body.extend_from_slice(&server);
            body.push(0); // no procedure
            body.extend_from_slice(&1u32.to_le_bytes()); // line
            let mut t = vec![0xAA];
            t.extend_from_slice(&(body.len() as u16).to_le_bytes());
            t.extend_from_slice(&body);
            t.extend_from_slice(&done(0x0002));
            t
        }
        LoginAnswer::Route(host, port) => {
            let host16 = utf16(host);
            let mut value = vec![0u8]; // protocol: TCP
            value.extend_from_slice(&port.to_le_bytes());
            value.extend_from_slice(&(host.encode_utf16().count() as u16).to_le_bytes());
            value.extend_from_slice(&host16);
            let mut body = vec![20u8]; // ENVCHANGE type: routing
            body.extend_from_slice(&(value.len() as u16).to_le_bytes());
            body.extend_from_slice(&value);
            body.extend_from_slice(&0u16.to_le_bytes()); // old value: none
            let mut t = vec![0xE3];
            t.extend_from_slice(&(body.len() as u16).to_le_bytes());
            t.extend_from_slice(&body);
            t.extend_from_slice(&done(0));
            t
        }
        LoginAnswer::Accept => done(0),
        LoginAnswer::Never => unreachable!("a hanging login is never answered"),
    }
}

impl FakeTds {
    async fn start(answer: LoginAnswer) -> FakeTds {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let logins = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&logins);
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let (answer, kept) = (answer.clone(), Arc::clone(&kept));
                tokio::spawn(async move {
                    if read_message(&mut s).await.is_none() {
                        return;
                    }
                    // PRELOGIN answer: version 15.0.2000, encryption NOT_SUP.
                    let mut pre = vec![0x00, 0, 11, 0, 6, 0x01, 0, 17, 0, 1, 0xFF];
                    pre.extend_from_slice(&[15, 0, 0x07, 0xD0, 0, 0, 0x02]);
                    s.write_all(&packet(&pre)).await.unwrap();
                    let Some(login) = read_message(&mut s).await else {
                        return;
                    };
                    kept.lock().unwrap().push(login);
                    if matches!(answer, LoginAnswer::Never) {
                        // Hold the login until the client goes away.
                        while read_message(&mut s).await.is_some() {}
                        return;
                    }
                    s.write_all(&packet(&login_answer(&answer))).await.unwrap();
                    // Logged in: answer every later request with a bare DONE,
                    // until the client goes away.
                    while read_message(&mut s).await.is_some() {
                        if s.write_all(&packet(&done(0))).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        FakeTds { port, logins }
    }

    fn config(&self) -> tiberius::Config {
        plaintext(self.port).tiberius_config()
    }

    fn login_count(&self) -> usize {
        self.logins.lock().unwrap().len()
    }
}

fn plaintext(port: u16) -> SqlConnInfo {
    SqlConnInfo::parse(&format!(
        "Server=tcp:127.0.0.1,{port};Initial Catalog=orders;User ID=app;Password=S3cret!pw;Encrypt=DANGER_PLAINTEXT"
    ))
    .unwrap()
}

async fn server_error(number: u32, message: &'static str) -> tiberius::error::Error {
    let fake = FakeTds::start(LoginAnswer::Error(number, message)).await;
    match open_following_redirect(fake.config()).await {
        Err(e) => e,
        Ok(_) => panic!("login answered with error {number} succeeded"),
    }
}

// --------------------------------------------------- error classification

#[tokio::test]
async fn unique_violations_are_recognised_by_number_not_text() {
    for (number, text) in [
        (2627, "Violation of PRIMARY KEY constraint 'PK_Positions'."),
        (2601, "Cannot insert duplicate key row in object 'dbo.Orders' with unique index 'UX_Orders_OrderId'."),
        (2627, "duplicate key value violates unique constraint \"ux_orders_orderid\""),
    ] {
        let e = server_error(number, text).await;
        assert_eq!(e.code(), Some(number));
        assert!(classify::is_unique_violation(&e), "{number}");
    }
    let other = server_error(
        547,
        "The INSERT statement conflicted with the CHECK constraint",
    )
    .await;
    assert!(!classify::is_unique_violation(&other));
}

#[tokio::test]
async fn transient_numbers_ask_for_a_retry() {
    for number in [
        1205, 1222, 40613, 40501, 40197, 49918, 49919, 49920, 4060, 4221, 615, 926, 10928, 10929,
        233, 997, 1204,
    ] {
        let e = server_error(number, "try again").await;
        assert_eq!(e.code(), Some(number));
        match classify::classify("accept", &e) {
            StoreError::Transient(m) => assert!(m.contains(&number.to_string()), "{m}"),
            other => panic!("{number} classified as {other:?}"),
        }
    }
}

#[tokio::test]
async fn other_server_errors_are_permanent_with_the_server_text() {
    for (number, text) in [
        (18456, "Login failed for user 'app'."),
        (40544, "The database has reached its size quota."),
        (208, "Invalid object name 'dbo.Orders'."),
        (33557097, "feature not supported by this engine"),
    ] {
        let e = server_error(number, text).await;
        match classify::classify("accept", &e) {
            StoreError::Permanent(m) => {
                assert!(m.contains(&number.to_string()) && m.contains(text), "{m}")
            }
            other => panic!("{number} classified as {other:?}"),
        }
    }
}

#[test]
fn dropped_connections_and_timeouts_are_transient() {
    let reset: tiberius::error::Error = std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "connection reset by peer",
    )
    .into();
    assert!(classify::is_connection_lost(&reset));
    assert!(matches!(
        classify::classify("execute", &reset),
        StoreError::Transient(_)
    ));
    let eof: tiberius::error::Error =
        std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed").into();
    assert!(matches!(
        classify::classify("execute", &eof),
        StoreError::Transient(_)
    ));
    assert!(matches!(
        classify::query_timeout("execute", Duration::from_secs(8)),
        StoreError::Transient(_)
    ));
    let pool = classify::pool_timeout(
        "accept",
        Duration::from_secs(10),
        Some("Login failed (18456)".into()),
    );
    match pool {
        StoreError::Transient(m) => assert!(m.contains("18456"), "{m}"),
        other => panic!("{other:?}"),
    }
    let conversion = tiberius::error::Error::Conversion("bad value".into());
    assert!(matches!(
        classify::classify("read", &conversion),
        StoreError::Permanent(_)
    ));
}

fn settings(connect_secs: u64) -> SqlServerSettings {
    SqlServerSettings {
        connect_timeout: Duration::from_secs(connect_secs),
        query_timeout: Duration::from_secs(2),
        pool_size: 2,
    }
}

fn order() -> Order {
    Order::from_data(&json!({
        "orderId": "o-1", "accountId": "a-1", "side": "buy", "symbol": "MSFT", "quantity": "1"
    }))
    .unwrap()
}

#[tokio::test]
async fn an_unreachable_server_is_a_transient_failure_within_the_connect_timeout() {
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port(); // listener dropped: nobody listens there now
    let cs = format!("Server=tcp:127.0.0.1,{port};Database=d;User ID=u;Password=Hunter2!x;Encrypt=DANGER_PLAINTEXT");
    let store = SqlServerStore::connect(&cs, &settings(1)).unwrap();
    let started = std::time::Instant::now();
    let e = store.migrate().await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    match e {
        StoreError::Transient(m) => {
            assert!(m.contains("no SQL Server connection"), "{m}");
            assert!(!m.contains("Hunter2"), "{m}");
        }
        other => panic!("{other:?}"),
    }
}

/// Logins are paced: however many callers wait for a connection, at most
/// `LOGINS_AT_ONCE` logins are in flight per pool, and a caller still gives
/// up at the connect timeout. Without this an overloaded server gets one
/// login per waiting caller, each abandoned and started again (a
/// reconnection storm).
#[tokio::test]
async fn logins_are_paced_whatever_the_number_of_waiting_callers() {
    use order_guard::store::sqlserver::pool::LOGINS_AT_ONCE;
    let fake = FakeTds::start(LoginAnswer::Never).await;
    let cs = format!(
        "Server=tcp:127.0.0.1,{};Database=d;User ID=u;Password=pw;Encrypt=DANGER_PLAINTEXT",
        fake.port
    );
    let store = SqlServerStore::connect(
        &cs,
        &SqlServerSettings {
            connect_timeout: Duration::from_secs(1),
            query_timeout: Duration::from_secs(2),
            pool_size: 8,
        },
    )
    .unwrap();
    let started = std::time::Instant::now();
    let callers = (0..8).map(|_| store.migrate());
    for result in futures::future::join_all(callers).await {
        match result {
            Err(StoreError::Transient(m)) => assert!(m.contains("no SQL Server connection"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        fake.login_count(),
        LOGINS_AT_ONCE,
        "logins started for 8 waiting callers"
    );
}

#[tokio::test]
async fn a_refused_login_explains_the_pool_timeout() {
    let fake = FakeTds::start(LoginAnswer::Error(18456, "Login failed for user 'u'.")).await;
    let cs = format!(
        "Server=tcp:127.0.0.1,{};Database=d;User ID=u;Password=Hunter2!x;Encrypt=DANGER_PLAINTEXT",
        fake.port
    );
    let store = SqlServerStore::connect(&cs, &settings(1)).unwrap();
    let e = store.migrate().await.unwrap_err();
    let m = e.to_string();
    assert!(m.contains("18456") && m.contains("Login failed"), "{m}");
    assert!(!m.contains("Hunter2"), "{m}");
    assert!(fake.login_count() >= 1);
}

#[tokio::test]
async fn nothing_is_read_or_written_before_the_schema_is_verified() {
    // The fake accepts logins but is no database: `migrate` cannot succeed,
    // so every other call must refuse (retry) without sending anything.
    let fake = FakeTds::start(LoginAnswer::Accept).await;
    let cs = format!(
        "Server=tcp:127.0.0.1,{};Database=d;User ID=u;Password=pw;Encrypt=DANGER_PLAINTEXT",
        fake.port
    );
    let store = SqlServerStore::connect(&cs, &settings(2)).unwrap();
    let e = store.migrate().await.unwrap_err();
    assert!(e.to_string().contains("migrate"), "{e}");
    let logins = fake.login_count();
    for e in [
        store.accept(&order(), "e1").await.unwrap_err(),
        store.execute(&order(), "e", "{}").await.unwrap_err(),
        store.order("o-1").await.unwrap_err(),
    ] {
        match e {
            StoreError::Transient(m) => assert!(m.contains("schema is not verified"), "{m}"),
            other => panic!("want a transient refusal, got {other:?}"),
        }
    }
    assert_eq!(
        fake.login_count(),
        logins,
        "no connection used for a refused call"
    );
}

// ---------------------------------------------------------------- redirect

#[tokio::test]
async fn azure_redirect_is_followed_with_a_new_login() {
    let node = FakeTds::start(LoginAnswer::Accept).await;
    let gateway = FakeTds::start(LoginAnswer::Route("127.0.0.1".into(), node.port)).await;
    let client = open_following_redirect(gateway.config()).await;
    assert!(client.is_ok(), "{:?}", client.err());
    assert_eq!(gateway.login_count(), 1);
    assert_eq!(node.login_count(), 1, "the login is repeated at the node");

    // A node that redirects again is an error, not a loop.
    let again = FakeTds::start(LoginAnswer::Route("127.0.0.1".into(), node.port)).await;
    let first = FakeTds::start(LoginAnswer::Route("127.0.0.1".into(), again.port)).await;
    let e = open_following_redirect(first.config()).await.err().unwrap();
    assert!(e.to_string().contains("redirected twice"), "{e}");
}

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

// ------------------------------------------------------- Entra ID tokens
//
// Through `azure_identity`'s own credentials, against a local endpoint that
// answers as the App Service / Functions identity endpoint does. The
// credentials read IDENTITY_ENDPOINT when built and IDENTITY_HEADER on every
// request, so a test that sets them holds [`IdentityEnv`] throughout. No
// test lets a credential reach the Instance Metadata Service or run `az`:
// with IDENTITY_ENDPOINT set neither managed identity nor the Default chain
// uses the Instance Metadata Service, and the endpoint answers before the
// chain would get to the developer tools.

const HEADER_SECRET: &str = "hdr-secret-0123";

/// Serializes the tests that change the process environment.
static ENV_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The identity variables as App Service sets them, every other managed
/// identity or workload identity variable removed, and loopback exempt from
/// any proxy; all restored on drop.
struct IdentityEnv {
    saved: Vec<(&'static str, Option<OsString>)>,
    _lock: tokio::sync::MutexGuard<'static, ()>,
}

impl IdentityEnv {
    async fn set(endpoint: Option<&str>, header: Option<&str>) -> IdentityEnv {
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
struct TokenRequest {
    resource: Option<String>,
    api_version: Option<String>,
    client_id: Option<String>,
}

/// A loopback endpoint answering as the App Service identity endpoint does
/// (GET, `X-IDENTITY-HEADER`, `resource`, `api-version=2019-08-01`, optional
/// `client_id`; `expires_on` as a string of epoch seconds). Tokens are
/// numbered and expire `lifetime` seconds from when they are handed out; a
/// wrong header gets 401 without a token.
struct IdentityEndpoint {
    url: String,
    requests: Arc<Mutex<Vec<TokenRequest>>>,
    refused: Arc<AtomicUsize>,
    lifetime: Arc<AtomicUsize>,
}

impl IdentityEndpoint {
    fn tokens_handed_out(&self) -> usize {
        self.requests.lock().unwrap().len()
    }
}

async fn identity_endpoint(lifetime_secs: usize) -> IdentityEndpoint {
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
                    "access_token": format!("token-{n}"),
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

/// A fake TDS server and a connection manager logging in to it with `tokens`.
async fn token_login(tokens: TokenSource) -> (FakeTds, SqlConnectionManager) {
    let fake = FakeTds::start(LoginAnswer::Accept).await;
    let mut config = tiberius::Config::new();
    config.host("127.0.0.1");
    config.port(fake.port);
    config.encryption(tiberius::EncryptionLevel::NotSupported);
    let manager = SqlConnectionManager::new(config, Some(Arc::new(tokens)), Duration::from_secs(5));
    (fake, manager)
}

fn carries(login: &[u8], token: &str) -> bool {
    let token = utf16(token);
    login.windows(token.len()).any(|w| w == token.as_slice())
}

#[tokio::test]
async fn the_token_is_what_the_login_carries() {
    let ep = identity_endpoint(3600).await;
    let _env = IdentityEnv::set(Some(&ep.url), Some(HEADER_SECRET)).await;
    let cs = "Server=tcp:127.0.0.1,1;Authentication=Active Directory Managed Identity;User ID=user-assigned-id";
    let info = SqlConnInfo::parse(cs).unwrap();
    let tokens = TokenSource::for_auth(&info.auth, Duration::from_secs(5))
        .unwrap()
        .expect("a token source for a managed identity");
    assert!(
        tokens.description().contains("IDENTITY_ENDPOINT"),
        "{}",
        tokens.description()
    );
    let (fake, manager) = token_login(tokens).await;
    let conn = bb8::ManageConnection::connect(&manager).await;
    assert!(conn.is_ok(), "{:?}", conn.err());
    let mut conn = conn.unwrap();
    bb8::ManageConnection::is_valid(&manager, &mut conn)
        .await
        .unwrap();
    assert!(!bb8::ManageConnection::has_broken(&manager, &mut conn));
    let login = fake.logins.lock().unwrap()[0].clone();
    assert!(
        carries(&login, "token-1"),
        "the LOGIN7 packet does not carry the managed-identity token"
    );
    // What azure_identity asked the endpoint: the Azure SQL resource (the
    // scope without "/.default"), the App Service API version, the
    // user-assigned identity's client id.
    assert_eq!(
        ep.requests.lock().unwrap().as_slice(),
        &[TokenRequest {
            resource: Some("https://database.windows.net".into()),
            api_version: Some("2019-08-01".into()),
            client_id: Some("user-assigned-id".into()),
        }]
    );
}

#[tokio::test]
async fn the_system_identity_sends_no_client_id() {
    let ep = identity_endpoint(3600).await;
    let _env = IdentityEnv::set(Some(&ep.url), Some(HEADER_SECRET)).await;
    let tokens = TokenSource::managed_identity(None, Duration::from_secs(5)).unwrap();
    assert_eq!(tokens.token().await.unwrap(), "token-1");
    assert_eq!(ep.requests.lock().unwrap()[0].client_id, None);
}

#[tokio::test]
async fn tokens_are_reused_while_valid_and_refreshed_near_expiry() {
    // Valid for an hour: two logins, one request to the endpoint.
    let ep = identity_endpoint(3600).await;
    let _env = IdentityEnv::set(Some(&ep.url), Some(HEADER_SECRET)).await;
    let tokens = TokenSource::managed_identity(None, Duration::from_secs(5)).unwrap();
    let (fake, manager) = token_login(tokens).await;
    for _ in 0..2 {
        let conn = bb8::ManageConnection::connect(&manager).await;
        assert!(conn.is_ok(), "{:?}", conn.err());
    }
    assert_eq!(fake.login_count(), 2);
    assert_eq!(ep.tokens_handed_out(), 1, "the token is fetched once");
    for login in fake.logins.lock().unwrap().iter() {
        assert!(carries(login, "token-1"));
    }
    // Valid for 2 minutes, less than the 5-minute refresh margin: every
    // token wanted is a fresh one, though the last has not expired yet.
    ep.lifetime.store(120, Ordering::SeqCst);
    let tokens = TokenSource::managed_identity(None, Duration::from_secs(5)).unwrap();
    assert_eq!(tokens.token().await.unwrap(), "token-2");
    assert_eq!(tokens.token().await.unwrap(), "token-3");
    assert_eq!(ep.tokens_handed_out(), 3);
}

#[tokio::test]
async fn a_wrong_header_secret_is_refused_and_not_echoed() {
    let ep = identity_endpoint(3600).await;
    let secret = "wrong-secret-999";
    let _env = IdentityEnv::set(Some(&ep.url), Some(secret)).await;
    let tokens = TokenSource::managed_identity(None, Duration::from_secs(5)).unwrap();
    assert!(!format!("{tokens:?}").contains(secret));
    let e = tokens.token().await.unwrap_err().to_string();
    assert!(e.contains("401"), "{e}");
    assert!(e.contains("ManagedIdentityCredential"), "{e}");
    assert!(e.contains("az login"), "what to do locally: {e}");
    assert!(!e.contains(secret), "{e}");
    assert!(ep.refused.load(Ordering::SeqCst) >= 1);
    assert_eq!(ep.tokens_handed_out(), 0);
    // Through the pool: the connect error, which is logged and kept for
    // the pool timeout's message, does not hold it either.
    let (fake, manager) = token_login(tokens).await;
    let e = bb8::ManageConnection::connect(&manager)
        .await
        .err()
        .unwrap();
    assert!(matches!(e, ConnectError::Token(_)), "{e:?}");
    assert!(!format!("{e} {e:?}").contains(secret), "{e}");
    assert_eq!(fake.login_count(), 0, "no login without a token");
}

#[tokio::test]
async fn an_identity_endpoint_without_its_header_is_refused_at_start() {
    // Without IDENTITY_HEADER the crate would turn to the Instance Metadata
    // Service; the store refuses before anything is sent.
    let _env = IdentityEnv::set(Some("http://127.0.0.1:9/msi/token"), None).await;
    for kind in ["Managed Identity", "Default"] {
        let cs =
            format!("Server=tcp:127.0.0.1,1;Authentication=Active Directory {kind};Encrypt=False");
        match SqlServerStore::connect(&cs, &settings(1)).err() {
            Some(StoreError::Permanent(m)) => assert!(m.contains("IDENTITY_HEADER"), "{m}"),
            other => panic!("{kind}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn default_uses_the_app_service_identity_when_it_is_there() {
    let ep = identity_endpoint(3600).await;
    let _env = IdentityEnv::set(Some(&ep.url), Some(HEADER_SECRET)).await;
    let info = SqlConnInfo::parse(
        "Server=tcp:127.0.0.1,1;Authentication=Active Directory Default;User ID=uai-client",
    )
    .unwrap();
    let tokens = TokenSource::for_auth(&info.auth, Duration::from_secs(5))
        .unwrap()
        .unwrap();
    let shown = tokens.description().to_string();
    assert!(shown.contains("App Service"), "{shown}");
    assert!(
        !shown.contains("Instance Metadata"),
        "with IDENTITY_ENDPOINT set, the chain has no IMDS link: {shown}"
    );
    assert!(!shown.contains("WorkloadIdentity"), "{shown}");
    let (fake, manager) = token_login(tokens).await;
    let conn = bb8::ManageConnection::connect(&manager).await;
    assert!(conn.is_ok(), "{:?}", conn.err());
    assert!(carries(&fake.logins.lock().unwrap()[0], "token-1"));
    assert_eq!(
        ep.requests.lock().unwrap()[0].client_id.as_deref(),
        Some("uai-client")
    );
}

/// Every log record of this test binary, at every level (the azure crates
/// log through `tracing`, which forwards to `log` here).
static LOGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        let line = format!("{} {}: {}", record.level(), record.target(), record.args());
        LOGS.lock().unwrap_or_else(|p| p.into_inner()).push(line);
    }
    fn flush(&self) {}
}

fn capture_logs() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        log::set_logger(&Capture).unwrap();
        log::set_max_level(log::LevelFilter::Trace);
    });
}

#[tokio::test]
async fn no_log_line_holds_the_token_or_the_header_secret() {
    capture_logs();
    let ep = identity_endpoint(3600).await;
    let _env = IdentityEnv::set(Some(&ep.url), Some(HEADER_SECRET)).await;
    let tokens = TokenSource::managed_identity(Some("uai".into()), Duration::from_secs(5)).unwrap();
    let (fake, manager) = token_login(tokens).await;
    let conn = bb8::ManageConnection::connect(&manager).await;
    assert!(conn.is_ok(), "{:?}", conn.err());
    assert!(carries(&fake.logins.lock().unwrap()[0], "token-1"));
    let logs = LOGS.lock().unwrap().clone();
    assert!(
        logs.iter().any(|l| l.contains("azure")),
        "the azure crates' records are captured: {logs:#?}"
    );
    for line in &logs {
        assert!(!line.contains(HEADER_SECRET), "{line}");
        assert!(!line.contains("token-1"), "{line}");
    }
}

/// A credential answering from a script: `Ok(secs)` a token `fake-N` valid
/// for `secs` seconds, `Err(text)` an error; the last entry repeats.
#[derive(Debug)]
struct Scripted {
    script: Vec<Result<i64, &'static str>>,
    calls: AtomicUsize,
    delay: Duration,
}

impl Scripted {
    fn new(script: Vec<Result<i64, &'static str>>) -> Arc<Scripted> {
        Arc::new(Scripted {
            script,
            calls: AtomicUsize::new(0),
            delay: Duration::ZERO,
        })
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl TokenCredential for Scripted {
    async fn get_token(
        &self,
        scopes: &[&str],
        _: Option<TokenRequestOptions<'_>>,
    ) -> azure_core::Result<AccessToken> {
        assert_eq!(scopes, &[SQL_SCOPE]);
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        match self.script[n.min(self.script.len() - 1)] {
            Ok(secs) => Ok(AccessToken::new(
                format!("fake-{}", n + 1),
                OffsetDateTime::now_utc() + azure_core::time::Duration::seconds(secs),
            )),
            Err(text) => Err(azure_core::Error::with_message(
                azure_core::error::ErrorKind::Credential,
                text,
            )),
        }
    }
}

#[tokio::test]
async fn the_chain_takes_the_first_token_and_remembers_where_it_came_from() {
    let not_signed_in = Scripted::new(vec![Err("not signed in")]);
    let works = Scripted::new(vec![Ok(3600)]);
    let never = Scripted::new(vec![Ok(3600)]);
    let chain = ChainCredential::new(
        vec![
            ChainLink::unavailable("Absent", "not tried: nothing configured"),
            ChainLink::new("First", not_signed_in.clone()),
            ChainLink::new("Second", works.clone()),
            ChainLink::new("Third", never.clone()),
        ],
        Duration::from_secs(1),
    );
    assert_eq!(chain.tried_names(), ["First", "Second", "Third"]);
    assert_eq!(chain.chosen(), None);
    let t = chain.get_token(&[SQL_SCOPE], None).await.unwrap();
    assert_eq!(t.token.secret(), "fake-1");
    assert_eq!(chain.chosen(), Some("Second"));
    let t = chain.get_token(&[SQL_SCOPE], None).await.unwrap();
    assert_eq!(t.token.secret(), "fake-2");
    assert_eq!(
        (not_signed_in.calls(), works.calls(), never.calls()),
        (1, 2, 0),
        "once a link has given a token, only it is asked"
    );

    // None gives one: every link is named with its reason.
    let slow = Arc::new(Scripted {
        script: vec![Ok(3600)],
        calls: AtomicUsize::new(0),
        delay: Duration::from_secs(30),
    });
    let chain = ChainCredential::new(
        vec![
            ChainLink::unavailable("Absent", "not tried: nothing configured"),
            ChainLink::new("First", Scripted::new(vec![Err("not signed in")])),
            ChainLink::new("Slow", slow),
        ],
        Duration::from_millis(200),
    );
    let e = chain
        .get_token(&[SQL_SCOPE], None)
        .await
        .unwrap_err()
        .to_string();
    for part in [
        "Absent: not tried: nothing configured",
        "First: not signed in",
        "Slow: no answer within 200 ms",
    ] {
        assert!(e.contains(part), "{part:?} missing in {e}");
    }
    assert_eq!(chain.chosen(), None);
}

#[tokio::test]
async fn a_failed_refresh_keeps_the_valid_token_and_errors_say_what_to_fix() {
    // The first token is inside the refresh margin, so the next call asks
    // again; that fails, and the kept token (still valid) is used.
    let credential = Scripted::new(vec![Ok(120), Err("endpoint down")]);
    let tokens = TokenSource::new(
        credential.clone(),
        "the test credential",
        "fix the test",
        Duration::from_secs(1),
    );
    assert_eq!(tokens.token().await.unwrap(), "fake-1");
    assert_eq!(tokens.token().await.unwrap(), "fake-1");
    assert_eq!(credential.calls(), 2);
    // Without a valid token the error names the credential and the fix,
    // and no token.
    let tokens = TokenSource::new(
        Scripted::new(vec![Ok(2), Err("endpoint down")]),
        "the test credential",
        "fix the test",
        Duration::from_secs(1),
    );
    assert_eq!(tokens.token().await.unwrap(), "fake-1");
    let e = tokens.token().await.unwrap_err().to_string();
    assert!(
        e.contains("the test credential")
            && e.contains("endpoint down")
            && e.contains("fix the test"),
        "{e}"
    );
    assert!(!e.contains("fake-"), "{e}");
    // A credential that does not answer is bounded by the timeout.
    let slow = Arc::new(Scripted {
        script: vec![Ok(3600)],
        calls: AtomicUsize::new(0),
        delay: Duration::from_secs(30),
    });
    let tokens = TokenSource::new(slow, "slow", "wait less", Duration::from_millis(200));
    let started = std::time::Instant::now();
    let e = tokens.token().await.unwrap_err().to_string();
    assert!(e.contains("no token within 200 ms"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(5));
}
