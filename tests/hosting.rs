//! The real binary's `serve`, started in the environment of each place a
//! Functions container runs without Core Tools (the platform's own
//! variables, no `REDIS_URL`, no `SQL_CONNECTION_STRING`): it refuses to
//! start on the embedded state, naming the missing setting and where it
//! runs, before it listens; so it does in a Kubernetes pod with no
//! Functions host. Under Core Tools it starts on that state, even where a
//! plan's variable (`CONTAINER_NAME`) is set too.

mod common;

use std::process::{Command, Stdio};
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

/// What a `serve` did.
#[derive(Debug, PartialEq, Eq)]
enum Serve {
    /// Exited with this code and stderr.
    Exited(i32, String),
    /// Listened on its port (then killed).
    Listened,
    /// Neither within the wait (then killed).
    Hung,
}

/// `order-guard serve` with only `vars` (and `PATH`) set.
///
/// Whether it listened is read from its own log line (on stdout), not
/// from a probe of its port: a connection to a free loopback port can
/// succeed without it (a socket the kernel connects to itself, or another
/// process that took the port), and then a refusal would be missed.
fn serve(vars: &[(&str, &str)], wait: Duration) -> Serve {
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port().to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_order-guard"))
        .arg("serve")
        .current_dir(dir.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("FUNCTIONS_CUSTOMHANDLER_PORT", &port)
        .envs(vars.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (listened, heard) = std::sync::mpsc::channel::<()>();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let its_port = format!(":{port} (");
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in stdout.lines().map_while(Result::ok) {
            if line.contains("order-guard listening on http://") && line.contains(&its_port) {
                let _ = listened.send(());
            }
        }
    });
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
            return Serve::Exited(status.code().unwrap_or(-1), stderr);
        }
        let outcome = match heard.recv_timeout(Duration::from_millis(20)) {
            Ok(()) => Some(Serve::Listened),
            // Its stdout closed without the line: it is exiting.
            Err(RecvTimeoutError::Disconnected) => {
                child.wait().unwrap();
                continue;
            }
            Err(RecvTimeoutError::Timeout) if started.elapsed() > wait => Some(Serve::Hung),
            Err(RecvTimeoutError::Timeout) => None,
        };
        if let Some(outcome) = outcome {
            let _ = child.kill();
            let _ = child.wait();
            return outcome;
        }
    }
}

#[test]
fn serve_refuses_the_embedded_state_in_every_self_hosted_functions_container() {
    // (the place, its environment, what the refusal must say of it)
    type Place<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
    let places: [Place; 4] = [
        (
            "AKS with KEDA",
            &[
                ("FUNCTIONS_WORKER_RUNTIME", "custom"),
                ("AzureWebJobsScriptRoot", "/home/site/wwwroot"),
                ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
                ("KUBERNETES_SERVICE_PORT", "443"),
            ],
            "KUBERNETES_SERVICE_HOST is set: Kubernetes",
        ),
        (
            "a plain Container App",
            &[
                ("FUNCTIONS_WORKER_RUNTIME", "custom"),
                ("CONTAINER_APP_NAME", "orders"),
                ("CONTAINER_APP_REVISION", "orders--r1"),
            ],
            "CONTAINER_APP_NAME is set: Azure Container Apps",
        ),
        (
            "Docker on a VM",
            &[
                ("FUNCTIONS_WORKER_RUNTIME", "custom"),
                ("AzureWebJobsScriptRoot", "/home/site/wwwroot"),
            ],
            "AzureWebJobsScriptRoot is set: a Functions container image",
        ),
        (
            "Linux Consumption",
            &[
                ("FUNCTIONS_WORKER_RUNTIME", "custom"),
                ("CONTAINER_NAME", "E9A1C2_orders"),
                ("WEBSITE_SKU", "Dynamic"),
            ],
            "in Azure on Consumption (Linux)",
        ),
    ];
    for (place, vars, says) in places {
        let Serve::Exited(code, stderr) = serve(vars, Duration::from_secs(20)) else {
            panic!("{place}: serve did not refuse the embedded state");
        };
        assert_eq!(code, 2, "{place}: {stderr}");
        assert!(
            stderr.contains("REDIS_URL: is not set")
                && stderr.contains(says)
                && stderr.contains("ORDER_GUARD_ALLOW_EMBEDDED_STATE=true"),
            "{place}: {stderr}"
        );
        // A SQLite file of its own is refused there too.
        let mut with_file = vars.to_vec();
        with_file.extend([
            ("REDIS_URL", "redis://127.0.0.1:1"),
            ("SQL_CONNECTION_STRING", "sqlite:./orders.db"),
        ]);
        let Serve::Exited(code, stderr) = serve(&with_file, Duration::from_secs(20)) else {
            panic!("{place}: serve did not refuse a SQLite file");
        };
        assert_eq!(code, 2, "{place}: {stderr}");
        assert!(
            stderr.contains("SQL_CONNECTION_STRING: is a SQLite file"),
            "{place}: {stderr}"
        );
    }
}

#[test]
fn under_core_tools_serve_starts_on_the_embedded_state() {
    let started = serve(
        &[
            ("FUNCTIONS_WORKER_RUNTIME", "custom"),
            ("FUNCTIONS_CORETOOLS_ENVIRONMENT", "true"),
            ("AzureWebJobsScriptRoot", "/work/app"),
        ],
        Duration::from_secs(30),
    );
    assert_eq!(
        started,
        Serve::Listened,
        "serve did not start under Core Tools"
    );
}

/// `func start` in a dev container or on a CI runner: Core Tools' mark with
/// `CONTAINER_NAME` set (the Linux Consumption rule's variable) still serves
/// on the embedded state.
#[test]
fn under_core_tools_in_a_container_serve_starts_on_the_embedded_state() {
    let started = serve(
        &[
            ("FUNCTIONS_CORETOOLS_ENVIRONMENT", "true"),
            ("FUNCTIONS_WORKER_RUNTIME", "custom"),
            ("CONTAINER_NAME", "x"),
        ],
        Duration::from_secs(30),
    );
    assert_eq!(
        started,
        Serve::Listened,
        "serve did not start under Core Tools with CONTAINER_NAME set"
    );
}

/// A Kubernetes pod without a Functions host (`serve` run as a pod's
/// command): the kubelet's `KUBERNETES_SERVICE_HOST` says several replicas
/// may run.
#[test]
fn serve_refuses_the_embedded_state_in_a_kubernetes_pod_without_a_functions_host() {
    let Serve::Exited(code, stderr) = serve(
        &[("KUBERNETES_SERVICE_HOST", "10.0.0.1")],
        Duration::from_secs(20),
    ) else {
        panic!("serve did not refuse the embedded state in a pod");
    };
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("REDIS_URL: is not set")
            && stderr.contains("KUBERNETES_SERVICE_HOST=10.0.0.1: a Kubernetes pod")
            && stderr.contains("ORDER_GUARD_ALLOW_EMBEDDED_STATE=true"),
        "{stderr}"
    );
}
