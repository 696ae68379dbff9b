//! [`Loader`]: one job's batches for the training loop, over any [`BatchSource`] — the
//! embedded producer (decode threads in this process) or the remote client (a coordinator's
//! workers). It owns what both share: the slot pool, the prefetch controller, the statistics,
//! the deadline, and the next epoch's speculative start.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stoker_dashboard::{LoaderMonitor, LoaderStats};
use stoker_pipeline::Job;
use stoker_proto::v1::JobSpec;

use super::decode_lane::{DecodeLane, StartDecodeLane};
use super::embedded::EmbeddedSource;
use super::lane_cost::LaneWindow;
use super::monitor::LocalSources;
use super::prefetch::{ControllerConfig, ControllerSnapshot, PrefetchController};
use super::remote::{RemoteOptions, RemoteSource};
use super::slots::{pinned_reserved, slot_stride, PageLocker, PoolUser, SlotPool};
use super::source::{BatchSource, SourceInfo};
use super::stats::StatsRecorder;
use super::stream::{EpochStream, Successor};
use crate::error::{Error, Result};

/// How a loader runs, in either mode.
#[derive(Debug, Clone)]
pub struct LoaderOptions {
    /// Decode threads of the embedded mode (0: one per available core).
    pub threads: usize,
    /// Batches in flight or waiting: 0 lets the prefetch controller size it from the stall,
    /// latency and step time it observes; any other value fixes it. In distributed mode the
    /// depth is the number of credits granted to the workers.
    pub prefetch: usize,
    /// Memory budget for batches in flight or waiting (the controller never goes past it).
    pub max_prefetch_bytes: u64,
    /// The longest `next()` waits for one batch before it fails with [`Error::Timeout`].
    pub deadline: Duration,
    /// Batches the consumer may keep alive beyond the prefetch before the loader waits for
    /// one to be released: the slot pool holds `prefetch + max_held_batches` buffers.
    pub max_held_batches: usize,
    /// Start building the next epoch's first batches while the last ones of the current epoch
    /// are consumed (dropped unused when another epoch or step is asked for next).
    pub prefetch_next_epoch: bool,
    /// Page-lock the batch slots for a GPU; `None` (default): plain memory.
    pub pin: Option<PinOptions>,
    /// A decode lane beside the decode threads (embedded mode only; the GPU decode lane of
    /// `stoker-gpu`); `None` (default): every image is decoded on the decode threads.
    pub decode_lane: Option<Arc<dyn StartDecodeLane>>,
}

/// Page-locked batch slots ([`SlotPool::pinned`]).
#[derive(Debug, Clone)]
pub struct PinOptions {
    /// What locks the slots (the CUDA driver's primary context, from `stoker-gpu`, which also
    /// chooses the device).
    pub locker: Arc<dyn PageLocker>,
    /// The most page-locked slot memory the loaders of this process may hold together, in
    /// bytes (a node's budget divided by its ranks). The pool is made smaller to fit, and
    /// refused when fewer than `max_held_batches + 2` slots fit.
    pub budget_bytes: u64,
}

impl LoaderOptions {
    /// The decode lane `decode_lane` starts for `job`, if one is asked for and runs.
    pub fn start_lane(&self, job: &Job) -> Result<Option<Arc<dyn DecodeLane>>> {
        match &self.decode_lane {
            Some(start) => start.start(job),
            None => Ok(None),
        }
    }
}

impl Default for LoaderOptions {
    fn default() -> Self {
        Self {
            threads: 0,
            prefetch: 0,
            max_prefetch_bytes: 2 << 30,
            deadline: Duration::from_secs(600),
            max_held_batches: 4,
            prefetch_next_epoch: true,
            pin: None,
            decode_lane: None,
        }
    }
}

/// Most batches the controller may keep in flight, whatever the budget allows.
const MAX_AUTO_DEPTH: usize = 64;

/// What a loader and its streams share.
pub(crate) struct Core {
    pub(crate) source: Box<dyn BatchSource>,
    /// The decode lane beside an embedded source's decode threads.
    pub(crate) lane: Option<Arc<dyn DecodeLane>>,
    /// Fixed depth, or the controller's ceiling when `controller` is set.
    pub(crate) prefetch: usize,
    pub(crate) controller: Option<Arc<Mutex<PrefetchController>>>,
    pub(crate) deadline: Duration,
    pub(crate) slots: Arc<SlotPool>,
    /// This loader's use of `slots`: the pool closes when the last loader over it goes.
    _slots_user: PoolUser,
    pub(crate) stats: Arc<Mutex<StatsRecorder>>,
    pub(crate) prefetch_next_epoch: bool,
    /// The next epoch's feed, started by a stream that reached its end, waiting to be adopted.
    pub(crate) successor: Mutex<Option<Successor>>,
    /// GPU idle reported since the controller last looked ([`Loader::record_gpu_idle`]).
    pub(crate) gpu_idle_pending: Mutex<Duration>,
    /// Set when a resumed state replaced a GPU decode split that batches started ahead may
    /// have been built with: the next [`Loader::epoch`] builds its batches afresh.
    pub(crate) discard_started: AtomicBool,
}

impl Core {
    pub(crate) fn monitor(&self) -> LoaderMonitor {
        LocalSources {
            stats: Arc::clone(&self.stats),
            controller: self.controller.clone(),
            slots: Arc::downgrade(&self.slots),
            threads: self.source.info().threads,
            fixed_prefetch: self.controller.is_none().then_some(self.prefetch),
            lane: self.lane.as_ref().map(Arc::downgrade),
        }
        .monitor()
    }

    /// The GPU idle reported since the last call.
    pub(crate) fn take_gpu_idle(&self) -> Duration {
        self.gpu_idle_pending
            .lock()
            .map(|mut pending| std::mem::take(&mut *pending))
            .unwrap_or_default()
    }

    /// The current target depth: the controller's in auto mode, else the fixed depth.
    pub(crate) fn prefetch_depth(&self) -> usize {
        match &self.controller {
            Some(controller) => controller
                .lock()
                .map(|c| c.target_depth())
                .unwrap_or(self.prefetch),
            None => self.prefetch,
        }
    }
}

/// The batches of one job, for one rank, epoch after epoch.
pub struct Loader {
    pub(crate) core: Arc<Core>,
}

impl Loader {
    /// The embedded mode: opens the job and starts its decode threads in this process.
    pub fn new(spec: JobSpec, options: LoaderOptions) -> Result<Loader> {
        Self::from_job(Job::open(spec)?, options)
    }

    /// The embedded mode over an opened job.
    pub fn from_job(job: Job, options: LoaderOptions) -> Result<Loader> {
        let lane = options.start_lane(&job)?;
        let source = EmbeddedSource::start_with(job, options.threads, lane.clone())?;
        Self::assemble(Box::new(source), lane, options, None, None)
    }

    /// The distributed mode: registers the job with the coordinator at `address`, whose
    /// workers then build the batches.
    pub fn remote(
        address: &str,
        spec: JobSpec,
        options: LoaderOptions,
        remote: RemoteOptions,
    ) -> Result<Loader> {
        if options.decode_lane.is_some() {
            return Err(Error::Gpu(
                "the GPU decode lane runs beside the decode threads of the embedded mode; the \
                 workers of a coordinator decode on their CPUs"
                    .into(),
            ));
        }
        let source = RemoteSource::connect(address, spec, remote)?;
        Self::with_source(Box::new(source), options)
    }

    /// A loader over any batch source.
    pub fn with_source(source: Box<dyn BatchSource>, options: LoaderOptions) -> Result<Loader> {
        Self::assemble(source, None, options, None, None)
    }

    /// The loader of an epoch resumed on another world size (`spec`: this loader's job with
    /// `JobSpec.resized_epoch`), to read that epoch in place of this one: over this loader's
    /// slot pool (page-locked slots count once against the pinned budget), and on its decode
    /// threads and GPU lane where its source shares them ([`BatchSource::beside`]); else over
    /// the source `fresh` starts (a Python dataset's workers, a coordinator's). The two share
    /// slots and, in the embedded mode, one producer that builds steps in the order asked:
    /// while the new loader is read, this one has no stream open and no epoch started ahead
    /// ([`Loader::cancel_started`]), else the batches it holds may leave the other none. The
    /// two count into one set of figures: [`Loader::stats`] of either covers both.
    pub fn beside(
        &self,
        spec: JobSpec,
        options: LoaderOptions,
        fresh: impl FnOnce(JobSpec) -> Result<Box<dyn BatchSource>>,
    ) -> Result<Loader> {
        // A source that shares this one's threads shares its lane; a fresh one brings no lane
        // this loader knows of (its figures and pace are not read).
        let (source, lane) = match self.core.source.beside(spec.clone())? {
            Some(source) => (source, self.core.lane.clone()),
            None => (fresh(spec)?, None),
        };
        Self::assemble(
            source,
            lane,
            options,
            Some(Arc::clone(&self.core.slots)),
            Some(Arc::clone(&self.core.stats)),
        )
    }

    /// A loader over `source` (and the decode lane beside it), with the slots of `pool` when it
    /// is given and fits the source's batches, else a pool of its own, and counting into
    /// `stats` when given, else figures of its own.
    fn assemble(
        source: Box<dyn BatchSource>,
        lane: Option<Arc<dyn DecodeLane>>,
        options: LoaderOptions,
        pool: Option<Arc<SlotPool>>,
        stats: Option<Arc<Mutex<StatsRecorder>>>,
    ) -> Result<Loader> {
        let info = source.info();
        let batch_bytes = info.batch_bytes as u64;
        let resumed_epoch_only = info.only_epoch.is_some();
        let pool = pool.filter(|pool| {
            let fits = pool.slot_bytes() >= info.batch_bytes
                && pool.shared_memory().is_some() == info.shared_slots
                && pool.is_pinned() == options.pin.is_some();
            if !fits {
                tracing::warn!(
                    slot_bytes = pool.slot_bytes(),
                    batch_bytes = info.batch_bytes,
                    "the other loader's slots do not fit these batches; making a pool of its own"
                );
            }
            fits
        });
        // Page-locked slots must fit the pinned budget: the slots past what it holds are not
        // made, which lowers the controller's ceiling (or a fixed depth) to match. A loader
        // over another's pool has that pool's slots.
        let pinned = match (&options.pin, &pool) {
            (Some(pin), None) => Some(Self::pinned_slots_fit(pin, info.batch_bytes, &options)?),
            _ => None,
        };
        let fit = match &pool {
            Some(pool) => Some(pool.capacity()),
            None => pinned,
        };
        let max_prefetch_bytes = match fit {
            Some(fit) => options
                .max_prefetch_bytes
                .min(fit.saturating_sub(options.max_held_batches) as u64 * batch_bytes),
            None => options.max_prefetch_bytes,
        };
        let (prefetch, controller) = if options.prefetch == 0 {
            let controller = PrefetchController::new(ControllerConfig {
                min_depth: 2,
                max_depth: MAX_AUTO_DEPTH,
                max_bytes: max_prefetch_bytes,
                batch_bytes,
                initial_depth: info.initial_depth.max(2),
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
            match fit {
                Some(fit) if options.prefetch + options.max_held_batches > fit => {
                    let depth = fit.saturating_sub(options.max_held_batches).max(1);
                    tracing::warn!(
                        asked = options.prefetch,
                        depth,
                        "the batch slots hold fewer batches than prefetch asks for; prefetching fewer"
                    );
                    (depth, None)
                }
                _ => (options.prefetch, None),
            }
        };
        let capacity = prefetch + options.max_held_batches;
        let slots = match (pool, pinned, &options.pin) {
            (Some(pool), _, _) => pool,
            (None, Some(_), Some(pin)) => SlotPool::pinned(
                info.batch_bytes,
                capacity,
                info.shared_slots,
                Arc::clone(&pin.locker),
                pin.budget_bytes,
            )
            .map_err(|e| Error::Gpu(e.to_string()))?,
            _ if info.shared_slots => {
                SlotPool::shared(info.batch_bytes, capacity).map_err(|e| {
                    Error::Stopped(format!("cannot map {capacity} shared batch slots: {e}"))
                })?
            }
            _ => SlotPool::new(info.batch_bytes, capacity),
        };
        Ok(Loader {
            core: Arc::new(Core {
                source,
                lane,
                prefetch,
                controller,
                deadline: options.deadline,
                _slots_user: slots.user(),
                slots,
                stats: stats.unwrap_or_else(|| Arc::new(Mutex::new(StatsRecorder::new()))),
                // A resumed epoch has no next epoch in the same job.
                prefetch_next_epoch: options.prefetch_next_epoch && !resumed_epoch_only,
                successor: Mutex::new(None),
                gpu_idle_pending: Mutex::new(Duration::ZERO),
                discard_started: AtomicBool::new(false),
            }),
        })
    }

    /// How many page-locked slots of `batch_bytes` fit what is left of the process's pinned
    /// budget (the driver and the device checked, no context started); an error naming the
    /// budget when fewer than `max_held_batches + 2` do (two in flight, the held ones beside
    /// them).
    fn pinned_slots_fit(
        pin: &PinOptions,
        batch_bytes: usize,
        options: &LoaderOptions,
    ) -> Result<usize> {
        pin.locker.check().map_err(Error::Gpu)?;
        let stride = slot_stride(batch_bytes) as u64;
        let held = pinned_reserved();
        let fit =
            usize::try_from(pin.budget_bytes.saturating_sub(held) / stride).unwrap_or(usize::MAX);
        let needed = options.max_held_batches + 2;
        if fit < needed {
            return Err(Error::Gpu(format!(
                "the pinned memory budget ({budget} bytes for this process, {held} of them held by its other loaders and GPU decode lanes) \
                 holds {fit} page-locked batch slots of {stride} bytes; {needed} are needed (max_held_batches + 2): \
                 raise the budget, or lower batch_size or max_held_batches",
                budget = pin.budget_bytes,
            )));
        }
        Ok(fit)
    }

    /// What the source knows about the job (steps, samples, class names, threads).
    pub fn info(&self) -> &SourceInfo {
        self.core.source.info()
    }

    /// The object cache's counters, when the dataset is read through one.
    pub fn cache_stats(&self) -> Option<stoker_datasets::CacheStats> {
        self.core.source.cache_stats()
    }

    /// Decode threads in this process (0 in distributed mode).
    pub fn threads(&self) -> usize {
        self.info().threads
    }

    /// The job's id at its coordinator in the distributed mode (the dashboard names the job
    /// by it): the id it reads under now, a new one once the coordinator forgot the job and
    /// the loader registered it again. `None` for an in-process loader.
    pub fn coordinator_job(&self) -> Option<u64> {
        self.core.source.coordinator_job()
    }

    /// Steps per epoch for this rank.
    pub fn steps_per_epoch(&self) -> u64 {
        self.info().steps_per_epoch
    }

    /// Batches in flight or waiting, at most (the controller's ceiling in auto mode).
    pub fn prefetch(&self) -> usize {
        self.core.prefetch
    }

    /// The current target depth: the controller's in auto mode, else the fixed depth.
    pub fn prefetch_depth(&self) -> usize {
        self.core.prefetch_depth()
    }

    /// A cheap, shareable handle that reads this loader's figures from any thread (for a
    /// dashboard or a metrics endpoint); it keeps no thread, batch or batch buffer alive (once
    /// the loader is gone it reads no slots).
    pub fn monitor(&self) -> LoaderMonitor {
        self.core.monitor()
    }

    /// What the prefetch controller sees and decided, in auto mode.
    pub fn controller_snapshot(&self) -> Option<ControllerSnapshot> {
        self.core
            .controller
            .as_ref()
            .and_then(|c| c.lock().ok().map(|c| c.snapshot()))
    }

    /// The decode lane beside the decode threads, when the loader has one.
    pub fn decode_lane(&self) -> Option<&Arc<dyn DecodeLane>> {
        self.core.lane.as_ref()
    }

    /// The time the decode lane has worked so far, when the loader has one ([`DecodeLane::busy`]).
    pub fn lane_busy(&self) -> Option<Duration> {
        self.decode_lane().map(|lane| lane.busy())
    }

    /// Sets the decode lane's split for the point step `step` of `epoch` is in (a resumed
    /// state's; nothing without a lane). When batches started ahead may carry another split
    /// (the point, or a later one, had been decided), the next [`Loader::epoch`] does not take
    /// them over.
    pub fn set_gpu_decode_split(&self, epoch: u64, step: u64, sixteenths: u8) {
        if let Some(lane) = self.decode_lane() {
            if lane.set_split(epoch, step, sixteenths) {
                self.core.discard_started.store(true, Ordering::Relaxed);
            }
        }
    }

    /// The pool of batch buffers.
    pub fn slots(&self) -> &Arc<SlotPool> {
        &self.core.slots
    }

    /// Records that the consumer's GPU stream sat idle for `idle` waiting for batches, over
    /// `span` of its time (measured by the consumer with events on its stream: the time
    /// between the stream reaching the point where it asks for a batch and the batch being
    /// there). It shows in [`Loader::stats`] and the dashboard, and the prefetch controller
    /// counts it as stall, like a wait in `next()`.
    ///
    /// With `lane` (one step's figures, the lane's work in that step's host window read
    /// through [`Loader::lane_busy`]), the step also counts towards what the decode lane
    /// costs the stream ([`LoaderStats::gpu_lane_cost_s`]): time the stream was busier on
    /// steps beside the lane's work than on steps with the lane quiet. That is not stall to
    /// the controller (a deeper queue does not take it away).
    pub fn record_gpu_idle(&self, idle: Duration, span: Duration, lane: Option<LaneWindow>) {
        if let Ok(mut stats) = self.core.stats.lock() {
            stats.record_gpu_idle(idle, span, lane);
        }
        if let Ok(mut pending) = self.core.gpu_idle_pending.lock() {
            *pending = pending.saturating_add(idle);
        }
    }

    /// Statistics so far, over every epoch this loader ran.
    pub fn stats(&self) -> LoaderStats {
        let mut stats = self
            .core
            .stats
            .lock()
            .map(|recorder| recorder.snapshot())
            .unwrap_or_default();
        stats.gpu_decode = self.decode_lane().map(|lane| lane.figures());
        stats
    }

    /// Cancels the epoch the last stream started ahead, if one waits: its work not yet
    /// started is dropped and its slots go back to the pool. For a caller that reads the next
    /// epoch from another loader (an epoch resumed on another world size).
    pub fn cancel_started(&self) {
        if let Some(started) = self.take_started() {
            tracing::debug!(
                epoch = started.epoch,
                "the epoch started ahead is cancelled"
            );
        }
    }

    /// The epoch the last stream started ahead, taken out of the core (None when none waits).
    fn take_started(&self) -> Option<Successor> {
        self.core
            .successor
            .lock()
            .map(|mut s| s.take())
            .unwrap_or_default()
    }

    /// Starts `epoch` at `start_step` (0 for the beginning; a later step resumes mid-epoch
    /// with no replay). When the previous epoch's stream already started this one (epoch-
    /// boundary prefetch), its batches in flight are taken over; otherwise they are dropped.
    pub fn epoch(&self, epoch: u64, start_step: u64) -> Result<EpochStream> {
        if let Some(only) = self.info().only_epoch.filter(|&only| only != epoch) {
            return Err(Error::InvalidSpec(format!(
                "this job resumes epoch {only} on another world size and serves that epoch only, not epoch {epoch}"
            )));
        }
        let steps = self.steps_per_epoch();
        if start_step > steps {
            return Err(Error::InvalidSpec(format!(
                "start step {start_step} is past the end of the epoch ({steps} steps)"
            )));
        }
        let successor = self.take_started();
        let discard = self.core.discard_started.swap(false, Ordering::Relaxed);
        if let Ok(mut stats) = self.core.stats.lock() {
            stats.epoch_started();
        }
        match successor {
            Some(successor) if successor.epoch == epoch && start_step == 0 && !discard => {
                tracing::debug!(epoch, "taking over the epoch started ahead");
                Ok(EpochStream::adopt(Arc::clone(&self.core), successor))
            }
            other => {
                // A speculative start of another epoch is cancelled here, before the new
                // epoch's work is queued behind it.
                drop(other);
                let feed = self
                    .core
                    .source
                    .open_epoch(epoch, start_step, self.monitor())?;
                Ok(EpochStream::start(
                    Arc::clone(&self.core),
                    epoch,
                    start_step,
                    feed,
                ))
            }
        }
    }
}
