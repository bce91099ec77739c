//! order-guard: an Azure Functions custom handler that executes Event Grid
//! orders exactly once in effect.
//!
//! Data flows one way, and no module imports one that imports it back
//! (`docs/architecture.md`):
//! [`host`] → [`event`] → [`order`] → [`processor`] → [`guard`] / [`store`];
//! the processor performs the steps that [`decision`] (pure) chooses, and
//! keeps [`finished`], this instance's cache of finished orders;
//! [`position`] is the exact arithmetic of positions (pure) the stores apply.
//! [`config`] reads the environment (and [`hosting`], pure, says which Azure
//! hosting plan it describes); [`app`] wires the pieces together for the
//! binary's commands; [`logging`] puts each log line on the stream that
//! gives it its severity on the Functions host; [`tls`] installs the one
//! TLS crypto provider every HTTPS and `rediss://` client uses; [`text`]
//! (how values are shown in logs and messages), [`storage`] (an Azure
//! Storage account's settings, for the outbox and the dead-letter sweep)
//! and [`handoff`] (the bounded hand-over of the store's births to the
//! outbox) are leaves every layer may import.

pub mod app;
pub mod body;
pub mod config;
pub mod deadletter;
pub mod decision;
pub mod entra;
pub mod event;
pub mod faults;
pub mod finished;
pub mod guard;
pub mod handoff;
pub mod host;
pub mod hosting;
pub mod logging;
pub mod order;
pub mod outbox;
pub mod position;
pub mod processor;
pub mod storage;
pub mod store;
pub mod telemetry;
pub mod text;
pub mod tls;
pub mod webhook;
