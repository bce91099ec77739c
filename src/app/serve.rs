//! `serve`: the custom handler's HTTP server, until SIGTERM or SIGINT.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use anyhow::Context;

use super::build::{build_processor_as, describe, start_telemetry, Built, GiveUp, Start};
use super::dead_letters::dead_letter_container;
use crate::config::Config;

/// `serve`: listen on 127.0.0.1:$FUNCTIONS_CUSTOMHANDLER_PORT until SIGTERM/SIGINT.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    let telemetry = start_telemetry(&config)?;
    let Built {
        processor,
        background,
        dispatcher,
    } = build_processor_as(&config, telemetry.as_ref(), Start::Serve).await?;
    let (stop, gave_up) = stop_on(background);
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
    if let Some(t) = telemetry {
        t.shutdown().await;
    }
    match gave_up.get() {
        Some(e) => Err(anyhow::anyhow!("{e}")).context("the SQL Server store cannot be used"),
        None => Ok(()),
    }
}

/// What stops a server: SIGTERM or SIGINT, or a background migration that
/// gives up (a right missing, found after the first try), which stops the
/// handler like a signal and then fails the start with what it said.
pub(super) fn stop_on(
    background: Option<GiveUp>,
) -> (
    impl std::future::Future<Output = ()> + Send + 'static,
    Arc<std::sync::OnceLock<String>>,
) {
    let gave_up = Arc::new(std::sync::OnceLock::<String>::new());
    let stop = {
        let gave_up = Arc::clone(&gave_up);
        async move {
            let given_up = async {
                match background {
                    Some(task) => match task.await {
                        Ok(e) => e.to_string(),
                        Err(e) => format!("the background migration failed: {e}"),
                    },
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown_signal() => {}
                e = given_up => {
                    log::error!("stopping: {e}");
                    let _ = gave_up.set(e);
                }
            }
        }
    };
    (stop, gave_up)
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                log::error!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => log::info!("SIGINT received"),
        () = term => log::info!("SIGTERM received"),
    }
}
