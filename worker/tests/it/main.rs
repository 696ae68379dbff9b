//! The worker crate's integration tests, one binary: `ops` checks the image ops against
//! torchvision's outputs (`tests/fixtures/`) and the pipeline's checks; `plan` holds the
//! property tests of the epoch planner.

mod ops;
mod plan;
