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
    pub(crate) slots: Arc<SlotPool>,
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
            slots_in_use: self.slots.in_use(),
            slot_capacity: self.slots.capacity(),
            slot_bytes: self.slots.slot_bytes(),
            threads: self.threads,
        }
    }
}
