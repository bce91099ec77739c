//! Every T-SQL statement and schema batch checked without a server.

use super::*;

// ---------------------------------------------------------------- T-SQL

/// A batch parses as exactly the statements it separates with `;` (most are
/// one statement; a few end a transaction and read `@@TRANCOUNT` in one
/// round trip).
fn parse_one(what: &str, statement: &str) {
    let declared = statement.trim_end_matches(';').matches(';').count() + 1;
    parse_as(what, statement, declared);
}

fn parse_as(what: &str, statement: &str, declared: usize) {
    match Parser::parse_sql(&MsSqlDialect {}, statement) {
        Ok(parsed) => assert_eq!(
            parsed.len(),
            declared,
            "{what} must be exactly {declared} statement(s), parsed {}: {statement}",
            parsed.len()
        ),
        Err(e) => panic!("{what} does not parse as T-SQL ({e}):\n{statement}"),
    }
}

/// The mark names its message ids as parameters, as many as it marks.
#[test]
fn the_mark_parses_for_every_size() {
    for n in [1, 2, 17, sql::MARK_AT_MOST] {
        let mark = sql::mark_announced(n);
        parse_as(&format!("mark_announced({n})"), &mark, 3);
        assert!(mark.contains(&format!("@P{n})")), "{mark}");
        assert!(!mark.contains(&format!("@P{}", n + 1)), "{mark}");
    }
}

#[test]
fn every_statement_parses_as_tsql() {
    assert!(sql::ALL.len() >= 13, "sql::ALL lost statements");
    for (i, statement) in sql::ALL.iter().enumerate() {
        parse_one(&format!("sql::ALL[{i}]"), statement);
    }
}

/// The batches with control flow (`sql::BATCHES`: the execution batch and
/// the one-round-trip reject) are not parsed here: sqlparser's MS SQL
/// dialect does not take all of `DECLARE … IF … BEGIN TRY … END CATCH`.
/// Their check is the engine: every path of them runs in
/// `tests/store_conformance.rs` and `tests/sqlserver_engine.rs` on the
/// T-SQL engine in every CI run. Here only what can be read off the text.
#[test]
fn the_batches_keep_their_shape() {
    assert_eq!(
        sql::BATCHES,
        [
            sql::EXECUTE_ORDER_BODY,
            sql::REJECT,
            sql::LOCK_SCHEMA,
            sql::CLAIM_ANNOUNCEMENTS,
            sql::PURGE_ANNOUNCED,
            sql::RETRY_ANNOUNCEMENTS,
            sql::RESEND_ANNOUNCEMENTS,
            sql::BACKFILL_READ,
            sql::RAISE_EPOCH
        ]
    );
    // Raises are one at a time, under a lock their transaction owns, read
    // and never ignored: epochs grow with the sequences they cover.
    assert!(sql::RAISE_EPOCH.contains("EXEC @Lock = sp_getapplock"));
    assert!(sql::RAISE_EPOCH.contains("@LockOwner = N'Transaction'"));
    assert!(sql::RAISE_EPOCH.contains("IF @Lock < 0 THROW"));
    assert_eq!(sql::RAISE_EPOCH.matches("COMMIT TRANSACTION").count(), 1);
    // The purge's lock is read and owned by its transaction: a purge that
    // does not get it deletes nothing and holds nothing after it.
    assert!(sql::PURGE_ANNOUNCED.contains("EXEC @Lock = sp_getapplock"));
    assert!(sql::PURGE_ANNOUNCED.contains("@LockOwner = N'Transaction', @LockTimeout = 0"));
    assert!(sql::PURGE_ANNOUNCED.contains("IF @Lock >= 0"));
    // The lock's result is read, never ignored.
    assert!(sql::LOCK_SCHEMA.contains("EXEC @Result = sp_getapplock"));
    assert!(sql::LOCK_SCHEMA.ends_with("SELECT @Result AS Result"));
    assert!(sql::LOCK_SCHEMA.contains("@LockOwner = N'Session'"));
    for batch in &sql::BATCHES[..2] {
        assert!(batch.starts_with("SET NOCOUNT ON;"), "{batch}");
        assert_eq!(
            batch.matches("BEGIN TRY").count(),
            batch.matches("END CATCH").count()
        );
        // Only unique violations are handled; anything else reaches the client.
        for handler in batch.split("BEGIN CATCH").skip(1) {
            assert!(
                handler.contains("IF ERROR_NUMBER() NOT IN (2601, 2627) THROW;"),
                "{handler}"
            );
        }
    }
    let exec = sql::EXECUTE_ORDER_BODY;
    assert_eq!(exec.matches(sql::EXECUTE_ORDER_COMMIT).count(), 1);
    assert_eq!(exec.matches("BEGIN TRANSACTION").count(), 1);
    // One result set, the last statement.
    assert!(exec
        .trim_end()
        .ends_with("AND @Result IN (N'conflict', N'row', N'done');"));
}

/// The result type of `e1 + e2` or `e1 - e2` for `DECIMAL(p1,s1)` and
/// `DECIMAL(p2,s2)`, by SQL Server's documented rules ("Precision, scale,
/// and length (Transact-SQL)"): precision `max(s1,s2) + max(p1-s1,p2-s2) +
/// 1`, scale `max(s1,s2)`; a precision over 38 is cut to 38 and the scale
/// lowered to keep the integral part (the fraction is then rounded).
fn sql_server_sum_type((p1, s1): (u32, u32), (p2, s2): (u32, u32)) -> (u32, u32) {
    let scale = s1.max(s2);
    let precision = scale + (p1 - s1).max(p2 - s2) + 1;
    if precision <= 38 {
        return (precision, scale);
    }
    let integral = precision - scale;
    (38, scale.min(38u32.saturating_sub(integral)))
}

/// Adding positions in T-SQL must not round. The
/// engine cannot show SQL Server's rounding (Babelfish keeps scale 10), so
/// the batch's types are checked against SQL Server's rules here.
#[test]
fn the_execution_batch_adds_positions_without_rounding_by_sql_servers_rules() {
    // Why positions are not DECIMAL(38,10) any more: that sum loses a decimal.
    assert_eq!(sql_server_sum_type((38, 10), (28, 10)), (38, 9));
    assert_eq!(sql_server_sum_type((38, 10), (38, 10)), (38, 9));
    // Units: scale 0 stays 0, so nothing can be rounded; the carry could
    // overflow, which the comparison before the sum rules out.
    let units = (38, 0);
    assert_eq!(sql_server_sum_type(units, units), (38, 0));
    let exec = sql::EXECUTE_ORDER_BODY;
    for declared in [
        "@Current DECIMAL(38, 0)",
        "@Change DECIMAL(38, 0) = CONVERT(DECIMAL(38, 0), @P11)",
        "@Max DECIMAL(38, 0) = 99999999999999999999999999999999999999",
    ] {
        assert!(exec.contains(declared), "{declared}");
    }
    assert!(sql::SCHEMA.contains("Units     DECIMAL(38, 0)  NOT NULL"));
    // The only sum written, and the bound checked by comparison before it.
    assert_eq!(exec.matches(" + @Change").count(), 1);
    assert!(exec.contains("SET @After = @Current + @Change;"));
    assert!(exec.contains("@After DECIMAL(38, 0)"));
    assert!(exec.contains("SET Units = @After"));
    // Each bound on its side's branch only: `@Max - @Change` for a sell, or
    // `-@Max - @Change` for a buy, would need 39 digits (8115), and T-SQL
    // does not promise to evaluate `AND` / `OR` left to right.
    assert!(exec.contains(
        "IF @Change > 0
            BEGIN
                IF @Current > @Max - @Change SET @Over = 1;
            END
            ELSE IF @Current < -@Max - @Change SET @Over = 1;"
    ));
    assert!(!exec.contains(" AND @Current"), "a bound behind AND");
    assert!(exec.contains("SET TRANSACTION ISOLATION LEVEL READ COMMITTED;"));
    // @Max is DECIMAL(38,10)'s bound in units: 10^28 - 10^-10.
    assert_eq!(
        "99999999999999999999999999999999999999"
            .parse::<i128>()
            .unwrap(),
        10_i128.pow(38) - 1
    );
}

#[test]
fn every_schema_batch_parses_as_tsql() {
    let batches = sql::schema_batches();
    // SchemaVersion, Orders, its unique index, Positions, its Units column
    // and the old column renamed (version 2 → 3), RejectedEvents, two
    // indexes, StoreIdentity and its row, the app's role and its grants,
    // the outbox and its four indexes, the purge's watermark, the epochs,
    // the execution procedure (dropped if there, created, granted); after
    // the rows are converted, Units made NOT NULL and the old column
    // dropped, the version rows 3, 4 and 5, the first epoch, the version
    // row 6: a GO lost or added shows here.
    assert_eq!(batches.len(), 29, "{batches:#?}");
    let migration = sql::migration();
    assert_eq!(migration.setup.len(), 23);
    assert_eq!(
        migration.finish.len(),
        6,
        "the last transaction: {:#?}",
        migration.finish
    );
    assert!(
        batches[28].contains("(6, SYSUTCDATETIME())"),
        "the version row is last"
    );
    assert!(batches[27].contains("INSERT INTO dbo.OutboxEpoch"));
    assert!(batches[26].contains("(5, SYSUTCDATETIME())"));
    assert!(batches[25].contains("(4, SYSUTCDATETIME())"));
    assert!(batches[24].contains("(3, SYSUTCDATETIME())"));
    assert!(batches[23].contains("DROP COLUMN QuantityV2"));
    assert!(batches[16].contains("CREATE TABLE dbo.OutboxPurge"));
    assert!(batches[17].contains("CREATE TABLE dbo.OutboxEpoch"));
    let procedure = sql::execute_procedure_batches();
    assert_eq!(
        [&*batches[20], &*batches[21], &*batches[22]],
        [
            procedure[0].as_str(),
            procedure[1].as_str(),
            procedure[2].as_str()
        ]
    );
    assert_eq!(
        procedure[2],
        format!(
            "GRANT EXECUTE ON {} TO {}",
            sql::EXECUTE_PROCEDURE,
            sql::APP_ROLE
        )
    );
    assert!(procedure[1].starts_with(&format!("CREATE PROCEDURE {}", sql::EXECUTE_PROCEDURE)));
    assert!(procedure[1].contains(sql::EXECUTE_ORDER_BODY));
    assert!(sql::EXECUTE_ORDER.starts_with(&format!("EXEC {} @P1,", sql::EXECUTE_PROCEDURE)));
    for i in 1..=21 {
        assert!(sql::EXECUTE_ORDER.contains(&format!("@P{i}")), "@P{i}");
        assert!(procedure[1].contains(&format!("@P{i} ")), "@P{i} declared");
    }
    for (i, batch) in batches.iter().enumerate() {
        // The procedure's body is the execution batch: checked on the
        // engine (see `the_batches_keep_their_shape`). The grants are one
        // statement a line.
        let statements = if batch.starts_with("GRANT ") {
            batch.lines().count()
        } else {
            1
        };
        if i != 21 {
            parse_as(&format!("schema batch {i}"), batch, statements);
        }
    }
    let schema = sql::SCHEMA.to_ascii_uppercase();
    for table in [
        "ORDERS",
        "POSITIONS",
        "REJECTEDEVENTS",
        "SCHEMAVERSION",
        "OUTBOX",
        "OUTBOXPURGE",
    ] {
        assert!(
            schema.contains(&format!("IF OBJECT_ID(N'DBO.{table}', N'U') IS NULL")),
            "{table} is not created idempotently"
        );
    }
    assert!(schema.contains("CREATE UNIQUE INDEX UX_ORDERS_ORDERID ON DBO.ORDERS (ORDERID)"));
    assert!(schema.contains("CREATE UNIQUE INDEX UX_REJECTEDEVENTS_EVENTHASH"));
    // Orders keep DECIMAL(28,10) (each order is at most 10^18); a position,
    // the sum of many orders, is in units of 10^-10 as DECIMAL(38,0): exact
    // to DECIMAL(38,10).
    let batch_of = |table: &str| {
        batches
            .iter()
            .find(|b| {
                b.to_ascii_uppercase()
                    .contains(&format!("CREATE TABLE DBO.{table} ("))
            })
            .unwrap_or_else(|| panic!("no batch creates {table}"))
            .to_ascii_uppercase()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let orders = batch_of("ORDERS");
    assert!(
        orders.contains("QUANTITY DECIMAL(28, 10) NOT NULL"),
        "{orders}"
    );
    assert!(
        orders.contains("LIMITPRICE DECIMAL(28, 10) NULL"),
        "{orders}"
    );
    let positions = batch_of("POSITIONS");
    assert!(
        positions.contains("UNITS DECIMAL(38, 0) NOT NULL"),
        "{positions}"
    );
}

/// Constructs outside the portable subset (docs/sqlserver.md, "The portable T-SQL subset").
#[test]
fn statements_stay_in_the_portable_subset() {
    let forbidden = [
        "MERGE ",
        "CREATE OR ALTER",
        "SERIALIZABLE",
        "REPEATABLE READ",
        "ROWVERSION",
        "SYS.DM_",
        " OUTPUT ",
        "HOLDLOCK",
    ];
    let schema_code: String = sql::SCHEMA
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    for statement in sql::ALL
        .iter()
        .chain(sql::BATCHES)
        .copied()
        .chain([schema_code.as_str()])
    {
        let upper = statement.to_ascii_uppercase();
        for f in forbidden {
            assert!(!upper.contains(f), "{f:?} in {statement}");
        }
    }
}
