//! Where the handler runs: which Azure hosting plan, if any, from the same
//! environment variables the Functions host reads to know it.
//!
//! A pure function of the environment ([`detect`]); `config` uses it to
//! refuse the embedded defaults (in-memory guard, SQLite file) wherever the
//! app may run on more than one instance or on a disk it does not own.
//!
//! The rules are the host's own, from Azure/azure-functions-host
//! (`src/WebJobs.Script/Environment/EnvironmentExtensions.cs`:
//! `IsAppService`, `IsWindowsConsumption`, `IsWindowsElasticPremium`,
//! `IsFlexConsumptionSku`, `IsLinuxConsumptionOnAtlas`,
//! `IsLinuxConsumptionOnLegion`, `IsManagedAppEnvironment`,
//! `IsKubernetesManagedHosting`; the variable names are in
//! `src/WebJobs.Script/Environment/EnvironmentSettingNames.cs` and the SKU
//! values in `src/WebJobs.Script/ScriptConstants.cs`). The host starts the
//! handler with its own environment plus the port variables
//! (`Workers/ProcessManagement/DefaultWorkerProcessFactory.cs`), so the
//! handler sees what the host sees.

/// Every variable [`detect`] may read: set by the platform, never by the user.
pub const VARIABLES: [&str; 9] = [
    "FUNCTIONS_WORKER_RUNTIME",
    "MANAGED_ENVIRONMENT",
    "WEBSITE_INSTANCE_ID",
    "WEBSITE_SKU",
    "CONTAINER_NAME",
    "WEBSITE_POD_NAME",
    "LEGION_SERVICE_HOST",
    "KUBERNETES_SERVICE_HOST",
    "POD_NAMESPACE",
];

/// An Azure hosting plan of Azure Functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Consumption on Windows: App Service with `WEBSITE_SKU=Dynamic`.
    WindowsConsumption,
    /// Elastic Premium (Windows or Linux): App Service with
    /// `WEBSITE_SKU=ElasticPremium`.
    Premium,
    /// Dedicated: an App Service plan (any other `WEBSITE_SKU`, or none).
    Dedicated,
    /// Consumption on Linux ("Atlas"): `CONTAINER_NAME` without
    /// `WEBSITE_INSTANCE_ID` nor `LEGION_SERVICE_HOST`.
    LinuxConsumption,
    /// Flex Consumption: `WEBSITE_SKU=FlexConsumption`, or (in placeholder
    /// mode, before site settings arrive) `LEGION_SERVICE_HOST` with
    /// `CONTAINER_NAME` or `WEBSITE_POD_NAME`.
    FlexConsumption,
    /// Azure Container Apps hosting of Functions: `MANAGED_ENVIRONMENT`.
    ContainerApps,
    /// App Service on Kubernetes (Azure Arc): `KUBERNETES_SERVICE_HOST`
    /// and `POD_NAMESPACE`, without `MANAGED_ENVIRONMENT`.
    Kubernetes,
}

impl Plan {
    /// The plan's name as Azure's documentation writes it.
    pub fn name(self) -> &'static str {
        match self {
            Plan::WindowsConsumption => "Consumption (Windows)",
            Plan::Premium => "Premium (Elastic Premium)",
            Plan::Dedicated => "Dedicated (App Service plan)",
            Plan::LinuxConsumption => "Consumption (Linux)",
            Plan::FlexConsumption => "Flex Consumption",
            Plan::ContainerApps => "Azure Container Apps",
            Plan::Kubernetes => "App Service on Kubernetes (Azure Arc)",
        }
    }
}

/// A detected plan and the variables that showed it (`NAME=value`, or
/// `NAME` alone when any non-empty value counts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detected {
    pub plan: Plan,
    pub evidence: String,
}

impl std::fmt::Display for Detected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.plan.name(), self.evidence)
    }
}

/// Which Azure hosting plan `get` describes, or `None` (a developer's
/// machine, Core Tools, CI, a container run by hand). `get` answers a
/// variable's value; empty values count as absent, as in the host
/// (`string.IsNullOrEmpty`).
pub fn detect(get: impl Fn(&str) -> Option<String>) -> Option<Detected> {
    let val = |k: &str| get(k).filter(|v| !v.is_empty());
    let found = |plan, evidence: String| Some(Detected { plan, evidence });
    // IsManagedAppEnvironment first: the host excludes it from Linux
    // Consumption and from Kubernetes managed hosting.
    if val("MANAGED_ENVIRONMENT").is_some() {
        return found(Plan::ContainerApps, "MANAGED_ENVIRONMENT is set".into());
    }
    let sku = val("WEBSITE_SKU");
    let sku_is = |s: &str| sku.as_deref().is_some_and(|v| v.eq_ignore_ascii_case(s));
    // IsAppService: WEBSITE_INSTANCE_ID (Windows Consumption, Premium,
    // Dedicated on Windows and Linux).
    if val("WEBSITE_INSTANCE_ID").is_some() {
        let (plan, what) = if sku_is("Dynamic") {
            (Plan::WindowsConsumption, "WEBSITE_SKU=Dynamic")
        } else if sku_is("ElasticPremium") {
            (Plan::Premium, "WEBSITE_SKU=ElasticPremium")
        } else if sku_is("FlexConsumption") {
            (Plan::FlexConsumption, "WEBSITE_SKU=FlexConsumption")
        } else {
            (Plan::Dedicated, "")
        };
        let evidence = match (what, sku.as_deref()) {
            ("", Some(s)) => format!("WEBSITE_INSTANCE_ID is set, WEBSITE_SKU={s}"),
            ("", None) => "WEBSITE_INSTANCE_ID is set".into(),
            (w, _) => format!("WEBSITE_INSTANCE_ID is set, {w}"),
        };
        return found(plan, evidence);
    }
    // IsFlexConsumptionSku: the SKU, or Legion in placeholder mode.
    if sku_is("FlexConsumption") {
        return found(Plan::FlexConsumption, "WEBSITE_SKU=FlexConsumption".into());
    }
    // CONTAINER_NAME, WEBSITE_POD_NAME and the Kubernetes variables are set
    // by other container platforms too (a CI runner, a plain Kubernetes pod):
    // they count only in a Functions app, which always has
    // FUNCTIONS_WORKER_RUNTIME (an app setting Azure requires; the host
    // passes its environment on to the handler). The host itself needs no
    // such gate: it knows it is the Functions host.
    val("FUNCTIONS_WORKER_RUNTIME")?;
    let container = val("CONTAINER_NAME").map(|_| "CONTAINER_NAME");
    let pod = val("WEBSITE_POD_NAME").map(|_| "WEBSITE_POD_NAME");
    if val("LEGION_SERVICE_HOST").is_some() {
        if let Some(which) = container.or(pod) {
            return found(
                Plan::FlexConsumption,
                format!("LEGION_SERVICE_HOST and {which} are set"),
            );
        }
    }
    // IsLinuxConsumptionOnAtlas: a container name outside App Service.
    if container.is_some() {
        return found(
            Plan::LinuxConsumption,
            "CONTAINER_NAME is set, WEBSITE_INSTANCE_ID is not".into(),
        );
    }
    // IsKubernetesManagedHosting.
    if val("KUBERNETES_SERVICE_HOST").is_some() && val("POD_NAMESPACE").is_some() {
        return found(
            Plan::Kubernetes,
            "KUBERNETES_SERVICE_HOST and POD_NAMESPACE are set".into(),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn on(vars: &[(&str, &str)]) -> Option<Detected> {
        let env: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        detect(|k| env.get(k).cloned())
    }

    /// What every Functions app has (the platform requires the setting).
    const F: (&str, &str) = ("FUNCTIONS_WORKER_RUNTIME", "custom");

    fn plan(vars: &[(&str, &str)]) -> Option<Plan> {
        on(vars).map(|d| d.plan)
    }

    #[test]
    fn detect_reads_only_its_listed_variables() {
        let everything: Vec<(&str, &str)> = VARIABLES.iter().map(|k| (*k, "x")).collect();
        for n in 0..=everything.len() {
            let read = std::cell::RefCell::new(Vec::new());
            let env: HashMap<&str, &str> = everything[..n].iter().copied().collect();
            detect(|k| {
                read.borrow_mut().push(k.to_string());
                env.get(k).map(|v| v.to_string())
            });
            for k in read.into_inner() {
                assert!(VARIABLES.contains(&k.as_str()), "{k} is not in VARIABLES");
            }
        }
    }

    #[test]
    fn nothing_azure_is_no_plan() {
        assert_eq!(on(&[]), None);
        assert_eq!(on(&[("HOME", "/root"), ("CI", "true")]), None);
        // Empty values are absent, as in the host.
        assert_eq!(
            on(&[("WEBSITE_INSTANCE_ID", ""), ("CONTAINER_NAME", "")]),
            None
        );
        // Core Tools sets its own variable, and no plan's.
        assert_eq!(on(&[("FUNCTIONS_CORETOOLS_ENVIRONMENT", "true")]), None);
        // A SKU alone, outside App Service, is no plan but Flex.
        assert_eq!(on(&[("WEBSITE_SKU", "Dynamic")]), None);
        // One Kubernetes variable without the other is not the host's rule.
        assert_eq!(on(&[("KUBERNETES_SERVICE_HOST", "10.0.0.1")]), None);
    }

    #[test]
    fn app_service_plans_by_sku() {
        let d = on(&[("WEBSITE_INSTANCE_ID", "abc"), ("WEBSITE_SKU", "dynamic")]).unwrap();
        assert_eq!(d.plan, Plan::WindowsConsumption);
        assert!(d.to_string().contains("WEBSITE_SKU=Dynamic"), "{d}");
        assert_eq!(
            plan(&[
                ("WEBSITE_INSTANCE_ID", "abc"),
                ("WEBSITE_SKU", "ElasticPremium")
            ]),
            Some(Plan::Premium)
        );
        let d = on(&[("WEBSITE_INSTANCE_ID", "abc"), ("WEBSITE_SKU", "PremiumV3")]).unwrap();
        assert_eq!(d.plan, Plan::Dedicated);
        assert_eq!(
            d.evidence,
            "WEBSITE_INSTANCE_ID is set, WEBSITE_SKU=PremiumV3"
        );
        assert_eq!(
            plan(&[("WEBSITE_INSTANCE_ID", "abc")]),
            Some(Plan::Dedicated)
        );
    }

    #[test]
    fn linux_consumption_is_a_container_outside_app_service() {
        let d = on(&[F, ("CONTAINER_NAME", "E9A1C2_orders")]).unwrap();
        assert_eq!(d.plan, Plan::LinuxConsumption);
        assert!(d.evidence.contains("CONTAINER_NAME"), "{d}");
    }

    /// The generic container variables alone (a CI runner, a container run
    /// by hand, a plain Kubernetes pod) are not Azure Functions.
    #[test]
    fn container_variables_outside_a_functions_app_are_no_plan() {
        assert_eq!(on(&[("CONTAINER_NAME", "uid-runner-1")]), None);
        assert_eq!(
            on(&[("LEGION_SERVICE_HOST", "l"), ("WEBSITE_POD_NAME", "p")]),
            None
        );
        assert_eq!(
            on(&[
                ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
                ("POD_NAMESPACE", "ns")
            ]),
            None
        );
    }

    #[test]
    fn flex_consumption_by_sku_or_legion() {
        assert_eq!(
            plan(&[("WEBSITE_SKU", "FlexConsumption"), ("CONTAINER_NAME", "c")]),
            Some(Plan::FlexConsumption)
        );
        assert_eq!(
            plan(&[F, ("LEGION_SERVICE_HOST", "l"), ("CONTAINER_NAME", "c")]),
            Some(Plan::FlexConsumption)
        );
        assert_eq!(
            plan(&[F, ("LEGION_SERVICE_HOST", "l"), ("WEBSITE_POD_NAME", "p")]),
            Some(Plan::FlexConsumption)
        );
    }

    #[test]
    fn container_apps_wins_over_the_kubernetes_and_container_variables() {
        let d = on(&[
            ("MANAGED_ENVIRONMENT", "true"),
            ("CONTAINER_NAME", "c"),
            ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
            ("POD_NAMESPACE", "k8se-apps"),
        ])
        .unwrap();
        assert_eq!(d.plan, Plan::ContainerApps);
        assert_eq!(d.evidence, "MANAGED_ENVIRONMENT is set");
    }

    #[test]
    fn kubernetes_managed_hosting_needs_both_variables() {
        assert_eq!(
            plan(&[
                F,
                ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
                ("POD_NAMESPACE", "ns")
            ]),
            Some(Plan::Kubernetes)
        );
    }
}
