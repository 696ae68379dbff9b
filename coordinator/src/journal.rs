//! The coordinator's journal: job specs (with what a worker described of their datasets, and
//! their weights) and per-(job, rank, epoch) acknowledged positions in an embedded redb file,
//! so a restarted coordinator loses nothing a client acknowledged, and its workers check their
//! datasets against the one each job was registered over.
//!
//! Positions change by the thousands between two writes (every rank of every job moves), so a
//! write appends them as one entry of a log table (one insert and one commit, whatever the
//! number of ranks) rather than updating each key of the positions table's B-tree, which cost
//! about a microsecond per position. Every [`FOLD_EVERY`]th write folds the log into the table,
//! in the same transaction, so the log stays short; opening reads the table, then replays the
//! log in the order it was written.
//!
//! In-flight leases are not journaled: after a restart they are simply redone, which the
//! determinism contract makes safe (the redone batch is bit-identical, and clients drop
//! duplicates by step number).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use prost::encoding::{decode_varint, encode_varint};
use redb::{Database, ReadableTable, TableDefinition};

use crate::scheduler::{
    journal_error, CoordinatorError, CoordinatorResult, JournalContents, JournaledJob, PositionKey,
};

/// Job id -> (steps per epoch, protobuf-encoded `JobSpec`).
const JOBS: TableDefinition<u64, (u64, &[u8])> = TableDefinition::new("jobs");
/// (job id, rank, epoch) -> acknowledged position (every step below it was acknowledged).
const ACKED: TableDefinition<(u64, u32, u64), u64> = TableDefinition::new("acked");

/// Position changes appended since the last fold: write number -> records (see
/// [`encode_record`]), applied over `ACKED` in write order.
const POSITION_LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("acked_log");

/// job id -> its weight (jobs never given one are absent: weight 1).
const WEIGHTS: TableDefinition<u64, u32> = TableDefinition::new("weights");

/// job id -> what a worker described of its datasets when it was registered (a protobuf
/// `DescribeJobResponse`: sample count, fingerprint, tokenizer digests), which workers check
/// their own view against after a restart too (absent for a job of an older journal).
const DESCRIPTIONS: TableDefinition<u64, &[u8]> = TableDefinition::new("descriptions");

/// Position writes between two folds of the log into `ACKED`.
pub(crate) const FOLD_EVERY: u64 = 64;

/// Name of the redb file inside the state directory.
pub const JOURNAL_FILE: &str = "coordinator.redb";

/// Opens the journal's database: at start, and again after a write failed.
pub(crate) type OpenDatabase = Box<dyn Fn() -> Result<Database, redb::DatabaseError> + Send>;

/// An open redb journal. A write that fails lets go of the database (redb refuses every later
/// transaction of a database an I/O error struck, a full disk for a moment included), and the
/// next write opens it again, so the journal works again once the disk does.
pub(crate) struct Journal {
    database: Option<Database>,
    open_database: OpenDatabase,
    path: PathBuf,
    /// The key of the next log entry.
    next_entry: u64,
    /// Entries in the log now.
    log_entries: u64,
    /// The number of the last numbered position write that landed (see
    /// [`Journal::write_positions_numbered`]).
    written_seq: u64,
    /// Makes the next `write_positions` fail as a full disk would (tests only).
    #[cfg(test)]
    pub(crate) fail_next_write: bool,
}

/// Appends one position change to `out`: the key's three parts and the position plus one (0:
/// the position was dropped), as varints.
fn encode_record(key: PositionKey, position: Option<u64>, out: &mut Vec<u8>) {
    encode_varint(key.0, out);
    encode_varint(u64::from(key.1), out);
    encode_varint(key.2, out);
    encode_varint(position.map_or(0, |p| p.saturating_add(1)), out);
}

/// The position changes of one log entry, in the order written; `None` when it does not
/// decode.
fn decode_records(mut bytes: &[u8]) -> Option<Vec<(PositionKey, Option<u64>)>> {
    let mut records = Vec::new();
    while !bytes.is_empty() {
        let job = decode_varint(&mut bytes).ok()?;
        let rank = u32::try_from(decode_varint(&mut bytes).ok()?).ok()?;
        let epoch = decode_varint(&mut bytes).ok()?;
        let position = decode_varint(&mut bytes).ok()?.checked_sub(1);
        records.push(((job, rank, epoch), position));
    }
    Some(records)
}

/// Applies the records of `log` (in key order) over `positions`.
fn replay(
    log: impl Iterator<Item = Result<(u64, Vec<u8>), redb::StorageError>>,
    positions: &mut HashMap<PositionKey, u64>,
) -> CoordinatorResult<(u64, u64)> {
    let (mut next_entry, mut entries) = (0, 0);
    for entry in log {
        let (key, bytes) = entry.map_err(journal_error)?;
        let records =
            decode_records(&bytes).ok_or(CoordinatorError::CorruptPositions { entry: key })?;
        for (record, position) in records {
            match position {
                Some(position) => positions.insert(record, position),
                None => positions.remove(&record),
            };
        }
        next_entry = key + 1;
        entries += 1;
    }
    Ok((next_entry, entries))
}

impl Journal {
    /// Opens (or creates) the journal in `state_dir` and reads everything it holds.
    pub fn open(state_dir: &Path) -> CoordinatorResult<(Self, JournalContents)> {
        let path = state_dir.join(JOURNAL_FILE);
        Self::open_with(state_dir, Box::new(move || Database::create(&path)))
    }

    /// [`Journal::open`], the database opened by `open_database` (tests give a storage that
    /// fails on demand).
    pub(crate) fn open_with(
        state_dir: &Path,
        open_database: OpenDatabase,
    ) -> CoordinatorResult<(Self, JournalContents)> {
        std::fs::create_dir_all(state_dir).map_err(|source| CoordinatorError::StateDir {
            path: state_dir.to_path_buf(),
            source,
        })?;
        let path = state_dir.join(JOURNAL_FILE);
        // redb asserts on some damage (a file cut short of its header's layout) rather than
        // returning an error: met here, it is an error naming the file, not a crash (nor a
        // panic's message and backtrace printed before it).
        let database = stoker_pipeline::without_panics("redb", &open_database)
            .map_err(|problem| CoordinatorError::JournalDamaged {
                path: path.clone(),
                problem,
            })?
            .map_err(journal_error)?;
        // Create both tables up front so that reading a fresh journal finds them.
        let txn = database.begin_write().map_err(journal_error)?;
        txn.open_table(JOBS).map_err(journal_error)?;
        txn.open_table(ACKED).map_err(journal_error)?;
        txn.open_table(POSITION_LOG).map_err(journal_error)?;
        txn.open_table(WEIGHTS).map_err(journal_error)?;
        txn.open_table(DESCRIPTIONS).map_err(journal_error)?;
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
        let log = txn.open_table(POSITION_LOG).map_err(journal_error)?;
        let (next_entry, log_entries) = replay(
            log.iter()
                .map_err(journal_error)?
                .map(|row| row.map(|(key, bytes)| (key.value(), bytes.value().to_vec()))),
            &mut positions,
        )?;
        let mut weights = HashMap::new();
        for row in txn
            .open_table(WEIGHTS)
            .map_err(journal_error)?
            .iter()
            .map_err(journal_error)?
        {
            let (job, weight) = row.map_err(journal_error)?;
            weights.insert(job.value(), weight.value());
        }
        let mut descriptions = HashMap::new();
        for row in txn
            .open_table(DESCRIPTIONS)
            .map_err(journal_error)?
            .iter()
            .map_err(journal_error)?
        {
            let (job, described) = row.map_err(journal_error)?;
            descriptions.insert(job.value(), described.value().to_vec());
        }
        tracing::info!(
            path = %path.display(),
            jobs = jobs.len(),
            positions = positions.len(),
            "coordinator journal opened"
        );
        drop(txn);
        Ok((
            Self {
                database: Some(database),
                open_database,
                path,
                next_entry,
                log_entries,
                written_seq: 0,
                #[cfg(test)]
                fail_next_write: false,
            },
            JournalContents {
                jobs,
                positions,
                weights,
                descriptions,
            },
        ))
    }

    /// The database, opened again if a write let go of it (the log's counters read back from
    /// it: the failed write may or may not have landed).
    fn database(&mut self) -> CoordinatorResult<&Database> {
        if self.database.is_none() {
            let database = (self.open_database)().map_err(journal_error)?;
            let txn = database.begin_read().map_err(journal_error)?;
            let log = txn.open_table(POSITION_LOG).map_err(journal_error)?;
            let (mut next_entry, mut entries) = (0, 0);
            for row in log.iter().map_err(journal_error)? {
                next_entry = row.map_err(journal_error)?.0.value() + 1;
                entries += 1;
            }
            (self.next_entry, self.log_entries) = (next_entry, entries);
            drop((log, txn));
            tracing::info!(path = %self.path.display(), "coordinator journal opened again");
            self.database = Some(database);
        }
        self.database
            .as_ref()
            .ok_or_else(|| journal_error(std::io::Error::other("the journal is not open")))
    }

    /// Runs the write `write` in one transaction; when it fails, lets go of the database
    /// (opened again by the next write).
    fn write<T>(
        &mut self,
        write: impl FnOnce(&mut Self, &redb::WriteTransaction) -> CoordinatorResult<T>,
    ) -> CoordinatorResult<T> {
        #[cfg(test)]
        if std::mem::take(&mut self.fail_next_write) {
            return Err(journal_error(std::io::Error::other(
                "no space left (injected)",
            )));
        }
        let written = self
            .database()
            .and_then(|database| database.begin_write().map_err(journal_error))
            .and_then(|txn| {
                let value = write(self, &txn)?;
                txn.commit().map_err(journal_error)?;
                Ok(value)
            });
        if let Err(error) = &written {
            tracing::warn!(path = %self.path.display(), %error, "a journal write failed; the journal is opened again for the next one");
            self.database = None;
        }
        written
    }

    /// Durably records a job, its weight when it has one and its description when a worker
    /// gave one (not empty), in one transaction.
    pub fn put_job(
        &mut self,
        id: u64,
        steps_per_epoch: u64,
        (spec, described): (&[u8], &[u8]),
        weight: Option<u32>,
    ) -> CoordinatorResult<()> {
        self.write(|_, txn| {
            txn.open_table(JOBS)
                .map_err(journal_error)?
                .insert(id, (steps_per_epoch, spec))
                .map_err(journal_error)?;
            if !described.is_empty() {
                txn.open_table(DESCRIPTIONS)
                    .map_err(journal_error)?
                    .insert(id, described)
                    .map_err(journal_error)?;
            }
            if let Some(weight) = weight {
                txn.open_table(WEIGHTS)
                    .map_err(journal_error)?
                    .insert(id, weight)
                    .map_err(journal_error)?;
            }
            Ok(())
        })
    }

    /// Durably records a job's weight.
    pub fn put_weight(&mut self, job: u64, weight: u32) -> CoordinatorResult<()> {
        self.write(|_, txn| {
            txn.open_table(WEIGHTS)
                .map_err(journal_error)?
                .insert(job, weight)
                .map_err(journal_error)?;
            Ok(())
        })
    }

    /// Durably records acknowledged positions, deletes the `pruned` ones and the rows of the
    /// `retired_jobs` (spec, weight and description), all in one transaction: positions
    /// appended to the log, or, every [`FOLD_EVERY`]th write, folded with the log into the
    /// positions table.
    pub fn write_positions(
        &mut self,
        positions: impl Iterator<Item = (PositionKey, u64)>,
        pruned: &[PositionKey],
        retired_jobs: &[u64],
    ) -> CoordinatorResult<()> {
        // Deletions first: a key both pruned and written was opened again after its prune,
        // and replay applies records in order, so its new position must come last.
        let mut records = Vec::new();
        for key in pruned {
            encode_record(*key, None, &mut records);
        }
        for (key, position) in positions {
            encode_record(key, Some(position), &mut records);
        }
        let fold = self.write(|journal, txn| {
            let fold = journal.log_entries + 1 >= FOLD_EVERY;
            let mut log = txn.open_table(POSITION_LOG).map_err(journal_error)?;
            log.insert(journal.next_entry, records.as_slice())
                .map_err(journal_error)?;
            if fold {
                Self::fold(txn, &mut log)?;
            }
            if !retired_jobs.is_empty() {
                let mut jobs = txn.open_table(JOBS).map_err(journal_error)?;
                let mut weights = txn.open_table(WEIGHTS).map_err(journal_error)?;
                let mut descriptions = txn.open_table(DESCRIPTIONS).map_err(journal_error)?;
                for job in retired_jobs {
                    jobs.remove(job).map_err(journal_error)?;
                    weights.remove(job).map_err(journal_error)?;
                    descriptions.remove(job).map_err(journal_error)?;
                }
            }
            Ok(fold)
        })?;
        self.next_entry += 1;
        self.log_entries = if fold { 0 } else { self.log_entries + 1 };
        Ok(())
    }

    /// [`write_positions`](Self::write_positions) of the write numbered `seq` (numbers rise in
    /// the order the writes' positions were taken): skipped, `Ok(false)`, when a write of a later
    /// number landed first, since that one held these positions or newer ones.
    pub fn write_positions_numbered(
        &mut self,
        seq: u64,
        positions: impl Iterator<Item = (PositionKey, u64)>,
        pruned: &[PositionKey],
        retired_jobs: &[u64],
    ) -> CoordinatorResult<bool> {
        if seq <= self.written_seq {
            return Ok(false);
        }
        self.write_positions(positions, pruned, retired_jobs)?;
        self.written_seq = seq;
        Ok(true)
    }

    /// Applies every log entry to the positions table (the last change of each key, in key
    /// order) and empties the log, inside `txn`.
    fn fold(
        txn: &redb::WriteTransaction,
        log: &mut redb::Table<'_, u64, &'static [u8]>,
    ) -> CoordinatorResult<()> {
        let mut last: HashMap<PositionKey, Option<u64>> = HashMap::new();
        for row in log.iter().map_err(journal_error)? {
            let (key, bytes) = row.map_err(journal_error)?;
            let records = decode_records(bytes.value())
                .ok_or(CoordinatorError::CorruptPositions { entry: key.value() })?;
            last.extend(records);
        }
        let mut changes: Vec<_> = last.into_iter().collect();
        // In key order: redb's B-tree takes sorted inserts several times faster.
        changes.sort_unstable();
        let mut table = txn.open_table(ACKED).map_err(journal_error)?;
        for (key, position) in changes {
            match position {
                Some(position) => table.insert(key, position).map_err(journal_error)?,
                None => table.remove(key).map_err(journal_error)?,
            };
        }
        log.retain(|_, _| false).map_err(journal_error)?;
        Ok(())
    }
}

/// The journal's file at `path` as redb's plain file storage, for tests that wrap it in a
/// storage of their own (one that fails or stalls on demand).
#[cfg(test)]
pub(crate) fn journal_file(
    path: &Path,
) -> Result<redb::backends::FileBackend, redb::DatabaseError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    redb::backends::FileBackend::new(file)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use redb::backends::FileBackend;
    use redb::StorageBackend;

    use super::*;

    /// A journal file whose writes fail while `full` is set, as on a full disk.
    #[derive(Debug)]
    struct FillingDisk {
        file: FileBackend,
        full: Arc<AtomicBool>,
    }

    impl FillingDisk {
        fn check(&self) -> std::io::Result<()> {
            if self.full.load(Ordering::SeqCst) {
                return Err(std::io::Error::from_raw_os_error(28)); // ENOSPC
            }
            Ok(())
        }
    }

    impl StorageBackend for FillingDisk {
        fn len(&self) -> std::io::Result<u64> {
            self.file.len()
        }
        fn read(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
            self.file.read(offset, len)
        }
        fn set_len(&self, len: u64) -> std::io::Result<()> {
            self.check()?;
            self.file.set_len(len)
        }
        fn sync_data(&self, eventual: bool) -> std::io::Result<()> {
            self.check()?;
            self.file.sync_data(eventual)
        }
        fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
            self.check()?;
            self.file.write(offset, data)
        }
    }

    #[test]
    fn a_journal_works_again_once_a_full_disk_has_room() {
        let dir = tempfile::tempdir().expect("tempdir");
        let full = Arc::new(AtomicBool::new(false));
        let (path, disk) = (dir.path().join(JOURNAL_FILE), Arc::clone(&full));
        let open: OpenDatabase = Box::new(move || {
            redb::Builder::new().create_with_backend(FillingDisk {
                file: journal_file(&path)?,
                full: Arc::clone(&disk),
            })
        });
        {
            let (mut journal, _) = Journal::open_with(dir.path(), open).expect("open");
            journal
                .put_job(0, 10, (b"first", b""), None)
                .expect("a job");
            journal
                .write_positions([((0, 0, 0), 3)].into_iter(), &[], &[])
                .expect("positions");
            full.store(true, Ordering::SeqCst);
            assert!(journal.put_job(1, 10, (b"lost", b""), None).is_err());
            assert!(journal
                .write_positions([((0, 0, 0), 5)].into_iter(), &[], &[])
                .is_err());
            // Room again: the next writes land (redb alone refuses every transaction of a
            // database an I/O error struck, until it is opened again).
            full.store(false, Ordering::SeqCst);
            journal
                .write_positions([((0, 0, 0), 7)].into_iter(), &[], &[])
                .expect("positions once there is room");
            journal
                .put_job(2, 10, (b"second", b""), None)
                .expect("a job once there is room");
        }
        let (_, contents) = Journal::open(dir.path()).expect("reopen");
        let ids: Vec<u64> = contents.jobs.iter().map(|job| job.id).collect();
        assert!(ids.contains(&0) && ids.contains(&2), "{ids:?}");
        assert_eq!(contents.positions.get(&(0, 0, 0)), Some(&7));
    }

    /// A journal cut short (a partial copy or restore) made redb assert, and the coordinator
    /// died with a backtrace; it is an error naming the file now, for every length cut to.
    #[test]
    fn a_journal_cut_short_is_an_error_naming_it_not_a_crash() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let (mut journal, _) = Journal::open(dir.path()).expect("open");
            journal.put_job(1, 10, (b"a spec", b""), None).expect("put");
        }
        let path = dir.path().join(JOURNAL_FILE);
        let whole = std::fs::read(&path).expect("read");
        for cut in [3000, 600, whole.len() / 2, whole.len() - 1] {
            std::fs::write(&path, &whole[..cut]).expect("cut");
            match Journal::open(dir.path()) {
                // redb may also mend what it can read: the job is then there or not.
                Ok(_) => {}
                Err(error) => assert!(error.to_string().contains("journal"), "{cut}: {error}"),
            }
        }
        std::fs::write(&path, &whole[..3000]).expect("cut");
        let error = Journal::open(dir.path())
            .err()
            .expect("a journal cut to 3000 bytes");
        assert!(
            matches!(&error, CoordinatorError::JournalDamaged { path: named, .. } if *named == path),
            "{error}"
        );
    }

    #[test]
    fn positions_survive_appends_folds_and_drops() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut expected: HashMap<PositionKey, u64> = HashMap::new();
        {
            let (mut journal, contents) = Journal::open(dir.path()).expect("open");
            assert!(contents.positions.is_empty());
            // Enough writes for three folds and some entries after the last.
            for write in 0..(3 * FOLD_EVERY + 5) {
                let changed: Vec<(PositionKey, u64)> = (0..40u32)
                    .map(|rank| ((write % 3, rank, write / 10), write * 100 + u64::from(rank)))
                    .collect();
                let pruned: Vec<PositionKey> = if write % 7 == 6 {
                    expected.keys().take(5).copied().collect()
                } else {
                    Vec::new()
                };
                // Drops first, then changes, as one write applies them (a key pruned and then
                // written again in one write keeps its new position).
                for key in &pruned {
                    expected.remove(key);
                }
                expected.extend(changed.iter().copied());
                journal
                    .write_positions(changed.into_iter(), &pruned, &[])
                    .expect("write");
            }
            assert_eq!(journal.log_entries, 5, "folded every {FOLD_EVERY} writes");
        }
        let (journal, contents) = Journal::open(dir.path()).expect("reopen");
        assert_eq!(contents.positions, expected);
        assert_eq!(
            (journal.log_entries, journal.next_entry),
            (5, 3 * FOLD_EVERY + 5)
        );
    }

    #[test]
    fn a_journal_of_the_table_alone_opens_and_a_bad_log_entry_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(JOURNAL_FILE);
        {
            // As journals were written before the log: positions in the table only.
            let database = Database::create(&path).expect("create");
            let txn = database.begin_write().expect("txn");
            txn.open_table(ACKED)
                .expect("table")
                .insert((1, 2, 3), 40)
                .expect("insert");
            txn.commit().expect("commit");
        }
        {
            let (mut journal, contents) = Journal::open(dir.path()).expect("open");
            assert_eq!(contents.positions, HashMap::from([((1, 2, 3), 40)]));
            journal
                .write_positions([((1, 2, 3), 41)].into_iter(), &[], &[])
                .expect("write");
        }
        let (journal, contents) = Journal::open(dir.path()).expect("reopen");
        assert_eq!(contents.positions, HashMap::from([((1, 2, 3), 41)]));
        let txn = journal
            .database
            .as_ref()
            .expect("open")
            .begin_write()
            .expect("txn");
        txn.open_table(POSITION_LOG)
            .expect("log")
            .insert(99, [0xffu8; 3].as_slice())
            .expect("insert");
        txn.commit().expect("commit");
        drop(journal);
        match Journal::open(dir.path()) {
            Err(CoordinatorError::CorruptPositions { entry: 99 }) => {}
            Err(other) => panic!("another error: {other}"),
            Ok(_) => panic!("a log entry that does not decode was read"),
        }
    }
}
