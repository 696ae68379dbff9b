//! The distributed-mode client: registers the job with the coordinator, opens the session of
//! its (job, rank, epoch), opens a stream to every worker, grants credits, acknowledges what
//! arrives, drops duplicates by step number and yields batches in step order.
//!
//! A driver task (on the client's own small tokio runtime) owns the session; the consumer's
//! thread only waits on a channel. The driver recovers on its own:
//! - a worker stream that ends after it was open may have swallowed batches the worker already
//!   reported delivered, so the session is reopened: every unacknowledged step is leased again
//!   and identical bytes arrive (determinism contract); copies of steps already received are
//!   dropped;
//! - a coordinator that goes away is reconnected with backoff; the restarted coordinator has its
//!   journal, a new incarnation, and the client opens its session again from the first step it
//!   still needs;
//! - a worker that joins shows up in the coordinator's answers and gets a stream.
//! - no batch for [`RemoteOptions::stall_reopen`] while the consumer waits: the session is
//!   reopened as well (and logged), so a lost batch costs a delay, never a hang.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use stoker_proto::v1::coordinator_client::CoordinatorClient;
use stoker_proto::v1::worker_data_client::WorkerDataClient;
use stoker_proto::v1::{
    Batch, ClientStats, CloseSessionRequest, JobSpec, OpenSessionRequest, RegisterJobRequest,
    SessionToken, SessionUpdateRequest, StageTimings, SubscribeRequest, WorkerInfo,
};
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::transport::{self, Backoff, MAX_MESSAGE_BYTES};
use crate::embedded::INTERRUPT_CHECK;
use crate::error::{Error, Result};

/// How the client runs.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// Batches the client accepts ahead of the consumer (credits).
    pub prefetch: usize,
    /// The longest `next()` waits for one batch.
    pub deadline: Duration,
    /// How long connecting and registering the job may take in all.
    pub connect_timeout: Duration,
    /// No batch for this long while the consumer waits: reopen the session.
    pub stall_reopen: Duration,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        Self {
            prefetch: 8,
            deadline: Duration::from_secs(600),
            connect_timeout: Duration::from_secs(60),
            stall_reopen: Duration::from_secs(10),
        }
    }
}

/// A job served by a coordinator and its workers.
pub struct RemoteLoader {
    runtime: Arc<tokio::runtime::Runtime>,
    address: String,
    channel: Channel,
    spec: JobSpec,
    job_id: u64,
    steps_per_epoch: u64,
    num_samples: u64,
    options: RemoteOptions,
}

fn remote(context: &str, status: &Status) -> Error {
    Error::Remote(format!(
        "{context}: {} ({:?})",
        status.message(),
        status.code()
    ))
}

impl RemoteLoader {
    /// Connects to the coordinator at `address` and registers the job (the coordinator has a
    /// worker open it, so a spec no worker can serve is refused here, with the worker's reason).
    pub fn connect(address: &str, spec: JobSpec, options: RemoteOptions) -> Result<RemoteLoader> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("stoker-client-io")
            .enable_all()
            .build()
            .map_err(|e| Error::Threads(e.to_string()))?;
        let channel = runtime.block_on(async { transport::channel(address) })?;
        let registered = runtime.block_on(register_job(
            channel.clone(),
            &spec,
            options.connect_timeout,
            address,
        ))?;
        tracing::info!(
            coordinator = address,
            job = registered.0,
            steps_per_epoch = registered.1,
            "job registered"
        );
        Ok(RemoteLoader {
            runtime: Arc::new(runtime),
            address: address.to_string(),
            channel,
            spec,
            job_id: registered.0,
            steps_per_epoch: registered.1,
            num_samples: registered.2,
            options,
        })
    }

    /// The job's id at the coordinator.
    pub fn job_id(&self) -> u64 {
        self.job_id
    }

    /// Steps in each epoch of this rank.
    pub fn steps_per_epoch(&self) -> u64 {
        self.steps_per_epoch
    }

    /// Samples in the dataset (as a worker counted them when the job was registered; 0 when the
    /// job was registered earlier by another client).
    pub fn num_samples(&self) -> u64 {
        self.num_samples
    }

    /// The spec.
    pub fn spec(&self) -> &JobSpec {
        &self.spec
    }

    /// Batches of `epoch` from `start_step` on, in step order.
    pub fn epoch(&self, epoch: u64, start_step: u64) -> Result<RemoteEpochStream> {
        if start_step > self.steps_per_epoch {
            return Err(Error::InvalidSpec(format!(
                "start step {start_step} is past the end of the epoch ({} steps)",
                self.steps_per_epoch
            )));
        }
        let (batches_tx, batches_rx) = crossbeam_channel::unbounded();
        let (consumed_tx, consumed_rx) = mpsc::unbounded_channel();
        let stats = Arc::new(Mutex::new(ClientStats::default()));
        let driver = Driver {
            channel: self.channel.clone(),
            address: self.address.clone(),
            spec: self.spec.clone(),
            job_id: self.job_id,
            rank: self.spec.rank,
            epoch,
            steps: self.steps_per_epoch,
            depth: self.options.prefetch.max(1) as u64,
            stall_reopen: self.options.stall_reopen,
            batches: batches_tx,
            consumed: consumed_rx,
            stats: stats.clone(),
        };
        let task = self.runtime.spawn(driver.run(start_step));
        Ok(RemoteEpochStream {
            _runtime: self.runtime.clone(),
            task,
            receiver: batches_rx,
            consumed: consumed_tx,
            ready: BTreeMap::new(),
            next_step: start_step,
            steps: self.steps_per_epoch,
            epoch,
            rank: self.spec.rank,
            deadline: self.options.deadline,
            address: self.address.clone(),
            stats,
            started: Instant::now(),
            depth: self.options.prefetch.max(1),
        })
    }
}

/// Registers (or finds) the job, retrying while the coordinator is unreachable.
async fn register_job(
    channel: Channel,
    spec: &JobSpec,
    timeout: Duration,
    address: &str,
) -> Result<(u64, u64, u64)> {
    let started = Instant::now();
    let mut backoff = Backoff::new(Duration::from_secs(2));
    let mut client = CoordinatorClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES);
    loop {
        match client
            .register_job(RegisterJobRequest {
                spec: Some(spec.clone()),
            })
            .await
        {
            Ok(response) => {
                let r = response.into_inner();
                return Ok((r.job_id, r.steps_per_epoch, r.num_samples));
            }
            Err(status) if transport::is_transient(&status) && started.elapsed() < timeout => {
                let delay = backoff.next_delay();
                tracing::warn!(coordinator = address, %status, retry_in = ?delay, "coordinator unreachable");
                tokio::time::sleep(delay).await;
            }
            Err(status) => {
                return Err(remote(
                    &format!("coordinator {address} refused the job"),
                    &status,
                ))
            }
        }
    }
}

/// One epoch of batches from the workers, in step order.
pub struct RemoteEpochStream {
    _runtime: Arc<tokio::runtime::Runtime>,
    task: tokio::task::JoinHandle<()>,
    receiver: Receiver<Result<Batch>>,
    consumed: mpsc::UnboundedSender<u64>,
    ready: BTreeMap<u64, Batch>,
    next_step: u64,
    steps: u64,
    epoch: u64,
    rank: u32,
    deadline: Duration,
    address: String,
    stats: Arc<Mutex<ClientStats>>,
    started: Instant,
    depth: usize,
}

impl RemoteEpochStream {
    /// The step the next batch will have.
    pub fn next_step(&self) -> u64 {
        self.next_step
    }

    /// Steps in the epoch.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The next batch in step order, `None` at the end of the epoch.
    pub fn next_batch(&mut self) -> Result<Option<Batch>> {
        self.next_batch_checked(&mut || false)
    }

    /// Like [`RemoteEpochStream::next_batch`], asking `interrupted` every [`INTERRUPT_CHECK`].
    pub fn next_batch_checked(
        &mut self,
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Result<Option<Batch>> {
        if self.next_step >= self.steps {
            return Ok(None);
        }
        let started = Instant::now();
        let step = self.next_step;
        while !self.ready.contains_key(&step) {
            let remaining = self.deadline.saturating_sub(started.elapsed());
            if remaining.is_zero() {
                return Err(Error::RemoteTimeout {
                    epoch: self.epoch,
                    step,
                    rank: self.rank,
                    waited: started.elapsed(),
                    coordinator: self.address.clone(),
                });
            }
            match self.receiver.recv_timeout(remaining.min(INTERRUPT_CHECK)) {
                Ok(Ok(batch)) => {
                    self.ready.insert(batch.step, batch);
                }
                Ok(Err(error)) => return Err(error),
                Err(RecvTimeoutError::Timeout) => {
                    if interrupted() {
                        return Err(Error::Interrupted);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Error::Stopped(
                        "the distributed client's driver stopped".into(),
                    ))
                }
            }
        }
        let waited = started.elapsed();
        let batch = self
            .ready
            .remove(&step)
            .ok_or_else(|| Error::Stopped(format!("step {step} vanished")))?;
        self.next_step += 1;
        let _ = self.consumed.send(step);
        if let Ok(mut stats) = self.stats.lock() {
            stats.batches += 1;
            stats.samples += batch.sample_indices.len() as u64;
            stats.wait_ns += waited.as_nanos() as u64;
            stats.elapsed_ns = self.started.elapsed().as_nanos() as u64;
            stats.queue_depth = self.ready.len() as u32;
            stats.prefetch_target = self.depth as u32;
            stats.bad_samples += batch.bad_samples.len() as u64;
            stats.bytes += batch
                .tensors
                .iter()
                .map(|t| t.data.len() as u64)
                .sum::<u64>();
            if let Some(t) = &batch.timings {
                let sum = stats.stage_ns.get_or_insert_with(StageTimings::default);
                sum.read_ns += t.read_ns;
                sum.decode_ns += t.decode_ns;
                sum.augment_ns += t.augment_ns;
                sum.assemble_ns += t.assemble_ns;
                sum.transfer_ns += t.transfer_ns;
            }
        }
        Ok(Some(batch))
    }
}

impl Iterator for RemoteEpochStream {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_batch().transpose()
    }
}

impl Drop for RemoteEpochStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a worker stream tells the driver.
enum Arrival {
    Batch {
        incarnation: u64,
        batch: Batch,
    },
    /// A batch the worker could not build (fail policy): the consumer gets the error.
    Failed(Status),
    /// The stream ended; `opened` says whether it was ever up.
    Lost {
        worker: u64,
        opened: bool,
        status: Status,
    },
}

struct Driver {
    channel: Channel,
    address: String,
    spec: JobSpec,
    job_id: u64,
    rank: u32,
    epoch: u64,
    steps: u64,
    depth: u64,
    stall_reopen: Duration,
    batches: Sender<Result<Batch>>,
    consumed: mpsc::UnboundedReceiver<u64>,
    stats: Arc<Mutex<ClientStats>>,
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

impl Driver {
    async fn run(mut self, start_step: u64) {
        // Steps passed to the consumer: all below `floor`, plus `ahead`.
        let mut floor = start_step;
        let mut ahead = BTreeSet::new();
        // Steps the consumer took (it takes them in order from `start_step`).
        let mut consumed = start_step;
        let mut backoff = Backoff::new(Duration::from_secs(2));
        loop {
            match self
                .session(&mut floor, &mut ahead, &mut consumed, &mut backoff)
                .await
            {
                SessionEnd::Done | SessionEnd::Stop => return,
                SessionEnd::Reopen => {}
            }
        }
    }

    fn register_request(&self) -> RegisterJobRequest {
        RegisterJobRequest {
            spec: Some(self.spec.clone()),
        }
    }

    async fn open(
        &mut self,
        client: &mut CoordinatorClient<Channel>,
        floor: u64,
        backoff: &mut Backoff,
    ) -> Option<(SessionToken, Vec<WorkerInfo>)> {
        loop {
            if self.batches.is_empty() && self.consumer_gone() {
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
                                .send(Err(remote("registering the job again", &status)));
                            return None;
                        }
                    }
                }
                Err(status) if transport::is_transient(&status) => {
                    let delay = backoff.next_delay();
                    tracing::warn!(coordinator = %self.address, %status, retry_in = ?delay, "cannot open the session; retrying");
                    tokio::time::sleep(delay).await;
                }
                Err(status) => {
                    let _ = self
                        .batches
                        .send(Err(remote("opening the session", &status)));
                    return None;
                }
            }
        }
    }

    fn consumer_gone(&self) -> bool {
        self.consumed.is_closed()
    }

    async fn session(
        &mut self,
        floor: &mut u64,
        ahead: &mut BTreeSet<u64>,
        consumed: &mut u64,
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
        let job_id = self.job_id;
        let subscribe_all =
            |workers: &[WorkerInfo], streams: &mut HashMap<u64, tokio::task::JoinHandle<()>>| {
                for worker in workers {
                    if streams.contains_key(&worker.worker_id) {
                        continue;
                    }
                    let handle = tokio::spawn(stream_worker(
                        worker.clone(),
                        token,
                        job_id,
                        arrivals_tx.clone(),
                    ));
                    streams.insert(worker.worker_id, handle);
                }
            };
        subscribe_all(&workers, &mut streams);

        let mut outstanding = 0u64;
        // Steps received beyond the floor are acknowledged again first (before any credit of
        // the new window), so the reopened session does not lease them again.
        let mut acks: Vec<u64> = ahead.iter().copied().collect();
        let mut last_arrival = Instant::now();
        let mut last_stats = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        let end = loop {
            let received = *floor + ahead.len() as u64;
            if received >= self.steps && acks.is_empty() {
                break SessionEnd::Done;
            }
            // Credits: keep (batches waiting at the consumer + credits not yet used) at depth.
            let buffered = received.saturating_sub(*consumed);
            let remaining = self.steps - received;
            let want = self
                .depth
                .saturating_sub(buffered + outstanding)
                .min(remaining.saturating_sub(outstanding));
            if want > 0 || !acks.is_empty() || last_stats.elapsed() >= Duration::from_millis(500) {
                let stats = if last_stats.elapsed() >= Duration::from_millis(500) {
                    last_stats = Instant::now();
                    self.stats.lock().ok().map(|s| *s)
                } else {
                    None
                };
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
                        subscribe_all(&response.into_inner().workers, &mut streams);
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
                    Some(Arrival::Batch { incarnation, batch }) => {
                        let step = batch.step;
                        if batch.epoch != self.epoch || batch.rank != self.rank || step >= self.steps {
                            tracing::warn!(epoch = batch.epoch, rank = batch.rank, step, "batch for another session dropped");
                            continue;
                        }
                        if step < *floor || ahead.contains(&step) {
                            tracing::debug!(step, "duplicate batch dropped");
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
                        if self.batches.send(Ok(batch)).is_err() {
                            break SessionEnd::Stop;
                        }
                    }
                    Some(Arrival::Failed(status)) => {
                        let _ = self.batches.send(Err(remote("a worker could not build a batch", &status)));
                        break SessionEnd::Stop;
                    }
                    Some(Arrival::Lost { worker, opened, status }) => {
                        if opened {
                            tracing::warn!(worker, %status, "worker stream lost; opening the session again so its undelivered batches are redone");
                            break SessionEnd::Reopen;
                        }
                        tracing::debug!(worker, %status, "worker unreachable");
                    }
                    None => break SessionEnd::Stop,
                },
                step = self.consumed.recv() => match step {
                    Some(_) => *consumed += 1,
                    None => break SessionEnd::Stop,
                },
                _ = tick.tick() => {
                    let waiting = *consumed >= received;
                    if waiting && outstanding > 0 && last_arrival.elapsed() >= self.stall_reopen {
                        tracing::warn!(step = *floor, waited = ?last_arrival.elapsed(), "no batch arrived; opening the session again");
                        break SessionEnd::Reopen;
                    }
                }
            }
        };
        for handle in streams.values() {
            handle.abort();
        }
        if matches!(end, SessionEnd::Done | SessionEnd::Stop) {
            let _ = client
                .close_session(CloseSessionRequest {
                    session: Some(token),
                })
                .await;
        }
        end
    }
}

/// Opens the worker's stream for the session and forwards what arrives.
async fn stream_worker(
    worker: WorkerInfo,
    token: SessionToken,
    job_id: u64,
    arrivals: mpsc::UnboundedSender<Arrival>,
) {
    let lost = |opened: bool, status: Status| Arrival::Lost {
        worker: worker.worker_id,
        opened,
        status,
    };
    let channel = match transport::channel(&worker.data_address) {
        Ok(channel) => channel,
        Err(error) => {
            let _ = arrivals.send(lost(false, Status::invalid_argument(error.to_string())));
            return;
        }
    };
    let mut client = WorkerDataClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let response = client
        .subscribe(SubscribeRequest {
            session: Some(token),
            job_id,
        })
        .await;
    let mut stream = match response {
        Ok(response) => response.into_inner(),
        Err(status) => {
            let _ = arrivals.send(lost(false, status));
            return;
        }
    };
    loop {
        match stream.message().await {
            Ok(Some(batch)) => {
                let arrival = Arrival::Batch {
                    incarnation: token.incarnation,
                    batch,
                };
                if arrivals.send(arrival).is_err() {
                    return;
                }
            }
            Ok(None) => {
                let _ = arrivals.send(lost(true, Status::unavailable("stream ended")));
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
