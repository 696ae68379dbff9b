//! How any thread reaches a `NativeLoader`'s parts: the loaders and the dashboard behind one
//! lock held only for short work, the epoch's stream behind another, which `next_batch` holds
//! while it waits. Both are taken with the interpreter let go (`lock_py_attached`), so neither
//! can deadlock against it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard, PoisonError};

use pyo3::prelude::*;
use pyo3::sync::MutexExt;
use stoker_loader::{Dashboard, EpochStream, Loader};

use crate::buffer::PinnedRelease;
use crate::errors::{raise, Kind};

use super::NativeLoader;

/// What `close` lets go of, besides the stream.
#[derive(Default)]
pub(super) struct Held {
    pub(super) loader: Option<Arc<Loader>>,
    /// The loader of an epoch resumed on another world size, and that epoch: it serves that
    /// epoch only.
    pub(super) resumed: Option<(u64, Arc<Loader>)>,
    /// An epoch resumed on another world size with nothing left for this rank (no loader): it
    /// has no steps, and runs empty.
    pub(super) resumed_empty: Option<u64>,
    pub(super) dashboard: Option<Dashboard>,
    /// The job name and rank the dashboard charts this loader as.
    pub(super) charted_as: (String, u32),
    /// Whether the dashboard charts the resumed epoch's loader (while it serves its epoch)
    /// rather than the plain one.
    pub(super) charting_resumed: bool,
}

/// An epoch's stream and the slot pool of the loader it reads (the plain or the resumed one).
pub(super) struct Current {
    pub(super) stream: EpochStream,
    pub(super) slots: Arc<stoker_loader::SlotPool>,
    /// The step of the last batch handed to Python: one Python did not get (an exception
    /// raised as the call returned) is one it sees handed and not yielded.
    pub(super) handed: Option<u64>,
}

/// How page-locked slots are let go, and their pool.
pub(super) type SlotRelease = (Arc<PinnedRelease>, Arc<stoker_loader::SlotPool>);

impl Held {
    pub(super) fn loader(&self) -> PyResult<&Arc<Loader>> {
        self.loader.as_ref().ok_or_else(closed)
    }

    /// The loader that builds `epoch`: the one of an epoch resumed on another world size, else
    /// the plain one.
    pub(super) fn loader_of(&self, epoch: u64) -> PyResult<&Arc<Loader>> {
        let plain = self.loader()?;
        Ok(match &self.resumed {
            Some((resumed, loader)) if *resumed == epoch => loader,
            _ => plain,
        })
    }

    /// Whether `epoch` is the one resumed on another world size (its own loader builds it).
    fn is_resumed(&self, epoch: u64) -> bool {
        matches!(&self.resumed, Some((resumed, _)) if *resumed == epoch)
    }

    /// Steps of `epoch` for this rank (0 for a resumed epoch with nothing left).
    pub(super) fn steps_in(&self, epoch: u64) -> PyResult<u64> {
        if self.resumed_empty == Some(epoch) {
            self.loader()?;
            return Ok(0);
        }
        Ok(self.loader_of(epoch)?.steps_per_epoch())
    }

    /// The loader that starts `epoch` and the step it starts at: for a resumed epoch with
    /// nothing left, the plain loader from its end (it runs empty). A resumed epoch with
    /// nothing left is forgotten once a later one starts.
    pub(super) fn start_of(&mut self, epoch: u64, step: u64) -> PyResult<(Arc<Loader>, u64)> {
        let loader = Arc::clone(self.loader_of(epoch)?);
        self.chart(self.is_resumed(epoch), &loader);
        let empty = self.resumed_empty == Some(epoch);
        self.resumed_empty = self.resumed_empty.filter(|&empty| empty >= epoch);
        let step = if empty {
            loader.steps_per_epoch()
        } else {
            step
        };
        Ok((loader, step))
    }

    /// Lets go of the resumed epoch's loader (returned, to be dropped without the GIL), and
    /// records `empty` as a resumed epoch with nothing left, or none.
    pub(super) fn let_go_of_resumed(&mut self, empty: Option<u64>) -> Option<(u64, Arc<Loader>)> {
        self.resumed_empty = empty;
        if let Some(plain) = self.loader.clone() {
            self.chart(false, &plain);
        }
        self.resumed.take()
    }

    /// Has the dashboard chart `loader`, the resumed epoch's when `resumed`, when it charts
    /// the other one now (its history starts afresh: the figures are another loader's).
    fn chart(&mut self, resumed: bool, loader: &Loader) {
        if resumed == self.charting_resumed {
            return;
        }
        self.charting_resumed = resumed;
        if let Some(dashboard) = &self.dashboard {
            let (name, rank) = &self.charted_as;
            dashboard.register_job(name, *rank, loader.monitor());
        }
    }
}

/// The mark of the thread waiting in `next_batch`, cleared when dropped.
pub(super) struct Waiting<'a>(&'a std::sync::Mutex<Option<std::thread::ThreadId>>);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// The error of a call on a closed loader.
pub(super) fn closed() -> PyErr {
    raise(Kind::Stoker, "the loader is closed".into())
}

impl NativeLoader {
    /// The loaders, locked (waiting with the interpreter let go). A panic while it was held
    /// left nothing half-changed that matters here, so a poisoned lock is used as it is.
    pub(super) fn held(&self, py: Python<'_>) -> MutexGuard<'_, Held> {
        self.held
            .lock_py_attached(py)
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The current stream, locked (waiting with the interpreter let go, for as long as a
    /// `next_batch` in another thread waits).
    pub(super) fn current(&self, py: Python<'_>) -> MutexGuard<'_, Option<Current>> {
        self.current
            .lock_py_attached(py)
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks this thread as the one waiting in `next_batch` until the guard is dropped.
    pub(super) fn waiting_here(&self) -> Waiting<'_> {
        *self.waiting.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(std::thread::current().id());
        Waiting(&self.waiting)
    }

    /// Whether this thread is the one waiting in `next_batch` (a call from a signal handler
    /// Python runs during that wait).
    pub(super) fn waits_here(&self) -> bool {
        *self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
            == Some(std::thread::current().id())
    }

    /// Drops `current` (a stream taken out) and the loaders, the interpreter let go: the
    /// plain loader, the resumed one, then the dashboard.
    pub(super) fn let_go(&self, py: Python<'_>, current: Option<Current>) {
        let mut held = std::mem::take(&mut *self.held(py));
        py.detach(|| {
            drop(current);
            drop(held.resumed.take());
            drop(held);
        });
    }

    pub(super) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// The started stream in `current`; a StokerError before `start_epoch` or after close.
    pub(super) fn started<'a>(
        &self,
        current: &'a mut Option<Current>,
    ) -> PyResult<&'a mut Current> {
        if self.is_closing() {
            return Err(closed());
        }
        current
            .as_mut()
            .ok_or_else(|| raise(Kind::Stoker, "no epoch started: call start_epoch".into()))
    }

    /// The release of `current`'s page-locked slots, if they are.
    pub(super) fn release_for(&self, current: &Current) -> Option<SlotRelease> {
        Some((self.release.clone()?, Arc::clone(&current.slots)))
    }
}
