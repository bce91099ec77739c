//! Dead-lettered orders, found in Blob Storage and replayed through the
//! processor.
//!
//! Event Grid retries a delivery for at most its retry policy's attempts
//! and time to live; then, when the subscription has a dead-letter
//! destination, it writes the event to a blob in that container. This
//! module reads those blobs back and hands each event to
//! [`Processor::process_event`](crate::processor::Processor::process_event),
//! exactly as a delivery: an order executed before is a `duplicate`, one
//! never executed is executed once, conflicts and poison are stored.
//!
//! - [`envelope`] (pure): a blob's content → the original events (every
//!   dead-letter field removed) and their [`Metadata`];
//! - [`name`] (pure): the documented blob-name layouts;
//! - [`storage`] (pure): `DEAD_LETTER_STORAGE` → where and how to sign in;
//! - [`blobs`]: the container, through `object_store` (list, read, move);
//! - [`fate`] (pure): what becomes of one blob, step by step, and how it counts;
//! - [`sweep`]: the replay and the dry run (`list`), with their summaries;
//! - [`function`]: the `DeadLetterSweep` timer function's invocation.

pub mod blobs;
pub mod envelope;
pub mod fate;
pub mod function;
pub mod name;
pub mod progress;
pub mod sweep;

pub use blobs::{BlobError, Container};
pub use envelope::{parse_blob, DeadLettered, Metadata, Unreadable};
pub use sweep::{list, sweep, ListSummary, Progress, SweepOptions, SweepSummary};

use crate::storage::StorageTarget;

/// The sweep's settings (built by `config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterSettings {
    pub storage: StorageTarget,
    pub container: String,
    /// The largest blob the sweep reads (`DEAD_LETTER_MAX_BLOB_BYTES`,
    /// default [`DEFAULT_MAX_BLOB_BYTES`]); a larger one is set aside
    /// unread, so one blob cannot take the process's memory.
    pub max_blob_bytes: u64,
}

/// Default `DEAD_LETTER_MAX_BLOB_BYTES`: 4 MiB. Event Grid writes a blob per
/// dead-lettered delivery: events of at most 1 MB, a batch of at most
/// 1 MB (a larger single event is sent alone), each event with its
/// dead-letter fields added (under 300 bytes an event; a batch holds at
/// most 5 000 events, so at most 1.5 MB of them). So a real dead letter is
/// under 2.5 MB; 4 MiB leaves room, and a sweep holds one blob and its
/// parsed events at a time.
pub const DEFAULT_MAX_BLOB_BYTES: u64 = 4 * 1024 * 1024;
