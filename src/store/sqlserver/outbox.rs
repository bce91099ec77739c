//! The outbox on SQL Server: the dispatcher's claim, mark, defer and purge,
//! and the listings, each one round trip (`sql::CLAIM_ANNOUNCEMENTS` and
//! the statements after it). The row itself is written by the execution
//! procedure, in the transaction that executes the order.

use std::time::Duration;

use tiberius::Row;

use super::pool::Client;
use super::{conversion, decimal, int, opt_text, sql, text, utc};
use crate::position::Position;
use crate::store::walk_back::{walk_back, Executed};
use crate::store::{Announcement, Deferral, Expired, Listing, OutboxCounts, Resend};

fn millis(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

/// An announcement from the columns of `sql::outbox_columns!`.
fn row(r: &Row) -> Result<Announcement, tiberius::error::Error> {
    let units = text(r, 8, "PositionUnits")?;
    let position_after = units
        .parse::<i128>()
        .ok()
        .and_then(Position::from_units)
        .ok_or_else(|| conversion(format!("PositionUnits {units:?} is not a position")))?;
    Ok(Announcement {
        message_id: text(r, 0, "MessageId")?,
        seq: int(r, 1, "Seq")?,
        kind: text(r, 2, "Kind")?,
        order_id: text(r, 3, "OrderId")?,
        account_id: text(r, 4, "AccountId")?,
        side: text(r, 5, "Side")?,
        symbol: text(r, 6, "Symbol")?,
        quantity: decimal(r, 7, "Quantity")?,
        position_after,
        executed_at: utc(opt_text(r, 9)?).unwrap_or_default(),
        fingerprint: text(r, 10, "Fingerprint")?,
        attempts: r.try_get::<i32, _>(11)?.map_or(0, i64::from),
        last_error: opt_text(r, 12)?,
        parked: r.try_get::<i32, _>(13)?.unwrap_or(0) != 0,
        dispatched_at: utc(opt_text(r, 14)?),
        epoch: r.try_get::<i64, _>(15)?,
    })
}

fn rows(result: &[Row]) -> Result<Vec<Announcement>, tiberius::error::Error> {
    result.iter().map(row).collect()
}

/// The first column of the last row a batch answered, as a count.
async fn last_count(stream: tiberius::QueryStream<'_>) -> Result<u64, tiberius::error::Error> {
    let n = stream
        .into_results()
        .await?
        .iter()
        .flatten()
        .last()
        .and_then(|r| r.get::<i32, _>(0))
        .ok_or_else(|| conversion("the outbox batch answered no count".into()))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

pub(super) async fn claim(
    client: &mut Client,
    token: &str,
    limit: u32,
    lease: Duration,
) -> Result<Vec<Announcement>, tiberius::error::Error> {
    let limit = i32::try_from(limit).unwrap_or(i32::MAX);
    let result = client
        .query(sql::CLAIM_ANNOUNCEMENTS, &[&token, &millis(lease), &limit])
        .await?
        .into_results()
        .await?;
    rows(result.last().map_or(&[][..], Vec::as_slice))
}

/// The mark, by message id (the rows' unique key here).
pub(super) async fn mark(
    client: &mut Client,
    sent: &[Announcement],
) -> Result<u64, tiberius::error::Error> {
    let mut marked = 0;
    for chunk in sent.chunks(sql::MARK_AT_MOST) {
        let statement = sql::mark_announced(chunk.len());
        let params: Vec<&dyn tiberius::ToSql> = chunk
            .iter()
            .map(|a| &a.message_id as &dyn tiberius::ToSql)
            .collect();
        marked += last_count(client.query(statement, &params).await?).await?;
    }
    Ok(marked)
}

pub(super) async fn defer(
    client: &mut Client,
    token: &str,
    d: &Deferral,
) -> Result<(), tiberius::error::Error> {
    client
        .execute(
            sql::DEFER_ANNOUNCEMENT,
            &[
                &d.message_id.as_str(),
                &token,
                &d.error.as_str(),
                &millis(d.retry_in),
                &i32::from(d.park),
            ],
        )
        .await?;
    Ok(())
}

pub(super) async fn purge(
    client: &mut Client,
    retention: Duration,
    limit: u32,
    expired: Expired,
) -> Result<u64, tiberius::error::Error> {
    let seconds = i32::try_from(retention.as_secs()).unwrap_or(i32::MAX);
    let limit = i32::try_from(limit).unwrap_or(i32::MAX);
    let unsent = i32::from(expired == Expired::SentAndUnsent);
    let result = client
        .query(sql::PURGE_ANNOUNCED, &[&seconds, &limit, &unsent])
        .await?
        .into_results()
        .await?;
    let row = result
        .iter()
        .flatten()
        .last()
        .ok_or_else(|| conversion("the outbox purge answered nothing".into()))?;
    let open = row.try_get::<i32, _>(1)?;
    if open != Some(0) {
        return Err(tiberius::error::Error::Protocol(
            format!("a transaction is still open after the outbox purge (@@TRANCOUNT {open:?})")
                .into(),
        ));
    }
    Ok(row
        .try_get::<i32, _>(0)?
        .map_or(0, |n| u64::try_from(n).unwrap_or(0)))
}

pub(super) async fn list(
    client: &mut Client,
    listing: &Listing,
    limit: u32,
) -> Result<Vec<Announcement>, tiberius::error::Error> {
    let limit = i32::try_from(limit).unwrap_or(i32::MAX);
    let result = match listing {
        Listing::Undispatched => {
            client
                .query(sql::SELECT_UNDISPATCHED, &[&limit])
                .await?
                .into_first_result()
                .await?
        }
        Listing::Order(_) | Listing::Message(_) => {
            let message_id = match listing {
                Listing::Order(id) => crate::store::message_id(id),
                Listing::Message(id) => id.clone(),
                Listing::Undispatched => unreachable!("matched above"),
            };
            client
                .query(
                    sql::SELECT_ANNOUNCEMENT_OF_ORDER,
                    &[&limit, &message_id.as_str()],
                )
                .await?
                .into_first_result()
                .await?
        }
    };
    rows(&result)
}

pub(super) async fn counts(client: &mut Client) -> Result<OutboxCounts, tiberius::error::Error> {
    let row = client
        .simple_query(sql::OUTBOX_COUNTS)
        .await?
        .into_row()
        .await?
        .ok_or_else(|| conversion("the outbox counts answered no row".into()))?;
    let count = |i: usize, name: &str| int(&row, i, name).map(|n| u64::try_from(n).unwrap_or(0));
    Ok(OutboxCounts {
        undispatched: count(0, "Undispatched")?,
        parked: count(1, "Parked")?,
        dispatched: count(2, "Dispatched")?,
        purged_through: utc(opt_text(&row, 3)?),
    })
}

pub(super) async fn retry(
    client: &mut Client,
    id: Option<&str>,
) -> Result<u64, tiberius::error::Error> {
    last_count(
        client
            .query(sql::RETRY_ANNOUNCEMENTS, &[&id.unwrap_or("")])
            .await?,
    )
    .await
}

/// Dispatched rows made undispatched and due now (`outbox resend`).
pub(super) async fn resend(
    client: &mut Client,
    which: &Resend,
) -> Result<u64, tiberius::error::Error> {
    let (id, seconds) = match which {
        Resend::Message(id) => (id.as_str(), -1),
        Resend::DispatchedWithin(age) => ("", i32::try_from(age.as_secs()).unwrap_or(i32::MAX)),
    };
    last_count(
        client
            .query(sql::RESEND_ANNOUNCEMENTS, &[&id, &seconds])
            .await?,
    )
    .await
}

/// A position in units, as the statements convert it to text.
fn units(text: &str, name: &str) -> Result<Position, tiberius::error::Error> {
    text.parse::<i128>()
        .ok()
        .and_then(Position::from_units)
        .ok_or_else(|| conversion(format!("{name} {text:?} is not a position")))
}

/// `outbox backfill` (`OrderStore::backfill_announcements`): one read of
/// the positions concerned and their executions since `within` ago, the
/// positions after each computed here ([`walk_back`], which the announced
/// ones' rows, `Seq` and `PositionUnits`, place exactly), then one insert
/// per order without an announcement, oldest first, each skipped if its
/// message id has a row by then.
pub(super) async fn backfill(
    client: &mut Client,
    within: Duration,
    write: bool,
) -> Result<u64, tiberius::error::Error> {
    let seconds = i32::try_from(within.as_secs()).unwrap_or(i32::MAX);
    let rows = client
        .query(sql::BACKFILL_READ, &[&seconds])
        .await?
        .into_results()
        .await?;
    struct Read {
        position: (String, String),
        order_id: String,
        executed: Executed,
        now: String,
    }
    let mut read = Vec::new();
    for r in rows.iter().flatten() {
        let side = text(r, 3, "Side")?;
        let announced = match r.try_get::<i64, _>(7)? {
            Some(seq) => Some((seq, units(&text(r, 8, "PositionUnits")?, "PositionUnits")?)),
            None => None,
        };
        read.push(Read {
            position: (text(r, 0, "AccountId")?, text(r, 1, "Symbol")?),
            order_id: text(r, 2, "OrderId")?,
            executed: Executed {
                tie: int(r, 6, "Tie")?,
                id: int(r, 5, "Id")?,
                side: side
                    .parse()
                    .map_err(|e: String| conversion(format!("Orders.Side: {e}")))?,
                quantity: decimal(r, 4, "Quantity")?,
                announced,
            },
            now: text(r, 9, "Units")?,
        });
    }
    let count = read
        .iter()
        .filter(|e| e.executed.announced.is_none())
        .count() as u64;
    if !write || count == 0 {
        return Ok(count);
    }
    // Each position's unannounced executions oldest first, then all of
    // them by millisecond (a stable sort: one position's keep their order).
    let mut due: Vec<(i64, &str, Position)> = Vec::new();
    for group in read.chunk_by(|a, b| a.position == b.position) {
        let now = units(&group[0].now, "Units")?;
        let executions: Vec<Executed> = group.iter().map(|e| e.executed.clone()).collect();
        let placed = walk_back(now, &executions).ok_or_else(|| {
            conversion(format!(
                "the executions of account {:?} in {:?} do not lead to its position {now}",
                group[0].position.0, group[0].position.1
            ))
        })?;
        due.extend(
            placed
                .into_iter()
                .map(|(i, after)| (group[i].executed.tie, group[i].order_id.as_str(), after)),
        );
    }
    due.sort_by_key(|(tie, _, _)| *tie);
    let mut written = 0;
    for (_, order_id, after) in &due {
        let id = crate::store::message_id(order_id);
        let units = after.units().to_string();
        written += last_count(
            client
                .query(
                    sql::BACKFILL_WRITE,
                    &[&id.as_str(), &units.as_str(), order_id],
                )
                .await?,
        )
        .await?;
    }
    Ok(written)
}
