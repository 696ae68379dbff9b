//! Fuzz target `job_plan`: see `stoker_pipeline::fuzz_targets::job_plan`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = stoker_pipeline::fuzz_targets::job_plan(data);
});
