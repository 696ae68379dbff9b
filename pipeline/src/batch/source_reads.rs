//! Reading from the data source on behalf of the bad-input policy: only a sample's own bytes
//! being wrong makes it a bad sample. A read that fails because the process or the machine ran
//! short (out of descriptors or memory: `EMFILE`, `ENFILE`, `ENOMEM`...) is tried again after a
//! pause that doubles, a bounded number of times; one that fails because the storage or the
//! dataset failed as a whole (`EIO`, a full or stale file system, a file changed under the job)
//! is raised at once. Neither is ever replaced by a substitute.

use std::time::Duration;

use stoker_datasets::ReadFault;

use crate::error::SampleError;

/// Attempts at a read that keeps failing for lack of resources (the first one included).
const RESOURCE_ATTEMPTS: u32 = 8;
/// The pause after the first such failure; it doubles up to [`MAX_RESOURCE_PAUSE`]
/// (about 1.5 s over all attempts).
const FIRST_RESOURCE_PAUSE: Duration = Duration::from_millis(5);
const MAX_RESOURCE_PAUSE: Duration = Duration::from_millis(500);

/// Why one attempt at a sample failed.
#[derive(Debug)]
pub(super) enum AttemptError {
    /// The sample itself is bad: the policy decides.
    Sample(SampleError),
    /// The source failed (resources, storage, a changed file): never a bad sample.
    Source(stoker_datasets::Error),
}

impl From<SampleError> for AttemptError {
    fn from(error: SampleError) -> Self {
        AttemptError::Sample(error)
    }
}

/// Runs `read`, retrying resource failures with backoff, and sorts its failure.
pub(super) fn read_from_source<T>(
    mut read: impl FnMut() -> stoker_datasets::Result<T>,
) -> Result<T, AttemptError> {
    let mut pause = FIRST_RESOURCE_PAUSE;
    let mut attempt = 1;
    loop {
        let error = match read() {
            Ok(value) => return Ok(value),
            Err(error) => error,
        };
        match error.read_fault() {
            ReadFault::Sample => {
                return Err(AttemptError::Sample(SampleError::Unreadable(
                    error.to_string(),
                )))
            }
            ReadFault::Source => return Err(AttemptError::Source(error)),
            ReadFault::Resource if attempt >= RESOURCE_ATTEMPTS => {
                tracing::warn!(%error, attempts = attempt, "read kept failing for lack of resources; giving up");
                return Err(AttemptError::Source(error));
            }
            ReadFault::Resource => {
                tracing::debug!(%error, attempt, pause_ms = pause.as_millis() as u64, "read failed for lack of resources; retrying");
                std::thread::sleep(pause);
                pause = (pause * 2).min(MAX_RESOURCE_PAUSE);
                attempt += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(code: i32) -> stoker_datasets::Error {
        stoker_datasets::Error::Io {
            path: "/data/shard-7.tar".into(),
            source: std::io::Error::from_raw_os_error(code),
        }
    }

    #[test]
    fn resource_failures_are_retried_until_they_pass() {
        let mut calls = 0;
        let value = read_from_source(|| {
            calls += 1;
            if calls < 3 {
                Err(failure(libc::EMFILE))
            } else {
                Ok(calls)
            }
        })
        .unwrap();
        assert_eq!(value, 3);
    }

    #[test]
    fn resource_failures_that_persist_end_as_source_errors_after_bounded_tries() {
        let mut calls = 0;
        let started = std::time::Instant::now();
        let error = read_from_source(|| -> stoker_datasets::Result<()> {
            calls += 1;
            Err(failure(libc::ENFILE))
        })
        .unwrap_err();
        assert_eq!(calls, RESOURCE_ATTEMPTS);
        assert!(started.elapsed() < Duration::from_secs(5));
        match error {
            AttemptError::Source(error) => assert!(error.to_string().contains("shard-7.tar")),
            AttemptError::Sample(error) => panic!("became a bad sample: {error}"),
        }
    }

    #[test]
    fn storage_failures_are_raised_at_once_and_sample_faults_go_to_the_policy() {
        let mut calls = 0;
        let error = read_from_source(|| -> stoker_datasets::Result<()> {
            calls += 1;
            Err(failure(libc::EIO))
        })
        .unwrap_err();
        assert_eq!(calls, 1);
        assert!(matches!(error, AttemptError::Source(_)));
        let error =
            read_from_source(|| -> stoker_datasets::Result<()> { Err(failure(libc::ENOENT)) })
                .unwrap_err();
        assert!(matches!(
            error,
            AttemptError::Sample(SampleError::Unreadable(_))
        ));
    }
}
