//! Least privilege, proven on the T-SQL engine: the app runs as
//! docs/deploy.md step 4 deploys it, a database user whose only right is the role
//! `order_guard_app` that `migrate` makes; a user that lacks a right is
//! refused at start, naming each right and the fix, and `replay` stops at
//! once instead of retrying for minutes; a schema older than the build that
//! the user may not change says to run `migrate` as the admin.
//!
//! Runs when `ORDER_GUARD_TEST_MSSQL` names a server (`scripts/test.sh`
//! starts the T-SQL engine and sets it), as its owner; says so and runs
//! nothing otherwise. Each test works in a fresh database of its own.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use order_guard::config::Config;
use order_guard::processor::OutcomeKind;
use order_guard::store::sqlserver::sql;
use order_guard::store::{OrderStore, Rejection, RejectionKind, SqlServerStore, StoreError};
use serde_json::{json, Value};

use common::unique_id;

/// The manual deployment, whose step 4 makes the app's database user.
const DEPLOY: &str = include_str!("../docs/deploy.md");

/// The statements step 4 of docs/deploy.md runs with `sqlcmd -Q "…"` (the text
/// between `-Q "` and the closing `"` in the step's code block).
fn readme_step_4_sql() -> String {
    let step = DEPLOY
        .split("**4. ")
        .nth(1)
        .expect("docs/deploy.md step 4")
        .split("**5. ")
        .next()
        .unwrap();
    let sql = step
        .split("-Q \"")
        .nth(1)
        .expect("a sqlcmd -Q \"…\" in docs/deploy.md step 4")
        .split('"')
        .next()
        .unwrap();
    sql.trim().to_string()
}

fn store(cs: &str) -> SqlServerStore {
    SqlServerStore::connect(cs, &common::mssql_settings(Duration::from_secs(20))).unwrap()
}

async fn owner_batch(cs: &str, batch: &str) {
    let mut owner = common::mssql_raw_client(cs).await;
    let run = async { owner.simple_query(batch).await?.into_results().await };
    run.await
        .unwrap_or_else(|e| panic!("as the owner: {e}\n{batch}"));
}

fn order_guard(cs: &str, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(common::handler_binary());
    cmd.args(args)
        .env_remove("REDIS_URL")
        .env_remove("FAILPOINTS")
        .env("SQL_CONNECTION_STRING", cs)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// `order-guard replay` of `events` as `cs`: (success, stdout, stderr, time).
async fn replay(cs: &str, events: &[Value]) -> (bool, String, String, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.json");
    std::fs::write(&file, serde_json::to_vec(events).unwrap()).unwrap();
    let started = Instant::now();
    let out = order_guard(cs, &["replay", &file.display().to_string()])
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
        started.elapsed(),
    )
}

/// The real handler's `serve` on `cs` (warnings and errors logged): its
/// folder, log file, port and process.
fn serve_as(
    cs: &str,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    u16,
    tokio::process::Child,
) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("handler.log");
    let port = common::free_port();
    let mut env = common::handler_env(port, dir.path());
    env.push(("SQL_CONNECTION_STRING".into(), cs.to_string()));
    env.push(("RUST_LOG".into(), "warn".into()));
    let child = common::spawn_handler(&common::handler_binary(), &env, &log);
    (dir, log, port, child)
}

/// `order-guard migrate` as `cs` (the admin).
async fn migrate(cs: &str) {
    let out = order_guard(cs, &["migrate"]).output().await.unwrap();
    assert!(
        out.status.success(),
        "migrate: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn summary_field(summary: &str, name: &str) -> u64 {
    summary
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name}= in {summary:?}"))
}

fn order_event(id: &str, account: &str, quantity: &str) -> Value {
    common::eg_event(common::order_data(id, "buy", "MSFT", quantity, account))
}

/// docs/deploy.md step 4 as written, on a fresh database: `migrate` as the admin,
/// then the step's own statements for the app's user (its `$APP` a test
/// user, and `FROM EXTERNAL PROVIDER`, an Entra ID identity, which the
/// engine has not, replaced by `FOR LOGIN` a test login). As that user,
/// every path runs: `serve`'s processor (an order, its duplicate, a
/// conflict, a poison event and its redelivery), the dead-letter sweep's
/// store calls, `status`, and `replay` through the binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_step_4_statements_are_all_the_app_needs() {
    let Some(cs) = common::mssql_connection_string() else {
        return;
    };
    let db = common::mssql_fresh_database(&cs).await;
    migrate(&db).await;
    let step_4 = readme_step_4_sql();
    assert_eq!(
        step_4.split_whitespace().collect::<Vec<_>>().join(" "),
        "CREATE USER [$APP] FROM EXTERNAL PROVIDER; ALTER ROLE order_guard_app ADD MEMBER [$APP];",
        "docs/deploy.md step 4 changed: this test runs what it says"
    );
    let user = "og_readme";
    let login = format!("{user}_{}", common::mssql_database_of(&db));
    owner_batch(
        &db,
        &format!(
            "CREATE LOGIN [{login}] WITH PASSWORD = '{}'",
            common::MSSQL_APP_PASSWORD
        ),
    )
    .await;
    owner_batch(
        &db,
        &step_4
            .replace("$APP", user)
            .replace("FROM EXTERNAL PROVIDER", &format!("FOR LOGIN [{login}]")),
    )
    .await;
    let app = common::mssql_as_login(&db, &login);

    // serve's processor, as that user.
    let store = std::sync::Arc::new(store(&app));
    store.migrate().await.expect("the start's check passes");
    let processor = common::processor(common::memory_guard(), store.clone());
    let (id, account) = (unique_id("ord"), unique_id("acct"));
    let first = order_event(&id, &account, "5");
    let answers = [
        processor.process_event(&first).await,
        processor.process_event(&first).await,
        processor
            .process_event(&order_event(&id, &account, "6"))
            .await,
        processor
            .process_event(&common::eg_event(json!({"orderId": unique_id("bad")})))
            .await,
    ];
    let kinds: Vec<OutcomeKind> = answers.iter().map(|o| o.outcome).collect();
    assert_eq!(
        kinds,
        [
            OutcomeKind::Executed,
            OutcomeKind::Duplicate,
            OutcomeKind::Conflict,
            OutcomeKind::Rejected
        ],
        "{answers:#?}"
    );
    // A redelivered poison event: counted (UPDATE), and the dead-letter
    // sweep's own calls: an unreadable blob stored as poison, the rows read.
    let poison = Rejection {
        kind: RejectionKind::Poison,
        order_id: None,
        event_id: Some("blob".into()),
        reason: "unreadable dead-letter blob".into(),
        fingerprint: None,
        existing_fingerprint: None,
        raw_event: unique_id("raw"),
    };
    store.reject(&poison).await.unwrap();
    store.reject(&poison).await.unwrap();
    assert_eq!(store.order(&id).await.unwrap().unwrap().order_id, id);
    assert_eq!(store.rejections(Some(&id)).await.unwrap().len(), 1);
    assert!(!store.rejections(None).await.unwrap().is_empty());
    assert!(store.position(&account, "MSFT").await.unwrap().is_some());
    store.identity().await.unwrap();

    // status, as the app function runs it.
    let config =
        Config::from_lookup(|k| (k == "SQL_CONNECTION_STRING").then(|| app.clone())).unwrap();
    let status = order_guard::app::status(&config, &id).await.unwrap().text;
    assert!(
        status.contains(&format!("order   {id} Executed")),
        "{status}"
    );
    assert!(status.contains("rejected conflict"), "{status}");

    // replay, the binary.
    let (ok, out, err, _) = replay(
        &app,
        &[order_event(&unique_id("ord"), &account, "1"), first.clone()],
    )
    .await;
    assert!(ok, "{out}{err}");
    let summary = out.lines().last().unwrap_or_default();
    assert_eq!(summary_field(summary, "executed"), 1, "{summary}");
    assert_eq!(summary_field(summary, "duplicates"), 1, "{summary}");
    assert_eq!(summary_field(summary, "unresolved"), 0, "{summary}");
}

/// A user that is not a member of the role (here: one with some rights of
/// its own, and one with none) is refused at start with each missing right
/// and the `ALTER ROLE` that fixes it; `replay` and `serve` as that user
/// exit non-zero within seconds, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_the_role_is_refused_at_start_naming_each_missing_right() {
    let Some(cs) = common::mssql_connection_string() else {
        return;
    };
    let db = common::mssql_fresh_database(&cs).await;
    migrate(&db).await;
    let partial = common::mssql_login(&db, "og_partial", &[]).await;
    owner_batch(
        &db,
        "GRANT SELECT ON SCHEMA::dbo TO og_partial; GRANT INSERT, UPDATE ON dbo.RejectedEvents TO og_partial",
    )
    .await;
    match store(&partial).migrate().await {
        Err(StoreError::Misconfigured(m)) => {
            let missing = [
                "EXECUTE on dbo.OrderGuard_Execute_v2",
                "INSERT on dbo.Orders",
                "UPDATE on dbo.Orders",
                "INSERT on dbo.Positions",
                "UPDATE on dbo.Positions",
                "INSERT on dbo.Outbox",
                "UPDATE on dbo.Outbox",
                "DELETE on dbo.Outbox",
                "INSERT on dbo.OutboxPurge",
                "UPDATE on dbo.OutboxPurge",
                "INSERT on dbo.OutboxEpoch",
                "DELETE on dbo.OutboxEpoch",
            ];
            assert!(m.contains(&missing.join(", ")), "{m}");
            assert!(m.contains("lacks 12 right(s)"), "{m}");
            assert!(!m.contains("SELECT on"), "it has those: {m}");
            assert!(
                m.contains("ALTER ROLE order_guard_app ADD MEMBER [og_partial];"),
                "{m}"
            );
        }
        other => panic!("want the missing rights, got {other:?}"),
    }

    let none = common::mssql_login(&db, "og_none", &[]).await;
    let refusal = match store(&none).migrate().await {
        Err(StoreError::Misconfigured(m)) => m,
        other => panic!("want the missing rights, got {other:?}"),
    };
    for (right, object) in sql::APP_RIGHTS {
        assert!(
            refusal.contains(&format!("{right} on {object}")),
            "{refusal}"
        );
    }
    assert!(
        refusal.contains("ALTER ROLE order_guard_app ADD MEMBER [og_none];"),
        "{refusal}"
    );

    // replay: stops at once, non-zero, with the rights and the fix.
    let events: Vec<Value> = (0..20)
        .map(|_| order_event(&unique_id("ord"), "acct", "1"))
        .collect();
    let (ok, out, err, took) = replay(&none, &events).await;
    assert!(!ok, "replay as a user without rights succeeded: {out}{err}");
    assert!(
        err.contains("EXECUTE on dbo.OrderGuard_Execute_v2")
            && err.contains("ALTER ROLE order_guard_app ADD MEMBER [og_none]"),
        "{err}"
    );
    println!("replay of 20 deliveries as a user without the role ended in {took:?}");
    assert!(took < Duration::from_secs(15), "replay took {took:?}");

    // serve: refuses to become ready, exits non-zero with the same message.
    let (_dir, log, _port, mut child) = serve_as(&none);
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("serve as a user without rights did not stop within 20 s")
        .unwrap();
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(!status.success(), "{said}");
    assert!(
        said.contains("EXECUTE on dbo.OrderGuard_Execute_v2")
            && said.contains("ALTER ROLE order_guard_app ADD MEMBER [og_none]"),
        "{said}"
    );
}

/// Running `migrate` again, when it re-creates the procedure (a dropped
/// procedure takes its grants with it), keeps the app's rights.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_again_keeps_the_grants() {
    let Some(cs) = common::mssql_connection_string() else {
        return;
    };
    let db = common::mssql_fresh_database(&cs).await;
    let app = common::mssql_app_connection_string(&db).await;
    let account = unique_id("acct");
    let o = |q: &str| {
        order_guard::order::Order::from_data(&json!({
            "orderId": unique_id("ord"), "accountId": account, "side": "buy",
            "symbol": "MSFT", "quantity": q
        }))
        .unwrap()
    };
    let first = store(&app);
    first.migrate().await.unwrap();
    first.execute(&o("1"), "e", "{}").await.unwrap();
    // Forget the version row, so the next `migrate` runs every batch again:
    // the procedure is dropped and created anew.
    owner_batch(&db, "DELETE FROM dbo.SchemaVersion WHERE Version = 3").await;
    migrate(&db).await;
    migrate(&db).await;
    let again = store(&app);
    again
        .migrate()
        .await
        .expect("the app's rights are still there");
    again.execute(&o("2"), "e", "{}").await.unwrap();
    assert_eq!(
        again.position(&account, "MSFT").await.unwrap(),
        Some("3".parse().unwrap())
    );
}

/// A database at version 2 (an upgrade the admin has not migrated yet)
/// and an app user that may read it but not change it: the start says the
/// version, the version needed and to run `migrate` as the admin; `replay`
/// stops at once with that; `serve` listens and answers `retry`, its log
/// naming the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_schema_the_user_cannot_migrate_says_to_run_migrate_as_the_admin() {
    let Some(cs) = common::mssql_connection_string() else {
        return;
    };
    let db = common::mssql_fresh_database(&cs).await;
    for batch in common::mssql_v2_schema_batches() {
        owner_batch(&db, &batch).await;
    }
    let app = common::mssql_login(&db, "og_v2app", &[]).await;
    owner_batch(
        &db,
        "GRANT SELECT, INSERT, UPDATE ON SCHEMA::dbo TO og_v2app",
    )
    .await;
    let want = "the schema is at version 2, this build needs version 6: run `order-guard migrate` \
                as the database admin (docs/deploy.md step 4)";
    match store(&app).migrate().await {
        Err(StoreError::Unmigrated(m)) => assert!(m.starts_with(want), "{m}"),
        other => panic!("want the schema's version and the fix, got {other:?}"),
    }
    let (ok, out, err, took) = replay(&app, &[order_event(&unique_id("ord"), "a", "1")]).await;
    assert!(!ok, "{out}{err}");
    assert!(err.contains(want), "{err}");
    assert!(took < Duration::from_secs(15), "replay took {took:?}");

    let (_dir, log, port, mut child) = serve_as(&app);
    common::wait_ready(port, &mut child, Duration::from_secs(20))
        .await
        .unwrap_or_else(|e| panic!("{e}: {}", std::fs::read_to_string(&log).unwrap()));
    // The start's check may outlive its 3 s on a loaded machine and say the
    // fix from the background, after the handler listens: waited for, bounded.
    let started = Instant::now();
    loop {
        let said = std::fs::read_to_string(&log).unwrap();
        if said.contains(want) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the handler never said {want:?}:\n{said}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill().await;
}

/// A right lost while `replay` runs (revoked by the admin): the first call
/// refused makes it stop, starting and redelivering nothing more, counting
/// what is left unresolved and saying the right and the fix, instead of
/// redelivering every delivery 40 times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_stops_at_the_first_right_refused_mid_run() {
    let Some(cs) = common::mssql_connection_string() else {
        return;
    };
    let db = common::mssql_fresh_database(&cs).await;
    let app = common::mssql_app_connection_string(&db).await;
    let store = std::sync::Arc::new(store(&app));
    store.migrate().await.unwrap();
    let processor = common::processor(common::memory_guard(), store);
    owner_batch(
        &db,
        &format!(
            "REVOKE EXECUTE ON {} FROM order_guard_app",
            sql::EXECUTE_PROCEDURE
        ),
    )
    .await;
    let deliveries: Vec<Value> = (0..20)
        .map(|_| order_event(&unique_id("ord"), "acct", "1"))
        .collect();
    let started = Instant::now();
    let summary = order_guard::app::replay(&processor, deliveries, 1).await;
    assert!(started.elapsed() < Duration::from_secs(10), "{summary}");
    let stopped = summary.stopped.as_deref().expect("replay stopped");
    assert!(
        stopped.contains("permission denied") || stopped.contains("EXECUTE permission"),
        "{stopped}"
    );
    assert!(
        stopped.contains("ALTER ROLE order_guard_app ADD MEMBER"),
        "{stopped}"
    );
    assert_eq!(
        (summary.deliveries, summary.unresolved),
        (20, 20),
        "{summary}"
    );
    assert_eq!(
        summary.retries, 0,
        "no redelivery after the refusal: {summary}"
    );
    assert_eq!(summary.executed, 0, "{summary}");
}

/// The dead-letter sweep stops too when a right is refused mid-run: the
/// blob being replayed and every later one stay where they are, counted,
/// and the summary says why and how to fix it; nothing is moved.
#[tokio::test]
async fn the_dead_letter_sweep_stops_at_the_first_right_refused() {
    let Some(cs) = common::mssql_connection_string() else {
        return;
    };
    let db = common::mssql_fresh_database(&cs).await;
    let app = common::mssql_app_connection_string(&db).await;
    let store = std::sync::Arc::new(store(&app));
    store.migrate().await.unwrap();
    let processor = common::processor(common::memory_guard(), store);
    let azurite = common::azurite::Azurite::start();
    let container = azurite.container("deadletters").await;
    let names: Vec<String> = (0..3)
        .map(|i| format!("SUB/2025/6/14/{i}/aaaaaaaa-0000-0000-0000-00000000000{i}.json"))
        .collect();
    for name in &names {
        let mut event = order_event(&unique_id("dl"), "acct", "1");
        event["deadLetterReason"] = json!("MaxDeliveryAttemptsExceeded");
        let body = bytes::Bytes::from(json!([event]).to_string());
        assert!(container.put_new(name, body).await.unwrap());
    }
    owner_batch(
        &db,
        &format!(
            "REVOKE EXECUTE ON {} FROM order_guard_app",
            sql::EXECUTE_PROCEDURE
        ),
    )
    .await;
    let started = Instant::now();
    let s = order_guard::deadletter::sweep(
        &processor,
        &container,
        &order_guard::deadletter::SweepOptions::default(),
        &order_guard::deadletter::sweep::Silent,
    )
    .await
    .unwrap();
    assert!(started.elapsed() < Duration::from_secs(10), "{s}");
    let stopped = s.stopped.as_deref().expect("the sweep stopped");
    assert!(
        stopped.contains("ALTER ROLE order_guard_app ADD MEMBER"),
        "{stopped}"
    );
    assert_eq!(
        (
            s.blobs,
            s.events,
            s.retries,
            s.unresolved,
            s.moved,
            s.not_reached
        ),
        (1, 1, 1, 1, 0, 2),
        "{s:?}"
    );
    let mut left: Vec<String> = container
        .list(None)
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.name)
        .collect();
    left.sort();
    assert_eq!(left, names, "every blob stays where it was");

    // The right still missing, a later sweep by the same long-running
    // processor (the timer's next tick in `serve`) stops at it too: a
    // failure met before it does not blind it.
    let s = order_guard::deadletter::sweep(
        &processor,
        &container,
        &order_guard::deadletter::SweepOptions::default(),
        &order_guard::deadletter::sweep::Silent,
    )
    .await
    .unwrap();
    assert!(s.stopped.is_some(), "the second sweep stopped: {s}");
    assert_eq!((s.blobs, s.moved, s.not_reached), (1, 0, 2), "{s:?}");
}

/// `migrate` makes the operator's read-only role, on a current schema
/// too: a login whose user is only in `order_guard_reader` runs `status`
/// and `outbox list`, and the server refuses it every write (an INSERT,
/// UPDATEs, a DELETE), as `outbox retry` is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reader_role_runs_status_and_outbox_list_and_writes_nothing() {
    let Some(cs) = common::mssql_connection_string() else {
        return;
    };
    let db = common::mssql_fresh_database(&cs).await;
    let app = common::mssql_app_connection_string(&db).await;
    // Granted on a schema already current too: its grants revoked (a
    // role with grants cannot be dropped on Babelfish), `migrate` again.
    let revoke: Vec<String> = sql::READER_TABLES
        .iter()
        .map(|t| format!("REVOKE SELECT ON {t} FROM {};", sql::READER_ROLE))
        .collect();
    owner_batch(&db, &revoke.join("\n")).await;
    migrate(&db).await;
    let account = unique_id("acct");
    let order_id = unique_id("ord");
    let app_store = store(&app);
    app_store.migrate().await.unwrap();
    let o = order_guard::order::Order::from_data(&json!({
        "orderId": order_id, "accountId": account, "side": "buy", "symbol": "MSFT",
        "quantity": "2"
    }))
    .unwrap();
    app_store.execute(&o, "e", "{}").await.unwrap();
    let reader = common::mssql_login(&db, "og_reader", &[sql::READER_ROLE]).await;

    let run = |args: &[&str]| {
        let mut cmd = order_guard(&reader, args);
        async move {
            let out = cmd.output().await.unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            (out.status.code(), text)
        }
    };
    let (code, text) = run(&["status", &order_id]).await;
    assert_eq!(code, Some(0), "{text}");
    for part in ["Executed", "position", " = 2", "announced"] {
        assert!(text.contains(part), "{part:?} not in: {text}");
    }
    let (code, text) = run(&["outbox", "list"]).await;
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("undispatched=1"), "{text}");
    let (code, text) = run(&["outbox", "retry"]).await;
    assert_ne!(code, Some(0), "a write, refused: {text}");

    let mut client = common::mssql_raw_client(&reader).await;
    let writes = [
        "INSERT INTO dbo.RejectedEvents (EventHash, Kind, Reason, RawEvent, Deliveries, \
         FirstSeenAt, LastSeenAt) VALUES (N'h', N'poison', N'r', N'{}', 1, \
         SYSUTCDATETIME(), SYSUTCDATETIME())"
            .to_string(),
        "UPDATE dbo.Orders SET Attempts = Attempts + 1".to_string(),
        "UPDATE dbo.Outbox SET Parked = 1".to_string(),
        "DELETE FROM dbo.Outbox".to_string(),
        format!("UPDATE dbo.Positions SET Units = 0 WHERE AccountId = N'{account}'"),
    ];
    for write in &writes {
        let refused = match client.simple_query(write.as_str()).await {
            Ok(stream) => stream.into_results().await.err(),
            Err(e) => Some(e),
        };
        let e = refused.unwrap_or_else(|| panic!("the reader wrote: {write}"));
        let message = e.to_string().to_lowercase();
        assert!(
            message.contains("permission") || message.contains("denied"),
            "{write}: {e}"
        );
    }
    // Nothing changed.
    assert_eq!(
        app_store.position(&account, "MSFT").await.unwrap(),
        Some("2".parse().unwrap())
    );
    assert_eq!(app_store.outbox_counts().await.unwrap().undispatched, 1);
}
