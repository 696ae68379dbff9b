//! The native side's warnings and errors on Python's `stoker` logger.
//!
//! The crates log through `tracing`; in a Python process nothing read those events, so a
//! retry loop against an unreachable coordinator or a slot pool that shrank the prefetch
//! depth said nothing. The module installs a `tracing` subscriber that keeps the events of the
//! loader's side (the client library, the GPU half, this module: warnings and errors; the
//! tokenizer's notices; and what the datasets crate says of how a source's files and labels are
//! taken) in a bounded queue once a loader is made, and [`forward`] hands them to `logging` on a thread
//! that holds the interpreter: while `next()` waits (every check for Ctrl-C), when it returns,
//! and where the Python side calls `forward_logs()`. What the Python side already says (a
//! dataset's notices, bad samples) comes from other targets and is not sent twice.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once, PoisonError};

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// Events kept until forwarded; past it the oldest go, counted.
const KEPT: usize = 256;

/// The targets forwarded and the least severe level of each.
const FORWARDED: [(&str, Level); 8] = [
    ("stoker_loader", Level::WARN),
    ("stoker_gpu", Level::WARN),
    // This module's own (its library is named `_native`).
    ("_native", Level::WARN),
    ("stoker_pipeline::ops::tokenize", Level::INFO),
    // Packing that drops most of a batch's tokens, or pads most of its rows (said once).
    ("stoker_pipeline::ops::pack", Level::WARN),
    // What a source's files are taken as, said nowhere else: a split folder's subfolders not
    // read, hub shards named by a pattern that are not one set, a label column chosen among
    // several.
    ("stoker_datasets::naming", Level::WARN),
    ("stoker_datasets::label_checks", Level::WARN),
    // A tar member left out, and why (the first ones of each shard; opening's notice counts
    // them all).
    ("stoker_datasets::tar_shards::scan", Level::WARN),
];

/// One event waiting: its level, target and text (message, then its fields).
struct Record {
    level: Level,
    target: String,
    text: String,
}

static WAITING: Mutex<VecDeque<Record>> = Mutex::new(VecDeque::new());
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Whether an event of `metadata` is forwarded.
fn wanted(metadata: &Metadata<'_>) -> bool {
    FORWARDED
        .iter()
        .any(|(prefix, least)| metadata.target().starts_with(prefix) && *metadata.level() <= *least)
}

/// The layer that queues the forwarded events.
struct Queue;

impl<S: Subscriber> Layer<S> for Queue {
    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        wanted(metadata)
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let metadata = event.metadata();
        if !wanted(metadata) {
            return;
        }
        let mut text = Text::default();
        event.record(&mut text);
        let mut waiting = WAITING.lock().unwrap_or_else(PoisonError::into_inner);
        if waiting.len() == KEPT {
            waiting.pop_front();
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
        waiting.push_back(Record {
            level: *metadata.level(),
            target: metadata.target().to_string(),
            text: text.finish(),
        });
    }
}

/// An event's message and its other fields as `name=value`.
#[derive(Default)]
struct Text {
    message: String,
    fields: String,
}

impl Text {
    fn finish(self) -> String {
        if self.fields.is_empty() {
            self.message
        } else {
            format!("{} ({})", self.message, self.fields.trim_start())
        }
    }
}

impl Visit for Text {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }
}

/// Installs the queue as the process's `tracing` subscriber when the first loader is made (not
/// at import: the package's `stoker-lane-helper` command, which makes none, logs to stderr
/// through its own), unless one is already set (by another extension module): then nothing is
/// forwarded.
pub(crate) fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let subscriber = tracing_subscriber::registry().with(Queue);
        // Fails only where the process has a subscriber already; that one is kept.
        let _ = tracing::subscriber::set_global_default(subscriber);
    });
}

/// Hands the queued events to `logging.getLogger("stoker")`, each at its level (and how many
/// were dropped, if any). A failure of `logging` itself is left to it; an exception that is
/// not an `Exception` (a `KeyboardInterrupt` a signal handler raised while a handler ran) is
/// returned, so that a waiting `next()` ends with it rather than losing it.
pub(crate) fn forward(py: Python<'_>) -> PyResult<()> {
    let records: Vec<Record> = {
        let mut waiting = WAITING.lock().unwrap_or_else(PoisonError::into_inner);
        waiting.drain(..).collect()
    };
    let dropped = DROPPED.swap(0, Ordering::Relaxed);
    if records.is_empty() && dropped == 0 {
        return Ok(());
    }
    let kept = |outcome: PyResult<Bound<'_, PyAny>>| match outcome {
        Err(error) if !error.is_instance_of::<PyException>(py) => Err(error),
        _ => Ok(()),
    };
    let logger = match py
        .import("logging")
        .and_then(|logging| logging.call_method1("getLogger", ("stoker",)))
    {
        Ok(logger) => logger,
        Err(error) => return kept(Err(error)),
    };
    if dropped > 0 {
        kept(logger.call_method1(
            "warning",
            (
                "%d native log messages were dropped (more than %d waiting)",
                dropped,
                KEPT,
            ),
        ))?;
    }
    for record in records {
        let level = match record.level {
            Level::ERROR => 40,
            Level::WARN => 30,
            Level::INFO => 20,
            _ => 10,
        };
        kept(logger.call_method1("log", (level, "%s [%s]", record.text, record.target)))?;
    }
    Ok(())
}

/// `forward_logs()`: hands the native side's queued warnings and errors to the `stoker`
/// logger now.
#[pyfunction]
pub(crate) fn forward_logs(py: Python<'_>) -> PyResult<()> {
    forward(py)
}
