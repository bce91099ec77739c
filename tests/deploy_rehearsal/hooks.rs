//! The azd template's hooks rehearsed as `azd up` runs them: azure.yaml
//! read for each hook's script, each run under `bash -euo pipefail` in
//! azd's order (preprovision, provisioning, postprovision, prepackage,
//! deploying, postdeploy) with azd's environment between them, and
//! recording stand-ins for `azd`, `az`, `curl`, `cargo`, `sqlcmd`,
//! `rustup` and the package script first on `PATH` (Python is the real
//! one). Then `azd down` and `azd up` again with the same environment, and
//! an `azd up` as a service principal. What the smoke test publishes is
//! parsed as Event Grid would and replayed through the real binary.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const SUBSCRIPTION: &str = "00000000-0000-0000-0000-00000000aaaa";
const USER_OID: &str = "0000aaaa-0000-0000-0000-000000000001";
const SP_OID: &str = "0000cccc-0000-0000-0000-000000000003";
const SP_APP_ID: &str = "0000dddd-0000-0000-0000-000000000004";
const TOPIC_ID: &str = "/subscriptions/00000000-0000-0000-0000-00000000aaaa/resourceGroups/rg-dev/providers/Microsoft.EventGrid/topics/evgt-orders-x";

/// One stand-in for every tool: records its arguments, one line each in
/// brackets, and answers as the real tool would what the hooks ask of it.
const STAND_IN: &str = r#"#!/usr/bin/env bash
set -u
name=$(basename "$0")
{ printf '%s' "$name"; for a in "$@"; do printf ' [%s]' "$a"; done; echo; } >> "$REHEARSAL/calls.log"
count() { local f="$REHEARSAL/count-$1"; local n=$(( $(cat "$f" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$f"; echo "$n"; }
has() { case " $ARGS " in *" $1 "*) return 0 ;; esac; return 1; }
ARGS="$*"
case "$name" in
  azd)
    if [ "$1 $2" = "env set" ]; then printf '%s=%s\n' "$3" "$4" >> "$REHEARSAL/azd.env"; fi ;;
  az)
    case "$1 $2" in
      "account show")
        if [ "$REHEARSAL_PRINCIPAL" = sp ]; then printf '%s\tservicePrincipal\n' "$SP_APP_ID"
        else printf 'operator@example.com\tuser\n'; fi ;;
      "account get-access-token")
        if has https://eventgrid.azure.net; then echo eg-token; exit 0; fi
        payload=$(printf '{"oid":"%s"}' "$REHEARSAL_OID" | base64 | tr '+/' '-_' | tr -d '=\n')
        echo "eyJhbGciOiJSUzI1NiJ9.$payload.c2ln" ;;
      "functionapp list-flexconsumption-locations")
        printf 'swedencentral\neastus\nwesteurope\n' ;;
      "provider show")
        printf 'Sweden Central\nEast US\n%s\n' "${REHEARSAL_REDIS_REGION:-West Europe}" ;;
      "rest --method")
        n=$(count rest)
        body=""; prev=""
        for a in "$@"; do [ "$prev" = --body ] && body=${a#@}; prev=$a; done
        cp "$body" "$REHEARSAL/subscription-$n.json"
        if [ "$n" -le "${REHEARSAL_REST_FAILURES:-0}" ]; then
          echo "ERROR: (BadRequest) Destination endpoint not found." >&2; exit 1
        fi ;;
    esac ;;
  curl)
    case "$ARGS" in
      *api.ipify.org*) echo 203.0.113.7 ;;
      *api/events*)
        n=$(count publish)
        out=""; data=""; prev=""
        for a in "$@"; do
          [ "$prev" = -o ] && out=$a
          [ "$prev" = --data-binary ] && data=${a#@}
          prev=$a
        done
        cp "$data" "$REHEARSAL/published-$n.json"
        echo '{}' > "$out"
        if [ "$n" -le "${REHEARSAL_PUBLISH_REFUSALS:-0}" ]; then printf '%s' "${REHEARSAL_REFUSAL:-401}"
        else printf 200; fi ;;
    esac ;;
  cargo)
    for a in "$@"; do last=$a; done
    if has status; then
      if [ "${REHEARSAL_STATUS:-}" != never ] && grep -qs "\"$last\"" "$REHEARSAL"/published-*.json; then
        echo "order   $last Executed sell 10 MSFT for acct-5521 (fingerprint f, attempts 1, received now)"
      else
        echo "order   $last: no row in SQL Server"
      fi
    fi ;;
esac
exit 0
"#;

/// The package script's stand-in: writes a zip where it is told to, as
/// `scripts/package.sh --out FILE` does.
const PACKAGE_STAND_IN: &str = r#"#!/usr/bin/env bash
set -eu
echo "package.sh $*" >> "$REHEARSAL/calls.log"
[ "$1" = --out ] && mkdir -p "$(dirname "$2")" && echo zip > "$2" && echo "$2"
"#;

/// azure.yaml's hooks: name → (the posix script, the Windows command).
fn hooks_of(yaml: &str) -> BTreeMap<String, (String, String)> {
    let mut hooks = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut variant = "";
    for line in yaml.lines() {
        let t = line.trim();
        if let Some(name) = t.strip_suffix(':') {
            if [
                "preprovision",
                "postprovision",
                "prepackage",
                "postdeploy",
                "predown",
                "postdown",
            ]
            .contains(&name)
            {
                current = Some(name.to_string());
                hooks.insert(name.to_string(), (String::new(), String::new()));
                continue;
            }
            if name == "posix" || name == "windows" {
                variant = if name == "posix" { "posix" } else { "windows" };
                continue;
            }
        }
        if let (Some(hook), Some(run)) = (&current, t.strip_prefix("run: ")) {
            let entry = hooks.get_mut(hook).unwrap();
            match variant {
                "posix" => entry.0 = run.to_string(),
                _ => entry.1 = run.to_string(),
            }
        }
    }
    hooks
}

fn executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A checkout of the template with the stand-ins, and azd's environment.
struct Azd {
    dir: tempfile::TempDir,
    hooks: BTreeMap<String, (String, String)>,
    vars: Vec<(String, String)>,
}

/// What one hook did.
struct Ran {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Azd {
    /// A new environment of an identity: `sp` for a service principal.
    fn new(sp: bool) -> Azd {
        let dir = tempfile::tempdir().unwrap();
        let root = Path::new(ROOT);
        let work = dir.path().join("work");
        std::fs::create_dir_all(work.join("infra/hooks")).unwrap();
        std::fs::create_dir_all(work.join("scripts")).unwrap();
        std::fs::create_dir_all(work.join("samples")).unwrap();
        std::fs::create_dir_all(dir.path().join("bin")).unwrap();
        for entry in std::fs::read_dir(root.join("infra/hooks")).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(
                &path,
                work.join("infra/hooks").join(path.file_name().unwrap()),
            )
            .unwrap();
        }
        std::fs::copy(root.join("azure.yaml"), work.join("azure.yaml")).unwrap();
        std::fs::copy(
            root.join("samples/publish.json"),
            work.join("samples/publish.json"),
        )
        .unwrap();
        executable(&work.join("scripts/package.sh"), PACKAGE_STAND_IN);
        for tool in ["azd", "az", "curl", "cargo", "sqlcmd", "rustup"] {
            executable(&dir.path().join("bin").join(tool), STAND_IN);
        }
        let yaml = std::fs::read_to_string(root.join("azure.yaml")).unwrap();
        let oid = if sp { SP_OID } else { USER_OID };
        let vars = vec![
            (
                "REHEARSAL_PRINCIPAL".into(),
                if sp { "sp" } else { "user" }.into(),
            ),
            ("REHEARSAL_OID".into(), oid.into()),
            ("SP_APP_ID".into(), SP_APP_ID.into()),
            ("ORDER_GUARD_HOOK_PAUSE".into(), "0.05".into()),
            ("ORDER_GUARD_HOOK_PATIENCE".into(), "3".into()),
        ];
        let azd = Azd {
            dir,
            hooks: hooks_of(&yaml),
            vars,
        };
        // What azd itself puts in a new environment.
        azd.env_set("AZURE_ENV_NAME", "dev");
        azd.env_set("AZURE_LOCATION", "swedencentral");
        azd.env_set("AZURE_SUBSCRIPTION_ID", SUBSCRIPTION);
        azd.env_set("AZURE_PRINCIPAL_ID", oid);
        azd
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn env_set(&self, key: &str, value: &str) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("azd.env"))
            .unwrap();
        writeln!(f, "{key}={value}").unwrap();
    }

    /// azd's environment as it is now (the last value of each key).
    fn env(&self) -> BTreeMap<String, String> {
        std::fs::read_to_string(self.path("azd.env"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn calls(&self) -> String {
        std::fs::read_to_string(self.path("calls.log")).unwrap_or_default()
    }

    /// Run one hook as azd does: its script, with azd's environment.
    fn hook(&self, name: &str, extra: &[(&str, &str)]) -> Ran {
        let (script, _) = self
            .hooks
            .get(name)
            .unwrap_or_else(|| panic!("azure.yaml has no {name} hook"));
        let path = format!(
            "{}:{}",
            self.path("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let out = Command::new("bash")
            .args(["-euo", "pipefail"])
            .arg(script)
            .current_dir(self.path("work"))
            .env_clear()
            .env("PATH", path)
            .env("HOME", self.dir.path())
            .env("REHEARSAL", self.dir.path())
            .envs(self.env())
            .envs(self.vars.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .envs(extra.iter().copied())
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run bash");
        Ran {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// The template's outputs, as azd keeps them after provisioning.
    fn provision(&self) {
        let rg = "/subscriptions/00000000-0000-0000-0000-00000000aaaa/resourceGroups/rg-dev";
        for (k, v) in [
            ("AZURE_RESOURCE_GROUP", "rg-dev".to_string()),
            ("AZURE_IDENTITY_NAME", "id-orderguard-x".into()),
            (
                "AZURE_IDENTITY_ID",
                format!("{rg}/providers/Microsoft.ManagedIdentity/userAssignedIdentities/id-orderguard-x"),
            ),
            (
                "AZURE_FUNCTION_APP_ID",
                format!("{rg}/providers/Microsoft.Web/sites/func-orderguard-x"),
            ),
            ("SQL_SERVER_NAME", "sql-orderguard-x".into()),
            ("SQL_SERVER_FQDN", "sql-orderguard-x.database.windows.net".into()),
            ("SQL_DATABASE_NAME", "orders".into()),
            ("SQL_CONNECTION_STRING", "Server=tcp:sql-orderguard-x.database.windows.net,1433;Initial Catalog=orders;Authentication=Active Directory Default;Encrypt=True".into()),
            ("EVENT_GRID_TOPIC_ID", TOPIC_ID.into()),
            (
                "EVENT_GRID_TOPIC_ENDPOINT",
                "https://evgt-orders-x.swedencentral-1.eventgrid.azure.net/api/events".into(),
            ),
            (
                "DEAD_LETTER_CONTAINER_ID",
                format!("{rg}/providers/Microsoft.Storage/storageAccounts/stdatax/blobServices/default/containers/deadletters"),
            ),
            ("ORDER_EVENT_TYPES", "Trading.Order.Placed".into()),
        ] {
            self.env_set(k, &v);
        }
    }

    /// `azd up`: each step in azd's order, stopping at the first hook that
    /// fails; the hooks that ran.
    fn up(&self, extra: &[(&str, &str)]) -> Vec<(String, Ran)> {
        let mut ran = Vec::new();
        for step in [
            "preprovision",
            "provision",
            "postprovision",
            "prepackage",
            "deploy",
            "postdeploy",
        ] {
            match step {
                "provision" => self.provision(),
                "deploy" => {
                    let dist = self.path("work/dist/azd/order-guard.zip");
                    assert!(dist.exists(), "nothing at azure.yaml's dist to deploy");
                }
                hook => {
                    let r = self.hook(hook, extra);
                    let ok = r.ok;
                    ran.push((hook.to_string(), r));
                    if !ok {
                        break;
                    }
                }
            }
        }
        ran
    }
}

fn assert_green(ran: &[(String, Ran)], calls: &str) {
    for (hook, r) in ran {
        assert!(
            r.ok,
            "{hook} failed:\n{}\n{}\ncalls:\n{calls}",
            r.stdout, r.stderr
        );
    }
    assert_eq!(ran.len(), 4, "every hook ran");
}

/// Every az call names the subscription azd deploys to.
fn assert_bound_to_the_subscription(calls: &str) {
    for call in calls.lines().filter(|l| l.starts_with("az ")) {
        assert!(
            call.contains(&format!("[--subscription] [{SUBSCRIPTION}]")),
            "an az call without --subscription {SUBSCRIPTION}: {call}"
        );
    }
}

/// What the smoke test published, parsed as Event Grid parses a publish
/// to a custom topic in its own schema, then replayed through the real
/// binary: each event is executed.
fn assert_publishable(file: &Path) -> String {
    let text = std::fs::read_to_string(file).unwrap();
    let events: Vec<Value> = serde_json::from_str(&text).expect("a JSON array of events");
    assert_eq!(events.len(), 1, "{text}");
    let e = &events[0];
    for field in ["id", "subject", "eventType", "eventTime", "dataVersion"] {
        assert!(
            e[field].as_str().is_some_and(|v| !v.is_empty()),
            "Event Grid requires {field}: {e}"
        );
    }
    assert!(
        e.get("topic").is_none() || e["topic"] == TOPIC_ID,
        "a topic that is not the topic's own id is refused (400): {e}"
    );
    assert_eq!(
        e["eventType"], "Trading.Order.Placed",
        "the subscription's filter"
    );
    let order = e["data"]["orderId"]
        .as_str()
        .expect("an order id")
        .to_string();
    let scratch = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_order-guard"))
        .arg("replay")
        .arg(file)
        .current_dir(scratch.path())
        .env_remove("REDIS_URL")
        .env_remove("SQL_CONNECTION_STRING")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("executed=1"),
        "the published event is not executed by the handler:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    order
}

#[test]
fn azure_yaml_runs_one_bash_script_per_hook_on_every_system() {
    let yaml = std::fs::read_to_string(Path::new(ROOT).join("azure.yaml")).unwrap();
    assert!(yaml.contains("requiredVersions:") && yaml.contains("azd: \">= 1.20.0\""));
    assert!(
        yaml.contains("dist: dist/azd/order-guard.zip"),
        "azd must deploy the package's own zip (its modes), not zip a folder again"
    );
    let hooks = hooks_of(&yaml);
    assert_eq!(
        hooks.keys().collect::<Vec<_>>(),
        ["postdeploy", "postprovision", "prepackage", "preprovision"]
    );
    for (name, (posix, windows)) in &hooks {
        let script = format!(
            "infra/hooks/{}.sh",
            if name == "prepackage" {
                "package"
            } else {
                name
            }
        );
        assert_eq!(posix, &script, "{name}");
        assert!(Path::new(ROOT).join(&script).exists(), "{script}");
        let stem = script
            .trim_start_matches("infra/hooks/")
            .trim_end_matches(".sh");
        assert_eq!(
            windows,
            &format!("./infra/hooks/bash.ps1 {stem}; exit $LASTEXITCODE"),
            "{name}'s Windows variant runs the same script"
        );
    }
    // No hook asks for root or a package manager.
    for script in [
        "preprovision",
        "postprovision",
        "package",
        "postdeploy",
        "lib",
    ] {
        let text =
            std::fs::read_to_string(Path::new(ROOT).join(format!("infra/hooks/{script}.sh")))
                .unwrap();
        for word in ["sudo", "apt-get", "signed-in-user"] {
            assert!(!text.contains(word), "{script}.sh uses {word}");
        }
    }
}

#[test]
fn up_down_up_and_a_service_principal_up_end_green() {
    // A first `azd up`: Event Grid does not see the function at once, and
    // the topic refuses the new role twice.
    let azd = Azd::new(false);
    let first = azd.up(&[
        ("REHEARSAL_REST_FAILURES", "1"),
        ("REHEARSAL_PUBLISH_REFUSALS", "2"),
    ]);
    let calls = azd.calls();
    assert_green(&first, &calls);
    assert_bound_to_the_subscription(&calls);
    assert!(
        !calls.contains("azd [provision]"),
        "a hook provisions again: {calls}"
    );
    assert_eq!(
        azd.env().get("AZURE_PRINCIPAL_NAME").map(String::as_str),
        Some("operator@example.com")
    );
    let subscription: Value =
        serde_json::from_str(&std::fs::read_to_string(azd.path("subscription-2.json")).unwrap())
            .unwrap();
    let p = &subscription["properties"];
    assert_eq!(
        p["destination"]["properties"]["resourceId"],
        format!(
            "{}/functions/OrderTrigger",
            azd.env()["AZURE_FUNCTION_APP_ID"]
        )
    );
    assert_eq!(p["filter"]["includedEventTypes"][0], "Trading.Order.Placed");
    assert_eq!(p["retryPolicy"]["maxDeliveryAttempts"], 30);
    assert_eq!(p["retryPolicy"]["eventTimeToLiveInMinutes"], 1440);
    let dead = &p["deadLetterWithResourceIdentity"];
    assert_eq!(dead["identity"]["type"], "UserAssigned");
    assert_eq!(
        dead["identity"]["userAssignedIdentity"],
        azd.env()["AZURE_IDENTITY_ID"]
    );
    assert_eq!(
        dead["deadLetterDestination"]["properties"]["blobContainerName"],
        "deadletters"
    );
    assert!(dead["deadLetterDestination"]["properties"]["resourceId"]
        .as_str()
        .unwrap()
        .ends_with("/storageAccounts/stdatax"));
    // Published twice after two refusals, and read back executed.
    let order = assert_publishable(&azd.path("published-4.json"));
    let postdeploy = &first.last().unwrap().1;
    assert!(
        postdeploy
            .stdout
            .contains(&format!("smoke test passed: {order} executed")),
        "{}",
        postdeploy.stdout
    );

    // `azd down` removes the resources and keeps the environment; the next
    // `azd up` runs the same way, the subscription made again.
    std::fs::remove_file(azd.path("calls.log")).unwrap();
    let again = azd.up(&[]);
    let calls = azd.calls();
    assert_green(&again, &calls);
    assert_bound_to_the_subscription(&calls);
    assert_eq!(
        calls
            .lines()
            .filter(|l| l.starts_with("az [rest] [--method] [put]"))
            .count(),
        1,
        "{calls}"
    );

    // A service principal (CI, `azd pipeline config`).
    let sp = Azd::new(true);
    let ran = sp.up(&[]);
    let calls = sp.calls();
    assert_green(&ran, &calls);
    assert_bound_to_the_subscription(&calls);
    assert_eq!(
        sp.env().get("AZURE_PRINCIPAL_NAME").map(String::as_str),
        Some(SP_APP_ID),
        "a service principal's admin login is its application id"
    );
}

#[test]
fn a_smoke_test_failing_after_a_good_deploy_warns_and_ends_green() {
    for (why, extra, expect) in [
        (
            "never executed",
            vec![("REHEARSAL_STATUS", "never")],
            "was not executed within",
        ),
        (
            "the role never applies",
            vec![
                ("REHEARSAL_PUBLISH_REFUSALS", "1000"),
                ("REHEARSAL_REFUSAL", "403"),
            ],
            "EventGrid Data Sender",
        ),
    ] {
        let azd = Azd::new(false);
        let ran = azd.up(&extra);
        let calls = azd.calls();
        assert_green(&ran, &calls);
        let postdeploy = &ran.last().unwrap().1;
        assert!(
            postdeploy.stderr.contains("WARNING: smoke test:")
                && postdeploy.stderr.contains(expect)
                && postdeploy
                    .stderr
                    .contains("cargo run --release -- status smoke-"),
            "{why}: {}",
            postdeploy.stderr
        );
    }
}

#[test]
fn a_subscription_event_grid_never_takes_fails_the_deploy_saying_how_to_retry() {
    let azd = Azd::new(false);
    let ran = azd.up(&[("REHEARSAL_REST_FAILURES", "1000")]);
    let (hook, postdeploy) = ran.last().unwrap();
    assert_eq!(hook, "postdeploy");
    assert!(!postdeploy.ok);
    assert!(
        postdeploy.stderr.contains("Destination endpoint not found")
            && postdeploy.stderr.contains("azd hooks run postdeploy"),
        "{}",
        postdeploy.stderr
    );
}

#[test]
fn az_and_azd_signed_in_as_different_identities_stop_before_provisioning() {
    let azd = Azd::new(false);
    azd.env_set("AZURE_PRINCIPAL_ID", SP_OID);
    let ran = azd.up(&[]);
    assert_eq!(ran.len(), 1, "nothing runs after preprovision");
    let (_, pre) = &ran[0];
    assert!(!pre.ok);
    assert!(
        pre.stderr.contains(USER_OID) && pre.stderr.contains(SP_OID),
        "{}",
        pre.stderr
    );
}

#[test]
fn a_region_without_flex_or_managed_redis_stops_before_provisioning_naming_which() {
    for (location, missing) in [
        ("southafricawest", "Flex Consumption"),
        ("westeurope", "Azure Managed Redis"),
    ] {
        let azd = Azd::new(false);
        azd.env_set("AZURE_LOCATION", location);
        let ran = azd.up(&[("REHEARSAL_REDIS_REGION", "North Europe")]);
        assert_eq!(ran.len(), 1, "nothing runs after preprovision");
        let (_, pre) = &ran[0];
        assert!(!pre.ok, "{location}");
        assert!(
            pre.stderr
                .contains(&format!("region {location} does not offer {missing}")),
            "{location}: {}",
            pre.stderr
        );
    }
    // Offered, named as Azure names its display names: provisioning goes on.
    let azd = Azd::new(false);
    azd.env_set("AZURE_LOCATION", "eastus");
    let ran = azd.up(&[]);
    assert_green(&ran, &azd.calls());
}
