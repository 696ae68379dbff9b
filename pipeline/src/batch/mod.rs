//! Batch assembly: the samples of one step processed in parallel (rayon), with the bad-input
//! policy applied per sample, into one batch buffer. Images and token windows are written
//! straight into their row; text documents are tokenised in parallel, then packed in order.
//! Numeric columns are read for the whole batch at once, and sample by sample (under the
//! policy) only when that read fails.
//! The buffer holds the batch's tensors one after the other ([`AssembledBatch::tensors`]).
//!
//! This module builds the rows; `layout` says where each tensor lies in the buffer and makes
//! the [`Batch`] (`built`), `columns` reads Parquet numeric columns, `bad_sample_policy` replaces or
//! reports samples that cannot be read, `source_reads` tells those from reads that failed for
//! want of resources or storage (retried, or raised; never a bad sample).

mod bad_sample_policy;
mod built;
mod columns;
mod layout;
mod mixed;
mod read_watch;
mod source_reads;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use rayon::prelude::*;
use stoker_datasets::{SampleSource, TokenDtype};
use stoker_proto::v1::{self as proto, BadSamplePolicy};

use crate::error::{Error, Result, SampleError};
use crate::job_pipeline::{JobPipeline, PackedText};
use crate::ops::decode::{read_header, ImageHeader};
use crate::ops::pack::{pack_documents, PackSpec, PackedRowsMut};
use crate::ops::resample::SourceWindow;
use crate::pipeline::{SampleTimings, Scratch};
use crate::rng::SampleRng;

use bad_sample_policy::SampleOutcome;
pub use bad_sample_policy::MAX_SUBSTITUTE_TRIES;
pub use built::{Batch, LaneRows, Tensor};
use columns::{output_columns, OutputColumn};
pub use layout::{AssembledBatch, TensorLayout};
pub use mixed::{mix_samples, MixedAssembler, MixedPart};
pub use read_watch::ReadWatch;
use source_reads::{read_from_source, AttemptError};

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// Where a row goes: its position, and the diverter that may take it.
#[derive(Clone, Copy)]
struct RowTarget<'a> {
    row: usize,
    diverter: Option<&'a dyn ImageDiverter>,
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

/// An image sample offered to another decoder instead of the CPU threads (the GPU lane): its
/// bytes and header, and the output window and flip drawn from the sample's own RNG stream, the
/// same draws the CPU would make, so another decoder changes pixels only where its decode
/// differs (rounding, chroma upsampling, or a full-size decode where the CPU scales).
#[derive(Debug)]
pub struct DivertedImage {
    /// The sample's row in the batch.
    pub row: usize,
    /// The sample of the row (its RNG stream), in dataset order.
    pub sample: u64,
    /// The dataset index read: the sample, or its substitute under the skip policy.
    pub read: u64,
    /// The encoded image.
    pub bytes: Vec<u8>,
    /// What its header says.
    pub header: ImageHeader,
    /// Where the output pixels come from.
    pub window: SourceWindow,
    /// Whether the output is mirrored.
    pub flip: bool,
}

/// Takes some image rows of a batch off the CPU threads ([`BatchAssembler::assemble_diverted`]).
/// Which rows are offered must not depend on timing (it changes the bits: decoders round
/// differently), only on the row.
pub trait ImageDiverter: Sync {
    /// Whether row `row` is offered.
    fn wants(&self, row: usize) -> bool;
    /// Offers a sample: `None` when taken (its row is left for the taker to fill), or the sample
    /// given back to be built on the CPU.
    fn offer(&self, image: DivertedImage) -> Option<DivertedImage>;
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
    /// What packing said once of the tokens it dropped or the padding it wrote.
    waste_said: crate::ops::pack::WasteSaid,
    /// Where its reads are marked while they run, with its source's number there.
    watch: Option<(Arc<ReadWatch>, u16)>,
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
            (
                JobPipeline::TokenWindows {
                    documents: true, ..
                },
                Some(_),
            ) if source.document_starts().is_none() => {
                return Err(Error::InvalidSpec(
                    "TokenWindows with document_boundaries needs a corpus that knows its \
                     documents (a Megatron .bin beside its .idx); this token file has no \
                     document index"
                        .into(),
                ))
            }
            (JobPipeline::TokenWindows { seq_len, .. }, Some(shape))
                if shape.seq_len == *seq_len =>
            {
                Some(shape.dtype)
            }
            (JobPipeline::TokenWindows { seq_len, .. }, Some(shape)) => {
                return Err(Error::InvalidSpec(format!(
                    "the token file was opened with windows of seq_len {} but the pipeline's \
                     TokenWindows asks for {seq_len}",
                    shape.seq_len
                )))
            }
            (JobPipeline::TokenWindows { .. }, None) => return Err(Error::InvalidSpec(
                "TokenWindows reads token files, Megatron corpora and MDS token columns only; for \
                     text use [Tokenize, PackSequences]"
                    .into(),
            )),
            (_, Some(_)) => {
                return Err(Error::InvalidSpec(
                    "a token file is read through a [TokenWindows] pipeline".into(),
                ))
            }
            (_, None) => None,
        };
        if !source.has_sample_bytes() && !matches!(pipeline, JobPipeline::Columns(_)) {
            return Err(Error::InvalidSpec(
                "the dataset has numeric columns only (no image or text column); read it with \
                 a [SelectColumns] pipeline"
                    .into(),
            ));
        }
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
            waste_said: crate::ops::pack::WasteSaid::default(),
            watch: None,
        })
    }

    /// The assembler with its reads marked in `watch` as source `source`'s while they run.
    pub fn watched(mut self, watch: Arc<ReadWatch>, source: u16) -> Self {
        self.watch = Some((watch, source));
        self
    }

    /// Marks a read of sample `index` in the watch until the guard is dropped.
    fn mark_read(&self, index: u64) -> Option<read_watch::Reading<'_>> {
        self.watch
            .as_ref()
            .and_then(|(watch, source)| watch.mark(*source, index))
    }

    /// Runs `read` of sample `index` through [`read_from_source`], marked in the watch.
    fn read_watched<T>(
        &self,
        index: u64,
        read: impl FnMut() -> stoker_datasets::Result<T>,
    ) -> std::result::Result<T, AttemptError> {
        let _reading = self.mark_read(index);
        read_from_source(read)
    }

    /// The pipeline.
    pub fn pipeline(&self) -> &JobPipeline {
        &self.pipeline
    }

    /// Whether batches carry a `label` tensor: images, and columns unless a selected column is
    /// itself named `label`.
    pub fn has_labels(&self) -> bool {
        match self.pipeline {
            JobPipeline::Image(_) => true,
            JobPipeline::Columns(_) => self.column_labels,
            JobPipeline::TokenWindows { .. } | JobPipeline::PackedText(_) => false,
        }
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

    /// Builds the batch of `indices` (dataset indices in batch order) into `buffer`, which must
    /// hold exactly [`BatchAssembler::batch_bytes`] bytes. Runs the samples in parallel on the
    /// current rayon pool; the bytes depend only on the arguments and the job.
    pub fn assemble_into(
        &self,
        key: BatchKey,
        indices: &[u64],
        buffer: &mut [u8],
    ) -> Result<AssembledBatch> {
        self.assemble_diverted(key, indices, buffer, None)
    }

    /// Like [`BatchAssembler::assemble_into`]; an image pipeline's rows that `diverter` wants are
    /// read and planned here and offered to it, and a row it takes is not written (its label is
    /// the sample read, as if it had been built).
    pub fn assemble_diverted(
        &self,
        key: BatchKey,
        indices: &[u64],
        buffer: &mut [u8],
        diverter: Option<&dyn ImageDiverter>,
    ) -> Result<AssembledBatch> {
        let samples = indices.len();
        let mut assembled =
            AssembledBatch::start(key, self.layout(samples), samples, buffer.len())?;
        match &self.pipeline {
            JobPipeline::Image(_) | JobPipeline::TokenWindows { .. } => {
                // The rows' tensor first (a TokenWindows batch with documents has the
                // boundaries' tensors after it, filled below).
                let rows_end = assembled
                    .tensors
                    .first()
                    .map_or(buffer.len(), |tensor| tensor.bytes.end);
                let row_bytes = if indices.is_empty() {
                    1
                } else {
                    rows_end / indices.len()
                };
                let labelled = matches!(self.pipeline, JobPipeline::Image(_));
                let outcomes: Vec<Result<SampleOutcome<()>>> = buffer[..rows_end]
                    .par_chunks_mut(row_bytes.max(1))
                    .zip(indices.par_iter())
                    .enumerate()
                    .map(|(row, (dest, &index))| {
                        let diverter = diverter.filter(|d| d.wants(row));
                        self.with_policy(index, |source_index, timings| {
                            let target = RowTarget { row, diverter };
                            self.try_row(key.epoch, index, source_index, dest, timings, target)
                        })
                    })
                    .collect();
                let mut used = Vec::with_capacity(indices.len());
                for outcome in outcomes {
                    let outcome = outcome?;
                    if labelled {
                        assembled.labels.push(self.source.label(outcome.used));
                    }
                    used.push(outcome.used);
                    assembled.timings.add(&outcome.timings);
                    assembled.bad_samples.extend(outcome.bad);
                }
                if let JobPipeline::TokenWindows {
                    seq_len,
                    documents: true,
                } = self.pipeline
                {
                    self.document_ids(seq_len, &used, buffer, &assembled.tensors);
                }
            }
            JobPipeline::Columns(_) => {
                self.assemble_columns(indices, buffer, &mut assembled)?;
            }
            JobPipeline::PackedText(packed) => {
                let documents = self.documents(packed, indices, &mut assembled)?;
                self.pack(&packed.pack, &documents, buffer, &mut assembled);
            }
        }
        Ok(assembled)
    }

    /// The documents of `indices` tokenised in parallel (packed text), under the policy; their
    /// timings and bad samples go to `assembled`.
    fn documents(
        &self,
        packed: &PackedText,
        indices: &[u64],
        assembled: &mut AssembledBatch,
    ) -> Result<Vec<Vec<u32>>> {
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
        Ok(documents)
    }

    /// Packs `documents` into `buffer` (the three tensors of packed text), counting the time
    /// and the tokens dropped.
    fn pack(
        &self,
        pack: &PackSpec,
        documents: &[Vec<u32>],
        buffer: &mut [u8],
        assembled: &mut AssembledBatch,
    ) {
        let started = Instant::now();
        let third = buffer.len() / 3;
        let (input_ids, rest) = buffer.split_at_mut(third);
        let (position_ids, document_ids) = rest.split_at_mut(third);
        let summary = pack_documents(
            pack,
            documents,
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
        crate::ops::pack::warn_once_of_waste(&summary, pack.seq_len, &self.waste_said);
    }

    /// Builds the batch of `indices` in a new buffer; see [`BatchAssembler::assemble_into`].
    pub fn assemble(&self, key: BatchKey, indices: &[u64]) -> Result<Batch> {
        let mut buffer = vec![0u8; self.batch_bytes(indices.len())];
        let assembled = self.assemble_into(key, indices, &mut buffer)?;
        Ok(assembled.into_batch(indices, Bytes::from(buffer)))
    }

    /// Builds image row `dest` of epoch `epoch` on the CPU, for sample `index` under the
    /// bad-input policy, as [`BatchAssembler::assemble_into`] would; returns the label of the
    /// sample read and the sample's bad-sample report, if it was replaced. For rows a diverter
    /// took and then could not build.
    pub fn image_row(
        &self,
        epoch: u64,
        index: u64,
        dest: &mut [u8],
    ) -> Result<(i64, Option<proto::BadSample>)> {
        if !matches!(self.pipeline, JobPipeline::Image(_)) {
            return Err(Error::InvalidSpec(
                "image_row builds rows of image pipelines only".into(),
            ));
        }
        let outcome = self.with_policy(index, |source_index, timings| {
            let target = RowTarget {
                row: 0,
                diverter: None,
            };
            self.try_row(epoch, index, source_index, dest, timings, target)
        })?;
        Ok((self.source.label(outcome.used), outcome.bad))
    }

    /// One image or token window into its row `dest`. Images draw from the stream of
    /// `rng_index` (the slot's sample, also when a substitute is read); an image the target's
    /// diverter takes is read and planned here, and not written. Token windows are read
    /// straight into the row.
    fn try_row(
        &self,
        epoch: u64,
        rng_index: u64,
        index: u64,
        dest: &mut [u8],
        timings: &mut SampleTimings,
        target: RowTarget<'_>,
    ) -> std::result::Result<(), AttemptError> {
        let started = Instant::now();
        match &self.pipeline {
            JobPipeline::Image(pipeline) => {
                let mut bytes = self.read_watched(index, || self.source.read(index))?;
                timings.read_ns += started.elapsed().as_nanos() as u64;
                let mut rng = SampleRng::new(self.seed, epoch, rng_index);
                if let Some(diverter) = target.diverter {
                    let header = read_header(&bytes, pipeline.max_pixels)?;
                    let (window, flip) = pipeline.plan(&header, &mut rng)?;
                    let offered = DivertedImage {
                        row: target.row,
                        sample: rng_index,
                        read: index,
                        bytes,
                        header,
                        window,
                        flip,
                    };
                    match diverter.offer(offered) {
                        None => return Ok(()),
                        Some(back) => bytes = back.bytes,
                    }
                    rng = SampleRng::new(self.seed, epoch, rng_index);
                }
                SCRATCH.with(|scratch| {
                    pipeline.process(&bytes, &mut rng, dest, &mut scratch.borrow_mut(), timings)
                })?;
                Ok(())
            }
            JobPipeline::TokenWindows { .. } => {
                let expected = self
                    .source
                    .token_windows()
                    .map(|shape| (shape.seq_len as usize + 1) * shape.dtype.size());
                if expected != Some(dest.len()) {
                    return Err(SampleError::WindowSize {
                        found: expected.unwrap_or(0),
                        expected: dest.len(),
                    }
                    .into());
                }
                self.read_watched(index, || self.source.read_into(index, dest))?;
                timings.read_ns += started.elapsed().as_nanos() as u64;
                Ok(())
            }
            JobPipeline::PackedText(_) | JobPipeline::Columns(_) => Err(SampleError::Unreadable(
                "this pipeline is not assembled row by row".into(),
            )
            .into()),
        }
    }

    /// Writes the `position_ids` and `document_ids` of the windows `used` (the windows the rows
    /// hold, in row order) into their tensors of `layout` in `buffer`, from the source's
    /// document starts: positions count from 0 at each row start and each document start,
    /// document ids from 0 at each row start and one more at each document start.
    fn document_ids(&self, seq_len: u32, used: &[u64], buffer: &mut [u8], layout: &[TensorLayout]) {
        let starts = self.source.document_starts().unwrap_or(&[]);
        let (Some(positions), Some(documents)) = (layout.get(1), layout.get(2)) else {
            return;
        };
        let width = seq_len as usize + 1;
        let (head, tail) = buffer.split_at_mut(documents.bytes.start);
        let positions = &mut head[positions.bytes.clone()];
        let documents = &mut tail[..documents.bytes.len()];
        for (row, &window) in used.iter().enumerate() {
            let first = window * u64::from(seq_len);
            // The next document start after the row's first token.
            let mut next = starts.partition_point(|&start| start <= first);
            let mut position = 0i32;
            let mut document = 0i32;
            for k in 0..width {
                let token = first + k as u64;
                if k > 0 && starts.get(next) == Some(&token) {
                    position = 0;
                    document += 1;
                }
                while starts.get(next).is_some_and(|&start| start <= token) {
                    next += 1;
                }
                let at = (row * width + k) * 4;
                positions[at..at + 4].copy_from_slice(&position.to_le_bytes());
                documents[at..at + 4].copy_from_slice(&document.to_le_bytes());
                position += 1;
            }
        }
    }

    /// One text document, tokenised (read = read, decode = tokenise).
    fn try_document(
        &self,
        packed: &PackedText,
        index: u64,
        timings: &mut SampleTimings,
    ) -> std::result::Result<Vec<u32>, AttemptError> {
        let started = Instant::now();
        let bytes = self.read_watched(index, || self.source.read(index))?;
        let read_at = Instant::now();
        timings.read_ns += (read_at - started).as_nanos() as u64;
        let text = std::str::from_utf8(&bytes)
            .map_err(|e| SampleError::InvalidText(format!("not UTF-8: {e}")))?;
        let ids = packed.tokenizer.encode(text)?;
        timings.decode_ns += read_at.elapsed().as_nanos() as u64;
        Ok(ids)
    }
}
