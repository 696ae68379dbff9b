//! A map-style Python dataset under Stoker's planner (`Loader.from_dataset`): one more
//! [`BatchSource`] below the loader's seam, so the epoch plan, the slot pool, the prefetch
//! controller, the statistics and the dashboard are the loader's own. The samples come from
//! Python code: `lanes` threads each take the next requested step, plan its indices
//! ([`EpochPlan`], the same planner as native sources) and call the Python builder's
//! `build(lane, epoch, step, indices, view)` with a writable view of the batch's slot. The
//! builder either runs the dataset on that thread (thread mode) or hands the batch to the
//! lane's own worker process (process mode), which writes it straight into the slot: the
//! slots of a process-mode loader are one shared mapping (`SlotPool::shared`).
//!
//! A slot is laid out field by field: each field of an `n`-sample batch takes `n` rows of its
//! per-sample bytes, from a 64-byte boundary after the field before it; the Python side
//! (`stoker/_dataset.py`) writes and reads it by the same rule.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyWeakrefMethods, PyWeakrefReference};
use stoker_loader::{
    BatchSource, Built, EpochFeed, Error, IdleClock, LoaderMonitor, QueueFeed, Result, Slot,
    SourceInfo, StepContext, StepTask, TaskQueue,
};
use stoker_pipeline::{plan_for_spec, Batch, PlanConfig, SampleTimings, Tensor};
use stoker_proto::v1::{self as proto, JobSpec};

/// How long closing a loader waits for its lanes to finish the batch each is building.
const LANE_JOIN: Duration = Duration::from_secs(30);

/// What builds a dataset loader's source (again, for an epoch resumed on another world size).
pub(crate) struct DatasetRecipe {
    /// A weak reference to the Python object whose `build` fills a batch: the Python loader
    /// holds it, so a cycle through the dataset's code back to that loader (a `transform`
    /// bound to an object holding the loader) stays one the garbage collector sees and
    /// frees; a strong reference here, which it cannot see, kept every such loader, its
    /// threads and its worker processes until exit.
    pub builder: Arc<Py<PyWeakrefReference>>,
    /// Bytes per sample of each field, in field order.
    pub sample_bytes: Vec<usize>,
    /// Threads calling `build` at once: the decode threads, or one per worker process.
    pub lanes: usize,
    /// What the lanes run on, for timeout messages ("on 2 worker processes").
    pub waiting_on: String,
    /// Slots in a shared mapping, which worker processes write into.
    pub shared_slots: bool,
}

impl DatasetRecipe {
    /// A source for `spec` (its dataset is the Python one; `num_samples` is its length).
    pub fn build(&self, spec: JobSpec, num_samples: u64) -> Result<DatasetSource> {
        DatasetSource::start(
            spec,
            num_samples,
            Arc::clone(&self.builder),
            self.sample_bytes.clone(),
            self.lanes,
            self.waiting_on.clone(),
            self.shared_slots,
        )
    }
}

/// The sizes of a sample's tensors, which size each batch's slot.
#[derive(Debug, Clone)]
struct SampleBytes(Arc<[usize]>);

impl StepContext for SampleBytes {
    fn batch_bytes(&self, samples: usize) -> usize {
        batch_bytes(&self.0, samples)
    }
}

/// One step for a lane to build; its context gives the sizes of the tensors it fills.
type Task = StepTask<SampleBytes>;

/// The batches of a Python dataset, built by Python code on `lanes` threads.
pub(crate) struct DatasetSource {
    spec: JobSpec,
    config: PlanConfig,
    info: SourceInfo,
    sample_bytes: Arc<[usize]>,
    tasks: Option<Sender<Task>>,
    lanes: Vec<JoinHandle<()>>,
    /// Set when the source is dropped: the lanes stop after their batch (feeds of epochs not
    /// yet dropped still hold senders of the queue, so its end cannot tell them).
    closing: Arc<AtomicBool>,
    idle: IdleClock,
}

/// Every field's region starts this far into the slot from a multiple of it (slots themselves
/// are at least 16-byte aligned, which every dtype's view needs).
const ALIGN: usize = 64;

fn aligned(size: usize) -> usize {
    size.div_ceil(ALIGN) * ALIGN
}

/// Bytes of an `n`-sample batch.
fn batch_bytes(sample_bytes: &[usize], n: usize) -> usize {
    sample_bytes.iter().map(|size| aligned(size * n)).sum()
}

impl DatasetSource {
    fn start(
        spec: JobSpec,
        num_samples: u64,
        builder: Arc<Py<PyWeakrefReference>>,
        sample_bytes: Vec<usize>,
        lanes: usize,
        waiting_on: String,
        shared_slots: bool,
    ) -> Result<DatasetSource> {
        if spec.batch_size == 0 || spec.batch_size > stoker_pipeline::MAX_BATCH_SIZE {
            return Err(Error::InvalidSpec(format!(
                "batch_size must be in 1..={}, got {}",
                stoker_pipeline::MAX_BATCH_SIZE,
                spec.batch_size
            )));
        }
        let config = PlanConfig::from_spec(&spec, num_samples);
        let sample_bytes: Arc<[usize]> = sample_bytes.into();
        let lanes = lanes.max(1);
        let first_epoch = spec.resized_epoch.as_ref().map_or(0, |r| r.epoch);
        let plan = plan_for_spec(&spec, config, None, first_epoch)?;
        let info = SourceInfo {
            steps_per_epoch: plan.steps(),
            num_samples,
            class_names: Vec::new(),
            batch_bytes: batch_bytes(&sample_bytes, spec.batch_size as usize),
            threads: lanes,
            rank: spec.rank,
            initial_depth: lanes * 2,
            waiting_on,
            only_epoch: spec.resized_epoch.as_ref().map(|r| r.epoch),
            shared_slots,
            dataset_fingerprint: None,
            notices: Vec::new(),
        };
        let (tasks, queue) = crossbeam_channel::unbounded::<Task>();
        let idle = IdleClock::default();
        let closing = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::with_capacity(lanes);
        for lane in 0..lanes {
            let queue = queue.clone();
            let builder = Arc::clone(&builder);
            let idle = idle.clone();
            let closing = Arc::clone(&closing);
            let handle = std::thread::Builder::new()
                .name(format!("stoker-dataset-{lane}"))
                .spawn(move || {
                    let lane = Lane {
                        number: lane,
                        of: lanes,
                        builder,
                        idle,
                        closing,
                    };
                    lane.run(&queue)
                })
                .map_err(|e| Error::Stopped(format!("cannot start a dataset thread: {e}")))?;
            handles.push(handle);
        }
        Ok(DatasetSource {
            spec,
            config,
            info,
            sample_bytes,
            tasks: Some(tasks),
            lanes: handles,
            closing,
            idle,
        })
    }
}

impl DatasetSource {
    /// Waits (boundedly) for the lanes to finish the batch each is building.
    fn join_lanes(&mut self) {
        let deadline = Instant::now() + LANE_JOIN;
        for handle in self.lanes.drain(..) {
            if handle.thread().id() == std::thread::current().id() {
                continue; // dropped on a lane (a collection there): it ends after this build
            }
            while !handle.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if handle.is_finished() {
                let _ = handle.join();
            } else {
                tracing::warn!(
                    "a dataset thread is still in Python code after {LANE_JOIN:?}; leaving it"
                );
            }
        }
    }
}

impl Drop for DatasetSource {
    fn drop(&mut self) {
        // The lanes stop after their batch; they are waited for, so none is left calling into
        // Python while the interpreter shuts down. The wait lets go of the interpreter (a lane
        // needs it to finish), whether or not the dropping thread held it.
        self.tasks = None;
        self.closing.store(true, Ordering::Relaxed);
        if Python::try_attach(|py| py.detach(|| self.join_lanes())).is_none() {
            self.join_lanes();
        }
    }
}

/// How often an idle lane looks whether its source was closed.
const LANE_POLL: Duration = Duration::from_millis(50);

/// One thread calling the Python builder.
struct Lane {
    number: usize,
    of: usize,
    builder: Arc<Py<PyWeakrefReference>>,
    idle: IdleClock,
    closing: Arc<AtomicBool>,
}

impl Lane {
    /// Builds the steps taken from the queue, one at a time, until the source is closed.
    fn run(&self, queue: &Receiver<Task>) {
        // A lane dead of a panic took its step with it: the loader's wait fails at once.
        let _running = self.idle.running();
        // One Python thread state for the lane's life, let go of between calls: each attach
        // of a thread without one makes a fresh state, and a dataset's `threading.local()`
        // (a file handle of its own per thread) would be lost after every batch.
        if Python::try_attach(|py| py.detach(|| self.serve(queue))).is_none() {
            self.serve(queue);
        }
    }

    /// [`run`](Self::run)'s loop.
    fn serve(&self, queue: &Receiver<Task>) {
        let mut asked = Instant::now();
        while !self.closing.load(Ordering::Relaxed) {
            let task = match queue.recv_timeout(LANE_POLL) {
                Ok(task) => task,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            // The loader's "producer idle" is the lanes' idle time averaged over the lanes.
            self.idle.add(asked.elapsed() / self.of as u32);
            if !task.cancelled.load(Ordering::Relaxed) {
                self.build(task);
            }
            asked = Instant::now();
        }
    }

    /// Builds one step into its slot and sends it back.
    fn build(&self, mut task: Task) {
        let (lane, builder) = (self.number, &*self.builder);
        let sample_bytes = Arc::clone(&task.context.0);
        let started = Instant::now();
        let indices = task.plan.batch_indices(task.step);
        let epoch = task.plan.epoch();
        let step = task.step;
        let shared = task
            .slot
            .shared_place()
            .map(|(memory, offset)| (memory.id, memory.fd, memory.size, offset));
        let call = Call {
            lane,
            epoch,
            step,
            indices: &indices,
            shared,
        };
        let mut still_viewed = None;
        let built = Python::try_attach(|py| {
            let slot = task.slot.as_mut_slice();
            build_in_python(py, builder, call, slot, &mut still_viewed)
        })
        .unwrap_or_else(|| {
            Err(Error::Stopped(
                "the Python interpreter is shutting down".into(),
            ))
        });
        if let Some(view) = still_viewed {
            // Python still holds views of the slot's memory: the view object they keep alive
            // takes the slot, which goes back to the pool when the last of them is released.
            let mut slot = Some(task.slot);
            let kept = Python::try_attach(|_| {
                if let Some(slot) = slot.take() {
                    view.get().keep(slot);
                }
                drop(view);
            });
            if kept.is_none() {
                // Never back to the pool while the interpreter may still read it.
                std::mem::forget(slot);
                tracing::warn!("the interpreter is shutting down; a batch slot it views is left");
            }
            let _ = task.reply.send(Built {
                step,
                service: started.elapsed(),
                result: built.map(|_| Batch::default()),
            });
            return;
        }
        let result = built.map(|bad| {
            let bytes = task.slot.into_bytes();
            let n = indices.len();
            let mut offset = 0;
            let tensors = sample_bytes
                .iter()
                .enumerate()
                .map(|(field, &size)| {
                    let len = size * n;
                    let tensor = Tensor {
                        name: field.to_string(),
                        dtype: proto::Dtype::Uint8,
                        shape: vec![n as u64, size as u64],
                        data: bytes.slice(offset..offset + len),
                    };
                    offset += aligned(len);
                    tensor
                })
                .collect();
            Batch {
                epoch,
                rank: task.plan.config().rank,
                step,
                tensors,
                sample_indices: indices,
                timings: SampleTimings {
                    read_ns: started.elapsed().as_nanos() as u64,
                    ..Default::default()
                },
                bad_samples: bad,
                dropped_tokens: 0,
                device_rows: None,
            }
        });
        let _ = task.reply.send(Built {
            step,
            service: started.elapsed(),
            result,
        });
    }
}

/// A sample replaced under the skip policy, as Python reports it: (index, reason, substitute,
/// its name: `dataset[i]`, or a mix's source and sample).
type Replaced = (u64, String, u64, String);

/// The sample that failed a batch, as Python reports it: (index, reason, its name).
type Failed = (u64, String, String);

/// A writable window on a batch slot for the Python builder, through the buffer protocol. It
/// counts the views taken of it (numpy's arrays hold theirs as long as they live) and takes no
/// new one once closed, so the caller knows whether Python still holds the slot's memory after
/// the build: a slot still viewed is never reused or freed (see [`Lane::build`]).
#[pyclass(module = "stoker._native", frozen)]
pub(crate) struct SlotView {
    address: usize,
    exports: AtomicUsize,
    open: AtomicBool,
    shape: [pyo3::ffi::Py_ssize_t; 1],
    strides: [pyo3::ffi::Py_ssize_t; 1],
    /// The slot, when views of it outlived the build: dropped (back to its pool) with this
    /// object, which every view keeps alive.
    kept: Mutex<Option<Slot>>,
}

impl SlotView {
    fn new(slot: &mut [u8]) -> Self {
        Self {
            address: slot.as_mut_ptr() as usize,
            exports: AtomicUsize::new(0),
            open: AtomicBool::new(true),
            shape: [slot.len() as pyo3::ffi::Py_ssize_t],
            strides: [1],
            kept: Mutex::new(None),
        }
    }

    /// Holds `slot` until this object goes, with the last view of it.
    fn keep(&self, slot: Slot) {
        *self.kept.lock().unwrap_or_else(PoisonError::into_inner) = Some(slot);
    }

    /// Refuses new views and returns how many are still held.
    fn close(&self) -> usize {
        self.open.store(false, Ordering::SeqCst);
        self.exports.load(Ordering::SeqCst)
    }
}

#[pymethods]
impl SlotView {
    fn __len__(&self) -> usize {
        self.shape[0] as usize
    }

    /// # Safety
    /// Called by the interpreter with a valid, writable `Py_buffer`.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: std::ffi::c_int,
    ) -> PyResult<()> {
        let this = slf.get();
        if view.is_null() || !this.open.load(Ordering::SeqCst) {
            return Err(pyo3::exceptions::PyBufferError::new_err(
                "the batch buffer is only writable while its batch is built",
            ));
        }
        this.exports.fetch_add(1, Ordering::SeqCst);
        // SAFETY: `view` is non-null and ours to fill. The memory is the slot's, which stays
        // valid while any view is held: the lane checks the count after the build and never
        // reuses or frees a slot still viewed. Shape and strides live in the object, which
        // the view keeps alive.
        unsafe {
            crate::buffer::fill_byte_view(
                view,
                slf.clone().into_any(),
                this.address as *mut std::ffi::c_void,
                &this.shape,
                &this.strides,
                flags,
            )
        };
        Ok(())
    }

    /// # Safety
    /// Called by the interpreter when a view taken by `__getbuffer__` is released.
    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {
        self.exports.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One call of the Python builder.
struct Call<'a> {
    lane: usize,
    epoch: u64,
    step: u64,
    indices: &'a [u64],
    /// The slot's shared mapping as (id, fd, size, offset), when its pool is shared.
    shared: Option<(u64, i32, usize, usize)>,
}

/// Calls `builder.build(lane, epoch, step, indices, view, shared)` with `view` a [`SlotView`]
/// of `slot`, closed before this returns; `shared` is where the slot lies in a shared mapping (id, fd, size,
/// offset), or `None`. `build` returns `(bad, failure)`: the samples replaced under the skip
/// policy as `(index, reason, substitute, name)`, and `None` or the `(index, reason, name)` of
/// a sample that failed the batch.
fn build_in_python(
    py: Python<'_>,
    builder: &Py<PyWeakrefReference>,
    call: Call<'_>,
    slot: &mut [u8],
    still_viewed: &mut Option<Py<SlotView>>,
) -> Result<Vec<proto::BadSample>> {
    let Call {
        lane,
        epoch,
        step,
        indices,
        shared,
    } = call;
    let python = |e: PyErr| {
        let traceback = e
            .traceback(py)
            .and_then(|t| t.format().ok())
            .unwrap_or_default();
        Error::Stopped(format!(
            "building step {step} of epoch {epoch} in Python: {e}\n{traceback}"
        ))
    };
    let Some(builder) = builder.bind(py).upgrade() else {
        return Err(Error::Stopped(
            "the loader was garbage-collected while its batches were being built".into(),
        ));
    };
    let view = Bound::new(py, SlotView::new(slot)).map_err(python)?;
    let outcome = builder.call_method1(
        "build",
        (
            lane,
            epoch,
            step,
            PyList::new(py, indices).map_err(python)?,
            &view,
            shared,
        ),
    );
    let views = view.get().close();
    if views > 0 {
        *still_viewed = Some(view.unbind());
    }
    let outcome = outcome.map_err(python)?;
    if views > 0 {
        return Err(Error::Stopped(format!(
            "the dataset code kept {views} view(s) of the batch buffer of step {step} after \
             filling it; the buffer is left to them and the batch is dropped"
        )));
    }
    let (bad, failure): (Vec<Replaced>, Option<Failed>) = outcome.extract().map_err(python)?;
    if let Some((index, reason, path)) = failure {
        return Err(Error::Worker(stoker_pipeline::Error::BadSample {
            index,
            path,
            reason,
        }));
    }
    Ok(bad
        .into_iter()
        .map(|(index, reason, substitute, path)| proto::BadSample {
            sample_index: index,
            path,
            reason,
            substitute_index: substitute,
        })
        .collect())
}

impl BatchSource for DatasetSource {
    fn info(&self) -> &SourceInfo {
        &self.info
    }

    fn open_epoch(
        &self,
        epoch: u64,
        _start_step: u64,
        _monitor: LoaderMonitor,
    ) -> Result<Box<dyn EpochFeed>> {
        let tasks = self
            .tasks
            .clone()
            .ok_or_else(|| Error::Stopped("the dataset loader is closed".into()))?;
        Ok(Box::new(QueueFeed::new(
            SampleBytes(Arc::clone(&self.sample_bytes)),
            Arc::new(plan_for_spec(&self.spec, self.config, None, epoch)?),
            TaskQueue::new(tasks, self.idle.clone(), "the dataset threads"),
        )))
    }
}
