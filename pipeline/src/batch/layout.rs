//! Where a batch's tensors lie in its buffer ([`TensorLayout`], one after the other, column
//! tensors 8-byte aligned) and the batch they become ([`AssembledBatch::into_batch`]).

use bytes::Bytes;
use stoker_datasets::TokenDtype;
use stoker_proto::v1 as proto;

use super::{Batch, BatchAssembler, BatchKey, Tensor};
use crate::error::{Error, Result};
use crate::job_pipeline::{token_dtype_proto, JobPipeline};
use crate::pipeline::SampleTimings;

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
    /// Mixed sources: the source of each sample (packed text: of each document), which
    /// becomes the `source` tensor; empty for a single source.
    pub sources: Vec<i64>,
}

impl AssembledBatch {
    /// A batch of `samples` laid out as `tensors`, about to be written into a buffer of
    /// `buffer` bytes (refused when the layout needs another size), nothing filled in yet.
    pub(crate) fn start(
        key: BatchKey,
        tensors: Vec<TensorLayout>,
        samples: usize,
        buffer: usize,
    ) -> Result<AssembledBatch> {
        let expected = tensors.last().map_or(0, |t| t.bytes.end);
        if buffer != expected {
            return Err(Error::InvalidSpec(format!(
                "batch buffer of {buffer} bytes for {samples} samples needing {expected} bytes"
            )));
        }
        Ok(AssembledBatch {
            key,
            tensors,
            labels: Vec::new(),
            timings: SampleTimings::default(),
            bad_samples: Vec::new(),
            dropped_tokens: 0,
            sources: Vec::new(),
        })
    }

    /// The batch; `data` is the batch buffer the tensors were written into.
    pub fn into_batch(self, indices: &[u64], data: Bytes) -> Batch {
        let mut tensors: Vec<Tensor> = self
            .tensors
            .into_iter()
            .map(|layout| Tensor {
                name: layout.name,
                dtype: layout.dtype,
                shape: layout.shape,
                data: data.slice(layout.bytes),
            })
            .collect();
        for (name, values) in [("label", &self.labels), ("source", &self.sources)] {
            if values.is_empty() {
                continue;
            }
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            tensors.push(Tensor {
                name: name.into(),
                dtype: proto::Dtype::Int64,
                shape: vec![values.len() as u64],
                data: Bytes::from(bytes),
            });
        }
        Batch {
            epoch: self.key.epoch,
            rank: self.key.rank,
            step: self.key.step,
            tensors,
            sample_indices: indices.to_vec(),
            timings: self.timings,
            bad_samples: self.bad_samples,
            dropped_tokens: self.dropped_tokens,
            device_rows: None,
        }
    }
}

impl BatchAssembler {
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
            JobPipeline::TokenWindows { seq_len, documents } => {
                let dtype = self.window_dtype.unwrap_or(TokenDtype::Uint16);
                let width = *seq_len as usize + 1;
                let tokens_end = width * dtype.size() * samples;
                let mut tensors = vec![TensorLayout {
                    name: "tokens".into(),
                    dtype: token_dtype_proto(dtype),
                    shape: vec![batch, width as u64],
                    bytes: 0..tokens_end,
                }];
                if *documents {
                    // 8-byte aligned after the tokens, so int32 views need no copy.
                    let start = tokens_end.next_multiple_of(8);
                    let len = width * 4 * samples;
                    for (i, name) in ["position_ids", "document_ids"].into_iter().enumerate() {
                        tensors.push(TensorLayout {
                            name: name.into(),
                            dtype: proto::Dtype::Int32,
                            shape: vec![batch, width as u64],
                            bytes: start + i * len..start + (i + 1) * len,
                        });
                    }
                }
                tensors
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
}
