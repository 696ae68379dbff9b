//! Fuzz target `jsonl_compressed`: see `stoker_datasets::fuzz_targets::jsonl_compressed`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    stoker_datasets::fuzz_targets::jsonl_compressed(data, stoker_fuzz::scratch())
        .expect("scratch folder");
});
