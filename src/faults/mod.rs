//! Named fault points for the chaos tests (issue: exactly-once under faults).
//!
//! Built only with `--features failpoints`; otherwise `fail_point!` expands to
//! nothing and release builds carry no cost. Points are configured with the
//! `FAILPOINTS` environment variable, e.g.
//! `FAILPOINTS='after_guard_acquire=5%return(crash);before_complete=10%return(error)'`:
//! `return(crash)` aborts the process on the spot (a worker dying mid-way),
//! `return(error)` makes the step fail as a transient dependency error.
//!
//! One fault is not a point in the code but the disk under the SQLite store:
//! with [`DISK_AWAY_WHILE`] set, every SQLite file operation fails while the
//! file it names exists ([`disk`]).

#[cfg(feature = "failpoints")]
pub mod disk;

/// The environment variable naming the file whose existence takes the
/// SQLite store's disk away (`disk::arm`): the chaos run creates it for an
/// outage and removes it when the outage ends.
pub const DISK_AWAY_WHILE: &str = "FAULT_DISK_AWAY_WHILE";

/// After the guard reservation is taken, before the store is touched.
pub const AFTER_GUARD_ACQUIRE: &str = "after_guard_acquire";
/// After `execute` committed, before the guard is marked `COMPLETADA`.
pub const BEFORE_COMPLETE: &str = "before_complete";
/// In guard release, before the compare-and-delete is sent.
pub const IN_RELEASE: &str = "in_release";
/// The COMMIT inside the SQL Server store's execution batch: `fail`,
/// `skip`, `cut` or `crash` (see `store::sqlserver`).
pub const SQLSERVER_COMMIT: &str = "sqlserver_commit";

/// In the outbox's send, before the message goes out: `500`, `503`, `413`
/// (any status: the queue answering it), `slow` (two seconds, then the
/// send), or `crash`.
pub const OUTBOX_SEND: &str = "outbox_send";
/// In a dispatch round, after its sends and before their mark: `crash` is
/// a dispatcher killed between send and mark (its rows are sent again when
/// the lease ends).
pub const OUTBOX_AFTER_SEND: &str = "outbox_after_send";

/// The webhook's floor between two fetches of the signing keys, in ms
/// (`return(300)`): a test's seconds in place of 30.
pub const WEBHOOK_KEYS_FLOOR_MS: &str = "webhook_keys_floor_ms";
/// How long the webhook keeps its signing keys before it refreshes them,
/// in ms (`return(0)`): a test's keys always too old.
pub const WEBHOOK_KEYS_KEPT_MS: &str = "webhook_keys_kept_ms";

/// What a triggered point does: `crash` aborts the process, anything else is
/// an error of the kind the caller maps it to.
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
pub(crate) fn crash_or_error(point: &str, arg: Option<String>) -> String {
    if arg.as_deref() == Some("crash") {
        // Like SIGKILL mid-invocation: no unwinding, no cleanup, no answer.
        eprintln!("fault point {point}: crash");
        std::process::abort();
    }
    format!("fault injected at {point}")
}

/// Set up the points from `FAILPOINTS` (no-op without the feature).
pub fn setup_from_env() {
    #[cfg(feature = "failpoints")]
    {
        if let Ok(spec) = std::env::var("FAILPOINTS") {
            for part in spec.split(';').filter(|p| !p.trim().is_empty()) {
                if let Some((name, action)) = part.split_once('=') {
                    if let Err(e) = fail::cfg(name.trim(), action.trim()) {
                        eprintln!("FAILPOINTS: ignoring {part:?}: {e}");
                    }
                }
            }
            log::warn!("fault points armed: {spec}");
        }
        if let Some(switch) = std::env::var_os(DISK_AWAY_WHILE) {
            let switch = std::path::PathBuf::from(switch);
            match disk::arm(switch.clone(), true) {
                Ok(()) => log::warn!(
                    "disk fault armed: SQLite's files fail while {} exists",
                    switch.display()
                ),
                Err(e) => {
                    // A chaos run must not go on quietly without its fault.
                    eprintln!("{DISK_AWAY_WHILE}: the disk fault could not be armed: {e}");
                    std::process::exit(2);
                }
            }
        }
    }
}
