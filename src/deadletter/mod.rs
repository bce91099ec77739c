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
pub mod storage;
pub mod sweep;

pub use blobs::{BlobError, Container};
pub use envelope::{parse_blob, DeadLettered, Metadata, Unreadable};
pub use storage::{DeadLetterSettings, StorageTarget};
pub use sweep::{list, sweep, ListSummary, Progress, SweepOptions, SweepSummary};
