//! The writer thread that owns the SQLite connection: it groups the calls
//! waiting for it into one `IMMEDIATE` transaction each, every call in its
//! own savepoint, answers none before the group's commit, and sheds load
//! (a full queue, callers that stopped waiting). See the module above.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;

use rusqlite::Connection;

use super::classify;
use crate::store::StoreError;

/// At most this many calls share one commit.
pub const MAX_GROUP: usize = 64;

/// At most this many calls wait for the writer; more are answered `retry` at
/// once. Sixteen full groups: at a few milliseconds per durable commit, well
/// inside any caller's deadline.
pub const MAX_QUEUED: usize = 1024;

/// Statements kept prepared on the writer's connection: the writer's own
/// seven and about twenty of the calls', with room to spare.
const STATEMENT_CACHE: usize = 64;

/// One of the writer's own statements (`BEGIN IMMEDIATE`, a savepoint, …),
/// prepared once per connection: they run around every call, and parsing
/// them each time cost part of a first delivery's instructions
/// (`docs/architecture.md`, "SQLite's hot statements are prepared once").
fn run_cached(conn: &Connection, sql: &str) -> Result<(), rusqlite::Error> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// One call for the writer thread.
pub(super) trait Call: Send {
    /// The caller stopped waiting: skip the call.
    fn abandoned(&self) -> bool;
    /// Whether its effect must be on disk before it is answered (see
    /// [`Durability`]).
    fn durability(&self) -> Durability;
    /// Given the connection, run inside the call's own savepoint and hand
    /// back its failure, if any (then its savepoint is rolled back); given
    /// `None`, do not run. Either way hand back how to answer once the
    /// group's commit (or failure) is known.
    fn run(self: Box<Self>, conn: Option<&mut Connection>) -> (Option<StoreError>, Reply);
}

pub(super) type Job = Box<dyn Call>;
type Reply = Box<dyn FnOnce(Option<&StoreError>) + Send>;

/// Whether a call's commit waits for the disk.
///
/// The outbox's bookkeeping (a claim's lease, a row marked sent, deferred,
/// purged) may be lost in a power cut without harm: a lost claim or mark
/// means a row sent again (announcements are at least once, consumers
/// deduplicate by message id), a lost deferral a retry sooner, a lost
/// purge a delete done again. Such a group commits with `synchronous =
/// NORMAL` (in WAL mode: atomic, durable against a crash of the process,
/// made durable on disk by the next `FULL` commit, which syncs the whole
/// log) and does not make the orders behind it wait for two more fsyncs a
/// dispatch round. Everything else is `Full`; a group holding any `Full`
/// call commits `FULL`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Durability {
    Full,
    Relaxed,
}

/// A call and where its answer goes.
pub(super) struct Pending<T, F> {
    pub(super) tx: tokio::sync::oneshot::Sender<Result<T, StoreError>>,
    pub(super) f: F,
    pub(super) durability: Durability,
}

impl<T, F> Call for Pending<T, F>
where
    T: Send + 'static,
    F: FnOnce(&mut Connection) -> Result<T, rusqlite::Error> + Send + 'static,
{
    fn abandoned(&self) -> bool {
        self.tx.is_closed()
    }

    fn durability(&self) -> Durability {
        self.durability
    }

    fn run(self: Box<Self>, conn: Option<&mut Connection>) -> (Option<StoreError>, Reply) {
        let Pending { tx, f, .. } = *self;
        let Some(conn) = conn else {
            let reply: Reply = Box::new(move |e| {
                let e = e
                    .cloned()
                    .unwrap_or_else(|| StoreError::Transient("store call not run".into()));
                let _ = tx.send(Err(e));
            });
            return (None, reply);
        };
        let result = match catch_unwind(AssertUnwindSafe(|| f(conn))) {
            Ok(r) => r.map_err(classify),
            Err(_) => Err(StoreError::Transient(
                "store task failed: it panicked".into(),
            )),
        };
        let failed = result.as_ref().err().cloned();
        let reply: Reply = Box::new(move |commit_failed| {
            let _ = tx.send(match commit_failed {
                Some(e) => Err(e.clone()),
                None => result,
            });
        });
        (failed, reply)
    }
}

/// How the writer has shed load (for tests, figures and operators).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pressure {
    /// Calls answered `retry` at once because the queue was full.
    pub refused: u64,
    /// Calls skipped because their caller had stopped waiting.
    pub skipped: u64,
    /// Commits of groups that ran at least one call (tried: a failed commit
    /// counts too): calls ÷ commits is about how many calls one fsync
    /// served.
    pub commits: u64,
    /// The most calls the writer took from its queue for one transaction
    /// (at most [`MAX_GROUP`]; a call found abandoned inside it is skipped).
    pub largest_group: u64,
}

#[derive(Default)]
pub(super) struct PressureCounters {
    pub(super) refused: AtomicU64,
    pub(super) skipped: AtomicU64,
    pub(super) commits: AtomicU64,
    pub(super) largest_group: AtomicU64,
}

/// The writer thread: groups waiting calls into one transaction each.
pub(super) fn writer(
    mut conn: Connection,
    queue: mpsc::Receiver<Job>,
    pressure: &PressureCounters,
) {
    // The connection is opened `FULL` (`SqliteStore::open`).
    let mut synchronous = Durability::Full;
    // Room for every statement the calls cache and the writer's own: an
    // evicted statement is parsed again on its next use.
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    while let Ok(first) = queue.recv() {
        let mut group = Vec::with_capacity(MAX_GROUP);
        let mut next = Some(first);
        while let Some(job) = next.take() {
            if job.abandoned() {
                // Already answered `retry` by its caller's deadline.
                pressure.skipped.fetch_add(1, Ordering::Relaxed);
            } else {
                group.push(job);
            }
            if group.len() < MAX_GROUP {
                next = queue.try_recv().ok();
            }
        }
        if !group.is_empty() {
            pressure
                .largest_group
                .fetch_max(group.len() as u64, Ordering::Relaxed);
            run_group(&mut conn, group, pressure, &mut synchronous);
        }
    }
}

fn run_group(
    conn: &mut Connection,
    group: Vec<Job>,
    pressure: &PressureCounters,
    synchronous: &mut Durability,
) {
    let fail_all = |replies: Vec<Reply>, e: &StoreError| {
        for r in replies {
            r(Some(e));
        }
    };
    let wanted = group_durability(group.iter().map(|job| job.durability()));
    let switched = if wanted == *synchronous {
        Ok(())
    } else {
        run_cached(
            conn,
            match wanted {
                Durability::Full => "PRAGMA synchronous = FULL",
                Durability::Relaxed => "PRAGMA synchronous = NORMAL",
            },
        )
        .map(|()| *synchronous = wanted)
    };
    if let Err(e) = switched.and_then(|()| run_cached(conn, "BEGIN IMMEDIATE")) {
        let replies = group.into_iter().map(|job| job.run(None).1).collect();
        fail_all(replies, &classify(e));
        return;
    }
    let mut replies = Vec::with_capacity(group.len());
    let mut jobs = group.into_iter();
    while let Some(job) = jobs.next() {
        // Asked again now that the group holds the write lock (taking it may
        // have waited out another process): a caller that stopped waiting
        // meanwhile was answered `retry`, and its redelivery will do the
        // work. Best effort (a caller may give up just after this check):
        // correctness never depends on it, a late effect is harmless.
        if job.abandoned() {
            pressure.skipped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let step = match run_cached(conn, "SAVEPOINT job") {
            Err(e) => {
                // Not run: answered with the group's failure below.
                replies.push(job.run(None).1);
                Err(classify(e))
            }
            Ok(()) => {
                let (failed, reply) = job.run(Some(&mut *conn));
                replies.push(reply);
                if conn.is_autocommit() {
                    // SQLite ended the transaction itself: an I/O error (a
                    // disk gone away) or a full disk rolls back the whole
                    // transaction, not the statement, and every savepoint
                    // with it. The group's calls share its fate and its
                    // cause (`classify`: an I/O error is transient, a full
                    // disk is not).
                    Err(failed.unwrap_or_else(|| {
                        StoreError::Transient("SQLite rolled the transaction back".into())
                    }))
                } else {
                    let undone = match failed {
                        None => Ok(()),
                        Some(_) => run_cached(conn, "ROLLBACK TO job"),
                    };
                    undone
                        .and_then(|()| run_cached(conn, "RELEASE job"))
                        .map_err(classify)
                }
            }
        };
        if let Err(e) = step {
            // The transaction is in an unknown state: abandon the whole group.
            let _ = conn.execute_batch("ROLLBACK");
            replies.extend(jobs.map(|job| job.run(None).1));
            fail_all(replies, &e);
            return;
        }
    }
    if !replies.is_empty() {
        pressure.commits.fetch_add(1, Ordering::Relaxed);
    }
    match run_cached(conn, "COMMIT") {
        Ok(()) => {
            for r in replies {
                r(None);
            }
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            fail_all(replies, &classify(e));
        }
    }
}

/// A group commits `Relaxed` only when every call of it may. Pure.
fn group_durability(calls: impl IntoIterator<Item = Durability>) -> Durability {
    if calls.into_iter().all(|d| d == Durability::Relaxed) {
        Durability::Relaxed
    } else {
        Durability::Full
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_waits_for_the_disk_unless_every_call_may_not() {
        use Durability::{Full, Relaxed};
        assert_eq!(group_durability([Relaxed, Relaxed]), Relaxed);
        assert_eq!(group_durability([Relaxed, Full, Relaxed]), Full);
        assert_eq!(group_durability([Full]), Full);
    }

    /// A disk gone in the middle of a group, an I/O error in one call's own
    /// statement: SQLite rolls the whole transaction back, savepoints and
    /// all, so every call of the group fails, as transient and with the
    /// error that ended it (not "no such savepoint", taken for permanent),
    /// and nothing of the group is kept. The same connection serves again
    /// once the disk is back. The same when it goes just before the
    /// group's commit.
    #[cfg(feature = "failpoints")]
    #[test]
    fn a_disk_gone_mid_group_fails_the_whole_group_as_transient_and_keeps_none_of_it() {
        let dir = tempfile::tempdir().unwrap();
        let away = dir.path().join("disk-away");
        // Not the default VFS: other tests of this process are untouched.
        crate::faults::disk::arm(away.clone(), false).unwrap();
        let mut conn = Connection::open_with_flags_and_vfs(
            dir.path().join("t.db"),
            rusqlite::OpenFlags::default(),
            crate::faults::disk::NAME,
        )
        .unwrap();
        // A table of many pages, for a read that needs the file.
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             CREATE TABLE t (x INTEGER);
             CREATE TABLE big (b BLOB);
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200)
             INSERT INTO big SELECT zeroblob(4000) FROM n;",
        )
        .unwrap();
        type Answer = tokio::sync::oneshot::Receiver<Result<(), StoreError>>;
        fn job<F>(f: F) -> (Job, Answer)
        where
            F: FnOnce(&mut Connection) -> Result<(), rusqlite::Error> + Send + 'static,
        {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let durability = Durability::Full;
            (Box::new(Pending { tx, f, durability }), rx)
        }
        let insert = |x: i64| {
            job(move |conn: &mut Connection| {
                conn.execute("INSERT INTO t VALUES (?1)", [x]).map(|_| ())
            })
        };
        let gone = away.clone();
        let (first, second, third) = (
            insert(1),
            job(move |conn: &mut Connection| {
                // Every clean page dropped from the cache (its size alone
                // does not bound it: caches of one process may share one
                // pool of pages), so the read below goes to the file.
                // SAFETY: the handle is this live connection's, used on
                // its own thread.
                unsafe { rusqlite::ffi::sqlite3_db_release_memory(conn.handle()) };
                std::fs::write(&gone, b"").unwrap();
                conn.query_row(
                    "SELECT count(*) FROM big WHERE b = zeroblob(4000)",
                    [],
                    |r| r.get::<_, i64>(0),
                )
                .map(|_| ())
            }),
            insert(3),
        );
        let (pressure, mut synchronous) = (PressureCounters::default(), Durability::Full);
        run_group(
            &mut conn,
            vec![first.0, second.0, third.0],
            &pressure,
            &mut synchronous,
        );
        assert_eq!(
            pressure.commits.load(Ordering::Relaxed),
            0,
            "no commit was tried"
        );
        for (name, mut answer) in [("first", first.1), ("second", second.1), ("third", third.1)] {
            match answer.try_recv() {
                Ok(Err(StoreError::Transient(e))) if e.contains("disk I/O error") => {}
                other => panic!(
                    "the {name} call of the group: want a transient I/O error, got {other:?}"
                ),
            }
        }

        std::fs::remove_file(&away).unwrap();
        let mut after = insert(4);
        run_group(&mut conn, vec![after.0], &pressure, &mut synchronous);
        assert_eq!(after.1.try_recv().unwrap(), Ok(()));

        // Gone at the commit: its write or sync of the WAL fails, the group is
        // rolled back, every call answered the commit's I/O error.
        let gone = away.clone();
        let (fifth, sixth) = (
            insert(5),
            job(move |conn: &mut Connection| {
                conn.execute("INSERT INTO t VALUES (6)", [])?;
                std::fs::write(&gone, b"").unwrap();
                Ok(())
            }),
        );
        run_group(
            &mut conn,
            vec![fifth.0, sixth.0],
            &pressure,
            &mut synchronous,
        );
        assert_eq!(
            pressure.commits.load(Ordering::Relaxed),
            2,
            "the group after the disk came back committed, this one tried to"
        );
        for (name, mut answer) in [("fifth", fifth.1), ("sixth", sixth.1)] {
            match answer.try_recv() {
                Ok(Err(StoreError::Transient(e))) if e.contains("disk I/O error") => {}
                other => panic!(
                    "the {name} call, its commit failed: want a transient I/O error, got {other:?}"
                ),
            }
        }
        std::fs::remove_file(&away).unwrap();
        let kept: Vec<i64> = conn
            .prepare("SELECT x FROM t")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(kept, vec![4], "nothing of the failed group is kept");
    }
}
