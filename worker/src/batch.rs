//! Batch assembly: the samples of one step processed in parallel (rayon), with the bad-input
//! policy applied per sample, into one batch buffer. Images and token windows are written
//! straight into their row; text documents are tokenised in parallel, then packed in order.
//! Numeric columns are read for the whole batch at once, and sample by sample (under the
//! policy) only when that read fails.
//! The buffer holds the batch's tensors one after the other ([`AssembledBatch::tensors`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use rayon::prelude::*;
use stoker_datasets::{NumericKind, SampleSource, TokenDtype};
use stoker_proto::v1::{self as proto, BadSamplePolicy};

use crate::error::{Error, Result, SampleError};
use crate::job_pipeline::{token_dtype_proto, JobPipeline, PackedText, SelectedColumns};
use crate::ops::pack::{pack_documents, PackedRowsMut};
use crate::pipeline::{SampleTimings, Scratch};
use crate::rng::SampleRng;

/// How many following samples the skip policy tries before giving up on a slot.
pub const MAX_SUBSTITUTE_TRIES: u64 = 16;

/// Log the first few bad samples in full, then one in this many.
const BAD_SAMPLE_LOG_EVERY: u64 = 1000;
const BAD_SAMPLE_LOG_FIRST: u64 = 20;

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// The coordinates of one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BatchKey {
    /// Epoch.
    pub epoch: u64,
    /// Rank.
    pub rank: u32,
    /// Step within the rank's epoch.
    pub step: u64,
}

/// Turns lists of sample indices into batches for one job.
pub struct BatchAssembler {
    source: Arc<dyn SampleSource>,
    pipeline: JobPipeline,
    /// The source's token dtype, for TokenWindows pipelines.
    window_dtype: Option<TokenDtype>,
    /// SelectColumns: each column's output type, in tensor order.
    columns: Vec<OutputColumn>,
    /// SelectColumns: whether batches carry the source's `label` tensor (not when a selected
    /// column is itself named `label`).
    column_labels: bool,
    seed: u64,
    policy: BadSamplePolicy,
    bad_samples_seen: AtomicU64,
    tokens_dropped: AtomicU64,
}

/// One selected column and the type its tensor holds.
#[derive(Debug, Clone)]
struct OutputColumn {
    name: String,
    kind: NumericKind,
}

impl OutputColumn {
    fn dtype(&self) -> proto::Dtype {
        match self.kind {
            NumericKind::Integer => proto::Dtype::Int64,
            NumericKind::Float => proto::Dtype::Float32,
        }
    }

    fn size(&self) -> usize {
        match self.kind {
            NumericKind::Integer => 8,
            NumericKind::Float => 4,
        }
    }
}

/// One sample's (or a batch's) values of the selected columns, row-major per kind.
#[derive(Debug, Default)]
struct ColumnValues {
    integers: Vec<i64>,
    floats: Vec<f32>,
}

/// Where one tensor lies in a batch buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorLayout {
    /// Tensor name (`image`, `tokens`, `input_ids`, a column's name, ...).
    pub name: String,
    /// Element type.
    pub dtype: proto::Dtype,
    /// Shape, batch first.
    pub shape: Vec<u64>,
    /// Byte range in the batch buffer.
    pub bytes: std::ops::Range<usize>,
}

/// What a batch holds besides its buffer's bytes.
#[derive(Debug, Clone)]
pub struct AssembledBatch {
    /// Where the batch belongs.
    pub key: BatchKey,
    /// The tensors in the batch buffer, in wire order.
    pub tensors: Vec<TensorLayout>,
    /// One label per sample (the substitute's label for replaced samples); image and column
    /// batches, where they become the `label` tensor.
    pub labels: Vec<i64>,
    /// Stage timings summed over the samples.
    pub timings: SampleTimings,
    /// Samples replaced under the skip policy.
    pub bad_samples: Vec<proto::BadSample>,
    /// Packed text: document tokens (EOS included) that did not fit in the batch's rows.
    pub dropped_tokens: u64,
}

impl AssembledBatch {
    /// The wire form; `data` is the batch buffer the tensors were written into.
    pub fn into_proto(self, indices: &[u64], data: Bytes) -> proto::Batch {
        let mut tensors: Vec<proto::Tensor> = self
            .tensors
            .into_iter()
            .map(|layout| proto::Tensor {
                name: layout.name,
                dtype: layout.dtype as i32,
                shape: layout.shape,
                data: data.slice(layout.bytes),
            })
            .collect();
        if !self.labels.is_empty() {
            let labels: Vec<u8> = self.labels.iter().flat_map(|l| l.to_le_bytes()).collect();
            tensors.push(proto::Tensor {
                name: "label".into(),
                dtype: proto::Dtype::Int64 as i32,
                shape: vec![self.labels.len() as u64],
                data: Bytes::from(labels),
            });
        }
        proto::Batch {
            epoch: self.key.epoch,
            rank: self.key.rank,
            step: self.key.step,
            tensors,
            sample_indices: indices.to_vec(),
            timings: Some(proto::StageTimings {
                read_ns: self.timings.read_ns,
                decode_ns: self.timings.decode_ns,
                augment_ns: self.timings.augment_ns,
                assemble_ns: self.timings.assemble_ns,
                transfer_ns: 0,
            }),
            bad_samples: self.bad_samples,
        }
    }
}

/// Checks SelectColumns against the source and gives each column's output type.
fn output_columns(
    source: &dyn SampleSource,
    selected: &SelectedColumns,
) -> Result<Vec<OutputColumn>> {
    let numeric = source.numeric_columns().ok_or_else(|| {
        Error::InvalidSpec(
            "SelectColumns reads numeric columns of Parquet sources; this source has none".into(),
        )
    })?;
    selected
        .names
        .iter()
        .map(|name| {
            let own = numeric
                .numeric_kind(name)
                .map_err(|error| Error::InvalidSpec(format!("SelectColumns: {error}")))?;
            let kind = match (selected.dtype, own) {
                (proto::Dtype::Int64, NumericKind::Float) => {
                    return Err(Error::InvalidSpec(format!(
                        "SelectColumns asks for int64 but column {name:?} holds floating-point \
                         values; ask for FLOAT32 or leave the dtype unspecified"
                    )))
                }
                (proto::Dtype::Float32, _) => NumericKind::Float,
                (_, own) => own,
            };
            Ok(OutputColumn {
                name: name.clone(),
                kind,
            })
        })
        .collect()
}

/// One sample's result after the bad-input policy.
struct SampleOutcome<T> {
    value: T,
    /// The dataset index actually used (the substitute's for a replaced sample).
    used: u64,
    timings: SampleTimings,
    bad: Option<proto::BadSample>,
}

impl BatchAssembler {
    /// An assembler reading from `source` through `pipeline`. Fails when the two do not fit
    /// (token windows need a token file of the same `seq_len`; a token file needs them).
    pub fn new(
        source: Arc<dyn SampleSource>,
        pipeline: impl Into<JobPipeline>,
        seed: u64,
        policy: BadSamplePolicy,
    ) -> Result<Self> {
        let pipeline = pipeline.into();
        let windows = source.token_windows();
        let window_dtype = match (&pipeline, windows) {
            (JobPipeline::TokenWindows { seq_len }, Some(shape)) if shape.seq_len == *seq_len => {
                Some(shape.dtype)
            }
            (JobPipeline::TokenWindows { seq_len }, Some(shape)) => {
                return Err(Error::InvalidSpec(format!(
                    "the token file was opened with windows of seq_len {} but the pipeline's \
                     TokenWindows asks for {seq_len}",
                    shape.seq_len
                )))
            }
            (JobPipeline::TokenWindows { .. }, None) => {
                return Err(Error::InvalidSpec(
                    "TokenWindows reads token files only; for text use [Tokenize, PackSequences]"
                        .into(),
                ))
            }
            (_, Some(_)) => {
                return Err(Error::InvalidSpec(
                    "a token file is read through a [TokenWindows] pipeline".into(),
                ))
            }
            (_, None) => None,
        };
        let (columns, column_labels) = match &pipeline {
            JobPipeline::Columns(selected) => (
                output_columns(source.as_ref(), selected)?,
                !selected.names.iter().any(|name| name == "label"),
            ),
            _ => (Vec::new(), false),
        };
        Ok(Self {
            source,
            pipeline,
            window_dtype,
            columns,
            column_labels,
            seed,
            policy,
            bad_samples_seen: AtomicU64::new(0),
            tokens_dropped: AtomicU64::new(0),
        })
    }

    /// The pipeline.
    pub fn pipeline(&self) -> &JobPipeline {
        &self.pipeline
    }

    /// The data source.
    pub fn source(&self) -> &Arc<dyn SampleSource> {
        &self.source
    }

    /// Bad samples met so far (under either policy).
    pub fn bad_samples_seen(&self) -> u64 {
        self.bad_samples_seen.load(Ordering::Relaxed)
    }

    /// Packed text: document tokens dropped so far because they did not fit their batch.
    pub fn tokens_dropped(&self) -> u64 {
        self.tokens_dropped.load(Ordering::Relaxed)
    }

    /// The tensors of a batch of `samples`, laid out one after the other in its buffer.
    pub fn layout(&self, samples: usize) -> Vec<TensorLayout> {
        let batch = samples as u64;
        match &self.pipeline {
            JobPipeline::Image(pipeline) => vec![TensorLayout {
                name: "image".into(),
                dtype: pipeline.image_dtype(),
                shape: pipeline.image_shape(samples),
                bytes: 0..pipeline.bytes_per_sample() * samples,
            }],
            JobPipeline::TokenWindows { seq_len } => {
                let dtype = self.window_dtype.unwrap_or(TokenDtype::Uint16);
                let row = (*seq_len as usize + 1) * dtype.size();
                vec![TensorLayout {
                    name: "tokens".into(),
                    dtype: token_dtype_proto(dtype),
                    shape: vec![batch, u64::from(*seq_len) + 1],
                    bytes: 0..row * samples,
                }]
            }
            JobPipeline::PackedText(packed) => {
                let seq_len = packed.pack.seq_len;
                let len = samples * seq_len as usize * 4;
                ["input_ids", "position_ids", "document_ids"]
                    .into_iter()
                    .enumerate()
                    .map(|(i, name)| TensorLayout {
                        name: name.into(),
                        dtype: proto::Dtype::Int32,
                        shape: vec![batch, u64::from(seq_len)],
                        bytes: i * len..(i + 1) * len,
                    })
                    .collect()
            }
            JobPipeline::Columns(_) => {
                let mut start = 0usize;
                self.columns
                    .iter()
                    .map(|column| {
                        // Each tensor starts 8-byte aligned so int64 views need no copy.
                        start = start.next_multiple_of(8);
                        let end = start + column.size() * samples;
                        let layout = TensorLayout {
                            name: column.name.clone(),
                            dtype: column.dtype(),
                            shape: vec![batch],
                            bytes: start..end,
                        };
                        start = end;
                        layout
                    })
                    .collect()
            }
        }
    }

    /// Bytes of the buffer of a batch of `samples` (all its tensors but labels).
    pub fn batch_bytes(&self, samples: usize) -> usize {
        self.layout(samples).last().map_or(0, |t| t.bytes.end)
    }

    /// Builds the batch of `indices` (dataset indices in batch order) into `buffer`, which must
    /// hold exactly [`BatchAssembler::batch_bytes`] bytes. Runs the samples in parallel on the
    /// current rayon pool; the bytes depend only on the arguments and the job.
    pub fn assemble_into(
        &self,
        key: BatchKey,
        indices: &[u64],
        buffer: &mut [u8],
    ) -> Result<AssembledBatch> {
        let tensors = self.layout(indices.len());
        let expected = tensors.last().map_or(0, |t| t.bytes.end);
        if buffer.len() != expected {
            return Err(Error::InvalidSpec(format!(
                "batch buffer of {} bytes for {} samples needing {expected} bytes",
                buffer.len(),
                indices.len()
            )));
        }
        let mut assembled = AssembledBatch {
            key,
            tensors,
            labels: Vec::new(),
            timings: SampleTimings::default(),
            bad_samples: Vec::new(),
            dropped_tokens: 0,
        };
        match &self.pipeline {
            JobPipeline::Image(_) | JobPipeline::TokenWindows { .. } => {
                let row_bytes = if indices.is_empty() {
                    1
                } else {
                    expected / indices.len()
                };
                let labelled = matches!(self.pipeline, JobPipeline::Image(_));
                let outcomes: Vec<Result<SampleOutcome<()>>> = buffer
                    .par_chunks_mut(row_bytes.max(1))
                    .zip(indices.par_iter())
                    .map(|(dest, &index)| {
                        self.with_policy(index, |source_index, timings| {
                            self.try_row(key.epoch, index, source_index, dest, timings)
                        })
                    })
                    .collect();
                for outcome in outcomes {
                    let outcome = outcome?;
                    if labelled {
                        assembled.labels.push(self.source.label(outcome.used));
                    }
                    assembled.timings.add(&outcome.timings);
                    assembled.bad_samples.extend(outcome.bad);
                }
            }
            JobPipeline::Columns(_) => {
                self.assemble_columns(indices, buffer, &mut assembled)?;
            }
            JobPipeline::PackedText(packed) => {
                let outcomes: Vec<Result<SampleOutcome<Vec<u32>>>> = indices
                    .par_iter()
                    .map(|&index| {
                        self.with_policy(index, |source_index, timings| {
                            self.try_document(packed, source_index, timings)
                        })
                    })
                    .collect();
                let mut documents = Vec::with_capacity(indices.len());
                for outcome in outcomes {
                    let outcome = outcome?;
                    documents.push(outcome.value);
                    assembled.timings.add(&outcome.timings);
                    assembled.bad_samples.extend(outcome.bad);
                }
                let started = Instant::now();
                let third = buffer.len() / 3;
                let (input_ids, rest) = buffer.split_at_mut(third);
                let (position_ids, document_ids) = rest.split_at_mut(third);
                let summary = pack_documents(
                    &packed.pack,
                    &documents,
                    PackedRowsMut {
                        input_ids,
                        position_ids,
                        document_ids,
                    },
                );
                assembled.timings.assemble_ns += started.elapsed().as_nanos() as u64;
                assembled.dropped_tokens = summary.dropped_tokens;
                self.tokens_dropped
                    .fetch_add(summary.dropped_tokens, Ordering::Relaxed);
            }
        }
        Ok(assembled)
    }

    /// Builds the batch of `indices` in a new buffer; see [`BatchAssembler::assemble_into`].
    pub fn assemble(&self, key: BatchKey, indices: &[u64]) -> Result<proto::Batch> {
        let mut buffer = vec![0u8; self.batch_bytes(indices.len())];
        let assembled = self.assemble_into(key, indices, &mut buffer)?;
        Ok(assembled.into_proto(indices, Bytes::from(buffer)))
    }

    /// One image or token window into its row `dest`. Images draw from the stream of
    /// `rng_index` (the slot's sample, also when a substitute is read).
    fn try_row(
        &self,
        epoch: u64,
        rng_index: u64,
        index: u64,
        dest: &mut [u8],
        timings: &mut SampleTimings,
    ) -> std::result::Result<(), SampleError> {
        let started = Instant::now();
        let bytes = self
            .source
            .read(index)
            .map_err(|e| SampleError::Unreadable(e.to_string()))?;
        let read_at = Instant::now();
        timings.read_ns += (read_at - started).as_nanos() as u64;
        match &self.pipeline {
            JobPipeline::Image(pipeline) => {
                let mut rng = SampleRng::new(self.seed, epoch, rng_index);
                SCRATCH.with(|scratch| {
                    pipeline.process(&bytes, &mut rng, dest, &mut scratch.borrow_mut(), timings)
                })
            }
            JobPipeline::TokenWindows { .. } => {
                if bytes.len() != dest.len() {
                    return Err(SampleError::WindowSize {
                        found: bytes.len(),
                        expected: dest.len(),
                    });
                }
                dest.copy_from_slice(&bytes);
                timings.assemble_ns += read_at.elapsed().as_nanos() as u64;
                Ok(())
            }
            JobPipeline::PackedText(_) | JobPipeline::Columns(_) => Err(SampleError::Unreadable(
                "this pipeline is not assembled row by row".into(),
            )),
        }
    }

    /// The selected columns of `indices` into their tensors: one read for the whole batch,
    /// and when that fails, one read per sample under the bad-input policy (a null cell or a
    /// damaged row group is then a bad sample, substituted or fatal like an image).
    fn assemble_columns(
        &self,
        indices: &[u64],
        buffer: &mut [u8],
        assembled: &mut AssembledBatch,
    ) -> Result<()> {
        let started = Instant::now();
        let values = match self.read_columns(indices) {
            Ok(values) => {
                assembled.timings.read_ns += started.elapsed().as_nanos() as u64;
                if self.column_labels {
                    assembled
                        .labels
                        .extend(indices.iter().map(|&index| self.source.label(index)));
                }
                values
            }
            Err(error) => {
                tracing::debug!(%error, "batch column read failed; reading sample by sample");
                let outcomes: Vec<Result<SampleOutcome<ColumnValues>>> = indices
                    .par_iter()
                    .map(|&index| {
                        self.with_policy(index, |source_index, timings| {
                            let started = Instant::now();
                            let values = self
                                .read_columns(&[source_index])
                                .map_err(|e| SampleError::Unreadable(e.to_string()));
                            timings.read_ns += started.elapsed().as_nanos() as u64;
                            values
                        })
                    })
                    .collect();
                let mut values = ColumnValues::default();
                for outcome in outcomes {
                    let outcome = outcome?;
                    values.integers.extend(outcome.value.integers);
                    values.floats.extend(outcome.value.floats);
                    if self.column_labels {
                        assembled.labels.push(self.source.label(outcome.used));
                    }
                    assembled.timings.add(&outcome.timings);
                    assembled.bad_samples.extend(outcome.bad);
                }
                values
            }
        };
        let started = Instant::now();
        let integer_width = self.integer_columns().count();
        let float_width = self.columns.len() - integer_width;
        let (mut integer_slot, mut float_slot) = (0, 0);
        for (column, layout) in self.columns.iter().zip(&assembled.tensors) {
            let dest = &mut buffer[layout.bytes.clone()];
            match column.kind {
                NumericKind::Integer => {
                    let values = values.integers.iter().skip(integer_slot);
                    for (cell, value) in dest.chunks_exact_mut(8).zip(values.step_by(integer_width))
                    {
                        cell.copy_from_slice(&value.to_le_bytes());
                    }
                    integer_slot += 1;
                }
                NumericKind::Float => {
                    let values = values.floats.iter().skip(float_slot);
                    for (cell, value) in dest.chunks_exact_mut(4).zip(values.step_by(float_width)) {
                        cell.copy_from_slice(&value.to_le_bytes());
                    }
                    float_slot += 1;
                }
            }
        }
        assembled.timings.assemble_ns += started.elapsed().as_nanos() as u64;
        Ok(())
    }

    fn integer_columns(&self) -> impl Iterator<Item = &str> {
        self.columns
            .iter()
            .filter(|column| column.kind == NumericKind::Integer)
            .map(|column| column.name.as_str())
    }

    /// The selected columns of `indices`: integer columns as `i64`, float ones as `f32`, each
    /// row-major over its own columns.
    fn read_columns(&self, indices: &[u64]) -> stoker_datasets::Result<ColumnValues> {
        let mut values = ColumnValues::default();
        let Some(numeric) = self.source.numeric_columns() else {
            return Ok(values);
        };
        let integers: Vec<&str> = self.integer_columns().collect();
        let floats: Vec<&str> = self
            .columns
            .iter()
            .filter(|column| column.kind == NumericKind::Float)
            .map(|column| column.name.as_str())
            .collect();
        if !integers.is_empty() {
            numeric.read_i64_columns(&integers, indices, &mut values.integers)?;
        }
        if !floats.is_empty() {
            numeric.read_f32_columns(&floats, indices, &mut values.floats)?;
        }
        Ok(values)
    }

    /// One text document, tokenised (read = read, decode = tokenise).
    fn try_document(
        &self,
        packed: &PackedText,
        index: u64,
        timings: &mut SampleTimings,
    ) -> std::result::Result<Vec<u32>, SampleError> {
        let started = Instant::now();
        let bytes = self
            .source
            .read(index)
            .map_err(|e| SampleError::Unreadable(e.to_string()))?;
        let read_at = Instant::now();
        timings.read_ns += (read_at - started).as_nanos() as u64;
        let text = std::str::from_utf8(&bytes)
            .map_err(|e| SampleError::InvalidText(format!("not UTF-8: {e}")))?;
        let ids = packed.tokenizer.encode(text)?;
        timings.decode_ns += read_at.elapsed().as_nanos() as u64;
        Ok(ids)
    }

    /// Runs `attempt` on sample `index`; under the skip policy a failed sample is replaced by
    /// the next readable one in dataset order (the attempt is told which index to read), so the
    /// batch keeps its shape and stays deterministic.
    fn with_policy<T>(
        &self,
        index: u64,
        mut attempt: impl FnMut(u64, &mut SampleTimings) -> std::result::Result<T, SampleError>,
    ) -> Result<SampleOutcome<T>> {
        let mut timings = SampleTimings::default();
        let first_error = match attempt(index, &mut timings) {
            Ok(value) => {
                return Ok(SampleOutcome {
                    value,
                    used: index,
                    timings,
                    bad: None,
                })
            }
            Err(error) => error,
        };
        let path = self.source.describe(index);
        self.note_bad_sample(index, &path, &first_error);
        if self.policy == BadSamplePolicy::Fail {
            return Err(Error::BadSample {
                index,
                path,
                reason: first_error.to_string(),
            });
        }
        let len = self.source.len();
        for offset in 1..=MAX_SUBSTITUTE_TRIES.min(len.saturating_sub(1)) {
            let substitute = (index + offset) % len;
            match attempt(substitute, &mut timings) {
                Ok(value) => {
                    return Ok(SampleOutcome {
                        value,
                        used: substitute,
                        timings,
                        bad: Some(proto::BadSample {
                            sample_index: index,
                            path,
                            reason: first_error.to_string(),
                            substitute_index: substitute,
                        }),
                    })
                }
                Err(error) => {
                    let substitute_path = self.source.describe(substitute);
                    self.note_bad_sample(substitute, &substitute_path, &error);
                }
            }
        }
        Err(Error::BadSample {
            index,
            path,
            reason: format!(
                "{first_error}; and none of the next {MAX_SUBSTITUTE_TRIES} samples could replace it"
            ),
        })
    }

    fn note_bad_sample(&self, index: u64, path: &str, error: &SampleError) {
        let seen = self.bad_samples_seen.fetch_add(1, Ordering::Relaxed) + 1;
        if seen <= BAD_SAMPLE_LOG_FIRST || seen % BAD_SAMPLE_LOG_EVERY == 0 {
            tracing::warn!(index, path, reason = %error, bad_samples = seen, "bad sample");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use stoker_datasets::NumericColumns;

    use super::*;

    /// An in-memory table: `i` int (null at `null_row`), `f` float, `s` text, labels `10 * i`.
    struct Table {
        rows: u64,
        null_row: Option<u64>,
        numeric: bool,
    }

    impl Table {
        fn new(rows: u64) -> Arc<Table> {
            Arc::new(Table {
                rows,
                null_row: None,
                numeric: true,
            })
        }

        fn column_error(name: &str) -> stoker_datasets::Error {
            stoker_datasets::Error::ParquetColumn {
                path: PathBuf::from("table.parquet"),
                problem: format!("no numeric column named {name:?}"),
            }
        }

        fn cell(&self, name: &str, row: u64) -> stoker_datasets::Result<f64> {
            match name {
                "i" | "label" if self.null_row == Some(row) => {
                    Err(stoker_datasets::Error::ParquetNullCell {
                        path: PathBuf::from("table.parquet"),
                        column: name.into(),
                        row,
                    })
                }
                "i" => Ok(row as f64 * 3.0),
                "label" => Ok(row as f64 * 10.0),
                "f" => Ok(row as f64 + 0.5),
                other => Err(Table::column_error(other)),
            }
        }
    }

    impl SampleSource for Table {
        fn len(&self) -> u64 {
            self.rows
        }
        fn label(&self, index: u64) -> i64 {
            index as i64 * 10
        }
        fn describe(&self, index: u64) -> String {
            format!("table.parquet:row {index}")
        }
        fn read(&self, _index: u64) -> stoker_datasets::Result<Vec<u8>> {
            Ok(Vec::new())
        }
        fn class_names(&self) -> &[String] {
            &[]
        }
        fn numeric_columns(&self) -> Option<&dyn NumericColumns> {
            self.numeric.then_some(self as &dyn NumericColumns)
        }
    }

    impl NumericColumns for Table {
        fn numeric_kind(&self, name: &str) -> stoker_datasets::Result<NumericKind> {
            match name {
                "i" | "label" => Ok(NumericKind::Integer),
                "f" => Ok(NumericKind::Float),
                other => Err(Table::column_error(other)),
            }
        }
        fn read_f32_columns(
            &self,
            columns: &[&str],
            indices: &[u64],
            out: &mut Vec<f32>,
        ) -> stoker_datasets::Result<()> {
            for &row in indices {
                for name in columns {
                    out.push(self.cell(name, row)? as f32);
                }
            }
            Ok(())
        }
        fn read_i64_columns(
            &self,
            columns: &[&str],
            indices: &[u64],
            out: &mut Vec<i64>,
        ) -> stoker_datasets::Result<()> {
            for &row in indices {
                for name in columns {
                    if *name == "f" {
                        return Err(Table::column_error(name));
                    }
                    out.push(self.cell(name, row)? as i64);
                }
            }
            Ok(())
        }
    }

    fn columns(names: &[&str], dtype: proto::Dtype) -> JobPipeline {
        JobPipeline::Columns(SelectedColumns {
            names: names.iter().map(|name| name.to_string()).collect(),
            dtype,
        })
    }

    fn assembler(
        source: Arc<Table>,
        names: &[&str],
        dtype: proto::Dtype,
        policy: BadSamplePolicy,
    ) -> Result<BatchAssembler> {
        BatchAssembler::new(source, columns(names, dtype), 1, policy)
    }

    fn key() -> BatchKey {
        BatchKey {
            epoch: 0,
            rank: 0,
            step: 0,
        }
    }

    fn values<const N: usize>(tensor: &proto::Tensor) -> Vec<[u8; N]> {
        tensor
            .data
            .chunks_exact(N)
            .map(|c| c.try_into().unwrap())
            .collect()
    }

    fn ints(tensor: &proto::Tensor) -> Vec<i64> {
        assert_eq!(tensor.dtype, proto::Dtype::Int64 as i32, "{}", tensor.name);
        values::<8>(tensor)
            .into_iter()
            .map(i64::from_le_bytes)
            .collect()
    }

    fn floats(tensor: &proto::Tensor) -> Vec<f32> {
        assert_eq!(
            tensor.dtype,
            proto::Dtype::Float32 as i32,
            "{}",
            tensor.name
        );
        values::<4>(tensor)
            .into_iter()
            .map(f32::from_le_bytes)
            .collect()
    }

    fn named<'a>(batch: &'a proto::Batch, name: &str) -> &'a proto::Tensor {
        batch.tensors.iter().find(|t| t.name == name).unwrap()
    }

    #[test]
    fn columns_are_checked_against_the_source_when_the_assembler_is_built() {
        let skip = BadSamplePolicy::Skip;
        let error = assembler(
            Table::new(4),
            &["i", "nope"],
            proto::Dtype::Unspecified,
            skip,
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            error.contains("invalid job spec") && error.contains("\"nope\""),
            "{error}"
        );
        let error = assembler(Table::new(4), &["i", "f"], proto::Dtype::Int64, skip)
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("column \"f\"") && error.contains("int64"),
            "{error}"
        );
        let without = Arc::new(Table {
            rows: 4,
            null_row: None,
            numeric: false,
        });
        let error = assembler(without, &["i"], proto::Dtype::Unspecified, skip)
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("numeric columns of Parquet"), "{error}");
        assert!(assembler(Table::new(4), &["i"], proto::Dtype::Int64, skip).is_ok());
    }

    #[test]
    fn one_aligned_tensor_per_column_in_its_own_or_the_asked_type() {
        let skip = BadSamplePolicy::Skip;
        let own = assembler(Table::new(8), &["f", "i"], proto::Dtype::Unspecified, skip).unwrap();
        let layout = own.layout(3);
        let summary: Vec<_> = layout
            .iter()
            .map(|t| (t.name.as_str(), t.dtype, t.shape.clone(), t.bytes.clone()))
            .collect();
        assert_eq!(
            summary,
            [
                ("f", proto::Dtype::Float32, vec![3], 0..12),
                ("i", proto::Dtype::Int64, vec![3], 16..40),
            ]
        );
        assert_eq!(own.batch_bytes(3), 40);
        let batch = own.assemble(key(), &[5, 0, 7]).unwrap();
        assert_eq!(floats(named(&batch, "f")), [5.5, 0.5, 7.5]);
        assert_eq!(ints(named(&batch, "i")), [15, 0, 21]);
        assert_eq!(ints(named(&batch, "label")), [50, 0, 70]);
        assert_eq!(batch.tensors.len(), 3);
        assert!(batch.bad_samples.is_empty());

        let as_float = assembler(Table::new(8), &["i", "f"], proto::Dtype::Float32, skip).unwrap();
        assert_eq!(as_float.batch_bytes(3), 16 + 12);
        let batch = as_float.assemble(key(), &[1, 2, 3]).unwrap();
        assert_eq!(floats(named(&batch, "i")), [3.0, 6.0, 9.0]);
        assert_eq!(floats(named(&batch, "f")), [1.5, 2.5, 3.5]);
    }

    #[test]
    fn a_selected_label_column_is_the_only_label_tensor() {
        let skip = BadSamplePolicy::Skip;
        let own = assembler(
            Table::new(8),
            &["label", "f"],
            proto::Dtype::Unspecified,
            skip,
        )
        .unwrap();
        let batch = own.assemble(key(), &[2, 4]).unwrap();
        let names: Vec<&str> = batch.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["label", "f"]);
        assert_eq!(ints(named(&batch, "label")), [20, 40]);
    }

    #[test]
    fn a_null_cell_follows_the_bad_input_policy() {
        let table = Arc::new(Table {
            rows: 6,
            null_row: Some(2),
            numeric: true,
        });
        let skip = assembler(
            Arc::clone(&table),
            &["i", "f"],
            proto::Dtype::Unspecified,
            BadSamplePolicy::Skip,
        )
        .unwrap();
        let batch = skip.assemble(key(), &[1, 2, 5]).unwrap();
        // Sample 2 is replaced by the next readable row, 3, in every tensor.
        assert_eq!(ints(named(&batch, "i")), [3, 9, 15]);
        assert_eq!(floats(named(&batch, "f")), [1.5, 3.5, 5.5]);
        assert_eq!(ints(named(&batch, "label")), [10, 30, 50]);
        assert_eq!(batch.bad_samples.len(), 1);
        let bad = &batch.bad_samples[0];
        assert_eq!((bad.sample_index, bad.substitute_index), (2, 3));
        assert!(bad.reason.contains("column i"), "{}", bad.reason);
        assert_eq!(skip.bad_samples_seen(), 1);
        // Batches without the bad row take the whole-batch read and match.
        let again = skip.assemble(key(), &[1, 3, 5]).unwrap();
        assert_eq!(again.tensors, batch.tensors);

        let fail = assembler(
            table,
            &["i"],
            proto::Dtype::Unspecified,
            BadSamplePolicy::Fail,
        )
        .unwrap();
        let error = fail.assemble(key(), &[0, 2]).unwrap_err().to_string();
        assert!(
            error.contains("bad sample 2") && error.contains("table.parquet:row 2"),
            "{error}"
        );
    }
}
