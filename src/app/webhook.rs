//! `webhook`: Event Grid's webhook protocol on every interface, for where
//! no Functions host runs; the same processor, guard, store, outbox and
//! telemetry as `serve`.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use anyhow::Context;

use super::build::{build_processor_as, describe, start_telemetry, Built, Start};
use super::serve::stop_on;
use crate::config::Config;
use crate::webhook::auth::Verifier;
use crate::webhook::{Door, WebhookAuth};

/// `webhook`: listen on 0.0.0.0:$WEBHOOK_PORT until SIGTERM or SIGINT, then
/// drain.
pub async fn webhook(config: Config) -> anyhow::Result<()> {
    let settings = config.webhook.clone()?;
    let verifier = match &settings.auth {
        WebhookAuth::Entra(entra) => Some(Verifier::new(entra.clone())?),
        WebhookAuth::Off => {
            log::warn!(
                "WEBHOOK_AUTH=off: deliveries are not authenticated (a developer's machine only)"
            );
            None
        }
    };
    let telemetry = start_telemetry(&config)?;
    let Built {
        processor,
        background,
        dispatcher: _dispatcher,
    } = build_processor_as(&config, telemetry.as_ref(), Start::Serve).await?;
    let (stop, gave_up) = stop_on(background);
    let door = Arc::new(Door::new(processor, verifier, config.limits));
    let addr = SocketAddr::from((Ipv4Addr::UNSPECIFIED, settings.port));
    let (bound, server) = crate::webhook::bind(door, addr, stop, config.shutdown_grace)?;
    let auth = match &settings.auth {
        WebhookAuth::Entra(e) => format!(
            "Microsoft Entra ID: audience {}, tenant {}",
            e.audience, e.tenant_id
        ),
        WebhookAuth::Off => "no authentication".into(),
    };
    log::info!(
        "order-guard webhook listening on http://{bound}/{} ({}; {auth})",
        crate::webhook::PATH,
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
