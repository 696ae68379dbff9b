//! `Buffer`: a batch tensor's bytes, owned by Rust and shown to Python through the buffer
//! protocol, so NumPy and torch wrap them without a copy. The bytes usually live in a slot of
//! the loader's pool; the slot goes back to the pool when the last Python view is gone.

use std::ffi::{c_int, c_void};

use bytes::Bytes;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

/// Rust-owned bytes of one tensor (1-D, unsigned bytes, writable).
#[pyclass(module = "stoker._native", frozen)]
pub struct Buffer {
    data: Bytes,
    // Py_buffer points at these; they live as long as the object, which every view keeps alive.
    shape: [ffi::Py_ssize_t; 1],
    strides: [ffi::Py_ssize_t; 1],
}

static FORMAT_UNSIGNED_BYTE: &std::ffi::CStr = c"B";

impl Buffer {
    /// Wraps `data`, whose bytes nothing else reads or writes (several buffers may be disjoint
    /// slices of one batch slot): Python may write into it.
    pub fn new(data: Bytes) -> Self {
        let len = data.len() as ffi::Py_ssize_t;
        Self {
            data,
            shape: [len],
            strides: [1],
        }
    }
}

#[pymethods]
impl Buffer {
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
