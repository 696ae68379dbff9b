//! The verdict the page, the JSON API and `/metrics` give a job: what holds it back, in words.

use serde::Serialize;

/// What holds a job back, in words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(into = "String")]
pub enum Verdict {
    /// Too little data yet.
    Starting,
    /// No batches were taken over the window and the trainer waited for less than half of it
    /// (the run ended or the trainer paused).
    Idle,
    /// The trainer waited more than 5% of the time; the named stage costs the most ("no batch
    /// built" when no batch was built over the window).
    InputBound(&'static str),
    /// The trainer waited more than 5% of the time while the decode threads were busy less
    /// than half of theirs: the wait is elsewhere (batches handed over one by one, the wire, a
    /// remote worker, the GPU decode lane), not in a stage of theirs.
    NotTheDecodeThreads,
    /// The trainer waited more than 5% of the time, mostly for the first batch of an epoch.
    EpochBoundary,
    /// The GPU decode lane's work beside the training step cost the consumer's GPU stream more
    /// than 5% of its time, and more than the trainer waited: no wait in `next()` shows it.
    LaneBeside,
    /// The trainer waited between 1% and 5% of the time.
    Balanced,
    /// The trainer waited less than 1% of the time.
    ComputeBound,
    /// A remote client has sent no report for this many seconds: it stopped reading, ended,
    /// or cannot reach the coordinator (whose figures cannot tell which).
    Silent(u64),
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Starting => f.write_str("starting"),
            Self::Idle => f.write_str("idle"),
            Self::InputBound(stage) => write!(f, "input-bound: {stage}"),
            Self::NotTheDecodeThreads => {
                f.write_str("input-bound: not the decode threads (mostly idle)")
            }
            Self::EpochBoundary => f.write_str("input-bound: epoch boundary"),
            Self::LaneBeside => f.write_str("input-bound: GPU decode beside the step"),
            Self::Balanced => f.write_str("balanced"),
            Self::ComputeBound => f.write_str("compute-bound"),
            Self::Silent(seconds) => write!(
                f,
                "no report for {seconds} s: the client stopped reading, ended, or cannot reach \
                 the coordinator"
            ),
        }
    }
}

impl Verdict {
    /// The verdict as `/metrics` labels it: as said, but one value for every silent spell.
    pub(crate) fn label(&self) -> String {
        match self {
            Self::Silent(_) => "silent".to_string(),
            other => other.to_string(),
        }
    }
}

impl From<Verdict> for String {
    fn from(verdict: Verdict) -> Self {
        verdict.to_string()
    }
}
