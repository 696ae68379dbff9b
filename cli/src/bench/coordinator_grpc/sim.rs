//! The simulated workers and clients of `stoker bench coordinator-grpc`, in the two ways the
//! control plane can talk:
//! - [`Control::Before`], as Stoker did until the update stream: a client answers each batch of
//!   arrivals at once with an `UpdateSession` call, whose answer lists every worker; a worker
//!   leases with a `Lease` call each and reports each lease's tasks right after leasing them;
//! - [`Control::After`], as the loader and the worker daemon do now: a client's updates go on
//!   its session's stream (`UpdateSessionStream`), held as the loader holds them (its
//!   `Hold`), naming the workers' list it holds so the answer lists them only when they
//!   changed, and quiet (unanswered) but for one whenever the loader's `ANSWER_AFTER_ACKS`
//!   acknowledgements are on the way, as the loader asks; a worker leases on its lease stream
//!   (`LeaseStream`, through the worker daemon's `stoker_rpc::lease_calls`), and its reports go with its next lease, or from a task of their own at
//!   most one per interval, whichever comes first.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use serde::Serialize;
use stoker_proto::v1::coordinator_client::CoordinatorClient;
use stoker_proto::v1::{
    LeaseRequest, ReportRequest, SessionToken, SessionUpdateRequest, SessionUpdateResponse,
    TaskLease,
};
use stoker_rpc::lease_calls::LeaseCalls;
use stoker_rpc::transport::RpcChannel;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::bench::Result;
use stoker_loader::session_updates::{Due, Hold, Pending, ANSWER_AFTER_ACKS};

/// How the simulators talk to the coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Control {
    /// A call per update, the full worker list in each answer, a report per lease.
    Before,
    /// The session's update stream, updates held for the interval and mostly unanswered, the
    /// workers listed only when they changed; leases on each worker's lease stream, reports
    /// riding them.
    After,
}

/// Least time between two reports of a worker, the way after (the worker daemon's default).
const REPORT_INTERVAL: Duration = Duration::from_millis(5);

/// What the simulators share.
pub struct Shared {
    pub stop: AtomicBool,
    pub measuring: AtomicBool,
    pub acknowledged: AtomicU64,
    pub lease_calls: AtomicU64,
    pub latencies_us: Mutex<Vec<u32>>,
    /// Each session's client, by its coordinator's incarnation and session id (session ids of
    /// two shards may coincide): the steps handed to it, with when.
    pub clients: HashMap<(u64, u64), mpsc::UnboundedSender<(u64, Instant)>>,
    pub control: Control,
    /// Longest an update of a session is held (`After`).
    pub interval: Duration,
    /// Set once the measurement is over.
    pub stopped: tokio::sync::watch::Receiver<bool>,
    /// Batches a second each rank consumes (0: each as it arrives).
    pub rank_rate: f64,
    /// Per batch, microseconds from its credit's grant to its arrival.
    pub served_us: Mutex<Vec<u32>>,
    /// When each session's credits were granted.
    pub grants: Grants,
    /// Per lease call that returned tasks, microseconds from when its work was there (the
    /// later of the call and the grant of its earliest task's credit) to its answer.
    pub ready_us: Mutex<Vec<u32>>,
}

/// When each session's credits were granted, in grant order. A session starts at step 0 and
/// its credit `k` (counted from 0) lets step `k` be leased, so a leased task's step finds the
/// grant that made its work, whichever worker leases it and in whatever order.
pub struct Grants(HashMap<(u64, u64), Mutex<Vec<Instant>>>);

impl Grants {
    /// The sessions `keys` (incarnation, session id), none granted yet.
    pub fn new(keys: impl IntoIterator<Item = (u64, u64)>) -> Self {
        Self(
            keys.into_iter()
                .map(|key| (key, Mutex::default()))
                .collect(),
        )
    }

    /// Notes `count` credits of `session` granted `at`.
    pub fn granted(&self, session: (u64, u64), count: u64, at: Instant) {
        if let Some(Ok(mut grants)) = self.0.get(&session).map(Mutex::lock) {
            grants.extend(std::iter::repeat_n(at, count as usize));
        }
    }

    /// When the credit that let `session`'s `step` be leased was granted.
    fn of(&self, session: (u64, u64), step: u64) -> Option<Instant> {
        let grants = self.0.get(&session)?.lock().ok()?;
        grants.get(usize::try_from(step).ok()?).copied()
    }
}

/// Lease ids handed on and not yet reported (`After`), shared by a worker's lease loop and its
/// reporter.
type Unreported = std::sync::Arc<Mutex<Vec<u64>>>;

/// The report of what `unreported` holds (taken), if anything.
fn take_report(worker_id: u64, unreported: &Unreported) -> Option<ReportRequest> {
    let completed = std::mem::take(&mut *unreported.lock().ok()?);
    (!completed.is_empty()).then(|| ReportRequest {
        worker_id,
        completed,
        ..ReportRequest::default()
    })
}

/// One simulated worker: lease, hand the steps to their clients, report.
pub async fn worker(
    channel: RpcChannel,
    worker_id: u64,
    batch: u32,
    shared: std::sync::Arc<Shared>,
) -> Result<()> {
    let mut client = CoordinatorClient::new(channel);
    let (mut latencies, mut ready) = (Vec::new(), Vec::new());
    let after = shared.control == Control::After;
    let unreported = Unreported::default();
    // After: the reporter, woken as lease ids are handed on.
    let (handed_on, wakes) = mpsc::unbounded_channel::<()>();
    let reporter = after.then(|| {
        let reports = (worker_id, unreported.clone(), wakes);
        tokio::spawn(report_loop(client.clone(), reports, REPORT_INTERVAL))
    });
    // After: the leases go on the worker's lease stream, as the worker daemon's do.
    let mut leases = after.then(|| LeaseCalls::new(client.clone()));
    while !shared.stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let request = LeaseRequest {
            worker_id,
            max_tasks: batch,
            // As the worker daemon waits.
            wait_ms: 1000,
            report: take_report(worker_id, &unreported),
            full_sessions: Vec::new(),
        };
        let tasks = match &mut leases {
            Some(leases) => leases.lease(request).await?.tasks,
            None => client.lease(request).await?.into_inner().tasks,
        };
        if tasks.is_empty() {
            continue;
        }
        let answered = Instant::now();
        let granted = tasks
            .iter()
            .filter_map(|task| shared.grants.of(session_of(task), task.step))
            .min();
        if shared.measuring.load(Ordering::Relaxed) {
            let micros = |from: Instant| {
                u32::try_from(answered.saturating_duration_since(from).as_micros())
                    .unwrap_or(u32::MAX)
            };
            latencies.push(micros(started));
            ready.push(micros(granted.map_or(started, |at| at.max(started))));
            shared.lease_calls.fetch_add(1, Ordering::Relaxed);
        }
        if !after {
            client
                .report(ReportRequest {
                    worker_id,
                    completed: tasks.iter().map(|t| t.lease_id).collect(),
                    ..ReportRequest::default()
                })
                .await?;
        }
        for task in tasks {
            if let Some(client) = shared.clients.get(&session_of(&task)) {
                let _ = client.send((task.step, Instant::now()));
            }
            if after {
                if let Ok(mut held) = unreported.lock() {
                    held.push(task.lease_id);
                }
                let _ = handed_on.send(());
            }
        }
    }
    drop(handed_on);
    if let Some(reporter) = reporter {
        reporter.await.map_err(|e| {
            crate::bench::Error::Failed(format!("a simulated worker's reports: {e}"))
        })??;
    }
    if let Ok(mut all) = shared.latencies_us.lock() {
        all.extend(latencies);
    }
    if let Ok(mut all) = shared.ready_us.lock() {
        all.extend(ready);
    }
    Ok(())
}

/// A leased task's session, as the simulators key it: its coordinator's incarnation and its
/// session id.
fn session_of(task: &TaskLease) -> (u64, u64) {
    task.session
        .map_or((0, u64::MAX), |s| (s.incarnation, s.session_id))
}

/// A worker's reports, at most one per `interval`, each holding what was handed on meanwhile
/// and not taken by a lease call.
async fn report_loop(
    mut client: CoordinatorClient<RpcChannel>,
    (worker_id, unreported, mut wakes): (u64, Unreported, mpsc::UnboundedReceiver<()>),
    interval: Duration,
) -> Result<()> {
    let mut last = tokio::time::Instant::now();
    while wakes.recv().await.is_some() {
        tokio::time::sleep_until(last + interval).await;
        while wakes.try_recv().is_ok() {}
        if let Some(request) = take_report(worker_id, &unreported) {
            last = tokio::time::Instant::now();
            client.report(request).await?;
        }
    }
    Ok(())
}

/// A client's way to the coordinator.
enum Updates {
    Calls(CoordinatorClient<RpcChannel>),
    Stream {
        requests: mpsc::UnboundedSender<SessionUpdateRequest>,
        answers: tonic::Streaming<SessionUpdateResponse>,
    },
}

impl Updates {
    /// Sends `request`; waits for its answer unless it is quiet (`None` then).
    async fn send(
        &mut self,
        request: SessionUpdateRequest,
    ) -> Result<Option<SessionUpdateResponse>> {
        match self {
            Self::Calls(client) => Ok(Some(client.update_session(request).await?.into_inner())),
            Self::Stream { requests, answers } => {
                let (quiet, sequence) = (request.quiet, request.sequence);
                requests
                    .send(request)
                    .map_err(|_| crate::bench::Error::Failed("an update stream closed".into()))?;
                if quiet {
                    return Ok(None);
                }
                // Answers to quiet updates before it (a changed workers' list) come first.
                loop {
                    let answer = answers.message().await?.ok_or_else(|| {
                        crate::bench::Error::Failed("the coordinator ended an update stream".into())
                    })?;
                    if answer.sequence >= sequence {
                        return Ok(Some(answer));
                    }
                }
            }
        }
    }
}

/// One simulated client (rank): acknowledges what arrives and consumes it, one batch per
/// `1 / rank_rate` seconds (at once when the rate is 0), a credit back for each batch
/// consumed, as the loader asks a step for each one its training takes. Before: an update as
/// soon as there is anything to send (the driver before the update stream); after: held as
/// the driver holds it now. Records, per batch, the time from its credit's grant (the update
/// that carried it sent) to the batch's arrival.
pub async fn client(
    channel: RpcChannel,
    (session, mut workers_version): (SessionToken, u64),
    credits: u64,
    mut arrivals: mpsc::UnboundedReceiver<(u64, Instant)>,
    shared: std::sync::Arc<Shared>,
) -> Result<()> {
    let mut updates = match shared.control {
        Control::Before => {
            workers_version = 0;
            Updates::Calls(CoordinatorClient::new(channel))
        }
        Control::After => {
            let (requests, receiver) = mpsc::unbounded_channel();
            let answers = CoordinatorClient::new(channel)
                .update_session_stream(UnboundedReceiverStream::new(receiver))
                .await?
                .into_inner();
            Updates::Stream { requests, answers }
        }
    };
    let period = (shared.rank_rate > 0.0).then(|| Duration::from_secs_f64(1.0 / shared.rank_rate));
    let (mut acks, mut want, mut outstanding, mut buffered) = (Vec::new(), 0u64, credits, 0u64);
    // Its grants, in `shared.grants`: the first credits were noted before this starts.
    let key = (session.incarnation, session.session_id);
    let mut latencies = Vec::new();
    let mut hold = Hold::new(shared.interval);
    // Updates sent, and acknowledgements sent since the last answer.
    let (mut sequence, mut on_the_way) = (0u64, 0usize);
    let mut next_step = tokio::time::Instant::now();
    let mut stopped = shared.stopped.clone();
    while !shared.stop.load(Ordering::Relaxed) {
        let mut held_until = None;
        let pending = Pending {
            want,
            outstanding,
            acks: acks.len(),
            all_in: false,
            report: false,
            unreachable_changed: false,
        };
        let due = match shared.control {
            Control::Before if want > 0 || !acks.is_empty() => Due::Now,
            Control::Before => Due::Nothing,
            Control::After => hold.due(Instant::now(), pending),
        };
        if due == Due::Now {
            hold.sent();
            let count = acks.len() as u64;
            shared.grants.granted(key, want, Instant::now());
            sequence += 1;
            on_the_way += count as usize;
            let quiet = shared.control == Control::After && on_the_way < ANSWER_AFTER_ACKS;
            let answer = updates
                .send(SessionUpdateRequest {
                    session: Some(session),
                    grant_credits: want,
                    acknowledged: std::mem::take(&mut acks),
                    stats: None,
                    workers_version,
                    quiet,
                    sequence,
                    unreachable_workers: None,
                })
                .await?;
            if let Some(answer) = answer.filter(|_| shared.control == Control::After) {
                workers_version = answer.workers_version;
                on_the_way = 0;
            }
            outstanding += want;
            want = 0;
            if shared.measuring.load(Ordering::Relaxed) {
                shared.acknowledged.fetch_add(count, Ordering::Relaxed);
            }
            continue;
        }
        if let Due::At(at) = due {
            held_until = Some(tokio::time::Instant::from_std(at));
        }
        let consume = period.filter(|_| buffered > 0).map(|_| next_step);
        tokio::select! {
            arrival = arrivals.recv() => {
                let Some((step, handed_at)) = arrival else { break };
                acks.push(step);
                outstanding = outstanding.saturating_sub(1);
                if let Some(at) = shared.grants.of(key, step) {
                    if shared.measuring.load(Ordering::Relaxed) {
                        let took = handed_at.saturating_duration_since(at);
                        latencies.push(u32::try_from(took.as_micros()).unwrap_or(u32::MAX));
                    }
                }
                match period {
                    Some(_) => {
                        if buffered == 0 {
                            next_step = next_step.max(tokio::time::Instant::now());
                        }
                        buffered += 1;
                    }
                    None => {
                        want += 1;
                    }
                }
            }
            () = sleep_until_some(consume) => {
                buffered -= 1;
                want += 1;
                next_step += period.unwrap_or_default();
            }
            () = sleep_until_some(held_until) => {}
            _ = stopped.changed() => break,
        }
    }
    if let Ok(mut all) = shared.served_us.lock() {
        all.extend(latencies);
    }
    Ok(())
}

/// Sleeps until `at`; forever when `None`.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leased_step_finds_the_grant_that_let_it_be_leased() {
        let (a, b) = ((1, 7), (2, 7));
        let grants = Grants::new([a, b]);
        let start = Instant::now();
        let (t0, t1, t2) = (
            start,
            start + Duration::from_millis(5),
            start + Duration::from_millis(9),
        );
        grants.granted(a, 2, t0);
        grants.granted(b, 1, t2);
        grants.granted(a, 3, t1);
        let of_a: Vec<_> = (0..6).map(|step| grants.of(a, step)).collect();
        assert_eq!(
            of_a,
            [Some(t0), Some(t0), Some(t1), Some(t1), Some(t1), None]
        );
        assert_eq!(grants.of(b, 0), Some(t2));
        assert_eq!(grants.of(b, 1), None);
        assert_eq!(grants.of((3, 7), 0), None, "a session not set up");
    }
}
