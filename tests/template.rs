//! The azd template (`infra/`) held to the code. No Bicep compiler runs
//! here, so the Bicep text is read as text: the app's settings (each value
//! evaluated with the template's own names in place of what Azure fills
//! in), the role assignments, the subscription, the outputs. Then:
//!
//! - the settings, in Flex Consumption's environment, are a configuration
//!   the handler accepts (`Config::from_lookup`) with no embedded state:
//!   Redis and SQL Server signed in to as the user-assigned identity, the
//!   dead-letter container and the announcements queue by Entra ID, under
//!   the code's default names; none of the settings Flex refuses;
//! - each client's role is on the resource that client's setting names,
//!   not wider, and the host's on its own account;
//! - the subscription filters on the event types the handler is told to
//!   take and the samples carry, with Event Grid's retry policy and the
//!   container as dead-letter destination through the identity;
//! - the outputs are the settings an operator exports (docs/deploy.md
//!   step 10's names).
//!
//! What only a deployment shows (that Azure accepts each resource, that the
//! roles suffice at run time) is said in the README.

use std::collections::BTreeMap;
use std::path::Path;

use order_guard::config::{
    Config, GuardConfig, RedisAuth, StoreConfig, DEFAULT_DEAD_LETTER_CONTAINER,
    DEFAULT_OUTBOX_QUEUE,
};
use order_guard::outbox::DestinationSettings;
use order_guard::storage::Credential;
use order_guard::store::sqlserver::connstr::{Auth, SqlConnInfo};

fn read(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// The text of the `{ … }` block that starts on the first line containing
/// `marker`, braces inside '…' strings and `//` comments not counted.
fn block<'a>(text: &'a str, marker: &str) -> &'a str {
    let start = text
        .find(marker)
        .unwrap_or_else(|| panic!("not found: {marker}"));
    let open = start + text[start..].find('{').expect("a block");
    let (mut depth, mut in_string, mut in_comment) = (0, false, false);
    let bytes = text.as_bytes();
    for (i, c) in text[open..].char_indices() {
        if in_comment {
            in_comment = c != '\n';
            continue;
        }
        match c {
            '/' if !in_string && bytes.get(open + i + 1) == Some(&b'/') => in_comment = true,
            '\'' => in_string = !in_string,
            '{' if !in_string => depth += 1,
            '}' if !in_string => {
                depth -= 1;
                if depth == 0 {
                    return &text[start..open + i + 1];
                }
            }
            _ => {}
        }
    }
    panic!("unclosed block: {marker}")
}

/// Every `resource NAME 'TYPE@…'` block of `text` whose type is `kind`.
fn resources<'a>(text: &'a str, kind: &str) -> Vec<&'a str> {
    let marker = format!("'{kind}@");
    text.match_indices(&marker)
        .map(|(i, _)| {
            let line_start = text[..i].rfind('\n').map_or(0, |n| n + 1);
            block(&text[line_start..], &text[line_start..i])
        })
        .collect()
}

/// The first-level `key: value` lines of an object block (values on one
/// line; comments skipped).
fn entries(object: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let body = &object[object.find('{').unwrap() + 1..object.rfind('}').unwrap()];
    let mut depth = 0;
    for line in body.lines() {
        let trimmed = line.trim();
        if depth == 0 && !trimmed.starts_with("//") {
            if let Some((key, value)) = trimmed.split_once(": ") {
                out.insert(key.trim().to_string(), value.trim().to_string());
            }
        }
        depth += trimmed.matches('{').count() as i32 - trimmed.matches('}').count() as i32;
    }
    out
}

/// A `var NAME = 'value'` of `text`.
fn string_var(text: &str, name: &str) -> String {
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("var {name} = '")))
        .unwrap_or_else(|| panic!("var {name} not found"));
    line.split('\'').nth(1).unwrap().to_string()
}

/// What the template fills in at deployment, as it would be there.
const CLIENT_ID: &str = "6a1e2b3c-0000-4000-8000-00000000c11d";
const TOKEN: &str = "abc123xyz4567";

/// A Bicep value of the app's settings, evaluated: a string with `${…}`
/// holes filled from `names`, `join(x, ',')`, or a name.
fn evaluate(value: &str, names: &BTreeMap<&str, String>) -> String {
    if let Some(literal) = value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')) {
        let mut out = String::new();
        let mut rest = literal;
        while let Some(i) = rest.find("${") {
            out.push_str(&rest[..i]);
            let end = rest[i..].find('}').unwrap() + i;
            out.push_str(&evaluate(&rest[i + 2..end], names));
            rest = &rest[end + 1..];
        }
        out.push_str(rest);
        return out;
    }
    if let Some(inner) = value
        .strip_prefix("join(")
        .and_then(|v| v.strip_suffix(", ',')"))
    {
        return evaluate(inner, names);
    }
    names
        .get(value)
        .cloned()
        .unwrap_or_else(|| panic!("the test does not know what {value} is at deployment"))
}

/// The values main.bicep and app.bicep's parameters take at deployment.
fn deployed_names() -> BTreeMap<&'static str, String> {
    let main = read("infra/main.bicep");
    let event_types: Vec<String> = main
        .split("param orderEventTypes array = [")
        .nth(1)
        .expect("param orderEventTypes")
        .split(']')
        .next()
        .unwrap()
        .lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix('\'')?
                .strip_suffix('\'')
                .map(String::from)
        })
        .collect();
    let data_storage = evaluate(
        &main
            .lines()
            .find_map(|l| l.strip_prefix("var dataStorageName = "))
            .unwrap()
            .replace("${resourceToken}", TOKEN),
        &BTreeMap::new(),
    );
    let mut names = BTreeMap::from([
        ("identityClientId", CLIENT_ID.to_string()),
        ("redisHostName", format!("redis-{TOKEN}.westeurope.redis.azure.net")),
        ("sqlServerFqdn", format!("sql-{TOKEN}.database.windows.net")),
        ("sqlDatabaseName", "orders".to_string()),
        ("orderEventTypes", event_types.join(",")),
        ("appInsightsConnectionString", "InstrumentationKey=00000000-0000-0000-0000-000000000000;IngestionEndpoint=https://westeurope-5.in.applicationinsights.azure.com/".to_string()),
        ("hostStorage.properties.primaryEndpoints.blob", format!("https://sthost{TOKEN}.blob.core.windows.net/")),
        ("hostStorage.properties.primaryEndpoints.queue", format!("https://sthost{TOKEN}.queue.core.windows.net/")),
        ("hostStorage.properties.primaryEndpoints.table", format!("https://sthost{TOKEN}.table.core.windows.net/")),
        ("environment().suffixes.storage", "core.windows.net".to_string()),
        ("dataStorageName", data_storage),
        // The pool app.bicep works out for the default tier, S0 (60
        // workers) and 40 instances: (40 + 1) × 1 ≤ 60 − 10.
        ("sqlPoolSize", "1".to_string()),
    ]);
    for var in ["deadLetterStorage", "outboxStorage"] {
        let value = main
            .lines()
            .find_map(|l| l.strip_prefix(&format!("var {var} = ")))
            .unwrap_or_else(|| panic!("var {var} in main.bicep"));
        let evaluated = evaluate(value, &names);
        names.insert(var, evaluated);
    }
    // The database's name is data.bicep's.
    let data = read("infra/app/data.bicep");
    let database = entries(block(
        &data,
        "resource database 'Microsoft.Sql/servers/databases@",
    ));
    assert_eq!(database["name"], "'orders'");
    names
}

/// The app's settings on Flex Consumption: the handler's and the host's.
fn flex_settings() -> BTreeMap<String, String> {
    let app = read("infra/app/app.bicep");
    assert!(
        app.contains("properties: union(handlerSettings, hostSettings)"),
        "the app's settings are the handler's and the host's"
    );
    let names = deployed_names();
    let mut settings = BTreeMap::new();
    for var in ["var handlerSettings", "var hostSettings"] {
        for (k, v) in entries(block(&app, var)) {
            settings.insert(k, evaluate(&v, &names));
        }
    }
    settings
}

/// What Flex Consumption refuses among app settings (its runtime, package
/// and content settings live in functionAppConfig), and what the handler
/// must never get in Azure.
const REFUSED: [&str; 9] = [
    "FUNCTIONS_WORKER_RUNTIME",
    "FUNCTIONS_EXTENSION_VERSION",
    "WEBSITE_RUN_FROM_PACKAGE",
    "WEBSITE_CONTENTAZUREFILECONNECTIONSTRING",
    "WEBSITE_CONTENTSHARE",
    "WEBSITE_NODE_DEFAULT_VERSION",
    "WEBSITE_USE_PLACEHOLDER_DOTNETISOLATED",
    "AzureWebJobsStorage",
    "ORDER_GUARD_ALLOW_EMBEDDED_STATE",
];

#[test]
fn the_apps_settings_are_a_configuration_the_handler_accepts_on_flex() {
    let settings = flex_settings();
    for refused in REFUSED {
        assert!(
            !settings.contains_key(refused),
            "{refused} is set; Flex Consumption or the handler refuses it"
        );
    }
    // Flex's own environment, as its platform sets it for the handler.
    let mut env: BTreeMap<String, String> = settings.clone();
    for (k, v) in [
        ("WEBSITE_SKU", "FlexConsumption"),
        ("FUNCTIONS_WORKER_RUNTIME", "custom"),
        ("CONTAINER_NAME", "orderguard"),
        ("LEGION_SERVICE_HOST", "10.0.0.4"),
        ("IDENTITY_ENDPOINT", "http://localhost:8081/msi/token"),
        ("IDENTITY_HEADER", "header"),
    ] {
        env.insert(k.into(), v.into());
    }
    let config = Config::from_lookup(|k| env.get(k).cloned())
        .unwrap_or_else(|e| panic!("the handler refuses the template's settings: {e}"));
    assert!(
        config.defaulted_state.is_empty(),
        "{:?}",
        config.defaulted_state
    );

    // Redis: Entra ID as the identity, one endpoint.
    match &config.guard {
        GuardConfig::Redis { cluster, auth, .. } => {
            assert!(!cluster);
            assert_eq!(
                auth,
                &RedisAuth::EntraId {
                    client_id: Some(CLIENT_ID.into())
                }
            );
        }
        other => panic!("the guard is {other:?}, not Redis"),
    }
    // SQL: the identity's managed-identity token.
    let StoreConfig::SqlServer { connection_string } = &config.store else {
        panic!("the store is not SQL Server");
    };
    let info = SqlConnInfo::parse(connection_string).unwrap();
    assert_eq!(
        info.auth,
        Auth::ManagedIdentity {
            client_id: Some(CLIENT_ID.into())
        }
    );
    assert_eq!(info.database.as_deref(), Some("orders"));
    // The container and the queue, by Entra ID, under the code's names.
    let dead_letter = config.dead_letter.as_ref().expect("DEAD_LETTER_STORAGE");
    assert_eq!(dead_letter.container, DEFAULT_DEAD_LETTER_CONTAINER);
    let named = Credential::EntraId {
        client_id: Some(CLIENT_ID.into()),
    };
    assert_eq!(dead_letter.storage.credential, named);
    match &config.outbox.destination {
        Some(DestinationSettings::Queue(queue)) => {
            assert_eq!(queue.queue, DEFAULT_OUTBOX_QUEUE);
            assert_eq!(queue.storage.credential, named);
        }
        _ => panic!("announcements do not go to the queue"),
    }
    // The clients that name no identity of their own take AZURE_CLIENT_ID;
    // the host's storage and Application Insights are signed in to with it.
    for (k, v) in [
        ("AZURE_CLIENT_ID", CLIENT_ID.to_string()),
        ("AzureWebJobsStorage__credential", "managedidentity".into()),
        ("AzureWebJobsStorage__clientId", CLIENT_ID.into()),
        (
            "APPLICATIONINSIGHTS_AUTHENTICATION_STRING",
            format!("Authorization=AAD;ClientId={CLIENT_ID}"),
        ),
    ] {
        assert_eq!(settings.get(k), Some(&v), "{k}");
    }
    // The host's storage by the one role the identity holds there (Blob
    // Data Owner): no queue or table endpoint it could not use.
    for k in [
        "AzureWebJobsStorage__queueServiceUri",
        "AzureWebJobsStorage__tableServiceUri",
    ] {
        assert!(!settings.contains_key(k), "{k} is set without its role");
    }
    assert_eq!(settings.get("SQL_POOL_SIZE").map(String::as_str), Some("1"));
    for k in [
        "AzureWebJobsStorage__blobServiceUri",
        "APPLICATIONINSIGHTS_CONNECTION_STRING",
        // Read by the host: without it DeadLetterSweep is not indexed, and
        // nothing sends the outbox on a plan scaled to zero.
        "DEAD_LETTER_SWEEP_SCHEDULE",
    ] {
        assert!(settings.contains_key(k), "{k} is not set");
    }
}

#[test]
fn flex_runs_the_custom_handler_from_a_container_signed_in_with_the_identity() {
    let app = read("infra/app/app.bicep");
    let flex = block(&app, "var flexConfig");
    let runtime = entries(block(flex, "runtime:"));
    assert_eq!(runtime["name"], "'custom'");
    assert_eq!(runtime["version"], "'1.0'");
    let auth = entries(block(flex, "authentication:"));
    assert_eq!(auth["type"], "'UserAssignedIdentity'");
    assert_eq!(auth["userAssignedIdentityResourceId"], "identityId");
    assert!(app.contains("functionAppConfig: flexConfig"));
    // Flex only: Premium without an Azure Files share runs a package only
    // from its blob URL, which azd's deploy does not set.
    let main = read("infra/main.bicep");
    for gone in ["planSku", "EP1"] {
        assert!(!main.contains(gone), "main.bicep still has {gone}");
    }
    assert!(!app.contains("premiumSettings") && !app.contains("ftpsState:"));
}

/// The built-in roles' ids, as Azure defines them.
const ROLES: [(&str, &str); 6] = [
    (
        "Storage Blob Data Owner",
        "b7e6dc6d-f1e8-4753-8033-0f276bb0955b",
    ),
    (
        "Storage Blob Data Contributor",
        "ba92f5b4-2d11-453d-a403-e96b0029c9fe",
    ),
    (
        "Storage Queue Data Message Sender",
        "c6a89b2d-59bc-44d0-9896-0f6e12d7b80a",
    ),
    (
        "Storage Queue Data Contributor",
        "974c5e8b-45b9-4653-ba55-5f855dd0fb88",
    ),
    (
        "Monitoring Metrics Publisher",
        "3913510d-42f4-4e42-8a64-420c390055eb",
    ),
    (
        "EventGrid Data Sender",
        "d5a91429-5739-47e2-a06b-3470a27159e7",
    ),
];

/// (role name, scope, principal) of each role assignment of a module.
fn role_assignments(text: &str) -> Vec<(String, String, String)> {
    resources(text, "Microsoft.Authorization/roleAssignments")
        .into_iter()
        .map(|r| {
            let top = entries(r);
            let props = entries(block(r, "properties:"));
            let var = props["roleDefinitionId"]
                .split(", ")
                .nth(1)
                .unwrap()
                .trim_end_matches(')')
                .to_string();
            let id = string_var(text, &var);
            let role = ROLES
                .iter()
                .find(|(_, g)| *g == id)
                .unwrap_or_else(|| panic!("{var} = {id} is not a role the test knows"))
                .0;
            (
                role.to_string(),
                top["scope"].clone(),
                props["principalId"].clone(),
            )
        })
        .collect()
}

#[test]
fn each_role_is_on_what_its_client_uses() {
    let messaging = read("infra/app/messaging.bicep");
    let roles = role_assignments(&messaging);
    let app_roles: Vec<(&str, &str)> = roles
        .iter()
        .filter(|(_, _, who)| who == "identityPrincipalId")
        .map(|(role, scope, _)| (role.as_str(), scope.as_str()))
        .collect();
    // DEAD_LETTER_STORAGE names the container, OUTBOX_STORAGE the queue:
    // the roles are there, and nowhere wider on the account.
    assert_eq!(
        app_roles,
        [
            (
                "Storage Blob Data Contributor",
                "storage::blobs::deadLetters"
            ),
            (
                "Storage Queue Data Message Sender",
                "storage::queues::announcements"
            ),
        ]
    );
    assert_eq!(
        string_var(&messaging, "deadLetterContainer"),
        DEFAULT_DEAD_LETTER_CONTAINER
    );
    assert_eq!(
        string_var(&messaging, "announcementsQueue"),
        DEFAULT_OUTBOX_QUEUE
    );
    let settings = flex_settings();
    assert!(settings["DEAD_LETTER_STORAGE"].ends_with(&format!(
        ".blob.core.windows.net/{DEFAULT_DEAD_LETTER_CONTAINER}"
    )));
    assert!(settings["OUTBOX_STORAGE"]
        .ends_with(&format!(".queue.core.windows.net/{DEFAULT_OUTBOX_QUEUE}")));
    // The settings' account is the one the roles are on.
    let main = read("infra/main.bicep");
    assert!(main.contains("storageName: dataStorageName"));
    assert!(block(&messaging, "resource storage 'Microsoft.Storage").contains("name: storageName"));

    // The operator: the container (dead-letters replay), the queue (reading
    // announcements, outbox dispatch), the topic (the smoke test).
    let operator: Vec<(&str, &str)> = roles
        .iter()
        .filter(|(_, _, who)| who == "operatorPrincipalId")
        .map(|(role, scope, _)| (role.as_str(), scope.as_str()))
        .collect();
    assert_eq!(
        operator,
        [
            (
                "Storage Blob Data Contributor",
                "storage::blobs::deadLetters"
            ),
            (
                "Storage Queue Data Contributor",
                "storage::queues::announcements"
            ),
            ("EventGrid Data Sender", "topic"),
        ]
    );

    // The Functions host: its own account (AzureWebJobsStorage, the package).
    let app = read("infra/app/app.bicep");
    assert_eq!(
        role_assignments(&app),
        [(
            "Storage Blob Data Owner".to_string(),
            "hostStorage".to_string(),
            "identityPrincipalId".to_string()
        )]
    );
    assert!(settings["AzureWebJobsStorage__blobServiceUri"].contains("sthost"));
    // Application Insights: ingestion with the identity's token.
    let monitoring = read("infra/app/monitoring.bicep");
    assert_eq!(
        role_assignments(&monitoring),
        [(
            "Monitoring Metrics Publisher".to_string(),
            "appInsights".to_string(),
            "identityPrincipalId".to_string()
        )]
    );

    // Redis: an access policy assignment for the identity, keys off.
    let data = read("infra/app/data.bicep");
    let app_policy = entries(block(
        block(&data, "resource app 'accessPolicyAssignments'"),
        "user:",
    ));
    assert_eq!(app_policy["objectId"], "identityPrincipalId");
    assert!(data.contains("accessKeysAuthentication: 'Disabled'"));
}

#[test]
fn local_authentication_is_off_everywhere() {
    let data = read("infra/app/data.bicep");
    let admins = entries(block(&data, "administrators:"));
    assert_eq!(admins["azureADOnlyAuthentication"], "true");
    // A user's SID is its object id, an application's its client id (the
    // login name the preprovision hook gives a service principal).
    assert_eq!(
        admins["sid"],
        "adminPrincipalType == 'User' ? adminObjectId : adminLogin"
    );
    for module in ["infra/app/app.bicep", "infra/app/messaging.bicep"] {
        let text = read(module);
        for account in resources(&text, "Microsoft.Storage/storageAccounts") {
            assert_eq!(
                entries(block(account, "properties:"))["allowSharedKeyAccess"],
                "false",
                "{module}"
            );
        }
    }
    let monitoring = read("infra/app/monitoring.bicep");
    let insights = resources(&monitoring, "Microsoft.Insights/components");
    assert_eq!(
        entries(block(insights[0], "properties:"))["DisableLocalAuth"],
        "true"
    );
    let messaging = read("infra/app/messaging.bicep");
    let topic = resources(&messaging, "Microsoft.EventGrid/topics");
    assert_eq!(
        entries(block(topic[0], "properties:"))["disableLocalAuth"],
        "true"
    );
}

/// The subscription is the postdeploy hook's (Event Grid checks that
/// OrderTrigger exists, so the template cannot make it before the
/// package is deployed); tests/deploy_rehearsal/hooks.rs reads what the
/// hook PUTs. The template leaves it out, and gives the hook the ids it
/// needs.
#[test]
fn the_subscription_delivers_the_handlers_event_types_to_order_trigger() {
    let messaging = read("infra/app/messaging.bicep");
    assert!(
        resources(&messaging, "Microsoft.EventGrid/topics/eventSubscriptions").is_empty(),
        "the template makes the subscription before OrderTrigger exists"
    );
    let main = read("infra/main.bicep");
    assert!(!main.contains("orderSubscription"));
    let hook = read("infra/hooks/postdeploy.sh");
    for output in [
        "EVENT_GRID_TOPIC_ID",
        "AZURE_FUNCTION_APP_ID",
        "AZURE_IDENTITY_ID",
        "DEAD_LETTER_CONTAINER_ID",
        "ORDER_EVENT_TYPES",
        "AZURE_SUBSCRIPTION_ID",
    ] {
        assert!(
            hook.contains(output),
            "postdeploy.sh does not read {output}"
        );
        assert!(
            main.contains(&format!("output {output} ")),
            "main.bicep has no output {output}"
        );
    }
    assert!(hook.contains("/functions/OrderTrigger"));
    assert!(Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("OrderTrigger/function.json")
        .exists());
    assert!(hook.contains("\"maxDeliveryAttempts\": 30, \"eventTimeToLiveInMinutes\": 1440"));

    // The event types: the handler's setting, the samples', the manual path's.
    let settings = flex_settings();
    let types = &settings["ORDER_EVENT_TYPES"];
    let samples: serde_json::Value = serde_json::from_str(&read("samples/delivery.json")).unwrap();
    for event in samples.as_array().unwrap() {
        let t = event["eventType"].as_str().unwrap();
        assert!(types.split(',').any(|x| x == t), "{t} is not in {types}");
    }
    assert!(read("docs/deploy.md").contains(&format!("\"ORDER_EVENT_TYPES={types}\"")));
    assert!(read("docs/deploy.md").contains(&format!("\"includedEventTypes\": [\"{types}\"]")));
}

#[test]
fn the_outputs_are_the_settings_an_operator_exports() {
    let main = read("infra/main.bicep");
    let outputs: Vec<&str> = main
        .lines()
        .filter_map(|l| l.strip_prefix("output ")?.split(' ').next())
        .collect();
    let settings = flex_settings();
    // docs/deploy.md step 10's exports, by name.
    let deploy = read("docs/deploy.md");
    let step_10 = deploy
        .split("**10. ")
        .nth(1)
        .unwrap()
        .split("**11. ")
        .next()
        .unwrap();
    let exports = step_10
        .split("\nexport ")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    for name in [
        "REDIS_URL",
        "REDIS_AUTH",
        "REDIS_CLUSTER",
        "SQL_CONNECTION_STRING",
        "DEAD_LETTER_STORAGE",
        "OUTBOX_STORAGE",
    ] {
        assert!(outputs.contains(&name), "no output {name}");
        assert!(settings.contains_key(name), "{name} is not an app setting");
        assert!(
            exports.contains(&format!("{name}=")),
            "step 10 does not export {name}"
        );
    }
    // The operator signs in to SQL as themselves, not as the app's identity.
    let sql = main
        .lines()
        .find(|l| l.starts_with("output SQL_CONNECTION_STRING"))
        .unwrap();
    assert!(
        sql.contains("Authentication=Active Directory Default"),
        "{sql}"
    );
}

#[test]
fn azure_yaml_runs_hooks_that_are_there() {
    let yaml = read("azure.yaml");
    assert!(yaml.contains("language: custom") && yaml.contains("host: function"));
    let mut hooks = 0;
    for line in yaml.lines() {
        // The Windows variants run the same scripts through bash.ps1
        // (tests/deploy_rehearsal/hooks.rs).
        if let Some(path) = line
            .trim()
            .strip_prefix("run: ")
            .filter(|p| !p.contains("bash.ps1"))
        {
            let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&full)
                .unwrap_or_else(|e| panic!("{path}: {e}"))
                .permissions()
                .mode();
            assert!(mode & 0o111 != 0, "{path} is not executable");
            hooks += 1;
        }
    }
    assert_eq!(hooks, 4);
    // postprovision makes the app's user in the role migrate makes.
    let post = read("infra/hooks/postprovision.sh");
    assert!(post.contains("-- migrate"));
    assert!(post.contains("ALTER ROLE order_guard_app ADD MEMBER [$AZURE_IDENTITY_NAME]"));
}

/// The handler's source, every `.rs` file under `src/`, as one text.
fn source_text() -> String {
    fn walk(dir: &Path, text: &mut String) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, text);
            } else if path.extension().is_some_and(|e| e == "rs") {
                text.push_str(&std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    let mut text = String::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut text,
    );
    text
}

/// Each alert on Application Insights matches what the handler emits: every
/// string its query compares with (a metric's name, an attribute and its
/// value, words of a log line) is in the handler's source, so a rename
/// there cannot leave a rule that never fires.
#[test]
fn the_alerts_look_for_what_the_handler_emits() {
    let alerts = read("infra/app/alerts.bicep");
    let source = source_text();
    // The log alerts' rules (the workbook's queries are views: their
    // strings are labels as much as matches).
    let start = alerts.find("var logAlerts").expect("var logAlerts");
    let end = start
        + alerts[start..]
            .find("resource ")
            .expect("the rules' resource");
    let mut queries = 0;
    for (i, part) in alerts[start..end].split("'''").enumerate() {
        // The multi-line strings: the odd parts between ''' pairs.
        if i % 2 == 0 || !part.contains("| where") {
            continue;
        }
        queries += 1;
        for (j, literal) in part.split('"').enumerate() {
            if j % 2 == 1 {
                // A line's prefix may be a constant formatted in
                // (`{FUNCTION_NAME}: {summary}`): each side of it then.
                let found = source.contains(literal)
                    || literal
                        .split_once(": ")
                        .is_some_and(|(a, b)| source.contains(a) && source.contains(b));
                assert!(
                    found,
                    "an alert's query looks for {literal:?}, which the handler never emits:\n{part}"
                );
            }
        }
    }
    assert!(queries >= 4, "the log alerts' queries were not found");
    // A workbook and an alert on each of what needs an operator.
    for name in [
        "'dead-lettered'",
        "'operator-needed'",
        "'parked'",
        "'outbox-behind'",
        "'retries'",
    ] {
        assert!(alerts.contains(&format!("name: {name}")), "no alert {name}");
    }
    assert!(!resources(&alerts, "Microsoft.Insights/workbooks").is_empty());
    assert!(read("infra/main.bicep").contains("module alerts 'app/alerts.bicep'"));
}
