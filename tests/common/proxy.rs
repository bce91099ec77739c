//! A TCP proxy of the tests' own between a client and a server on loopback:
//! it counts request/response turns (a turn begins each time the client
//! sends after the server has answered, whatever the protocol, TLS
//! included) and can hold every chunk for a one-way delay, to stand for the
//! network between a Function and its Azure SQL database.

use std::net::{SocketAddr, ToSocketAddrs};
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
    parts.push(format!("Server=tcp:127.0.0.1,{port}"));
    parts.join(";")
}

pub struct TurnProxy {
    pub port: u16,
    turns: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl TurnProxy {
    /// Listen on a free loopback port and forward every connection to
    /// `upstream`, each chunk held for `one_way` in each direction.
    pub async fn start(upstream: SocketAddr, one_way: Duration) -> TurnProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let turns = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&turns);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                tokio::spawn(relay(client, server, Arc::clone(&counted), one_way));
            }
        });
        TurnProxy { port, turns, task }
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
async fn relay(client: TcpStream, server: TcpStream, turns: Arc<AtomicU64>, one_way: Duration) {
    let answered = Arc::new(AtomicBool::new(true));
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let up = {
        let answered = Arc::clone(&answered);
        pipe(cr, sw, one_way, move || {
            if answered.swap(false, Ordering::SeqCst) {
                turns.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    // Set before the client can read the answer, so its next bytes see it.
    let down = pipe(sr, cw, one_way, move || {
        answered.store(true, Ordering::SeqCst)
    });
    tokio::join!(up, down);
}

/// Forward `from` to `to`, each chunk `delay` after it was read; `on_read`
/// runs as each chunk arrives.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
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
            if to.write_all(&chunk).await.is_err() {
                break;
            }
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
