//! The bench harnesses `stoker bench` runs, as a library below the command line (which only
//! parses their settings and calls them): the end-to-end pipeline ([`pipeline`]), the prefetch
//! controller's stall under simulated training loops ([`stall`]), the coordinator core's
//! assignment rate ([`coordinator`]) and the whole path to a coordinator process over gRPC
//! ([`coordinator_grpc`]), the gRPC transport's streaming rate ([`transport`],
//! plaintext and TLS; [`certificates`] writes the throwaway certificates it and the TLS tests
//! use), the distributed mode under faults for a long time ([`soak`]) and the CPU per sample of
//! peers' formats beside Stoker's own ([`formats`]).
//! Each prints its report, as text or as one JSON object.
//!
//! They are measuring tools, not part of the loader: only `stoker bench` and the tests use them.

pub mod certificates;
pub mod coordinator;
pub mod coordinator_grpc;
pub mod formats;
pub mod pipeline;
mod resources;
pub mod soak;
pub mod stall;
pub mod transport;

/// Why a bench could not run or finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is out of range; the message names it.
    #[error("{0}")]
    InvalidArgument(String),
    /// The run went wrong in a way its checks caught; the message says how.
    #[error("{0}")]
    Failed(String),
    /// The loader failed.
    #[error(transparent)]
    Loader(#[from] stoker_loader::Error),
    /// Opening or building a job failed, or the security settings are unusable.
    #[error(transparent)]
    Worker(#[from] stoker_pipeline::Error),
    /// A token is not usable.
    #[error(transparent)]
    Security(#[from] stoker_rpc::security::SecurityError),
    /// An address no channel can be made to.
    #[error(transparent)]
    Address(#[from] stoker_rpc::transport::BadAddress),
    /// The coordinator core refused a call.
    #[error(transparent)]
    Coordinator(#[from] stoker_coordinator::CoordinatorError),
    /// A system call failed (threads, sockets, temporary files).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The gRPC transport failed.
    #[error(transparent)]
    Transport(#[from] tonic::transport::Error),
    /// A gRPC call failed.
    #[error(transparent)]
    Status(Box<tonic::Status>),
    /// The test image could not be encoded.
    #[error(transparent)]
    Png(#[from] png::EncodingError),
    /// A report could not be written as JSON.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

impl From<tonic::Status> for Error {
    fn from(status: tonic::Status) -> Self {
        Error::Status(Box::new(status))
    }
}

/// Result alias for the bench harnesses.
pub type Result<T> = std::result::Result<T, Error>;
