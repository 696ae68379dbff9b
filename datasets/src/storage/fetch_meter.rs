//! How many bytes were fetched into a cache folder since its cap was last enforced, counted by
//! every process that uses the folder: one 8-byte file (`.stoker-fetched`) mapped shared, added
//! to atomically. A cap check (a walk of the folder) comes after an eighth of the cap was
//! fetched by any of them together, so eight ranks on a node overshoot the cap by an eighth,
//! not by eight eighths as when each counted its own fetches. Processes on other machines
//! (a folder on a network file system) keep their own count; where the file cannot be mapped,
//! the process does.

use std::fs::{File, OpenOptions};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::debug;

/// The file under the cache folder that holds the count.
const METER_FILE: &str = ".stoker-fetched";

/// The count of bytes fetched since the last cap check, shared when the folder's file maps.
pub(super) struct FetchMeter {
    shared: Option<SharedWord>,
    local: AtomicU64,
}

/// One `u64` in a shared mapping of the meter file.
struct SharedWord {
    word: NonNull<AtomicU64>,
    _file: File,
}

// SAFETY: the mapping is only reached through atomic operations, from any thread.
unsafe impl Send for SharedWord {}
// SAFETY: as above.
unsafe impl Sync for SharedWord {}

impl Drop for SharedWord {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `SharedWord::map`, of `size_of::<u64>()` bytes, unmapped
        // once; nothing else points into it.
        unsafe { libc::munmap(self.word.as_ptr().cast(), std::mem::size_of::<u64>()) };
    }
}

impl SharedWord {
    fn map(dir: &Path) -> std::io::Result<SharedWord> {
        let path = dir.join(METER_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        let len = std::mem::size_of::<u64>();
        if file.metadata()?.len() < len as u64 {
            // Extending zero-fills; another process doing the same at once changes nothing.
            file.set_len(len as u64)?;
        }
        // SAFETY: a fresh shared mapping of the file's first 8 bytes, which exist; no other
        // mapping in this process is affected.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // A mapping is page-aligned, so aligned for an AtomicU64.
        let word = NonNull::new(base.cast::<AtomicU64>())
            .ok_or_else(|| std::io::Error::other("mmap gave a null mapping"))?;
        Ok(SharedWord { word, _file: file })
    }

    fn get(&self) -> &AtomicU64 {
        // SAFETY: the mapping lives as long as `self` and holds an initialised u64 (zeros, or
        // what the processes sharing it wrote).
        unsafe { self.word.as_ref() }
    }
}

impl FetchMeter {
    /// The meter of the cache folder `dir` (which exists); a count of this process's own
    /// when the folder's file cannot be made or mapped.
    pub(super) fn open(dir: &Path) -> FetchMeter {
        let shared = match SharedWord::map(dir) {
            Ok(shared) => Some(shared),
            Err(error) => {
                debug!(cache = %dir.display(), %error, "cannot map the cache's shared fetch meter; counting this process's fetches only");
                None
            }
        };
        FetchMeter {
            shared,
            local: AtomicU64::new(0),
        }
    }

    /// Whether the count is shared through the folder's file.
    #[cfg(test)]
    pub(super) fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// Adds `bytes` fetched; true when the count (of every process sharing it) passed
    /// `threshold`: the count then starts again, and the caller, the one that passed it,
    /// checks the cap.
    pub(super) fn add(&self, bytes: u64, threshold: u64) -> bool {
        let count = self.shared.as_ref().map_or(&self.local, SharedWord::get);
        let since = count
            .fetch_add(bytes, Ordering::AcqRel)
            .saturating_add(bytes);
        // Of the callers that saw the threshold passed, only the one that takes the count
        // back to zero while it is still past checks.
        since > threshold && count.swap(0, Ordering::AcqRel) > threshold
    }
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
