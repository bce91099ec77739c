//! Where the handler runs: which Azure hosting plan, if any, from the same
//! environment variables the Functions host reads to know it ([`detect`]),
//! and whether the embedded state is safe there ([`runs`]).
//!
//! Pure functions of the environment; `config` uses them to refuse the
//! embedded state (in-memory guard, SQLite file) wherever the app may run on
//! more than one instance or on a disk it does not own. The rule is the safe
//! way round: the embedded state only where Core Tools, or no Functions host
//! at all, is seen. A Functions host that is not Core Tools (an Azure plan,
//! or a Functions container its users host themselves: AKS with KEDA, a
//! plain Container App, Docker on a VM) may run the app on several replicas
//! and restart it on a fresh disk.
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

/// Every variable [`detect`] and [`runs`] may read: set by the platform or
/// the tools, never by the user.
pub const VARIABLES: [&str; 15] = [
    "FUNCTIONS_WORKER_RUNTIME",
    "ORDER_GUARD_IMAGE",
    "FUNCTIONS_CORETOOLS_ENVIRONMENT",
    "CONTAINER_APP_NAME",
    "CONTAINER_APP_REVISION",
    "CONTAINER_APP_REPLICA_NAME",
    "AzureWebJobsScriptRoot",
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

/// Where the handler runs, as far as the embedded state is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Runs {
    /// On an Azure hosting plan of Functions.
    OnPlan(Detected),
    /// Under a Functions host that is not Core Tools and no Azure plan: a
    /// Functions container hosted by its users. `evidence` says what showed
    /// it (the runtime variable, and the platform's marks when seen).
    UnderSelfHostedFunctions { evidence: String },
    /// Under Core Tools (`func start`), which marks itself.
    UnderCoreTools,
    /// With no Functions host, where several replicas may run: this
    /// project's image (`ORDER_GUARD_IMAGE`, which its Containerfile sets,
    /// never empty; present even empty), an Azure Container App
    /// (`CONTAINER_APP_NAME`, `CONTAINER_APP_REVISION`,
    /// `CONTAINER_APP_REPLICA_NAME`, which the platform sets) or a
    /// Kubernetes pod (`KUBERNETES_SERVICE_HOST`, which the kubelet sets in
    /// every pod). `evidence` names the variable. Not every container: a
    /// dev container or a CI runner (`/.dockerenv`, `CONTAINER_NAME`) is one
    /// process on one disk, as is a single `docker run` of another image.
    InContainer { evidence: String },
    /// With no Functions host: the CLI, a test, a developer's `serve`.
    WithoutFunctionsHost,
}

impl Runs {
    /// Whether one process's own state (an in-memory guard, a local SQLite
    /// file) can be the whole state: only on a developer's machine.
    pub fn embedded_state_is_safe(&self) -> bool {
        matches!(self, Runs::UnderCoreTools | Runs::WithoutFunctionsHost)
    }
}

impl std::fmt::Display for Runs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Runs::OnPlan(d) => write!(f, "in Azure on {d}"),
            Runs::UnderSelfHostedFunctions { evidence } => write!(
                f,
                "under a Functions host that is not Core Tools ({evidence}): a container that may run as several replicas and restart on a fresh disk"
            ),
            Runs::InContainer { evidence } => write!(
                f,
                "in a container ({evidence}) that may run as several replicas and restart on a fresh disk"
            ),
            Runs::UnderCoreTools => f.write_str("under Core Tools"),
            Runs::WithoutFunctionsHost => f.write_str("without a Functions host"),
        }
    }
}

/// Which door the handler serves: Core Tools' mark counts only behind a
/// Functions host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    /// `serve` (and the operator's commands): behind a Functions host.
    Host,
    /// `webhook`: Event Grid's own protocol, which Core Tools never starts.
    Webhook,
}

/// Where `get` says the handler runs (see [`Runs`]), for `door`. Core
/// Tools sets `FUNCTIONS_CORETOOLS_ENVIRONMENT=true` for the host it starts
/// (and so for the handler); every Functions host has
/// `FUNCTIONS_WORKER_RUNTIME` (the host passes its environment on to the
/// handler).
///
/// Behind a host, Core Tools' mark is read first and wins over every
/// plan's rule: the plans' variables (`CONTAINER_NAME`, the Kubernetes
/// ones) are also set by dev containers and CI runners where `func start`
/// runs, while no Azure plan sets the mark (Core Tools sets it for the
/// process it starts). For the webhook, which Core Tools never starts, the
/// mark says nothing and is not read.
pub fn runs(get: impl Fn(&str) -> Option<String>, door: Door) -> Runs {
    let val = |k: &str| get(k).filter(|v| !v.is_empty());
    if door == Door::Host
        && val("FUNCTIONS_CORETOOLS_ENVIRONMENT").is_some_and(|v| v.eq_ignore_ascii_case("true"))
    {
        return Runs::UnderCoreTools;
    }
    if let Some(plan) = detect(&get) {
        return Runs::OnPlan(plan);
    }
    // A Functions host, or a Functions container image (whose
    // `AzureWebJobsScriptRoot` is set even where `serve` runs by hand).
    let runtime = val("FUNCTIONS_WORKER_RUNTIME");
    if runtime.is_none() && val("AzureWebJobsScriptRoot").is_none() {
        return match replicas(&get) {
            Some(evidence) => Runs::InContainer { evidence },
            None => Runs::WithoutFunctionsHost,
        };
    }
    let mut evidence = match &runtime {
        Some(r) => {
            format!("FUNCTIONS_WORKER_RUNTIME={r} without FUNCTIONS_CORETOOLS_ENVIRONMENT=true")
        }
        None => "no FUNCTIONS_CORETOOLS_ENVIRONMENT=true".to_string(),
    };
    for (var, platform) in [
        ("KUBERNETES_SERVICE_HOST", "Kubernetes"),
        ("CONTAINER_APP_NAME", "Azure Container Apps"),
        ("AzureWebJobsScriptRoot", "a Functions container image"),
    ] {
        if val(var).is_some() {
            evidence.push_str(&format!("; {var} is set: {platform}"));
        }
    }
    Runs::UnderSelfHostedFunctions { evidence }
}

/// Where several replicas of the handler may run with no Functions host
/// (pure): the variable that shows it, or `None`. This project's image
/// counts however it was built (its mark present, even empty); the
/// platforms count by the variables they set in every replica.
fn replicas(get: &impl Fn(&str) -> Option<String>) -> Option<String> {
    if let Some(v) = get("ORDER_GUARD_IMAGE") {
        return Some(format!("ORDER_GUARD_IMAGE={v:?}: this project's image"));
    }
    let val = |k: &str| get(k).filter(|v| !v.is_empty());
    for (var, what) in [
        ("CONTAINER_APP_NAME", "an Azure Container App"),
        ("CONTAINER_APP_REVISION", "an Azure Container App"),
        ("CONTAINER_APP_REPLICA_NAME", "an Azure Container App"),
        ("KUBERNETES_SERVICE_HOST", "a Kubernetes pod"),
    ] {
        if let Some(v) = val(var) {
            return Some(format!("{var}={v}: {what}"));
        }
    }
    None
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

    /// The handler's own places: where the embedded state is safe and where
    /// it is not, each environment as its platform sets it.
    #[test]
    fn the_embedded_state_is_safe_only_under_core_tools_or_no_host() {
        // A developer's machine, CI, the CLI: no Functions host.
        assert_eq!(runs(|_| None, Door::Host), Runs::WithoutFunctionsHost);
        let safe = |vars: &[(&str, &str)]| {
            let env: HashMap<String, String> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let r = runs(|k| env.get(k).cloned(), Door::Host);
            (r.embedded_state_is_safe(), r)
        };
        // Core Tools marks the host it starts (`func start`).
        let (ok, r) = safe(&[F, ("FUNCTIONS_CORETOOLS_ENVIRONMENT", "true")]);
        assert!(ok, "{r}");
        assert_eq!(r, Runs::UnderCoreTools);
        // Core Tools' mark wins over every plan's rule: a dev container or
        // a CI runner sets the plans' variables where `func start` runs.
        for plan_marks in [
            &[("CONTAINER_NAME", "devcontainer")][..],
            &[("LEGION_SERVICE_HOST", "l"), ("WEBSITE_POD_NAME", "p")],
            &[
                ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
                ("POD_NAMESPACE", "ns"),
            ],
            &[("WEBSITE_INSTANCE_ID", "abc"), ("WEBSITE_SKU", "Dynamic")],
            &[("MANAGED_ENVIRONMENT", "true")],
        ] {
            let mut vars = vec![F, ("FUNCTIONS_CORETOOLS_ENVIRONMENT", "true")];
            vars.extend_from_slice(plan_marks);
            let (ok, r) = safe(&vars);
            assert_eq!(r, Runs::UnderCoreTools, "{plan_marks:?}");
            assert!(ok, "{r}");
        }
        // Outside a Functions host a container is not several replicas by
        // itself (a dev container, a CI runner: `CONTAINER_NAME`)...
        let (ok, r) = safe(&[("CONTAINER_NAME", "uid-runner-1"), ("HOSTNAME", "3f2a")]);
        assert!(ok, "{r}");
        // ...but this project's image (however built: its mark even
        // empty), a Container App or a Kubernetes pod may be.
        for (var, value, says) in [
            ("ORDER_GUARD_IMAGE", "0.2.0", "this project's image"),
            ("ORDER_GUARD_IMAGE", "", "this project's image"),
            ("CONTAINER_APP_NAME", "orders", "an Azure Container App"),
            (
                "CONTAINER_APP_REVISION",
                "orders--r1",
                "an Azure Container App",
            ),
            (
                "CONTAINER_APP_REPLICA_NAME",
                "orders--r1-5f",
                "an Azure Container App",
            ),
            ("KUBERNETES_SERVICE_HOST", "10.0.0.1", "a Kubernetes pod"),
        ] {
            let (ok, r) = safe(&[(var, value), ("CONTAINER_NAME", "c")]);
            assert!(!ok, "{var}={value:?}: {r}");
            assert!(r.to_string().contains(says), "{r}");
            assert!(r.to_string().contains(var), "{r}");
            assert!(matches!(r, Runs::InContainer { .. }), "{r}");
        }
        // (the place, its environment, what the refusal must say of it)
        type Place<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
        let unsafe_places: [Place; 7] = [
            (
                "AKS with KEDA",
                &[
                    F,
                    ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
                    ("KUBERNETES_SERVICE_PORT", "443"),
                    ("AzureWebJobsScriptRoot", "/home/site/wwwroot"),
                ],
                "KUBERNETES_SERVICE_HOST is set: Kubernetes",
            ),
            (
                "a plain Container App",
                &[
                    F,
                    ("CONTAINER_APP_NAME", "orders"),
                    ("CONTAINER_APP_REVISION", "orders--r1"),
                    ("KUBERNETES_SERVICE_HOST", "100.100.0.1"),
                ],
                "CONTAINER_APP_NAME is set: Azure Container Apps",
            ),
            (
                "Docker on a VM",
                &[
                    F,
                    ("AzureWebJobsScriptRoot", "/home/site/wwwroot"),
                    ("HOSTNAME", "3f2a"),
                ],
                "AzureWebJobsScriptRoot is set",
            ),
            (
                "a Functions image running serve by hand",
                &[("AzureWebJobsScriptRoot", "/home/site/wwwroot")],
                "AzureWebJobsScriptRoot is set: a Functions container image",
            ),
            (
                "a Functions host with no other mark",
                &[F],
                "FUNCTIONS_WORKER_RUNTIME=custom without FUNCTIONS_CORETOOLS_ENVIRONMENT=true",
            ),
            (
                "Core Tools' variable not true",
                &[F, ("FUNCTIONS_CORETOOLS_ENVIRONMENT", "false")],
                "without FUNCTIONS_CORETOOLS_ENVIRONMENT=true",
            ),
            (
                "Linux Consumption",
                &[F, ("CONTAINER_NAME", "E9A1C2_orders")],
                "Consumption (Linux)",
            ),
        ];
        for (place, vars, says) in unsafe_places {
            let (ok, r) = safe(vars);
            assert!(!ok, "{place}: {r}");
            assert!(r.to_string().contains(says), "{place}: {r}");
        }
    }

    /// Core Tools never starts the webhook: its mark does not make a pod,
    /// an image or a Functions plan safe for it.
    #[test]
    fn core_tools_mark_counts_only_behind_a_functions_host() {
        let core_tools = ("FUNCTIONS_CORETOOLS_ENVIRONMENT", "true");
        let on = |vars: &[(&str, &str)], door| {
            let env: HashMap<&str, &str> = vars.iter().copied().collect();
            runs(|k| env.get(k).map(|v| v.to_string()), door)
        };
        for place in [
            &[("KUBERNETES_SERVICE_HOST", "10.0.0.1")][..],
            &[("ORDER_GUARD_IMAGE", "0.2.0")],
            &[("WEBSITE_INSTANCE_ID", "abc")],
            &[F],
        ] {
            let mut vars = vec![core_tools];
            vars.extend_from_slice(place);
            assert_eq!(on(&vars, Door::Host), Runs::UnderCoreTools, "{place:?}");
            let r = on(&vars, Door::Webhook);
            assert!(!r.embedded_state_is_safe(), "{place:?}: {r}");
        }
        // Alone, the mark is a developer's machine for either door.
        assert!(on(&[core_tools], Door::Webhook).embedded_state_is_safe());
    }
}
