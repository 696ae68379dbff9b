//! The worker's reports to the coordinator: its heartbeats, and the outcomes of its leases,
//! each report holding what finished since the last one (at most one per the report interval),
//! unless the lease loop's next call carries them first.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stoker_proto::v1::coordinator_client::CoordinatorClient;
use stoker_proto::v1::{FailedTask, HeartbeatRequest, ReportRequest};
use stoker_rpc::error_kinds;
use stoker_rpc::transport::RpcChannel;
use tokio::sync::mpsc;
use tonic::{Code, Status};

use super::{lock, Outcome, Shared};

pub(super) async fn heartbeat_loop(
    mut client: CoordinatorClient<RpcChannel>,
    worker_id: u64,
    lease_timeout_ms: u64,
    lost: mpsc::Sender<Status>,
) {
    let every = Duration::from_millis((lease_timeout_ms / 4).clamp(50, 5_000));
    loop {
        tokio::time::sleep(every).await;
        if let Err(status) = client.heartbeat(HeartbeatRequest { worker_id }).await {
            if !error_kinds::is_transient(&status) || status.code() == Code::Unavailable {
                let _ = lost.send(status).await;
                return;
            }
        }
    }
}

/// The report of the outcomes in `unreported` (taken), with the counts since the last report
/// that went through; `None` when there is nothing to report.
pub(super) fn take_report(
    worker_id: u64,
    shared: &Shared,
    unreported: &Mutex<Vec<Outcome>>,
) -> Option<ReportRequest> {
    let outcomes = std::mem::take(&mut *lock(unreported));
    if outcomes.is_empty() {
        return None;
    }
    let mut request = ReportRequest {
        worker_id,
        ..ReportRequest::default()
    };
    for outcome in outcomes {
        match outcome {
            Outcome::Completed(lease) => request.completed.push(lease),
            Outcome::Failed(lease_id, reason) => request.failed.push(FailedTask {
                lease_id,
                reason,
                unclaimed: false,
            }),
            Outcome::Unclaimed(lease_id, reason) => request.failed.push(FailedTask {
                lease_id,
                reason,
                unclaimed: true,
            }),
        }
    }
    // Taken now, put back when this report fails (a re-registered worker reports them under
    // its new id, once).
    request.bad_samples = shared.bad_samples.swap(0, Ordering::Relaxed);
    request.busy_ns = shared.busy_ns.swap(0, Ordering::Relaxed);
    Some(request)
}

/// Tasks whose outcome `report` carries.
pub(super) fn reported_tasks(report: &ReportRequest) -> usize {
    report.completed.len() + report.failed.len()
}

/// A report of `tasks` outcomes did not go through: the coordinator leases them again (its
/// sessions reopened, or the leases timed out), and the clients drop what they already have.
pub(super) fn unreported_lost(tasks: usize, status: &Status) {
    if tasks > 0 {
        tracing::warn!(tasks, %status, "a report did not reach the coordinator; it leases those tasks again");
    }
}

/// The counts of a report that did not go through, for the next one.
pub(super) fn put_back_counts(shared: &Shared, counts: Option<(u64, u64)>) {
    if let Some((bad, busy)) = counts {
        shared.bad_samples.fetch_add(bad, Ordering::Relaxed);
        shared.busy_ns.fetch_add(busy, Ordering::Relaxed);
    }
}

/// Reports the outcomes as they come, at most one report per `interval`: what comes meanwhile
/// waits in `unreported` for the report, unless a lease call takes it first. Ends when the
/// outcomes' senders are gone and all is reported, or when a report fails.
pub(super) async fn report_loop(
    mut client: CoordinatorClient<RpcChannel>,
    worker_id: u64,
    shared: Arc<Shared>,
    (mut outcomes, unreported): (mpsc::UnboundedReceiver<Outcome>, Arc<Mutex<Vec<Outcome>>>),
    interval: Duration,
    lost: mpsc::Sender<Status>,
) {
    let mut last = tokio::time::Instant::now();
    let mut open = true;
    while open {
        let Some(first) = outcomes.recv().await else {
            break;
        };
        lock(&unreported).push(first);
        // Each outcome goes where a lease call can take it as soon as it comes.
        let due = last + interval;
        while open {
            tokio::select! {
                () = tokio::time::sleep_until(due) => break,
                outcome = outcomes.recv() => match outcome {
                    Some(outcome) => lock(&unreported).push(outcome),
                    None => open = false,
                },
            }
        }
        let Some(request) = take_report(worker_id, &shared, &unreported) else {
            continue;
        };
        last = tokio::time::Instant::now();
        if !send_report(&mut client, &shared, request, &lost).await {
            return;
        }
    }
    // The last outcomes a lease call had not taken.
    if let Some(request) = take_report(worker_id, &shared, &unreported) {
        send_report(&mut client, &shared, request, &lost).await;
    }
}

/// Sends `request`; whether it went through. When not, its counts are kept for the next
/// report and the serving loop hears the coordinator is lost.
async fn send_report(
    client: &mut CoordinatorClient<RpcChannel>,
    shared: &Shared,
    request: ReportRequest,
    lost: &mpsc::Sender<Status>,
) -> bool {
    let counts = Some((request.bad_samples, request.busy_ns));
    let carried = reported_tasks(&request);
    let Err(status) = client.report(request).await else {
        return true;
    };
    put_back_counts(shared, counts);
    unreported_lost(carried, &status);
    let _ = lost.send(status).await;
    false
}
