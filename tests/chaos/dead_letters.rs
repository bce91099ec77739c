//! Dead letters: Event Grid's last resort, and the sweep that replays them.
//!
//! Some deliveries run on a short retry budget ([`SHORT_ATTEMPTS`], as a
//! subscription with `--max-delivery-attempts 2` would); one that exhausts
//! it is dead-lettered by the harness as Event Grid does: the published
//! event plus Event Grid's dead-letter fields, in a JSON array, in a blob
//! named `<SUBSCRIPTION>/<yyyy>/<M>/<d>/<H>/<guid>.json` in Azurite. After the
//! run, `order-guard dead-letters replay` (the CLI, on the run's store and
//! Redis) replays every blob, and again while one is left, as the timer
//! function would every 5 minutes (a blob whose order a killed worker still
//! holds is answered `in_progress` and left until its owner's deadline has
//! passed); the audit then expects every order executed exactly once, its
//! `executed` answers from deliveries and from the sweeps counted together.

use super::*;

use order_guard::deadletter::Container;

/// The retry budget of a short delivery.
pub(crate) const SHORT_ATTEMPTS: u32 = 2;
/// The share of eligible deliveries on the short budget.
const SHORT_SHARE: f64 = 0.15;
/// The dead-letter container in Azurite.
pub(crate) const CONTAINER: &str = "deadletters";
/// The subscription name in the blob names, upper case as Event Grid writes it.
const SUBSCRIPTION: &str = "CHAOS-ORDERS";

/// Put a share of the single-order deliveries on the short budget. Only
/// orders without a conflicting twin: a twin is sent once its order's own
/// deliveries are done, acknowledged or given up, and one sent before the
/// order was ever executed would take its id (Event Grid's order of events
/// is the publisher's problem; the audit's would not be the product's).
pub(crate) fn shorten_budgets(plan: &mut Plan, rng: &mut StdRng) -> usize {
    let twinned: HashSet<usize> = plan.conflicts.iter().map(|c| c.order).collect();
    let mut short = 0;
    for d in &mut plan.deliveries {
        let single = match d.expects.as_slice() {
            [Expect::Order(i)] => !twinned.contains(i),
            _ => false,
        };
        if single && !d.batch && d.after_ack_of.is_none() && rng.gen_bool(SHORT_SHARE) {
            d.max_attempts = SHORT_ATTEMPTS;
            short += 1;
        }
    }
    short
}

/// The event as its publisher sent it: the trigger without the host's
/// string wrappings.
fn published(trigger: &Value) -> Value {
    let mut v = trigger.clone();
    while let Value::String(s) = &v {
        v = serde_json::from_str(s).expect("a stringified event is JSON");
    }
    v
}

/// The blob Event Grid writes for `d` after `attempts` failed attempts.
fn blob(d: &Delivery, attempts: u32, last_status: u16) -> Value {
    let mut event = published(&d.trigger);
    let t = time::OffsetDateTime::now_utc();
    let now = format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    );
    let o = event.as_object_mut().expect("one event");
    if o.contains_key("specversion") {
        o.insert(
            "deadletterreason".into(),
            json!("MaxDeliveryAttemptsExceeded"),
        );
        o.insert("deliveryattempts".into(), json!(attempts));
        o.insert("lastdeliveryoutcome".into(), json!("Busy"));
        o.insert("publishtime".into(), json!(now));
        o.insert("lastdeliveryattempttime".into(), json!(now));
    } else {
        o.insert(
            "deadLetterReason".into(),
            json!("MaxDeliveryAttemptsExceeded"),
        );
        o.insert("deliveryAttempts".into(), json!(attempts));
        o.insert("lastDeliveryOutcome".into(), json!("Busy"));
        o.insert("lastHttpStatusCode".into(), json!(last_status));
        o.insert("publishTime".into(), json!(now));
        o.insert("lastDeliveryAttemptTime".into(), json!(now));
    }
    Value::Array(vec![event])
}

/// `<SUBSCRIPTION>/<yyyy>/<M>/<d>/<H>/<guid>.json`, UTC, not zero-padded.
fn blob_name() -> String {
    let now = time::OffsetDateTime::now_utc();
    format!(
        "{SUBSCRIPTION}/{}/{}/{}/{}/{}.json",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        uuid::Uuid::new_v4()
    )
}

/// Write `d`'s dead letter into `container`.
pub(crate) async fn dead_letter(container: &Container, d: &Delivery, last_status: u16) {
    let content = blob(d, d.max_attempts, last_status).to_string();
    let written = container
        .put_new(&blob_name(), bytes::Bytes::from(content))
        .await
        .expect("writing a dead letter into Azurite");
    assert!(written, "a dead-letter blob name was taken");
}

/// What the sweep did.
pub(crate) struct SweepReport {
    /// Its summary line (`blobs=… events=… executed=… … moved=…`).
    pub(crate) summary: String,
    /// A field of the summary line.
    pub(crate) fields: HashMap<String, u64>,
    /// The order ids it answered `executed`, one entry per answer.
    pub(crate) executed: Vec<String>,
    pub(crate) succeeded: bool,
    pub(crate) output: String,
}

/// Sweeps at most this many times.
const SWEEPS: usize = 4;

/// Every sweep run until none left a blob (or [`SWEEPS`] ran).
pub(crate) struct Sweeps(pub(crate) Vec<SweepReport>);

impl Sweeps {
    /// A summary field, summed over the sweeps.
    pub(crate) fn total(&self, field: &str) -> u64 {
        self.0
            .iter()
            .map(|r| r.fields.get(field).copied().unwrap_or(0))
            .sum()
    }

    /// Events that got a final outcome, over the sweeps.
    pub(crate) fn replayed(&self) -> u64 {
        ["executed", "duplicates", "conflicts", "rejected"]
            .iter()
            .map(|f| self.total(f))
            .sum()
    }

    /// Whether the last sweep finished every blob.
    pub(crate) fn finished(&self) -> bool {
        self.0
            .last()
            .is_some_and(|r| r.succeeded && r.fields.get("unresolved").copied() == Some(0))
    }
}

/// Sweep, and again after an owner's deadline while a blob is left.
pub(crate) async fn sweep_until_done(
    binary: &Path,
    env: &[(String, String)],
    app_root: &Path,
) -> Sweeps {
    let mut sweeps = Sweeps(Vec::new());
    while sweeps.0.len() < SWEEPS {
        if !sweeps.0.is_empty() {
            // The timer's next run, compressed: past the lease of a
            // reservation a killed worker left (its owner's deadline).
            tokio::time::sleep(Duration::from_millis(DEADLINE_MS + 1_000)).await;
        }
        sweeps.0.push(sweep(binary, env, app_root).await);
        if sweeps.finished() {
            break;
        }
    }
    sweeps
}

/// Run `order-guard dead-letters replay` with the handlers' settings.
pub(crate) async fn sweep(binary: &Path, env: &[(String, String)], app_root: &Path) -> SweepReport {
    let mut cmd = tokio::process::Command::new(binary);
    cmd.args(["dead-letters", "replay"])
        .kill_on_drop(true)
        .current_dir(app_root)
        .env_remove("FAILPOINTS")
        .env("RUST_LOG", "info");
    for (k, v) in env.iter().filter(|(k, _)| k != "FAILPOINTS") {
        cmd.env(k, v);
    }
    // A topology on an embedded default (the memory guard) replays into it
    // on purpose: the CLI refuses that without the flag.
    let set = |var: &str| env.iter().any(|(k, v)| k == var && !v.trim().is_empty());
    if !set("REDIS_URL") || !set("SQL_CONNECTION_STRING") {
        cmd.arg("--allow-embedded-state");
    }
    let out = tokio::time::timeout(Duration::from_secs(300), cmd.output())
        .await
        .expect("the dead-letter sweep ran for 5 minutes")
        .expect("cannot run order-guard dead-letters replay");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let summary = stdout
        .lines()
        .rfind(|l| l.starts_with("blobs="))
        .unwrap_or("")
        .to_string();
    let fields = summary
        .split(' ')
        .filter_map(|kv| kv.split_once('='))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect();
    let executed = stdout
        .lines()
        .filter(|l| l.contains(" outcome=executed "))
        .filter_map(|l| {
            let rest = l.split(" order_id=\"").nth(1)?;
            Some(rest.split('"').next()?.to_string())
        })
        .collect();
    SweepReport {
        summary,
        fields,
        executed,
        succeeded: out.status.success(),
        output: format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)),
    }
}
