//! The outbox's commands and its dispatcher's start: `serve` runs one
//! dispatcher when `OUTBOX_STORAGE` is set; `outbox list`, `outbox retry`
//! and `outbox dispatch` are the operator's (issue 32).

use std::fmt::Write;
use std::sync::Arc;

use crate::config::Config;
use crate::outbox::{Dispatcher, QueueDestination};
use crate::store::{Listing, OrderStore};

/// The dispatcher `serve` runs beside the handler, started (its first
/// round picks up what earlier instances left), or `None` without a
/// destination.
pub fn start_dispatcher(config: &Config, store: &Arc<dyn OrderStore>) -> Option<Arc<Dispatcher>> {
    let Some(queue) = &config.outbox.queue else {
        log::info!(
            "outbox: OUTBOX_STORAGE is not set: executions are announced in the {} store's Outbox table and not sent anywhere",
            store.name()
        );
        return None;
    };
    let dispatcher = Arc::new(Dispatcher::new(
        Arc::clone(store),
        QueueDestination::new(queue.clone()),
        config.outbox.dispatch.clone(),
    ));
    log::info!("outbox: dispatching to the {}", dispatcher.describe());
    tokio::spawn(Arc::clone(&dispatcher).run());
    Some(dispatcher)
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
    let Some(queue) = &config.outbox.queue else {
        anyhow::bail!("OUTBOX_STORAGE is not set: there is nowhere to send announcements");
    };
    let dispatcher = Dispatcher::new(
        store,
        QueueDestination::new(queue.clone()),
        config.outbox.dispatch.clone(),
    );
    Ok(dispatcher.drain().await?)
}

/// Where announcements go, for `outbox list` and `status`.
pub fn destination(config: &Config) -> String {
    match &config.outbox.queue {
        Some(q) => format!("queue {} at {}", q.queue, q.storage.endpoint),
        None => "none (OUTBOX_STORAGE not set: kept, not sent)".into(),
    }
}
