//! Fuzz target `job_spec`: see `stoker_pipeline::fuzz_targets::job_spec`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    stoker_pipeline::fuzz_targets::job_spec(data);
});
