//! The cache entries' file locks (`flock` through fs4): shared while an entry is read, exclusive
//! to fetch or evict it, waits with a deadline, and the lock file's mtime as the entry's last use.

use std::fs::File;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use fs4::FileExt;
use fs4::TryLockError;
use tracing::{debug, info};

use crate::error::{Error, Result};

/// Tries to lock `file` without waiting. `Ok(false)`: someone else holds a conflicting lock.
pub(super) fn try_lock(file: &File, exclusive: bool, path: &Path) -> Result<bool> {
    let attempt = if exclusive {
        FileExt::try_lock(file)
    } else {
        FileExt::try_lock_shared(file)
    };
    match attempt {
        Ok(()) => Ok(true),
        Err(TryLockError::WouldBlock) => Ok(false),
        Err(TryLockError::Error(source)) => Err(Error::cache(path, source)),
    }
}

/// Waits for a lock on `file`, polling, up to `timeout` (every wait has a deadline).
pub(super) fn wait_for_lock(
    file: &File,
    exclusive: bool,
    path: &Path,
    timeout: Duration,
) -> Result<()> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(5);
    let mut logged = false;
    loop {
        if try_lock(file, exclusive, path)? {
            return Ok(());
        }
        if started.elapsed() >= timeout {
            return Err(Error::CacheLockTimeout {
                path: path.to_path_buf(),
                waited_seconds: started.elapsed().as_secs(),
            });
        }
        if !logged && started.elapsed() >= Duration::from_secs(2) {
            info!(lock = %path.display(), "waiting for a cache entry another process is fetching");
            logged = true;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

pub(super) fn unlock(file: &File, path: &Path) -> Result<()> {
    FileExt::unlock(file).map_err(|source| Error::cache(path, source))
}

/// Turns the exclusive lock held on `file` into a shared one, marking the entry used first:
/// `flock` converts a lock by dropping it and taking the other kind, and an evictor that tries
/// the lock in that gap takes the least recently used entries first, so the entry goes
/// there as the newest, not with a lock file's old time (left by an entry evicted before).
pub(super) fn downgrade(file: &File, path: &Path) -> Result<()> {
    touch(file, path);
    FileExt::lock_shared(file).map_err(|source| Error::cache(path, source))
}

/// Marks the entry as just used (the eviction order reads it back).
pub(super) fn touch(lock: &File, path: &Path) {
    if let Err(error) = lock.set_modified(SystemTime::now()) {
        debug!(lock = %path.display(), %error, "cannot record the last use of a cache entry");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locks_exclude_across_handles_of_one_process() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("entry.stoker-lock");
        let first = File::create(&path).unwrap();
        let second = File::open(&path).unwrap();
        assert!(try_lock(&first, false, &path).unwrap());
        assert!(
            try_lock(&second, false, &path).unwrap(),
            "shared locks coexist"
        );
        unlock(&second, &path).unwrap();
        assert!(
            !try_lock(&second, true, &path).unwrap(),
            "a reader blocks eviction"
        );
        unlock(&first, &path).unwrap();
        assert!(try_lock(&second, true, &path).unwrap());
        assert!(
            !try_lock(&first, false, &path).unwrap(),
            "a fetch blocks readers"
        );
        let error = wait_for_lock(&first, false, &path, Duration::from_millis(50)).unwrap_err();
        assert!(matches!(error, Error::CacheLockTimeout { .. }));
    }

    #[test]
    fn an_entry_is_the_newest_before_its_lock_is_downgraded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("entry.stoker-lock");
        // A lock file left by an entry evicted long ago.
        let file = File::create(&path).unwrap();
        file.set_modified(SystemTime::UNIX_EPOCH).unwrap();
        assert!(try_lock(&file, true, &path).unwrap());
        downgrade(&file, &path).unwrap();
        let age = std::fs::metadata(&path)
            .unwrap()
            .modified()
            .unwrap()
            .elapsed()
            .unwrap();
        assert!(age < Duration::from_secs(60), "last use {age:?} ago");
        // Shared now: another reader gets in, an evictor does not.
        let other = File::open(&path).unwrap();
        assert!(try_lock(&other, false, &path).unwrap());
        unlock(&other, &path).unwrap();
        assert!(!try_lock(&other, true, &path).unwrap());
    }
}
