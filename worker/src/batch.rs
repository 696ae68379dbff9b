//! Batch assembly: the samples of one step processed in parallel (rayon), each written straight
//! into its place in one batch buffer, with the bad-input policy applied per sample.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use rayon::prelude::*;
use stoker_datasets::SampleSource;
use stoker_proto::v1::{self as proto, BadSamplePolicy};

use crate::error::{Error, Result, SampleError};
use crate::pipeline::{Pipeline, SampleTimings, Scratch};
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
    pipeline: Pipeline,
    seed: u64,
    policy: BadSamplePolicy,
    bad_samples_seen: AtomicU64,
}

/// What a batch holds besides its image bytes.
#[derive(Debug, Clone)]
pub struct AssembledBatch {
    /// Where the batch belongs.
    pub key: BatchKey,
    /// One label per sample (the substitute's label for replaced samples).
    pub labels: Vec<i64>,
    /// Stage timings summed over the samples.
    pub timings: SampleTimings,
    /// Samples replaced under the skip policy.
    pub bad_samples: Vec<proto::BadSample>,
}

impl AssembledBatch {
    /// The wire form, with `images` as the image tensor's bytes.
    pub fn into_proto(self, pipeline: &Pipeline, indices: &[u64], images: Bytes) -> proto::Batch {
        let count = indices.len();
        let labels: Vec<u8> = self.labels.iter().flat_map(|l| l.to_le_bytes()).collect();
        proto::Batch {
            epoch: self.key.epoch,
            rank: self.key.rank,
            step: self.key.step,
            tensors: vec![
                proto::Tensor {
                    name: "image".into(),
                    dtype: pipeline.image_dtype() as i32,
                    shape: pipeline.image_shape(count),
                    data: images,
                },
                proto::Tensor {
                    name: "label".into(),
                    dtype: proto::Dtype::Int64 as i32,
                    shape: vec![count as u64],
                    data: Bytes::from(labels),
                },
            ],
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

struct SampleOutcome {
    label: i64,
    timings: SampleTimings,
    bad: Option<proto::BadSample>,
}

impl BatchAssembler {
    /// An assembler reading from `source` through `pipeline`.
    pub fn new(
        source: Arc<dyn SampleSource>,
        pipeline: Pipeline,
        seed: u64,
        policy: BadSamplePolicy,
    ) -> Self {
        Self {
            source,
            pipeline,
            seed,
            policy,
            bad_samples_seen: AtomicU64::new(0),
        }
    }

    /// The pipeline.
    pub fn pipeline(&self) -> &Pipeline {
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

    /// Bytes of the image tensor of a batch of `samples`.
    pub fn image_bytes(&self, samples: usize) -> usize {
        self.pipeline.bytes_per_sample() * samples
    }

    /// Builds the batch of `indices` (dataset indices in batch order) into `images`, which must
    /// hold exactly [`BatchAssembler::image_bytes`] bytes. Runs the samples in parallel on the
    /// current rayon pool; the bytes depend only on the arguments and the job.
    pub fn assemble_into(
        &self,
        key: BatchKey,
        indices: &[u64],
        images: &mut [u8],
    ) -> Result<AssembledBatch> {
        let sample_bytes = self.pipeline.bytes_per_sample();
        if images.len() != sample_bytes * indices.len() {
            return Err(Error::InvalidSpec(format!(
                "batch buffer of {} bytes for {} samples of {sample_bytes} bytes",
                images.len(),
                indices.len()
            )));
        }
        let outcomes: Vec<Result<SampleOutcome>> = images
            .par_chunks_mut(sample_bytes.max(1))
            .zip(indices.par_iter())
            .map(|(dest, &index)| self.fill_slot(key.epoch, index, dest))
            .collect();
        let mut assembled = AssembledBatch {
            key,
            labels: Vec::with_capacity(indices.len()),
            timings: SampleTimings::default(),
            bad_samples: Vec::new(),
        };
        for outcome in outcomes {
            let outcome = outcome?;
            assembled.labels.push(outcome.label);
            assembled.timings.add(&outcome.timings);
            assembled.bad_samples.extend(outcome.bad);
        }
        Ok(assembled)
    }

    /// Builds the batch of `indices` in a new buffer; see [`BatchAssembler::assemble_into`].
    pub fn assemble(&self, key: BatchKey, indices: &[u64]) -> Result<proto::Batch> {
        let mut images = vec![0u8; self.image_bytes(indices.len())];
        let assembled = self.assemble_into(key, indices, &mut images)?;
        Ok(assembled.into_proto(&self.pipeline, indices, Bytes::from(images)))
    }

    fn try_sample(
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
        timings.read_ns += started.elapsed().as_nanos() as u64;
        let mut rng = SampleRng::new(self.seed, epoch, rng_index);
        SCRATCH.with(|scratch| {
            self.pipeline
                .process(&bytes, &mut rng, dest, &mut scratch.borrow_mut(), timings)
        })
    }

    fn fill_slot(&self, epoch: u64, index: u64, dest: &mut [u8]) -> Result<SampleOutcome> {
        let mut timings = SampleTimings::default();
        let first_error = match self.try_sample(epoch, index, index, dest, &mut timings) {
            Ok(()) => {
                return Ok(SampleOutcome {
                    label: self.source.label(index),
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
        // Skip: the next readable sample in dataset order takes the slot, augmented with the
        // slot's own random stream, so the batch keeps its shape and stays deterministic.
        let len = self.source.len();
        for offset in 1..=MAX_SUBSTITUTE_TRIES.min(len.saturating_sub(1)) {
            let substitute = (index + offset) % len;
            match self.try_sample(epoch, index, substitute, dest, &mut timings) {
                Ok(()) => {
                    return Ok(SampleOutcome {
                        label: self.source.label(substitute),
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
