//! The bad-input policy, sample by sample: under `skip` a sample that cannot be read or decoded
//! is replaced by the first readable one of its [`substitute_offsets`] in dataset order
//! (deterministic, the batch keeps its shape) and reported; under `fail` it is an error naming
//! the sample. Bad samples are counted and logged at a bounded rate. A read that failed for another reason than the sample's own
//! bytes (see `source_reads`) is an error under both policies, never a bad sample.

use std::sync::atomic::Ordering;

use stoker_proto::v1::{self as proto, BadSamplePolicy};

use super::source_reads::AttemptError;
use super::BatchAssembler;
use crate::error::{Error, Result, SampleError};
use crate::pipeline::SampleTimings;

/// How many following samples the skip policy tries one by one, before it looks further on.
pub const MAX_SUBSTITUTE_TRIES: u64 = 16;

/// The offsets from a bad sample, in a dataset of `len`, of the samples tried in its place, in
/// turn: the next [`MAX_SUBSTITUTE_TRIES`], then 32, 64, 128... on (wrapping round the end)
/// while below `len`, so a run of bad files longer than the next few (a folder's AppleDouble
/// `._*` copies, sorted ahead of the images they describe) is passed over, in a few more
/// tries, rather than ending the run. A dataset of 33 samples or fewer has every other sample
/// tried.
pub fn substitute_offsets(len: u64) -> impl Iterator<Item = u64> {
    let others = len.saturating_sub(1);
    let near = if others <= 2 * MAX_SUBSTITUTE_TRIES {
        1..=others
    } else {
        1..=MAX_SUBSTITUTE_TRIES
    };
    let far = std::iter::successors(Some(2 * MAX_SUBSTITUTE_TRIES), |offset| {
        offset.checked_mul(2)
    })
    .take_while(move |offset| others > 2 * MAX_SUBSTITUTE_TRIES && *offset < len);
    near.chain(far)
}

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
    /// batch keeps its shape and stays deterministic. A source failure (of the sample or of a
    /// substitute) ends the batch with that error.
    pub(super) fn with_policy<T>(
        &self,
        index: u64,
        mut attempt: impl FnMut(u64, &mut SampleTimings) -> std::result::Result<T, AttemptError>,
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
            Err(AttemptError::Sample(error)) => error,
            Err(AttemptError::Source(error)) => return Err(self.source_failed(index, error)),
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
        let mut tried = 0u64;
        for offset in substitute_offsets(len) {
            tried += 1;
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
                Err(AttemptError::Sample(error)) => {
                    let substitute_path = self.source.describe(substitute);
                    self.note_bad_sample(substitute, &substitute_path, &error);
                }
                Err(AttemptError::Source(error)) => {
                    return Err(self.source_failed(substitute, error))
                }
            }
        }
        Err(Error::BadSample {
            index,
            path,
            reason: format!(
                "{first_error}; and none of the {tried} samples tried after it (the next \
                 {MAX_SUBSTITUTE_TRIES}, then 32, 64, 128... on) could replace it"
            ),
        })
    }

    /// The error for a read of sample `index` that failed through no fault of the sample.
    fn source_failed(&self, index: u64, error: stoker_datasets::Error) -> Error {
        tracing::error!(
            index,
            sample = %self.source.describe(index),
            %error,
            "reading from the data source failed through no fault of the sample"
        );
        Error::Dataset(error)
    }

    fn note_bad_sample(&self, index: u64, path: &str, error: &SampleError) {
        let seen = self.bad_samples_seen.fetch_add(1, Ordering::Relaxed) + 1;
        if seen <= BAD_SAMPLE_LOG_FIRST || seen % BAD_SAMPLE_LOG_EVERY == 0 {
            tracing::warn!(index, path, reason = %error, bad_samples = seen, "bad sample");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use stoker_datasets::{SampleSource, TokenDtype, TokenWindowShape};

    use super::*;
    use crate::batch::BatchKey;
    use crate::job_pipeline::JobPipeline;

    /// `len` token windows of 2 + 1 uint16 tokens, each filled with its index; a window for
    /// which `fails` gives an OS error code cannot be read, with that error.
    struct Windows {
        len: u64,
        fails: fn(u64) -> Option<i32>,
    }

    impl SampleSource for Windows {
        fn len(&self) -> u64 {
            self.len
        }
        fn label(&self, _index: u64) -> i64 {
            0
        }
        fn describe(&self, index: u64) -> String {
            format!("window {index}")
        }
        fn read(&self, index: u64) -> stoker_datasets::Result<Vec<u8>> {
            match (self.fails)(index) {
                Some(code) => Err(stoker_datasets::Error::Io {
                    path: format!("tokens.bin:{index}").into(),
                    source: std::io::Error::from_raw_os_error(code),
                }),
                None => Ok([index as u8, 0].repeat(3)),
            }
        }
        fn class_names(&self) -> &[String] {
            &[]
        }
        fn token_windows(&self) -> Option<TokenWindowShape> {
            Some(TokenWindowShape {
                dtype: TokenDtype::Uint16,
                seq_len: 2,
            })
        }
    }

    /// The skip policy's assembler over `windows`.
    fn assembler_of(windows: Windows) -> BatchAssembler {
        BatchAssembler::new(
            Arc::new(windows),
            JobPipeline::TokenWindows {
                seq_len: 2,
                documents: false,
            },
            1,
            BadSamplePolicy::Skip,
        )
        .unwrap()
    }

    /// 10 windows: sample 3 cannot be read for lack of descriptors, samples 2 and 5 are
    /// missing (their own fault).
    fn assembler() -> BatchAssembler {
        assembler_of(Windows {
            len: 10,
            fails: |index| match index {
                3 => Some(libc::EMFILE),
                2 | 5 => Some(libc::ENOENT),
                _ => None,
            },
        })
    }

    const KEY: BatchKey = BatchKey {
        epoch: 0,
        rank: 0,
        step: 0,
    };

    #[test]
    fn a_sample_missing_by_its_own_fault_is_replaced() {
        let assembler = assembler();
        let batch = assembler.assemble(KEY, &[0, 5]).unwrap();
        assert_eq!(batch.bad_samples.len(), 1);
        assert_eq!(batch.bad_samples[0].substitute_index, 6);
        assert_eq!(assembler.bad_samples_seen(), 1);
    }

    #[test]
    fn substitutes_are_the_next_sixteen_then_ever_further_on() {
        let offsets = |len| substitute_offsets(len).collect::<Vec<u64>>();
        assert_eq!(offsets(1), Vec::<u64>::new());
        assert_eq!(offsets(10), (1..10).collect::<Vec<u64>>());
        // Up to 33 samples, every other one (a run of 17 bad of 30 ended the run).
        assert_eq!(offsets(30), (1..30).collect::<Vec<u64>>());
        assert_eq!(offsets(33), (1..33).collect::<Vec<u64>>());
        let mut expected: Vec<u64> = (1..=16).collect();
        expected.extend([32, 64]);
        assert_eq!(offsets(100), expected);
        assert_eq!(substitute_offsets(u64::MAX).count(), 16 + 59);
    }

    /// A run of 41 bad samples ended the run under skip: none of the next 16 could replace
    /// the first of them (100 windows, the first 41 missing by their own fault, as a folder's
    /// `._*` copies sort ahead of its images).
    #[test]
    fn a_run_of_bad_samples_longer_than_sixteen_is_passed_over() {
        let assembler = assembler_of(Windows {
            len: 100,
            fails: |index| (index <= 40).then_some(libc::ENOENT),
        });
        let batch = assembler.assemble(KEY, &[0, 30, 40, 41]).unwrap();
        let substitutes: Vec<(u64, u64)> = batch
            .bad_samples
            .iter()
            .map(|bad| (bad.sample_index, bad.substitute_index))
            .collect();
        // 0: 1..=16 and 32 bad, 64 good; 30: 31..=40 bad, 41 good; 40: 41.
        assert_eq!(substitutes, [(0, 64), (30, 41), (40, 41)]);
    }

    #[test]
    fn running_out_of_descriptors_fails_the_batch_and_replaces_nothing() {
        let assembler = assembler();
        let error = assembler.assemble(KEY, &[0, 3, 4]).unwrap_err();
        assert!(matches!(error, Error::Dataset(_)), "{error}");
        assert!(error.to_string().contains("tokens.bin:3"), "{error}");
        assert_eq!(assembler.bad_samples_seen(), 0);
        // Nor does it stand in as a substitute's failure: 2 is bad, its substitute 3 cannot
        // be read for lack of descriptors, so the batch fails rather than trying 4.
        let error = assembler.assemble(KEY, &[2]).unwrap_err();
        assert!(matches!(error, Error::Dataset(_)), "{error}");
        assert_eq!(assembler.bad_samples_seen(), 1, "only 2 itself is bad");
    }
}
