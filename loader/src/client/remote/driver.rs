//! The driver of one epoch's session (see the parent module for what it recovers from): it opens
//! the session, subscribes to every worker the coordinator lists, grants a credit for every step
//! the loader asks for, acknowledges what arrives, drops duplicates by step, and reopens the
//! session when a stream breaks, a batch is overdue or the coordinator restarts. Credits and
//! acknowledgements go on the session's update stream, held as [`Hold`] says (up to
//! [`Driver::ack_interval`] while the workers hold more than half the window's credits).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use stoker_proto::v1::coordinator_client::CoordinatorClient;
use stoker_proto::v1::{JobSpec, SessionUpdateRequest, WorkerInfo};
use stoker_rpc::error_kinds;
use stoker_rpc::network::Network;
use stoker_rpc::security::ClientSecurity;
use stoker_rpc::transport::{Backoff, RpcChannel, MAX_MESSAGE_BYTES};
use tokio::sync::mpsc;

use super::streams::{stream_worker, Arrival, Streams};
use super::unreachable::{address_of, Unopened, Unreachable};
use super::updates::{close_session, Due, Hold, Pending, Updates, ANSWER_AFTER_ACKS};
use super::{client_stats, STREAM_RETRY};
use crate::client::landing::{lock, SlotQueue};
use crate::client::slots::Slot;
use crate::client::source::{Built, IdleClock};
use crate::error::{error_from_status, Result};
use stoker_dashboard::LoaderMonitor;

pub(super) struct Driver {
    pub(super) channel: RpcChannel,
    pub(super) security: ClientSecurity,
    pub(super) network: Network,
    pub(super) address: String,
    pub(super) spec: JobSpec,
    pub(super) job_weight: u32,
    /// The job's id at the coordinator, shared with the source and its other epochs: a new
    /// one goes here when the job is registered again.
    pub(super) job_id: Arc<AtomicU64>,
    /// The dataset's fingerprint the job was registered with (`None` when workers gave none).
    pub(super) dataset_fingerprint: Option<String>,
    pub(super) rank: u32,
    pub(super) epoch: u64,
    pub(super) steps: u64,
    /// No batch for this long while credits are out: the session is reopened. Doubled at each
    /// such reopen, up to `stall_most`, so a batch that takes longer to build than the setting
    /// (large images, a slow store) arrives at last instead of being leased again and again;
    /// halved again (down to `stall_base`) by each batch that comes within half of it.
    pub(super) stall_reopen: Duration,
    /// The setting `stall_reopen` started at.
    pub(super) stall_base: Duration,
    pub(super) worker_grace: Duration,
    /// The most `stall_reopen` grows to.
    pub(super) stall_most: Duration,
    /// Longest wanted credits are held while the workers hold more than half the window's.
    pub(super) ack_interval: Duration,
    pub(super) batches: Sender<Result<Built>>,
    /// One slot per step the loader asks for.
    pub(super) requests: mpsc::UnboundedReceiver<Slot>,
    /// Slots for batches not yet arrived, with when they were asked for; the worker streams
    /// take them as batches start to arrive.
    pub(super) free_slots: Arc<SlotQueue>,
    /// Steps asked for so far (all below this).
    pub(super) requested: u64,
    pub(super) monitor: LoaderMonitor,
    /// Time with every asked-for step received (the workers had nothing to do for us).
    pub(super) idle: IdleClock,
    pub(super) idle_since: Option<Instant>,
    /// Since when no worker stream has been open while batches were wanted.
    pub(super) unserved_since: Option<Instant>,
    /// Slots owed to the pool by failed steps whose slot a duplicate's landing held: taken from
    /// the queue at the next tick that finds them there.
    pub(super) owed_slots: usize,
}

/// How many times its setting the stall before a reopen grows to at most.
pub(super) const STALL_REOPEN_GROWTH: u32 = 64;

/// The longest the stall before a reopen grows to (where the setting is below it): half the
/// loader's default deadline, so a batch lost in transit after a slow spell still costs a
/// reopen, not the deadline.
pub(super) const STALL_REOPEN_MOST: Duration = Duration::from_secs(300);

/// The most the stall before a reopen grows to from the setting `base`.
pub(super) fn stall_most(base: Duration) -> Duration {
    base.saturating_mul(STALL_REOPEN_GROWTH)
        .min(STALL_REOPEN_MOST)
        .max(base)
}

/// How long a reopen waits for the updates on their way to be applied.
const REOPEN_WAIT: Duration = Duration::from_secs(1);

/// Why a session ended.
enum SessionEnd {
    /// Every step arrived.
    Done,
    /// Open the session again (worker lost, stall, coordinator restarted).
    Reopen,
    /// The consumer went away or an error was passed on.
    Stop,
}

impl Driver {
    pub(super) async fn run(mut self, start_step: u64) {
        // Steps passed to the consumer: all below `floor`, plus `ahead`.
        let mut floor = start_step;
        let mut ahead = BTreeSet::new();
        let mut backoff = Backoff::new(Duration::from_secs(2));
        loop {
            match self.session(&mut floor, &mut ahead, &mut backoff).await {
                SessionEnd::Done | SessionEnd::Stop => return,
                SessionEnd::Reopen => {}
            }
        }
    }

    /// The job's id at the coordinator now.
    pub(super) fn job_id(&self) -> u64 {
        self.job_id.load(Ordering::Relaxed)
    }

    /// Takes the loader's new requests (credits and their slots) without waiting.
    pub(super) fn take_requests(&mut self) -> bool {
        loop {
            match self.requests.try_recv() {
                Ok(slot) => self.add_request(slot),
                Err(mpsc::error::TryRecvError::Empty) => return true,
                Err(mpsc::error::TryRecvError::Disconnected) => return false,
            }
        }
    }

    /// `step` arrived (its batch or its error): the floor moves past what arrived in order, and
    /// the idle clock starts once every step asked for is in.
    fn received(&mut self, step: u64, floor: &mut u64, ahead: &mut BTreeSet<u64>) {
        ahead.insert(step);
        while ahead.first() == Some(floor) {
            ahead.pop_first();
            *floor += 1;
        }
        if *floor + ahead.len() as u64 >= self.requested {
            self.idle_since.get_or_insert_with(Instant::now);
        }
    }

    /// Pays the slots owed to the pool from the queue, as far as it holds them (a duplicate's
    /// slot goes back there, and a landing cut off puts its own back).
    fn settle_owed_slots(&mut self) {
        while self.owed_slots > 0 && lock(&self.free_slots).pop_front().is_some() {
            self.owed_slots -= 1;
        }
    }

    fn add_request(&mut self, slot: Slot) {
        lock(&self.free_slots).push_back((slot, Instant::now()));
        self.requested += 1;
        if let Some(since) = self.idle_since.take() {
            self.idle.add(since.elapsed());
        }
    }

    async fn session(
        &mut self,
        floor: &mut u64,
        ahead: &mut BTreeSet<u64>,
        backoff: &mut Backoff,
    ) -> SessionEnd {
        let mut client = CoordinatorClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
        let Some((token, mut workers, workers_version)) =
            self.open(&mut client, *floor, backoff).await
        else {
            return SessionEnd::Stop;
        };
        let mut updates = match Updates::open(&client, workers_version).await {
            Ok(updates) => updates,
            Err(status) => {
                tracing::warn!(coordinator = %self.address, %status, "cannot open the session's update stream; opening the session again");
                if error_kinds::is_transient(&status) {
                    tokio::time::sleep(backoff.next_delay()).await;
                }
                return SessionEnd::Reopen;
            }
        };
        tracing::debug!(session = token.session_id, floor = *floor, "session open");
        let (arrivals_tx, mut arrivals) = mpsc::unbounded_channel();
        let mut streams = Streams::default();
        let mut open_streams: HashSet<u64> = HashSet::new();
        let job_id = self.job_id();
        let security = self.security.clone();
        let network = self.network.clone();
        let free_slots = Arc::clone(&self.free_slots);
        // Workers whose stream could not open or was ended by the worker, and when to try them
        // again: a worker may be listed before its address resolves or accepts (a new pod's
        // DNS name), or end a stream and stay listed.
        let mut retry_at: HashMap<u64, Instant> = HashMap::new();
        // Listed workers whose stream has not opened, told to the coordinator as they change.
        let mut unreachable = Unreachable::default();
        let mut unopened = Unopened::default();
        let subscribe_all = |workers: &[WorkerInfo],
                             streams: &mut Streams,
                             retry_at: &mut HashMap<u64, Instant>| {
            let now = Instant::now();
            retry_at.retain(|_, at| *at > now);
            for worker in workers {
                if streams.0.contains_key(&worker.worker_id)
                    || retry_at.contains_key(&worker.worker_id)
                {
                    continue;
                }
                let handle = tokio::spawn(stream_worker(
                    worker.clone(),
                    network.clone(),
                    security.clone(),
                    token,
                    job_id,
                    arrivals_tx.clone(),
                    Arc::clone(&free_slots),
                ));
                streams.0.insert(worker.worker_id, handle);
            }
        };
        subscribe_all(&workers, &mut streams, &mut retry_at);

        let mut outstanding = 0u64;
        // Steps received beyond the floor are acknowledged again first (before any credit of
        // the new window), so the reopened session does not lease them again.
        let mut acks: Vec<u64> = ahead.iter().copied().collect();
        // The last arrival, or the grant that ended a time with nothing outstanding: a consumer
        // that paused (an evaluation, a checkpoint) before asking again has not waited.
        let mut progress_at = Instant::now();
        // The first update of a session reports, so a client whose epochs are shorter than the
        // report period still shows on the dashboard.
        let mut last_stats: Option<Instant> = None;
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        // Updates go quiet (unanswered) on the stream, except those whose answer is needed;
        // while one of those waits for it (`updates.awaiting()`) no other goes: arrivals are
        // handed out meanwhile (the data plane never waits on the control plane), and what comes
        // (acks, credits) goes in the next one. When the next update is due:
        let mut hold = Hold::new(self.ack_interval);
        // The steps acknowledged by updates not yet known applied (sent again at a Stop rather
        // than waited for), and whether the awaited update's credits started the stall clock
        // (restarted at its answer).
        let mut acks_on_the_way: Vec<u64> = Vec::new();
        let mut clock_from_answer = false;
        let end = loop {
            let received = *floor + ahead.len() as u64;
            let all_in = received >= self.steps;
            if all_in && acks.is_empty() && updates.all_applied() {
                break SessionEnd::Done;
            }
            // Until when the next update is held back.
            let mut held_until = None;
            if !updates.awaiting() {
                // Credits: one for every step asked for and not yet received.
                let want = self
                    .requested
                    .min(self.steps)
                    .saturating_sub(received + outstanding);
                let report = last_stats.is_none_or(|at| at.elapsed() >= Duration::from_millis(500));
                let pending = Pending {
                    want,
                    outstanding,
                    acks: acks.len(),
                    all_in,
                    report,
                    unreachable_changed: unreachable.changed(),
                };
                // The end waits for every update to be known applied: this one asks for that.
                let flush = all_in && acks.is_empty();
                let due = match hold.due(Instant::now(), pending) {
                    _ if flush => Due::Now,
                    due => due,
                };
                if let Due::At(at) = due {
                    held_until = Some(tokio::time::Instant::from_std(at));
                } else if due == Due::Now {
                    hold.sent();
                    let stats = report.then(|| {
                        last_stats = Some(Instant::now());
                        client_stats(&self.monitor)
                    });
                    acks_on_the_way.extend_from_slice(&acks);
                    // Its answer is needed when the acks on the way reach ANSWER_AFTER_ACKS (so
                    // those sent again at a Stop stay few), when it ends the epoch, or when it
                    // starts the stall clock; figures go quiet like the rest.
                    let quiet = !(acks_on_the_way.len() >= ANSWER_AFTER_ACKS || all_in);
                    let unreachable_workers = unreachable.take_change();
                    let request = SessionUpdateRequest {
                        session: Some(token),
                        grant_credits: want,
                        acknowledged: std::mem::take(&mut acks),
                        stats,
                        unreachable_workers,
                        // The workers' version, number and quietness are set by `updates.send`.
                        ..SessionUpdateRequest::default()
                    };
                    // Counted as granted from now: a batch of these credits may arrive before
                    // the answer does.
                    clock_from_answer = outstanding == 0 && want > 0;
                    if clock_from_answer {
                        progress_at = Instant::now();
                    }
                    outstanding += want;
                    if let Err(status) = updates.send(request, quiet && !clock_from_answer) {
                        tracing::warn!(coordinator = %self.address, %status, "session update not sent; opening the session again");
                        break SessionEnd::Reopen;
                    }
                }
            }
            tokio::select! {
                updated = updates.answer(), if updates.awaiting() || updates.listens() => {
                    match updated {
                        Ok(answer) => {
                            if updates.all_applied() {
                                acks_on_the_way.clear();
                            }
                            // Credits granted from nothing outstanding: the wait for their
                            // batches starts once the coordinator has them.
                            if clock_from_answer && !updates.awaiting() {
                                clock_from_answer = false;
                                progress_at = Instant::now();
                            }
                            if let Some(listed) = answer.workers {
                                workers = listed;
                            }
                            subscribe_all(&workers, &mut streams, &mut retry_at);
                        }
                        Err(status) => {
                            tracing::warn!(coordinator = %self.address, %status, "session update failed; opening the session again");
                            if error_kinds::is_transient(&status) {
                                tokio::time::sleep(backoff.next_delay()).await;
                            }
                            break SessionEnd::Reopen;
                        }
                    }
                }
                arrival = arrivals.recv() => match arrival {
                    Some(Arrival::Opened { worker }) => {
                        open_streams.insert(worker);
                        self.unserved_since = None;
                        unreachable.opened(worker);
                    }
                    Some(Arrival::Batch { batch: landed, received }) => {
                        let batch = &landed.wire.batch;
                        let step = batch.step;
                        if batch.epoch != self.epoch || batch.rank != self.rank || step >= self.steps {
                            tracing::warn!(epoch = batch.epoch, rank = batch.rank, step, "batch for another session dropped");
                            landed.give_back(&self.free_slots);
                            continue;
                        }
                        if step < *floor || ahead.contains(&step) {
                            tracing::debug!(step, "duplicate batch dropped");
                            landed.give_back(&self.free_slots);
                            continue;
                        }
                        // Every stream sending here is of this opening of the session (the
                        // channel is the opening's own): the batch spent one of its credits.
                        outstanding = outstanding.saturating_sub(1);
                        // A batch well within the wait: the slow spell that grew it is over.
                        if progress_at.elapsed() < self.stall_reopen / 2 {
                            self.stall_reopen = (self.stall_reopen / 2).max(self.stall_base);
                        }
                        progress_at = Instant::now();
                        self.received(step, floor, ahead);
                        acks.push(step);
                        // Latency: from the oldest open request (credits are served in order).
                        let (batch, asked) = landed.finish();
                        let service = asked.unwrap_or(received).elapsed();
                        let built = Built { step, service, result: Ok(batch) };
                        if self.batches.send(Ok(built)).is_err() {
                            break SessionEnd::Stop;
                        }
                    }
                    // A worker that cannot open the job (its disk, its --data-root) keeps its
                    // ended stream in `streams`, so none is opened to it again this opening;
                    // the coordinator, told it is unreachable, gives its share to the others.
                    Some(Arrival::Failed { worker, status }) if error_kinds::is_job_unopened(&status) => {
                        open_streams.remove(&worker);
                        unreachable.refused(worker);
                        if let Some(context) = unopened.add(worker, &workers, &status) {
                            let _ = self.batches.send(Err(error_from_status(&context, &status)));
                            break SessionEnd::Stop;
                        }
                    }
                    // A batch the worker could not build (a bad sample under the fail policy):
                    // that step fails alone, as in process, and the epoch goes on. The worker's
                    // stream ended with the error, and what it queued behind it went with it:
                    // the session opens again past the step, the others leased again.
                    Some(Arrival::BatchFailed { worker, step, status }) => {
                        if step >= self.steps || step < *floor || ahead.contains(&step) {
                            tracing::debug!(step, "a duplicate batch's error dropped");
                            break SessionEnd::Reopen;
                        }
                        self.received(step, floor, ahead);
                        // The step's slot goes back to the pool, as in process (left queued,
                        // one per failed step, they would hold the pool's slots for good); its
                        // wait counts from the oldest open request, as a batch's does.
                        let oldest = lock(&self.free_slots).pop_front();
                        if oldest.is_none() {
                            // A duplicate's landing holds it: paid once it is back.
                            self.owed_slots += 1;
                        }
                        let service = oldest.map_or(Duration::ZERO, |(_, at)| at.elapsed());
                        let worker = address_of(&workers, worker);
                        let context = format!("worker {worker} could not build step {step}");
                        let result = Err(error_from_status(&context, &status));
                        let built = Built { step, service, result };
                        if self.batches.send(Ok(built)).is_err() {
                            break SessionEnd::Stop;
                        }
                        break SessionEnd::Reopen;
                    }
                    Some(Arrival::Failed { worker, status }) => {
                        let context = format!("worker {} could not build a batch", address_of(&workers, worker));
                        let _ = self.batches.send(Err(error_from_status(&context, &status)));
                        break SessionEnd::Stop;
                    }
                    Some(Arrival::Refused { address, status }) => {
                        let context = format!("worker {address} refused the client's stream");
                        let _ = self.batches.send(Err(error_from_status(&context, &status)));
                        break SessionEnd::Stop;
                    }
                    Some(Arrival::Ended { worker }) => {
                        open_streams.remove(&worker);
                        streams.0.remove(&worker);
                        // A worker that stays listed gets a new one after the same wait; a
                        // draining one (whose end this is) refuses it until the workers' list
                        // drops it. A stream a worker ended for taking nothing ends with
                        // UNAVAILABLE instead: lost, so the session opens again.
                        retry_at.insert(worker, Instant::now() + STREAM_RETRY);
                        tracing::debug!(worker, "the worker ended its stream");
                    }
                    Some(Arrival::Lost { worker, opened, status }) => {
                        open_streams.remove(&worker);
                        if opened {
                            tracing::warn!(worker, %status, "worker stream lost; opening the session again so its undelivered batches are redone");
                            break SessionEnd::Reopen;
                        }
                        // Tried again once STREAM_RETRY has passed (the tick below), while the
                        // workers' list still holds it; answers are few, so not left to them.
                        streams.0.remove(&worker);
                        retry_at.insert(worker, Instant::now() + STREAM_RETRY);
                        tracing::debug!(worker, %status, retry_in = ?STREAM_RETRY, "worker unreachable");
                        unreachable.failed(worker, &workers, &status);
                    }
                    None => break SessionEnd::Stop,
                },
                slot = self.requests.recv() => match slot {
                    Some(slot) => self.add_request(slot),
                    None => break SessionEnd::Stop,
                },
                () = async {
                    match held_until {
                        Some(until) => tokio::time::sleep_until(until).await,
                        None => std::future::pending().await,
                    }
                }, if held_until.is_some() => {}
                _ = tick.tick() => {
                    self.settle_owed_slots();
                    let now = Instant::now();
                    if retry_at.values().any(|at| *at <= now) {
                        subscribe_all(&workers, &mut streams, &mut retry_at);
                    }
                    let received = *floor + ahead.len() as u64;
                    let wanted = self.requested.min(self.steps) > received;
                    if open_streams.is_empty() && wanted {
                        self.unserved_since.get_or_insert_with(Instant::now);
                        if self.unserved_too_long(None, unreachable.described(&workers)) {
                            break SessionEnd::Stop;
                        }
                    }
                    // Not while an update is unanswered: its credits' wait has not begun.
                    let stalled = progress_at.elapsed() >= self.stall_reopen;
                    if wanted && outstanding > 0 && !updates.awaiting() && stalled {
                        let waited = progress_at.elapsed();
                        // A build longer than the wait would be leased again at every reopen.
                        self.stall_reopen = (self.stall_reopen * 2).min(self.stall_most);
                        tracing::warn!(step = *floor, ?waited, next_wait = ?self.stall_reopen, "no batch arrived; opening the session again");
                        break SessionEnd::Reopen;
                    }
                }
            }
        };
        drop(streams);
        // Batches that came after the end are not taken (the next session leases them
        // again): their slots go back to the queue.
        while let Ok(arrival) = arrivals.try_recv() {
            if let Arrival::Batch { batch, .. } = arrival {
                batch.give_back(&self.free_slots);
            }
        }
        if !updates.all_applied() {
            if matches!(end, SessionEnd::Reopen) {
                // Their credits would land on the reopened session's window if the coordinator
                // took them after the reopen: given a moment to be applied first (an update
                // that asks for its answer says when).
                let flush = SessionUpdateRequest {
                    session: Some(token),
                    ..SessionUpdateRequest::default()
                };
                if updates.awaiting() || updates.send(flush, false).is_ok() {
                    let applied =
                        async { while !updates.all_applied() && updates.answer().await.is_ok() {} };
                    let _ = tokio::time::timeout(REOPEN_WAIT, applied).await;
                }
            } else {
                // The acks of the updates not known applied go again with the last ones (an
                // ack taken twice is one), in one call before the close: the loader gives the
                // end a short while.
                acks_on_the_way.extend_from_slice(&acks);
                acks = acks_on_the_way;
            }
        }
        if matches!(end, SessionEnd::Done | SessionEnd::Stop) {
            let last = SessionUpdateRequest {
                session: Some(token),
                acknowledged: acks,
                stats: Some(client_stats(&self.monitor)),
                // The list held is current or not, it is not needed any more.
                workers_version: updates.workers_version(),
                ..SessionUpdateRequest::default()
            };
            close_session(&mut client, last).await;
        }
        end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stall_wait_grows_to_64_times_its_setting_but_not_past_300_s() {
        let ms = Duration::from_millis;
        assert_eq!(stall_most(ms(5)), ms(320));
        assert_eq!(stall_most(Duration::from_secs(10)), STALL_REOPEN_MOST);
        // A setting past the bound stays what it is; one meant to never reopen overflows not.
        assert_eq!(
            stall_most(Duration::from_secs(400)),
            Duration::from_secs(400)
        );
        assert_eq!(stall_most(Duration::MAX), Duration::MAX);
    }
}
