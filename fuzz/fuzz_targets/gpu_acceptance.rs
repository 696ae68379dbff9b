//! Fuzz target `gpu_acceptance`: see `stoker_gpu::fuzz_targets::gpu_acceptance`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    stoker_gpu::fuzz_targets::gpu_acceptance(data);
});
