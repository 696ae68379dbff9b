//! The native loader's settings as the Python package defines them, once: the frozen
//! dataclasses of `stoker._settings`, read here by attribute. Each struct below names the
//! attributes it reads; `SETTINGS_FIELDS` gives those names to Python, where a test checks
//! them against the dataclasses' fields, so the two cannot drift apart.

use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use stoker_proto::v1::{self as proto, JobSpec};

use crate::spec::PyMix;

/// A settings struct read from the dataclass of the same name, with the list of the fields it
/// reads (`FIELDS`, in order).
macro_rules! settings {
    ($(#[$doc:meta])* $name:ident $(<$py:lifetime>)? { $($(#[$field_doc:meta])* $field:ident: $ty:ty,)* }) => {
        $(#[$doc])*
        #[derive(FromPyObject)]
        pub(crate) struct $name $(<$py>)? {
            $($(#[$field_doc])* pub(crate) $field: $ty,)*
        }

        impl $(<$py>)? $name $(<$py>)? {
            /// The dataclass's fields this struct reads, in order.
            pub(crate) const FIELDS: &'static [&'static str] = &[$(stringify!($field)),*];
        }
    };
}

settings! {
    /// What every loader takes, whatever its source (`stoker._settings.LoaderSettings`).
    LoaderSettings {
        /// Samples per batch.
        batch_size: u32,
        /// Reshuffle every epoch.
        shuffle: bool,
        /// The shuffle's and augmentations' seed.
        seed: u64,
        /// Drop each epoch's last, partial batch.
        drop_last: bool,
        /// This rank.
        rank: u32,
        /// Ranks in all.
        world_size: u32,
        /// Batches ahead (0: the controller's depth).
        prefetch: usize,
        /// Seconds a batch is waited for.
        timeout_s: f64,
        /// Batches the caller may hold beyond those in flight.
        max_held_batches: usize,
        /// The controller's memory budget.
        max_prefetch_bytes: u64,
        /// The dashboard's address, if one is served.
        dashboard: Option<String>,
        /// The file of its credential off loopback.
        dashboard_token_file: Option<PathBuf>,
        /// The job's name on the dashboard.
        job_name: String,
        /// The device that page-locks the slots (none: pageable slots).
        pin_device: Option<usize>,
        /// Lock through the device the process uses when the first batch goes out.
        pin_follow: bool,
        /// Bytes of page-locked slots this process may hold.
        pinned_budget: u64,
        /// Names the streams a released batch is fenced on (`stoker.gpu.release_streams`).
        release_streams: Option<Py<PyAny>>,
    }
}

settings! {
    /// A source Stoker reads itself (`stoker._settings.SourceSettings`).
    SourceSettings<'py> {
        /// The dataset's path, URI or pattern (the first of `uris`).
        source: PathBuf,
        /// The pipeline's ops, as `Op.to_dict()` gives them.
        ops: Vec<Bound<'py, PyDict>>,
        /// Decode threads (0: all cores).
        num_threads: usize,
        /// The bad-sample policy, `"skip"` or `"fail"`.
        on_error: String,
        /// The dataset's format (`"auto"`: from the files).
        format: String,
        /// Shards per shuffle window (0: global).
        shuffle_window: u32,
        /// JSONL's text field ("": `"text"`).
        text_column: String,
        /// The label column ("": found by name).
        label_column: String,
        /// The image column ("": found by name or feature).
        image_column: String,
        /// The coordinator (or fleet) serving the job, for the distributed mode.
        address: Option<String>,
        /// Seconds batches may be wanted with no worker.
        worker_grace_s: f64,
        /// The daemons' shared token.
        token: Option<String>,
        /// The CA of the daemons' certificates (TLS).
        tls_ca: Option<PathBuf>,
        /// The name their certificates carry.
        tls_server_name: Option<String>,
        /// A mix of sources in place of `source` (`MixRequest.native(...).arguments()`).
        mix: Option<PyMix<'py>>,
        /// Where images are decoded: `"cpu"`, `"gpu"` or `"auto"`.
        decode: String,
        /// The GPU decode lane's device memory, in bytes.
        gpu_memory: usize,
        /// Folders searched first for the CUDA libraries.
        library_dirs: Vec<PathBuf>,
        /// The device stage's tail for the lane's kernel to apply when asked: (dtype, channel
        /// planes, per-channel scale and shift or None); None: no device stage tail.
        gpu_tail: Option<crate::gpu_decode::StageTail>,
        /// Every name a source of several names holds.
        uris: Vec<String>,
        /// The split to read ("": the only one).
        split: String,
    }
}

settings! {
    /// A Python map-style dataset's source (`stoker._settings.DatasetSettings`).
    DatasetSettings {
        /// What fills each batch's slot (`builder.build`).
        builder: Py<PyAny>,
        /// Samples in the dataset.
        num_samples: u64,
        /// Each field's bytes per sample.
        sample_bytes: Vec<usize>,
        /// Threads (or worker processes) loading batches at once.
        lanes: usize,
        /// What a timeout's message says the loader waits on.
        waiting_on: String,
        /// Slots in one shared mapping that worker processes write into.
        shared_slots: bool,
    }
}

impl LoaderSettings {
    /// Every loader's part of its job spec, once the deadline is checked: the batch size, the
    /// order and the ranks (a rank's short last batch padded), no dataset yet.
    pub(crate) fn plan(&self) -> PyResult<JobSpec> {
        let timeout_s = self.timeout_s;
        if !(timeout_s.is_finite() && timeout_s > 0.0) {
            return Err(PyValueError::new_err(format!(
                "timeout must be a positive number of seconds, got {timeout_s}"
            )));
        }
        Ok(JobSpec {
            batch_size: self.batch_size,
            seed: self.seed,
            shuffle: self.shuffle,
            drop_last: self.drop_last,
            rank: self.rank,
            world_size: self.world_size,
            uneven_tail: proto::UnevenTail::Pad as i32,
            ..JobSpec::default()
        })
    }
}

/// `SETTINGS_FIELDS`: each settings dataclass's name and the fields read from it.
pub fn fields(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let fields = PyDict::new(py);
    for (name, names) in [
        ("LoaderSettings", LoaderSettings::FIELDS),
        ("SourceSettings", SourceSettings::FIELDS),
        ("DatasetSettings", DatasetSettings::FIELDS),
    ] {
        fields.set_item(name, PyList::new(py, names)?)?;
    }
    Ok(fields)
}
