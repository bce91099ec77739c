//! `TelemetrySettings` from the standard `OTEL_*` variables (issue 22).
//!
//! Only what this handler exports is read: OTLP over HTTP/protobuf, for
//! traces and metrics. Header values (often an API key) never appear in a
//! message.

use std::time::Duration;

use super::{err, parse_num, ConfigError};
use crate::telemetry::{AppInsightsSettings, OtlpSettings, TelemetrySettings};

/// The settings, through `val` (trimmed, empty as unset).
pub(super) fn telemetry(
    val: &dyn Fn(&str) -> Option<String>,
) -> Result<TelemetrySettings, ConfigError> {
    let num = |var: &'static str, default: u64, min: u64, max: u64| {
        val(var).map_or(Ok(default), |v| parse_num(var, &v, min, max))
    };
    let defaults = TelemetrySettings::default();
    let disabled = match val("OTEL_SDK_DISABLED")
        .map(|v| v.to_ascii_lowercase())
        .as_deref()
    {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(err(
                "OTEL_SDK_DISABLED",
                format!("expected true or false, got {other:?}"),
            ))
        }
    };
    match val("OTEL_EXPORTER_OTLP_PROTOCOL").as_deref() {
        None | Some("http/protobuf") => {}
        Some(other) => {
            return Err(err(
                "OTEL_EXPORTER_OTLP_PROTOCOL",
                format!("this handler exports OTLP over http/protobuf only, got {other:?}"),
            ))
        }
    }
    let timeout = Duration::from_millis(num("OTEL_EXPORTER_OTLP_TIMEOUT", 10_000, 1, 60_000)?);
    let metric_interval =
        Duration::from_millis(num("OTEL_METRIC_EXPORT_INTERVAL", 60_000, 100, 86_400_000)?);
    let span_queue = num("OTEL_BSP_MAX_QUEUE_SIZE", 2_048, 1, 1_000_000)? as usize;
    let headers = val("OTEL_EXPORTER_OTLP_HEADERS")
        .map(|v| headers(&v))
        .transpose()?
        .unwrap_or_default();
    let otlp = match val("OTEL_EXPORTER_OTLP_ENDPOINT") {
        Some(_) if disabled => None,
        None => None,
        Some(base) => {
            let base = endpoint(&base)?;
            Some(OtlpSettings {
                traces_endpoint: format!("{base}/v1/traces"),
                metrics_endpoint: format!("{base}/v1/metrics"),
                headers,
                timeout,
            })
        }
    };
    let application_insights = val("APPLICATIONINSIGHTS_CONNECTION_STRING")
        .map(|v| application_insights(&v))
        .transpose()?
        .filter(|_| !disabled);
    Ok(TelemetrySettings {
        service_name: val("OTEL_SERVICE_NAME").unwrap_or(defaults.service_name),
        otlp,
        application_insights,
        metric_interval,
        span_queue,
    })
}

/// The collector's base URL, without a trailing `/` (the signal paths
/// `/v1/traces`, `/v1/metrics` are appended, as the OTLP specification
/// says for `OTEL_EXPORTER_OTLP_ENDPOINT`).
fn endpoint(v: &str) -> Result<String, ConfigError> {
    const VAR: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
    let rest = v
        .strip_prefix("http://")
        .or_else(|| v.strip_prefix("https://"))
        .ok_or_else(|| {
            err(
                VAR,
                "expected the collector's http:// or https:// base URL, e.g. http://localhost:4318",
            )
        })?;
    let authority = rest.split('/').next().unwrap_or("");
    if authority.is_empty() || authority.contains('@') || v.contains(['?', '#', ' ']) {
        return Err(err(
            VAR,
            "expected http(s)://host[:port][/path], without credentials, query or fragment (put an API key in OTEL_EXPORTER_OTLP_HEADERS)",
        ));
    }
    Ok(v.trim_end_matches('/').to_string())
}

/// Application Insights' connection string (`Key=Value;…`, keys in any
/// case): it must hold an `InstrumentationKey`; its `IngestionEndpoint` (or
/// the default one) is what the logs show. Neither the string nor the key
/// ever appears in a message.
fn application_insights(v: &str) -> Result<AppInsightsSettings, ConfigError> {
    const VAR: &str = "APPLICATIONINSIGHTS_CONNECTION_STRING";
    let mut key = None;
    let mut endpoint = None;
    for part in v.split(';').filter(|p| !p.trim().is_empty()) {
        let (k, value) = part.split_once('=').ok_or_else(|| {
            err(VAR, "expected Key=Value pairs separated by ';', as the Azure portal shows it (the value is not shown)")
        })?;
        match k.trim().to_ascii_lowercase().as_str() {
            "instrumentationkey" => key = Some(value.trim()),
            "ingestionendpoint" => endpoint = Some(value.trim().trim_end_matches('/')),
            _ => {}
        }
    }
    if key.is_none_or(str::is_empty) {
        return Err(err(
            VAR,
            "has no InstrumentationKey: copy the whole connection string of the Application Insights resource (the value is not shown)",
        ));
    }
    let ingestion_endpoint = match endpoint {
        Some(e) if e.starts_with("https://") || e.starts_with("http://") => e.to_string(),
        Some(_) => {
            return Err(err(
                VAR,
                "its IngestionEndpoint is not an https:// URL (the value is not shown)",
            ))
        }
        None => "https://dc.services.visualstudio.com (the default)".to_string(),
    };
    Ok(AppInsightsSettings {
        connection_string: v.to_string(),
        ingestion_endpoint,
    })
}

/// `key=value,key=value`, values percent-decoded (the OTLP exporter
/// specification's format).
fn headers(v: &str) -> Result<Vec<(String, String)>, ConfigError> {
    const VAR: &str = "OTEL_EXPORTER_OTLP_HEADERS";
    v.split(',')
        .filter(|pair| !pair.trim().is_empty())
        .map(|pair| {
            let (k, value) = pair.split_once('=').ok_or_else(|| {
                err(
                    VAR,
                    "expected key=value pairs separated by commas (values not shown)",
                )
            })?;
            let k = k.trim();
            if k.is_empty()
                || !k
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            {
                return Err(err(
                    VAR,
                    "a header name must be letters, digits, '-', '_' or '.' (values not shown)",
                ));
            }
            let value = percent_encoding::percent_decode_str(value.trim())
                .decode_utf8()
                .map_err(|_| {
                    err(
                        VAR,
                        "a header value is not UTF-8 once percent-decoded (not shown)",
                    )
                })?;
            Ok((k.to_string(), value.into_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn settings(vars: &[(&str, &str)]) -> Result<TelemetrySettings, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        telemetry(&|k| map.get(k).cloned().filter(|v| !v.is_empty()))
    }

    #[test]
    fn nothing_set_exports_nothing() {
        let s = settings(&[]).unwrap();
        assert_eq!(s, TelemetrySettings::default());
        assert!(s.otlp.is_none());
    }

    #[test]
    fn the_endpoint_gets_the_signal_paths() {
        let s = settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
            ("OTEL_SERVICE_NAME", "orders-eu"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
        ])
        .unwrap();
        let otlp = s.otlp.expect("an exporter");
        assert_eq!(otlp.traces_endpoint, "http://collector:4318/v1/traces");
        assert_eq!(otlp.metrics_endpoint, "http://collector:4318/v1/metrics");
        assert_eq!(otlp.timeout, Duration::from_millis(2500));
        assert_eq!(s.service_name, "orders-eu");
    }

    #[test]
    fn disabled_wins_over_an_endpoint() {
        let s = settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_SDK_DISABLED", "TRUE"),
        ])
        .unwrap();
        assert!(s.otlp.is_none());
    }

    #[test]
    fn only_http_protobuf_is_accepted() {
        let e = settings(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]).unwrap_err();
        assert_eq!(e.var, "OTEL_EXPORTER_OTLP_PROTOCOL");
        settings(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")]).unwrap();
    }

    #[test]
    fn bad_endpoints_are_refused() {
        for bad in [
            "collector:4318",
            "http://",
            "http://user:key@collector:4318",
            "https://c?key=1",
        ] {
            let e = settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", bad)]).unwrap_err();
            assert_eq!(e.var, "OTEL_EXPORTER_OTLP_ENDPOINT", "{bad}");
            assert!(!e.problem.contains("key=1") && !e.problem.contains("user:key"));
        }
    }

    const CONNECTION: &str = "InstrumentationKey=0f1e2d3c-aaaa-bbbb-cccc-123456789abc;IngestionEndpoint=https://westeurope-5.in.applicationinsights.azure.com/;LiveEndpoint=https://westeurope.livediagnostics.monitor.azure.com/";

    #[test]
    fn application_insights_from_its_connection_string() {
        let s = settings(&[("APPLICATIONINSIGHTS_CONNECTION_STRING", CONNECTION)]).unwrap();
        let ai = s
            .application_insights
            .clone()
            .expect("Application Insights");
        assert_eq!(
            ai.ingestion_endpoint,
            "https://westeurope-5.in.applicationinsights.azure.com"
        );
        assert_eq!(ai.connection_string, CONNECTION);
        assert!(s.otlp.is_none());
        let shown = format!("{s:?}");
        assert!(!shown.contains("0f1e2d3c"), "{shown}");
        let off = settings(&[
            ("APPLICATIONINSIGHTS_CONNECTION_STRING", CONNECTION),
            ("OTEL_SDK_DISABLED", "true"),
        ])
        .unwrap();
        assert!(off.application_insights.is_none());
    }

    #[test]
    fn a_connection_string_without_a_key_is_refused_unshown() {
        for bad in [
            "IngestionEndpoint=https://x.in.applicationinsights.azure.com/",
            "InstrumentationKey=;IngestionEndpoint=https://x",
            "0f1e2d3c-aaaa-bbbb-cccc-123456789abc",
            "InstrumentationKey=0f1e2d3c;IngestionEndpoint=x.example",
        ] {
            let e = settings(&[("APPLICATIONINSIGHTS_CONNECTION_STRING", bad)]).unwrap_err();
            assert_eq!(e.var, "APPLICATIONINSIGHTS_CONNECTION_STRING");
            assert!(!e.problem.contains("0f1e2d3c"), "{e}");
        }
    }

    #[test]
    fn headers_are_decoded_and_never_shown() {
        let s = settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "api-key=s3cr%3Dt, x-tenant=eu",
            ),
        ])
        .unwrap();
        let otlp = s.otlp.clone().unwrap();
        assert_eq!(
            otlp.headers,
            vec![
                ("api-key".to_string(), "s3cr=t".to_string()),
                ("x-tenant".to_string(), "eu".to_string())
            ]
        );
        let shown = format!("{s:?}");
        assert!(
            shown.contains("api-key") && !shown.contains("s3cr"),
            "{shown}"
        );
        let e = settings(&[("OTEL_EXPORTER_OTLP_HEADERS", "s3cret")]).unwrap_err();
        assert!(!e.problem.contains("s3cret"), "{e}");
    }
}
