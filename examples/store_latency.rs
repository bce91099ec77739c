//! What the one-call store protocol costs on the wire, printed as
//! figures: round trips per first delivery and per duplicate, counted by a
//! TCP proxy between the SQL Server store and the server (the tests' own,
//! `tests/common/proxy.rs`), the cost of 1 ms added each way, concurrency on
//! distinct accounts and on one hot account, and SQLite's first deliveries
//! through the processor.
//!
//! ```sh
//! ORDER_GUARD_TEST_MSSQL="$(scripts/tsql-engine.sh start og_latency)" \
//! ORDER_GUARD_TSQL_SERVER="$(scripts/tsql-engine.sh path)" \
//!   cargo run --release --example store_latency -- [ORDERS] [recovery]
//! ```
//!
//! With `ORDER_GUARD_TSQL_SERVER` it also measures the recovery of one
//! store and of a fleet of three on an engine of its own, after a 10 s
//! engine outage, a 10 s cut of every connection and a silent drop of every
//! connection (`recovery` as the second argument runs only that phase).
//!
//! Without `ORDER_GUARD_TEST_MSSQL` only the SQLite figures are printed (and
//! it says so). A phase that fails, or measures nothing, fails the run.

#[path = "../tests/common/proxy.rs"]
mod proxy;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use order_guard::guard::{GuardSettings, MemoryGuard};
use order_guard::order::Order;
use order_guard::processor::{OutcomeKind, Processor, ProcessorSettings};
use order_guard::store::sqlserver::SqlServerSettings;
use order_guard::store::{Execution, OrderStore, SqlServerStore, SqliteStore};
use proxy::{server_of, via, TurnProxy};
use serde_json::json;

fn order(id: &str, account: &str) -> Order {
    Order::from_data(&json!({
        "orderId": id, "accountId": account, "side": "buy", "symbol": "MSFT", "quantity": "1"
    }))
    .expect("a valid order")
}

fn unique(tag: &str) -> String {
    format!("{tag}-{}", uuid::Uuid::new_v4().simple())
}

async fn sql_store(cs: &str, pool: u32) -> anyhow::Result<Arc<SqlServerStore>> {
    let store = SqlServerStore::connect(
        cs,
        &SqlServerSettings {
            connect_timeout: Duration::from_secs(30),
            query_timeout: Duration::from_secs(30),
            pool_size: pool,
            migrate_timeout: order_guard::store::sqlserver::DEFAULT_MIGRATE_TIMEOUT,
            migrate_batch_rows: order_guard::store::sqlserver::DEFAULT_MIGRATE_BATCH_ROWS,
            idle_timeout: order_guard::store::sqlserver::DEFAULT_IDLE_TIMEOUT,
        },
    )?;
    store.migrate().await?;
    Ok(Arc::new(store))
}

/// Execute `orders` at `concurrency`, each expected `want`; the rate.
async fn run(
    store: &Arc<SqlServerStore>,
    orders: Vec<Order>,
    concurrency: usize,
    want: fn(&Execution) -> bool,
) -> anyhow::Result<(f64, Duration)> {
    let n = orders.len();
    let queue = Arc::new(std::sync::Mutex::new(orders));
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (store, queue) = (Arc::clone(store), Arc::clone(&queue));
            tokio::spawn(async move {
                loop {
                    let Some(o) = queue.lock().unwrap().pop() else {
                        return Ok::<_, anyhow::Error>(());
                    };
                    let e = store.execute(&o, "e", "{}").await?;
                    if !want(&e) {
                        bail!("{}: unexpected {e:?}", o.order_id);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.await??;
    }
    let took = started.elapsed();
    if n == 0 {
        bail!("no orders measured");
    }
    Ok((n as f64 / took.as_secs_f64(), took / n as u32))
}

/// `n` calls of `call` on each store, taking the stores in turn call by
/// call (c=1); the mean duration per store.
async fn interleaved<const K: usize, F, Fut>(
    n: usize,
    stores: [&Arc<SqlServerStore>; K],
    call: F,
) -> anyhow::Result<[Duration; K]>
where
    F: Fn(Arc<SqlServerStore>) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let mut total = [Duration::ZERO; K];
    for _ in 0..n {
        for (i, store) in stores.iter().enumerate() {
            let started = Instant::now();
            call(Arc::clone(store)).await?;
            total[i] += started.elapsed();
        }
    }
    if n == 0 {
        bail!("no calls measured");
    }
    Ok(total.map(|t| t / n as u32))
}

fn executed(e: &Execution) -> bool {
    matches!(e, Execution::Executed)
}

fn duplicate(e: &Execution) -> bool {
    matches!(e, Execution::AlreadyDone)
}

async fn sql_server(cs: &str, n: usize) -> anyhow::Result<()> {
    let upstream = server_of(cs).context("no Server=host,port in ORDER_GUARD_TEST_MSSQL")?;
    let direct = sql_store(cs, 32).await?;
    let counted = TurnProxy::start(upstream, Duration::ZERO).await;
    let through = sql_store(&via(cs, counted.port), 32).await?;
    let slow_proxy = TurnProxy::start(upstream, Duration::from_millis(1)).await;
    let slow = sql_store(&via(cs, slow_proxy.port), 32).await?;
    let fresh = |n: usize| -> Vec<Order> {
        (0..n)
            .map(|_| order(&unique("ord"), &unique("acct")))
            .collect()
    };
    // Open and warm every connection the phases below use (logins and, on
    // an engine that compiles the procedure per session, its compile), so
    // the figures are of calls, not of connecting.
    run(&through, fresh(4), 1, executed).await?;
    for s in [&direct, &slow] {
        run(s, fresh(128), 32, executed).await?;
    }
    // Round trips, counted on the wire.
    let firsts = fresh(n);
    let before = counted.turns();
    run(&through, firsts.clone(), 1, executed).await?;
    let per_first = (counted.turns() - before) as f64 / n as f64;
    let before = counted.turns();
    run(&through, firsts, 1, duplicate).await?;
    let per_duplicate = (counted.turns() - before) as f64 / n as f64;
    println!(
        "sqlserver round trips per first delivery: {per_first:.2} (target 1: {})",
        met(per_first <= 1.0)
    );
    println!(
        "sqlserver round trips per duplicate reaching the store: {per_duplicate:.2} (target 1: {})",
        met(per_duplicate <= 1.0)
    );

    // Latency at c=1: directly, through the proxy, and with 1 ms added each
    // way, each on one connection (a c=1 caller on a pool of 32 takes them
    // in turn, each session of the engine colder), the three interleaved
    // call by call so that the engine's drift (its latency at c=1 varies by
    // 2x within a run) weighs on each alike.
    let direct1 = sql_store(cs, 1).await?;
    let slow1 = sql_store(&via(cs, slow_proxy.port), 1).await?;
    for s in [&direct1, &slow1] {
        run(s, fresh(4), 1, executed).await?;
    }
    let [d_direct, d_proxied, d_slow] = interleaved(n, [&direct1, &through, &slow1], |store| {
        let o = order(&unique("ord"), &unique("acct"));
        async move {
            match store.execute(&o, "e", "{}").await? {
                e if executed(&e) => Ok(()),
                e => bail!("{}: unexpected {e:?}", o.order_id),
            }
        }
    })
    .await?;
    let added = d_slow.saturating_sub(d_direct);
    println!(
        "sqlserver first delivery c=1: {:.2} ms direct, {:.2} ms through the proxy with no delay, {:.2} ms with 1 ms each way: +{:.2} ms (target at most +3.5 ms: {}; +{:.2} ms over the proxy without delay)",
        ms(d_direct),
        ms(d_proxied),
        ms(d_slow),
        ms(added),
        met(added <= Duration::from_micros(3500)),
        ms(d_slow.saturating_sub(d_proxied))
    );
    // What one added millisecond each way costs through this proxy: a
    // round trip of the smallest statement, interleaved the same way.
    let [p_direct, p_slow] = interleaved(n, [&direct1, &slow1], |store| async move {
        store
            .identity()
            .await
            .map(drop)
            .map_err(anyhow::Error::from)
    })
    .await?;
    println!(
        "one round trip of the smallest query: {:.2} ms direct, {:.2} ms with 1 ms each way (+{:.2} ms: what the proxy adds per round trip)",
        ms(p_direct),
        ms(p_slow),
        ms(p_slow.saturating_sub(p_direct))
    );

    // Concurrency on distinct accounts, directly.
    let (r1, p1) = run(&direct, fresh(n), 1, executed).await?;
    let (r32, p32) = run(&direct, fresh(n * 2), 32, executed).await?;
    println!(
        "sqlserver first delivery: c=1 {r1:.0} orders/s ({:.2} ms each), c=32 {r32:.0} orders/s ({:.2} ms each); c=32 / c=1 = {:.2} (target at least 1: {})",
        ms(p1),
        ms(p32),
        r32 / r1,
        met(r32 >= r1)
    );

    // One hot account (every order on one account and symbol), 1 ms each way.
    let hot = unique("hot");
    let hot_orders =
        |n: usize| -> Vec<Order> { (0..n).map(|_| order(&unique("ord"), &hot)).collect() };
    let (h1, _) = run(&slow, hot_orders(n), 1, executed).await?;
    let (h32, _) = run(&slow, hot_orders(n * 2), 32, executed).await?;
    println!(
        "sqlserver hot account with 1 ms each way: c=1 {h1:.0} orders/s, c=32 {h32:.0} orders/s"
    );
    Ok(())
}

async fn sqlite(n: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(SqliteStore::open(
        &dir.path().join("orders.db"),
        Duration::from_secs(5),
    )?);
    store.migrate().await?;
    let guard = Arc::new(MemoryGuard::new(GuardSettings::default()));
    let processor = Arc::new(Processor::new(guard, store, ProcessorSettings::default()));
    for concurrency in [1usize, 32] {
        let events: Vec<_> = (0..n * concurrency.min(4))
            .map(|_| {
                json!({"id": unique("e"), "eventType": "T", "subject": "s",
                       "eventTime": "2025-06-14T09:30:02Z", "dataVersion": "1",
                       "data": {"orderId": unique("ord"), "accountId": unique("acct"),
                                "side": "buy", "symbol": "MSFT", "quantity": "1"}})
            })
            .collect();
        let total = events.len();
        let queue = Arc::new(std::sync::Mutex::new(events));
        let started = Instant::now();
        let workers: Vec<_> = (0..concurrency)
            .map(|_| {
                let (p, queue) = (Arc::clone(&processor), Arc::clone(&queue));
                tokio::spawn(async move {
                    loop {
                        let Some(e) = queue.lock().unwrap().pop() else {
                            return Ok::<_, anyhow::Error>(());
                        };
                        let o = p.process_event(&e).await;
                        if o.outcome != OutcomeKind::Executed {
                            bail!("unexpected {o:?}");
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.await??;
        }
        let rate = total as f64 / started.elapsed().as_secs_f64();
        println!("sqlite first delivery through the processor (memory guard), c={concurrency}: {rate:.0} events/s");
    }
    Ok(())
}

/// An engine of this run's own on a free port (so it may stop and start
/// it), in its own state folder; stopped when dropped.
struct OwnEngine {
    tool: String,
    port: u16,
    dir: tempfile::TempDir,
}

impl OwnEngine {
    fn new(tool: String) -> anyhow::Result<OwnEngine> {
        // Reachable by the engine's system user (so not under /root).
        let dir = tempfile::Builder::new()
            .prefix("og-engine-")
            .tempdir_in("/tmp")?;
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        Ok(OwnEngine { tool, port, dir })
    }

    fn command(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = std::process::Command::new(&self.tool)
            .args(args)
            .args(["--port", &self.port.to_string()])
            .env("TSQL_SERVER_DIR", self.dir.path())
            .output()
            .with_context(|| format!("running {}", self.tool))?;
        if !out.status.success() {
            bail!(
                "tsql-server {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

impl Drop for OwnEngine {
    fn drop(&mut self) {
        let _ = self.command(&["stop"]);
    }
}

/// A fault the recovery phase puts between the stores and the engine.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// The engine stopped for 10 s, then started.
    Restart,
    /// Every connection cut and logins refused for 10 s (the proxy's
    /// outage), then accepted.
    Cut,
    /// Every connection dropped silently (no RST, no FIN); new ones work.
    Silence,
}

impl Fault {
    fn describe(self) -> &'static str {
        match self {
            Fault::Restart => "a 10 s engine outage",
            Fault::Cut => "a 10 s cut of every connection (logins refused)",
            Fault::Silence => "a silent drop of every connection",
        }
    }
}

/// Recovery: first deliveries at c=8 from one
/// store (one instance) or three (a fleet, the 8 callers spread over them)
/// on an engine of its own, through a proxy, at the production defaults
/// (connect 10 s, query 8 s); after each fault (an engine restart, a cut, a
/// silent drop), the time from the store being reachable again (the
/// engine accepting logins, the proxy forwarding, or the drop itself) to
/// the first `executed`, and to 90 % of the throughput before the fault
/// (in 250 ms buckets). Failed calls are retried after 50 ms, as a busy
/// Event Grid would (its real back-off starts at 10 s).
async fn recovery(tool: String) -> anyhow::Result<()> {
    let engine = OwnEngine::new(tool)?;
    let cs = engine.command(&["start", "--database", "recovery"])?;
    let proxy = TurnProxy::start(
        server_of(&cs).context("no Server=host,port from the engine")?,
        Duration::ZERO,
    )
    .await;
    // `RECOVERY_FAULTS=silence` (or `restart,cut`) runs only those.
    let chosen = std::env::var("RECOVERY_FAULTS").unwrap_or_default();
    if let Some(unknown) = chosen
        .split(',')
        .map(str::trim)
        .find(|f| !f.is_empty() && !["restart", "cut", "silence"].contains(f))
    {
        bail!("RECOVERY_FAULTS: unknown fault {unknown:?} (restart, cut, silence)");
    }
    for fault in [Fault::Restart, Fault::Cut, Fault::Silence] {
        let name = format!("{fault:?}").to_lowercase();
        if !chosen.is_empty() && !chosen.split(',').any(|f| f.trim() == name) {
            continue;
        }
        for fleet in [1, 3] {
            recover_from(&engine, &cs, &proxy, fault, fleet).await?;
        }
    }
    Ok(())
}

async fn recover_from(
    engine: &OwnEngine,
    cs: &str,
    proxy: &TurnProxy,
    fault: Fault,
    fleet: usize,
) -> anyhow::Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut stores = Vec::new();
    for _ in 0..fleet {
        let store = SqlServerStore::connect(
            &via(cs, proxy.port),
            &SqlServerSettings {
                connect_timeout: Duration::from_secs(10),
                query_timeout: Duration::from_secs(8),
                pool_size: 10,
                migrate_timeout: order_guard::store::sqlserver::DEFAULT_MIGRATE_TIMEOUT,
                migrate_batch_rows: order_guard::store::sqlserver::DEFAULT_MIGRATE_BATCH_ROWS,
                idle_timeout: order_guard::store::sqlserver::DEFAULT_IDLE_TIMEOUT,
            },
        )?;
        store.migrate().await?;
        let store = Arc::new(store);
        // Warm the pool's connections.
        let warm: Vec<Order> = (0..64)
            .map(|_| order(&unique("warm"), &unique("acct")))
            .collect();
        run(&store, warm, 8 / fleet + 1, executed).await?;
        stores.push(store);
    }

    let started = Instant::now();
    // Every call: when it began, how long it took to answer, and whether
    // it was executed.
    let calls = Arc::new(std::sync::Mutex::new(
        Vec::<(Duration, Duration, bool)>::new(),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..8)
        .map(|i| {
            let store = Arc::clone(&stores[i % fleet]);
            let (calls, stop) = (Arc::clone(&calls), Arc::clone(&stop));
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let o = order(&unique("ord"), &unique("acct"));
                    loop {
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        let began = started.elapsed();
                        let answer = store.execute(&o, "e", "{}").await;
                        let executed =
                            matches!(answer, Ok(Execution::Executed | Execution::AlreadyDone));
                        calls
                            .lock()
                            .unwrap()
                            .push((began, started.elapsed() - began, executed));
                        if executed {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let fault_at = started.elapsed();
    let back_at = match fault {
        Fault::Restart => {
            let restart = tokio::task::spawn_blocking({
                let tool = engine.tool.clone();
                let (port, dir) = (engine.port, engine.dir.path().to_path_buf());
                move || -> anyhow::Result<Duration> {
                    let run = |args: &[&str]| -> anyhow::Result<()> {
                        let out = std::process::Command::new(&tool)
                            .args(args)
                            .args(["--port", &port.to_string()])
                            .env("TSQL_SERVER_DIR", &dir)
                            .output()?;
                        if !out.status.success() {
                            bail!(
                                "tsql-server {args:?}: {}",
                                String::from_utf8_lossy(&out.stderr)
                            );
                        }
                        Ok(())
                    };
                    run(&["stop"])?;
                    std::thread::sleep(Duration::from_secs(10));
                    run(&["start", "--database", "recovery"])?;
                    Ok(started.elapsed())
                }
            });
            restart.await??
        }
        Fault::Cut => {
            proxy.outage();
            tokio::time::sleep(Duration::from_secs(10)).await;
            proxy.restore();
            started.elapsed()
        }
        Fault::Silence => {
            proxy.silence();
            started.elapsed()
        }
    };
    // Long enough for a silent drop: a query timeout (8 s), a check, a login.
    tokio::time::sleep(Duration::from_secs(20)).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.await;
    }
    // When each order was executed.
    let times: Vec<Duration> = calls
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, _, executed)| *executed)
        .map(|(began, took, _)| *began + *took)
        .collect();
    let bucket = Duration::from_millis(250);
    let before: usize = times
        .iter()
        .filter(|t| **t >= Duration::from_secs(1) && **t < fault_at)
        .count();
    let rate_before = before as f64 / (fault_at - Duration::from_secs(1)).as_secs_f64();
    if rate_before == 0.0 {
        bail!("the recovery phase measured nothing before the fault");
    }
    // The first call begun after the fault and executed: a call in flight
    // when it began may still be answered (a silent drop catches some
    // answers already on their way), which says nothing of the recovery.
    let first = calls
        .lock()
        .unwrap()
        .iter()
        .filter(|(began, _, executed)| *executed && *began >= fault_at)
        .map(|(began, took, _)| *began + *took)
        .filter(|done| *done > back_at)
        .min()
        .with_context(|| format!("no order executed after {}", fault.describe()))?;
    // The first 1 s window after the store is back whose rate reaches 90 %.
    let mut at = back_at;
    let ninety = loop {
        let in_window = times
            .iter()
            .filter(|t| **t >= at && **t < at + Duration::from_secs(1))
            .count();
        if in_window as f64 >= 0.9 * rate_before {
            break Some(at - back_at);
        }
        at += bucket;
        if at + Duration::from_secs(1) > started.elapsed() {
            break None;
        }
    };
    // The bound on a call after a silent drop: one query timeout.
    // Over the calls begun after the fault (each answered before its
    // worker ended).
    let longest_call = calls
        .lock()
        .unwrap()
        .iter()
        .filter(|(began, _, _)| *began >= fault_at)
        .map(|(_, took, _)| *took)
        .max()
        .unwrap_or_default();
    println!(
        "sqlserver recovery after {} (c=8, {fleet} instance{}): {rate_before:.0} orders/s before; first executed (by a call begun after the fault) {:.2} s after the store was reachable again (target 1 s: {}); 90 % of the rate after {} (target 5 s: {}); longest call begun after the fault {:.2} s (one query timeout: 8 s)",
        fault.describe(),
        if fleet == 1 { "" } else { "s" },
        (first - back_at).as_secs_f64(),
        met(first - back_at <= Duration::from_secs(1)),
        ninety.map_or("never within 20 s".to_string(), |d| format!("{:.2} s", d.as_secs_f64())),
        met(ninety.is_some_and(|d| d <= Duration::from_secs(5))),
        longest_call.as_secs_f64()
    );
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let _ = env_logger::Builder::from_env(
        env_logger::Env::default().default_filter_or("error,tiberius=off"),
    )
    .try_init();
    order_guard::tls::install_crypto_provider();
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().context("ORDERS must be a number"))
        .transpose()?
        .unwrap_or(200);
    let only_recovery = match std::env::args().nth(2).as_deref() {
        None => false,
        Some("recovery") => true,
        Some(other) => bail!("unknown phase {other:?}: the only one to run alone is `recovery`"),
    };
    if !only_recovery {
        sqlite(n).await?;
        match std::env::var("ORDER_GUARD_TEST_MSSQL") {
            Ok(cs) if !cs.trim().is_empty() => sql_server(&cs, n).await?,
            _ => println!("SQL Server figures NOT MEASURED: set ORDER_GUARD_TEST_MSSQL (scripts/tsql-engine.sh start NAME prints one)"),
        }
    }
    match std::env::var("ORDER_GUARD_TSQL_SERVER") {
        Ok(tool) if !tool.trim().is_empty() => recovery(tool).await?,
        _ => println!("recovery after an engine outage NOT MEASURED: set ORDER_GUARD_TSQL_SERVER to the tsql-server command (scripts/tsql-engine.sh path prints it)"),
    }
    Ok(())
}
