//! The GPU decode lane as Python sees it: the `decode=` argument made a starter of the lane,
//! the rows a batch's lane decoded, still on the GPU (`DeviceRows`, a CUDA array interface
//! torch wraps without a copy), the lane's figures (`stats()["gpu_decode"]`), and the check
//! that says why the lane cannot run here.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use stoker_gpu::{DecodeMode, GpuDecodeOptions, RowTail, StartGpuLane};
use stoker_loader::LaneRows;

/// The rows of one batch that the GPU lane decoded: `shape` of `dtype` on CUDA device
/// `device`, row `k` being the batch's row `positions[k]`; uint8 (rows, height, width, 3) as
/// the slot's rows, unless `tail_applied` (the lane's kernel applied the device stage's tail,
/// `STOKER_GPU_DECODE_FUSED_TAIL=1`: NHWC memory, or (rows, 3, height, width) planes). Make a
/// stream wait for them with `wait(stream)` before reading, and fence the reads with
/// `keep_until(stream)`; they stay valid while this object, the batch, or such a fence holds
/// them.
#[pyclass(module = "stoker._native", frozen)]
pub struct DeviceRows {
    rows: Arc<dyn LaneRows>,
}

impl DeviceRows {
    /// The lane's rows a batch carried.
    pub fn new(rows: Arc<dyn LaneRows>) -> DeviceRows {
        DeviceRows { rows }
    }
}

#[pymethods]
impl DeviceRows {
    /// The batch row of each device row.
    #[getter]
    fn positions(&self) -> Vec<u32> {
        self.rows.positions().to_vec()
    }

    /// (rows, height, width, 3), or (rows, 3, height, width) for channel planes.
    #[getter]
    fn shape(&self) -> (usize, usize, usize, usize) {
        let [n, h, w, c] = self.rows.shape();
        (n, h, w, c)
    }

    /// The element type, as torch names its dtype ("uint8", "float32", "bfloat16",
    /// "float16").
    #[getter]
    fn dtype(&self) -> &'static str {
        self.rows.element()
    }

    /// Whether the rows are already what the device stage's tail makes of the slot's rows.
    #[getter]
    fn tail_applied(&self) -> bool {
        self.rows.tail_applied()
    }

    /// The CUDA device ordinal.
    #[getter]
    fn device(&self) -> usize {
        self.rows.device()
    }

    /// Makes CUDA stream `stream` (a `torch.cuda.Stream.cuda_stream` of this device, or 0)
    /// wait on the GPU until the rows are written.
    fn wait(&self, stream: usize) -> PyResult<()> {
        // SAFETY: the caller passes a live stream of the device's primary context (torch's
        // streams are), as documented.
        unsafe { self.rows.wait_on(stream) }.map_err(PyRuntimeError::new_err)
    }

    /// Keeps the rows' buffer from the lane until the work queued on CUDA stream `stream` so
    /// far (the copies reading the rows) is done, even once every reference here is gone.
    fn keep_until(&self, stream: usize) -> PyResult<()> {
        // SAFETY: the caller passes a live stream of the device's primary context, as
        // documented.
        unsafe { Arc::clone(&self.rows).keep_until(stream) }.map_err(PyRuntimeError::new_err)
    }

    /// The CUDA array interface (version 3): no stream is named, so no consumer stream is
    /// synchronised by it; order reads with `wait`. bfloat16, which the interface has no
    /// type for, is given as its 16-bit patterns (`<i2`): view the tensor as `dtype`.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let interface = PyDict::new(py);
        let [n, h, w, c] = self.rows.shape();
        interface.set_item("shape", PyTuple::new(py, [n, h, w, c])?)?;
        interface.set_item("typestr", typestr(self.rows.element()))?;
        interface.set_item("data", (self.rows.ptr(), false))?;
        interface.set_item("version", 3)?;
        interface.set_item("strides", py.None())?;
        Ok(interface)
    }
}

/// The device stage's tail as Python gives it (`stoker.gpu.lane_tail`): the dtype's name,
/// whether the image's memory holds channel planes, and the per-channel scale and shift of a
/// `Normalize` (None without one).
pub type StageTail = (String, bool, Option<(Vec<f64>, Vec<f64>)>);

/// The CUDA array interface's type of an element named as torch names its dtype.
fn typestr(element: &str) -> &'static str {
    match element {
        "float32" => "<f4",
        "float16" => "<f2",
        "bfloat16" => "<i2",
        _ => "|u1",
    }
}

/// What starts the lane `decode` asks for ("cpu": none; "gpu", "auto": on `pin_device`, the
/// device batches go to, within `gpu_memory` bytes, the CUDA libraries looked for in
/// `library_dirs` first, its page-locked memory within the process's `pinned_budget` beside
/// the slots; `tail` the device stage's, for its kernel to apply when asked: see
/// `SourceSettings.gpu_tail`); ValueError for another mode, a lane without a device, or a tail
/// it cannot apply, or a helper process asked for (`STOKER_GPU_DECODE_HELPER`) whose binary is not
/// found.
pub fn lane_starter(
    py: Python<'_>,
    decode: &str,
    pin_device: Option<usize>,
    gpu_memory: usize,
    library_dirs: Vec<PathBuf>,
    pinned_budget: u64,
    tail: Option<StageTail>,
) -> PyResult<Option<Arc<StartGpuLane>>> {
    let mode = match decode {
        "cpu" => return Ok(None),
        "gpu" => DecodeMode::Gpu,
        "auto" => DecodeMode::Auto,
        other => {
            return Err(PyValueError::new_err(format!(
                "decode must be 'cpu', 'gpu' or 'auto', got {other:?}"
            )))
        }
    };
    let Some(device) = pin_device else {
        return Err(PyValueError::new_err(
            "decode='gpu' or 'auto' needs a CUDA device to deliver to (device='cuda')",
        ));
    };
    let tail = match &tail {
        None => RowTail::BYTES,
        Some((dtype, planar, affine)) => RowTail::from_stage(
            dtype,
            *planar,
            affine
                .as_ref()
                .map(|(scale, shift)| (scale.as_slice(), shift.as_slice())),
        )
        .map_err(PyValueError::new_err)?,
    };
    // STOKER_GPU_DECODE_HELPER runs the lane in a helper process of its own.
    let helper = crate::lane_helper::lane_helper(py)?.map(stoker_gpu::HelperOptions::new);
    Ok(Some(Arc::new(StartGpuLane::new(GpuDecodeOptions {
        mode,
        device,
        memory_bytes: gpu_memory,
        library_dirs,
        pinned_budget: Some(pinned_budget),
        tail,
        helper,
    }))))
}

/// `None` when the GPU decode lane can run on CUDA device `ordinal` here (driver, nvJPEG of a
/// tested version, NVRTC compiling the kernel), else what is missing. `library_dirs` are
/// searched first for the libraries.
#[pyfunction]
#[pyo3(signature = (ordinal, library_dirs = Vec::new()))]
pub fn gpu_decode_unavailable(
    py: Python<'_>,
    ordinal: usize,
    library_dirs: Vec<PathBuf>,
) -> Option<String> {
    py.detach(|| {
        let cuda = match stoker_gpu::Cuda::open(ordinal) {
            Ok(cuda) => cuda,
            Err(error) => return Some(error.to_string()),
        };
        if let Err(error) = stoker_gpu::nvjpeg_version(&library_dirs) {
            return Some(error.to_string());
        }
        // The lane's own compile, for this GPU (kept for the lane).
        let sm = match cuda.compute_capability() {
            Ok(sm) => sm,
            Err(error) => return Some(error.to_string()),
        };
        stoker_gpu::compile_kernel(&library_dirs, Some(sm))
            .err()
            .map(|e| e.to_string())
    })
}

/// Compiles the lane's crop kernel with NVRTC (no GPU needed): PTX text, or with `sm` (a
/// compute capability) that architecture's machine code. Raises RuntimeError naming what
/// failed (no libnvrtc, a compile error).
#[pyfunction]
#[pyo3(signature = (library_dirs = Vec::new(), sm = None))]
pub fn compile_gpu_kernel(
    py: Python<'_>,
    library_dirs: Vec<PathBuf>,
    sm: Option<(i32, i32)>,
) -> PyResult<Py<PyAny>> {
    let compiled = py
        .detach(|| stoker_gpu::compile_kernel(&library_dirs, sm))
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    Ok(match compiled {
        stoker_gpu::Compiled::Ptx(text) => text.into_pyobject(py)?.into_any().unbind(),
        stoker_gpu::Compiled::Cubin(bytes) => {
            pyo3::types::PyBytes::new(py, &bytes).into_any().unbind()
        }
    })
}

/// The keys both lanes' figures start with: whether the hardware engines decode, what the rows
/// are (`tail`), and `counts`' rows by where they were built and each lane's rate.
fn rows_stats<'py>(
    py: Python<'py>,
    hardware: bool,
    tail: RowTail,
    counts: &stoker_gpu::LaneStats,
) -> PyResult<Bound<'py, PyDict>> {
    let entry = PyDict::new(py);
    let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    entry.set_item("hardware", hardware)?;
    entry.set_item("rows_dtype", tail.element.name())?;
    entry.set_item("tail_fused", !tail.is_bytes())?;
    entry.set_item("rows", load(&counts.gpu_rows))?;
    entry.set_item("declined_rows", load(&counts.declined_rows))?;
    entry.set_item("fallback_rows", load(&counts.fallback_rows))?;
    entry.set_item("gpu_rows_per_s", counts.gpu_rate())?;
    entry.set_item("cpu_rows_per_s", counts.cpu_rate())?;
    Ok(entry)
}

/// The lane's figures as `stats()["gpu_decode"]` gives them: rows by where they were built,
/// each lane's rate, its memory and where its threads spent their time.
pub fn lane_stats<'py>(
    py: Python<'py>,
    lane: &stoker_gpu::GpuLane,
) -> PyResult<Bound<'py, PyDict>> {
    let counts = lane.stats();
    let entry = rows_stats(py, lane.hardware(), lane.rows_tail(), counts)?;
    let seconds = |counter: &AtomicU64| counter.load(Ordering::Relaxed) as f64 / 1e9;
    entry.set_item("memory_bytes", lane.memory_bytes())?;
    entry.set_item("memory_cap", lane.memory_cap())?;
    entry.set_item("nvjpeg_allocations", lane.nvjpeg_allocations())?;
    entry.set_item("pinned_bytes", lane.pinned_bytes())?;
    entry.set_item("staging_bytes", lane.staging_bytes())?;
    entry.set_item("pinned_refused", lane.pinned_refused())?;
    entry.set_item("busy_s", seconds(&counts.gpu_busy_ns))?;
    entry.set_item("check_s", seconds(&counts.check_ns))?;
    entry.set_item("decode_call_s", seconds(&counts.decode_call_ns))?;
    entry.set_item("pipe_wait_s", seconds(&counts.pipe_wait_ns))?;
    entry.set_item("launch_s", seconds(&counts.launch_ns))?;
    entry.set_item("roi", lane.roi())?;
    entry.set_item("roi_rows", counts.roi_rows.load(Ordering::Relaxed))?;
    entry.set_item("helper", py.None())?;
    Ok(entry)
}

/// A helper process's lane's figures as `stats()["gpu_decode"]` gives them: the same keys as
/// [`lane_stats`] where this process knows them, and `helper`: its `pid`, whether it builds
/// rows on a device (`on_device`), and why it was `lost` (None while it runs).
pub fn helper_stats<'py>(
    py: Python<'py>,
    helper: &stoker_gpu::HelperLane,
) -> PyResult<Bound<'py, PyDict>> {
    let figures = helper.figures();
    let entry = rows_stats(py, helper.hardware(), helper.rows_tail(), helper.stats())?;
    entry.set_item("memory_bytes", figures.memory_bytes)?;
    entry.set_item("memory_cap", figures.memory_cap)?;
    entry.set_item("staging_bytes", helper.staging_bytes())?;
    entry.set_item("pinned_bytes", helper.pinned_bytes())?;
    entry.set_item("pinned_refused", helper.pinned_refused())?;
    entry.set_item(
        "busy_s",
        stoker_loader::DecodeLane::busy(helper).as_secs_f64(),
    )?;
    let about = PyDict::new(py);
    about.set_item("pid", helper.pid())?;
    about.set_item("on_device", helper.on_device())?;
    about.set_item("lost", helper.lost())?;
    entry.set_item("helper", about)?;
    Ok(entry)
}
