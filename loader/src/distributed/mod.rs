//! Distributed mode: the coordinator daemon, the worker daemon and the client that reads from
//! them, over gRPC (`stoker.v1.Coordinator`, `stoker.v1.WorkerData`).
//!
//! Control messages go to the coordinator; batches go from a worker straight to the client, on a
//! stream the client opened, against credits the client granted. See `../shared/DESIGN.md`
//! ("Data plane and control plane") for the contract and each module for its part.

mod client;
mod coordinator_service;
pub mod transport;
mod worker_daemon;

pub use client::{RemoteEpochStream, RemoteLoader, RemoteOptions};
pub use coordinator_service::{
    ClientEntry, CoordinatorService, CoordinatorServiceConfig, WorkerEntry,
};
pub use worker_daemon::{canonical_roots, run_worker, WorkerConfig, SUBSCRIBE_WAIT};
