//! The worker crate's integration tests, one binary: `ops` checks the image ops against
//! torchvision's outputs (`tests/fixtures/`) and the pipeline's checks; `plan` holds the
//! property tests of the epoch planner; `daemon` runs the `stoker-worker` binary.

mod daemon;
mod ops;
mod plan;
