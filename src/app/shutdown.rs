//! How `serve` and `webhook` end: the stop signals, listened for from the
//! command's first instruction (a container's PID 1 ignores SIGTERM until
//! it listens for it, so a rollout would wait for SIGKILL through a slow
//! start), what stops a server once it runs, and the tail both share.

use std::future::Future;
use std::sync::{Arc, OnceLock};

use anyhow::Context;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

use super::build::{build_processor_as, start_telemetry, Built, GiveUp, Start};
use crate::config::Config;
use crate::telemetry::Telemetry;

/// SIGTERM and SIGINT, listened for since [`Stop::listen`].
pub(super) struct Stop {
    signalled: CancellationToken,
}

impl Stop {
    /// Listen for SIGTERM and SIGINT from now on: both are registered
    /// before this returns (not at a first poll).
    pub(super) fn listen() -> Stop {
        let signalled = CancellationToken::new();
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        let done = signalled.clone();
        tokio::spawn(async move {
            let wait = |s: std::io::Result<tokio::signal::unix::Signal>, name: &'static str| async move {
                match s {
                    Ok(mut s) => {
                        s.recv().await;
                        name
                    }
                    Err(e) => {
                        log::error!("cannot listen for {name}: {e}");
                        std::future::pending().await
                    }
                }
            };
            let name = tokio::select! {
                name = wait(term, "SIGTERM") => name,
                name = wait(int, "SIGINT") => name,
            };
            log::info!("{name} received");
            done.cancel();
        });
        Stop { signalled }
    }

    /// `start` run to its end, unless a stop signal comes first: `None`
    /// then, `start` dropped where it was.
    pub(super) async fn unless_stopped<T>(&self, start: impl Future<Output = T>) -> Option<T> {
        tokio::select! {
            biased;
            () = self.signalled.cancelled() => {
                log::info!("stopping during start-up");
                None
            }
            done = start => Some(done),
        }
    }

    /// The telemetry and the processor `serve` and `webhook` run, built
    /// unless a stop signal comes first: `None` then, once the start has
    /// ended as [`finish`] ends it.
    pub(super) async fn build_serving(
        &self,
        config: &Config,
    ) -> anyhow::Result<Option<(Option<Telemetry>, Built)>> {
        let telemetry = start_telemetry(config)?;
        let building = build_processor_as(config, telemetry.as_ref(), Start::Serve);
        match self.unless_stopped(building).await {
            None => {
                finish(telemetry, None).await?;
                Ok(None)
            }
            Some(built) => Ok(Some((telemetry, built?))),
        }
    }

    /// What stops a server: a stop signal, or a background migration that
    /// gives up (a right missing, found after the first try), which stops
    /// the handler like a signal and then fails the start with what it
    /// said (kept in the returned cell).
    pub(super) fn or_given_up(
        &self,
        background: Option<GiveUp>,
    ) -> (
        impl Future<Output = ()> + Send + 'static,
        Arc<OnceLock<String>>,
    ) {
        let gave_up = Arc::new(OnceLock::<String>::new());
        let signalled = self.signalled.clone();
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
                    () = signalled.cancelled() => {}
                    e = given_up => {
                        log::error!("stopping: {e}");
                        let _ = gave_up.set(e);
                    }
                }
            }
        };
        (stop, gave_up)
    }
}

/// The tail of `serve` and `webhook` once the server has stopped (or the
/// start was stopped): telemetry flushed, and the start failed when a
/// background migration gave up.
pub(super) async fn finish(
    telemetry: Option<Telemetry>,
    gave_up: Option<&OnceLock<String>>,
) -> anyhow::Result<()> {
    if let Some(t) = telemetry {
        t.shutdown().await;
    }
    match gave_up.and_then(OnceLock::get) {
        Some(e) => Err(anyhow::anyhow!("{e}")).context("the SQL Server store cannot be used"),
        None => Ok(()),
    }
}
