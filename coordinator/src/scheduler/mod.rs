//! The coordinator's core: workers, sessions, task leases and the journal, in process and
//! without sockets (the gRPC service is a thin layer over exactly this API).
//!
//! - Workers [`register_worker`](Coordinator::register_worker) and prove they are alive with
//!   [`heartbeat`](Coordinator::heartbeat) (leasing counts as one). A worker silent for longer
//!   than the lease timeout is dropped by [`expire`](Coordinator::expire): its leased tasks go
//!   back to the front of their sessions' queues and another worker redoes them.
//! - A client [`open_session`](Coordinator::open_session)s for (job, rank, epoch) and grants
//!   credits: how many batches it will accept. A session is never leased more tasks than its
//!   uncovered credits.
//! - [`lease`](Coordinator::lease) hands a worker tasks (one task = one batch). Between jobs,
//!   **by weight among the jobs whose clients wait** (stride scheduling, [`shares`]: a job's
//!   weight is what it asked for at registration, capped by
//!   [`CoordinatorConfig::max_job_weight`]; no waiting job is passed over forever); within a
//!   job, **most-starved session first**. A session's starvation is its credits that no leased
//!   or delivered task covers yet (empty slots at the client); ties go to the session served
//!   longest ago. Sessions with credits and work sit in ordered sets keyed that way, so a lease
//!   costs O(log sessions), not a scan.
//! - The worker reports [`complete`](Coordinator::complete) (the batch went to the client) or
//!   [`fail`](Coordinator::fail) (requeue it); the client
//!   [`acknowledge`](Coordinator::acknowledge)s each step it received, in any order.
//!   Duplicates (a step acknowledged twice, a late report on a lease that expired) are ignored
//!   and counted.
//! - Job specs and each (job, rank, epoch)'s acknowledged position (every step below it was
//!   received) are journaled in redb. Job registrations are durable when the call returns;
//!   positions are written every [`CoordinatorConfig::journal_every`] acknowledgements and on
//!   [`flush`](Coordinator::flush), or, by a service that must not wait on its disk, taken
//!   with [`take_positions`](Coordinator::take_positions), written outside the core
//!   ([`PositionWrite::write`], on any thread) and handed back with
//!   [`positions_written`](Coordinator::positions_written). A crash loses at most the unwritten
//!   positions, whose steps are then redone: batches are a pure function of (spec, epoch, rank,
//!   step), so the client receives identical bytes and drops them by step number.
//! - Nothing grows with the epochs a job runs: a closed session is dropped (its id answers
//!   "closed" from then on), and when a rank opens epoch `e` the positions of its epochs before
//!   `e - 1` leave memory and the journal. Nor with the jobs a coordinator has served: a job
//!   with no session open for [`CoordinatorConfig::job_retention`] is retired
//!   ([`idle_jobs`](Coordinator::idle_jobs), [`retire_jobs`](Coordinator::retire_jobs)), its
//!   spec, weight and positions gone from memory and the journal; its id is not given again.
//!
//! Time is passed in (`now: Instant`), so tests run without sleeping.

mod error;
mod ids;
mod journal;
mod session;
mod shares;
#[cfg(test)]
mod tests;
mod types;

use std::collections::{BTreeMap, HashMap, HashSet};

/// The core's maps keyed by integers: foldhash (seeded per process, so keys a client picks
/// cannot be aimed at collisions) instead of std's SipHash, which took about a sixth of an
/// assignment's time in `stoker bench coordinator`.
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
use std::mem::size_of;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use prost::Message;
use stoker_proto::v1::JobSpec;

pub use error::{CoordinatorError, CoordinatorResult};
pub use ids::{JobId, LeaseId, SessionId, Step, TaskKey, WorkerId};
pub use journal::JOURNAL_FILE;
#[cfg(test)]
pub(crate) use journal::{journal_file, OpenDatabase};
pub use types::{
    AckOutcome, CoordinatorConfig, CoordinatorStats, ExpireReport, Lease, LeaseOutcome,
    MAX_JOB_WEIGHT,
};

use journal::{Journal, PositionKey};
use session::{AckEffect, ReadyKey, Session};
pub use shares::JobShareStats;
use shares::ReadySet;

struct Job {
    spec: JobSpec,
    steps_per_epoch: u64,
    /// Since when no session of the job has been seen open (by [`Coordinator::idle_jobs`]).
    idle_since: Option<Instant>,
    /// A session of it opened since [`Coordinator::idle_jobs`] last looked.
    opened_since_look: bool,
}

struct Worker {
    last_heartbeat: Instant,
    alive: bool,
}

#[derive(Debug, Clone, Copy)]
struct LeaseEntry {
    worker: u32,
    session: u32,
    incarnation: u32,
    step: u64,
}

/// A lease slot; the id of a lease is (generation << 32 | slot index), so a slot reused for a
/// later lease never answers to the old id.
struct LeaseSlot {
    generation: u32,
    entry: Option<LeaseEntry>,
}

/// The coordinator core: workers, sessions, task leases (most-starved session first) and the
/// journal of job specs and acknowledged positions. Single-threaded (`&mut self`); a service
/// wraps it in a lock or an actor.
pub struct Coordinator {
    config: CoordinatorConfig,
    /// Shared with the [`PositionWrite`]s in flight, which write outside the core.
    journal: Option<Arc<Mutex<Journal>>>,
    journal_path: Option<PathBuf>,
    jobs: BTreeMap<JobId, Job>,
    /// The jobs of each spec, by its encoding (equal specs encode alike: a spec has no map
    /// fields), in id order.
    jobs_by_spec: HashMap<Vec<u8>, Vec<JobId>>,
    /// The id the next [`JobWrite`] takes: ids rise within a run and none is given twice, not
    /// even one whose write failed or whose job was retired.
    next_job: JobId,
    /// Jobs retired whose rows the journal still holds (deleted by the next position write).
    retired_jobs: Vec<u64>,
    /// The first job id of this run's range ([`JOB_ID_RUN_BITS`]).
    job_id_base: u64,
    workers: Vec<Worker>,
    /// Open sessions by id; a closed session is dropped (its id stays issued, below
    /// `next_session`, so a late call on it is told "closed", not "unknown").
    sessions: FastMap<u32, Session>,
    next_session: u32,
    session_index: FastMap<PositionKey, u32>,
    /// Acknowledged positions of (job, rank, epoch)s without a session (from the journal, or
    /// closed), consulted when one opens.
    resume_positions: HashMap<PositionKey, u64>,
    /// Positions changed and not yet written (each stays until a write of its value lands).
    dirty_positions: FastMap<PositionKey, u64>,
    /// Positions dropped and not yet deleted from the journal, in the order dropped.
    pruned_positions: Vec<PositionKey>,
    /// Prunes deleted from the journal, and so from the front of `pruned_positions`, so far.
    pruned_written: u64,
    /// The number of the last [`PositionWrite`] taken.
    position_writes: u64,
    acks_since_flush: u64,
    ready: ReadySet,
    leases: Vec<LeaseSlot>,
    free_lease_slots: Vec<u32>,
    serve_clock: u64,
    stats: CoordinatorStats,
}

/// The index of entry `id` of `entries` (worker ids are indices) when `live` says
/// it still is; else `ended` (issued, but expired or closed) or `unknown` (never issued).
fn live_index<T>(
    entries: &[T],
    id: u64,
    live: impl Fn(&T) -> bool,
    ended: CoordinatorError,
    unknown: CoordinatorError,
) -> CoordinatorResult<usize> {
    match usize::try_from(id)
        .ok()
        .and_then(|i| entries.get(i).map(|e| (i, e)))
    {
        Some((index, entry)) if live(entry) => Ok(index),
        Some(_) => Err(ended),
        None => Err(unknown),
    }
}

/// The key of open session `session`: "closed" for an id issued before (below `next`) that is
/// no longer open, "unknown" for one never issued.
fn open_key(
    sessions: &FastMap<u32, Session>,
    next: u32,
    session: SessionId,
) -> CoordinatorResult<u32> {
    match u32::try_from(session.0) {
        Ok(index) if sessions.contains_key(&index) => Ok(index),
        Ok(index) if index < next => Err(CoordinatorError::SessionClosed(session)),
        _ => Err(CoordinatorError::UnknownSession(session)),
    }
}

/// Open session `session`, or why it is not (see [`open_key`]).
fn open_entry(
    sessions: &mut FastMap<u32, Session>,
    next: u32,
    session: SessionId,
) -> CoordinatorResult<&mut Session> {
    let index = open_key(sessions, next, session)?;
    sessions
        .get_mut(&index)
        .ok_or(CoordinatorError::UnknownSession(session))
}

/// The low bits of a job id: its number within the run that registered it. The bits above are
/// that run's tag, random for each run of a journaled coordinator, so a coordinator whose
/// journal was lost or restored from an older copy does not give an id again (two runs share
/// a tag with a chance of about one in a million): a client still holding an id from before
/// is told the job is unknown (and registers again), not handed another job's batches.
const JOB_ID_RUN_BITS: u32 = 32;

/// The journal, once a write in flight is done with it. A write that panicked left
/// nothing half-done in it (a transaction not committed is dropped), so carry on with it.
fn lock_journal(journal: &Mutex<Journal>) -> MutexGuard<'_, Journal> {
    journal
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Acknowledged positions taken from the core by [`Coordinator::take_positions`], written to
/// the journal by [`PositionWrite::write`] without the core (a service runs it off its lock, so
/// a slow disk stalls no call), then handed back with [`Coordinator::positions_written`].
pub struct PositionWrite {
    journal: Arc<Mutex<Journal>>,
    /// Rises with each write taken: a write that lands after a later one is skipped.
    seq: u64,
    positions: Vec<(PositionKey, u64)>,
    pruned: Vec<PositionKey>,
    /// The core's count of prunes when it was taken (those before it are in `pruned` or done).
    pruned_upto: u64,
    /// Retired jobs whose rows it deletes.
    retired: Vec<u64>,
}

impl PositionWrite {
    /// Writes the positions durably, in one transaction; `Ok(false)` when a later write landed
    /// first (it held these or newer). Waits for a job registration or another write in
    /// flight to finish with the journal first.
    pub fn write(&self) -> CoordinatorResult<bool> {
        lock_journal(&self.journal).write_positions_numbered(
            self.seq,
            self.positions.iter().copied(),
            &self.pruned,
            &self.retired,
        )
    }
}

/// A job registration taken from the core by [`Coordinator::job_write`], journaled by
/// [`JobWrite::write`] without the core, then handed back with [`Coordinator::job_written`].
pub struct JobWrite {
    journal: Option<Arc<Mutex<Journal>>>,
    id: JobId,
    steps_per_epoch: u64,
    weight: Option<u32>,
    spec: JobSpec,
    encoded: Vec<u8>,
}

impl JobWrite {
    /// The id the job will have once registered.
    pub fn id(&self) -> JobId {
        self.id
    }

    /// Writes the job, and its weight, durably (nothing to write without a journal). Waits for
    /// another write in flight to finish with the journal first.
    pub fn write(&self) -> CoordinatorResult<()> {
        match &self.journal {
            Some(journal) => lock_journal(journal).put_job(
                self.id.0,
                self.steps_per_epoch,
                &self.encoded,
                self.weight,
            ),
            None => Ok(()),
        }
    }
}

/// A change of a job's weight taken by [`Coordinator::weight_write`], journaled by
/// [`WeightWrite::write`] without the core, then handed back with
/// [`Coordinator::weight_written`].
pub struct WeightWrite {
    /// `None` without a journal or when the weight does not change.
    journal: Option<Arc<Mutex<Journal>>>,
    changes: bool,
    job: JobId,
    requested: u32,
    weight: u32,
}

impl WeightWrite {
    /// Writes the weight durably when it changes. Waits for another write in flight to
    /// finish with the journal first.
    pub fn write(&self) -> CoordinatorResult<()> {
        match &self.journal {
            Some(journal) => lock_journal(journal).put_weight(self.job.0, self.weight),
            None => Ok(()),
        }
    }

    /// Whether the job's weight changes (else there is nothing to write).
    pub fn changes(&self) -> bool {
        self.changes
    }
}

/// The first id of a run's job range for the random `seed`: a tag of 1 to 2^20 - 1 above the
/// run's bits, so ids stay below 2^52 (exact as JSON numbers in the dashboard's JavaScript).
fn run_job_id_base(seed: u64) -> u64 {
    let tag = seed % ((1 << 20) - 1) + 1;
    tag << JOB_ID_RUN_BITS
}

impl Coordinator {
    /// A coordinator without a journal: nothing survives it (its job ids start at 0). For
    /// tests and benches.
    pub fn in_memory(config: CoordinatorConfig) -> Self {
        Self {
            config,
            journal: None,
            journal_path: None,
            jobs: BTreeMap::new(),
            jobs_by_spec: HashMap::new(),
            next_job: JobId(0),
            retired_jobs: Vec::new(),
            job_id_base: 0,
            workers: Vec::new(),
            sessions: FastMap::default(),
            next_session: 0,
            session_index: FastMap::default(),
            resume_positions: HashMap::new(),
            dirty_positions: FastMap::default(),
            pruned_positions: Vec::new(),
            pruned_written: 0,
            position_writes: 0,
            acks_since_flush: 0,
            ready: ReadySet::default(),
            leases: Vec::new(),
            free_lease_slots: Vec::new(),
            serve_clock: 0,
            stats: CoordinatorStats::default(),
        }
    }

    /// Opens the coordinator journaled in `state_dir` (created if missing): registered jobs and
    /// acknowledged positions come back; workers and leases do not (workers re-register, and
    /// unacknowledged steps are redone).
    pub fn open(state_dir: &Path, config: CoordinatorConfig) -> CoordinatorResult<Self> {
        Self::with_journal(Journal::open(state_dir)?, config)
    }

    /// [`Coordinator::open`], the journal's database opened by `open_database` (tests give a
    /// storage that fails or stalls on demand).
    #[cfg(test)]
    pub(crate) fn open_with(
        state_dir: &Path,
        config: CoordinatorConfig,
        open_database: journal::OpenDatabase,
    ) -> CoordinatorResult<Self> {
        Self::with_journal(Journal::open_with(state_dir, open_database)?, config)
    }

    fn with_journal(
        (journal, contents): (Journal, journal::JournalContents),
        config: CoordinatorConfig,
    ) -> CoordinatorResult<Self> {
        let mut coordinator = Self::in_memory(config);
        coordinator.job_id_base = run_job_id_base(stoker_rpc::transport::random_u64());
        for job in contents.jobs {
            let id = JobId(job.id);
            let spec = JobSpec::decode(job.spec.as_slice())
                .map_err(|source| CoordinatorError::CorruptSpec { job: id, source })?;
            // Encoded again rather than the bytes as stored: specs are looked up by the
            // encoding this build gives them.
            let encoding = spec.encode_to_vec();
            coordinator.insert_job(id, spec, encoding, job.steps_per_epoch);
        }
        coordinator.next_job = coordinator.first_free_job_id();
        coordinator.resume_positions = contents.positions;
        // Capped by this run's limit, which may be lower than the one they were given under.
        let cap = coordinator.weight_cap();
        for (job, weight) in contents.weights {
            // A weight written after its job was retired is no job's.
            if coordinator.jobs.contains_key(&JobId(job)) {
                coordinator.ready.set_weight(job, weight.clamp(1, cap));
            }
        }
        coordinator.journal_path = Some(journal.path().to_path_buf());
        coordinator.journal = Some(Arc::new(Mutex::new(journal)));
        Ok(coordinator)
    }

    /// The journal file, when there is one.
    pub fn journal_path(&self) -> Option<PathBuf> {
        self.journal_path.clone()
    }

    /// Registers a job whose ranks each run `steps_per_epoch` steps; durable on return. The
    /// journal is written under `&mut self`; a service that must not wait on its disk uses
    /// [`job_write`](Self::job_write) instead.
    pub fn register_job(
        &mut self,
        spec: JobSpec,
        steps_per_epoch: u64,
    ) -> CoordinatorResult<JobId> {
        let write = self.job_write(spec, steps_per_epoch, 0)?;
        let outcome = write.write();
        self.job_written(write, outcome)
    }

    /// Takes the next job id for a job whose ranks each run `steps_per_epoch` steps, of the
    /// `weight` asked (0: the default; capped as by [`set_job_weight`](Self::set_job_weight)),
    /// to be journaled outside the core ([`JobWrite::write`]: job and weight in one
    /// transaction) and handed back with [`job_written`](Self::job_written), which registers
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
            journal: self.journal.clone(),
            id,
            steps_per_epoch,
            weight: (weight > 0).then(|| weight.clamp(1, self.weight_cap())),
            encoded: spec.encode_to_vec(),
            spec,
        })
    }

    /// Takes back `write` after [`JobWrite::write`] gave `outcome`: once it landed the job is
    /// registered and its id returned; otherwise its id is let go and the write's error
    /// returned.
    pub fn job_written(
        &mut self,
        write: JobWrite,
        outcome: CoordinatorResult<()>,
    ) -> CoordinatorResult<JobId> {
        let JobWrite {
            journal,
            id,
            steps_per_epoch,
            spec,
            weight,
            encoded,
        } = write;
        outcome?;
        if journal.is_some() {
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
    fn first_free_job_id(&self) -> JobId {
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
        if self.journal.is_some() {
            self.pruned_positions.extend(dropped);
            self.retired_jobs.extend(retired.iter().map(|job| job.0));
        }
        self.stats.jobs_retired += retired.len() as u64;
        retired
    }

    /// The largest weight a job gets in this run.
    fn weight_cap(&self) -> u32 {
        self.config.max_job_weight.clamp(1, MAX_JOB_WEIGHT)
    }

    /// Sets `job`'s share of the workers to the `requested` weight, capped by
    /// [`CoordinatorConfig::max_job_weight`] (0 counts as 1); journaled when it changes, under
    /// `&mut self` (a service uses [`weight_write`](Self::weight_write)). Returns the weight
    /// given.
    pub fn set_job_weight(&mut self, job: JobId, requested: u32) -> CoordinatorResult<u32> {
        let write = self.weight_write(job, requested)?;
        let outcome = write.write();
        self.weight_written(&write, outcome)
    }

    /// What setting `job`'s weight to `requested` (as [`set_job_weight`](Self::set_job_weight))
    /// writes to the journal, to be written outside the core ([`WeightWrite::write`]: nothing
    /// when the weight does not change) and handed back with
    /// [`weight_written`](Self::weight_written), which gives the job its weight. Two changes of
    /// one job's weight must be written and handed back in the order they were taken.
    pub fn weight_write(&self, job: JobId, requested: u32) -> CoordinatorResult<WeightWrite> {
        if !self.jobs.contains_key(&job) {
            return Err(CoordinatorError::UnknownJob(job));
        }
        let weight = requested.clamp(1, self.weight_cap());
        let changes = self.job_share(job).weight != weight;
        Ok(WeightWrite {
            journal: self.journal.clone().filter(|_| changes),
            changes,
            job,
            requested,
            weight,
        })
    }

    /// Takes back `write` after [`WeightWrite::write`] gave `outcome`: once it landed the job
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
        if write.journal.is_some() {
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

    /// The spec of a job (workers need it to produce its batches).
    pub fn job_spec(&self, job: JobId) -> CoordinatorResult<&JobSpec> {
        self.jobs
            .get(&job)
            .map(|j| &j.spec)
            .ok_or(CoordinatorError::UnknownJob(job))
    }

    /// Registers job `id` in memory, found by its spec's `encoding` from then on.
    fn insert_job(&mut self, id: JobId, spec: JobSpec, encoding: Vec<u8>, steps_per_epoch: u64) {
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
            },
        );
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

    fn live_worker(&self, worker: WorkerId) -> CoordinatorResult<usize> {
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
    fn requeue_leases_of_dead_workers(&mut self) -> (u64, u64) {
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
            if self.journal.is_some() {
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
        if self.journal.is_some() && position != journaled {
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
    fn prune_positions(&mut self, job: JobId, rank: u32, epoch: u64) {
        let Some(oldest_kept) = epoch.checked_sub(1) else {
            return;
        };
        let stale = |key: &PositionKey| key.0 == job.0 && key.1 == rank && key.2 < oldest_kept;
        let mut dropped = Vec::new();
        self.resume_positions.retain(|key, _| {
            let drop = stale(key);
            if drop {
                dropped.push(*key);
            }
            !drop
        });
        let open = &self.session_index;
        self.dirty_positions
            .retain(|key, _| !stale(key) || open.contains_key(key));
        if self.journal.is_some() {
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
        self.lease_into(worker, max_tasks, now, &mut leases)?;
        Ok(leases)
    }

    /// [`lease`](Self::lease) appending to `out`, so a caller can reuse one vector.
    pub fn lease_into(
        &mut self,
        worker: WorkerId,
        max_tasks: usize,
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
        let heartbeat = &mut self.workers[worker_index].last_heartbeat;
        *heartbeat = (*heartbeat).max(now);
        let deadline = *heartbeat + self.config.lease_timeout;
        let mut leased = 0;
        while leased < max_tasks {
            let Some((job, key)) = self.ready.pop() else {
                break;
            };
            let session_index = key.2;
            let Some(session) = self.sessions.get_mut(&session_index) else {
                continue;
            };
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
            let session_id = session.id;
            let lease_id = self.alloc_slot(entry);
            out.push(Lease {
                task,
                session: session_id,
                lease_id,
                deadline,
            });
            leased += 1;
        }
        self.stats.assignments += leased as u64;
        Ok(leased)
    }

    fn alloc_slot(&mut self, entry: LeaseEntry) -> LeaseId {
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

    fn free_slot(&mut self, index: usize) {
        let slot = &mut self.leases[index];
        slot.entry = None;
        slot.generation = slot.generation.wrapping_add(1);
        self.free_lease_slots.push(index as u32);
        self.stats.leased_tasks -= 1;
    }

    /// Ends the live lease `lease_id` of `worker` (its slot is freed) and returns it: `Ok(None)`
    /// when it is stale (expired, or already reported), an error when the worker or the lease
    /// was never issued or the lease belongs to another worker.
    fn end_lease(
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

    fn fail_leased(
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
        if let Some(session) = self.sessions.get(&entry.session) {
            tracing::warn!(
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
    fn requeue(&mut self, entry: LeaseEntry, credit_back: bool) -> bool {
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
    /// acknowledged twice is ignored and counted. The acknowledged position is journaled every
    /// [`CoordinatorConfig::journal_every`] acknowledgements (and on [`flush`](Self::flush)).
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
        if position != before && self.journal.is_some() {
            self.dirty_positions
                .insert((entry.job.0, entry.rank, entry.epoch), position);
        }
        self.acks_since_flush += 1;
        if self.acks_since_flush >= self.config.journal_every {
            self.flush()?;
        }
        Ok(AckOutcome::Recorded {
            position: Step(position),
        })
    }

    /// Writes the acknowledged positions changed since the last write, durably, here and now
    /// (see [`take_positions`](Self::take_positions) for a write outside the core).
    pub fn flush(&mut self) -> CoordinatorResult<()> {
        self.acks_since_flush = 0;
        let Some(journal) = &self.journal else {
            return Ok(());
        };
        if self.nothing_to_write() {
            return Ok(());
        }
        // Nothing moves while this write runs, so no copy is taken: what it wrote is forgotten
        // once it lands, and kept for the next write if it fails. It carries the latest number,
        // so a write taken before it and still on its way is skipped when it lands.
        self.position_writes += 1;
        let positions = self.dirty_positions.iter().map(|(key, at)| (*key, *at));
        lock_journal(journal).write_positions_numbered(
            self.position_writes,
            positions,
            &self.pruned_positions,
            &self.retired_jobs,
        )?;
        self.stats.journal_commits += 1;
        tracing::debug!(
            positions = self.dirty_positions.len(),
            pruned = self.pruned_positions.len(),
            "acknowledged positions journaled"
        );
        self.dirty_positions.clear();
        self.pruned_written += self.pruned_positions.len() as u64;
        self.pruned_positions.clear();
        self.retired_jobs.clear();
        Ok(())
    }

    /// Whether no position, prune or retired job waits to be written.
    fn nothing_to_write(&self) -> bool {
        self.dirty_positions.is_empty()
            && self.pruned_positions.is_empty()
            && self.retired_jobs.is_empty()
    }

    /// The acknowledged positions changed (and dropped) since the last write that landed, to be
    /// written outside the core, so the core's other calls go on while the disk takes them; `None`
    /// without a journal or with nothing to write. The core keeps them until
    /// [`positions_written`](Self::positions_written) says a write of theirs landed: a write
    /// that fails, or is never made, loses nothing.
    pub fn take_positions(&mut self) -> Option<PositionWrite> {
        self.acks_since_flush = 0;
        let journal = self.journal.as_ref()?;
        if self.nothing_to_write() {
            return None;
        }
        self.position_writes += 1;
        Some(PositionWrite {
            journal: Arc::clone(journal),
            seq: self.position_writes,
            positions: self
                .dirty_positions
                .iter()
                .map(|(k, at)| (*k, *at))
                .collect(),
            pruned: self.pruned_positions.clone(),
            pruned_upto: self.pruned_written + self.pruned_positions.len() as u64,
            retired: self.retired_jobs.clone(),
        })
    }

    /// Takes back `write` after [`PositionWrite::write`] gave `outcome`: once landed, its
    /// positions that have not changed since are written, and its prunes done; otherwise
    /// everything stays for the next write. Returns the write's error.
    pub fn positions_written(
        &mut self,
        write: &PositionWrite,
        outcome: CoordinatorResult<bool>,
    ) -> CoordinatorResult<()> {
        if !outcome? {
            // A later write landed first, with these positions or newer ones.
            return Ok(());
        }
        self.stats.journal_commits += 1;
        let done = write.pruned_upto.saturating_sub(self.pruned_written);
        let done = usize::try_from(done).map_or(self.pruned_positions.len(), |done| {
            done.min(self.pruned_positions.len())
        });
        self.pruned_positions.drain(..done);
        self.pruned_written += done as u64;
        if !write.retired.is_empty() {
            let deleted: HashSet<u64> = write.retired.iter().copied().collect();
            self.retired_jobs.retain(|job| !deleted.contains(job));
        }
        // A key dropped after this write was taken, then opened again, is deleted by the next
        // write before its position is written again: that position stays to be written.
        let pruned_since: HashSet<PositionKey> = self.pruned_positions.iter().copied().collect();
        for (key, at) in &write.positions {
            // A position that moved since is written by a later write.
            if self.dirty_positions.get(key) == Some(at) && !pruned_since.contains(key) {
                self.dirty_positions.remove(key);
            }
        }
        tracing::debug!(
            positions = write.positions.len(),
            pruned = write.pruned.len(),
            "acknowledged positions journaled"
        );
        Ok(())
    }

    /// The acknowledged position of a session: every step below it was received.
    pub fn acknowledged_position(&self, session: SessionId) -> CoordinatorResult<Step> {
        let index = open_key(&self.sessions, self.next_session, session)?;
        self.sessions
            .get(&index)
            .map(|entry| Step(entry.acked_position))
            .ok_or(CoordinatorError::UnknownSession(session))
    }

    /// Counters, sizes and the memory estimate. Costs a pass over the sessions.
    pub fn stats(&self) -> CoordinatorStats {
        let mut stats = self.stats.clone();
        stats.jobs = self.jobs.len() as u64;
        stats.workers = self.workers.iter().filter(|w| w.alive).count() as u64;
        stats.sessions = self.sessions.len() as u64;
        stats.queued_tasks = self.sessions.values().map(Session::queued).sum();
        stats.memory_bytes = self.memory_bytes() as u64;
        stats
    }

    /// Estimated heap bytes of the coordinator's data structures, from their capacities (job
    /// specs and the journal's own cache excluded).
    fn memory_bytes(&self) -> usize {
        // Ordered sets: about 16 bytes of node overhead per key besides the key.
        let ready = self.ready.len() * (size_of::<ReadyKey>() + 16) + self.ready.jobs() * 128;
        // Hash maps: key, value and one control byte per bucket, buckets ~8/7 of capacity.
        let map = |cap: usize, entry: usize| cap * 8 / 7 * (entry + 1);
        size_of::<Self>()
            + self.workers.capacity() * size_of::<Worker>()
            + map(self.sessions.capacity(), size_of::<(u32, Session)>())
            + self
                .sessions
                .values()
                .map(Session::heap_bytes)
                .sum::<usize>()
            + map(
                self.session_index.capacity(),
                size_of::<(PositionKey, u32)>(),
            )
            + map(
                self.resume_positions.capacity(),
                size_of::<(PositionKey, u64)>(),
            )
            + map(
                self.dirty_positions.capacity(),
                size_of::<(PositionKey, u64)>(),
            )
            + self.pruned_positions.capacity() * size_of::<PositionKey>()
            + ready
            + self.leases.capacity() * size_of::<LeaseSlot>()
            + self.free_lease_slots.capacity() * size_of::<u32>()
            + self.jobs.len() * (size_of::<(JobId, Job)>() + 16)
    }
}
