//! Log lines at the severity the Functions host gives them.
//!
//! The host reads a custom handler's two streams line by line
//! (`WorkerProcess.cs`, `HttpWorkerDescription.UseStdErrorStreamForErrorsOnly`
//! is `true` for custom handlers): every **stdout** line becomes an
//! Information log; every **stderr** line becomes a Warning when it contains
//! `warn` in any case (`IndexOf("warn", OrdinalIgnoreCase)`), else an Error.
//! So [`init`] writes `warn` and `error` records to stderr and the rest to
//! stdout, in env_logger's human form: a warning's line holds its level tag
//! `WARN` (a Warning to the host), an error's holds `ERROR` (an Error: the
//! word `warn` in its text is written with an escape, [`for_stderr`]).
//! [`host_severity`] is that rule, for the tests that read the real binary's
//! streams.

use log::{Level, Log, Metadata, Record};

/// One of the handler's two output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// The severity the Functions host gives a line of a custom handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum HostSeverity {
    Information,
    Warning,
    Error,
}

/// The host's rule for a custom handler's line (see the module doc): stdout
/// is Information; stderr is Warning when the line contains `warn` in any
/// case, Error otherwise.
pub fn host_severity(stream: Stream, line: &str) -> HostSeverity {
    match stream {
        Stream::Stdout => HostSeverity::Information,
        Stream::Stderr if contains_ignore_ascii_case(line, "warn") => HostSeverity::Warning,
        Stream::Stderr => HostSeverity::Error,
    }
}

/// .NET's `OrdinalIgnoreCase` for an ASCII needle: a letter of the needle
/// matches either case of it, nothing else does.
fn contains_ignore_ascii_case(haystack: &str, needle: &str) -> bool {
    haystack
        .as_bytes()
        .windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

/// A stderr record's message as written (pure): one line whatever it
/// holds (control characters, separators and bidi controls escaped, as
/// [`crate::text::escaped`] does), and, on an error, without the word the
/// host reads as a warning, so that the host grades the line at the
/// record's own level.
pub fn for_stderr(level: Level, message: &str) -> std::borrow::Cow<'_, str> {
    match level {
        Level::Error => crate::text::escaped(message),
        _ => crate::text::one_line(message),
    }
}

/// Which stream a record of `level` goes to.
pub fn stream_for(level: Level) -> Stream {
    match level {
        Level::Error | Level::Warn => Stream::Stderr,
        Level::Info | Level::Debug | Level::Trace => Stream::Stdout,
    }
}

/// The SDK's error line for each failed export (one per batch of spans,
/// one per metric export: a flood while a collector is down). Telemetry's
/// exporters count each failure and say it once per run of failures
/// (`telemetry/pipeline.rs`), so these are not written.
const SAID_ONCE_BY_TELEMETRY: [&str; 2] = [
    "name=\"BatchSpanProcessor.ExportError\"",
    "name=\"PeriodicReader.ExportError\"",
];

/// The SDK's warnings about `OTEL_TRACES_SAMPLER`: its tracer provider's
/// builder reads the variable itself before telemetry sets the sampler
/// `config` made of it, so they speak of a choice that never applies
/// ("Unrecognized sampler type 'microsoft.rate_limited' … Using fallback
/// sampler", of a value `config` accepted; one it refuses stops the start
/// before any tracer is built).
const SAMPLER_READ_BY_CONFIG: [&str; 3] = [
    "name=\"TracerProvider.Config.InvalidSamplerType\"",
    "name=\"TracerProvider.Config.InvalidSamplerArgument\"",
    "name=\"TracerProvider.Config.UnsupportedSampler\"",
];

/// Whether `record` is one of [`SAID_ONCE_BY_TELEMETRY`] (an error) or
/// [`SAMPLER_READ_BY_CONFIG`] (a warning): the SDK's events reach `log`
/// through `tracing`, their name first in the message.
fn left_out(record: &Record) -> bool {
    if record.target() != "opentelemetry_sdk" {
        return false;
    }
    let names: &[&str] = match record.level() {
        Level::Error => &SAID_ONCE_BY_TELEMETRY,
        Level::Warn => &SAMPLER_READ_BY_CONFIG,
        _ => return false,
    };
    let text = record.args().to_string();
    names.iter().any(|name| text.starts_with(name))
}

/// Two env_logger loggers of one filter (`RUST_LOG`, default
/// `info,tiberius=warn`), one per stream.
struct Split {
    stdout: env_logger::Logger,
    stderr: env_logger::Logger,
}

impl Log for Split {
    fn enabled(&self, metadata: &Metadata) -> bool {
        self.stdout.enabled(metadata)
    }

    fn log(&self, record: &Record) {
        if left_out(record) {
            return;
        }
        match stream_for(record.level()) {
            Stream::Stdout => self.stdout.log(record),
            Stream::Stderr => {
                // The values of events are escaped where they are written
                // into a message; this holds for every other text too (a
                // server's error, a library's message), on the stream whose
                // lines the host grades: one line, at the record's severity.
                let text = record.args().to_string();
                let safe = for_stderr(record.level(), &text);
                self.stderr.log(
                    &Record::builder()
                        .args(format_args!("{safe}"))
                        .metadata(record.metadata().clone())
                        .module_path(record.module_path())
                        .file(record.file())
                        .line(record.line())
                        .build(),
                )
            }
        }
    }

    fn flush(&self) {
        self.stdout.flush();
        self.stderr.flush();
    }
}

/// Install the process's logger (see the module doc). Idempotent: a second
/// call leaves the first logger in place.
pub fn init() {
    let build = |target| {
        env_logger::Builder::from_env(
            env_logger::Env::default().default_filter_or("info,tiberius=warn"),
        )
        .target(target)
        .format_timestamp_millis()
        .build()
    };
    let split = Split {
        stdout: build(env_logger::Target::Stdout),
        stderr: build(env_logger::Target::Stderr),
    };
    let max = split.stdout.filter();
    if log::set_boxed_logger(Box::new(split)).is_ok() {
        log::set_max_level(max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdout_is_information_whatever_it_says() {
        for line in ["executed", "WARN x", "ERROR failed", ""] {
            assert_eq!(
                host_severity(Stream::Stdout, line),
                HostSeverity::Information
            );
        }
    }

    #[test]
    fn stderr_is_a_warning_when_it_says_warn_in_any_case() {
        for line in ["[t WARN  m] x", "warn", "a Warning", "forewarned", "wArN"] {
            assert_eq!(
                host_severity(Stream::Stderr, line),
                HostSeverity::Warning,
                "{line}"
            );
        }
    }

    #[test]
    fn other_stderr_lines_are_errors() {
        for line in ["[t ERROR m] x", "", "war n", "wa\nrn", "info"] {
            assert_eq!(
                host_severity(Stream::Stderr, line),
                HostSeverity::Error,
                "{line}"
            );
        }
    }

    /// Whether a record of `target` at `level` saying `text` is left out.
    fn record(target: &str, level: Level, text: &str) -> bool {
        left_out(
            &Record::builder()
                .target(target)
                .level(level)
                .args(format_args!("{text}"))
                .build(),
        )
    }

    /// Each `(target, level, message, left out?)` as `left_out` must say.
    fn assert_cases(cases: &[(&str, Level, String, bool)]) {
        for (target, level, text, out) in cases {
            assert_eq!(
                record(target, *level, text),
                *out,
                "{target} {level} {text:?}: left out should be {out}"
            );
        }
    }

    const SDK: &str = "opentelemetry_sdk";
    const OURS: &str = "order_guard::telemetry";

    #[test]
    fn the_sdks_line_per_failed_export_is_left_to_telemetry() {
        let error = r#"error="Operation failed: HTTP export failed: network error""#;
        let export = |name: &str| format!("name=\"{name}\" {error}");
        assert_cases(&[
            (
                SDK,
                Level::Error,
                export("BatchSpanProcessor.ExportError"),
                true,
            ),
            (
                SDK,
                Level::Error,
                export("PeriodicReader.ExportError"),
                true,
            ),
            // The SDK's other lines, and anyone else's, are written.
            (
                SDK,
                Level::Error,
                export("BatchSpanProcessor.Shutdown.Timeout"),
                false,
            ),
            (
                OURS,
                Level::Error,
                export("PeriodicReader.ExportError"),
                false,
            ),
        ]);
    }

    #[test]
    fn the_sdks_warnings_on_the_sampler_variable_are_left_to_config() {
        let message = "message=Unrecognized sampler type 'microsoft.rate_limited'";
        let config = |name: &str| format!("name=\"TracerProvider.Config.{name}\" {message}");
        assert_cases(&[
            (SDK, Level::Warn, config("InvalidSamplerType"), true),
            (SDK, Level::Warn, config("InvalidSamplerArgument"), true),
            (SDK, Level::Warn, config("UnsupportedSampler"), true),
            // Its other warnings, the same names at another level, and
            // anyone else's are written.
            (
                SDK,
                Level::Warn,
                "name=\"BatchSpanProcessor.Flush.Timeout\"".into(),
                false,
            ),
            (SDK, Level::Error, config("InvalidSamplerType"), false),
            (
                SDK,
                Level::Warn,
                "name=\"PeriodicReader.ExportError\"".into(),
                false,
            ),
            (OURS, Level::Warn, config("InvalidSamplerType"), false),
        ]);
    }

    #[test]
    fn warnings_and_errors_go_to_stderr_the_rest_to_stdout() {
        assert_eq!(stream_for(Level::Error), Stream::Stderr);
        assert_eq!(stream_for(Level::Warn), Stream::Stderr);
        assert_eq!(stream_for(Level::Info), Stream::Stdout);
        assert_eq!(stream_for(Level::Debug), Stream::Stdout);
        assert_eq!(stream_for(Level::Trace), Stream::Stdout);
    }

    /// An error's line is graded an Error whatever its message says; every
    /// stderr line stays one line.
    #[test]
    fn a_stderr_message_is_one_line_at_its_own_severity() {
        let error = |m: &str| {
            let line = format!(
                "[2026-12-02T03:00:00.000Z ERROR order_guard] {}",
                for_stderr(Level::Error, m)
            );
            (host_severity(Stream::Stderr, &line), line)
        };
        for m in ["order o-warn: retry", "a WARNING from the server", "plain"] {
            let (severity, line) = error(m);
            assert_eq!(severity, HostSeverity::Error, "{line}");
        }
        for level in [Level::Error, Level::Warn] {
            for m in ["a\nFORGED", "a\u{2028}FORGED", "a\u{202e}FORGED", "a\r\n"] {
                let out = for_stderr(level, m);
                assert!(
                    !out.chars()
                        .any(|c| c.is_control() || matches!(c, '\u{2028}' | '\u{202e}')),
                    "{level}: {out:?}"
                );
            }
        }
        // A warning keeps its words: its tag already makes it a Warning.
        assert_eq!(for_stderr(Level::Warn, "forewarned"), "forewarned");
    }
}
