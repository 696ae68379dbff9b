//! Leases in the core: tasks handed to workers by weight among the waiting jobs and, within a
//! job, most-starved session first; a lease's end (complete, failed, requeued) and the
//! client's acknowledgements.

use std::time::Instant;

use super::*;

impl Coordinator {
    /// Leases up to `max_tasks` tasks to `worker`, most-starved session first; counts as a
    /// heartbeat. Returns fewer (maybe none) when no session has both credits and work.
    /// `max_tasks` must be 1..=[`CoordinatorConfig::max_lease_batch`].
    pub fn lease(
        &mut self,
        worker: WorkerId,
        max_tasks: usize,
        now: Instant,
    ) -> CoordinatorResult<Vec<Lease>> {
        let mut leases = Vec::with_capacity(max_tasks.min(self.config.max_lease_batch));
        self.lease_into(worker, max_tasks, &[], now, &mut leases)?;
        Ok(leases)
    }

    /// Sessions with credits and a step to lease: the work waiting here for a worker.
    pub fn waiting_sessions(&self) -> usize {
        self.ready.len()
    }

    /// [`waiting_sessions`](Self::waiting_sessions) but for those of `full`, which the worker
    /// asking has no room for: the work waiting here for that worker.
    pub fn waiting_sessions_besides(&self, full: &[u64]) -> usize {
        let full: std::collections::BTreeSet<u64> = full.iter().copied().collect();
        let ready = |id: &u64| {
            let index = u32::try_from(*id).ok()?;
            self.sessions.get(&index).map(Session::is_ready)
        };
        let passed = full.iter().filter(|id| ready(id) == Some(true)).count();
        self.ready.len().saturating_sub(passed)
    }

    /// [`lease`](Self::lease) appending to `out`, so a caller can reuse one vector; none of the
    /// sessions `full` (by id: their client's stream on this worker has no room for more)
    /// is leased from.
    pub fn lease_into(
        &mut self,
        worker: WorkerId,
        max_tasks: usize,
        full: &[u64],
        now: Instant,
        out: &mut Vec<Lease>,
    ) -> CoordinatorResult<usize> {
        if max_tasks == 0 || max_tasks > self.config.max_lease_batch {
            return Err(CoordinatorError::InvalidArgument(format!(
                "max_tasks must be 1..={}, not {max_tasks}",
                self.config.max_lease_batch
            )));
        }
        let worker_index = self.live_worker(worker)?;
        // A worker names at most as many as a call may lease.
        let full: std::collections::HashSet<u64> = full
            .iter()
            .take(self.config.max_lease_batch)
            .copied()
            .collect();
        let heartbeat = &mut self.workers[worker_index].last_heartbeat;
        *heartbeat = (*heartbeat).max(now);
        let deadline = *heartbeat + self.config.lease_timeout;
        let mut leased = 0;
        // Ready sessions whose client cannot reach this worker, or whose stream there is full:
        // put back for the others.
        let mut passed_over = Vec::new();
        while leased < max_tasks {
            let Some((job, key)) = self.ready.pop() else {
                break;
            };
            let session_index = key.2;
            let Some(session) = self.sessions.get_mut(&session_index) else {
                continue;
            };
            if session.unreachable.contains(&(worker_index as u32)) || full.contains(&session.id.0)
            {
                passed_over.push((job, key));
                continue;
            }
            let Some(step) = session.take_step() else {
                continue;
            };
            self.ready.charge(job);
            session.credits -= 1;
            self.serve_clock += 1;
            session.last_served = self.serve_clock;
            if session.is_ready() {
                self.ready.insert(job, session.ready_key());
            }
            let task = TaskKey {
                job: session.job,
                epoch: session.epoch,
                rank: session.rank,
                step: Step(step),
            };
            let entry = LeaseEntry {
                worker: worker_index as u32,
                session: session_index,
                incarnation: session.incarnation,
                step,
            };
            let (session_id, opening) = (session.id, session.incarnation);
            let lease_id = self.alloc_slot(entry);
            out.push(Lease {
                task,
                session: session_id,
                opening,
                lease_id,
                deadline,
            });
            leased += 1;
        }
        for (job, key) in passed_over {
            self.ready.put_back(job, key);
        }
        self.stats.assignments += leased as u64;
        Ok(leased)
    }

    /// The workers `session`'s client cannot open a stream to (it says so when that changes):
    /// its steps are leased to none of them from now on (until it says otherwise, or the
    /// session is reopened), and the leases they hold for it end, their steps requeued with
    /// their credits. Returns those leases; workers not registered are left out.
    pub fn set_unreachable(
        &mut self,
        session: SessionId,
        workers: &[WorkerId],
    ) -> CoordinatorResult<u64> {
        let index = open_key(&self.sessions, self.next_session, session)?;
        let mut unreachable: Vec<u32> = workers
            .iter()
            .filter(|worker| (worker.0 as usize) < self.workers.len())
            .map(|worker| worker.0 as u32)
            .collect();
        unreachable.sort_unstable();
        unreachable.dedup();
        let Some(entry) = self.sessions.get_mut(&index) else {
            return Err(CoordinatorError::UnknownSession(session));
        };
        let incarnation = entry.incarnation;
        entry.unreachable = unreachable.clone();
        let mut taken_back = 0;
        for slot_index in 0..self.leases.len() {
            let Some(lease) = self.leases[slot_index].entry else {
                continue;
            };
            if lease.session != index
                || lease.incarnation != incarnation
                || unreachable.binary_search(&lease.worker).is_err()
            {
                continue;
            }
            self.free_slot(slot_index);
            taken_back += 1;
            self.requeue(lease, true);
        }
        if taken_back > 0 || !unreachable.is_empty() {
            tracing::info!(
                session = session.0,
                workers = ?unreachable,
                taken_back,
                "the session's client cannot reach these workers: its steps go to the others"
            );
        }
        Ok(taken_back)
    }

    pub(super) fn alloc_slot(&mut self, entry: LeaseEntry) -> LeaseId {
        self.stats.leased_tasks += 1;
        let index = match self.free_lease_slots.pop() {
            Some(index) => index,
            None => {
                self.leases.push(LeaseSlot {
                    generation: 0,
                    entry: None,
                });
                (self.leases.len() - 1) as u32
            }
        };
        let slot = &mut self.leases[index as usize];
        slot.entry = Some(entry);
        LeaseId((u64::from(slot.generation) << 32) | u64::from(index))
    }

    pub(super) fn free_slot(&mut self, index: usize) {
        let slot = &mut self.leases[index];
        slot.entry = None;
        slot.generation = slot.generation.wrapping_add(1);
        self.free_lease_slots.push(index as u32);
        self.stats.leased_tasks -= 1;
    }

    /// Ends the live lease `lease_id` of `worker` (its slot is freed) and returns it: `Ok(None)`
    /// when it is stale (expired, or already reported), an error when the worker or the lease
    /// was never issued or the lease belongs to another worker.
    pub(super) fn end_lease(
        &mut self,
        worker: WorkerId,
        lease_id: LeaseId,
    ) -> CoordinatorResult<Option<LeaseEntry>> {
        if worker.0 >= self.workers.len() as u64 {
            return Err(CoordinatorError::UnknownWorker(worker));
        }
        let index = (lease_id.0 & u64::from(u32::MAX)) as usize;
        let generation = (lease_id.0 >> 32) as u32;
        let slot = self
            .leases
            .get(index)
            .ok_or(CoordinatorError::UnknownLease(lease_id))?;
        match slot.entry {
            Some(entry) if slot.generation == generation => {
                if entry.worker as u64 != worker.0 {
                    return Err(CoordinatorError::LeaseNotHeld {
                        lease: lease_id,
                        holder: WorkerId(u64::from(entry.worker)),
                        caller: worker,
                    });
                }
                self.free_slot(index);
                Ok(Some(entry))
            }
            _ if generation > slot.generation => Err(CoordinatorError::UnknownLease(lease_id)),
            _ => {
                self.stats.duplicates_dropped += 1;
                Ok(None)
            }
        }
    }

    /// The worker sent the leased batch to its client. A report on a lease that expired (its
    /// task requeued, perhaps redone) is ignored and counted as a duplicate.
    pub fn complete(
        &mut self,
        worker: WorkerId,
        lease_id: LeaseId,
    ) -> CoordinatorResult<LeaseOutcome> {
        let Some(entry) = self.end_lease(worker, lease_id)? else {
            return Ok(LeaseOutcome::Stale);
        };
        let live = self
            .sessions
            .get(&entry.session)
            .is_some_and(|session| session.incarnation == entry.incarnation);
        if !live {
            self.stats.duplicates_dropped += 1;
            return Ok(LeaseOutcome::Stale);
        }
        self.stats.completions += 1;
        Ok(LeaseOutcome::Applied)
    }

    /// The worker could not produce the leased batch: the task goes back to the front of its
    /// session's queue for another try.
    pub fn fail(
        &mut self,
        worker: WorkerId,
        lease_id: LeaseId,
        reason: &str,
    ) -> CoordinatorResult<LeaseOutcome> {
        self.fail_leased(worker, lease_id, reason, true)
    }

    /// The worker had no stream from the session's client to deliver the leased batch to: the
    /// task goes back to the queue, but the credit is spent, so a session whose client is gone
    /// stops being leased once its credits are (a live client's reopen grants them again).
    pub fn fail_unclaimed(
        &mut self,
        worker: WorkerId,
        lease_id: LeaseId,
        reason: &str,
    ) -> CoordinatorResult<LeaseOutcome> {
        self.fail_leased(worker, lease_id, reason, false)
    }

    pub(super) fn fail_leased(
        &mut self,
        worker: WorkerId,
        lease_id: LeaseId,
        reason: &str,
        credit_back: bool,
    ) -> CoordinatorResult<LeaseOutcome> {
        let Some(entry) = self.end_lease(worker, lease_id)? else {
            return Ok(LeaseOutcome::Stale);
        };
        self.stats.failed_leases += 1;
        // A batch its client's stream did not take (a reopen, a client gone) is no failure of
        // the job's to name to it later.
        if let Some(job) = self
            .sessions
            .get(&entry.session)
            .and_then(|session| self.jobs.get_mut(&session.job))
            .filter(|_| credit_back)
        {
            job.last_failure = Some((reason.to_string(), Instant::now()));
        }
        if let Some(session) = self.sessions.get(&entry.session) {
            tracing::debug!(
                worker = worker.0,
                job = session.job.0,
                rank = session.rank,
                epoch = session.epoch,
                step = entry.step,
                reason,
                credit_back,
                "task failed, requeued"
            );
        }
        if self.requeue(entry, credit_back) {
            Ok(LeaseOutcome::Applied)
        } else {
            Ok(LeaseOutcome::Stale)
        }
    }

    /// Puts the task of a dead lease back in its session's queue, with its credit when
    /// `credit_back`; false when the lease was stale or the step was acknowledged meanwhile.
    pub(super) fn requeue(&mut self, entry: LeaseEntry, credit_back: bool) -> bool {
        let Some(session) = self.sessions.get_mut(&entry.session) else {
            return false;
        };
        if session.incarnation != entry.incarnation {
            return false;
        }
        let job = session.job.0;
        if session.is_ready() {
            self.ready.remove(job, &session.ready_key());
        }
        let requeued = session.requeue(entry.step);
        if requeued && credit_back {
            session.credits = session.credits.saturating_add(1);
        }
        if session.is_ready() {
            self.ready.insert(job, session.ready_key());
        }
        requeued
    }

    /// The session's client received `step`. Acknowledgements may arrive in any order; a step
    /// acknowledged twice is ignored and counted. The acknowledged position is kept for the next
    /// [`PositionWrite`] ([`take_positions`](Self::take_positions)), which is due every
    /// [`CoordinatorConfig::journal_every`] acknowledgements ([`write_due`](Self::write_due)).
    pub fn acknowledge(&mut self, session: SessionId, step: Step) -> CoordinatorResult<AckOutcome> {
        let entry = open_entry(&mut self.sessions, self.next_session, session)?;
        if step.0 >= entry.steps_per_epoch {
            return Err(CoordinatorError::StepOutOfRange {
                step,
                steps_per_epoch: entry.steps_per_epoch,
            });
        }
        let was_ready = entry.is_ready();
        let old_key = entry.ready_key();
        let before = entry.acked_position;
        match entry.acknowledge(step.0) {
            AckEffect::Duplicate => {
                self.stats.duplicates_dropped += 1;
                return Ok(AckOutcome::Duplicate);
            }
            AckEffect::Recorded { was_queued } => {
                // A step received without a live lease (a redone or pre-restart batch) fills a
                // client slot all the same.
                if was_queued {
                    entry.credits = entry.credits.saturating_sub(1);
                }
            }
        }
        if was_ready && (!entry.is_ready() || entry.ready_key() != old_key) {
            self.ready.remove(entry.job.0, &old_key);
            if entry.is_ready() {
                self.ready.insert(entry.job.0, entry.ready_key());
            }
        }
        let position = entry.acked_position;
        self.stats.acknowledgements += 1;
        if position != before && self.journaled {
            self.dirty_positions
                .insert((entry.job.0, entry.rank, entry.epoch), position);
        }
        self.acks_since_flush += 1;
        Ok(AckOutcome::Recorded {
            position: Step(position),
        })
    }
}
