//! The replay of a dead-letter container (`dead-letters replay`, the
//! `DeadLetterSweep` timer) and its dry run (`dead-letters list`).
//!
//! Per blob, oldest hour first, always by the name it was listed under
//! (never one rebuilt from its parts: `2026/06/04` is not `2026/6/4`):
//! - a name in no documented layout: left where it is, counted `unresolved`
//!   with a warning (a dead-letter container holds dead letters only);
//! - larger than the bound (`DEAD_LETTER_MAX_BLOB_BYTES`, by its listed
//!   size, before any byte is read) or not events ([`Unreadable`]): set
//!   aside, that is stored in `RejectedEvents` as poison with its name,
//!   size and reason (not its body, which stays in the blob:
//!   `OrderStore::reject` is keyed by kind + text, so once however often
//!   this runs), then moved under `unreadable/`; counted `unreadable`;
//! - gone by the time it is read: fine when a copy is under `replayed/` or
//!   `unreadable/` (another sweep moved it), else counted `unresolved`;
//! - events: each through [`Processor::process_event`] (the same outcomes,
//!   counters and log lines as a delivery) plus one line with the
//!   dead-letter reason and attempt count; when every event got a final
//!   outcome (executed, duplicate, conflict, rejected) the blob is moved
//!   under `replayed/`, else it stays for the next sweep.
//!
//! Safe from several processes at once: the processor executes each order
//! once, and a move is a conditional write plus a delete
//! ([`Container::move_under`]), done once whoever gets there first.
//!
//! [`Unreadable`]: super::envelope::Unreadable

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use super::blobs::{BlobError, Container, Listed, Read};
use super::envelope::{parse_blob, Metadata};
pub use super::fate::SweepSummary;
use super::fate::{self, Fate, First};
use super::name::{self, BlobName, REPLAYED, UNREADABLE};
use crate::event::{check_type, parse_envelope};
use crate::order::Order;
use crate::processor::{OutcomeKind, Processor, ProcessorSettings};
use crate::store::{OrderRecord, OrderStore, Rejection, RejectionKind};
use crate::text::escaped;

/// How long storing an unreadable blob's rejection may take.
const REJECT_TIMEOUT: Duration = Duration::from_secs(20);

/// What to sweep.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepOptions {
    /// Only blobs under this folder (`<SUBSCRIPTION>`, `<SUBSCRIPTION>/2025/6/14/9`,
    /// `<namespace>/<topic>/<subscription>`; whole path segments).
    pub prefix: Option<String>,
    /// At most this many blobs.
    pub max_blobs: Option<usize>,
    /// Start no blob or event after this long.
    pub deadline: Option<Duration>,
}

/// Told as the sweep goes (a progress bar, plain lines, nothing).
pub trait Progress: Send + Sync {
    fn start(&self, _blobs: u64) {}
    /// One blob done; `events` it held, `note` what became of it.
    fn blob_done(&self, _name: &str, _events: u64, _note: &str) {}
    fn finish(&self) {}
}

/// Tells nothing.
pub struct Silent;
impl Progress for Silent {}

/// A listed blob the sweep looks at: the name and size as listed, and the
/// name read in a documented layout (`None`: in none).
#[derive(Debug, Clone)]
struct Candidate {
    listed: Listed,
    parsed: Option<BlobName>,
}

/// The dead-letter blobs to look at: those in a documented layout, oldest
/// hour first, then those in none (which the sweep reports and leaves);
/// the ones already moved are left out.
async fn candidates(
    container: &Container,
    prefix: Option<&str>,
) -> Result<Vec<Candidate>, BlobError> {
    let mut listed = Vec::new();
    match prefix
        .map(|p| p.trim_matches('/'))
        .filter(|p| !p.is_empty())
    {
        Some(p) => listed.extend(container.list(Some(p)).await?),
        None => {
            // Blobs at the root are in no layout: listed, so they are said.
            let (folders, root) = container.top_level().await?;
            listed.extend(root);
            for folder in folders {
                let top = folder.trim_end_matches('/');
                if format!("{top}/") == REPLAYED || format!("{top}/") == UNREADABLE {
                    continue;
                }
                listed.extend(container.list(Some(top)).await?);
            }
        }
    }
    let mut found: Vec<Candidate> = listed
        .into_iter()
        .filter(|blob| !name::is_archived(&blob.name))
        .map(|listed| Candidate {
            parsed: name::parse(&listed.name),
            listed,
        })
        .collect();
    // Unparsed last; then by hour, then by the listed name.
    found.sort_by(|a, b| {
        let key = |c: &Candidate| (c.parsed.is_none(), c.parsed.as_ref().map(|n| n.hour));
        key(a)
            .cmp(&key(b))
            .then_with(|| a.listed.name.cmp(&b.listed.name))
    });
    Ok(found)
}

/// Replay what the container holds (see the module documentation). Fails
/// only when the container cannot be listed; every other failure leaves its
/// blob for the next sweep and is counted `unresolved`.
pub async fn sweep(
    processor: &Processor,
    container: &Container,
    options: &SweepOptions,
    progress: &dyn Progress,
) -> Result<SweepSummary, BlobError> {
    let started = Instant::now();
    // A store failure no retry can fix (a right or the schema missing) met
    // during this sweep stops it: every later event would fail the same
    // way. One met before it (a long-running `serve` whose rights were
    // fixed since) does not.
    let before = processor.operator_needed_count();
    let operator_needed = || processor.operator_needed_since(before).is_some();
    let stop = || options.deadline.is_some_and(|d| started.elapsed() >= d) || operator_needed();
    let names = candidates(container, options.prefix.as_deref()).await?;
    let limit = options.max_blobs.unwrap_or(usize::MAX).min(names.len());
    progress.start(limit as u64);
    let mut s = SweepSummary::default();
    for (i, blob) in names.iter().enumerate() {
        if i >= limit || stop() {
            s.not_reached = (names.len() - i) as u64;
            break;
        }
        let fate = sweep_blob(processor, container, blob, &mut s, &stop).await;
        let shown = escaped(&blob.listed.name);
        if let Fate::Left { why, .. } = &fate {
            log::warn!("dead letter {shown}: left in place: {why}");
        }
        let note = fate::record(&mut s, &shown, &fate);
        progress.blob_done(&blob.listed.name, fate::events_of(&fate), &note);
    }
    progress.finish();
    if operator_needed() {
        s.stopped = processor.operator_needed_since(before);
    }
    Ok(s)
}

/// One blob: the steps [`fate`] decides, performed; what became of it.
/// (`s` counts the events; the blob itself is counted by the caller.)
async fn sweep_blob(
    processor: &Processor,
    container: &Container,
    blob: &Candidate,
    s: &mut SweepSummary,
    stop: &(dyn Fn() -> bool + Sync),
) -> Fate {
    let name = blob.listed.name.as_str();
    let left = |why: String| Fate::Left { events: 0, why };
    let max = container.max_blob_bytes();
    match fate::before_reading(blob.parsed.is_some(), blob.listed.size, max) {
        First::Leave(why) => return left(why),
        First::SetAside { why } => {
            return set_aside(processor, container, name, blob.listed.size, None, why).await
        }
        First::Read => {}
    }
    let bytes = match container.read(name).await {
        Ok(Read::Bytes(b)) => b,
        // Gone since it was listed.
        Ok(Read::Gone) => {
            return match moved_by_another(container, name).await {
                Ok(found) => fate::when_gone(found),
                Err(e) => left(e.to_string()),
            }
        }
        // It grew past the bound after it was listed.
        Ok(Read::TooLarge { size }) => {
            return set_aside(
                processor,
                container,
                name,
                size,
                None,
                fate::too_large(size, max),
            )
            .await
        }
        Err(e) => return left(e.to_string()),
    };
    let events = match parse_blob(&bytes) {
        Ok(events) => events,
        Err(unreadable) => {
            let size = bytes.len() as u64;
            let why = format!("holds no events: {unreadable}");
            return set_aside(processor, container, name, size, Some(bytes), why).await;
        }
    };
    let count = events.len() as u64;
    let mut pending = 0u64;
    for (i, dl) in events.iter().enumerate() {
        if stop() {
            pending += count - i as u64;
            break;
        }
        let outcome = processor.process_event(&dl.event).await;
        if fate::count_event(s, outcome.outcome) {
            pending += 1;
        }
        log_event(name, &outcome, &dl.metadata);
    }
    if let Some(stays) = fate::after_events(count, pending) {
        return stays;
    }
    match container.move_under(REPLAYED, name, bytes).await {
        Ok(moved) => Fate::Replayed {
            events: count,
            moved,
        },
        Err(e) => Fate::Left {
            events: count,
            why: e.to_string(),
        },
    }
}

/// Whether a blob gone from its place was moved by a sweep: its copy is
/// under `replayed/` or `unreadable/` (a move writes the copy first).
async fn moved_by_another(container: &Container, name: &str) -> Result<bool, BlobError> {
    Ok(container.exists(&format!("{REPLAYED}{name}")).await?
        || container.exists(&format!("{UNREADABLE}{name}")).await?)
}

/// A blob the sweep will not replay (`why`): stored as poison with its
/// name, size and reason (its body stays in the blob), then moved under
/// `unreadable/`: with the `bytes` read (bounded) in hand, a conditional
/// write of them; else streamed without being held; left in place when
/// either fails.
async fn set_aside(
    processor: &Processor,
    container: &Container,
    name: &str,
    size: u64,
    bytes: Option<bytes::Bytes>,
    why: String,
) -> Fate {
    let left = |why: String| Fate::Left { events: 0, why };
    let reason = format!("dead-letter blob {name} {why}; the blob is kept as {UNREADABLE}{name}");
    let rejection = Rejection {
        kind: RejectionKind::Poison,
        order_id: None,
        event_id: None,
        reason: reason.clone(),
        fingerprint: None,
        existing_fingerprint: None,
        raw_event: set_aside_record(container.describe(), name, size),
    };
    match tokio::time::timeout(REJECT_TIMEOUT, processor.store().reject(&rejection)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return left(format!("{why}, and not stored: {e}")),
        Err(_) => {
            return left(format!(
                "{why}, and the store did not answer within {} s",
                REJECT_TIMEOUT.as_secs()
            ))
        }
    }
    log::warn!("dead letter {}", escaped(&reason));
    let moved = match bytes {
        Some(bytes) => container.move_under(UNREADABLE, name, bytes).await,
        None => container.move_unread(UNREADABLE, name, size).await,
    };
    match moved {
        Ok(moved) => Fate::SetAside { why, moved },
        Err(e) => left(format!("{why}; stored, but not moved: {e}")),
    }
}

/// What `RejectedEvents` keeps of a blob set aside (pure): where it was and
/// how large, as JSON; never its body.
pub fn set_aside_record(container: &str, name: &str, size: u64) -> String {
    serde_json::json!({
        "deadLetterBlob": name,
        "movedTo": format!("{UNREADABLE}{name}"),
        "container": container,
        "size": size,
    })
    .to_string()
}

/// The extra line of a replayed event: which blob, and why Event Grid gave up.
fn log_event(blob: &str, outcome: &crate::processor::Outcome, m: &Metadata) {
    let level = if outcome.outcome.needs_redelivery() {
        log::Level::Warn
    } else {
        log::Level::Info
    };
    log::log!(
        level,
        "dead letter {} order {} event {}: {} (dead-lettered: {}, {} delivery attempts{})",
        escaped(blob),
        outcome
            .order_id
            .as_deref()
            .map(escaped)
            .unwrap_or("?".into()),
        outcome
            .event_id
            .as_deref()
            .map(escaped)
            .unwrap_or("?".into()),
        outcome.outcome.as_str(),
        escaped(m.reason_or_unknown()),
        m.attempts.map_or("?".to_string(), |a| a.to_string()),
        m.last_outcome
            .as_deref()
            .map(|o| format!(", last outcome {}", escaped(o)))
            .unwrap_or_default()
    );
}

// ------------------------------------------------------------- dry run

/// What `dead-letters list` found; nothing executed, stored or moved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListSummary {
    pub blobs: u64,
    pub events: u64,
    /// Blobs a replay would set aside: no events in them, or over the size
    /// bound.
    pub unreadable: u64,
    /// Blobs named in no documented layout, which a replay leaves in place.
    pub not_dead_letters: Vec<String>,
    pub by_reason: BTreeMap<String, u64>,
    /// The outcome each event would get, judged from the store's rows
    /// (read only): `executed`, `duplicate`, `conflict`, `rejected`, or
    /// `unknown` when the store could not be read.
    pub by_outcome: BTreeMap<&'static str, u64>,
    /// Earliest and latest publish time (else the blob's hour), with the blob.
    pub oldest: Option<(String, String)>,
    pub newest: Option<(String, String)>,
    oldest_at: Option<time::OffsetDateTime>,
    newest_at: Option<time::OffsetDateTime>,
}

impl fmt::Display for ListSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "blobs={} events={} unreadable={} not_dead_letters={}",
            self.blobs,
            self.events,
            self.unreadable,
            self.not_dead_letters.len()
        )?;
        for name in &self.not_dead_letters {
            writeln!(
                f,
                "  not in a dead-letter layout (a replay leaves it): {}",
                escaped(name)
            )?;
        }
        writeln!(f, "by reason:")?;
        for (reason, n) in &self.by_reason {
            writeln!(f, "  {n:>8}  {}", escaped(reason))?;
        }
        writeln!(
            f,
            "by the outcome a replay would get (from the store's rows, read only; nothing executed):"
        )?;
        for (outcome, n) in &self.by_outcome {
            writeln!(f, "  {n:>8}  {outcome}")?;
        }
        for (label, v) in [("oldest", &self.oldest), ("newest", &self.newest)] {
            match v {
                Some((when, blob)) => {
                    writeln!(f, "{label}  {} ({})", escaped(when), escaped(blob))?
                }
                None => writeln!(f, "{label}  -")?,
            }
        }
        Ok(())
    }
}

/// The outcome a replay would give an order, from its row (pure): no row
/// or a `Received` row executes, a terminal row with the same fingerprint
/// is a duplicate, another fingerprint a conflict. (An order whose position
/// would overflow shows as `executed`; the replay rejects it.)
pub fn expected_outcome(order: &Order, row: Option<&OrderRecord>) -> OutcomeKind {
    match row {
        None => OutcomeKind::Executed,
        Some(r) if r.current_fingerprint() != order.fingerprint() => OutcomeKind::Conflict,
        Some(r) if !r.status.is_terminal() => OutcomeKind::Executed,
        Some(_) => OutcomeKind::Duplicate,
    }
}

/// The order of a dead-lettered event as the processor would read it, or
/// why it would be rejected (pure).
pub fn order_of(event: &Value, settings: &ProcessorSettings) -> Result<Order, String> {
    let envelope = parse_envelope(event).map_err(|e| e.0)?;
    check_type(&envelope.event_type, settings.event_types.as_deref()).map_err(|e| e.0)?;
    Order::from_data_with(&envelope.data, settings.fractional_numbers).map_err(|e| e.to_string())
}

/// `dead-letters list`: counts by reason and by the outcome a replay would
/// get, oldest and newest. Reads blobs and the store; changes nothing.
pub async fn list(
    container: &Container,
    store: &dyn OrderStore,
    settings: &ProcessorSettings,
    options: &SweepOptions,
) -> Result<ListSummary, BlobError> {
    let started = Instant::now();
    let names = candidates(container, options.prefix.as_deref()).await?;
    let mut s = ListSummary::default();
    for (i, candidate) in names.iter().enumerate() {
        if options.max_blobs.is_some_and(|m| i >= m)
            || options.deadline.is_some_and(|d| started.elapsed() >= d)
        {
            break;
        }
        let name = candidate.listed.name.clone();
        let max = container.max_blob_bytes();
        let read =
            match fate::before_reading(candidate.parsed.is_some(), candidate.listed.size, max) {
                First::Leave(_) => {
                    s.blobs += 1;
                    s.not_dead_letters.push(name);
                    continue;
                }
                First::SetAside { .. } => Read::TooLarge {
                    size: candidate.listed.size,
                },
                First::Read => container.read(&name).await?,
            };
        let Some(blob) = &candidate.parsed else {
            continue;
        };
        let bytes = match read {
            Read::Bytes(b) => b,
            Read::Gone => continue,
            Read::TooLarge { .. } => {
                s.blobs += 1;
                s.unreadable += 1;
                continue;
            }
        };
        s.blobs += 1;
        let events = match parse_blob(&bytes) {
            Ok(events) => events,
            Err(_) => {
                s.unreadable += 1;
                continue;
            }
        };
        for dl in events {
            s.events += 1;
            *s.by_reason
                .entry(dl.metadata.reason_or_unknown().to_string())
                .or_default() += 1;
            let outcome = match order_of(&dl.event, settings) {
                Err(_) => OutcomeKind::Rejected.as_str(),
                Ok(order) => match store.order(&order.order_id).await {
                    Ok(row) => expected_outcome(&order, row.as_ref()).as_str(),
                    Err(_) => "unknown",
                },
            };
            *s.by_outcome.entry(outcome).or_default() += 1;
            let when = dl
                .metadata
                .publish_time
                .as_deref()
                .and_then(|t| {
                    time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
                        .ok()
                        .map(|at| (at, t.to_string()))
                })
                .or_else(|| {
                    hour_of(blob).map(|at| (at, format!("{} (blob hour)", blob.hour_text())))
                });
            if let Some((at, text)) = when {
                if s.oldest_at.is_none_or(|o| at < o) {
                    s.oldest_at = Some(at);
                    s.oldest = Some((text.clone(), name.clone()));
                }
                if s.newest_at.is_none_or(|n| at > n) {
                    s.newest_at = Some(at);
                    s.newest = Some((text, name.clone()));
                }
            }
        }
    }
    Ok(s)
}

fn hour_of(blob: &BlobName) -> Option<time::OffsetDateTime> {
    let (y, m, d, h) = blob.hour;
    let month = time::Month::try_from(m).ok()?;
    let date = time::Date::from_calendar_date(i32::from(y), month, d).ok()?;
    Some(date.with_hms(h, 0, 0).ok()?.assume_utc())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn order(quantity: &str) -> Order {
        Order::from_data(&json!({"orderId":"o1","side":"buy","symbol":"MSFT","quantity":quantity,"accountId":"a1"})).unwrap()
    }

    #[test]
    fn the_summary_line() {
        let s = SweepSummary {
            blobs: 3,
            events: 5,
            executed: 1,
            duplicates: 2,
            conflicts: 1,
            rejected: 1,
            moved: 2,
            unreadable: 1,
            ..SweepSummary::default()
        };
        assert_eq!(
            s.to_string(),
            "blobs=3 events=5 executed=1 duplicates=2 conflicts=1 rejected=1 retries=0 unresolved=0 moved=2 unreadable=1"
        );
    }

    #[test]
    fn a_dry_run_judges_from_the_row() {
        let o = order("2");
        assert_eq!(expected_outcome(&o, None), OutcomeKind::Executed);
        let row = |fp: &str, status| OrderRecord {
            order_id: "o1".into(),
            fingerprint: fp.into(),
            account_id: "a1".into(),
            side: "buy".into(),
            symbol: "MSFT".into(),
            quantity: rust_decimal::Decimal::from(2),
            limit_price: None,
            currency: None,
            status,
            attempts: 1,
            received_at: "t".into(),
            executed_at: None,
            placed_at: None,
        };
        use crate::order::OrderStatus;
        let same = o.fingerprint().to_string();
        assert_eq!(
            expected_outcome(&o, Some(&row(&same, OrderStatus::Executed))),
            OutcomeKind::Duplicate
        );
        assert_eq!(
            expected_outcome(&o, Some(&row(&same, OrderStatus::Received))),
            OutcomeKind::Executed
        );
        let other = order("3").fingerprint().to_string();
        assert_eq!(
            expected_outcome(&o, Some(&row(&other, OrderStatus::Executed))),
            OutcomeKind::Conflict
        );
    }

    #[test]
    fn a_dry_run_sees_poison() {
        let settings = ProcessorSettings::default();
        assert!(order_of(&json!({"id":"e"}), &settings).is_err());
        let ok = json!({"id":"e","eventType":"T","data":{"orderId":"o1","side":"buy","symbol":"MSFT","quantity":1,"accountId":"a1"}});
        assert_eq!(order_of(&ok, &settings).unwrap().order_id, "o1");
    }
}
