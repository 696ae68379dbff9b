//! Fuzz target `token_file`: see `stoker_datasets::fuzz_targets::token_file`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    stoker_datasets::fuzz_targets::token_file(data, stoker_fuzz::scratch())
        .expect("scratch folder");
});
