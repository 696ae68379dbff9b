//! How many bytes were fetched into a cache folder since its cap was last enforced, counted by
//! every process that uses the folder: one 8-byte file (`.stoker-fetched`), read and rewritten
//! under its `flock`. A cap check (a walk of the folder) comes after an eighth of the cap was
//! fetched by all of them together, so eight ranks on a node overshoot the cap by an eighth,
//! not by eight eighths as when each counted its own fetches. A count that cannot be read or
//! written (a full disk, a folder gone), or whose lock another process holds too long, is kept
//! by the process alone meanwhile: nothing here fails or stalls a read (a file mapped instead
//! would turn a full disk into a SIGBUS).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::debug;

/// The file under the cache folder that holds the count.
const METER_FILE: &str = ".stoker-fetched";

/// The count of bytes fetched since the last cap check: the folder's file when it can be
/// used, else this process's own.
pub(super) struct FetchMeter {
    file: Option<File>,
    /// One thread of this process at a time: a `flock` belongs to the open file, which every
    /// thread shares, so it keeps out other processes only.
    threads: Mutex<()>,
    local: AtomicU64,
}

impl FetchMeter {
    /// The meter of the cache folder `dir` (which exists); a count of this process's own
    /// when the folder's file cannot be made.
    pub(super) fn open(dir: &Path) -> FetchMeter {
        let path = dir.join(METER_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|error| {
                debug!(meter = %path.display(), %error, "cannot open the cache's shared fetch meter; counting this process's fetches only");
            })
            .ok();
        FetchMeter {
            file,
            threads: Mutex::new(()),
            local: AtomicU64::new(0),
        }
    }

    /// Whether the count is shared through the folder's file.
    #[cfg(test)]
    pub(super) fn is_shared(&self) -> bool {
        self.file.is_some()
    }

    /// Adds `bytes` fetched; true when the count (of every process sharing it) passed
    /// `threshold`: the count then starts again, and the caller, the one that passed it,
    /// checks the cap.
    pub(super) fn add(&self, bytes: u64, threshold: u64) -> bool {
        if let Some(file) = &self.file {
            let _one_thread = self.threads.lock().unwrap_or_else(PoisonError::into_inner);
            match add_shared(file, bytes, threshold) {
                Ok(passed) => return passed,
                Err(error) => {
                    debug!(%error, "cannot update the cache's shared fetch meter; counting alone")
                }
            }
        }
        let since = self
            .local
            .fetch_add(bytes, Ordering::AcqRel)
            .saturating_add(bytes);
        since > threshold
            && self
                .local
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |count| {
                    (count > threshold).then_some(0)
                })
                .is_ok()
    }
}

/// How long a process waits for another's hold of the meter (microseconds, normally) before it
/// counts alone for this fetch: a holder stopped or stuck never stalls the others' reads.
const LOCK_PATIENCE: Duration = Duration::from_millis(200);

/// The shared count's read, add and write, under the file's exclusive lock (a short file, as
/// a new one is, reads as zero).
fn add_shared(file: &File, bytes: u64, threshold: u64) -> std::io::Result<bool> {
    let deadline = Instant::now() + LOCK_PATIENCE;
    loop {
        match fs4::FileExt::try_lock(file) {
            Ok(()) => break,
            Err(fs4::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(fs4::TryLockError::WouldBlock) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::WouldBlock,
                    "another process held the fetch meter too long",
                ))
            }
            Err(fs4::TryLockError::Error(error)) => return Err(error),
        }
    }
    let updated = (|| -> std::io::Result<bool> {
        let mut word = [0u8; 8];
        let read = file.read_at(&mut word, 0)?;
        let count = if read == word.len() {
            u64::from_le_bytes(word)
        } else {
            0
        };
        let since = count.saturating_add(bytes);
        let passed = since > threshold;
        let stored = if passed { 0 } else { since };
        file.write_all_at(&stored.to_le_bytes(), 0)?;
        Ok(passed)
    })();
    let unlocked = fs4::FileExt::unlock(file);
    let passed = updated?;
    unlocked?;
    Ok(passed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meters_of_one_folder_share_their_count() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (FetchMeter::open(dir.path()), FetchMeter::open(dir.path()));
        assert!(a.is_shared() && b.is_shared());
        assert!(!a.add(600, 1000));
        // The other meter sees the first's bytes: 1,200 passed the threshold.
        assert!(b.add(600, 1000));
        // Started again.
        assert!(!a.add(600, 1000));
        // A meter of another folder counts apart.
        let other = tempfile::tempdir().unwrap();
        assert!(!FetchMeter::open(other.path()).add(600, 1000));
        // Opened again later (another process starting), the count carries on.
        assert!(FetchMeter::open(dir.path()).add(600, 1000));
    }

    #[test]
    fn threads_of_one_process_lose_no_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let meter = FetchMeter::open(dir.path());
        std::thread::scope(|scope| {
            for _ in 0..8 {
                scope.spawn(|| {
                    for _ in 0..500 {
                        assert!(!meter.add(1, u64::MAX / 2));
                    }
                });
            }
        });
        // What the file holds: every thread's bytes, none lost to another's read.
        let bytes = std::fs::read(dir.path().join(METER_FILE)).unwrap();
        let count = u64::from_le_bytes(bytes[..8].try_into().unwrap());
        assert_eq!(count, 8 * 500);
    }

    #[test]
    fn without_its_file_a_meter_counts_alone() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("not-there");
        let meter = FetchMeter::open(&missing);
        assert!(!meter.is_shared());
        assert!(!meter.add(600, 1000));
        assert!(meter.add(600, 1000));
        assert!(!meter.add(600, 1000));
    }
}
