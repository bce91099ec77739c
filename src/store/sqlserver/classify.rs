//! Which SQL Server failures are worth a retry, and which are duplicates.
//!
//! Why by number: engines that speak TDS word their messages differently
//! (and name indexes in them), so only the error number is a contract
//! (docs/protocol.md 7.3). Anything unknown is permanent, with the server's
//! text kept so an operator can see what the engine said.

use crate::store::StoreError;

/// Unique violations: 2627 (PRIMARY KEY / UNIQUE constraint), 2601 (unique
/// index). Compatible engines may answer 2627 for both.
pub const UNIQUE_VIOLATION: &[u32] = &[2627, 2601];

/// Server error numbers that mean "try again later": deadlock victim (1205),
/// lock request timeout (1222), lock resources exhausted (1204), Azure SQL's
/// documented transient numbers (reconfiguration, throttling, resource
/// limits), and the transport-level ones Microsoft.Data.SqlClient retries
/// (233, 997).
pub const TRANSIENT: &[u32] = &[
    1205, 1222, 1204, 40613, 40501, 40197, 49918, 49919, 49920, 4060, 4221, 615, 926, 10928, 10929,
    233, 997,
];

/// True when `e` is a unique violation (the duplicate case, not an error).
pub fn is_unique_violation(e: &tiberius::error::Error) -> bool {
    e.code().is_some_and(|c| UNIQUE_VIOLATION.contains(&c))
}

/// True when `e` says the connection itself is gone or unusable, so the
/// connection must be dropped and the call may be retried once on a fresh one.
pub fn is_connection_lost(e: &tiberius::error::Error) -> bool {
    matches!(
        e,
        tiberius::error::Error::Io { .. }
            | tiberius::error::Error::Tls(_)
            | tiberius::error::Error::Protocol(_)
            | tiberius::error::Error::Routing { .. }
    )
}

/// The transport under the connection broke (I/O or TLS): what a server
/// restart does to every pooled connection at once. Narrower than
/// [`is_connection_lost`]: a protocol error that repeats on every
/// connection must not make a call discard the whole pool.
pub fn is_transport_cut(e: &tiberius::error::Error) -> bool {
    matches!(
        e,
        tiberius::error::Error::Io { .. } | tiberius::error::Error::Tls(_)
    )
}

/// Classify a driver error. `what` names the operation for the log and the
/// message (never a value from the connection string).
pub fn classify(what: &str, e: &tiberius::error::Error) -> StoreError {
    use tiberius::error::Error;
    match e {
        Error::Server(t) if TRANSIENT.contains(&t.code()) => StoreError::Transient(format!(
            "{what}: SQL Server error {}: {}",
            t.code(),
            t.message()
        )),
        Error::Server(t) => {
            log::error!(
                "{what}: SQL Server error {} (state {}, class {}): {}",
                t.code(),
                t.state(),
                t.class(),
                t.message()
            );
            StoreError::Permanent(format!(
                "{what}: SQL Server error {}: {}",
                t.code(),
                t.message()
            ))
        }
        Error::Io { kind, message } => {
            StoreError::Transient(format!("{what}: connection lost ({kind:?}): {message}"))
        }
        Error::Tls(_) | Error::Protocol(_) | Error::Routing { .. } => {
            StoreError::Transient(format!("{what}: connection failed: {e}"))
        }
        other => {
            log::error!("{what}: {other}");
            StoreError::Permanent(format!("{what}: {other}"))
        }
    }
}

/// The query did not finish within the configured query timeout.
pub fn query_timeout(what: &str, timeout: std::time::Duration) -> StoreError {
    StoreError::Transient(format!(
        "{what}: no answer from SQL Server within {} ms (SQL_QUERY_TIMEOUT_SECONDS)",
        timeout.as_millis()
    ))
}

/// No pooled connection could be had within the connect timeout; `last`
/// is the most recent connect failure, if any, to say why.
pub fn pool_timeout(what: &str, timeout: std::time::Duration, last: Option<String>) -> StoreError {
    StoreError::Transient(format!(
        "{what}: no SQL Server connection within {} ms (SQL_CONNECT_TIMEOUT_SECONDS){}",
        timeout.as_millis(),
        last.map(|l| format!("; last connect error: {l}"))
            .unwrap_or_default()
    ))
}
