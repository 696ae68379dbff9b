//! The local cache tier: whole remote objects kept as files on disk, shared safely by threads
//! and processes, bounded by a size cap with least-recently-used eviction.
//!
//! The parts, one module each: `entry` (an entry's files on disk, its check against the
//! listing, the commit of a download), `entry_lock` (the entry locks), `download` (the S3
//! side), `materialise` (entries brought in for a read: hits, downloads, waits for another
//! process's, an entry evicted as its lock is turned shared fetched again), `eviction` (the
//! size cap), `options` and `stats`. This module ties them together: [`ObjectCache::fetch`]
//! lists, checks, locks and downloads.
//!
//! Concurrency: every entry has a lock file locked with `flock` (through fs4). A reader holds
//! a shared lock for as long as it uses the file (a [`CachedObject`] keeps it); a fetch or an
//! eviction needs the exclusive lock. So two processes fetching the same object take turns
//! (the second finds the first's copy valid), and an entry in use is never evicted. Downloads
//! go to a temporary file renamed over the entry only when every byte asked for has arrived
//! (the store's ranged reads are checked for their length), and the metadata file is written
//! last, so a crash leaves either no entry or an entry that fails its check and is fetched
//! again. An eviction removes the entry's lock file too, still holding it, and the folder of an
//! object's ranges or versions once empty; a lock taken on a lock file removed meanwhile is
//! taken again on the one its path names now (`entry_lock`), so two processes never hold one
//! entry's lock through two files.
//!
//! An entry is valid when its metadata matches the listing (size and ETag, or last-modified
//! when the store gives no ETag) and the data file has that size; a changed object or a cut
//! short copy is fetched again. Nothing is kept in memory between runs: the folder is the
//! cache, so a restarted process finds everything a previous one fetched.
//!
//! A whole object's copy lies under its version (`<key>.stoker-versions/<size>-<crc>`), so an
//! object changed in the store is fetched as a new entry while another process still reads
//! the old copy (which the cap evicts once nobody holds it); a range's entry is fetched again
//! in place (each read holds it only while it copies from it).
//!
//! Limits: a copy is checked by size and ETag, not by a checksum of its bytes (a same-size
//! corruption on local disk goes unnoticed).
//!
//! Descriptors: a [`CachedObject`] holds its lock until it is dropped or its user lets go of
//! it ([`CachedObject::release`]). The remote sources read through ranges (tar shards, token
//! files, JSONL): each read locks its range's entry for as long as it copies from it, so an
//! entry is protected from eviction while it is being read, not for the source's whole life;
//! an entry evicted in between is fetched again on its next read.

use std::fs::File;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use object_store::ObjectMeta;
use tracing::{info, warn};

use super::download::{self, FetchPlan};
use super::entry::{CachedObject, Entry, PartFile};
use super::eviction::evict_to_cap;
use super::fetch_meter::FetchMeter;
use super::listed::Listed;
use super::options::ObjectCacheOptions;
use super::remote_object::RemoteObject;
use super::s3_client::{self, Store};
use super::stats::Counters;
use super::uri::{s3_location, RemoteLocation};
use crate::cache_stats::CacheStats;
use crate::error::{Error, Result};

/// Objects [`ObjectCache::fetch_listed_in_batches`] fetches and hands over at once: their
/// locks, and their part files while they come, are the descriptors an open holds beside the
/// pool's.
pub(crate) const OPEN_BATCH: usize = 32;

/// How long [`ObjectCache::materialise`] waits for entries another process holds.
#[derive(Debug, Clone, Copy)]
pub(super) enum LockWait {
    /// This long for each entry, counted from the holder's last write to it: whole objects,
    /// which another process commits one by one as they come, so a long download is waited
    /// out as long as its bytes keep coming.
    Each(std::time::Duration),
    /// This long for all of them together: byte ranges, which a reader fetches itself
    /// past the cache when they do not come.
    InAll(std::time::Duration),
}

/// An entry being downloaded: its place among those asked for, the entry, its lock (held
/// exclusive) and the file its bytes go to.
pub(super) type Downloading = (usize, Entry, File, PartFile);

/// A bucket's client for listings by key prefix ([`ObjectCache::lister`]).
pub(crate) struct Lister {
    client: Arc<dyn object_store::list::PaginatedListStore>,
    bucket: String,
}

/// The local cache tier for remote objects. See the module docs for layout and guarantees.
///
/// One instance per process is the intent (it owns a small tokio runtime for its downloads),
/// but any number of instances and processes may share one folder.
pub struct ObjectCache {
    pub(super) options: ObjectCacheOptions,
    pub(super) runtime: tokio::runtime::Runtime,
    pub(super) counters: Counters,
    pub(super) next_part: AtomicU64,
    /// Bytes fetched by range reads into the folder since the cap was last enforced, by
    /// every process using it.
    pub(super) fetch_meter: FetchMeter,
}

/// An entry to materialise: its identity in the cache (`meta`: a listed object, or a range of
/// one named by [`RANGES_SUFFIX`]), and where its bytes are: object `key` (of `object_size`
/// bytes) from `offset`.
pub(super) struct Wanted {
    pub(super) meta: ObjectMeta,
    pub(super) key: String,
    pub(super) offset: u64,
    /// The whole object's size as listed.
    pub(super) object_size: u64,
}

impl Wanted {
    /// The version its GETs must be answered with: the object's as listed.
    pub(super) fn listed(&self) -> Listed {
        Listed::of_whole(&self.meta, self.object_size)
    }
}

impl std::fmt::Debug for ObjectCache {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ObjectCache")
            .field("options", &self.options)
            .field("stats", &self.stats())
            .finish()
    }
}

impl ObjectCache {
    /// A cache in `options.dir` (created if missing).
    pub fn new(options: ObjectCacheOptions) -> Result<ObjectCache> {
        if options.part_size == 0 || options.concurrency == 0 || options.max_attempts == 0 {
            return Err(Error::CacheConfig(
                "part_size, concurrency and max_attempts must be at least 1".into(),
            ));
        }
        std::fs::create_dir_all(&options.dir)
            .map_err(|source| Error::cache(&options.dir, source))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| Error::cache(&options.dir, source))?;
        Ok(ObjectCache {
            runtime,
            counters: Counters::default(),
            next_part: AtomicU64::new(0),
            fetch_meter: FetchMeter::open(&options.dir),
            options,
        })
    }

    /// A cache configured by [`ObjectCacheOptions::from_env`].
    pub fn from_env() -> Result<ObjectCache> {
        ObjectCache::new(ObjectCacheOptions::from_env()?)
    }

    /// The options in force.
    pub fn options(&self) -> &ObjectCacheOptions {
        &self.options
    }

    /// The counters so far.
    pub fn stats(&self) -> CacheStats {
        self.counters.snapshot()
    }

    /// Materialises the objects directly under an `s3://BUCKET/PREFIX` URI (or the one object
    /// it names) whose file name passes `keep`, and returns them in key order, each locked in
    /// the cache for as long as it is kept.
    ///
    /// Objects valid in the cache cost no request beyond the one listing; the others are
    /// fetched together, `concurrency` ranged GETs at a time. This is the "remote object ->
    /// local file" step every format can build on.
    pub fn fetch(
        &self,
        uri: &str,
        keep: &dyn Fn(&str) -> bool,
    ) -> Result<(RemoteLocation, Vec<CachedObject>)> {
        let location = s3_location(uri, "the object cache reads s3://BUCKET/PREFIX URIs")?;
        let started = Instant::now();
        let store = self.store(&location)?;
        let listing = self
            .runtime
            .block_on(download::list_objects(&store, &location))?;
        let listing: Vec<ObjectMeta> = listing
            .into_iter()
            .filter(|object| keep(object.location.filename().unwrap_or_default()))
            .collect();
        let before = self.stats();
        let ready = self.fetch_listed(&store, &location, &listing)?;

        let after = self.stats();
        info!(
            uri = %location.uri(),
            objects = listing.len(),
            hits = after.hits - before.hits,
            misses = after.misses - before.misses,
            bytes_fetched = after.bytes_fetched - before.bytes_fetched,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "objects ready in the cache"
        );
        Ok((location, ready))
    }

    /// Refuses a set of `objects` a format reads whole (`what`, of `uri`) that is larger than
    /// the cap: they are fetched into the cache as the set opens, and read from there, so
    /// their download would go past the cap (and evict its own objects before they are read)
    /// and, where the disk is smaller, fail once it was full.
    pub(crate) fn check_fits_whole(
        &self,
        uri: &str,
        what: &str,
        objects: &[ObjectMeta],
    ) -> Result<()> {
        let bytes: u64 = objects.iter().map(|object| object.size).sum();
        let cap = self.options.max_bytes;
        if bytes > cap {
            return Err(Error::CacheConfig(format!(
                "the {what} of {uri} are {bytes} bytes, over the cache tier's cap of {cap} \
                 bytes (STOKER_CACHE_MAX_BYTES): they are read whole, from the cache; raise \
                 the cap on a disk that holds them, or write the set as Parquet files, which \
                 are read by ranges"
            )));
        }
        Ok(())
    }

    /// Materialises the listed `objects` of `location`'s bucket whole and returns them in
    /// order, each locked in the cache for as long as it is kept (an index; what
    /// [`ObjectCache::fetch`] returns).
    pub(crate) fn fetch_listed(
        &self,
        store: &Arc<Store>,
        location: &RemoteLocation,
        objects: &[ObjectMeta],
    ) -> Result<Vec<CachedObject>> {
        let ready = self.fetch_whole(store, location, objects)?;
        self.enforce_cap()?;
        Ok(ready)
    }

    /// [`Self::fetch_listed`] [`OPEN_BATCH`] objects at a time, each batch handed to `open`
    /// as it comes (each object as one read through this cache, with its copy), which lets go
    /// of the copies' locks once it opened them (they can be fetched again): a set of more
    /// objects than the descriptor limit opens holding a batch's locks at once, not one per
    /// object. The cap is checked as range reads check it, once an eighth of it was fetched
    /// (a check walks the cache folder: one after each batch would walk a large folder
    /// thousands of times), and once at the end, whether the open passed or failed.
    pub(crate) fn fetch_listed_in_batches<T>(
        self: &Arc<Self>,
        store: &Arc<Store>,
        location: &RemoteLocation,
        objects: &[ObjectMeta],
        mut open: impl FnMut(Vec<(RemoteObject, CachedObject)>) -> Result<Vec<T>>,
    ) -> Result<Vec<T>> {
        let mut opened = Vec::with_capacity(objects.len());
        let mut open_all = || {
            for batch in objects.chunks(OPEN_BATCH) {
                let fetched_before = self.counters.bytes_fetched.load(Ordering::Relaxed);
                let copies = self.fetch_whole(store, location, batch)?;
                self.check_cap_after_fetch(fetched_before)?;
                let remote = |object: &ObjectMeta| {
                    let (cache, store) = (Arc::clone(self), Arc::clone(store));
                    RemoteObject::new(cache, store, location, object.clone())
                };
                opened.extend(open(batch.iter().map(remote).zip(copies).collect())?);
            }
            Ok(())
        };
        // The cap is held also after an open that failed part way.
        let all = open_all();
        let capped = self.enforce_cap();
        all.and(capped).map(|()| opened)
    }

    /// The listed `object`'s whole copy, locked while the returned one lives: taken from the
    /// cache when valid there, else fetched as listed (an object rewritten since is
    /// [`Error::ObjectChanged`]). For a reader whose copy may have been evicted since it let
    /// go of its lock; the cap is checked as range reads check it, once an eighth of it was
    /// fetched.
    pub(crate) fn fetch_one(
        &self,
        store: &Arc<Store>,
        location: &RemoteLocation,
        object: &ObjectMeta,
    ) -> Result<CachedObject> {
        let fetched_before = self.counters.bytes_fetched.load(Ordering::Relaxed);
        let copy = self
            .fetch_whole(store, location, std::slice::from_ref(object))?
            .pop()
            .ok_or_else(|| {
                let uri = location.uri_of(object.location.as_ref());
                Error::cache(
                    uri,
                    std::io::Error::other("the cache tier returned no copy"),
                )
            })?;
        if let Err(error) = self.check_cap_after_fetch(fetched_before) {
            warn!(%error, "the cache tier could not check its size cap");
        }
        Ok(copy)
    }

    /// The whole copies of the listed `objects`, each locked ([`Self::materialise`]).
    fn fetch_whole(
        &self,
        store: &Arc<Store>,
        location: &RemoteLocation,
        objects: &[ObjectMeta],
    ) -> Result<Vec<CachedObject>> {
        let wanted = objects
            .iter()
            .map(|object| Wanted {
                meta: object.clone(),
                key: object.location.to_string(),
                offset: 0,
                object_size: object.size,
            })
            .collect();
        let wait = LockWait::Each(self.options.lock_timeout);
        self.materialise(store, location, wanted, true, wait)
    }

    /// The store of `location`'s bucket, for [`Self::read_ranges`].
    pub(crate) fn store(&self, location: &RemoteLocation) -> Result<Arc<Store>> {
        s3_client::connect(
            &location.bucket,
            &self.options.s3,
            self.options.request_retries,
        )
    }

    /// Lists `location` (the objects directly under its prefix, or the one it names).
    pub(crate) fn list(&self, store: &Store, location: &RemoteLocation) -> Result<Vec<ObjectMeta>> {
        self.runtime
            .block_on(download::list_objects(store, location))
    }

    /// [`Self::list`], with the folders directly under the prefix (their keys, ending in `/`).
    pub(crate) fn list_with_folders(
        &self,
        store: &Store,
        location: &RemoteLocation,
    ) -> Result<(Vec<ObjectMeta>, Vec<String>)> {
        self.runtime
            .block_on(download::list_objects_and_folders(store, location))
    }

    /// A client that lists `bucket`'s keys by any string prefix ([`ObjectCache::list_key_prefix`]),
    /// made once for the listings of one resolution.
    pub(crate) fn lister(&self, bucket: &str) -> Result<Lister> {
        Ok(Lister {
            client: s3_client::connect_lister(
                bucket,
                &self.options.s3,
                self.options.request_retries,
            )?,
            bucket: bucket.to_string(),
        })
    }

    /// Lists the objects of the lister's bucket whose keys start with `key_prefix` (any string):
    /// in its folder only unless `deep`; with, not `deep`, the keys of the folders below it that
    /// the listing names (ending in `/`).
    pub(crate) fn list_key_prefix(
        &self,
        lister: &Lister,
        key_prefix: &str,
        deep: bool,
    ) -> Result<(Vec<ObjectMeta>, Vec<String>)> {
        self.runtime.block_on(download::list_key_prefix(
            lister.client.as_ref(),
            &lister.bucket,
            key_prefix,
            deep,
        ))
    }

    /// Reads bytes `range` of the listed `object`, bypassing the cache (a shard scanned once),
    /// of the version listed (see [`download::get_range`]).
    pub(crate) fn read_uncached(
        &self,
        store: &Store,
        location: &RemoteLocation,
        object: &ObjectMeta,
        range: Range<u64>,
    ) -> Result<bytes::Bytes> {
        let key = object.location.as_ref();
        let plan = FetchPlan {
            part_size: self.options.part_size,
            concurrency: self.options.concurrency,
            max_attempts: self.options.max_attempts,
        };
        self.runtime.block_on(download::get_range(
            store,
            key,
            &location.uri_of(key),
            &Listed::of(object),
            range,
            plan,
            &self.counters,
        ))
    }

    /// Reads the listed `object` whole through the cache (an index, `classes.txt`).
    pub(crate) fn read_whole(
        &self,
        store: &Arc<Store>,
        location: &RemoteLocation,
        object: &ObjectMeta,
    ) -> Result<Vec<u8>> {
        let whole = 0..object.size;
        let mut bytes = self.read_ranges(store, location, object, std::slice::from_ref(&whole))?;
        Ok(bytes.pop().unwrap_or_default())
    }

    /// Writes `bytes` as the object `key` of `location`'s bucket.
    pub(crate) fn put(
        &self,
        store: &Store,
        location: &RemoteLocation,
        key: &str,
        bytes: Vec<u8>,
    ) -> Result<()> {
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        self.runtime
            .block_on(download::put(store, location, key, bytes))
    }

    /// Uploads the file `file` as the object `key` of `location`'s bucket, in parts of
    /// `part_bytes` when it is larger ([`download::put_file`]).
    pub(crate) fn put_file(
        &self,
        store: &Store,
        location: &RemoteLocation,
        key: &str,
        file: &std::path::Path,
        part_bytes: usize,
    ) -> Result<()> {
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        self.runtime
            .block_on(download::put_file(store, location, key, file, part_bytes))
    }

    /// Deletes the object `key` of `location`'s bucket.
    pub(crate) fn delete(&self, store: &Store, location: &RemoteLocation, key: &str) -> Result<()> {
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        self.runtime
            .block_on(download::delete(store, location, key))
    }

    /// Evicts least-recently-used entries nobody holds until the cached objects fit the cap.
    /// Entries in use (locked by any process) are skipped; leftover downloads of dead
    /// processes are removed on the way.
    pub fn enforce_cap(&self) -> Result<()> {
        evict_to_cap(&self.options.dir, self.options.max_bytes, &self.counters)
    }
}

#[cfg(test)]
mod tests {
    use object_store::memory::InMemory;
    use object_store::path::Path as ObjectPath;
    use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

    use super::super::cached_ranges::range_wanted;
    use super::*;
    use crate::storage::entry::{LOCK_SUFFIX, META_SUFFIX, PART_MARKER};
    use crate::storage::entry_lock::try_lock;

    /// The cache reads through whatever object store it is given: an in-memory one here, in
    /// the builds with and without the S3 client alike.
    #[test]
    fn ranges_come_through_any_object_store_and_then_from_the_cache() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let cache = ObjectCache::new(ObjectCacheOptions::new(dir.path()))?;
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let memory = InMemory::new();
        cache.runtime.block_on(async {
            for (key, bytes) in [("set/a.tar", data.clone()), ("set/deeper/b.tar", vec![1])] {
                memory
                    .put(&ObjectPath::from(key), PutPayload::from(bytes))
                    .await
                    .map_err(|source| Error::ObjectStore {
                        uri: key.into(),
                        source,
                    })?;
            }
            Ok::<_, Error>(())
        })?;
        let store: Arc<Store> = Arc::new(memory);
        let location = s3_location("s3://bucket/set", "a test prefix")?;
        // Only what lies directly under the prefix is listed.
        let listing = cache.list(&store, &location)?;
        let keys: Vec<&str> = listing.iter().map(|o| o.location.as_ref()).collect();
        assert_eq!(keys, ["set/a.tar"]);

        let ranges = [10..20, 50_000..50_100, 99_990..100_000];
        let expected: Vec<Vec<u8>> = ranges
            .iter()
            .map(|r| data[r.start as usize..r.end as usize].to_vec())
            .collect();
        assert_eq!(
            cache.read_ranges(&store, &location, &listing[0], &ranges)?,
            expected
        );
        // The three ranges lie within `MAX_COALESCE_GAP` of each other: one GET, the bytes
        // between them read and dropped.
        let first = cache.stats();
        assert_eq!((first.requests, first.bytes_fetched), (1, 100_000 - 10));
        assert_eq!(first.misses, 3);
        // Read again: every range from the cache, nothing fetched.
        assert_eq!(
            cache.read_ranges(&store, &location, &listing[0], &ranges)?,
            expected
        );
        let again = cache.stats();
        assert_eq!(again.bytes_fetched, first.bytes_fetched);
        assert_eq!(again.hits, first.hits + 3);
        Ok(())
    }

    /// An in-memory store holding `bytes` as `set/a.bin`, the location `s3://bucket/set` and
    /// its listing, read through `cache`.
    fn one_object(
        cache: &ObjectCache,
        bytes: Vec<u8>,
    ) -> Result<(Arc<Store>, RemoteLocation, Vec<ObjectMeta>)> {
        let memory = InMemory::new();
        cache
            .runtime
            .block_on(memory.put(&ObjectPath::from("set/a.bin"), PutPayload::from(bytes)))
            .map_err(|source| Error::ObjectStore {
                uri: "set/a.bin".into(),
                source,
            })?;
        let store: Arc<Store> = Arc::new(memory);
        let location = s3_location("s3://bucket/set", "a test prefix")?;
        let listing = cache.list(&store, &location)?;
        Ok((store, location, listing))
    }

    /// Bytes of cached data (not metadata, locks or parts) under `dir`.
    fn cached_bytes(dir: &std::path::Path) -> u64 {
        let mut total = 0;
        let mut folders = vec![dir.to_path_buf()];
        while let Some(folder) = folders.pop() {
            for entry in std::fs::read_dir(&folder).unwrap() {
                let entry = entry.unwrap();
                let name = entry.file_name().to_string_lossy().into_owned();
                let kind = entry.file_type().unwrap();
                if kind.is_dir() {
                    folders.push(entry.path());
                } else if folder != dir
                    && !name.ends_with(META_SUFFIX)
                    && !name.ends_with(LOCK_SUFFIX)
                    && !name.contains(PART_MARKER)
                {
                    total += entry.metadata().unwrap().len();
                }
            }
        }
        total
    }

    /// Many processes' caches on one folder (one instance each here) check the cap after an
    /// eighth of it was fetched by all of them together: the folder stays within an eighth
    /// of the cap and one read of it, however many share it (each counting its own, sixteen
    /// would reach twice the cap before any checked).
    #[test]
    fn the_caches_of_many_processes_keep_one_folder_near_its_cap() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let mut options = ObjectCacheOptions::new(dir.path());
        options.max_bytes = 1000;
        let caches: Vec<ObjectCache> = (0..16)
            .map(|_| ObjectCache::new(options.clone()))
            .collect::<Result<_>>()?;
        let data: Vec<u8> = (0..8000u32).map(|i| (i % 251) as u8).collect();
        let (store, location, listing) = one_object(&caches[0], data)?;
        let mut evicted = 0;
        for round in 0..2u64 {
            for (i, cache) in caches.iter().enumerate() {
                // 120 bytes each: under the eighth of the cap (125) any one cache counts.
                let start = (round * 16 + i as u64) * 200;
                let range = start..start + 120;
                cache.read_ranges(&store, &location, &listing[0], std::slice::from_ref(&range))?;
                let on_disk = cached_bytes(dir.path());
                assert!(on_disk <= 1000 + 125 + 120, "{on_disk} bytes cached");
            }
        }
        for cache in &caches {
            evicted += cache.stats().evictions;
        }
        assert!(evicted > 0);
        Ok(())
    }

    /// Whole objects fetched together are each committed as their bytes come in: one that
    /// fails (gone from the store since its listing) leaves those already in committed, for
    /// another process to take, not discarded with the batch.
    #[test]
    fn objects_fetched_together_are_committed_one_by_one() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let mut options = ObjectCacheOptions::new(dir.path());
        // One GET at a time, in key order: `a.bin` lands before `b.bin` is asked for.
        options.concurrency = 1;
        let cache = ObjectCache::new(options.clone())?;
        let (store, location, mut listing) = one_object(&cache, vec![7; 5000])?;
        let mut gone = listing[0].clone();
        gone.location = ObjectPath::from("set/b.bin");
        listing.push(gone);
        let error = cache
            .fetch_listed(&store, &location, &listing)
            .expect_err("b.bin is not in the store");
        assert!(error.to_string().contains("b.bin"), "{error}");
        // Another process's cache finds a.bin whole, and fetches nothing for it.
        let other = ObjectCache::new(options)?;
        let fetched = other.fetch_listed(&store, &location, &listing[..1])?;
        assert_eq!(
            std::fs::read(fetched[0].path()).map_err(|e| Error::io("a.bin", e))?,
            vec![7; 5000]
        );
        assert_eq!(other.stats().requests, 0);
        Ok(())
    }

    /// An object rewritten in the store while a process still holds its old copy (an older
    /// job on the node) is fetched as a new entry by the next process, at once: it waited for
    /// the old copy's lock, the lock timeout, and died. Each keeps reading its own version.
    #[test]
    fn a_new_version_is_fetched_beside_the_old_copy_another_process_holds() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let mut options = ObjectCacheOptions::new(dir.path());
        options.lock_timeout = std::time::Duration::from_secs(2);
        let older = ObjectCache::new(options.clone())?;
        let (store, location, listing) = one_object(&older, vec![1; 100])?;
        let held = older.fetch_listed(&store, &location, &listing)?;
        older
            .runtime
            .block_on(store.put(
                &ObjectPath::from("set/a.bin"),
                PutPayload::from(vec![2; 100]),
            ))
            .map_err(|source| Error::ObjectStore {
                uri: "set/a.bin".into(),
                source,
            })?;
        let newer = ObjectCache::new(options)?;
        let relisted = newer.list(&store, &location)?;
        let fetched = newer.fetch_listed(&store, &location, &relisted)?;
        let read =
            |object: &CachedObject| std::fs::read(object.path()).map_err(|e| Error::io("copy", e));
        assert_eq!(read(&fetched[0])?, vec![2; 100]);
        assert_eq!(read(&held[0])?, vec![1; 100]);
        Ok(())
    }

    /// A range whose entry another process (or a stalled read-ahead) holds is read from the
    /// store after a few seconds, not after the lock timeout (10 minutes by default: a decode
    /// thread waited that out behind a GET retried for minutes), and does not fail.
    #[test]
    fn a_range_locked_by_another_is_read_from_the_store_after_a_short_wait() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let cache = ObjectCache::new(ObjectCacheOptions::new(dir.path()))?;
        let data: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        let (store, location, listing) = one_object(&cache, data.clone())?;
        // Another holder of the range's entry (its lock file locked exclusively).
        let entry = Entry::new(
            dir.path(),
            &location,
            &range_wanted(&listing[0], &(10..20)).meta,
        )?;
        if let Some(parent) = entry.lock.parent() {
            std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        }
        let mut held = File::create(&entry.lock).map_err(|e| Error::io(&entry.lock, e))?;
        assert!(try_lock(&mut held, true, &entry.lock)?);
        let started = Instant::now();
        let read = cache.read_ranges(&store, &location, &listing[0], &[10..20, 30..40])?;
        assert_eq!(read, [data[10..20].to_vec(), data[30..40].to_vec()]);
        let waited = started.elapsed();
        assert!(
            waited < std::time::Duration::from_secs(20),
            "waited {waited:?}"
        );
        Ok(())
    }

    /// A cache in a new folder (kept while the first lives) and an empty in-memory store.
    fn cache_in_memory() -> Result<(tempfile::TempDir, ObjectCache, InMemory)> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        let cache = ObjectCache::new(ObjectCacheOptions::new(dir.path()))?;
        Ok((dir, cache, InMemory::new()))
    }

    /// Writes `bytes` as `set/a.bin` of `memory`.
    fn put_a_bin(cache: &ObjectCache, memory: &InMemory, bytes: Vec<u8>) -> Result<()> {
        let path = ObjectPath::from("set/a.bin");
        cache
            .runtime
            .block_on(memory.put(&path, PutPayload::from(bytes)))
            .map(|_| ())
            .map_err(|source| Error::ObjectStore {
                uri: "set/a.bin".into(),
                source,
            })
    }

    /// A store that ignores the If-Match asked of it (some S3-compatible ones do): a GET
    /// answers with whatever version the object is now.
    #[derive(Debug)]
    struct IgnoresIfMatch(InMemory);

    impl std::fmt::Display for IgnoresIfMatch {
        fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(formatter, "IgnoresIfMatch")
        }
    }

    #[async_trait::async_trait]
    impl ObjectStore for IgnoresIfMatch {
        async fn put_opts(
            &self,
            location: &ObjectPath,
            payload: PutPayload,
            options: object_store::PutOptions,
        ) -> object_store::Result<object_store::PutResult> {
            self.0.put_opts(location, payload, options).await
        }

        async fn put_multipart_opts(
            &self,
            location: &ObjectPath,
            options: object_store::PutMultipartOptions,
        ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
            self.0.put_multipart_opts(location, options).await
        }

        async fn get_opts(
            &self,
            location: &ObjectPath,
            mut options: object_store::GetOptions,
        ) -> object_store::Result<object_store::GetResult> {
            options.if_match = None;
            self.0.get_opts(location, options).await
        }

        fn delete_stream(
            &self,
            locations: futures_util::stream::BoxStream<'static, object_store::Result<ObjectPath>>,
        ) -> futures_util::stream::BoxStream<'static, object_store::Result<ObjectPath>> {
            self.0.delete_stream(locations)
        }

        fn list(
            &self,
            prefix: Option<&ObjectPath>,
        ) -> futures_util::stream::BoxStream<'static, object_store::Result<ObjectMeta>> {
            self.0.list(prefix)
        }

        async fn list_with_delimiter(
            &self,
            prefix: Option<&ObjectPath>,
        ) -> object_store::Result<object_store::ListResult> {
            self.0.list_with_delimiter(prefix).await
        }

        async fn copy_opts(
            &self,
            from: &ObjectPath,
            to: &ObjectPath,
            options: object_store::CopyOptions,
        ) -> object_store::Result<()> {
            self.0.copy_opts(from, to, options).await
        }
    }

    /// From a store that ignores the If-Match, a range of an object rewritten since its listing
    /// is refused all the same (the answer's ETag is another): never the new version's bytes
    /// at the old version's offsets, nor a copy mixing the two.
    #[test]
    #[allow(clippy::single_range_in_vec_init)] // one range among the ranges read
    fn a_store_ignoring_if_match_never_serves_another_version() -> Result<()> {
        let (_dir, cache, memory) = cache_in_memory()?;
        let put = |bytes: Vec<u8>| put_a_bin(&cache, &memory, bytes);
        put(vec![1; 1000])?;
        let store: Arc<Store> = Arc::new(IgnoresIfMatch(memory.clone()));
        let location = s3_location("s3://bucket/set", "a test prefix")?;
        let listing = cache.list(&store, &location)?;
        assert_eq!(
            cache.read_ranges(&store, &location, &listing[0], &[10..20])?,
            [vec![1; 10]]
        );
        put(vec![2; 1000])?;
        let error = cache
            .read_ranges(&store, &location, &listing[0], &[500..510])
            .expect_err("a range of another version was served");
        assert!(matches!(error, Error::ObjectChanged { .. }), "{error}");
        Ok(())
    }

    /// An object rewritten after it was listed is an error when a range of it is fetched,
    /// never the new version's bytes at the old version's offsets; an empty range is empty.
    #[test]
    #[allow(clippy::single_range_in_vec_init)] // one range among the ranges read
    fn a_range_of_an_object_rewritten_since_its_listing_is_refused() -> Result<()> {
        let (_dir, cache, memory) = cache_in_memory()?;
        let put = |bytes: Vec<u8>| put_a_bin(&cache, &memory, bytes);
        put(vec![1; 1000])?;
        let store: Arc<Store> = Arc::new(memory.clone());
        let location = s3_location("s3://bucket/set", "a test prefix")?;
        let listing = cache.list(&store, &location)?;
        assert_eq!(
            cache.read_ranges(&store, &location, &listing[0], &[10..20, 30..30])?,
            [vec![1; 10], vec![]]
        );
        put(vec![2; 1000])?;
        let error = cache
            .read_ranges(&store, &location, &listing[0], &[500..510])
            .expect_err("a range of another version was served");
        assert!(matches!(error, Error::ObjectChanged { .. }), "{error}");
        let error = cache
            .read_uncached(&store, &location, &listing[0], 0..8)
            .expect_err("a scan read another version");
        assert!(matches!(error, Error::ObjectChanged { .. }), "{error}");
        // Listed again, the new version is read.
        let listing = cache.list(&store, &location)?;
        assert_eq!(
            cache.read_ranges(&store, &location, &listing[0], &[500..510])?,
            [vec![2; 10]]
        );
        Ok(())
    }
}
