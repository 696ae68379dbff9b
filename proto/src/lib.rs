//! Stoker's wire types, generated from `stoker/v1/*.proto` (package `stoker.v1`).
//!
//! The job spec fixes everything a batch depends on; the batch carries named tensors plus the
//! epoch, rank, step, sample indices and stage timings that produced it. `bytes` fields are
//! [`bytes::Bytes`], so tensors move without copies.
//!
//! ```
//! use stoker_proto::v1::{JobSpec, DatasetSource};
//! let spec = JobSpec {
//!     dataset: Some(DatasetSource { uri: "data/train".into(), ..Default::default() }),
//!     batch_size: 64,
//!     ..Default::default()
//! };
//! assert_eq!(spec.batch_size, 64);
//! ```

/// Version 1 of the Stoker protocol.
#[allow(missing_docs, clippy::doc_lazy_continuation)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/stoker.v1.rs"));
}
