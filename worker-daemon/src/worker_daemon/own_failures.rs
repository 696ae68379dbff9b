//! A worker's batch builds that failed on its own storage or machine (its disk or mount, the
//! store refusing or not answering it): how each build ended, what that means for its job's
//! next tries here, and how many times one step goes back before its client is told.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use stoker_proto::v1::TaskLease;

use super::lock;
use super::opening::OpenBackoff;

/// How serving one task ended.
pub(super) enum BuildEnd {
    /// Built, and on its way to the client.
    Built,
    /// Its error went to the client (a bad sample under the fail policy, a panic).
    Told,
    /// Handed back for another worker, for a cause of this worker's own.
    HandedBack(String),
    /// Handed back: the drain's time is up.
    Stopping,
    /// Not built: its client's stream is gone.
    Unclaimed,
}

/// What a build's end means for the job's next tries on this worker: a failure of its own
/// spaces them as a failed opening does (its next tasks go back untried meanwhile), a batch
/// built ends the spacing.
pub(super) fn note_build(backoff: &mut OpenBackoff, job: u64, end: BuildEnd) {
    match end {
        BuildEnd::HandedBack(reason) => {
            let pause = backoff.failed(job, Instant::now(), &reason);
            tracing::warn!(
                job,
                %reason,
                ?pause,
                "a batch failed on this worker's own storage or machine: it goes back for \
                 another worker, and the job's tasks go back untried until the next try"
            );
        }
        BuildEnd::Built => backoff.opened(job),
        BuildEnd::Told | BuildEnd::Stopping | BuildEnd::Unclaimed => {}
    }
}

/// A step of a job's epoch, for one rank.
type StepKey = (u64, u64, u32, u64);

/// How many times this worker hands one step back for a failure of its own before it tells
/// the client: a failure every worker meets (one worker, a file server failing for all, a
/// store refusing every node) reaches the client after a few spaced tries rather than at its
/// deadline, and one worker's fault leaves the step to the others meanwhile.
pub(super) const OWN_FAILURES_PER_STEP: u32 = 3;

/// The most steps [`OwnFailures`] remembers: past it, it starts over.
const OWN_FAILURES_KEPT: usize = 4096;

/// The steps whose builds failed on this worker's own storage or machine, with how many times.
#[derive(Default)]
pub(super) struct OwnFailures(Mutex<HashMap<StepKey, u32>>);

impl OwnFailures {
    /// Whether `task`'s step, failed on this worker's own storage or machine, goes back once
    /// more (counted), or has failed here [`OWN_FAILURES_PER_STEP`] times and its error goes
    /// to the client.
    pub(super) fn hand_back_again(&self, task: &TaskLease) -> bool {
        let key = (task.job_id, task.epoch, task.rank, task.step);
        let mut failures = lock(&self.0);
        if failures.len() >= OWN_FAILURES_KEPT && !failures.contains_key(&key) {
            failures.clear();
        }
        let tries = failures.entry(key).or_insert(0);
        *tries += 1;
        if *tries < OWN_FAILURES_PER_STEP {
            return true;
        }
        failures.remove(&key);
        false
    }
}
