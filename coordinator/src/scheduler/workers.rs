//! Worker liveness in the core: registration, heartbeats, a stall excused, expiry (a worker
//! silent past the lease timeout is dropped and its leased tasks go back to their sessions'
//! queues) and a worker's leave.

use std::time::{Duration, Instant};

use super::*;

impl Coordinator {
    /// Registers a worker, alive as of `now`. A worker that joins mid-epoch takes tasks at its
    /// first `lease`.
    pub fn register_worker(&mut self, now: Instant) -> WorkerId {
        let id = WorkerId(self.workers.len() as u64);
        self.workers.push(Worker {
            last_heartbeat: now,
            alive: true,
        });
        tracing::debug!(worker = id.0, "worker registered");
        id
    }

    /// Records that `worker` is alive at `now`, which renews all its leases.
    pub fn heartbeat(&mut self, worker: WorkerId, now: Instant) -> CoordinatorResult<()> {
        let index = self.live_worker(worker)?;
        let entry = &mut self.workers[index];
        entry.last_heartbeat = entry.last_heartbeat.max(now);
        Ok(())
    }

    pub(super) fn live_worker(&self, worker: WorkerId) -> CoordinatorResult<usize> {
        let expired = CoordinatorError::WorkerExpired(worker);
        let unknown = CoordinatorError::UnknownWorker(worker);
        live_index(&self.workers, worker.0, |w| w.alive, expired, unknown)
    }

    /// Forgives the live workers `stalled` of silence: a time the caller was not looking (stalled
    /// on its own lock, a paused machine, no CPU), when their heartbeats could not be taken.
    /// Each one's silence counts from up to `stalled` later, never from after `now`; a worker
    /// that really died is dropped that much later.
    pub fn excuse_stall(&mut self, stalled: Duration, now: Instant) {
        for worker in self.workers.iter_mut().filter(|w| w.alive) {
            worker.last_heartbeat = worker
                .last_heartbeat
                .checked_add(stalled)
                .map_or(now, |later| later.min(now))
                .max(worker.last_heartbeat);
        }
    }

    /// Drops the workers whose last heartbeat is at least the lease timeout before `now`, and
    /// puts their leased tasks back at the front of their sessions' queues, in step order.
    /// Costs a pass over the workers, plus one over the lease table when someone died.
    pub fn expire(&mut self, now: Instant) -> ExpireReport {
        let mut report = ExpireReport::default();
        for (index, worker) in self.workers.iter_mut().enumerate() {
            if worker.alive
                && now.saturating_duration_since(worker.last_heartbeat) >= self.config.lease_timeout
            {
                worker.alive = false;
                report.workers.push(WorkerId(index as u64));
            }
        }
        if report.workers.is_empty() {
            return report;
        }
        let (ended, requeued) = self.requeue_leases_of_dead_workers();
        self.stats.expired_leases += ended;
        report.requeued_tasks = requeued;
        tracing::warn!(
            workers = ?report.workers.iter().map(|w| w.0).collect::<Vec<_>>(),
            requeued_tasks = report.requeued_tasks,
            "workers expired, their tasks requeued"
        );
        report
    }

    /// `worker` leaves on purpose (it was told to stop): it gets no more leases, and the
    /// leases it still holds (it finished or reported the others first) go back to the front
    /// of their sessions' queues at once, without waiting for the lease timeout. Returns how
    /// many tasks went back.
    pub fn leave_worker(&mut self, worker: WorkerId) -> CoordinatorResult<u64> {
        let index = self.live_worker(worker)?;
        self.workers[index].alive = false;
        let (ended, requeued) = self.requeue_leases_of_dead_workers();
        self.stats.returned_leases += ended;
        tracing::debug!(worker = worker.0, returned = ended, "worker left");
        Ok(requeued)
    }

    /// Ends every lease held by a worker no longer alive and requeues its task; returns the
    /// leases ended and the tasks requeued (a stale or acknowledged one is not).
    pub(super) fn requeue_leases_of_dead_workers(&mut self) -> (u64, u64) {
        let (mut ended, mut requeued) = (0, 0);
        for slot_index in 0..self.leases.len() {
            let Some(entry) = self.leases[slot_index].entry else {
                continue;
            };
            if self.workers[entry.worker as usize].alive {
                continue;
            }
            self.free_slot(slot_index);
            ended += 1;
            if self.requeue(entry, true) {
                requeued += 1;
            }
        }
        (ended, requeued)
    }
}
