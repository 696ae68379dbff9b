//! Sessions in the core: opening one for (job, rank, epoch) at its acknowledged position,
//! closing it, dropping the positions of epochs a rank has left behind, and the credits its
//! client grants.

use super::*;

impl Coordinator {
    /// Opens the session of (job, rank, epoch), starting at `start_step` or at the journaled
    /// acknowledged position if that is further. Opening an open session again (a client
    /// reconnecting) restarts its window: unacknowledged steps are redone, earlier leases
    /// become stale, and credits must be granted again.
    pub fn open_session(
        &mut self,
        job: JobId,
        rank: u32,
        epoch: u64,
        start_step: Step,
    ) -> CoordinatorResult<SessionId> {
        self.open_session_at(job, rank, epoch, start_step, false)
    }

    /// Like [`open_session`](Self::open_session); with `exact`, the session starts at
    /// `start_step` even when earlier runs acknowledged further: a client resuming from a
    /// checkpoint older than what it was sent gets those steps again.
    pub fn open_session_at(
        &mut self,
        job: JobId,
        rank: u32,
        epoch: u64,
        start_step: Step,
        exact: bool,
    ) -> CoordinatorResult<SessionId> {
        let entry = self
            .jobs
            .get(&job)
            .ok_or(CoordinatorError::UnknownJob(job))?;
        let world_size = entry.spec.world_size.max(1);
        if rank >= world_size {
            return Err(CoordinatorError::RankOutOfRange {
                job,
                rank,
                world_size,
            });
        }
        let steps_per_epoch = entry.steps_per_epoch;
        if start_step.0 > steps_per_epoch {
            return Err(CoordinatorError::StepOutOfRange {
                step: start_step,
                steps_per_epoch,
            });
        }
        self.job_in_use(job);
        let key = (job.0, rank, epoch);
        if let Some(&index) = self.session_index.get(&key) {
            let session = self
                .sessions
                .get_mut(&index)
                .ok_or(CoordinatorError::UnknownSession(SessionId(u64::from(
                    index,
                ))))?;
            if session.is_ready() {
                self.ready.remove(session.job.0, &session.ready_key());
            }
            if exact {
                session.reset_exact(start_step.0);
            } else {
                session.reset(start_step.0);
            }
            self.stats.session_opens += 1;
            if self.journaled {
                // An exact reopen may move the position back, a plain one forward.
                self.dirty_positions.insert(key, session.acked_position);
            }
            tracing::info!(
                session = index,
                job = job.0,
                rank,
                epoch,
                position = session.acked_position,
                "session reopened"
            );
            return Ok(session.id);
        }
        // Open sessions are exactly the keys of the index.
        if self.session_index.len() >= self.config.max_sessions {
            return Err(CoordinatorError::TooManySessions {
                limit: self.config.max_sessions,
            });
        }
        let index = self.next_session;
        self.next_session = index
            .checked_add(1)
            .ok_or_else(|| CoordinatorError::InvalidArgument("too many sessions".into()))?;
        let journaled = self.resume_positions.remove(&key).unwrap_or(0);
        let position = if exact {
            start_step.0
        } else {
            start_step.0.max(journaled).min(steps_per_epoch)
        };
        let id = SessionId(u64::from(index));
        self.stats.session_opens += 1;
        self.sessions.insert(
            index,
            Session::new(id, job, rank, epoch, steps_per_epoch, position),
        );
        self.prune_positions(job, rank, epoch);
        if self.journaled && position != journaled {
            self.dirty_positions.insert(key, position);
        }
        self.session_index.insert(key, index);
        tracing::debug!(
            session = index,
            job = job.0,
            rank,
            epoch,
            position,
            "session opened"
        );
        Ok(id)
    }

    /// Closes a session; its acknowledged position is kept (journaled) for a later reopening,
    /// and its live leases become stale.
    pub fn close_session(&mut self, session: SessionId) -> CoordinatorResult<()> {
        let index = open_key(&self.sessions, self.next_session, session)?;
        let Some(entry) = self.sessions.remove(&index) else {
            return Err(CoordinatorError::UnknownSession(session));
        };
        if entry.is_ready() {
            self.ready.remove(entry.job.0, &entry.ready_key());
        }
        let key = (entry.job.0, entry.rank, entry.epoch);
        self.resume_positions.insert(key, entry.acked_position);
        self.session_index.remove(&key);
        Ok(())
    }

    /// Drops the acknowledged positions (kept and journaled) of `job`'s `rank` in epochs before
    /// `epoch - 1`, once that rank opens `epoch`: a run that moved on does not need them, and
    /// kept forever they would grow the journal and the coordinator with every epoch. Open
    /// sessions keep theirs.
    pub(super) fn prune_positions(&mut self, job: JobId, rank: u32, epoch: u64) {
        let Some(oldest_kept) = epoch.checked_sub(1) else {
            return;
        };
        // A key in `resume_positions` has no open session (opening takes it out, closing puts
        // it back) and every stale key not open is there, so the range is all there is to drop:
        // a lookup per opening, where a scan of every rank's positions made an epoch's
        // openings cost the square of the ranks.
        let dropped: Vec<PositionKey> = self
            .resume_positions
            .range((job.0, rank, 0)..(job.0, rank, oldest_kept))
            .map(|(key, _)| *key)
            .collect();
        for key in &dropped {
            self.resume_positions.remove(key);
            self.dirty_positions.remove(key);
        }
        if self.journaled {
            self.pruned_positions.extend(dropped);
        }
    }

    /// Adds `credits` to what the session's client will accept. Zero, or a total above
    /// [`CoordinatorConfig::max_credits`], is refused.
    pub fn grant_credits(&mut self, session: SessionId, credits: u64) -> CoordinatorResult<()> {
        let limit = self.config.max_credits;
        let entry = open_entry(&mut self.sessions, self.next_session, session)?;
        let held = entry.credits;
        let total = u64::from(held).saturating_add(credits);
        if credits == 0 || total > u64::from(limit) {
            return Err(CoordinatorError::InvalidCredits {
                session,
                granted: credits,
                held: u64::from(held),
                limit: u64::from(limit),
            });
        }
        if entry.is_ready() {
            self.ready.remove(entry.job.0, &entry.ready_key());
        }
        entry.credits = total as u32;
        if entry.is_ready() {
            self.ready.insert(entry.job.0, entry.ready_key());
        }
        Ok(())
    }
}
