//! What the coordinator's dashboard shows of the fleet, refreshed on a timer: each worker's
//! load and each job's share of the workers.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::client_reports::job_name;
use super::service::WorkerEntry;
use crate::coordinator::Coordinator;
use crate::{JobShare, WorkerLoad};

/// Counters at the previous refresh, for the per-second figures.
#[derive(Debug, Default)]
pub(super) struct LastRefresh {
    /// Tasks completed per worker.
    completed: HashMap<u64, u64>,
    /// Tasks leased per job.
    leased: HashMap<u64, u64>,
}

/// Each worker's load since the previous refresh, `interval` ago.
pub(super) fn worker_loads(
    workers: &BTreeMap<u64, WorkerEntry>,
    last: &mut LastRefresh,
    interval: Duration,
) -> Vec<WorkerLoad> {
    workers
        .values()
        .map(|w| {
            let before = last.completed.insert(w.id, w.completed);
            WorkerLoad {
                name: format!("worker {} ({})", w.id, w.data_address),
                threads: w.threads as usize,
                tasks_per_s: before.map(|b| w.completed.saturating_sub(b) as f64 / secs(interval)),
                tasks: w.completed,
                failed: w.failed,
                bad_samples: w.bad_samples,
            }
        })
        .collect()
}

/// Each registered job's share of the workers since the previous refresh, `interval` ago.
pub(super) fn job_shares(
    core: &Coordinator,
    last: &mut LastRefresh,
    interval: Duration,
) -> Vec<JobShare> {
    let now: Vec<(u64, super::JobShareStats)> = core
        .jobs()
        .map(|(id, _, _)| (id.0, core.job_share(id)))
        .collect();
    let recent: Vec<Option<u64>> = now
        .iter()
        .map(|(job, share)| {
            let before = last.leased.insert(*job, share.leased);
            before.map(|b| share.leased.saturating_sub(b))
        })
        .collect();
    let total: u64 = recent.iter().flatten().sum();
    now.iter()
        .zip(recent)
        .map(|((job, share), recent)| JobShare {
            name: job_name(core, *job),
            weight: share.weight,
            leases: share.leased,
            leases_per_s: recent.map(|r| r as f64 / secs(interval)),
            lease_fraction: recent
                .filter(|_| total > 0)
                .map(|r| r as f64 / total as f64),
            waiting_sessions: share.ready_sessions,
        })
        .collect()
}

fn secs(interval: Duration) -> f64 {
    interval.as_secs_f64().max(1e-3)
}
