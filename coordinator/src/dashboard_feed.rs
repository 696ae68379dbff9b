//! What the coordinator's dashboard shows of the fleet, refreshed on a timer: each worker's
//! load, each job's share of the workers, and how many workers the jobs want.
//!
//! Workers wanted: each client's demand is the batches it took per second divided by the part
//! of the time its trainer did *not* wait (a trainer that waited half the time would take twice
//! as many batches if they were there); one worker's capacity is the batches the workers
//! completed per second of time they had a batch in production (`busy_ns` in their reports).
//! Wanted = ⌈[`HEADROOM`] × Σ demand / capacity⌉ (the workers there are, until a capacity is
//! measured; 0 without clients).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use super::client_reports::job_name;
use crate::registry::{ClientEntry, WorkerEntry};
use crate::Coordinator;
use stoker_dashboard::{JobShare, WorkerLoad};

/// Counters at the previous refresh, for the per-second figures.
#[derive(Debug, Default)]
pub(super) struct LastRefresh {
    /// Tasks completed per worker.
    completed: HashMap<u64, u64>,
    /// Tasks completed per worker between the last two refreshes.
    recent_completed: HashMap<u64, u64>,
    /// Tasks leased per job.
    leased: HashMap<u64, u64>,
    /// Busy nanoseconds reported per worker.
    busy_ns: HashMap<u64, u64>,
    /// Per (job, rank): (batches, wait ns, elapsed ns) of the last report used, and the demand
    /// (batches/s) it gave.
    clients: HashMap<(u64, u32), (ClientCounters, f64)>,
    /// Batches one worker builds per busy second (smoothed), once measured.
    capacity: Option<f64>,
}

impl LastRefresh {
    /// Forgets the counters of workers, jobs and clients no longer there (a worker gone or
    /// registered again under a new id, a job retired, a client's session closed), so a
    /// coordinator serving job after job for months keeps only the live ones.
    pub(super) fn forget_gone(
        &mut self,
        workers: &BTreeMap<u64, WorkerEntry>,
        jobs: &HashSet<u64>,
        clients: &BTreeMap<(u64, u32), ClientEntry>,
    ) {
        for by_worker in [
            &mut self.completed,
            &mut self.recent_completed,
            &mut self.busy_ns,
        ] {
            by_worker.retain(|worker, _| workers.contains_key(worker));
        }
        self.leased.retain(|job, _| jobs.contains(job));
        self.clients.retain(|key, _| clients.contains_key(key));
    }

    /// Entries held, over every map (for tests).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.completed.len()
            + self.recent_completed.len()
            + self.busy_ns.len()
            + self.leased.len()
            + self.clients.len()
    }
}

/// A client's (batches, wait ns, elapsed ns) as reported.
type ClientCounters = (u64, u64, u64);

/// Room over the measured demand the wanted count keeps.
pub(super) const HEADROOM: f64 = 1.2;

/// The most of its time a trainer is taken to wait when its demand is estimated (so that a
/// trainer that only waits counts as wanting 20 times what it gets, not infinitely more).
const MAX_STALL: f64 = 0.95;

/// Clients silent this long no longer count towards the demand.
const CLIENT_SILENCE: Duration = Duration::from_secs(10);

/// Workers wanted for `demand` batches/s when one worker builds `capacity` batches/s.
pub(super) fn workers_wanted(demand: f64, capacity: Option<f64>, workers: usize) -> u64 {
    if demand <= 0.0 {
        return 0;
    }
    match capacity.filter(|c| *c > 0.0) {
        Some(capacity) => ((HEADROOM * demand / capacity).ceil() as u64).max(1),
        None => workers as u64,
    }
}

/// Live workers and how many the clients' demand wants (see the module's doc).
pub(super) fn fleet(
    workers: &BTreeMap<u64, WorkerEntry>,
    clients: &BTreeMap<(u64, u32), ClientEntry>,
    last: &mut LastRefresh,
) -> (u64, u64) {
    // Capacity: completions over busy seconds, across workers, since the last refresh. The
    // completed counts were taken by `worker_loads` (called first), so read them back here.
    let (mut done, mut busy_s) = (0u64, 0f64);
    for w in workers.values() {
        let before = last.busy_ns.insert(w.id, w.busy_ns);
        let busy = w.busy_ns.saturating_sub(before.unwrap_or(w.busy_ns));
        if busy > 0 {
            busy_s += busy as f64 / 1e9;
            done += last.recent_completed.get(&w.id).copied().unwrap_or(0);
        }
    }
    if busy_s > 0.0 && done > 0 {
        let measured = done as f64 / busy_s;
        last.capacity = Some(match last.capacity {
            Some(old) => 0.7 * old + 0.3 * measured,
            None => measured,
        });
    }
    let mut demand = 0.0;
    for (key, entry) in clients {
        if entry.at.elapsed() > CLIENT_SILENCE {
            last.clients.remove(key);
            continue;
        }
        let now = (
            entry.stats.batches,
            entry.stats.wait_ns,
            entry.stats.elapsed_ns,
        );
        let estimate = match last.clients.get(key) {
            Some(&(before, estimate)) if before == now => estimate,
            Some(&(before, _)) if now.2 > before.2 => {
                let elapsed = (now.2 - before.2) as f64 / 1e9;
                let rate = now.0.saturating_sub(before.0) as f64 / elapsed;
                let stall = (now.1.saturating_sub(before.1) as f64 / 1e9 / elapsed).min(MAX_STALL);
                rate / (1.0 - stall)
            }
            _ => 0.0,
        };
        last.clients.insert(*key, (now, estimate));
        demand += estimate;
    }
    let wanted = workers_wanted(demand, last.capacity, workers.len());
    (workers.len() as u64, wanted)
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
            last.recent_completed
                .insert(w.id, before.map_or(0, |b| w.completed.saturating_sub(b)));
            WorkerLoad {
                name: worker_name(w),
                threads: w.threads as usize,
                tasks_per_s: before.map(|b| w.completed.saturating_sub(b) as f64 / secs(interval)),
                tasks: w.completed,
                failed: w.failed,
                bad_samples: w.bad_samples,
            }
        })
        .collect()
}

/// A worker serves a job on the dashboard while its last lease of the job's tasks is this
/// recent.
pub(super) const SERVING_WINDOW: Duration = Duration::from_secs(10);

/// Per job, the live workers that leased one of its tasks within [`SERVING_WINDOW`] of `now`,
/// named as on the worker cards; forgets older entries and workers gone.
pub(super) fn serving_workers(
    serving: &mut HashMap<u64, HashMap<u64, Instant>>,
    workers: &BTreeMap<u64, WorkerEntry>,
    now: Instant,
) -> HashMap<u64, Vec<String>> {
    serving.retain(|_, by| {
        by.retain(|worker, last| {
            workers.contains_key(worker) && now.saturating_duration_since(*last) < SERVING_WINDOW
        });
        !by.is_empty()
    });
    serving
        .iter()
        .map(|(job, by)| {
            let mut names: Vec<(u64, String)> = by
                .keys()
                .filter_map(|id| Some((*id, worker_name(workers.get(id)?))))
                .collect();
            names.sort_unstable();
            (*job, names.into_iter().map(|(_, name)| name).collect())
        })
        .collect()
}

/// A worker's name on the dashboard.
fn worker_name(worker: &WorkerEntry) -> String {
    format!("worker {} ({})", worker.id, worker.data_address)
}

/// Each registered job's share of the workers since the previous refresh, `interval` ago, and
/// the workers serving it.
pub(super) fn job_shares(
    core: &Coordinator,
    last: &mut LastRefresh,
    interval: Duration,
    mut serving: HashMap<u64, Vec<String>>,
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
            workers: serving.remove(job).unwrap_or_default(),
        })
        .collect()
}

fn secs(interval: Duration) -> f64 {
    interval.as_secs_f64().max(1e-3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_of_workers_jobs_and_clients_gone_are_forgotten() {
        let mut last = LastRefresh::default();
        for id in 0..100u64 {
            last.completed.insert(id, 1);
            last.recent_completed.insert(id, 1);
            last.busy_ns.insert(id, 1);
            last.leased.insert(id, 1);
            last.clients.insert((id, 0), ((1, 1, 1), 1.0));
        }
        let mut workers = BTreeMap::new();
        workers.insert(
            7,
            WorkerEntry {
                id: 7,
                data_address: "w:1".into(),
                threads: 1,
                data_roots: Vec::new(),
                registered_at: Instant::now(),
                completed: 0,
                failed: 0,
                bad_samples: 0,
                busy_ns: 0,
            },
        );
        let jobs: HashSet<u64> = [3].into();
        last.forget_gone(&workers, &jobs, &BTreeMap::new());
        assert_eq!(last.held(), 4, "worker 7's three counters and job 3's");
        assert!(last.completed.contains_key(&7) && last.leased.contains_key(&3));
    }

    #[test]
    fn wanted_follows_demand_over_capacity_with_headroom() {
        // 10 batches/s wanted, 4 per worker: 10 * 1.2 / 4 = 3.
        assert_eq!(workers_wanted(10.0, Some(4.0), 2), 3);
        // Demand doubles: so does the count (rounded up).
        assert_eq!(workers_wanted(20.0, Some(4.0), 2), 6);
        // A trickle still wants one; no demand wants none.
        assert_eq!(workers_wanted(0.1, Some(4.0), 2), 1);
        assert_eq!(workers_wanted(0.0, Some(4.0), 2), 0);
        // Nothing measured yet: the workers there are.
        assert_eq!(workers_wanted(5.0, None, 2), 2);
    }
}
