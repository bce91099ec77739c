//! The operator's read-outs and upkeep: `status ORDER_ID` (the guard's
//! key beside the store's row) and `prune-guard`.

use super::build::{open_checked, open_for_reading};
use super::outbox;
use crate::config::{Config, GuardConfig};

/// `status ORDER_ID`: the guard key beside the store's row, as text.
pub async fn status(config: &Config, order_id: &str) -> anyhow::Result<Status> {
    use std::fmt::Write;
    // As the processor keeps ids: without surrounding white space.
    let order_id = order_id.trim();
    let (guard, store) = open_for_reading(config).await?;
    let mut out = String::new();
    let key = config.guard_settings.key(order_id);
    match (&config.guard, guard.inspect(order_id).await) {
        (GuardConfig::Memory, _) => writeln!(
            out,
            "guard   memory guard: state lives only inside a running `serve` process"
        )?,
        (_, Ok(entry)) => match entry.value {
            Some(v) => writeln!(
                out,
                "guard   {key} = {v} (ttl {} s){}",
                entry.ttl_seconds.unwrap_or(-1),
                entry
                    .fingerprint
                    .map(|f| format!(" fingerprint {f}"))
                    .unwrap_or_default()
            )?,
            None => writeln!(
                out,
                "guard   {key}: no key (never seen, expired, or released)"
            )?,
        },
        (_, Err(e)) => writeln!(out, "guard   {key}: {e}")?,
    }
    let mut known = match store.order(order_id).await? {
        Some(o) => {
            writeln!(
                out,
                "order   {} {} {} {} {} for {} (fingerprint {}, attempts {}, received {}{})",
                o.order_id,
                o.status.as_str(),
                o.side,
                o.quantity,
                o.symbol,
                o.account_id,
                o.fingerprint,
                o.attempts,
                o.received_at,
                o.executed_at
                    .map(|t| format!(", executed {t}"))
                    .unwrap_or_default()
            )?;
            let pos = store.position(&o.account_id, &o.symbol).await?;
            writeln!(
                out,
                "position {} {} = {}",
                o.account_id,
                o.symbol,
                pos.map(|p| p.to_string()).unwrap_or_else(|| "none".into())
            )?;
            true
        }
        None => {
            writeln!(out, "order   {order_id}: no row in {}", store.name())?;
            false
        }
    };
    for r in store.rejections(Some(order_id)).await? {
        known = true;
        writeln!(
            out,
            "rejected {} ({} deliveries): {}",
            r.kind, r.deliveries, r.reason
        )?;
    }
    let listing = crate::store::Listing::Order(order_id.to_string());
    for a in store.announcements(&listing, 1).await? {
        writeln!(
            out,
            "announced {} {}",
            a.message_id,
            match (&a.dispatched_at, a.parked) {
                (Some(t), _) => format!("dispatched {t}"),
                (None, true) => format!(
                    "parked after {} attempts: {} (`order-guard outbox retry {}`)",
                    a.attempts,
                    a.last_error
                        .as_deref()
                        .map(crate::text::escaped)
                        .unwrap_or_default(),
                    a.message_id
                ),
                (None, false) => format!(
                    "waiting ({} attempts so far; destination {})",
                    a.attempts,
                    outbox::destination(config)
                ),
            }
        )?;
    }
    Ok(Status { text: out, known })
}

/// What `status ORDER_ID` shows, and whether the store knows the order at
/// all (a row, or a rejected event naming it): an id it has never seen
/// makes the command fail, so a script that checks an order notices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub text: String,
    pub known: bool,
}

/// What `prune-guard` found and did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PruneSummary {
    /// `COMPLETADA` keys seen.
    pub completed: u64,
    /// Of those, marked by this store (its identity).
    pub ours: u64,
    /// Of ours, whose order has no row here: removed (or, dry run, listed).
    pub orphaned: Vec<String>,
    /// Whether they were removed.
    pub removed: bool,
}

impl std::fmt::Display for PruneSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for id in &self.orphaned {
            writeln!(
                f,
                "{} {id}",
                if self.removed {
                    "removed"
                } else {
                    "would remove"
                }
            )?;
        }
        write!(
            f,
            "completed={} ours={} without_row={} removed={}",
            self.completed,
            self.ours,
            self.orphaned.len(),
            if self.removed { self.orphaned.len() } else { 0 }
        )
    }
}

/// `prune-guard`: remove this store's `COMPLETADA` keys whose order has no
/// row in the store. After a database is restored to an earlier point, the
/// cache still says the orders of the lost interval are done, and their
/// redeliveries would be answered `duplicate` without ever executing.
/// Markers of other databases sharing the cache, and unbound ones, are left
/// alone (the processor already asks the store about those).
pub async fn prune_guard(config: &Config, dry_run: bool) -> anyhow::Result<PruneSummary> {
    let (guard, store) = open_checked(config).await?;
    let identity = store.identity().await?;
    let prefix = format!("{identity}/");
    let mut summary = PruneSummary {
        removed: !dry_run,
        ..PruneSummary::default()
    };
    for (order_id, marker) in guard.completed_orders().await? {
        summary.completed += 1;
        if !marker.as_deref().is_some_and(|m| m.starts_with(&prefix)) {
            continue;
        }
        summary.ours += 1;
        if store.order(&order_id).await?.is_some() {
            continue;
        }
        if !dry_run && !guard.forget_completed(&order_id, marker.as_deref()).await? {
            continue; // changed meanwhile: completed again, leave it
        }
        summary.orphaned.push(order_id);
    }
    Ok(summary)
}
