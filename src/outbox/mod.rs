//! The outbox's dispatch: executions announced downstream, at least once,
//! each with a stable id.
//!
//! The store writes the announcement with the execution, in the same call
//! (`store::announcement`); this module sends it afterwards:
//! [`envelope`] turns a row into the message (pure), [`pack`] is what
//! every destination shares (a pack of events, a refusal: a leaf),
//! [`destination`] is where it goes: an Azure Storage Queue ([`queue`]) or
//! an Event Grid custom topic ([`topic`]), each reading its own status
//! codes; [`dispatch`] claims, sends, marks and defers, by the rules of
//! [`lease`]; [`retention`] deletes
//! what is past `OUTBOX_RETENTION_HOURS`, with a destination or without
//! (then the unsent rows too: nothing would send them), so the table stays
//! bounded and a destination set later sends at most the retention's rows.

pub mod destination;
pub mod dispatch;
pub mod envelope;
pub mod lease;
pub mod pack;
pub mod queue;
pub mod retention;
pub mod topic;

pub use destination::{Destination, DestinationSettings};
pub use dispatch::{Announcer, DispatchSettings, Dispatcher};
pub use envelope::Naming;
pub use pack::SendFailure;
pub use queue::{Encoding, QueueDestination, QueueSettings};
pub use retention::{Retention, RetentionSettings};
pub use topic::{Schema, TopicAuth, TopicDestination, TopicSettings};

/// The outbox's settings (built by `config`): where to send, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxSettings {
    /// `None`: announcements are written and kept, not sent.
    pub destination: Option<DestinationSettings>,
    pub dispatch: DispatchSettings,
}
