//! A batch as Python reads it: waiting for one with the interpreter let go (Ctrl-C checked),
//! and the `NativeBatch` of `Buffer`s it becomes; the page-locking options of a loader.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::gpu_decode::DeviceRows;
use stoker_loader::Batch;
use stoker_proto::v1 as proto;

use crate::buffer::{dtype_name, Buffer, PinnedRelease};
use crate::errors::{from_loader, raise, Kind};

/// Runs a blocking `next_batch_checked` with the GIL released, looking for Ctrl-C and for
/// `closing` (set by a `close()` from another thread) every `INTERRUPT_CHECK`, and turns the
/// batch into its [`NativeBatch`]. `taken` is the step of the batch taken from the stream,
/// set even when what follows raises (a log handler meeting Ctrl-C as the records logged
/// meanwhile are handed over): the caller counts that step as handed out, so the iterator
/// starts the epoch again there rather than go on past a batch it never yielded.
pub(super) fn wait_for_batch<'py>(
    py: Python<'py>,
    closing: &AtomicBool,
    release: Option<(Arc<PinnedRelease>, Arc<stoker_loader::SlotPool>)>,
    taken: &mut Option<u64>,
    next: impl Send + FnOnce(&mut dyn FnMut() -> bool) -> stoker_loader::Result<Option<Batch>>,
) -> PyResult<Option<Bound<'py, NativeBatch>>> {
    let mut signal: Option<PyErr> = None;
    let batch = py.detach(|| {
        next(&mut || {
            closing.load(Ordering::SeqCst)
                || Python::attach(|py| {
                    // Ctrl-C first; then what the native side logged meanwhile (a retry loop,
                    // say), whose handlers may meet a signal too.
                    match py.check_signals().and_then(|()| crate::logs::forward(py)) {
                        Ok(()) => false,
                        Err(error) => {
                            signal = Some(error);
                            true
                        }
                    }
                })
        })
    });
    if let Ok(Some(batch)) = &batch {
        *taken = Some(batch.step);
    }
    crate::logs::forward(py)?;
    let batch = match (batch, signal) {
        (Err(stoker_loader::Error::Interrupted), Some(error)) => return Err(error),
        (Err(stoker_loader::Error::Interrupted), None) => return Err(raise(
            Kind::Stoker,
            "the loader was closed (by another thread, or a signal handler) while next() waited \
                 for a batch"
                .into(),
        )),
        (batch, _) => batch.map_err(from_loader)?,
    };
    match batch {
        Some(batch) => native_batch(py, batch, release).map(Some),
        None => Ok(None),
    }
}

/// One batch as Python reads it, by name. Tensor bytes are shared with the slot, not copied.
#[pyclass(module = "stoker._native", frozen, get_all)]
pub(crate) struct NativeBatch {
    /// The epoch it belongs to.
    epoch: u64,
    /// Its step in the epoch.
    pub(super) step: u64,
    /// `(name, dtype, shape, Buffer)` per tensor: the image first, then the label.
    tensors: Py<PyList>,
    /// The samples of its rows, in row order.
    sample_indices: Vec<u64>,
    /// A dict per sample that could not be read or decoded (and what replaced it).
    bad_samples: Py<PyList>,
    /// The rows the GPU decode lane left on the GPU, if any.
    device_rows: Option<Py<DeviceRows>>,
    /// With `device_rows`: the batch row of each of them as int64 bytes, page-locked beside
    /// the slots when the pool pins and has room there.
    row_places: Option<Py<Buffer>>,
}

#[pymethods]
impl NativeBatch {
    fn __repr__(&self) -> String {
        format!(
            "<stoker NativeBatch epoch {} step {} of {} rows>",
            self.epoch,
            self.step,
            self.sample_indices.len()
        )
    }
}

/// The [`NativeBatch`] of `batch`: its tensors as `Buffer`s over the slot (fenced when the
/// slot is page-locked), its bad samples as dicts, and the rows the GPU decode lane left on the
/// GPU with their places. With a page-locked pool, the tensors built apart from the slot
/// (labels, sources) and the row places are copied into the pool's page-locked room beside
/// the slots and fenced with the batch, so no page is locked for them outside the pinned
/// budget; where that room has no slot free they stay pageable.
pub(super) fn native_batch(
    py: Python<'_>,
    mut batch: Batch,
    release: Option<(Arc<PinnedRelease>, Arc<stoker_loader::SlotPool>)>,
) -> PyResult<Bound<'_, NativeBatch>> {
    let mut places: Option<Bytes> = batch.device_rows.as_ref().map(|rows| {
        let places = rows.positions().iter();
        places.flat_map(|&p| i64::from(p).to_le_bytes()).collect()
    });
    if let Some((_, slots)) = &release {
        let apart: Vec<usize> = (0..batch.tensors.len())
            .filter(|&i| !slots.holds(batch.tensors[i].data.as_ptr()))
            .collect();
        let parts: Vec<&[u8]> = apart
            .iter()
            .map(|&i| &batch.tensors[i].data[..])
            .chain(places.as_deref())
            .collect();
        if let Some(mut pinned) = slots.pin_beside(&parts) {
            if let Some(bytes) = places.as_mut() {
                *bytes = pinned.pop().unwrap_or_default();
            }
            for (i, bytes) in apart.into_iter().zip(pinned) {
                batch.tensors[i].data = bytes;
            }
        }
    }
    let device_rows = batch.device_rows.map(DeviceRows::new);
    let device_rows = device_rows.map(|rows| Py::new(py, rows)).transpose()?;
    let tensors = PyList::empty(py);
    let mut batch_fences = None;
    let mut fences_of = |pinned: bool| match (&release, pinned) {
        (Some((release, _)), true) => {
            if batch_fences.is_none() {
                batch_fences = release.for_batch(py);
            }
            batch_fences.clone()
        }
        _ => None,
    };
    for tensor in batch.tensors {
        let shape = PyTuple::new(py, tensor.shape.iter().copied())?;
        // Only page-locked bytes need fences.
        let pinned = release
            .as_ref()
            .is_some_and(|(_, slots)| slots.holds_pinned(tensor.data.as_ptr()));
        let buffer = Bound::new(py, Buffer::new(tensor.data, fences_of(pinned)))?;
        tensors.append((tensor.name, dtype_name(tensor.dtype), shape, buffer))?;
    }
    let row_places = places
        .map(|bytes| {
            let pinned = release
                .as_ref()
                .is_some_and(|(_, slots)| slots.holds_pinned(bytes.as_ptr()));
            Py::new(py, Buffer::new(bytes, fences_of(pinned)))
        })
        .transpose()?;
    let bad = PyList::empty(py);
    for sample in batch.bad_samples {
        let entry = PyDict::new(py);
        entry.set_item("sample_index", sample.sample_index)?;
        entry.set_item("path", sample.path)?;
        entry.set_item("reason", sample.reason)?;
        entry.set_item("substitute_index", sample.substitute_index)?;
        bad.append(entry)?;
    }
    Bound::new(
        py,
        NativeBatch {
            epoch: batch.epoch,
            step: batch.step,
            tensors: tensors.unbind(),
            sample_indices: batch.sample_indices,
            bad_samples: bad.unbind(),
            device_rows,
            row_places,
        },
    )
}

/// The resizes of `spec`'s resized epoch as Python takes them, oldest first.
pub(super) fn resize_chain(spec: &proto::JobSpec) -> Vec<super::PyResize> {
    let resizes = spec.resized_epoch.as_ref().map(|r| r.resizes.as_slice());
    let resizes = resizes.unwrap_or_default().iter();
    resizes.map(|z| (z.cursor, z.taken.clone())).collect()
}

/// The steps of `epoch` as `spec` resizes it, refusing a `start_step` past them.
pub(super) fn steps_left_from(
    spec: &proto::JobSpec,
    num_samples: u64,
    epoch: u64,
    start_step: u64,
) -> PyResult<u64> {
    let steps = resized_steps(spec, num_samples, epoch)?;
    if start_step > steps {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "step {start_step} is past the end of the resumed epoch ({steps} steps)"
        )));
    }
    Ok(steps)
}

/// Steps of `epoch` for `spec`'s rank under its resized epoch (dataset of `num_samples`).
fn resized_steps(spec: &proto::JobSpec, num_samples: u64, epoch: u64) -> PyResult<u64> {
    let resizes = spec.resized_epoch.as_ref().map_or_else(Vec::new, |r| {
        r.resizes
            .iter()
            .map(stoker_pipeline::Resize::from)
            .collect()
    });
    let config = stoker_pipeline::PlanConfig::from_spec(spec, num_samples);
    stoker_pipeline::EpochPlan::new(config, epoch)
        .and_then(|plan| plan.resized(resizes))
        .map(|plan| plan.steps())
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
}

/// The slot pool's figures in `stats()`: slots in use and in all, and their page-locking.
pub(super) fn slot_stats(
    dict: &Bound<'_, PyDict>,
    slots: &stoker_loader::SlotPool,
) -> PyResult<()> {
    dict.set_item("slots_in_use", slots.in_use())?;
    dict.set_item("slot_capacity", slots.capacity())?;
    dict.set_item("pinned", slots.all_pinned())?;
    dict.set_item("pinned_bytes", slots.pinned_bytes())?;
    dict.set_item("pin_error", slots.pin_error())?;
    dict.set_item("pinned_device", slots.pinned_device())
}
