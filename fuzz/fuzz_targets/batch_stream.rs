//! Fuzz target `batch_stream`: see `stoker_rpc::fuzz_targets::batch_stream`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    stoker_rpc::fuzz_targets::batch_stream(data);
});
