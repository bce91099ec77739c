//! The README and the pages of `docs/` stay in step with the code, the way
//! `tests/settings.rs` keeps `local.settings.json.example` in step: the
//! settings table of `docs/configuration.md` lists every variable the
//! handler reads and nothing else, the defaults shown (there and in the
//! README's short table) are the code's, the key format stated is the one
//! the guard writes, the metric table of `docs/telemetry.md` lists the
//! instruments the code makes, and every relative link resolves.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use order_guard::config::Config;

const README: &str = include_str!("../README.md");
const CONFIGURATION: &str = include_str!("../docs/configuration.md");
const TELEMETRY: &str = include_str!("../docs/telemetry.md");

/// Read only in builds with `--features failpoints` (the chaos tests); not a
/// setting of a deployed handler, so not in the table on purpose.
const TEST_BUILDS_ONLY: [&str; 1] = ["FAILPOINTS"];

/// The rows of a settings table: each row's variables (first column, every
/// backticked name) and its default cell.
fn table_rows(section: &str) -> Vec<(Vec<String>, String)> {
    section
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
        .collect()
}

/// The full table, `docs/configuration.md`: every setting the handler reads.
fn settings_table() -> Vec<(Vec<String>, String)> {
    let rows = table_rows(CONFIGURATION);
    assert!(
        rows.len() > 30,
        "the table of docs/configuration.md was not found"
    );
    rows
}

/// The README's short table (its Configuration section): the settings
/// most often set, each also in the full table.
fn readme_settings_table() -> Vec<(Vec<String>, String)> {
    let section = README
        .split("\n## Configuration\n")
        .nth(1)
        .expect("the README has a Configuration section");
    let section = section.split("\n## ").next().unwrap();
    let rows = table_rows(section);
    assert!(
        rows.len() > 5,
        "the README's Configuration table was not found"
    );
    assert!(
        section.contains("(docs/configuration.md)"),
        "the README's Configuration section links to the full table"
    );
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
        "the handler reads {missing:?}, which the settings table of docs/configuration.md does not list"
    );
    let unknown: Vec<&String> = table.difference(&read).collect();
    assert!(
        unknown.is_empty(),
        "the settings table of docs/configuration.md lists {unknown:?}, which the handler does not read"
    );
    let short: BTreeSet<String> = readme_settings_table()
        .into_iter()
        .flat_map(|(n, _)| n)
        .collect();
    let unknown: Vec<&String> = short.difference(&read).collect();
    assert!(
        unknown.is_empty(),
        "the README's settings table lists {unknown:?}, which the handler does not read"
    );
}

/// Checks the defaults of one table's rows against the code; answers how
/// many were checked.
fn check_defaults(rows: Vec<(Vec<String>, String)>, page: &str) -> usize {
    let default = format!("{:?}", Config::from_lookup(|_| None).unwrap());
    let mut checked = 0;
    for (names, cell) in rows {
        let Some(value) = cell.strip_prefix('`').and_then(|c| c.split('`').next()) else {
            continue;
        };
        let name = &names[0];
        if name == "RUST_LOG" {
            let logging = include_str!("../src/logging.rs");
            assert!(
                logging.contains(&format!("default_filter_or(\"{value}\")")),
                "{page} says RUST_LOG defaults to {value:?}; src/logging.rs does not"
            );
            checked += 1;
            continue;
        }
        let with = Config::from_lookup(|k| (k == name).then(|| value.to_string()));
        let with =
            with.unwrap_or_else(|e| panic!("{name}={value} ({page}'s default) is refused: {e}"));
        assert_eq!(
            format!("{with:?}"),
            default,
            "{name}={value} ({page}'s default) does not give the default configuration"
        );
        checked += 1;
    }
    checked
}

#[test]
fn the_defaults_shown_are_the_codes() {
    let checked = check_defaults(settings_table(), "docs/configuration.md");
    assert!(checked >= 15, "only {checked} defaults were checked");
    let checked = check_defaults(readme_settings_table(), "README.md");
    assert!(
        checked >= 5,
        "only {checked} of the README's defaults were checked"
    );
    // Defaults written as words: the embedded ones, in both tables.
    for (page, table) in [
        ("docs/configuration.md", settings_table()),
        ("README.md", readme_settings_table()),
    ] {
        let rows: BTreeMap<String, String> =
            table.into_iter().map(|(n, d)| (n[0].clone(), d)).collect();
        assert!(
            rows["REDIS_URL"].contains("in-memory guard"),
            "{page}: {}",
            rows["REDIS_URL"]
        );
        assert!(
            rows["SQL_CONNECTION_STRING"].contains(&format!(
                "sqlite:{}",
                order_guard::config::DEFAULT_SQLITE_PATH
            )),
            "{page}: {}",
            rows["SQL_CONNECTION_STRING"]
        );
    }
}

#[test]
fn the_key_format_stated_is_the_one_the_guard_writes() {
    let settings = Config::from_lookup(|_| None).unwrap().guard_settings;
    let key = settings.key("<id>");
    let fp = settings.fingerprint_key("<id>");
    assert_eq!(key, "orden:{<id>}");
    assert_eq!(fp, "orden-fp:{<id>}");
    let redis_doc = include_str!("../docs/redis.md");
    for (text, name) in [
        (CONFIGURATION, "docs/configuration.md"),
        (redis_doc, "docs/redis.md"),
        (README, "README.md"),
    ] {
        if name != "README.md" {
            assert!(
                text.contains(&format!("`{key}`")),
                "{name} does not state the key format {key}"
            );
            assert!(
                text.contains(&format!("`{fp}`")),
                "{name} does not state the fingerprint key format {fp}"
            );
        }
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

/// The README's Azurite is started as the tests start theirs, whose queue
/// carries announcements (`tests/outbox.rs`): past npx's install prompt
/// (`--yes`, no standard input in a script), and with the harness's flags
/// that change what Azurite accepts (`--skipApiVersionCheck`: the storage
/// clients speak a newer API version than Azurite knows) or sends.
#[test]
fn the_readmes_azurite_is_started_as_the_tests_start_it() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let harness = std::fs::read_to_string(root.join("tests/common/azurite.rs")).unwrap();
    let commands: Vec<&str> = README
        .lines()
        .filter(|l| l.contains("azurite --"))
        .collect();
    assert_eq!(commands.len(), 1, "{commands:?}");
    let command = commands[0];
    assert!(command.starts_with("npx --yes azurite "), "{command}");
    for flag in ["--skipApiVersionCheck", "--disableTelemetry"] {
        assert!(
            harness.contains(&format!("\"{flag}\"")),
            "the harness no longer passes {flag}"
        );
        assert!(
            command.contains(flag),
            "the README's Azurite lacks {flag}: {command}"
        );
    }
    // And the README shows how to read an announcement from its queue.
    let local = README
        .split("## Run it under the Functions host (Core Tools)")
        .nth(1)
        .unwrap()
        .split("\n## ")
        .next()
        .unwrap();
    assert!(local.contains("OUTBOX_STORAGE\": \"UseDevelopmentStorage=true"));
    assert!(local.contains("az storage message peek --queue-name order-executed"));
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

/// The metric table of `docs/telemetry.md`: the first cell of each row of
/// its Metrics section.
fn metric_table() -> BTreeSet<String> {
    let start = TELEMETRY
        .find("\n## Metrics\n")
        .expect("docs/telemetry.md has a Metrics section");
    let end = start
        + 1
        + TELEMETRY[start + 1..]
            .find("\n## ")
            .expect("a section after Metrics");
    TELEMETRY[start..end]
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

/// The README and every page of `docs/`, with their paths in the repository.
fn documents() -> Vec<(std::path::PathBuf, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut paths = vec![root.join("README.md")];
    let mut pages: Vec<std::path::PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    paths.extend(pages);
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect()
}

/// The lines of a Markdown text outside fenced code blocks.
fn prose_lines(text: &str) -> Vec<&str> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            lines.push(line);
        }
    }
    lines
}

/// GitHub's anchor for a heading: lower case, letters, digits, `-` and `_`
/// kept, spaces made `-`, everything else dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .flat_map(char::to_lowercase)
        .collect()
}

/// The anchors a page offers: its headings' (a repeated heading gets `-1`,
/// `-2`, … as on GitHub) and every `<a id="…">`.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for line in prose_lines(text) {
        if let Some(heading) = line.strip_prefix('#') {
            let heading = heading.trim_start_matches('#');
            if heading.starts_with(' ') {
                let base = slug(heading);
                let n = seen.entry(base.clone()).or_insert(0);
                found.insert(if *n == 0 {
                    base.clone()
                } else {
                    format!("{base}-{n}")
                });
                *n += 1;
            }
        }
        for part in line.split("<a id=\"").skip(1) {
            found.insert(part.split('"').next().unwrap().to_string());
        }
    }
    found
}

/// Every `[text](target)` of a text's prose, with its line number.
fn markdown_links(text: &str) -> Vec<(usize, String)> {
    let mut links = Vec::new();
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        for (at, _) in line.match_indices("](") {
            if !line[..at].contains('[') {
                continue;
            }
            let rest = &line[at + 2..];
            if let Some(end) = rest.find(')') {
                links.push((n + 1, rest[..end].trim().to_string()));
            }
        }
    }
    links
}

/// Every relative link of the README and of the pages of `docs/` names a
/// file of the repository, and its `#anchor` a heading of that page (a
/// link to `#section` of the same page included); every repository path
/// written as inline code (`docs/…`, `src/…`, `tests/…`, …) exists.
#[test]
fn every_relative_link_and_path_resolves() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let docs = documents();
    let mut broken = Vec::new();
    let mut checked = 0;
    for (path, text) in &docs {
        let shown = path.strip_prefix(root).unwrap().display().to_string();
        let dir = path.parent().unwrap();
        for (line, target) in markdown_links(text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, anchor) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let resolved = if file.is_empty() {
                path.clone()
            } else {
                dir.join(file)
            };
            let Ok(resolved) = resolved.canonicalize() else {
                broken.push(format!("{shown}:{line}: {target}: no such file"));
                continue;
            };
            if !resolved.starts_with(root.canonicalize().unwrap()) {
                broken.push(format!("{shown}:{line}: {target}: outside the repository"));
                continue;
            }
            if let Some(anchor) = anchor {
                let page = std::fs::read_to_string(&resolved).unwrap_or_default();
                if !anchors(&page).contains(anchor) {
                    broken.push(format!(
                        "{shown}:{line}: {target}: no heading #{anchor} there"
                    ));
                }
            }
        }
        let prefixes = [
            "docs/",
            "src/",
            "tests/",
            "scripts/",
            "sql/",
            "samples/",
            "examples/",
            "fuzz/",
            ".ci/",
            "OrderTrigger/",
            "DeadLetterSweep/",
        ];
        for (n, line) in text.lines().enumerate() {
            if line.matches('`').count() % 2 != 0 {
                continue;
            }
            for code in line.split('`').skip(1).step_by(2) {
                let named = code.trim_end_matches([':', ',', '.']);
                // `.cs` files are the Functions host's (Azure/azure-functions-host),
                // named in docs/host-protocol.md as the sources of its facts.
                if !prefixes.iter().any(|p| named.starts_with(p))
                    || named.ends_with(".cs")
                    || named.contains(|c: char| c.is_whitespace() || "{}*<>…|$=".contains(c))
                {
                    continue;
                }
                checked += 1;
                if !root.join(named).exists() {
                    broken.push(format!("{shown}:{}: `{named}`: no such path", n + 1));
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} links and paths were checked");
    assert!(
        broken.is_empty(),
        "links and paths that do not resolve:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_anchors_are_githubs() {
    assert_eq!(
        slug(" Deploy to Azure, step by step"),
        "deploy-to-azure-step-by-step"
    );
    assert_eq!(
        slug(" Sampling: which traces are exported"),
        "sampling-which-traces-are-exported"
    );
    assert_eq!(
        slug(" Run it under the Functions host (Core Tools)"),
        "run-it-under-the-functions-host-core-tools"
    );
    assert_eq!(slug(" `finished`: the cache"), "finished-the-cache");
    let page = "# A\n## Same\n## Same\n```\n## not a heading\n```\n<a id=\"x\"></a>\n";
    let found = anchors(page);
    assert!(found.contains("a") && found.contains("same") && found.contains("same-1"));
    assert!(found.contains("x") && !found.contains("not-a-heading"));
}
