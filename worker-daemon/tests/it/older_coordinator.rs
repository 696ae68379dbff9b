//! The coordinator service as a build from before the update and lease streams answers: those
//! two calls refused as unimplemented (what tonic answers for a method it does not know), every
//! other call the service's own. Clients and workers must go on with a call each.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use stoker_coordinator::CoordinatorService;
use stoker_proto::v1::coordinator_server::{self, CoordinatorServer};
use stoker_proto::v1::*;
use stoker_rpc::network::Connection;
use stoker_rpc::transport;
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

#[derive(Clone)]
pub struct Coordinator {
    current: CoordinatorService,
    refusals: Refusals,
}

impl Coordinator {
    pub fn new(current: CoordinatorService, refusals: Refusals) -> Self {
        Self { current, refusals }
    }
}

/// Serves `older` on `incoming` until `shutdown` (without the service's timers: nothing here
/// waits on a lease timeout).
pub async fn serve<IO, E>(
    older: Coordinator,
    incoming: impl tokio_stream::Stream<Item = Result<IO, E>> + Send + 'static,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error>
where
    IO: Connection,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    transport::server()
        .add_service(CoordinatorServer::new(older))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

fn unknown(count: &AtomicUsize, method: &str) -> Status {
    count.fetch_add(1, Ordering::Relaxed);
    Status::unimplemented(format!("unknown method {method}"))
}

type Answers<T> = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl coordinator_server::Coordinator for Coordinator {
    async fn register_worker(
        &self,
        request: Request<RegisterWorkerRequest>,
    ) -> Result<Response<RegisterWorkerResponse>, Status> {
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
        self.current.lease(request).await
    }

    type LeaseStreamStream = Answers<LeaseResponse>;

    async fn lease_stream(
        &self,
        _: Request<Streaming<LeaseRequest>>,
    ) -> Result<Response<Self::LeaseStreamStream>, Status> {
        Err(unknown(&self.refusals.0 .1, "LeaseStream"))
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
        self.current.open_session(request).await
    }

    async fn update_session(
        &self,
        request: Request<SessionUpdateRequest>,
    ) -> Result<Response<SessionUpdateResponse>, Status> {
        self.current.update_session(request).await
    }

    type UpdateSessionStreamStream = Answers<SessionUpdateResponse>;

    async fn update_session_stream(
        &self,
        _: Request<Streaming<SessionUpdateRequest>>,
    ) -> Result<Response<Self::UpdateSessionStreamStream>, Status> {
        Err(unknown(&self.refusals.0 .0, "UpdateSessionStream"))
    }

    async fn close_session(
        &self,
        request: Request<CloseSessionRequest>,
    ) -> Result<Response<CloseSessionResponse>, Status> {
        self.current.close_session(request).await
    }
}
