//! `local.settings.json.example` stays in step with the code: what
//! `func start` (and a user copying the example into Application settings)
//! gives the handler is exactly what the handler reads, plus what the
//! Functions host itself reads.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use order_guard::config::Config;
use serde_json::Value;

/// Set by the Functions host or the platform, never by the user: the port,
/// and the variables that say which hosting plan this is (`hosting::VARIABLES`);
/// or read only by `order-guard webhook`, which no Functions host runs
/// (`config::WEBHOOK_VARIABLES`).
fn set_by_the_platform(k: &str) -> bool {
    ["FUNCTIONS_CUSTOMHANDLER_PORT", "FUNCTIONS_HTTPWORKER_PORT"].contains(&k)
        || order_guard::hosting::VARIABLES.contains(&k)
        || order_guard::config::WEBHOOK_VARIABLES.contains(&k)
}

/// Entries the Functions host reads, not the handler (the sweep's timer
/// schedule is resolved by the host from `DeadLetterSweep/function.json`).
const READ_BY_THE_HOST: [&str; 3] = [
    "FUNCTIONS_WORKER_RUNTIME",
    "AzureWebJobsStorage",
    "DEAD_LETTER_SWEEP_SCHEDULE",
];

/// Read by the handler outside `Config`: the log filter (env_logger, in
/// `logging::init`). Fault points (`FAILPOINTS`) exist only in test
/// builds and stay out of the example on purpose; Entra ID's variables
/// (`IDENTITY_ENDPOINT`, `AZURE_CLIENT_ID`, …) are set by the platform.
const READ_OUTSIDE_CONFIG: [&str; 1] = ["RUST_LOG"];

/// What `func start` gives the handler: the example's values plus what
/// Core Tools sets for the host it starts (`FUNCTIONS_CORETOOLS_ENVIRONMENT
/// =true`, Core Tools' `Program.Main`), which the host passes on.
fn under_core_tools() -> BTreeMap<String, String> {
    let mut env = example_values();
    env.insert("FUNCTIONS_CORETOOLS_ENVIRONMENT".into(), "true".into());
    env
}

fn example_values() -> BTreeMap<String, String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/local.settings.json.example");
    let text = std::fs::read_to_string(path).expect("read local.settings.json.example");
    let json: Value = serde_json::from_str(&text).expect("local.settings.json.example is JSON");
    assert_eq!(
        json["IsEncrypted"],
        Value::Bool(false),
        "IsEncrypted must be false"
    );
    json["Values"]
        .as_object()
        .expect("a Values object")
        .iter()
        .map(|(k, v)| {
            let v = v
                .as_str()
                .unwrap_or_else(|| panic!("{k}: Values must be strings (the host reads strings)"));
            (k.clone(), v.to_string())
        })
        .collect()
}

/// Every variable `Config` asks for, over `environments`, and whether each
/// environment was accepted.
fn asked(environments: &[BTreeMap<String, String>]) -> (BTreeSet<String>, Vec<Result<(), String>>) {
    let names = RefCell::new(BTreeSet::new());
    let mut results = Vec::new();
    for env in environments {
        let r = Config::from_lookup(|k| {
            names.borrow_mut().insert(k.to_string());
            env.get(k).cloned()
        });
        results.push(r.map(|_| ()).map_err(|e| e.to_string()));
    }
    (names.into_inner(), results)
}

#[test]
fn the_example_holds_every_setting_the_handler_reads_and_nothing_else() {
    let example = example_values();
    let mut in_azure = example.clone();
    in_azure.insert("WEBSITE_INSTANCE_ID".into(), "instance".into());
    // The embedded defaults too: some settings are read only on that path.
    let embedded = BTreeMap::from([("WEBSITE_INSTANCE_ID".to_string(), "instance".to_string())]);
    let (read, results) = asked(&[under_core_tools(), in_azure, BTreeMap::new(), embedded]);

    assert_eq!(
        results[0],
        Ok(()),
        "the example's own values must be accepted by the handler"
    );

    let user_settings: BTreeSet<&str> = read
        .iter()
        .map(String::as_str)
        .filter(|k| !set_by_the_platform(k))
        .chain(READ_OUTSIDE_CONFIG)
        .collect();
    let missing: Vec<&&str> = user_settings
        .iter()
        .filter(|k| !example.contains_key(**k))
        .collect();
    assert!(
        missing.is_empty(),
        "the handler reads {missing:?}, which local.settings.json.example does not list"
    );
    let unknown: Vec<&String> = example
        .keys()
        .filter(|k| !user_settings.contains(k.as_str()) && !READ_BY_THE_HOST.contains(&k.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "local.settings.json.example lists {unknown:?}, which neither the handler nor the Functions host reads"
    );
    for k in READ_BY_THE_HOST {
        assert!(
            example.contains_key(k),
            "{k} (read by the Functions host) is missing"
        );
    }
    assert_eq!(example["FUNCTIONS_WORKER_RUNTIME"], "custom");
}

#[test]
fn the_handler_reads_its_log_filter_from_rust_log() {
    // env_logger's default variable: this test breaks if logging stops
    // reading it, so READ_OUTSIDE_CONFIG stays true.
    let logging = include_str!("../src/logging.rs");
    assert!(
        logging.contains("env_logger::Env::default()"),
        "logging.rs no longer builds its logger from env_logger's default (RUST_LOG) environment"
    );
}

/// Copied unedited for `func start`, the example gives the embedded defaults
/// (in-memory guard, SQLite file), not placeholder Azure hosts that would
/// make every event `retry`.
#[test]
fn the_example_copied_unedited_runs_on_the_embedded_defaults() {
    use order_guard::config::{GuardConfig, StoreConfig, DEFAULT_SQLITE_PATH};
    let example = under_core_tools();
    let config = Config::from_lookup(|k| example.get(k).cloned()).expect("the example is accepted");
    assert_eq!(
        config.guard,
        GuardConfig::Memory,
        "REDIS_URL must be empty in the example"
    );
    assert_eq!(
        config.store,
        StoreConfig::Sqlite {
            path: DEFAULT_SQLITE_PATH.into(),
            create_if_missing: true,
        },
        "SQL_CONNECTION_STRING must be empty in the example"
    );
}

/// Copied into an Azure app as it is, the example must not start there on
/// the embedded defaults: every hosting plan refuses it.
#[test]
fn the_example_copied_into_azure_is_refused() {
    let example = example_values();
    for plan in [
        ("WEBSITE_INSTANCE_ID", "8c3ab2d1e5f64d7e"),
        ("CONTAINER_NAME", "E9A1C2_orders"),
        ("WEBSITE_SKU", "FlexConsumption"),
        ("MANAGED_ENVIRONMENT", "true"),
    ] {
        let mut env = example.clone();
        env.insert(plan.0.into(), plan.1.into());
        let e = Config::from_lookup(|k| env.get(k).cloned())
            .expect_err("the example must be refused on an Azure plan");
        assert_eq!(e.var, "REDIS_URL", "{plan:?}: {e}");
    }
}

/// The host's storage connection in the example is the local emulator's
/// (Azurite): the manual deployment (docs/deploy.md, step 7) must say it is
/// never copied into Azure.
#[test]
fn the_deploy_steps_say_which_local_settings_are_never_copied() {
    let example = example_values();
    assert_eq!(example["AzureWebJobsStorage"], "UseDevelopmentStorage=true");
    let deploy = include_str!("../docs/deploy.md");
    let section = deploy
        .split("never copied")
        .nth(1)
        .expect("docs/deploy.md has a passage on settings never copied into Azure");
    let passage: String = section.chars().take(1500).collect();
    for k in ["AzureWebJobsStorage", "ORDER_GUARD_ALLOW_EMBEDDED_STATE"] {
        assert!(
            passage.contains(k),
            "docs/deploy.md's 'never copied' passage does not name {k}"
        );
    }
}

/// The same example in a Functions container that is not Core Tools (a
/// user copying it into their own image, or Azure): its empty `REDIS_URL`
/// is refused, naming where it runs; it never runs one replica's own state.
#[test]
fn the_example_outside_core_tools_is_refused() {
    let example = example_values();
    let e = Config::from_lookup(|k| example.get(k).cloned()).unwrap_err();
    assert_eq!(e.var, "REDIS_URL", "{e}");
    assert!(
        e.to_string().contains("not Core Tools")
            && e.to_string()
                .contains("ORDER_GUARD_ALLOW_EMBEDDED_STATE=true"),
        "{e}"
    );
}
