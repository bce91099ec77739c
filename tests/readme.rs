//! The README stays in step with the code (issue 24), the way
//! `tests/settings.rs` keeps `local.settings.json.example` in step: its
//! settings table lists every variable the handler reads and nothing else,
//! the defaults it shows are the code's, the key format it states is the
//! one the guard writes, and its metric table lists the instruments the
//! code makes.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use order_guard::config::Config;

const README: &str = include_str!("../README.md");

/// Read only in builds with `--features failpoints` (the chaos tests); not a
/// setting of a deployed handler, so not in the table on purpose.
const TEST_BUILDS_ONLY: [&str; 1] = ["FAILPOINTS"];

/// The Configuration table: each row's variables (first column, every
/// backticked name) and its default cell.
fn settings_table() -> Vec<(Vec<String>, String)> {
    let section = README
        .split("\n## Configuration\n")
        .nth(1)
        .expect("the README has a Configuration section");
    let section = section.split("\n## ").next().unwrap();
    let rows: Vec<(Vec<String>, String)> = section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.split(" | ").collect();
            let names = cells[0]
                .trim_start_matches("| ")
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect();
            (names, cells[1].trim().to_string())
        })
        .collect();
    assert!(rows.len() > 10, "the Configuration table was not found");
    rows
}

/// Every variable `Config` asks for over a few environments (some settings
/// are read only on some paths: the embedded default, Azure, Redis).
fn read_by_config() -> BTreeSet<String> {
    let names = RefCell::new(BTreeSet::new());
    let envs: Vec<BTreeMap<&str, &str>> = vec![
        BTreeMap::new(),
        BTreeMap::from([("WEBSITE_INSTANCE_ID", "x")]),
        BTreeMap::from([
            ("FUNCTIONS_WORKER_RUNTIME", "custom"),
            ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
            ("LEGION_SERVICE_HOST", "l"),
        ]),
        BTreeMap::from([
            ("REDIS_URL", "redis://cache:6379"),
            (
                "SQL_CONNECTION_STRING",
                "Server=tcp:db,1433;Initial Catalog=o",
            ),
            ("ORDER_EVENT_TYPES", "A"),
        ]),
    ];
    for env in &envs {
        let _ = Config::from_lookup(|k| {
            names.borrow_mut().insert(k.to_string());
            env.get(k).map(|v| v.to_string())
        });
    }
    names.into_inner()
}

/// Variables read outside `Config`: every string literal passed to
/// `std::env::var`, `var_os` or `env_set` in `src/`, plus env_logger's
/// `RUST_LOG`.
fn read_outside_config() -> BTreeSet<String> {
    let mut names = BTreeSet::from(["RUST_LOG".to_string()]);
    let mut dirs = vec![std::path::PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src"
    ))];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src/") {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for call in ["env::var(\"", "env::var_os(\"", "env_set(\""] {
                for rest in text.split(call).skip(1) {
                    let name = rest.split('"').next().unwrap();
                    if !name.is_empty()
                        && name
                            .bytes()
                            .all(|b| b.is_ascii_uppercase() || b == b'_' || b.is_ascii_digit())
                    {
                        names.insert(name.to_string());
                    }
                }
            }
        }
    }
    names
}

#[test]
fn the_settings_table_lists_every_variable_the_handler_reads_and_nothing_else() {
    let table: BTreeSet<String> = settings_table().into_iter().flat_map(|(n, _)| n).collect();
    let read: BTreeSet<String> = read_by_config()
        .into_iter()
        .chain(read_outside_config())
        .filter(|k| !TEST_BUILDS_ONLY.contains(&k.as_str()))
        .collect();
    let missing: Vec<&String> = read.difference(&table).collect();
    assert!(
        missing.is_empty(),
        "the handler reads {missing:?}, which the README's settings table does not list"
    );
    let unknown: Vec<&String> = table.difference(&read).collect();
    assert!(
        unknown.is_empty(),
        "the README's settings table lists {unknown:?}, which the handler does not read"
    );
}

#[test]
fn the_defaults_shown_are_the_codes() {
    let default = format!("{:?}", Config::from_lookup(|_| None).unwrap());
    let mut checked = 0;
    for (names, cell) in settings_table() {
        let Some(value) = cell.strip_prefix('`').and_then(|c| c.split('`').next()) else {
            continue;
        };
        let name = &names[0];
        if name == "RUST_LOG" {
            let logging = include_str!("../src/logging.rs");
            assert!(
                logging.contains(&format!("default_filter_or(\"{value}\")")),
                "the README says RUST_LOG defaults to {value:?}; src/logging.rs does not"
            );
            checked += 1;
            continue;
        }
        let with = Config::from_lookup(|k| (k == name).then(|| value.to_string()));
        let with = with
            .unwrap_or_else(|e| panic!("{name}={value} (the README's default) is refused: {e}"));
        assert_eq!(
            format!("{with:?}"),
            default,
            "{name}={value} (the README's default) does not give the default configuration"
        );
        checked += 1;
    }
    assert!(checked >= 15, "only {checked} defaults were checked");
    // Defaults written as words: the embedded ones.
    let rows: BTreeMap<String, String> = settings_table()
        .into_iter()
        .map(|(n, d)| (n[0].clone(), d))
        .collect();
    assert!(
        rows["REDIS_URL"].contains("in-memory guard"),
        "{}",
        rows["REDIS_URL"]
    );
    assert!(
        rows["SQL_CONNECTION_STRING"].contains(&format!(
            "sqlite:{}",
            order_guard::config::DEFAULT_SQLITE_PATH
        )),
        "{}",
        rows["SQL_CONNECTION_STRING"]
    );
}

#[test]
fn the_key_format_stated_is_the_one_the_guard_writes() {
    let settings = Config::from_lookup(|_| None).unwrap().guard_settings;
    let key = settings.key("<id>");
    let fp = settings.fingerprint_key("<id>");
    assert_eq!(key, "orden:{<id>}");
    assert_eq!(fp, "orden-fp:{<id>}");
    let redis_doc = include_str!("../docs/redis.md");
    for (text, name) in [(README, "README.md"), (redis_doc, "docs/redis.md")] {
        assert!(
            text.contains(&format!("`{key}`")),
            "{name} does not state the key format {key}"
        );
        assert!(
            text.contains(&format!("`{fp}`")),
            "{name} does not state the fingerprint key format {fp}"
        );
        // The form before hash tags appears only where the upgrade from it is told.
        for line in text.lines().filter(|l| l.contains("`orden:<id>`")) {
            assert!(
                line.contains("before hash tags"),
                "{name} states the old key format: {line}"
            );
        }
    }
    // The reservation value, as the acquire script writes it.
    let script = include_str!("../src/guard/redis.rs");
    assert!(
        script.contains("PROCESANDO:<token>:<deadline ms>"),
        "src/guard/redis.rs changed the reservation value"
    );
    assert!(README.contains("PROCESANDO:<token>:<deadline ms>"));
    assert!(
        !README.contains("PROCESANDO:<token> "),
        "the README states a reservation value without the deadline"
    );
}

/// Every command line we hand a reader or run ourselves that starts Azurite
/// turns its usage telemetry off (by default it reports to a Microsoft host
/// on the internet): the README, the docs and the scripts.
#[test]
fn every_azurite_command_we_show_or_run_disables_its_telemetry() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    for dir in ["docs", "scripts"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            files.push(entry.unwrap().path());
        }
    }
    files.push(root.join("tests/common/azurite.rs"));
    let starts = ["npx azurite", "azurite-blob ", "azurite --", "main.js"];
    let mut checked = 0;
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        for (n, line) in text.lines().enumerate() {
            if starts.iter().any(|s| line.contains(s)) {
                checked += 1;
                assert!(
                    line.contains("--disableTelemetry"),
                    "{}:{}: Azurite started without --disableTelemetry: {line}",
                    path.display(),
                    n + 1
                );
            }
        }
    }
    // tests/common/azurite.rs passes its flags one per line: the flag
    // comes first, right after the binary, on the line that starts it.
    let harness = std::fs::read_to_string(root.join("tests/common/azurite.rs")).unwrap();
    let spawns: Vec<&str> = harness
        .lines()
        .skip_while(|l| !l.contains("Command::new(&bin)"))
        .take(2)
        .collect();
    assert_eq!(
        spawns.get(1).map(|l| l.trim()),
        Some(".arg(\"--disableTelemetry\")"),
        "the test harness's Azurite must be started with --disableTelemetry first: {spawns:?}"
    );
    assert_eq!(
        harness.matches("Command::new(").count(),
        1,
        "the harness starts Azurite in one place"
    );
    assert!(
        checked >= 2,
        "the check found the Azurite commands ({checked})"
    );
}

/// The metric names the code makes: the first argument of each instrument
/// builder (`u64_counter("…")`, `f64_observable_gauge("…")`, …) in
/// `src/telemetry`.
fn instruments_in_code() -> BTreeSet<String> {
    let sources = [
        include_str!("../src/telemetry/instruments.rs"),
        include_str!("../src/telemetry/pipeline.rs"),
    ];
    let mut names = BTreeSet::new();
    for source in sources {
        for kind in ["_counter(\"", "_gauge(\"", "_histogram(\""] {
            for (at, _) in source.match_indices(kind) {
                let rest = &source[at + kind.len()..];
                names.insert(rest[..rest.find('"').unwrap()].to_string());
            }
        }
    }
    names
}

/// The README's metric table: the first cell of each row between
/// "**Metrics**" and "**Traces.**".
fn metric_table() -> BTreeSet<String> {
    let start = README.find("**Metrics**").expect("a Metrics paragraph");
    let end = start
        + README[start..]
            .find("**Traces.**")
            .expect("a Traces paragraph");
    README[start..end]
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .map(|l| l[..l.find('`').unwrap()].to_string())
        .collect()
}

#[test]
fn the_metric_table_lists_every_instrument_and_nothing_else() {
    let code = instruments_in_code();
    assert!(code.len() > 10, "{code:?}");
    assert_eq!(metric_table(), code);
}
