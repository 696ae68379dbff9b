//! A built batch as a process holds it ([`Batch`]): named tensors over the batch buffer (a
//! loader's slot, when it was built into one), the samples of its rows, the samples replaced,
//! its stage timings, and the rows a decode lane left on a device ([`LaneRows`]). The embedded
//! loader hands it on as it is; the worker daemon turns it into the wire's batch only as it
//! sends it, and the loader turns a received one back into it as it lands.

use std::sync::Arc;

use bytes::Bytes;
use stoker_proto::v1 as proto;

use crate::pipeline::SampleTimings;

/// One named tensor of a batch: little-endian elements in row-major order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor {
    /// `image`, `label`, `tokens`, `input_ids`, a column's name, ...
    pub name: String,
    /// Element type.
    pub dtype: proto::Dtype,
    /// Shape, batch first.
    pub shape: Vec<u64>,
    /// The elements: a slice of the batch buffer, or bytes of their own (labels).
    pub data: Bytes,
}

impl Tensor {
    /// Its elements as `T`; `None` when its dtype is not `T`'s or its bytes are not a whole
    /// number of elements.
    pub fn elements<T: stoker_proto::Element>(&self) -> Option<Vec<T>> {
        stoker_proto::elements(self.dtype, &self.data)
    }
}

/// One batch of one rank's epoch, as built.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    /// Its epoch.
    pub epoch: u64,
    /// Its rank.
    pub rank: u32,
    /// Its step in the rank's epoch.
    pub step: u64,
    /// Its tensors: the batch buffer's, then `label` and `source` where the batch has them.
    pub tensors: Vec<Tensor>,
    /// The dataset index of each row, in row order (before any substitution).
    pub sample_indices: Vec<u64>,
    /// Time spent per stage, summed over the samples (zero for a batch built in Python).
    pub timings: SampleTimings,
    /// Samples replaced under the skip policy.
    pub bad_samples: Vec<proto::BadSample>,
    /// Packed text: document tokens (EOS included) past the batch's last row, dropped.
    pub dropped_tokens: u64,
    /// The image rows a decode lane built on a device instead of in the buffer; their rows of
    /// the `image` tensor's bytes are not written.
    pub device_rows: Option<Arc<dyn LaneRows>>,
}

impl Batch {
    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// Rows of one batch a decode lane built on a device rather than in its buffer: `shape()[0]`
/// rows of [`LaneRows::element`], C order, from [`LaneRows::ptr`], row `k` standing for the
/// batch's row `positions()[k]`: uint8 `(height, width, 3)` as the buffer's rows are, unless
/// the lane applied the device's tail ([`LaneRows::tail_applied`]). They stay valid while this
/// value is held.
pub trait LaneRows: Send + Sync + std::fmt::Debug {
    /// Device address of the first row.
    fn ptr(&self) -> u64;

    /// The batch row of each device row.
    fn positions(&self) -> &[u32];

    /// (rows, height, width, 3), or (rows, 3, height, width) for channel planes.
    fn shape(&self) -> [usize; 4];

    /// The element type, as torch names its dtype (`"uint8"`, `"float32"`, `"bfloat16"`,
    /// `"float16"`).
    fn element(&self) -> &'static str;

    /// Whether the rows are already what the device's tail (normalise, dtype, layout) makes of
    /// the buffer's uint8 rows.
    fn tail_applied(&self) -> bool;

    /// The device's ordinal.
    fn device(&self) -> usize;

    /// Makes `stream` wait (on the device) until the rows are written.
    ///
    /// # Safety
    /// `stream` is a live stream of the device's primary context, or 0 (its legacy default
    /// stream).
    unsafe fn wait_on(&self, stream: usize) -> Result<(), String>;

    /// Keeps the rows until the work queued on `stream` so far (the copies reading them) is
    /// done, whoever else lets go of them first.
    ///
    /// # Safety
    /// As for [`LaneRows::wait_on`].
    unsafe fn keep_until(self: Arc<Self>, stream: usize) -> Result<(), String>;
}

/// The wire's batch, as the worker daemon sends it: the rows a lane left on a device do not
/// travel (a worker has no lane).
impl From<Batch> for proto::Batch {
    fn from(batch: Batch) -> Self {
        let tensors = batch.tensors.into_iter().map(|tensor| proto::Tensor {
            name: tensor.name,
            dtype: tensor.dtype as i32,
            shape: tensor.shape,
            data: tensor.data,
        });
        let timings = batch.timings;
        proto::Batch {
            epoch: batch.epoch,
            rank: batch.rank,
            step: batch.step,
            tensors: tensors.collect(),
            sample_indices: batch.sample_indices,
            timings: Some(proto::StageTimings {
                read_ns: timings.read_ns,
                decode_ns: timings.decode_ns,
                augment_ns: timings.augment_ns,
                assemble_ns: timings.assemble_ns,
                transfer_ns: 0,
            }),
            bad_samples: batch.bad_samples,
            dropped_tokens: batch.dropped_tokens,
        }
    }
}

/// A batch off the wire, as the loader lands it. A dtype this build does not know becomes
/// `Unspecified` (read as `unknown`, and refused by whoever would reinterpret the bytes).
impl From<proto::Batch> for Batch {
    fn from(batch: proto::Batch) -> Self {
        let tensors = batch.tensors.into_iter().map(|tensor| Tensor {
            name: tensor.name,
            dtype: proto::Dtype::try_from(tensor.dtype).unwrap_or(proto::Dtype::Unspecified),
            shape: tensor.shape,
            data: tensor.data,
        });
        let timings = batch.timings.unwrap_or_default();
        Batch {
            epoch: batch.epoch,
            rank: batch.rank,
            step: batch.step,
            tensors: tensors.collect(),
            sample_indices: batch.sample_indices,
            timings: SampleTimings {
                read_ns: timings.read_ns,
                decode_ns: timings.decode_ns,
                augment_ns: timings.augment_ns,
                assemble_ns: timings.assemble_ns,
            },
            bad_samples: batch.bad_samples,
            dropped_tokens: batch.dropped_tokens,
            device_rows: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire() -> proto::Batch {
        proto::Batch {
            epoch: 3,
            rank: 1,
            step: 9,
            tensors: vec![
                proto::Tensor {
                    name: "image".into(),
                    dtype: proto::Dtype::Uint8 as i32,
                    shape: vec![2, 1, 1, 3],
                    data: Bytes::from_static(&[1, 2, 3, 4, 5, 6]),
                },
                proto::Tensor {
                    name: "label".into(),
                    dtype: proto::Dtype::Int64 as i32,
                    shape: vec![2],
                    data: Bytes::from([7i64, 8].map(i64::to_le_bytes).concat()),
                },
            ],
            sample_indices: vec![4, 0],
            timings: Some(proto::StageTimings {
                read_ns: 1,
                decode_ns: 2,
                augment_ns: 3,
                assemble_ns: 4,
                transfer_ns: 0,
            }),
            bad_samples: vec![proto::BadSample {
                sample_index: 0,
                path: "a.jpg".into(),
                reason: "truncated".into(),
                substitute_index: 5,
            }],
            dropped_tokens: 11,
        }
    }

    #[test]
    fn a_batch_goes_to_the_wire_and_back_unchanged_and_its_tensors_read_by_name() {
        let batch = Batch::from(wire());
        assert_eq!(
            batch.tensor("label").and_then(Tensor::elements::<i64>),
            Some(vec![7, 8])
        );
        assert_eq!(
            batch.tensor("image").map(|t| t.dtype),
            Some(proto::Dtype::Uint8)
        );
        assert!(batch.tensor("source").is_none());
        assert_eq!(batch.timings.augment_ns, 3);
        assert_eq!(batch.dropped_tokens, 11);
        assert_eq!(proto::Batch::from(batch), wire());
    }

    #[test]
    fn an_unknown_dtype_off_the_wire_is_unspecified_and_no_elements() {
        let mut sent = wire();
        sent.tensors[1].dtype = 99;
        let batch = Batch::from(sent);
        assert_eq!(batch.tensors[1].dtype, proto::Dtype::Unspecified);
        assert_eq!(batch.tensors[1].elements::<i64>(), None);
    }
}
