//! `TelemetrySettings` from the standard `OTEL_*` variables.
//!
//! Only what this handler exports is read: OTLP over HTTP/protobuf, for
//! traces and metrics, and which traces (`OTEL_TRACES_SAMPLER`). Header
//! values (often an API key) never appear in a message.

use std::time::Duration;

use super::{err, parse_num, ConfigError};
use crate::telemetry::{
    AppInsightsSettings, EntraSignIn, OtlpSettings, Sampling, TelemetrySettings,
    DEFAULT_TRACES_PER_SECOND,
};

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
    let entra = val("APPLICATIONINSIGHTS_AUTHENTICATION_STRING")
        .map(|v| authentication(&v))
        .transpose()?;
    let application_insights = val("APPLICATIONINSIGHTS_CONNECTION_STRING")
        .map(|v| application_insights(&v))
        .transpose()?
        .filter(|_| !disabled)
        .map(|ai| AppInsightsSettings { entra, ..ai });
    let sampling = sampling(
        val("OTEL_TRACES_SAMPLER").as_deref(),
        val("OTEL_TRACES_SAMPLER_ARG").as_deref(),
        application_insights.is_some(),
    )?;
    Ok(TelemetrySettings {
        service_name: val("OTEL_SERVICE_NAME").unwrap_or(defaults.service_name),
        otlp,
        application_insights,
        metric_interval,
        span_queue,
        sampling,
    })
}

/// The samplers `OTEL_TRACES_SAMPLER` may name, for the messages.
const SAMPLERS: &str = "always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio, microsoft.rate_limited or microsoft.fixed_percentage";

/// Which traces are exported: `OTEL_TRACES_SAMPLER` (names in any case, as
/// the specification says of its enum values) and its argument. Unset:
/// Microsoft's default with Application Insights (`microsoft.rate_limited`,
/// 5 a second), OpenTelemetry's otherwise (every trace; a collector can
/// sample the tail). An event's span never has a parent (the host sends no
/// `traceparent`), so `parentbased_X` is `X`.
fn sampling(
    sampler: Option<&str>,
    arg: Option<&str>,
    application_insights: bool,
) -> Result<Sampling, ConfigError> {
    const VAR: &str = "OTEL_TRACES_SAMPLER";
    let Some(sampler) = sampler else {
        if let Some(arg) = arg {
            return Err(err(
                "OTEL_TRACES_SAMPLER_ARG",
                format!("is {arg:?} but OTEL_TRACES_SAMPLER is not set: name the sampler it is for (traceidratio or microsoft.fixed_percentage: a probability from 0 to 1; microsoft.rate_limited: traces per second)"),
            ));
        }
        return Ok(if application_insights {
            Sampling::RateLimited(DEFAULT_TRACES_PER_SECOND)
        } else {
            Sampling::AlwaysOn
        });
    };
    let name = sampler.to_ascii_lowercase();
    match name.as_str() {
        // The argument of a sampler that takes none is ignored, as the
        // specification says.
        "always_on" | "parentbased_always_on" => Ok(Sampling::AlwaysOn),
        "always_off" | "parentbased_always_off" => Ok(Sampling::AlwaysOff),
        "traceidratio" | "parentbased_traceidratio" | "microsoft.fixed_percentage" => arg
            .map_or(Ok(1.0), |v| ratio(&name, v))
            .map(Sampling::Ratio),
        "microsoft.rate_limited" => arg
            .map_or(Ok(DEFAULT_TRACES_PER_SECOND), per_second)
            .map(Sampling::RateLimited),
        "jaeger_remote" | "parentbased_jaeger_remote" | "xray" => Err(err(
            VAR,
            format!("{name} is not a sampler this handler has; expected {SAMPLERS}"),
        )),
        _ => Err(err(VAR, format!("expected {SAMPLERS}, got {sampler:?}"))),
    }
}

/// A sampling probability, 0 to 1 (`0.1`: one event in ten traced).
fn ratio(sampler: &str, v: &str) -> Result<f64, ConfigError> {
    match v.parse::<f64>() {
        // `abs`: -0 is 0.
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p.abs()),
        _ => Err(err(
            "OTEL_TRACES_SAMPLER_ARG",
            format!("{sampler} takes a probability from 0 to 1 (0.1: one event in ten traced), got {v:?}"),
        )),
    }
}

/// Traces per second of `microsoft.rate_limited`: from 0.001 (one every
/// 17 minutes; the rate limiter cannot hold much longer periods) to a
/// million (`0.5`: one every two seconds).
fn per_second(v: &str) -> Result<f64, ConfigError> {
    match v.parse::<f64>() {
        Ok(n) if (0.001..=1e6).contains(&n) => Ok(n),
        _ => Err(err(
            "OTEL_TRACES_SAMPLER_ARG",
            format!("microsoft.rate_limited takes traces per second, from 0.001 to 1000000 (0.5: one every two seconds; always_off exports none), got {v:?}"),
        )),
    }
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
    // The exporter sends to an http:// endpoint over https:// (the
    // ingestion API is HTTPS only): the logs name what it does.
    let ingestion_endpoint = match endpoint {
        Some(e) if e.starts_with("https://") => e.to_string(),
        Some(e) if e.starts_with("http://") => e.replacen("http://", "https://", 1),
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
        entra: None,
    })
}

/// `APPLICATIONINSIGHTS_AUTHENTICATION_STRING`, as the Functions host and
/// Microsoft's SDKs read it: `Authorization=AAD` signs the uploads in with
/// a managed identity, `ClientId=<id>` names a user-assigned one (keys in
/// any case). Anything else is refused: a value the handler ignored would
/// leave its telemetry refused by a resource with local authentication off.
fn authentication(v: &str) -> Result<EntraSignIn, ConfigError> {
    const VAR: &str = "APPLICATIONINSIGHTS_AUTHENTICATION_STRING";
    let mut aad = false;
    let mut client_id = None;
    for part in v.split(';').filter(|p| !p.trim().is_empty()) {
        let (k, value) = part.split_once('=').ok_or_else(|| {
            err(
                VAR,
                format!("expected Authorization=AAD[;ClientId=<client id>], got {part:?}"),
            )
        })?;
        match k.trim().to_ascii_lowercase().as_str() {
            "authorization" if value.trim().eq_ignore_ascii_case("aad") => aad = true,
            "authorization" => {
                return Err(err(
                    VAR,
                    format!("Authorization must be AAD (Microsoft Entra ID), got {:?}", value.trim()),
                ))
            }
            "clientid" if !value.trim().is_empty() => client_id = Some(value.trim().to_string()),
            "clientid" => return Err(err(VAR, "ClientId is empty: name the user-assigned identity's client id, or leave ClientId out for the system-assigned one")),
            other => {
                return Err(err(
                    VAR,
                    format!("unknown key {other:?}: expected Authorization=AAD[;ClientId=<client id>]"),
                ))
            }
        }
    }
    if !aad {
        return Err(err(
            VAR,
            "has no Authorization=AAD: expected Authorization=AAD[;ClientId=<client id>]",
        ));
    }
    Ok(EntraSignIn { client_id })
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
    fn entra_sign_in_from_the_authentication_string() {
        let with = |auth: &str| {
            settings(&[
                ("APPLICATIONINSIGHTS_CONNECTION_STRING", CONNECTION),
                ("APPLICATIONINSIGHTS_AUTHENTICATION_STRING", auth),
            ])
        };
        let ai = |auth: &str| with(auth).unwrap().application_insights.unwrap();
        assert_eq!(
            ai("Authorization=AAD;ClientId=11111111-2222-3333-4444-555555555555").entra,
            Some(EntraSignIn {
                client_id: Some("11111111-2222-3333-4444-555555555555".into())
            })
        );
        assert_eq!(
            ai("authorization=aad").entra,
            Some(EntraSignIn { client_id: None })
        );
        let key_only = settings(&[("APPLICATIONINSIGHTS_CONNECTION_STRING", CONNECTION)]).unwrap();
        assert_eq!(key_only.application_insights.unwrap().entra, None);
        for bad in [
            "ClientId=abc",
            "Authorization=Key",
            "Authorization=AAD;ClientId=",
            "Authorization=AAD;Secret=x",
            "AAD",
        ] {
            let e = with(bad).unwrap_err();
            assert_eq!(e.var, "APPLICATIONINSIGHTS_AUTHENTICATION_STRING", "{bad}");
        }
    }

    #[test]
    fn the_logs_name_the_scheme_the_exporter_uses() {
        let s = settings(&[(
            "APPLICATIONINSIGHTS_CONNECTION_STRING",
            "InstrumentationKey=0f1e2d3c;IngestionEndpoint=http://ingest.example/",
        )])
        .unwrap();
        assert_eq!(
            s.application_insights.unwrap().ingestion_endpoint,
            "https://ingest.example"
        );
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

    #[test]
    fn sampling_defaults_to_microsoft_s_rate_limit_with_application_insights_only() {
        assert_eq!(settings(&[]).unwrap().sampling, Sampling::AlwaysOn);
        let otlp = settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]).unwrap();
        assert_eq!(
            otlp.sampling,
            Sampling::AlwaysOn,
            "a collector can tail-sample"
        );
        for vars in [
            vec![("APPLICATIONINSIGHTS_CONNECTION_STRING", CONNECTION)],
            vec![
                ("APPLICATIONINSIGHTS_CONNECTION_STRING", CONNECTION),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ],
        ] {
            assert_eq!(
                settings(&vars).unwrap().sampling,
                Sampling::RateLimited(5.0),
                "{vars:?}"
            );
        }
        let off = settings(&[
            ("APPLICATIONINSIGHTS_CONNECTION_STRING", CONNECTION),
            ("OTEL_SDK_DISABLED", "true"),
        ])
        .unwrap();
        assert_eq!(off, TelemetrySettings::default(), "nothing exported");
    }

    #[test]
    fn every_sampler_accepted_and_its_argument() {
        use Sampling::{AlwaysOff as Off, AlwaysOn as On, RateLimited as Rate, Ratio};
        let with = |sampler: &str, arg: Option<&str>| {
            let mut vars = vec![
                ("APPLICATIONINSIGHTS_CONNECTION_STRING", CONNECTION),
                ("OTEL_TRACES_SAMPLER", sampler),
            ];
            vars.extend(arg.map(|a| ("OTEL_TRACES_SAMPLER_ARG", a)));
            settings(&vars)
                .unwrap_or_else(|e| panic!("{sampler} {arg:?}: {e}"))
                .sampling
        };
        let fixed = "microsoft.fixed_percentage";
        let rate = "microsoft.rate_limited";
        for (sampler, arg, want) in [
            ("always_on", None, On),
            ("parentbased_always_on", None, On),
            ("ALWAYS_ON", None, On),
            ("always_on", Some("0.1"), On),
            ("always_off", None, Off),
            ("parentbased_always_off", None, Off),
            ("traceidratio", Some("0.1"), Ratio(0.1)),
            ("traceidratio", None, Ratio(1.0)),
            ("traceidratio", Some("0"), Ratio(0.0)),
            ("traceidratio", Some("-0"), Ratio(0.0)),
            ("traceidratio", Some("1"), Ratio(1.0)),
            ("parentbased_traceidratio", Some("0.25"), Ratio(0.25)),
            (fixed, Some("1.0"), Ratio(1.0)),
            ("Microsoft.Fixed_Percentage", Some("0.5"), Ratio(0.5)),
            (fixed, None, Ratio(1.0)),
            (rate, Some("0.5"), Rate(0.5)),
            (rate, Some("100"), Rate(100.0)),
            (rate, Some("1000000"), Rate(1e6)),
            (rate, None, Rate(5.0)),
        ] {
            assert_eq!(with(sampler, arg), want, "{sampler} {arg:?}");
        }
    }

    #[test]
    fn a_bad_sampler_or_argument_is_refused_naming_what_is_accepted() {
        const SAMPLER: &str = "OTEL_TRACES_SAMPLER";
        const ARG: &str = "OTEL_TRACES_SAMPLER_ARG";
        let rate = "microsoft.rate_limited";
        for (sampler, arg, var, says) in [
            ("always", None, SAMPLER, "parentbased_traceidratio"),
            ("jaeger_remote", None, SAMPLER, "microsoft.rate_limited"),
            ("xray", None, SAMPLER, "not a sampler this handler has"),
            ("traceidratio", Some("1.5"), ARG, "from 0 to 1"),
            ("traceidratio", Some("-0.1"), ARG, "from 0 to 1"),
            ("traceidratio", Some("10%"), ARG, "from 0 to 1"),
            ("parentbased_traceidratio", Some("NaN"), ARG, "from 0 to 1"),
            ("microsoft.fixed_percentage", Some("50"), ARG, "from 0 to 1"),
            (rate, Some("0"), ARG, "always_off"),
            (rate, Some("-5"), ARG, "from 0.001"),
            // Its period would outgrow the rate limiter (it panicked).
            (rate, Some("1e-12"), ARG, "from 0.001"),
            (rate, Some("inf"), ARG, "to 1000000"),
            (rate, Some("1000001"), ARG, "to 1000000"),
            (rate, Some("five"), ARG, "per second"),
        ] {
            let mut vars = vec![(SAMPLER, sampler)];
            vars.extend(arg.map(|a| (ARG, a)));
            let e = settings(&vars).unwrap_err();
            assert_eq!(e.var, var, "{sampler} {arg:?}: {e}");
            assert!(e.problem.contains(says), "{sampler} {arg:?}: {e}");
            if let Some(arg) = arg {
                assert!(e.problem.contains(arg), "the value is named: {e}");
            }
        }
        let e = settings(&[("OTEL_TRACES_SAMPLER_ARG", "0.1")]).unwrap_err();
        assert_eq!(e.var, "OTEL_TRACES_SAMPLER_ARG");
        assert!(e.problem.contains("OTEL_TRACES_SAMPLER is not set"), "{e}");
    }
}
