//! What the criterion benches share: their run lengths.

use std::time::Duration;

use criterion::Criterion;

/// Short runs: one second of warm-up, three of measurement, 20 samples. A 2-core machine runs
/// the whole suite in a few minutes with these; the decoders and resizers measured take well
/// under a millisecond an image, so each sample still averages hundreds of iterations, and the
/// per-image spread of the set dominates the noise long before more samples would help.
pub fn short_runs() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
}
