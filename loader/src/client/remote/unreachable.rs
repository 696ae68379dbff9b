//! The listed workers a session's client cannot open a stream to: said in a warning once each
//! has failed for [`UNREACHABLE_SAID_AFTER`](super::UNREACHABLE_SAID_AFTER), and told to the
//! coordinator in the next update whenever the set changes, so it leases this opening's steps
//! to none of them and takes back, with their credits, those they hold. A worker that cannot
//! open the job itself ([`Unopened`]) joins that set; the consumer's error comes once every
//! listed worker has said so.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use stoker_proto::v1::{WorkerInfo, WorkerSet};
use tonic::Status;

use super::UNREACHABLE_SAID_AFTER;

/// One opening's unreachable workers.
#[derive(Debug, Default)]
pub(super) struct Unreachable {
    /// Since when each has failed to open, and whether that was said.
    failing: HashMap<u64, (Instant, bool)>,
    /// Why each one's last try failed.
    why: HashMap<u64, String>,
    /// The set the coordinator was last told of.
    told: Vec<u64>,
}

impl Unreachable {
    /// `worker`'s stream opened.
    pub(super) fn opened(&mut self, worker: u64) {
        self.failing.remove(&worker);
        self.why.remove(&worker);
    }

    /// The listed workers whose streams did not open, with their addresses and why, for the
    /// error of a job no worker served: `None` when there is none.
    pub(super) fn described(&self, workers: &[WorkerInfo]) -> Option<String> {
        let mut failing: Vec<u64> = self
            .why
            .keys()
            .copied()
            .filter(|worker| workers.iter().any(|listed| listed.worker_id == *worker))
            .collect();
        failing.sort_unstable();
        let named: Vec<String> = failing
            .iter()
            .map(|worker| {
                let why = self.why.get(worker).map_or("", String::as_str);
                format!("{} ({why})", address_of(workers, *worker))
            })
            .collect();
        (!named.is_empty()).then(|| named.join(", "))
    }

    /// `worker`'s stream failed to open with `status`; `workers` is the list it is on.
    pub(super) fn failed(&mut self, worker: u64, workers: &[WorkerInfo], status: &Status) {
        self.why
            .insert(worker, format!("{}: {}", status.code(), status.message()));
        let (since, said) = self
            .failing
            .entry(worker)
            .or_insert((Instant::now(), false));
        if !*said && since.elapsed() >= UNREACHABLE_SAID_AFTER {
            *said = true;
            let address = address_of(workers, worker);
            tracing::warn!(
                worker,
                %address,
                %status,
                for_s = since.elapsed().as_secs(),
                "cannot open a stream to a worker the coordinator lists: this client's batches go to the other workers; check that its --advertise address is reachable from here"
            );
        }
    }

    /// `worker` cannot open the job: unreachable for this opening (the caller said why).
    pub(super) fn refused(&mut self, worker: u64) {
        self.failing.insert(worker, (Instant::now(), true));
    }

    /// Whether the set changed since the coordinator was last told.
    pub(super) fn changed(&self) -> bool {
        self.now() != self.told
    }

    /// The set to tell the coordinator, when it changed (then taken as told).
    pub(super) fn take_change(&mut self) -> Option<WorkerSet> {
        let now = self.now();
        (now != self.told).then(|| {
            self.told = now.clone();
            WorkerSet { workers: now }
        })
    }

    fn now(&self) -> Vec<u64> {
        let mut workers: Vec<u64> = self.failing.keys().copied().collect();
        workers.sort_unstable();
        workers
    }
}

/// The listed workers that could not open the job this opening, by id, with their address.
#[derive(Debug, Default)]
pub(super) struct Unopened(BTreeMap<u64, String>);

impl Unopened {
    /// `worker` of `workers` could not open the job (`status`): the context of the consumer's
    /// error once no listed worker is left that has not said so, else `None` (the others
    /// serve the job).
    pub(super) fn add(
        &mut self,
        worker: u64,
        workers: &[WorkerInfo],
        status: &Status,
    ) -> Option<String> {
        let address = address_of(workers, worker);
        tracing::warn!(worker, %address, %status, "a worker cannot open the job's datasets: its batches come from the other workers");
        self.0.insert(worker, address);
        if !workers
            .iter()
            .all(|listed| self.0.contains_key(&listed.worker_id))
        {
            return None;
        }
        let named: Vec<&str> = self.0.values().map(String::as_str).collect();
        Some(format!(
            "no worker can open the job's datasets (workers {})",
            named.join(", ")
        ))
    }
}

/// The data address `workers` lists for `worker` (empty when it is not listed).
pub(super) fn address_of(workers: &[WorkerInfo], worker: u64) -> String {
    workers
        .iter()
        .find(|listed| listed.worker_id == worker)
        .map(|listed| listed.data_address.clone())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_set_is_told_when_it_changes_and_then_not_again() {
        let mut unreachable = Unreachable::default();
        assert!(!unreachable.changed() && unreachable.take_change().is_none());
        let status = Status::unavailable("connection refused");
        unreachable.failed(7, &[], &status);
        unreachable.failed(3, &[], &status);
        assert!(unreachable.changed());
        assert_eq!(
            unreachable.take_change().map(|set| set.workers),
            Some(vec![3, 7])
        );
        unreachable.failed(7, &[], &status);
        assert!(!unreachable.changed() && unreachable.take_change().is_none());
        unreachable.opened(3);
        assert_eq!(
            unreachable.take_change().map(|set| set.workers),
            Some(vec![7])
        );
        unreachable.opened(7);
        assert_eq!(
            unreachable.take_change().map(|set| set.workers),
            Some(vec![])
        );
    }

    /// A job no worker served because the listed workers' advertised addresses do not reach
    /// from the client read "no worker stream is open; start stoker-worker daemons".
    #[test]
    fn the_workers_that_did_not_open_are_named_with_why() {
        let listed = |id: u64, address: &str| WorkerInfo {
            worker_id: id,
            data_address: address.into(),
        };
        let workers = [listed(3, "pod-3:7001"), listed(7, "pod-7:7001")];
        let mut unreachable = Unreachable::default();
        assert_eq!(unreachable.described(&workers), None);
        unreachable.failed(7, &workers, &Status::unavailable("dns error"));
        unreachable.failed(3, &workers, &Status::unavailable("connection refused"));
        let named = unreachable.described(&workers).unwrap_or_default();
        assert!(
            named.contains("pod-3:7001 (")
                && named.contains("connection refused")
                && named.contains("pod-7:7001 (")
                && named.contains("dns error"),
            "{named}"
        );
        // One whose stream opened, or no longer listed, is not named.
        unreachable.opened(3);
        let named = unreachable.described(&workers[1..]).unwrap_or_default();
        assert!(
            !named.contains("pod-3") && named.contains("pod-7"),
            "{named}"
        );
        assert_eq!(unreachable.described(&workers[..1]), None);
    }
}
