//! `serve`: the custom handler's HTTP server, until SIGTERM or SIGINT
//! (listened for from its first instruction: `shutdown`).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use super::build::{describe, Built};
use super::dead_letters::dead_letter_container;
use super::shutdown::{finish, Stop};
use crate::config::Config;

/// `serve`: listen on 127.0.0.1:$FUNCTIONS_CUSTOMHANDLER_PORT until SIGTERM/SIGINT.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    let stop = Stop::listen();
    let Some((
        telemetry,
        Built {
            processor,
            background,
            dispatcher,
        },
    )) = stop.build_serving(&config).await?
    else {
        return Ok(());
    };
    let (stop, gave_up) = stop.or_given_up(background);
    let container = match &config.dead_letter {
        Some(_) => Some(dead_letter_container(&config)?),
        None => None,
    };
    let sweep = Arc::new(
        crate::deadletter::function::SweepFunction::new(Arc::clone(&processor), container)
            .with_outbox(dispatcher),
    );
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, config.port));
    let (bound, server) = crate::host::bind_with(
        processor,
        sweep,
        addr,
        config.limits,
        stop,
        config.shutdown_grace,
    )?;
    log::info!(
        "order-guard listening on http://{bound} ({})",
        describe(&config)
    );
    server.await;
    finish(telemetry, Some(&gave_up)).await
}
