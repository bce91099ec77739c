//! Azure Cache for Redis takes TLS only (`rediss://`, port 6380): the guard
//! must reach a real TLS handshake. A real `redis-server` with a TLS port and
//! a self-signed certificate (made with `openssl`): the client's handshake
//! runs and refuses that certificate (it is not from a trusted root), which
//! the guard reports as `Unavailable` with the reason; it never panics (a
//! build without a TLS crypto provider panicked at the first connection).

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use order_guard::guard::Acquisition;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rediss_url_reaches_a_tls_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let made = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"])
        .args(["-subj", "/CN=localhost", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("openssl is missing: this test makes a certificate with it (apt-get install -y openssl)");
    assert!(made.success(), "openssl could not make a test certificate");
    let port = common::free_port();
    let mut server = Command::new(common::redis_server_binary())
        .args([
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ])
        .arg("--tls-cert-file")
        .arg(&cert)
        .arg("--tls-key-file")
        .arg(&key)
        .args([
            "--tls-auth-clients",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start redis-server with a TLS port");
    // Ready when it accepts TCP on the TLS port (bounded).
    let ready = async {
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            tokio::task::yield_now().await;
        }
    };
    let up = tokio::time::timeout(Duration::from_secs(10), ready).await;
    assert!(
        up.is_ok(),
        "redis-server did not open its TLS port (built without TLS?)"
    );

    // The guard as the binary builds it from its configuration.
    let url = format!("rediss://localhost:{port}");
    let config =
        order_guard::config::Config::from_lookup(|k| (k == "REDIS_URL").then(|| url.clone()))
            .unwrap();
    let guard = order_guard::app::build_guard(&config).unwrap();
    match guard.acquire("tls-order").await {
        Acquisition::Unavailable(why) => assert!(
            why.contains("certificate"),
            "want the handshake to refuse the self-signed certificate, got: {why}"
        ),
        other => panic!("a self-signed certificate must not be trusted: {other:?}"),
    }
    let _ = server.kill();
    let _ = server.wait();
}
