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
//!   dropped. A stream the worker ends cleanly (a worker draining on SIGTERM) delivered all it
//!   held before its end: the session goes on, and the worker gets a new stream if the
//!   coordinator still lists it; one a worker ended because this client took nothing from it
//!   ends with `UNAVAILABLE`, lost, and the session opens again;
//! - a coordinator that goes away is reconnected with backoff; the restarted coordinator has its
//!   journal, a new incarnation, and the client opens its session again from the first step it
//!   still needs;
//! - a worker that joins shows up in the coordinator's answers and gets a stream; one whose
//!   stream cannot open yet (its address does not resolve or accept) is tried again every
//!   500 ms while the coordinator lists it;
//! - no batch for [`RemoteOptions::stall_reopen`] while batches are asked for and credits are
//!   out (whether or not the consumer waits in `next()` meanwhile): the session is reopened as
//!   well (and logged), so a lost batch costs a delay, never a hang; the wait
//!   doubles at each such reopen (up to 64 times, at most 300 s) and halves again as batches
//!   come quicker, so a batch slower to build than the wait is not leased again for good;
//! - a batch a worker could not build (a bad sample under the fail policy; its error carries the
//!   step) fails that step alone, as in process: the consumer gets the error for that step and
//!   reads on; the worker's stream ended with the error, so the session is reopened, the step
//!   acknowledged first (each such step costs a reopen: the batches in flight then are leased
//!   and built again);
//! - a coordinator at its session cap (`RESOURCE_EXHAUSTED`) is asked again with backoff, as
//!   its silent sessions time out;
//! - no worker stream open for [`RemoteOptions::worker_grace`] while batches are wanted (every
//!   worker gone, or the coordinator not answering, so no session): the consumer gets
//!   [`Error::WorkerUnavailable`] naming the job, how long it went unserved and which cause.
//!
//! Dropping an epoch's feed (the loader closed, or the epoch left before its end) stops its
//! driver, which acknowledges what arrived and closes the session, so the coordinator stops
//! leasing steps nobody will take at once rather than after its session timeout.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use stoker_proto::v1::coordinator_client::CoordinatorClient;
use stoker_proto::v1::{JobSpec, RegisterJobRequest};
use stoker_rpc::error_kinds;
use stoker_rpc::network::Network;
use stoker_rpc::security::{ClientSecurity, Token};
use stoker_rpc::transport::{Backoff, RpcChannel, MAX_MESSAGE_BYTES};
use tokio::sync::mpsc;

mod driver;
mod opening;
mod streams;
mod unreachable;
pub mod updates;

use super::landing::SLOT_ALIGN;
use super::slots::Slot;
use super::source::{receive, BatchSource, Built, EpochFeed, IdleClock, SourceInfo};
use crate::error::{error_from_status, Error, ErrorKind, Result};
use driver::Driver;
use stoker_dashboard::{ChangeReason, ControllerSnapshot, LoaderMonitor};

/// How the remote source runs.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// How long an unreachable coordinator, or one with no worker for the job, is tried again
    /// while connecting and registering the job; then the loader stops with a
    /// `WorkerUnavailable` error, as when that happens mid-run. A registration the coordinator
    /// answers is waited for as long as its workers take to open the dataset, up to the
    /// coordinator's `--describe-timeout-secs` (120 s by default) for each worker it asks.
    pub connect_timeout: Duration,
    /// No batch for this long while batches are asked for and credits are out (the consumer
    /// waiting in `next()` or not): reopen the session. Each reopen for
    /// that doubles the wait, up to 64 times this but no more than 300 s (unless this is
    /// more), so batches that take longer than this to build still arrive; a batch that comes
    /// within half the wait halves it again, down to this.
    pub stall_reopen: Duration,
    /// No worker stream open for this long while batches are wanted (every worker gone, or the
    /// coordinator not answering): fail with [`Error::WorkerUnavailable`]. Separate from the
    /// `next()` deadline, so that workers
    /// leaving during a scale-down or a rolling update do not trip it.
    pub worker_grace: Duration,
    /// Longest credits wanted back (steps the loader asked for) are held while the workers
    /// still hold more than half the prefetch window's credits: what is asked for meanwhile
    /// goes in one update of the session. They go at once when half the window is wanted
    /// back. Acknowledgements of arrived steps ride with the credits, or go alone after
    /// 200 ms, when 64 wait, or when the epoch is all in. Longer: fewer updates for the
    /// coordinator to take (its cost per assignment is mostly these); shorter: credits reach
    /// the workers sooner.
    pub ack_interval: Duration,
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
            ack_interval: Duration::from_millis(50),
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

/// How long a timed-out wait asks the coordinator why.
const WHY_ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// How long dropping an epoch's feed waits for its driver to close the session.
const CLOSE_WAIT: Duration = Duration::from_millis(500);

/// How long after a worker's stream failed to open, or was ended by the worker, the driver
/// opens it again (while the coordinator lists the worker).
const STREAM_RETRY: Duration = Duration::from_millis(500);

/// How long a listed worker's stream fails to open before the client says so (a warning, once
/// per session).
const UNREACHABLE_SAID_AFTER: Duration = Duration::from_secs(5);

/// A job served by a coordinator and its workers.
pub struct RemoteSource {
    runtime: Arc<tokio::runtime::Runtime>,
    address: String,
    channel: RpcChannel,
    security: ClientSecurity,
    spec: JobSpec,
    /// The job's id at the coordinator: a later epoch's driver that finds the coordinator has
    /// forgotten the job registers it again and puts the new id here for the next ones.
    job_id: Arc<AtomicU64>,
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
    /// Empty from workers that give none.
    dataset_fingerprint: String,
}

impl RemoteSource {
    /// Connects to the coordinator at `address` and registers the job (the coordinator has a
    /// worker open it, so a spec no worker can serve is refused here, with the worker's reason).
    /// `address` may list several coordinators, comma-separated (jobs sharded over them,
    /// `stoker_rpc::shards`): the job goes to the one its spec hashes to.
    pub fn connect(list: &str, spec: JobSpec, options: RemoteOptions) -> Result<RemoteSource> {
        let (shard, address) = stoker_rpc::shards::coordinator_of(list, &spec)
            .map_err(|error| Error::InvalidSpec(format!("address: {error}")))?;
        if address != list {
            tracing::info!(coordinator = %address, shard, "the job's coordinator, of the list");
        }
        let address = address.as_str();
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
            dataset_fingerprint: Some(registered.dataset_fingerprint).filter(|f| !f.is_empty()),
            notices: Vec::new(),
        };
        Ok(RemoteSource {
            runtime: Arc::new(runtime),
            address: address.to_string(),
            channel,
            security,
            spec,
            job_id: Arc::new(AtomicU64::new(registered.job_id)),
            info,
            options,
        })
    }

    /// The job's id at the coordinator.
    pub fn job_id(&self) -> u64 {
        self.job_id.load(Ordering::Relaxed)
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

    fn coordinator_job(&self) -> Option<u64> {
        Some(self.job_id())
    }

    /// Why a worker last handed one of the job's tasks back, as the coordinator says (asked
    /// once the wait for a batch ran out, within 2 s): the cause a timeout
    /// names when every worker hands its tasks back (a store failing for all of them).
    fn reading_now(&self) -> String {
        // Not from within a runtime, where blocking on this one's would panic.
        if tokio::runtime::Handle::try_current().is_ok() {
            return String::new();
        }
        let mut client = CoordinatorClient::new(self.channel.clone());
        let request = stoker_proto::v1::GetJobRequest {
            job_id: self.job_id(),
        };
        let asked = self.runtime.block_on(async {
            tokio::time::timeout(WHY_ASK_TIMEOUT, client.get_job(request)).await
        });
        match asked {
            Ok(Ok(answer)) => {
                let answer = answer.into_inner();
                if answer.last_failure.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; the coordinator says a worker last handed one of its tasks back {} s \
                         ago: {}",
                        answer.last_failure_age_s, answer.last_failure
                    )
                }
            }
            Ok(Err(status)) => format!("; the coordinator could not be asked why: {status}"),
            Err(_) => "; the coordinator did not say why within 2 s".to_string(),
        }
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
            job_id: Arc::clone(&self.job_id),
            dataset_fingerprint: self.info.dataset_fingerprint.clone(),
            rank: self.spec.rank,
            epoch,
            steps,
            stall_reopen: self.options.stall_reopen,
            stall_base: self.options.stall_reopen,
            stall_most: driver::stall_most(self.options.stall_reopen),
            worker_grace: self.options.worker_grace,
            ack_interval: self.options.ack_interval,
            batches: batches_tx,
            requests: requests_rx,
            free_slots: Arc::default(),
            requested: start_step,
            monitor,
            idle: idle.clone(),
            idle_since: Some(Instant::now()),
            unserved_since: None,
            owed_slots: 0,
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

/// What registering `spec` asks of the coordinator.
fn register_request(spec: &JobSpec, options: &RemoteOptions) -> RegisterJobRequest {
    RegisterJobRequest {
        spec: Some(spec.clone()),
        weight: options.job_weight,
    }
}

/// Registers (or finds) the job, retrying while the coordinator is unreachable.
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
                    dataset_fingerprint: r.dataset_fingerprint,
                });
            }
            Err(status) if error_kinds::is_transient(&status) && started.elapsed() < timeout => {
                let delay = backoff.next_delay();
                if error_kinds::is_worker_unreachable(&status) {
                    tracing::warn!(coordinator = address, %status, retry_in = ?delay, "the coordinator answers, but cannot reach a worker to open the job");
                } else {
                    tracing::warn!(coordinator = address, %status, retry_in = ?delay, "coordinator unreachable");
                }
                tokio::time::sleep(delay).await;
            }
            // Still unreachable, or still without a worker, when the connect timeout ran out:
            // nothing refused the job. The client stops as it does when this happens mid-run.
            Err(status) if error_kinds::is_transient(&status) => {
                // The coordinator's own wait for a worker may outlast the timeout.
                let within = format!("after {:.0} s", started.elapsed().as_secs_f64());
                let context = if error_kinds::is_worker_unreachable(&status) {
                    format!(
                        "coordinator {address} answers, but could not reach a worker to open the \
                         job {within}"
                    )
                } else if error_kinds::kind_of_status(&status) == ErrorKind::WorkerUnavailable {
                    format!("coordinator {address} answers, but had no worker for the job {within}")
                } else {
                    format!("could not reach coordinator {address} {within}")
                };
                return Err(Error::Remote {
                    kind: ErrorKind::WorkerUnavailable,
                    context,
                    message: status.message().to_string(),
                });
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
/// The figures a client reports to its coordinator, from its loader's monitor.
pub(super) fn client_stats(monitor: &LoaderMonitor) -> stoker_proto::v1::ClientStats {
    let snapshot = monitor.snapshot();
    let stats = &snapshot.stats;
    let ns = |s: f64| (s * 1e9) as u64;
    stoker_proto::v1::ClientStats {
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
        stage_ns: Some(stoker_proto::v1::StageTimings {
            read_ns: ns(stats.read_s),
            decode_ns: ns(stats.decode_s),
            augment_ns: ns(stats.augment_s),
            assemble_ns: ns(stats.assemble_s),
            transfer_ns: 0,
        }),
        prefetch_control: snapshot.controller.as_ref().map(prefetch_control),
    }
}

/// The prefetch controller's view as the client reports it.
fn prefetch_control(view: &ControllerSnapshot) -> stoker_proto::v1::PrefetchControl {
    use stoker_proto::v1::DepthChange;
    let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let depth = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    let last_change = match view.last_change {
        ChangeReason::Startup => DepthChange::Startup,
        ChangeReason::Stall => DepthChange::Stall,
        ChangeReason::Idle => DepthChange::Idle,
        ChangeReason::LittlesLaw => DepthChange::LittlesLaw,
        ChangeReason::Budget => DepthChange::Budget,
    };
    stoker_proto::v1::PrefetchControl {
        target_depth: depth(view.target_depth),
        budget_depth: depth(view.budget_depth),
        latency_mean_ns: ns(view.latency_mean),
        latency_std_ns: ns(view.latency_std),
        step_mean_ns: ns(view.step_mean),
        step_std_ns: ns(view.step_std),
        littles_depth: depth(view.littles_depth),
        stall_floor_depth: depth(view.stall_floor_depth),
        stall_fraction: view.stall_fraction,
        last_change: last_change.into(),
    }
}

/// A short name for the job in messages: its dataset (a mix: its datasets joined by `+`).
pub(super) fn job_label(spec: &JobSpec) -> String {
    let uris: Vec<String> = stoker_pipeline::spec_sources(spec)
        .into_iter()
        .map(|(dataset, _)| stoker_pipeline::source_names(dataset).join(","))
        .collect();
    if uris.is_empty() {
        "without a dataset".to_string()
    } else {
        uris.join("+")
    }
}
