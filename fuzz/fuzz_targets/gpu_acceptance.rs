//! Fuzz target `gpu_acceptance`: see `stoker_loader::fuzz_targets::gpu_acceptance`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    stoker_loader::fuzz_targets::gpu_acceptance(data);
});
