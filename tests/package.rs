//! The deploy package, tested as the Functions host meets it:
//! `scripts/package.sh` builds it (in the dev profile, see
//! `build_package`); this test unpacks the zip into an empty
//! folder with the modes the zip itself carries, checks the layout and that
//! the binary is static, then starts it the way the host does (working
//! directory = app root, executable and arguments from `host.json`,
//! `FUNCTIONS_CUSTOMHANDLER_PORT` set) and sends an Event Grid invocation and
//! its redelivery: `executed`, then `duplicate`.
//!
//! When the musl target or Zig cannot be installed, `package.sh` fails
//! saying why and so does this test: it never passes on a glibc build.

mod common;

use std::collections::BTreeSet;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// Build the package with the project's own script; the zip's path.
///
/// In the dev profile: what is checked here (the layout, the modes, the
/// static link, the start and the answers) does not depend on the
/// optimizer, and the release build for musl took 12 of CI's minutes.
///
/// With `sudo`, `apt-get` and `musl-gcc` first on `PATH` as stand-ins that
/// fail and leave a mark: the build needs none of them (Zig compiles and
/// links the C code), so it runs where users are, without root.
fn build_package() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let poisoned = tempfile::tempdir().expect("temp dir");
    let marks = poisoned.path().join("called");
    for tool in ["sudo", "apt-get", "musl-gcc"] {
        let path = poisoned.path().join(tool);
        std::fs::write(
            &path,
            format!("#!/bin/sh\necho {tool} >> '{}'\nexit 1\n", marks.display()),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let path = format!(
        "{}:{}",
        poisoned.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(root.join("scripts/package.sh"))
        .env("ORDER_GUARD_PACKAGE_PROFILE", "dev")
        .env("PATH", path)
        .env_remove("CC_x86_64_unknown_linux_musl")
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/package.sh");
    assert!(
        out.status.success(),
        "scripts/package.sh failed (its error is above): the package could not be built"
    );
    assert!(
        !marks.exists(),
        "the build called {}: it must need no root, no package manager and no musl-gcc",
        std::fs::read_to_string(&marks).unwrap_or_default().trim()
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let zip = stdout
        .lines()
        .last()
        .expect("package.sh prints the zip's path");
    root.join(zip.trim())
}

/// Unpack every entry, giving each file the Unix mode recorded in the zip
/// (as Azure's zip deploy and `unzip` do); the entry names.
fn unpack(zip_path: &Path, into: &Path) -> BTreeSet<String> {
    let file = std::fs::File::open(zip_path).expect("open the package");
    let mut archive = zip::ZipArchive::new(file).expect("the package is a zip");
    let mut names = BTreeSet::new();
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i).expect("a zip entry");
        let name = entry.name().to_string();
        let dest = into.join(entry.enclosed_name().expect("a safe entry name"));
        if entry.is_dir() {
            std::fs::create_dir_all(&dest).unwrap();
            continue;
        }
        names.insert(name.clone());
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).unwrap();
        std::fs::write(&dest, bytes).unwrap();
        let mode = entry
            .unix_mode()
            .unwrap_or_else(|| panic!("{name} carries no Unix mode in the zip"));
        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(mode & 0o777)).unwrap();
    }
    names
}

/// Does the ELF file ask for a program interpreter (the dynamic loader)?
fn needs_dynamic_loader(binary: &Path) -> bool {
    let out = Command::new("readelf")
        .args(["-l", &binary.display().to_string()])
        .output()
        .expect("readelf (binutils) is needed to inspect the binary");
    assert!(
        out.status.success(),
        "readelf failed on {}",
        binary.display()
    );
    String::from_utf8_lossy(&out.stdout).contains("program interpreter")
}

/// The ELF file's `.debug_*` sections.
fn debug_sections(binary: &Path) -> Vec<String> {
    let out = Command::new("readelf")
        .args(["-S", "-W", &binary.display().to_string()])
        .output()
        .expect("readelf (binutils) is needed to inspect the binary");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with(".debug_"))
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn the_package_starts_as_the_host_starts_it_and_guards_orders() {
    let zip = build_package();
    let app = tempfile::tempdir().expect("temp dir");
    let names = unpack(&zip, app.path());
    assert_eq!(
        names,
        BTreeSet::from([
            "DeadLetterSweep/function.json".to_string(),
            "OrderTrigger/function.json".to_string(),
            "host.json".to_string(),
            "order-guard".to_string(),
        ]),
        "the app root must hold host.json, the two functions' function.json and the binary, nothing else"
    );

    // The executable and its arguments, as the host reads them.
    let host: Value =
        serde_json::from_str(&std::fs::read_to_string(app.path().join("host.json")).unwrap())
            .expect("host.json is JSON");
    let description = &host["customHandler"]["description"];
    let exe = description["defaultExecutablePath"]
        .as_str()
        .expect("customHandler.description.defaultExecutablePath");
    let args: Vec<String> = description["arguments"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
        .unwrap_or_default();
    let workdir = app
        .path()
        .join(description["workingDirectory"].as_str().unwrap_or(""));
    let binary = app.path().join(exe);

    let mode = std::fs::metadata(&binary).unwrap().permissions().mode();
    assert!(
        mode & 0o111 != 0,
        "{exe} is not executable from the zip's own modes ({mode:o}): the host could not start it"
    );
    assert!(
        !needs_dynamic_loader(&binary),
        "{exe} in the package is dynamically linked: it must be a static (musl) binary"
    );
    let debug = debug_sections(&binary);
    assert!(
        debug.is_empty(),
        "{exe} in the package carries debug info ({debug:?}): it is uploaded on every deploy and mapped on every start"
    );

    // A dead-lettered order waiting in Blob Storage (Azurite), for the
    // packaged DeadLetterSweep function to replay.
    let azurite = common::azurite::Azurite::start();
    let container = azurite.container("deadletters").await;
    let dead_id = common::unique_id("pkg-dead");
    let mut dead = common::eg_event(common::order_data(&dead_id, "buy", "MSFT", "2", "acct-1"));
    dead["deadLetterReason"] = Value::from("MaxDeliveryAttemptsExceeded");
    dead["deliveryAttempts"] = Value::from(30);
    assert!(container
        .put_new(
            "ORDERS-TO-GUARD/2025/6/14/9/00000000-0000-0000-0000-000000000001.json",
            bytes::Bytes::from(Value::Array(vec![dead]).to_string()),
        )
        .await
        .unwrap());

    // Start it as the host does: embedded defaults (no Redis, no SQL Server).
    let port = common::free_port();
    let mut cmd = tokio::process::Command::new(&binary);
    cmd.args(&args)
        .current_dir(&workdir)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    for (k, v) in common::handler_env(port, app.path()) {
        cmd.env(k, v);
    }
    cmd.env("DEAD_LETTER_STORAGE", azurite.connection_string())
        .env("DEAD_LETTER_CONTAINER", "deadletters");
    let mut child = cmd.spawn().expect("start the packaged binary");
    common::wait_ready(port, &mut child, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("the packaged handler did not start: {e}"));

    let id = common::unique_id("pkg");
    let event = common::eg_event(common::order_data(&id, "buy", "MSFT", "10", "acct-1"));
    let body = serde_json::to_vec(&common::invocation(event)).unwrap();
    let url = format!("http://127.0.0.1:{port}/OrderTrigger");
    let first = common::send("POST", &url, body.clone(), false).await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    assert_eq!(
        first.body["ReturnValue"]["outcome"], "executed",
        "{:?}",
        first.body
    );
    let again = common::send("POST", &url, body, false).await;
    assert_eq!(again.status, 200, "{:?}", again.body);
    assert_eq!(
        again.body["ReturnValue"]["outcome"], "duplicate",
        "{:?}",
        again.body
    );
    assert!(
        workdir.join("order-guard.db").exists(),
        "the embedded store lives in the app root"
    );

    // The host's timer invocation of DeadLetterSweep: the dead-lettered
    // order is executed, once, and its blob moved under replayed/.
    let timer = serde_json::json!({
        "Data": {"timer": {"Schedule": {"AdjustForDST": true}, "ScheduleStatus": null, "IsPastDue": false}},
        "Metadata": {"sys": {"MethodName": "DeadLetterSweep", "UtcNow": "2025-06-14T10:00:00Z"}}
    });
    let sweep_url = format!("http://127.0.0.1:{port}/DeadLetterSweep");
    let swept = common::send(
        "POST",
        &sweep_url,
        serde_json::to_vec(&timer).unwrap(),
        false,
    )
    .await;
    assert_eq!(swept.status, 200, "{:?}", swept.body);
    assert_eq!(
        swept.body["ReturnValue"]["summary"]["executed"], 1,
        "{:?}",
        swept.body
    );
    let again = common::send(
        "POST",
        &sweep_url,
        serde_json::to_vec(&timer).unwrap(),
        false,
    )
    .await;
    assert_eq!(again.status, 200, "{:?}", again.body);
    assert_eq!(
        again.body["ReturnValue"]["summary"]["executed"], 0,
        "a second sweep executes nothing: {:?}",
        again.body
    );
    child.kill().await.ok();
}
