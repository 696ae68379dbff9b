//! The Python exception hierarchy, rooted at `stoker.StokerError`, and the one table that maps
//! Rust errors onto it (and onto Python's built-ins where one fits: a missing dataset is a
//! `FileNotFoundError`, a bad argument a `ValueError`).

use pyo3::exceptions::{PyFileNotFoundError, PyNotADirectoryError, PyValueError};
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
    'No worker can serve the job.'
    __module__ = 'stoker'
";

/// The exception classes, in the order of [`Kind`].
pub const NAMES: [&str; 6] = [
    "StokerError",
    "DatasetError",
    "DecodeError",
    "PipelineError",
    "LoaderTimeoutError",
    "WorkerUnavailableError",
];

/// Which Stoker exception to raise.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Stoker = 0,
    Dataset = 1,
    Decode = 2,
    Pipeline = 3,
    Timeout = 4,
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

/// Maps a loader error to the Python exception that names its cause.
pub fn from_loader(error: stoker_loader::Error) -> PyErr {
    use stoker_datasets::Error as DatasetError;
    use stoker_loader::Error as LoaderError;
    use stoker_worker::Error as WorkerError;
    let message = error.to_string();
    match error {
        LoaderError::InvalidSpec(_) => PyValueError::new_err(message),
        LoaderError::Dataset(DatasetError::RootNotFound(_)) => {
            PyFileNotFoundError::new_err(message)
        }
        LoaderError::Dataset(DatasetError::NotADirectory(_)) => {
            PyNotADirectoryError::new_err(message)
        }
        LoaderError::Dataset(DatasetError::UnsupportedScheme { .. })
        | LoaderError::Dataset(DatasetError::InvalidUri { .. }) => PyValueError::new_err(message),
        LoaderError::Dataset(_) | LoaderError::Worker(WorkerError::Dataset(_)) => {
            raise(Kind::Dataset, message)
        }
        LoaderError::Worker(WorkerError::InvalidPipeline(_)) => raise(Kind::Pipeline, message),
        LoaderError::Worker(WorkerError::InvalidSpec(_)) => PyValueError::new_err(message),
        LoaderError::Worker(WorkerError::BadSample { .. }) => raise(Kind::Decode, message),
        LoaderError::Worker(WorkerError::Io { .. }) => raise(Kind::Dataset, message),
        LoaderError::Timeout { .. }
        | LoaderError::SlotsHeld { .. }
        | LoaderError::RemoteTimeout { .. } => raise(Kind::Timeout, message),
        LoaderError::Stopped(_)
        | LoaderError::Threads(_)
        | LoaderError::Interrupted
        | LoaderError::Remote(_) => raise(Kind::Stoker, message),
    }
}

/// Maps a dataset error (from `make_dataset`).
pub fn from_dataset(error: stoker_datasets::Error) -> PyErr {
    from_loader(stoker_loader::Error::Dataset(error))
}
