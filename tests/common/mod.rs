//! Shared test harness, one module per concern: `redis` (real
//! `redis-server`s and clusters on free loopback ports), `mssql` (the SQL
//! Server under test, fresh databases, least-privileged logins), `host`
//! (a real handler on an ephemeral port and a host-like client),
//! `azurite` (Blob and Queue Storage), `event_grid` (an endpoint that
//! enforces Event Grid's publish contract), `identity` (Entra ID endpoints), `proxy`
//! (a TCP proxy that cuts or drops); here: ports, guards and stores,
//! processors, events, signals.
#![allow(dead_code)]

use std::net::TcpListener;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

pub mod azurite;
pub mod blackhole;
pub mod event_grid;
mod host;
pub mod identity;
mod mssql;
pub mod proxy;
mod redis;
pub mod webhook;

// Each test binary uses some of these: the others are not unused code.
#[allow(unused_imports)]
pub use host::*;
#[allow(unused_imports)]
pub use mssql::*;
#[allow(unused_imports)]
pub use redis::*;

use order_guard::guard::{GuardSettings, IdempotencyGuard, MemoryGuard};
use order_guard::processor::{Processor, ProcessorSettings};
use order_guard::store::{OrderStore, SqliteStore};
use serde_json::{json, Value};

/// A loopback port nobody listens on right now, and never handed out
/// before in this process: the kernel may give a port just released to the
/// next `bind(0)`, and tests running in parallel (each starting servers,
/// cluster nodes with their bus ports) must not pick one port twice.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("cannot bind a loopback port")
            .port();
        if GIVEN.lock().unwrap_or_else(|p| p.into_inner()).insert(port) {
            return port;
        }
    }
}

pub fn memory_guard() -> Arc<MemoryGuard> {
    Arc::new(MemoryGuard::new(GuardSettings::default()))
}

/// A migrated SQLite store in a fresh temp dir (kept alive by the returned dir).
pub async fn sqlite_store() -> (Arc<SqliteStore>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("orders.db"), Duration::from_secs(5)).unwrap();
    store.migrate().await.unwrap();
    (Arc::new(store), dir)
}

pub fn processor(guard: Arc<dyn IdempotencyGuard>, store: Arc<dyn OrderStore>) -> Arc<Processor> {
    Arc::new(Processor::new(guard, store, ProcessorSettings::default()))
}

/// A processor with its cache of finished orders off: for tests of what the
/// guard and the store decide, which a cache hit would answer first.
pub fn processor_without_cache(
    guard: Arc<dyn IdempotencyGuard>,
    store: Arc<dyn OrderStore>,
) -> Arc<Processor> {
    let mut settings = ProcessorSettings::default();
    settings.finished_cache.max_bytes = 0;
    Arc::new(Processor::new(guard, store, settings))
}

/// A process stopped with SIGSTOP, resumed (SIGCONT) when this is dropped,
/// so an assertion that fails meanwhile cannot leave it hung.
pub struct Paused(u32);

/// SIGSTOP `pid` until the returned guard is dropped.
pub fn pause(pid: u32) -> Paused {
    signal(pid, "STOP");
    Paused(pid)
}

impl Drop for Paused {
    fn drop(&mut self) {
        signal(self.0, "CONT");
    }
}

/// A unique order id for one test.
pub fn unique_id(tag: &str) -> String {
    format!("{tag}-{}", uuid::Uuid::new_v4().simple())
}

/// An order payload (`data`).
pub fn order_data(id: &str, side: &str, symbol: &str, quantity: &str, account: &str) -> Value {
    json!({
        "orderId": id, "accountId": account, "side": side, "symbol": symbol,
        "quantity": serde_json::from_str::<Value>(quantity).unwrap(),
        "limitPrice": 431.15, "currency": "USD", "placedAt": "2025-06-14T09:30:02.118Z"
    })
}

/// An Event Grid schema event with a fixed `id` around `data` (the fields
/// the replay tests read back).
pub fn eg_event_with_id(id: &str, data: Value) -> Value {
    json!({
        "id": id,
        "eventType": "Trading.Order.Placed",
        "subject": "orders",
        "eventTime": "2025-06-14T09:30:02Z",
        "dataVersion": "1.0",
        "data": data,
    })
}

/// `order-guard replay` of `deliveries` (a JSON array of events) on the
/// embedded defaults in a temp dir, a clean environment plus `RUST_LOG`
/// and `vars`; what it printed, each stream apart.
pub fn replay_binary(
    deliveries: &Value,
    rust_log: &str,
    vars: &[(&str, &str)],
) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.json");
    std::fs::write(&file, deliveries.to_string()).unwrap();
    Command::new(env!("CARGO_BIN_EXE_order-guard"))
        .arg("replay")
        .arg(&file)
        .env_clear()
        .env("RUST_LOG", rust_log)
        .envs(vars.iter().copied())
        .current_dir(dir.path())
        .output()
        .expect("run order-guard")
}

/// An Event Grid schema event around `data`.
pub fn eg_event(data: Value) -> Value {
    json!({
        "id": uuid::Uuid::new_v4().to_string(),
        "topic": "/subscriptions/1111/resourceGroups/rg/providers/Microsoft.EventGrid/topics/orders",
        "subject": format!("orders/{}", data["orderId"].as_str().unwrap_or("?")),
        "eventType": "Trading.Order.Placed",
        "eventTime": "2025-06-14T09:30:02.1180000Z",
        "data": data, "dataVersion": "1.0", "metadataVersion": "1"
    })
}

/// A CloudEvents 1.0 event around `data`.
pub fn cloud_event(data: Value) -> Value {
    json!({
        "specversion": "1.0", "type": "Trading.Order.Placed",
        "source": "/subscriptions/1111/resourceGroups/rg/providers/Microsoft.EventGrid/topics/orders",
        "id": uuid::Uuid::new_v4().to_string(), "time": "2025-06-14T09:31:45.902Z",
        "subject": "orders/x", "datacontenttype": "application/json", "data": data
    })
}
