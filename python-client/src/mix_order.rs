//! `stoker._native.MixOrder`: the native mix order for Python datasets (`stoker.mix` over
//! `Loader.from_dataset`-style datasets), made once per process and kept.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use stoker_proto::v1 as proto;

/// The mix order of Python datasets (`stoker.mix` over `Loader.from_dataset`-style
/// datasets): sources of `lens` samples mixed by `weights`, `window` positions per window,
/// the epoch rule `epoch_end` (`"first_exhausted"`, `"all_exhausted"` or `"samples"` with
/// `epoch_samples`).
fn python_mix(
    weights: &[f64],
    lens: &[u64],
    window: u32,
    epoch_end: &str,
    epoch_samples: u64,
    seed: u64,
    shuffle: bool,
) -> PyResult<stoker_pipeline::MixOrder> {
    let end = match epoch_end {
        "first_exhausted" => stoker_pipeline::MixEnd::FirstExhausted,
        "all_exhausted" => stoker_pipeline::MixEnd::AllExhausted,
        "samples" => stoker_pipeline::MixEnd::Samples(epoch_samples),
        other => {
            return Err(PyValueError::new_err(format!(
                "epoch_end must be \"first_exhausted\", \"all_exhausted\" or a number of \
                 samples, got {other:?}"
            )))
        }
    };
    stoker_pipeline::MixOrder::new(weights, lens, window, end, seed, shuffle)
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The mix order of Python datasets, made once and kept by the dataset: the windows it lays
/// out stay laid out for the positions after them.
#[pyclass(module = "stoker._native", frozen)]
pub(crate) struct MixOrder {
    order: stoker_pipeline::MixOrder,
    /// Each source's own order (batch 1, one rank).
    sources: Vec<stoker_pipeline::PlanConfig>,
}

#[pymethods]
impl MixOrder {
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        weights: Vec<f64>,
        lens: Vec<u64>,
        window: u32,
        epoch_end: &str,
        epoch_samples: u64,
        seed: u64,
        shuffle: bool,
    ) -> PyResult<Self> {
        let order = python_mix(
            &weights,
            &lens,
            window,
            epoch_end,
            epoch_samples,
            seed,
            shuffle,
        )?;
        let sources = lens
            .iter()
            .enumerate()
            .map(|(k, &len)| stoker_pipeline::PlanConfig {
                num_samples: len,
                batch_size: 1,
                seed: stoker_pipeline::source_seed(seed, k),
                shuffle,
                drop_last: false,
                rank: 0,
                world_size: 1,
                uneven_tail: proto::UnevenTail::Pad,
                shuffle_window: 0,
            })
            .collect();
        Ok(Self { order, sources })
    }

    /// Where the window's counts give sources shares off their weights', in words (what a
    /// native mix's loader says when it opens); `None` when every share is within.
    #[getter]
    fn rounding(&self) -> Option<String> {
        self.order.rounding().map(str::to_string)
    }

    /// Positions of an epoch.
    #[getter]
    fn epoch_len(&self) -> u64 {
        self.order.epoch_len()
    }

    /// The sample each of `positions` of `epoch` reads: (source, index in the source), by the
    /// rule of native mixes (each source in its own seeded order, restarting).
    fn samples(&self, epoch: u64, positions: Vec<u64>) -> PyResult<Vec<(usize, u64)>> {
        if let Some(position) = positions.iter().find(|&&p| p >= self.order.epoch_len()) {
            return Err(PyValueError::new_err(format!(
                "position {position} is past the mix's {} positions",
                self.order.epoch_len()
            )));
        }
        let orders: Vec<(stoker_pipeline::PlanConfig, Option<&[u64]>)> =
            self.sources.iter().map(|config| (*config, None)).collect();
        let samples = stoker_pipeline::mix_samples(&self.order, &orders, epoch, &positions)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(samples
            .into_iter()
            .map(|(source, _, index)| (source, index))
            .collect())
    }
}
