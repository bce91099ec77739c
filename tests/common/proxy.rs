//! A TCP proxy of the tests' own between a client and a server on loopback:
//! it counts request/response turns (a turn begins each time the client
//! sends after the server has answered, whatever the protocol, TLS
//! included) and can hold every chunk for a one-way delay, to stand for the
//! network between a Function and its Azure SQL database. It can also drop
//! its connections silently ([`TurnProxy::silence`]): what a load balancer
//! that lost its state does, no RST and no FIN, the bytes just go nowhere;
//! or close them all and refuse new ones for a while ([`TurnProxy::outage`]).

use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The server's address in an ADO.NET string (`Server=tcp:host,port`).
pub fn server_of(cs: &str) -> Option<SocketAddr> {
    let server = cs.split(';').find_map(|p| {
        let (k, v) = p.split_once('=')?;
        matches!(
            k.trim().to_ascii_lowercase().as_str(),
            "server" | "data source"
        )
        .then(|| v.trim().trim_start_matches("tcp:").replace(',', ":"))
    })?;
    server.to_socket_addrs().ok()?.next()
}

/// `cs` with its server replaced by this proxy's loopback port.
pub fn via(cs: &str, port: u16) -> String {
    via_address(cs, Ipv4Addr::LOCALHOST, port)
}

/// `cs` with its server replaced by `address:port`.
pub fn via_address(cs: &str, address: Ipv4Addr, port: u16) -> String {
    let mut parts: Vec<String> = cs
        .split(';')
        .filter(|p| {
            let key = p
                .split('=')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            !p.trim().is_empty() && key != "server" && key != "data source"
        })
        .map(str::to_string)
        .collect();
    parts.push(format!("Server=tcp:{address},{port}"));
    parts.join(";")
}

pub struct TurnProxy {
    pub port: u16,
    turns: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
    /// Bumped by [`TurnProxy::silence`]: connections of an older
    /// generation forward nothing more. (examples/store_latency.rs uses
    /// the proxy without silencing it.)
    #[allow(dead_code)]
    generation: tokio::sync::watch::Sender<u64>,
    /// Bumped by [`TurnProxy::outage`]: connections of an older
    /// generation are closed.
    #[allow(dead_code)]
    cuts: tokio::sync::watch::Sender<u64>,
    /// While set, new connections are closed as soon as accepted.
    #[allow(dead_code)]
    refusing: Arc<AtomicBool>,
}

impl TurnProxy {
    /// Listen on a free loopback port and forward every connection to
    /// `upstream`, each chunk held for `one_way` in each direction.
    pub async fn start(upstream: SocketAddr, one_way: Duration) -> TurnProxy {
        Self::start_on(Ipv4Addr::LOCALHOST, upstream, one_way).await
    }

    /// [`TurnProxy::start`] on `address`: a loopback address of its own,
    /// which a [`super::blackhole::Blackhole`] can take off the network.
    pub async fn start_on(address: Ipv4Addr, upstream: SocketAddr, one_way: Duration) -> TurnProxy {
        let listener = TcpListener::bind((address, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let turns = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&turns);
        let (generation, _) = tokio::sync::watch::channel(0u64);
        let silenced = generation.subscribe();
        let (cuts, _) = tokio::sync::watch::channel(0u64);
        let cut = cuts.subscribe();
        let refusing = Arc::new(AtomicBool::new(false));
        let refused = Arc::clone(&refusing);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if refused.load(Ordering::SeqCst) {
                    continue; // closed at once
                }
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let mut silenced = silenced.clone();
                silenced.mark_unchanged();
                let mut cut = cut.clone();
                cut.mark_unchanged();
                let relayed = relay(client, server, Arc::clone(&counted), one_way, silenced);
                tokio::spawn(async move {
                    tokio::select! {
                        _ = relayed => {}
                        _ = cut.changed() => {} // both sockets dropped: closed
                    }
                });
            }
        });
        TurnProxy {
            port,
            turns,
            task,
            generation,
            cuts,
            refusing,
        }
    }

    /// A network outage as the client sees it: every connection open now
    /// is closed, and new ones are closed as soon as accepted until
    /// [`TurnProxy::restore`].
    #[allow(dead_code)]
    pub fn outage(&self) {
        self.refusing.store(true, Ordering::SeqCst);
        self.cuts.send_modify(|g| *g += 1);
    }

    /// The end of an [`TurnProxy::outage`]: new connections are forwarded.
    #[allow(dead_code)]
    pub fn restore(&self) {
        self.refusing.store(false, Ordering::SeqCst);
    }

    /// Drop every connection open now silently: from here on nothing is
    /// forwarded on them either way, and their sockets stay open (no FIN,
    /// no RST), so each end learns of it only by a timeout of its own.
    /// Connections made afterwards are forwarded as before.
    #[allow(dead_code)]
    pub fn silence(&self) {
        self.generation.send_modify(|g| *g += 1);
    }

    /// Turns so far, over every connection.
    pub fn turns(&self) -> u64 {
        self.turns.load(Ordering::SeqCst)
    }
}

impl Drop for TurnProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copy both ways until either side closes. `answered` is true once the
/// server has sent since the client last did: the client's next bytes open
/// a new turn. Each direction is a delay line: a chunk is read as soon as
/// it arrives and written `one_way` after its arrival, so consecutive
/// chunks of one message are not delayed one after the other.
/// Once `silenced` has changed, nothing more is forwarded (see
/// [`TurnProxy::silence`]).
async fn relay(
    client: TcpStream,
    server: TcpStream,
    turns: Arc<AtomicU64>,
    one_way: Duration,
    silenced: tokio::sync::watch::Receiver<u64>,
) {
    let answered = Arc::new(AtomicBool::new(true));
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let silent = move || silenced.has_changed().unwrap_or(false);
    let up = {
        let answered = Arc::clone(&answered);
        pipe(cr, sw, one_way, silent.clone(), move || {
            if answered.swap(false, Ordering::SeqCst) {
                turns.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    // Set before the client can read the answer, so its next bytes see it.
    let down = pipe(sr, cw, one_way, silent, move || {
        answered.store(true, Ordering::SeqCst)
    });
    tokio::join!(up, down);
}

/// Forward `from` to `to`, each chunk `delay` after it was read; `on_read`
/// runs as each chunk arrives. Once `silent()`, chunks are read and
/// dropped, and `to` is neither written nor shut down.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
    silent: impl Fn() -> bool,
    on_read: impl Fn(),
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            on_read();
            if tx
                .send((tokio::time::Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
            {
                break;
            }
        }
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            if !delay.is_zero() {
                sleep_until_precisely(due).await;
            }
            if silent() {
                continue;
            }
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
        if silent() {
            // Keep `to` open: a silent drop sends no FIN.
            std::future::pending::<()>().await;
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}

/// Wait until `due` to within tens of microseconds. tokio's timer counts in
/// whole milliseconds (a 1 ms sleep waits 1-2 ms), which made the delay
/// line add up to twice its nominal delay; a blocking-pool thread's own
/// sleep does not.
async fn sleep_until_precisely(due: tokio::time::Instant) {
    let left = due.saturating_duration_since(tokio::time::Instant::now());
    if !left.is_zero() {
        let _ = tokio::task::spawn_blocking(move || std::thread::sleep(left)).await;
    }
}
