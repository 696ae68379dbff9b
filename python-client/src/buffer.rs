//! `Buffer`: a batch tensor's bytes, owned by Rust and shown to Python through the buffer
//! protocol, so NumPy and torch wrap them without a copy. The bytes usually live in a slot of
//! the loader's pool; the slot goes back to the pool when the last Python view is gone.
//!
//! In a page-locked pool a copy to the GPU may still be reading the slot when the last view
//! goes (`.cuda(non_blocking=True)` returns at once). The bytes are then let go only after
//! fences on the streams that may hold such copies have completed ([`ReleaseFences`]): the
//! loader's own copy stream ([`Buffer::release_after`]), or, for a batch handed to the user, a
//! sweep of every device the process has started CUDA on (the fence thread fences the legacy
//! default stream and every stream of torch's pool there, on whichever thread a copy was
//! queued) and the releasing thread's current stream when it is none of those (the pages are
//! locked for every device, so a batch pinned through device 0 may be copied to device 1).

use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use stoker_gpu::{Cuda, DevicePinning, Fence, Sweep};
use stoker_proto::v1::Dtype;

/// How the buffers of a page-locked pool are let go: the device that locked them, and a Python
/// callable that names each device a user's copy may be queued on with the releasing thread's
/// current stream there (`stoker.gpu.release_streams`: a list of `(device, CUstream)` pairs,
/// empty when torch has not started CUDA; it registers torch's pool streams for the sweeps).
pub struct ReleaseFences {
    pub cuda: Arc<Cuda>,
    pub streams: Option<Py<PyAny>>,
    /// The process the batch was handed out in: a process forked from it (a checkpoint writer)
    /// has no driver context nor fence thread of its own, and lets its copy go unfenced.
    pub pid: u32,
}

/// What a loader's page-locked buffers are let go with before its pool has chosen the device
/// that locks its slots (when the first batch goes out): the callable naming the streams, and
/// what locks the slots. Each batch's [`ReleaseFences`] pairs the callable with the context
/// that locked the batch's slot.
pub struct PinnedRelease {
    pub streams: Option<Py<PyAny>>,
    pub pinning: Arc<DevicePinning>,
}

impl PinnedRelease {
    /// The fences of a batch whose bytes are in a locked slot (its context is open then),
    /// else `None`.
    pub fn for_batch(&self, py: Python<'_>) -> Option<Arc<ReleaseFences>> {
        Some(Arc::new(ReleaseFences {
            cuda: Arc::clone(self.pinning.opened()?),
            streams: self.streams.as_ref().map(|s| s.clone_ref(py)),
            pid: std::process::id(),
        }))
    }
}

impl ReleaseFences {
    /// What a batch released by the user waits for: a sweep of every device the callable
    /// names (the fence thread fences the legacy default stream and torch's pool streams
    /// there, whichever thread queued a copy on them), and a fence recorded now on each named
    /// stream a sweep does not cover (a current stream made outside torch's pool, which may
    /// not live until the sweep). `None` when the streams cannot be known (the caller then
    /// waits for the whole device).
    fn user_release(&self) -> Option<(Vec<Fence>, Vec<Sweep>)> {
        let streams = self.streams.as_ref()?;
        let handles: Vec<(usize, usize)> = Python::attach(|py| {
            streams
                .call0(py)
                .and_then(|handles| handles.extract::<Vec<(usize, usize)>>(py))
        })
        .map_err(|error| {
            tracing::debug!(%error, "cannot read the current streams; fencing the device");
        })
        .ok()?;
        let mut fences = Vec::new();
        let mut sweeps: Vec<(usize, Sweep)> = Vec::with_capacity(handles.len());
        for (device, stream) in handles {
            let cuda = if device == self.cuda.ordinal() {
                Arc::clone(&self.cuda)
            } else {
                // The callable names only devices whose primary context is active, so this
                // retains a running context (once per process) rather than starting one.
                match Cuda::open(device) {
                    Ok(cuda) => cuda,
                    Err(error) => {
                        tracing::debug!(%error, device, "cannot open a device; fencing the devices");
                        return None;
                    }
                }
            };
            if !sweeps.iter().any(|(d, _)| *d == device) {
                sweeps.push((device, cuda.sweep()));
            }
            if cuda.swept(stream) {
                continue;
            }
            // SAFETY: the handle is a stream of `device`'s primary context, as torch reports
            // it for that device, current on this thread now.
            match unsafe { cuda.fence(stream) } {
                Ok(fence) => fences.push(fence),
                Err(error) => {
                    tracing::debug!(%error, device, stream, "cannot fence a stream; fencing the device");
                    return None;
                }
            }
        }
        Some((fences, sweeps.into_iter().map(|(_, sweep)| sweep).collect()))
    }

    /// For unknown streams: fences on everything queued so far on the locking device and on
    /// every other device whose primary context is active; `None` when one of those cannot
    /// be fenced.
    fn device_fences(&self) -> Option<Vec<Fence>> {
        let mut fences = vec![self.cuda.device_fence()];
        for device in stoker_gpu::cuda_active_devices() {
            if device != self.cuda.ordinal() {
                match Cuda::open(device) {
                    Ok(cuda) => fences.push(cuda.device_fence()),
                    Err(error) => {
                        tracing::error!(%error, device, "cannot fence a device a copy may be reading a batch slot on");
                        return None;
                    }
                }
            }
        }
        Some(fences)
    }
}

/// Rust-owned bytes of one tensor (1-D, unsigned bytes, writable).
#[pyclass(module = "stoker._native", frozen)]
pub struct Buffer {
    data: Bytes,
    // Py_buffer points at these; they live as long as the object, which every view keeps alive.
    shape: [ffi::Py_ssize_t; 1],
    strides: [ffi::Py_ssize_t; 1],
    /// Set for the buffers of a page-locked pool.
    release: Option<Arc<ReleaseFences>>,
    /// Fences recorded by [`Buffer::release_after`]; when there are some, the bytes never left
    /// the loader and only those copies read them.
    fences: Mutex<Vec<Fence>>,
}

static FORMAT_UNSIGNED_BYTE: &std::ffi::CStr = c"B";

impl Buffer {
    /// Wraps `data`, whose bytes nothing else reads or writes (several buffers may be disjoint
    /// slices of one batch slot): Python may write into it. `release` is set when the bytes
    /// are page-locked (see the module doc).
    pub fn new(data: Bytes, release: Option<Arc<ReleaseFences>>) -> Self {
        let len = data.len() as ffi::Py_ssize_t;
        Self {
            data,
            shape: [len],
            strides: [1],
            release,
            fences: Mutex::new(Vec::new()),
        }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let Some(release) = self.release.take() else {
            return;
        };
        if release.pid != std::process::id() {
            // A forked process's copy: its slot stays the parent's (the pool does nothing with
            // it here either).
            return;
        }
        let data = std::mem::take(&mut self.data);
        let mut fences = std::mem::take(self.fences.get_mut().unwrap_or_else(|p| p.into_inner()));
        let mut sweeps = Vec::new();
        if fences.is_empty() {
            let found = release
                .user_release()
                .or_else(|| release.device_fences().map(|fences| (fences, Vec::new())));
            match found {
                Some(found) => (fences, sweeps) = found,
                None => {
                    // A copy may still read the slot and nothing can say when it is done:
                    // the slot is kept out of the pool for good rather than refilled under it
                    // (a pool short of slots says so; wrong pixels would not).
                    std::mem::forget(data);
                    return;
                }
            }
        }
        release
            .cuda
            .release_after_sweeps(fences, sweeps, Box::new(data));
    }
}

#[pymethods]
impl Buffer {
    /// Whether the bytes are in page-locked memory (a pinned pool's slot, or its room beside
    /// the slots).
    #[getter]
    fn pinned(&self) -> bool {
        self.release.is_some()
    }

    /// Records a fence on `stream` (a `CUstream` handle of the pool's device, such as
    /// `torch.cuda.Stream.cuda_stream`) after the copies queued there read these bytes: the
    /// slot returns to the pool only once they have completed. For the loader's own copy
    /// stream; the bytes are then not handed to the user. A no-op for pageable bytes (a copy
    /// from them finishes reading before it returns).
    fn release_after(&self, stream: usize) -> PyResult<()> {
        let Some(release) = &self.release else {
            return Ok(());
        };
        // SAFETY: the caller passes a stream of the pool's device, as the docs require.
        let fence = unsafe { release.cuda.fence(stream) }
            .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
        self.fences
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(fence);
        Ok(())
    }

    /// Address of the first byte.
    #[getter]
    fn address(&self) -> usize {
        self.data.as_ptr() as usize
    }

    /// Length in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.data.len()
    }

    fn __len__(&self) -> usize {
        self.data.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "<stoker Buffer of {} bytes at {:#x}>",
            self.data.len(),
            self.address()
        )
    }

    /// # Safety
    /// Called by the interpreter with a valid, writable `Py_buffer`.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("null Py_buffer"));
        }
        let this = slf.get();
        // SAFETY: `view` is non-null and the interpreter hands it to us to fill in. The bytes
        // were moved into this object by the loader and no Rust code reads or writes them
        // until the object (and so every view of it) is gone, so Python may write into them;
        // the shape and stride arrays live inside the object, which the view keeps alive.
        unsafe {
            fill_byte_view(
                view,
                slf.clone().into_any(),
                this.data.as_ptr() as *mut c_void,
                &this.shape,
                &this.strides,
                flags,
            )
        };
        Ok(())
    }

    /// # Safety
    /// Called by the interpreter; nothing to free (the format string is static).
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

/// Fills `view` as a writable, 1-D view of unsigned bytes at `buf` (`shape[0]` of them), owned
/// by `owner`, for the `__getbuffer__` of the objects that show Rust memory to Python.
///
/// # Safety
/// `view` is non-null and the interpreter's to fill; `buf` is valid and writable for
/// `shape[0]` bytes while any view of `owner` lives; `shape` and `strides` live inside
/// `owner`, which the view keeps alive.
pub(crate) unsafe fn fill_byte_view(
    view: *mut ffi::Py_buffer,
    owner: Bound<'_, PyAny>,
    buf: *mut c_void,
    shape: &[ffi::Py_ssize_t; 1],
    strides: &[ffi::Py_ssize_t; 1],
    flags: c_int,
) {
    // SAFETY: as the caller promises.
    unsafe {
        (*view).obj = owner.into_ptr();
        (*view).buf = buf;
        (*view).len = shape[0];
        (*view).readonly = 0;
        (*view).itemsize = 1;
        (*view).format = if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT {
            FORMAT_UNSIGNED_BYTE.as_ptr() as *mut _
        } else {
            std::ptr::null_mut()
        };
        (*view).ndim = 1;
        (*view).shape = if flags & ffi::PyBUF_ND == ffi::PyBUF_ND {
            shape.as_ptr() as *mut _
        } else {
            std::ptr::null_mut()
        };
        (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
            strides.as_ptr() as *mut _
        } else {
            std::ptr::null_mut()
        };
        (*view).suboffsets = std::ptr::null_mut();
        (*view).internal = std::ptr::null_mut();
    }
}

/// The numpy name of a proto dtype.
pub(crate) fn dtype_name(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::Uint8 => "uint8",
        Dtype::Float32 => "float32",
        Dtype::Int64 => "int64",
        Dtype::Int32 => "int32",
        Dtype::Uint16 => "uint16",
        Dtype::Uint32 => "uint32",
        Dtype::Unspecified => "unknown",
    }
}
