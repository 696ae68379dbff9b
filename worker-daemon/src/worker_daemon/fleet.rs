//! The coordinators of the worker's list (one, or a fleet's, jobs sharded over them): a task
//! loop against each over the one decode pool, each coordinator's place (its job ids are its
//! own), the worker's deliveries in flight split between them by the sessions waiting at each
//! ([`Shares`]), and the registrations the probes read.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use stoker_rpc::health::Health;

use super::delivery::Draining;
use super::leases::task_loop;
use super::{lock, Shared, WorkerConfig};

/// Runs one task loop per coordinator of `coordinators` until every one has ended; aborting
/// this future's task aborts them all. A loop that panics (a bug) ends them all, and the
/// error says so: the worker then stops, rather than go on serving with no loop taking tasks.
pub(super) async fn task_loops(
    config: WorkerConfig,
    coordinators: Vec<String>,
    shared: Arc<Shared>,
    draining: Draining,
) -> Result<(), String> {
    let registrations = Arc::new(Registrations::new(
        config.health.clone(),
        coordinators.len(),
    ));
    let budget = config.lease_ahead.max(1).saturating_mul(2);
    let shares = Arc::new(Shares::new(budget, coordinators.len()));
    let mut set = tokio::task::JoinSet::new();
    for (index, address) in coordinators.into_iter().enumerate() {
        let place = Place {
            index,
            address,
            registrations: registrations.clone(),
            shares: shares.clone(),
        };
        set.spawn(task_loop(
            config.clone(),
            place,
            shared.clone(),
            draining.clone(),
        ));
    }
    first_panic(set).await
}

/// Waits for every task of `set` to end; the first that panics ends the others, and its panic
/// is the error.
async fn first_panic(mut set: tokio::task::JoinSet<()>) -> Result<(), String> {
    while let Some(ended) = set.join_next().await {
        if let Err(error) = ended {
            if error.is_panic() {
                set.abort_all();
                return Err(format!("a task loop panicked: {error}"));
            }
        }
    }
    Ok(())
}

/// A coordinator of the worker's list: its place (job ids are its own), its address, the
/// registrations the probes read, and the shares of the worker's deliveries.
#[derive(Clone)]
pub(super) struct Place {
    pub(super) index: usize,
    pub(super) address: String,
    pub(super) registrations: Arc<Registrations>,
    pub(super) shares: Arc<Shares>,
}

/// How a worker serving several coordinators splits its deliveries in flight between them: in
/// proportion to the sessions waiting at each (as each coordinator's last lease answer said),
/// so a shard with three times the waiting clients gets three times the worker. No clock and
/// no I/O: the task loops note what each coordinator said and ask for their room.
pub(super) struct Shares {
    /// Deliveries in flight the worker allows over all its coordinators.
    budget: u32,
    /// Each coordinator's waiting sessions at its last answer.
    waiting: Vec<AtomicU32>,
}

impl Shares {
    pub(super) fn new(budget: u32, coordinators: usize) -> Self {
        Self {
            budget: budget.max(1),
            waiting: (0..coordinators).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// Coordinator `place` answered a lease with `waiting` sessions waiting (0 once the worker
    /// has lost it).
    pub(super) fn note(&self, place: usize, waiting: u32) {
        if let Some(slot) = self.waiting.get(place) {
            slot.store(waiting, Ordering::Relaxed);
        }
    }

    /// The deliveries coordinator `place` may have in flight now ([`share`]).
    pub(super) fn cap(&self, place: usize) -> u32 {
        let waiting: Vec<u32> = self
            .waiting
            .iter()
            .map(|w| w.load(Ordering::Relaxed))
            .collect();
        share(self.budget, &waiting, place)
    }
}

/// Coordinator `place`'s part of `budget` when `waiting[i]` sessions wait at coordinator `i`:
/// `budget` split in proportion, rounded up, and at least one (a coordinator with nothing
/// waiting yet is still leased from, so its first task is taken at once); the whole budget
/// while nothing waits anywhere, and always with one coordinator.
pub(super) fn share(budget: u32, waiting: &[u32], place: usize) -> u32 {
    let total: u64 = waiting.iter().map(|&w| u64::from(w)).sum();
    let mine = waiting.get(place).copied().map_or(0, u64::from);
    if total == 0 || waiting.len() == 1 {
        return budget;
    }
    let part = (u64::from(budget) * mine).div_ceil(total);
    u32::try_from(part).unwrap_or(budget).clamp(1, budget)
}

/// Which coordinators of the list the worker is registered with, for the probes: ready while
/// registered with at least one (and not draining).
pub(super) struct Registrations {
    health: Arc<Health>,
    registered: Mutex<Vec<bool>>,
}

impl Registrations {
    pub(super) fn new(health: Arc<Health>, coordinators: usize) -> Self {
        Self {
            health,
            registered: Mutex::new(vec![false; coordinators]),
        }
    }

    /// The worker is (or no longer is) registered with the coordinator at `place`; the probes
    /// are left alone while `draining`.
    pub(super) fn set(&self, place: usize, registered: bool, draining: bool) {
        let mut all = lock(&self.registered);
        if let Some(slot) = all.get_mut(place) {
            *slot = registered;
        }
        if draining {
            return;
        }
        if all.iter().any(|&r| r) {
            self.health.set_ready();
        } else if all.len() == 1 {
            self.health
                .set_not_ready("not registered with the coordinator");
        } else {
            self.health
                .set_not_ready("not registered with any coordinator");
        }
    }
}

#[cfg(test)]
mod tests {
    use stoker_rpc::health::{Health, Readiness};

    use super::{first_panic, share, Registrations, Shares};

    /// A task loop that panics ends the others (a coordinator's loop that would run on) and
    /// is the error the worker stops with.
    #[tokio::test]
    async fn a_panicking_task_loop_ends_the_others_and_is_the_error() {
        let mut set = tokio::task::JoinSet::new();
        set.spawn(std::future::pending::<()>());
        set.spawn(async { panic!("a bug in a task loop") });
        let ended = tokio::time::timeout(std::time::Duration::from_secs(5), first_panic(set))
            .await
            .expect("the panic ends the wait");
        let error = ended.expect_err("a panic is an error");
        assert!(error.contains("panicked"), "{error}");
        let mut quiet = tokio::task::JoinSet::new();
        quiet.spawn(async {});
        assert_eq!(first_panic(quiet).await, Ok(()));
    }

    #[test]
    fn deliveries_are_split_by_the_sessions_waiting_at_each_coordinator() {
        // Three times the waiting sessions, three times the deliveries.
        assert_eq!(share(8, &[3, 1], 0), 6);
        assert_eq!(share(8, &[3, 1], 1), 2);
        // Rounded up, and never below one: a coordinator with nothing waiting is still leased
        // from, so its first task is taken at once.
        assert_eq!(share(8, &[10, 0, 1], 0), 8);
        assert_eq!(share(8, &[10, 0, 1], 1), 1);
        assert_eq!(share(8, &[10, 0, 1], 2), 1);
        // Nothing waiting anywhere, or one coordinator: the whole budget.
        assert_eq!(share(8, &[0, 0], 1), 8);
        assert_eq!(share(8, &[0], 0), 8);
        assert_eq!(share(8, &[5], 0), 8);
        // What each coordinator last said is what counts.
        let shares = Shares::new(8, 2);
        assert_eq!(shares.cap(0), 8);
        shares.note(0, 1);
        shares.note(1, 3);
        assert_eq!((shares.cap(0), shares.cap(1)), (2, 6));
        shares.note(1, 0);
        assert_eq!((shares.cap(0), shares.cap(1)), (8, 1));
    }

    #[test]
    fn a_worker_of_a_fleet_is_ready_while_registered_with_any_coordinator() {
        let health = Health::starting("not registered with the coordinator");
        let fleet = Registrations::new(health.clone(), 3);
        fleet.set(1, true, false);
        assert_eq!(health.readiness(), Readiness::Ready);
        fleet.set(2, true, false);
        fleet.set(1, false, false);
        assert_eq!(
            health.readiness(),
            Readiness::Ready,
            "still registered with one"
        );
        fleet.set(2, false, false);
        assert_eq!(
            health.readiness(),
            Readiness::NotReady("not registered with any coordinator".into())
        );
        // While draining the probes say so, whatever the registrations do.
        health.set_not_ready("draining");
        fleet.set(0, true, true);
        assert_eq!(health.readiness(), Readiness::NotReady("draining".into()));
        // One coordinator: the reason names it as before.
        let lone = Health::starting("starting");
        let one = Registrations::new(lone.clone(), 1);
        one.set(0, true, false);
        one.set(0, false, false);
        assert_eq!(
            lone.readiness(),
            Readiness::NotReady("not registered with the coordinator".into())
        );
    }
}
