//! `NativeLoader`: one job's loader as Python drives it (`stoker.Loader` holds one): epochs,
//! batches, resume and resize, the dashboard, closing. How it is built from its recipe is
//! [`recipe`]; how a batch becomes the `NativeBatch` Python reads is [`batches`]; how any thread
//! reaches its parts is [`access`].

mod access;
mod batches;
mod recipe;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyWeakrefReference};
use stoker_loader::{LaneWindow, Loader, RemoteOptions, StartDecodeLane, Token};
use stoker_proto::v1 as proto;

use crate::buffer::PinnedRelease;
use crate::dataset::DatasetRecipe;
use crate::errors::from_loader;

use access::{closed, Current, Held};
pub(crate) use batches::NativeBatch;
use batches::{native_batch, resize_chain, slot_stats, steps_left_from, wait_for_batch};
use recipe::Recipe;

use crate::settings::{DatasetSettings, LoaderSettings, SourceSettings};
use crate::spec::{job_spec, mix_spec, JobSettings};

/// One job's loader, driven from Python: in-process (decode threads here) or, with an
/// address, served by a coordinator's workers. Both go through the same `stoker_loader::Loader`.
///
/// Any thread may call it: `stats()` from a monitoring thread or `close()` from another one
/// while `next_batch` waits. The stream is behind its own lock, which `next_batch` holds while
/// it waits with the interpreter let go; `close` raises `closing`, which ends that wait within
/// `INTERRUPT_CHECK`, then takes the stream.
#[pyclass(module = "stoker._native", frozen)]
pub(crate) struct NativeLoader {
    /// The loaders and the dashboard, emptied by `close`; locked only for short work that
    /// never lets go of the interpreter.
    held: Mutex<Held>,
    /// The current epoch's stream.
    current: Mutex<Option<Current>>,
    /// The thread waiting in `next_batch`, holding `current`, if any.
    waiting: Mutex<Option<std::thread::ThreadId>>,
    /// Set by a `close` that ran on the thread waiting in `next_batch` (a signal handler),
    /// which left the stream and the loaders for that wait to drop on its way out.
    close_deferred: AtomicBool,
    /// Set once `close` starts.
    closing: AtomicBool,
    address: Option<String>,
    /// What the loader was built from, to build the loader of an epoch resumed on another
    /// world size.
    recipe: Recipe,
    /// How the buffers of page-locked slots are let go (set when the slots are pinned).
    release: Option<Arc<PinnedRelease>>,
}

/// A resize as Python holds it: (cursor, taken positions).
pub(super) type PyResize = (u64, Vec<u64>);

#[pymethods]
impl NativeLoader {
    /// A loader of the source `source` describes, with `settings`.
    #[new]
    fn new(py: Python<'_>, settings: LoaderSettings, source: SourceSettings<'_>) -> PyResult<Self> {
        let SourceSettings {
            source: path,
            ops,
            num_threads,
            on_error,
            format,
            shuffle_window,
            text_column,
            label_column,
            image_column,
            address,
            worker_grace_s,
            token,
            tls_ca,
            tls_server_name,
            mix,
            decode,
            gpu_memory,
            library_dirs,
            gpu_tail,
            uris,
            split,
        } = source;
        let lane = crate::gpu_decode::lane_starter(
            py,
            &decode,
            settings.pin_device,
            gpu_memory,
            library_dirs,
            settings.pinned_budget,
            gpu_tail,
        )?;
        let mut spec = job_spec(
            settings.plan()?,
            path.to_string_lossy().into_owned(),
            &ops,
            JobSettings {
                on_error: &on_error,
                format: &format,
                shuffle_window,
                text_column,
                label_column,
                image_column,
                uris: if uris.len() > 1 { uris } else { Vec::new() },
                split,
            },
        )?;
        if let Some(mix) = mix {
            spec.dataset = None;
            spec.pipeline = Vec::new();
            spec.mix = Some(mix_spec(mix)?);
        }
        if !(worker_grace_s.is_finite() && worker_grace_s > 0.0) {
            return Err(PyValueError::new_err(format!(
                "worker_grace must be a positive number of seconds, got {worker_grace_s}"
            )));
        }
        let token = token
            .as_deref()
            .map(Token::new)
            .transpose()
            .map_err(|e| PyValueError::new_err(format!("token: {e}")))?;
        let remote = address.as_ref().map(|address| {
            let remote = RemoteOptions {
                worker_grace: Duration::from_secs_f64(worker_grace_s),
                token,
                tls_ca,
                tls_server_name,
                ..RemoteOptions::default()
            };
            (address.clone(), remote)
        });
        let mut recipe = Recipe::new(spec, num_threads, &settings);
        recipe.options.decode_lane = lane.clone().map(|lane| lane as Arc<dyn StartDecodeLane>);
        recipe.lane = lane;
        recipe.remote_at(remote);
        Self::from_recipe(py, recipe, address, settings)
    }

    /// A loader over a Python map-style dataset (`Loader.from_dataset`): `builder.build`
    /// fills each batch's slot, `sample_bytes` are each field's bytes per sample, and `lanes`
    /// threads call it at once; with `shared_slots` the slots are one shared mapping that
    /// worker processes write into. Shuffle, ranks, resume and the dashboard are the native
    /// ones.
    #[staticmethod]
    fn from_dataset(
        py: Python<'_>,
        settings: LoaderSettings,
        dataset: DatasetSettings,
    ) -> PyResult<Self> {
        let spec = settings.plan()?;
        let DatasetSettings {
            builder,
            num_samples,
            sample_bytes,
            lanes,
            waiting_on,
            shared_slots,
        } = dataset;
        let mut recipe = Recipe::new(spec, lanes, &settings);
        recipe.dataset = Some((
            DatasetRecipe {
                builder: Arc::new(PyWeakrefReference::new(builder.bind(py))?.unbind()),
                sample_bytes,
                lanes,
                waiting_on,
                shared_slots,
            },
            num_samples,
        ));
        Self::from_recipe(py, recipe, None, settings)
    }

    /// Resumes `epoch` on this loader's world size after ranks of `old_world`, striding what
    /// `resizes` (cursor, taken) left of it, read `steps[r]` batches each (rank r; one count
    /// for all when only one is known). With the same world size, no new resize and every
    /// rank at the same step, it resumes the resized epoch itself at that step. Builds the
    /// loader of that epoch (beside the plain one, over its slots) and returns (the step to
    /// start at, the epoch's steps, the epoch's resizes now); none when nothing of the epoch
    /// is left for this rank (steps 0).
    fn resume_resized(
        &self,
        py: Python<'_>,
        epoch: u64,
        resizes: Vec<PyResize>,
        old_world: u32,
        steps: Vec<u64>,
    ) -> PyResult<(u64, u64, Vec<PyResize>)> {
        let plain = Arc::clone(self.held(py).loader()?);
        let num_samples = plain.info().num_samples;
        let earlier: Vec<stoker_pipeline::Resize> = resizes
            .into_iter()
            .map(|(cursor, taken)| stoker_pipeline::Resize { cursor, taken })
            .collect();
        let same_step = steps.windows(2).all(|w| w[0] == w[1]);
        let (spec, start_step) = if old_world == self.recipe.spec.world_size.max(1) && same_step {
            let mut spec = self.recipe.spec.clone();
            spec.resized_epoch = Some(proto::ResizedEpoch {
                epoch,
                resizes: earlier.iter().map(Into::into).collect(),
            });
            (spec, steps.first().copied().unwrap_or(0))
        } else {
            let spec = stoker_pipeline::resized_spec(
                &self.recipe.spec,
                num_samples,
                epoch,
                old_world,
                earlier,
                &steps,
            )
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
            (spec, 0)
        };
        let chain = resize_chain(&spec);
        // Refused before the resumed loader there is goes: a refusal leaves it served.
        let steps_left = steps_left_from(&spec, num_samples, epoch, start_step)?;
        let nothing_left = start_step == 0 && steps_left == 0;
        let previous = self
            .held(py)
            .let_go_of_resumed(nothing_left.then_some(epoch));
        if nothing_left {
            // Nothing of the epoch is left for this rank: no loader (a remote one's job of no
            // steps is refused); the epoch runs empty.
            py.detach(|| drop(previous));
            return Ok((0, 0, chain));
        }
        let loader = py
            .detach(move || {
                drop(previous);
                let built = self.recipe.build_beside(&plain, spec);
                // Dropped here too: a close() meanwhile may have left this the last reference.
                drop(plain);
                built
            })
            .map_err(from_loader)?;
        let steps_in_epoch = loader.steps_per_epoch();
        {
            let mut held = self.held(py);
            if held.loader.is_some() {
                held.resumed = Some((epoch, Arc::new(loader)));
                return Ok((start_step, steps_in_epoch, chain));
            }
        }
        py.detach(|| drop(loader));
        Err(closed()) // by another thread meanwhile
    }

    /// The epoch resumed on another world size whose loader this one holds, if any (a failed
    /// `resume_resized` may have let go of the one before).
    #[getter]
    fn resumed_epoch(&self, py: Python<'_>) -> Option<u64> {
        let held = self.held(py);
        held.resumed
            .as_ref()
            .map(|(epoch, _)| *epoch)
            .or(held.resumed_empty)
    }

    /// Lets go of the loader of an epoch resumed on another world size: a later resume on
    /// this loader's own world size makes every epoch the plain loader's again.
    fn end_resized(&self, py: Python<'_>) {
        let previous = self.held(py).let_go_of_resumed(None);
        py.detach(|| drop(previous));
    }

    /// Steps (batches) of `epoch` for this rank: the resumed epoch's own count for the epoch
    /// resumed on another world size, else `steps_per_epoch`.
    fn steps_in(&self, py: Python<'_>, epoch: u64) -> PyResult<u64> {
        self.held(py).steps_in(epoch)
    }

    /// Steps (batches) per epoch for this rank.
    #[getter]
    fn steps_per_epoch(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.held(py).loader()?.steps_per_epoch())
    }

    /// Samples in the dataset.
    #[getter]
    fn num_samples(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.held(py).loader()?.info().num_samples)
    }

    /// What opening the datasets in this process found to tell the user once (image files an
    /// image folder left out); empty in distributed mode (the worker daemons log theirs).
    #[getter]
    fn notices(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        Ok(self.held(py).loader()?.info().notices.clone())
    }

    /// The datasets' fingerprint (this process's, or the workers'); None where there is none.
    #[getter]
    fn dataset_fingerprint(&self, py: Python<'_>) -> PyResult<Option<String>> {
        Ok(self.held(py).loader()?.info().dataset_fingerprint.clone())
    }

    /// Class names, in label order.
    #[getter]
    fn class_names(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        Ok(self.held(py).loader()?.info().class_names.clone())
    }

    /// Decode threads in this process (0 in distributed mode: the workers decode).
    #[getter]
    fn num_threads(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.held(py).loader()?.threads())
    }

    /// Batches in flight at most.
    #[getter]
    fn prefetch(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.held(py).loader()?.prefetch())
    }

    /// The dashboard's URL, when one was asked for.
    #[getter]
    fn dashboard_url(&self, py: Python<'_>) -> Option<String> {
        self.held(py).dashboard.as_ref().map(|d| d.url())
    }

    /// The coordinator's address in distributed mode, else None.
    #[getter]
    fn address(&self) -> Option<String> {
        self.address.clone()
    }

    /// Batch buffers in the pool.
    #[getter]
    fn slot_capacity(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.held(py).loader()?.slots().capacity())
    }

    /// Starts `epoch` at `start_step` (a later step resumes mid-epoch with no replay).
    fn start_epoch(&self, py: Python<'_>, epoch: u64, start_step: u64) -> PyResult<()> {
        let (loader, done, plain, start_step) = {
            let mut held = self.held(py);
            let (loader, start_step) = held.start_of(epoch, start_step)?;
            // Past the resumed epoch its loader is done.
            let past = |(resumed, _): &(u64, Arc<Loader>)| *resumed < epoch;
            let done = held.resumed.take_if(|resumed| past(resumed));
            // Reading the resumed epoch: what the plain loader started ahead (that epoch, as
            // it would have run on the old world size) is not wanted, nor its slots held.
            let plain = held
                .loader()
                .ok()
                .filter(|plain| !Arc::ptr_eq(plain, &loader))
                .cloned();
            (loader, done, plain, start_step)
        };
        let mut current = self.current(py);
        // In process, the stream already at this epoch and step goes on with what it built
        // ahead (a remote one opens its session again, as identical runs sharing it expect).
        let plain_epoch =
            done.is_none() && plain.is_none() && !self.is_closing() && self.address.is_none();
        let live = current.as_mut().map(|current| &mut current.stream);
        if plain_epoch && live.is_some_and(|live| live.goes_on(&loader, epoch, start_step)) {
            return Ok(());
        }
        // Drop the previous stream first: its unstarted work is cancelled (except the next
        // epoch's start, which `epoch` takes over when it asks for that epoch).
        let previous = current.take();
        let closing = self.is_closing();
        let started = py.detach(|| {
            drop((previous, done));
            if let Some(plain) = plain {
                plain.cancel_started();
            }
            let started = match closing {
                true => None,
                false => Some(loader.epoch(epoch, start_step)),
            };
            let slots = Arc::clone(loader.slots());
            drop(loader);
            started.map(|stream| {
                stream.map(|stream| Current {
                    stream,
                    slots,
                    handed: None,
                })
            })
        });
        *current = Some(started.ok_or_else(closed)?.map_err(from_loader)?);
        Ok(())
    }

    /// The next batch; None at the end of the epoch. Waits with the GIL released; a `close()`
    /// from another thread ends the wait with StokerError.
    fn next_batch<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, NativeBatch>>> {
        let mut current = self.current(py);
        let waiting = self.waiting_here();
        let batch = (|| {
            let current = self.started(&mut current)?;
            let release = self.release_for(current);
            let stream = &mut current.stream;
            let mut taken = None;
            let batch = wait_for_batch(py, &self.closing, release, &mut taken, |interrupted| {
                stream.next_batch_checked(interrupted)
            });
            if taken.is_some() {
                current.handed = taken;
            }
            batch
        })();
        drop(waiting);
        // Closed while it waited by a signal handler on this thread, which could not take the
        // stream from under this wait: it goes now.
        if self.close_deferred.swap(false, Ordering::SeqCst) {
            self.let_go(py, current.take());
        }
        batch
    }

    /// The next batch if it has already arrived, else None (also at the end of the epoch, and
    /// while another thread waits in `next_batch`); never waits.
    fn try_next_batch<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, NativeBatch>>> {
        let mut current = match self.current.try_lock() {
            Ok(current) => current,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return Ok(None),
        };
        let current = self.started(&mut current)?;
        let release = self.release_for(current);
        match current.stream.try_next_batch().map_err(from_loader)? {
            Some(batch) => {
                // Counted before it is made a Python object, which may raise.
                current.handed = Some(batch.step);
                native_batch(py, batch, release).map(Some)
            }
            None => Ok(None),
        }
    }

    /// The step of the last batch handed out in the current epoch, if any.
    #[getter]
    fn handed_out(&self, py: Python<'_>) -> Option<u64> {
        self.current(py).as_ref().and_then(|current| current.handed)
    }

    /// The GPU's share of step `step` of `epoch` in sixteenths (`auto` decides it once for the
    /// point the step is in, then keeps it); None without a GPU decode lane.
    fn decode_split(&self, py: Python<'_>, epoch: u64, step: u64) -> PyResult<Option<u8>> {
        Ok(self
            .held(py)
            .loader_of(epoch)?
            .decode_lane()
            .map(|lane| lane.split_at(epoch, step)))
    }

    /// Sets the GPU's share of the point step `step` of `epoch` is in (from a saved state),
    /// before that step is built; batches of the next epoch started ahead with another share
    /// are then built again.
    fn set_decode_split(
        &self,
        py: Python<'_>,
        epoch: u64,
        step: u64,
        sixteenths: u8,
    ) -> PyResult<()> {
        if sixteenths > 16 {
            return Err(PyValueError::new_err(format!(
                "a decode split is 0 to 16 sixteenths, got {sixteenths}"
            )));
        }
        self.held(py)
            .loader_of(epoch)?
            .set_gpu_decode_split(epoch, step, sixteenths);
        Ok(())
    }

    /// Records that the consumer's GPU stream sat idle for `idle_s` seconds waiting for
    /// batches, over `span_s` seconds of its time (measured with events by the Python layer).
    /// With `lane_busy_s` and `window_s` (one step's: the decode lane's work within the host
    /// window of `window_s` seconds the step ran in), the step also counts towards what the
    /// lane costs the stream.
    #[pyo3(signature = (idle_s, span_s, lane_busy_s=None, window_s=None))]
    fn record_gpu_idle(
        &self,
        py: Python<'_>,
        idle_s: f64,
        span_s: f64,
        lane_busy_s: Option<f64>,
        window_s: Option<f64>,
    ) -> PyResult<()> {
        let figures = [Some(idle_s), Some(span_s), lane_busy_s, window_s];
        if figures
            .iter()
            .flatten()
            .any(|s| !(s.is_finite() && *s >= 0.0))
        {
            return Err(PyValueError::new_err(format!(
                "GPU idle, span, lane busy and window must be finite and >= 0, got {idle_s}, \
                 {span_s}, {lane_busy_s:?} and {window_s:?}"
            )));
        }
        // Finite and >= 0, but maybe past what a Duration holds: saturated.
        let seconds = |s: f64| Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX);
        let lane = match (lane_busy_s, window_s) {
            (Some(busy), Some(window)) => Some(LaneWindow {
                busy: seconds(busy),
                window: seconds(window),
            }),
            (None, None) => None,
            _ => {
                return Err(PyValueError::new_err(
                    "lane_busy_s and window_s come together",
                ))
            }
        };
        self.held(py)
            .loader()?
            .record_gpu_idle(seconds(idle_s), seconds(span_s), lane);
        Ok(())
    }

    /// Seconds the GPU decode lane has worked so far; None without a lane.
    fn lane_busy_s(&self, py: Python<'_>) -> PyResult<Option<f64>> {
        Ok(self
            .held(py)
            .loader()?
            .lane_busy()
            .map(|busy| busy.as_secs_f64()))
    }

    /// Throughput, stall and queue figures so far.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let held = self.held(py);
        let loader = held.loader()?;
        let stats = loader.stats();
        let dict = PyDict::new(py);
        dict.set_item("samples", stats.samples)?;
        dict.set_item("batches", stats.batches)?;
        dict.set_item("elapsed_s", stats.elapsed_s)?;
        dict.set_item("samples_per_s", stats.samples_per_s)?;
        dict.set_item("wait_s", stats.wait_s)?;
        dict.set_item("epoch_start_wait_s", stats.epoch_start_wait_s)?;
        dict.set_item("first_batch_s", stats.first_batch_s)?;
        dict.set_item("read_s", stats.read_s)?;
        dict.set_item("decode_s", stats.decode_s)?;
        dict.set_item("augment_s", stats.augment_s)?;
        dict.set_item("assemble_s", stats.assemble_s)?;
        dict.set_item("bad_samples", stats.bad_samples)?;
        dict.set_item("tokens_dropped", stats.tokens_dropped)?;
        dict.set_item("in_flight", stats.in_flight)?;
        dict.set_item("prefetch_depth", stats.prefetch_depth)?;
        slot_stats(&dict, loader.slots())?;
        dict.set_item("gpu_idle_s", stats.gpu_idle_s)?;
        dict.set_item("gpu_span_s", stats.gpu_span_s)?;
        dict.set_item("gpu_lane_cost_s", stats.gpu_lane_cost_s)?;
        dict.set_item("gpu_lane_quiet_steps", stats.gpu_lane_quiet_steps)?;
        let starter = self.recipe.lane.as_ref();
        let lane_stats = match (
            starter.and_then(|start| start.lane()),
            starter.and_then(|start| start.helper()),
        ) {
            (Some(lane), _) => Some(crate::gpu_decode::lane_stats(py, &lane)?),
            (None, Some(helper)) => Some(crate::gpu_decode::helper_stats(py, &helper)?),
            (None, None) => None,
        };
        dict.set_item("gpu_decode", lane_stats)?;
        if let Some(address) = &self.address {
            dict.set_item("address", address)?;
        }
        Ok(dict)
    }

    /// Ends a `next_batch` waiting in another thread (within `INTERRUPT_CHECK`, StokerError
    /// "closed") and refuses later calls, without stopping anything yet: for a close that has
    /// other work to do first (a dataset loader's worker processes).
    fn interrupt(&self) {
        self.closing.store(true, Ordering::SeqCst);
    }

    /// Stops the decode threads (or closes the session); later calls raise StokerError, and
    /// so does a `next_batch` waiting in another thread (within `INTERRUPT_CHECK`). Batches
    /// already handed out stay valid.
    fn close(&self, py: Python<'_>) {
        self.closing.store(true, Ordering::SeqCst);
        if self.waits_here() {
            // A signal handler run while this thread waits in next_batch (a SIGTERM handler
            // that closes the loader): that wait ends now and lets go of the stream and the
            // loaders on its way out; taking them here would wait for itself.
            self.close_deferred.store(true, Ordering::SeqCst);
            return;
        }
        let current = self.current(py).take();
        self.let_go(py, current);
    }
}
