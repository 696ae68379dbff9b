//! Jobs through the service: checked by a worker (`WorkerData.DescribeJob`), registered with
//! their weight off the state's lock (one registration at a time, durable before it is
//! answered), and retired with what the service and the dashboard kept of them.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message;

use stoker_pipeline::ErrorKind;
use stoker_proto::v1::worker_data_client::WorkerDataClient;
use stoker_proto::v1::{self as proto, DescribeJobRequest, JobSpec};
use stoker_rpc::error_kinds;
use tonic::Status;

use super::timers::write_off_the_lock;
use super::{lock, CoordinatorService, State};
use crate::client_reports::job_name;
use crate::status::coordinator_status;
use crate::{Coordinator, JobId};

/// Per job spec being described (its encoding), the turn its registrations take in order, and
/// the refusal of the last description tried while others waited (which they answer with,
/// rather than each trying in turn); an entry goes once nobody holds or waits for it.
pub(super) type DescribeTurns = Arc<Mutex<HashMap<Vec<u8>, Arc<tokio::sync::Mutex<Failed>>>>>;

/// Why the description a turn's holder tried failed, if it did, and when (its ticket): it
/// answers the registrations that were waiting then, not one that came later (which describes
/// anew: the waiters of a failure, cancelled, left it to answer every later registration of
/// the spec, however long after its cause was gone).
type Failed = Option<(Status, u64)>;

impl State {
    /// Keeps what a worker `described` of the job `id`, now.
    fn described(&mut self, id: JobId, described: proto::DescribeJobResponse) {
        self.descriptions.insert(id.0, described);
        self.described_at.insert(id.0, Instant::now());
    }

    /// The newest job of `spec` registered over the dataset a worker `described`: its step
    /// count, and its sample count and fingerprint where its description is kept (journaled
    /// with the job; a job of an older journal has none: the step count decides).
    fn job_of(&self, spec: &JobSpec, described: &proto::DescribeJobResponse) -> Option<JobId> {
        let same_samples = |id: JobId| {
            self.descriptions.get(&id.0).is_none_or(|kept| {
                let counts = [kept.num_samples, described.num_samples];
                (counts.contains(&0) || counts[0] == counts[1])
                    && same_fingerprint(&kept.dataset_fingerprint, &described.dataset_fingerprint)
            })
        };
        self.core
            .jobs_of_spec(spec)
            .into_iter()
            .rev()
            .find(|&(id, steps)| steps == described.steps_per_epoch && same_samples(id))
            .map(|(id, _)| id)
    }
}

/// Whether two descriptions' fingerprints say their datasets are one, as far as they can: a
/// missing one, or one of another version (`v3:...`: a worker of another release, rolled out
/// across a restart, computes them otherwise), says nothing, as a worker's own check takes it.
fn same_fingerprint(kept: &str, described: &str) -> bool {
    kept.is_empty()
        || described.is_empty()
        || fingerprint_version(kept) != fingerprint_version(described)
        || kept == described
}

/// A fingerprint's version (`v3` of `v3:...`; none for one without).
fn fingerprint_version(fingerprint: &str) -> Option<&str> {
    fingerprint.split_once(':').map(|(version, _)| version)
}

/// Orders registrations' waits and descriptions' failures.
static TICKETS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn ticket() -> u64 {
    TICKETS.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
}

/// What the service knows of a job spec a client registers.
enum Known {
    /// Registered and described in this run, lately or with a session open, its weight as
    /// asked: answered at once.
    Answered(JobId, proto::DescribeJobResponse),
    /// Described, with another weight asked.
    Described(proto::DescribeJobResponse),
    /// Not described in this run, or not lately with no session open: described again.
    Unknown,
}

/// A registration's turn at describing its spec; lets the entry go when it was the last.
struct DescribeTurn {
    turns: DescribeTurns,
    key: Vec<u8>,
    held: tokio::sync::OwnedMutexGuard<Failed>,
}

impl Drop for DescribeTurn {
    fn drop(&mut self) {
        let mut turns = self.turns.lock().unwrap_or_else(|p| p.into_inner());
        // The map's and this turn's alone: nobody waits for it (a waiter holds one too).
        if Arc::strong_count(tokio::sync::OwnedMutexGuard::mutex(&self.held)) == 2 {
            turns.remove(&self.key);
        }
    }
}

/// Whether giving `job` the `weight` a registration asks for (0: none) changes its weight.
pub(super) fn asks_another_weight(
    core: &Coordinator,
    job: JobId,
    weight: u32,
) -> Result<bool, Status> {
    Ok(weight > 0
        && core
            .weight_write(job, weight)
            .map_err(coordinator_status)?
            .changes())
}

impl CoordinatorService {
    /// Registers the job of `spec` (its ranks' key), describing it first unless this run did
    /// lately or a session of it is open (`description_reused_for`):
    /// one description at a time per spec, so the ranks of a job registering together have
    /// one worker open its dataset once, not once per rank at the same time. Returns the
    /// job's id and description.
    pub(crate) async fn register(
        &self,
        spec: JobSpec,
        weight: u32,
    ) -> Result<(JobId, proto::DescribeJobResponse), Status> {
        let mut turn: Option<DescribeTurn> = None;
        let described = loop {
            match (self.known(&spec, weight)?, turn.as_mut()) {
                (Known::Answered(id, described), _) => return Ok((id, described)),
                (Known::Described(described), _) => break described,
                (Known::Unknown, Some(turn)) => match self.describe(&spec).await {
                    Ok(described) => break described,
                    Err(refused) => {
                        *turn.held = Some((refused.clone(), ticket()));
                        return Err(refused);
                    }
                },
                (Known::Unknown, None) => {
                    let waited_from = ticket();
                    let taken = self.describe_turn(&spec).await;
                    if let Some((refused, at)) = taken.held.as_ref() {
                        if *at > waited_from {
                            return Err(refused.clone());
                        }
                    }
                    turn = Some(taken);
                }
            }
        };
        // On a task of its own, so a client that hangs up mid-write does not leave the write
        // half handed back.
        let id = tokio::spawn(
            self.clone()
                .register_described(spec, described.clone(), weight),
        )
        .await
        .map_err(|error| {
            Status::internal(format!("the job's registration did not finish: {error}"))
        })??;
        drop(turn);
        Ok((id, described))
    }

    /// What this run knows of `spec`, a registration asking `weight` (0: none) of it.
    fn known(&self, spec: &JobSpec, weight: u32) -> Result<Known, Status> {
        let mut state = lock(&self.state);
        // A description of a job no session has open, older than the registrations of one run
        // take, is asked again: the dataset may have changed since.
        let fresh = |id: JobId| {
            state
                .described_at
                .get(&id.0)
                .is_some_and(|at| at.elapsed() < self.config.description_reused_for)
                || state.core.has_open_session(id)
        };
        let described = state
            .core
            .jobs_of_spec(spec)
            .into_iter()
            .rev()
            .filter(|&(id, _)| fresh(id))
            .find_map(|(id, _)| Some((id, state.descriptions.get(&id.0)?.clone())));
        Ok(match described {
            Some((id, described)) if !asks_another_weight(&state.core, id, weight)? => {
                state.core.job_in_use(id);
                // In use: its description answers for as long again.
                state.described_at.insert(id.0, Instant::now());
                Known::Answered(id, described)
            }
            Some((_, described)) => Known::Described(described),
            None => Known::Unknown,
        })
    }

    /// Waits for `spec`'s turn at being described.
    async fn describe_turn(&self, spec: &JobSpec) -> DescribeTurn {
        let key = spec.encode_to_vec();
        let gate = {
            let mut turns = self.describing.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(turns.entry(key.clone()).or_default())
        };
        let held = gate.lock_owned().await;
        DescribeTurn {
            turns: Arc::clone(&self.describing),
            key,
            held,
        }
    }

    /// Refuses a job this coordinator's shard does not own: its clients were given another
    /// address list than its workers and coordinators (or another order).
    pub(super) fn check_shard(&self, spec: &JobSpec) -> Result<(), Status> {
        let Some((index, of)) = self.config.shard else {
            return Ok(());
        };
        let owner = stoker_rpc::shards::job_shard(spec, of);
        if owner == index {
            return Ok(());
        }
        Err(error_kinds::status(
            ErrorKind::InvalidArgument,
            format!(
                "this job belongs to coordinator {} of the {of} in the list, and this is \
                 coordinator {} (--shard {index}/{of}): give clients the same address list, \
                 in the same order, as the workers and coordinators",
                owner, index
            ),
        ))
    }

    /// Registers the job of `spec`, which a worker `described`, unless one of its step count
    /// is registered already, and sets its `weight` (0 leaves it): journaled outside the
    /// state's lock, one registration at a time (a new job with its weight in one write).
    /// Returns the job's id.
    pub(super) async fn register_described(
        self,
        spec: JobSpec,
        described: proto::DescribeJobResponse,
        weight: u32,
    ) -> Result<JobId, Status> {
        if described.steps_per_epoch == 0 {
            return Err(no_batch_per_rank(&spec, described.num_samples));
        }
        // Nothing to write (the ranks of a journaled job after a restart): not in turn.
        if let Some(id) = self.registered_as_asked(&spec, &described, weight)? {
            return Ok(id);
        }
        let _in_turn = self.registrations.lock().await;
        if let Some(id) = self.registered_as_asked(&spec, &described, weight)? {
            return Ok(id);
        }
        let steps = described.steps_per_epoch;
        let (registered, earlier) = {
            let state = lock(&self.state);
            let registered = state.job_of(&spec, &described);
            (registered, state.core.jobs_of_spec(&spec).last().copied())
        };
        if let Some(id) = registered {
            // Registered, its weight to change.
            let write = lock(&self.state)
                .core
                .weight_write(id, weight)
                .map_err(coordinator_status)?;
            let journal = self.journal.clone();
            let (write, outcome) =
                write_off_the_lock(write, move |write| journal.write_weight(write))
                    .await
                    .map_err(coordinator_status)?;
            let mut state = lock(&self.state);
            state
                .core
                .weight_written(&write, outcome)
                .map_err(coordinator_status)?;
            state.described(id, described);
            state.core.job_in_use(id);
            return Ok(id);
        }
        // A journaled job of another step count was registered over another dataset than the
        // workers see now: served as it was, its clients would wait for steps the core never
        // leases, so the job is registered anew. So is one of the same step count described
        // anew over other samples (a changed dataset of the same size): workers that hold the
        // old one open serve its sessions only, never a batch of the new run.
        let mut write = lock(&self.state)
            .core
            .job_write(spec, steps, weight)
            .map_err(coordinator_status)?;
        write.described = described.encode_to_vec();
        let journal = self.journal.clone();
        let (write, outcome) = write_off_the_lock(write, move |write| journal.write_job(write))
            .await
            .map_err(coordinator_status)?;
        let mut state = lock(&self.state);
        let id = state
            .core
            .job_written(write, outcome)
            .map_err(coordinator_status)?;
        state.described(id, described);
        state.core.job_in_use(id);
        if let Some((before, steps_before)) = earlier {
            tracing::warn!(
                job = id.0,
                earlier = before.0,
                steps_before,
                steps_now = steps,
                "the job's dataset changed since it was registered: registered anew"
            );
        }
        Ok(id)
    }

    /// The job of `spec` a worker `described` (its step count, and its samples when this run
    /// described it before), when it is registered and its weight is as asked (nothing to
    /// write); its description kept.
    pub(super) fn registered_as_asked(
        &self,
        spec: &JobSpec,
        described: &proto::DescribeJobResponse,
        weight: u32,
    ) -> Result<Option<JobId>, Status> {
        let mut state = lock(&self.state);
        let Some(id) = state.job_of(spec, described) else {
            return Ok(None);
        };
        if asks_another_weight(&state.core, id, weight)? {
            return Ok(None);
        }
        state.described(id, described.clone());
        state.core.job_in_use(id);
        Ok(Some(id))
    }

    /// How often jobs are looked at for retirement: a quarter of the retention, at most every
    /// [`RETIRE_LOOK_EVERY`].
    pub(super) fn retire_look_every(&self) -> Duration {
        self.config
            .core
            .job_retention
            .map_or(RETIRE_LOOK_EVERY, |retention| {
                (retention / 4).min(RETIRE_LOOK_EVERY)
            })
    }

    /// Retires the jobs idle for their retention, and forgets what the service and the
    /// dashboard kept of them.
    pub(super) fn retire_idle_jobs(&self, state: &mut State, now: Instant) {
        let due = state.core.idle_jobs(now);
        if due.is_empty() {
            return;
        }
        let names: HashMap<u64, String> = due
            .iter()
            .map(|job| (job.0, job_name(&state.core, job.0)))
            .collect();
        let retired: HashSet<u64> = state
            .core
            .retire_jobs(&due)
            .into_iter()
            .map(|job| job.0)
            .collect();
        for job in &retired {
            state.descriptions.remove(job);
            state.described_at.remove(job);
            state.serving.remove(job);
        }
        state.monitors.retain(|(job, _), _| !retired.contains(job));
        state.clients.retain(|(job, _), _| !retired.contains(job));
        if let Some(dashboard) = &self.dashboard {
            let names: HashSet<String> = names
                .into_iter()
                .filter(|(job, _)| retired.contains(job))
                .map(|(_, name)| name)
                .collect();
            dashboard.forget_jobs(&names);
        }
    }

    /// Asks live workers, in turn, to open the job; the first that opens it describes it. A
    /// worker that refuses it for a reason of its own (the folder outside its --data-root, a
    /// path missing on its node, its security) leaves it to the next, as a worker that cannot
    /// open a job mid-run leaves its share to the others; the job is refused with the first
    /// such refusal when none opens it, and at once for any other refusal.
    ///
    /// The whole check takes at most `describe_timeout`: a worker that has not answered within
    /// an eighth of it is joined by the next (every worker opens the job's datasets to serve
    /// it anyway), sooner when there are many, so that every worker is asked within half of
    /// it; one stuck worker, or many, cost a registration that long at most, not that long
    /// each.
    pub(super) async fn describe(
        &self,
        spec: &JobSpec,
    ) -> Result<proto::DescribeJobResponse, Status> {
        let waited_since = Instant::now();
        let workers = loop {
            let workers = {
                let state = lock(&self.state);
                Self::worker_infos(&state)
            };
            if !workers.is_empty() {
                break workers;
            }
            if waited_since.elapsed() >= self.config.worker_wait {
                return Err(error_kinds::status(
                    ErrorKind::WorkerUnavailable,
                    "no worker is registered with the coordinator (start stoker-worker --coordinator ADDR)",
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let timeout = self.config.describe_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let parts = u32::try_from(workers.len().saturating_mul(2))
            .unwrap_or(u32::MAX)
            .max(HEAD_START_PARTS);
        let head_start = timeout / parts;
        let mut unasked = workers.iter().enumerate();
        let mut asking = tokio::task::JoinSet::new();
        // Asked and not answered yet, by their place in `workers`.
        let mut waiting: Vec<usize> = Vec::new();
        let mut last_error = None;
        let mut refusal = None;
        // Each turn asks the next worker: at the start, when the last asked took its head
        // start, and when one answered with anything but a description.
        loop {
            if let Some((place, worker)) = unasked.next() {
                let channel = self
                    .config
                    .network
                    .channel(&worker.data_address, &self.config.client_security)
                    .map_err(|e| Status::internal(e.to_string()))?;
                let request = DescribeJobRequest {
                    spec: Some(spec.clone()),
                };
                asking.spawn(async move {
                    let answer = WorkerDataClient::new(channel).describe_job(request).await;
                    (place, answer.map(tonic::Response::into_inner))
                });
                waiting.push(place);
            }
            if asking.is_empty() {
                break;
            }
            let more = unasked.len() > 0;
            let answered = tokio::select! {
                answered = asking.join_next() => answered,
                () = tokio::time::sleep(head_start), if more => continue,
                () = tokio::time::sleep_until(deadline) => break,
            };
            let Some(Ok((place, answer))) = answered else {
                continue; // A task that panicked: its worker stays named as not answering.
            };
            waiting.retain(|&asked| asked != place);
            let worker = &workers[place];
            match answer {
                Ok(response) => {
                    if let Some(refused) = &refusal {
                        tracing::warn!(worker = worker.worker_id, %refused, "a worker refused a job another opened");
                    }
                    return Ok(response);
                }
                Err(status) if error_kinds::is_transient(&status) => {
                    tracing::warn!(worker = worker.worker_id, %status, "worker unreachable while checking a job");
                    // Still transient (the client tries again), but named as what it is:
                    // the coordinator answered, a worker did not.
                    last_error = Some(error_kinds::worker_unreachable(Status::with_metadata(
                        status.code(),
                        format!(
                            "the coordinator cannot reach worker {} at {} to open the job \
                             (is that address reachable from the coordinator?): {}",
                            worker.worker_id,
                            worker.data_address,
                            status.message()
                        ),
                        status.metadata().clone(),
                    )));
                }
                Err(status) => {
                    // The worker's kind goes back with its reason (or the kind of the
                    // connector's refusal, when the coordinator could not reach it).
                    let kind = error_kinds::kind_of_status(&status);
                    let refused = error_kinds::with_kind(
                        Status::with_metadata(
                            status.code(),
                            format!(
                                "worker {} ({}) refused the job: {}",
                                worker.worker_id,
                                worker.data_address,
                                status.message()
                            ),
                            status.metadata().clone(),
                        ),
                        kind,
                    );
                    // Only a refusal about this worker (the folder outside its
                    // --data-root, a path its node lacks, its own connection) is left to
                    // the next: any other (a split to name, a format it cannot read) every
                    // worker would give, each after as long.
                    if !matches!(
                        kind,
                        ErrorKind::PermissionDenied
                            | ErrorKind::NotFound
                            | ErrorKind::NotADirectory
                            | ErrorKind::Unauthenticated
                            | ErrorKind::Tls
                    ) {
                        return Err(refused);
                    }
                    refusal.get_or_insert(refused);
                }
            }
        }
        if !waiting.is_empty() {
            // The coordinator answered, workers did not in time: named as such.
            let silent: Vec<String> = waiting
                .iter()
                .map(|&place| {
                    let worker = &workers[place];
                    format!("worker {} at {}", worker.worker_id, worker.data_address)
                })
                .collect();
            let silent = silent.join(", ");
            tracing::warn!(workers = %silent, ?timeout, "no worker opened a job in time");
            // What the others answered, if they could not be reached, goes with it.
            let besides = last_error
                .map(|status: Status| format!("; besides: {}", status.message()))
                .unwrap_or_default();
            last_error = Some(error_kinds::worker_unreachable(Status::deadline_exceeded(
                format!(
                    "{silent} did not open the job's datasets within {timeout:?} (a first \
                     index of a large set can take longer: raise the coordinator's \
                     --describe-timeout-secs){besides}"
                ),
            )));
        }
        Err(refusal
            .or(last_error)
            .unwrap_or_else(|| Status::unavailable("no worker could check the job")))
    }
}

/// A worker asked to open a job that has not answered within this part of the describe
/// timeout (or less, with more than half as many workers) is joined by the next.
const HEAD_START_PARTS: u32 = 8;

/// Longest time between two looks for jobs to retire.
const RETIRE_LOOK_EVERY: Duration = Duration::from_secs(5);

/// The refusal of a job whose epoch leaves no batch for a rank (the core serves a step at
/// least), in the spec's terms: its `num_samples`, ranks and batch size.
fn no_batch_per_rank(spec: &JobSpec, num_samples: u64) -> Status {
    let (batch, world) = (spec.batch_size, spec.world_size.max(1));
    let why = if spec.drop_last {
        "with drop_last, a rank's last partial batch is dropped"
    } else {
        "a rank with no sample has no batch"
    };
    error_kinds::status(
        ErrorKind::InvalidArgument,
        format!(
            "the dataset's {num_samples} samples over {world} ranks in batches of {batch} leave \
             no batch per rank in an epoch ({why}): use a smaller batch_size or fewer ranks, or \
             more data"
        ),
    )
}
