//! Fuzz target `parquet`: see `stoker_datasets::fuzz_targets::parquet`.
//!
//! The Parquet decoder runs inside `without_panics` (the parquet and arrow crates panic on some
//! damaged files, and the open or the read turns that into an error). libFuzzer's panic hook
//! aborts on every panic, caught or not, so `init` keeps it for every panic but those
//! (`let_contained_panics_unwind`): any other panic still aborts.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(
    init: stoker_datasets::fuzz_targets::let_contained_panics_unwind(),
    |data: &[u8]| {
        stoker_datasets::fuzz_targets::parquet(data, stoker_fuzz::scratch()).expect("scratch folder");
    }
);
