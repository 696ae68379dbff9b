//! Fuzz target `tokenizer`: see `stoker_pipeline::fuzz_targets::tokenizer`.
//!
//! `TextTokenizer::load` runs the tokenizers crate's parser under `catch_unwind` (it panics on
//! some malformed files, and the load turns that into an error). libFuzzer's panic hook aborts
//! on every panic, caught or not, so this target puts the default hook back, as `parquet.rs`
//! does: a panic that escapes the target still aborts.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(
    init: {
        drop(std::panic::take_hook());
    },
    |data: &[u8]| {
        stoker_pipeline::fuzz_targets::tokenizer(data, stoker_fuzz::scratch()).expect("scratch folder");
    }
);
