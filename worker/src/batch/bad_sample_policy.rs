//! The bad-input policy, sample by sample: under `skip` a sample that cannot be read or decoded
//! is replaced by the next readable one in dataset order (deterministic, the batch keeps its
//! shape) and reported; under `fail` it is an error naming the sample. Bad samples are counted
//! and logged at a bounded rate.

use std::sync::atomic::Ordering;

use stoker_proto::v1::{self as proto, BadSamplePolicy};

use super::BatchAssembler;
use crate::error::{Error, Result, SampleError};
use crate::pipeline::SampleTimings;

/// How many following samples the skip policy tries before giving up on a slot.
pub const MAX_SUBSTITUTE_TRIES: u64 = 16;

/// Log the first few bad samples in full, then one in this many.
const BAD_SAMPLE_LOG_EVERY: u64 = 1000;
const BAD_SAMPLE_LOG_FIRST: u64 = 20;

/// One sample's result after the bad-input policy.
pub(super) struct SampleOutcome<T> {
    pub(super) value: T,
    /// The dataset index actually used (the substitute's for a replaced sample).
    pub(super) used: u64,
    pub(super) timings: SampleTimings,
    pub(super) bad: Option<proto::BadSample>,
}

impl BatchAssembler {
    /// Runs `attempt` on sample `index`; under the skip policy a failed sample is replaced by
    /// the next readable one in dataset order (the attempt is told which index to read), so the
    /// batch keeps its shape and stays deterministic.
    pub(super) fn with_policy<T>(
        &self,
        index: u64,
        mut attempt: impl FnMut(u64, &mut SampleTimings) -> std::result::Result<T, SampleError>,
    ) -> Result<SampleOutcome<T>> {
        let mut timings = SampleTimings::default();
        let first_error = match attempt(index, &mut timings) {
            Ok(value) => {
                return Ok(SampleOutcome {
                    value,
                    used: index,
                    timings,
                    bad: None,
                })
            }
            Err(error) => error,
        };
        let path = self.source.describe(index);
        self.note_bad_sample(index, &path, &first_error);
        if self.policy == BadSamplePolicy::Fail {
            return Err(Error::BadSample {
                index,
                path,
                reason: first_error.to_string(),
            });
        }
        let len = self.source.len();
        for offset in 1..=MAX_SUBSTITUTE_TRIES.min(len.saturating_sub(1)) {
            let substitute = (index + offset) % len;
            match attempt(substitute, &mut timings) {
                Ok(value) => {
                    return Ok(SampleOutcome {
                        value,
                        used: substitute,
                        timings,
                        bad: Some(proto::BadSample {
                            sample_index: index,
                            path,
                            reason: first_error.to_string(),
                            substitute_index: substitute,
                        }),
                    })
                }
                Err(error) => {
                    let substitute_path = self.source.describe(substitute);
                    self.note_bad_sample(substitute, &substitute_path, &error);
                }
            }
        }
        Err(Error::BadSample {
            index,
            path,
            reason: format!(
                "{first_error}; and none of the next {MAX_SUBSTITUTE_TRIES} samples could replace it"
            ),
        })
    }

    fn note_bad_sample(&self, index: u64, path: &str, error: &SampleError) {
        let seen = self.bad_samples_seen.fetch_add(1, Ordering::Relaxed) + 1;
        if seen <= BAD_SAMPLE_LOG_FIRST || seen % BAD_SAMPLE_LOG_EVERY == 0 {
            tracing::warn!(index, path, reason = %error, bad_samples = seen, "bad sample");
        }
    }
}
