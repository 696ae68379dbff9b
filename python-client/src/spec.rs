//! The job spec a Python loader asks for: its settings checked, its pipeline read from the ops'
//! dicts, a mix's sources.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use stoker_proto::v1::{self as proto, BadSamplePolicy, JobSpec};

/// What a source Stoker reads adds to a job's plan: how it is read, and which of its files.
pub(crate) struct JobSettings<'a> {
    pub on_error: &'a str,
    pub format: &'a str,
    pub shuffle_window: u32,
    pub text_column: String,
    /// The label column ("" = found by name).
    pub label_column: String,
    /// The image column ("" = found by name or feature).
    pub image_column: String,
    /// The source's names when it is a list of several (`source` is then the first, for
    /// messages); empty for one.
    pub uris: Vec<String>,
    /// The split to read ("" = none).
    pub split: String,
}

/// A mix as Python passes it: the sources as (uri, ops, weight, format, text column, the names
/// of a list of several, split), the window, the epoch rule (`"first_exhausted"`,
/// `"all_exhausted"` or `"samples"`) and the samples of an epoch for `"samples"`.
pub(crate) type PyMix<'py> = (Vec<PyMixSource<'py>>, u32, String, u64);

/// One source of a [`PyMix`].
pub(crate) type PyMixSource<'py> = (
    String,
    Vec<Bound<'py, PyDict>>,
    f64,
    String,
    String,
    Vec<String>,
    String,
);

/// The spec's `Mix` of a mix from Python.
pub(crate) fn mix_spec(mix: PyMix<'_>) -> PyResult<proto::Mix> {
    let (sources, window, epoch_end, epoch_samples) = mix;
    let epoch_end = match epoch_end.as_str() {
        "first_exhausted" => proto::MixEpochEnd::FirstExhausted,
        "all_exhausted" => proto::MixEpochEnd::AllExhausted,
        "samples" => proto::MixEpochEnd::Samples,
        other => {
            return Err(PyValueError::new_err(format!(
                "epoch_end must be \"first_exhausted\", \"all_exhausted\" or a number of \
                 samples, got {other:?}"
            )))
        }
    };
    let sources = sources
        .into_iter()
        .map(|(uri, ops, weight, format, text_column, uris, split)| {
            Ok(proto::MixSource {
                dataset: Some(proto::DatasetSource {
                    uri: if uris.is_empty() { uri } else { String::new() },
                    uris,
                    split,
                    format: dataset_format(&format)? as i32,
                    text_column,
                    ..Default::default()
                }),
                pipeline: crate::ops::from_python(&ops)?,
                weight,
            })
        })
        .collect::<PyResult<Vec<_>>>()?;
    Ok(proto::Mix {
        sources,
        window,
        epoch_end: epoch_end as i32,
        epoch_samples,
    })
}

/// The dataset format named `format` in Python.
pub(crate) fn dataset_format(format: &str) -> PyResult<proto::DatasetFormat> {
    Ok(match format {
        "auto" => proto::DatasetFormat::Auto,
        "image_folder" => proto::DatasetFormat::ImageFolder,
        "tar" => proto::DatasetFormat::TarShards,
        "parquet" => proto::DatasetFormat::Parquet,
        "tokens" => proto::DatasetFormat::TokenFile,
        "jsonl" => proto::DatasetFormat::Jsonl,
        "hf" => proto::DatasetFormat::HfDataset,
        "mds" => proto::DatasetFormat::Mds,
        other => {
            return Err(PyValueError::new_err(format!(
                "format must be \"auto\", \"image_folder\", \"tar\", \"parquet\", \"tokens\", \
                 \"jsonl\", \"hf\" or \"mds\", got {other:?}"
            )))
        }
    })
}

/// Checks the settings and builds the job spec of `plan` (its order and ranks) over `source`
/// (the pipeline from the ops' dicts).
pub(crate) fn job_spec(
    plan: JobSpec,
    source: String,
    ops: &[Bound<'_, PyDict>],
    settings: JobSettings<'_>,
) -> PyResult<JobSpec> {
    let format = dataset_format(settings.format)?;
    let on_error = match settings.on_error {
        "skip" => BadSamplePolicy::Skip,
        "fail" => BadSamplePolicy::Fail,
        other => {
            return Err(PyValueError::new_err(format!(
                "on_error must be \"skip\" or \"fail\", got {other:?}"
            )))
        }
    };
    Ok(JobSpec {
        dataset: Some(proto::DatasetSource {
            uri: if settings.uris.is_empty() {
                source
            } else {
                String::new()
            },
            uris: settings.uris,
            split: settings.split,
            format: format as i32,
            text_column: settings.text_column,
            label_column: settings.label_column,
            image_column: settings.image_column,
            ..Default::default()
        }),
        pipeline: crate::ops::from_python(ops)?,
        on_error: on_error as i32,
        shuffle_window: settings.shuffle_window,
        ..plan
    })
}
