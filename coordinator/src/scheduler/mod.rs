//! The coordinator's core: workers, sessions, task leases and what must be durable, in process,
//! without sockets and without I/O (the gRPC service is a thin layer over exactly this API; the
//! journal, `crate::journal`, writes what the core hands out, `crate::durable` pairs them).
//!
//! One module per idea, each an `impl Coordinator` over the state kept here: `jobs`
//! (registration, weights, retirement), `workers` (liveness), `sessions` (opening, closing,
//! credits), `leases` (handing out tasks, their ends, acknowledgements), `durability` (the
//! positions the journal keeps).
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
//!   received) are journaled, but not by the core: every journal write is an intent the core
//!   hands out, a [`JobWrite`], [`WeightWrite`] or [`PositionWrite`], which the caller writes
//!   (on any thread, off its lock) and hands back ([`job_written`](Coordinator::job_written),
//!   [`weight_written`](Coordinator::weight_written),
//!   [`positions_written`](Coordinator::positions_written)). A job exists once its write
//!   landed; positions are taken with [`take_positions`](Coordinator::take_positions), due
//!   every [`CoordinatorConfig::journal_every`] acknowledgements
//!   ([`write_due`](Coordinator::write_due)) or on a timer, and kept until a write of theirs
//!   lands. A crash loses at most the unwritten positions, whose steps are then redone: batches
//!   are a pure function of (spec, epoch, rank, step), so the client receives identical bytes
//!   and drops them by step number.
//! - Nothing grows with the epochs a job runs: a closed session is dropped (its id answers
//!   "closed" from then on), and when a rank opens epoch `e` the positions of its epochs before
//!   `e - 1` leave memory and the journal. Nor with the jobs a coordinator has served: a job
//!   with no session open for [`CoordinatorConfig::job_retention`] is retired
//!   ([`idle_jobs`](Coordinator::idle_jobs), [`retire_jobs`](Coordinator::retire_jobs)), its
//!   spec, weight and positions gone from memory and the journal; its id is not given again.
//!
//! Time is passed in (`now: Instant`), so tests run without sleeping.

mod durability;
mod error;
mod ids;
mod jobs;
mod leases;
mod session;
mod sessions;
mod shares;
#[cfg(test)]
mod tests;
mod types;
mod workers;

use std::collections::{BTreeMap, HashMap, HashSet};

/// The core's maps keyed by integers: foldhash (seeded per process, so keys a client picks
/// cannot be aimed at collisions) instead of std's SipHash, which took about a sixth of an
/// assignment's time in `stoker bench coordinator`.
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
use std::mem::size_of;
use std::time::Instant;

use prost::Message;
use stoker_proto::v1::JobSpec;

pub use durability::PositionWrite;
pub(crate) use error::journal_error;
pub use error::{CoordinatorError, CoordinatorResult};
pub use ids::{JobId, LeaseId, SessionId, Step, TaskKey, WorkerId};
pub use jobs::{JobWrite, WeightWrite};
pub use types::{
    AckOutcome, CoordinatorConfig, CoordinatorStats, ExpireReport, Lease, LeaseOutcome,
    MAX_JOB_WEIGHT,
};
pub(crate) use types::{JournalContents, JournaledJob, PositionKey};

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
    /// Why a worker last handed one of its tasks back, and when.
    last_failure: Option<(String, Instant)>,
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
/// journal writes they call for, handed out as intents. Single-threaded (`&mut self`); a
/// service wraps it in a lock or an actor.
pub struct Coordinator {
    config: CoordinatorConfig,
    /// Whether a journal keeps this core (restored from one): only then are positions, prunes
    /// and retired jobs kept for [`PositionWrite`]s.
    journaled: bool,
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
    /// closed), consulted when one opens; in key order, so a rank's epochs are one range.
    resume_positions: BTreeMap<PositionKey, u64>,
    /// What the journal held of its jobs' descriptions, until the service takes them.
    restored_descriptions: HashMap<u64, Vec<u8>>,
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
            journaled: false,
            jobs: BTreeMap::new(),
            jobs_by_spec: HashMap::new(),
            next_job: JobId(0),
            retired_jobs: Vec::new(),
            job_id_base: 0,
            workers: Vec::new(),
            sessions: FastMap::default(),
            next_session: 0,
            session_index: FastMap::default(),
            resume_positions: BTreeMap::new(),
            restored_descriptions: HashMap::new(),
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

    /// A journaled core, as its journal held it when opened: registered jobs, their weights and
    /// acknowledged positions come back; workers and leases do not (workers re-register, and
    /// unacknowledged steps are redone). No I/O: the journal was read by its opener.
    pub(crate) fn restore(
        config: CoordinatorConfig,
        contents: JournalContents,
    ) -> CoordinatorResult<Self> {
        let mut coordinator = Self::in_memory(config);
        coordinator.journaled = true;
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
        coordinator.resume_positions = contents.positions.into_iter().collect();
        let mut descriptions = contents.descriptions;
        descriptions.retain(|job, _| coordinator.jobs.contains_key(&JobId(*job)));
        coordinator.restored_descriptions = descriptions;
        // Capped by this run's limit, which may be lower than the one they were given under.
        let cap = coordinator.weight_cap();
        for (job, weight) in contents.weights {
            // A weight written after its job was retired is no job's.
            if coordinator.jobs.contains_key(&JobId(job)) {
                coordinator.ready.set_weight(job, weight.clamp(1, cap));
            }
        }
        Ok(coordinator)
    }

    /// What the journal held of its jobs' descriptions (encoded `DescribeJobResponse`s), taken
    /// once by the service that serves this core.
    pub(crate) fn take_restored_descriptions(&mut self) -> HashMap<u64, Vec<u8>> {
        std::mem::take(&mut self.restored_descriptions)
    }

    /// Whether a journal keeps this core (its writes are to be made).
    pub fn journaled(&self) -> bool {
        self.journaled
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
            // A B-tree's nodes: about the entries' size again in keys, values and slack.
            + self.resume_positions.len() * 2 * size_of::<(PositionKey, u64)>()
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
