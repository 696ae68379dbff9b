//! What the coordinator's dashboard shows of the fleet, refreshed on a timer: each worker's
//! load, each job's share of the workers, and how many workers the jobs want.
//!
//! Workers wanted: each client's demand is the batches it took per second divided by the part
//! of the time its trainer did *not* wait (a trainer that waited half the time would take twice
//! as many batches if they were there); one worker's capacity is the batches the workers
//! completed per second of time they had a batch in production (`busy_ns` in their reports).
//! Wanted = ⌈[`HEADROOM`] × Σ demand / capacity⌉ (the workers there are, at least one, until a
//! capacity is measured; 0 without clients). A client's figures are taken over its last
//! [`DEMAND_WINDOW`] of reports, not between two, so a step longer than a refresh does not make
//! its demand flip between nothing and several times what it takes. A client that took nothing
//! over that window while its trainer waited most of it is starved: what it would take cannot be
//! measured, so the count is never below the workers there are, nor below one.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
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
    /// Per (job, rank): its reports' (batches, wait ns, elapsed ns) over the last
    /// [`DEMAND_WINDOW`], oldest first, with one from before it.
    clients: HashMap<(u64, u32), VecDeque<ClientCounters>>,
    /// Batches one worker builds per busy second (smoothed), once measured.
    capacity: Option<f64>,
    /// When the last refresh was.
    at: Option<Instant>,
}

impl LastRefresh {
    /// The time since the last refresh (none before the first), this one `now`.
    pub(super) fn since_last(&mut self, now: Instant) -> Option<Duration> {
        self.at
            .replace(now)
            .map(|at| now.saturating_duration_since(at))
    }

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

/// The span of a client's own time its demand is measured over.
pub(super) const DEMAND_WINDOW: Duration = Duration::from_secs(10);

/// The part of its time a trainer that took no batch waited, from which it is starved.
const STARVED_STALL: f64 = 0.5;

/// What the clients' reports say they want.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Demand {
    /// Batches per second the clients would take if never kept waiting.
    pub(super) batches_per_s: f64,
    /// Some client took no batch over its window while its trainer waited most of it.
    pub(super) starved: bool,
}

/// Workers wanted for `demand` when one worker builds `capacity` batches/s and `workers` are
/// live.
pub(super) fn workers_wanted(demand: Demand, capacity: Option<f64>, workers: usize) -> u64 {
    let workers = workers as u64;
    let measured = if demand.batches_per_s <= 0.0 {
        0
    } else {
        match capacity.filter(|c| *c > 0.0) {
            Some(capacity) => ((HEADROOM * demand.batches_per_s / capacity).ceil() as u64).max(1),
            None => workers.max(1),
        }
    };
    if demand.starved {
        measured.max(workers).max(1)
    } else {
        measured
    }
}

/// A client's demand over its window of reports (`window`, oldest first): the batches it took
/// per second over the part of the time it did not wait, and whether it is starved.
fn client_demand(window: &VecDeque<ClientCounters>) -> Demand {
    let (Some(first), Some(last)) = (window.front(), window.back()) else {
        return Demand::default();
    };
    if last.2 <= first.2 {
        return Demand::default();
    }
    let elapsed = (last.2 - first.2) as f64 / 1e9;
    let taken = last.0.saturating_sub(first.0);
    let waited = last.1.saturating_sub(first.1) as f64 / 1e9 / elapsed;
    if taken == 0 {
        return Demand {
            batches_per_s: 0.0,
            starved: waited >= STARVED_STALL,
        };
    }
    let stall = waited.min(MAX_STALL);
    Demand {
        batches_per_s: taken as f64 / elapsed / (1.0 - stall),
        starved: false,
    }
}

/// Adds the report `now` to a client's window, keeping one report from before
/// [`DEMAND_WINDOW`]; a report whose clock went back (a client started again) starts it anew.
fn take_report(window: &mut VecDeque<ClientCounters>, now: ClientCounters) {
    match window.back() {
        Some(last) if *last == now => return,
        Some(last) if now.2 <= last.2 || now.0 < last.0 => window.clear(),
        _ => {}
    }
    window.push_back(now);
    let span = DEMAND_WINDOW.as_nanos() as u64;
    while window
        .get(1)
        .is_some_and(|second| now.2.saturating_sub(second.2) >= span)
    {
        window.pop_front();
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
    let mut demand = Demand::default();
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
        let window = last.clients.entry(*key).or_default();
        take_report(window, now);
        let client = client_demand(window);
        demand.batches_per_s += client.batches_per_s;
        demand.starved |= client.starved;
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

/// The decode threads one rank of `job` is shown against (its busy share, its stage times per
/// sample): those of the live workers that leased the job's tasks within [`SERVING_WINDOW`] of
/// `now`, shared equally among the job's reporting ranks, `rank` one of them (data-parallel
/// ranks take batches at one pace); 0 when no worker served it lately.
pub(super) fn rank_threads(
    (job, rank): (u64, u32),
    serving: &HashMap<u64, HashMap<u64, Instant>>,
    workers: &BTreeMap<u64, WorkerEntry>,
    clients: &BTreeMap<(u64, u32), ClientEntry>,
    now: Instant,
) -> usize {
    let threads: usize = serving.get(&job).map_or(0, |by| {
        by.iter()
            .filter(|(_, last)| now.saturating_duration_since(**last) < SERVING_WINDOW)
            .filter_map(|(worker, _)| workers.get(worker))
            .map(|worker| worker.threads as usize)
            .sum()
    });
    if threads == 0 {
        // Without a dashboard nothing is recorded as served: every report of every rank ends
        // here, never walking the ranks (a walk of all jobs' ranks each report, under the
        // state's lock, was quadratic in the ranks).
        return 0;
    }
    // The job's ranks alone, by the key's order.
    let ranks = 1 + clients
        .range((job, 0)..=(job, u32::MAX))
        .filter(|((_, other), _)| *other != rank)
        .count();
    ((threads + ranks / 2) / ranks).max(1)
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
            last.clients.insert((id, 0), VecDeque::from([(1, 1, 1)]));
        }
        let mut workers = BTreeMap::new();
        workers.insert(7, worker(7, 1));
        let jobs: HashSet<u64> = [3].into();
        last.forget_gone(&workers, &jobs, &BTreeMap::new());
        assert_eq!(last.held(), 4, "worker 7's three counters and job 3's");
        assert!(last.completed.contains_key(&7) && last.leased.contains_key(&3));
    }

    fn worker(id: u64, threads: u32) -> WorkerEntry {
        WorkerEntry {
            id,
            data_address: format!("w:{id}"),
            instance: 0,
            threads,
            data_roots: Vec::new(),
            registered_at: Instant::now(),
            completed: 0,
            failed: 0,
            bad_samples: 0,
            busy_ns: 0,
        }
    }

    /// A rank's figures were shown against every worker's threads: four ranks on a fleet
    /// busy all the time read 25% busy each, and less beside another job.
    #[test]
    fn a_rank_is_shown_against_its_share_of_the_workers_serving_its_job() {
        let now = Instant::now();
        let workers: BTreeMap<u64, WorkerEntry> =
            [(1, worker(1, 8)), (2, worker(2, 8)), (3, worker(3, 16))].into();
        // Job 5 served by workers 1 and 2; worker 3 serves job 6 only.
        let serving: HashMap<u64, HashMap<u64, Instant>> =
            [(5, [(1, now), (2, now)].into()), (6, [(3, now)].into())].into();
        let mut clients = BTreeMap::new();
        assert_eq!(
            rank_threads((5, 0), &serving, &workers, &clients, now),
            16,
            "the only rank"
        );
        for rank in 0..4 {
            clients.insert((5, rank), client_entry(5, rank));
        }
        clients.insert((6, 0), client_entry(6, 0));
        assert_eq!(rank_threads((5, 2), &serving, &workers, &clients, now), 4);
        assert_eq!(rank_threads((6, 0), &serving, &workers, &clients, now), 16);
        // A worker that served long ago, or is gone, counts for nothing.
        let later = now + SERVING_WINDOW;
        assert_eq!(rank_threads((5, 2), &serving, &workers, &clients, later), 0);
    }

    fn client_entry(job: u64, rank: u32) -> ClientEntry {
        ClientEntry {
            job,
            rank,
            epoch: 0,
            stats: Default::default(),
            acknowledged_position: 0,
            steps_per_epoch: 0,
            at: Instant::now(),
            session: 0,
        }
    }

    fn wanting(batches_per_s: f64) -> Demand {
        Demand {
            batches_per_s,
            starved: false,
        }
    }

    #[test]
    fn the_rates_are_over_the_time_since_the_last_refresh() {
        let mut last = LastRefresh::default();
        let start = Instant::now();
        assert_eq!(last.since_last(start), None);
        let late = start + Duration::from_millis(2300);
        assert_eq!(last.since_last(late), Some(Duration::from_millis(2300)));
        let workers: BTreeMap<u64, WorkerEntry> = [(1, worker(1, 4))].into();
        worker_loads(&workers, &mut last, Duration::from_millis(500));
        let mut busier = workers.clone();
        busier.get_mut(&1).unwrap().completed = 23;
        // 23 tasks over the 2.3 s that passed: 10/s, not 46/s over the planned 0.5 s.
        let loads = worker_loads(&busier, &mut last, Duration::from_millis(2300));
        let rate = loads[0].tasks_per_s.unwrap_or_default();
        assert!((rate - 10.0).abs() < 1e-9, "{rate}");
    }

    #[test]
    fn wanted_follows_demand_over_capacity_with_headroom() {
        // 10 batches/s wanted, 4 per worker: 10 * 1.2 / 4 = 3.
        assert_eq!(workers_wanted(wanting(10.0), Some(4.0), 2), 3);
        // Demand doubles: so does the count (rounded up).
        assert_eq!(workers_wanted(wanting(20.0), Some(4.0), 2), 6);
        // A trickle still wants one; no demand wants none.
        assert_eq!(workers_wanted(wanting(0.1), Some(4.0), 2), 1);
        assert_eq!(workers_wanted(wanting(0.0), Some(4.0), 2), 0);
        // Nothing measured yet: the workers there are, and one where there are none.
        assert_eq!(workers_wanted(wanting(5.0), None, 2), 2);
        assert_eq!(workers_wanted(wanting(5.0), None, 0), 1);
    }

    #[test]
    fn a_starved_client_wants_at_least_the_workers_there_are_and_one_where_there_are_none() {
        let starved = Demand {
            batches_per_s: 0.0,
            starved: true,
        };
        // Every worker gone (or a fleet starting from none) while a trainer waits.
        assert_eq!(workers_wanted(starved, None, 0), 1);
        assert_eq!(workers_wanted(starved, Some(4.0), 0), 1);
        // Workers there, none of their batches reaching it: not fewer.
        assert_eq!(workers_wanted(starved, Some(4.0), 3), 3);
        // Beside another client's measured demand, the larger count.
        let both = Demand {
            batches_per_s: 20.0,
            starved: true,
        };
        assert_eq!(workers_wanted(both, Some(4.0), 2), 6);
    }

    /// A client's report `at_ms` into its run having taken `batches` and waited `wait_ms`.
    fn report(batches: u64, wait_ms: u64, at_ms: u64) -> ClientCounters {
        (batches, wait_ms * 1_000_000, at_ms * 1_000_000)
    }

    #[test]
    fn a_client_that_takes_nothing_while_its_trainer_waits_is_starved() {
        let mut window = VecDeque::new();
        // Reports every 500 ms, no batch, waiting all along.
        for tick in 0..6u64 {
            take_report(&mut window, report(40, tick * 500, tick * 500));
        }
        let demand = client_demand(&window);
        assert!(demand.starved && demand.batches_per_s == 0.0, "{demand:?}");
        // A trainer that takes nothing and does not wait (between epochs, evaluating) is not.
        let mut idle = VecDeque::new();
        for tick in 0..6u64 {
            take_report(&mut idle, report(40, 0, tick * 500));
        }
        assert_eq!(client_demand(&idle), Demand::default());
    }

    #[test]
    fn a_step_longer_than_a_refresh_gives_a_steady_demand() {
        // A trainer stepping every 1.5 s, one batch per step, waiting 300 ms of each (the
        // wait counted as it goes), reported every 500 ms: it would take 1 / 1.2 s = 0.83/s.
        let mut window = VecDeque::new();
        let mut estimates = Vec::new();
        for tick in 0..80u64 {
            let at = tick * 500;
            let (steps, into) = (at / 1500, at % 1500);
            let wait = steps * 300 + into.min(300);
            take_report(&mut window, report(steps, wait, at));
            if at >= 12_000 {
                estimates.push(client_demand(&window).batches_per_s);
            }
        }
        let (low, high) = estimates
            .iter()
            .fold((f64::MAX, 0f64), |(lo, hi), e| (lo.min(*e), hi.max(*e)));
        assert!(
            low > 0.75 && high < 0.92,
            "the demand read {low:.2}..{high:.2} batches/s"
        );
        // The window holds 10 s of reports, not the whole run.
        assert!(window.len() <= 22, "{} reports held", window.len());
    }

    #[test]
    fn a_client_started_again_is_measured_from_its_new_reports() {
        let mut window = VecDeque::new();
        for tick in 0..10u64 {
            take_report(&mut window, report(tick * 10, 0, tick * 1000));
        }
        // A new run under the same rank: its counters start over.
        take_report(&mut window, report(2, 0, 1000));
        assert_eq!(window.len(), 1);
        take_report(&mut window, report(6, 0, 2000));
        let demand = client_demand(&window);
        assert!((demand.batches_per_s - 4.0).abs() < 1e-9, "{demand:?}");
    }
}
