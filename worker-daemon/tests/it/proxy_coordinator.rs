//! The coordinator service behind a proxy a test controls. As an *older* build it refuses the
//! update and lease streams as unimplemented (what tonic answers for a method it does not
//! know), and clients and workers must go on with a call each; *recording*, it passes every
//! call through, keeps what each session update asked of the coordinator, may hold each lease
//! request a while, and holds the answers about the jobs a test names until it lets them go; it
//! may also register workers and refuse all their leases.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stoker_coordinator::{CoordinatorService, StreamAnswers};
use stoker_proto::v1::coordinator_server::{self, CoordinatorServer};
use stoker_proto::v1::*;
use stoker_rpc::network::Connection;
use stoker_rpc::transport;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

/// How many times each stream was refused: (update streams, lease streams).
#[derive(Clone, Default)]
pub struct Refusals(Arc<(AtomicUsize, AtomicUsize)>);

impl Refusals {
    pub fn counts(&self) -> (usize, usize) {
        (
            self.0 .0.load(Ordering::Relaxed),
            self.0 .1.load(Ordering::Relaxed),
        )
    }
}

/// One session update as it reached the coordinator.
#[derive(Debug, Clone, PartialEq)]
pub struct Update {
    pub session: u64,
    /// Sent on the update stream (not by an `UpdateSession` call).
    pub streamed: bool,
    pub quiet: bool,
    /// It carried the client's figures.
    pub stats: bool,
    pub credits: u64,
    pub acks: usize,
}

/// The session updates forwarded so far, in the order they came, how long each of a
/// worker's lease requests is held before the coordinator takes it (a slow worker, so the
/// client waits with credits outstanding), and the jobs whose `GetJob` answers are held (a
/// worker's opening of them waits).
#[derive(Clone, Default)]
pub struct Recorded(
    Arc<Mutex<Vec<Update>>>,
    Duration,
    Arc<tokio::sync::watch::Sender<HashSet<u64>>>,
);

impl Recorded {
    /// Records, holding each lease request on a lease stream for `delay`.
    pub fn with_lease_delay(delay: Duration) -> Self {
        Self(Arc::default(), delay, Arc::default())
    }

    /// Holds every `GetJob` of `job` until [`release_job`](Self::release_job).
    pub fn hold_job(&self, job: u64) {
        self.2.send_modify(|held| {
            held.insert(job);
        });
    }

    pub fn release_job(&self, job: u64) {
        self.2.send_modify(|held| {
            held.remove(&job);
        });
    }

    pub fn updates(&self) -> Vec<Update> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn push(&self, update: &SessionUpdateRequest, streamed: bool) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Update {
                session: update.session.as_ref().map_or(0, |s| s.session_id),
                streamed,
                quiet: update.quiet,
                stats: update.stats.is_some(),
                credits: update.grant_credits,
                acks: update.acknowledged.len(),
            });
    }
}

/// What the proxy does with the streams.
#[derive(Clone)]
pub enum Proxy {
    /// Refuses both streams, counting each refusal.
    Older(Refusals),
    /// Passes everything through, recording each session update.
    Recording(Recorded),
    /// Passes everything through but the session token of each `OpenSession` answer.
    NoSessionToken,
    /// Registers workers, counting each registration, and refuses every lease (as a replica
    /// that does not know the worker would, behind a service that spreads calls).
    LeasesRefused(Arc<AtomicUsize>),
}

#[derive(Clone)]
pub struct Coordinator {
    current: CoordinatorService,
    proxy: Proxy,
}

impl Coordinator {
    pub fn new(current: CoordinatorService, proxy: Proxy) -> Self {
        Self { current, proxy }
    }
}

/// Serves `proxy` on `incoming` until `shutdown` (without the service's timers: nothing here
/// waits on a lease timeout).
pub async fn serve<IO, E>(
    proxy: Coordinator,
    incoming: impl tokio_stream::Stream<Item = Result<IO, E>> + Send + 'static,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error>
where
    IO: Connection,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    transport::server()
        .add_service(CoordinatorServer::new(proxy))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

fn refused_lease() -> Status {
    Status::failed_precondition("worker not registered here")
}

fn unknown(count: &AtomicUsize, method: &str) -> Status {
    count.fetch_add(1, Ordering::Relaxed);
    Status::unimplemented(format!("unknown method {method}"))
}

#[tonic::async_trait]
impl coordinator_server::Coordinator for Coordinator {
    async fn register_worker(
        &self,
        request: Request<RegisterWorkerRequest>,
    ) -> Result<Response<RegisterWorkerResponse>, Status> {
        if let Proxy::LeasesRefused(registrations) = &self.proxy {
            registrations.fetch_add(1, Ordering::Relaxed);
        }
        self.current.register_worker(request).await
    }

    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        self.current.heartbeat(request).await
    }

    async fn lease(
        &self,
        request: Request<LeaseRequest>,
    ) -> Result<Response<LeaseResponse>, Status> {
        if let Proxy::LeasesRefused(_) = &self.proxy {
            return Err(refused_lease());
        }
        self.current.lease(request).await
    }

    type LeaseStreamStream = StreamAnswers<LeaseResponse>;

    async fn lease_stream(
        &self,
        request: Request<Streaming<LeaseRequest>>,
    ) -> Result<Response<Self::LeaseStreamStream>, Status> {
        match &self.proxy {
            Proxy::Older(refusals) => Err(unknown(&refusals.0 .1, "LeaseStream")),
            Proxy::Recording(recorded) => {
                let delay = recorded.1;
                let requests = request.into_inner().then(move |lease| async move {
                    tokio::time::sleep(delay).await;
                    lease
                });
                Ok(Response::new(self.current.lease_answers(requests)))
            }
            Proxy::NoSessionToken => Ok(Response::new(
                self.current.lease_answers(request.into_inner()),
            )),
            Proxy::LeasesRefused(_) => Err(refused_lease()),
        }
    }

    async fn report(
        &self,
        request: Request<ReportRequest>,
    ) -> Result<Response<ReportResponse>, Status> {
        self.current.report(request).await
    }

    async fn leave(
        &self,
        request: Request<LeaveRequest>,
    ) -> Result<Response<LeaveResponse>, Status> {
        self.current.leave(request).await
    }

    async fn get_job(
        &self,
        request: Request<GetJobRequest>,
    ) -> Result<Response<GetJobResponse>, Status> {
        if let Proxy::Recording(recorded) = &self.proxy {
            let job = request.get_ref().job_id;
            let mut held = recorded.2.subscribe();
            let _ = held.wait_for(|held| !held.contains(&job)).await;
        }
        self.current.get_job(request).await
    }

    async fn register_job(
        &self,
        request: Request<RegisterJobRequest>,
    ) -> Result<Response<RegisterJobResponse>, Status> {
        self.current.register_job(request).await
    }

    async fn open_session(
        &self,
        request: Request<OpenSessionRequest>,
    ) -> Result<Response<OpenSessionResponse>, Status> {
        let mut answer = self.current.open_session(request).await?;
        if let Proxy::NoSessionToken = &self.proxy {
            answer.get_mut().session = None;
        }
        Ok(answer)
    }

    async fn update_session(
        &self,
        request: Request<SessionUpdateRequest>,
    ) -> Result<Response<SessionUpdateResponse>, Status> {
        if let Proxy::Recording(recorded) = &self.proxy {
            recorded.push(request.get_ref(), false);
        }
        self.current.update_session(request).await
    }

    type UpdateSessionStreamStream = StreamAnswers<SessionUpdateResponse>;

    async fn update_session_stream(
        &self,
        request: Request<Streaming<SessionUpdateRequest>>,
    ) -> Result<Response<Self::UpdateSessionStreamStream>, Status> {
        match &self.proxy {
            Proxy::Older(refusals) => Err(unknown(&refusals.0 .0, "UpdateSessionStream")),
            Proxy::Recording(recorded) => {
                let recorded = recorded.clone();
                let updates = request.into_inner().map(move |update| {
                    if let Ok(update) = &update {
                        recorded.push(update, true);
                    }
                    update
                });
                Ok(Response::new(self.current.update_answers(updates)))
            }
            Proxy::NoSessionToken | Proxy::LeasesRefused(_) => Ok(Response::new(
                self.current.update_answers(request.into_inner()),
            )),
        }
    }

    async fn close_session(
        &self,
        request: Request<CloseSessionRequest>,
    ) -> Result<Response<CloseSessionResponse>, Status> {
        self.current.close_session(request).await
    }
}
