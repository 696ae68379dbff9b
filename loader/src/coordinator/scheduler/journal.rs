//! The coordinator's journal: job specs and per-(job, rank, epoch) acknowledged positions in an
//! embedded redb file, so a restarted coordinator loses nothing a client acknowledged.
//!
//! In-flight leases are not journaled: after a restart they are simply redone, which the
//! determinism contract makes safe (the redone batch is bit-identical, and clients drop
//! duplicates by step number).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use redb::{Database, ReadableTable, TableDefinition};

use super::error::{journal_error, CoordinatorError, CoordinatorResult};

/// Job id -> (steps per epoch, protobuf-encoded `JobSpec`).
const JOBS: TableDefinition<u64, (u64, &[u8])> = TableDefinition::new("jobs");
/// (job id, rank, epoch) -> acknowledged position (every step below it was acknowledged).
const ACKED: TableDefinition<(u64, u32, u64), u64> = TableDefinition::new("acked");

/// Name of the redb file inside the state directory.
pub const JOURNAL_FILE: &str = "coordinator.redb";

/// Where a (job, rank, epoch) stands, as journaled.
pub(crate) type PositionKey = (u64, u32, u64);

/// A job as journaled.
pub(crate) struct JournaledJob {
    pub id: u64,
    pub steps_per_epoch: u64,
    pub spec: Vec<u8>,
}

/// What a journal holds when it is opened.
pub(crate) struct JournalContents {
    pub jobs: Vec<JournaledJob>,
    pub positions: HashMap<PositionKey, u64>,
}

/// An open redb journal.
pub(crate) struct Journal {
    database: Database,
    path: PathBuf,
}

impl Journal {
    /// Opens (or creates) the journal in `state_dir` and reads everything it holds.
    pub fn open(state_dir: &Path) -> CoordinatorResult<(Self, JournalContents)> {
        std::fs::create_dir_all(state_dir).map_err(|source| CoordinatorError::StateDir {
            path: state_dir.to_path_buf(),
            source,
        })?;
        let path = state_dir.join(JOURNAL_FILE);
        let database = Database::create(&path).map_err(journal_error)?;
        // Create both tables up front so that reading a fresh journal finds them.
        let txn = database.begin_write().map_err(journal_error)?;
        txn.open_table(JOBS).map_err(journal_error)?;
        txn.open_table(ACKED).map_err(journal_error)?;
        txn.commit().map_err(journal_error)?;

        let txn = database.begin_read().map_err(journal_error)?;
        let mut jobs = Vec::new();
        for row in txn
            .open_table(JOBS)
            .map_err(journal_error)?
            .iter()
            .map_err(journal_error)?
        {
            let (id, value) = row.map_err(journal_error)?;
            let (steps_per_epoch, spec) = value.value();
            jobs.push(JournaledJob {
                id: id.value(),
                steps_per_epoch,
                spec: spec.to_vec(),
            });
        }
        let mut positions = HashMap::new();
        for row in txn
            .open_table(ACKED)
            .map_err(journal_error)?
            .iter()
            .map_err(journal_error)?
        {
            let (key, position) = row.map_err(journal_error)?;
            positions.insert(key.value(), position.value());
        }
        tracing::info!(
            path = %path.display(),
            jobs = jobs.len(),
            positions = positions.len(),
            "coordinator journal opened"
        );
        Ok((Self { database, path }, JournalContents { jobs, positions }))
    }

    /// Durably records a job.
    pub fn put_job(&self, id: u64, steps_per_epoch: u64, spec: &[u8]) -> CoordinatorResult<()> {
        let txn = self.database.begin_write().map_err(journal_error)?;
        txn.open_table(JOBS)
            .map_err(journal_error)?
            .insert(id, (steps_per_epoch, spec))
            .map_err(journal_error)?;
        txn.commit().map_err(journal_error)
    }

    /// Durably records acknowledged positions and deletes the `pruned` ones, all in one
    /// transaction.
    pub fn write_positions(
        &self,
        positions: impl Iterator<Item = (PositionKey, u64)>,
        pruned: &[PositionKey],
    ) -> CoordinatorResult<()> {
        let txn = self.database.begin_write().map_err(journal_error)?;
        {
            let mut table = txn.open_table(ACKED).map_err(journal_error)?;
            for (key, position) in positions {
                table.insert(key, position).map_err(journal_error)?;
            }
            for key in pruned {
                table.remove(key).map_err(journal_error)?;
            }
        }
        txn.commit().map_err(journal_error)
    }

    /// The redb file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}
