//! Fuzz target `parquet`: see `stoker_datasets::fuzz_targets::parquet`.
//!
//! The Parquet footer reader runs under `catch_unwind` in `ParquetDataset::open` (the parquet
//! crate panics on some damaged footers, and the open turns that into an error). libFuzzer's
//! panic hook aborts on every panic, caught or not, so this target puts the default hook back:
//! a panic that escapes the target still aborts (libfuzzer-sys catches it and aborts), a panic
//! the code under test handles does not.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(
    init: {
        drop(std::panic::take_hook());
    },
    |data: &[u8]| {
        stoker_datasets::fuzz_targets::parquet(data, stoker_fuzz::scratch()).expect("scratch folder");
    }
);
