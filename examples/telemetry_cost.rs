//! What telemetry adds to one event's CPU, measured in one process.
//!
//! `scripts/bench.sh` measures the whole handler with and without an OTLP
//! exporter, over HTTP: its figure is the one the target is set on, but two
//! runs of it differ by up to 0.2 on this machine, more than the 10 % asked.
//! This measures the part telemetry changes, with nothing else around it:
//! processors that differ only in their telemetry (none; rate-limited to
//! 5 traces a second, the default with Application Insights; every trace),
//! each answering cache-hit duplicates (the cheapest event, where
//! telemetry weighs the most) at concurrency 1 and 32, in rounds that
//! alternate the processors. The figure is the process's CPU (user +
//! system, `/proc/<pid>/stat`) per event: the exporters' threads included,
//! the collector not (it runs in a process of its own, `telemetry_cost
//! sink PORT`, and takes every export).
//!
//! ```sh
//! cargo run --release --example telemetry_cost -- [ROUNDS] [SECONDS]
//! ```
//!
//! `ONLY=rate` (a prefix of a configuration's name) measures that one
//! alone (its "added" column is then against itself), for a profiler
//! (`perf record --call-graph dwarf`).
//!
//! Prints, per configuration and concurrency, the median CPU per event over
//! the rounds and what it adds to the plain processor's; what that is of a
//! whole duplicate is that figure over the handler's CPU per duplicate from
//! `scripts/bench.sh` (docs/benchmarks.md).

#[path = "bench/cpu.rs"]
mod cpu;

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use order_guard::guard::{GuardSettings, MemoryGuard};
use order_guard::processor::{OutcomeKind, Processor, ProcessorSettings};
use order_guard::store::{OrderStore, SqliteStore};
use order_guard::telemetry::{OtlpSettings, Sampling, Telemetry, TelemetrySettings};
use serde_json::{json, Value};

// The handler's allocator (src/main.rs): the duplicate path allocates.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Distinct orders the duplicates cycle through (all in the cache).
const ORDERS: usize = 1024;
const CONCURRENCY: [usize; 2] = [1, 32];

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("sink") {
        let port: u16 = args.get(1).context("sink PORT")?.parse()?;
        return sink(port);
    }
    let rounds: usize = args.first().map_or(Ok(5), |a| a.parse())?;
    let seconds: f64 = args.get(1).map_or(Ok(2.0), |a| a.parse())?;
    if rounds == 0 || seconds <= 0.0 {
        bail!("ROUNDS and SECONDS must be more than 0");
    }
    // The exporters' own lines (a full span queue, spans dropped) on
    // stderr: a figure with spans dropped did not pay for exporting them.
    env_logger::Builder::from_env(
        env_logger::Env::default()
            .default_filter_or("order_guard::telemetry=info,telemetry_cost=info"),
    )
    .init();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(measure(rounds, Duration::from_secs_f64(seconds)))
}

/// The processors, one per configuration, and their figures.
struct Subject {
    name: &'static str,
    processor: Arc<Processor>,
    /// CPU µs per event, per concurrency, one per round.
    figures: Vec<Vec<f64>>,
    telemetry: Option<Telemetry>,
}

async fn measure(rounds: usize, window: Duration) -> anyhow::Result<()> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let _sink = SinkProcess::start(port)?;
    let scratch = tempfile::tempdir()?;
    let events: Arc<Vec<Value>> = Arc::new((0..ORDERS).map(event).collect());
    let configurations = [
        ("no telemetry", None),
        ("rate-limited, 5 traces/s", Some(Sampling::RateLimited(5.0))),
        ("every trace (always_on)", Some(Sampling::AlwaysOn)),
    ];
    let mut subjects = Vec::new();
    let only = std::env::var("ONLY").ok();
    for (i, (name, sampling)) in configurations.into_iter().enumerate() {
        if only.as_deref().is_some_and(|o| !name.starts_with(o)) {
            continue;
        }
        let telemetry = match sampling {
            None => None,
            Some(sampling) => Telemetry::start(&settings(port, sampling), None)?,
        };
        let store = SqliteStore::open(
            &scratch.path().join(format!("{i}.db")),
            Duration::from_secs(5),
        )?;
        store.migrate().await?;
        let processor = Processor::new(
            Arc::new(MemoryGuard::new(GuardSettings::default())),
            Arc::new(store),
            ProcessorSettings::default(),
        )
        .with_telemetry(telemetry.as_ref().map(Telemetry::events));
        let processor = Arc::new(processor);
        // Each order executed once: from here on, every event is a duplicate
        // the cache answers.
        for e in events.iter() {
            let outcome = processor.process_event(e).await;
            if outcome.outcome != OutcomeKind::Executed {
                bail!(
                    "{name}: first delivery answered {:?}: {:?}",
                    outcome.outcome,
                    outcome.reason
                );
            }
        }
        subjects.push(Subject {
            name,
            processor,
            figures: vec![Vec::new(); CONCURRENCY.len()],
            telemetry,
        });
    }
    if subjects.is_empty() {
        bail!("ONLY={only:?} names no configuration");
    }
    println!(
        "{rounds} rounds of {:.1} s per configuration and concurrency, cache-hit duplicates",
        window.as_secs_f64()
    );
    for round in 0..rounds {
        for (c, &concurrency) in CONCURRENCY.iter().enumerate() {
            // Rotate who goes first: a round's drift falls on each in turn.
            for k in 0..subjects.len() {
                let s = (round + k) % subjects.len();
                let subject = &mut subjects[s];
                let us = duplicates(&subject.processor, &events, concurrency, window).await?;
                subject.figures[c].push(us);
            }
        }
        println!("round {} of {rounds} done", round + 1);
    }
    for subject in &mut subjects {
        if let Some(telemetry) = subject.telemetry.take() {
            telemetry.shutdown().await;
        }
    }
    println!();
    println!("| configuration | c | CPU µs per duplicate (median) | rounds | added (median of per-round differences) |");
    println!("|---|---|---|---|---|");
    for (c, concurrency) in CONCURRENCY.iter().enumerate() {
        let plain = subjects[0].figures[c].clone();
        for subject in &subjects {
            let figures = &subject.figures[c];
            let added: Vec<f64> = figures.iter().zip(&plain).map(|(t, p)| t - p).collect();
            let shown: Vec<String> = figures.iter().map(|f| format!("{f:.2}")).collect();
            println!(
                "| {} | {concurrency} | {:.2} | {} | {:+.2} µs |",
                subject.name,
                median(figures),
                shown.join(", "),
                median(&added),
            );
        }
    }
    Ok(())
}

/// Answer duplicates at `concurrency` for `window`; the process's CPU µs
/// per event.
async fn duplicates(
    processor: &Arc<Processor>,
    events: &Arc<Vec<Value>>,
    concurrency: usize,
    window: Duration,
) -> anyhow::Result<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let cpu_before = cpu::cpu_seconds(std::process::id())?;
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| {
            let (processor, events) = (Arc::clone(processor), Arc::clone(events));
            let (stop, answered) = (Arc::clone(&stop), Arc::clone(&answered));
            tokio::spawn(async move {
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    // As the host does: the invocation id read only for
                    // telemetry, in scope either way.
                    let id = processor
                        .reports_telemetry()
                        .then(|| Arc::from("5d0c2a8e-7b1f-4c39-9e62-000000000000"));
                    let event = &events[i % ORDERS];
                    let outcome = order_guard::telemetry::with_invocation_id(
                        id,
                        processor.process_event(event),
                    )
                    .await;
                    if outcome.outcome != OutcomeKind::Duplicate {
                        return Err(anyhow::anyhow!("answered {:?}", outcome.outcome));
                    }
                    answered.fetch_add(1, Ordering::Relaxed);
                    i += concurrency;
                    // Let the other tasks in, as awaiting the network would.
                    tokio::task::yield_now().await;
                }
                Ok(())
            })
        })
        .collect();
    tokio::time::sleep(window).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await??;
    }
    let cpu = cpu::cpu_seconds(std::process::id())? - cpu_before;
    let n = answered.load(Ordering::Relaxed);
    if n == 0 {
        bail!("no event answered");
    }
    // Beside the exporters' lines: how many spans a window made at most.
    log::info!("{n} events at c={concurrency}");
    Ok(cpu * 1e6 / n as f64)
}

fn settings(port: u16, sampling: Sampling) -> TelemetrySettings {
    let base = format!("http://127.0.0.1:{port}");
    TelemetrySettings {
        otlp: Some(OtlpSettings {
            traces_endpoint: format!("{base}/v1/traces"),
            metrics_endpoint: format!("{base}/v1/metrics"),
            headers: Vec::new(),
            timeout: Duration::from_secs(10),
        }),
        sampling,
        ..TelemetrySettings::default()
    }
}

/// Order `i`'s event, Event Grid schema.
fn event(i: usize) -> Value {
    json!({
        "id": format!("00000000-0000-4000-8000-{i:012x}"),
        "topic": "/subscriptions/11111111-2222-3333-4444-555555555555/resourceGroups/rg-trading/providers/Microsoft.EventGrid/topics/orders",
        "subject": format!("orders/cost-{i:06}"),
        "eventType": "Trading.Order.Placed",
        "eventTime": "2025-06-14T09:30:02.1180000Z",
        "data": {
            "orderId": format!("cost-{i:06}"), "side": "buy", "symbol": "MSFT",
            "quantity": 25, "limitPrice": 431.15, "currency": "USD",
            "accountId": format!("acct-{}", i % 64), "placedAt": "2025-06-14T09:30:02.118Z"
        },
        "dataVersion": "1.0",
        "metadataVersion": "1"
    })
}

/// The median (of the two middle values, their mean); `values` is never
/// empty (at least one round).
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len().is_multiple_of(2) {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    } else {
        sorted[mid]
    }
}

/// The collector, in a process of its own so that its CPU is not counted.
struct SinkProcess(Child);

impl SinkProcess {
    fn start(port: u16) -> anyhow::Result<SinkProcess> {
        let child = Command::new(std::env::current_exe()?)
            .args(["sink", &port.to_string()])
            .stdout(Stdio::null())
            .spawn()
            .context("starting the collector")?;
        // Until it listens: the first export is minutes away, but a closed
        // port would fail the span exports of the first second.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                bail!("the collector did not listen on {port} within 10 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(SinkProcess(child))
    }
}

impl Drop for SinkProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Take every OTLP/HTTP export and answer the empty protobuf response.
fn sink(port: u16) -> anyhow::Result<()> {
    use warp::Filter;
    let export = warp::post()
        .and(warp::path!("v1" / String))
        .and(warp::body::bytes())
        .map(|_signal: String, _body: bytes::Bytes| {
            warp::http::Response::builder()
                .header("content-type", "application/x-protobuf")
                .body(Vec::<u8>::new())
                .expect("static response")
        });
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(warp::serve(export).run(([127, 0, 0, 1], port)));
    Ok(())
}
