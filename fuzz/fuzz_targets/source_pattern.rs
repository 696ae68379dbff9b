//! Fuzz target `source_pattern`: see `stoker_datasets::fuzz_targets::source_pattern`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    stoker_datasets::fuzz_targets::source_pattern(data, stoker_fuzz::scratch())
        .expect("scratch folder");
});
