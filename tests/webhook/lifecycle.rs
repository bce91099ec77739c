//! Where the webhook may start (nothing per-replica where several
//! replicas may run), a signal during its start, and the drain.

use super::*;

#[tokio::test]
async fn sigterm_drains_taking_deliveries_until_the_last_stretch_of_the_grace() {
    let redis = RedisServer::start();
    let issuer = Issuer::start().await;
    let mut settings = issuer.settings();
    settings.push(("SHUTDOWN_GRACE_SECONDS".into(), "4".into()));
    let mut hook = Webhook::start(&redis, &settings).await;
    let port: u16 = hook.base.rsplit(':').next().unwrap().parse().unwrap();
    let pid = hook.child.id().unwrap();
    drain_as_event_grid_meets_it(
        &hook.base,
        port,
        &issuer.token(),
        || json!([eg_event(order("drain"))]),
        || signal(pid, "TERM"),
    )
    .await;
    let status = tokio::time::timeout(Duration::from_secs(30), hook.child.wait())
        .await
        .expect("the webhook exits once drained")
        .unwrap();
    assert!(status.success(), "{status}: {}", hook.log());
    assert!(
        hook.log().contains("all deliveries drained"),
        "{}",
        hook.log()
    );
}

#[tokio::test]
async fn a_quiet_drain_ends_before_the_grace() {
    let redis = RedisServer::start();
    let issuer = Issuer::start().await;
    let mut settings = issuer.settings();
    settings.push(("SHUTDOWN_GRACE_SECONDS".into(), "300".into()));
    let mut hook = Webhook::start(&redis, &settings).await;
    signal(hook.child.id().unwrap(), "TERM");
    // Nothing in flight and nothing coming: over after the quiet stretch
    // (5 s), not the grace (5 min).
    let status = tokio::time::timeout(Duration::from_secs(60), hook.child.wait())
        .await
        .expect("a quiet drain ends before its grace")
        .unwrap();
    assert!(status.success(), "{status}: {}", hook.log());
}

#[test]
fn authentication_off_is_refused_where_the_embedded_state_would_be() {
    let dir = tempfile::tempdir().unwrap();
    let (status, out) = common::run_command(
        dir.path(),
        &["webhook"],
        &[
            ("WEBHOOK_AUTH", "off"),
            ("ORDER_GUARD_IMAGE", "0.2.0"),
            ("REDIS_URL", "redis://127.0.0.1:1"),
            (
                "SQL_CONNECTION_STRING",
                "Server=tcp:127.0.0.1,1;User ID=u;Password=p",
            ),
        ],
    );
    assert!(!status.success());
    assert!(
        out.contains("WEBHOOK_AUTH") && out.contains("this project's image"),
        "{out}"
    );
    let (status, out) = common::run_command(dir.path(), &["webhook"], &[]);
    assert!(!status.success());
    assert!(out.contains("WEBHOOK_TENANT_ID"), "{out}");
}

/// The path of `program` on this machine's PATH.
fn on_path(program: &str) -> String {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| std::path::Path::new(d).join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{program} is not on PATH (util-linux)"))
        .display()
        .to_string()
}

#[tokio::test]
async fn sigterm_during_a_slow_start_ends_the_process_promptly_even_as_pid_1() {
    let redis = RedisServer::start();
    let issuer = Issuer::start().await;
    let mut settings = issuer.settings();
    settings.push(("SQLITE_BUSY_TIMEOUT_MS".into(), "100".into()));
    // PID 1 of its own PID namespace, as in a container: the kernel drops
    // a signal PID 1 does not listen for.
    // The start waits for its SQLite file, which this test holds locked.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("locked.db");
    let held = rusqlite::Connection::open(&file).unwrap();
    held.execute_batch("BEGIN EXCLUSIVE; CREATE TABLE held(x);")
        .unwrap();
    settings.push((
        "SQL_CONNECTION_STRING".into(),
        format!("sqlite:{}?mode=rwc", file.display()),
    ));
    let unshare = on_path("unshare");
    let mut hook = Webhook::spawn(
        &redis,
        &settings,
        &[&unshare, "--pid", "--fork", "--kill-child"],
    );
    hook.wait_for_log("store not ready yet", Duration::from_secs(30))
        .await;
    let outer = hook.child.id().unwrap();
    let children = std::fs::read_to_string(format!("/proc/{outer}/task/{outer}/children")).unwrap();
    let pid: u32 = children.split_whitespace().next().unwrap().parse().unwrap();
    signal(pid, "TERM");
    let status = tokio::time::timeout(Duration::from_secs(5), hook.child.wait())
        .await
        .unwrap_or_else(|_| panic!("SIGTERM during the start was not honoured: {}", hook.log()))
        .unwrap();
    assert!(status.success(), "{status}: {}", hook.log());
    assert!(hook.log().contains("SIGTERM received"), "{}", hook.log());
    drop(held);
}

/// `order-guard webhook` started with only `vars` set, in a directory of
/// its own: `Err` with its output when it refuses to start, `Ok` once it
/// listens (then it is stopped).
async fn start_with(vars: &[(String, String)]) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("webhook.log");
    let out = std::fs::File::create(&log).unwrap();
    let mut child = tokio::process::Command::new(common::handler_binary())
        .arg("webhook")
        .env_clear()
        .env("WEBHOOK_PORT", free_port().to_string())
        .envs(vars.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .current_dir(dir.path())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(status) = child.try_wait().unwrap() {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(!status.success(), "exited 0 without serving: {text}");
            return Err(text);
        }
        if text.contains("order-guard webhook listening on") {
            return Ok(());
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "neither refused nor listening: {text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn where_several_replicas_may_run_nothing_per_replica_and_no_open_door_is_accepted() {
    let issuer = Issuer::start().await;
    let with_entra = |place: &[(&str, &str)]| -> Vec<(String, String)> {
        let mut vars = issuer.settings();
        vars.extend(place.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        vars
    };
    // (the place, its platform's variables, what the refusal names)
    type Place<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
    let places: [Place; 5] = [
        (
            "a Kubernetes pod of another image",
            &[("KUBERNETES_SERVICE_HOST", "10.0.0.1")],
            "KUBERNETES_SERVICE_HOST",
        ),
        (
            "this image built without its version",
            &[("ORDER_GUARD_IMAGE", "")],
            "ORDER_GUARD_IMAGE",
        ),
        (
            "a Container App revision",
            &[("CONTAINER_APP_REVISION", "orders--r1")],
            "CONTAINER_APP_REVISION",
        ),
        (
            "Core Tools' mark in a pod, for a command Core Tools never starts",
            &[
                ("FUNCTIONS_CORETOOLS_ENVIRONMENT", "true"),
                ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
            ],
            "KUBERNETES_SERVICE_HOST",
        ),
        (
            "a Container App",
            &[("CONTAINER_APP_NAME", "orders")],
            "CONTAINER_APP_NAME",
        ),
    ];
    for (place, vars, names) in places {
        // The embedded state: refused, naming the place and the opt-in.
        let out = start_with(&with_entra(vars))
            .await
            .err()
            .unwrap_or_else(|| panic!("{place}: started on the embedded state"));
        assert!(
            out.contains("REDIS_URL")
                && out.contains(names)
                && out.contains("ORDER_GUARD_ALLOW_EMBEDDED_STATE=true"),
            "{place}: {out}"
        );
        // No authentication: refused even with the state elsewhere.
        let mut off = vars.to_vec();
        off.extend([
            ("WEBHOOK_AUTH", "off"),
            ("REDIS_URL", "redis://127.0.0.1:1"),
            (
                "SQL_CONNECTION_STRING",
                "Server=tcp:127.0.0.1,1;User ID=u;Password=p",
            ),
        ]);
        let out = start_with(&with_entra(&off))
            .await
            .err()
            .unwrap_or_else(|| panic!("{place}: started with no authentication"));
        assert!(
            out.contains("WEBHOOK_AUTH") && out.contains(names),
            "{place}: {out}"
        );
    }
    // Not every container: a dev container or a CI runner (this machine
    // has /.dockerenv and CONTAINER_NAME) runs one process on one disk.
    let redis = RedisServer::start();
    let url = redis.url();
    let runner = [
        ("CONTAINER_NAME", "uid-runner-1"),
        ("WEBHOOK_AUTH", "off"),
        ("REDIS_URL", url.as_str()),
        ("SQL_CONNECTION_STRING", "sqlite:./orders.db?mode=rwc"),
    ];
    start_with(&with_entra(&runner))
        .await
        .expect("a CI runner's container");
    // A deliberate single replica says so.
    let pod = [
        ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
        ("ORDER_GUARD_ALLOW_EMBEDDED_STATE", "true"),
        ("SQL_CONNECTION_STRING", "sqlite:./orders.db?mode=rwc"),
    ];
    start_with(&with_entra(&pod))
        .await
        .expect("a single-replica pod that opted in");
}
