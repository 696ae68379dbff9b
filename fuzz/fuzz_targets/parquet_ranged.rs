//! Fuzz target `parquet_ranged`: see `stoker_datasets::fuzz_targets::parquet_ranged`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    stoker_datasets::fuzz_targets::parquet_ranged(data);
});
