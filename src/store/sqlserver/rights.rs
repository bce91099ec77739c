//! Does the connected user hold every right order-guard uses? Checked at
//! every start once the schema is current, so a deployment
//! whose database user lacks one refuses to start, naming each missing
//! right and the fix, instead of answering `retry` for every order.
//!
//! The rights are [`sql::APP_RIGHTS`], granted by `migrate` to the role
//! [`sql::APP_ROLE`]; docs/deploy.md step 4 makes the app's user a member.

use tiberius::error::Error as SqlError;

use super::pool::Client;
use super::{opt_text, sql};

/// What a right of [`sql::APP_RIGHTS`] the user lacks does, once the
/// schema is found current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppRights {
    /// A start of the app: it refuses (`StoreError::Misconfigured`).
    Required,
    /// The admin's `migrate`: said, not refused (an admin who may change
    /// the schema need not hold the app's table rights).
    Said,
    /// A command that only reads (`status`, `outbox list`): not asked; the
    /// operator's read-only role ([`sql::READER_ROLE`]) holds none of them.
    NotNeeded,
}

/// One right the user lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingRight {
    /// `EXECUTE`, `SELECT`, `INSERT`, `UPDATE`.
    pub right: String,
    /// `dbo.Orders`, …
    pub object: String,
}

/// What [`sql::MISSING_RIGHTS`] answered: who the user is, and what it lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rights {
    pub user: String,
    pub missing: Vec<MissingRight>,
}

/// [`sql::MISSING_RIGHTS`], one round trip.
pub async fn check_on(client: &mut Client) -> Result<Rights, SqlError> {
    let rows = client
        .simple_query(sql::MISSING_RIGHTS)
        .await?
        .into_first_result()
        .await?;
    let mut rights = Rights {
        user: String::new(),
        missing: Vec::new(),
    };
    for row in &rows {
        rights.user = opt_text(row, 0)?.unwrap_or_default();
        if let (Some(right), Some(object)) = (opt_text(row, 1)?, opt_text(row, 2)?) {
            rights.missing.push(MissingRight { right, object });
        }
    }
    Ok(rights)
}

/// Why a start refuses, when `rights` lacks any: each missing right, then
/// the fix (docs/deploy.md step 4). `None` when nothing is missing.
pub fn refusal(rights: &Rights) -> Option<String> {
    if rights.missing.is_empty() {
        return None;
    }
    let list: Vec<String> = rights
        .missing
        .iter()
        .map(|m| format!("{} on {}", m.right, m.object))
        .collect();
    let (user, quoted) = if rights.user.is_empty() {
        (
            "<the app's user>".to_string(),
            "[<the app's user>]".to_string(),
        )
    } else {
        // A bracketed identifier escapes `]` by doubling it.
        (
            rights.user.clone(),
            format!("[{}]", rights.user.replace(']', "]]")),
        )
    };
    Some(format!(
        "the database user {user} lacks {} right(s) order-guard needs: {}; as the database \
         admin, run `ALTER ROLE {role} ADD MEMBER {quoted};` (docs/deploy.md step 4; the role and its \
         grants are made by `order-guard migrate`, run as the admin first)",
        list.len(),
        list.join(", "),
        role = sql::APP_ROLE
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn missing(right: &str, object: &str) -> MissingRight {
        MissingRight {
            right: right.into(),
            object: object.into(),
        }
    }

    #[test]
    fn nothing_missing_is_no_refusal() {
        let rights = Rights {
            user: "orders-guard-fn".into(),
            missing: vec![],
        };
        assert_eq!(refusal(&rights), None);
    }

    #[test]
    fn a_refusal_names_each_missing_right_the_user_and_the_fix() {
        let rights = Rights {
            user: "orders-guard-fn".into(),
            missing: vec![
                missing("EXECUTE", "dbo.OrderGuard_Execute_v1"),
                missing("INSERT", "dbo.RejectedEvents"),
            ],
        };
        let m = refusal(&rights).unwrap();
        assert!(
            m.contains("EXECUTE on dbo.OrderGuard_Execute_v1, INSERT on dbo.RejectedEvents"),
            "{m}"
        );
        assert!(
            m.contains("ALTER ROLE order_guard_app ADD MEMBER [orders-guard-fn];"),
            "{m}"
        );
        assert!(m.contains("docs/deploy.md step 4"), "{m}");
        // A name holding `]` stays one identifier in the statement to run.
        let odd = Rights {
            user: "ops]team".into(),
            missing: vec![missing("EXECUTE", "dbo.OrderGuard_Execute_v1")],
        };
        let m = refusal(&odd).unwrap();
        assert!(m.contains("ADD MEMBER [ops]]team];"), "{m}");
    }

    /// The check asks for exactly the rights `schema.sql` grants the role
    /// (and the procedure's grant), so the two cannot drift apart.
    #[test]
    fn the_check_and_the_grants_agree() {
        let granted = granted_rights();
        let mut listed: Vec<(String, String)> = sql::APP_RIGHTS
            .iter()
            .map(|(r, o)| (r.to_string(), o.to_string()))
            .collect();
        listed.sort();
        assert_eq!(granted, listed);
        for (right, object) in sql::APP_RIGHTS {
            assert!(
                sql::MISSING_RIGHTS.contains(&format!("(N'{right}', N'{object}')")),
                "{right} on {object} is not checked"
            );
        }
        assert_eq!(
            sql::MISSING_RIGHTS.matches("(N'").count(),
            sql::APP_RIGHTS.len(),
            "the check asks for a right the list does not hold"
        );
        // Nothing beyond reading and writing rows, no DDL; the only DELETEs
        // are the outbox's retention's (its rows, the epochs they no
        // longer need).
        for (right, object) in sql::APP_RIGHTS {
            assert!(
                ["EXECUTE", "SELECT", "INSERT", "UPDATE"].contains(right)
                    || [("DELETE", "dbo.Outbox"), ("DELETE", "dbo.OutboxEpoch")]
                        .contains(&(*right, *object)),
                "{right} on {object}"
            );
        }
    }

    /// (right, object) of every `GRANT … TO order_guard_app` migrate sends.
    fn granted_rights() -> Vec<(String, String)> {
        let mut out = Vec::new();
        for batch in sql::schema_batches() {
            for line in batch.lines() {
                let line = line.trim().trim_end_matches(';');
                let Some(rest) = line.strip_prefix("GRANT ") else {
                    continue;
                };
                let (rights, rest) = rest.split_once(" ON ").unwrap();
                let (object, role) = rest.split_once(" TO ").unwrap();
                assert_eq!(role, sql::APP_ROLE, "{line}");
                for right in rights.split(", ") {
                    out.push((right.to_string(), object.to_string()));
                }
            }
        }
        out.sort();
        out
    }
}
