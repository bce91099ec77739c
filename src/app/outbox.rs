//! The outbox's commands and its dispatcher's start: `serve` runs one
//! dispatcher when a destination is set (`OUTBOX_STORAGE` or
//! `OUTBOX_TOPIC_ENDPOINT`); `outbox list`, `outbox retry`
//! and `outbox dispatch` are the operator's (issue 32).

use std::fmt::Write;
use std::sync::Arc;

use crate::config::Config;
use crate::outbox::{Destination, DestinationSettings, Dispatcher};
use crate::store::{Listing, OrderStore};

/// The dispatcher `serve` runs beside the handler, started (its first
/// round picks up what earlier instances left), or `None` without a
/// destination.
pub fn start_dispatcher(
    config: &Config,
    store: &Arc<dyn OrderStore>,
) -> anyhow::Result<Option<Arc<Dispatcher>>> {
    let Some(settings) = &config.outbox.destination else {
        log::info!(
            "outbox: neither OUTBOX_STORAGE nor OUTBOX_TOPIC_ENDPOINT is set: executions are announced in the {} store's Outbox table and not sent anywhere",
            store.name()
        );
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
    let (_, store) = super::open_checked(config).await?;
    let counts = store.outbox_counts().await?;
    let mut out = String::new();
    writeln!(
        out,
        "outbox  undispatched={} parked={} dispatched={} (kept {} h) destination={}",
        counts.undispatched,
        counts.parked,
        counts.dispatched,
        config.outbox.dispatch.retention.as_secs() / 3600,
        destination(config)
    )?;
    for a in store
        .announcements(&Listing::Undispatched, LIST_AT_MOST)
        .await?
    {
        writeln!(
            out,
            "{} {} order {} executed {} attempts {}{}",
            if a.parked { "parked " } else { "waiting" },
            a.message_id,
            crate::event::Quoted(&a.order_id),
            a.executed_at,
            a.attempts,
            a.last_error
                .map(|e| format!(": {}", crate::event::escaped(&e)))
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

/// `outbox dispatch`: send what is due now, once, and say how many.
pub async fn outbox_dispatch(config: &Config) -> anyhow::Result<usize> {
    let (_, store) = super::open_checked(config).await?;
    let Some(settings) = &config.outbox.destination else {
        anyhow::bail!(
            "neither OUTBOX_STORAGE nor OUTBOX_TOPIC_ENDPOINT is set: there is nowhere to send announcements"
        );
    };
    let destination = Destination::new(settings).map_err(|e| anyhow::anyhow!("outbox: {e}"))?;
    let dispatcher = Dispatcher::new(store, destination, config.outbox.dispatch.clone());
    Ok(dispatcher.drain().await?)
}

/// Where announcements go, for `outbox list` and `status`.
pub fn destination(config: &Config) -> String {
    match &config.outbox.destination {
        Some(DestinationSettings::Queue(q)) => {
            format!("queue {} at {}", q.queue, q.storage.endpoint)
        }
        Some(DestinationSettings::Topic(t)) => format!("Event Grid topic {}", t.endpoint),
        None => "none (no OUTBOX_STORAGE or OUTBOX_TOPIC_ENDPOINT: kept, not sent)".into(),
    }
}
