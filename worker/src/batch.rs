//! Batch assembly: the samples of one step processed in parallel (rayon), with the bad-input
//! policy applied per sample, into one batch buffer. Images and token windows are written
//! straight into their row; text documents are tokenised in parallel, then packed in order.
//! The buffer holds the batch's tensors one after the other ([`AssembledBatch::tensors`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use rayon::prelude::*;
use stoker_datasets::{SampleSource, TokenDtype};
use stoker_proto::v1::{self as proto, BadSamplePolicy};

use crate::error::{Error, Result, SampleError};
use crate::job_pipeline::{token_dtype_proto, JobPipeline, PackedText};
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
    seed: u64,
    policy: BadSamplePolicy,
    bad_samples_seen: AtomicU64,
    tokens_dropped: AtomicU64,
}

/// Where one tensor lies in a batch buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorLayout {
    /// Tensor name (`image`, `tokens`, `input_ids`, ...).
    pub name: &'static str,
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
    /// One label per sample (the substitute's label for replaced samples); image batches only,
    /// where they become the `label` tensor.
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
                name: layout.name.into(),
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
        Ok(Self {
            source,
            pipeline,
            window_dtype,
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
                name: "image",
                dtype: pipeline.image_dtype(),
                shape: pipeline.image_shape(samples),
                bytes: 0..pipeline.bytes_per_sample() * samples,
            }],
            JobPipeline::TokenWindows { seq_len } => {
                let dtype = self.window_dtype.unwrap_or(TokenDtype::Uint16);
                let row = (*seq_len as usize + 1) * dtype.size();
                vec![TensorLayout {
                    name: "tokens",
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
                        name,
                        dtype: proto::Dtype::Int32,
                        shape: vec![batch, u64::from(seq_len)],
                        bytes: i * len..(i + 1) * len,
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
            JobPipeline::PackedText(_) => Err(SampleError::Unreadable(
                "packed text is not assembled row by row".into(),
            )),
        }
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
