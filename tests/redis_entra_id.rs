//! Entra ID for Redis (`REDIS_AUTH=entra-id`), end to end: Microsoft's
//! credentials ask a local endpoint answering as the App Service identity
//! endpoint does (`tests/common/identity.rs`) for tokens shaped as Entra ID's
//! (a JWT whose `oid` is the identity's object id); the guard sends each as
//! the password of the user named by that `oid` to a real `redis-server`
//! whose ACL knows only those tokens (the `default` user is off, so nothing
//! unauthenticated gets in). Rotation is watched on the server itself:
//! `INFO commandstats` counts one more accepted `AUTH` per connection, and
//! `CLIENT LIST` shows the same connections.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use common::identity::{identity_endpoint_minting, IdentityEndpoint, IdentityEnv, HEADER_SECRET};
use common::{unique_id, RedisCluster, RedisServer};
use order_guard::entra::{TokenSource, REDIS_SCOPE};
use order_guard::guard::{
    Acquisition, EntraCredentials, GuardSettings, IdempotencyGuard, RedisGuard, Topology,
};
use order_guard::order::OrderStatus;
use order_guard::processor::OutcomeKind;
use order_guard::store::OrderStore;

/// The object id every test token names.
const OID: &str = "5b2c0f3e-8d41-4a77-9c1e-0a6f2d3b4c5d";
/// The administrator the test itself uses once `default` is off.
const ADMIN: &str = "test-admin";
const ADMIN_PASSWORD: &str = "admin-pw-0123";

/// The n-th token the identity endpoint hands out.
fn token(n: usize) -> String {
    let b64 = |s: String| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    format!(
        "{}.{}.signature-{n}",
        b64(r#"{"alg":"RS256","typ":"JWT"}"#.to_string()),
        b64(format!(
            r#"{{"oid":"{OID}","aud":"https://redis.azure.com","n":{n}}}"#
        ))
    )
}

fn settings() -> GuardSettings {
    GuardSettings {
        prefix: "orden:".into(),
        processing_ttl: Duration::from_secs(300),
        completed_ttl: Duration::from_secs(86_400),
        ..GuardSettings::default()
    }
}

/// On the node at `port`: the user [`OID`] knows `tokens` (1-based), an
/// administrator for the test, and `default` off.
fn entra_only(port: u16, tokens: &[usize]) {
    let plain = format!("redis://127.0.0.1:{port}");
    let mut con = redis::Client::open(plain)
        .unwrap()
        .get_connection()
        .unwrap();
    redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            ADMIN,
            "on",
            &format!(">{ADMIN_PASSWORD}"),
            "~*",
            "&*",
            "+@all",
        ])
        .query::<()>(&mut con)
        .unwrap();
    let passwords: Vec<String> = tokens.iter().map(|n| format!(">{}", token(*n))).collect();
    let mut setuser = redis::cmd("ACL");
    setuser.arg(&["SETUSER", OID, "on", "~*", "&*", "+@all"]);
    for p in &passwords {
        setuser.arg(p);
    }
    setuser.query::<()>(&mut con).unwrap();
    redis::cmd("ACL")
        .arg(&["SETUSER", "default", "off"])
        .query::<()>(&mut con)
        .unwrap();
}

/// The test's administrator on one node, on one connection of its own
/// (authenticated once, so the server's count of `AUTH` calls moves only
/// with the guard's).
struct Admin(std::sync::Mutex<redis::Connection>);

impl Admin {
    fn connect(port: u16) -> Admin {
        let url = format!("redis://{ADMIN}:{ADMIN_PASSWORD}@127.0.0.1:{port}");
        let con = redis::Client::open(url)
            .unwrap()
            .get_connection()
            .expect("connect as the test's administrator");
        Admin(std::sync::Mutex::new(con))
    }

    fn cmd(&self, args: &[&str]) -> redis::Value {
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        c.query(&mut *self.0.lock().unwrap())
            .expect("admin command")
    }

    fn text(&self, args: &[&str]) -> String {
        match self.cmd(args) {
            redis::Value::BulkString(b) => String::from_utf8(b).unwrap(),
            redis::Value::VerbatimString { text, .. } => text,
            other => panic!("{args:?}: {other:?}"),
        }
    }

    /// The connections of user [`OID`]: (id, last command).
    fn oid_connections(&self) -> Vec<(String, String)> {
        self.text(&["CLIENT", "LIST"])
            .lines()
            .filter_map(|line| {
                let field = |name: &str| {
                    line.split(' ')
                        .find_map(|f| f.strip_prefix(&format!("{name}=")))
                        .map(str::to_string)
                };
                (field("user").as_deref() == Some(OID))
                    .then(|| (field("id").unwrap(), field("cmd").unwrap()))
            })
            .collect()
    }

    /// `AUTH` calls the server accepted (`INFO commandstats`: calls minus
    /// failed ones).
    fn auths(&self) -> u64 {
        let stats = self.text(&["INFO", "commandstats"]);
        let Some(line) = stats.lines().find(|l| l.starts_with("cmdstat_auth:")) else {
            return 0;
        };
        let field = |name: &str| -> u64 {
            line.split([':', ','])
                .find_map(|f| f.strip_prefix(&format!("{name}=")))
                .map_or(0, |v| v.parse().unwrap())
        };
        field("calls") - field("failed_calls") - field("rejected_calls")
    }
}

/// Poll the server (it sends no signal) until `done`, for at most `limit`.
fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The credentials the handler builds for `REDIS_AUTH=entra-id`.
fn credentials() -> EntraCredentials {
    EntraCredentials::start(
        TokenSource::default_chain(None, REDIS_SCOPE, Duration::from_secs(5))
            .expect("the Default chain for Redis"),
    )
}

async fn endpoint(lifetime_secs: usize) -> IdentityEndpoint {
    identity_endpoint_minting(lifetime_secs, token).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_authenticate_the_guard_and_rotate_on_its_live_connection() {
    let server = RedisServer::start();
    entra_only(server.port, &[1, 2]);
    let admin = Admin::connect(server.port);
    let base = admin.auths();
    // The first token lives 302 s: its refresh is due 2 s after it is handed
    // out.
    let ep = endpoint(302).await;
    let _env = IdentityEnv::set(Some(&ep.url), Some(HEADER_SECRET)).await;
    let guard = RedisGuard::connect(
        &server.url(),
        Topology::Single,
        Some(credentials()),
        settings(),
        Duration::from_secs(2),
    )
    .unwrap();

    let first = unique_id("o");
    assert!(
        matches!(guard.acquire(&first).await, Acquisition::Acquired(_)),
        "the first token opens the door"
    );
    // The second lives an hour: no third arrives during the test.
    ep.lifetime.store(3600, Ordering::SeqCst);
    assert_eq!(
        ep.requests.lock().unwrap()[0].resource.as_deref(),
        Some("https://redis.azure.com"),
        "the token is asked for Redis' resource"
    );
    let before = admin.oid_connections();
    assert_eq!(
        before.len(),
        1,
        "one connection, as the token's oid: {before:?}"
    );
    let live = before[0].0.clone();
    // Before the rotation: the connection's own AUTH, and the re-auth
    // task's first (redis-rs subscribes afresh and gets the current token).
    wait_for(
        "the first token's two AUTHs",
        Duration::from_secs(5),
        || admin.auths() == base + 2,
    );
    assert_eq!(ep.tokens_handed_out(), 1, "no second token yet");

    // The second token arrives; the same connection authenticates again,
    // once.
    wait_for("the second token", Duration::from_secs(15), || {
        ep.tokens_handed_out() >= 2
    });
    wait_for(
        "AUTH with the second token on the live connection",
        Duration::from_secs(10),
        || admin.auths() == base + 3,
    );
    assert_eq!(
        admin
            .oid_connections()
            .iter()
            .map(|(id, _)| id)
            .collect::<Vec<_>>(),
        [&live],
        "the same connection, not a new one"
    );

    // The first token is withdrawn and the connection cut: the guard comes
    // back on a new connection with the second.
    admin.cmd(&["ACL", "SETUSER", OID, &format!("<{}", token(1))]);
    admin.cmd(&["CLIENT", "KILL", "USER", OID]);
    let second = unique_id("o");
    let mut answer = guard.acquire(&second).await;
    if matches!(answer, Acquisition::Unavailable(_)) {
        // The cut may be seen by the call in flight; the next reconnects.
        answer = guard.acquire(&second).await;
    }
    assert!(matches!(answer, Acquisition::Acquired(_)), "{answer:?}");
    let after = admin.oid_connections();
    assert_eq!(after.len(), 1, "{after:?}");
    assert_ne!(after[0].0, live, "a new connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_leaves_the_guard_unavailable_saying_why() {
    let server = RedisServer::start();
    entra_only(server.port, &[1]);
    let admin = Admin::connect(server.port);
    let ep = endpoint(3600).await;
    // The identity header is wrong: the endpoint refuses every request.
    let _env = IdentityEnv::set(Some(&ep.url), Some("not-the-header")).await;
    let guard = RedisGuard::connect(
        &server.url(),
        Topology::Single,
        Some(credentials()),
        settings(),
        Duration::from_secs(5),
    )
    .unwrap();
    match guard.acquire(&unique_id("o")).await {
        Acquisition::Unavailable(why) => {
            assert!(why.contains("no Entra ID token for Redis"), "{why}");
            assert!(why.contains("managed identity"), "names what to fix: {why}");
            assert!(!why.contains("not-the-header"), "{why}");
        }
        other => panic!("want Unavailable, got {other:?}"),
    }
    assert_eq!(ep.tokens_handed_out(), 0);
    assert!(admin.oid_connections().is_empty());
    // The policy applies (`GUARD_UNAVAILABLE=proceed`, the default): the
    // store alone decides, and the order is executed once.
    let (store, _dir) = common::sqlite_store().await;
    let processor = common::processor(Arc::new(guard), store.clone());
    let id = unique_id("o");
    let event = common::eg_event(common::order_data(&id, "buy", "MSFT", "3", "acct-1"));
    let outcome = processor.process_event(&event).await;
    assert_eq!(outcome.outcome, OutcomeKind::Executed, "{outcome:?}");
    assert_eq!(
        store.order(&id).await.unwrap().map(|r| r.status),
        Some(OrderStatus::Executed)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_takes_the_token_on_every_node_and_rotates_it() {
    let cluster = RedisCluster::start(5_000);
    // Orders on every master (where each lives is asked before `default`
    // is turned off).
    let orders: Vec<(String, u16)> = (0..40)
        .map(|_| {
            let id = unique_id("o");
            let master = cluster.master_port_of(&format!("orden:{{{id}}}"));
            (id, master)
        })
        .collect();
    let masters: std::collections::BTreeSet<u16> = orders.iter().map(|(_, m)| *m).collect();
    assert_eq!(masters.len(), 3, "the orders fall on every master");
    for port in cluster.live_ports() {
        entra_only(port, &[1, 2]);
    }
    let admins: Vec<(u16, Admin, u64)> = masters
        .iter()
        .map(|p| {
            let a = Admin::connect(*p);
            let base = a.auths();
            (*p, a, base)
        })
        .collect();
    let ep = endpoint(302).await;
    let _env = IdentityEnv::set(Some(&ep.url), Some(HEADER_SECRET)).await;
    let guard = RedisGuard::connect(
        &cluster.url(),
        Topology::Cluster,
        Some(credentials()),
        settings(),
        Duration::from_secs(2),
    )
    .unwrap();
    for (id, _) in &orders {
        let answer = guard.acquire(id).await;
        assert!(
            matches!(answer, Acquisition::Acquired(_)),
            "{id}: {answer:?}"
        );
    }
    ep.lifetime.store(3600, Ordering::SeqCst);
    // Each master: its connections as the oid, each authenticated twice
    // with the first token (its own AUTH, the re-auth task's first), then
    // once more with the second, on the same connections.
    let live: Vec<Vec<String>> = admins
        .iter()
        .map(|(port, admin, base)| {
            let ids: Vec<String> = admin
                .oid_connections()
                .into_iter()
                .map(|(id, _)| id)
                .collect();
            assert!(!ids.is_empty(), "no connection as the oid on master {port}");
            let n = ids.len() as u64;
            wait_for(
                &format!("the first token's AUTHs on master {port}"),
                Duration::from_secs(5),
                || admin.auths() == base + 2 * n,
            );
            ids
        })
        .collect();
    assert_eq!(ep.tokens_handed_out(), 1, "no second token yet");
    wait_for("the second token", Duration::from_secs(15), || {
        ep.tokens_handed_out() >= 2
    });
    for ((port, admin, base), ids) in admins.iter().zip(&live) {
        let n = ids.len() as u64;
        wait_for(
            &format!("AUTH with the second token on master {port}"),
            Duration::from_secs(10),
            || admin.auths() == base + 3 * n,
        );
        let now: Vec<String> = admin
            .oid_connections()
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(&now, ids, "master {port}: the same connections");
    }
}
