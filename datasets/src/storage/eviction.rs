//! Keeping the cache tier under its cap: a scan of the entries on disk (removing downloads left
//! by dead processes: a part file whose entry nobody holds locked), then least-recently-used
//! eviction of the entries no process holds.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use tracing::{debug, warn};

use super::entry::{
    with_suffix, INDEX_SUFFIX, LOCAL_ROOT, LOCK_SUFFIX, META_SUFFIX, PART_MARKER, RANGES_SUFFIX,
    VERSIONS_SUFFIX,
};
use super::entry_lock::try_lock;
use super::stats::Counters;
use crate::error::Result;

/// Parts whose entry's lock cannot be tried (an unreadable lock file) are removed once this
/// old.
const STALE_PART_AGE: Duration = Duration::from_secs(24 * 60 * 60);

/// Evicts least-recently-used entries nobody holds from the cache in `dir` until the cached
/// objects add up to `max_bytes` at most, counting evictions in `counters`. Entries in use
/// (locked by any process) are skipped; leftover downloads of dead processes are removed on
/// the way.
pub(super) fn evict_to_cap(dir: &Path, max_bytes: u64, counters: &Counters) -> Result<()> {
    #[cfg(test)]
    tests::count_walk(dir);
    let mut entries = Vec::new();
    // Remote objects, and copies made from local files (`derived.rs`).
    scan(&dir.join("s3"), &mut entries);
    scan(&dir.join(LOCAL_ROOT), &mut entries);
    let mut total: u64 = entries.iter().map(|entry| entry.size).sum();
    if total <= max_bytes {
        return Ok(());
    }
    entries.sort_by_key(|entry| entry.last_use);
    for entry in &entries {
        if total <= max_bytes {
            break;
        }
        let mut lock = match OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&entry.lock)
        {
            Ok(lock) => lock,
            Err(error) => {
                debug!(lock = %entry.lock.display(), %error, "cannot open a cache lock; not evicting");
                continue;
            }
        };
        if !try_lock(&mut lock, true, &entry.lock)? {
            continue;
        }
        // The metadata goes first: without it the entry is invalid whatever is left.
        for path in [
            &entry.meta,
            &entry.data,
            &with_suffix(&entry.data, INDEX_SUFFIX),
        ] {
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => {
                    warn!(path = %path.display(), %error, "cannot remove an evicted cache file")
                }
            }
        }
        // The lock file last, still held (see `entry_lock`), and the folder of an object's
        // ranges or versions once it holds nothing: every entry read once left both.
        match std::fs::remove_file(&entry.lock) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                debug!(path = %entry.lock.display(), %error, "cannot remove an evicted lock file")
            }
        }
        if let Some(folder) = entry.lock.parent().filter(|folder| {
            let name = folder.file_name().unwrap_or_default().to_string_lossy();
            name.ends_with(RANGES_SUFFIX) || name.ends_with(VERSIONS_SUFFIX)
        }) {
            let _ = std::fs::remove_dir(folder); // refused while it holds anything
        }
        drop(lock);
        total -= entry.size;
        counters.evictions.fetch_add(1, Ordering::Relaxed);
        counters
            .bytes_evicted
            .fetch_add(entry.size, Ordering::Relaxed);
        debug!(path = %entry.data.display(), bytes = entry.size, "evicted from the object cache");
    }
    if total > max_bytes {
        warn!(
            cache = %dir.display(),
            bytes = total,
            cap = max_bytes,
            "object cache is over its cap: every entry left is in use"
        );
    }
    Ok(())
}

/// An entry found by the eviction scan.
struct ScannedEntry {
    data: PathBuf,
    meta: PathBuf,
    lock: PathBuf,
    size: u64,
    last_use: SystemTime,
}

/// Finds every entry (by its metadata file) under `folder`, removing stale leftovers.
fn scan(folder: &Path, entries: &mut Vec<ScannedEntry>) {
    let Ok(listing) = std::fs::read_dir(folder) else {
        return;
    };
    for item in listing.flatten() {
        let path = item.path();
        let Ok(file_type) = item.file_type() else {
            continue;
        };
        if file_type.is_dir() {
            scan(&path, entries);
            continue;
        }
        let name = item.file_name();
        let name = name.to_string_lossy();
        if let Some((data_name, _)) = name.split_once(PART_MARKER) {
            // A download holds its entry's lock exclusive until the part is renamed into
            // place: a part whose entry nobody holds was left by a process that died. The
            // metadata being written (`<data>.stoker-meta.stoker-part-...`) is its entry's too.
            let data_name = data_name.strip_suffix(META_SUFFIX).unwrap_or(data_name);
            let lock = with_suffix(&path.with_file_name(data_name), LOCK_SUFFIX);
            let abandoned = match OpenOptions::new().read(true).write(true).open(&lock) {
                Ok(mut file) => try_lock(&mut file, true, &lock).unwrap_or(false),
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => true,
                Err(_) => item
                    .metadata()
                    .and_then(|metadata| metadata.modified())
                    .ok()
                    .and_then(|modified| modified.elapsed().ok())
                    .is_some_and(|age| age > STALE_PART_AGE),
            };
            if abandoned {
                debug!(part = %path.display(), "removing a download a process left behind");
                let _ = std::fs::remove_file(&path);
            }
            continue;
        }
        let Some(data_name) = name.strip_suffix(META_SUFFIX) else {
            continue;
        };
        let data = path.with_file_name(data_name);
        let lock = with_suffix(&data, LOCK_SUFFIX);
        let size = std::fs::metadata(&data).map_or(0, |metadata| metadata.len());
        let last_use = std::fs::metadata(&lock)
            .or_else(|_| item.metadata())
            .and_then(|metadata| metadata.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        entries.push(ScannedEntry {
            data,
            meta: path,
            lock,
            size,
            last_use,
        });
    }
}

#[cfg(test)]
pub(super) mod tests {
    /// Walks of each cache folder (for the tests that count them).
    static WALKS: std::sync::Mutex<std::collections::BTreeMap<std::path::PathBuf, u64>> =
        std::sync::Mutex::new(std::collections::BTreeMap::new());

    pub(in crate::storage) fn count_walk(dir: &Path) {
        let mut walks = WALKS.lock().unwrap_or_else(|p| p.into_inner());
        *walks.entry(dir.to_path_buf()).or_default() += 1;
    }

    /// The walks of the cache folder `dir` so far.
    pub(in crate::storage) fn walks_of(dir: &Path) -> u64 {
        let walks = WALKS.lock().unwrap_or_else(|p| p.into_inner());
        walks.get(dir).copied().unwrap_or(0)
    }

    use super::*;

    #[test]
    fn a_download_left_by_a_dead_process_goes_at_once_one_in_progress_stays() {
        let dir = tempfile::tempdir().unwrap();
        let bucket = dir.path().join("s3").join("bucket");
        std::fs::create_dir_all(&bucket).unwrap();
        // Two parts: one whose downloader holds its entry's lock, one nobody holds.
        let busy_lock = bucket.join("busy.stoker-lock");
        let mut held = std::fs::File::create(&busy_lock).unwrap();
        assert!(try_lock(&mut held, true, &busy_lock).unwrap());
        let busy = bucket.join("busy.stoker-part-4242-0");
        std::fs::write(&busy, b"half").unwrap();
        std::fs::File::create(bucket.join("left.stoker-lock")).unwrap();
        let left = bucket.join("left.stoker-part-4242-1");
        std::fs::write(&left, b"half").unwrap();
        let orphan = bucket.join("nolock.stoker-part-4242-2");
        std::fs::write(&orphan, b"half").unwrap();
        // The metadata a commit is writing under the entry's lock, before its rename.
        let committing = bucket.join("busy.stoker-meta.stoker-part-4242-meta");
        std::fs::write(&committing, b"{}").unwrap();
        evict_to_cap(dir.path(), u64::MAX, &Counters::default()).unwrap();
        assert!(busy.exists(), "a download in progress is kept");
        assert!(committing.exists(), "metadata being committed is kept");
        assert!(
            !left.exists() && !orphan.exists(),
            "abandoned downloads are removed"
        );
        drop(held);
    }
}
