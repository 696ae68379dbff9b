//! A session's streams from the workers: each opened on its own task, landing every batch in a
//! slot of the session's queue as its bytes come, and telling the driver what happens.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use stoker_proto::v1::{SessionToken, SubscribeRequest, WorkerInfo};
use stoker_rpc::batch_wire;
use stoker_rpc::error_kinds;
use stoker_rpc::network::Network;
use stoker_rpc::security::ClientSecurity;
use stoker_rpc::transport::MAX_MESSAGE_BYTES;
use tokio::sync::mpsc;
use tonic::{Code, Status};

use crate::client::landing::{next_landed, Landed, SlotQueue};

/// What a worker stream tells the driver.
pub(super) enum Arrival {
    /// The stream is open.
    Opened { worker: u64 },
    Batch {
        batch: Box<Landed>,
        /// When the batch's bytes had arrived.
        received: Instant,
    },
    /// The batch of `step` the worker could not build (a bad sample under the fail policy; the
    /// status carries the step, [`error_kinds::failed_step`]): the consumer gets the error for
    /// that step and the epoch goes on, as in process. The worker's stream ended with it.
    BatchFailed {
        worker: u64,
        step: u64,
        status: Status,
    },
    /// The job the worker could not open ([`error_kinds::is_job_unopened`]), told to the
    /// consumer once no listed worker is left that has not sent it, or an error the worker sent
    /// without a step (one of an older worker's batches): the consumer gets it, and the
    /// session stops.
    Failed { worker: u64, status: Status },
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

/// A session's worker streams by worker: aborted when dropped, at the session's end or with
/// the session itself when its driver is cancelled (a stream left running would hold the
/// slots of the steps it was to land, and its subscription at the worker).
#[derive(Default)]
pub(super) struct Streams(pub(super) HashMap<u64, tokio::task::JoinHandle<()>>);

impl Drop for Streams {
    fn drop(&mut self) {
        for handle in self.0.values() {
            handle.abort();
        }
    }
}

/// Opens the worker's stream for the session and forwards what arrives, each batch landed in a
/// slot of `slots` as its bytes come.
pub(super) async fn stream_worker(
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
        Err(status) if error_kinds::is_refusal(&status) => {
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
            Err(status) => {
                // A stream that broke is lost, whatever step its status names: the step is
                // leased again rather than failed for good.
                let arrival = if matches!(
                    status.code(),
                    Code::Unavailable | Code::Unknown | Code::Cancelled
                ) {
                    lost(true, status)
                } else if let Some(step) = error_kinds::failed_step(&status) {
                    Arrival::BatchFailed {
                        worker: worker.worker_id,
                        step,
                        status,
                    }
                } else {
                    Arrival::Failed {
                        worker: worker.worker_id,
                        status,
                    }
                };
                let _ = arrivals.send(arrival);
                return;
            }
        }
    }
}
