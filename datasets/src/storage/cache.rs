//! The local cache tier: whole remote objects kept as files on disk, shared safely by threads
//! and processes, bounded by a size cap with least-recently-used eviction.
//!
//! Layout under the cache folder, mirroring the bucket so the files read like the remote set:
//!
//! ```text
//! s3/<bucket>/<key>                       the object's bytes, complete and verified
//! s3/<bucket>/<key>.stoker-meta           JSON: size, ETag and last-modified of that copy
//! s3/<bucket>/<key>.stoker-lock           the entry's lock file; its mtime is the last use
//! s3/<bucket>/<key>.stoker-part-<pid>-<n> a download in progress
//! s3/<bucket>/<key>.stoker-idx            a tar shard's index (written by `TarShards`)
//! ```
//!
//! Concurrency: every entry has a lock file locked with `flock` (through fs4). A reader holds
//! a shared lock for as long as it uses the file (a [`CachedObject`] keeps it); a fetch or an
//! eviction needs the exclusive lock. So two processes fetching the same object take turns
//! (the second finds the first's copy valid), and an entry in use is never evicted. Downloads
//! go to a temporary file renamed over the entry only when complete and of the listed size,
//! and the metadata file is written last, so a crash leaves either no entry or an entry that
//! fails its check and is fetched again. Lock files stay when their entry is evicted: deleting
//! a lock file that another process has open would let two processes "hold" the same lock.
//!
//! An entry is valid when its metadata matches the listing (size and ETag, or last-modified
//! when the store gives no ETag) and the data file has that size; a changed object or a cut
//! short copy is fetched again. Nothing is kept in memory between runs: the folder is the
//! cache, so a restarted process finds everything a previous one fetched.
//!
//! Limits: a copy is checked by size and ETag, not by a checksum of its bytes (a same-size
//! corruption on local disk goes unnoticed); an object changed in the store while another
//! process still reads the old copy is refetched only once that process lets go (the wait has
//! the lock timeout as its deadline); each entry in use keeps one file descriptor open.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use fs4::FileExt;
use fs4::TryLockError;
use object_store::ObjectMeta;
use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn};

use super::download::{self, Download, FetchPlan};
use super::uri::{parse_dataset_uri, DatasetLocation, RemoteLocation};
use crate::error::{Error, Result};

const META_SUFFIX: &str = ".stoker-meta";
const LOCK_SUFFIX: &str = ".stoker-lock";
const PART_MARKER: &str = ".stoker-part-";
const INDEX_SUFFIX: &str = ".stoker-idx";

/// Bytes per ranged GET by default.
pub const DEFAULT_PART_SIZE: u64 = 8 * 1024 * 1024;
/// Ranged GETs in flight at once by default.
pub const DEFAULT_CONCURRENCY: usize = 8;
/// The cache cap when `STOKER_CACHE_MAX_BYTES` is not set: 64 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 64 * 1024 * 1024 * 1024;
/// Parts left behind by a process that died are removed once this old.
const STALE_PART_AGE: Duration = Duration::from_secs(24 * 60 * 60);

/// S3 connection settings that override the standard `AWS_*` environment variables
/// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL`,
/// `AWS_ALLOW_HTTP`...). `None` leaves the environment's value.
#[derive(Clone, Default)]
pub struct S3Settings {
    /// Endpoint URL of an S3-compatible server (`http://127.0.0.1:9000`).
    pub endpoint: Option<String>,
    /// Access key id.
    pub access_key_id: Option<String>,
    /// Secret access key.
    pub secret_access_key: Option<String>,
    /// Region.
    pub region: Option<String>,
    /// Allow plain HTTP to a non-loopback endpoint (loopback endpoints always may).
    pub allow_http: bool,
}

impl std::fmt::Debug for S3Settings {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("S3Settings")
            .field("endpoint", &self.endpoint)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "<redacted>"),
            )
            .field("region", &self.region)
            .field("allow_http", &self.allow_http)
            .finish()
    }
}

/// How an [`ObjectCache`] stores, fetches and evicts.
#[derive(Debug, Clone)]
pub struct ObjectCacheOptions {
    /// The cache folder.
    pub dir: PathBuf,
    /// Evict least-recently-used entries once the cached objects add up to more than this.
    pub max_bytes: u64,
    /// Bytes per ranged GET.
    pub part_size: u64,
    /// Ranged GETs in flight at once.
    pub concurrency: usize,
    /// Tries per ranged GET before a fetch fails (each try is itself retried by the client on
    /// connection errors and 5xx answers, `request_retries` times).
    pub max_attempts: u32,
    /// Retries of one HTTP request by the object store client (exponential backoff from
    /// 100 ms up to 5 s) before it reports a failure.
    pub request_retries: usize,
    /// How long to wait for an entry another process is fetching.
    pub lock_timeout: Duration,
    /// Connection settings over the `AWS_*` environment variables.
    pub s3: S3Settings,
}

impl ObjectCacheOptions {
    /// Defaults with the cache in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> ObjectCacheOptions {
        ObjectCacheOptions {
            dir: dir.into(),
            max_bytes: DEFAULT_MAX_BYTES,
            part_size: DEFAULT_PART_SIZE,
            concurrency: DEFAULT_CONCURRENCY,
            max_attempts: 6,
            request_retries: 8,
            lock_timeout: Duration::from_secs(600),
            s3: S3Settings::default(),
        }
    }

    /// Options from the environment: `STOKER_CACHE_DIR` (default
    /// `$XDG_CACHE_HOME/stoker/objects`, else `~/.cache/stoker/objects`),
    /// `STOKER_CACHE_MAX_BYTES` (bytes, or with a K/M/G/T suffix in powers of 1024; default
    /// 64G) and `STOKER_CACHE_LOCK_TIMEOUT_SECS` (default 600).
    pub fn from_env() -> Result<ObjectCacheOptions> {
        let dir = match std::env::var_os("STOKER_CACHE_DIR") {
            Some(dir) if !dir.is_empty() => PathBuf::from(dir),
            _ => crate::tar_shards::default_user_cache_dir()
                .map(|dir| dir.join("objects"))
                .ok_or_else(|| {
                    Error::CacheConfig(
                        "no cache folder: set STOKER_CACHE_DIR (or HOME / XDG_CACHE_HOME)".into(),
                    )
                })?,
        };
        let mut options = ObjectCacheOptions::new(dir);
        if let Ok(text) = std::env::var("STOKER_CACHE_MAX_BYTES") {
            options.max_bytes = parse_byte_size(&text).ok_or_else(|| {
                Error::CacheConfig(format!(
                    "STOKER_CACHE_MAX_BYTES={text:?} is not a size (bytes, or 512M, 20G...)"
                ))
            })?;
        }
        if let Ok(text) = std::env::var("STOKER_CACHE_LOCK_TIMEOUT_SECS") {
            let seconds: u64 = text.trim().parse().map_err(|_| {
                Error::CacheConfig(format!(
                    "STOKER_CACHE_LOCK_TIMEOUT_SECS={text:?} is not a number of seconds"
                ))
            })?;
            options.lock_timeout = Duration::from_secs(seconds);
        }
        Ok(options)
    }
}

/// `123`, `512K`, `20G`, `1.5T`... in bytes (suffixes are powers of 1024).
fn parse_byte_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let multiplier: u64 = match unit
        .trim()
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return None,
    };
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_mul(multiplier);
    }
    let value: f64 = number.parse().ok()?;
    let bytes = value * multiplier as f64;
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

/// What the cache tier has done since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CacheStats {
    /// Objects found valid in the cache.
    pub hits: u64,
    /// Objects fetched from the store (absent, changed or damaged in the cache).
    pub misses: u64,
    /// Bytes received from the store.
    pub bytes_fetched: u64,
    /// Bytes of the objects served from the cache without a fetch.
    pub bytes_from_cache: u64,
    /// Ranged GETs sent (retries included).
    pub requests: u64,
    /// Ranged GETs tried again after a failure.
    pub retries: u64,
    /// Entries evicted to keep the cache under its cap.
    pub evictions: u64,
    /// Bytes of the evicted entries.
    pub bytes_evicted: u64,
}

impl std::fmt::Display for CacheStats {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "object cache: {} hits, {} misses, {} bytes fetched, {} bytes from cache, \
             {} requests, {} retries, {} evictions",
            self.hits,
            self.misses,
            self.bytes_fetched,
            self.bytes_from_cache,
            self.requests,
            self.retries,
            self.evictions
        )
    }
}

/// The live counters behind [`CacheStats`].
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) hits: AtomicU64,
    pub(super) misses: AtomicU64,
    pub(super) bytes_fetched: AtomicU64,
    pub(super) bytes_from_cache: AtomicU64,
    pub(super) requests: AtomicU64,
    pub(super) retries: AtomicU64,
    pub(super) evictions: AtomicU64,
    pub(super) bytes_evicted: AtomicU64,
}

/// A remote object materialised in the cache. While it lives, its entry is locked shared:
/// no process evicts or replaces it.
#[derive(Debug)]
pub struct CachedObject {
    key: String,
    uri: String,
    path: PathBuf,
    size: u64,
    /// Holds the entry's shared lock; closing it releases the lock.
    _lock: File,
}

impl CachedObject {
    /// The object's key in its bucket.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The object's `s3://` URI.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// The local file holding the object's bytes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The object's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The last segment of the key.
    pub fn file_name(&self) -> &str {
        self.key.rsplit('/').next().unwrap_or(&self.key)
    }
}

/// The recorded identity of a cached copy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct EntryMeta {
    size: u64,
    e_tag: Option<String>,
    last_modified: String,
}

impl EntryMeta {
    fn of(object: &ObjectMeta) -> EntryMeta {
        EntryMeta {
            size: object.size,
            e_tag: object.e_tag.clone(),
            last_modified: object.last_modified.to_rfc3339(),
        }
    }

    /// Whether a copy described by `self` is the object the listing describes.
    fn matches(&self, listed: &EntryMeta) -> bool {
        self.size == listed.size
            && match (&self.e_tag, &listed.e_tag) {
                (Some(mine), Some(theirs)) => mine == theirs,
                _ => self.last_modified == listed.last_modified,
            }
    }
}

/// The files of one cache entry.
struct Entry {
    key: String,
    uri: String,
    data: PathBuf,
    meta: PathBuf,
    lock: PathBuf,
    listed: EntryMeta,
}

/// The state of an entry's copy against the listing.
#[derive(Debug, PartialEq, Eq)]
enum Validity {
    Valid,
    Missing,
    Stale,
    Damaged(String),
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

impl Entry {
    fn new(dir: &Path, location: &RemoteLocation, object: &ObjectMeta) -> Result<Entry> {
        let key = object.location.to_string();
        let uri = location.uri_of(&key);
        let bad_segment = |segment: &str| {
            segment.is_empty()
                || segment == "."
                || segment == ".."
                || [META_SUFFIX, LOCK_SUFFIX, INDEX_SUFFIX]
                    .iter()
                    .any(|suffix| segment.ends_with(suffix))
                || segment.contains(PART_MARKER)
        };
        if bad_segment(&location.bucket) || key.split('/').any(bad_segment) {
            return Err(Error::InvalidUri {
                uri,
                reason: "the key cannot be cached: it has an empty, `.` or `..` segment or \
                         ends like one of the cache's own files (.stoker-meta, .stoker-lock, \
                         .stoker-idx)"
                    .into(),
            });
        }
        let mut data = dir.join("s3").join(&location.bucket);
        data.extend(key.split('/'));
        Ok(Entry {
            meta: with_suffix(&data, META_SUFFIX),
            lock: with_suffix(&data, LOCK_SUFFIX),
            data,
            key,
            uri,
            listed: EntryMeta::of(object),
        })
    }

    fn open_lock(&self) -> Result<File> {
        if let Some(parent) = self.lock.parent() {
            std::fs::create_dir_all(parent).map_err(|source| Error::io(parent, source))?;
        }
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&self.lock)
            .map_err(|source| Error::io(&self.lock, source))
    }

    fn validity(&self) -> Validity {
        let text = match std::fs::read(&self.meta) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Validity::Missing,
            Err(error) => return Validity::Damaged(format!("metadata unreadable: {error}")),
        };
        let recorded: EntryMeta = match serde_json::from_slice(&text) {
            Ok(recorded) => recorded,
            Err(error) => return Validity::Damaged(format!("metadata unparsable: {error}")),
        };
        if !recorded.matches(&self.listed) {
            return Validity::Stale;
        }
        match std::fs::metadata(&self.data) {
            Ok(metadata) if metadata.len() == self.listed.size => Validity::Valid,
            Ok(metadata) => Validity::Damaged(format!(
                "data file holds {} bytes, {} expected",
                metadata.len(),
                self.listed.size
            )),
            Err(error) => Validity::Damaged(format!("data file unreadable: {error}")),
        }
    }

    /// Whether the copy is valid; logs why not when it is there but unusable.
    fn is_valid(&self) -> bool {
        match self.validity() {
            Validity::Valid => true,
            Validity::Missing => false,
            Validity::Stale => {
                info!(uri = %self.uri, "cached copy is of another version of the object; fetching it again");
                false
            }
            Validity::Damaged(why) => {
                warn!(uri = %self.uri, cache = %self.data.display(), problem = %why, "cached copy is damaged; fetching it again");
                false
            }
        }
    }
}

/// A temporary download file, removed unless committed.
struct PartFile {
    path: PathBuf,
    file: Arc<File>,
    committed: bool,
}

impl Drop for PartFile {
    fn drop(&mut self) {
        if !self.committed {
            // Best effort: nothing else can be done about a leftover, which a later eviction
            // scan removes once stale.
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Tries to lock `file` without waiting. `Ok(false)`: someone else holds a conflicting lock.
fn try_lock(file: &File, exclusive: bool, path: &Path) -> Result<bool> {
    let attempt = if exclusive {
        FileExt::try_lock(file)
    } else {
        FileExt::try_lock_shared(file)
    };
    match attempt {
        Ok(()) => Ok(true),
        Err(TryLockError::WouldBlock) => Ok(false),
        Err(TryLockError::Error(source)) => Err(Error::io(path, source)),
    }
}

/// Waits for a lock on `file`, polling, up to `timeout` (every wait has a deadline).
fn wait_for_lock(file: &File, exclusive: bool, path: &Path, timeout: Duration) -> Result<()> {
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

fn unlock(file: &File, path: &Path) -> Result<()> {
    FileExt::unlock(file).map_err(|source| Error::io(path, source))
}

/// Turns the exclusive lock held on `file` into a shared one.
fn downgrade(file: &File, path: &Path) -> Result<()> {
    FileExt::lock_shared(file).map_err(|source| Error::io(path, source))
}

/// Writes `bytes` to `path` through a temporary file and a rename.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let temporary = with_suffix(path, &format!("{PART_MARKER}{}-meta", std::process::id()));
    let written =
        std::fs::write(&temporary, bytes).and_then(|()| std::fs::rename(&temporary, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

/// The local cache tier for remote objects. See the module docs for layout and guarantees.
///
/// One instance per process is the intent (it owns a small tokio runtime for its downloads),
/// but any number of instances and processes may share one folder.
pub struct ObjectCache {
    options: ObjectCacheOptions,
    runtime: tokio::runtime::Runtime,
    counters: Counters,
    next_part: AtomicU64,
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
        std::fs::create_dir_all(&options.dir).map_err(|source| Error::io(&options.dir, source))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| Error::io(&options.dir, source))?;
        Ok(ObjectCache {
            options,
            runtime,
            counters: Counters::default(),
            next_part: AtomicU64::new(0),
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
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let counters = &self.counters;
        CacheStats {
            hits: load(&counters.hits),
            misses: load(&counters.misses),
            bytes_fetched: load(&counters.bytes_fetched),
            bytes_from_cache: load(&counters.bytes_from_cache),
            requests: load(&counters.requests),
            retries: load(&counters.retries),
            evictions: load(&counters.evictions),
            bytes_evicted: load(&counters.bytes_evicted),
        }
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
        let location = match parse_dataset_uri(uri)? {
            DatasetLocation::S3(location) => location,
            DatasetLocation::Local(_) => {
                return Err(Error::InvalidUri {
                    uri: uri.to_string(),
                    reason: "the object cache reads s3://BUCKET/PREFIX URIs".into(),
                })
            }
        };
        let started = Instant::now();
        let store = Arc::new(download::build_store(
            &location.bucket,
            &self.options.s3,
            self.options.request_retries,
        )?);
        let listing = self
            .runtime
            .block_on(download::list_objects(&store, &location))?;
        let listing: Vec<ObjectMeta> = listing
            .into_iter()
            .filter(|object| keep(object.location.filename().unwrap_or_default()))
            .collect();
        let before = self.stats();

        let mut ready: Vec<Option<CachedObject>> = listing.iter().map(|_| None).collect();
        let mut to_fetch = Vec::new();
        let mut contended = Vec::new();
        for (position, object) in listing.iter().enumerate() {
            let entry = Entry::new(&self.options.dir, &location, object)?;
            let lock = entry.open_lock()?;
            if try_lock(&lock, false, &entry.lock)? {
                if entry.is_valid() {
                    ready[position] = Some(self.hit(entry, lock));
                    continue;
                }
                unlock(&lock, &entry.lock)?;
            }
            if try_lock(&lock, true, &entry.lock)? {
                if entry.validity() == Validity::Valid {
                    downgrade(&lock, &entry.lock)?;
                    ready[position] = Some(self.hit(entry, lock));
                } else {
                    to_fetch.push((position, entry, lock));
                }
            } else {
                contended.push((position, entry, lock));
            }
        }
        for (position, object) in self.download(&store, to_fetch)? {
            ready[position] = Some(object);
        }
        // Entries another process was fetching or evicting: wait for it, then use its copy or
        // fetch ours.
        for (position, entry, lock) in contended {
            let timeout = self.options.lock_timeout;
            wait_for_lock(&lock, false, &entry.lock, timeout)?;
            if entry.is_valid() {
                ready[position] = Some(self.hit(entry, lock));
                continue;
            }
            unlock(&lock, &entry.lock)?;
            wait_for_lock(&lock, true, &entry.lock, timeout)?;
            if entry.validity() == Validity::Valid {
                downgrade(&lock, &entry.lock)?;
                ready[position] = Some(self.hit(entry, lock));
                continue;
            }
            for (position, object) in self.download(&store, vec![(position, entry, lock)])? {
                ready[position] = Some(object);
            }
        }
        self.enforce_cap()?;

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
        Ok((location, ready.into_iter().flatten().collect()))
    }

    /// Records a hit on an entry whose lock is held shared.
    fn hit(&self, entry: Entry, lock: File) -> CachedObject {
        touch(&lock, &entry.lock);
        self.counters.hits.fetch_add(1, Ordering::Relaxed);
        self.counters
            .bytes_from_cache
            .fetch_add(entry.listed.size, Ordering::Relaxed);
        CachedObject {
            key: entry.key,
            uri: entry.uri,
            path: entry.data,
            size: entry.listed.size,
            _lock: lock,
        }
    }

    /// Downloads entries whose locks are held exclusive, commits them, and returns them with
    /// their locks turned shared.
    fn download(
        &self,
        store: &Arc<object_store::aws::AmazonS3>,
        entries: Vec<(usize, Entry, File)>,
    ) -> Result<Vec<(usize, CachedObject)>> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
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
                .map_err(|source| Error::io(&path, source))?;
            let part = PartFile {
                path,
                file: Arc::new(file),
                committed: false,
            };
            part.file
                .set_len(entry.listed.size)
                .map_err(|source| Error::io(&part.path, source))?;
            parts.push(part);
        }
        let downloads: Vec<Download> = entries
            .iter()
            .zip(&parts)
            .map(|((_, entry, _), part)| Download {
                key: entry.key.clone(),
                uri: entry.uri.clone(),
                size: entry.listed.size,
                file: Arc::clone(&part.file),
            })
            .collect();
        let plan = FetchPlan {
            part_size: self.options.part_size,
            concurrency: self.options.concurrency,
            max_attempts: self.options.max_attempts,
        };
        self.runtime.block_on(download::download_all(
            Arc::clone(store),
            &downloads,
            plan,
            &self.counters,
        ))?;
        drop(downloads);

        let mut fetched = Vec::with_capacity(entries.len());
        for ((position, entry, lock), mut part) in entries.into_iter().zip(parts) {
            commit(&entry, &part)?;
            part.committed = true;
            downgrade(&lock, &entry.lock)?;
            touch(&lock, &entry.lock);
            self.counters.misses.fetch_add(1, Ordering::Relaxed);
            debug!(uri = %entry.uri, bytes = entry.listed.size, "fetched object into the cache");
            fetched.push((
                position,
                CachedObject {
                    key: entry.key,
                    uri: entry.uri,
                    path: entry.data,
                    size: entry.listed.size,
                    _lock: lock,
                },
            ));
        }
        Ok(fetched)
    }

    /// Evicts least-recently-used entries nobody holds until the cached objects fit the cap.
    /// Entries in use (locked by any process) are skipped; leftover downloads of dead
    /// processes are removed on the way.
    pub fn enforce_cap(&self) -> Result<()> {
        let root = self.options.dir.join("s3");
        let mut entries = Vec::new();
        scan(&root, &mut entries);
        let mut total: u64 = entries.iter().map(|entry| entry.size).sum();
        if total <= self.options.max_bytes {
            return Ok(());
        }
        entries.sort_by_key(|entry| entry.last_use);
        for entry in &entries {
            if total <= self.options.max_bytes {
                break;
            }
            let lock = match OpenOptions::new()
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
            if !try_lock(&lock, true, &entry.lock)? {
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
            total -= entry.size;
            self.counters.evictions.fetch_add(1, Ordering::Relaxed);
            self.counters
                .bytes_evicted
                .fetch_add(entry.size, Ordering::Relaxed);
            debug!(path = %entry.data.display(), bytes = entry.size, "evicted from the object cache");
        }
        if total > self.options.max_bytes {
            warn!(
                cache = %self.options.dir.display(),
                bytes = total,
                cap = self.options.max_bytes,
                "object cache is over its cap: every entry left is in use"
            );
        }
        Ok(())
    }
}

/// Marks the entry as just used (the eviction order reads it back).
fn touch(lock: &File, path: &Path) {
    if let Err(error) = lock.set_modified(SystemTime::now()) {
        debug!(lock = %path.display(), %error, "cannot record the last use of a cache entry");
    }
}

/// Moves a complete download over the entry, then records its metadata.
fn commit(entry: &Entry, part: &PartFile) -> Result<()> {
    part.file
        .sync_all()
        .map_err(|source| Error::io(&part.path, source))?;
    let received = part
        .file
        .metadata()
        .map_err(|source| Error::io(&part.path, source))?
        .len();
    if received != entry.listed.size {
        return Err(Error::IncompleteObject {
            uri: entry.uri.clone(),
            expected: entry.listed.size,
            received,
        });
    }
    // Invalidate first so no reader trusts old metadata with new bytes in between.
    match std::fs::remove_file(&entry.meta) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(Error::io(&entry.meta, source)),
    }
    std::fs::rename(&part.path, &entry.data).map_err(|source| Error::io(&entry.data, source))?;
    let meta = serde_json::to_vec(&entry.listed).map_err(|source| Error::Manifest {
        path: entry.meta.clone(),
        source,
    })?;
    write_atomically(&entry.meta, &meta).map_err(|source| Error::io(&entry.meta, source))
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
        if name.contains(PART_MARKER) {
            let old = item
                .metadata()
                .and_then(|metadata| metadata.modified())
                .ok()
                .and_then(|modified| modified.elapsed().ok())
                .is_some_and(|age| age > STALE_PART_AGE);
            if old {
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
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_byte_size("123"), Some(123));
        assert_eq!(parse_byte_size("4K"), Some(4096));
        assert_eq!(parse_byte_size("20G"), Some(20 << 30));
        assert_eq!(parse_byte_size("20GiB"), Some(20 << 30));
        assert_eq!(parse_byte_size("1.5M"), Some(3 << 19));
        assert_eq!(parse_byte_size("lots"), None);
        assert_eq!(parse_byte_size("5Q"), None);
    }

    #[test]
    fn metadata_matches_by_etag_else_by_time() {
        let listed = EntryMeta {
            size: 10,
            e_tag: Some("\"a\"".into()),
            last_modified: "t1".into(),
        };
        let mut copy = listed.clone();
        copy.last_modified = "t0".into();
        assert!(copy.matches(&listed), "same etag: same object");
        copy.e_tag = Some("\"b\"".into());
        assert!(!copy.matches(&listed));
        copy.e_tag = None;
        assert!(!copy.matches(&listed), "no etag: times differ");
        copy.last_modified = "t1".into();
        assert!(copy.matches(&listed));
        copy.size = 11;
        assert!(!copy.matches(&listed));
    }

    #[test]
    fn keys_that_would_escape_or_clash_with_cache_files_are_refused() {
        let location = RemoteLocation {
            bucket: "b".into(),
            prefix: String::new(),
        };
        let object = |key: &str| ObjectMeta {
            location: object_store::path::Path::from(key),
            last_modified: Default::default(),
            size: 1,
            e_tag: None,
            version: None,
        };
        let entry =
            Entry::new(Path::new("/cache"), &location, &object("train/shard-0.tar")).unwrap();
        assert_eq!(entry.data, Path::new("/cache/s3/b/train/shard-0.tar"));
        assert_eq!(
            entry.lock,
            Path::new("/cache/s3/b/train/shard-0.tar.stoker-lock")
        );
        for key in [
            "x.tar.stoker-meta",
            "x.stoker-lock",
            "x.tar.stoker-idx",
            "a.stoker-part-1-2",
        ] {
            assert!(
                Entry::new(Path::new("/cache"), &location, &object(key)).is_err(),
                "{key}"
            );
        }
    }

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
}
