//! Load generator for `scripts/bench.sh` (see docs/benchmarks.md).
//!
//! Two modes:
//!
//! - `bench ceiling-server --port P`: a bare warp server that reads the same
//!   invocation and answers a fixed host-shaped JSON body with no work: the
//!   HTTP ceiling, a separate process like the handler.
//! - `bench run …`: drives the handler over real HTTP with host-shaped
//!   invocations (docs/host-protocol.md, "One invocation") and measures, in rounds that
//!   interleave every figure with its ceilings: the HTTP ceiling, raw
//!   `SET key val NX EX 300` round trips with redis-rs (the Redis ceiling),
//!   durable SQLite commits (the commit ceiling), the first-delivery path and
//!   the duplicate path (answered from the handler's cache of finished orders,
//!   and, on a second handler with that cache off, through Redis), at
//!   concurrency 1 and 32; then the handler's peak RSS and the cold start
//!   (median of N starts). Beside each figure, the CPU time (user + system,
//!   from `/proc/<pid>/stat`) the process serving it spent per operation in
//!   the measured window: the handler per event, bare warp per request,
//!   redis-server per command. Writes `results.json` and one PNG latency plot
//!   per path into `--out`, and prints a table.
//!
//! Every loop is bounded in time and count; it only talks to loopback.

mod ceiling;
mod cpu;
mod invocations;
mod phases;
mod plots;
mod process;
mod results;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use hdrhistogram::Histogram;
use hyper::client::conn::SendRequest;
use hyper::{Body, Request, StatusCode};
use serde::Serialize;
use tokio::net::TcpStream;

use ceiling::*;
use cpu::*;
use invocations::*;
use phases::*;
use plots::*;
use process::*;
use results::*;

/// Never run a phase past this many operations, whatever its duration.
const MAX_OPS_PER_PHASE: u64 = 2_000_000;
/// Give up on a phase after this many failed operations.
const MAX_ERRORS: u64 = 20;

#[derive(Parser)]
#[command(about = "order-guard load generator (run through scripts/bench.sh)")]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand)]
enum Mode {
    /// The HTTP ceiling: read the invocation, answer a fixed body, no work.
    CeilingServer {
        #[arg(long)]
        port: u16,
    },
    /// An OTLP/HTTP collector that takes every export (for the handler with
    /// telemetry on).
    OtlpSink {
        #[arg(long)]
        port: u16,
    },
    /// Measure everything and write the results.
    Run(Box<Opts>),
}

#[derive(Parser, Clone)]
struct Opts {
    /// The handler under test (`order-guard serve`), e.g. 127.0.0.1:7071.
    #[arg(long)]
    handler: SocketAddr,
    /// Its process id, for the peak RSS and CPU per event.
    #[arg(long)]
    handler_pid: u32,
    /// A second handler on the same Redis with its cache of finished orders
    /// off (`ORDER_CACHE_MB=0`): the duplicate path through Redis.
    #[arg(long)]
    redis_handler: SocketAddr,
    /// Its process id.
    #[arg(long)]
    redis_handler_pid: u32,
    /// The ceiling server (`bench ceiling-server`).
    #[arg(long)]
    ceiling: SocketAddr,
    /// Its process id, for CPU per request.
    #[arg(long)]
    ceiling_pid: u32,
    /// The redis-server the handler uses.
    #[arg(long)]
    redis_url: String,
    /// Its process id, for CPU per command.
    #[arg(long)]
    redis_pid: u32,
    /// The `order-guard` binary, started again for the cold-start figure.
    #[arg(long)]
    binary: PathBuf,
    /// Scratch directory on the same file system as the handler's database.
    #[arg(long)]
    scratch: PathBuf,
    /// Where results.json and the plots go.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Measured seconds per phase (after the warm-up).
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Unmeasured warm-up seconds at the start of each phase.
    #[arg(long, default_value_t = 0.3)]
    warmup: f64,
    /// Rounds of interleaved phases per concurrency.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Concurrency levels.
    #[arg(long, value_delimiter = ',', default_value = "1,32")]
    concurrency: Vec<usize>,
    /// Cold starts to take the median of.
    #[arg(long, default_value_t = 20)]
    cold_starts: usize,
    /// A second handler on the SQL Server store (the T-SQL engine), measured
    /// beside the SQLite one when given.
    #[arg(long)]
    sqlserver_handler: Option<SocketAddr>,
    /// Its process id.
    #[arg(long)]
    sqlserver_handler_pid: Option<u32>,
    /// The ADO.NET string of that handler's database, for the round-trip
    /// ceiling (`SELECT 1` on a connection of our own per worker).
    #[arg(long)]
    sqlserver: Option<String>,
    /// A third handler whose guard is a Redis cluster (`REDIS_CLUSTER=true`,
    /// three masters and three replicas on loopback): its duplicate path is
    /// measured beside the single node's, in the same rounds.
    #[arg(long)]
    cluster_handler: Option<SocketAddr>,
    /// Its process id.
    #[arg(long)]
    cluster_handler_pid: Option<u32>,
    /// A handler configured as `--handler` plus an OTLP exporter
    /// (`OTEL_EXPORTER_OTLP_ENDPOINT`, `bench otlp-sink`): its first
    /// deliveries and duplicates are measured beside the plain handler's, in
    /// the same rounds, for the CPU telemetry costs per event.
    #[arg(long)]
    telemetry_handler: Option<SocketAddr>,
    /// Its process id.
    #[arg(long)]
    telemetry_handler_pid: Option<u32>,
    /// `order-guard webhook` on the same Redis and a SQLite file of its own:
    /// Event Grid's own door, measured beside the Functions door in the
    /// same rounds.
    #[arg(long)]
    webhook_handler: Option<SocketAddr>,
    /// Its process id.
    #[arg(long)]
    webhook_handler_pid: Option<u32>,
    /// The bearer token every delivery to the webhook carries (Microsoft
    /// Entra ID on: a token of scripts/bench.sh's local issuer); none with
    /// `WEBHOOK_AUTH=off`.
    #[arg(long)]
    webhook_token: Option<String>,
    /// The local issuer's process id: its key endpoint is stopped
    /// (SIGSTOP) for one more round of the webhook's phases, and resumed.
    #[arg(long)]
    webhook_issuer_pid: Option<u32>,
    /// Events per delivery of the webhook's batch phase.
    #[arg(long, default_value_t = 100)]
    webhook_batch: u64,
}

/// The bearer token of every delivery to the webhook (`--webhook-token`).
pub(crate) static WEBHOOK_TOKEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// `kill -s NAME pid`.
fn signal(pid: u32, name: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .args(["-s", name, &pid.to_string()])
        .status()
        .with_context(|| format!("kill -s {name} {pid}"))?;
    if !status.success() {
        bail!("kill -s {name} {pid}: {status}");
    }
    Ok(())
}

/// How many batch deliveries are in flight in the phase of concurrency
/// `c`: no more than the SQLite writer takes waiting calls
/// ([`order_guard::store::SQLITE_MAX_QUEUED`]), every event a call; past
/// that the handler answers 503 by design (load shed, Event Grid retries),
/// which the phase would count as a failure.
fn batch_concurrency(c: usize, size: u64) -> usize {
    let fits = order_guard::store::SQLITE_MAX_QUEUED as u64 / size.max(1);
    c.min(usize::try_from(fits).unwrap_or(usize::MAX).max(1))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let result = match cli.mode {
        Mode::CeilingServer { port } => runtime.block_on(ceiling_server(port)),
        Mode::OtlpSink { port } => runtime.block_on(otlp_sink(port)),
        Mode::Run(opts) => runtime.block_on(run(*opts)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(opts: Opts) -> anyhow::Result<()> {
    plotters::style::register_font(
        "sans-serif",
        plotters::style::FontStyle::Normal,
        epaint_default_fonts::HACK_REGULAR,
    )
    .map_err(|_| anyhow::anyhow!("the embedded font did not load"))?;
    std::fs::create_dir_all(&opts.out)?;
    std::fs::create_dir_all(&opts.scratch)?;
    if let Some(token) = &opts.webhook_token {
        let _ = WEBHOOK_TOKEN.set(token.clone());
    }
    let unique_keys_down = Arc::new(AtomicU64::new(0));
    let tag: u32 = rand::random();
    let warmup = Duration::from_secs_f64(opts.warmup);
    let measure = Duration::from_secs_f64(opts.seconds);
    let next = Arc::new(AtomicU64::new(0));
    let unique = Arc::new(AtomicU64::new(0));
    let unique_mssql = Arc::new(AtomicU64::new(0));
    let unique_cluster = Arc::new(AtomicU64::new(0));
    let unique_redis = Arc::new(AtomicU64::new(0));
    let unique_otel = Arc::new(AtomicU64::new(0));
    let unique_webhook = Arc::new(AtomicU64::new(0));
    let unique_batch = Arc::new(AtomicU64::new(0));
    let redis = redis::Client::open(opts.redis_url.as_str())?
        .get_multiplexed_async_connection()
        .await
        .context("connecting to redis")?;

    let mut series: BTreeMap<(&str, usize), Series> = BTreeMap::new();
    let sqlite_path = opts.scratch.join("commit-ceiling.db");
    // The processes whose CPU each phase reads.
    let through_redis = [
        ("handler", opts.redis_handler_pid),
        ("redis", opts.redis_pid),
    ];
    for &c in &opts.concurrency {
        for round in 0..opts.rounds {
            eprintln!(
                "bench: concurrency {c}, round {}/{}",
                round + 1,
                opts.rounds
            );
            let mut record =
                |name: &'static str, s: &Sample| series.entry((name, c)).or_default().add(s);
            let s = phase(
                &Work::HttpCeiling { addr: opts.ceiling },
                c,
                warmup,
                measure,
                &next,
                &[("handler", opts.ceiling_pid)],
            )
            .await?;
            record("http_ceiling", &s)?;
            let s = phase(
                &Work::RedisCeiling {
                    conn: redis.clone(),
                    tag,
                },
                c,
                warmup,
                measure,
                &next,
                &[("redis", opts.redis_pid)],
            )
            .await?;
            record("redis_ceiling", &s)?;
            let path = sqlite_path.clone();
            let s = tokio::task::spawn_blocking(move || sqlite_ceiling(&path, warmup, measure))
                .await??;
            record("sqlite_commit_ceiling", &s)?;
            // The handler, and beside it the same with an OTLP exporter, in
            // alternating order: what drifts within a round falls on each in
            // turn, and the two figures divided are taken moments apart.
            let plain = Some((
                opts.handler,
                opts.handler_pid,
                tag,
                &unique,
                ["first_delivery", "duplicate_cache_hit"],
            ));
            let otel = (opts.telemetry_handler.zip(opts.telemetry_handler_pid)).map(|(a, p)| {
                (
                    a,
                    p,
                    tag ^ 0x0e1e_0e1e,
                    &unique_otel,
                    ["first_delivery_otel", "duplicate_otel"],
                )
            });
            let mut pair = [plain, otel];
            if round % 2 == 1 {
                pair.reverse();
            }
            for (addr, pid, tag, unique, [first_name, dup_name]) in pair.into_iter().flatten() {
                let (first, dup) = first_then_duplicates(
                    Door::Functions,
                    addr,
                    tag,
                    c,
                    warmup,
                    measure,
                    unique,
                    &next,
                    &[("handler", pid)],
                )
                .await?;
                record(first_name, &first)?;
                record(dup_name, &dup)?;
            }
            // The same on a handler without the cache: duplicates go to Redis.
            let (_, dup) = first_then_duplicates(
                Door::Functions,
                opts.redis_handler,
                tag ^ 0x1e1e_1e1e,
                c,
                warmup,
                measure,
                &unique_redis,
                &next,
                &through_redis,
            )
            .await?;
            record("duplicate_redis", &dup)?;
            if let (Some(addr), Some(pid)) = (opts.webhook_handler, opts.webhook_handler_pid) {
                let watch = [("handler", pid)];
                let (first, dup) = first_then_duplicates(
                    Door::Webhook,
                    addr,
                    tag ^ 0x7e7e_7e7e,
                    c,
                    warmup,
                    measure,
                    &unique_webhook,
                    &next,
                    &watch,
                )
                .await?;
                record("first_delivery_webhook", &first)?;
                record("duplicate_webhook", &dup)?;
                let s = phase(
                    &Work::WebhookBatch {
                        addr,
                        tag: tag ^ 0x7b7b_7b7b,
                        size: opts.webhook_batch,
                    },
                    batch_concurrency(c, opts.webhook_batch),
                    warmup,
                    measure,
                    &unique_batch,
                    &watch,
                )
                .await?;
                record("webhook_batch", &s)?;
                // The tenant's key endpoint down (SIGSTOP: connections
                // taken, never answered): deliveries signed by the keys
                // held are served as before.
                if let Some(issuer) = opts.webhook_issuer_pid {
                    signal(issuer, "STOP")?;
                    let measured = first_then_duplicates(
                        Door::Webhook,
                        addr,
                        tag ^ 0x7d7d_7d7d,
                        c,
                        warmup,
                        measure,
                        &unique_keys_down,
                        &next,
                        &watch,
                    )
                    .await;
                    signal(issuer, "CONT")?;
                    let (first, dup) = measured?;
                    record("first_delivery_webhook_keys_down", &first)?;
                    record("duplicate_webhook_keys_down", &dup)?;
                }
            }
            if let (Some(addr), Some(pid)) = (opts.cluster_handler, opts.cluster_handler_pid) {
                let (first, dup) = first_then_duplicates(
                    Door::Functions,
                    addr,
                    tag ^ 0x6b6b_6b6b,
                    c,
                    warmup,
                    measure,
                    &unique_cluster,
                    &next,
                    &[("handler", pid)],
                )
                .await?;
                record("first_delivery_cluster", &first)?;
                record("duplicate_cluster", &dup)?;
            }
            if let (Some(addr), Some(pid), Some(ado)) = (
                opts.sqlserver_handler,
                opts.sqlserver_handler_pid,
                opts.sqlserver.as_ref(),
            ) {
                let s = phase(
                    &Work::SqlRoundTrip {
                        ado: Arc::new(ado.clone()),
                    },
                    c,
                    warmup,
                    measure,
                    &next,
                    &[],
                )
                .await?;
                record("sqlserver_roundtrip_ceiling", &s)?;
                let (first, dup) = first_then_duplicates(
                    Door::Functions,
                    addr,
                    tag ^ 0x3c3c_3c3c,
                    c,
                    warmup,
                    measure,
                    &unique_mssql,
                    &next,
                    &[("handler", pid)],
                )
                .await?;
                record("first_delivery_sqlserver", &first)?;
                record("duplicate_sqlserver", &dup)?;
            }
        }
    }
    let rss = peak_rss_mib(opts.handler_pid)?;

    eprintln!("bench: {} cold starts", opts.cold_starts);
    let mut starts = Vec::new();
    for i in 0..opts.cold_starts {
        // A different tag: these orders are new to the shared redis-server.
        starts.push(cold_start(&opts, tag ^ 0x5a5a_5a5a, i).await?);
    }
    starts.sort();

    let mut entries = Vec::new();
    for &c in &opts.concurrency {
        let s = |name: &'static str| &series[&(name, c)];
        let http = ("http_ceiling", s("http_ceiling"));
        entries.extend(figure_entries(
            "duplicate_cache_hit",
            "events/s",
            c,
            s("duplicate_cache_hit"),
            &PERCENTILES,
            &[http, ("redis_ceiling", s("redis_ceiling"))],
        ));
        entries.extend(figure_entries(
            "duplicate_redis",
            "events/s",
            c,
            s("duplicate_redis"),
            &PERCENTILES,
            &[http, ("redis_ceiling", s("redis_ceiling"))],
        ));
        if opts.cluster_handler.is_some() {
            entries.extend(figure_entries(
                "duplicate_cluster",
                "events/s",
                c,
                s("duplicate_cluster"),
                &PERCENTILES,
                &[("duplicate_redis", s("duplicate_redis")), http],
            ));
            entries.extend(figure_entries(
                "first_delivery_cluster",
                "events/s",
                c,
                s("first_delivery_cluster"),
                &PERCENTILES[..2],
                &[("first_delivery", s("first_delivery"))],
            ));
        }
        entries.extend(figure_entries(
            "first_delivery",
            "events/s",
            c,
            s("first_delivery"),
            &PERCENTILES[..2],
            &[("sqlite_commit_ceiling", s("sqlite_commit_ceiling"))],
        ));
        if opts.webhook_handler.is_some() {
            // The webhook door beside the Functions door: the same ratios
            // to the HTTP ceiling, and to the Functions door's own figure.
            entries.extend(figure_entries(
                "duplicate_webhook",
                "events/s",
                c,
                s("duplicate_webhook"),
                &PERCENTILES,
                &[http, ("duplicate_cache_hit", s("duplicate_cache_hit"))],
            ));
            entries.extend(figure_entries(
                "first_delivery_webhook",
                "events/s",
                c,
                s("first_delivery_webhook"),
                &PERCENTILES[..2],
                &[http, ("first_delivery", s("first_delivery"))],
            ));
            if opts.webhook_issuer_pid.is_some() {
                entries.extend(figure_entries(
                    "duplicate_webhook_keys_down",
                    "events/s",
                    c,
                    s("duplicate_webhook_keys_down"),
                    &PERCENTILES,
                    &[http, ("duplicate_webhook", s("duplicate_webhook"))],
                ));
                entries.extend(figure_entries(
                    "first_delivery_webhook_keys_down",
                    "events/s",
                    c,
                    s("first_delivery_webhook_keys_down"),
                    &PERCENTILES[..2],
                    &[
                        http,
                        ("first_delivery_webhook", s("first_delivery_webhook")),
                    ],
                ));
            }
            // The batch phase ran with fewer deliveries in flight where c
            // batches would overflow the SQLite writer: said as its own c.
            let batch_c = batch_concurrency(c, opts.webhook_batch);
            entries.extend(figure_entries(
                "webhook_batch",
                "deliveries/s",
                batch_c,
                s("webhook_batch"),
                &PERCENTILES[..2],
                &[],
            ));
            let mut events = entry(
                "webhook_batch_events",
                s("webhook_batch").rate() * opts.webhook_batch as f64,
                "events/s",
                Some(batch_c),
            );
            events.ratio_to_ceiling = Some(events.value / s("http_ceiling").rate());
            events.ceiling = Some("http_ceiling".into());
            entries.push(events);
        }
        entries.extend(figure_entries(
            "http_ceiling",
            "req/s",
            c,
            s("http_ceiling"),
            &PERCENTILES,
            &[],
        ));
        entries.extend(figure_entries(
            "redis_ceiling",
            "ops/s",
            c,
            s("redis_ceiling"),
            &PERCENTILES,
            &[],
        ));
        if opts.telemetry_handler.is_some() {
            entries.extend(figure_entries(
                "duplicate_otel",
                "events/s",
                c,
                s("duplicate_otel"),
                &PERCENTILES,
                &[("duplicate_cache_hit", s("duplicate_cache_hit"))],
            ));
            entries.extend(figure_entries(
                "first_delivery_otel",
                "events/s",
                c,
                s("first_delivery_otel"),
                &PERCENTILES[..2],
                &[("first_delivery", s("first_delivery"))],
            ));
        }
        if opts.sqlserver_handler.is_some() {
            entries.extend(figure_entries(
                "first_delivery_sqlserver",
                "events/s",
                c,
                s("first_delivery_sqlserver"),
                &PERCENTILES[..2],
                &[(
                    "sqlserver_roundtrip_ceiling",
                    s("sqlserver_roundtrip_ceiling"),
                )],
            ));
            entries.extend(figure_entries(
                "duplicate_sqlserver",
                "events/s",
                c,
                s("duplicate_sqlserver"),
                &PERCENTILES,
                &[http],
            ));
            entries.extend(figure_entries(
                "sqlserver_roundtrip_ceiling",
                "round trips/s",
                c,
                s("sqlserver_roundtrip_ceiling"),
                &PERCENTILES[..2],
                &[],
            ));
        }
        if c == opts.concurrency[0] {
            entries.extend(figure_entries(
                "sqlite_commit_ceiling",
                "commits/s",
                1,
                s("sqlite_commit_ceiling"),
                &PERCENTILES[..2],
                &[],
            ));
        }
        // CPU per operation: what each process spent, whatever its neighbours
        // did. The ratio is bare warp's CPU per request ÷ the figure (1.0: as
        // cheap as bare warp; 0.5: twice its cost).
        let warp_us = s("http_ceiling").cpu_us_per_op("handler");
        let mut cpu = |name: &str, series: &Series, process: &str, vs_warp: bool| {
            let mut e = entry(name, series.cpu_us_per_op(process), "µs CPU/op", Some(c));
            if vs_warp {
                e.ratio_to_ceiling = Some(warp_us / e.value);
                e.ceiling = Some("http_ceiling_cpu".into());
            }
            entries.push(e);
        };
        cpu("http_ceiling_cpu", s("http_ceiling"), "handler", false);
        cpu("redis_ceiling_cpu", s("redis_ceiling"), "redis", false);
        let paths = [
            "duplicate_cache_hit",
            "duplicate_redis",
            "first_delivery",
            "duplicate_cluster",
            "first_delivery_cluster",
            "duplicate_sqlserver",
            "first_delivery_sqlserver",
            "duplicate_webhook",
            "first_delivery_webhook",
        ];
        for path in paths {
            if let Some(series) = series.get(&(path, c)) {
                cpu(&format!("{path}_cpu"), series, "handler", true);
            }
        }
        cpu(
            "duplicate_redis_redis_cpu",
            s("duplicate_redis"),
            "redis",
            false,
        );
        // What telemetry costs: the handler's CPU per event with an OTLP
        // exporter ÷ without (1.0: free).
        for (with, without) in [
            ("duplicate_otel", "duplicate_cache_hit"),
            ("first_delivery_otel", "first_delivery"),
        ] {
            if let (Some(w), Some(o)) = (series.get(&(with, c)), series.get(&(without, c))) {
                let mut e = entry(
                    &format!("{with}_cpu"),
                    w.cpu_us_per_op("handler"),
                    "µs CPU/op",
                    Some(c),
                );
                // Each round's ratio (the two phases ran side by side); the
                // median of them is the figure, robust to a round the
                // machine slowed for one phase and not the other.
                let per_round: Vec<f64> = w
                    .cpu_per_round
                    .iter()
                    .zip(&o.cpu_per_round)
                    .filter_map(|(w, o)| Some(w.get("handler")? / o.get("handler")?))
                    .collect();
                e.ratio_to_ceiling = median(&per_round);
                e.ceiling = Some(format!("{without}_cpu, median of rounds"));
                e.ratios.insert(
                    "all rounds pooled".into(),
                    e.value / o.cpu_us_per_op("handler"),
                );
                e.per_round = per_round.iter().map(|r| round3(*r)).collect();
                entries.push(e);
            }
        }
    }
    let ms = |d: &Duration| d.as_secs_f64() * 1e3;
    let mut cold = entry(
        "cold_start_median",
        ms(&starts[starts.len() / 2]),
        "ms",
        None,
    );
    cold.per_round = starts.iter().map(|d| round3(ms(d))).collect();
    entries.push(cold);
    entries.push(entry("cold_start_min", ms(&starts[0]), "ms", None));
    entries.push(entry(
        "cold_start_max",
        ms(&starts[starts.len() - 1]),
        "ms",
        None,
    ));
    let max_c = opts.concurrency.iter().copied().max();
    entries.push(entry("peak_rss", rss, "MiB", max_c));
    for e in &mut entries {
        e.value = round3(e.value);
        e.ratio_to_ceiling = e.ratio_to_ceiling.map(round3);
        for v in e.ratios.values_mut() {
            *v = round3(*v);
        }
    }

    let json = opts.out.join("results.json");
    std::fs::write(&json, serde_json::to_string_pretty(&entries)? + "\n")?;
    print_table(&entries);
    if let Some(c) = max_c {
        print_targets(&entries, c);
    }
    println!("\nwrote {}", json.display());

    // Plots: each path beside its ceilings, one line per concurrency.
    use plotters::style::RGBColor;
    // Solid: the path; dashed: its ceilings. One hue family per concurrency.
    const PATH_COLORS: [RGBColor; 2] = [RGBColor(31, 119, 180), RGBColor(214, 39, 40)];
    const CEILING_COLORS: [[RGBColor; 2]; 2] = [
        [RGBColor(120, 180, 230), RGBColor(23, 190, 207)],
        [RGBColor(255, 140, 60), RGBColor(188, 100, 160)],
    ];
    for (path, ceilings, max_x) in [
        (
            "duplicate_cache_hit",
            &["http_ceiling", "redis_ceiling"][..],
            10_000.0,
        ),
        (
            "duplicate_redis",
            &["http_ceiling", "redis_ceiling"][..],
            10_000.0,
        ),
        ("first_delivery", &["sqlite_commit_ceiling"][..], 1_000.0),
    ] {
        let mut curves = Vec::new();
        for (i, &c) in opts.concurrency.iter().enumerate() {
            let color = PATH_COLORS[i % 2];
            curves.push(curve(
                format!("{path} c={c}"),
                &series[&(path, c)],
                color,
                false,
                max_x,
            ));
            for (j, name) in ceilings.iter().enumerate() {
                if *name == "sqlite_commit_ceiling" && i > 0 {
                    continue;
                }
                let label = if *name == "sqlite_commit_ceiling" {
                    format!("{name} (1 writer)")
                } else {
                    format!("{name} c={c}")
                };
                let shade = CEILING_COLORS[i % 2][j % 2];
                curves.push(curve(label, &series[&(*name, c)], shade, true, max_x));
            }
        }
        let file = opts.out.join(format!("latency_{path}.png"));
        plot(
            &file,
            &format!("order-guard {path} path: latency by percentile"),
            &curves,
            max_x,
        )?;
        println!("wrote {}", file.display());
    }
    Ok(())
}
