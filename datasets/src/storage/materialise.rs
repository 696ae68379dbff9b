//! Entries brought into the cache for a read: hits taken as they are, the rest downloaded
//! together and committed one by one, entries another process holds waited for.
//!
//! A lock is turned from exclusive to shared by dropping it and taking the other kind
//! (`flock`), and an evictor may take the entry in that gap: every downgrade here is checked
//! for a valid entry after it, and an entry evicted so is fetched again, up to
//! [`MAX_FETCHES`] times, then refused naming the cap (it is smaller than the objects in use
//! at once). The shared lock a downgrade takes is waited for as any other, with a deadline.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::debug;

use super::cache::{Downloading, LockWait, ObjectCache, Wanted};
use super::download::{self, Download, FetchPlan};
use super::entry::{commit, with_suffix, CachedObject, Entry, PartFile, Validity};
use super::entry::{PART_MARKER, RANGES_SUFFIX};
use super::entry_lock::{downgrade, touch, try_lock, unlock, wait_for_lock};
use super::s3_client::Store;
use super::uri::RemoteLocation;
use crate::error::{Error, Result};

/// How many times one read fetches an entry that an eviction takes before it is read.
pub(super) const MAX_FETCHES: u32 = 3;

/// Entries downloaded together, each with a part file open while it comes.
const DOWNLOAD_BATCH: usize = 64;

/// What a download brought: entries committed and locked shared, each with its place among
/// those asked for, and entries evicted between their commit and their lock's downgrade.
#[derive(Default)]
struct Fetched {
    objects: Vec<(usize, CachedObject)>,
    evicted: Vec<(usize, Entry, File)>,
}

/// An entry another process holds (or an eviction took): its place, the entry, its lock (not
/// held, or held shared on no valid entry) and how many times this read fetched it.
type Waiting = (usize, Entry, File, u32);

impl LockWait {
    /// The longest wait for one lock, with no deadline set for the lot.
    fn longest(self) -> Duration {
        match self {
            LockWait::Each(wait) | LockWait::InAll(wait) => wait,
        }
    }

    /// The data file whose part files' writes extend a wait: a whole object is waited for as
    /// long as its download keeps writing; a range is read past the cache once its short
    /// wait is over.
    fn written(self, entry: &Entry) -> Option<&Path> {
        matches!(self, LockWait::Each(_)).then_some(entry.data.as_path())
    }
}

impl ObjectCache {
    /// Brings `wanted` into the cache (hits as they are, the rest downloaded together) and
    /// returns them in order, each locked shared. Entries another process is fetching or
    /// evicting are waited for as `wait` says, then [`Error::CacheLockTimeout`].
    pub(super) fn materialise(
        &self,
        store: &Arc<Store>,
        location: &RemoteLocation,
        wanted: Vec<Wanted>,
        reading: bool,
        wait: LockWait,
    ) -> Result<Vec<CachedObject>> {
        let mut ready: Vec<Option<CachedObject>> = wanted.iter().map(|_| None).collect();
        let mut to_fetch = Vec::new();
        let mut contended: VecDeque<Waiting> = VecDeque::new();
        for (position, object) in wanted.iter().map(|w| &w.meta).enumerate() {
            let entry = Entry::new(&self.options.dir, location, object)?;
            let mut lock = entry.open_lock()?;
            if try_lock(&mut lock, false, &entry.lock)? {
                if entry.is_valid() {
                    ready[position] = Some(self.hit(entry, lock, reading));
                    continue;
                }
                unlock(&lock, &entry.lock)?;
            }
            if try_lock(&mut lock, true, &entry.lock)? {
                if entry.validity() == Validity::Valid {
                    downgrade(&mut lock, &entry.lock, wait.longest(), wait.written(&entry))?;
                    if entry.is_valid() {
                        ready[position] = Some(self.hit(entry, lock, reading));
                        continue;
                    }
                    // Evicted in the downgrade's gap: fetched again below.
                    contended.push_back((position, entry, lock, 0));
                } else {
                    to_fetch.push((position, entry, lock));
                }
            } else {
                contended.push_back((position, entry, lock, 0));
            }
        }
        let fetched = self.download(store, to_fetch, &wanted, reading, wait)?;
        for (position, object) in fetched.objects {
            ready[position] = Some(object);
        }
        for (position, entry, lock) in fetched.evicted {
            contended.push_back((position, entry, lock, 1));
        }
        // Entries another process was fetching or evicting: wait for it, then use its copy or
        // fetch ours.
        let deadline = match wait {
            LockWait::InAll(wait) => Some(Instant::now() + wait),
            LockWait::Each(_) => None,
        };
        while let Some((position, entry, mut lock, fetches)) = contended.pop_front() {
            let timeout = match deadline {
                Some(deadline) => deadline.saturating_duration_since(Instant::now()),
                None => wait.longest(),
            };
            let written = wait.written(&entry);
            wait_for_lock(&mut lock, false, &entry.lock, timeout, written)?;
            if entry.is_valid() {
                ready[position] = Some(self.hit(entry, lock, reading));
                continue;
            }
            unlock(&lock, &entry.lock)?;
            wait_for_lock(&mut lock, true, &entry.lock, timeout, written)?;
            if entry.validity() == Validity::Valid {
                downgrade(&mut lock, &entry.lock, timeout, written)?;
                if entry.is_valid() {
                    ready[position] = Some(self.hit(entry, lock, reading));
                    continue;
                }
                // Evicted in the downgrade's gap: fetched again, under the exclusive lock.
                unlock(&lock, &entry.lock)?;
                wait_for_lock(&mut lock, true, &entry.lock, timeout, written)?;
            }
            if fetches >= MAX_FETCHES {
                return Err(evicted_as_fetched(&entry, self.options.max_bytes, fetches));
            }
            let fetched =
                self.download(store, vec![(position, entry, lock)], &wanted, reading, wait)?;
            for (position, object) in fetched.objects {
                ready[position] = Some(object);
            }
            for (position, entry, lock) in fetched.evicted {
                contended.push_back((position, entry, lock, fetches + 1));
            }
        }
        Ok(ready.into_iter().flatten().collect())
    }

    /// Records a hit on an entry whose lock is held shared.
    fn hit(&self, entry: Entry, lock: File, reading: bool) -> CachedObject {
        touch(&lock, &entry.lock);
        if reading {
            self.counters.hits.fetch_add(1, Ordering::Relaxed);
            self.counters
                .bytes_from_cache
                .fetch_add(entry.listed.size, Ordering::Relaxed);
        }
        entry.into_cached(lock)
    }

    /// Downloads entries whose locks are held exclusive, commits them, and returns them with
    /// their locks turned shared (those an eviction took in the downgrade's gap apart):
    /// [`DOWNLOAD_BATCH`] at a time, so the part files open at once stay few whatever the
    /// objects (each entry's lock is one descriptor already, held as long as it is read: with a
    /// part file each, a set of 600 objects took 1,200 at once, past the common soft limit of
    /// 1,024, and failed to open).
    fn download(
        &self,
        store: &Arc<Store>,
        mut entries: Vec<(usize, Entry, File)>,
        sources: &[Wanted],
        reading: bool,
        wait: LockWait,
    ) -> Result<Fetched> {
        let mut fetched = Fetched::default();
        while !entries.is_empty() {
            let rest = entries.split_off(entries.len().min(DOWNLOAD_BATCH));
            let batch = self.download_batch(store, entries, sources, reading, wait)?;
            fetched.objects.extend(batch.objects);
            fetched.evicted.extend(batch.evicted);
            entries = rest;
        }
        Ok(fetched)
    }

    /// [`Self::download`] of one batch.
    fn download_batch(
        &self,
        store: &Arc<Store>,
        entries: Vec<(usize, Entry, File)>,
        sources: &[Wanted],
        reading: bool,
        wait: LockWait,
    ) -> Result<Fetched> {
        let mut fetched = Fetched::default();
        let mut parts = Vec::with_capacity(entries.len());
        for (_, entry, _) in &entries {
            let number = self.next_part.fetch_add(1, Ordering::Relaxed);
            let path = with_suffix(
                &entry.data,
                &format!("{PART_MARKER}{}-{number}", std::process::id()),
            );
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)
                .map_err(|source| Error::cache(&path, source))?;
            let part = PartFile {
                path,
                file: Arc::new(file),
                committed: false,
            };
            part.file
                .set_len(entry.listed.size)
                .map_err(|source| Error::cache(&part.path, source))?;
            parts.push(part);
        }
        let downloads: Vec<Download> = entries
            .iter()
            .zip(&parts)
            .map(|((position, entry, _), part)| Download {
                key: sources[*position].key.clone(),
                listed: sources[*position].listed(),
                uri: entry.uri.clone(),
                size: entry.listed.size,
                offset: sources[*position].offset,
                file: Arc::clone(&part.file),
                part: part.path.clone(),
            })
            .collect();
        let plan = FetchPlan {
            part_size: self.options.part_size,
            concurrency: self.options.concurrency,
            max_attempts: self.options.max_attempts,
        };
        // Each entry is committed, and its lock turned shared, as soon as its bytes are in:
        // another process waiting for it (a rank beside this one) takes it then, not once
        // every object of the batch has come; one that fails leaves those done committed.
        let pending: Vec<std::sync::Mutex<Option<Downloading>>> = entries
            .into_iter()
            .zip(parts)
            .map(|((position, entry, lock), part)| {
                std::sync::Mutex::new(Some((position, entry, lock, part)))
            })
            .collect();
        let committed = std::sync::Mutex::new(Vec::with_capacity(pending.len()));
        let done = |index: usize| -> Result<()> {
            let taken = pending
                .get(index)
                .and_then(|slot| slot.lock().ok().and_then(|mut slot| slot.take()));
            let Some((position, entry, mut lock, mut part)) = taken else {
                return Ok(());
            };
            commit(&entry, &part, entry.key.contains(RANGES_SUFFIX))?;
            part.committed = true;
            #[cfg(test)]
            tests::evict_in_gap(&self.options.dir, &lock, &entry.lock);
            // As long as a wait for this entry lasts (a range's is short).
            downgrade(&mut lock, &entry.lock, wait.longest(), wait.written(&entry))?;
            touch(&lock, &entry.lock);
            let counter = if reading {
                &self.counters.misses
            } else {
                &self.counters.read_ahead
            };
            counter.fetch_add(1, Ordering::Relaxed);
            debug!(uri = %entry.uri, bytes = entry.listed.size, "fetched object into the cache");
            if let Ok(mut committed) = committed.lock() {
                committed.push((position, entry, lock));
            }
            Ok(())
        };
        self.runtime.block_on(download::download_all(
            Arc::clone(store),
            &downloads,
            plan,
            &self.counters,
            &done,
        ))?;
        drop(downloads);
        let committed = committed.into_inner().unwrap_or_default();
        if committed.len() != pending.len() {
            return Err(Error::cache(
                &self.options.dir,
                std::io::Error::other("a download ended without all its objects"),
            ));
        }
        for (position, entry, lock) in committed {
            if entry.is_valid() {
                fetched.objects.push((position, entry.into_cached(lock)));
            } else {
                fetched.evicted.push((position, entry, lock));
            }
        }
        Ok(fetched)
    }
}

/// The refusal of an entry an eviction took as soon as it was fetched, `fetches` times over.
fn evicted_as_fetched(entry: &Entry, cap: u64, fetches: u32) -> Error {
    Error::cache(
        &entry.data,
        std::io::Error::other(format!(
            "evicted by another reader each of the {fetches} times it was fetched, before it \
             could be read: the cache cap ({cap} bytes) is smaller than the objects in use at once"
        )),
    )
}

#[cfg(test)]
pub(super) mod tests {
    use std::path::PathBuf;
    use std::sync::Mutex;

    use object_store::memory::InMemory;
    use object_store::path::Path as ObjectPath;
    use object_store::{ObjectStoreExt, PutPayload};

    use super::*;
    use crate::storage::eviction::evict_to_cap;
    use crate::storage::options::ObjectCacheOptions;
    use crate::storage::stats::Counters;
    use crate::storage::uri::s3_location;

    /// Evictions a test runs in the gap of a fetched entry's downgrade: how many more, in the
    /// cache folder named (the tests of other folders run beside it).
    static EVICTIONS_IN_GAP: Mutex<Vec<(PathBuf, u32)>> = Mutex::new(Vec::new());

    /// Runs an eviction of every entry nobody holds, as another process may in the gap of a
    /// downgrade, where a test asked for one in `dir`.
    pub(super) fn evict_in_gap(dir: &Path, lock: &File, lock_path: &Path) {
        let mut plans = EVICTIONS_IN_GAP.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(plan) = plans.iter_mut().find(|(d, left)| d == dir && *left > 0) {
            plan.1 -= 1;
            unlock(lock, lock_path).unwrap();
            evict_to_cap(dir, 0, &Counters::default()).unwrap();
        }
    }

    /// A cache in `dir` holding `set/a.bin` of an in-memory store, its location and listing.
    fn cache_of_one_object(dir: &Path) -> (ObjectCache, Arc<Store>, RemoteLocation, Vec<Wanted>) {
        let cache = ObjectCache::new(ObjectCacheOptions::new(dir)).unwrap();
        let memory = InMemory::new();
        cache
            .runtime
            .block_on(memory.put(
                &ObjectPath::from("set/a.bin"),
                PutPayload::from(vec![9; 300]),
            ))
            .unwrap();
        let store: Arc<Store> = Arc::new(memory);
        let location = s3_location("s3://bucket/set", "a test prefix").unwrap();
        let listing = cache.list(&store, &location).unwrap();
        let wanted = listing
            .into_iter()
            .map(|meta| Wanted {
                key: meta.location.to_string(),
                offset: 0,
                object_size: meta.size,
                meta,
            })
            .collect();
        (cache, store, location, wanted)
    }

    /// An entry an eviction takes between its commit and its lock's downgrade was handed out
    /// as read (its file gone, and the read failed): it is fetched again and read.
    #[test]
    fn an_entry_evicted_as_its_lock_is_downgraded_is_fetched_again() {
        let dir = tempfile::tempdir().unwrap();
        EVICTIONS_IN_GAP
            .lock()
            .unwrap()
            .push((dir.path().to_path_buf(), 1));
        let (cache, store, location, wanted) = cache_of_one_object(dir.path());
        let wait = LockWait::Each(Duration::from_secs(5));
        let objects = cache
            .materialise(&store, &location, wanted, true, wait)
            .unwrap();
        assert_eq!(std::fs::read(objects[0].path()).unwrap(), vec![9; 300]);
        let stats = cache.stats();
        assert_eq!((stats.requests, stats.misses), (2, 2), "{stats:?}");
    }

    /// An entry evicted each time it is fetched is refused naming the cap, not fetched for
    /// good.
    #[test]
    fn an_entry_evicted_each_time_it_is_fetched_is_refused_naming_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        EVICTIONS_IN_GAP
            .lock()
            .unwrap()
            .push((dir.path().to_path_buf(), 100));
        let (cache, store, location, wanted) = cache_of_one_object(dir.path());
        let wait = LockWait::Each(Duration::from_secs(5));
        let error = cache
            .materialise(&store, &location, wanted, true, wait)
            .unwrap_err()
            .to_string();
        assert!(error.contains("the cache cap"), "{error}");
        assert_eq!(cache.stats().requests, u64::from(MAX_FETCHES));
    }

    /// The environment variable that tells a child which test below it runs.
    const CHILD_ENV: &str = "STOKER_MATERIALISE_TEST_CHILD";

    /// Run as a child by the test below: under a soft limit of 320 descriptors, 200 objects
    /// fetched whole (a lock each, held while they are kept; a part file each while they come).
    #[test]
    #[ignore = "run in a child process by many_objects_fetched_whole_fit_a_low_descriptor_limit"]
    fn child_fetches_many_objects_under_a_low_descriptor_limit() {
        if std::env::var_os(CHILD_ENV).is_none() {
            return;
        }
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit and setrlimit read and write one `rlimit` through a valid pointer.
        unsafe {
            assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
            limit.rlim_cur = limit.rlim_cur.min(320);
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
        }
        let dir = tempfile::tempdir().unwrap();
        let cache = ObjectCache::new(ObjectCacheOptions::new(dir.path())).unwrap();
        let memory = InMemory::new();
        for k in 0..200u8 {
            let path = ObjectPath::from(format!("set/{k:03}.bin"));
            cache
                .runtime
                .block_on(memory.put(&path, PutPayload::from(vec![k; 10])))
                .unwrap();
        }
        let store: Arc<Store> = Arc::new(memory);
        let location = s3_location("s3://bucket/set", "a test prefix").unwrap();
        let listing = cache.list(&store, &location).unwrap();
        let objects = cache.fetch_listed(&store, &location, &listing).unwrap();
        assert_eq!(objects.len(), 200);
        assert_eq!(std::fs::read(objects[199].path()).unwrap(), vec![199; 10]);
    }

    /// A set of many objects fetched whole (a remote MDS set, JSONL or Arrow files) opened a
    /// part file for each at once beside its lock: 600 objects failed with "Too many open
    /// files" under the common soft limit of 1,024. Batched, 200 fit 320 descriptors.
    #[test]
    fn many_objects_fetched_whole_fit_a_low_descriptor_limit() {
        let name = concat!(
            "storage::materialise::tests::",
            "child_fetches_many_objects_under_a_low_descriptor_limit"
        );
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                name,
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, "1")
            .output()
            .unwrap();
        assert!(
            child.status.success(),
            "{}{}",
            String::from_utf8_lossy(&child.stdout),
            String::from_utf8_lossy(&child.stderr)
        );
        assert!(
            String::from_utf8_lossy(&child.stdout).contains("1 passed"),
            "the child ran no test: {}",
            String::from_utf8_lossy(&child.stdout)
        );
    }
}
