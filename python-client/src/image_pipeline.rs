//! `stoker._native.ImagePipeline`: Stoker's decode and augmentation called from Python on
//! encoded bytes, sample by sample, with the native loader's per-sample random stream.

use pyo3::prelude::*;

/// A native image pipeline that Python code calls on encoded bytes (`Loader.from_dataset(...,
/// pipeline=[...])`): the dataset reads and parses, Stoker decodes and augments, with the
/// native loader's per-sample random stream, so the same bytes at the same (seed, epoch,
/// index) give the same pixels as a native source.
#[pyclass(module = "stoker._native", frozen)]
pub(crate) struct ImagePipeline {
    pipeline: stoker_pipeline::Pipeline,
    /// The op dicts it was made from, to pickle it to worker processes.
    ops: OpDicts,
}

/// The op dicts an [`ImagePipeline`] is made from (what it pickles as).
type OpDicts = Vec<Py<pyo3::types::PyDict>>;

thread_local! {
    /// Each thread's decode buffers, reused from sample to sample.
    static SCRATCH: std::cell::RefCell<stoker_pipeline::Scratch> =
        std::cell::RefCell::new(stoker_pipeline::Scratch::default());
}

#[pymethods]
impl ImagePipeline {
    /// Checks and fuses `ops` (dicts of `stoker.ops`), as the native loader does.
    #[new]
    fn new(ops: Vec<Bound<'_, pyo3::types::PyDict>>) -> PyResult<Self> {
        let proto_ops = crate::ops::from_python(&ops)?;
        let pipeline = stoker_pipeline::Pipeline::from_ops(&proto_ops)
            .map_err(|e| crate::errors::raise(crate::errors::Kind::Pipeline, e.to_string()))?;
        Ok(Self {
            pipeline,
            ops: ops.into_iter().map(Bound::unbind).collect(),
        })
    }

    /// The output's shape per sample: (height, width, 3) or (3, height, width).
    #[getter]
    fn shape(&self) -> Vec<u64> {
        self.pipeline.image_shape(1)[1..].to_vec()
    }

    /// The output's dtype: "uint8" or "float32".
    #[getter]
    fn dtype(&self) -> &'static str {
        crate::buffer::dtype_name(self.pipeline.image_dtype())
    }

    /// Decodes and augments `data` (an encoded image) into `out` (a writable, contiguous
    /// buffer of the output's size), drawing from the stream of (`seed`, `epoch`, `index`).
    /// The interpreter is let go meanwhile.
    fn process(
        &self,
        py: Python<'_>,
        data: &[u8],
        seed: u64,
        epoch: u64,
        index: u64,
        out: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let buffer = pyo3::buffer::PyBuffer::<u8>::get(out)?;
        let size = self.pipeline.bytes_per_sample();
        if buffer.readonly() || !buffer.is_c_contiguous() || buffer.len_bytes() != size {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "out must be a writable, contiguous buffer of {size} bytes"
            )));
        }
        let address = buffer.buf_ptr() as usize;
        let pipeline = &self.pipeline;
        let result = py.detach(|| {
            // SAFETY: `buffer` holds the export (the memory stays valid and writable, checked
            // above) until it drops after this closure; nothing else writes it meanwhile.
            let dest = unsafe { std::slice::from_raw_parts_mut(address as *mut u8, size) };
            let mut rng = stoker_pipeline::SampleRng::new(seed, epoch, index);
            let mut timings = stoker_pipeline::SampleTimings::default();
            SCRATCH.with(|scratch| {
                pipeline.process(
                    data,
                    &mut rng,
                    dest,
                    &mut scratch.borrow_mut(),
                    &mut timings,
                )
            })
        });
        drop(buffer);
        result.map_err(|e| crate::errors::raise(crate::errors::Kind::Decode, e.to_string()))
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (OpDicts,))> {
        let ops = slf
            .get()
            .ops
            .iter()
            .map(|op| op.clone_ref(slf.py()))
            .collect();
        Ok((slf.get_type().into_any(), (ops,)))
    }
}
