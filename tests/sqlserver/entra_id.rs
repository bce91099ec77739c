//! Entra ID tokens through `azure_identity`'s credentials.

use super::identity::*;
use super::*;

// ------------------------------------------------------- Entra ID tokens
//
// Through `azure_identity`'s own credentials, against a local endpoint that
// answers as the App Service / Functions identity endpoint does
// (`tests/common/identity.rs`). No test lets a credential reach the Instance
// Metadata Service or run `az`: with IDENTITY_ENDPOINT set neither managed
// identity nor the Default chain uses the Instance Metadata Service, and the
// endpoint answers before the chain would get to the developer tools.

/// A fake TDS server and a connection manager logging in to it with `tokens`.
async fn token_login(tokens: TokenSource) -> (FakeTds, SqlConnectionManager) {
    let fake = FakeTds::start(LoginAnswer::Accept).await;
    let mut config = tiberius::Config::new();
    config.host("127.0.0.1");
    config.port(fake.port);
    config.encryption(tiberius::EncryptionLevel::NotSupported);
    let manager = SqlConnectionManager::new(
        config,
        Some(Arc::new(tokens)),
        Duration::from_secs(5),
        Duration::from_secs(5),
    );
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
    let tokens = order_guard::store::sqlserver::token_source(&info.auth, Duration::from_secs(5))
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
    let tokens = TokenSource::managed_identity(None, SQL_SCOPE, Duration::from_secs(5)).unwrap();
    assert_eq!(tokens.token().await.unwrap(), "token-1");
    assert_eq!(ep.requests.lock().unwrap()[0].client_id, None);
}

#[tokio::test]
async fn tokens_are_reused_while_valid_and_refreshed_near_expiry() {
    // Valid for an hour: two logins, one request to the endpoint.
    let ep = identity_endpoint(3600).await;
    let _env = IdentityEnv::set(Some(&ep.url), Some(HEADER_SECRET)).await;
    let tokens = TokenSource::managed_identity(None, SQL_SCOPE, Duration::from_secs(5)).unwrap();
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
    let tokens = TokenSource::managed_identity(None, SQL_SCOPE, Duration::from_secs(5)).unwrap();
    assert_eq!(tokens.token().await.unwrap(), "token-2");
    assert_eq!(tokens.token().await.unwrap(), "token-3");
    assert_eq!(ep.tokens_handed_out(), 3);
}

#[tokio::test]
async fn a_wrong_header_secret_is_refused_and_not_echoed() {
    let ep = identity_endpoint(3600).await;
    let secret = "wrong-secret-999";
    let _env = IdentityEnv::set(Some(&ep.url), Some(secret)).await;
    let tokens = TokenSource::managed_identity(None, SQL_SCOPE, Duration::from_secs(5)).unwrap();
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
    let tokens = order_guard::store::sqlserver::token_source(&info.auth, Duration::from_secs(5))
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
    let tokens =
        TokenSource::managed_identity(Some("uai".into()), SQL_SCOPE, Duration::from_secs(5))
            .unwrap();
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
        SQL_SCOPE,
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
        SQL_SCOPE,
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
    let tokens = TokenSource::new(
        slow,
        SQL_SCOPE,
        "slow",
        "wait less",
        Duration::from_millis(200),
    );
    let started = std::time::Instant::now();
    let e = tokens.token().await.unwrap_err().to_string();
    assert!(e.contains("no token within 200 ms"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(5));
}
