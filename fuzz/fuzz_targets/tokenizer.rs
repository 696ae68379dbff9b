//! Fuzz target `tokenizer`: see `stoker_worker::fuzz_targets::tokenizer`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    stoker_worker::fuzz_targets::tokenizer(data, stoker_fuzz::scratch()).expect("scratch folder");
});
