//! Fuzz target `hf_arrow`: see `stoker_datasets::fuzz_targets::hf_arrow`. Panics the Arrow IPC
//! decoder's containment turns into errors unwind; any other aborts (see the `parquet` target).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(
    init: stoker_datasets::fuzz_targets::let_contained_panics_unwind(),
    |data: &[u8]| {
        stoker_datasets::fuzz_targets::hf_arrow(data, stoker_fuzz::scratch()).expect("scratch folder");
    }
);
