//! [`EpochStream`]: the batches of one epoch in step order, over any [`EpochFeed`]. It keeps
//! the prefetch depth (asking the feed for steps, each with a slot from the pool), reorders
//! what arrives, feeds the controller, records the stall figures, and enforces the deadline.
//! Near the end of an epoch it starts the next one's first steps, so an epoch does not open
//! with a stall; the loader hands that start to the next epoch's stream, or drops it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stoker_pipeline::Batch;

use super::loader::Core;
use super::source::EpochFeed;
use crate::error::{Error, Result};

/// How often a waiting `next()` asks whether it should give up (Ctrl-C).
pub const INTERRUPT_CHECK: Duration = Duration::from_millis(100);
/// How long `next()` waits with every slot held by the consumer before it warns: nothing but
/// the consumer can end that wait (a single-threaded loop keeping its batches never will), so
/// it says so long before the timeout.
const SLOTS_HELD_WARNING: Duration = Duration::from_secs(10);

/// Calls over which the producer's idle time is weighed against a stall.
const IDLE_WINDOW_CALLS: usize = 64;

/// The next epoch's feed, started before its stream exists.
pub(crate) struct Successor {
    pub(crate) epoch: u64,
    feed: Box<dyn EpochFeed>,
    /// Steps already asked for (from 0).
    dispatched: u64,
}

/// The batches of one epoch, in step order. Dropping it cancels the work not yet started
/// (except the next epoch's start, which the loader keeps for the next stream).
pub struct EpochStream {
    core: Arc<Core>,
    feed: Box<dyn EpochFeed>,
    epoch: u64,
    steps: u64,
    ready: BTreeMap<u64, Result<Batch>>,
    next_step: u64,
    next_to_dispatch: u64,
    /// Batches allowed in flight or waiting (besides the one the consumer holds).
    prefetch: usize,
    /// Producer idle time the controller has seen, and the recent calls' share of it.
    idle_seen: Duration,
    recent_idle: VecDeque<Duration>,
    arrived_latencies: Vec<Duration>,
    last_return: Option<Instant>,
    successor: Option<Successor>,
    /// Whether starting the next epoch failed once (then it is not tried again).
    successor_failed: bool,
    /// An error the feed gave [`EpochStream::try_next_batch`], which does not raise: the next
    /// [`EpochStream::next_batch`] does (a feed may hand out an error once only).
    pending: Option<Error>,
    /// Whether it gave an error other than an interruption: a stream to start again, not go on
    /// with (a remote session that stopped gives its error once, then nothing).
    failed: bool,
}

impl EpochStream {
    pub(crate) fn start(
        core: Arc<Core>,
        epoch: u64,
        start_step: u64,
        feed: Box<dyn EpochFeed>,
    ) -> EpochStream {
        let mut stream = Self::new(core, epoch, start_step, feed);
        stream.top_up();
        stream
    }

    pub(crate) fn adopt(core: Arc<Core>, successor: Successor) -> EpochStream {
        let Successor {
            epoch,
            feed,
            dispatched,
        } = successor;
        let mut stream = Self::new(core, epoch, 0, feed);
        stream.next_to_dispatch = dispatched;
        stream.top_up();
        stream
    }

    fn new(core: Arc<Core>, epoch: u64, start_step: u64, feed: Box<dyn EpochFeed>) -> Self {
        let idle_seen = feed.producer_idle();
        EpochStream {
            prefetch: core.prefetch_depth(),
            steps: feed.steps(),
            core,
            feed,
            epoch,
            ready: BTreeMap::new(),
            next_step: start_step,
            next_to_dispatch: start_step,
            idle_seen,
            recent_idle: VecDeque::new(),
            arrived_latencies: Vec::new(),
            last_return: None,
            successor: None,
            successor_failed: false,
            pending: None,
            failed: false,
        }
    }

    /// The epoch being walked.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Steps in the epoch.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The step the next batch will have.
    pub fn next_step(&self) -> u64 {
        self.next_step
    }

    /// Whether this stream, of `loader`, is `epoch` at `start_step`, as [`crate::Loader::epoch`]
    /// would start it now (no split set since that its batches may not carry, no error given
    /// but an interruption: a failed stream, a remote session stopped, is started again): it
    /// can go on, keeping what it built ahead, and the time until its next batch is asked for
    /// is no step of the consumer's. A loop that left an epoch early and takes it up again in
    /// a new iterator had every batch built ahead cancelled and built again.
    pub fn goes_on(&mut self, loader: &crate::Loader, epoch: u64, start_step: u64) -> bool {
        let same = Arc::ptr_eq(&self.core, &loader.core)
            && !self.failed
            && self.pending.is_none()
            && self.epoch == epoch
            && self.next_step == start_step
            && !self
                .core
                .discard_started
                .load(std::sync::atomic::Ordering::Relaxed);
        if same {
            self.last_return = None;
        }
        same
    }

    /// Batches asked for and not yet yielded (this epoch's, and the next one's started early).
    pub fn in_flight(&self) -> usize {
        (self.next_to_dispatch - self.next_step) as usize
            + self.successor.as_ref().map_or(0, |s| s.dispatched as usize)
    }

    /// Asks for steps until `prefetch` are in flight or no free slot is left; past the last
    /// step, asks for the next epoch's first steps.
    fn top_up(&mut self) {
        while self.in_flight() < self.prefetch {
            if self.next_to_dispatch < self.steps {
                let Some(slot) = self.core.slots.try_take(self.core.slots.slot_bytes()) else {
                    return;
                };
                self.feed.request(self.next_to_dispatch, slot);
                self.next_to_dispatch += 1;
                continue;
            }
            if !self.core.prefetch_next_epoch || self.successor_failed {
                return;
            }
            if self.successor.is_none() {
                let next = self.epoch + 1;
                match self.core.source.open_epoch(next, 0, self.core.monitor()) {
                    Ok(feed) => {
                        self.successor = Some(Successor {
                            epoch: next,
                            feed,
                            dispatched: 0,
                        })
                    }
                    Err(error) => {
                        tracing::debug!(%error, epoch = next, "cannot start the next epoch early");
                        self.successor_failed = true;
                        return;
                    }
                }
            }
            let Some(successor) = self.successor.as_mut() else {
                return;
            };
            if successor.dispatched >= successor.feed.steps() {
                return;
            }
            let Some(slot) = self.core.slots.try_take(self.core.slots.slot_bytes()) else {
                return;
            };
            successor.feed.request(successor.dispatched, slot);
            successor.dispatched += 1;
        }
    }

    /// Counts a wait that ended without a batch (timeout, interruption) in the stall figures.
    fn record_wait(&self, waited: Duration) {
        if let Ok(mut stats) = self.core.stats.lock() {
            stats.record_wait(waited, self.next_step == 0);
        }
    }

    /// Feeds the controller what this call saw and takes its new depth.
    fn adjust_depth(&mut self, started: Instant, waited: Duration) {
        // None on the stream's first call: no step of the consumer's came before it here, and
        // a step of 0 would seed the trainer's estimate at 0 (which its burst clip then holds
        // there) and count the whole wait as this epoch's first pace.
        let step_time = self
            .last_return
            .map(|at| started.saturating_duration_since(at));
        self.last_return = Some(Instant::now());
        let Some(controller) = &self.core.controller else {
            // Nothing reads the arrivals' latencies at a fixed depth (kept, they grew by one
            // a batch for the whole epoch).
            self.arrived_latencies.clear();
            return;
        };
        // A wait while the producer never ran dry means building is slower than the consumer:
        // a deeper queue would not shorten it, only cost memory. Only waits behind an idle
        // producer count as stall, and the consumer's pace is what it actually got (step plus
        // wait), so Little's law sizes the queue to the real flow.
        let idle_total = self.feed.producer_idle();
        let idle = idle_total.saturating_sub(self.idle_seen);
        self.idle_seen = idle_total;
        self.recent_idle.push_back(idle);
        if self.recent_idle.len() > IDLE_WINDOW_CALLS {
            self.recent_idle.pop_front();
        }
        // If the producer sat idle for at least as long as this wait over the recent calls,
        // a deeper queue would have used that time to prevent it (bursty consumers idle the
        // producer during a long step and stall a few steps later, when the queue drains).
        let recent_idle: Duration = self.recent_idle.iter().sum();
        let gated = |wait: Duration| {
            if recent_idle >= wait {
                wait
            } else {
                Duration::ZERO
            }
        };
        // The GPU idle the consumer reported (its stream waiting for a batch while the loop
        // ran ahead) is stall too, gated the same way.
        let stall = gated(waited).max(gated(self.core.take_gpu_idle()));
        if let Ok(mut controller) = controller.lock() {
            match step_time {
                Some(step_time) => {
                    controller.observe_trainer(step_time);
                    controller.observe(stall, step_time + waited, &self.arrived_latencies);
                }
                None => controller.observe_arrivals(&self.arrived_latencies),
            }
            // The controller counts the batch the consumer holds; the stream does not.
            self.prefetch = controller.target_depth().saturating_sub(1).max(1);
            tracing::trace!(
                step = self.next_step - 1,
                waited_us = waited.as_micros() as u64,
                step_us = step_time.unwrap_or_default().as_micros() as u64,
                depth = self.prefetch,
                in_flight = self.in_flight(),
                "loader.prefetch"
            );
        }
        self.arrived_latencies.clear();
    }

    /// The next batch in step order, `None` at the end of the epoch.
    pub fn next_batch(&mut self) -> Result<Option<Batch>> {
        self.next_batch_checked(&mut || false)
    }

    /// Like [`EpochStream::next_batch`], asking `interrupted` every [`INTERRUPT_CHECK`] while
    /// it waits, and giving up with [`Error::Interrupted`] when it says so (Ctrl-C in Python).
    pub fn next_batch_checked(
        &mut self,
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Result<Option<Batch>> {
        let next = self.wait_for_next(interrupted);
        if next
            .as_ref()
            .is_err_and(|error| !matches!(error, Error::Interrupted))
        {
            self.failed = true;
        }
        next
    }

    /// [`EpochStream::next_batch_checked`], but for what a failure leaves.
    fn wait_for_next(&mut self, interrupted: &mut dyn FnMut() -> bool) -> Result<Option<Batch>> {
        if let Some(error) = self.pending.take() {
            return Err(error);
        }
        if self.next_step >= self.steps {
            return Ok(None);
        }
        let started = Instant::now();
        let step = self.next_step;
        let deadline = self.core.deadline;
        if !self.ready.contains_key(&step) {
            if let Ok(mut stats) = self.core.stats.lock() {
                stats.wait_began(started, step == 0);
            }
        }
        let mut warned = false;
        while !self.ready.contains_key(&step) {
            let remaining = deadline.saturating_sub(started.elapsed());
            let slice = remaining.min(INTERRUPT_CHECK);
            if self.next_to_dispatch == step {
                // Nothing in flight: every slot is held by batches the consumer kept.
                let slots = &self.core.slots;
                if let Some(slot) = slots.take_timeout(slots.slot_bytes(), slice) {
                    self.feed.request(step, slot);
                    self.next_to_dispatch += 1;
                    self.top_up();
                    continue;
                }
                if !warned && started.elapsed() >= SLOTS_HELD_WARNING.min(deadline / 2) {
                    warned = true;
                    tracing::warn!(
                        step,
                        capacity = slots.capacity(),
                        waited = ?started.elapsed(),
                        timeout = ?deadline,
                        "every batch slot is held by batches the training loop kept (a list of \
                         them, a tensor stored); next() waits until one is released or the \
                         timeout passes"
                    );
                }
                if started.elapsed() >= deadline {
                    let error = Error::SlotsHeld {
                        step,
                        capacity: slots.capacity(),
                        waited: started.elapsed(),
                    };
                    // Returned to the caller, which raises it: not logged as well.
                    tracing::debug!(%error, "loader.next found no free batch slot");
                    self.record_wait(started.elapsed());
                    return Err(error);
                }
                if interrupted() {
                    self.record_wait(started.elapsed());
                    return Err(Error::Interrupted);
                }
                continue;
            }
            match self.feed.recv(slice) {
                Ok(Some(built)) => {
                    self.arrived_latencies.push(built.service);
                    self.ready.insert(built.step, built.result);
                }
                Ok(None) if started.elapsed() < deadline => {
                    if interrupted() {
                        self.record_wait(started.elapsed());
                        return Err(Error::Interrupted);
                    }
                }
                Ok(None) => {
                    let error = Error::Timeout {
                        epoch: self.epoch,
                        step,
                        rank: self.core.source.info().rank,
                        waited: started.elapsed(),
                        in_flight: self.in_flight(),
                        waiting_on: format!(
                            "{}{}",
                            self.core.source.info().waiting_on,
                            self.core.source.reading_now()
                        ),
                    };
                    tracing::debug!(%error, "loader.next timed out");
                    self.record_wait(started.elapsed());
                    return Err(error);
                }
                Err(error) => {
                    self.record_wait(started.elapsed());
                    return Err(error);
                }
            }
        }
        self.hand_out(started, step).map(Some)
    }

    /// The next batch in step order if it has already arrived, without waiting; `None` when it
    /// has not (or at the end of the epoch). For a consumer that starts work on the next
    /// batch early (the device stage copies it while the GPU runs the current step).
    pub fn try_next_batch(&mut self) -> Result<Option<Batch>> {
        // An error already seen waits for `next_batch`: asking the feed again would get its
        // "stopped" in the error's place.
        if self.next_step >= self.steps || self.pending.is_some() {
            return Ok(None);
        }
        let step = self.next_step;
        while !self.ready.contains_key(&step) {
            match self.feed.recv(Duration::ZERO) {
                Ok(Some(built)) => {
                    self.arrived_latencies.push(built.service);
                    self.ready.insert(built.step, built.result);
                }
                Ok(None) => return Ok(None),
                // Raised by the next `next_batch`, which waits: a remote feed hands an error
                // out once, so it is kept here rather than asked for again.
                Err(error) => {
                    self.pending = Some(error);
                    return Ok(None);
                }
            }
        }
        let handed = self.hand_out(Instant::now(), step);
        self.failed |= handed.is_err();
        handed.map(Some)
    }

    /// Takes `step` (arrived) out of the reorder buffer, feeds the controller what this call
    /// saw (started at `started`), asks for more, and counts the batch.
    fn hand_out(&mut self, started: Instant, step: u64) -> Result<Batch> {
        let waited = started.elapsed();
        // The time since the batch before was handed out: the pace the consumer got.
        let interval = self
            .last_return
            .map(|at| started.saturating_duration_since(at) + waited);
        let result = self
            .ready
            .remove(&step)
            .ok_or_else(|| Error::Stopped(format!("step {step} vanished")))?;
        self.next_step += 1;
        self.adjust_depth(started, waited);
        self.top_up();
        let batch = match result {
            Ok(batch) => batch,
            Err(error) => {
                // The wait ends here too: left open, every later reading would count the time
                // since as the consumer waiting, and the batch after would take it back.
                if let Ok(mut stats) = self.core.stats.lock() {
                    stats.record_wait(waited, step == 0);
                }
                return Err(error);
            }
        };
        if let (Some(lane), Some(interval)) = (&self.core.lane, interval) {
            lane.note_delivered(self.epoch, step, batch.sample_indices.len(), interval);
        }
        if let Some(tensor) = batch.tensors.first() {
            // A pinned pool's slot is page-locked when its first batch goes out.
            self.core.slots.pin_for_hand_out(tensor.data.as_ptr());
        }
        if let Ok(mut stats) = self.core.stats.lock() {
            stats.record_batch(&batch, waited, step == 0, self.in_flight(), self.prefetch);
        }
        Ok(batch)
    }
}

impl Iterator for EpochStream {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_batch().transpose()
    }
}

impl Drop for EpochStream {
    fn drop(&mut self) {
        // The next epoch's start goes to the loader, for the next stream to take over; an older
        // one still waiting there is dropped (cancelled).
        if let Some(successor) = self.successor.take() {
            if let Ok(mut slot) = self.core.successor.lock() {
                *slot = Some(successor);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::loader::{Loader, LoaderOptions};
    use crate::client::slots::Slot;
    use crate::client::source::{BatchSource, Built, SourceInfo};
    use stoker_dashboard::LoaderMonitor;

    /// A source whose feed fails the way a remote one does: its error is handed out once,
    /// then only "stopped".
    struct FailsOnce {
        info: SourceInfo,
    }

    struct FailingFeed {
        told: bool,
        held: Vec<Slot>,
    }

    impl BatchSource for FailsOnce {
        fn info(&self) -> &SourceInfo {
            &self.info
        }

        fn open_epoch(&self, _: u64, _: u64, _: LoaderMonitor) -> Result<Box<dyn EpochFeed>> {
            Ok(Box::new(FailingFeed {
                told: false,
                held: Vec::new(),
            }))
        }
    }

    impl EpochFeed for FailingFeed {
        fn steps(&self) -> u64 {
            3
        }

        fn request(&mut self, _: u64, slot: Slot) {
            self.held.push(slot);
        }

        fn recv(&mut self, _: Duration) -> Result<Option<Built>> {
            if std::mem::replace(&mut self.told, true) {
                return Err(Error::Stopped("the session driver stopped".into()));
            }
            Err(Error::Stopped("no worker serves this job".into()))
        }

        fn producer_idle(&self) -> Duration {
            Duration::ZERO
        }
    }

    /// A source whose one batch fails to build.
    struct BuildFails {
        info: SourceInfo,
    }

    struct BuildFailsFeed {
        requested: Vec<(u64, Slot)>,
    }

    impl BatchSource for BuildFails {
        fn info(&self) -> &SourceInfo {
            &self.info
        }

        fn open_epoch(&self, _: u64, _: u64, _: LoaderMonitor) -> Result<Box<dyn EpochFeed>> {
            Ok(Box::new(BuildFailsFeed {
                requested: Vec::new(),
            }))
        }
    }

    impl EpochFeed for BuildFailsFeed {
        fn steps(&self) -> u64 {
            1
        }

        fn request(&mut self, step: u64, slot: Slot) {
            self.requested.push((step, slot));
        }

        fn recv(&mut self, wait: Duration) -> Result<Option<Built>> {
            match self.requested.pop() {
                Some((step, _slot)) => Ok(Some(Built {
                    step,
                    service: Duration::ZERO,
                    result: Err(Error::Stopped("a sample could not be read".into())),
                })),
                None => {
                    std::thread::sleep(wait);
                    Ok(None)
                }
            }
        }

        fn producer_idle(&self) -> Duration {
            Duration::ZERO
        }
    }

    /// A source whose batches are built as soon as they are asked for.
    struct Ready {
        info: SourceInfo,
    }

    struct ReadyFeed {
        steps: u64,
        requested: std::collections::VecDeque<(u64, Slot)>,
    }

    impl BatchSource for Ready {
        fn info(&self) -> &SourceInfo {
            &self.info
        }

        fn open_epoch(&self, _: u64, _: u64, _: LoaderMonitor) -> Result<Box<dyn EpochFeed>> {
            Ok(Box::new(ReadyFeed {
                steps: self.info.steps_per_epoch,
                requested: Default::default(),
            }))
        }
    }

    impl EpochFeed for ReadyFeed {
        fn steps(&self) -> u64 {
            self.steps
        }

        fn request(&mut self, step: u64, slot: Slot) {
            self.requested.push_back((step, slot));
        }

        fn recv(&mut self, _: Duration) -> Result<Option<Built>> {
            Ok(self.requested.pop_front().map(|(step, _slot)| Built {
                step,
                service: Duration::from_micros(1),
                result: Ok(Batch::default()),
            }))
        }

        fn producer_idle(&self) -> Duration {
            Duration::ZERO
        }
    }

    /// At a fixed depth no controller reads the arrivals' latencies: they were kept all the
    /// same, one a batch for the whole epoch (a text epoch of millions of steps: megabytes).
    #[test]
    fn a_fixed_depth_keeps_no_latency_per_batch() -> Result<()> {
        let source = Ready {
            info: SourceInfo {
                steps_per_epoch: 1000,
                batch_bytes: 64,
                initial_depth: 2,
                waiting_on: "on a test feed".into(),
                ..SourceInfo::default()
            },
        };
        let options = LoaderOptions {
            prefetch: 2,
            ..LoaderOptions::default()
        };
        let loader = Loader::with_source(Box::new(source), options)?;
        let mut stream = loader.epoch(0, 0)?;
        let mut batches = 0;
        while stream.next_batch()?.is_some() {
            batches += 1;
        }
        assert_eq!(batches, 1000);
        assert!(
            stream.arrived_latencies.len() <= 2,
            "{} latencies kept",
            stream.arrived_latencies.len()
        );
        // The loader gone (and its stream), its pool is closed: no slot of it kept for later.
        let pool = Arc::clone(loader.slots());
        drop(stream);
        assert!(!pool.is_closed(), "the loader still uses it");
        drop(loader);
        assert!(pool.is_closed());
        Ok(())
    }

    #[test]
    fn a_batch_that_fails_ends_the_wait_it_was_waited_for_in() -> Result<()> {
        let source = BuildFails {
            info: SourceInfo {
                steps_per_epoch: 1,
                batch_bytes: 64,
                initial_depth: 1,
                waiting_on: "on a test feed".into(),
                ..SourceInfo::default()
            },
        };
        let loader = Loader::with_source(Box::new(source), LoaderOptions::default())?;
        let mut stream = loader.epoch(0, 0)?;
        assert!(stream.next_batch().is_err());
        let after = loader.stats().wait_s;
        std::thread::sleep(Duration::from_millis(50));
        // Left open, the wait went on counting with no one in `next()`.
        assert_eq!(loader.stats().wait_s, after);
        // A monitor outliving its loader keeps none of its batch buffers.
        let monitor = loader.monitor();
        assert!(monitor.snapshot().slot_capacity > 0);
        drop(stream);
        drop(loader);
        assert_eq!(monitor.snapshot().slot_capacity, 0);
        Ok(())
    }

    #[test]
    fn an_error_seen_by_try_next_batch_is_raised_by_the_next_wait() -> Result<()> {
        let source = FailsOnce {
            info: SourceInfo {
                steps_per_epoch: 3,
                batch_bytes: 64,
                initial_depth: 2,
                waiting_on: "on a test feed".into(),
                ..SourceInfo::default()
            },
        };
        let loader = Loader::with_source(Box::new(source), LoaderOptions::default())?;
        let mut stream = loader.epoch(0, 0)?;
        assert!(stream.try_next_batch()?.is_none());
        // Asked again before the wait: the error seen first is kept.
        assert!(stream.try_next_batch()?.is_none());
        let Err(error) = stream.next_batch() else {
            panic!("the feed's error was lost");
        };
        assert!(
            error.to_string().contains("no worker serves this job"),
            "{error}"
        );
        Ok(())
    }
}
