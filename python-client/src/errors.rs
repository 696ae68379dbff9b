//! The Python exception hierarchy, rooted at `stoker.StokerError`, and the one table that maps
//! Rust errors onto it (and onto Python's built-ins where one fits: a missing dataset is a
//! `FileNotFoundError`, a bad argument a `ValueError`).

use pyo3::exceptions::{
    PyFileNotFoundError, PyNotADirectoryError, PyPermissionError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

/// The exception classes, in the order of [`Kind`]: each one's name, the built-in exception it
/// also is (two bases: `PipelineError` is a `StokerError` and a `ValueError`), and its
/// docstring. Every class but the first derives from `StokerError`.
const HIERARCHY: [(&str, Option<&str>, &str); 9] = [
    (
        "StokerError",
        None,
        "Base class of every error Stoker raises.",
    ),
    (
        "DatasetError",
        None,
        "The dataset cannot be opened or indexed.",
    ),
    (
        "DecodeError",
        None,
        "A sample could not be read or decoded (raised under on_error=\"fail\", or under \
         \"skip\" when none of the samples tried in its place could be either); the message \
         names the file.",
    ),
    (
        "PipelineError",
        Some("ValueError"),
        "The op list or one of its arguments is invalid.",
    ),
    (
        "LoaderTimeoutError",
        Some("TimeoutError"),
        "A wait passed its deadline: a batch did not arrive, or every batch slot is held.",
    ),
    (
        "WorkerUnavailableError",
        None,
        "Distributed mode: no worker served the job for longer than worker_grace.",
    ),
    (
        "AuthenticationError",
        Some("PermissionError"),
        "Distributed mode: a daemon refused the token (none given, or not one it accepts).",
    ),
    (
        "TlsError",
        Some("ConnectionError"),
        "Distributed mode: TLS failed (unknown CA, wrong name, or TLS on one side only).",
    ),
    (
        "GpuUnavailableError",
        Some("RuntimeError"),
        "device=\"cuda\" cannot run here: no CUDA driver or device, torch without CUDA, or \
         page-locked slots over the pinned budget; the message names what is missing.",
    ),
];

/// The exception classes' names, in the order of [`Kind`].
pub fn names() -> impl Iterator<Item = &'static str> {
    HIERARCHY.iter().map(|(name, _, _)| *name)
}

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

/// Defines the classes once (of module `stoker`, as `type(name, bases, namespace)` would)
/// and returns them.
pub fn classes(py: Python<'_>) -> PyResult<&Vec<Py<PyType>>> {
    CLASSES.get_or_try_init(py, || {
        let builtins = py.import("builtins")?;
        let mut classes: Vec<Py<PyType>> = Vec::with_capacity(HIERARCHY.len());
        for (name, builtin, doc) in HIERARCHY {
            let mut bases = Vec::new();
            match classes.first() {
                Some(root) => bases.push(root.bind(py).clone().into_any()),
                None => bases.push(builtins.getattr("Exception")?),
            }
            if let Some(builtin) = builtin {
                bases.push(builtins.getattr(builtin)?);
            }
            let namespace = PyDict::new(py);
            namespace.set_item("__doc__", doc)?;
            namespace.set_item("__module__", "stoker")?;
            let bases = PyTuple::new(py, bases)?;
            let class = py.get_type::<PyType>().call1((name, bases, namespace))?;
            classes.push(class.cast_into::<PyType>()?.unbind());
        }
        Ok(classes)
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
