//! A cheap, shareable view of a loader's figures, read from any thread (the dashboard, the
//! metrics endpoint, a remote client's reports to its coordinator).

use std::sync::{Arc, Mutex};

use super::gpu_decode::LaneView;
use super::prefetch::{ControllerSnapshot, PrefetchController};
use super::slots::SlotPool;
use super::stats::{LoaderStats, StatsRecorder};

/// Reads a loader's figures from any thread; see [`crate::Loader::monitor`]. A coordinator
/// builds monitors of remote clients from their reports with [`LoaderMonitor::reported`].
#[derive(Clone)]
pub struct LoaderMonitor {
    source: MonitorSource,
}

#[derive(Clone)]
enum MonitorSource {
    /// A loader in this process.
    Local(LocalSources),
    /// The latest figures a remote client reported.
    Reported(Arc<Mutex<MonitorSnapshot>>),
}

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
    pub(crate) lane: Option<LaneView>,
}

/// One reading of a [`LoaderMonitor`].
#[derive(Debug, Clone, Default)]
pub struct MonitorSnapshot {
    /// Throughput, waits, stage times.
    pub stats: LoaderStats,
    /// The prefetch controller's view, in auto mode.
    pub controller: Option<ControllerSnapshot>,
    /// The fixed depth, when not in auto mode.
    pub fixed_prefetch: Option<usize>,
    /// Batch buffers in use (in flight, waiting, or held by the consumer).
    pub slots_in_use: usize,
    /// Batch buffers that may exist.
    pub slot_capacity: usize,
    /// Bytes per batch buffer.
    pub slot_bytes: usize,
    /// Decode threads.
    pub threads: usize,
}

impl LoaderMonitor {
    pub(crate) fn local(sources: LocalSources) -> Self {
        Self {
            source: MonitorSource::Local(sources),
        }
    }

    /// A monitor that shows whatever is written into `latest` (a remote client's reports).
    pub fn reported(latest: Arc<Mutex<MonitorSnapshot>>) -> Self {
        Self {
            source: MonitorSource::Reported(latest),
        }
    }

    /// The figures now.
    pub fn snapshot(&self) -> MonitorSnapshot {
        match &self.source {
            MonitorSource::Local(local) => MonitorSnapshot {
                stats: {
                    let mut stats = local.stats.lock().map(|s| s.snapshot()).unwrap_or_default();
                    stats.gpu_decode = local.lane.as_ref().and_then(LaneView::figures);
                    stats
                },
                controller: local
                    .controller
                    .as_ref()
                    .and_then(|c| c.lock().ok().map(|c| c.snapshot())),
                fixed_prefetch: local.fixed_prefetch,
                slots_in_use: local.slots.in_use(),
                slot_capacity: local.slots.capacity(),
                slot_bytes: local.slots.slot_bytes(),
                threads: local.threads,
            },
            MonitorSource::Reported(latest) => latest
                .lock()
                .map(|s| s.clone())
                .unwrap_or_else(|p| p.into_inner().clone()),
        }
    }
}
