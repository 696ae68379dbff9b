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
    Local {
        stats: Arc<Mutex<StatsRecorder>>,
        controller: Option<Arc<Mutex<PrefetchController>>>,
        slots: Arc<SlotPool>,
        threads: usize,
        fixed_prefetch: Option<usize>,
        lane: Option<LaneView>,
    },
    /// The latest figures a remote client reported.
    Reported(Arc<Mutex<MonitorSnapshot>>),
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
    pub(crate) fn local(
        stats: Arc<Mutex<StatsRecorder>>,
        controller: Option<Arc<Mutex<PrefetchController>>>,
        slots: Arc<SlotPool>,
        threads: usize,
        fixed_prefetch: Option<usize>,
        lane: Option<LaneView>,
    ) -> Self {
        Self {
            source: MonitorSource::Local {
                stats,
                controller,
                slots,
                threads,
                fixed_prefetch,
                lane,
            },
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
            MonitorSource::Local {
                stats,
                controller,
                slots,
                threads,
                fixed_prefetch,
                lane,
            } => MonitorSnapshot {
                stats: {
                    let mut stats = stats.lock().map(|s| s.snapshot()).unwrap_or_default();
                    stats.gpu_decode = lane.as_ref().and_then(LaneView::figures);
                    stats
                },
                controller: controller
                    .as_ref()
                    .and_then(|c| c.lock().ok().map(|c| c.snapshot())),
                fixed_prefetch: *fixed_prefetch,
                slots_in_use: slots.in_use(),
                slot_capacity: slots.capacity(),
                slot_bytes: slots.slot_bytes(),
                threads: *threads,
            },
            MonitorSource::Reported(latest) => latest
                .lock()
                .map(|s| s.clone())
                .unwrap_or_else(|p| p.into_inner().clone()),
        }
    }
}
