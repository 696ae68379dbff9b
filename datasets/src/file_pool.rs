//! Open files as a bounded pool: data files that are read by position (local tar shards, JSONL
//! files, MDS shards and the Arrow shards of `save_to_disk` folders) are opened on demand and
//! kept in one process-wide least-recently-used pool, so the number of descriptors a process
//! holds does not grow with the number of files in its datasets.
//!
//! The pool's budget comes from the soft `RLIMIT_NOFILE` at first use: a quarter of it (between
//! [`MIN_BUDGET`] and [`MAX_BUDGET`]), leaving the rest to sockets, pipes, the runtime and
//! whatever else the process opens. An entry counts the descriptors it holds (a file and a
//! descriptor held beside it, such as a lock, are two). A file evicted while a reader still uses it closes
//! when that reader lets go, so the pool can overshoot its budget by the number of reads in
//! flight (at most one per decode thread).
//!
//! Opening a file that fails because the process or the system is out of descriptors
//! (`EMFILE`, `ENFILE`) closes the least recently used half of the pool and tries once more; the
//! caller sees the error only when that did not help.

use std::fs::File;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use lru::LruCache;
use tracing::{debug, info, warn};

/// The smallest budget, whatever the soft limit says.
pub const MIN_BUDGET: usize = 4;
/// The largest budget: reopening a file costs microseconds, so more buys nothing.
pub const MAX_BUDGET: usize = 4096;

/// One pooled entry: the file read from, and a descriptor that may be held beside it for as
/// long as the file is open (counted against the budget).
#[derive(Debug)]
pub(crate) struct PooledFile {
    /// The file read by position.
    pub(crate) file: File,
    /// Held, never read: closing it releases what it stands for.
    pub(crate) _held: Option<File>,
}

impl PooledFile {
    /// A plain file.
    pub(crate) fn plain(file: File) -> PooledFile {
        PooledFile { file, _held: None }
    }

    fn descriptors(&self) -> usize {
        1 + usize::from(self._held.is_some())
    }
}

/// A key in the pool. Each user reserves a range with [`FilePool::reserve_keys`] and gives it
/// back with [`FilePool::forget`], so two datasets never share an entry.
pub(crate) type FileKey = u64;

struct Entries {
    files: LruCache<FileKey, Arc<PooledFile>>,
    descriptors: usize,
}

/// A bounded, process-wide pool of open files; see the module docs.
pub(crate) struct FilePool {
    budget: usize,
    entries: Mutex<Entries>,
    next_key: AtomicU64,
    opened: AtomicU64,
}

impl FilePool {
    /// A pool that keeps at most `budget` descriptors open (at least one entry).
    pub(crate) fn with_budget(budget: usize) -> FilePool {
        FilePool {
            budget: budget.max(1),
            entries: Mutex::new(Entries {
                files: LruCache::unbounded(),
                descriptors: 0,
            }),
            next_key: AtomicU64::new(0),
            opened: AtomicU64::new(0),
        }
    }

    /// The process's pool, sized from the soft descriptor limit on first use.
    pub(crate) fn global() -> &'static FilePool {
        static GLOBAL: OnceLock<FilePool> = OnceLock::new();
        GLOBAL.get_or_init(|| {
            let soft_limit = soft_descriptor_limit();
            let budget = budget_for(soft_limit);
            info!(
                soft_limit = soft_limit.unwrap_or(0),
                budget, "open data files are pooled"
            );
            FilePool::with_budget(budget)
        })
    }

    /// Descriptors the pool keeps open at most (reads in flight aside).
    #[cfg(test)]
    pub(crate) fn budget(&self) -> usize {
        self.budget
    }

    /// Reserves `count` keys for one user (a dataset's files).
    pub(crate) fn reserve_keys(&self, count: usize) -> Range<FileKey> {
        let start = self.next_key.fetch_add(count as u64, Ordering::Relaxed);
        start..start + count as u64
    }

    /// Descriptors held by the pool now.
    #[cfg(test)]
    pub(crate) fn descriptors(&self) -> usize {
        self.lock().descriptors
    }

    /// Files opened through the pool so far (reopens included).
    #[cfg(test)]
    pub(crate) fn opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// The file of `key`, opened with `open` when the pool does not hold it.
    ///
    /// `open` runs without the pool's lock (opening may be slow on network file systems); two
    /// threads missing the same key at once both open it and the pool keeps one.
    pub(crate) fn get_or_open<E>(
        &self,
        key: FileKey,
        open: impl Fn() -> Result<PooledFile, E>,
        is_out_of_descriptors: impl Fn(&E) -> bool,
    ) -> Result<Arc<PooledFile>, E> {
        if let Some(file) = self.lock().files.get(&key) {
            return Ok(Arc::clone(file));
        }
        let pooled = match open() {
            Ok(pooled) => pooled,
            Err(error) if is_out_of_descriptors(&error) => {
                let closed = self.shed_half();
                warn!(
                    closed,
                    budget = self.budget,
                    "out of file descriptors; closed pooled files and trying again"
                );
                open()?
            }
            Err(error) => return Err(error),
        };
        self.opened.fetch_add(1, Ordering::Relaxed);
        let pooled = Arc::new(pooled);
        let mut entries = self.lock();
        entries.descriptors += pooled.descriptors();
        if let Some(replaced) = entries.files.put(key, Arc::clone(&pooled)) {
            entries.descriptors -= replaced.descriptors();
        }
        while entries.descriptors > self.budget && entries.files.len() > 1 {
            match entries.files.pop_lru() {
                Some((_, evicted)) => entries.descriptors -= evicted.descriptors(),
                None => break,
            }
        }
        Ok(pooled)
    }

    /// Closes the pooled files of `keys` (their user is gone).
    pub(crate) fn forget(&self, keys: Range<FileKey>) {
        let mut entries = self.lock();
        let doomed: Vec<FileKey> = entries
            .files
            .iter()
            .map(|(key, _)| *key)
            .filter(|key| keys.contains(key))
            .collect();
        for key in doomed {
            if let Some(file) = entries.files.pop(&key) {
                entries.descriptors -= file.descriptors();
            }
        }
    }

    /// [`FilePool::forget`] of one key, without a look at the other entries.
    pub(crate) fn forget_one(&self, key: FileKey) {
        let mut entries = self.lock();
        if let Some(file) = entries.files.pop(&key) {
            entries.descriptors -= file.descriptors();
        }
    }

    /// Closes the least recently used half of the pool; returns how many entries it closed.
    fn shed_half(&self) -> usize {
        let mut entries = self.lock();
        let count = entries.files.len().div_ceil(2);
        for _ in 0..count {
            if let Some((_, evicted)) = entries.files.pop_lru() {
                entries.descriptors -= evicted.descriptors();
            }
        }
        count
    }

    fn lock(&self) -> MutexGuard<'_, Entries> {
        // The entries stay consistent across a panic (each update is one step), so a poisoned
        // lock is still usable.
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The pool budget for a soft descriptor limit (`None`: unknown or unlimited).
pub(crate) fn budget_for(soft_limit: Option<u64>) -> usize {
    match soft_limit {
        Some(limit) => usize::try_from(limit / 4)
            .unwrap_or(MAX_BUDGET)
            .clamp(MIN_BUDGET, MAX_BUDGET),
        None => MAX_BUDGET,
    }
}

/// The soft `RLIMIT_NOFILE` of this process (`None`: unlimited or unknown).
pub(crate) fn soft_descriptor_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` through a valid pointer to a local.
    let status = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    if status != 0 {
        debug!(error = %std::io::Error::last_os_error(), "cannot read the descriptor limit");
        return None;
    }
    (limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// Whether `error` says the process or the system has no descriptor left.
pub(crate) fn is_out_of_descriptors(error: &std::io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// Whether a dataset's `error`, opening a file for the pool, says so.
pub(crate) fn failed_for_descriptors(error: &crate::error::Error) -> bool {
    use crate::error::Error;
    match error {
        Error::Io { source, .. }
        | Error::Cache { source, .. }
        | Error::ShardRead { source, .. } => is_out_of_descriptors(source),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_a_quarter_of_the_soft_limit_within_bounds() {
        assert_eq!(budget_for(Some(256)), 64);
        assert_eq!(budget_for(Some(64)), 16);
        assert_eq!(budget_for(Some(8)), MIN_BUDGET);
        assert_eq!(budget_for(Some(1 << 20)), MAX_BUDGET);
        assert_eq!(budget_for(None), MAX_BUDGET);
        assert!(soft_descriptor_limit().is_none_or(|limit| limit > 0));
    }

    #[test]
    fn the_pool_never_holds_more_than_its_budget_and_reopens_evicted_files() {
        let dir = tempfile::tempdir().unwrap();
        let paths: Vec<_> = (0..10)
            .map(|index| {
                let path = dir.path().join(format!("{index}.bin"));
                std::fs::write(&path, [index as u8]).unwrap();
                path
            })
            .collect();
        let pool = FilePool::with_budget(3);
        assert_eq!(pool.budget(), 3);
        let keys = pool.reserve_keys(paths.len());
        for round in 0..2 {
            for (key, path) in keys.clone().zip(&paths) {
                let file = pool
                    .get_or_open(key, || File::open(path).map(PooledFile::plain), |_| false)
                    .unwrap();
                let mut byte = [0u8];
                std::os::unix::fs::FileExt::read_exact_at(&file.file, &mut byte, 0).unwrap();
                assert_eq!(u64::from(byte[0]), key - keys.start, "round {round}");
                assert!(pool.descriptors() <= 3);
            }
        }
        assert_eq!(
            pool.opened(),
            20,
            "a pool of 3 cycling over 10 files reopens each"
        );
        // A hit opens nothing.
        let last = keys.end - 1;
        pool.get_or_open(
            last,
            || File::open(&paths[9]).map(PooledFile::plain),
            |_| false,
        )
        .unwrap();
        assert_eq!(pool.opened(), 20);
        pool.forget(keys);
        assert_eq!(pool.descriptors(), 0);
    }

    #[test]
    fn entries_count_the_descriptors_they_hold() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        std::fs::write(&path, b"x").unwrap();
        let pool = FilePool::with_budget(4);
        let keys = pool.reserve_keys(4);
        let with_lock = || -> std::io::Result<PooledFile> {
            Ok(PooledFile {
                file: File::open(&path)?,
                _held: Some(File::open(&path)?),
            })
        };
        for key in keys.clone() {
            pool.get_or_open(key, with_lock, |_| false).unwrap();
            assert!(pool.descriptors() <= 4);
        }
        assert_eq!(pool.descriptors(), 4, "two entries of two descriptors");
    }

    #[test]
    fn running_out_of_descriptors_sheds_half_the_pool_and_retries_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        std::fs::write(&path, b"x").unwrap();
        let pool = FilePool::with_budget(8);
        let keys = pool.reserve_keys(9);
        for key in keys.start..keys.start + 8 {
            pool.get_or_open(key, || File::open(&path).map(PooledFile::plain), |_| false)
                .unwrap();
        }
        let attempts = std::sync::atomic::AtomicUsize::new(0);
        let flaky = || {
            if attempts.fetch_add(1, Ordering::Relaxed) == 0 {
                Err(std::io::Error::from_raw_os_error(libc::EMFILE))
            } else {
                File::open(&path).map(PooledFile::plain)
            }
        };
        pool.get_or_open(keys.end - 1, flaky, is_out_of_descriptors)
            .unwrap();
        assert_eq!(attempts.load(Ordering::Relaxed), 2);
        assert_eq!(pool.descriptors(), 5, "half of 8 closed, then one opened");

        let always = || -> std::io::Result<PooledFile> {
            Err(std::io::Error::from_raw_os_error(libc::ENFILE))
        };
        let error = pool
            .get_or_open(keys.end + 100, always, is_out_of_descriptors)
            .unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::ENFILE));
    }
}
