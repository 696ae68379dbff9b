//! The worker's side of the control plane: register with the coordinator, lease tasks (on the
//! lease stream, `stoker_rpc::lease_calls`; each lease carrying the outcomes finished since the
//! last), build each batch on the decode pool once its client's stream has room for it, and put
//! it there; heartbeats and the other reports on their own cadence (`reports.rs`); register
//! again when the coordinator is lost or restarted; on the drain, finish what is held, report
//! it and leave.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stoker_proto::v1::coordinator_client::CoordinatorClient;
use stoker_proto::v1::{LeaseRequest, LeaveRequest, RegisterWorkerRequest, TaskLease};
use tokio::sync::{mpsc, AcquireError, OwnedSemaphorePermit, Semaphore};
use tonic::Status;

use stoker_rpc::error_kinds;
use stoker_rpc::lease_calls::LeaseCalls;

use super::error_status;
use stoker_rpc::transport::{Backoff, RpcChannel, MAX_MESSAGE_BYTES};

use super::delivery::{
    before_drain_due, put, room_for, room_now, Draining, RoomNow, WaitingForRoom,
};
use super::fleet::Place;
use super::opening::{this_workers_own, OpenBackoff, Opened, Openings, Unopened};
use super::own_failures::{note_build, BuildEnd, OwnFailures, OWN_FAILURES_PER_STEP};
use super::reports::{
    heartbeat_loop, put_back_counts, report_loop, reported_tasks, take_report, unreported_lost,
};
use super::{lock, JobEntry, Outcome, Shared, WorkerConfig, LEAVE_RESERVE};
use crate::client_stream::Room;

/// How a spell of leasing from one registration ended.
enum Ended {
    /// A call to the coordinator failed: register again; `leased` once a lease was answered
    /// since registering.
    Lost { status: Status, leased: bool },
    /// The worker was told to stop, and left.
    Drained,
}

/// Why a task goes back untried: the drain's time for deliveries is up.
const STOPPING: &str = "the worker is stopping and had no time left to deliver it";

/// Why a task goes back untried: its job's opening on this worker holds its most tasks.
const STILL_OPENING: &str = "this worker is still opening the job's datasets";

/// How soon a loop whose lease brought only tasks of a job it is opening (handed back) leases
/// again.
const OPENING_RECHECK: Duration = Duration::from_millis(250);

/// Most time a task loop whose share of the worker is taken waits before it looks at the
/// shares again (they move with what the other coordinators say).
const SHARE_RECHECK: Duration = Duration::from_millis(100);

/// One loop's deliveries in flight: each a batch being built and put in its client's stream
/// (room reserved first), `most` at a time.
struct Deliveries {
    permits: Arc<Semaphore>,
    most: u32,
    /// Taken to look at the share and take a permit: the tasks served aside ask beside the
    /// loop, on other threads, and each must see the permits the others took (else two that
    /// look at once both take one over the share; a window too short for a test to open).
    turn: tokio::sync::Mutex<()>,
}

impl Deliveries {
    fn new(most: u32) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(most as usize)),
            most,
            turn: tokio::sync::Mutex::new(()),
        }
    }

    /// A permit for the next task of `place`'s loop, taken once the loop's deliveries in
    /// flight are under the coordinator's share of the worker
    /// ([`Shares`](super::fleet::Shares); all of them with one coordinator).
    async fn share_permit(&self, place: &Place) -> Result<OwnedSemaphorePermit, AcquireError> {
        let (permits, most) = (&self.permits, self.most);
        let _turn = self.turn.lock().await;
        loop {
            let in_flight = most.saturating_sub(permits.available_permits() as u32);
            let share = place.shares.cap(place.index).min(most);
            if in_flight < share {
                return permits.clone().acquire_owned().await;
            }
            // The share is taken: look again once one of the loop's deliveries ends, or after
            // a while (the shares may have moved meanwhile).
            let freed = permits.acquire_many(most - share + 1);
            let _ = tokio::time::timeout(SHARE_RECHECK, freed).await;
        }
    }
}

/// Register, lease, build, deliver, report; again from registration when the coordinator is
/// lost or forgets this worker; returns once the drain starts and the worker has left.
pub(super) async fn task_loop(
    config: WorkerConfig,
    place: Place,
    shared: Arc<Shared>,
    mut draining: Draining,
) {
    let channel = match config
        .network
        .channel(&place.address, &config.client_security)
    {
        Ok(channel) => channel,
        Err(error) => {
            tracing::error!(%error, coordinator = %place.address, "bad coordinator address");
            return;
        }
    };
    let mut backoff = Backoff::new(Duration::from_secs(2));
    let mut incarnation = None;
    // Sleeps `delay`, or less when the drain starts; whether it started.
    async fn pause(draining: &mut Draining, delay: Duration) -> bool {
        let _ = tokio::time::timeout(delay, draining.wait_for(Option::is_some)).await;
        draining.borrow().is_some()
    }
    loop {
        if draining.borrow().is_some() {
            // Never registered, or lost: there is nothing to hand back.
            return;
        }
        let mut client =
            CoordinatorClient::new(channel.clone()).max_decoding_message_size(MAX_MESSAGE_BYTES);
        let registered = client
            .register_worker(RegisterWorkerRequest {
                data_address: config.advertise.clone(),
                instance: shared.instance,
                threads: shared.threads as u32,
                data_roots: shared
                    .roots
                    .iter()
                    .map(|r| r.display().to_string())
                    .collect(),
            })
            .await;
        let registered = match registered {
            Ok(response) => response.into_inner(),
            Err(status) => {
                let delay = backoff.next_delay();
                if error_kinds::is_refusal(&status) {
                    // A setting to fix, not a network blip: say so at the loudest level.
                    tracing::error!(message = status.message(), retry_in = ?delay, coordinator = %place.address, "the coordinator refused this worker");
                } else {
                    tracing::warn!(%status, retry_in = ?delay, coordinator = %place.address, "cannot register with the coordinator");
                }
                if pause(&mut draining, delay).await {
                    return;
                }
                continue;
            }
        };
        if incarnation != Some(registered.incarnation) {
            // A new coordinator run: job ids may mean other jobs now.
            let forgotten = shared.forget_jobs(place.index);
            let _ = tokio::task::spawn_blocking(move || drop(forgotten)).await;
            incarnation = Some(registered.incarnation);
        }
        tracing::info!(worker = registered.worker_id, coordinator = %place.address, "registered with the coordinator");
        place
            .registrations
            .set(place.index, true, draining.borrow().is_some());
        // The drain may have started in between; its not-ready may have come first.
        if draining.borrow().is_some() {
            config.health.set_not_ready("draining");
        }
        let ended = serve_leases(
            &config,
            &shared,
            &place,
            client,
            registered.worker_id,
            registered.lease_timeout_ms,
            draining.clone(),
        )
        .await;
        // Nothing waits for this worker at a coordinator it no longer serves: the others'
        // shares are not held down by what it last said.
        place.shares.note(place.index, 0);
        match ended {
            Ended::Drained => return,
            Ended::Lost { status, leased } => {
                // The pause goes back to its first step only once leases were answered: a
                // worker registered and refused its leases at once (registration and leases
                // answered by different replicas, say) registered again every 50 ms, each time
                // a new worker for the coordinator to keep.
                if leased {
                    backoff.reset();
                }
                place
                    .registrations
                    .set(place.index, false, draining.borrow().is_some());
                tracing::warn!(%status, coordinator = %place.address, "lost the coordinator; registering again");
                if pause(&mut draining, backoff.next_delay()).await {
                    return;
                }
            }
        }
    }
}

/// Leases and builds until a call to the coordinator fails, or until the drain starts: then
/// takes no more leases, finishes and reports the ones held, and leaves, all by the drain's
/// deadline (a task that cannot be delivered in time is handed back).
async fn serve_leases(
    config: &WorkerConfig,
    shared: &Arc<Shared>,
    place: &Place,
    mut client: CoordinatorClient<RpcChannel>,
    worker_id: u64,
    lease_timeout_ms: u64,
    draining: Draining,
) -> Ended {
    let (outcomes_tx, outcomes_rx) = mpsc::unbounded_channel();
    let (lost_tx, mut lost_rx) = mpsc::channel::<Status>(4);
    let heartbeat = tokio::spawn(heartbeat_loop(
        client.clone(),
        worker_id,
        lease_timeout_ms,
        lost_tx.clone(),
    ));
    // Outcomes taken off the channel and not yet reported: the reporter's next report or the
    // lease loop's next call sends them, whichever comes first.
    let unreported = Arc::new(Mutex::new(Vec::new()));
    let reporter = tokio::spawn(report_loop(
        client.clone(),
        worker_id,
        shared.clone(),
        (outcomes_rx, unreported.clone()),
        config.report_interval,
        lost_tx,
    ));
    // Deliveries in flight: each a batch being built and put in its client's stream (reserved
    // room first). This coordinator's part of them is the fleet's share (all of them with one
    // coordinator).
    let deliveries = Arc::new(Deliveries::new(config.lease_ahead.max(1).saturating_mul(2)));
    // How the builds of tasks served aside ended, for the pauses of their jobs.
    let (ends_tx, mut ends) = mpsc::unbounded_channel();
    // Each task served aside holds a sender: the drain waits until none is left.
    let (in_flight, mut all_done) = mpsc::channel::<()>(1);
    // Of the drain's time, what is kept for the last report and the leave.
    let reserve = LEAVE_RESERVE.min(config.drain_timeout / 4);
    let mut open_backoff = OpenBackoff::default();
    let mut leases = LeaseCalls::new(client.clone());
    let mut openings = Openings::new(place.index, config.lease_ahead as usize);
    let serving = Serving {
        shared: shared.clone(),
        place: place.clone(),
        deliveries,
        draining: draining.clone(),
        reserve,
        outcomes: outcomes_tx.downgrade(),
        own_failures: Arc::new(OwnFailures::default()),
        ends: ends_tx,
        waiting: Arc::default(),
        _in_flight: in_flight,
    };
    // Whether a lease call was answered (see `Ended::Lost`).
    let mut answered = false;
    let status = loop {
        if draining.borrow().is_some() {
            break None;
        }
        if let Ok(status) = lost_rx.try_recv() {
            break Some(status);
        }
        while let Ok((job, end)) = ends.try_recv() {
            note_build(&mut open_backoff, job, end);
        }
        let report = take_report(worker_id, shared, &unreported);
        let counts = report.as_ref().map(|r| (r.bad_samples, r.busy_ns));
        let carried = report.as_ref().map_or(0, reported_tasks);
        let full_sessions = serving.waiting.full(serving.deliveries.most);
        // While a job opens, its waiting tasks are looked at again soon; while a session is
        // full here, its room is (a client that reads again soon finds its tasks leased).
        let wait_ms = match (openings.under_way(), full_sessions.is_empty()) {
            (true, _) => 50,
            (false, false) => 250,
            (false, true) => 1000,
        };
        let leased = leases
            .lease(LeaseRequest {
                worker_id,
                max_tasks: config.lease_ahead.max(1),
                wait_ms,
                report,
                full_sessions,
            })
            .await;
        // Leased even if the drain started meanwhile: these are finished like the others (but
        // for those left waiting for their job's opening, which go back once the loop ends).
        let tasks = match leased {
            Ok(response) => {
                answered = true;
                place.shares.note(place.index, response.waiting_sessions);
                response.tasks
            }
            Err(status) => {
                put_back_counts(shared, counts);
                unreported_lost(carried, &status);
                break Some(status);
            }
        };
        // Whether a task was served (built, or left waiting for its job's opening), and the
        // shortest wait of the jobs whose tasks went back untried.
        let (leased_any, mut served, mut least_wait) =
            (!tasks.is_empty(), false, OpenBackoff::MOST);
        // First the tasks whose job's opening ended since the last lease, then this lease's.
        for (job, opened, waiting) in openings.ended(shared).await {
            match opened {
                Ok(entry) => {
                    open_backoff.opened(job);
                    for task in waiting {
                        // After a failure of this worker's own, the rest go back untried.
                        if let Some((_, reason)) = open_backoff.wait(job, Instant::now()) {
                            let _ = outcomes_tx.send(Outcome::Failed(task.lease_id, reason));
                            continue;
                        }
                        served = true;
                        if let Some(end) = serving.serve(entry.clone(), task).await {
                            note_build(&mut open_backoff, job, end);
                        }
                    }
                }
                Err(unopened) => {
                    let reason = unopened.status().message().to_string();
                    let pause = open_backoff.failed(job, Instant::now(), &reason);
                    if let Unopened::Refused(_) = unopened {
                        tracing::warn!(job, %reason, ?pause, "cannot open the job's datasets on this worker: a client is told and its tasks go to other workers");
                    } else {
                        tracing::warn!(job, %reason, ?pause, "cannot open the job's datasets; its tasks go back untried until the next try");
                    }
                    // One client hears of it, as when the opening held up the loop; the other
                    // tasks go back untried.
                    let mut waiting = waiting.into_iter();
                    if let Some(first) = waiting.next() {
                        serving.unopened(&unopened, &reason, first);
                    }
                    for task in waiting {
                        let _ = outcomes_tx.send(Outcome::Failed(task.lease_id, reason.clone()));
                    }
                }
            }
        }
        for task in tasks {
            if let Some((wait, reason)) = open_backoff.wait(task.job_id, Instant::now()) {
                let _ = outcomes_tx.send(Outcome::Failed(task.lease_id, reason));
                least_wait = least_wait.min(wait);
                continue;
            }
            let job = task.job_id;
            match openings.open_or_wait(shared, &client, task) {
                Opened::Ready(entry, task) => {
                    served = true;
                    if let Some(end) = serving.serve(entry, task).await {
                        note_build(&mut open_backoff, job, end);
                    }
                }
                Opened::Waiting => served = true,
                Opened::Full(task) => {
                    let _ = outcomes_tx.send(Outcome::Failed(task.lease_id, STILL_OPENING.into()));
                    least_wait = least_wait.min(OPENING_RECHECK);
                }
            }
        }
        let only_handed_back = (leased_any && !served).then_some(least_wait);
        if let Some(wait) = only_handed_back {
            // Nothing this worker can serve came: lease again when a job's next try is due.
            let mut draining = draining.clone();
            tokio::select! {
                () = tokio::time::sleep(wait.min(Duration::from_secs(1))) => {}
                _ = draining.changed() => {}
            }
        }
    };
    if let Some(status) = status {
        heartbeat.abort();
        reporter.abort();
        unreported_lost(lock(&unreported).len(), &status);
        return Ended::Lost {
            status,
            leased: answered,
        };
    }
    // What waits for its job's opening goes back for another worker.
    for task in openings.take_waiting() {
        let reason = "the worker is stopping; the job's datasets were still opening";
        let _ = outcomes_tx.send(Outcome::Failed(task.lease_id, reason.into()));
    }
    // The drain, by its deadline (the loop ends here only once it has one): the tasks served
    // aside, then the last report, then the leave, each by a point of its own, the last a
    // little before the deadline so the daemon is not cut off mid-leave. The tasks served
    // aside hand theirs back when the deadline less `reserve` comes: they are waited for a
    // little past it, so those go in the last report. The heartbeats go on, so the leases held
    // stay this worker's meanwhile.
    let deadline =
        (*draining.borrow()).unwrap_or_else(|| tokio::time::Instant::now() + config.drain_timeout);
    let by = |left: Duration| deadline.checked_sub(left).unwrap_or(deadline);
    drop(serving);
    let delivered = tokio::time::timeout_at(by(reserve * 3 / 4), all_done.recv())
        .await
        .is_ok();
    if !delivered {
        tracing::warn!(
            "tasks still waiting on their clients' streams; the coordinator gets them back"
        );
    }
    // The tasks still waiting hold no sender: the reporter sends what came and ends.
    drop(outcomes_tx);
    let reported = tokio::time::timeout_at(by(reserve / 2), reporter)
        .await
        .is_ok();
    if !reported {
        tracing::warn!("the last report did not go through; the coordinator redoes those tasks");
    }
    let leave = client.leave(LeaveRequest { worker_id });
    let left = tokio::time::timeout_at(by(reserve / 8), leave).await;
    heartbeat.abort();
    match left {
        Ok(Ok(answer)) => tracing::info!(
            worker = worker_id,
            returned = answer.into_inner().requeued_tasks,
            took = ?by(config.drain_timeout).elapsed(),
            "drained: left the coordinator"
        ),
        Ok(Err(status)) => {
            tracing::warn!(%status, "the coordinator did not take the leave; its lease timeout will")
        }
        Err(_) => tracing::warn!("the coordinator did not answer the leave in time"),
    }
    Ended::Drained
}

/// What a spell of leasing serves its tasks with; the tasks served aside hold a copy.
#[derive(Clone)]
struct Serving {
    shared: Arc<Shared>,
    place: Place,
    deliveries: Arc<Deliveries>,
    draining: Draining,
    reserve: Duration,
    /// The reporter's: work still waiting once the drain is done holds none, so the reporter
    /// sends what came and ends.
    outcomes: mpsc::WeakUnboundedSender<Outcome>,
    own_failures: Arc<OwnFailures>,
    /// How the builds of tasks served aside ended, by job.
    ends: mpsc::UnboundedSender<(u64, BuildEnd)>,
    /// The tasks served aside still waiting for room, by session.
    waiting: Arc<WaitingForRoom>,
    /// Held by each task served aside: the drain waits until none is left.
    _in_flight: mpsc::Sender<()>,
}

impl Serving {
    /// Tells the coordinator `outcome` in the next report, unless the spell is over.
    fn outcome(&self, outcome: Outcome) {
        if let Some(outcomes) = self.outcomes.upgrade() {
            let _ = outcomes.send(outcome);
        }
    }

    /// `task` goes back to the coordinator for another worker: the drain's time for
    /// deliveries is up.
    fn handed_back(&self, task: &TaskLease) {
        self.outcome(Outcome::Failed(task.lease_id, STOPPING.into()));
    }

    /// Serves `task` of a job open here: its batch is built once its client's stream has room
    /// for it. With room now, in the loop (how it ended); else on a task of its own that waits
    /// for room and then builds, while the loop leases and builds on (`None`; the loop hears
    /// how it ended through `ends`). So a client reading slowly holds no delivery of the
    /// worker's while its queue is full, and other jobs go on at the worker's pace.
    async fn serve(&self, entry: Arc<JobEntry>, task: TaskLease) -> Option<BuildEnd> {
        match room_now(&self.shared, &task) {
            RoomNow::Here(room) => Some(self.build(entry, task, room).await),
            RoomNow::Never(outcome) => {
                self.outcome(outcome);
                Some(BuildEnd::Unclaimed)
            }
            RoomNow::Later => {
                let serving = self.clone();
                let waiting = self.waiting.enter(&task);
                tokio::spawn(async move {
                    let (job, draining) = (task.job_id, serving.draining.clone());
                    let room = room_for(&serving.shared, &task, "its batch");
                    let room = before_drain_due(room, draining, serving.reserve).await;
                    drop(waiting);
                    match room {
                        None => serving.handed_back(&task),
                        Some(Err(outcome)) => serving.outcome(outcome),
                        Some(Ok(room)) => {
                            let end = serving.build(entry, task, room).await;
                            let _ = serving.ends.send((job, end));
                        }
                    }
                });
                None
            }
        }
    }

    /// Builds `task`'s batch on the decode pool once the loop's deliveries in flight are under
    /// its share, and puts it in the `room` reserved for it in its client's stream (or its
    /// error, or hands the task back when the failure is this worker's own).
    async fn build(&self, entry: Arc<JobEntry>, task: TaskLease, room: Room) -> BuildEnd {
        let (shared, draining) = (&self.shared, &self.draining);
        let permit = self.deliveries.share_permit(&self.place);
        let Some(Ok(permit)) = before_drain_due(permit, draining.clone(), self.reserve).await
        else {
            self.handed_back(&task);
            return BuildEnd::Stopping;
        };
        let built = {
            let shared = shared.clone();
            tokio::task::spawn_blocking(move || shared.build(&entry, &task))
        };
        // A build still running at the deadline finishes on its own; its batch is dropped.
        let Some(built) = before_drain_due(built, draining.clone(), self.reserve).await else {
            self.handed_back(&task);
            return BuildEnd::Stopping;
        };
        let status = match built {
            Ok(Ok(batch)) => {
                self.outcome(put(room, &task, Ok(batch.into())));
                return BuildEnd::Built;
            }
            // This worker's disk, mount, store access or machine failed it: another worker
            // may build it (the client would fail the step for a failure of this worker's).
            Ok(Err(error))
                if this_workers_own(&error) && self.own_failures.hand_back_again(&task) =>
            {
                let reason = format!("the worker could not build the batch: {error}");
                self.outcome(Outcome::Failed(task.lease_id, reason.clone()));
                return BuildEnd::HandedBack(reason);
            }
            // Not UNAVAILABLE: the client would take it for a lost stream, the step leased again.
            Ok(Err(error)) if this_workers_own(&error) => {
                let status = error_status(&error);
                error_kinds::status(
                    error_kinds::kind_of_status(&status),
                    format!(
                        "{} (tried {OWN_FAILURES_PER_STEP} times on this worker, handed back \
                         between tries)",
                        status.message()
                    ),
                )
            }
            // Under the fail policy a bad sample fails the batch: the client must hear about
            // it, not wait for a retry that fails the same way.
            Ok(Err(error)) => error_status(&error),
            // A build is a function of the task: tried again it panics again, so the client
            // hears of it, as of a decode thread's panic in-process.
            Err(panic) => Status::internal(format!("a worker's batch build panicked: {panic}")),
        };
        drop(permit);
        // Marked with its step: the client fails that step alone and reads on.
        let status = error_kinds::failed_step_of(status, task.step);
        self.outcome(put(room, &task, Err(status)));
        BuildEnd::Told
    }

    /// `task`'s job did not open on this worker. A dataset that will not open here (gone from
    /// its disk, outside its --data-root, not a dataset, changed since first opened) is told to
    /// its client, marked as this worker's own failure (the client takes its batches from the
    /// others, and fails once every worker has said so), and goes back to the queue for
    /// another worker; one that may open later (a store or disk failing) is only handed back.
    /// The client is told on a task of its own, by the drain's deadline.
    fn unopened(&self, unopened: &Unopened, reason: &str, task: TaskLease) {
        let handed_back = Outcome::Failed(task.lease_id, reason.to_string());
        let Unopened::Refused(status) = unopened else {
            self.outcome(handed_back);
            return;
        };
        let status = error_kinds::job_unopened(status.clone());
        let serving = self.clone();
        tokio::spawn(async move {
            let room = room_for(&serving.shared, &task, "its error");
            let room = before_drain_due(room, serving.draining.clone(), serving.reserve).await;
            if let Some(Ok(room)) = room {
                room.send(Err(status));
            }
            serving.outcome(handed_back);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::super::opening::may_pass;
    use super::*;

    fn opening(code: i32) -> stoker_pipeline::Error {
        stoker_pipeline::Error::OpenDataset(stoker_datasets::Error::Io {
            path: "/data/train".into(),
            source: std::io::Error::from_raw_os_error(code),
        })
    }

    #[tokio::test]
    async fn a_loop_starts_a_task_only_while_under_its_coordinators_share() {
        use super::super::fleet::{Registrations, Shares};
        let health = stoker_rpc::health::Health::starting("starting");
        let shares = Arc::new(Shares::new(4, 2));
        let place = |index| Place {
            index,
            address: format!("coordinator-{index}"),
            registrations: Arc::new(Registrations::new(health.clone(), 2)),
            shares: shares.clone(),
        };
        let (first, second) = (place(0), place(1));
        // Three sessions wait at the second coordinator for each one at the first.
        shares.note(0, 1);
        shares.note(1, 3);
        let deliveries = Deliveries::new(4);
        let held = deliveries
            .share_permit(&first)
            .await
            .expect("under its share");
        let waits = tokio::time::timeout(SHARE_RECHECK * 3, deliveries.share_permit(&first));
        assert!(waits.await.is_err(), "its one delivery is its whole share");
        // The other coordinator's loop (its own deliveries) starts three.
        let others = Deliveries::new(4);
        let mut started = Vec::new();
        for _ in 0..3 {
            started.push(others.share_permit(&second).await.expect("a permit"));
        }
        let fourth = tokio::time::timeout(SHARE_RECHECK * 3, others.share_permit(&second));
        assert!(fourth.await.is_err(), "three are its share");
        // A delivery ends: the next task starts, and the one after it waits again.
        drop(held);
        let soon = SHARE_RECHECK * 10;
        let next = tokio::time::timeout(soon, deliveries.share_permit(&first)).await;
        let next = next
            .expect("started once a delivery ended")
            .expect("a permit");
        let over = tokio::time::timeout(SHARE_RECHECK * 3, deliveries.share_permit(&first));
        assert!(over.await.is_err(), "still one");
        // Nothing waits at the second any more: the first may use the whole worker.
        shares.note(1, 0);
        let more = tokio::time::timeout(soon, deliveries.share_permit(&first)).await;
        let more = more.expect("the shares moved").expect("a permit");
        drop((next, more, started));
    }

    #[test]
    fn only_a_dataset_that_may_open_later_is_handed_back() {
        // A disk or file system failing, the machine short of descriptors: another try.
        // EIO, ESTALE, ETIMEDOUT, EMFILE (Linux numbers).
        for code in [5, 116, 110, 24] {
            assert!(may_pass(&opening(code)), "{code}");
        }
        // Not there, not readable, not a dataset: the client is told.
        // ENOENT, EACCES, ENOTDIR.
        for code in [2, 13, 20] {
            assert!(!may_pass(&opening(code)), "{code}");
        }
        let not_a_dataset = stoker_pipeline::Error::InvalidSpec("no images".into());
        assert!(!may_pass(&not_a_dataset));
    }

    #[test]
    fn a_job_that_failed_to_open_is_tried_again_after_a_growing_pause() {
        let mut backoff = OpenBackoff::default();
        let start = Instant::now();
        assert!(backoff.wait(7, start).is_none());
        let pauses: Vec<Duration> = (0..7).map(|_| backoff.failed(7, start, "EIO")).collect();
        let ms = |n| Duration::from_millis(n);
        assert_eq!(
            pauses,
            [
                ms(250),
                ms(500),
                ms(1000),
                ms(2000),
                ms(4000),
                ms(5000),
                ms(5000)
            ]
        );
        // Meanwhile the job's tasks go back untried: how long until the next try, and why.
        let (wait, reason) = backoff.wait(7, start + ms(1000)).unwrap();
        assert_eq!((wait, reason.as_str()), (ms(4000), "EIO"));
        assert!(backoff.wait(7, start + ms(5000)).is_none());
        // Another job is not held back; an open resets the pause.
        assert!(backoff.wait(8, start).is_none());
        backoff.opened(7);
        assert!(backoff.wait(7, start).is_none());
        assert_eq!(backoff.failed(7, start, "EIO"), ms(250));
    }
}
