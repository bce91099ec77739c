//! `execute` in one round trip: the call of the execution procedure
//! ([`sql::EXECUTE_ORDER`]), sent again only when it hands a decision back,
//! and, with the `sqlserver_commit` fault point armed (tests only), its
//! body as a batch of its own with the COMMIT replaced.

use rust_decimal::Decimal;
use tiberius::error::Error as SqlError;
use tiberius::numeric::Numeric;

use super::pool::Client;
use super::{conversion, opt_text, order_record, sql, store_rejection};
#[cfg(feature = "failpoints")]
use crate::faults;
use crate::order::Order;
use crate::position::{Overflow, Position};
use crate::store::{
    conflict_reason_around, event_hash, message_id, short_fingerprint, Execution, OrderRecord,
    Rejection, RejectionKind, MAX_EXECUTION_TRIES,
};

/// What one run of [`sql::EXECUTE_ORDER`] answered.
struct BatchAnswer {
    result: String,
    current: Option<i128>,
    row: Option<OrderRecord>,
}

/// Parameters of [`sql::EXECUTE_ORDER`] that change between the tries of
/// one call.
#[derive(Default)]
struct Retry {
    /// A stored fingerprint of another version that is this order (P12).
    also_this_order: String,
    /// The overflow reason and the position it is about (P14, P15).
    overflow: Option<(String, i128)>,
}

/// `execute` in one round trip: [`sql::EXECUTE_ORDER`] (see there), sent
/// again only when it hands a decision back (a lost race, a row of another
/// fingerprint version, an overflow to store with its reason), at most
/// [`MAX_EXECUTION_TRIES`] times. Any error returns at once and the
/// connection is discarded (closing it rolls back whatever was open).
pub(super) async fn execute_on(
    client: &mut Client,
    o: &Order,
    event_id: &str,
    raw_event: &str,
) -> Result<Execution, SqlError> {
    let change = Position::change_of(o.side, o.quantity);
    let batch = execute_batch()?;
    let mut retry = Retry::default();
    for _ in 0..MAX_EXECUTION_TRIES {
        let answer =
            run_execute_batch(client, &batch, o, event_id, raw_event, change, &retry).await?;
        let overflow = |current: Option<i128>| -> Result<Overflow, SqlError> {
            let current = current.and_then(Position::from_units).ok_or_else(|| {
                conversion(format!("order {}: no position in the answer", o.order_id))
            })?;
            Ok(Overflow { current, change })
        };
        match answer.result.as_str() {
            "executed" => return Ok(Execution::Executed),
            "rejected" => return Ok(Execution::Rejected(overflow(answer.current)?)),
            "done" => return Ok(Execution::AlreadyDone),
            "conflict" => {
                let row = answer.row.ok_or_else(|| {
                    conversion(format!("order {}: a conflict without its row", o.order_id))
                })?;
                return Ok(Execution::Conflict {
                    existing_fingerprint: row.fingerprint,
                });
            }
            "overflow" => {
                let overflow = overflow(answer.current)?;
                let reason = overflow.reason(&o.account_id, &o.symbol);
                retry.overflow = Some((reason, overflow.current.units()));
            }
            "row" => {
                let row = answer.row.ok_or_else(|| {
                    conversion(format!("order {}: no row to execute", o.order_id))
                })?;
                if row.current_fingerprint() != o.fingerprint() {
                    let conflict = Rejection::conflict(o, event_id, raw_event, &row.fingerprint);
                    store_rejection(client, &conflict).await?;
                    return Ok(Execution::Conflict {
                        existing_fingerprint: row.fingerprint,
                    });
                }
                if row.status.is_terminal() {
                    return Ok(Execution::AlreadyDone);
                }
                retry.also_this_order = row.fingerprint;
            }
            // A racing first delivery (or first trade of the position) won
            // the unique index: the next run finds its row.
            "raced" => {}
            other => {
                return Err(conversion(format!(
                    "order {}: the execution batch answered {other:?}",
                    o.order_id
                )))
            }
        }
    }
    Err(SqlError::Protocol(
        format!(
            "order {}: its row kept changing under {MAX_EXECUTION_TRIES} tries",
            o.order_id
        )
        .into(),
    ))
}

async fn run_execute_batch(
    client: &mut Client,
    batch: &ExecuteBatch,
    o: &Order,
    event_id: &str,
    raw_event: &str,
    change: Position,
    retry: &Retry,
) -> Result<BatchAnswer, SqlError> {
    let (head, tail) = conflict_reason_around(o);
    let short = short_fingerprint(o.fingerprint()).chars().count() as i32;
    let (overflow_reason, overflow_at) = match &retry.overflow {
        Some((reason, at)) => (reason.as_str(), *at),
        None => ("", 0),
    };
    // Where the call stores an overflow or a conflict, if it turns out one
    // (the same keys `Rejection::event_hash` gives those rejections).
    let overflow_hash = event_hash(RejectionKind::Poison, raw_event);
    let conflict_hash = event_hash(RejectionKind::Conflict, raw_event);
    // The announcement an execution writes in the same transaction.
    let message_id = message_id(&o.order_id);
    let units = |u: i128| Numeric::new_with_scale(u, 0);
    let rows = client
        .query(
            batch.text(),
            &[
                &o.order_id.as_str(),
                &o.fingerprint(),
                &event_id,
                &o.account_id.as_str(),
                &o.side.as_str(),
                &o.symbol.as_str(),
                &o.quantity,
                &o.limit_price.unwrap_or(Decimal::ZERO),
                &o.currency.as_deref().unwrap_or(""),
                &o.placed_at.as_deref().unwrap_or(""),
                &units(change.units()),
                &retry.also_this_order.as_str(),
                &raw_event,
                &overflow_reason,
                &units(overflow_at),
                &overflow_hash.as_str(),
                &conflict_hash.as_str(),
                &head.as_str(),
                &tail.as_str(),
                &short,
                &message_id.as_str(),
            ],
        )
        .await?
        .into_results()
        .await?;
    let row = rows.iter().flatten().last().ok_or_else(|| {
        conversion(format!(
            "order {}: the execution batch answered nothing",
            o.order_id
        ))
    })?;
    let open = row.try_get::<i32, _>(1)?;
    if open != Some(0) {
        return Err(SqlError::Protocol(
            format!("a transaction is still open after the execution batch (@@TRANCOUNT {open:?})")
                .into(),
        ));
    }
    let answer = BatchAnswer {
        result: opt_text(row, 0)?.unwrap_or_default(),
        current: opt_text(row, 2)?
            .map(|t| {
                t.parse::<i128>()
                    .map_err(|e| conversion(format!("position units {t:?}: {e}")))
            })
            .transpose()?,
        row: order_record(row, 3)?,
    };
    batch.after()?;
    Ok(answer)
}

/// The execution as sent: [`sql::EXECUTE_ORDER`] (the procedure), or with
/// the `sqlserver_commit` fault point armed (tests only) the procedure's
/// body as a batch of its own, the COMMIT replaced:
/// `fail` puts a statement the server fails in the COMMIT's place (the
/// transaction is aborted); `skip` leaves the COMMIT out, so nothing but the
/// open-transaction check stands between the caller and a false `executed`;
/// `cut` leaves it out and reports the connection lost after the answer (the
/// server rolls back when the connection closes); `crash` aborts the process
/// before the batch is sent.
struct ExecuteBatch {
    text: std::borrow::Cow<'static, str>,
    cut: bool,
}

impl ExecuteBatch {
    fn text(&self) -> &str {
        &self.text
    }

    fn after(&self) -> Result<(), SqlError> {
        if self.cut {
            return Err(SqlError::Io {
                kind: std::io::ErrorKind::ConnectionReset,
                message: "fault injected at sqlserver_commit: connection cut".into(),
            });
        }
        Ok(())
    }
}

fn execute_batch() -> Result<ExecuteBatch, SqlError> {
    #[cfg(feature = "failpoints")]
    if let Some(batch) = fail::eval(faults::SQLSERVER_COMMIT, |arg| {
        let replaced = |with: &str| {
            sql::EXECUTE_ORDER_BODY
                .replace(sql::EXECUTE_ORDER_COMMIT, with)
                .into()
        };
        match arg.as_deref() {
            Some("fail") => Ok(ExecuteBatch {
                text: replaced(sql::FAULT_FAILING_COMMIT),
                cut: false,
            }),
            Some("skip") => Ok(ExecuteBatch {
                text: replaced(sql::FAULT_NO_COMMIT),
                cut: false,
            }),
            Some("cut") => Ok(ExecuteBatch {
                text: replaced(sql::FAULT_NO_COMMIT),
                cut: true,
            }),
            _ => Err(SqlError::Protocol(
                faults::crash_or_error(faults::SQLSERVER_COMMIT, arg).into(),
            )),
        }
    }) {
        return batch;
    }
    Ok(ExecuteBatch {
        text: sql::EXECUTE_ORDER.into(),
        cut: false,
    })
}
