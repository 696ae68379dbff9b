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
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use stoker_pipeline::Job;
use stoker_proto::v1::JobSpec;

use super::decode_lane::{DecodeLane, EmbeddedStep};
use super::source::{
    BatchSource, Built, EpochFeed, IdleClock, QueueFeed, SourceInfo, StepContext, StepTask,
    TaskQueue,
};
use crate::error::{Error, Result};
use stoker_dashboard::LoaderMonitor;

/// Reads in progress a timeout's message names at most.
const READS_NAMED: usize = 8;

impl StepContext for Arc<Job> {
    fn batch_bytes(&self, samples: usize) -> usize {
        Job::batch_bytes(self, samples)
    }
}

/// A job built by decode threads in this process, and by a decode lane beside them (the GPU
/// decode lane of `stoker-gpu`) when one is given.
pub struct EmbeddedSource {
    job: Arc<Job>,
    info: SourceInfo,
    tasks: Sender<EmbeddedStep>,
    idle: IdleClock,
    /// The lane, held by this source and those made [`BatchSource::beside`] it.
    lane: Option<Arc<LaneHold>>,
}

/// The sources' hold on the lane: the last source to let go stops the lane, so that closing
/// the loader releases the lane's threads and device objects before it returns (the producer
/// thread, which also holds the lane, ends on its own once its queue is gone).
struct LaneHold(Arc<dyn DecodeLane>);

impl Drop for LaneHold {
    fn drop(&mut self) {
        self.0.shutdown();
    }
}

impl EmbeddedSource {
    /// Starts `threads` decode threads (0: one per available core) and the producer thread.
    pub fn start(job: Job, threads: usize) -> Result<EmbeddedSource> {
        Self::start_with(job, threads, None)
    }

    /// Like [`EmbeddedSource::start`], with `lane` beside the decode threads (started for
    /// this job by a [`crate::StartDecodeLane`]).
    pub fn start_with(
        job: Job,
        threads: usize,
        lane: Option<Arc<dyn DecodeLane>>,
    ) -> Result<EmbeddedSource> {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            threads
        };
        let info = Self::describe(&job, threads)?;
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
            let lane = lane.clone();
            std::thread::Builder::new()
                .name("stoker-producer".into())
                .spawn(move || produce(pool, queue, idle, lane))
                .map_err(|e| Error::Threads(e.to_string()))?;
        }
        Ok(EmbeddedSource {
            job: Arc::new(job),
            info,
            tasks,
            idle,
            lane: lane.map(|lane| Arc::new(LaneHold(lane))),
        })
    }

    /// What the source of `job` on `threads` decode threads tells its loader.
    fn describe(job: &Job, threads: usize) -> Result<SourceInfo> {
        let plan = job.plan(job.first_epoch())?;
        Ok(SourceInfo {
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
            dataset_fingerprint: Some(job.dataset_fingerprint()),
            notices: job.notices(),
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
        Ok(Box::new(QueueFeed::new(
            Arc::clone(&self.job),
            Arc::new(self.job.plan(epoch)?),
            TaskQueue::new(self.tasks.clone(), self.idle.clone(), "the decode pool"),
        )))
    }

    fn cache_stats(&self) -> Option<stoker_datasets::CacheStats> {
        self.job.cache_stats()
    }

    fn reading_now(&self) -> String {
        let reads = self.job.reading_now(READS_NAMED);
        if reads.is_empty() {
            return String::new();
        }
        format!("; the decode threads are reading {}", reads.join(", "))
    }

    /// The source of `spec` on this source's decode threads, producer and lane: the steps
    /// of both go through one queue, so the process runs one set of threads and holds the
    /// lane's device memory once.
    fn beside(&self, spec: JobSpec) -> Result<Option<Box<dyn BatchSource>>> {
        // The lane's buffers and rows are sized for this job's pipeline and batch: only the
        // same job, but for its ranks and resized epoch, shares them.
        let same_job = |spec: &JobSpec| JobSpec {
            rank: 0,
            world_size: 0,
            resized_epoch: None,
            ..spec.clone()
        };
        if same_job(&spec) != same_job(self.job.spec()) {
            return Ok(None);
        }
        let job = Job::open(spec)?;
        let info = Self::describe(&job, self.info.threads)?;
        Ok(Some(Box::new(EmbeddedSource {
            job: Arc::new(job),
            info,
            tasks: self.tasks.clone(),
            idle: self.idle.clone(),
            lane: self.lane.clone(),
        })))
    }
}

/// Builds queued steps one at a time, each with every pool thread on its samples; stops when
/// the source (the last sender) is gone. With a lane, a step it has a share of is the lane's
/// to build ([`DecodeLane::build`]): its CPU rows on the pool, then its own rows, the batch
/// sent on by the lane, so the threads start the next step while the lane works.
fn produce(
    pool: rayon::ThreadPool,
    queue: Receiver<EmbeddedStep>,
    idle: IdleClock,
    lane: Option<Arc<dyn DecodeLane>>,
) {
    let _running = idle.running();
    loop {
        let asked = Instant::now();
        let Ok(task) = queue.recv() else {
            return;
        };
        idle.add(asked.elapsed());
        if task.cancelled.load(Ordering::Relaxed) {
            continue;
        }
        let Some(lane) = &lane else {
            build_on_pool(&pool, task);
            continue;
        };
        // The split is looked up as the step is built (decided here for a new point), so
        // `auto` decides from what the batches handed out just before took.
        match lane.split_at(task.plan.epoch(), task.step) {
            0 => build_on_pool(&pool, task),
            sixteenths => lane.build(&pool, task, sixteenths),
        }
    }
}

/// The message of a decode thread's panic (a lane's decode threads' too).
pub fn decode_panic(step: u64, panic: Box<dyn std::any::Any + Send>) -> Error {
    Error::Stopped(format!(
        "a decode thread panicked building step {step}: {}",
        stoker_pipeline::panic_text(&*panic)
    ))
}

/// Builds a step on the pool alone and sends it: the producer's way without a lane's share,
/// and a lane's for a step it leaves whole to the decode threads.
pub fn build_on_pool(pool: &rayon::ThreadPool, task: EmbeddedStep) {
    let StepTask {
        context: job,
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
        .unwrap_or_else(|panic| Err(decode_panic(step, panic)))
    });
    // A stream that went away no longer wants the batch; that is not an error.
    let _ = reply.send(Built {
        step,
        service: started.elapsed(),
        result,
    });
}
