//! Fuzz target `tar_shards`: see `stoker_datasets::fuzz_targets::tar_shards`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    stoker_datasets::fuzz_targets::tar_shards(data, stoker_fuzz::scratch())
        .expect("scratch folder");
});
