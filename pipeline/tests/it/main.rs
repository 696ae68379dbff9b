//! The worker crate's integration tests, one binary: `ops` checks the image ops against
//! torchvision's outputs (`tests/fixtures/`) and the pipeline's checks; `plan` holds the
//! property tests of the epoch planner; `fuzz_replay` replays the committed fuzz inputs of the
//! image, tokenizer, job-spec and job-plan targets; `mix` checks a mixed job's read-ahead hints;
//! `divert` the images set aside for another decoder; `formats` the image formats beside JPEG
//! and PNG, and CMYK/YCCK JPEGs, each decoded back to the pixels written.

mod divert;
mod formats;
mod fuzz_replay;
mod mix;
mod ops;
mod plan;
