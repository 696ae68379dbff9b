//! The core's journal writes made: [`JournalWriter`] writes the intents the core hands out
//! ([`JobWrite`], [`WeightWrite`], [`PositionWrite`]) to the redb journal, from any thread; and
//! [`Durable`], a core beside its journal for callers that write in place (benches, tools,
//! tests), where a call returns once its write landed.
//!
//! The core ([`Coordinator`]) holds no journal and does no I/O: it decides what must be durable,
//! and whoever holds it (this module's [`Durable`], or the service, which writes off its lock)
//! writes it and hands the outcome back.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use stoker_proto::v1::JobSpec;

use crate::journal::Journal;
#[cfg(test)]
use crate::journal::OpenDatabase;
use crate::scheduler::{
    AckOutcome, Coordinator, CoordinatorConfig, CoordinatorResult, JobId, JobWrite,
    JournalContents, PositionWrite, SessionId, Step, WeightWrite,
};

/// Where a core's journal writes go: a redb journal shared by the writes in flight, or nowhere
/// (a core without a journal, whose writes there is nothing to make). Cheap to clone.
#[derive(Clone, Default)]
pub struct JournalWriter(Option<Arc<Mutex<Journal>>>);

impl JournalWriter {
    /// A writer for a core without a journal: every write succeeds at once.
    pub fn none() -> Self {
        Self(None)
    }

    /// The journal, once a write in flight is done with it. A write that panicked left
    /// nothing half-done in it (a transaction not committed is dropped), so carry on with it.
    fn lock(journal: &Mutex<Journal>) -> MutexGuard<'_, Journal> {
        journal
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Writes a job, and its weight, durably in one transaction. Waits for another write in
    /// flight to finish with the journal first.
    pub fn write_job(&self, write: &JobWrite) -> CoordinatorResult<()> {
        match &self.0 {
            Some(journal) => Self::lock(journal).put_job(
                write.id.0,
                write.steps_per_epoch,
                (&write.encoded, &write.described),
                write.weight,
            ),
            None => Ok(()),
        }
    }

    /// Writes a job's weight durably when it changes.
    pub fn write_weight(&self, write: &WeightWrite) -> CoordinatorResult<()> {
        match &self.0 {
            Some(journal) if write.changes() => {
                Self::lock(journal).put_weight(write.job.0, write.weight)
            }
            _ => Ok(()),
        }
    }

    /// Writes acknowledged positions durably, in one transaction; `Ok(false)` when a write
    /// taken later landed first (it held these or newer).
    pub fn write_positions(&self, write: &PositionWrite) -> CoordinatorResult<bool> {
        match &self.0 {
            Some(journal) => Self::lock(journal).write_positions_numbered(
                write.seq,
                write.positions.iter().copied(),
                &write.pruned,
                &write.retired,
            ),
            None => Ok(true),
        }
    }

    /// Makes the journal's next write fail as a full disk would (tests only).
    #[cfg(test)]
    pub(crate) fn fail_next_write(&self) {
        if let Some(journal) = &self.0 {
            Self::lock(journal).fail_next_write = true;
        }
    }
}

/// A core and the journal that keeps it, each call that changes what is durable returning
/// once its write landed. The service does not use it: it writes off its lock.
pub struct Durable {
    /// The core; calls that need no write go to it directly.
    pub core: Coordinator,
    journal: JournalWriter,
}

impl Durable {
    /// A core without a journal: nothing survives it.
    pub fn in_memory(config: CoordinatorConfig) -> Self {
        Self {
            core: Coordinator::in_memory(config),
            journal: JournalWriter::none(),
        }
    }

    /// The core journaled in `state_dir` (created if missing), as its journal holds it:
    /// registered jobs, weights and acknowledged positions come back; workers and leases do not
    /// (workers re-register, and unacknowledged steps are redone).
    pub fn open(state_dir: &Path, config: CoordinatorConfig) -> CoordinatorResult<Self> {
        Self::restored(Journal::open(state_dir)?, config)
    }

    /// [`Durable::open`], the journal's database opened by `open_database` (tests give a
    /// storage that fails or stalls on demand).
    #[cfg(test)]
    pub(crate) fn open_with(
        state_dir: &Path,
        config: CoordinatorConfig,
        open_database: OpenDatabase,
    ) -> CoordinatorResult<Self> {
        Self::restored(Journal::open_with(state_dir, open_database)?, config)
    }

    /// The core restored from what the journal held when opened, beside that journal.
    fn restored(
        (journal, contents): (Journal, JournalContents),
        config: CoordinatorConfig,
    ) -> CoordinatorResult<Self> {
        Ok(Self {
            core: Coordinator::restore(config, contents)?,
            journal: JournalWriter(Some(Arc::new(Mutex::new(journal)))),
        })
    }

    /// The core and where its writes go, parted (a service takes them so).
    pub fn into_parts(self) -> (Coordinator, JournalWriter) {
        (self.core, self.journal)
    }

    /// Where the core's writes go.
    pub fn journal(&self) -> &JournalWriter {
        &self.journal
    }

    /// Registers a job whose ranks each run `steps_per_epoch` steps; durable on return.
    pub fn register_job(
        &mut self,
        spec: JobSpec,
        steps_per_epoch: u64,
    ) -> CoordinatorResult<JobId> {
        let write = self.core.job_write(spec, steps_per_epoch, 0)?;
        let outcome = self.journal.write_job(&write);
        self.core.job_written(write, outcome)
    }

    /// Sets `job`'s weight (see [`Coordinator::weight_write`]); durable on return. Returns the
    /// weight given.
    pub fn set_job_weight(&mut self, job: JobId, requested: u32) -> CoordinatorResult<u32> {
        let write = self.core.weight_write(job, requested)?;
        let outcome = self.journal.write_weight(&write);
        self.core.weight_written(&write, outcome)
    }

    /// Acknowledges `step` of `session`, and writes the positions when
    /// [`CoordinatorConfig::journal_every`] acknowledgements have come since the last write.
    pub fn acknowledge(&mut self, session: SessionId, step: Step) -> CoordinatorResult<AckOutcome> {
        let outcome = self.core.acknowledge(session, step)?;
        if self.core.write_due() {
            self.flush()?;
        }
        Ok(outcome)
    }

    /// Writes the acknowledged positions changed since the last write, here and now; a write
    /// that fails keeps them for the next.
    pub fn flush(&mut self) -> CoordinatorResult<()> {
        let Some(write) = self.core.take_positions() else {
            return Ok(());
        };
        let outcome = self.journal.write_positions(&write);
        self.core.positions_written(&write, outcome)
    }
}
