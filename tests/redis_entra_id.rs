//! Entra ID for Redis (`REDIS_AUTH=entra-id`), end to end: Microsoft's
//! credentials ask a local endpoint answering as the App Service identity
//! endpoint does (`tests/common/identity.rs`) for tokens shaped as Entra ID's
//! (a JWT whose `oid` is the identity's object id); the guard sends each as
//! the password of the user named by that `oid` to a real `redis-server`
//! whose ACL knows only those tokens (the `default` user is off, so nothing
//! unauthenticated gets in). Rotation is watched on the server itself:
//! `CLIENT LIST` shows the same connection, its last command `auth`.

mod common;

use std::time::{Duration, Instant};

use base64::Engine;
use common::identity::{identity_endpoint_minting, IdentityEndpoint, IdentityEnv, HEADER_SECRET};
use common::{unique_id, RedisCluster, RedisServer};
use order_guard::entra::{TokenSource, REDIS_SCOPE};
use order_guard::guard::{
    Acquisition, EntraCredentials, GuardSettings, IdempotencyGuard, RedisGuard, Topology,
};

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

/// A command as the test's administrator, on one node.
fn admin(port: u16, args: &[&str]) -> redis::Value {
    let url = format!("redis://{ADMIN}:{ADMIN_PASSWORD}@127.0.0.1:{port}");
    let mut con = redis::Client::open(url)
        .unwrap()
        .get_connection()
        .expect("connect as the test's administrator");
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query(&mut con).expect("admin command")
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

/// The connections of user [`OID`] on the node at `port`: (id, last command).
fn oid_connections(port: u16) -> Vec<(String, String)> {
    let list = match admin(port, &["CLIENT", "LIST"]) {
        redis::Value::BulkString(b) => String::from_utf8(b).unwrap(),
        redis::Value::VerbatimString { text, .. } => text,
        other => panic!("CLIENT LIST: {other:?}"),
    };
    list.lines()
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
    // Tokens live 302 s: the refresh is due 2 s after each is handed out.
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
    assert_eq!(
        ep.requests.lock().unwrap()[0].resource.as_deref(),
        Some("https://redis.azure.com"),
        "the token is asked for Redis' resource"
    );
    let before = oid_connections(server.port);
    assert_eq!(
        before.len(),
        1,
        "one connection, as the token's oid: {before:?}"
    );

    // The second token arrives; the same connection authenticates again.
    let live = before[0].0.clone();
    wait_for("the second token", Duration::from_secs(15), || {
        ep.tokens_handed_out() >= 2
    });
    wait_for(
        "AUTH again on the live connection",
        Duration::from_secs(10),
        || oid_connections(server.port) == [(live.clone(), "auth".to_string())],
    );

    // The first token is withdrawn and the connection cut: the guard comes
    // back on a new connection with the second.
    admin(
        server.port,
        &["ACL", "SETUSER", OID, &format!("<{}", token(1))],
    );
    admin(server.port, &["CLIENT", "KILL", "USER", OID]);
    let second = unique_id("o");
    let mut answer = guard.acquire(&second).await;
    if matches!(answer, Acquisition::Unavailable(_)) {
        // The cut may be seen by the call in flight; the next reconnects.
        answer = guard.acquire(&second).await;
    }
    assert!(matches!(answer, Acquisition::Acquired(_)), "{answer:?}");
    let after = oid_connections(server.port);
    assert_eq!(after.len(), 1, "{after:?}");
    assert_ne!(after[0].0, live, "a new connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_leaves_the_guard_unavailable_saying_why() {
    let server = RedisServer::start();
    entra_only(server.port, &[1]);
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
    assert!(oid_connections(server.port).is_empty());
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
    let live: Vec<(u16, String)> = masters
        .iter()
        .flat_map(|p| oid_connections(*p).into_iter().map(|(id, _)| (*p, id)))
        .collect();
    assert!(
        live.len() >= 3,
        "a connection as the oid on each master: {live:?}"
    );
    wait_for("the second token", Duration::from_secs(15), || {
        ep.tokens_handed_out() >= 2
    });
    for (port, id) in &live {
        wait_for(
            &format!("AUTH again on connection {id} of node {port}"),
            Duration::from_secs(10),
            || {
                oid_connections(*port)
                    .iter()
                    .any(|(i, cmd)| i == id && cmd == "auth")
            },
        );
    }
}
