//! Fuzz target `parquet_ranged`: see `stoker_datasets::fuzz_targets::parquet_ranged`. Panics
//! the Parquet decoder's containment turns into errors unwind; any other aborts (see the
//! `parquet` target).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(
    init: stoker_datasets::fuzz_targets::let_contained_panics_unwind(),
    |data: &[u8]| {
        stoker_datasets::fuzz_targets::parquet_ranged(data);
    }
);
