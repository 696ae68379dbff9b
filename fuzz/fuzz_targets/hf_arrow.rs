//! Fuzz target `hf_arrow`: see `stoker_datasets::fuzz_targets::hf_arrow`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    stoker_datasets::fuzz_targets::hf_arrow(data, stoker_fuzz::scratch()).expect("scratch folder");
});
