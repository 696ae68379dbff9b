//! A loader's figures, read by a [`LoaderMonitor`] from any thread: the loader's side of the
//! dashboard crate's [`MonitorSource`] hook.

use std::sync::{Arc, Mutex, Weak};

use stoker_dashboard::{LoaderMonitor, MonitorSnapshot, MonitorSource};

use super::decode_lane::DecodeLane;
use super::prefetch::PrefetchController;
use super::slots::SlotPool;
use super::stats::StatsRecorder;

/// Where a loader in this process keeps the figures a monitor reads.
#[derive(Clone)]
pub(crate) struct LocalSources {
    pub(crate) stats: Arc<Mutex<StatsRecorder>>,
    /// The prefetch controller, in auto mode.
    pub(crate) controller: Option<Arc<Mutex<PrefetchController>>>,
    /// The slot pool, read without keeping it (and its memory, page-locked or not) alive
    /// once the loader is dropped: 0s then.
    pub(crate) slots: Weak<SlotPool>,
    pub(crate) threads: usize,
    /// The fixed depth, when not in auto mode.
    pub(crate) fixed_prefetch: Option<usize>,
    /// The decode lane, read through its figures hook without keeping it alive.
    pub(crate) lane: Option<Weak<dyn DecodeLane>>,
}

impl LocalSources {
    /// A monitor of these figures.
    pub(crate) fn monitor(self) -> LoaderMonitor {
        LoaderMonitor::new(Arc::new(self))
    }
}

impl MonitorSource for LocalSources {
    fn snapshot(&self) -> MonitorSnapshot {
        let slots = self.slots.upgrade();
        MonitorSnapshot {
            stats: {
                let mut stats = self.stats.lock().map(|s| s.snapshot()).unwrap_or_default();
                stats.gpu_decode = self
                    .lane
                    .as_ref()
                    .and_then(Weak::upgrade)
                    .map(|lane| lane.figures());
                stats
            },
            controller: self
                .controller
                .as_ref()
                .and_then(|c| c.lock().ok().map(|c| c.snapshot())),
            fixed_prefetch: self.fixed_prefetch,
            slots_in_use: slots.as_ref().map_or(0, |pool| pool.in_use()),
            slot_capacity: slots.as_ref().map_or(0, |pool| pool.capacity()),
            slot_bytes: slots.as_ref().map_or(0, |pool| pool.slot_bytes()),
            threads: self.threads,
            threads_shared: false,
            report_age_s: None,
        }
    }
}
