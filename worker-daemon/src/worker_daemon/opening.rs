//! A job's datasets opened for its first task on this worker, in a task of its own while the
//! worker serves its other jobs: its spec asked of the coordinator, its paths held under the
//! data roots, the failures another try may pass (the task handed back) and those it will not
//! (the client told), and the pause between tries.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stoker_datasets::SampleSource;
use stoker_pipeline::{open_sources, Job};
use stoker_proto::v1::coordinator_client::CoordinatorClient;
use stoker_proto::v1::{GetJobRequest, GetJobResponse, JobSpec, TaskLease};
use stoker_rpc::error_kinds;
use stoker_rpc::transport::RpcChannel;
use tonic::Status;

use super::{check_root, error_status, lock, JobEntry, Shared};

/// Tries at opening a job whose datasets failed to open in a way that may pass (a disk or
/// store failing, the machine short of descriptors), or at building its batches once a build
/// failed for such a cause of this worker's own ([`this_workers_own`]), spaced: the next try
/// after 250 ms, each one after twice the pause before, up to 5 s (a build that succeeds
/// ends the spacing, as an opening does). Until then a task of that job is handed back
/// at once, untried (another worker may open it), and a lease that brought nothing else
/// pauses this worker's leasing until the next try is due (at most a second at a time): else
/// the task is leased, failed and requeued by this worker as fast as the coordinator
/// answers, for as long as the failure lasts.
#[derive(Default)]
pub(super) struct OpenBackoff {
    /// Per job: when it may be tried again, the pause that led there, why it failed.
    jobs: HashMap<u64, (Instant, Duration, String)>,
}

impl OpenBackoff {
    pub(super) const FIRST: Duration = Duration::from_millis(250);
    pub(super) const MOST: Duration = Duration::from_secs(5);

    /// How long until `job` may be tried again, with why it failed; `None`: now.
    pub(super) fn wait(&self, job: u64, now: Instant) -> Option<(Duration, String)> {
        let (next, _, reason) = self.jobs.get(&job)?;
        let wait = next.saturating_duration_since(now);
        (!wait.is_zero()).then(|| (wait, reason.clone()))
    }

    /// Opening `job` failed at `now` for `reason`: the pause until the next try.
    pub(super) fn failed(&mut self, job: u64, now: Instant, reason: &str) -> Duration {
        let pause = self
            .jobs
            .get(&job)
            .map_or(Self::FIRST, |(_, pause, _)| (*pause * 2).min(Self::MOST));
        self.jobs
            .insert(job, (now + pause, pause, reason.to_string()));
        pause
    }

    /// `job` opened: no pause next time it fails.
    pub(super) fn opened(&mut self, job: u64) {
        self.jobs.remove(&job);
    }
}

/// Why a job could not be opened: the coordinator did not give its spec; its datasets could
/// not be opened in a way that may pass (a store or file system failing, the machine short of
/// descriptors: the task is handed back); or in a way that will not (a path that is not there
/// or outside --data-root, data that is not a dataset, a changed dataset: the client is told).
pub(super) enum Unopened {
    Coordinator(Status),
    Dataset(Status),
    Refused(Status),
}

impl Unopened {
    pub(super) fn status(&self) -> &Status {
        match self {
            Self::Coordinator(status) | Self::Dataset(status) | Self::Refused(status) => status,
        }
    }
}

/// Whether opening a job's datasets failed in a way another try may not repeat.
pub(super) fn may_pass(error: &stoker_pipeline::Error) -> bool {
    use stoker_datasets::ReadFault;
    match error {
        stoker_pipeline::Error::OpenDataset(error) | stoker_pipeline::Error::Dataset(error) => {
            match error {
                stoker_datasets::Error::Io { source, .. }
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    false
                }
                error => error.read_fault() != ReadFault::Sample,
            }
        }
        stoker_pipeline::Error::Io { .. } => true,
        _ => false,
    }
}

/// A job as [`Shared::record_dataset`] records it: its coordinator's place, its id, a hash of
/// its spec.
pub(super) type OpenedJob = (usize, u64, u64);

impl Shared {
    /// Refuses job `job_id`'s datasets (of the coordinator at `place`) as opened now to serve
    /// it when they differ from its first open here (its epochs would mix two orders, its
    /// clients' fingerprint name another dataset); `None` when none was recorded yet, else the
    /// key to record the view under ([`Shared::record_dataset`]). A file rewritten in place is
    /// not seen.
    fn check_dataset(
        &self,
        (place, job_id): (usize, u64),
        spec: &JobSpec,
        sources: &[&dyn SampleSource],
        fingerprint: &str,
    ) -> std::result::Result<Option<(OpenedJob, Vec<u64>)>, Status> {
        use std::hash::{Hash, Hasher};
        let lengths: Vec<u64> = sources.iter().map(|source| source.len()).collect();
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        prost::Message::encode_to_vec(spec).hash(&mut hasher);
        let key = (place, job_id, hasher.finish());
        let opened = lock(&self.opened_datasets);
        let changed = match opened.get(&key) {
            Some((first, _)) if *first != lengths => format!(
                "{first:?} samples per source then, {lengths:?} now (its epochs would mix two \
                 orders)"
            ),
            Some((_, first)) if first != fingerprint => format!(
                "as many samples, but other names, labels or classes (fingerprint {first} then, \
                 {fingerprint} now)"
            ),
            Some(_) => return Ok(None),
            None => return Ok(Some((key, lengths))),
        };
        Err(Status::failed_precondition(format!(
            "the dataset changed since this worker first opened the job: {changed}; restore it, \
             or read the changed dataset as another job (another path or seed)"
        )))
    }

    /// Records a job's datasets as first opened here ([`Shared::check_dataset`]'s key), once
    /// they matched the job's registration: a view the job was refused under is never the one
    /// recorded (it was, and a worker that first saw a copy still syncing refused the job for
    /// good once the copy was whole, as "changed since this worker first opened the job").
    fn record_dataset(&self, (key, lengths): (OpenedJob, Vec<u64>), fingerprint: &str) {
        lock(&self.opened_datasets)
            .entry(key)
            .or_insert_with(|| (lengths, fingerprint.to_string()));
    }
}

/// Whether building a batch failed through this worker's own storage or machine (its disk or
/// mount failing, the store refusing or not answering it, short of descriptors or memory past
/// the reads' own retries) rather than through the batch's samples or a dataset changed under
/// the job: another worker may build it, so the task goes back rather than the error to the
/// client (which would fail the step with it).
pub(super) fn this_workers_own(error: &stoker_pipeline::Error) -> bool {
    use stoker_datasets::ReadFault;
    match error {
        stoker_pipeline::Error::Dataset(error) => {
            error.read_fault() != ReadFault::Sample && !error.dataset_changed()
        }
        _ => false,
    }
}

/// The jobs one spell of leasing is opening, each in a task of its own, with the tasks waiting
/// for each: a job whose datasets take long to open (a large folder listed, a slow store, a
/// coordinator slow to answer) holds up no other job's tasks on this worker. A job holds as
/// many waiting tasks as the worker leases ahead, no more: the others go back untried, for
/// workers that have it open (held here, they would wait out the opening). An opened job
/// enters the worker's table only when the loop takes it ([`Openings::ended`]); dropped (the
/// coordinator lost, the drain), the openings are aborted and enter nothing, so a job id of a
/// coordinator's run before never names a job opened since.
pub(super) struct Openings {
    place: usize,
    /// The most tasks one job's opening holds.
    most_waiting: usize,
    jobs: HashMap<u64, Opening>,
}

/// What becomes of a task whose job may not be open.
pub(super) enum Opened {
    /// Its job is open: the task is built with it.
    Ready(Arc<JobEntry>, TaskLease),
    /// It waits for its job's opening.
    Waiting,
    /// Its job's opening holds as many tasks as it may: it goes back untried.
    Full(TaskLease),
}

struct Opening {
    task: tokio::task::JoinHandle<std::result::Result<JobEntry, Unopened>>,
    waiting: Vec<TaskLease>,
}

/// A job whose opening ended: its id, the job or why it did not open, the tasks that waited.
pub(super) type Ended = (
    u64,
    std::result::Result<Arc<JobEntry>, Unopened>,
    Vec<TaskLease>,
);

impl Openings {
    /// The openings of the loop against the coordinator at `place` in the list, each holding
    /// `most_waiting` tasks at most (at least one).
    pub(super) fn new(place: usize, most_waiting: usize) -> Self {
        Self {
            place,
            most_waiting: most_waiting.max(1),
            jobs: HashMap::new(),
        }
    }

    /// `task` with its job, if this worker has it open; else `task` waits for the job's
    /// opening, started now unless it is under way (or goes back when that holds its most).
    pub(super) fn open_or_wait(
        &mut self,
        shared: &Arc<Shared>,
        client: &CoordinatorClient<RpcChannel>,
        task: TaskLease,
    ) -> Opened {
        let (place, job_id) = (self.place, task.job_id);
        if let Some(entry) = lock(&shared.jobs).get(&(place, job_id)) {
            *lock(&entry.used) = Instant::now();
            return Opened::Ready(entry.clone(), task);
        }
        let opening = self.jobs.entry(job_id).or_insert_with(|| Opening {
            task: tokio::spawn(open_job(shared.clone(), client.clone(), place, job_id)),
            waiting: Vec::new(),
        });
        if opening.waiting.len() >= self.most_waiting {
            return Opened::Full(task);
        }
        opening.waiting.push(task);
        Opened::Waiting
    }

    /// Whether a job is being opened.
    pub(super) fn under_way(&self) -> bool {
        !self.jobs.is_empty()
    }

    /// The openings that have ended, each with the tasks that waited for it; the jobs opened
    /// enter the worker's table.
    pub(super) async fn ended(&mut self, shared: &Shared) -> Vec<Ended> {
        let done: Vec<u64> = (self.jobs.iter())
            .filter(|(_, opening)| opening.task.is_finished())
            .map(|(&job, _)| job)
            .collect();
        let mut ended = Vec::with_capacity(done.len());
        for job in done {
            let Some(opening) = self.jobs.remove(&job) else {
                continue;
            };
            let opened = match opening.task.await {
                Ok(Ok(entry)) => {
                    let entry = Arc::new(entry);
                    lock(&shared.jobs).insert((self.place, job), entry.clone());
                    tracing::info!(job, "job opened");
                    Ok(entry)
                }
                Ok(Err(unopened)) => Err(unopened),
                Err(error) => Err(Unopened::Dataset(Status::internal(format!(
                    "opening job {job} ended: {error}"
                )))),
            };
            ended.push((job, opened, opening.waiting));
        }
        ended
    }

    /// Every task waiting, its job's opening aborted.
    pub(super) fn take_waiting(&mut self) -> Vec<TaskLease> {
        let jobs = std::mem::take(&mut self.jobs);
        jobs.into_values()
            .flat_map(|opening| {
                opening.task.abort();
                opening.waiting
            })
            .collect()
    }
}

impl Drop for Openings {
    fn drop(&mut self) {
        for opening in self.jobs.values() {
            opening.task.abort();
        }
    }
}

/// Job `job_id` of the coordinator at `place`: its spec asked of the coordinator, its
/// datasets opened and checked against the registration.
async fn open_job(
    shared: Arc<Shared>,
    mut client: CoordinatorClient<RpcChannel>,
    place: usize,
    job_id: u64,
) -> std::result::Result<JobEntry, Unopened> {
    let registered = client
        .get_job(GetJobRequest { job_id })
        .await
        .map_err(Unopened::Coordinator)?
        .into_inner();
    let spec = registered.spec.clone().ok_or_else(|| {
        Unopened::Coordinator(Status::internal(format!(
            "coordinator sent job {job_id} without a spec"
        )))
    })?;
    let opened = {
        let spec = spec.clone();
        tokio::task::spawn_blocking(move || {
            check_root(&shared.roots, &spec).map_err(|status| {
                // A file system failing as the paths were resolved may pass.
                if error_kinds::is_transient(&status) {
                    Unopened::Dataset(status)
                } else {
                    Unopened::Refused(status)
                }
            })?;
            let sources = open_sources(&spec).map_err(|error| {
                let status = error_status(&error);
                if may_pass(&error) {
                    Unopened::Dataset(status)
                } else {
                    Unopened::Refused(status)
                }
            })?;
            let views: Vec<&dyn SampleSource> = sources.iter().map(|s| s.as_ref()).collect();
            let fingerprint = stoker_pipeline::dataset_fingerprint(&views);
            let first = shared
                .check_dataset((place, job_id), &spec, &views, &fingerprint)
                .map_err(Unopened::Refused)?;
            check_registered(&registered, &spec, &sources, &fingerprint)
                .map_err(Unopened::Refused)?;
            if let Some(first) = first {
                shared.record_dataset(first, &fingerprint);
            }
            Ok(sources)
        })
        .await
        .map_err(|e| {
            Unopened::Dataset(Status::internal(format!(
                "opening job {job_id} panicked: {e}"
            )))
        })??
    };
    Ok(JobEntry {
        spec,
        used: Mutex::new(Instant::now()),
        sources: opened,
        ranks: Mutex::new(HashMap::new()),
        plans: Mutex::new(HashMap::new()),
    })
}

/// Refuses to serve a job whose datasets this worker sees otherwise than the worker that
/// described it when it was registered (other files on this node, or the data changed since):
/// its batches would come from another sample order, or from other samples, silently. Steps
/// per epoch are compared always (they are journaled); the sample count, fingerprint and
/// tokenizer files' digests where the coordinator has them ([`GetJobResponse`]).
fn check_registered(
    registered: &GetJobResponse,
    spec: &JobSpec,
    sources: &[Arc<dyn SampleSource>],
    fingerprint: &str,
) -> std::result::Result<(), Status> {
    let job = Job::with_sources(spec.clone(), sources.to_vec()).map_err(|e| error_status(&e))?;
    let steps = job
        .plan(job.first_epoch())
        .map_err(|e| error_status(&e))?
        .steps();
    let samples = job.plan_config().num_samples;
    let differs = if steps != registered.steps_per_epoch {
        format!(
            "{steps} steps per epoch here, {} as registered",
            registered.steps_per_epoch
        )
    } else if registered.num_samples != 0 && samples != registered.num_samples {
        format!(
            "{samples} samples here, {} as registered",
            registered.num_samples
        )
    } else if !registered.dataset_fingerprint.is_empty()
        && fingerprint != registered.dataset_fingerprint
        // Fingerprints of one version only (`v3:...`): a worker of another release, rolled
        // out meanwhile, computes them otherwise.
        && fingerprint.split(':').next() == registered.dataset_fingerprint.split(':').next()
    {
        format!(
            "as many samples, but other names, labels or classes (fingerprint {fingerprint} here, \
             {} as registered)",
            registered.dataset_fingerprint
        )
    } else if !registered.tokenizer_digests.is_empty()
        && job.tokenizer_digests() != registered.tokenizer_digests
    {
        let here = job.tokenizer_digests();
        return Err(Status::failed_precondition(format!(
            "this worker's tokenizer file is not the one the job was registered with (SHA-256 \
             {here} here, {} as registered): its ids would differ from the other workers'; \
             give every worker the same tokenizer.json",
            registered.tokenizer_digests
        )));
    } else {
        return Ok(());
    };
    Err(Status::failed_precondition(format!(
        "this worker's dataset is not the one the job was registered with: {differs}; give \
         every worker the same files, or read the changed dataset as another job (another \
         path or seed)"
    )))
}
