//! The real binary's `serve`, started in the environment of each place a
//! Functions container runs without Core Tools (the platform's own
//! variables, no `REDIS_URL`, no `SQL_CONNECTION_STRING`): it refuses to
//! start on the embedded state, naming the missing setting and where it
//! runs, before it listens. Under Core Tools it starts on that state.

mod common;

use std::process::{Command, Stdio};
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
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            return Serve::Exited(
                status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            );
        }
        // Listening means it started: no refusal is coming.
        let listening =
            std::net::TcpStream::connect(("127.0.0.1", port.parse::<u16>().unwrap())).is_ok();
        if listening || started.elapsed() > wait {
            let _ = child.kill();
            let _ = child.wait();
            return if listening {
                Serve::Listened
            } else {
                Serve::Hung
            };
        }
        std::thread::sleep(Duration::from_millis(20));
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
