//! Load generator for `scripts/bench.sh` (see docs/benchmarks.md).
//!
//! Two modes:
//!
//! - `bench ceiling-server --port P`: a bare warp server that reads the same
//!   invocation and answers a fixed host-shaped JSON body with no work: the
//!   HTTP ceiling, a separate process like the handler.
//! - `bench run …`: drives the handler over real HTTP with host-shaped
//!   invocations (protocol.md §1.2–1.3, §6.2) and measures, in rounds that
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let result = match cli.mode {
        Mode::CeilingServer { port } => runtime.block_on(ceiling_server(port)),
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

// ---------------------------------------------------------------- ceiling server

/// What the handler answers for a duplicate, byte for byte in shape.
const CEILING_ANSWER: &str = r#"{"Outputs":{},"Logs":["order bench-00000000-000000 duplicate"],"ReturnValue":{"orderId":"bench-00000000-000000","eventId":"00000000-0000-4000-8000-000000000000","outcome":"duplicate","guard":"redis"}}"#;

async fn ceiling_server(port: u16) -> anyhow::Result<()> {
    use warp::Filter;
    let invoke = warp::post()
        .and(warp::path::param::<String>())
        .and(warp::path::end())
        .and(warp::body::bytes())
        .map(|_function: String, _body: bytes::Bytes| {
            warp::http::Response::builder()
                .header("content-type", "application/json")
                .body(CEILING_ANSWER)
                .expect("static response")
        });
    let ready = warp::get().map(|| "{\"status\":\"ready\"}");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let (bound, server) = warp::serve(invoke.or(ready))
        .try_bind_ephemeral(addr)
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    println!("ceiling server listening on {bound}");
    server.await;
    Ok(())
}

// ---------------------------------------------------------------- invocations

/// The Functions host's invocation body for order `i` of run `tag`
/// (protocol.md §1.3, Event Grid schema, the default binding). The same `i`
/// always gives the same event: a redelivery.
fn invocation_body(tag: u32, i: u64) -> String {
    let order_id = format!("bench-{tag:08x}-{i:06}");
    let event_id = format!("{tag:08x}-0000-4000-8000-{i:012x}");
    let account = i % 64;
    let side = if i.is_multiple_of(3) { "sell" } else { "buy" };
    let data = format!(
        r#"{{"orderId":"{order_id}","side":"{side}","symbol":"MSFT","quantity":25,"limitPrice":431.15,"currency":"USD","accountId":"acct-{account}","placedAt":"2025-06-14T09:30:02.118Z"}}"#
    );
    format!(
        r#"{{"Data":{{"eventGridEvent":{{"id":"{event_id}","topic":"/subscriptions/11111111-2222-3333-4444-555555555555/resourceGroups/rg-trading/providers/Microsoft.EventGrid/topics/orders","subject":"orders/{order_id}","eventType":"Trading.Order.Placed","eventTime":"2025-06-14T09:30:02.1180000Z","data":{data},"dataVersion":"1.0","metadataVersion":"1"}}}},"Metadata":{{"data":{data},"sys":{{"MethodName":"OrderTrigger","UtcNow":"2025-06-14T09:30:02.4471234Z","RandGuid":"5d0c2a8e-7b1f-4c39-9e62-{i:012x}"}}}}}}"#
    )
}

fn invocation_request(addr: SocketAddr, body: String) -> anyhow::Result<Request<Body>> {
    Ok(Request::post("/OrderTrigger")
        .header("host", addr.to_string())
        .header("content-type", "application/json; charset=utf-8")
        .header(
            "x-azure-functions-invocationid",
            uuid::Uuid::new_v4().to_string(),
        )
        .header("x-azure-functions-hostversion", "4.1037.0.0")
        .header("user-agent", "Azure-Functions-Host/4.1037.0.0")
        .body(Body::from(body))?)
}

/// One keep-alive HTTP/1.1 connection (the host keeps its connections open).
async fn http_connection(addr: SocketAddr) -> anyhow::Result<SendRequest<Body>> {
    let stream = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connect {addr}"))?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::handshake(stream).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// Send one invocation; `Ok` only for a 200 whose body holds `expect`.
async fn invoke(
    sender: &mut SendRequest<Body>,
    addr: SocketAddr,
    body: String,
    expect: &str,
) -> anyhow::Result<()> {
    futures::future::poll_fn(|cx| sender.poll_ready(cx)).await?;
    let response = sender.send_request(invocation_request(addr, body)?).await?;
    let status = response.status();
    let bytes = hyper::body::to_bytes(response.into_body()).await?;
    if status != StatusCode::OK || !contains(&bytes, expect.as_bytes()) {
        bail!(
            "unexpected answer {status}: {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(300)])
        );
    }
    Ok(())
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

// ---------------------------------------------------------------- phases

/// What one phase does per operation.
#[derive(Clone)]
enum Work {
    /// The ceiling server: the same request, no work behind it.
    HttpCeiling { addr: SocketAddr },
    /// Raw `SET key val NX EX 300` on one multiplexed redis-rs connection
    /// shared by every worker (the handler's `ConnectionManager` is one too).
    RedisCeiling {
        conn: redis::aio::MultiplexedConnection,
        tag: u32,
    },
    /// Unique orders: guard + SQLite durable commits.
    FirstDelivery { addr: SocketAddr, tag: u32 },
    /// Redeliveries of orders completed earlier in this run.
    Duplicate {
        addr: SocketAddr,
        tag: u32,
        completed: u64,
    },
    /// `SELECT 1` on a SQL Server connection per worker: one round trip.
    SqlRoundTrip { ado: Arc<String> },
}

impl Work {
    /// The phase's name, for messages.
    fn name(&self) -> &'static str {
        match self {
            Work::HttpCeiling { .. } => "HTTP ceiling",
            Work::RedisCeiling { .. } => "Redis ceiling",
            Work::FirstDelivery { .. } => "first delivery",
            Work::Duplicate { .. } => "duplicate",
            Work::SqlRoundTrip { .. } => "SQL Server round-trip ceiling",
        }
    }
}

/// The result of one phase.
struct Sample {
    ops: u64,
    seconds: f64,
    hist: Histogram<u64>,
    /// CPU seconds each watched process spent in the measured window.
    cpu: Vec<(&'static str, f64)>,
}

impl Sample {
    fn rate(&self) -> f64 {
        self.ops as f64 / self.seconds
    }
}

fn new_hist() -> Histogram<u64> {
    // Nanoseconds, 1 ns .. 60 s, 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds")
}

/// Run `work` with `concurrency` workers: `warmup` unmeasured, then `measure`.
/// `next` hands out operation numbers (unique across the run for first
/// deliveries and Redis keys).
/// First deliveries of new orders to one handler, then redeliveries of the
/// orders that phase completed: the two samples, in that order.
#[allow(clippy::too_many_arguments)]
async fn first_then_duplicates(
    addr: SocketAddr,
    tag: u32,
    concurrency: usize,
    warmup: Duration,
    measure: Duration,
    unique: &Arc<AtomicU64>,
    next: &Arc<AtomicU64>,
    watch: &[(&'static str, u32)],
) -> anyhow::Result<(Sample, Sample)> {
    let first = phase(
        &Work::FirstDelivery { addr, tag },
        concurrency,
        warmup,
        measure,
        unique,
        watch,
    )
    .await?;
    let completed = unique.load(Ordering::Relaxed);
    let dup = phase(
        &Work::Duplicate {
            addr,
            tag,
            completed,
        },
        concurrency,
        warmup,
        measure,
        next,
        watch,
    )
    .await?;
    Ok((first, dup))
}

/// One phase; `watch` names the processes whose CPU time is read at the
/// start and at the end of the measured window.
async fn phase(
    work: &Work,
    concurrency: usize,
    warmup: Duration,
    measure: Duration,
    next: &Arc<AtomicU64>,
    watch: &[(&'static str, u32)],
) -> anyhow::Result<Sample> {
    let start = Instant::now();
    let measure_from = start + warmup;
    let stop = measure_from + measure;
    let watched = watch.to_vec();
    let cpu_window = tokio::spawn(async move {
        // Timers, not synchronisation: the window is defined by the clock.
        tokio::time::sleep_until(measure_from.into()).await;
        let before = cpu_seconds_of(&watched)?;
        tokio::time::sleep_until(stop.into()).await;
        let after = cpu_seconds_of(&watched)?;
        anyhow::Ok(
            watched
                .iter()
                .zip(before.iter().zip(after))
                .map(|((name, _), (b, a))| (*name, a - b))
                .collect::<Vec<_>>(),
        )
    });
    let mut tasks = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let work = work.clone();
        let next = Arc::clone(next);
        tasks.push(tokio::spawn(async move {
            worker(work, measure_from, stop, next).await
        }));
    }
    let mut hist = new_hist();
    let mut ops = 0;
    for t in tasks {
        let (h, n) = t.await??;
        hist.add(&h)?;
        ops += n;
    }
    // A phase that measured nothing fails the run: printed, it would read
    // as a ceiling of 0 per second and a ratio of infinity (issue 23).
    if ops == 0 {
        bail!(
            "the {} phase at c={concurrency} completed no operation inside its {:.1} s window",
            work.name(),
            measure.as_secs_f64()
        );
    }
    Ok(Sample {
        ops,
        seconds: measure.as_secs_f64(),
        hist,
        cpu: cpu_window.await??,
    })
}

/// User + system CPU seconds of each process (`/proc/<pid>/stat`, all threads).
fn cpu_seconds_of(watch: &[(&'static str, u32)]) -> anyhow::Result<Vec<f64>> {
    watch.iter().map(|(_, pid)| cpu_seconds(*pid)).collect()
}

fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces), from field 3:
    // utime is field 14, stime field 15, in clock ticks.
    let rest = stat.rsplit_once(')').context("malformed stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> anyhow::Result<f64> {
        Ok(fields.get(i).context("short stat")?.parse::<u64>()? as f64)
    };
    Ok((ticks(11)? + ticks(12)?) / clock_ticks_per_second())
}

/// `getconf CLK_TCK` (100 on Linux unless the kernel says otherwise).
fn clock_ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

async fn worker(
    work: Work,
    measure_from: Instant,
    stop: Instant,
    next: Arc<AtomicU64>,
) -> anyhow::Result<(Histogram<u64>, u64)> {
    let mut hist = new_hist();
    let mut ops = 0u64;
    let mut errors = 0u64;
    let mut sender = match &work {
        Work::HttpCeiling { addr }
        | Work::FirstDelivery { addr, .. }
        | Work::Duplicate { addr, .. } => Some(http_connection(*addr).await?),
        Work::RedisCeiling { .. } | Work::SqlRoundTrip { .. } => None,
    };
    let mut sql_client = match &work {
        Work::SqlRoundTrip { ado } => {
            let info = order_guard::store::sqlserver::connstr::SqlConnInfo::parse(ado)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            Some(
                order_guard::store::sqlserver::pool::open_following_redirect(
                    info.tiberius_config(),
                )
                .await?,
            )
        }
        _ => None,
    };
    let mut redis_conn = match &work {
        Work::RedisCeiling { conn, .. } => Some(conn.clone()),
        _ => None,
    };
    for _ in 0..MAX_OPS_PER_PHASE {
        let began = Instant::now();
        if began >= stop {
            break;
        }
        let n = next.fetch_add(1, Ordering::Relaxed);
        let result = match &work {
            Work::HttpCeiling { addr } => {
                let body = invocation_body(0, n);
                let s = sender.as_mut().expect("http");
                invoke(s, *addr, body, "\"outcome\"").await
            }
            Work::FirstDelivery { addr, tag } => {
                let body = invocation_body(*tag, n);
                let s = sender.as_mut().expect("http");
                invoke(s, *addr, body, "\"outcome\":\"executed\"").await
            }
            Work::Duplicate {
                addr,
                tag,
                completed,
            } => {
                let body = invocation_body(*tag, n % completed);
                let s = sender.as_mut().expect("http");
                invoke(s, *addr, body, "\"outcome\":\"duplicate\"").await
            }
            Work::SqlRoundTrip { .. } => {
                let c = sql_client.as_mut().expect("sql");
                match c.simple_query("SELECT 1").await {
                    Ok(stream) => stream.into_results().await.map(|_| ()).map_err(Into::into),
                    Err(e) => Err(e.into()),
                }
            }
            Work::RedisCeiling { tag, .. } => {
                let c = redis_conn.as_mut().expect("redis");
                let reply: redis::RedisResult<Option<String>> = redis::cmd("SET")
                    .arg(format!("bench-ceiling:{tag:08x}:{n}"))
                    .arg("1")
                    .arg("NX")
                    .arg("EX")
                    .arg(300)
                    .query_async(c)
                    .await;
                match reply {
                    Ok(Some(_)) => Ok(()),
                    Ok(None) => Err(anyhow::anyhow!("SET NX found the key")),
                    Err(e) => Err(e.into()),
                }
            }
        };
        let done = Instant::now();
        match result {
            Ok(()) => {
                if began >= measure_from && done <= stop {
                    hist.record((done - began).as_nanos().max(1) as u64)?;
                    ops += 1;
                }
            }
            Err(e) => {
                errors += 1;
                eprintln!("bench: operation {n} failed: {e:#}");
                if errors >= MAX_ERRORS {
                    bail!("{errors} operations failed; stopping");
                }
                if matches!(work, Work::FirstDelivery { .. }) {
                    bail!("a first delivery failed: the duplicate phase would be wrong");
                }
                // The connection may be broken: start a new one.
                if let (Some(s), Work::HttpCeiling { addr } | Work::Duplicate { addr, .. }) =
                    (sender.as_mut(), &work)
                {
                    *s = http_connection(*addr).await?;
                }
            }
        }
    }
    Ok((hist, ops))
}

/// Durable single-row commits on one SQLite connection (WAL,
/// `synchronous=FULL`, the store's settings) on the handler's file system:
/// what one commit costs here. Always one writer: SQLite has one.
fn sqlite_ceiling(path: &Path, warmup: Duration, measure: Duration) -> anyhow::Result<Sample> {
    let conn = rusqlite::Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch("CREATE TABLE IF NOT EXISTS T (K TEXT PRIMARY KEY, V TEXT NOT NULL)")?;
    let mut stmt = conn.prepare("INSERT INTO T (K, V) VALUES (?1, ?2)")?;
    let start = Instant::now();
    let (measure_from, stop) = (start + warmup, start + warmup + measure);
    let mut hist = new_hist();
    let mut ops = 0;
    for _ in 0..MAX_OPS_PER_PHASE {
        let began = Instant::now();
        if began >= stop {
            break;
        }
        stmt.execute(rusqlite::params![uuid::Uuid::new_v4().to_string(), "x"])?;
        let done = Instant::now();
        if began >= measure_from && done <= stop {
            hist.record((done - began).as_nanos().max(1) as u64)?;
            ops += 1;
        }
    }
    Ok(Sample {
        ops,
        seconds: measure.as_secs_f64(),
        hist,
        cpu: Vec::new(),
    })
}

/// Accumulated rounds of one figure at one concurrency.
#[derive(Default)]
struct Series {
    ops: u64,
    seconds: f64,
    per_round: Vec<f64>,
    hist: Option<Histogram<u64>>,
    /// CPU seconds per watched process, over every round.
    cpu: BTreeMap<&'static str, f64>,
}

impl Series {
    fn add(&mut self, s: &Sample) -> anyhow::Result<()> {
        self.ops += s.ops;
        self.seconds += s.seconds;
        self.per_round.push(s.rate());
        for (name, secs) in &s.cpu {
            *self.cpu.entry(name).or_default() += secs;
        }
        match &mut self.hist {
            Some(h) => h.add(&s.hist)?,
            None => self.hist = Some(s.hist.clone()),
        }
        Ok(())
    }
    fn rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.ops as f64 / self.seconds
        } else {
            0.0
        }
    }
    /// Microseconds of `process`'s CPU per operation (NaN when not watched).
    fn cpu_us_per_op(&self, process: &str) -> f64 {
        match self.cpu.get(process) {
            Some(secs) if self.ops > 0 => secs * 1e6 / self.ops as f64,
            _ => f64::NAN,
        }
    }
    fn ms(&self, q: f64) -> f64 {
        self.hist
            .as_ref()
            .map_or(f64::NAN, |h| h.value_at_quantile(q) as f64 / 1e6)
    }
}

// ---------------------------------------------------------------- results

#[derive(Serialize, Clone)]
struct Entry {
    name: String,
    value: f64,
    unit: &'static str,
    concurrency: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ratio_to_ceiling: Option<f64>,
    /// Which ceiling the ratio is taken against.
    #[serde(skip_serializing_if = "Option::is_none")]
    ceiling: Option<String>,
    /// Extra ratios when a figure has two ceilings (the duplicate path).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    ratios: BTreeMap<String, f64>,
    /// Throughput of each round, for the spread within this run.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    per_round: Vec<f64>,
}

fn entry(name: &str, value: f64, unit: &'static str, concurrency: Option<usize>) -> Entry {
    Entry {
        name: name.to_string(),
        value,
        unit,
        concurrency,
        ratio_to_ceiling: None,
        ceiling: None,
        ratios: BTreeMap::new(),
        per_round: Vec::new(),
    }
}

fn round3(x: f64) -> f64 {
    if x.abs() >= 100.0 {
        x.round()
    } else {
        (x * 1000.0).round() / 1000.0
    }
}

const PERCENTILES: [(&str, f64); 3] = [("p50", 0.50), ("p99", 0.99), ("p99.9", 0.999)];

/// Throughput + latency entries for `name`; ratios against `ceilings`
/// (throughput: figure ÷ ceiling; latency: ceiling ÷ figure, so 1.0 is "as
/// fast as the ceiling" either way). The headline ratio is against the lowest
/// ceiling throughput, and every ratio is listed in `ratios`.
fn figure_entries(
    name: &str,
    unit: &'static str,
    c: usize,
    s: &Series,
    percentiles: &[(&str, f64)],
    ceilings: &[(&str, &Series)],
) -> Vec<Entry> {
    let mut out = Vec::new();
    let mut t = entry(&format!("{name}_throughput"), s.rate(), unit, Some(c));
    t.per_round = s.per_round.iter().map(|x| x.round()).collect();
    if let Some((cname, cs)) = ceilings
        .iter()
        .min_by(|a, b| a.1.rate().total_cmp(&b.1.rate()))
    {
        t.ratio_to_ceiling = Some(s.rate() / cs.rate());
        t.ceiling = Some(format!("{cname}_throughput"));
        if ceilings.len() > 1 {
            for (cname, cs) in ceilings {
                t.ratios
                    .insert(format!("{cname}_throughput"), s.rate() / cs.rate());
            }
        }
    }
    out.push(t);
    for (pname, q) in percentiles {
        let mut e = entry(&format!("{name}_{pname}"), s.ms(*q), "ms", Some(c));
        if let Some((cname, cs)) = ceilings.first() {
            e.ratio_to_ceiling = Some(cs.ms(*q) / s.ms(*q));
            e.ceiling = Some(format!("{cname}_{pname}"));
        }
        out.push(e);
    }
    out
}

fn print_table(entries: &[Entry]) {
    println!(
        "{:<32} {:>4} {:>12} {:<9} {:>7}  ceiling",
        "figure", "c", "value", "unit", "ratio"
    );
    println!("{}", "-".repeat(90));
    for e in entries {
        let c = e.concurrency.map_or("-".into(), |c| c.to_string());
        let ratio = e.ratio_to_ceiling.map_or("-".into(), |r| format!("{r:.3}"));
        let mut ceiling = e.ceiling.clone().unwrap_or_default();
        for (k, v) in &e.ratios {
            ceiling.push_str(&format!("  [{k}: {v:.3}]"));
        }
        println!(
            "{:<32} {:>4} {:>12} {:<9} {:>7}  {}",
            e.name,
            c,
            fmt_value(e.value),
            e.unit,
            ratio,
            ceiling
        );
    }
}

/// Issue 13's goals at concurrency `c`, each said met or missed.
fn print_targets(entries: &[Entry], c: usize) {
    let find = |name: &str| {
        entries
            .iter()
            .find(|e| e.name == name && e.concurrency == Some(c))
    };
    let ratio = |name: &str, ceiling: &str| {
        find(name).and_then(|e| e.ratios.get(ceiling).copied().or(e.ratio_to_ceiling))
    };
    let goals = [
        (
            "duplicate (cache hit) ÷ HTTP ceiling ≥ 0.6",
            ratio("duplicate_cache_hit_throughput", "http_ceiling_throughput"),
            0.6,
            true,
        ),
        (
            "duplicate (cache hit) p99 ≤ 2 ms",
            find("duplicate_cache_hit_p99").map(|e| e.value),
            2.0,
            false,
        ),
        (
            "duplicate through Redis ÷ HTTP ceiling ≥ 0.4",
            ratio("duplicate_redis_throughput", "http_ceiling_throughput"),
            0.4,
            true,
        ),
        (
            "handler CPU per duplicate (cache hit) ≤ 2× bare warp's (ratio ≥ 0.5)",
            find("duplicate_cache_hit_cpu").and_then(|e| e.ratio_to_ceiling),
            0.5,
            true,
        ),
    ];
    println!("\ntargets at c={c}:");
    for (goal, value, bound, at_least) in goals {
        let verdict = match value {
            Some(v) if (at_least && v >= bound) || (!at_least && v <= bound) => "met",
            Some(_) => "MISSED",
            None => "not measured",
        };
        let shown = value.map_or("-".into(), |v| format!("{v:.3}"));
        println!("  {verdict:<12} {goal}: {shown}");
    }
}

fn fmt_value(v: f64) -> String {
    if v >= 1000.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

// ---------------------------------------------------------------- cold start, RSS

/// Peak resident set (VmHWM) of `pid`, in MiB.
fn peak_rss_mib(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .context("no VmHWM line")?;
    let kib: f64 = line
        .split_whitespace()
        .nth(1)
        .context("VmHWM value")?
        .parse()?;
    Ok(kib / 1024.0)
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Start the handler with a fresh SQLite file and time until its first
/// invocation (a new order) answers 200 `executed`. Connection attempts are
/// retried every millisecond, for at most 10 s.
async fn cold_start(opts: &Opts, tag: u32, i: usize) -> anyhow::Result<Duration> {
    let port = free_port()?;
    let db = opts.scratch.join(format!("cold-{i}.db"));
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let started = Instant::now();
    let mut child = Command::new(&opts.binary)
        .arg("serve")
        .env("FUNCTIONS_CUSTOMHANDLER_PORT", port.to_string())
        .env("REDIS_URL", &opts.redis_url)
        .env("SQL_CONNECTION_STRING", format!("sqlite:{}", db.display()))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", opts.binary.display()))?;
    let result = async {
        let deadline = started + Duration::from_secs(10);
        loop {
            if Instant::now() > deadline {
                bail!("no successful invocation within 10 s");
            }
            match http_connection(addr).await {
                Ok(mut sender) => {
                    let body = invocation_body(tag, i as u64);
                    match invoke(&mut sender, addr, body, "\"outcome\":\"executed\"").await {
                        Ok(()) => return Ok(started.elapsed()),
                        Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
                    }
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
            }
        }
    }
    .await;
    let _ = child.kill();
    let _ = child.wait();
    result
}

// ---------------------------------------------------------------- plots

/// One latency-by-percentile curve.
struct Curve {
    label: String,
    points: Vec<(f64, f64)>,
    color: plotters::style::RGBColor,
    dashed: bool,
}

/// x = 1 / (1 − q): 1 at p0, 10 at p90, 100 at p99, 1000 at p99.9.
fn curve(
    label: String,
    s: &Series,
    color: plotters::style::RGBColor,
    dashed: bool,
    max_x: f64,
) -> Curve {
    let mut points = Vec::new();
    if let Some(h) = &s.hist {
        let steps = (max_x.log10() * 100.0) as i32;
        for k in 0..=steps {
            let x = 10f64.powf(f64::from(k) / 100.0);
            let q = 1.0 - 1.0 / x;
            points.push((x, h.value_at_quantile(q) as f64 / 1e6));
        }
    }
    Curve {
        label,
        points,
        color,
        dashed,
    }
}

fn plot(path: &Path, title: &str, curves: &[Curve], max_x: f64) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let (mut lo, mut hi) = (f64::MAX, 0f64);
    for c in curves {
        for &(_, y) in &c.points {
            lo = lo.min(y);
            hi = hi.max(y);
        }
    }
    if hi <= 0.0 {
        return Ok(());
    }
    let (lo, hi) = (lo.max(0.001) * 0.8, hi * 1.25);
    let root = BitMapBackend::new(path, (1000, 620)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(16)
        .margin_right(48)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d((1f64..max_x).log_scale(), (lo..hi).log_scale())?;
    let percentile = |x: &f64| {
        let p = 100.0 * (1.0 - 1.0 / x);
        if p < 99.0 {
            format!("p{p:.0}")
        } else {
            format!("p{}", trim(p))
        }
    };
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency (ms)")
        .x_label_formatter(&percentile)
        .y_label_formatter(&|y| trim(*y))
        .label_style(("sans-serif", 15))
        .draw()?;
    for c in curves {
        let color = c.color;
        let style = ShapeStyle::from(&color).stroke_width(if c.dashed { 1 } else { 3 });
        if c.dashed {
            chart
                .draw_series(DashedLineSeries::new(c.points.clone(), 6, 4, style))?
                .label(c.label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        } else {
            chart
                .draw_series(LineSeries::new(c.points.clone(), style))?
                .label(c.label.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
                });
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()?;
    root.present()?;
    Ok(())
}

fn trim(x: f64) -> String {
    let s = format!("{x:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

// ---------------------------------------------------------------- run

async fn run(opts: Opts) -> anyhow::Result<()> {
    plotters::style::register_font(
        "sans-serif",
        plotters::style::FontStyle::Normal,
        epaint_default_fonts::HACK_REGULAR,
    )
    .map_err(|_| anyhow::anyhow!("the embedded font did not load"))?;
    std::fs::create_dir_all(&opts.out)?;
    std::fs::create_dir_all(&opts.scratch)?;
    let tag: u32 = rand::random();
    let warmup = Duration::from_secs_f64(opts.warmup);
    let measure = Duration::from_secs_f64(opts.seconds);
    let next = Arc::new(AtomicU64::new(0));
    let unique = Arc::new(AtomicU64::new(0));
    let unique_mssql = Arc::new(AtomicU64::new(0));
    let unique_cluster = Arc::new(AtomicU64::new(0));
    let unique_redis = Arc::new(AtomicU64::new(0));
    let redis = redis::Client::open(opts.redis_url.as_str())?
        .get_multiplexed_async_connection()
        .await
        .context("connecting to redis")?;

    let mut series: BTreeMap<(&str, usize), Series> = BTreeMap::new();
    let sqlite_path = opts.scratch.join("commit-ceiling.db");
    // The processes whose CPU each phase reads.
    let handler = [("handler", opts.handler_pid)];
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
            let (first, dup) = first_then_duplicates(
                opts.handler,
                tag,
                c,
                warmup,
                measure,
                &unique,
                &next,
                &handler,
            )
            .await?;
            record("first_delivery", &first)?;
            record("duplicate_cache_hit", &dup)?;
            // The same on a handler without the cache: duplicates go to Redis.
            let (_, dup) = first_then_duplicates(
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
            if let (Some(addr), Some(pid)) = (opts.cluster_handler, opts.cluster_handler_pid) {
                let (first, dup) = first_then_duplicates(
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
