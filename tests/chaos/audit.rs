//! The audit.

use super::*;

#[derive(Debug, Default)]
pub(crate) struct Audit {
    pub(crate) executed_once: usize,
    pub(crate) lost: usize,
    pub(crate) double: usize,
    pub(crate) mismatched: usize,
    pub(crate) positions_wrong: usize,
    pub(crate) conflicts_stored: usize,
    pub(crate) poison_stored: usize,
    pub(crate) orphan_reservations: usize,
    pub(crate) findings: Vec<String>,
}

pub(crate) fn dec(text: &str) -> Decimal {
    Decimal::from_str(text).unwrap_or_else(|e| panic!("stored decimal {text:?}: {e}"))
}

/// Status, AccountId, Symbol, Side, Quantity, Fingerprint.
pub(crate) type OrderRow = (String, String, String, String, String, String);
/// Kind, OrderId, Reason, Fingerprint, ExistingFingerprint, Deliveries.
pub(crate) type Rejected = (
    String,
    Option<String>,
    String,
    Option<String>,
    Option<String>,
    i64,
);

/// The store's tables as the audit reads them, straight from the database.
#[derive(Default)]
pub(crate) struct Tables {
    /// (OrderId, row)
    pub(crate) orders: Vec<(String, OrderRow)>,
    /// ((AccountId, Symbol), Quantity)
    pub(crate) positions: Vec<((String, String), Decimal)>,
    /// (EventId, RawEvent, row)
    pub(crate) rejected: Vec<(Option<String>, String, Rejected)>,
}

pub(crate) fn read_sqlite(db: &Path) -> Tables {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .expect("open the database for the audit");
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    let mut t = Tables::default();
    let mut stmt = conn
        .prepare(
            "SELECT OrderId, Status, AccountId, Symbol, Side, Quantity, Fingerprint FROM Orders",
        )
        .unwrap();
    t.orders = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                (
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, String>(5)?,
                    r.get::<_, String>(6)?,
                ),
            ))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut stmt = conn
        .prepare("SELECT AccountId, Symbol, Quantity FROM Positions")
        .unwrap();
    t.positions = stmt
        .query_map([], |r| {
            Ok((
                (r.get::<_, String>(0)?, r.get::<_, String>(1)?),
                r.get::<_, String>(2)?,
            ))
        })
        .unwrap()
        .map(|r| {
            let (k, q) = r.unwrap();
            (k, dec(&q))
        })
        .collect();
    let mut stmt = conn
        .prepare(
            "SELECT Kind, OrderId, EventId, Reason, Fingerprint, ExistingFingerprint, RawEvent, Deliveries
               FROM RejectedEvents",
        )
        .unwrap();
    t.rejected = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, Option<String>>(2)?,
                r.get::<_, String>(6)?,
                (
                    r.get::<_, String>(0)?,
                    r.get::<_, Option<String>>(1)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, Option<String>>(4)?,
                    r.get::<_, Option<String>>(5)?,
                    r.get::<_, i64>(7)?,
                ),
            ))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    t
}

/// The same tables read from SQL Server (decimals as text, exactly).
pub(crate) async fn read_sqlserver(cs: &str) -> Tables {
    let mut client = common::mssql_raw_client(cs).await;
    let text = |r: &tiberius::Row, i: usize| -> String {
        r.get::<&str, _>(i)
            .unwrap_or_else(|| panic!("NULL in column {i}"))
            .to_string()
    };
    let opt = |r: &tiberius::Row, i: usize| r.get::<&str, _>(i).map(str::to_string);
    let mut t = Tables::default();
    let orders = client
        .simple_query(
            "SELECT OrderId, Status, AccountId, Symbol, Side, CAST(Quantity AS NVARCHAR(60)), \
             Fingerprint FROM dbo.Orders",
        )
        .await
        .expect("audit: Orders")
        .into_first_result()
        .await
        .expect("audit: Orders");
    t.orders = orders
        .iter()
        .map(|r| {
            (
                text(r, 0),
                (
                    text(r, 1),
                    text(r, 2),
                    text(r, 3),
                    text(r, 4),
                    text(r, 5),
                    text(r, 6),
                ),
            )
        })
        .collect();
    let positions = client
        .simple_query("SELECT AccountId, Symbol, CAST(Units AS NVARCHAR(60)) FROM dbo.Positions")
        .await
        .expect("audit: Positions")
        .into_first_result()
        .await
        .expect("audit: Positions");
    // Units of 10^-10 (schema version 3): the same value as a decimal.
    t.positions = positions
        .iter()
        .map(|r| {
            let units = dec(&text(r, 2));
            (
                (text(r, 0), text(r, 1)),
                units / Decimal::from(10_000_000_000_i64),
            )
        })
        .collect();
    let rejected = client
        .simple_query(
            "SELECT Kind, OrderId, EventId, Reason, Fingerprint, ExistingFingerprint, RawEvent, \
             Deliveries FROM dbo.RejectedEvents",
        )
        .await
        .expect("audit: RejectedEvents")
        .into_first_result()
        .await
        .expect("audit: RejectedEvents");
    t.rejected = rejected
        .iter()
        .map(|r| {
            (
                opt(r, 2),
                text(r, 6),
                (
                    text(r, 0),
                    opt(r, 1),
                    text(r, 3),
                    opt(r, 4),
                    opt(r, 5),
                    r.get::<i64, _>(7).expect("Deliveries"),
                ),
            )
        })
        .collect();
    t
}

pub(crate) fn audit(
    plan: &Plan,
    tally: &Tally,
    tables: &Tables,
    guard_keys: &[(String, Option<String>, i64)],
) -> Audit {
    let mut a = Audit::default();

    // Orders: one row per id, Executed, with the valid order's content.
    let mut rows: HashMap<String, Vec<OrderRow>> = HashMap::new();
    for (id, rest) in &tables.orders {
        rows.entry(id.clone()).or_default().push(rest.clone());
    }
    let executed_answers = tally.executed_answers.lock().unwrap();
    let mut fingerprints = HashMap::new();
    let valid_ids: HashSet<&str> = plan.orders.iter().map(|o| o.id.as_str()).collect();
    for (i, o) in plan.orders.iter().enumerate() {
        let answers = executed_answers.get(&i).copied().unwrap_or(0);
        match rows.get(&o.id).map(Vec::as_slice) {
            None | Some([]) => {
                a.lost += 1;
                a.findings
                    .push(format!("order {} is missing from Orders (lost)", o.id));
            }
            Some([(status, account, symbol, side, qty, fp)]) => {
                fingerprints.insert(i, fp.clone());
                if status != "Executed" {
                    a.lost += 1;
                    a.findings
                        .push(format!("order {} is {status}, not Executed (lost)", o.id));
                } else if *account != o.account
                    || symbol != o.symbol
                    || side != o.side
                    || dec(qty) != o.quantity
                {
                    a.mismatched += 1;
                    a.findings.push(format!(
                        "order {} stored as {side} {qty} {symbol} for {account}, sent as {} {} {} for {}",
                        o.id, o.side, o.quantity, o.symbol, o.account
                    ));
                } else if answers > 1 {
                    a.double += 1;
                    a.findings.push(format!(
                        "order {} was answered `executed` {answers} times",
                        o.id
                    ));
                } else {
                    a.executed_once += 1;
                }
            }
            Some(many) => {
                a.double += 1;
                a.findings
                    .push(format!("order {} has {} rows", o.id, many.len()));
            }
        }
    }
    for id in rows.keys() {
        if !valid_ids.contains(id.as_str()) {
            a.findings.push(format!("unexpected Orders row {id:?} (a poison or conflicting event was stored as an order)"));
        }
    }

    // Positions: the sum of the distinct orders, exactly.
    let mut expected: BTreeMap<(String, String), Decimal> = BTreeMap::new();
    for o in &plan.orders {
        *expected
            .entry((o.account.clone(), o.symbol.to_string()))
            .or_default() += o.signed();
    }
    let stored: BTreeMap<(String, String), Decimal> = tables.positions.iter().cloned().collect();
    let keys: HashSet<&(String, String)> = expected.keys().chain(stored.keys()).collect();
    for k in keys {
        let want = expected.get(k).copied().unwrap_or_default();
        let got = stored.get(k).copied().unwrap_or_default();
        if want != got {
            a.positions_wrong += 1;
            a.findings.push(format!(
                "position {}/{} is {got}, the distinct orders sum to {want}",
                k.0, k.1
            ));
        }
    }

    // Rejected events: every conflict and poison event stored with its reason.
    let mut by_event: HashMap<String, Vec<Rejected>> = HashMap::new();
    let mut by_raw: HashMap<String, Vec<Rejected>> = HashMap::new();
    for (event_id, raw, rest) in tables.rejected.iter().cloned() {
        if let Some(e) = event_id {
            if plan.valid_event_ids.contains(&e) {
                a.findings.push(format!(
                    "a valid order's event {e} was stored as rejected ({}: {})",
                    rest.0, rest.2
                ));
            }
            by_event.entry(e).or_default().push(rest.clone());
        }
        by_raw.entry(raw).or_default().push(rest);
    }
    let conflict_acks = tally.conflict_acks.lock().unwrap();
    for (c, ev) in plan.conflicts.iter().enumerate() {
        let o = &plan.orders[ev.order];
        let rows = by_event.get(&ev.event_id).cloned().unwrap_or_default();
        let acked = conflict_acks.get(&c).copied().unwrap_or(0);
        match rows.as_slice() {
            [(kind, order_id, reason, fp, existing, deliveries)] => {
                let ok = kind == "conflict"
                    && order_id.as_deref() == Some(o.id.as_str())
                    && reason.contains("already used by a different order")
                    && fp.is_some()
                    && fp != existing
                    && existing.as_ref() == fingerprints.get(&ev.order)
                    && *deliveries >= acked;
                if ok {
                    a.conflicts_stored += 1;
                } else {
                    a.findings.push(format!(
                        "conflict event {} for {} stored wrongly: {:?}",
                        ev.event_id, o.id, rows[0]
                    ));
                }
            }
            other => a.findings.push(format!(
                "conflict event {} for {} has {} RejectedEvents rows (want 1)",
                ev.event_id,
                o.id,
                other.len()
            )),
        }
    }
    let poison_acks = tally.poison_acks.lock().unwrap();
    for (p, ev) in plan.poison.iter().enumerate() {
        let rows = match &ev.event_id {
            Some(e) => by_event.get(e).cloned().unwrap_or_default(),
            None => by_raw.get(&ev.raw).cloned().unwrap_or_default(),
        };
        let acked = poison_acks.get(&p).copied().unwrap_or(0);
        match rows.as_slice() {
            [(kind, _, reason, _, _, deliveries)]
                if kind == "poison" && reason.contains(ev.reason) && *deliveries >= acked =>
            {
                a.poison_stored += 1;
            }
            other => a.findings.push(format!(
                "poison event ({}) {:?}: want one poison row saying {:?} with ≥ {acked} deliveries, found {other:?}",
                ev.label, ev.event_id, ev.reason
            )),
        }
    }

    // Guard keys: no reservation without a bounded TTL.
    for (key, value, ttl) in guard_keys {
        if value
            .as_deref()
            .is_some_and(|v| v.starts_with("PROCESANDO"))
        {
            a.orphan_reservations += 1;
            if !(1..=PROCESSING_TTL_SECONDS).contains(ttl) {
                a.findings.push(format!(
                    "guard key {key} = {value:?} has TTL {ttl} (want 1..={PROCESSING_TTL_SECONDS})"
                ));
            }
        }
    }
    a
}
