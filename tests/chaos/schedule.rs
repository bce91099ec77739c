//! The chaos schedule.

use super::*;

/// Where the handlers keep their state, and how the chaos reaches it.
pub(crate) enum Db {
    /// One SQLite file shared by the handlers.
    Sqlite(PathBuf),
    /// A fresh database on SQL Server, reached by the handlers through a
    /// proxy that can cut their connections; the audit connects directly.
    SqlServer {
        /// What the handlers are given (through the proxy).
        handlers: String,
        /// What the audit uses (straight to the server).
        direct: String,
        database: String,
        proxy: CutProxy,
        /// An engine of the test's own, which the chaos may restart.
        engine: Option<Arc<common::OwnEngine>>,
    },
}

impl Db {
    pub(crate) fn connection_string(&self) -> String {
        match self {
            Db::Sqlite(path) => format!("sqlite:{}?mode=rwc", path.display()),
            Db::SqlServer { handlers, .. } => handlers.clone(),
        }
    }

    pub(crate) async fn tables(&self) -> Tables {
        match self {
            Db::Sqlite(path) => read_sqlite(path),
            Db::SqlServer { direct, .. } => read_sqlserver(direct).await,
        }
    }
}

/// The file whose existence takes the SQLite handlers' disk away (their
/// `FAULT_DISK_AWAY_WHILE`), beside the database.
pub(crate) fn disk_away_switch(db: &Path) -> PathBuf {
    db.with_file_name("disk-away")
}

/// A TCP proxy in front of the database server that can cut every
/// connection through it at once and refuse new ones for a while: a network
/// outage as the handlers see it (TLS and TDS pass through untouched).
pub(crate) struct CutProxy {
    pub(crate) port: u16,
    /// Bumped by every outage: connections of an older generation are cut.
    pub(crate) generation: watch::Sender<u64>,
    pub(crate) down: Arc<std::sync::atomic::AtomicBool>,
}

impl CutProxy {
    pub(crate) async fn start(upstream: u16) -> CutProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (generation, _) = watch::channel(0u64);
        let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (gen_rx, is_down) = (generation.subscribe(), Arc::clone(&down));
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if is_down.load(Ordering::SeqCst) {
                    continue; // refused: dropped at once
                }
                let mut cut = gen_rx.clone();
                cut.mark_unchanged();
                tokio::spawn(async move {
                    let Ok(mut outbound) =
                        tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                    else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.changed() => {} // both sockets dropped: cut
                    }
                });
            }
        });
        CutProxy {
            port,
            generation,
            down,
        }
    }

    /// Cut every connection and refuse new ones for `hold`.
    pub(crate) async fn outage(&self, hold: Duration) {
        self.down.store(true, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
        // The outage lasts this long: chaos pacing, not synchronisation.
        tokio::time::sleep(hold).await;
        self.down.store(false, Ordering::SeqCst);
    }
}

/// The port of `Server=tcp:HOST,PORT` in an ADO.NET string.
pub(crate) fn server_port(cs: &str) -> u16 {
    cs.split(';')
        .find_map(|p| {
            let (k, v) = p.split_once('=')?;
            let k = k.trim().to_ascii_lowercase();
            (k == "server" || k == "data source")
                .then(|| v.rsplit_once(',').map(|(_, port)| port.trim().parse().ok()))
                .flatten()
                .flatten()
        })
        .unwrap_or(1433)
}

/// `cs` with its server replaced by the proxy on loopback.
pub(crate) fn through_proxy(cs: &str, port: u16) -> String {
    common::ado_without(
        cs,
        &["server", "data source"],
        &format!("Server=tcp:127.0.0.1,{port}"),
    )
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Action {
    Kill(usize),
    RedisRestart,
    RedisFlush,
    /// SIGSTOP Redis for a while: a hung dependency, not a dead one.
    RedisPause(Duration),
    /// The database unreachable for a while: SQLite locked (`BEGIN
    /// EXCLUSIVE`); SQL Server's connections all cut and new ones refused.
    DbOutage(Duration),
    /// SQL Server only, on an engine of the test's own: stopped and started.
    EngineRestart,
    /// Redis cluster only: a master SIGKILLed, its replica promoted by the
    /// cluster, the old master started again (it rejoins as a replica).
    MasterFailover,
    /// The announcements' queue unreachable for a while: every connection
    /// to it cut and new ones refused.
    QueueOutage(Duration),
}

#[derive(Default)]
pub(crate) struct ChaosStats {
    pub(crate) redis_restarts: AtomicU64,
    pub(crate) redis_flushes: AtomicU64,
    pub(crate) redis_pauses: AtomicU64,
    pub(crate) db_outages: AtomicU64,
    pub(crate) engine_restarts: AtomicU64,
    pub(crate) failovers: AtomicU64,
    pub(crate) queue_outages: AtomicU64,
    pub(crate) failover: Mutex<Option<FailoverReport>>,
    /// Every database outage and engine restart, with when the store was back.
    pub(crate) store_faults: Mutex<Vec<StoreFault>>,
}

/// What one master failover did to the guard's keys.
#[derive(Debug, Clone)]
pub(crate) struct FailoverReport {
    /// Orders whose `COMPLETADA` the killed master held just before the kill.
    pub(crate) completed_before: usize,
    /// Of those, the ones the promoted replica did not have: completions
    /// acknowledged by the master but not yet replicated (replication is
    /// asynchronous), lost by the failover.
    pub(crate) lost: Vec<String>,
    /// When the master was killed, its replica promoted, the old master
    /// back as a replica.
    pub(crate) killed_at: Instant,
    pub(crate) promoted_at: Instant,
    pub(crate) back_at: Instant,
    /// Kill to promotion.
    pub(crate) failover_time: Duration,
}

/// The guard's cache in a chaos run.
#[derive(Clone)]
pub(crate) enum Cache {
    Single(Arc<Mutex<RedisServer>>),
    Cluster(Arc<Mutex<RedisCluster>>),
}

impl Cache {
    pub(crate) fn single(&self) -> &Arc<Mutex<RedisServer>> {
        match self {
            Cache::Single(r) => r,
            Cache::Cluster(_) => unreachable!("no single-node action is scheduled on a cluster"),
        }
    }

    pub(crate) fn keys_with_ttl(&self, pattern: &str) -> Vec<(String, Option<String>, i64)> {
        match self {
            Cache::Single(r) => r.lock().unwrap().keys_with_ttl(pattern),
            Cache::Cluster(c) => c.lock().unwrap().keys_with_ttl(pattern),
        }
    }
}

/// Database outages in a run of `n` orders.
fn db_outages(n: usize) -> usize {
    (n / 250).max(2)
}

/// Engine restarts in a run of `n` orders (on an engine of the run's own).
fn engine_restarts_of(n: usize, engine_restarts: bool) -> usize {
    if engine_restarts {
        (n / 250).max(1)
    } else {
        0
    }
}

/// How many store faults (database outages, engine restarts) a run of `n`
/// orders meets.
pub(crate) fn store_fault_count(n: usize, engine_restarts: bool) -> usize {
    db_outages(n) + engine_restarts_of(n, engine_restarts)
}

/// Each store fault gets a slot of its own at least this long: the quiet
/// before it, the fault (an engine restart takes a few seconds) and the
/// recovery after it.
pub(crate) const STORE_FAULT_SLOT: Duration = Duration::from_secs(10);

/// The shortest spread of deliveries that gives every store fault its slot
/// in the middle 80 % of the run.
pub(crate) fn min_spread(store_faults: usize) -> Duration {
    (STORE_FAULT_SLOT * store_faults as u32).mul_f64(1.0 / 0.8)
}

/// The schedule. Store faults are spaced, one to a slot of the middle of the
/// run; every other fault keeps clear of them ([`QUIET_BEFORE`],
/// [`QUIET_AFTER`]), so each store fault is followed by a recovery that is
/// the store's alone and the summary can measure it, the same way for every
/// store.
pub(crate) fn chaos_plan(
    rng: &mut StdRng,
    n: usize,
    spread: Duration,
    engine_restarts: bool,
    cluster: bool,
) -> Vec<(Duration, Action)> {
    let mut store = Vec::new();
    for _ in 0..db_outages(n) {
        store.push(Action::DbOutage(Duration::from_millis(
            rng.gen_range(800..=1600),
        )));
    }
    for _ in 0..engine_restarts_of(n, engine_restarts) {
        store.push(Action::EngineRestart);
    }
    store.shuffle(rng);
    let (first, last) = (spread.mul_f64(0.1), spread.mul_f64(0.9));
    let slot = (last - first) / store.len() as u32;
    let mut timed: Vec<(Duration, Action)> = store
        .into_iter()
        .enumerate()
        .map(|(i, a)| {
            let at = first + slot * i as u32 + QUIET_BEFORE + slot.mul_f64(rng.gen_range(0.0..0.1));
            (at, a)
        })
        .collect();
    let quiet: Vec<(Duration, Duration)> = timed
        .iter()
        .map(|(at, a)| {
            let nominal = match a {
                Action::DbOutage(hold) => *hold,
                // A stop and a start of the engine: a few seconds here.
                _ => Duration::from_secs(4),
            };
            (at.saturating_sub(QUIET_BEFORE), *at + nominal + QUIET_AFTER)
        })
        .collect();

    let mut others = Vec::new();
    for _ in 0..(n / 40).max(3) {
        others.push(Action::Kill(rng.gen_range(0..HANDLERS)));
    }
    if !cluster {
        for _ in 0..(n / 250).max(2) {
            others.push(Action::RedisRestart);
        }
        for _ in 0..(n / 400).max(1) {
            others.push(Action::RedisFlush);
        }
        for _ in 0..(n / 400).max(1) {
            others.push(Action::RedisPause(Duration::from_millis(
                rng.gen_range(500..=1500),
            )));
        }
    }
    for _ in 0..(n / 250).max(2) {
        others.push(Action::QueueOutage(Duration::from_millis(
            rng.gen_range(800..=2500),
        )));
    }
    if cluster {
        // Mid-run: many orders completed before it, many redeliveries after.
        others.push(Action::MasterFailover);
    }
    for a in others {
        let range = if matches!(a, Action::MasterFailover) {
            0.35..0.5
        } else {
            0.05..0.8
        };
        // Anywhere in its range outside the store faults' quiet windows
        // (a fault of its own lasts up to a few seconds as well).
        let clear = |at: Duration| {
            quiet
                .iter()
                .all(|(from, to)| at + Duration::from_secs(3) < *from || at > *to)
        };
        let at = (0..1000)
            .map(|_| spread.mul_f64(rng.gen_range(range.clone())))
            .find(|at| clear(*at))
            .unwrap_or_else(|| spread.mul_f64(rng.gen_range(range)));
        timed.push((at, a));
    }
    timed.sort_by_key(|(t, _)| *t);
    timed
}

pub(crate) async fn run_chaos(
    schedule: Vec<(Duration, Action)>,
    started: Instant,
    cache: Cache,
    db: Arc<Db>,
    kill_txs: Vec<mpsc::UnboundedSender<KillRequest>>,
    queue: Arc<CutProxy>,
    stats: Arc<ChaosStats>,
) {
    // When the last store fault ended: the next keeps its distance even
    // when the actions before it ran late (a kill waits for the restart).
    let mut store_back: Option<Instant> = None;
    for (at, action) in schedule {
        // Pacing of the schedule itself.
        tokio::time::sleep_until((started + at).into()).await;
        if let (Some(back), Action::DbOutage(_) | Action::EngineRestart) = (store_back, action) {
            tokio::time::sleep_until((back + QUIET_AFTER + QUIET_BEFORE).into()).await;
        }
        match action {
            Action::Kill(slot) => {
                let (tx, rx) = oneshot::channel();
                if kill_txs[slot].send(tx).is_ok() {
                    // Back when the supervisor saw it ready again (bounded by
                    // its own start limit).
                    let _ = tokio::time::timeout(Duration::from_secs(120), rx).await;
                }
            }
            Action::RedisRestart => {
                let r = Arc::clone(cache.single());
                tokio::task::spawn_blocking(move || r.lock().unwrap().restart())
                    .await
                    .expect("restarting redis-server");
                stats.redis_restarts.fetch_add(1, Ordering::Relaxed);
            }
            Action::RedisFlush => {
                let r = Arc::clone(cache.single());
                tokio::task::spawn_blocking(move || r.lock().unwrap().cmd(&["FLUSHALL"]))
                    .await
                    .expect("FLUSHALL");
                stats.redis_flushes.fetch_add(1, Ordering::Relaxed);
            }
            Action::RedisPause(hold) => {
                let r = Arc::clone(cache.single());
                tokio::task::spawn_blocking(move || {
                    let pid = r.lock().unwrap().pid().expect("redis-server is running");
                    common::signal(pid, "STOP");
                    // The hang lasts this long: chaos pacing, not synchronisation.
                    std::thread::sleep(hold);
                    common::signal(pid, "CONT");
                })
                .await
                .expect("pausing redis-server");
                stats.redis_pauses.fetch_add(1, Ordering::Relaxed);
            }
            Action::DbOutage(hold) => {
                let started = Instant::now();
                match db.as_ref() {
                    Db::Sqlite(path) => {
                        // Every handler's open handle fails until the file
                        // goes: the disk is away, as a network volume drops.
                        let switch = disk_away_switch(path);
                        std::fs::write(&switch, b"").expect("take the disk away");
                        // The outage lasts this long: chaos pacing, not synchronisation.
                        tokio::time::sleep(hold).await;
                        std::fs::remove_file(&switch).expect("bring the disk back");
                    }
                    Db::SqlServer { proxy, .. } => proxy.outage(hold).await,
                }
                store_back = Some(Instant::now());
                stats.store_faults.lock().unwrap().push(StoreFault {
                    kind: "db_outage",
                    started,
                    back: Instant::now(),
                });
                stats.db_outages.fetch_add(1, Ordering::Relaxed);
            }
            Action::QueueOutage(hold) => {
                queue.outage(hold).await;
                stats.queue_outages.fetch_add(1, Ordering::Relaxed);
            }
            Action::MasterFailover => {
                let Cache::Cluster(c) = &cache else {
                    unreachable!("failovers are scheduled on clusters only")
                };
                let c = Arc::clone(c);
                let report = tokio::task::spawn_blocking(move || {
                    let mut c = c.lock().unwrap();
                    let master = c.master_ports()[0];
                    let completed = c.keys_holding(master, "orden:*", "COMPLETADA");
                    let killed = Instant::now();
                    let promoted = c.kill_master_and_wait_for_failover(master);
                    let promoted_at = Instant::now();
                    let kept: HashSet<String> = c
                        .keys_holding(promoted, "orden:*", "COMPLETADA")
                        .into_iter()
                        .collect();
                    let lost = completed
                        .iter()
                        .filter(|k| !kept.contains(*k))
                        .cloned()
                        .collect();
                    c.bring_back(master);
                    FailoverReport {
                        completed_before: completed.len(),
                        lost,
                        killed_at: killed,
                        promoted_at,
                        back_at: Instant::now(),
                        failover_time: promoted_at - killed,
                    }
                })
                .await
                .expect("master failover");
                *stats.failover.lock().unwrap() = Some(report);
                stats.failovers.fetch_add(1, Ordering::Relaxed);
            }
            Action::EngineRestart => {
                if let Db::SqlServer {
                    engine: Some(engine),
                    database,
                    ..
                } = db.as_ref()
                {
                    let (engine, database) = (Arc::clone(engine), database.clone());
                    let started = Instant::now();
                    // `start` returns once the engine accepts logins.
                    tokio::task::spawn_blocking(move || {
                        engine.command(&["stop"]);
                        engine.command(&["start", "--database", &database]);
                    })
                    .await
                    .expect("restarting the T-SQL engine");
                    store_back = Some(Instant::now());
                    stats.store_faults.lock().unwrap().push(StoreFault {
                        kind: "engine_restart",
                        started,
                        back: Instant::now(),
                    });
                    stats.engine_restarts.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}
