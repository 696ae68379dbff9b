//! The worker daemon crate's integration tests, one binary: `daemon` runs the `stoker-worker`
//! binary as a user does (its help, its logs). The daemon serving real clients is tested from
//! the `stoker` CLI crate's tests, beside the coordinator.

mod daemon;
