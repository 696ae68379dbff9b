//! The worker daemon of the distributed mode (`stoker-worker`): it registers with the
//! coordinator, leases tasks (one task is one batch), builds them with the same
//! [`Job`](stoker_pipeline::Job) as the embedded loader and streams them to the client that owns
//! the session, against the credits that client granted. The wire it speaks is `stoker-rpc`'s.
//! See the repository's `ARCHITECTURE.md` ("Data plane and control plane") for the contract.

mod client_stream;
mod worker_daemon;

pub use worker_daemon::{
    canonical_roots, run_worker, run_worker_incoming, WorkerConfig, DELIVERY_TIMEOUT,
    DRAIN_TIMEOUT, JOB_IDLE,
};
