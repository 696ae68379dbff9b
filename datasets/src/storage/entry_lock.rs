//! The cache entries' file locks (`flock` through fs4): shared while an entry is read, exclusive
//! to fetch or evict it, waits with a deadline, and the lock file's mtime as the entry's last use.
//!
//! An eviction removes the entry's lock file too, while it holds it exclusive (else every
//! entry ever read leaves a file, one per sample or token window read from a bucket). A lock
//! taken on a descriptor opened before that removal locks a file no path names any more, and
//! another process may lock the new file made at the same path meanwhile: so every lock taken
//! here is checked to be on the file the path names now, and taken again on that one when not.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use fs4::FileExt;
use fs4::TryLockError;
use tracing::{debug, info};

use crate::error::{Error, Result};

/// Opens the lock file at `path`, creating it and its folder where missing.
pub(super) fn open_lock_file(path: &Path) -> Result<File> {
    let mut tries = 0;
    loop {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| Error::cache(parent, source))?;
        }
        match OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
        {
            Ok(file) => return Ok(file),
            // An eviction took the emptied folder away between the two calls.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound && tries < 3 => tries += 1,
            Err(source) => return Err(Error::cache(path, source)),
        }
    }
}

/// Whether `file` is the file `path` names now (an eviction removes a lock file it holds).
fn is_current(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(held), Ok(named)) => held.dev() == named.dev() && held.ino() == named.ino(),
        _ => false,
    }
}

/// Once a lock is taken on `file`: `true` when `file` is the lock file at `path`; else the lock
/// goes and `file` becomes the file at `path` now, not yet locked.
fn kept_or_reopened(file: &mut File, path: &Path) -> Result<bool> {
    if is_current(file, path) {
        return Ok(true);
    }
    let _ = FileExt::unlock(file);
    *file = open_lock_file(path)?;
    Ok(false)
}

/// Tries to lock the entry whose lock file is at `path`, through `file` (opened from it, and
/// opened again from it when an eviction removed the one it was), without waiting.
/// `Ok(false)`: someone else holds a conflicting lock.
pub(super) fn try_lock(file: &mut File, exclusive: bool, path: &Path) -> Result<bool> {
    loop {
        if !try_lock_once(file, exclusive, path)? {
            return Ok(false);
        }
        if kept_or_reopened(file, path)? {
            return Ok(true);
        }
    }
}

fn try_lock_once(file: &File, exclusive: bool, path: &Path) -> Result<bool> {
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

/// Waits for a lock on `file`, polling, up to `timeout` (every wait has a deadline). With
/// `written` (the entry's data path), the deadline counts from the last time the holder wrote
/// to a part file of that entry (`<data>.stoker-part-*`), not from the start: a download or
/// decompression that keeps writing is waited out however long it takes, one that stopped
/// writing for `timeout` is not.
pub(super) fn wait_for_lock(
    file: &mut File,
    exclusive: bool,
    path: &Path,
    timeout: Duration,
    written: Option<&Path>,
) -> Result<()> {
    let started = Instant::now();
    let mut clock = started;
    let mut last_write = written.and_then(last_part_write);
    let mut checked = started;
    let mut pause = Duration::from_millis(5);
    let mut logged = false;
    loop {
        if try_lock(file, exclusive, path)? {
            return Ok(());
        }
        if let Some(data) = written {
            if checked.elapsed() >= PROGRESS_CHECK {
                checked = Instant::now();
                let now = last_part_write(data);
                if now.is_some() && now != last_write {
                    last_write = now;
                    clock = Instant::now();
                }
            }
        }
        if clock.elapsed() >= timeout {
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

/// How often a wait looks for the holder's writes.
const PROGRESS_CHECK: Duration = Duration::from_millis(500);

/// The latest modification time of the part files of the entry at `data` (another process's
/// download or copy in progress); `None` when there is none.
fn last_part_write(data: &Path) -> Option<SystemTime> {
    let folder = data.parent()?;
    let prefix = format!(
        "{}{}",
        data.file_name()?.to_string_lossy(),
        super::entry::PART_MARKER
    );
    std::fs::read_dir(folder)
        .ok()?
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(&prefix))
        .filter_map(|entry| entry.metadata().ok()?.modified().ok())
        .max()
}

pub(super) fn unlock(file: &File, path: &Path) -> Result<()> {
    FileExt::unlock(file).map_err(|source| Error::cache(path, source))
}

/// Turns the exclusive lock held on `file` into a shared one, marking the entry used first:
/// `flock` converts a lock by dropping it and taking the other kind, and an evictor that tries
/// the lock in that gap takes the least recently used entries first, so the entry goes
/// there as the newest. Another process may take the lock exclusive in that gap (an evictor,
/// or a fetch of the file the path names after an eviction): the shared lock is waited for
/// as [`wait_for_lock`] waits, up to `timeout`. An entry evicted in that gap (its lock file
/// removed) is locked shared through the file at `path` now, which the caller finds holding
/// no valid entry.
pub(super) fn downgrade(
    file: &mut File,
    path: &Path,
    timeout: Duration,
    written: Option<&Path>,
) -> Result<()> {
    touch(file, path);
    wait_for_lock(file, false, path, timeout, written)
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
        let mut first = File::create(&path).unwrap();
        let mut second = File::open(&path).unwrap();
        assert!(try_lock(&mut first, false, &path).unwrap());
        assert!(
            try_lock(&mut second, false, &path).unwrap(),
            "shared locks coexist"
        );
        unlock(&second, &path).unwrap();
        assert!(
            !try_lock(&mut second, true, &path).unwrap(),
            "a reader blocks eviction"
        );
        unlock(&first, &path).unwrap();
        assert!(try_lock(&mut second, true, &path).unwrap());
        assert!(
            !try_lock(&mut first, false, &path).unwrap(),
            "a fetch blocks readers"
        );
        let error =
            wait_for_lock(&mut first, false, &path, Duration::from_millis(50), None).unwrap_err();
        assert!(matches!(error, Error::CacheLockTimeout { .. }));
    }

    /// A wait for an entry whose holder keeps writing its part file lasts past the timeout,
    /// counted from the last write; once the writes stop, it ends a timeout later.
    #[test]
    fn a_wait_lasts_while_the_holder_writes_the_entry() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("object");
        let lock_path = dir.path().join("object.stoker-lock");
        let mut holder = File::create(&lock_path).unwrap();
        let mut waiter = File::open(&lock_path).unwrap();
        assert!(try_lock(&mut holder, true, &lock_path).unwrap());
        let part = dir.path().join("object.stoker-part-1-0");
        let writing = std::thread::spawn(move || {
            use std::io::Write;
            let mut file = File::create(&part).unwrap();
            // 2.4 s of writes, each a little over the 0.9 s timeout's third.
            for _ in 0..8 {
                std::thread::sleep(Duration::from_millis(300));
                file.write_all(b"bytes").unwrap();
                file.set_modified(SystemTime::now()).unwrap();
            }
            drop(file);
            std::thread::sleep(Duration::from_millis(1500));
            holder
        });
        let started = Instant::now();
        let timeout = Duration::from_millis(900);
        let error =
            wait_for_lock(&mut waiter, false, &lock_path, timeout, Some(&data)).unwrap_err();
        let waited = started.elapsed();
        assert!(matches!(error, Error::CacheLockTimeout { .. }));
        assert!(
            waited >= Duration::from_millis(2400) && waited < Duration::from_secs(10),
            "{waited:?}"
        );
        let mut holder = writing.join().unwrap();
        unlock(&holder, &lock_path).unwrap();
        // Without a path to watch, the timeout counts from the start.
        assert!(try_lock(&mut holder, true, &lock_path).unwrap());
        let started = Instant::now();
        wait_for_lock(&mut waiter, false, &lock_path, timeout, None).unwrap_err();
        assert!(started.elapsed() < Duration::from_millis(2000));
    }

    /// A lock taken through a descriptor of a lock file an eviction removed is taken on the
    /// file the path names now: here another process holds that one, so the lock is refused,
    /// where it was granted on the removed file and two processes held the entry.
    #[test]
    fn a_lock_file_removed_by_an_eviction_is_locked_again_where_its_path_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir
            .path()
            .join("ranges.stoker-ranges")
            .join("0-8.stoker-lock");
        let mut early = open_lock_file(&path).unwrap();
        let mut evictor = open_lock_file(&path).unwrap();
        assert!(try_lock(&mut evictor, true, &path).unwrap());
        std::fs::remove_file(&path).unwrap();
        std::fs::remove_dir(path.parent().unwrap()).unwrap();
        drop(evictor);
        let mut fetcher = open_lock_file(&path).unwrap();
        assert!(try_lock(&mut fetcher, true, &path).unwrap());
        assert!(!try_lock(&mut early, false, &path).unwrap());
        unlock(&fetcher, &path).unwrap();
        assert!(try_lock(&mut early, false, &path).unwrap());
        assert!(is_current(&early, &path));
        // An exclusive lock taken through a descriptor of a removed file lands on the current
        // file too, and so does the shared lock a downgrade takes.
        unlock(&early, &path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let mut stale = fetcher;
        assert!(try_lock(&mut stale, true, &path).unwrap());
        assert!(is_current(&stale, &path), "locked again on the new file");
        let mut downgraded = open_lock_file(&path).unwrap();
        assert!(try_lock(&mut downgraded, true, &path).is_ok_and(|taken| !taken));
        unlock(&stale, &path).unwrap();
        assert!(try_lock(&mut downgraded, true, &path).unwrap());
        std::fs::remove_file(&path).unwrap();
        downgrade(&mut downgraded, &path, Duration::from_secs(5), None).unwrap();
        assert!(
            is_current(&downgraded, &path),
            "shared on the file the path names"
        );
    }

    /// A downgrade whose lock file an eviction replaced, the new one held exclusive by another
    /// process (fetching it, or stopped), ends at its timeout: it waited for good.
    #[test]
    fn a_downgrade_onto_a_file_held_exclusive_elsewhere_ends_at_its_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("entry.stoker-lock");
        let mut ours = open_lock_file(&path).unwrap();
        assert!(try_lock(&mut ours, true, &path).unwrap());
        std::fs::remove_file(&path).unwrap();
        let mut other = open_lock_file(&path).unwrap();
        assert!(try_lock(&mut other, true, &path).unwrap());
        let (sender, receiver) = std::sync::mpsc::channel();
        let downgraded = path.clone();
        std::thread::spawn(move || {
            let timeout = Duration::from_millis(300);
            let _ = sender.send(downgrade(&mut ours, &downgraded, timeout, None));
        });
        let result = receiver
            .recv_timeout(Duration::from_secs(20))
            .expect("the downgrade returns");
        assert!(
            matches!(result, Err(Error::CacheLockTimeout { .. })),
            "{result:?}"
        );
        unlock(&other, &path).unwrap();
    }

    #[test]
    fn an_entry_is_the_newest_before_its_lock_is_downgraded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("entry.stoker-lock");
        // A lock file left by an entry evicted long ago.
        let mut file = File::create(&path).unwrap();
        file.set_modified(SystemTime::UNIX_EPOCH).unwrap();
        assert!(try_lock(&mut file, true, &path).unwrap());
        downgrade(&mut file, &path, Duration::from_secs(5), None).unwrap();
        let age = std::fs::metadata(&path)
            .unwrap()
            .modified()
            .unwrap()
            .elapsed()
            .unwrap();
        assert!(age < Duration::from_secs(60), "last use {age:?} ago");
        // Shared now: another reader gets in, an evictor does not.
        let mut other = File::open(&path).unwrap();
        assert!(try_lock(&mut other, false, &path).unwrap());
        unlock(&other, &path).unwrap();
        assert!(!try_lock(&mut other, true, &path).unwrap());
    }
}
