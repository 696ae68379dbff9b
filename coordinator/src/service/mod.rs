//! The coordinator daemon: the gRPC face of the scheduling core ([`Coordinator`]), plus what only
//! a daemon needs: the worker registry with data addresses, long-polled leases, a timer that
//! expires silent workers and sessions, a timer that flushes the journal, and job checks done by
//! asking a worker to open the job (`WorkerData.DescribeJob`).
//!
//! The core sits behind one mutex that is never held across an `.await`; every call is a few
//! microseconds of work under it (see `stoker bench coordinator`). The journal's writes (the
//! periodic write of acknowledged positions, a job's registration, a weight) are taken under
//! it but written outside it, on a blocking thread, so a slow or stalled disk holds up no
//! call but a registration (durable before it is answered): workers' heartbeats and leases,
//! and clients' acknowledgements, go on meanwhile.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use prost::Message;
use stoker_pipeline::ErrorKind;
use stoker_proto::v1::coordinator_server::CoordinatorServer;
use stoker_proto::v1::{self as proto, JobSpec, SessionToken, WorkerInfo};
use stoker_rpc::error_kinds::with_kind;
use stoker_rpc::network::Network;
use stoker_rpc::security::{ClientSecurity, ServerSecurity};
use stoker_rpc::transport::{self, MAX_MESSAGE_BYTES};
use tokio::sync::Notify;
use tonic::Status;

pub(crate) mod calls;
mod jobs;
mod timers;

pub use calls::StreamAnswers;

use crate::dashboard_feed::LastRefresh;
use crate::registry::{ClientEntry, WorkerEntry};
use crate::status::coordinator_status;
use crate::{
    Coordinator, CoordinatorConfig, CoordinatorError, Durable, JournalWriter, SessionId, WorkerId,
};
use stoker_dashboard::{Dashboard, MonitorSnapshot};

/// Tuning of the coordinator daemon.
#[derive(Debug, Clone)]
pub struct CoordinatorServiceConfig {
    /// The core's settings (lease timeout, journal cadence, credit and lease limits).
    pub core: CoordinatorConfig,
    /// A session whose client sent nothing for this long is closed (its credits freed).
    pub session_timeout: Duration,
    /// Longest a worker's lease call waits for work.
    pub max_lease_wait: Duration,
    /// How long a job check (`DescribeJob` on the workers, each joined by the next when it
    /// has not answered within an eighth of it, less with more than four) may take in all.
    pub describe_timeout: Duration,
    /// How long a job registration waits for a first worker to register.
    pub worker_wait: Duration,
    /// How often acknowledged positions are written to the journal.
    pub flush_every: Duration,
    /// What the daemon accepts (token, TLS).
    pub server_security: ServerSecurity,
    /// What it presents when it asks a worker to check a job (token, trusted CA).
    pub client_security: ClientSecurity,
    /// Where its calls to the workers lead (sockets; an in-memory network in tests).
    pub network: Network,
    /// Its place in a fleet of coordinators, `(index, of)`: it registers only the jobs whose
    /// specs hash to `index` of `of` (`stoker_rpc::shards`). `None`: every job.
    pub shard: Option<(usize, usize)>,
    /// A client rank that sent no report for this long leaves the dashboard (and its report
    /// is let go).
    pub rank_forgotten_after: Duration,
    /// How long a job's description answers its registrations once no session of it is open,
    /// counted from its last use: the ranks of one run registering together share one; a
    /// registration later asks a worker again (the dataset may have changed between runs).
    pub description_reused_for: Duration,
}

impl Default for CoordinatorServiceConfig {
    fn default() -> Self {
        Self {
            core: CoordinatorConfig {
                lease_timeout: Duration::from_secs(3),
                // Positions are flushed on a timer instead.
                journal_every: u64::MAX,
                ..CoordinatorConfig::default()
            },
            session_timeout: Duration::from_secs(60),
            max_lease_wait: Duration::from_secs(2),
            describe_timeout: Duration::from_secs(120),
            worker_wait: Duration::from_secs(15),
            flush_every: Duration::from_millis(100),
            server_security: ServerSecurity::default(),
            client_security: ClientSecurity::default(),
            network: Network::Sockets,
            shard: None,
            rank_forgotten_after: Duration::from_secs(300),
            description_reused_for: Duration::from_secs(60),
        }
    }
}

struct SessionEntry {
    job: u64,
    rank: u32,
    epoch: u64,
    steps_per_epoch: u64,
    last_seen: Instant,
}

struct State {
    core: Coordinator,
    /// What the dashboard charts per (job, rank): the latest client report.
    monitors: HashMap<(u64, u32), Arc<Mutex<MonitorSnapshot>>>,
    /// Counters at the last dashboard refresh, for the per-second figures.
    last_refresh: LastRefresh,
    workers: BTreeMap<u64, WorkerEntry>,
    /// Per data address, the worker processes (instances) a registration there replaced.
    replaced: HashMap<String, std::collections::HashSet<u64>>,
    /// Changes with every worker that joins or goes (never 0), so a session's update lists
    /// the workers only when its client's list is out of date.
    workers_version: u64,
    sessions: HashMap<u64, SessionEntry>,
    clients: BTreeMap<(u64, u32), ClientEntry>,
    /// What a worker said of each job when it was registered (journaled with the job, and
    /// read back after a restart; described again when a client registers it).
    descriptions: HashMap<u64, proto::DescribeJobResponse>,
    /// When a worker last described each job, or a registration was answered with it or a
    /// session of it closed: a registration is answered with the description while a session
    /// of the job is open or for `description_reused_for` after that, and asks a worker again
    /// later (a dataset changed between two runs is seen within one
    /// coordinator run too, not only across a restart).
    described_at: HashMap<u64, Instant>,
    /// Per job, the workers leased one of its tasks and when they last were (the dashboard
    /// shows who serves each job; old entries go at each refresh; empty without a dashboard).
    serving: HashMap<u64, HashMap<u64, Instant>>,
    /// When silent workers and sessions were last looked for.
    last_expire: Instant,
    /// When jobs were last looked at for retirement.
    last_retire_look: Instant,
}

impl State {
    /// A worker registered: the workers' list has a new version.
    fn worker_joined(&mut self, entry: WorkerEntry) {
        self.workers.insert(entry.id, entry);
        self.workers_version += 1;
    }

    /// One address serves one process: a worker registering where a live one is listed
    /// (restarted at the address it had, before the coordinator found the old one silent)
    /// replaces it. Clients would otherwise open a stream to each, which the one process there
    /// takes as one client's, each opening ending the other's, until the old entry expired;
    /// and its leases would wait out that expiry too. Returns the tasks that went back.
    ///
    /// A process replaced at an address that registers there again while another holds it is
    /// refused: two running workers advertise one address, and would otherwise take turns
    /// replacing each other, each time putting the other's leases back.
    fn replace_workers_at(&mut self, address: &str, instance: u64) -> Result<u64, Status> {
        let listed: Vec<(u64, u64)> = self
            .workers
            .values()
            .filter(|entry| entry.data_address == address)
            .map(|entry| (entry.id, entry.instance))
            .collect();
        let displaced = self.replaced.get(address);
        if instance != 0
            && displaced.is_some_and(|gone| gone.contains(&instance))
            && listed.iter().any(|&(_, other)| other != instance)
        {
            return Err(with_kind(
                Status::already_exists(format!(
                    "another worker process registered at {address} after this one and holds \
                     it: two running workers advertise one address; give each its own \
                     --advertise"
                )),
                ErrorKind::InvalidArgument,
            ));
        }
        let mut requeued = 0;
        for (old, old_instance) in listed {
            if old_instance != 0 && old_instance != instance {
                let gone = self.replaced.entry(address.to_string()).or_default();
                if gone.len() >= REPLACED_KEPT {
                    gone.clear();
                }
                gone.insert(old_instance);
            }
            requeued += self.core.leave_worker(crate::WorkerId(old)).unwrap_or(0);
            self.worker_gone(old);
            tracing::warn!(
                worker = old,
                address,
                "a worker registered at the address of worker {old}, which is taken as gone and \
                 its tasks go back to the queue (if two running workers advertise one address, \
                 a Service's name say, give each its own --advertise)"
            );
        }
        Ok(requeued)
    }

    /// A worker left or was lost: the list has a new version if it was in it.
    fn worker_gone(&mut self, id: u64) -> Option<WorkerEntry> {
        let entry = self.workers.remove(&id)?;
        self.workers_version += 1;
        Some(entry)
    }
}

/// The coordinator's gRPC service; cheap to clone (shared state).
#[derive(Clone)]
pub struct CoordinatorService {
    state: Arc<Mutex<State>>,
    /// Where the core's journal writes go, made off the state's lock.
    journal: JournalWriter,
    dashboard: Option<Arc<Dashboard>>,
    incarnation: u64,
    work: Arc<Notify>,
    /// Held while a job's registration or weight is journaled (outside the state's lock), so
    /// they are written in turn and two ranks registering one job agree on its id.
    registrations: Arc<tokio::sync::Mutex<()>>,
    /// Per job spec (its encoding) being described, the turn its registrations wait for: the
    /// ranks of a job register together, and one worker opening the dataset once per rank at
    /// once took its memory as many times over.
    describing: jobs::DescribeTurns,
    config: Arc<CoordinatorServiceConfig>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic under the lock leaves the core consistent (every method checks before it
    // mutates), so carry on with it.
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Spec of a job as the coordinator keys it: ranks are sessions of one job.
fn job_key(mut spec: JobSpec) -> JobSpec {
    spec.rank = 0;
    spec
}

impl CoordinatorService {
    /// A service over the journal in `state_dir` (created if missing).
    pub fn open(
        state_dir: &Path,
        config: CoordinatorServiceConfig,
    ) -> Result<Self, CoordinatorError> {
        Ok(Self::with_core(
            Durable::open(state_dir, config.core.clone())?,
            config,
        ))
    }

    /// A service over an existing core and its journal (tests, in-memory use).
    pub fn with_core(durable: Durable, config: CoordinatorServiceConfig) -> Self {
        let (mut core, journal) = durable.into_parts();
        // Kept with their jobs, so a worker that opens one after a restart checks its view
        // against the one registered (a description that does not decode is left out).
        let descriptions = core
            .take_restored_descriptions()
            .into_iter()
            .filter_map(|(job, bytes)| {
                let described = proto::DescribeJobResponse::decode(bytes.as_slice()).ok()?;
                Some((job, described))
            })
            .collect();
        let incarnation = transport::random_u64();
        tracing::info!(
            incarnation,
            jobs = core.jobs().count(),
            "coordinator started"
        );
        Self {
            state: Arc::new(Mutex::new(State {
                core,
                monitors: HashMap::new(),
                last_refresh: LastRefresh::default(),
                workers: BTreeMap::new(),
                replaced: HashMap::new(),
                workers_version: 1,
                sessions: HashMap::new(),
                clients: BTreeMap::new(),
                descriptions,
                described_at: HashMap::new(),
                serving: HashMap::new(),
                last_expire: Instant::now(),
                last_retire_look: Instant::now(),
            })),
            journal,
            dashboard: None,
            incarnation,
            work: Arc::new(Notify::new()),
            registrations: Arc::new(tokio::sync::Mutex::new(())),
            describing: jobs::DescribeTurns::default(),
            config: Arc::new(config),
        }
    }

    /// Charts every client's reports and lists the workers on `dashboard`.
    pub fn with_dashboard(mut self, dashboard: Arc<Dashboard>) -> Self {
        self.dashboard = Some(dashboard);
        self
    }

    /// This run's incarnation (part of every session token).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// This run's tag in the high half of a worker's id on the wire: nonzero, and another in
    /// each run (the core's worker ids start at 0 again after a restart).
    fn worker_tag(&self) -> u64 {
        (self.incarnation >> 33) | 1
    }

    /// The id a worker is given: this run's tag over the core's id.
    fn wire_worker(&self, worker: WorkerId) -> Result<u64, Status> {
        if worker.0 >> 32 != 0 {
            return Err(Status::resource_exhausted(
                "this coordinator run has registered 2^32 workers; restart it",
            ));
        }
        Ok(self.worker_tag() << 32 | worker.0)
    }

    /// The core's id of a worker's id on the wire; refused (so the worker registers again) when
    /// an earlier run gave it, even where its core id is taken again by another worker.
    fn core_worker(&self, wire: u64) -> Result<WorkerId, Status> {
        if wire >> 32 != self.worker_tag() {
            return Err(with_kind(
                Status::not_found(format!(
                    "unknown worker {wire} in this coordinator run (an id from before a \
                     restart, or never given); register again"
                )),
                ErrorKind::InvalidArgument,
            ));
        }
        Ok(WorkerId(wire & u64::from(u32::MAX)))
    }

    /// The live workers.
    pub fn workers(&self) -> Vec<WorkerEntry> {
        lock(&self.state).workers.values().cloned().collect()
    }

    /// The latest client reports, per (job, rank).
    pub fn clients(&self) -> Vec<ClientEntry> {
        lock(&self.state).clients.values().cloned().collect()
    }

    /// The core's counters.
    pub fn core_stats(&self) -> crate::CoordinatorStats {
        lock(&self.state).core.stats()
    }

    /// Job `job`'s share of the workers: its weight, the leases handed to it, its ready
    /// sessions.
    pub fn job_share(&self, job: u64) -> crate::JobShareStats {
        lock(&self.state).core.job_share(crate::JobId(job))
    }

    /// The core under the service's lock, held as long as the guard lives (tests stall the
    /// coordinator with it).
    #[cfg(test)]
    pub(crate) fn locked_core(&self) -> impl std::ops::DerefMut<Target = Coordinator> + '_ {
        struct Core<'a>(MutexGuard<'a, State>);
        impl std::ops::Deref for Core<'_> {
            type Target = Coordinator;
            fn deref(&self) -> &Coordinator {
                &self.0.core
            }
        }
        impl std::ops::DerefMut for Core<'_> {
            fn deref_mut(&mut self) -> &mut Coordinator {
                &mut self.0.core
            }
        }
        Core(lock(&self.state))
    }

    /// Serves on `listener` until `shutdown` resolves, with the expiry and flush timers.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let incoming = self.config.server_security.incoming(listener);
        self.serve_incoming(incoming, shutdown).await
    }

    /// Serves the connections of `incoming` (a socket's, or an in-memory network's) until
    /// `shutdown` resolves, with the expiry and flush timers; flushes the journal at the end,
    /// and fails when that last flush does (the process's exit then says so to whatever
    /// supervises it).
    pub async fn serve_incoming<IO, E>(
        self,
        incoming: impl tokio_stream::Stream<Item = Result<IO, E>> + Send + 'static,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError>
    where
        IO: stoker_rpc::network::Connection,
        E: Into<Box<dyn std::error::Error + Send + Sync>> + 'static,
    {
        let timers = tokio::spawn(self.clone().run_timers());
        let (stop_flushes, flushes_stopped) = tokio::sync::oneshot::channel::<()>();
        let flushes = tokio::spawn(self.clone().run_flushes(flushes_stopped));
        let server = CoordinatorServer::new(self.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let server = tonic::service::interceptor::InterceptedService::new(
            server,
            self.config.server_security.check(),
        );
        // The server stops taking connections once told to, and then waits for the open ones
        // to end, which a client's update stream never does: past SHUTDOWN_GRACE they are
        // closed, so the journal's last positions go and the process ends.
        let (told, told_to_stop) = tokio::sync::oneshot::channel::<()>();
        let shutdown = async move {
            shutdown.await;
            let _ = told.send(());
        };
        let mut serving = tokio::spawn(
            transport::server()
                .add_service(server)
                .serve_with_incoming_shutdown(incoming, shutdown),
        );
        let ended = tokio::select! {
            ended = &mut serving => Some(ended),
            _ = told_to_stop => tokio::time::timeout(SHUTDOWN_GRACE, &mut serving).await.ok(),
        };
        let result = match ended {
            Some(Ok(result)) => result,
            Some(Err(join)) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            Some(Err(_)) => Ok(()),
            None => {
                tracing::warn!(
                    waited = ?SHUTDOWN_GRACE,
                    "client connections still open after the stop; closing them"
                );
                serving.abort();
                Ok(())
            }
        };
        timers.abort();
        // The write in flight finishes, then the last positions go, within the deadline.
        let _ = stop_flushes.send(());
        let last = async {
            let _ = flushes.await;
            self.flush_journal().await
        };
        let flushed = match tokio::time::timeout(SHUTDOWN_FLUSH_WAIT, last).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(ServeError::LastFlush(error.to_string())),
            Err(_) => Err(ServeError::LastFlush(format!(
                "the journal's disk did not take them within {SHUTDOWN_FLUSH_WAIT:?}"
            ))),
        };
        if let (Err(_), Err(error)) = (&result, &flushed) {
            tracing::error!(%error, "and as the server failed");
        }
        result?;
        flushed
    }

    /// Makes the journal's next write fail as a full disk would (tests only).
    #[cfg(test)]
    pub(crate) fn fail_next_journal_write(&self) {
        self.journal.fail_next_write();
    }

    fn check_token(&self, token: Option<&SessionToken>) -> Result<SessionToken, Status> {
        let token = token.ok_or_else(|| Status::invalid_argument("session token is missing"))?;
        if token.incarnation != self.incarnation {
            return Err(Status::failed_precondition(format!(
                "session {} belongs to an earlier run of the coordinator; open the session again",
                token.session_id
            )));
        }
        Ok(*token)
    }

    /// Refuses `token` (one [`check_token`](Self::check_token) passed) when its session was
    /// opened again since (a late update or close of an earlier opening, whose credits,
    /// acknowledgements or close are not the current client's).
    fn check_opening(core: &Coordinator, token: &SessionToken) -> Result<(), Status> {
        let current = core
            .session_opening(SessionId(token.session_id))
            .map_err(coordinator_status)?;
        if token.opening != current {
            return Err(Status::failed_precondition(format!(
                "session {} was opened again (opening {current}) since opening {} this call \
                 belongs to; it is not applied (if this repeats: another client reads the same \
                 job, rank and epoch, as two runs of identical settings on one coordinator do; \
                 give each run its own seed)",
                token.session_id, token.opening
            )));
        }
        Ok(())
    }

    fn token(&self, session: SessionId, opening: u32) -> SessionToken {
        SessionToken {
            incarnation: self.incarnation,
            session_id: session.0,
            opening,
        }
    }

    fn worker_infos(state: &State) -> Vec<WorkerInfo> {
        state
            .workers
            .values()
            .map(|w| WorkerInfo {
                worker_id: w.id,
                data_address: w.data_address.clone(),
            })
            .collect()
    }
}

/// Why [`CoordinatorService::serve`] ended with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The server failed.
    #[error(transparent)]
    Transport(#[from] tonic::transport::Error),
    /// The journal did not take the last acknowledged positions as the service stopped.
    #[error(
        "the coordinator stopped without writing its last positions to the journal ({0}): the \
         steps acknowledged since the last write that landed will be redone after a restart"
    )]
    LastFlush(String),
}

/// Replaced instances kept per address (a restarted worker adds one each time).
const REPLACED_KEPT: usize = 64;

/// How long a stopping coordinator waits for its clients' and workers' connections to end
/// before it closes them (a client's update stream lasts as long as its session).
pub(crate) const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How long a stopping coordinator waits for its journal's last write.
const SHUTDOWN_FLUSH_WAIT: Duration = Duration::from_secs(10);
