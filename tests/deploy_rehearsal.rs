//! The manual deployment (`docs/deploy.md`) rehearsed as an operator runs
//! it: its ```sh blocks, in order, in one `bash -euo pipefail`, with
//! recording stand-ins for `az`, `sqlcmd`, `curl` and `cargo` first on
//! `PATH`. A variable no earlier block defines stops the run (`set -u`), as
//! it would stop the operator; each stand-in refuses an empty flag value
//! (`--scope ""`), as Azure's CLI does, and answers `--query … -o tsv` with
//! a value of the shape asked for (a resource id, an object id, a host
//! name), so later blocks get what the real CLI would give them.
//!
//! `scripts/package.sh` is replaced too (in the rehearsal's own copy of
//! the layout it is called from): it builds the real binary, which
//! `tests/package.rs` tests; here it only prints the zip's path the way the
//! real one does. `tests/az_commands.rs` parses each `az` command with the
//! real CLI; this test holds the blocks together.

use std::path::Path;
use std::process::Command;

#[path = "deploy_rehearsal/hooks.rs"]
mod hooks;

const DEPLOY: &str = include_str!("../docs/deploy.md");

/// The text of each ```sh block, in order.
fn sh_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let fence = line.trim_start();
        if fence.starts_with("```") {
            match current.take() {
                Some(block) => blocks.push(block),
                None if matches!(fence.trim_end(), "```sh" | "```bash") => {
                    current = Some(String::new())
                }
                None => {}
            }
            continue;
        }
        if let Some(block) = current.as_mut() {
            block.push_str(line);
            block.push('\n');
        }
    }
    blocks
}

/// A stand-in for a command: records its arguments (one line, each in
/// brackets), refuses an empty value after a flag, and answers
/// `--query Q -o tsv` with a value of Q's shape.
const STAND_IN: &str = r#"#!/usr/bin/env bash
set -u
name=$(basename "$0")
{ printf '%s' "$name"; for a in "$@"; do printf ' [%s]' "$a"; done; echo; } >> "$REHEARSAL_LOG"
prev=""
for a in "$@"; do
  if [ -z "$a" ] && [[ "$prev" == -* ]]; then
    echo "$name: error: argument $prev: expected one argument (an empty value was given)" >&2
    exit 2
  fi
  prev=$a
done
query="" tsv=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    --query) query="${args[$((i + 1))]:-}" ;;
    -o|--output) [ "${args[$((i + 1))]:-}" = tsv ] && tsv=1 ;;
  esac
done
case "$name" in
  az)
    [ -n "$query" ] && [ -n "$tsv" ] || exit 0
    case "$query" in
      id)
        if [ "${1:-}" = ad ]; then echo 0000aaaa-0000-0000-0000-000000000001
        else echo "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/orders-rg/providers/Microsoft.Rehearsal/${2:-thing}s/rehearsed"
        fi ;;
      principalId|clientId) echo 0000bbbb-0000-0000-0000-000000000002 ;;
      user.name) echo operator@example.com ;;
      properties.hostName) echo orders-guard-redis.westeurope.redis.azure.net ;;
      endpoint) echo https://orders-topic.westeurope-1.eventgrid.azure.net/api/events ;;
      key1) echo a2V5 ;;
      *) echo value ;;
    esac ;;
  curl)
    # The only output a block reads is the caller's public address (-s URL).
    echo 203.0.113.7 ;;
esac
"#;

/// What the stand-in package script prints: the zip's path, as
/// `scripts/package.sh` does on its stdout.
const PACKAGE_STAND_IN: &str = r#"#!/usr/bin/env bash
set -eu
echo "package.sh" >> "$REHEARSAL_LOG"
echo "dist/order-guard-$REHEARSAL_VERSION-linux-x64.zip"
"#;

/// What a rehearsal did.
struct Rehearsal {
    ok: bool,
    stderr: String,
    /// One line per call of a stand-in, and `block N` before each block.
    log: String,
    /// `export -p` after the last block.
    exports: String,
}

fn executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Run `blocks` in order in one `bash -euo pipefail`, in a fresh folder
/// with the stand-ins first on `PATH`.
fn rehearse(blocks: &[String]) -> Rehearsal {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    let work = dir.path().join("work");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(work.join("scripts")).unwrap();
    for name in ["az", "sqlcmd", "curl", "cargo"] {
        executable(&bin.join(name), STAND_IN);
    }
    executable(&work.join("scripts/package.sh"), PACKAGE_STAND_IN);
    let log = dir.path().join("calls.log");
    let exports = dir.path().join("exports");
    let mut script = String::new();
    for (n, block) in blocks.iter().enumerate() {
        script.push_str(&format!("echo 'block {}' >> \"$REHEARSAL_LOG\"\n", n + 1));
        script.push_str(block);
    }
    script.push_str("export -p > \"$REHEARSAL_EXPORTS\"\n");
    let script_path = dir.path().join("deploy.sh");
    std::fs::write(&script_path, script).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .args(["-euo", "pipefail"])
        .arg(&script_path)
        .current_dir(&work)
        .env_clear()
        .env("PATH", path)
        .env("HOME", dir.path())
        .env("REHEARSAL_LOG", &log)
        .env("REHEARSAL_EXPORTS", &exports)
        .env("REHEARSAL_VERSION", env!("CARGO_PKG_VERSION"))
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run bash");
    Rehearsal {
        ok: out.status.success(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        log: std::fs::read_to_string(&log).unwrap_or_default(),
        exports: std::fs::read_to_string(&exports).unwrap_or_default(),
    }
}

/// The calls of one stand-in whose first arguments are `words`.
fn calls<'a>(log: &'a str, words: &str) -> Vec<&'a str> {
    let prefix: String = words
        .split(' ')
        .enumerate()
        .map(|(i, w)| {
            if i == 0 {
                w.to_string()
            } else {
                format!(" [{w}]")
            }
        })
        .collect();
    log.lines().filter(|l| l.starts_with(&prefix)).collect()
}

/// The value after `flag` in a recorded call.
fn value_of<'a>(call: &'a str, flag: &str) -> Option<&'a str> {
    let marker = format!("[{flag}] [");
    let start = call.find(&marker)? + marker.len();
    Some(&call[start..start + call[start..].find(']')?])
}

#[test]
fn the_deploy_blocks_run_in_order_under_bash_strict_mode() {
    let blocks = sh_blocks(DEPLOY);
    assert!(blocks.len() >= 12, "docs/deploy.md's blocks were not found");
    let run = rehearse(&blocks);
    let last = run.log.lines().rfind(|l| l.starts_with("block "));
    assert!(
        run.ok,
        "docs/deploy.md stops at {last:?}:\n{}\ncalls:\n{}",
        run.stderr, run.log
    );
    assert_eq!(
        last,
        Some(format!("block {}", blocks.len()).as_str()),
        "every block ran"
    );

    // The subscription (one PUT of the whole resource: the CLI's own
    // command dead-letters through a system-assigned identity only), and
    // the dead-letter container as Event Grid and the roles are given it.
    let subscription: Vec<&str> = calls(&run.log, "az rest --method put")
        .into_iter()
        .filter(|c| c.contains("/eventSubscriptions/orders-to-guard?"))
        .collect();
    assert_eq!(subscription.len(), 1, "{}", run.log);
    let body = subscription[0]
        .split_once("[--body] [")
        .map(|(_, rest)| rest.strip_suffix(']').unwrap_or(rest))
        .expect("the PUT has a body");
    let body: serde_json::Value = serde_json::from_str(body).expect("the body is JSON");
    let p = &body["properties"];
    assert_eq!(p["destination"]["endpointType"], "AzureFunction", "{body}");
    assert!(p["destination"]["properties"]["resourceId"]
        .as_str()
        .is_some_and(|id| id.ends_with("/functions/OrderTrigger")));
    assert_eq!(
        p["filter"]["includedEventTypes"],
        serde_json::json!(["Trading.Order.Placed"])
    );
    assert_eq!(p["retryPolicy"]["maxDeliveryAttempts"], 30);
    let dead = &p["deadLetterWithResourceIdentity"];
    assert_eq!(dead["identity"]["type"], "UserAssigned", "{body}");
    let dead_letter = format!(
        "{}/blobServices/default/containers/{}",
        dead["deadLetterDestination"]["properties"]["resourceId"]
            .as_str()
            .unwrap(),
        dead["deadLetterDestination"]["properties"]["blobContainerName"]
            .as_str()
            .unwrap()
    );
    let dead_letter = dead_letter.as_str();
    assert!(
        dead_letter.starts_with("/subscriptions/")
            && dead_letter.ends_with("/blobServices/default/containers/deadletters"),
        "{dead_letter}"
    );
    let scopes: Vec<&str> = calls(&run.log, "az role assignment create")
        .into_iter()
        .filter_map(|c| value_of(c, "--scope"))
        .collect();
    for scope in [
        dead_letter.to_string(),
        dead_letter.replace(
            "/blobServices/default/containers/deadletters",
            "/queueServices/default/queues/order-executed",
        ),
    ] {
        assert_eq!(
            scopes.iter().filter(|s| **s == scope).count(),
            2,
            "the app and the operator each get a role at {scope}: {scopes:?}"
        );
    }

    // The package published is the one of this version.
    let zip = calls(&run.log, "az functionapp deployment source config-zip");
    assert_eq!(zip.len(), 1, "{}", run.log);
    assert_eq!(
        value_of(zip[0], "--src"),
        Some(
            format!(
                "dist/order-guard-{}-linux-x64.zip",
                env!("CARGO_PKG_VERSION")
            )
            .as_str()
        )
    );

    // `migrate` runs before the app's database user is made.
    let migrate = run.log.find("cargo [run] [--release] [--] [migrate]");
    let user = run.log.find("sqlcmd ");
    assert!(
        migrate.is_some() && user.is_some() && migrate < user,
        "{}",
        run.log
    );

    // The operator's exports name every destination the app writes to.
    for name in [
        "REDIS_URL",
        "REDIS_AUTH",
        "SQL_CONNECTION_STRING",
        "DEAD_LETTER_STORAGE",
        "OUTBOX_STORAGE",
    ] {
        assert!(
            run.exports.contains(&format!("declare -x {name}=")),
            "step 10 does not export {name}"
        );
    }
    let settings = calls(&run.log, "az functionapp config appsettings set");
    assert!(
        settings.len() == 1 && settings[0].contains("[OUTBOX_STORAGE=https://"),
        "{settings:?}"
    );
}

/// The rehearsal sees what it is for: a variable no block defines, and an
/// empty flag value, each stop it, saying which.
#[test]
fn the_rehearsal_stops_at_an_unbound_variable_and_an_empty_flag_value() {
    let unbound = rehearse(&[
        "RG=orders-rg\n".to_string(),
        "az eventgrid event-subscription create --name s --deadletter-endpoint \"$CONTAINER_ID\"\n"
            .to_string(),
    ]);
    assert!(!unbound.ok);
    assert!(
        unbound.stderr.contains("CONTAINER_ID: unbound variable"),
        "{}",
        unbound.stderr
    );
    assert!(unbound.log.ends_with("block 2\n"), "{}", unbound.log);

    let empty = rehearse(&["X=\naz role assignment create --scope \"$X\"\n".to_string()]);
    assert!(!empty.ok);
    assert!(
        empty
            .stderr
            .contains("argument --scope: expected one argument"),
        "{}",
        empty.stderr
    );
}

/// The stand-ins answer a query with a value of its shape, so a block's
/// later use of it is rehearsed too.
#[test]
fn the_stand_ins_answer_queries_with_plausible_values() {
    let run = rehearse(&[r#"
SA_ID=$(az storage account show --name sa --resource-group rg --query id -o tsv)
ME=$(az ad signed-in-user show --query id -o tsv)
HOST=$(az resource show --ids "$SA_ID" --query properties.hostName -o tsv)
IP=$(curl -s https://api.ipify.org)
export SA_ID ME HOST IP
"#
    .to_string()]);
    assert!(run.ok, "{}", run.stderr);
    for (name, shape) in [
        ("SA_ID", "/subscriptions/"),
        ("ME", "0000aaaa-"),
        ("HOST", ".redis.azure.net"),
        ("IP", "203.0.113.7"),
    ] {
        let line = run
            .exports
            .lines()
            .find(|l| l.starts_with(&format!("declare -x {name}=")))
            .unwrap_or_else(|| panic!("{name} not set: {}", run.exports));
        assert!(line.contains(shape), "{line}");
    }
}
