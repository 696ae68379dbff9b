//! The embedded loader: one process plans the epoch, decodes on its own thread pool and yields
//! batches in step order, with a bounded number of batches in flight.
//!
//! Each batch is one rayon task whose samples run in parallel on the same pool, so the first
//! batch arrives after one batch's worth of work spread over every thread. At most `prefetch`
//! batches are being built or waiting at any time: memory stays bounded however slowly the
//! consumer pulls. Every wait has a deadline, and a timeout names the step it waited for.

use std::collections::{BTreeMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use stoker_proto::v1::{Batch, JobSpec};

use crate::error::{Error, Result};
use crate::job::Job;
use crate::planner::EpochPlan;
use crate::prefetch::{ControllerConfig, ControllerSnapshot, PrefetchController};
use crate::slots::SlotPool;
use crate::stats::{LoaderStats, StatsRecorder};

/// How the embedded loader runs.
#[derive(Debug, Clone)]
pub struct LoaderOptions {
    /// Decode threads (0: one per available core).
    pub threads: usize,
    /// Batches in flight or waiting: 0 lets the prefetch controller size it from the stall,
    /// latency and step time it observes; any other value fixes it.
    pub prefetch: usize,
    /// Memory budget for batches in flight or waiting (the controller never goes past it).
    pub max_prefetch_bytes: u64,
    /// The longest `next()` waits for one batch before it fails with [`Error::Timeout`].
    pub deadline: Duration,
    /// Batches the consumer may keep alive beyond the prefetch before the loader waits for
    /// one to be released: the slot pool holds `prefetch + max_held_batches` buffers.
    pub max_held_batches: usize,
}

impl Default for LoaderOptions {
    fn default() -> Self {
        Self {
            threads: 0,
            prefetch: 0,
            max_prefetch_bytes: 2 << 30,
            deadline: Duration::from_secs(600),
            max_held_batches: 4,
        }
    }
}

/// How often a waiting `next()` asks whether it should give up (Ctrl-C).
pub const INTERRUPT_CHECK: Duration = Duration::from_millis(100);

/// Calls over which the producer's idle time is weighed against a stall.
const IDLE_WINDOW_CALLS: usize = 64;

/// Most batches the controller may keep in flight, whatever the budget allows.
const MAX_AUTO_DEPTH: usize = 64;

/// The embedded loader of one job.
pub struct Loader {
    job: Arc<Job>,
    pool: Arc<rayon::ThreadPool>,
    threads: usize,
    /// Fixed depth, or the controller's ceiling when `controller` is set.
    prefetch: usize,
    controller: Option<Arc<Mutex<PrefetchController>>>,
    deadline: Duration,
    slots: Arc<SlotPool>,
    stats: Arc<Mutex<StatsRecorder>>,
}

impl Loader {
    /// Opens the job and starts its decode threads.
    pub fn new(spec: JobSpec, options: LoaderOptions) -> Result<Loader> {
        Self::from_job(Job::open(spec)?, options)
    }

    /// A loader over an opened job.
    pub fn from_job(job: Job, options: LoaderOptions) -> Result<Loader> {
        let threads = if options.threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            options.threads
        };
        let batch_bytes = job
            .assembler()
            .batch_bytes(job.plan_config().batch_size as usize) as u64;
        let (prefetch, controller) = if options.prefetch == 0 {
            let controller = PrefetchController::new(ControllerConfig {
                min_depth: 2,
                max_depth: MAX_AUTO_DEPTH,
                max_bytes: options.max_prefetch_bytes,
                batch_bytes,
                initial_depth: (threads * 2).max(2),
            });
            if controller.budget_too_small() {
                tracing::warn!(
                    batch_bytes,
                    max_prefetch_bytes = options.max_prefetch_bytes,
                    "prefetch budget holds fewer than two batches; keeping two"
                );
            }
            let ceiling = controller.budget_depth();
            (ceiling, Some(Arc::new(Mutex::new(controller))))
        } else {
            (options.prefetch, None)
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("stoker-decode-{i}"))
            .panic_handler(|_| tracing::error!("decode thread panicked"))
            .build()
            .map_err(|e| Error::Threads(e.to_string()))?;
        Ok(Loader {
            job: Arc::new(job),
            pool: Arc::new(pool),
            threads,
            prefetch,
            controller,
            deadline: options.deadline,
            slots: SlotPool::new(batch_bytes as usize, prefetch + options.max_held_batches),
            stats: Arc::new(Mutex::new(StatsRecorder::new())),
        })
    }

    /// The job.
    pub fn job(&self) -> &Job {
        &self.job
    }

    /// Decode threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Batches in flight or waiting, at most (the controller's ceiling in auto mode).
    pub fn prefetch(&self) -> usize {
        self.prefetch
    }

    /// The current target depth: the controller's in auto mode, else the fixed depth.
    pub fn prefetch_depth(&self) -> usize {
        match &self.controller {
            Some(controller) => controller
                .lock()
                .map(|c| c.target_depth())
                .unwrap_or(self.prefetch),
            None => self.prefetch,
        }
    }

    /// A cheap, shareable handle that reads this loader's figures from any thread (for a
    /// dashboard or a metrics endpoint); it keeps no thread or batch alive.
    pub fn monitor(&self) -> LoaderMonitor {
        LoaderMonitor {
            source: MonitorSource::Local {
                stats: Arc::clone(&self.stats),
                controller: self.controller.clone(),
                slots: Arc::clone(&self.slots),
                threads: self.threads,
                fixed_prefetch: self.controller.is_none().then_some(self.prefetch),
            },
        }
    }

    /// What the prefetch controller sees and decided, in auto mode.
    pub fn controller_snapshot(&self) -> Option<ControllerSnapshot> {
        self.controller
            .as_ref()
            .and_then(|c| c.lock().ok().map(|c| c.snapshot()))
    }

    /// Steps per epoch for this rank.
    pub fn steps_per_epoch(&self) -> Result<u64> {
        Ok(self.job.plan(0)?.steps())
    }

    /// The pool of batch buffers.
    pub fn slots(&self) -> &Arc<SlotPool> {
        &self.slots
    }

    /// Statistics so far, over every epoch this loader ran.
    pub fn stats(&self) -> LoaderStats {
        self.stats
            .lock()
            .map(|recorder| recorder.snapshot())
            .unwrap_or_default()
    }

    /// Starts `epoch` at `start_step` (0 for the beginning; a later step resumes mid-epoch
    /// with no replay).
    pub fn epoch(&self, epoch: u64, start_step: u64) -> Result<EpochStream> {
        let plan = Arc::new(self.job.plan(epoch)?);
        if start_step > plan.steps() {
            return Err(Error::InvalidSpec(format!(
                "start step {start_step} is past the end of the epoch ({} steps)",
                plan.steps()
            )));
        }
        let (sender, receiver) = crossbeam_channel::unbounded();
        let (jobs, job_receiver) = crossbeam_channel::unbounded();
        let cancelled = Arc::new(AtomicBool::new(false));
        let producer_idle_ns = Arc::new(AtomicU64::new(0));
        {
            let (job, plan, pool) = (
                Arc::clone(&self.job),
                Arc::clone(&plan),
                Arc::clone(&self.pool),
            );
            let cancelled = Arc::clone(&cancelled);
            let idle_ns = Arc::clone(&producer_idle_ns);
            std::thread::Builder::new()
                .name(format!("stoker-producer-{epoch}"))
                .spawn(move || produce(job, plan, pool, job_receiver, sender, cancelled, idle_ns))
                .map_err(|e| Error::Threads(e.to_string()))?;
        }
        let mut stream = EpochStream {
            job: Arc::clone(&self.job),
            plan,
            receiver,
            cancelled,
            ready: BTreeMap::new(),
            next_step: start_step,
            next_to_dispatch: start_step,
            prefetch: self.prefetch_depth(),
            controller: self.controller.clone(),
            jobs,
            producer_idle_ns,
            idle_seen_ns: 0,
            recent_idle_ns: VecDeque::new(),
            arrived_latencies: Vec::new(),
            last_return: None,
            threads: self.threads,
            deadline: self.deadline,
            slots: Arc::clone(&self.slots),
            stats: Arc::clone(&self.stats),
        };
        if let Ok(mut stats) = self.stats.lock() {
            stats.epoch_started();
        }
        stream.top_up();
        Ok(stream)
    }
}

/// Reads a loader's figures from any thread; see [`Loader::monitor`]. A coordinator builds
/// monitors of remote clients from their reports with [`LoaderMonitor::reported`].
#[derive(Clone)]
pub struct LoaderMonitor {
    source: MonitorSource,
}

#[derive(Clone)]
enum MonitorSource {
    /// A loader in this process.
    Local {
        stats: Arc<Mutex<StatsRecorder>>,
        controller: Option<Arc<Mutex<PrefetchController>>>,
        slots: Arc<SlotPool>,
        threads: usize,
        fixed_prefetch: Option<usize>,
    },
    /// The latest figures a remote client reported.
    Reported(Arc<Mutex<MonitorSnapshot>>),
}

/// One reading of a [`LoaderMonitor`].
#[derive(Debug, Clone, Default)]
pub struct MonitorSnapshot {
    /// Throughput, waits, stage times.
    pub stats: LoaderStats,
    /// The prefetch controller's view, in auto mode.
    pub controller: Option<ControllerSnapshot>,
    /// The fixed depth, when not in auto mode.
    pub fixed_prefetch: Option<usize>,
    /// Batch buffers in use (in flight, waiting, or held by the consumer).
    pub slots_in_use: usize,
    /// Batch buffers that may exist.
    pub slot_capacity: usize,
    /// Bytes per batch buffer.
    pub slot_bytes: usize,
    /// Decode threads.
    pub threads: usize,
}

impl LoaderMonitor {
    /// A monitor that shows whatever is written into `latest` (a remote client's reports).
    pub fn reported(latest: Arc<Mutex<MonitorSnapshot>>) -> Self {
        Self {
            source: MonitorSource::Reported(latest),
        }
    }

    /// The figures now.
    pub fn snapshot(&self) -> MonitorSnapshot {
        match &self.source {
            MonitorSource::Local {
                stats,
                controller,
                slots,
                threads,
                fixed_prefetch,
            } => MonitorSnapshot {
                stats: stats.lock().map(|s| s.snapshot()).unwrap_or_default(),
                controller: controller
                    .as_ref()
                    .and_then(|c| c.lock().ok().map(|c| c.snapshot())),
                fixed_prefetch: *fixed_prefetch,
                slots_in_use: slots.in_use(),
                slot_capacity: slots.capacity(),
                slot_bytes: slots.slot_bytes(),
                threads: *threads,
            },
            MonitorSource::Reported(latest) => latest
                .lock()
                .map(|s| s.clone())
                .unwrap_or_else(|p| p.into_inner().clone()),
        }
    }
}

/// Builds queued steps one at a time, each with every pool thread on its samples.
///
/// One batch at a time, on purpose: with several batch tasks in a rayon pool, a thread waiting
/// in a batch's parallel loop steals and runs a whole later batch first, so a batch can wait
/// behind many later ones (stalls of 100 ms were seen). Here steps start in order and finish in
/// order, and the first batch gets all threads.
fn produce(
    job: Arc<Job>,
    plan: Arc<EpochPlan>,
    pool: Arc<rayon::ThreadPool>,
    jobs: Receiver<(u64, crate::slots::Slot)>,
    sender: Sender<Built>,
    cancelled: Arc<AtomicBool>,
    idle_ns: Arc<AtomicU64>,
) {
    loop {
        let asked = Instant::now();
        let Ok((step, slot)) = jobs.recv() else {
            return;
        };
        idle_ns.fetch_add(asked.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if cancelled.load(Ordering::Relaxed) {
            return;
        }
        let started = Instant::now();
        let result = pool.install(|| {
            catch_unwind(AssertUnwindSafe(|| job.batch_into(&plan, step, slot))).unwrap_or_else(
                |panic| {
                    let message = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "unknown panic".into());
                    Err(Error::Stopped(format!(
                        "a decode thread panicked building step {step}: {message}"
                    )))
                },
            )
        });
        let built = Built {
            step,
            service: started.elapsed(),
            result,
        };
        if sender.send(built).is_err() {
            return;
        }
    }
}

/// A finished batch and how long building it took once started (queueing excluded: the
/// controller sizes the queue, so its latency input must not grow with the queue).
struct Built {
    step: u64,
    service: Duration,
    result: Result<Batch>,
}

/// The batches of one epoch, in step order. Dropping it cancels the work not yet started.
pub struct EpochStream {
    job: Arc<Job>,
    plan: Arc<EpochPlan>,
    receiver: Receiver<Built>,
    cancelled: Arc<AtomicBool>,
    ready: BTreeMap<u64, Result<Batch>>,
    next_step: u64,
    next_to_dispatch: u64,
    /// Batches allowed in flight or waiting (besides the one the consumer holds).
    prefetch: usize,
    controller: Option<Arc<Mutex<PrefetchController>>>,
    jobs: Sender<(u64, crate::slots::Slot)>,
    /// Time the producer spent with nothing queued, and how much of it the controller has seen.
    producer_idle_ns: Arc<AtomicU64>,
    idle_seen_ns: u64,
    recent_idle_ns: VecDeque<u64>,
    arrived_latencies: Vec<Duration>,
    last_return: Option<Instant>,
    threads: usize,
    deadline: Duration,
    slots: Arc<SlotPool>,
    stats: Arc<Mutex<StatsRecorder>>,
}

impl EpochStream {
    /// The plan being walked.
    pub fn plan(&self) -> &EpochPlan {
        &self.plan
    }

    /// The step the next batch will have.
    pub fn next_step(&self) -> u64 {
        self.next_step
    }

    /// Batches being built or waiting right now.
    pub fn in_flight(&self) -> usize {
        (self.next_to_dispatch - self.next_step) as usize
    }

    /// Starts batches until `prefetch` are in flight or no free slot is left.
    fn top_up(&mut self) {
        while self.next_to_dispatch < self.plan.steps()
            && (self.next_to_dispatch - self.next_step) < self.prefetch as u64
        {
            let len = self.batch_bytes(self.next_to_dispatch);
            let Some(slot) = self.slots.try_take(len) else {
                break;
            };
            self.dispatch(slot);
        }
    }

    fn batch_bytes(&self, step: u64) -> usize {
        self.job.assembler().batch_bytes(self.plan.batch_len(step))
    }

    /// Queues the next step for the stream's producer thread.
    fn dispatch(&mut self, slot: crate::slots::Slot) {
        let step = self.next_to_dispatch;
        self.next_to_dispatch += 1;
        if self.jobs.send((step, slot)).is_err() {
            tracing::error!(step, "the producer thread is gone");
        }
    }

    /// Counts a wait that ended without a batch (timeout, interruption) in the stall figures.
    fn record_wait(&self, waited: Duration) {
        if let Ok(mut stats) = self.stats.lock() {
            stats.record_wait(waited);
        }
    }

    /// Feeds the controller what this call saw and takes its new depth.
    fn adjust_depth(&mut self, started: Instant, waited: Duration) {
        let step_time = self
            .last_return
            .map_or(Duration::ZERO, |at| started.saturating_duration_since(at));
        self.last_return = Some(Instant::now());
        let Some(controller) = &self.controller else {
            return;
        };
        // A wait while the producer never ran dry means decoding is slower than the consumer:
        // a deeper queue would not shorten it, only cost memory. Only waits behind an idle
        // producer count as stall, and the consumer's pace is what it actually got (step plus
        // wait), so Little's law sizes the queue to the real flow.
        let idle_total = self.producer_idle_ns.load(Ordering::Relaxed);
        let idle = idle_total - self.idle_seen_ns;
        self.idle_seen_ns = idle_total;
        self.recent_idle_ns.push_back(idle);
        if self.recent_idle_ns.len() > IDLE_WINDOW_CALLS {
            self.recent_idle_ns.pop_front();
        }
        // If the producer sat idle for at least as long as this wait over the recent calls,
        // a deeper queue would have used that time to prevent it (bursty consumers idle the
        // producer during a long step and stall a few steps later, when the queue drains).
        let recent_idle = Duration::from_nanos(self.recent_idle_ns.iter().sum());
        let stall = if recent_idle >= waited {
            waited
        } else {
            Duration::ZERO
        };
        if let Ok(mut controller) = controller.lock() {
            controller.observe(stall, step_time + waited, &self.arrived_latencies);
            // The controller counts the batch the consumer holds; the stream does not.
            self.prefetch = controller.target_depth().saturating_sub(1).max(1);
            tracing::trace!(
                step = self.next_step - 1,
                waited_us = waited.as_micros() as u64,
                step_us = step_time.as_micros() as u64,
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
        if self.next_step >= self.plan.steps() {
            return Ok(None);
        }
        let started = Instant::now();
        let step = self.next_step;
        while !self.ready.contains_key(&step) {
            let remaining = self.deadline.saturating_sub(started.elapsed());
            let slice = remaining.min(INTERRUPT_CHECK);
            if self.next_to_dispatch == step {
                // Nothing in flight: every slot is held by batches the consumer kept.
                if let Some(slot) = self.slots.take_timeout(self.batch_bytes(step), slice) {
                    self.dispatch(slot);
                    self.top_up();
                    continue;
                }
                if started.elapsed() >= self.deadline {
                    let error = Error::SlotsHeld {
                        step,
                        capacity: self.slots.capacity(),
                        waited: started.elapsed(),
                    };
                    tracing::error!(%error, "loader.next found no free batch slot");
                    self.record_wait(started.elapsed());
                    return Err(error);
                }
                if interrupted() {
                    self.record_wait(started.elapsed());
                    return Err(Error::Interrupted);
                }
                continue;
            }
            match self.receiver.recv_timeout(slice) {
                Ok(built) => {
                    self.arrived_latencies.push(built.service);
                    self.ready.insert(built.step, built.result);
                }
                Err(RecvTimeoutError::Timeout) if started.elapsed() < self.deadline => {
                    if interrupted() {
                        self.record_wait(started.elapsed());
                        return Err(Error::Interrupted);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    let error = Error::Timeout {
                        epoch: self.plan.epoch(),
                        step,
                        rank: self.plan.config().rank,
                        waited: started.elapsed(),
                        in_flight: self.in_flight(),
                        threads: self.threads,
                    };
                    tracing::error!(%error, "loader.next timed out");
                    self.record_wait(started.elapsed());
                    return Err(error);
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Error::Stopped("the decode pool shut down".into()))
                }
            }
        }
        let waited = started.elapsed();
        let result = self
            .ready
            .remove(&step)
            .ok_or_else(|| Error::Stopped(format!("step {step} vanished")))?;
        self.next_step += 1;
        self.adjust_depth(started, waited);
        self.top_up();
        let batch = result?;
        if let Ok(mut stats) = self.stats.lock() {
            stats.record_batch(&batch, waited, self.in_flight(), self.prefetch);
        }
        Ok(Some(batch))
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
        self.cancelled.store(true, Ordering::Relaxed);
    }
}
