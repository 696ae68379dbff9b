//! The RPC crate's integration tests, one binary: `fuzz_replay` replays the committed inputs of
//! the `batch_stream` fuzz target.

mod fuzz_replay;
