//! How `dead-letters replay` shows its progress: a bar (blobs and events
//! done, rate, time left) when stderr is a terminal, one plain line per
//! blob otherwise (a pipeline, a log file, the Functions host).

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};

use indicatif::{ProgressBar, ProgressStyle};

use super::sweep::Progress;
use crate::text::escaped;

/// The right kind for this process's stderr.
pub fn for_stderr() -> Box<dyn Progress> {
    if std::io::stderr().is_terminal() {
        Box::new(Bar {
            bar: ProgressBar::hidden(),
            events: AtomicU64::new(0),
        })
    } else {
        Box::new(Lines {
            total: AtomicU64::new(0),
            done: AtomicU64::new(0),
        })
    }
}

struct Bar {
    bar: ProgressBar,
    events: AtomicU64,
}

impl Progress for Bar {
    fn start(&self, blobs: u64) {
        self.bar.set_length(blobs);
        self.bar.set_style(
            ProgressStyle::with_template(
                "{bar:30} {pos}/{len} blobs, {msg} [{elapsed_precise}, {per_sec}, {eta} left]",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        self.bar.set_message("0 events");
        self.bar
            .set_draw_target(indicatif::ProgressDrawTarget::stderr());
    }
    fn blob_done(&self, _name: &str, events: u64, _note: &str) {
        let total = self.events.fetch_add(events, Ordering::Relaxed) + events;
        self.bar.set_message(format!("{total} events"));
        self.bar.inc(1);
    }
    fn finish(&self) {
        self.bar.finish();
    }
}

struct Lines {
    total: AtomicU64,
    done: AtomicU64,
}

impl Progress for Lines {
    fn start(&self, blobs: u64) {
        self.total.store(blobs, Ordering::Relaxed);
        eprintln!("{blobs} dead-letter blobs to look at");
    }
    fn blob_done(&self, name: &str, events: u64, note: &str) {
        let done = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        eprintln!(
            "blob {done}/{} {} ({events} events): {}",
            self.total.load(Ordering::Relaxed),
            escaped(name),
            escaped(note)
        );
    }
}
