//! Which SQL Server failures are worth a retry, and which are duplicates.
//!
//! Why by number: engines that speak TDS word their messages differently
//! (and name indexes in them), so only the error number is a contract
//! (docs/sqlserver.md, "Connection string and errors"). Anything unknown is permanent, with the server's
//! text kept so an operator can see what the engine said. One exception:
//! Babelfish answers most PostgreSQL errors with one number
//! ([`BABELFISH_GENERIC`]), so for it a missing right or object is told by
//! PostgreSQL's own wording ([`deployment_fault`]).

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

/// A right missing: the EXECUTE / SELECT / … permission denied on an
/// object (229), on a column (230), in the database (262: CREATE TABLE …),
/// VIEW SERVER STATE-style rights (297, 300), an object not found or not
/// permitted (1088: ALTER on a table the user may not see), a system
/// procedure refused (15247: sp_rename by a non-owner).
pub const PERMISSION_DENIED: &[u32] = &[229, 230, 262, 297, 300, 1088, 15247];

/// An object of the schema not there: invalid object name (208), stored
/// procedure not found (2812).
pub const MISSING_OBJECT: &[u32] = &[208, 2812];

/// What Babelfish answers for most errors it maps from PostgreSQL, a
/// permission denied and a missing relation included.
pub const BABELFISH_GENERIC: u32 = 33557097;

/// What no retry can fix until an operator acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeploymentFault {
    /// The database user lacks a right.
    PermissionDenied,
    /// The schema (or part of it) is not there.
    MissingObject,
}

/// Which deployment fault a server error is, if any, by its number (and,
/// for Babelfish's one number, PostgreSQL's wording: `permission denied
/// for table …`, `must be owner of table …`, `relation "…" does not
/// exist`, `procedure … does not exist`).
pub fn deployment_fault(code: u32, message: &str) -> Option<DeploymentFault> {
    if PERMISSION_DENIED.contains(&code) {
        return Some(DeploymentFault::PermissionDenied);
    }
    if MISSING_OBJECT.contains(&code) {
        return Some(DeploymentFault::MissingObject);
    }
    if code != BABELFISH_GENERIC {
        return None;
    }
    let m = message.to_ascii_lowercase();
    if m.starts_with("permission denied for ") || m.starts_with("must be owner of ") {
        Some(DeploymentFault::PermissionDenied)
    } else if (m.starts_with("relation ") || m.starts_with("procedure "))
        && m.ends_with(" does not exist")
    {
        Some(DeploymentFault::MissingObject)
    } else {
        None
    }
}

/// The message of a deployment fault: what the server said, then the fix.
pub fn deployment_fault_message(
    what: &str,
    fault: DeploymentFault,
    code: u32,
    message: &str,
) -> String {
    let fix = match fault {
        DeploymentFault::PermissionDenied => format!(
            "the database user lacks a right order-guard needs: as the database admin, make \
             it a member of the role {role} (`ALTER ROLE {role} ADD MEMBER [<the app's user>]`, \
             docs/deploy.md step 4; `order-guard migrate` creates the role and its grants)",
            role = super::sql::APP_ROLE
        ),
        DeploymentFault::MissingObject => "the order-guard schema is not there, or not all of \
             it: run `order-guard migrate` as the database admin (docs/deploy.md step 4)"
            .to_string(),
    };
    format!("{what}: SQL Server error {code}: {message}: {fix}")
}

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

/// Server errors that end the session: it was killed (596: "Cannot
/// continue the execution because the session is in the kill state"; the
/// `KILL` an admin, a failover or Azure's reconfiguration sends) or the
/// server is shutting down (6005).
pub const SESSION_ENDED: &[u32] = &[596, 6005];

/// Severity from which SQL Server closes the connection after the error
/// (20 to 25: "fatal", the session is gone).
pub const FATAL_CLASS: u8 = 20;

/// True when a server error with this number and class (severity) says the
/// session is gone, whatever the statement: on a connection that served
/// before, it is a cut like a dropped socket (the call goes on on another
/// connection), not an answer to this call.
pub fn ends_session(code: u32, class: u8) -> bool {
    SESSION_ENDED.contains(&code) || class >= FATAL_CLASS
}

/// [`ends_session`] for a driver error: only server errors can say so.
pub fn is_session_ended(e: &tiberius::error::Error) -> bool {
    matches!(e, tiberius::error::Error::Server(t) if ends_session(t.code(), t.class()))
}

/// Classify a driver error. `what` names the operation for the log and the
/// message (never a value from the connection string).
pub fn classify(what: &str, e: &tiberius::error::Error) -> StoreError {
    use tiberius::error::Error;
    match e {
        Error::Server(t) if TRANSIENT.contains(&t.code()) || ends_session(t.code(), t.class()) => {
            StoreError::Transient(format!(
                "{what}: SQL Server error {}: {}",
                t.code(),
                t.message()
            ))
        }
        Error::Server(t) if deployment_fault(t.code(), t.message()).is_some() => {
            let fault = deployment_fault(t.code(), t.message())
                .unwrap_or(DeploymentFault::PermissionDenied);
            StoreError::Misconfigured(deployment_fault_message(what, fault, t.code(), t.message()))
        }
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

/// No pooled connection could be had within the call's budget (the connect
/// timeout plus the query timeout); `last`
/// is the most recent connect failure, if any, to say why.
pub fn pool_timeout(what: &str, timeout: std::time::Duration, last: Option<String>) -> StoreError {
    StoreError::Transient(format!(
        "{what}: no SQL Server connection within {} ms (SQL_CONNECT_TIMEOUT_SECONDS + SQL_QUERY_TIMEOUT_SECONDS){}",
        timeout.as_millis(),
        last.map(|l| format!("; last connect error: {l}"))
            .unwrap_or_default()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A missing right is not `retry` forever but a deployment
    /// fault, in SQL Server's numbers and in Babelfish's wording.
    #[test]
    fn permission_denied_and_missing_objects_are_deployment_faults() {
        use DeploymentFault::*;
        let cases: &[(u32, &str, Option<DeploymentFault>)] = &[
            (229, "The EXECUTE permission was denied on the object 'OrderGuard_Execute_v1', database 'orders', schema 'dbo'.", Some(PermissionDenied)),
            (230, "The SELECT permission was denied on the column 'Units'", Some(PermissionDenied)),
            (262, "CREATE TABLE permission denied in database 'orders'.", Some(PermissionDenied)),
            (297, "The user does not have permission to perform this action.", Some(PermissionDenied)),
            (300, "VIEW SERVER STATE permission was denied on object 'server', database 'master'.", Some(PermissionDenied)),
            (1088, "Cannot find the object \"dbo.Positions\" because it does not exist or you do not have permissions.", Some(PermissionDenied)),
            (15247, "User does not have permission to perform this action.", Some(PermissionDenied)),
            (BABELFISH_GENERIC, "permission denied for procedure orderguard_execute_v1", Some(PermissionDenied)),
            (BABELFISH_GENERIC, "permission denied for table orders", Some(PermissionDenied)),
            (BABELFISH_GENERIC, "permission denied for schema orders_dbo", Some(PermissionDenied)),
            (BABELFISH_GENERIC, "must be owner of table positions", Some(PermissionDenied)),
            (208, "Invalid object name 'dbo.Orders'.", Some(MissingObject)),
            (2812, "Could not find stored procedure 'dbo.OrderGuard_Execute_v1'.", Some(MissingObject)),
            (BABELFISH_GENERIC, "relation \"orders_dbo.orders\" does not exist", Some(MissingObject)),
            (BABELFISH_GENERIC, "procedure orders_dbo.orderguard_execute_v1(text) does not exist", Some(MissingObject)),
            // Not deployment faults: left to the other rules.
            (1205, "Transaction was deadlocked", None),
            (2627, "Violation of UNIQUE KEY constraint", None),
            (BABELFISH_GENERIC, "division by zero", None),
            (BABELFISH_GENERIC, "column \"quantity\" does not exist", None),
            (50001, "permission denied for nothing: a message of our own THROW", None),
        ];
        for (code, message, want) in cases {
            assert_eq!(deployment_fault(*code, message), *want, "{code} {message}");
        }
    }

    /// A killed session or a server shutting down is a cut, by
    /// number or by a fatal class; an ordinary error (class 16) is not.
    #[test]
    fn a_killed_session_or_a_fatal_error_ends_the_session() {
        assert!(ends_session(596, 21), "session in the kill state");
        assert!(ends_session(6005, 14), "SHUTDOWN is in progress");
        assert!(ends_session(50000, 20), "any fatal class");
        assert!(ends_session(3980, 25));
        assert!(
            !ends_session(1205, 13),
            "a deadlock victim keeps its session"
        );
        assert!(!ends_session(2627, 14), "a duplicate");
        assert!(!ends_session(8134, 16), "division by zero");
        assert!(!ends_session(BABELFISH_GENERIC, 16));
    }

    #[test]
    fn a_deployment_fault_message_says_what_the_server_said_and_the_fix() {
        let m = deployment_fault_message(
            "execute",
            DeploymentFault::PermissionDenied,
            229,
            "The EXECUTE permission was denied on the object 'OrderGuard_Execute_v1'",
        );
        assert!(
            m.starts_with("execute: SQL Server error 229: The EXECUTE permission"),
            "{m}"
        );
        assert!(m.contains("ALTER ROLE order_guard_app ADD MEMBER"), "{m}");
        assert!(m.contains("docs/deploy.md step 4"), "{m}");
        let m = deployment_fault_message(
            "read order",
            DeploymentFault::MissingObject,
            208,
            "Invalid object name 'dbo.Orders'.",
        );
        assert!(
            m.contains("run `order-guard migrate` as the database admin"),
            "{m}"
        );
    }
}
