//! Opening an epoch's session at the coordinator, registering the job again where the
//! coordinator forgot it, and the worker grace: how long batches may be wanted with no worker
//! stream open (every worker gone, or the coordinator not answering) before the consumer is
//! told.

use std::sync::atomic::Ordering;
use std::time::Instant;

use stoker_proto::v1::coordinator_client::CoordinatorClient;
use stoker_proto::v1::{
    OpenSessionRequest, RegisterJobRequest, RegisterJobResponse, SessionToken, WorkerInfo,
};
use stoker_rpc::error_kinds;
use stoker_rpc::transport::{Backoff, RpcChannel};
use tonic::Code;

use super::driver::Driver;
use super::job_label;
use crate::error::{error_from_status, Error, ErrorKind};

impl Driver {
    /// Why the job registered again (`registered`) is not the one this loader reads: the
    /// workers describe its dataset with another step count or fingerprint now, so reading on
    /// would skip or repeat samples. `None` when it is the same.
    fn changed_dataset(&self, registered: &RegisterJobResponse) -> Option<String> {
        if registered.steps_per_epoch != self.steps {
            return Some(format!(
                "the coordinator had forgotten the job, and its workers now describe the dataset \
                 with {} steps per epoch where this loader reads {}: the dataset changed under \
                 the job; start a new loader",
                registered.steps_per_epoch, self.steps
            ));
        }
        match &self.dataset_fingerprint {
            Some(before)
                if !registered.dataset_fingerprint.is_empty()
                    && registered.dataset_fingerprint != *before =>
            {
                Some(format!(
                    "the coordinator had forgotten the job, and its workers now fingerprint the \
                     dataset {} where this loader read {before}: the dataset changed under the \
                     job; start a new loader",
                    registered.dataset_fingerprint
                ))
            }
            _ => None,
        }
    }

    fn register_request(&self) -> RegisterJobRequest {
        RegisterJobRequest {
            spec: Some(self.spec.clone()),
            weight: self.job_weight,
        }
    }

    pub(super) async fn open(
        &mut self,
        client: &mut CoordinatorClient<RpcChannel>,
        floor: u64,
        backoff: &mut Backoff,
    ) -> Option<(SessionToken, Vec<WorkerInfo>, u64)> {
        loop {
            if !self.take_requests() {
                return None;
            }
            let opened = client
                .open_session(OpenSessionRequest {
                    job_id: self.job_id(),
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
                    let Some(token) = response.session else {
                        // Said, not only stopped on: the run would end naming no cause.
                        let _ = self.batches.send(Err(Error::Remote {
                            kind: ErrorKind::Internal,
                            context: format!("opening a session at coordinator {}", self.address),
                            message: "the coordinator's answer holds no session token (a \
                                      coordinator of another version, or a proxy that \
                                      changed the answer)"
                                .into(),
                        }));
                        return None;
                    };
                    return Some((token, response.workers, response.workers_version));
                }
                Err(status) if status.code() == Code::NotFound => {
                    // The coordinator forgot the job (retired after its clients were gone, or
                    // its journal lost): registered again, over the same dataset.
                    tracing::warn!(%status, "coordinator does not know the job; registering it again");
                    match client.register_job(self.register_request()).await {
                        Ok(r) => {
                            let r = r.into_inner();
                            if let Some(changed) = self.changed_dataset(&r) {
                                let _ = self.batches.send(Err(Error::Remote {
                                    kind: ErrorKind::Dataset,
                                    context: format!(
                                        "registering job {} again at coordinator {}",
                                        self.job_id(),
                                        self.address
                                    ),
                                    message: changed,
                                }));
                                return None;
                            }
                            self.job_id.store(r.job_id, Ordering::Relaxed);
                        }
                        Err(status) if error_kinds::is_transient(&status) => {
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
                    if error_kinds::is_transient(&status)
                        || status.code() == Code::ResourceExhausted =>
                {
                    // No session, so no worker stream: batches wanted meanwhile count against
                    // the worker grace, as with every worker gone (a coordinator down for good
                    // would otherwise be waited on until the loader's own timeout). Not a
                    // coordinator at its session cap: it answers, and frees places.
                    if error_kinds::is_transient(&status) && self.requested.min(self.steps) > floor
                    {
                        self.unserved_since.get_or_insert_with(Instant::now);
                        if self.unserved_too_long(Some(&status), None) {
                            return None;
                        }
                    }
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
    /// grace; if so the consumer is told. `coordinator_down` is the coordinator's last answer
    /// when it is what stands between the client and the workers; `unreachable` names the
    /// workers the coordinator lists whose streams did not open, and why.
    pub(super) fn unserved_too_long(
        &mut self,
        coordinator_down: Option<&tonic::Status>,
        unreachable: Option<String>,
    ) -> bool {
        let Some(since) = self.unserved_since else {
            return false;
        };
        if since.elapsed() < self.worker_grace {
            return false;
        }
        let cause = match (coordinator_down, unreachable) {
            (None, None) => "no worker stream is open; start stoker-worker daemons or raise \
                             worker_grace"
                .to_string(),
            (None, Some(workers)) => format!(
                "no worker stream is open, and the coordinator lists workers this client \
                 cannot open one to: {workers} (a worker that ended stays listed until the \
                 coordinator finds it silent; one that runs may advertise an address this \
                 client cannot reach: check its --advertise)"
            ),
            (Some(status), _) => format!(
                "the coordinator does not answer ({}: {}), and the workers are reached \
                 through it; start it again (on its --state it resumes the job) or raise \
                 worker_grace",
                status.code(),
                status.message()
            ),
        };
        let error = Error::WorkerUnavailable {
            job: format!(
                "{} (id {}, rank {})",
                job_label(&self.spec),
                self.job_id(),
                self.rank
            ),
            coordinator: self.address.clone(),
            unserved: since.elapsed(),
            grace: self.worker_grace,
            cause,
        };
        tracing::error!(%error, "no worker serves the job");
        let _ = self.batches.send(Err(error));
        true
    }
}
