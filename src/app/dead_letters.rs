//! `dead-letters list` and `dead-letters replay`: the dead-letter
//! container of the configuration, refused on the embedded state unless
//! asked for.

use anyhow::Context;

use super::build::{build_command_processor, build_store, describe, start_telemetry, NewFile};
use crate::config::Config;

/// Whether an operator command that takes events out of production (the
/// dead-letter container) may run on the state of `config` (pure): not on
/// an embedded default by accident, where the orders would execute in a
/// local file while the blobs are moved away from production for good.
pub fn refuse_embedded_state(
    command: &str,
    defaulted: &[&str],
    allowed: bool,
) -> anyhow::Result<()> {
    if defaulted.is_empty() || allowed {
        return Ok(());
    }
    anyhow::bail!(
        "{command}: {} not set, so this would run on the embedded defaults (an in-memory guard, the SQLite file {}) and the dead letters' orders would execute there, not in production, while their blobs leave the container; set {} as the app has them (README, Operate), or pass --allow-embedded-state to replay into the embedded state on purpose. Nothing was read or moved",
        defaulted.join(" and "),
        crate::config::DEFAULT_SQLITE_PATH,
        if defaulted.len() > 1 { "them" } else { "it" },
    )
}

/// The dead-letter container of the configuration, or what to set.
pub fn dead_letter_container(config: &Config) -> anyhow::Result<crate::deadletter::Container> {
    let settings = config.dead_letter.as_ref().ok_or_else(|| {
        anyhow::anyhow!("DEAD_LETTER_STORAGE is not set: give the dead-letter storage account's connection string or the container's URL (and DEAD_LETTER_CONTAINER, default {})", crate::config::DEFAULT_DEAD_LETTER_CONTAINER)
    })?;
    Ok(crate::deadletter::Container::open(settings)?)
}

/// `dead-letters replay`: every dead-lettered event through the processor;
/// finished blobs moved under `replayed/`, unreadable ones under `unreadable/`.
pub async fn dead_letters_replay(
    config: &Config,
    options: &crate::deadletter::SweepOptions,
    allow_embedded_state: bool,
) -> anyhow::Result<crate::deadletter::SweepSummary> {
    refuse_embedded_state(
        "dead-letters replay",
        &config.defaulted_state,
        allow_embedded_state,
    )?;
    let container = dead_letter_container(config)?;
    let telemetry = start_telemetry(config)?;
    let processor = build_command_processor(config, telemetry.as_ref()).await?;
    println!(
        "replaying dead letters from {} ({})",
        container.describe(),
        describe(config)
    );
    let progress = crate::deadletter::progress::for_stderr();
    let swept = crate::deadletter::sweep(&processor, &container, options, progress.as_ref()).await;
    if let Some(t) = telemetry {
        t.shutdown().await;
    }
    Ok(swept?)
}

/// `dead-letters list`: counts by reason and by the outcome a replay would
/// get (from the store's rows), oldest and newest; changes nothing.
pub async fn dead_letters_list(
    config: &Config,
    options: &crate::deadletter::SweepOptions,
    allow_embedded_state: bool,
) -> anyhow::Result<crate::deadletter::ListSummary> {
    // The outcomes it shows are read from the store: from a local file they
    // would say every order is still to execute.
    refuse_embedded_state(
        "dead-letters list",
        &config.defaulted_state,
        allow_embedded_state,
    )?;
    let container = dead_letter_container(config)?;
    let store = build_store(config, NewFile::Refused).await?;
    store
        .migrate()
        .await
        .with_context(|| format!("checking the {} schema", store.name()))?;
    println!(
        "dead letters in {} ({})",
        container.describe(),
        describe(config)
    );
    Ok(crate::deadletter::list(&container, store.as_ref(), &config.processor, options).await?)
}
