//! A data server that only describes jobs: every `DescribeJob` gets one fixed answer, and a
//! `Subscribe` stream stays open and sends nothing. The coordinator checks each job it registers
//! by asking a worker to describe it: `stoker bench coordinator-grpc` puts this behind its
//! simulated workers, and the services' in-process tests do the same.

use stoker_proto::v1::worker_data_server::WorkerData;
use stoker_proto::v1::{Batch, DescribeJobRequest, DescribeJobResponse, SubscribeRequest};
use tonic::{Request, Response, Status};

/// The data service of [the module](self), answering `DescribeJob` with its response.
#[derive(Debug, Clone)]
pub struct DescribeOnly(pub DescribeJobResponse);

#[tonic::async_trait]
impl WorkerData for DescribeOnly {
    async fn describe_job(
        &self,
        _request: Request<DescribeJobRequest>,
    ) -> Result<Response<DescribeJobResponse>, Status> {
        Ok(Response::new(self.0.clone()))
    }

    type SubscribeStream = tokio_stream::Pending<Result<Batch, Status>>;

    async fn subscribe(
        &self,
        _request: Request<SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        Ok(Response::new(tokio_stream::pending()))
    }
}
