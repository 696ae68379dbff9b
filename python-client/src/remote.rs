//! The distributed mode seen from Python: the same surface as `NativeLoader`, but batches come
//! from a Stoker coordinator's workers (`stoker.Loader(..., address="host:port")`).

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use stoker_loader::distributed::{RemoteEpochStream, RemoteLoader, RemoteOptions};

use crate::errors::{from_loader, raise, Kind};

/// A job served by a coordinator, driven from Python.
#[pyclass(module = "stoker._native")]
pub struct RemoteNativeLoader {
    loader: Option<RemoteLoader>,
    stream: Option<RemoteEpochStream>,
    address: String,
    prefetch: usize,
}

impl RemoteNativeLoader {
    fn loader(&self) -> PyResult<&RemoteLoader> {
        self.loader
            .as_ref()
            .ok_or_else(|| raise(Kind::Stoker, "the loader is closed".into()))
    }
}

#[pymethods]
impl RemoteNativeLoader {
    #[new]
    #[pyo3(signature = (address, source, ops, batch_size, shuffle, seed, drop_last, rank, world_size, prefetch, on_error, timeout_s, format = "auto", shuffle_window = 0, text_column = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        address: String,
        source: String,
        ops: Vec<Bound<'_, PyDict>>,
        batch_size: u32,
        shuffle: bool,
        seed: u64,
        drop_last: bool,
        rank: u32,
        world_size: u32,
        prefetch: usize,
        on_error: &str,
        timeout_s: f64,
        format: &str,
        shuffle_window: u32,
        text_column: String,
    ) -> PyResult<Self> {
        let spec = crate::job_spec(
            source,
            &ops,
            crate::JobSettings {
                batch_size,
                shuffle,
                seed,
                drop_last,
                rank,
                world_size,
                on_error,
                timeout_s,
                format,
                shuffle_window,
                text_column,
            },
        )?;
        // prefetch 0 ("auto") keeps the default credit depth.
        let defaults = RemoteOptions::default();
        let options = RemoteOptions {
            prefetch: if prefetch == 0 {
                defaults.prefetch
            } else {
                prefetch
            },
            deadline: Duration::from_secs_f64(timeout_s),
            ..defaults
        };
        let prefetch = options.prefetch;
        let loader = py
            .detach(|| RemoteLoader::connect(&address, spec, options))
            .map_err(from_loader)?;
        Ok(Self {
            loader: Some(loader),
            stream: None,
            address,
            prefetch,
        })
    }

    /// Steps (batches) per epoch for this rank.
    #[getter]
    fn steps_per_epoch(&self) -> PyResult<u64> {
        Ok(self.loader()?.steps_per_epoch())
    }

    /// Samples in the dataset, as a worker counted them (0 when unknown here).
    #[getter]
    fn num_samples(&self) -> PyResult<u64> {
        Ok(self.loader()?.num_samples())
    }

    /// Class names are known to the workers only.
    #[getter]
    fn class_names(&self) -> Vec<String> {
        Vec::new()
    }

    /// Decode threads in this process: none (the workers decode).
    #[getter]
    fn num_threads(&self) -> usize {
        0
    }

    /// Batches accepted ahead of the training loop (credits).
    #[getter]
    fn prefetch(&self) -> usize {
        self.prefetch
    }

    /// No dashboard here: the coordinator serves it.
    #[getter]
    fn dashboard_url(&self) -> Option<String> {
        None
    }

    /// The coordinator's address.
    #[getter]
    fn address(&self) -> String {
        self.address.clone()
    }

    /// Batches are not pooled in distributed mode (each arrives in its own buffer).
    #[getter]
    fn slot_capacity(&self) -> usize {
        0
    }

    /// Starts `epoch` at `start_step`.
    fn start_epoch(&mut self, py: Python<'_>, epoch: u64, start_step: u64) -> PyResult<()> {
        self.stream = None;
        let loader = self.loader()?;
        let stream = py
            .detach(|| loader.epoch(epoch, start_step))
            .map_err(from_loader)?;
        self.stream = Some(stream);
        Ok(())
    }

    /// The next batch, as `NativeLoader.next_batch` gives it. Waits with the GIL released.
    fn next_batch<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        self.loader()?;
        let stream = self
            .stream
            .as_mut()
            .ok_or_else(|| raise(Kind::Stoker, "no epoch started: call start_epoch".into()))?;
        crate::wait_for_batch(py, |interrupted| stream.next_batch_checked(interrupted))
    }

    /// Figures so far (the coordinator's dashboard has the rest).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        dict.set_item("address", &self.address)?;
        dict.set_item("prefetch_depth", self.prefetch)?;
        Ok(dict)
    }

    /// Closes the session; batches already handed out stay valid.
    fn close(&mut self, py: Python<'_>) {
        let stream = self.stream.take();
        let loader = self.loader.take();
        py.detach(|| {
            drop(stream);
            drop(loader);
        });
    }
}
