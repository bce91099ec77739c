//! The webhook's container image, black-box, as a user runs it: built by
//! `scripts/image.sh` (the dev profile: what is checked here does not
//! depend on the optimizer), run with podman on the host's network against
//! a real Redis and the T-SQL engine as the app's least-privileged login,
//! tokens from a local issuer: both handshakes, an order executed once from
//! two deliveries, a poison delivery, tokens refused, and the drain on
//! SIGTERM with a delivery in flight.
//!
//! Needs the T-SQL engine (`ORDER_GUARD_TEST_MSSQL`, as every SQL Server
//! test): without it the test says so and does not run.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::webhook::*;
use common::{eg_event, free_port, order_data, unique_id, RedisServer};
use serde_json::json;

/// `podman ARGS` with the configuration the image script writes.
fn podman(args: &[&str]) -> std::process::Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let conf = std::env::var("CONTAINERS_CONF")
        .unwrap_or_else(|_| root.join(".tools/containers.conf").display().to_string());
    Command::new("podman")
        .args(args)
        .env("CONTAINERS_CONF", conf)
        .output()
        .unwrap_or_else(|e| panic!("podman {args:?}: {e} (scripts/image.sh installs it)"))
}

fn build_image() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(root.join("scripts/image.sh"))
        .env("ORDER_GUARD_PACKAGE_PROFILE", "dev")
        .env("CARGO_PROFILE_DEV_DEBUG", "false")
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/image.sh");
    assert!(out.status.success(), "scripts/image.sh failed");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A container of the image, removed when dropped.
struct Container {
    name: String,
}

impl Container {
    fn logs(&self) -> String {
        let out = podman(&["logs", &self.name]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", "-t", "0", &self.name]);
    }
}

#[tokio::test]
async fn the_image_serves_event_grids_webhook_on_real_redis_and_sql_server() {
    let Some(owner) = common::mssql_connection_string() else {
        return;
    };
    let app = common::mssql_app_connection_string(&owner).await;
    let image = build_image();
    let redis = RedisServer::start();
    let issuer = Issuer::start().await;
    let port = free_port();
    let name = format!("og-webhook-{port}");
    let mut args: Vec<String> = vec![
        "run".into(),
        "-d".into(),
        "--name".into(),
        name.clone(),
        "--network".into(),
        "host".into(),
        "-e".into(),
        format!("WEBHOOK_PORT={port}"),
        "-e".into(),
        format!("REDIS_URL={}", redis.url()),
        "-e".into(),
        format!("SQL_CONNECTION_STRING={app}"),
        "-e".into(),
        "RUST_LOG=info".into(),
        "-e".into(),
        "SHUTDOWN_GRACE_SECONDS=4".into(),
    ];
    for (k, v) in issuer.settings() {
        args.push("-e".into());
        args.push(format!("{k}={v}"));
    }
    args.push(image.clone());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = podman(&args);
    assert!(
        run.status.success(),
        "podman run: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let container = Container { name };

    // The image runs as a user that is not root.
    let user = podman(&["inspect", "--format", "{{.Config.User}}", &image]);
    assert_eq!(String::from_utf8_lossy(&user.stdout).trim(), "65532:65532");

    let base = format!("http://127.0.0.1:{port}");
    let started = std::time::Instant::now();
    loop {
        let probe = tokio::time::timeout(
            Duration::from_secs(2),
            hyper::Client::new().get(format!("{base}/readyz").parse().unwrap()),
        )
        .await;
        if let Ok(Ok(r)) = probe {
            if r.status() == 200 {
                break;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "the container never became ready: {}",
            container.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let url = format!("{base}/events");
    let token = issuer.token();

    // The validation handshake, and the CloudEvents one.
    let answer = webhook_request(
        "POST",
        &url,
        &[
            ("aeg-event-type", "SubscriptionValidation".to_string()),
            ("Authorization", format!("Bearer {token}")),
        ],
        serde_json::to_vec(&validation_event("c0de")).unwrap(),
    )
    .await;
    assert_eq!(
        (answer.status, answer.body.clone()),
        (200, json!({"validationResponse": "c0de"}))
    );
    let options = webhook_request(
        "OPTIONS",
        &url,
        &[("WebHook-Request-Origin", "eventgrid.azure.net".to_string())],
        Vec::new(),
    )
    .await;
    assert_eq!(options.status, 200);
    assert_eq!(
        options.headers.get("webhook-allowed-origin").unwrap(),
        "eventgrid.azure.net"
    );

    // One order from two deliveries: executed once.
    let events = json!([eg_event(order_data(
        &unique_id("img"),
        "buy",
        "MSFT",
        "3",
        "acct-img"
    ))]);
    let first = deliver(&base, Some(&token), &events).await;
    assert_eq!(
        (first.status, outcomes(&first)),
        (200, vec!["executed".to_string()]),
        "{}",
        container.logs()
    );
    let again = deliver(&base, Some(&token), &events).await;
    assert_eq!(
        (again.status, outcomes(&again)),
        (200, vec!["duplicate".to_string()])
    );

    // A poison delivery, and tokens refused.
    let poison = webhook_request(
        "POST",
        &url,
        &[("Authorization", format!("Bearer {token}"))],
        b"{oops".to_vec(),
    )
    .await;
    assert_eq!(poison.status, 400);
    let fresh = || {
        json!([eg_event(order_data(
            &unique_id("img"),
            "buy",
            "MSFT",
            "1",
            "acct-img"
        ))])
    };
    assert_eq!(deliver(&base, None, &fresh()).await.status, 401);
    let mut other_app = event_grid_claims();
    other_app["aud"] = json!("api://another-app");
    assert_eq!(
        deliver(&base, Some(&issuer.key.sign(&other_app)), &fresh())
            .await
            .status,
        401
    );
    let mut no_role = event_grid_claims();
    no_role["roles"] = json!([]);
    assert_eq!(
        deliver(&base, Some(&issuer.key.sign(&no_role)), &fresh())
            .await
            .status,
        403
    );

    // SIGTERM with a delivery in flight: the drain as Event Grid meets it
    // (the same as the binary's, tests/webhook/lifecycle.rs), then a clean exit.
    let name = container.name.clone();
    drain_as_event_grid_meets_it(&base, port, &token, fresh, move || {
        let kill = podman(&["kill", "--signal", "TERM", &name]);
        assert!(
            kill.status.success(),
            "{}",
            String::from_utf8_lossy(&kill.stderr)
        );
    })
    .await;
    let waited = podman(&["wait", &container.name]);
    assert_eq!(
        String::from_utf8_lossy(&waited.stdout).trim(),
        "0",
        "{}",
        container.logs()
    );
    assert!(
        container.logs().contains("all deliveries drained"),
        "{}",
        container.logs()
    );
}
