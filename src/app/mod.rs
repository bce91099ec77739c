//! Wiring: the parts built from `Config` (`build`), and the commands the
//! binary runs, a file each: `serve`, `replay`, the operator's read-outs
//! (`inspect`), `dead_letters`, `outbox`, and `webhook`: Event Grid's own
//! protocol, the second front door; `shutdown`, how `serve` and `webhook`
//! end.

mod build;
mod dead_letters;
mod inspect;
mod outbox;
mod replay;
mod serve;
mod shutdown;
mod webhook;

pub use self::build::{
    build_checked_guard, build_command_processor, build_guard, build_processor,
    build_processor_with, build_store, describe, ingestion_tokens, start_telemetry, NewFile,
};
pub use self::dead_letters::{
    dead_letter_container, dead_letters_list, dead_letters_replay, refuse_embedded_state,
};
pub use self::inspect::{prune_guard, status, PruneSummary, Status};
pub use self::outbox::{
    outbox_backfill, outbox_dispatch, outbox_list, outbox_resend, outbox_retry, BackfillRun,
    DispatchRun,
};
pub use self::replay::{read_replay_file, replay, ReplaySummary};
pub use self::serve::serve;
pub use self::webhook::webhook;

use self::build::{open_checked, open_for_reading};

/// Log each record on the stream that gives it its severity on the
/// Functions host (`crate::logging`): warnings and errors on stderr, the
/// rest on stdout. `RUST_LOG` sets the filter (default `info`).
pub fn init_logging() {
    crate::logging::init();
}
