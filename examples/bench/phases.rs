//! Phases: a workload at a concurrency for a warm-up and a measured time, with the CPU each process spent.

use super::*;

/// What one phase does per operation.
#[derive(Clone)]
pub(crate) enum Work {
    /// The ceiling server: the same request, no work behind it.
    HttpCeiling { addr: SocketAddr },
    /// Raw `SET key val NX EX 300` on one multiplexed redis-rs connection
    /// shared by every worker (the handler's `ConnectionManager` is one too).
    RedisCeiling {
        conn: redis::aio::MultiplexedConnection,
        tag: u32,
    },
    /// Unique orders: guard + SQLite durable commits.
    FirstDelivery {
        addr: SocketAddr,
        tag: u32,
        door: Door,
    },
    /// Redeliveries of orders completed earlier in this run.
    Duplicate {
        addr: SocketAddr,
        tag: u32,
        completed: u64,
        door: Door,
    },
    /// Webhook deliveries of `size` unique orders each (an operation is a
    /// delivery).
    WebhookBatch {
        addr: SocketAddr,
        tag: u32,
        size: u64,
    },
    /// `SELECT 1` on a SQL Server connection per worker: one round trip.
    SqlRoundTrip { ado: Arc<String> },
}

impl Work {
    /// The phase's name, for messages.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Work::HttpCeiling { .. } => "HTTP ceiling",
            Work::RedisCeiling { .. } => "Redis ceiling",
            Work::FirstDelivery { .. } => "first delivery",
            Work::Duplicate { .. } => "duplicate",
            Work::WebhookBatch { .. } => "webhook batch",
            Work::SqlRoundTrip { .. } => "SQL Server round-trip ceiling",
        }
    }
}

/// The result of one phase.
pub(crate) struct Sample {
    pub(crate) ops: u64,
    pub(crate) seconds: f64,
    pub(crate) hist: Histogram<u64>,
    /// CPU seconds each watched process spent in the measured window.
    pub(crate) cpu: Vec<(&'static str, f64)>,
}

impl Sample {
    pub(crate) fn rate(&self) -> f64 {
        self.ops as f64 / self.seconds
    }
}

pub(crate) fn new_hist() -> Histogram<u64> {
    // Nanoseconds, 1 ns .. 60 s, 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds")
}

/// Run `work` with `concurrency` workers: `warmup` unmeasured, then `measure`.
/// `next` hands out operation numbers (unique across the run for first
/// deliveries and Redis keys).
/// First deliveries of new orders to one handler, then redeliveries of the
/// orders that phase completed: the two samples, in that order.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn first_then_duplicates(
    door: Door,
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
        &Work::FirstDelivery { addr, tag, door },
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
            door,
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
pub(crate) async fn phase(
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
    // as a ceiling of 0 per second and a ratio of infinity.
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
pub(crate) fn cpu_seconds_of(watch: &[(&'static str, u32)]) -> anyhow::Result<Vec<f64>> {
    watch.iter().map(|(_, pid)| cpu_seconds(*pid)).collect()
}

pub(crate) async fn worker(
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
        | Work::Duplicate { addr, .. }
        | Work::WebhookBatch { addr, .. } => Some(http_connection(*addr).await?),
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
            Work::FirstDelivery { addr, tag, door } => {
                let body = match door {
                    Door::Functions => invocation_body(*tag, n),
                    Door::Webhook => webhook_body(*tag, n, 1),
                };
                let s = sender.as_mut().expect("http");
                let request = delivery_request(*door, *addr, body)?;
                send(s, request, "\"outcome\":\"executed\"").await
            }
            Work::Duplicate {
                addr,
                tag,
                completed,
                door,
            } => {
                let body = match door {
                    Door::Functions => invocation_body(*tag, n % completed),
                    Door::Webhook => webhook_body(*tag, n % completed, 1),
                };
                let s = sender.as_mut().expect("http");
                let request = delivery_request(*door, *addr, body)?;
                send(s, request, "\"outcome\":\"duplicate\"").await
            }
            Work::WebhookBatch { addr, tag, size } => {
                let body = webhook_body(*tag, n * size, *size);
                let s = sender.as_mut().expect("http");
                let request = delivery_request(Door::Webhook, *addr, body)?;
                send(s, request, "\"outcome\":\"executed\"").await
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
                if matches!(work, Work::FirstDelivery { .. } | Work::WebhookBatch { .. }) {
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
pub(crate) fn sqlite_ceiling(
    path: &Path,
    warmup: Duration,
    measure: Duration,
) -> anyhow::Result<Sample> {
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
pub(crate) struct Series {
    pub(crate) ops: u64,
    pub(crate) seconds: f64,
    pub(crate) per_round: Vec<f64>,
    pub(crate) hist: Option<Histogram<u64>>,
    /// CPU seconds per watched process, over every round.
    pub(crate) cpu: BTreeMap<&'static str, f64>,
    /// Each round's CPU µs per operation, per watched process.
    pub(crate) cpu_per_round: Vec<BTreeMap<&'static str, f64>>,
}

impl Series {
    pub(crate) fn add(&mut self, s: &Sample) -> anyhow::Result<()> {
        self.ops += s.ops;
        self.seconds += s.seconds;
        self.per_round.push(s.rate());
        for (name, secs) in &s.cpu {
            *self.cpu.entry(name).or_default() += secs;
        }
        // One entry a round, whatever it measured: round i of one series
        // pairs with round i of another (NaN per op when none was done).
        let per_op = s
            .cpu
            .iter()
            .map(|(name, secs)| (*name, secs * 1e6 / s.ops as f64));
        self.cpu_per_round.push(per_op.collect());
        match &mut self.hist {
            Some(h) => h.add(&s.hist)?,
            None => self.hist = Some(s.hist.clone()),
        }
        Ok(())
    }
    pub(crate) fn rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.ops as f64 / self.seconds
        } else {
            0.0
        }
    }
    /// Microseconds of `process`'s CPU per operation (NaN when not watched).
    pub(crate) fn cpu_us_per_op(&self, process: &str) -> f64 {
        match self.cpu.get(process) {
            Some(secs) if self.ops > 0 => secs * 1e6 / self.ops as f64,
            _ => f64::NAN,
        }
    }
    pub(crate) fn ms(&self, q: f64) -> f64 {
        self.hist
            .as_ref()
            .map_or(f64::NAN, |h| h.value_at_quantile(q) as f64 / 1e6)
    }
}
