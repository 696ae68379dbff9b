//! Fuzz target `megatron_index`: see `stoker_datasets::fuzz_targets::megatron_index`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    stoker_datasets::fuzz_targets::megatron_index(data);
});
