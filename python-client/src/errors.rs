//! The Python exception hierarchy, rooted at `stoker.StokerError`, and the one table that maps
//! Rust errors onto it (and onto Python's built-ins where one fits: a missing dataset is a
//! `FileNotFoundError`, a bad argument a `ValueError`).

use pyo3::exceptions::{
    PyFileNotFoundError, PyNotADirectoryError, PyPermissionError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};

/// The exception classes, defined in Python so that they can inherit from two bases
/// (`PipelineError` is a `StokerError` and a `ValueError`).
const DEFINITIONS: &std::ffi::CStr = c"
class StokerError(Exception):
    'Base class of every error Stoker raises.'
    __module__ = 'stoker'

class DatasetError(StokerError):
    'The dataset cannot be opened or indexed.'
    __module__ = 'stoker'

class DecodeError(StokerError):
    'A sample could not be read or decoded (raised under on_error=\"fail\"); the message names the file.'
    __module__ = 'stoker'

class PipelineError(StokerError, ValueError):
    'The op list or one of its arguments is invalid.'
    __module__ = 'stoker'

class LoaderTimeoutError(StokerError, TimeoutError):
    'A wait passed its deadline: a batch did not arrive, or every batch slot is held.'
    __module__ = 'stoker'

class WorkerUnavailableError(StokerError):
    'Distributed mode: no worker served the job for longer than worker_grace.'
    __module__ = 'stoker'

class AuthenticationError(StokerError, PermissionError):
    'Distributed mode: a daemon refused the token (none given, or not one it accepts).'
    __module__ = 'stoker'

class TlsError(StokerError, ConnectionError):
    'Distributed mode: TLS failed (unknown CA, wrong name, or TLS on one side only).'
    __module__ = 'stoker'

class GpuUnavailableError(StokerError, RuntimeError):
    'device=\"cuda\" cannot run here: no CUDA driver or device, torch without CUDA, or page-locked slots over the pinned budget; the message names what is missing.'
    __module__ = 'stoker'
";

/// The exception classes, in the order of [`Kind`].
pub const NAMES: [&str; 9] = [
    "StokerError",
    "DatasetError",
    "DecodeError",
    "PipelineError",
    "LoaderTimeoutError",
    "WorkerUnavailableError",
    "AuthenticationError",
    "TlsError",
    "GpuUnavailableError",
];

/// Which Stoker exception to raise.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Stoker = 0,
    Dataset = 1,
    Decode = 2,
    Pipeline = 3,
    Timeout = 4,
    WorkerUnavailable = 5,
    Authentication = 6,
    Tls = 7,
    Gpu = 8,
}

static CLASSES: PyOnceLock<Vec<Py<PyType>>> = PyOnceLock::new();

/// Defines the classes once and returns them.
pub fn classes(py: Python<'_>) -> PyResult<&Vec<Py<PyType>>> {
    CLASSES.get_or_try_init(py, || {
        let namespace = PyDict::new(py);
        py.run(DEFINITIONS, Some(&namespace), None)?;
        NAMES
            .iter()
            .map(|name| {
                let class = namespace
                    .get_item(name)?
                    .ok_or_else(|| PyValueError::new_err(format!("{name} was not defined")))?;
                Ok(class.cast_into::<PyType>()?.unbind())
            })
            .collect()
    })
}

/// An exception of `kind` with `message`.
pub fn raise(kind: Kind, message: String) -> PyErr {
    Python::attach(|py| match classes(py) {
        Ok(classes) => PyErr::from_type(classes[kind as usize].bind(py).clone(), message),
        Err(error) => error,
    })
}

/// Maps a loader error to the Python exception that names its cause, by its kind: the same
/// class whether the error happened in this process or came back from a daemon.
pub fn from_loader(error: stoker_loader::Error) -> PyErr {
    use stoker_loader::ErrorKind;
    let message = error.to_string();
    if matches!(error, stoker_loader::Error::Gpu(_)) {
        return raise(Kind::Gpu, message);
    }
    match error.kind() {
        ErrorKind::InvalidArgument => PyValueError::new_err(message),
        ErrorKind::NotFound => PyFileNotFoundError::new_err(message),
        ErrorKind::NotADirectory => PyNotADirectoryError::new_err(message),
        ErrorKind::PermissionDenied => PyPermissionError::new_err(message),
        ErrorKind::Dataset => raise(Kind::Dataset, message),
        ErrorKind::Decode => raise(Kind::Decode, message),
        ErrorKind::Pipeline => raise(Kind::Pipeline, message),
        ErrorKind::Timeout => raise(Kind::Timeout, message),
        ErrorKind::WorkerUnavailable => raise(Kind::WorkerUnavailable, message),
        ErrorKind::Unauthenticated => raise(Kind::Authentication, message),
        ErrorKind::Tls => raise(Kind::Tls, message),
        ErrorKind::Interrupted | ErrorKind::Internal => raise(Kind::Stoker, message),
    }
}

/// Maps a dataset error (from `make_dataset`).
pub fn from_dataset(error: stoker_datasets::Error) -> PyErr {
    from_loader(stoker_loader::Error::Dataset(error))
}
