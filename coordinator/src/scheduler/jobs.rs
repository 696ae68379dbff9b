//! Jobs in the core: registration (its journal write an intent, a [`JobWrite`]), weights
//! (a [`WeightWrite`]), shares, the specs by id, and the retirement of jobs idle past their
//! retention.

use std::time::Instant;

use super::*;

/// A job registration taken from the core by [`Coordinator::job_write`], to be journaled
/// without the core (job and weight in one transaction), then handed back with
/// [`Coordinator::job_written`].
pub struct JobWrite {
    pub(crate) id: JobId,
    pub(crate) steps_per_epoch: u64,
    pub(crate) weight: Option<u32>,
    pub(super) spec: JobSpec,
    pub(crate) encoded: Vec<u8>,
    /// What a worker described of the job (an encoded `DescribeJobResponse`), journaled with
    /// it; empty when none did.
    pub(crate) described: Vec<u8>,
}

impl JobWrite {
    /// The id the job will have once registered.
    pub fn id(&self) -> JobId {
        self.id
    }
}

/// A change of a job's weight taken by [`Coordinator::weight_write`], to be journaled without
/// the core when it [`changes`](Self::changes) the weight, then handed back with
/// [`Coordinator::weight_written`].
pub struct WeightWrite {
    pub(super) changes: bool,
    pub(crate) job: JobId,
    pub(super) requested: u32,
    pub(crate) weight: u32,
}

impl WeightWrite {
    /// Whether the job's weight changes (else there is nothing to write).
    pub fn changes(&self) -> bool {
        self.changes
    }
}

impl Coordinator {
    /// Registers a job whose ranks each run `steps_per_epoch` steps, in a core without a
    /// journal (tests, benches). A journaled core is refused: its registrations are
    /// [`job_write`](Self::job_write)s, written before they count (`Durable::register_job`
    /// does both in place).
    pub fn register_job(
        &mut self,
        spec: JobSpec,
        steps_per_epoch: u64,
    ) -> CoordinatorResult<JobId> {
        self.refuse_if_journaled("register_job")?;
        let write = self.job_write(spec, steps_per_epoch, 0)?;
        self.job_written(write, Ok(()))
    }

    /// An error for a write-in-place call on a journaled core, whose writes go through the
    /// journal.
    fn refuse_if_journaled(&self, call: &str) -> CoordinatorResult<()> {
        if self.journaled {
            return Err(CoordinatorError::InvalidArgument(format!(
                "{call} does not write the journal; a journaled core's changes go through its \
                 journal (Durable)"
            )));
        }
        Ok(())
    }

    /// Takes the next job id for a job whose ranks each run `steps_per_epoch` steps, of the
    /// `weight` asked (0: the default; capped as by [`set_job_weight`](Self::set_job_weight)),
    /// to be journaled outside the core (job and weight in one transaction, as
    /// `JournalWriter::write_job` does) and handed back with [`job_written`](Self::job_written), which registers
    /// it: until then nobody sees the job, and no other registration is given its id.
    pub fn job_write(
        &mut self,
        spec: JobSpec,
        steps_per_epoch: u64,
        weight: u32,
    ) -> CoordinatorResult<JobWrite> {
        if steps_per_epoch == 0 {
            return Err(CoordinatorError::InvalidArgument(
                "steps_per_epoch must be at least 1".into(),
            ));
        }
        let id = self.next_job;
        if id.0 >= self.job_id_base + (1 << JOB_ID_RUN_BITS) {
            return Err(CoordinatorError::InvalidArgument(
                "this coordinator run has registered 2^32 jobs; restart it".into(),
            ));
        }
        self.next_job = JobId(id.0 + 1);
        Ok(JobWrite {
            id,
            steps_per_epoch,
            weight: (weight > 0).then(|| weight.clamp(1, self.weight_cap())),
            encoded: spec.encode_to_vec(),
            spec,
            described: Vec::new(),
        })
    }

    /// Takes back `write` after the journal gave `outcome` for it: once it landed the job is
    /// registered and its id returned; otherwise its id is let go and the write's error
    /// returned.
    pub fn job_written(
        &mut self,
        write: JobWrite,
        outcome: CoordinatorResult<()>,
    ) -> CoordinatorResult<JobId> {
        let JobWrite {
            id,
            steps_per_epoch,
            spec,
            weight,
            encoded,
            described: _,
        } = write;
        outcome?;
        if self.journaled {
            self.stats.journal_commits += 1;
        }
        tracing::info!(
            job = id.0,
            steps_per_epoch,
            world_size = spec.world_size,
            "job registered"
        );
        self.insert_job(id, spec, encoded, steps_per_epoch);
        if let Some(weight) = weight {
            self.ready.set_weight(id.0, weight);
        }
        Ok(id)
    }

    /// The first id of this run's range above every job registered in it.
    pub(super) fn first_free_job_id(&self) -> JobId {
        let range = JobId(self.job_id_base)..JobId(self.job_id_base + (1 << JOB_ID_RUN_BITS));
        self.jobs
            .range(range.clone())
            .next_back()
            .map_or(range.start, |(last, _)| JobId(last.0 + 1))
    }

    /// The jobs due to be retired at `now`: none of their ranks has had a session open since
    /// [`CoordinatorConfig::job_retention`] ago. A job is idle from the first call that finds
    /// it with no session open and none opened since the call before (jobs the journal brought
    /// back count from the first call after the restart). None without a retention.
    pub fn idle_jobs(&mut self, now: Instant) -> Vec<JobId> {
        let Some(retention) = self.config.job_retention else {
            return Vec::new();
        };
        let open: HashSet<JobId> = self.sessions.values().map(|s| s.job).collect();
        let mut due = Vec::new();
        for (id, job) in &mut self.jobs {
            // A session opened since the last call counts as open then, even if closed again.
            if std::mem::take(&mut job.opened_since_look) || open.contains(id) {
                job.idle_since = None;
                continue;
            }
            let since = *job.idle_since.get_or_insert(now);
            if now.saturating_duration_since(since) >= retention {
                due.push(*id);
            }
        }
        due
    }

    /// Forgets `jobs` (those [`idle_jobs`](Self::idle_jobs) found due): their specs, weights and
    /// positions leave memory at once and the journal with the next position write; their
    /// ids are not given again. A job with a session open, or unknown, is passed over. Returns
    /// the jobs retired. One pass over the sessions and positions, however many jobs.
    pub fn retire_jobs(&mut self, jobs: &[JobId]) -> Vec<JobId> {
        let open: HashSet<JobId> = self.sessions.values().map(|s| s.job).collect();
        let mut retired = HashSet::new();
        for &job in jobs {
            if open.contains(&job) || retired.contains(&job.0) {
                continue;
            }
            let Some(forgotten) = self.jobs.remove(&job) else {
                continue;
            };
            let key = forgotten.spec.encode_to_vec();
            if let Some(ids) = self.jobs_by_spec.get_mut(&key) {
                ids.retain(|id| *id != job);
                if ids.is_empty() {
                    self.jobs_by_spec.remove(&key);
                }
            }
            self.ready.forget(job.0);
            retired.insert(job.0);
            tracing::info!(
                job = job.0,
                "job retired: no session open for its retention"
            );
        }
        if retired.is_empty() {
            return Vec::new();
        }
        let mut dropped = Vec::new();
        self.resume_positions.retain(|key, _| {
            let gone = retired.contains(&key.0);
            if gone {
                dropped.push(*key);
            }
            !gone
        });
        self.dirty_positions
            .retain(|key, _| !retired.contains(&key.0));
        let mut listed = HashSet::new();
        let retired: Vec<JobId> = jobs
            .iter()
            .copied()
            .filter(|job| retired.contains(&job.0) && listed.insert(*job))
            .collect();
        if self.journaled {
            self.pruned_positions.extend(dropped);
            self.retired_jobs.extend(retired.iter().map(|job| job.0));
        }
        self.stats.jobs_retired += retired.len() as u64;
        retired
    }

    /// The largest weight a job gets in this run.
    pub(super) fn weight_cap(&self) -> u32 {
        self.config.max_job_weight.clamp(1, MAX_JOB_WEIGHT)
    }

    /// Sets `job`'s share of the workers to the `requested` weight, capped by
    /// [`CoordinatorConfig::max_job_weight`] (0 counts as 1), in a core without a journal; a
    /// journaled core is refused (its weights are [`weight_write`](Self::weight_write)s).
    /// Returns the weight given.
    pub fn set_job_weight(&mut self, job: JobId, requested: u32) -> CoordinatorResult<u32> {
        self.refuse_if_journaled("set_job_weight")?;
        let write = self.weight_write(job, requested)?;
        self.weight_written(&write, Ok(()))
    }

    /// What setting `job`'s weight to `requested` (as [`set_job_weight`](Self::set_job_weight))
    /// writes to the journal, to be written outside the core (nothing when the weight does not
    /// change) and handed back with
    /// [`weight_written`](Self::weight_written), which gives the job its weight. Two changes of
    /// one job's weight must be written and handed back in the order they were taken.
    pub fn weight_write(&self, job: JobId, requested: u32) -> CoordinatorResult<WeightWrite> {
        if !self.jobs.contains_key(&job) {
            return Err(CoordinatorError::UnknownJob(job));
        }
        let weight = requested.clamp(1, self.weight_cap());
        let changes = self.job_share(job).weight != weight;
        Ok(WeightWrite {
            changes,
            job,
            requested,
            weight,
        })
    }

    /// Takes back `write` after the journal gave `outcome` for it: once it landed the job
    /// has its weight, which is returned; otherwise the weight is unchanged and the write's
    /// error returned.
    pub fn weight_written(
        &mut self,
        write: &WeightWrite,
        outcome: CoordinatorResult<()>,
    ) -> CoordinatorResult<u32> {
        outcome?;
        if !self.jobs.contains_key(&write.job) {
            return Err(CoordinatorError::UnknownJob(write.job));
        }
        if self.journaled && write.changes {
            self.stats.journal_commits += 1;
        }
        if write.changes {
            tracing::info!(
                job = write.job.0,
                requested = write.requested,
                weight = write.weight,
                "job weight set"
            );
        }
        self.ready.set_weight(write.job.0, write.weight);
        Ok(write.weight)
    }

    /// `job`'s weight, leases so far and sessions waiting now.
    pub fn job_share(&self, job: JobId) -> JobShareStats {
        self.ready.stats(job.0).unwrap_or(JobShareStats {
            weight: 1,
            leased: 0,
            ready_sessions: 0,
        })
    }

    /// Why a worker last handed back one of `job`'s tasks (it could not open the job's
    /// datasets, or build or deliver the batch), and how long ago; `None` when none was.
    pub fn last_failure(&self, job: JobId) -> Option<(&str, std::time::Duration)> {
        let (reason, at) = self.jobs.get(&job)?.last_failure.as_ref()?;
        Some((reason.as_str(), at.elapsed()))
    }

    /// The spec of a job (workers need it to produce its batches).
    pub fn job_spec(&self, job: JobId) -> CoordinatorResult<&JobSpec> {
        self.jobs
            .get(&job)
            .map(|j| &j.spec)
            .ok_or(CoordinatorError::UnknownJob(job))
    }

    /// Registers job `id` in memory, found by its spec's `encoding` from then on.
    pub(super) fn insert_job(
        &mut self,
        id: JobId,
        spec: JobSpec,
        encoding: Vec<u8>,
        steps_per_epoch: u64,
    ) {
        let ids = self.jobs_by_spec.entry(encoding).or_default();
        if let Err(at) = ids.binary_search(&id) {
            ids.insert(at, id);
        }
        self.jobs.insert(
            id,
            Job {
                spec,
                steps_per_epoch,
                idle_since: None,
                opened_since_look: false,
                last_failure: None,
            },
        );
    }

    /// Whether a session of `job` is open.
    pub fn has_open_session(&self, job: JobId) -> bool {
        self.sessions.values().any(|session| session.job == job)
    }

    /// Counts a use of `job` (a client registering it) as a session opened, for
    /// [`idle_jobs`](Self::idle_jobs): a job handed to a client is not retired before it opens
    /// its first session.
    pub fn job_in_use(&mut self, job: JobId) {
        if let Some(entry) = self.jobs.get_mut(&job) {
            entry.opened_since_look = true;
        }
    }

    /// The jobs registered with `spec`, with their steps per epoch, in id order: more than one
    /// when its dataset changed across a restart (the journal keeps a job as it was
    /// registered). Costs the spec's encoding and a lookup, not a pass over the jobs.
    pub fn jobs_of_spec(&self, spec: &JobSpec) -> Vec<(JobId, u64)> {
        self.jobs_by_spec
            .get(&spec.encode_to_vec())
            .into_iter()
            .flatten()
            .filter_map(|id| Some((*id, self.jobs.get(id)?.steps_per_epoch)))
            .collect()
    }

    /// The registered jobs with their specs and steps per epoch, in id order.
    pub fn jobs(&self) -> impl Iterator<Item = (JobId, &JobSpec, u64)> {
        self.jobs
            .iter()
            .map(|(id, job)| (*id, &job.spec, job.steps_per_epoch))
    }

    /// Steps per epoch of a job.
    pub fn steps_per_epoch(&self, job: JobId) -> CoordinatorResult<u64> {
        self.jobs
            .get(&job)
            .map(|j| j.steps_per_epoch)
            .ok_or(CoordinatorError::UnknownJob(job))
    }
}
