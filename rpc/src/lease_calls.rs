//! A worker's lease calls to one coordinator: on one long-lived stream (`LeaseStream`), opened
//! with the first lease, or one `Lease` call each when the coordinator has no such stream (a
//! build from before it). A lease on the stream costs the coordinator no headers and no new
//! HTTP/2 stream, which is most of what a call costs it. The worker daemon leases through it,
//! and so do `stoker bench coordinator-grpc`'s simulated workers.

use crate::transport::RpcChannel;
use stoker_proto::v1::coordinator_client::CoordinatorClient;
use stoker_proto::v1::{LeaseRequest, LeaseResponse};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Code, Status, Streaming};

enum Way {
    /// Not opened yet: the first lease opens the stream.
    Unopened,
    /// The stream: requests go in `requests`, each answered in turn on `answers` (boxed: the
    /// other ways hold nothing).
    Stream {
        requests: mpsc::UnboundedSender<LeaseRequest>,
        answers: Box<Streaming<LeaseResponse>>,
    },
    /// A call per lease.
    Calls,
}

/// The lease calls of one worker to one coordinator.
pub struct LeaseCalls {
    client: CoordinatorClient<RpcChannel>,
    way: Way,
}

impl LeaseCalls {
    /// Leases through `client`; the stream opens with the first lease.
    pub fn new(client: CoordinatorClient<RpcChannel>) -> Self {
        Self {
            client,
            way: Way::Unopened,
        }
    }

    /// Leases as `request` says: its report first, then tasks (long poll). Not cancel-safe:
    /// an answer not read would be read as the next request's, so a lease loop awaits each to
    /// its end. An error ends the stream; the worker daemon then registers again and starts
    /// anew.
    pub async fn lease(&mut self, request: LeaseRequest) -> Result<LeaseResponse, Status> {
        if matches!(self.way, Way::Unopened) {
            self.way = self.open().await?;
        }
        match &mut self.way {
            Way::Stream { requests, answers } => {
                requests
                    .send(request)
                    .map_err(|_| Status::unavailable("the worker's lease stream is closed"))?;
                answers.message().await?.ok_or_else(|| {
                    Status::unavailable("the coordinator ended the worker's lease stream")
                })
            }
            Way::Calls | Way::Unopened => Ok(self.client.lease(request).await?.into_inner()),
        }
    }

    async fn open(&self) -> Result<Way, Status> {
        let (requests, receiver) = mpsc::unbounded_channel();
        let opened = self
            .client
            .clone()
            .lease_stream(UnboundedReceiverStream::new(receiver))
            .await;
        match opened {
            Ok(answers) => Ok(Way::Stream {
                requests,
                answers: Box::new(answers.into_inner()),
            }),
            Err(status) if status.code() == Code::Unimplemented => {
                tracing::debug!(%status, "the coordinator has no lease stream; one call per lease");
                Ok(Way::Calls)
            }
            Err(status) => Err(status),
        }
    }
}
