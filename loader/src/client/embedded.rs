//! The embedded batch source: one process plans the epoch and builds its batches on its own
//! decode pool.
//!
//! One producer thread per loader builds the steps it is asked for in order, each with the
//! whole pool on its samples. One batch at a time, on purpose: with several batch tasks in a
//! rayon pool, a thread waiting in a batch's parallel loop steals and runs a whole later batch
//! first, so a batch can wait behind many later ones (stalls of 100 ms were seen). Here steps
//! start in order and finish in order, and the first batch gets all threads. The queue runs on
//! across an epoch boundary: the next epoch's first steps, asked for early, follow the last
//! steps of the current one.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use stoker_worker::{EpochPlan, Job};

use super::monitor::LoaderMonitor;
use super::slots::Slot;
use super::source::{receive, BatchSource, Built, EpochFeed, IdleClock, SourceInfo};
use crate::error::{Error, Result};

/// One step for the producer thread to build.
struct Task {
    job: Arc<Job>,
    plan: Arc<EpochPlan>,
    step: u64,
    slot: Slot,
    reply: Sender<Built>,
    cancelled: Arc<AtomicBool>,
}

/// A job built by decode threads in this process.
pub struct EmbeddedSource {
    job: Arc<Job>,
    info: SourceInfo,
    tasks: Sender<Task>,
    idle: IdleClock,
}

impl EmbeddedSource {
    /// Starts `threads` decode threads (0: one per available core) and the producer thread.
    pub fn start(job: Job, threads: usize) -> Result<EmbeddedSource> {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            threads
        };
        let plan = job.plan(job.first_epoch())?;
        let info = SourceInfo {
            steps_per_epoch: plan.steps(),
            num_samples: job.num_samples(),
            class_names: job.class_names().to_vec(),
            batch_bytes: job.batch_bytes(job.plan_config().batch_size as usize),
            threads,
            rank: job.plan_config().rank,
            initial_depth: threads * 2,
            waiting_on: format!("on {threads} decode threads"),
            only_epoch: job.spec().resized_epoch.as_ref().map(|r| r.epoch),
            shared_slots: false,
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("stoker-decode-{i}"))
            .panic_handler(|_| tracing::error!("decode thread panicked"))
            .build()
            .map_err(|e| Error::Threads(e.to_string()))?;
        let (tasks, queue) = crossbeam_channel::unbounded();
        let idle = IdleClock::default();
        {
            let idle = idle.clone();
            std::thread::Builder::new()
                .name("stoker-producer".into())
                .spawn(move || produce(pool, queue, idle))
                .map_err(|e| Error::Threads(e.to_string()))?;
        }
        Ok(EmbeddedSource {
            job: Arc::new(job),
            info,
            tasks,
            idle,
        })
    }

    /// The job.
    pub fn job(&self) -> &Job {
        &self.job
    }
}

impl BatchSource for EmbeddedSource {
    fn info(&self) -> &SourceInfo {
        &self.info
    }

    fn open_epoch(
        &self,
        epoch: u64,
        _start_step: u64,
        _monitor: LoaderMonitor,
    ) -> Result<Box<dyn EpochFeed>> {
        let (reply, receiver) = crossbeam_channel::unbounded();
        Ok(Box::new(EmbeddedFeed {
            job: Arc::clone(&self.job),
            plan: Arc::new(self.job.plan(epoch)?),
            tasks: self.tasks.clone(),
            reply,
            receiver,
            cancelled: Arc::new(AtomicBool::new(false)),
            idle: self.idle.clone(),
        }))
    }

    fn cache_stats(&self) -> Option<stoker_datasets::CacheStats> {
        self.job.cache_stats()
    }
}

/// Builds queued steps one at a time, each with every pool thread on its samples; stops when
/// the source (the last sender) is gone.
fn produce(pool: rayon::ThreadPool, queue: Receiver<Task>, idle: IdleClock) {
    loop {
        let asked = Instant::now();
        let Ok(task) = queue.recv() else {
            return;
        };
        idle.add(asked.elapsed());
        if task.cancelled.load(Ordering::Relaxed) {
            continue;
        }
        let Task {
            job,
            plan,
            step,
            slot,
            reply,
            ..
        } = task;
        let started = Instant::now();
        let result = pool.install(|| {
            catch_unwind(AssertUnwindSafe(|| {
                job.batch_into(&plan, step, slot).map_err(Error::from)
            }))
            .unwrap_or_else(|panic| {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                Err(Error::Stopped(format!(
                    "a decode thread panicked building step {step}: {message}"
                )))
            })
        });
        // A stream that went away no longer wants the batch; that is not an error.
        let _ = reply.send(Built {
            step,
            service: started.elapsed(),
            result,
        });
    }
}

/// One epoch of an [`EmbeddedSource`].
struct EmbeddedFeed {
    job: Arc<Job>,
    plan: Arc<EpochPlan>,
    tasks: Sender<Task>,
    reply: Sender<Built>,
    receiver: Receiver<Built>,
    cancelled: Arc<AtomicBool>,
    idle: IdleClock,
}

impl EpochFeed for EmbeddedFeed {
    fn steps(&self) -> u64 {
        self.plan.steps()
    }

    fn request(&mut self, step: u64, mut slot: Slot) {
        slot.set_len(self.job.batch_bytes(self.plan.batch_len(step)));
        let task = Task {
            job: Arc::clone(&self.job),
            plan: Arc::clone(&self.plan),
            step,
            slot,
            reply: self.reply.clone(),
            cancelled: Arc::clone(&self.cancelled),
        };
        if self.tasks.send(task).is_err() {
            tracing::error!(step, "the producer thread is gone");
        }
    }

    fn recv(&mut self, timeout: Duration) -> Result<Option<Built>> {
        receive(&self.receiver, timeout, "the decode pool shut down")
    }

    fn producer_idle(&self) -> Duration {
        self.idle.total()
    }
}

impl Drop for EmbeddedFeed {
    fn drop(&mut self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }
}
