//! The worker crate's integration tests, one binary: `ops` checks the image ops against
//! torchvision's outputs (`tests/fixtures/`) and the pipeline's checks; `plan` holds the
//! property tests of the epoch planner; `daemon` runs the `stoker-worker` binary; `fuzz_replay`
//! replays the committed fuzz inputs of the image, tokenizer and job-spec targets; `mix` checks
//! a mixed job's read-ahead hints.

mod daemon;
mod divert;
mod fuzz_replay;
mod mix;
mod ops;
mod plan;
