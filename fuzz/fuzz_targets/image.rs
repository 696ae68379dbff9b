//! Fuzz target `image`: see `stoker_pipeline::fuzz_targets::image`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    stoker_pipeline::fuzz_targets::image(data);
});
