//! Fuzz target `jsonl`: see `stoker_datasets::fuzz_targets::jsonl`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    stoker_datasets::fuzz_targets::jsonl(data, stoker_fuzz::scratch()).expect("scratch folder");
});
