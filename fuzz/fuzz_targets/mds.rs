//! Fuzz target `mds`: see `stoker_datasets::fuzz_targets::mds`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    stoker_datasets::fuzz_targets::mds(data, stoker_fuzz::scratch()).expect("scratch folder");
});
