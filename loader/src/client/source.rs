//! The batch-source seam. The embedded producer ([`super::embedded`]) and the remote client
//! ([`super::remote`]) both implement [`BatchSource`]: they build (or fetch) the batches of the
//! steps they are asked for, into the slots they are given, and hand them back in any order.
//! Everything above the seam (reorder, slot pool, prefetch controller, stall figures, resume,
//! epoch-boundary prefetch, bad-sample reports) lives once, in [`super::stream`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use stoker_pipeline::Batch;
use stoker_pipeline::EpochPlan;
use stoker_proto::v1::JobSpec;

use super::slots::Slot;
use crate::error::{Error, Result};
use stoker_dashboard::LoaderMonitor;

/// What a source knows about its job once it is open.
#[derive(Debug, Clone, Default)]
pub struct SourceInfo {
    /// Steps in every epoch of this rank.
    pub steps_per_epoch: u64,
    /// Samples in the dataset.
    pub num_samples: u64,
    /// Class names, in label order (empty for sources without classes).
    pub class_names: Vec<String>,
    /// Bytes the largest batch needs in a slot.
    pub batch_bytes: usize,
    /// Decode threads in this process (0 when the batches are built elsewhere).
    pub threads: usize,
    /// This rank.
    pub rank: u32,
    /// The depth the prefetch controller starts from.
    pub initial_depth: usize,
    /// Where the batches come from, for timeout messages ("on 4 decode threads").
    pub waiting_on: String,
    /// The one epoch a job resumed on another world size serves (`JobSpec.resized_epoch`);
    /// `None`: every epoch.
    pub only_epoch: Option<u64>,
    /// Slots in one shared mapping ([`super::slots::SlotPool::shared`]), for sources whose
    /// batches other processes write.
    pub shared_slots: bool,
    /// The fingerprint of the datasets ([`stoker_pipeline::dataset_fingerprint`]): this process's,
    /// or as a coordinator's workers gave it (`None` from workers that give none, and for
    /// Python datasets).
    pub dataset_fingerprint: Option<String>,
    /// What opening the datasets in this process found that the user should be told once
    /// ([`stoker_datasets::SampleSource::notices`]); empty when they are opened elsewhere (the
    /// worker daemons log theirs).
    pub notices: Vec<String>,
}

/// A finished batch, and how long building it took once started (queueing excluded: the
/// controller sizes the queue, so its latency input must not grow with the queue).
pub struct Built {
    /// The batch's step.
    pub step: u64,
    /// Time spent building it.
    pub service: Duration,
    /// The batch, or why it could not be built.
    pub result: Result<Batch>,
}

/// Something that builds the batches of a job.
pub trait BatchSource: Send + Sync {
    /// What the source knows about its job.
    fn info(&self) -> &SourceInfo;

    /// Starts `epoch`. Steps from `start_step` on are then asked for, in order, through the
    /// returned feed; `monitor` reads the loader's figures (a remote source reports them).
    fn open_epoch(
        &self,
        epoch: u64,
        start_step: u64,
        monitor: LoaderMonitor,
    ) -> Result<Box<dyn EpochFeed>>;

    /// The object cache's counters, for sources read through one.
    fn cache_stats(&self) -> Option<stoker_datasets::CacheStats> {
        None
    }

    /// The job's id at the coordinator that serves it (the dashboard's "job ID ..."), for a
    /// source that has one: the id it reads under now, a new one once the coordinator forgot
    /// the job and it registered it again.
    fn coordinator_job(&self) -> Option<u64> {
        None
    }

    /// What the source is reading right now, or why it waits, for a timeout's message (`";
    /// the decode threads are reading ..."`), or "" where it cannot tell.
    fn reading_now(&self) -> String {
        String::new()
    }

    /// A source of `spec` (this source's job with one epoch resumed on another world size,
    /// `JobSpec.resized_epoch`) that builds its batches on this source's workers; `None` when
    /// this kind of source cannot share them (the caller then starts a source of its own).
    fn beside(&self, spec: JobSpec) -> Result<Option<Box<dyn BatchSource>>> {
        let _ = spec;
        Ok(None)
    }
}

/// One epoch of a [`BatchSource`]. Dropping it cancels the work not yet started.
pub trait EpochFeed: Send + Sync {
    /// Steps in the epoch.
    fn steps(&self) -> u64;

    /// Asks for `step`, to be built into `slot` (steps are asked for in increasing order).
    fn request(&mut self, step: u64, slot: Slot);

    /// Waits up to `timeout` for a finished batch; `Ok(None)` when none came in time, an error
    /// when no batch can come any more.
    fn recv(&mut self, timeout: Duration) -> Result<Option<Built>>;

    /// Time the producer had nothing asked of it so far: a wait behind an idle producer is
    /// stall that a deeper queue would have prevented; a wait behind a busy one is not.
    fn producer_idle(&self) -> Duration;
}

/// The time a producer had nothing asked of it, added up by the producer and read by its feeds
/// ([`EpochFeed::producer_idle`]); and whether a producer thread holding
/// [`IdleClock::running`] died of a panic.
#[derive(Debug, Clone, Default)]
pub struct IdleClock {
    idle_ns: Arc<AtomicU64>,
    panicked: Arc<AtomicBool>,
}

impl IdleClock {
    /// Counts `idle` more.
    pub fn add(&self, idle: Duration) {
        self.idle_ns
            .fetch_add(idle.as_nanos() as u64, Ordering::Relaxed);
    }

    /// The idle time so far.
    pub fn total(&self) -> Duration {
        Duration::from_nanos(self.idle_ns.load(Ordering::Relaxed))
    }

    /// Held by a producer thread for as long as it runs: unwound by a panic, it marks the
    /// producer dead, and the feeds' waits ([`TaskQueue::recv`]) fail at once saying so
    /// instead of waiting out the loader's deadline for batches that will never come.
    pub fn running(&self) -> ProducerRunning {
        ProducerRunning(Arc::clone(&self.panicked))
    }

    /// Whether a producer thread died of a panic.
    pub fn producer_panicked(&self) -> bool {
        self.panicked.load(Ordering::Acquire)
    }
}

/// A running producer's mark ([`IdleClock::running`]).
#[derive(Debug)]
pub struct ProducerRunning(Arc<AtomicBool>);

impl Drop for ProducerRunning {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::Release);
        }
    }
}

/// Waits up to `timeout` for what a producer sends a feed: `Ok(None)` when nothing came in
/// time, [`Error::Stopped`] saying `stopped` when the producer is gone.
pub fn receive<T>(receiver: &Receiver<T>, timeout: Duration, stopped: &str) -> Result<Option<T>> {
    match receiver.recv_timeout(timeout) {
        Ok(sent) => Ok(Some(sent)),
        Err(RecvTimeoutError::Timeout) => Ok(None),
        Err(RecvTimeoutError::Disconnected) => Err(Error::Stopped(stopped.into())),
    }
}

/// The channels of a feed whose producer takes its tasks from a queue (the embedded decode
/// pool, a Python dataset's lanes): the queue requests go into, the channel the built batches
/// come back on, the epoch's cancel flag (set when the feed is dropped, so its queued tasks are
/// skipped) and the producer's idle clock.
#[derive(Debug)]
pub struct TaskQueue<T> {
    tasks: Sender<T>,
    reply: Sender<Built>,
    receiver: Receiver<Built>,
    cancelled: Arc<AtomicBool>,
    idle: IdleClock,
    /// The producer, in messages ("the decode pool").
    producer: &'static str,
    /// What `recv` says once the producer is gone.
    stopped: String,
}

impl<T> TaskQueue<T> {
    /// A new epoch's channels over the producer's queue `tasks`.
    pub fn new(tasks: Sender<T>, idle: IdleClock, producer: &'static str) -> TaskQueue<T> {
        let (reply, receiver) = crossbeam_channel::unbounded();
        TaskQueue {
            tasks,
            reply,
            receiver,
            cancelled: Arc::new(AtomicBool::new(false)),
            idle,
            producer,
            stopped: format!("{producer} stopped"),
        }
    }

    /// Where a task sends its built batch.
    pub fn reply(&self) -> Sender<Built> {
        self.reply.clone()
    }

    /// The epoch's cancel flag, for its tasks.
    pub fn cancelled(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.cancelled)
    }

    /// Queues the task of `step`; a producer that is gone is logged (the feed's next `recv`
    /// reports it).
    pub fn send(&self, step: u64, task: T) {
        if self.tasks.send(task).is_err() {
            tracing::error!(step, producer = self.producer, "the producer is gone");
        }
    }

    /// [`EpochFeed::recv`] of the feed; an error once nothing more can come because the
    /// producer thread died of a panic (what it sent before is still received first).
    pub fn recv(&self, timeout: Duration) -> Result<Option<Built>> {
        let received = receive(&self.receiver, timeout, &self.stopped)?;
        if received.is_none() && self.idle.producer_panicked() {
            return Err(Error::Stopped(format!(
                "{} stopped: its producer thread panicked (the panic's message is in the log)",
                self.producer
            )));
        }
        Ok(received)
    }

    /// [`EpochFeed::producer_idle`] of the feed.
    pub fn producer_idle(&self) -> Duration {
        self.idle.total()
    }
}

/// What a queue's producer needs besides the step to build it (the embedded pool's job, a
/// Python dataset's sample sizes); it sizes each batch's slot.
pub trait StepContext: Clone + Send + Sync + 'static {
    /// Bytes of a batch of `samples` samples.
    fn batch_bytes(&self, samples: usize) -> usize;
}

/// One step for a queue's producer to build into `slot`, sent back on `reply` unless the
/// epoch was `cancelled` first.
#[derive(Debug)]
pub struct StepTask<C> {
    /// What the producer needs besides the step.
    pub context: C,
    /// The epoch's plan.
    pub plan: Arc<EpochPlan>,
    /// The step to build.
    pub step: u64,
    /// Where to build it, sized for its batch.
    pub slot: Slot,
    /// Where the built batch goes.
    pub reply: Sender<Built>,
    /// The epoch's cancel flag.
    pub cancelled: Arc<AtomicBool>,
}

/// One epoch of a producer that takes its steps from a queue (the embedded decode pool, a
/// Python dataset's lanes): each request sizes its slot and is queued as a [`StepTask`].
#[derive(Debug)]
pub struct QueueFeed<C> {
    context: C,
    plan: Arc<EpochPlan>,
    queue: TaskQueue<StepTask<C>>,
}

impl<C: StepContext> QueueFeed<C> {
    /// The epoch of `plan`, its steps queued on `queue`.
    pub fn new(context: C, plan: Arc<EpochPlan>, queue: TaskQueue<StepTask<C>>) -> Self {
        QueueFeed {
            context,
            plan,
            queue,
        }
    }
}

impl<C: StepContext> EpochFeed for QueueFeed<C> {
    fn steps(&self) -> u64 {
        self.plan.steps()
    }

    fn request(&mut self, step: u64, mut slot: Slot) {
        slot.set_len(self.context.batch_bytes(self.plan.batch_len(step)));
        let task = StepTask {
            context: self.context.clone(),
            plan: Arc::clone(&self.plan),
            step,
            slot,
            reply: self.queue.reply(),
            cancelled: self.queue.cancelled(),
        };
        self.queue.send(step, task);
    }

    fn recv(&mut self, timeout: Duration) -> Result<Option<Built>> {
        self.queue.recv(timeout)
    }

    fn producer_idle(&self) -> Duration {
        self.queue.producer_idle()
    }
}

impl<T> Drop for TaskQueue<T> {
    fn drop(&mut self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_producer_dead_of_a_panic_fails_the_wait_at_once_after_what_it_sent() {
        let (tasks, queue) = crossbeam_channel::unbounded::<(u64, Sender<Built>)>();
        let idle = IdleClock::default();
        let producer = {
            let idle = idle.clone();
            std::thread::spawn(move || {
                let _running = idle.running();
                let (step, reply) = queue.recv().expect("a first task");
                let built = Built {
                    step,
                    service: Duration::ZERO,
                    result: Ok(Batch::default()),
                };
                reply.send(built).expect("the feed is there");
                let (step, _) = queue.recv().expect("a second task");
                panic!("the producer fails at step {step}");
            })
        };
        let feed = TaskQueue::new(tasks, idle, "the decode pool");
        feed.send(0, (0, feed.reply()));
        feed.send(1, (1, feed.reply()));
        assert!(producer.join().is_err());
        let first = feed.recv(Duration::from_secs(5)).unwrap().unwrap();
        assert_eq!(first.step, 0);
        let Err(error) = feed.recv(Duration::from_millis(10)) else {
            panic!("the wait after a producer's panic did not fail");
        };
        assert!(
            error.to_string().contains("the decode pool stopped"),
            "{error}"
        );
        assert!(error.to_string().contains("panicked"), "{error}");
    }

    #[test]
    fn a_producer_that_ended_without_a_panic_leaves_waits_to_their_deadline() {
        let (tasks, _queue) = crossbeam_channel::unbounded::<u64>();
        let idle = IdleClock::default();
        {
            let _running = idle.running();
        }
        let feed = TaskQueue::new(tasks, idle, "the decode pool");
        assert!(feed.recv(Duration::from_millis(10)).unwrap().is_none());
    }
}
