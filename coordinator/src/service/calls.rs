//! The coordinator's calls (`stoker.v1.Coordinator`): workers register, heartbeat, lease, report
//! and leave; clients register jobs and open, update and close their sessions. Each takes the
//! service's lock for a few microseconds and never across an `.await`; a lease call waits for
//! work outside it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stoker_proto::v1::coordinator_server;
use stoker_proto::v1::{
    CloseSessionRequest, CloseSessionResponse, GetJobRequest, GetJobResponse, HeartbeatRequest,
    HeartbeatResponse, LeaseRequest, LeaseResponse, LeaveRequest, LeaveResponse,
    OpenSessionRequest, OpenSessionResponse, RegisterJobRequest, RegisterJobResponse,
    RegisterWorkerRequest, RegisterWorkerResponse, ReportRequest, ReportResponse, SessionToken,
    SessionUpdateRequest, SessionUpdateResponse, TaskLease,
};
use stoker_rpc::transport;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use super::{job_key, lock, CoordinatorService, SessionEntry};
use crate::client_reports::{client_snapshot, job_name};
use crate::dashboard_feed::rank_threads;
use crate::registry::{ClientEntry, WorkerEntry};
use crate::requests::validate_spec;
use crate::status::coordinator_status;
use crate::{CoordinatorError, JobId, Lease, LeaseId, SessionId, Step, WorkerId};
use stoker_dashboard::LoaderMonitor;

/// How long the figures a session of a (job, rank) reported hold off an older report of
/// another session of it: a few of a client's report periods (half a second).
const REPORTS_OVERLAP: Duration = Duration::from_secs(3);

/// Most waiting lease calls one grant wakes (one per credit up to this).
const MAX_WAKES: u64 = 64;

/// Most steps one session update may acknowledge. A client acknowledges what arrived since its
/// last update (a few hundred at most before it waits for an answer) and, after a reopen, what
/// it holds beyond its position (its prefetch): one acknowledging millions (a broken or
/// hostile client) would hold the coordinator's lock, every other job's calls with it, for
/// seconds.
pub(crate) const MAX_ACKS_PER_UPDATE: usize = 1 << 16;

fn task_lease(lease: &Lease, incarnation: u64) -> TaskLease {
    TaskLease {
        lease_id: lease.lease_id.0,
        job_id: lease.task.job.0,
        epoch: lease.task.epoch,
        rank: lease.task.rank,
        step: lease.task.step.0,
        session: Some(SessionToken {
            incarnation,
            session_id: lease.session.0,
            opening: lease.opening,
        }),
    }
}

#[tonic::async_trait]
impl coordinator_server::Coordinator for CoordinatorService {
    async fn register_worker(
        &self,
        request: Request<RegisterWorkerRequest>,
    ) -> Result<Response<RegisterWorkerResponse>, Status> {
        let request = request.into_inner();
        let address = request.data_address.trim();
        if !transport::is_host_port(address) {
            return Err(Status::invalid_argument(format!(
                "data_address {address:?} is not host:port (an IP address or a DNS name)"
            )));
        }
        let mut state = lock(&self.state);
        let requeued = state.replace_workers_at(address, request.instance)?;
        let id = state.core.register_worker(Instant::now());
        state.worker_joined(WorkerEntry {
            id: id.0,
            data_address: address.to_string(),
            instance: request.instance,
            threads: request.threads,
            data_roots: request.data_roots,
            registered_at: Instant::now(),
            completed: 0,
            failed: 0,
            bad_samples: 0,
            busy_ns: 0,
        });
        tracing::info!(
            worker = id.0,
            address,
            threads = request.threads,
            "worker registered"
        );
        drop(state);
        if requeued > 0 {
            self.work.notify_waiters();
        }
        Ok(Response::new(RegisterWorkerResponse {
            worker_id: self.wire_worker(id)?,
            incarnation: self.incarnation,
            lease_timeout_ms: self.config.core.lease_timeout.as_millis() as u64,
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        let worker = self.core_worker(request.into_inner().worker_id)?;
        lock(&self.state)
            .core
            .heartbeat(worker, Instant::now())
            .map_err(coordinator_status)?;
        Ok(Response::new(HeartbeatResponse {}))
    }

    async fn lease(
        &self,
        request: Request<LeaseRequest>,
    ) -> Result<Response<LeaseResponse>, Status> {
        self.lease_one(request.into_inner())
            .await
            .map(Response::new)
    }

    type LeaseStreamStream = StreamAnswers<LeaseResponse>;

    async fn lease_stream(
        &self,
        request: Request<Streaming<LeaseRequest>>,
    ) -> Result<Response<Self::LeaseStreamStream>, Status> {
        Ok(Response::new(self.lease_answers(request.into_inner())))
    }

    async fn report(
        &self,
        request: Request<ReportRequest>,
    ) -> Result<Response<ReportResponse>, Status> {
        let request = request.into_inner();
        let worker = self.core_worker(request.worker_id)?;
        self.apply_report(worker, &request)?;
        Ok(Response::new(ReportResponse {}))
    }

    async fn leave(
        &self,
        request: Request<LeaveRequest>,
    ) -> Result<Response<LeaveResponse>, Status> {
        let worker = self.core_worker(request.into_inner().worker_id)?;
        let mut state = lock(&self.state);
        let requeued = state
            .core
            .leave_worker(worker)
            .map_err(coordinator_status)?;
        if let Some(entry) = state.worker_gone(worker.0) {
            tracing::info!(
                worker = worker.0,
                address = %entry.data_address,
                requeued,
                "worker left; the tasks it held go back to the queue"
            );
        }
        drop(state);
        if requeued > 0 {
            self.work.notify_waiters();
        }
        Ok(Response::new(LeaveResponse {
            requeued_tasks: requeued,
        }))
    }

    async fn get_job(
        &self,
        request: Request<GetJobRequest>,
    ) -> Result<Response<GetJobResponse>, Status> {
        let job = JobId(request.into_inner().job_id);
        let state = lock(&self.state);
        let spec = state
            .core
            .job_spec(job)
            .map_err(coordinator_status)?
            .clone();
        let steps_per_epoch = state
            .core
            .steps_per_epoch(job)
            .map_err(coordinator_status)?;
        let described = state.descriptions.get(&job.0);
        let failure = state.core.last_failure(job);
        Ok(Response::new(GetJobResponse {
            last_failure: failure
                .map(|(reason, _)| reason.to_string())
                .unwrap_or_default(),
            last_failure_age_s: failure.map_or(0, |(_, age)| age.as_secs()),
            spec: Some(spec),
            steps_per_epoch,
            num_samples: described.map_or(0, |described| described.num_samples),
            dataset_fingerprint: described
                .map(|described| described.dataset_fingerprint.clone())
                .unwrap_or_default(),
            tokenizer_digests: described
                .map(|described| described.tokenizer_digests.clone())
                .unwrap_or_default(),
        }))
    }

    async fn register_job(
        &self,
        request: Request<RegisterJobRequest>,
    ) -> Result<Response<RegisterJobResponse>, Status> {
        let RegisterJobRequest { spec, weight } = request.into_inner();
        let spec = spec.ok_or_else(|| Status::invalid_argument("job spec is missing"))?;
        validate_spec(&spec)?;
        self.check_shard(&spec)?;
        let spec = job_key(spec);
        let (id, described) = self.register(spec, weight).await?;
        Ok(Response::new(RegisterJobResponse {
            job_id: id.0,
            steps_per_epoch: described.steps_per_epoch,
            num_samples: described.num_samples,
            batch_bytes: described.batch_bytes,
            class_names: described.class_names,
            dataset_fingerprint: described.dataset_fingerprint,
        }))
    }

    async fn open_session(
        &self,
        request: Request<OpenSessionRequest>,
    ) -> Result<Response<OpenSessionResponse>, Status> {
        let request = request.into_inner();
        let job = JobId(request.job_id);
        let mut state = lock(&self.state);
        let session = state
            .core
            .open_session_at(
                job,
                request.rank,
                request.epoch,
                Step(request.start_step),
                !request.resume_from_journal,
            )
            .map_err(coordinator_status)?;
        let position = state
            .core
            .acknowledged_position(session)
            .map_err(coordinator_status)?;
        let opening = state
            .core
            .session_opening(session)
            .map_err(coordinator_status)?;
        let steps_per_epoch = state
            .core
            .steps_per_epoch(job)
            .map_err(coordinator_status)?;
        state.sessions.insert(
            session.0,
            SessionEntry {
                job: job.0,
                rank: request.rank,
                epoch: request.epoch,
                steps_per_epoch,
                last_seen: Instant::now(),
            },
        );
        let workers = Self::worker_infos(&state);
        tracing::info!(
            session = session.0,
            job = job.0,
            rank = request.rank,
            epoch = request.epoch,
            position = position.0,
            "session opened"
        );
        Ok(Response::new(OpenSessionResponse {
            session: Some(self.token(session, opening)),
            acknowledged_position: position.0,
            steps_per_epoch,
            workers,
            workers_version: state.workers_version,
        }))
    }

    async fn update_session(
        &self,
        request: Request<SessionUpdateRequest>,
    ) -> Result<Response<SessionUpdateResponse>, Status> {
        let request = request.into_inner();
        let known = request.workers_version;
        self.apply_update(&request, known).map(Response::new)
    }

    type UpdateSessionStreamStream = StreamAnswers<SessionUpdateResponse>;

    async fn update_session_stream(
        &self,
        request: Request<Streaming<SessionUpdateRequest>>,
    ) -> Result<Response<Self::UpdateSessionStreamStream>, Status> {
        Ok(Response::new(self.update_answers(request.into_inner())))
    }

    async fn close_session(
        &self,
        request: Request<CloseSessionRequest>,
    ) -> Result<Response<CloseSessionResponse>, Status> {
        let token = self.check_token(request.into_inner().session.as_ref())?;
        let id = token.session_id;
        let mut state = lock(&self.state);
        Self::check_opening(&state.core, &token)?;
        if let Some(closed) = state.sessions.remove(&id) {
            // The job's description answers registrations for a while after its last session.
            if let Some(at) = state.described_at.get_mut(&closed.job) {
                *at = Instant::now();
            }
        }
        state
            .core
            .close_session(SessionId(id))
            .map_err(coordinator_status)?;
        Ok(Response::new(CloseSessionResponse {}))
    }
}

/// Answers on a stream, as the service's streaming calls send them.
pub type StreamAnswers<T> =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

impl CoordinatorService {
    /// The answers `LeaseStream` gives to a worker's `requests`: each taken in turn on the
    /// stream's own task, its long poll included, as [`Lease`](coordinator_server::Coordinator::lease)
    /// answers it. tonic ends the stream at the first error, with its status. Public so a
    /// proxy in front of the service (a test's) can serve the stream from requests it has read.
    pub fn lease_answers(
        &self,
        requests: impl tokio_stream::Stream<Item = Result<LeaseRequest, Status>> + Send + 'static,
    ) -> StreamAnswers<LeaseResponse> {
        let service = self.clone();
        Box::pin(requests.then(move |request| {
            let service = service.clone();
            async move { service.lease_one(request?).await }
        }))
    }

    /// The answers `UpdateSessionStream` gives to a client's `updates`: each applied as it
    /// comes, on the stream's own task (no task or channel more), and answered when it asks
    /// (not `quiet`) or brings a workers' list this stream has not sent. The stream remembers
    /// the list it sent last: a quiet update sent before its client read that answer still
    /// names the older one. Public for the same reason as [`Self::lease_answers`].
    pub fn update_answers(
        &self,
        updates: impl tokio_stream::Stream<Item = Result<SessionUpdateRequest, Status>> + Send + 'static,
    ) -> StreamAnswers<SessionUpdateResponse> {
        let service = self.clone();
        let mut listed = None;
        Box::pin(updates.filter_map(move |update| {
            let update = match update {
                Ok(update) => update,
                Err(status) => return Some(Err(status)),
            };
            let known = listed.unwrap_or(update.workers_version);
            match service.apply_update(&update, known) {
                Ok(answer) => {
                    // Listed (the list may be empty: every worker gone) when it changed since.
                    let lists = answer.workers_version != known;
                    if lists {
                        listed = Some(answer.workers_version);
                    }
                    (lists || !update.quiet).then_some(Ok(answer))
                }
                Err(status) => Some(Err(status)),
            }
        }))
    }

    /// A worker's lease (by `Lease`, or on its `LeaseStream`): its report first, then up to
    /// `max_tasks` tasks, waiting up to `wait_ms` (capped) for one when there is none.
    async fn lease_one(&self, request: LeaseRequest) -> Result<LeaseResponse, Status> {
        let worker = self.core_worker(request.worker_id)?;
        if let Some(report) = &request.report {
            self.apply_report(worker, report)?;
        }
        let wait = Duration::from_millis(u64::from(request.wait_ms));
        let deadline = Instant::now() + wait.min(self.config.max_lease_wait);
        let max_tasks = request.max_tasks as usize;
        let mut leases = Vec::new();
        let mut waiting: usize;
        loop {
            // Register for a wake-up before looking, so a grant in between is not missed.
            let notified = self.work.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut state = lock(&self.state);
                let before = leases.len();
                let now = Instant::now();
                waiting = state.core.waiting_sessions_besides(&request.full_sessions);
                state
                    .core
                    .lease_into(worker, max_tasks, &request.full_sessions, now, &mut leases)
                    .map_err(coordinator_status)?;
                // Kept for the dashboard alone (its refresh prunes it).
                if self.dashboard.is_some() {
                    for lease in &leases[before..] {
                        let job = state.serving.entry(lease.task.job.0).or_default();
                        job.insert(worker.0, now);
                    }
                }
            }
            let now = Instant::now();
            if !leases.is_empty() || now >= deadline {
                break;
            }
            let _ = tokio::time::timeout(deadline - now, notified).await;
        }
        Ok(LeaseResponse {
            tasks: leases
                .iter()
                .map(|l| task_lease(l, self.incarnation))
                .collect(),
            waiting_sessions: u32::try_from(waiting).unwrap_or(u32::MAX),
        })
    }

    /// A client's update of its session (acknowledgements, credits, stats), answered with its
    /// position and, when they changed since the version `known` (what the client holds), the
    /// live workers.
    fn apply_update(
        &self,
        request: &SessionUpdateRequest,
        known: u64,
    ) -> Result<SessionUpdateResponse, Status> {
        let token = self.check_token(request.session.as_ref())?;
        if request.acknowledged.len() > MAX_ACKS_PER_UPDATE {
            return Err(Status::invalid_argument(format!(
                "a session update acknowledges {} steps; at most {MAX_ACKS_PER_UPDATE} go in one",
                request.acknowledged.len()
            )));
        }
        let id = token.session_id;
        let session = SessionId(id);
        let mut state = lock(&self.state);
        Self::check_opening(&state.core, &token)?;
        for step in &request.acknowledged {
            state
                .core
                .acknowledge(session, Step(*step))
                .map_err(coordinator_status)?;
        }
        if request.grant_credits > 0 {
            state
                .core
                .grant_credits(session, request.grant_credits)
                .map_err(coordinator_status)?;
        }
        // Steps taken back from workers the client cannot reach (by the ids of the list this
        // run gave the session; one it never gave is left out): ready again, as granted ones.
        let taken_back = match &request.unreachable_workers {
            Some(set) => {
                let workers: Vec<WorkerId> = set.workers.iter().map(|&id| WorkerId(id)).collect();
                (state.core.set_unreachable(session, &workers)).map_err(coordinator_status)?
            }
            None => 0,
        };
        let position = state
            .core
            .acknowledged_position(session)
            .map_err(coordinator_status)?;
        let now = Instant::now();
        let entry = state.sessions.get_mut(&id).map(|entry| {
            entry.last_seen = now;
            (entry.job, entry.rank, entry.epoch, entry.steps_per_epoch)
        });
        // Two sessions of one (job, rank) report (a loader's next epoch opened early, two runs
        // of the same settings): a report older than the one kept from the other session (its
        // client's time shorter) is dropped, so the figures never go back (`/metrics`'
        // counters went down, and the fleet's demand read nothing) unless the other's went
        // quiet.
        let stats = request.stats.as_ref().filter(|stats| {
            let kept = entry.and_then(|(job, rank, _, _)| state.clients.get(&(job, rank)));
            !kept.is_some_and(|kept| {
                kept.session != id
                    && kept.stats.elapsed_ns > stats.elapsed_ns
                    && now.duration_since(kept.at) < REPORTS_OVERLAP
            })
        });
        // A new (job, rank) is shown on the dashboard once the state's lock is let go: its
        // registry's lock is held while a page's figures are written out.
        let mut to_show = None;
        if let (Some((job, rank, _, _)), Some(stats)) = (entry, stats) {
            let threads = rank_threads(
                (job, rank),
                &state.serving,
                &state.workers,
                &state.clients,
                now,
            );
            let snapshot = client_snapshot(stats, threads);
            match state.monitors.get(&(job, rank)) {
                Some(latest) => {
                    *latest.lock().unwrap_or_else(|p| p.into_inner()) = snapshot;
                }
                None => {
                    let latest = Arc::new(Mutex::new(snapshot));
                    state.monitors.insert((job, rank), latest.clone());
                    if self.dashboard.is_some() {
                        to_show = Some((job_name(&state.core, job), rank, latest));
                    }
                }
            }
        }
        if let (Some((job, rank, epoch, steps_per_epoch)), Some(stats)) = (entry, stats) {
            state.clients.insert(
                (job, rank),
                ClientEntry {
                    job,
                    rank,
                    epoch,
                    stats: *stats,
                    acknowledged_position: position.0,
                    steps_per_epoch,
                    at: now,
                    session: id,
                },
            );
        }
        let workers_version = state.workers_version;
        let workers = if known == workers_version {
            Vec::new()
        } else {
            Self::worker_infos(&state)
        };
        drop(state);
        if let (Some(dashboard), Some((name, rank, latest))) = (&self.dashboard, to_show) {
            dashboard.register_job(&name, rank, LoaderMonitor::reported(latest));
        }
        // One waiting lease call woken per credit or step taken back, not all of them: with
        // thousands of workers waiting, waking each for every credit costs the coordinator
        // O(workers) per grant. A call woken for work another took waits again; a call dropped
        // before it ran hands its wake-up on (tokio's `Notify`).
        let wakes = request.grant_credits.saturating_add(taken_back);
        for _ in 0..wakes.min(MAX_WAKES) {
            self.work.notify_one();
        }
        Ok(SessionUpdateResponse {
            acknowledged_position: position.0,
            workers,
            workers_version,
            sequence: request.sequence,
        })
    }

    /// A worker's report of its leases' outcomes (by `Report`, or with a `Lease` call).
    fn apply_report(&self, worker: WorkerId, request: &ReportRequest) -> Result<(), Status> {
        // One line per report, off the state's lock (each task's step is logged at debug level).
        if let Some(first) = request.failed.first() {
            tracing::warn!(worker = worker.0, failed = request.failed.len(), reason = %first.reason, "tasks failed on a worker; to be requeued (the first one's reason)");
        }
        let mut state = lock(&self.state);
        let mut requeued = false;
        // A lease never issued or another worker's: the rest still counts, the caller hears of it.
        let mut refused = None;
        let mut refuse = |error: CoordinatorError| match error {
            CoordinatorError::UnknownWorker(_) | CoordinatorError::WorkerExpired(_) => Err(error),
            error => {
                tracing::warn!(%error, worker = worker.0, "lease report refused");
                refused.get_or_insert(error);
                Ok(())
            }
        };
        for lease in &request.completed {
            if let Err(error) = state.core.complete(worker, LeaseId(*lease)) {
                refuse(error).map_err(coordinator_status)?;
            }
        }
        for failed in &request.failed {
            let lease = LeaseId(failed.lease_id);
            let failed = match failed.unclaimed {
                true => state.core.fail_unclaimed(worker, lease, &failed.reason),
                false => state.core.fail(worker, lease, &failed.reason),
            };
            match failed {
                Ok(_) => requeued = true,
                Err(error) => refuse(error).map_err(coordinator_status)?,
            }
        }
        if let Some(entry) = state.workers.get_mut(&worker.0) {
            entry.completed += request.completed.len() as u64;
            entry.failed += request.failed.len() as u64;
            entry.bad_samples = entry.bad_samples.saturating_add(request.bad_samples);
            entry.busy_ns = entry.busy_ns.saturating_add(request.busy_ns);
        }
        drop(state);
        if requeued {
            self.work.notify_waiters();
        }
        match refused {
            Some(error) => Err(coordinator_status(error)),
            None => Ok(()),
        }
    }
}
