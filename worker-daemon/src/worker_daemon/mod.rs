//! The worker daemon (`stoker-worker`): registers with the coordinator, pulls tasks (one task is
//! one batch), builds each batch with the same job code as the embedded mode, and streams it to
//! the client that owns the session, on the stream that client opened (`WorkerData.Subscribe`).
//!
//! - It reads datasets and tokenizers only under its `--data-root` folders (paths are resolved
//!   first, so `..` and symlinks count where they lead); a job naming anything else is refused
//!   with `PERMISSION_DENIED` saying so (`data_roots`).
//! - It produces only what it was leased, and the coordinator leases a session only against the
//!   credits its client granted: memory stays bounded at both ends.
//! - A batch that fails on a bad sample under the fail policy fails for the client (that step
//!   alone: its error carries the step, and the client reads on past it); one that
//!   fails on the worker's own storage or machine (its disk or mount, the store refusing or not
//!   answering it, short of descriptors past the reads' retries) goes back for another worker,
//!   and the job's next tasks on this one go back untried for a pause (250 ms, doubling up to
//!   5 s) until a try builds a batch again. A step that failed so three times on this worker
//!   fails for the client (a failure every worker meets is told after a few tries, not at the
//!   client's deadline).
//! - When the coordinator goes away it re-registers with backoff (a restarted coordinator gets a
//!   new incarnation; streams of the old one end and clients open new ones).
//! - Given a fleet's list of coordinators (jobs sharded over them, `stoker_rpc::shards`), it
//!   runs this loop against each, over one decode pool, and keys the jobs it opened by the
//!   coordinator's place in the list.
//! - A batch is built once room for it is reserved in its client's stream. A task that finds
//!   none within [`WorkerConfig::delivery_timeout`] (no stream from the client, or a stream
//!   that sends nothing: a client that stopped reading; one that reads a large batch slowly
//!   sends a frame at a time) is reported unclaimed and goes back to the queue (without the
//!   session's credit); a stream that holds a batch and sent nothing for that long is ended,
//!   whether or not a task waits on it
//!   (`client_stream`), so it holds at most its queue of batches meanwhile. Such a stream ends with `UNAVAILABLE` after what it queued,
//!   and its client opens its session again (the batches it did not take were requeued with
//!   their credits spent); the drain's streams end cleanly.
//! - Told to stop (the `shutdown` future of [`run_worker`]: SIGTERM or Ctrl-C for the binary), it
//!   drains: `/readyz` turns to `draining`, it takes no more leases, finishes and delivers the
//!   ones it holds, reports them, tells the coordinator it leaves (the coordinator requeues at
//!   once whatever it still held), ends its client streams once they are sent, and returns,
//!   all within [`WorkerConfig::drain_timeout`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use stoker_datasets::SampleSource;
use stoker_proto::v1::worker_data_server;
use stoker_proto::v1::{
    DescribeJobRequest, DescribeJobResponse, JobSpec, SubscribeRequest, TaskLease,
};
use tokio::sync::{mpsc, watch, Notify};
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

use stoker_pipeline::{Batch, EpochPlan, Error, Job, Result};
use stoker_rpc::batch_wire::WorkerDataService;
use stoker_rpc::error_kinds;
use stoker_rpc::health::Health;
use stoker_rpc::network::Network;
use stoker_rpc::security::{ClientSecurity, ServerSecurity};
use stoker_rpc::transport::{self, MAX_MESSAGE_BYTES};

mod data_roots;
mod delivery;
mod fleet;
mod leases;
mod opening;
mod own_failures;
mod reports;
mod subscriptions;

pub use data_roots::canonical_roots;
use data_roots::check_root;
use subscriptions::{key_of, Found, Key, Subscription, Subscriptions};

use crate::client_stream::{self, ClientStream};

/// The default [`WorkerConfig::delivery_timeout`].
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// The default [`WorkerConfig::drain_timeout`] (a Kubernetes pod's grace period is 30 s by
/// default).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);

/// The default [`WorkerConfig::job_idle`].
pub const JOB_IDLE: Duration = Duration::from_secs(600);

/// Of the drain's time, what is kept for reporting and leaving after the deliveries.
const LEAVE_RESERVE: Duration = Duration::from_secs(3);

/// Batches queued per client stream (credits bound it too).
const STREAM_QUEUE: usize = 8;

/// How the worker runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The coordinator's `host:port`, or the comma-separated list of a fleet's coordinators
    /// (jobs sharded over them, `stoker_rpc::shards`): the worker registers with each and
    /// serves them all.
    pub coordinator: String,
    /// The address clients reach this worker's data server at, `host:port` (registered with
    /// the coordinator; the host may be a DNS name, which a TLS certificate can carry).
    pub advertise: String,
    /// Decode threads (0: one per core).
    pub threads: usize,
    /// Folders datasets may be read from.
    pub data_roots: Vec<PathBuf>,
    /// Tasks leased ahead of the one being built; twice this many batches may be built at once,
    /// over all the coordinators (a task waiting for room in its client's stream is not one).
    pub lease_ahead: u32,
    /// Least time between two reports of the leases' outcomes: what finishes meanwhile goes in
    /// one report, or with the next lease call when that comes first.
    pub report_interval: Duration,
    /// What the data server accepts (token, TLS).
    pub server_security: ServerSecurity,
    /// What the worker presents to the coordinator (token, trusted CA).
    pub client_security: ClientSecurity,
    /// Where the coordinator's address leads (sockets; an in-memory network in tests).
    pub network: Network,
    /// How long a task waits for its client's stream to open, or for room in it while the
    /// stream sends nothing (its batch is built once there is room), before it is reported
    /// unclaimed (and a stream that sent nothing is ended).
    pub delivery_timeout: Duration,
    /// Once told to stop, how long the worker may take to finish the leases it holds, leave
    /// the coordinator and send what its clients' streams hold; it stops then in any case.
    pub drain_timeout: Duration,
    /// What the probes report: ready while registered with the coordinator and not draining.
    pub health: Arc<Health>,
    /// A job no task of this worker has used for this long is let go: its datasets closed
    /// (maps, file indexes in memory), its plans dropped. A later task of it opens it again,
    /// refused when its datasets' sample counts changed meanwhile. Zero: never. Without it a
    /// worker that serves job after job would hold every job it ever opened.
    pub job_idle: Duration,
}

struct JobEntry {
    spec: JobSpec,
    /// When a task last asked for the job.
    used: Mutex<Instant>,
    /// The job's datasets, opened once for all its ranks (one per source of a mix).
    sources: Vec<Arc<dyn SampleSource>>,
    ranks: Mutex<HashMap<u32, Arc<Job>>>,
    plans: Mutex<HashMap<(u32, u64), Arc<EpochPlan>>>,
}

struct Shared {
    roots: Vec<PathBuf>,
    /// This daemon's random instance, told at every registration (0 is never used).
    instance: u64,
    subscriptions: Mutex<Subscriptions>,
    subscribed: Notify,
    /// By (the coordinator's place in the address list, job id): two coordinators' job ids
    /// may coincide.
    jobs: Mutex<HashMap<(usize, u64), Arc<JobEntry>>>,
    pool: rayon::ThreadPool,
    threads: usize,
    delivery_timeout: Duration,
    bad_samples: AtomicU64,
    /// Builds in progress, and since when at least one has been.
    building: Mutex<(usize, Option<Instant>)>,
    /// Nanoseconds with at least one build in progress, not yet reported.
    busy_ns: AtomicU64,
    /// The drain is over: new client streams are refused.
    closing: AtomicBool,
    /// See [`WorkerConfig::job_idle`].
    job_idle: Duration,
    /// The sample count per source and fingerprint of each job's datasets as first opened here
    /// to serve it: kept when the job is let go and across a restart of its coordinator (which
    /// keeps its id); a registration of the spec anew is another job.
    opened_datasets: Mutex<HashMap<opening::OpenedJob, (Vec<u64>, String)>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// Takes out the jobs no task has used for [`WorkerConfig::job_idle`] and no build holds,
    /// to be dropped by the caller away from the runtime's threads (a large index takes a
    /// while to free).
    fn take_idle_jobs(&self) -> Vec<Arc<JobEntry>> {
        let now = Instant::now();
        self.take_jobs(|&(_, job), entry| {
            let unused = now.saturating_duration_since(*lock(&entry.used));
            let idle = unused >= self.job_idle && Arc::strong_count(entry) == 1;
            if idle {
                tracing::info!(job, unused = ?unused, "job let go: no task used it for a while");
            }
            idle
        })
    }

    /// Lets go of every job of the coordinator at `place` in the list (a new run of it: its
    /// job ids may mean other jobs now).
    fn forget_jobs(&self, place: usize) -> Vec<Arc<JobEntry>> {
        self.take_jobs(|&(of, _), _| of == place)
    }

    /// Takes out the jobs `gone` picks, to be dropped by the caller.
    fn take_jobs(
        &self,
        mut gone: impl FnMut(&(usize, u64), &Arc<JobEntry>) -> bool,
    ) -> Vec<Arc<JobEntry>> {
        let mut taken = Vec::new();
        lock(&self.jobs).retain(|key, entry| {
            let take = gone(key, entry);
            if take {
                taken.push(Arc::clone(entry));
            }
            !take
        });
        taken
    }

    fn open_job(&self, spec: &JobSpec) -> std::result::Result<Job, Status> {
        check_root(&self.roots, spec)?;
        Job::open(spec.clone()).map_err(|e| error_status(&e))
    }

    fn job_for(&self, entry: &JobEntry, rank: u32) -> Result<Arc<Job>> {
        if let Some(job) = lock(&entry.ranks).get(&rank) {
            return Ok(job.clone());
        }
        let mut spec = entry.spec.clone();
        spec.rank = rank;
        let job = Arc::new(Job::with_sources(spec, entry.sources.clone())?);
        lock(&entry.ranks).insert(rank, job.clone());
        Ok(job)
    }

    /// Builds the leased batch on the decode pool, counting the time as busy (until it ends,
    /// also by a panic).
    fn build(&self, entry: &JobEntry, task: &TaskLease) -> Result<Batch> {
        struct Busy<'a>(&'a Shared);
        impl Drop for Busy<'_> {
            fn drop(&mut self) {
                self.0.busy(false);
            }
        }
        self.busy(true);
        let _busy = Busy(self);
        self.build_batch(entry, task)
    }

    /// One build starts (`true`) or ends: the time with any build in progress is busy time.
    fn busy(&self, starts: bool) {
        let mut building = lock(&self.building);
        let (count, since) = &mut *building;
        if starts {
            *count += 1;
            since.get_or_insert_with(Instant::now);
        } else {
            *count = count.saturating_sub(1);
            if *count == 0 {
                if let Some(since) = since.take() {
                    let nanos = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    self.busy_ns.fetch_add(nanos, Ordering::Relaxed);
                }
            }
        }
    }

    fn build_batch(&self, entry: &JobEntry, task: &TaskLease) -> Result<Batch> {
        let job = self.job_for(entry, task.rank)?;
        let key = (task.rank, task.epoch);
        let cached = lock(&entry.plans).get(&key).cloned();
        let plan = match cached {
            Some(plan) => plan,
            None => {
                let plan = Arc::new(job.plan(task.epoch)?);
                let mut plans = lock(&entry.plans);
                if plans.len() > 64 {
                    plans.clear();
                }
                plans.insert(key, plan.clone());
                plan
            }
        };
        let batch = self.pool.install(|| job.batch(&plan, task.step))?;
        self.bad_samples
            .fetch_add(batch.bad_samples.len() as u64, Ordering::Relaxed);
        Ok(batch)
    }

    /// Forgets the stream of `key`, which stalled, if it is still `sender`'s (the client may
    /// have opened a new one meanwhile): once the clones in flight are gone, the stream ends,
    /// saying it stalled, and the session's deliveries of this opening come back unclaimed at
    /// once. Whether it did.
    fn end_subscription(&self, key: Key, sender: &mpsc::Sender<client_stream::Item>) -> bool {
        lock(&self.subscriptions).end_stalled(key, sender)
    }

    /// What the stream of `key` is now.
    fn find_subscription(&self, key: &Key) -> Found {
        lock(&self.subscriptions).find(key)
    }

    /// Waits until the client of `key` has opened its stream, up to `wait` (`NotYet` past it);
    /// `Gone` at once when the stream it opened has closed.
    async fn subscription(&self, key: Key, wait: Duration) -> Found {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.subscribed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match lock(&self.subscriptions).find(&key) {
                // Gone: its process died, or it lost the stream and opens its session again,
                // which grants the step again (this lease is then stale): nothing to wait for.
                Found::NotYet => {}
                found => return found,
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Found::NotYet;
            }
        }
    }
}

/// The data server clients stream batches from.
#[derive(Clone)]
struct DataService {
    shared: Arc<Shared>,
}

#[tonic::async_trait]
impl worker_data_server::WorkerData for DataService {
    async fn describe_job(
        &self,
        request: Request<DescribeJobRequest>,
    ) -> std::result::Result<Response<DescribeJobResponse>, Status> {
        let spec = request
            .into_inner()
            .spec
            .ok_or_else(|| Status::invalid_argument("job spec is missing"))?;
        let shared = self.shared.clone();
        let answer = tokio::task::spawn_blocking(move || {
            let job = shared.open_job(&spec)?;
            // What the coordinator hands the job's clients is what this worker will serve.
            let dataset_fingerprint = job.dataset_fingerprint();
            let plan = job.plan(job.first_epoch()).map_err(|e| error_status(&e))?;
            let batch_size = job.plan_config().batch_size as usize;
            Ok::<_, Status>(DescribeJobResponse {
                num_samples: job.plan_config().num_samples,
                steps_per_epoch: plan.steps(),
                batch_bytes: job.batch_bytes(batch_size) as u64,
                class_names: job.class_names().to_vec(),
                dataset_fingerprint,
                tokenizer_digests: job.tokenizer_digests(),
            })
        })
        .await
        .map_err(|e| Status::internal(format!("job check panicked: {e}")))??;
        Ok(Response::new(answer))
    }

    type SubscribeStream = ClientStream;

    async fn subscribe(
        &self,
        request: Request<SubscribeRequest>,
    ) -> std::result::Result<Response<Self::SubscribeStream>, Status> {
        let request = request.into_inner();
        let token = request
            .session
            .ok_or_else(|| Status::invalid_argument("session token is missing"))?;
        let (sender, stream, watch, stalled) = client_stream::client_stream(STREAM_QUEUE);
        let progress = stream.progress();
        let key = key_of(&token);
        {
            let mut subscriptions = lock(&self.shared.subscriptions);
            // Checked under the lock the drain clears the streams under: none slips past it.
            if self.shared.closing.load(Ordering::Acquire) {
                return Err(Status::unavailable("this worker is stopping"));
            }
            let subscription = Subscription {
                sender,
                progress: progress.clone(),
                stalled,
            };
            subscriptions.opened(key, subscription);
        }
        self.shared.subscribed.notify_waiters();
        tracing::debug!(
            session = token.session_id,
            job = request.job_id,
            "client stream opened"
        );
        // Ends the stream once its client stops taking batches, even when no delivery waits
        // on it (see `client_stream`).
        let shared = self.shared.clone();
        tokio::spawn(async move {
            let wait = shared.delivery_timeout;
            if let Some(sender) = watch.stalled(wait).await {
                if shared.end_subscription(key, &sender) {
                    tracing::warn!(
                        session = key.1,
                        waited = ?wait,
                        "client stream sent nothing within the delivery timeout; ending it"
                    );
                }
            }
        });
        // The body counts the frames it sends there: a large batch read slowly is progress.
        let mut response = Response::new(stream);
        response.extensions_mut().insert(progress.frames_sent());
        Ok(response)
    }
}

/// What the reporter sends the coordinator.
enum Outcome {
    Completed(u64),
    Failed(u64, String),
    /// The session's client had no stream here to take it (see `FailedTask.unclaimed`).
    Unclaimed(u64, String),
}

/// Runs a worker until `shutdown` resolves: the data server on `listener` and the task loop
/// against the coordinator.
pub async fn run_worker(
    config: WorkerConfig,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let incoming = config.server_security.incoming(listener);
    run_worker_incoming(config, incoming, shutdown).await
}

/// Runs a worker until `shutdown` resolves: the data server on the connections of `incoming`
/// (a socket's, or an in-memory network's) and the task loop against the coordinator.
pub async fn run_worker_incoming<IO, E>(
    config: WorkerConfig,
    incoming: impl tokio_stream::Stream<Item = std::result::Result<IO, E>> + Send + 'static,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()>
where
    IO: stoker_rpc::network::Connection,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    // A coordinator address that cannot be used fails the start, rather than leave a worker
    // running that never registers (the channel connects lazily: nothing is dialled here).
    let coordinators = stoker_rpc::shards::addresses(&config.coordinator)
        .map_err(|e| Error::Stopped(format!("cannot use --coordinator: {e}")))?;
    for address in &coordinators {
        config
            .network
            .channel(address, &config.client_security)
            .map_err(|e| Error::Stopped(format!("cannot use --coordinator: {e}")))?;
    }
    let threads = if config.threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        config.threads
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("stoker-worker-decode-{i}"))
        .build()
        .map_err(|e| Error::Threads(e.to_string()))?;
    let shared = Arc::new(Shared {
        instance: stoker_rpc::transport::random_u64().max(1),
        roots: canonical_roots(&config.data_roots)?,
        subscriptions: Mutex::new(Subscriptions::default()),
        subscribed: Notify::new(),
        jobs: Mutex::new(HashMap::new()),
        pool,
        threads,
        delivery_timeout: config.delivery_timeout,
        bad_samples: AtomicU64::new(0),
        building: Mutex::new((0, None)),
        busy_ns: AtomicU64::new(0),
        closing: AtomicBool::new(false),
        job_idle: config.job_idle,
        opened_datasets: Mutex::new(HashMap::new()),
    });
    if !config.job_idle.is_zero() {
        tokio::spawn(let_go_of_idle_jobs(Arc::downgrade(&shared)));
    }
    let service = WorkerDataService::new(
        DataService {
            shared: shared.clone(),
        },
        MAX_MESSAGE_BYTES,
    );
    let service = InterceptedService::new(service, config.server_security.check());
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let mut server = tokio::spawn(async move {
        transport::server()
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = server_stopped.await;
            })
            .await
    });
    let (drain, draining) = watch::channel(None);
    let health = config.health.clone();
    let drain_timeout = config.drain_timeout;
    let mut tasks = tokio::spawn(fleet::task_loops(
        config,
        coordinators,
        shared.clone(),
        draining,
    ));
    tokio::select! {
        () = shutdown => {}
        ended = &mut server => {
            // The server stopped without being asked: nothing to drain into.
            tasks.abort();
            return server_result(ended);
        }
        ended = &mut tasks => {
            // The task loops ended undrained (a panic): a worker taking no tasks, its
            // heartbeat still renewing what it held, would hold its clients up; it stops.
            let why = ended.map_err(|e| e.to_string()).and_then(|ended| ended).err();
            let why = why.unwrap_or_else(|| "every task loop ended undrained".into());
            tracing::error!(%why, "the worker stops");
            server.abort();
            return Err(Error::Stopped(why));
        }
    }
    // Drain: no new leases, the held ones finished and reported, then leave.
    tracing::info!(within = ?drain_timeout, "stopping: draining the leases held");
    let deadline = tokio::time::Instant::now() + drain_timeout;
    // The signal first: a task loop that registers meanwhile sees it after its set_ready.
    let _ = drain.send(Some(deadline));
    health.set_not_ready("draining");
    if tokio::time::timeout_at(deadline, &mut tasks).await.is_err() {
        tracing::warn!(waited = ?drain_timeout, "the drain did not finish in time; stopping anyway");
        tasks.abort();
    }
    // Every stream ends once its queue is sent; the server waits for them, up to the deadline.
    {
        let mut subscriptions = lock(&shared.subscriptions);
        shared.closing.store(true, Ordering::Release);
        subscriptions.open.clear();
    }
    let _ = stop_server.send(());
    match tokio::time::timeout_at(deadline, &mut server).await {
        Ok(ended) => server_result(ended),
        Err(_) => {
            tracing::warn!("client streams still open at the drain deadline; closing them");
            server.abort();
            Ok(())
        }
    }
}

/// Every quarter of the idle time, lets go of the jobs idle that long, until the worker is gone.
async fn let_go_of_idle_jobs(shared: std::sync::Weak<Shared>) {
    let Some(every) = shared
        .upgrade()
        .map(|s| (s.job_idle / 4).max(Duration::from_millis(10)))
    else {
        return;
    };
    loop {
        tokio::time::sleep(every).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let idle = shared.take_idle_jobs();
        drop(shared);
        if !idle.is_empty() {
            let _ = tokio::task::spawn_blocking(move || drop(idle)).await;
        }
    }
}

fn server_result(
    ended: std::result::Result<
        std::result::Result<(), tonic::transport::Error>,
        tokio::task::JoinError,
    >,
) -> Result<()> {
    ended
        .map_err(|e| Error::Stopped(format!("worker server task: {e}")))?
        .map_err(|e| Error::Stopped(format!("worker server: {e}")))
}

/// The status a worker error (opening a job, building a batch) travels as: its kind and message.
pub(super) fn error_status(error: &Error) -> Status {
    error_kinds::status(error.kind(), error.to_string())
}
