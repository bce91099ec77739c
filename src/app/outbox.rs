//! The outbox's commands and its dispatcher's start: `serve` runs one
//! dispatcher when a destination is set (`OUTBOX_STORAGE` or
//! `OUTBOX_TOPIC_ENDPOINT`), and the retention alone when none is;
//! `outbox list`, `retry`, `resend`, `dispatch` and `backfill` are the
//! operator's. The three that send, send again or announce act only when
//! told `--yes`: without it they say what they would do (the
//! destination, the event naming, the count) and do nothing, since a
//! shell's settings may name another destination than production's.

use std::fmt::Write;
use std::sync::Arc;

use crate::config::Config;
use crate::outbox::retention::expired;
use crate::outbox::{Destination, DestinationSettings, Dispatcher, Retention};
use crate::store::{Listing, OrderStore, Resend};

/// The dispatcher `serve` runs beside the handler, started (its first
/// round picks up what earlier instances left), or `None` without a
/// destination.
pub fn start_dispatcher(
    config: &Config,
    store: &Arc<dyn OrderStore>,
) -> anyhow::Result<Option<Arc<Dispatcher>>> {
    let Some(settings) = &config.outbox.destination else {
        let retention = config.outbox.dispatch.retention_settings();
        log::info!(
            "outbox: neither OUTBOX_STORAGE nor OUTBOX_TOPIC_ENDPOINT is set: executions are announced in the {} store's Outbox table and not sent anywhere; those waiting more than OUTBOX_RETENTION_HOURS ({} h) are deleted, so a destination set later sends at most that many hours of them",
            store.name(),
            retention.keep.as_secs() / 3600
        );
        // The table stays bounded without a dispatcher too: the retention
        // runs for the life of the process.
        Arc::new(Retention::new(Arc::clone(store), retention, expired(false))).spawn();
        return Ok(None);
    };
    let destination = Destination::new(settings).map_err(|e| anyhow::anyhow!("outbox: {e}"))?;
    let dispatcher = Arc::new(Dispatcher::new(
        Arc::clone(store),
        destination,
        config.outbox.dispatch.clone(),
    ));
    log::info!("outbox: dispatching to the {}", dispatcher.describe());
    // Spawned with its rows born leased to it from now on: every order
    // this process executes is sent from memory, with no claim.
    dispatcher.spawn();
    Ok(Some(dispatcher))
}

/// Most rows `outbox list` shows.
pub const LIST_AT_MOST: u32 = 1_000;

/// `outbox list`: counts, then each undispatched announcement (parked
/// ones marked), oldest first.
pub async fn outbox_list(config: &Config) -> anyhow::Result<String> {
    let (_, store) = super::open_for_reading(config).await?;
    let counts = store.outbox_counts().await?;
    let mut out = String::new();
    writeln!(
        out,
        "outbox  undispatched={} parked={} dispatched={} (kept {} h{}) destination={}",
        counts.undispatched,
        counts.parked,
        counts.dispatched,
        config.outbox.dispatch.retention.as_secs() / 3600,
        counts
            .purged_through
            .as_deref()
            .map(|t| format!(", purged through executions of {t}"))
            .unwrap_or_default(),
        destination(config)
    )?;
    for a in store
        .announcements(&Listing::Undispatched, LIST_AT_MOST)
        .await?
    {
        writeln!(
            out,
            "{} {} order {} executed {} at epoch {} sequence {} attempts {}{}",
            if a.parked { "parked " } else { "waiting" },
            a.message_id,
            crate::text::Quoted(&a.order_id),
            a.executed_at,
            a.epoch.unwrap_or(0),
            a.seq,
            a.attempts,
            a.last_error
                .map(|e| format!(": {}", crate::text::escaped(&e)))
                .unwrap_or_default()
        )?;
    }
    Ok(out)
}

/// `outbox retry [MESSAGE_ID]`: parked or waiting announcements due now.
pub async fn outbox_retry(config: &Config, message_id: Option<&str>) -> anyhow::Result<u64> {
    let (_, store) = super::open_checked(config).await?;
    Ok(store.retry_announcements(message_id).await?)
}

/// What `outbox dispatch` did, or would do without `--yes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DispatchRun {
    /// Told `--yes`: this many sent and marked.
    Sent(usize),
    /// Not told: what it would send, where; nothing sent or marked.
    Plan(String),
}

/// `outbox dispatch [--yes]`: send what is due now, once, from this
/// process, to the destination this process's settings name.
pub async fn outbox_dispatch(config: &Config, yes: bool) -> anyhow::Result<DispatchRun> {
    let (_, store) = super::open_checked(config).await?;
    let Some(settings) = &config.outbox.destination else {
        anyhow::bail!(
            "neither OUTBOX_STORAGE nor OUTBOX_TOPIC_ENDPOINT is set: there is nowhere to send announcements"
        );
    };
    let destination = Destination::new(settings).map_err(|e| anyhow::anyhow!("outbox: {e}"))?;
    if !yes {
        let counts = store.outbox_counts().await?;
        let naming = &config.outbox.dispatch.naming;
        return Ok(DispatchRun::Plan(format!(
            "would send the announcements due now of {} undispatched ({} parked, not sent) to the {}, as {}.{} events from source {}; and mark them sent, so the serving instances will not send them",
            counts.undispatched,
            counts.parked,
            destination.describe(),
            naming.type_prefix,
            crate::store::ORDER_EXECUTED,
            naming.source,
        )));
    }
    let dispatcher = Dispatcher::new(store, destination, config.outbox.dispatch.clone());
    Ok(DispatchRun::Sent(dispatcher.drain().await?))
}

/// `outbox resend MESSAGE_ID | --since AGE [--yes]`: dispatched
/// announcements made due again, as they were (same id, same sequence),
/// for the serving instances' dispatchers to send (a consumer that lost
/// them); answers how many, or with `yes` false how many it would.
pub async fn outbox_resend(config: &Config, which: &Resend, yes: bool) -> anyhow::Result<u64> {
    let (_, store) = super::open_checked(config).await?;
    if !yes {
        let matching = match which {
            Resend::Message(id) => store
                .announcements(&Listing::Message(id.clone()), 1)
                .await?
                .iter()
                .filter(|a| a.dispatched_at.is_some())
                .count() as u64,
            // Of every dispatched row kept, those dispatched within the
            // age: at most this many.
            Resend::DispatchedWithin(_) => store.outbox_counts().await?.dispatched,
        };
        return Ok(matching);
    }
    Ok(store.resend_announcements(which).await?)
}

/// What `outbox backfill` did, or would do without `--yes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackfillRun {
    /// Told `--yes`: this many announcements written.
    Written(u64),
    /// Not told: how many it would write, and where they would go.
    Plan(String),
}

/// `outbox backfill --since AGE [--yes]`: the orders executed within `age`
/// that have no announcement get one (`OrderStore::backfill_announcements`),
/// for the serving instances' dispatchers to send. Refused further back
/// than the retention: an older execution's announcement may have been
/// sent and deleted since, and would be announced twice.
pub async fn outbox_backfill(
    config: &Config,
    age: std::time::Duration,
    yes: bool,
) -> anyhow::Result<BackfillRun> {
    let retention = config.outbox.dispatch.retention;
    if age > retention {
        anyhow::bail!(
            "--since reaches back {} h, more than OUTBOX_RETENTION_HOURS ({} h): an order executed before that may have had its announcement sent and deleted by the retention, and would be announced twice; give a later time",
            age.as_secs() / 3600,
            retention.as_secs() / 3600
        );
    }
    let (_, store) = super::open_checked(config).await?;
    // What the store itself purged, whatever this shell's retention says.
    let purged = store.outbox_counts().await?.purged_through;
    if let Some(refusal) =
        reaches_the_purge(time::OffsetDateTime::now_utc(), age, purged.as_deref())
    {
        anyhow::bail!("{refusal}");
    }
    if !yes {
        let n = store.backfill_announcements(age, false).await?;
        return Ok(BackfillRun::Plan(format!(
            "would announce {n} orders executed in the last {} without an announcement, each once with its message id and a new sequence, for the serving instances to send (destination: {})",
            humantime::format_duration(std::time::Duration::from_secs(age.as_secs())),
            destination(config)
        )));
    }
    Ok(BackfillRun::Written(
        store.backfill_announcements(age, true).await?,
    ))
}

/// Why a backfill reaching back `age` from `now` is refused, if it is: it
/// reaches the store's purge watermark (`purged_through`, the newest
/// execution whose announcement the retention deleted), so an order it
/// finds without an announcement may have had one, sent and deleted.
fn reaches_the_purge(
    now: time::OffsetDateTime,
    age: std::time::Duration,
    purged_through: Option<&str>,
) -> Option<String> {
    let through = purged_through?;
    let since = now - age;
    let reached = match time::OffsetDateTime::parse(
        through,
        &time::format_description::well_known::Rfc3339,
    ) {
        Ok(through) => since <= through,
        // Unreadable: take it as reached, and say it.
        Err(_) => true,
    };
    reached.then(|| {
        format!(
            "--since reaches back to {since}, not after the outbox's purge watermark {through} (the newest execution whose announcement the retention deleted, as the store records it): an order executed by then may have had its announcement sent and deleted, and would be announced twice; give a time after it",
            since = since
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_else(|_| since.to_string()),
        )
    })
}

/// Where announcements go, for `outbox list` and `status`.
pub fn destination(config: &Config) -> String {
    match &config.outbox.destination {
        Some(DestinationSettings::Queue(q)) => {
            let lifetime = match q.message_ttl {
                None => "messages never expire".to_string(),
                Some(ttl) if ttl < config.outbox.dispatch.retention => format!(
                    "messages expire unread after {} s, before their rows are purged (OUTBOX_MESSAGE_TTL_UNDER_RETENTION=accept)",
                    ttl.as_secs()
                ),
                Some(ttl) => format!("messages expire unread after {} s", ttl.as_secs()),
            };
            format!("queue {} at {} ({lifetime})", q.queue, q.storage.endpoint)
        }
        Some(DestinationSettings::Topic(t)) => format!("Event Grid topic {}", t.endpoint),
        None => "none (no OUTBOX_STORAGE or OUTBOX_TOPIC_ENDPOINT: kept, not sent)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(text: &str) -> time::OffsetDateTime {
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).unwrap()
    }

    #[test]
    fn a_backfill_never_reaches_the_purge_watermark() {
        let now = at("2026-12-07T12:00:00Z");
        let hours = |h: u64| Duration::from_secs(h * 3600);
        // Nothing purged yet: any reach.
        assert_eq!(reaches_the_purge(now, hours(500), None), None);
        // Purged through executions of 10:00: from 11:00 on, fine; from
        // 10:00 itself or before, refused, naming the watermark.
        let through = Some("2026-12-07T10:00:00.000Z");
        assert_eq!(reaches_the_purge(now, hours(1), through), None);
        for reach in [hours(2), hours(3), hours(48)] {
            let refusal = reaches_the_purge(now, reach, through).expect("refused");
            assert!(refusal.contains("2026-12-07T10:00:00.000Z"), "{refusal}");
        }
        // One millisecond after it is after it.
        assert_eq!(
            reaches_the_purge(now, hours(2) - Duration::from_millis(1), through),
            None
        );
        // SQL Server's text without a fraction reads the same.
        assert!(reaches_the_purge(now, hours(2), Some("2026-12-07T10:00:00Z")).is_some());
        // A watermark that cannot be read refuses rather than guesses.
        assert!(reaches_the_purge(now, hours(1), Some("yesterday")).is_some());
    }
}
