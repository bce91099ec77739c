//! `migrate` on SQL Server: create or upgrade the schema, serialized
//! across processes, finishing however large the tables are.
//!
//! One migration, under an exclusive application lock owned by the session
//! (`sql::LOCK_SCHEMA`; its result is checked, never ignored):
//! 1. the first transaction: every cheap change (tables, indexes, columns
//!    added, the version-2 column renamed so earlier versions stop writing
//!    it, the role and its grants, the execution procedure re-created and
//!    granted);
//! 2. the row rewrite, in batches of `batch_rows` that each commit
//!    (`sql::CONVERT_POSITIONS`, `WHERE Units IS NULL`): a migration cut
//!    anywhere (a timeout, a killed process, a lost connection) keeps the
//!    batches it committed, and the next one goes on from there, converting
//!    each row once;
//! 3. the last transaction: what needs every row converted, then the
//!    version row. Until that row is there no instance of this version uses
//!    the schema (the fast path below, and the store's schema gate), so no
//!    reader sees a half-converted table as current.
//!
//! The fast path first: one query without locks (`sql::SCHEMA_STATE`), so
//! a start, a restart or a scale-out costs one round trip here (and one
//! for its rights, `rights.rs`).

use std::time::{Duration, Instant};

use tiberius::error::Error as SqlError;

use super::pool::Client;
use super::rights::{self, Rights};
use super::{classify, end_transaction, identity_of, run, sql};
use crate::store::StoreError;

/// How one migration is bounded (its overall time is the caller's).
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// How long the server may wait for another process's migration lock,
    /// at most: never more than three quarters of what is left before
    /// `deadline` when the lock is asked for, so a refusal is answered
    /// inside the bound however long the login and the first query took.
    pub lock_wait: Duration,
    /// When the migration's bound ends.
    pub deadline: tokio::time::Instant,
    /// Rows converted per batch (each its own transaction).
    pub batch_rows: u32,
}

/// What a migration did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Migrated {
    /// The schema was current (nothing sent but the check), and the
    /// store's identity if this user may read it (read by the same query).
    Current { identity: Option<String> },
    /// This call migrated it, converting this many position rows.
    Done { converted: u64 },
    /// `sp_getapplock` refused the lock with this result (nothing done).
    LockRefused(i32, Duration),
    /// This user may not migrate (`failure`, a deployment fault; its first
    /// transaction rolled back), and what it can see ([`verdict`] says why).
    Refused {
        diagnosis: Diagnosis,
        failure: StoreError,
    },
}

/// Where the schema stands, as this user sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SchemaState {
    current: bool,
    /// The highest version row (0: none, or not visible to this user).
    version: i32,
    /// The store's identity, read in the same round trip when this user
    /// may read it (`super::identity_of`).
    identity: Option<String>,
}

async fn schema_state(client: &mut Client) -> Result<SchemaState, SqlError> {
    let results = client
        .query(sql::SCHEMA_STATE, &[&sql::SCHEMA_VERSION])
        .await?
        .into_results()
        .await?;
    let (current, version) = results
        .first()
        .and_then(|rows| rows.first())
        .map(|r| (r.get::<i32, _>(0), r.get::<i32, _>(1)))
        .unwrap_or_default();
    let identity = results
        .get(1)
        .and_then(|rows| rows.first())
        .map(identity_of)
        .transpose()?;
    Ok(SchemaState {
        current: current.unwrap_or(0) > 0,
        version: version.unwrap_or(0),
        identity,
    })
}

/// The first column of the last row `statement` (one `INT` parameter)
/// answers, over all its result sets: what a batch that ends in `SELECT`
/// reports.
async fn last_int(client: &mut Client, statement: &str, p1: i32) -> Result<Option<i32>, SqlError> {
    Ok(client
        .query(statement, &[&p1])
        .await?
        .into_results()
        .await?
        .iter()
        .flatten()
        .last()
        .and_then(|r| r.get::<i32, _>(0)))
}

/// The first column of the first row `statement` answers (no parameters).
async fn first_int(client: &mut Client, statement: &str) -> Result<Option<i32>, SqlError> {
    Ok(client
        .simple_query(statement)
        .await?
        .into_row()
        .await?
        .and_then(|r| r.get::<i32, _>(0)))
}

/// Migrate on `client` (see the module documentation).
pub async fn migrate_on(client: &mut Client, bounds: &Bounds) -> Result<Migrated, SqlError> {
    let state = schema_state(client).await?;
    if state.current {
        return Ok(Migrated::Current {
            identity: state.identity,
        });
    }
    let wait = lock_wait(bounds, tokio::time::Instant::now());
    let millis = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
    let granted = last_int(client, sql::LOCK_SCHEMA, millis).await?;
    match granted {
        Some(r) if r >= 0 => {}
        Some(r) => return Ok(Migrated::LockRefused(r, wait)),
        None => {
            return Err(SqlError::Protocol(
                "sp_getapplock answered no result".into(),
            ))
        }
    }
    // Another process may have migrated while this one waited for the lock
    // (under RCSI the first check could not see its uncommitted row): do
    // nothing then, rather than drop and create the procedure it serves with.
    let done = if schema_state(client).await?.current {
        // Not kept: the identity is read again when asked for.
        Migrated::Current { identity: None }
    } else {
        match run_migration(client, bounds.batch_rows).await {
            Ok(converted) => Migrated::Done { converted },
            // A user without the rights to migrate: end the transaction
            // (`XACT_ABORT` has rolled most errors' back), then ask, on this
            // session (no second login at a start), what the user can see,
            // to say why.
            Err(SqlError::Server(e))
                if classify::deployment_fault(e.code(), e.message()).is_some() =>
            {
                let failure = classify::classify("migrate", &SqlError::Server(e));
                end_transaction(client, sql::ROLLBACK_AND_COUNT).await?;
                Migrated::Refused {
                    diagnosis: diagnose_on(client).await?,
                    failure,
                }
            }
            Err(e) => return Err(e),
        }
    };
    run(client, sql::UNLOCK_SCHEMA).await?;
    Ok(done)
}

/// [`sql::reader_role_batches`]: the operator's read-only role and its
/// grants, made or made again (the admin's `migrate`, every run).
pub async fn make_reader_role(client: &mut Client) -> Result<(), SqlError> {
    let mut batches = sql::reader_role_batches().into_iter();
    if let Some(create) = batches.next() {
        if let Err(e) = run(client, &create).await {
            // Another `migrate` made the role between this one's check and
            // its CREATE (SQL Server answers 15023, a compatible engine a
            // unique violation): made is made.
            let made = first_int(client, sql::READER_ROLE_EXISTS).await? == Some(1);
            if !made {
                return Err(e);
            }
        }
    }
    for batch in batches {
        run(client, &batch).await?;
    }
    Ok(())
}

async fn run_migration(client: &mut Client, batch_rows: u32) -> Result<u64, SqlError> {
    let migration = sql::migration();
    run(client, sql::BEGIN).await?;
    for batch in &migration.setup {
        run(client, batch).await?;
    }
    end_transaction(client, sql::COMMIT_AND_COUNT).await?;
    let converted = convert_positions(client, batch_rows).await?;
    run(client, sql::BEGIN).await?;
    for batch in &migration.finish {
        run(client, batch).await?;
    }
    end_transaction(client, sql::COMMIT_AND_COUNT).await?;
    Ok(converted)
}

/// How often a long conversion says how far it got.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// The version 2 → 3 conversion of positions, `batch_rows` at a time, each
/// batch committed; until a batch finds nothing left.
async fn convert_positions(client: &mut Client, batch_rows: u32) -> Result<u64, SqlError> {
    let pending = first_int(client, sql::POSITIONS_TO_CONVERT)
        .await?
        .unwrap_or(0);
    if pending == 0 {
        return Ok(0);
    }
    let rows = i32::try_from(batch_rows.max(1)).unwrap_or(i32::MAX);
    let (mut converted, mut said) = (0u64, Instant::now());
    log::info!("migrate: converting positions to units, {rows} rows per transaction");
    loop {
        let n = last_int(client, sql::CONVERT_POSITIONS, rows)
            .await?
            .unwrap_or(0);
        converted += u64::try_from(n).unwrap_or(0);
        if n == 0 {
            log::info!("migrate: {converted} positions converted to units");
            return Ok(converted);
        }
        if said.elapsed() >= PROGRESS_EVERY {
            log::info!("migrate: {converted} positions converted to units so far");
            said = Instant::now();
        }
    }
}

/// Why `sp_getapplock` refused the lock (its documented results), and
/// what to do.
/// How long the server may wait for the lock, asked at `now`: the cap, or
/// three quarters of what is left of the bound, whichever is shorter.
pub fn lock_wait(bounds: &Bounds, now: tokio::time::Instant) -> Duration {
    bounds
        .lock_wait
        .min(bounds.deadline.saturating_duration_since(now) * 3 / 4)
}

pub fn lock_refused(result: i32, waited: Duration) -> String {
    let why = match result {
        -1 => format!(
            "another session held it for more than {} ms (another `order-guard migrate` or \
             start migrating, or a session left holding it)",
            waited.as_millis()
        ),
        -2 => "the wait was cancelled".to_string(),
        -3 => "chosen as a deadlock victim".to_string(),
        _ => "the call was refused as invalid".to_string(),
    };
    format!(
        "migrate: the schema lock (sp_getapplock 'order-guard:schema') was not granted \
         (result {result}: {why}); nothing was changed: run `order-guard migrate` again once \
         the other migration is over"
    )
}

/// What a failed migration's user can see, to say why it failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnosis {
    /// The highest schema version this user sees (0: none visible).
    pub version: i32,
    /// The version table is there but this user may not read it.
    pub schema_hidden: bool,
    pub rights: Rights,
}

/// After a migration failed on a deployment fault: where the schema
/// stands for this user, whether it is hidden from it, and its rights.
async fn diagnose_on(client: &mut Client) -> Result<Diagnosis, SqlError> {
    let version = schema_state(client).await?.version;
    let probe = async {
        client
            .simple_query(sql::PROBE_SCHEMA_VERSION)
            .await?
            .into_results()
            .await
    }
    .await;
    let schema_hidden = match probe {
        Ok(_) => false,
        Err(SqlError::Server(e)) => match classify::deployment_fault(e.code(), e.message()) {
            Some(classify::DeploymentFault::PermissionDenied) => true,
            Some(classify::DeploymentFault::MissingObject) => false,
            None => return Err(SqlError::Server(e)),
        },
        Err(e) => return Err(e),
    };
    Ok(Diagnosis {
        version,
        schema_hidden,
        rights: rights::check_on(client).await?,
    })
}

/// Why a migration this user could not run failed (`failure`, a deployment
/// fault): the schema is there but hidden from the user (its rights are
/// missing: a start refuses, [`StoreError::Misconfigured`]), or older than
/// this build (the admin's `migrate` fixes it: [`StoreError::Unmigrated`]).
pub fn verdict(d: &Diagnosis, failure: &StoreError) -> StoreError {
    if d.schema_hidden {
        if let Some(refusal) = rights::refusal(&d.rights) {
            return StoreError::Misconfigured(refusal);
        }
    }
    let user = if d.rights.user.is_empty() {
        "this database user".to_string()
    } else {
        format!("the database user {}", d.rights.user)
    };
    StoreError::Unmigrated(format!(
        "the schema is at version {}, this build needs version {}: run `order-guard migrate` \
         as the database admin (docs/deploy.md step 4); {user} may not change the schema ({failure})",
        d.version,
        sql::SCHEMA_VERSION
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_wait_leaves_the_bound_room_to_answer() {
        let now = tokio::time::Instant::now();
        let bounds = |left_ms: u64| Bounds {
            lock_wait: Duration::from_millis(1500),
            deadline: now + Duration::from_millis(left_ms),
            batch_rows: 1,
        };
        // The whole bound left: the cap.
        assert_eq!(lock_wait(&bounds(2000), now), Duration::from_millis(1500));
        // A slow login took 800 ms of it: three quarters of the rest.
        assert_eq!(lock_wait(&bounds(1200), now), Duration::from_millis(900));
        // Nothing left: no wait at all (the lock is tried once).
        assert_eq!(lock_wait(&bounds(0), now), Duration::ZERO);
        assert_eq!(
            lock_wait(&bounds(100), now + Duration::from_secs(1)),
            Duration::ZERO
        );
    }
    use crate::store::sqlserver::rights::MissingRight;

    fn diagnosis(version: i32, hidden: bool, missing: &[(&str, &str)]) -> Diagnosis {
        Diagnosis {
            version,
            schema_hidden: hidden,
            rights: Rights {
                user: "orders-guard-fn".into(),
                missing: missing
                    .iter()
                    .map(|(r, o)| MissingRight {
                        right: r.to_string(),
                        object: o.to_string(),
                    })
                    .collect(),
            },
        }
    }

    #[test]
    fn an_older_schema_the_user_cannot_change_is_for_the_admins_migrate() {
        let failure = StoreError::Misconfigured("CREATE TABLE permission denied".into());
        let v = verdict(&diagnosis(2, false, &[("EXECUTE", "x")]), &failure);
        let StoreError::Unmigrated(m) = v else {
            panic!("{v:?}")
        };
        assert!(
            m.starts_with(
                "the schema is at version 2, this build needs version 6: run `order-guard \
                 migrate` as the database admin (docs/deploy.md step 4)"
            ),
            "{m}"
        );
        assert!(m.contains("orders-guard-fn"), "{m}");
        // No schema at all is the same: the admin's migrate makes it.
        assert!(matches!(
            verdict(&diagnosis(0, false, &[]), &failure),
            StoreError::Unmigrated(_)
        ));
    }

    #[test]
    fn a_schema_hidden_from_the_user_is_its_missing_rights() {
        let failure = StoreError::Misconfigured("permission denied for schema".into());
        let v = verdict(
            &diagnosis(0, true, &[("SELECT", "dbo.SchemaVersion")]),
            &failure,
        );
        let StoreError::Misconfigured(m) = v else {
            panic!("{v:?}")
        };
        assert!(m.contains("SELECT on dbo.SchemaVersion"), "{m}");
        assert!(
            m.contains("ALTER ROLE order_guard_app ADD MEMBER [orders-guard-fn];"),
            "{m}"
        );
    }

    #[test]
    fn a_refused_lock_says_why_and_that_nothing_changed() {
        let m = lock_refused(-1, Duration::from_millis(1500));
        assert!(m.contains("result -1"), "{m}");
        assert!(m.contains("more than 1500 ms"), "{m}");
        assert!(m.contains("nothing was changed"), "{m}");
        assert!(lock_refused(-3, Duration::ZERO).contains("deadlock victim"));
        assert!(lock_refused(-999, Duration::ZERO).contains("invalid"));
    }
}
