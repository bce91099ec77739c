//! `webhook`: Event Grid's webhook protocol on every interface, for where
//! no Functions host runs; the same processor, guard, store, outbox and
//! telemetry as `serve`.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use super::build::{describe, Built};
use super::shutdown::{finish, Stop};
use crate::config::Config;
use crate::webhook::auth::Verifier;
use crate::webhook::{Door, WebhookAuth};

/// `webhook`: listen on 0.0.0.0:$WEBHOOK_PORT until SIGTERM or SIGINT, then
/// drain.
pub async fn webhook(config: Config) -> anyhow::Result<()> {
    let stop = Stop::listen();
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
    let Some((
        telemetry,
        Built {
            processor,
            background,
            dispatcher: _dispatcher,
        },
    )) = stop.build_serving(&config).await?
    else {
        return Ok(());
    };
    let (stop, gave_up) = stop.or_given_up(background);
    let door = Arc::new(Door::new(processor, verifier, config.limits));
    let addr = SocketAddr::from((Ipv4Addr::UNSPECIFIED, settings.port));
    let (bound, server) = crate::webhook::bind(door, addr, stop, config.shutdown_grace)?;
    let auth = match &settings.auth {
        WebhookAuth::Entra(e) => format!(
            "Microsoft Entra ID: audience {}, tenant {}",
            e.accepted_audiences().join(", "),
            e.tenant_id
        ),
        WebhookAuth::Off => "no authentication".into(),
    };
    log::info!(
        "order-guard webhook listening on http://{bound}/{} ({}; {auth})",
        crate::webhook::PATH,
        describe(&config)
    );
    server.await;
    finish(telemetry, Some(&gave_up)).await
}
