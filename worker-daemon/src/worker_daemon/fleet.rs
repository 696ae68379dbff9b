//! The coordinators of the worker's list (one, or a fleet's, jobs sharded over them): a task
//! loop against each over the one decode pool, each coordinator's place (its job ids are its
//! own), and the registrations the probes read.

use std::sync::{Arc, Mutex};

use stoker_rpc::health::Health;

use super::leases::{task_loop, Draining};
use super::{lock, Shared, WorkerConfig};

/// Runs one task loop per coordinator of `coordinators` until every one has ended; aborting
/// this future's task aborts them all.
pub(super) async fn task_loops(
    config: WorkerConfig,
    coordinators: Vec<String>,
    shared: Arc<Shared>,
    draining: Draining,
) {
    let registrations = Arc::new(Registrations::new(
        config.health.clone(),
        coordinators.len(),
    ));
    let mut set = tokio::task::JoinSet::new();
    for (index, address) in coordinators.into_iter().enumerate() {
        let place = Place {
            index,
            address,
            registrations: registrations.clone(),
        };
        set.spawn(task_loop(
            config.clone(),
            place,
            shared.clone(),
            draining.clone(),
        ));
    }
    while set.join_next().await.is_some() {}
}

/// A coordinator of the worker's list: its place (job ids are its own), its address, and the
/// registrations the probes read.
pub(super) struct Place {
    pub(super) index: usize,
    pub(super) address: String,
    pub(super) registrations: Arc<Registrations>,
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

    use super::Registrations;

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
