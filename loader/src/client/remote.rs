//! The remote batch source (distributed mode): registers the job with the coordinator, opens
//! the session of its (job, rank, epoch), opens a stream to every worker, grants one credit for
//! every step the loader asks for, acknowledges what arrives, drops duplicates by step number,
//! and lands each batch in a slot the loader gave: the worker stream's reader copies each tensor
//! byte once, from the HTTP/2 receive buffer into the slot, as it comes off the socket
//! (`stoker_rpc::batch_wire`), off the consumer's thread.
//!
//! A driver task (on the source's own small tokio runtime) owns each epoch's session; the
//! consumer's thread only waits on a channel. The driver recovers on its own:
//! - a worker stream that breaks after it was open may have swallowed batches the worker already
//!   reported delivered, so the session is reopened: every unacknowledged step is leased again
//!   and identical bytes arrive (determinism contract); copies of steps already received are
//!   dropped. A stream the worker ends cleanly (a worker draining on SIGTERM, or one that
//!   stopped waiting on this client) delivered all it held before its end: the session goes on,
//!   and the worker gets a new stream if the coordinator still lists it;
//! - a coordinator that goes away is reconnected with backoff; the restarted coordinator has its
//!   journal, a new incarnation, and the client opens its session again from the first step it
//!   still needs;
//! - a worker that joins shows up in the coordinator's answers and gets a stream; one whose
//!   stream cannot open yet (its address does not resolve or accept) is tried again every
//!   500 ms while the coordinator lists it;
//! - no batch for [`RemoteOptions::stall_reopen`] while the consumer waits: the session is
//!   reopened as well (and logged), so a lost batch costs a delay, never a hang;
//! - a coordinator at its session cap (`RESOURCE_EXHAUSTED`) is asked again with backoff, as
//!   its silent sessions time out;
//! - no worker stream open for [`RemoteOptions::worker_grace`] while batches are wanted: the
//!   consumer gets [`Error::WorkerUnavailable`] naming the job and how long it went unserved.
//!
//! Dropping an epoch's feed (the loader closed, or the epoch left before its end) stops its
//! driver, which acknowledges what arrived and closes the session, so the coordinator stops
//! leasing steps nobody will take at once rather than after its session timeout.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use stoker_proto::v1::coordinator_client::CoordinatorClient;
use stoker_proto::v1::{
    ClientStats, CloseSessionRequest, JobSpec, OpenSessionRequest, RegisterJobRequest,
    SessionToken, SessionUpdateRequest, StageTimings, SubscribeRequest, WorkerInfo,
};
use stoker_rpc::batch_wire;
use stoker_rpc::network::Network;
use stoker_rpc::security::{ClientSecurity, Token};
use stoker_rpc::transport::{self, Backoff, RpcChannel, MAX_MESSAGE_BYTES};
use tokio::sync::mpsc;
use tonic::{Code, Status};

use super::landing::{lock, next_landed, Landed, SlotQueue, SLOT_ALIGN};
use super::monitor::LoaderMonitor;
use super::slots::Slot;
use super::source::{receive, BatchSource, Built, EpochFeed, IdleClock, SourceInfo};
use crate::error::{error_from_status, Error, Result};

/// How the remote source runs.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// How long connecting and registering the job may take in all.
    pub connect_timeout: Duration,
    /// No batch for this long while the consumer waits: reopen the session.
    pub stall_reopen: Duration,
    /// No worker stream open for this long while batches are wanted: fail with
    /// [`Error::WorkerUnavailable`]. Separate from the `next()` deadline, so that workers
    /// leaving during a scale-down or a rolling update do not trip it.
    pub worker_grace: Duration,
    /// The job's weight against other jobs waiting on the same coordinator (sent when the job
    /// registers; capped by the coordinator's `--max-job-weight`); 0 leaves it as the
    /// coordinator has it (1 for a new job).
    pub job_weight: u32,
    /// The token every call presents (none: the one in `STOKER_TOKEN`, if that is set).
    pub token: Option<Token>,
    /// A PEM file of CA certificates: connect to the coordinator and the workers over TLS and
    /// trust the certificates it signed (none: plaintext).
    pub tls_ca: Option<PathBuf>,
    /// The name the daemons' certificates must carry, when it is not the host of their address.
    pub tls_server_name: Option<String>,
    /// Where the coordinator's and the workers' addresses lead (sockets; an in-memory network
    /// in tests).
    pub network: Network,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(60),
            stall_reopen: Duration::from_secs(10),
            worker_grace: Duration::from_secs(120),
            job_weight: 0,
            token: None,
            tls_ca: None,
            tls_server_name: None,
            network: Network::Sockets,
        }
    }
}

impl RemoteOptions {
    /// The security the client's calls use: the token (or `STOKER_TOKEN`'s) and the CA.
    fn security(&self) -> Result<ClientSecurity> {
        let token = Token::or_from_env(self.token.clone())?;
        Ok(ClientSecurity::new(
            token,
            self.tls_ca.as_deref(),
            self.tls_server_name.as_deref(),
        )?)
    }
}

/// Credits a remote loader starts with when the prefetch controller sizes the depth.
const INITIAL_CREDITS: usize = 8;

/// How long dropping an epoch's feed waits for its driver to close the session.
const CLOSE_WAIT: Duration = Duration::from_millis(500);

/// How long after a worker's stream failed to open the driver tries it again.
const STREAM_RETRY: Duration = Duration::from_millis(500);

/// A job served by a coordinator and its workers.
pub struct RemoteSource {
    runtime: Arc<tokio::runtime::Runtime>,
    address: String,
    channel: RpcChannel,
    security: ClientSecurity,
    spec: JobSpec,
    job_id: u64,
    info: SourceInfo,
    options: RemoteOptions,
}

/// What the coordinator said about a registered job.
struct Registered {
    job_id: u64,
    steps_per_epoch: u64,
    num_samples: u64,
    batch_bytes: u64,
    class_names: Vec<String>,
}

impl RemoteSource {
    /// Connects to the coordinator at `address` and registers the job (the coordinator has a
    /// worker open it, so a spec no worker can serve is refused here, with the worker's reason).
    pub fn connect(address: &str, spec: JobSpec, options: RemoteOptions) -> Result<RemoteSource> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("stoker-client-io")
            .enable_all()
            .build()
            .map_err(|e| Error::Threads(e.to_string()))?;
        let security = options.security()?;
        let channel = runtime.block_on(async { options.network.channel(address, &security) })?;
        let registered = runtime.block_on(register_job(
            channel.clone(),
            register_request(&spec, &options),
            options.connect_timeout,
            address,
        ))?;
        tracing::info!(
            coordinator = address,
            job = registered.job_id,
            steps_per_epoch = registered.steps_per_epoch,
            "job registered"
        );
        // Tensors are laid out again in the slot, each at an aligned offset.
        let tensors = 8;
        let info = SourceInfo {
            steps_per_epoch: registered.steps_per_epoch,
            num_samples: registered.num_samples,
            class_names: registered.class_names,
            batch_bytes: registered.batch_bytes as usize + tensors * SLOT_ALIGN,
            threads: 0,
            rank: spec.rank,
            initial_depth: INITIAL_CREDITS,
            waiting_on: format!("from the workers of coordinator {address}"),
            only_epoch: spec.resized_epoch.as_ref().map(|r| r.epoch),
            shared_slots: false,
        };
        Ok(RemoteSource {
            runtime: Arc::new(runtime),
            address: address.to_string(),
            channel,
            security,
            spec,
            job_id: registered.job_id,
            info,
            options,
        })
    }

    /// The job's id at the coordinator.
    pub fn job_id(&self) -> u64 {
        self.job_id
    }

    /// The coordinator's address.
    pub fn address(&self) -> &str {
        &self.address
    }
}

impl BatchSource for RemoteSource {
    fn info(&self) -> &SourceInfo {
        &self.info
    }

    fn open_epoch(
        &self,
        epoch: u64,
        start_step: u64,
        monitor: LoaderMonitor,
    ) -> Result<Box<dyn EpochFeed>> {
        // `Loader::epoch` has checked `start_step` against the epoch's length.
        let steps = self.info.steps_per_epoch;
        let (batches_tx, batches_rx) = crossbeam_channel::unbounded();
        let (requests_tx, requests_rx) = mpsc::unbounded_channel();
        let idle = IdleClock::default();
        let driver = Driver {
            channel: self.channel.clone(),
            security: self.security.clone(),
            network: self.options.network.clone(),
            address: self.address.clone(),
            spec: self.spec.clone(),
            job_weight: self.options.job_weight,
            job_id: self.job_id,
            rank: self.spec.rank,
            epoch,
            steps,
            stall_reopen: self.options.stall_reopen,
            worker_grace: self.options.worker_grace,
            batches: batches_tx,
            requests: requests_rx,
            free_slots: Arc::default(),
            requested: start_step,
            monitor,
            idle: idle.clone(),
            idle_since: Some(Instant::now()),
            unserved_since: None,
        };
        let task = self.runtime.spawn(driver.run(start_step));
        Ok(Box::new(RemoteFeed {
            runtime: Arc::clone(&self.runtime),
            task,
            receiver: batches_rx,
            requests: requests_tx,
            steps,
            idle,
        }))
    }
}

/// Registers (or finds) the job, retrying while the coordinator is unreachable.
/// What registering `spec` asks of the coordinator.
fn register_request(spec: &JobSpec, options: &RemoteOptions) -> RegisterJobRequest {
    RegisterJobRequest {
        spec: Some(spec.clone()),
        weight: options.job_weight,
    }
}

async fn register_job(
    channel: RpcChannel,
    request: RegisterJobRequest,
    timeout: Duration,
    address: &str,
) -> Result<Registered> {
    let started = Instant::now();
    let mut backoff = Backoff::new(Duration::from_secs(2));
    let mut client = CoordinatorClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES);
    loop {
        match client.register_job(request.clone()).await {
            Ok(response) => {
                let r = response.into_inner();
                return Ok(Registered {
                    job_id: r.job_id,
                    steps_per_epoch: r.steps_per_epoch,
                    num_samples: r.num_samples,
                    batch_bytes: r.batch_bytes,
                    class_names: r.class_names,
                });
            }
            Err(status) if transport::is_transient(&status) && started.elapsed() < timeout => {
                let delay = backoff.next_delay();
                tracing::warn!(coordinator = address, %status, retry_in = ?delay, "coordinator unreachable");
                tokio::time::sleep(delay).await;
            }
            Err(status) => {
                return Err(error_from_status(
                    &format!("coordinator {address} refused the job"),
                    &status,
                ))
            }
        }
    }
}

/// One epoch of a [`RemoteSource`]: what the driver task sends, and the slots sent to it.
struct RemoteFeed {
    runtime: Arc<tokio::runtime::Runtime>,
    task: tokio::task::JoinHandle<()>,
    receiver: Receiver<Result<Built>>,
    requests: mpsc::UnboundedSender<Slot>,
    steps: u64,
    idle: IdleClock,
}

impl EpochFeed for RemoteFeed {
    fn steps(&self) -> u64 {
        self.steps
    }

    fn request(&mut self, step: u64, slot: Slot) {
        // The workers build steps in the order the coordinator leases them, so a request is a
        // credit and a slot for whichever batch arrives next.
        if self.requests.send(slot).is_err() {
            tracing::debug!(step, "the session driver has stopped");
        }
    }

    fn recv(&mut self, timeout: Duration) -> Result<Option<Built>> {
        let stopped = "the distributed client's session driver stopped";
        receive(&self.receiver, timeout, stopped)?.transpose()
    }

    fn producer_idle(&self) -> Duration {
        self.idle.total()
    }
}

impl Drop for RemoteFeed {
    fn drop(&mut self) {
        // With its requests gone the driver acknowledges what arrived and closes its session,
        // so the coordinator stops leasing the steps nobody will take now, not after its
        // session timeout (meanwhile those sessions, the most starved, would hold the workers
        // for other clients). Waited for briefly; past that, the timeout is left to do it.
        drop(std::mem::replace(
            &mut self.requests,
            mpsc::unbounded_channel().0,
        ));
        if tokio::runtime::Handle::try_current().is_err() {
            let task = &mut self.task;
            let stopped = self
                .runtime
                .block_on(async { tokio::time::timeout(CLOSE_WAIT, task).await });
            if stopped.is_err() {
                tracing::debug!(
                    "the session driver did not stop in time; its session is left to time out"
                );
            }
        }
        self.task.abort();
    }
}

/// What a worker stream tells the driver.
enum Arrival {
    /// The stream is open.
    Opened { worker: u64 },
    Batch {
        incarnation: u64,
        batch: Box<Landed>,
        /// When the batch's bytes had arrived.
        received: Instant,
    },
    /// A batch the worker could not build (fail policy): the consumer gets the error.
    Failed(Status),
    /// The worker refused the stream (token or TLS): a setting to fix, not worth a retry.
    Refused { address: String, status: Status },
    /// The worker ended the stream cleanly, after everything it sent into it.
    Ended { worker: u64 },
    /// The stream broke or could not open; `opened` says whether it was ever up.
    Lost {
        worker: u64,
        opened: bool,
        status: Status,
    },
}

struct Driver {
    channel: RpcChannel,
    security: ClientSecurity,
    network: Network,
    address: String,
    spec: JobSpec,
    job_weight: u32,
    job_id: u64,
    rank: u32,
    epoch: u64,
    steps: u64,
    stall_reopen: Duration,
    worker_grace: Duration,
    batches: Sender<Result<Built>>,
    /// One slot per step the loader asks for.
    requests: mpsc::UnboundedReceiver<Slot>,
    /// Slots for batches not yet arrived, with when they were asked for; the worker streams
    /// take them as batches start to arrive.
    free_slots: Arc<SlotQueue>,
    /// Steps asked for so far (all below this).
    requested: u64,
    monitor: LoaderMonitor,
    /// Time with every asked-for step received (the workers had nothing to do for us).
    idle: IdleClock,
    idle_since: Option<Instant>,
    /// Since when no worker stream has been open while batches were wanted.
    unserved_since: Option<Instant>,
}

/// Why a session ended.
enum SessionEnd {
    /// Every step arrived.
    Done,
    /// Open the session again (worker lost, stall, coordinator restarted).
    Reopen,
    /// The consumer went away or an error was passed on.
    Stop,
}

/// The figures a client reports to its coordinator, from its loader's monitor.
fn client_stats(monitor: &LoaderMonitor) -> ClientStats {
    let snapshot = monitor.snapshot();
    let stats = &snapshot.stats;
    let ns = |s: f64| (s * 1e9) as u64;
    ClientStats {
        batches: stats.batches,
        samples: stats.samples,
        wait_ns: ns(stats.wait_s),
        epoch_start_wait_ns: ns(stats.epoch_start_wait_s),
        elapsed_ns: ns(stats.elapsed_s),
        gpu_idle_ns: ns(stats.gpu_idle_s),
        gpu_span_ns: ns(stats.gpu_span_s),
        queue_depth: stats.in_flight as u32,
        prefetch_target: stats.prefetch_depth as u32,
        bad_samples: stats.bad_samples,
        bytes: stats.bytes,
        stage_ns: Some(StageTimings {
            read_ns: ns(stats.read_s),
            decode_ns: ns(stats.decode_s),
            augment_ns: ns(stats.augment_s),
            assemble_ns: ns(stats.assemble_s),
            transfer_ns: 0,
        }),
    }
}

impl Driver {
    async fn run(mut self, start_step: u64) {
        // Steps passed to the consumer: all below `floor`, plus `ahead`.
        let mut floor = start_step;
        let mut ahead = BTreeSet::new();
        let mut backoff = Backoff::new(Duration::from_secs(2));
        loop {
            match self.session(&mut floor, &mut ahead, &mut backoff).await {
                SessionEnd::Done | SessionEnd::Stop => return,
                SessionEnd::Reopen => {}
            }
        }
    }

    fn register_request(&self) -> RegisterJobRequest {
        RegisterJobRequest {
            spec: Some(self.spec.clone()),
            weight: self.job_weight,
        }
    }

    /// Takes the loader's new requests (credits and their slots) without waiting.
    fn take_requests(&mut self) -> bool {
        loop {
            match self.requests.try_recv() {
                Ok(slot) => self.add_request(slot),
                Err(mpsc::error::TryRecvError::Empty) => return true,
                Err(mpsc::error::TryRecvError::Disconnected) => return false,
            }
        }
    }

    fn add_request(&mut self, slot: Slot) {
        lock(&self.free_slots).push_back((slot, Instant::now()));
        self.requested += 1;
        if let Some(since) = self.idle_since.take() {
            self.idle.add(since.elapsed());
        }
    }

    async fn open(
        &mut self,
        client: &mut CoordinatorClient<RpcChannel>,
        floor: u64,
        backoff: &mut Backoff,
    ) -> Option<(SessionToken, Vec<WorkerInfo>)> {
        loop {
            if !self.take_requests() {
                return None;
            }
            let opened = client
                .open_session(OpenSessionRequest {
                    job_id: self.job_id,
                    rank: self.rank,
                    epoch: self.epoch,
                    start_step: floor,
                    resume_from_journal: false,
                })
                .await;
            match opened {
                Ok(response) => {
                    let response = response.into_inner();
                    backoff.reset();
                    let token = response.session?;
                    return Some((token, response.workers));
                }
                Err(status) if status.code() == Code::NotFound => {
                    // The coordinator lost its journal: register the job again.
                    tracing::warn!(%status, "coordinator does not know the job; registering it again");
                    match client.register_job(self.register_request()).await {
                        Ok(r) => self.job_id = r.into_inner().job_id,
                        Err(status) if transport::is_transient(&status) => {
                            tokio::time::sleep(backoff.next_delay()).await;
                        }
                        Err(status) => {
                            let _ = self
                                .batches
                                .send(Err(error_from_status("registering the job again", &status)));
                            return None;
                        }
                    }
                }
                // A coordinator at its --max-sessions frees places as sessions close or time
                // out: worth waiting for, like an unreachable one.
                Err(status)
                    if transport::is_transient(&status)
                        || status.code() == Code::ResourceExhausted =>
                {
                    let delay = backoff.next_delay();
                    tracing::warn!(coordinator = %self.address, %status, retry_in = ?delay, "cannot open the session; retrying");
                    tokio::time::sleep(delay).await;
                }
                Err(status) => {
                    let _ = self
                        .batches
                        .send(Err(error_from_status("opening the session", &status)));
                    return None;
                }
            }
        }
    }

    /// Whether batches have been wanted with no worker serving them for longer than the
    /// grace; if so the consumer is told.
    fn unserved_too_long(&mut self) -> bool {
        let Some(since) = self.unserved_since else {
            return false;
        };
        if since.elapsed() < self.worker_grace {
            return false;
        }
        let error = Error::WorkerUnavailable {
            job: format!(
                "{} (id {}, rank {})",
                job_label(&self.spec),
                self.job_id,
                self.rank
            ),
            coordinator: self.address.clone(),
            unserved: since.elapsed(),
            grace: self.worker_grace,
        };
        tracing::error!(%error, "no worker serves the job");
        let _ = self.batches.send(Err(error));
        true
    }

    async fn session(
        &mut self,
        floor: &mut u64,
        ahead: &mut BTreeSet<u64>,
        backoff: &mut Backoff,
    ) -> SessionEnd {
        let mut client = CoordinatorClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
        let Some((token, workers)) = self.open(&mut client, *floor, backoff).await else {
            return SessionEnd::Stop;
        };
        tracing::debug!(session = token.session_id, floor = *floor, "session open");
        let (arrivals_tx, mut arrivals) = mpsc::unbounded_channel();
        let mut streams: HashMap<u64, tokio::task::JoinHandle<()>> = HashMap::new();
        let mut open_streams: HashSet<u64> = HashSet::new();
        let job_id = self.job_id;
        let security = self.security.clone();
        let network = self.network.clone();
        let free_slots = Arc::clone(&self.free_slots);
        // Workers whose stream could not open, and when to try them again: a worker may be
        // listed before its address resolves or accepts (a new pod's DNS name).
        let mut retry_at: HashMap<u64, Instant> = HashMap::new();
        let subscribe_all = |workers: &[WorkerInfo],
                             streams: &mut HashMap<u64, tokio::task::JoinHandle<()>>,
                             retry_at: &mut HashMap<u64, Instant>| {
            let now = Instant::now();
            retry_at.retain(|_, at| *at > now);
            for worker in workers {
                if streams.contains_key(&worker.worker_id)
                    || retry_at.contains_key(&worker.worker_id)
                {
                    continue;
                }
                let handle = tokio::spawn(stream_worker(
                    worker.clone(),
                    network.clone(),
                    security.clone(),
                    token,
                    job_id,
                    arrivals_tx.clone(),
                    Arc::clone(&free_slots),
                ));
                streams.insert(worker.worker_id, handle);
            }
        };
        subscribe_all(&workers, &mut streams, &mut retry_at);

        let mut outstanding = 0u64;
        // Steps received beyond the floor are acknowledged again first (before any credit of
        // the new window), so the reopened session does not lease them again.
        let mut acks: Vec<u64> = ahead.iter().copied().collect();
        let mut last_arrival = Instant::now();
        // The first update of a session reports, so a client whose epochs are shorter than the
        // report period still shows on the dashboard.
        let mut last_stats: Option<Instant> = None;
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        let end = loop {
            let received = *floor + ahead.len() as u64;
            if received >= self.steps && acks.is_empty() {
                break SessionEnd::Done;
            }
            // Credits: one for every step asked for and not yet received.
            let want = self
                .requested
                .min(self.steps)
                .saturating_sub(received + outstanding);
            let report = last_stats.is_none_or(|at| at.elapsed() >= Duration::from_millis(500));
            if want > 0 || !acks.is_empty() || report {
                let stats = report.then(|| {
                    last_stats = Some(Instant::now());
                    client_stats(&self.monitor)
                });
                let update = client
                    .update_session(SessionUpdateRequest {
                        session: Some(token),
                        grant_credits: want,
                        acknowledged: std::mem::take(&mut acks),
                        stats,
                    })
                    .await;
                match update {
                    Ok(response) => {
                        outstanding += want;
                        subscribe_all(&response.into_inner().workers, &mut streams, &mut retry_at);
                    }
                    Err(status) => {
                        tracing::warn!(coordinator = %self.address, %status, "session update failed; opening the session again");
                        if transport::is_transient(&status) {
                            tokio::time::sleep(backoff.next_delay()).await;
                        }
                        break SessionEnd::Reopen;
                    }
                }
            }
            tokio::select! {
                arrival = arrivals.recv() => match arrival {
                    Some(Arrival::Opened { worker }) => {
                        open_streams.insert(worker);
                        self.unserved_since = None;
                    }
                    Some(Arrival::Batch { incarnation, batch: landed, received }) => {
                        let batch = &landed.wire.batch;
                        let step = batch.step;
                        if batch.epoch != self.epoch || batch.rank != self.rank || step >= self.steps {
                            tracing::warn!(epoch = batch.epoch, rank = batch.rank, step, "batch for another session dropped");
                            landed.give_back(&self.free_slots);
                            continue;
                        }
                        if step < *floor || ahead.contains(&step) {
                            tracing::debug!(step, "duplicate batch dropped");
                            landed.give_back(&self.free_slots);
                            continue;
                        }
                        if incarnation == token.incarnation {
                            outstanding = outstanding.saturating_sub(1);
                        }
                        last_arrival = Instant::now();
                        ahead.insert(step);
                        while ahead.first() == Some(floor) {
                            ahead.pop_first();
                            *floor += 1;
                        }
                        acks.push(step);
                        // Latency: from the oldest open request (credits are served in order).
                        let (batch, asked) = landed.finish();
                        let service = asked.unwrap_or(received).elapsed();
                        if *floor + ahead.len() as u64 >= self.requested {
                            self.idle_since.get_or_insert_with(Instant::now);
                        }
                        let built = Built { step, service, result: Ok(batch) };
                        if self.batches.send(Ok(built)).is_err() {
                            break SessionEnd::Stop;
                        }
                    }
                    Some(Arrival::Failed(status)) => {
                        let _ = self.batches.send(Err(error_from_status("a worker could not build a batch", &status)));
                        break SessionEnd::Stop;
                    }
                    Some(Arrival::Refused { address, status }) => {
                        let context = format!("worker {address} refused the client's stream");
                        let _ = self.batches.send(Err(error_from_status(&context, &status)));
                        break SessionEnd::Stop;
                    }
                    Some(Arrival::Ended { worker }) => {
                        open_streams.remove(&worker);
                        streams.remove(&worker);
                        tracing::debug!(worker, "the worker ended its stream");
                    }
                    Some(Arrival::Lost { worker, opened, status }) => {
                        open_streams.remove(&worker);
                        if opened {
                            tracing::warn!(worker, %status, "worker stream lost; opening the session again so its undelivered batches are redone");
                            break SessionEnd::Reopen;
                        }
                        // Tried again with a later update that still lists it.
                        streams.remove(&worker);
                        retry_at.insert(worker, Instant::now() + STREAM_RETRY);
                        tracing::debug!(worker, %status, retry_in = ?STREAM_RETRY, "worker unreachable");
                    }
                    None => break SessionEnd::Stop,
                },
                slot = self.requests.recv() => match slot {
                    Some(slot) => self.add_request(slot),
                    None => break SessionEnd::Stop,
                },
                _ = tick.tick() => {
                    let received = *floor + ahead.len() as u64;
                    let wanted = self.requested.min(self.steps) > received;
                    if open_streams.is_empty() && wanted {
                        self.unserved_since.get_or_insert_with(Instant::now);
                        if self.unserved_too_long() {
                            break SessionEnd::Stop;
                        }
                    }
                    if wanted && outstanding > 0 && last_arrival.elapsed() >= self.stall_reopen {
                        tracing::warn!(step = *floor, waited = ?last_arrival.elapsed(), "no batch arrived; opening the session again");
                        break SessionEnd::Reopen;
                    }
                }
            }
        };
        for handle in streams.values() {
            handle.abort();
        }
        // Batches that came after the end are not taken (the next session leases them
        // again): their slots go back to the queue.
        while let Ok(arrival) = arrivals.try_recv() {
            if let Arrival::Batch { batch, .. } = arrival {
                batch.give_back(&self.free_slots);
            }
        }
        if matches!(end, SessionEnd::Done | SessionEnd::Stop) {
            if !acks.is_empty() {
                // The consumer went away with steps received since the last update.
                let _ = client
                    .update_session(SessionUpdateRequest {
                        session: Some(token),
                        grant_credits: 0,
                        acknowledged: acks,
                        stats: Some(client_stats(&self.monitor)),
                    })
                    .await;
            }
            let _ = client
                .close_session(CloseSessionRequest {
                    session: Some(token),
                })
                .await;
        }
        end
    }
}

/// A short name for the job in messages: its dataset (a mix: its datasets joined by `+`).
fn job_label(spec: &JobSpec) -> String {
    let uris: Vec<&str> = stoker_worker::spec_sources(spec)
        .into_iter()
        .map(|(dataset, _)| dataset.uri.as_str())
        .collect();
    if uris.is_empty() {
        "without a dataset".to_string()
    } else {
        uris.join("+")
    }
}

/// Opens the worker's stream for the session and forwards what arrives, each batch landed in a
/// slot of `slots` as its bytes come.
async fn stream_worker(
    worker: WorkerInfo,
    network: Network,
    security: ClientSecurity,
    token: SessionToken,
    job_id: u64,
    arrivals: mpsc::UnboundedSender<Arrival>,
    slots: Arc<SlotQueue>,
) {
    let lost = |opened: bool, status: Status| Arrival::Lost {
        worker: worker.worker_id,
        opened,
        status,
    };
    let mut channel = match network.channel(&worker.data_address, &security) {
        Ok(channel) => channel,
        Err(error) => {
            let _ = arrivals.send(lost(false, Status::invalid_argument(error.to_string())));
            return;
        }
    };
    let request = SubscribeRequest {
        session: Some(token),
        job_id,
    };
    let mut reader = match batch_wire::subscribe(&mut channel, request, MAX_MESSAGE_BYTES).await {
        Ok(reader) => reader,
        Err(status) if transport::is_refusal(&status) => {
            let _ = arrivals.send(Arrival::Refused {
                address: worker.data_address.clone(),
                status,
            });
            return;
        }
        Err(status) => {
            let _ = arrivals.send(lost(false, status));
            return;
        }
    };
    let _ = arrivals.send(Arrival::Opened {
        worker: worker.worker_id,
    });
    loop {
        match next_landed(&mut reader, &slots).await {
            Ok(Some(landed)) => {
                let arrival = Arrival::Batch {
                    incarnation: token.incarnation,
                    batch: Box::new(landed),
                    received: Instant::now(),
                };
                if arrivals.send(arrival).is_err() {
                    return;
                }
            }
            Ok(None) => {
                let _ = arrivals.send(Arrival::Ended {
                    worker: worker.worker_id,
                });
                return;
            }
            Err(status)
                if status.code() == Code::Unavailable
                    || status.code() == Code::Unknown
                    || status.code() == Code::Cancelled =>
            {
                let _ = arrivals.send(lost(true, status));
                return;
            }
            Err(status) => {
                let _ = arrivals.send(Arrival::Failed(status));
                return;
            }
        }
    }
}
