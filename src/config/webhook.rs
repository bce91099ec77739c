//! The webhook's settings (`WEBHOOK_*`): its port, and how deliveries are
//! authenticated. Read whatever the command, checked when `webhook` runs:
//! `serve` needs none of them.

use super::{err, parse_num, ConfigError};
use crate::hosting::Runs;
use crate::webhook::auth::{EntraSettings, DEFAULT_AUTHORITY};
use crate::webhook::{WebhookAuth, WebhookSettings};

/// Every setting only `order-guard webhook` reads: no Functions host runs
/// it, so `local.settings.json` has none of them.
pub const WEBHOOK_VARIABLES: [&str; 5] = [
    "WEBHOOK_PORT",
    "WEBHOOK_AUTH",
    "WEBHOOK_TENANT_ID",
    "WEBHOOK_AUDIENCE",
    "WEBHOOK_AUTHORITY",
];

/// The port the webhook listens on unless `WEBHOOK_PORT` says otherwise.
pub const DEFAULT_WEBHOOK_PORT: u16 = 8080;

/// Whether `url` may serve Entra ID's keys: HTTPS, or HTTP on this machine
/// only (a local issuer in tests).
fn authority_allowed(url: &str) -> bool {
    if url.starts_with("https://") {
        return true;
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let host = rest.split(['/', ':']).next().unwrap_or_default();
    let host = if rest.starts_with('[') {
        rest.split(']').next().map_or("", |h| &h[1..])
    } else {
        host
    };
    matches!(host, "127.0.0.1" | "localhost" | "::1")
}

/// The webhook's settings; `runs` is where the handler runs: turning the
/// authentication off is refused wherever the embedded state would be.
pub(super) fn webhook(
    val: &dyn Fn(&str) -> Option<String>,
    runs: &Runs,
) -> Result<WebhookSettings, ConfigError> {
    let port = match val("WEBHOOK_PORT") {
        Some(p) => parse_num("WEBHOOK_PORT", &p, 1, 65_535)? as u16,
        None => DEFAULT_WEBHOOK_PORT,
    };
    // Each read whatever the others say (a test lists what is read).
    let (tenant_id, audience, authority) = (
        val("WEBHOOK_TENANT_ID"),
        val("WEBHOOK_AUDIENCE"),
        val("WEBHOOK_AUTHORITY"),
    );
    let auth = match val("WEBHOOK_AUTH").map(|v| v.to_ascii_lowercase()).as_deref() {
        None | Some("entra") => {
            let tenant_id = tenant_id.ok_or_else(|| {
                err(
                    "WEBHOOK_TENANT_ID",
                    "must be set to the tenant of the webhook's Microsoft Entra app (a GUID: az account show --query tenantId), or WEBHOOK_AUTH=off on a developer's machine",
                )
            })?;
            if uuid::Uuid::parse_str(&tenant_id).is_err() {
                return Err(err(
                    "WEBHOOK_TENANT_ID",
                    format!("expected a tenant id, a GUID (az account show --query tenantId), got {tenant_id:?}"),
                ));
            }
            let audiences: Vec<String> = audience
                .iter()
                .flat_map(|a| a.split(','))
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(String::from)
                .collect();
            if audiences.is_empty() {
                return Err(err(
                    "WEBHOOK_AUDIENCE",
                    "must be set to the webhook's Microsoft Entra app: its application id or application id URI, as the Event Grid subscription names it (--azure-active-directory-application-id-or-uri); several separated by commas",
                ));
            }
            let authority = authority.unwrap_or_else(|| DEFAULT_AUTHORITY.into());
            if !authority_allowed(&authority) {
                return Err(err(
                    "WEBHOOK_AUTHORITY",
                    format!("expected an https:// address (default {DEFAULT_AUTHORITY}), or http:// on this machine, got {authority:?}"),
                ));
            }
            WebhookAuth::Entra(EntraSettings {
                tenant_id,
                audiences,
                authority,
            })
        }
        Some("off") if runs.embedded_state_is_safe() => WebhookAuth::Off,
        Some("off") => {
            return Err(err(
                "WEBHOOK_AUTH",
                format!("off is for a developer's machine; this runs {runs}, where anyone who can reach the port could place orders. Use Microsoft Entra ID (WEBHOOK_TENANT_ID, WEBHOOK_AUDIENCE)"),
            ))
        }
        Some(other) => {
            return Err(err(
                "WEBHOOK_AUTH",
                format!("expected \"entra\" (the default) or \"off\", got {other:?}"),
            ))
        }
    };
    Ok(WebhookSettings { port, auth })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const TENANT: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";

    fn read(vars: &[(&str, &str)], runs: &Runs) -> Result<WebhookSettings, ConfigError> {
        let env: HashMap<&str, &str> = vars.iter().copied().collect();
        webhook(&|k| env.get(k).map(|v| v.to_string()), runs)
    }

    #[test]
    fn entra_id_is_the_default_and_needs_the_tenant_and_the_audience() {
        let local = Runs::WithoutFunctionsHost;
        assert_eq!(read(&[], &local).unwrap_err().var, "WEBHOOK_TENANT_ID");
        assert_eq!(
            read(&[("WEBHOOK_TENANT_ID", TENANT)], &local)
                .unwrap_err()
                .var,
            "WEBHOOK_AUDIENCE"
        );
        let bad = read(
            &[
                ("WEBHOOK_TENANT_ID", "contoso"),
                ("WEBHOOK_AUDIENCE", "api://a"),
            ],
            &local,
        )
        .unwrap_err();
        assert_eq!(bad.var, "WEBHOOK_TENANT_ID");
        let ok = read(
            &[
                ("WEBHOOK_TENANT_ID", TENANT),
                ("WEBHOOK_AUDIENCE", "api://orders"),
            ],
            &local,
        )
        .unwrap();
        assert_eq!(ok.port, DEFAULT_WEBHOOK_PORT);
        let listed = read(
            &[
                ("WEBHOOK_TENANT_ID", TENANT),
                (
                    "WEBHOOK_AUDIENCE",
                    " api://orders , 5b3c7f3e-8a52-4c1e-9f0e-0d1c2b3a4f5e,",
                ),
            ],
            &local,
        )
        .unwrap();
        let WebhookAuth::Entra(e) = listed.auth else {
            panic!("not Entra ID")
        };
        assert_eq!(
            e.audiences,
            ["api://orders", "5b3c7f3e-8a52-4c1e-9f0e-0d1c2b3a4f5e"]
        );
        assert_eq!(
            read(
                &[("WEBHOOK_TENANT_ID", TENANT), ("WEBHOOK_AUDIENCE", " , ")],
                &local
            )
            .unwrap_err()
            .var,
            "WEBHOOK_AUDIENCE"
        );
        assert_eq!(
            ok.auth,
            WebhookAuth::Entra(EntraSettings {
                tenant_id: TENANT.into(),
                audiences: vec!["api://orders".into()],
                authority: DEFAULT_AUTHORITY.into(),
            })
        );
    }

    #[test]
    fn off_only_where_the_embedded_state_may_run() {
        let off = [("WEBHOOK_AUTH", "off"), ("WEBHOOK_PORT", "9090")];
        let local = read(&off, &Runs::WithoutFunctionsHost).unwrap();
        assert_eq!((local.port, local.auth), (9090, WebhookAuth::Off));
        let image = Runs::InContainer {
            evidence: "ORDER_GUARD_IMAGE=0.2.0: this project's image".into(),
        };
        let e = read(&off, &image).unwrap_err();
        assert_eq!(e.var, "WEBHOOK_AUTH");
        assert!(e.problem.contains("this project's image"), "{e}");
        assert_eq!(
            read(&[("WEBHOOK_AUTH", "none")], &Runs::WithoutFunctionsHost)
                .unwrap_err()
                .var,
            "WEBHOOK_AUTH"
        );
    }

    #[test]
    fn keys_come_over_https_or_from_this_machine() {
        for ok in [
            "https://login.microsoftonline.com",
            "http://127.0.0.1:8123",
            "http://localhost/x",
            "http://[::1]:80",
        ] {
            assert!(authority_allowed(ok), "{ok}");
        }
        for refused in [
            "http://login.microsoftonline.com",
            "http://10.0.0.1",
            "ftp://x",
            "login.microsoftonline.com",
        ] {
            assert!(!authority_allowed(refused), "{refused}");
        }
    }
}
