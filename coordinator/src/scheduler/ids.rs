//! Identifier newtypes of the coordinator: jobs, workers, sessions, leases, steps, and the task
//! key that names one batch.

use std::fmt;

/// A job registered with the coordinator (journaled; survives restarts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(pub u64);

/// A worker registered with the coordinator (not journaled: workers re-register after a restart).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerId(pub u64);

/// An open session: one client consuming one (job, rank, epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

/// One step of a rank's epoch; a step is one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Step(pub u64);

/// A lease of one task to one worker. Ids of finished leases are never reused: a late completion
/// of an expired lease is recognised as stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(pub u64);

/// One task, that is one batch: a pure function of (job spec, epoch, rank, step).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskKey {
    /// The job whose spec defines the batch.
    pub job: JobId,
    /// Epoch of the batch.
    pub epoch: u64,
    /// Rank the batch belongs to.
    pub rank: u32,
    /// Step of that rank's epoch.
    pub step: Step,
}

macro_rules! display_id {
    ($($name:ident => $prefix:literal),* $(,)?) => {$(
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    )*};
}

display_id!(JobId => "job ", WorkerId => "worker ", SessionId => "session ", Step => "step ");

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lease {:#x}", self.0)
    }
}

impl fmt::Display for TaskKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} epoch {} rank {} {}",
            self.job, self.epoch, self.rank, self.step
        )
    }
}
