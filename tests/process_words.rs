//! The docs and the code's comments say how things are now and why; how
//! they came to be is `git log`'s. This test fails on the marks a way of
//! working leaves in them: the number of an issue or of a stop ("issue"
//! or "stop" and a number), "this round" for a piece of work, a markdown
//! heading holding a date, a date given with "until", "since" or "on" or
//! alone in parentheses, and a table row whose cell is only a commit hash.
//!
//! It reads the README and every `docs/*.md` whole, and the comments of
//! every `.rs` under `src/`, `tests/`, `examples/` and `fuzz/` (build output
//! left out; string and char literals skipped, so a log message or a URL is
//! not taken for a comment) and of `scripts/*.sh` and `.ci/run`. A round of
//! the outbox's dispatch is the domain's word: in comments "this round"
//! fails only as "in this round" or "this round of work"; in the docs it
//! fails everywhere but in "this round trip". A date in test data or an
//! example timestamp (`2026-12-05T11:07:22.123Z`) is not a comment's date
//! of work and passes. This file is skipped: its samples are the words.

use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// What a failure says, after the places and phrases.
const WHY: &str = "docs and code comments say how things are now; history is git log's (say it in the commit message)";

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Whether `word` starts a whole word at `i` of `lower` (ASCII lowercased).
fn word_at(lower: &[u8], i: usize, word: &str) -> bool {
    lower[i..].starts_with(word.as_bytes()) && (i == 0 || !is_word(lower[i - 1]))
}

/// Whether a date `20YY-MM-DD` starts at `i`.
fn date_at(b: &[u8], i: usize) -> bool {
    let shape = b"20dd-dd-dd";
    b.len() >= i + shape.len()
        && shape.iter().zip(&b[i..]).all(|(s, c)| match *s {
            b'd' => c.is_ascii_digit(),
            s => s == *c,
        })
}

/// A date that is the day of a piece of work, not part of a timestamp
/// (`2026-12-05T11:07:22Z`) or of a longer number.
fn day_at(lower: &[u8], i: usize) -> bool {
    date_at(lower, i) && !matches!(lower.get(i + 10), Some(c) if *c == b't' || c.is_ascii_digit())
}

/// The phrases of `line` that fail wherever they are: "issue 32"
/// ("issues", "#32" too), "stop 43", "until 2026-12-03" (or "since", "on"),
/// "(2026-12-03)".
fn numbered_and_dated(line: &str) -> Vec<String> {
    let lower = line.to_ascii_lowercase();
    let lower = lower.as_bytes();
    let mut found = Vec::new();
    for i in 0..lower.len() {
        for word in ["issue", "stop"] {
            if !word_at(lower, i, word) {
                continue;
            }
            let mut j = i + word.len();
            if word == "issue" && lower.get(j) == Some(&b's') {
                j += 1;
            }
            if lower.get(j) != Some(&b' ') {
                continue;
            }
            j += 1;
            if lower.get(j) == Some(&b'#') {
                j += 1;
            }
            let digits = lower[j..].iter().take_while(|c| c.is_ascii_digit()).count();
            if digits > 0 {
                found.push(line[i..j + digits].to_string());
            }
        }
        for word in ["until", "since", "on"] {
            let j = i + word.len() + 1;
            if word_at(lower, i, word) && lower.get(j - 1) == Some(&b' ') && day_at(lower, j) {
                found.push(line[i..j + 10].to_string());
            }
        }
        if lower.get(i) == Some(&b'(') && day_at(lower, i + 1) && lower.get(i + 11) == Some(&b')') {
            found.push(line[i..i + 12].to_string());
        }
    }
    found
}

/// Where "this round" starts in `lower` as whole words.
fn this_round(lower: &[u8]) -> Vec<usize> {
    let phrase = "this round";
    (0..lower.len())
        .filter(|&i| {
            word_at(lower, i, phrase)
                && !matches!(lower.get(i + phrase.len()), Some(c) if is_word(*c))
        })
        .collect()
}

/// The process words of one line of the README or of `docs/`.
fn in_doc_line(line: &str, in_code_block: bool) -> Vec<String> {
    let mut found = numbered_and_dated(line);
    let lower = line.to_ascii_lowercase();
    let lower = lower.as_bytes();
    for i in this_round(lower) {
        let rest = &lower[i + "this round".len()..];
        if !(rest.starts_with(b" trip") || rest.starts_with(b"-trip")) {
            found.push(line[i..i + "this round".len()].to_string());
        }
    }
    let hashes = line.trim_start().trim_start_matches('#');
    if !in_code_block
        && line.starts_with('#')
        && hashes.starts_with(' ')
        && (0..lower.len()).any(|i| date_at(lower, i))
    {
        found.push(line.trim().to_string());
    }
    if line.trim_start().starts_with('|') {
        for cell in line.split('|').map(str::trim) {
            let hex = cell.strip_prefix('`').and_then(|c| c.strip_suffix('`'));
            if let Some(hex) = hex {
                // A letter among the digits, so that a number such as
                // `4194304` is not taken for a hash.
                if (7..=40).contains(&hex.len())
                    && hex.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
                    && hex.bytes().any(|c| c.is_ascii_alphabetic())
                {
                    found.push(cell.to_string());
                }
            }
        }
    }
    found
}

/// The process words of one line of a comment.
fn in_comment_line(line: &str) -> Vec<String> {
    let mut found = numbered_and_dated(line);
    let lower = line.to_ascii_lowercase();
    let lower = lower.as_bytes();
    for i in this_round(lower) {
        let end = i + "this round".len();
        if lower[end..].starts_with(b" of work") {
            found.push(line[i..end + " of work".len()].to_string());
        } else if i >= 3 && word_at(lower, i - 3, "in ") {
            found.push(line[i - 3..end].to_string());
        }
    }
    found
}

/// The comments of a Rust source, a line at a time with its number: `//`
/// comments (doc comments too) and `/* */` blocks; strings, raw strings,
/// byte strings and char literals skipped.
fn rust_comments(text: &str) -> Vec<(usize, String)> {
    let c: Vec<char> = text.chars().collect();
    let ident = |i: usize| i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_');
    let mut comments = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < c.len() {
        match c[i] {
            '\n' => {
                line += 1;
                i += 1;
            }
            '/' if c.get(i + 1) == Some(&'/') => {
                let start = i;
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
                comments.push((line, c[start..i].iter().collect()));
            }
            '/' if c.get(i + 1) == Some(&'*') => {
                let mut depth = 0;
                let mut current = String::new();
                while i < c.len() {
                    if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                        depth += 1;
                        i += 2;
                    } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else if c[i] == '\n' {
                        comments.push((line, std::mem::take(&mut current)));
                        line += 1;
                        i += 1;
                    } else {
                        current.push(c[i]);
                        i += 1;
                    }
                }
                comments.push((line, current));
            }
            '"' => {
                i += 1;
                while i < c.len() && c[i] != '"' {
                    if c[i] == '\\' {
                        i += 1;
                    }
                    if c.get(i) == Some(&'\n') {
                        line += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
            'r' if !ident(i) || (c[i - 1] == 'b' && !ident(i - 1)) => {
                let hashes = c[i + 1..].iter().take_while(|&&h| h == '#').count();
                if c.get(i + 1 + hashes) != Some(&'"') {
                    i += 1;
                    continue;
                }
                let mut close = vec!['"'];
                close.resize(hashes + 1, '#');
                i += 2 + hashes;
                while i < c.len() && !c[i..].starts_with(&close) {
                    if c[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
                i += close.len();
            }
            '\'' => {
                if c.get(i + 1) == Some(&'\\') {
                    // An escaped char: to the quote that closes it.
                    i += 3;
                    while i < c.len() && c[i] != '\'' {
                        i += 1;
                    }
                    i += 1;
                } else if c.get(i + 2) == Some(&'\'') {
                    i += 3;
                } else {
                    // A lifetime or a label.
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    comments
}

/// The comments of a shell script, a line at a time with its number: a line
/// that starts with `#` (the `#!` line left out) and what follows a `#`
/// after a blank, outside quotes.
fn shell_comments(text: &str) -> Vec<(usize, String)> {
    let mut comments = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if n == 0 && line.starts_with("#!") {
            continue;
        }
        let mut quote = None;
        let mut previous = ' ';
        for (at, ch) in line.char_indices() {
            match (quote, ch) {
                (None, '\'' | '"') => quote = Some(ch),
                (Some(q), _) if ch == q => quote = None,
                (None, '#') if previous.is_whitespace() => {
                    comments.push((n + 1, line[at..].to_string()));
                    break;
                }
                _ => {}
            }
            previous = ch;
        }
    }
    comments
}

/// Every `.rs` under `dir`, build output (`target/`) and hidden folders
/// left out.
fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_files(&path, files);
            }
        } else if name.ends_with(".rs") {
            files.push(path);
        }
    }
}

/// `file:line: "phrase"` for each process word found.
fn failures() -> Vec<String> {
    let mut failures = Vec::new();
    let mut report = |path: &Path, line: usize, phrase: String| {
        let shown = path
            .strip_prefix(root())
            .unwrap_or(path)
            .display()
            .to_string();
        failures.push(format!("{shown}:{line}: \"{phrase}\""));
    };

    let mut docs = vec![root().join("README.md")];
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    docs.extend(pages);
    for path in &docs {
        let text = std::fs::read_to_string(path).unwrap();
        let mut in_code_block = false;
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                in_code_block = !in_code_block;
            }
            for phrase in in_doc_line(line, in_code_block) {
                report(path.as_path(), n + 1, phrase);
            }
        }
    }

    let mut sources = Vec::new();
    for dir in ["src", "tests", "examples", "fuzz"] {
        rust_files(&root().join(dir), &mut sources);
    }
    sources.sort();
    let this_file = root().join("tests/process_words.rs");
    for path in sources.iter().filter(|p| **p != this_file) {
        let text = std::fs::read_to_string(path).unwrap();
        for (n, comment) in rust_comments(&text) {
            for phrase in in_comment_line(&comment) {
                report(path.as_path(), n, phrase);
            }
        }
    }

    let mut scripts: Vec<PathBuf> = std::fs::read_dir(root().join("scripts"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sh"))
        .collect();
    scripts.sort();
    scripts.push(root().join(".ci/run"));
    for path in &scripts {
        let text = std::fs::read_to_string(path).unwrap();
        for (n, comment) in shell_comments(&text) {
            for phrase in in_comment_line(&comment) {
                report(path.as_path(), n, phrase);
            }
        }
    }
    failures
}

#[test]
fn docs_and_comments_carry_no_process_words() {
    let failures = failures();
    assert!(
        failures.is_empty(),
        "process words in the docs or in code comments:\n  {}\n{WHY}",
        failures.join("\n  ")
    );
}

/// The rules catch what they are for and nothing the tree holds for
/// another reason.
#[test]
fn the_rules_tell_process_words_from_the_domains() {
    let doc = |line: &str| in_doc_line(line, false);
    assert_eq!(
        doc("Version 3 → 4 (the outbox, issue 32) adds"),
        ["issue 32"]
    );
    assert_eq!(doc("Issues 31 and 32, stop 43"), ["Issues 31", "stop 43"]);
    assert_eq!(
        doc("they did until 2026-12-03: a purge"),
        ["until 2026-12-03"]
    );
    assert_eq!(
        doc("measured On 2026-12-03, (2026-12-04)"),
        ["On 2026-12-03", "(2026-12-04)"]
    );
    assert_eq!(
        doc("## Born leased (2026-12-05, 15:00 UTC)"),
        ["## Born leased (2026-12-05, 15:00 UTC)"]
    );
    assert_eq!(doc("| `54a63de` | a change |"), ["`54a63de`"]);
    assert_eq!(doc("What this round changed"), ["this round"]);
    assert!(doc("| `MAX_BODY_BYTES` | `4194304` | larger bodies |").is_empty());
    assert!(doc("one call costs this round trip; a stopwatch 3").is_empty());
    assert!(doc("written `2026-12-05T11:07:22.123Z` (on 2026-12-05T11:07:22Z)").is_empty());
    assert_eq!(
        in_doc_line("# a shell comment on 2026-12-05", true),
        ["on 2026-12-05"]
    );
    assert!(in_doc_line("# a shell comment, 2026-12-05", true).is_empty());

    assert_eq!(
        in_comment_line("// what changed in this round"),
        ["in this round"]
    );
    assert_eq!(
        in_comment_line("// this round of work"),
        ["this round of work"]
    );
    assert!(in_comment_line("// the messages of this round share one mark").is_empty());

    let source = "let u = \"https://x // issue 1\"; // issue 2\n\
                  let r = r#\"// issue 3 \"quoted\"\"#; let q = '\"'; // stop 4\n\
                  fn f<'a>(s: &'a str) {} /* issue\n 5 */ let b = br\"// issue 6\";\n";
    let found: Vec<(usize, Vec<String>)> = rust_comments(source)
        .into_iter()
        .map(|(n, c)| (n, in_comment_line(&c)))
        .filter(|(_, f)| !f.is_empty())
        .collect();
    let expected: Vec<(usize, Vec<String>)> = vec![
        (1, vec!["issue 2".to_string()]),
        (2, vec!["stop 4".to_string()]),
    ];
    assert_eq!(found, expected);

    let script = "#!/bin/sh\n# issue 7\necho \"# issue 8\" # stop 9\nx=${#y}\n";
    let found: Vec<(usize, Vec<String>)> = shell_comments(script)
        .into_iter()
        .map(|(n, c)| (n, in_comment_line(&c)))
        .collect();
    let expected: Vec<(usize, Vec<String>)> = vec![
        (2, vec!["issue 7".to_string()]),
        (3, vec!["stop 9".to_string()]),
    ];
    assert_eq!(found, expected);
}
