//! Distributed mode, the coordinator's side: its daemon over gRPC (`stoker.v1.Coordinator`).
//! The worker daemon and the transport settings live in `stoker-worker` (`stoker_worker::daemon`);
//! the client that reads from the workers is the remote batch source, `crate::client::remote`.
//!
//! Control messages go to the coordinator; batches go from a worker straight to the client, on a
//! stream the client opened, against credits the client granted. See `../shared/DESIGN.md`
//! ("Data plane and control plane") for the contract and each module for its part.

mod client_reports;
mod coordinator_service;
mod coordinator_status;

pub use coordinator_service::{
    ClientEntry, CoordinatorService, CoordinatorServiceConfig, WorkerEntry,
};
