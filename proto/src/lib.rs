//! Stoker's wire types, generated from `stoker/v1/*.proto` (package `stoker.v1`).
//!
//! The job spec fixes everything a batch depends on; the batch carries named tensors plus the
//! epoch, rank, step, sample indices and stage timings that produced it. `bytes` fields are
//! [`bytes::Bytes`], so tensors move without copies.
//!
//! The pipeline op language is the `Op` oneof of `job.proto`, and nothing else lists it:
//! [`op_schema`] reads the ops, their fields and comments from the embedded descriptor set, and
//! [`build_op`] builds an op by name from loosely typed values (the Python client's path).
//! [`elements()`] reads a tensor's bytes back as numbers of its dtype. [`ErrorKind`]
//! is the kind every error travels with, in process and over gRPC.
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

mod elements;
mod error_kind;
mod schema;

pub use elements::{elements, Element};
pub use error_kind::{ErrorKind, ERROR_KINDS};

pub use schema::{
    build_op, find_op, op_schema, EnumSchema, EnumValue, FieldKind, FieldSchema, OpSchema, Value,
    FILE_DESCRIPTOR_SET,
};

/// What can go wrong building an op from the schema.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The embedded descriptor set cannot be read (a build problem, not an input one).
    #[error("the embedded stoker.v1 descriptor set is unusable: {0}")]
    Descriptor(String),
    /// No op has this name.
    #[error("unknown op {name:?}; the ops are: {known}")]
    UnknownOp {
        /// The name asked for.
        name: String,
        /// The ops there are.
        known: String,
    },
    /// The op has no field of this name.
    #[error("{op} has no argument {field:?}; its fields are: {known}")]
    UnknownField {
        /// The op's message name.
        op: String,
        /// The field asked for.
        field: String,
        /// The fields there are.
        known: String,
    },
    /// A value does not fit its field's type.
    #[error("{op} {field} {problem}")]
    BadValue {
        /// The op's message name.
        op: String,
        /// The field.
        field: String,
        /// What is wrong, with the value.
        problem: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Version 1 of the Stoker protocol.
#[allow(missing_docs, clippy::doc_lazy_continuation)]
pub mod v1 {
    #[cfg(feature = "grpc")]
    include!(concat!(env!("OUT_DIR"), "/grpc/stoker.v1.rs"));
    #[cfg(not(feature = "grpc"))]
    include!(concat!(env!("OUT_DIR"), "/messages/stoker.v1.rs"));
}
