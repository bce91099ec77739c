//! Every `az` command the README and `docs/` show is one Azure's own CLI
//! accepts. Each is pulled out of the ```sh blocks (continuation lines
//! joined, and every `$(az …)` inside another command on its own), its
//! shell variables and substitutions replaced by placeholders, split into
//! arguments as the shell would, and given to the real CLI (the PyPI
//! package azure-cli, installed into `.tools/` by
//! `scripts/ensure-azure-cli.sh`) with no login: a command the CLI accepts
//! stops at "Please run 'az login'"; one it refuses says why (an unknown
//! argument, a missing one, a misspelt command) before it gets there.
//!
//! A command of a CLI extension cannot be parsed without installing the
//! extension, which this test does not do: it is named in the output as
//! unchecked, and the test fails if any is shown, so that the README
//! prefers core commands (or `az rest` on a documented API).

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The `az` of `scripts/ensure-azure-cli.sh`; fails saying how to get it.
fn az() -> PathBuf {
    let az = root().join(".tools/azure-cli/bin/az");
    assert!(
        az.exists(),
        "Azure's CLI is missing ({}): this test parses the README's az commands with it. Run scripts/ensure-azure-cli.sh (scripts/test.sh does), which installs the PyPI package azure-cli into .tools/azure-cli",
        az.display()
    );
    az
}

/// The documents whose commands a reader runs.
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![root().join("README.md")];
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    docs.extend(pages);
    docs
}

/// The shell lines of every ```sh block, continuation lines joined.
fn sh_lines(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut in_sh = false;
    let mut pending = String::new();
    for line in text.lines() {
        let fence = line.trim_start();
        if fence.starts_with("```") {
            in_sh = !in_sh && matches!(fence.trim_end(), "```sh" | "```bash" | "```shell");
            pending.clear();
            continue;
        }
        if !in_sh {
            continue;
        }
        let line = line.trim();
        match line.strip_suffix('\\') {
            Some(head) => {
                pending.push_str(head);
                pending.push(' ');
            }
            None => {
                pending.push_str(line);
                lines.push(std::mem::take(&mut pending));
            }
        }
    }
    lines
}

/// Every `az …` command in a shell line: the line itself when it is one
/// (or assigns one, `X=$(az …)`), and each `$(az …)` inside it.
fn az_commands(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    let code = line.split(" #").next().unwrap_or(line).trim();
    if code.starts_with("az ") {
        found.push(code.to_string());
    }
    let mut rest = code;
    while let Some(i) = rest.find("$(") {
        let inner = &rest[i + 2..];
        let mut depth = 1;
        let end = inner
            .char_indices()
            .find(|&(_, c)| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                depth == 0
            })
            .map(|(j, _)| j)
            .unwrap_or(inner.len());
        let sub = &inner[..end];
        if sub.trim_start().starts_with("az ") {
            found.push(sub.trim().to_string());
        }
        found.extend(az_commands(sub).into_iter().filter(|c| c != sub.trim()));
        rest = &inner[end..];
    }
    found
}

/// A resource id of the shape Azure's CLI checks (`--ids`, URLs under
/// management.azure.com).
const RESOURCE_ID: &str = "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/placeholder-rg/providers/Microsoft.Placeholder/placeholders/placeholder";
/// An object id (a principal's).
const OBJECT_ID: &str = "00000000-0000-0000-0000-000000000000";

/// What a variable of this name holds, as a placeholder: an object id for
/// `…OID`, a resource id for `…_ID`, else a word.
fn placeholder_for_variable(name: &str) -> &'static str {
    if name.ends_with("OID") || name.ends_with("OBJECT_ID") {
        OBJECT_ID
    } else if name.ends_with("_ID") || name == "ID" {
        RESOURCE_ID
    } else {
        "placeholder"
    }
}

/// What `$(…)` prints, as a placeholder: `--query id` of a resource is its
/// resource id, of a signed-in user an object id; anything else a word.
fn placeholder_for_substitution(inner: &str) -> &'static str {
    if inner.contains("--query id") || inner.contains("--query \"id\"") {
        if inner.contains("signed-in-user") {
            OBJECT_ID
        } else {
            RESOURCE_ID
        }
    } else if inner.contains("principalId") {
        OBJECT_ID
    } else {
        "placeholder-value"
    }
}

/// `$(…)` and `$VAR`/`${VAR}` replaced by placeholders, so the command can
/// be split and run without a shell (nothing of it is executed).
fn with_placeholders(command: &str) -> String {
    let mut out = String::new();
    let mut chars = command.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '$' {
            out.push(c);
            continue;
        }
        match chars.peek() {
            Some('(') => {
                let mut depth = 0;
                let mut inner = String::new();
                for c in chars.by_ref() {
                    match c {
                        '(' => depth += 1,
                        ')' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    inner.push(c);
                }
                out.push_str(placeholder_for_substitution(&inner));
            }
            Some('{') => {
                let mut name = String::new();
                chars.next();
                for c in chars.by_ref() {
                    if c == '}' {
                        break;
                    }
                    name.push(c);
                }
                out.push_str(placeholder_for_variable(&name));
            }
            Some(c) if c.is_ascii_alphabetic() || *c == '_' => {
                let mut name = String::new();
                while let Some(c) = chars.next_if(|c| c.is_ascii_alphanumeric() || *c == '_') {
                    name.push(c);
                }
                // An argument that takes resource ids holds one, whatever
                // the variable's name.
                let before = out.trim_end_matches(['"', '\'']).trim_end();
                if ["--ids", "--scope", "--source-resource-id"]
                    .iter()
                    .any(|a| before.ends_with(a))
                {
                    out.push_str(RESOURCE_ID);
                } else {
                    out.push_str(placeholder_for_variable(&name));
                }
            }
            _ => out.push('$'),
        }
    }
    out
}

/// The error code [`RefusingProxy`] answers every request with.
const REFUSED_BY_THE_TEST: &str = "RefusedByTheTestProxy";

/// Where the CLI's requests go: a local proxy that answers every request
/// at once with a 403 in Azure Storage's error form, which no client
/// retries. (A closed port instead makes the storage client retry a
/// refused connection for about a minute and a half a command.) Requests
/// through it never leave the machine: a CONNECT is refused too.
struct RefusingProxy {
    url: String,
}

impl RefusingProxy {
    fn start() -> RefusingProxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                std::thread::spawn(move || refuse(&mut stream));
            }
        });
        RefusingProxy { url }
    }
}

/// Read the request's head, answer 403 with a storage error body, close.
fn refuse(stream: &mut std::net::TcpStream) {
    use std::io::{Read, Write};
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let body = format!(
        r#"<?xml version="1.0" encoding="utf-8"?><Error><Code>{REFUSED_BY_THE_TEST}</Code><Message>refused by the test's proxy</Message></Error>"#
    );
    let _ = write!(
        stream,
        "HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\nx-ms-error-code: {REFUSED_BY_THE_TEST}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// What the CLI said of one command.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Accepted,
    Refused(String),
    Extension(String),
}

/// Accepted: the CLI got as far as asking for a login, or as sending a
/// request (refused by the test's proxy: a data-plane command given a
/// connection string, such as the README's Azurite queue, needs no login).
fn judge(az: &Path, config_dir: &Path, proxy: &str, command: &str) -> Verdict {
    let text = with_placeholders(command);
    let args = shlex::split(&text).unwrap_or_else(|| panic!("not a shell command: {command}"));
    assert_eq!(args[0], "az", "{command}");
    let out = Command::new(az)
        .args(&args[1..])
        .env("AZURE_CONFIG_DIR", config_dir)
        // Nothing leaves the machine: every request goes to the test's
        // proxy (a command that gets that far was accepted); no telemetry
        // upload, no survey, no extension fetched, no prompt.
        .env("HTTPS_PROXY", proxy)
        .env("HTTP_PROXY", proxy)
        .env("https_proxy", proxy)
        .env("http_proxy", proxy)
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .env("AZURE_CORE_COLLECT_TELEMETRY", "no")
        .env("AZURE_CORE_SURVEY_MESSAGE", "no")
        .env("AZURE_EXTENSION_USE_DYNAMIC_INSTALL", "no")
        .env("AZURE_CORE_NO_COLOR", "true")
        .env("AZURE_CORE_ONLY_SHOW_ERRORS", "true")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", az.display()));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    let lower = said.to_ascii_lowercase();
    if lower.contains("requires the extension") || lower.contains("az extension add") {
        Verdict::Extension(said.trim().to_string())
    } else if (lower.contains("az login")
        || said.contains(REFUSED_BY_THE_TEST)
        || lower.contains("proxyerror")
        || lower.contains("tunnel connection failed"))
        && !out.status.success()
    {
        // Stopped for want of a login, or at the network (a command that
        // needs neither, such as a data-plane call with its own key): the
        // arguments were accepted either way.
        Verdict::Accepted
    } else {
        Verdict::Refused(format!("exit {:?}: {}", out.status.code(), said.trim()))
    }
}

#[test]
fn the_parts_of_a_command_are_found_and_replaced() {
    let text = "```sh\naz group create --name $RG \\\n  --location $LOC\nX=$(az account show --query id -o tsv)\necho hi\n```\n```\naz not-sh\n```\n";
    let lines = sh_lines(text);
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert_eq!(lines[0], "az group create --name $RG  --location $LOC");
    assert_eq!(az_commands(&lines[0]), [lines[0].clone()]);
    assert_eq!(
        az_commands(&lines[1]),
        ["az account show --query id -o tsv"]
    );
    assert!(az_commands(&lines[2]).is_empty());
    let nested = r#"az x --id "$(az y --n "$(az z)")/f""#;
    assert_eq!(
        az_commands(nested),
        [nested, r#"az y --n "$(az z)""#, "az z"]
    );
    assert_eq!(
        with_placeholders(r#"az a --x "$(az b)/c" --y ${V} --z $W-1 --s '$'"#),
        r#"az a --x "placeholder-value/c" --y placeholder --z placeholder-1 --s '$'"#
    );
    assert_eq!(
        with_placeholders(r#"--url "https://management.azure.com$REDIS_ID/d" --o $APP_OID"#),
        format!(r#"--url "https://management.azure.com{RESOURCE_ID}/d" --o {OBJECT_ID}"#)
    );
    assert_eq!(
        with_placeholders(r#"--scope "$(az storage account show -n x --query id -o tsv)/c""#),
        format!(r#"--scope "{RESOURCE_ID}/c""#)
    );
    assert_eq!(
        with_placeholders(r#"az resource show --ids "$WS" --n $WS"#),
        format!(r#"az resource show --ids "{RESOURCE_ID}" --n placeholder"#)
    );
}

#[test]
fn every_az_command_shown_is_accepted_by_azure_cli() {
    let az = az();
    let mut commands: Vec<(String, String)> = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let shown = doc.strip_prefix(root()).unwrap().display().to_string();
        for line in sh_lines(&text) {
            for command in az_commands(&line) {
                if !commands.iter().any(|(_, c)| *c == command) {
                    commands.push((shown.clone(), command));
                }
            }
        }
    }
    assert!(
        commands.len() > 10,
        "too few az commands found ({}): the extraction is broken",
        commands.len()
    );
    // Each `az` is a Python process of its own, a second or more of CPU:
    // one worker per CPU, each with its own configuration folder (az writes
    // there), the verdicts then read in the documents' order.
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let proxy = RefusingProxy::start();
    let proxy = proxy.url.as_str();
    let mut verdicts: Vec<(usize, Verdict)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let (az, commands) = (&az, &commands);
                scope.spawn(move || {
                    let config_dir = tempfile::tempdir().unwrap();
                    (w..commands.len())
                        .step_by(workers)
                        .map(|i| (i, judge(az, config_dir.path(), proxy, &commands[i].1)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a worker judging az commands panicked"))
            .collect()
    });
    verdicts.sort_by_key(|(i, _)| *i);
    assert_eq!(verdicts.len(), commands.len(), "every command judged");
    let (mut refused, mut unchecked) = (Vec::new(), Vec::new());
    for ((doc, command), (_, verdict)) in commands.iter().zip(verdicts) {
        match verdict {
            Verdict::Accepted => println!("accepted  {doc}: {command}"),
            Verdict::Refused(why) => {
                println!("REFUSED   {doc}: {command}\n          {why}");
                refused.push(format!("{doc}: {command}\n    {why}"));
            }
            Verdict::Extension(why) => {
                println!("UNCHECKED {doc}: {command} (a CLI extension's: {why})");
                unchecked.push(format!("{doc}: {command}"));
            }
        }
    }
    println!(
        "{} az commands: {} accepted, {} refused, {} of extensions unchecked",
        commands.len(),
        commands.len() - refused.len() - unchecked.len(),
        refused.len(),
        unchecked.len()
    );
    assert!(
        refused.is_empty(),
        "Azure's CLI refuses these commands:\n{}",
        refused.join("\n")
    );
    assert!(
        unchecked.is_empty(),
        "these commands belong to CLI extensions, which this test cannot check; prefer a core command or `az rest` on the documented API:\n{}",
        unchecked.join("\n")
    );
}
