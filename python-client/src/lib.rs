//! `stoker._native`: the Rust side of Stoker's Python package. It runs the loader (in-process,
//! or as the client of a coordinator's workers) and hands batches to Python as `Buffer`s (zero-copy through the buffer protocol). The public
//! API is the pure-Python `stoker` package; this module is its private engine.

mod buffer;
mod dataset;
mod errors;
mod gpu_decode;
mod image_pipeline;
mod lane_helper;
mod loader_watch;
mod logs;
mod mix_order;
mod native_loader;
mod ops;
mod settings;
mod spec;

use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use buffer::Buffer;
use errors::{from_dataset, raise, Kind};

// Rust's allocations go to jemalloc: see the `stoker-alloc` crate.
use stoker_alloc as _;

/// `None` when CUDA device `ordinal` is there to page-lock memory, else what is missing (no
/// driver library, no such device, a driver that does not start). Starts no context: a loader
/// opens one when its first batch goes out.
#[pyfunction]
fn cuda_unavailable(py: Python<'_>, ordinal: usize) -> Option<String> {
    py.detach(|| {
        stoker_gpu::cuda_check_device(ordinal)
            .err()
            .map(|e| e.to_string())
    })
}

/// The threads `num_threads=None` gives where no launcher splits the node: one per CPU this
/// process may run on (its affinity and cgroup quota), as the embedded loader counts them.
#[pyfunction]
fn available_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Whether the CUDA driver's library can be loaded (checks nothing else; starts nothing).
#[pyfunction]
fn cuda_driver_present() -> bool {
    stoker_gpu::cuda_driver_present()
}

/// The CUDA devices whose primary context is active in this process (torch's first use of a
/// device starts it): those a copy from a batch may be queued on. Starts nothing; empty
/// without a driver.
#[pyfunction]
fn cuda_active_devices() -> Vec<usize> {
    stoker_gpu::cuda_active_devices()
}

/// Registers `streams` (handles of device `ordinal`'s primary context that are never
/// destroyed: torch's stream pool) for the fence thread to fence before a released batch's slot
/// is reused; returns how many the device has now. Retains the device's primary context (call
/// it only for a device the process uses).
#[pyfunction]
fn cuda_watch_streams(py: Python<'_>, ordinal: usize, streams: Vec<usize>) -> PyResult<usize> {
    py.detach(|| {
        let cuda = stoker_gpu::Cuda::open(ordinal)
            .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
        // SAFETY: the caller passes pool streams of this device, which torch never destroys.
        unsafe { cuda.watch_streams(&streams) };
        Ok(cuda.watched_streams())
    })
}

/// Writes (or reuses) a seeded ImageNet-like ImageFolder of `count` JPEGs under `out` and
/// returns its root.
#[pyfunction]
#[pyo3(signature = (out, count, seed = 0))]
fn make_dataset(py: Python<'_>, out: PathBuf, count: u64, seed: u64) -> PyResult<PathBuf> {
    let spec = stoker_datasets::SyntheticImageNetSpec {
        count,
        seed,
        classes: 10,
    };
    py.detach(|| stoker_datasets::generate_imagenet_like(&out, &spec, &|_| {}))
        .map(|generated| generated.root)
        .map_err(from_dataset)
}

/// Trains a small byte-level BPE tokenizer on `texts` (at most `vocab_size` ids, `eos` being
/// id 0) and writes its `tokenizer.json` to `out`: for tests and examples, no hub needed.
#[pyfunction]
#[pyo3(signature = (texts, out, vocab_size = 1000, eos = "<|endoftext|>".to_string()))]
fn train_bpe_tokenizer(
    py: Python<'_>,
    texts: Vec<String>,
    out: PathBuf,
    vocab_size: usize,
    eos: String,
) -> PyResult<()> {
    py.detach(|| {
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        stoker_pipeline::train_bpe_tokenizer(&texts, vocab_size, &eos, &out)
    })
    .map_err(|e| raise(Kind::Stoker, e.to_string()))
}

/// Writes a seeded token file of `tokens` random ids below `vocab` (uint16, or uint32 with
/// `dtype="uint32"`) to `out`.
#[pyfunction]
#[pyo3(signature = (out, tokens, vocab = 50_257, dtype = "uint16", seed = 0))]
fn make_tokens(
    py: Python<'_>,
    out: PathBuf,
    tokens: u64,
    vocab: u32,
    dtype: &str,
    seed: u64,
) -> PyResult<()> {
    let dtype = match dtype {
        "uint16" => stoker_datasets::TokenDtype::Uint16,
        "uint32" => stoker_datasets::TokenDtype::Uint32,
        other => {
            return Err(PyValueError::new_err(format!(
                "dtype must be \"uint16\" or \"uint32\", got {other:?}"
            )))
        }
    };
    let spec = stoker_datasets::SyntheticTokensSpec {
        tokens,
        vocab,
        dtype,
        seed,
    };
    py.detach(|| stoker_datasets::write_synthetic_tokens(&out, &spec))
        .map_err(from_dataset)
}

/// The 64-bit seed of sample `index` in `epoch` under `seed`: the one the native pipelines'
/// per-sample random stream starts from (`stoker.sample_rng()` seeds numpy's with it).
#[pyfunction]
fn sample_seed(seed: u64, epoch: u64, index: u64) -> u64 {
    stoker_pipeline::sample_seed(seed, epoch, index)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let classes = errors::classes(m.py())?;
    for (name, class) in errors::names().zip(classes) {
        m.add(name, class.bind(m.py()))?;
    }
    m.add_class::<native_loader::NativeLoader>()?;
    m.add_class::<native_loader::NativeBatch>()?;
    m.add_class::<mix_order::MixOrder>()?;
    m.add_class::<Buffer>()?;
    m.add_class::<gpu_decode::DeviceRows>()?;
    m.add("DEFAULT_GPU_MEMORY", stoker_gpu::DEFAULT_GPU_MEMORY)?;
    m.add("SETTINGS_FIELDS", settings::fields(m.py())?)?;
    m.add_function(wrap_pyfunction!(gpu_decode::gpu_decode_unavailable, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_decode::compile_gpu_kernel, m)?)?;
    m.add_function(wrap_pyfunction!(lane_helper::lane_helper, m)?)?;
    m.add_function(wrap_pyfunction!(lane_helper::lane_helper_main, m)?)?;
    m.add_class::<image_pipeline::ImagePipeline>()?;
    m.add_function(wrap_pyfunction!(make_dataset, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_unavailable, m)?)?;
    m.add_function(wrap_pyfunction!(available_threads, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_driver_present, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_active_devices, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_watch_streams, m)?)?;
    m.add_function(wrap_pyfunction!(make_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(sample_seed, m)?)?;
    m.add_function(wrap_pyfunction!(logs::forward_logs, m)?)?;
    m.add_function(wrap_pyfunction!(loader_watch::exit_with_loader, m)?)?;
    m.add_function(wrap_pyfunction!(train_bpe_tokenizer, m)?)?;
    ops::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
