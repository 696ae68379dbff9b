//! Tar shards in an object store, read lazily: opening reads the listing and the set's index
//! object (see `index_object.rs`), and each sample is a ranged read of its image member's bytes
//! through the local cache tier (each range an entry of its own, evicted under the cap like a
//! whole object), so neither the open nor the cache needs the whole set. A set without its
//! index is scanned shard by shard as a stream of ranged GETs, one window in memory at a time.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use object_store::ObjectMeta;
use tracing::{info, warn};

use super::index_object::{self as tar_index, IndexedShard, TAR_INDEX_OBJECT};
use super::scan::{scan_archive, ShardIndex};
use super::{parse_class_names, Shard, TarIndexStats, TarShards, ThroughCache, CLASSES_FILE};
use crate::error::{Error, Result};
use crate::sample_source::{numbered_class_names, SampleSource};
use crate::storage::{
    s3_location, write_atomically, ObjectCache, Prefetcher, RemoteLocation, RemoteObject, Store,
};

/// The largest index object read (decompressed): about 20 million samples.
const MAX_INDEX_BYTES: usize = 1 << 30;

pub(super) fn is_tar(name: &str) -> bool {
    Path::new(name)
        .extension()
        .is_some_and(|extension| extension.eq_ignore_ascii_case("tar"))
}

/// What [`write_tar_index`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TarIndexWritten {
    /// The index object's URI.
    pub uri: String,
    /// Shards and samples it describes.
    pub shards: usize,
    /// Samples it describes.
    pub samples: u64,
    /// Its size in bytes.
    pub bytes: u64,
    /// Bytes of shards read to build it.
    pub shard_bytes: u64,
}

/// The location of `uri`, which must be `s3://`.
pub(super) fn remote_location(uri: &str) -> Result<RemoteLocation> {
    s3_location(
        uri,
        "tar shards in an object store are named by s3://BUCKET/PREFIX",
    )
}

/// The tar shards of a listing, in key order.
pub(super) fn listed_shards(
    listing: &[ObjectMeta],
    location: &RemoteLocation,
) -> Result<Vec<ObjectMeta>> {
    let shards: Vec<ObjectMeta> = listing
        .iter()
        .filter(|object| is_tar(object.location.filename().unwrap_or_default()))
        .cloned()
        .collect();
    if shards.is_empty() {
        return Err(Error::NoRemoteObjects {
            uri: location.uri(),
            what: "*.tar shard".into(),
        });
    }
    Ok(shards)
}

/// Reads each of `shards` once, start to end, in windows (not kept in the cache), and indexes
/// it.
fn scan_shards(
    cache: &ObjectCache,
    store: &Store,
    location: &RemoteLocation,
    shards: &[ObjectMeta],
) -> Result<Vec<IndexedShard>> {
    shards
        .iter()
        .map(|object| {
            let key = object.location.to_string();
            let uri = location.uri_of(&key);
            let mut reader = WindowReader {
                cache,
                store,
                location,
                object,
                size: object.size,
                window: cache.options().part_size.max(MIN_SCAN_WINDOW),
                position: 0,
                held: (0, Bytes::new()),
                failure: None,
            };
            let scanned = scan_archive(Path::new(&uri), &mut reader, object.size);
            // A read that failed after its retries is that error, not a damaged shard.
            if let Some(error) = reader.failure {
                return Err(error);
            }
            Ok(IndexedShard {
                name: object.location.filename().unwrap_or_default().to_string(),
                size: object.size,
                e_tag: object.e_tag.clone(),
                index: scanned?,
            })
        })
        .collect()
}

/// The smallest window a shard is scanned in.
const MIN_SCAN_WINDOW: u64 = 64 * 1024;

/// One object read as a seekable stream of ranged GETs, one window (the cache's part size) at a
/// time: scanning a shard holds one window in memory, whatever the shard's size, and members
/// skipped past a window's end are not fetched at all.
struct WindowReader<'a> {
    cache: &'a ObjectCache,
    store: &'a Store,
    location: &'a RemoteLocation,
    /// The object as listed: the scan reads that version only.
    object: &'a ObjectMeta,
    size: u64,
    window: u64,
    position: u64,
    /// The window held: its offset and bytes.
    held: (u64, Bytes),
    /// The error of a GET that failed after its retries (the tar reader sees an I/O error).
    failure: Option<Error>,
}

impl std::io::Read for WindowReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.position >= self.size || out.is_empty() {
            return Ok(0);
        }
        let (start, bytes) = &self.held;
        let held = *start..*start + bytes.len() as u64;
        if !held.contains(&self.position) {
            let end = self.position.saturating_add(self.window).min(self.size);
            match self.cache.read_uncached(
                self.store,
                self.location,
                self.object,
                self.position..end,
            ) {
                Ok(bytes) => self.held = (self.position, bytes),
                Err(error) => {
                    let message = error.to_string();
                    self.failure = Some(error);
                    return Err(std::io::Error::other(message));
                }
            }
        }
        let (start, bytes) = &self.held;
        let from = (self.position - start) as usize;
        let n = out.len().min(bytes.len() - from);
        out[..n].copy_from_slice(&bytes[from..from + n]);
        self.position += n as u64;
        Ok(n)
    }
}

impl std::io::Seek for WindowReader<'_> {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        let target = match to {
            std::io::SeekFrom::Start(at) => Some(at),
            std::io::SeekFrom::End(by) => self.size.checked_add_signed(by),
            std::io::SeekFrom::Current(by) => self.position.checked_add_signed(by),
        };
        let target = target.ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "seek before the start of the object",
            )
        })?;
        self.position = target;
        Ok(target)
    }
}

/// The indexes of `shards` from `indexed`, in listing order, when it describes exactly them.
fn matching(indexed: Vec<IndexedShard>, shards: &[ObjectMeta]) -> Option<Vec<ShardIndex>> {
    if indexed.len() != shards.len() {
        return None;
    }
    indexed
        .into_iter()
        .zip(shards)
        .map(|(entry, object)| entry.describes(object).then_some(entry.index))
        .collect()
}

/// The indexes of `shards` from `indexed`, in listing order, when it describes each of them (it
/// may describe other shards of their folder too).
fn including(indexed: Vec<IndexedShard>, shards: &[ObjectMeta]) -> Option<Vec<ShardIndex>> {
    let mut by_name: std::collections::HashMap<String, IndexedShard> = indexed
        .into_iter()
        .map(|entry| (entry.name.clone(), entry))
        .collect();
    shards
        .iter()
        .map(|object| {
            let entry = by_name.remove(object.location.filename()?)?;
            entry.describes(object).then_some(entry.index)
        })
        .collect()
}

/// Lists the tar shards under `uri`, reads each once, and writes their index object,
/// `PREFIX/stoker-tar-index.bin`, so later opens read nothing else (`stoker index`).
pub fn write_tar_index(uri: &str, cache: &ObjectCache) -> Result<TarIndexWritten> {
    let location = remote_location(uri)?;
    let store = cache.store(&location)?;
    let listing = cache.list(&store, &location)?;
    let shards = listed_shards(&listing, &location)?;
    let before = cache.stats().bytes_fetched;
    let indexed = scan_shards(cache, &store, &location, &shards)?;
    let shard_bytes = cache.stats().bytes_fetched - before;
    put_index(cache, &store, &location, &shards, &indexed, shard_bytes)
}

/// Writes the index object of `indexed` (the `shards` listed under `location`) beside them.
pub(super) fn put_index(
    cache: &ObjectCache,
    store: &Store,
    location: &RemoteLocation,
    shards: &[ObjectMeta],
    indexed: &[IndexedShard],
    shard_bytes: u64,
) -> Result<TarIndexWritten> {
    let bytes = tar_index::encode(indexed, MAX_INDEX_BYTES)?;
    let key = index_key(location, shards);
    let written = TarIndexWritten {
        uri: location.uri_of(&key),
        shards: indexed.len(),
        samples: indexed.iter().map(|s| s.index.samples.len() as u64).sum(),
        bytes: bytes.len() as u64,
        shard_bytes,
    };
    cache.put(store, location, &key, bytes)?;
    Ok(written)
}

/// The key of the index object beside `shards` (they share a prefix: the listing is one level).
fn index_key(location: &RemoteLocation, shards: &[ObjectMeta]) -> String {
    let folder = shards
        .first()
        .map(|object| object.location.to_string())
        .and_then(|key| key.rsplit_once('/').map(|(folder, _)| folder.to_string()))
        .unwrap_or_else(|| location.prefix.clone());
    if folder.is_empty() {
        TAR_INDEX_OBJECT.to_string()
    } else {
        format!("{folder}/{TAR_INDEX_OBJECT}")
    }
}

/// Opens the tar shards under `uri` (`s3://BUCKET/PREFIX`: every `*.tar` object directly under
/// the prefix, or the one `.tar` object the URI names, with `classes.txt` when present), read
/// through `cache` ([`TarShards::open_remote`]); of `split` only when their names are the hub's
/// `{split}-NNNNN-of-NNNNN.tar` (shards of several splits with none named are refused, naming
/// them).
///
/// Opening lists the prefix and reads `stoker-tar-index.bin` (written by `stoker index`);
/// without one, or when it no longer matches the listing (a shard added, removed or changed),
/// each shard is read once and scanned, with a warning, as a stream of ranged GETs of the
/// cache's part size (one in memory at a time; members that span a whole part are skipped, not
/// fetched), and the index is kept in the local cache folder for the next open. A sample is then
/// read by a ranged GET of its member, through the cache.
pub(crate) fn open_remote_tar_set(
    uri: &str,
    cache: Arc<ObjectCache>,
    split: Option<&str>,
) -> Result<TarShards> {
    let started = Instant::now();
    let location = remote_location(uri)?;
    let store = cache.store(&location)?;
    let listing = cache.list(&store, &location)?;
    let shards = listed_shards(&listing, &location)?;
    let shards = crate::naming::listed_of_split(uri, shards, split)?;
    let local_key = match split {
        None => location.uri(),
        Some(split) => format!("{} split {split}", location.uri()),
    };
    let set = TarObjects {
        location,
        store,
        shards,
        listing,
        local_key,
        whole_index: split.is_none(),
    };
    open_tar_objects(set, cache, started)
}

/// Opens the tar shards that `s3://` patterns or a list named ([`TarShards::open_remote_files`]):
/// as [`open_remote_tar_set`] does, each shard's index taken from the index object of its folder
/// when that describes it, else scanned once.
pub(crate) fn open_remote_tar_files(
    files: crate::naming::RemoteFiles,
    cache: Arc<ObjectCache>,
) -> Result<TarShards> {
    let started = Instant::now();
    let set = TarObjects {
        local_key: format!("{} named {}", files.location.uri(), files.name),
        location: files.location,
        store: files.store,
        shards: files.objects,
        listing: files.listing,
        whole_index: false,
    };
    open_tar_objects(set, cache, started)
}

/// Tar shards found in a store, and what was listed beside them.
struct TarObjects {
    /// The bucket and the set's root (its URI names the set).
    location: RemoteLocation,
    store: Arc<Store>,
    /// The shards, in sample order.
    shards: Vec<ObjectMeta>,
    /// Everything listed to find them (index objects, `classes.txt`).
    listing: Vec<ObjectMeta>,
    /// What names the index scanned on this machine in the cache folder.
    local_key: String,
    /// Whether an index object must describe exactly the shards (a whole prefix), not only
    /// include them (a split or named shards of its folder).
    whole_index: bool,
}

/// The folder of `key` (`""` at the top of the bucket).
pub(super) fn folder_of(key: &str) -> &str {
    key.rsplit_once('/').map_or("", |(folder, _)| folder)
}

fn open_tar_objects(
    set: TarObjects,
    cache: Arc<ObjectCache>,
    started: Instant,
) -> Result<TarShards> {
    let TarObjects {
        location,
        store,
        shards,
        listing,
        local_key,
        whole_index,
    } = set;
    super::upload::refuse_unfinished(&location, &shards, &listing)?;
    // The index object and `classes.txt` of the shards' one folder, when they share one.
    let folder = shards
        .first()
        .map(|object| folder_of(object.location.as_ref()).to_string());
    let one_folder = folder.filter(|folder| {
        shards
            .iter()
            .all(|object| folder_of(object.location.as_ref()) == folder)
    });
    let beside = |name: &str| {
        let folder = one_folder.as_deref()?;
        listing.iter().find(|object| {
            folder_of(object.location.as_ref()) == folder
                && object.location.filename() == Some(name)
        })
    };
    let pick = |decoded: Vec<IndexedShard>| {
        if whole_index {
            matching(decoded, &shards)
        } else {
            including(decoded, &shards)
        }
    };
    let before = cache.stats();
    let mut indexes = None;
    if let Some(object) = beside(TAR_INDEX_OBJECT) {
        let key = object.location.to_string();
        let bytes = cache.read_whole(&store, &location, object)?;
        // An index that cannot be read is no reason not to read the shards: they are scanned,
        // as without one.
        match tar_index::decode(&bytes, &location.uri_of(&key), MAX_INDEX_BYTES) {
            Ok(decoded) => {
                indexes = pick(decoded);
                if indexes.is_none() {
                    warn!(
                        index = %location.uri_of(&key),
                        "the tar index no longer matches the shards listed (one was added, \
                         removed or changed); scanning the shards (run `stoker index` to write \
                         it again)"
                    );
                }
            }
            Err(error) => warn!(%error, "scanning the shards instead"),
        }
    }
    let local = local_index_path(cache.options().dir.as_path(), &location, &local_key);
    if indexes.is_none() {
        indexes = std::fs::read(&local)
            .ok()
            .and_then(|bytes| tar_index::decode(&bytes, "", MAX_INDEX_BYTES).ok())
            .and_then(|decoded| matching(decoded, &shards));
    }
    let (indexes, scanned): (Vec<ShardIndex>, bool) = match indexes {
        Some(indexes) => (indexes, false),
        None => {
            if beside(TAR_INDEX_OBJECT).is_none() {
                warn!(
                    uri = %location.uri(),
                    shards = shards.len(),
                    "no tar index object ({TAR_INDEX_OBJECT}) under this prefix: reading every \
                     shard once to index it; write one with `stoker index {}`",
                    location.uri()
                );
            }
            let scanned = scan_shards(&cache, &store, &location, &shards)?;
            keep_local_index(&local, &scanned);
            (scanned.into_iter().map(|shard| shard.index).collect(), true)
        }
    };
    let classes = match beside(CLASSES_FILE) {
        Some(object) => Some((
            location.uri_of(object.location.as_ref()),
            cache.read_whole(&store, &location, object)?,
        )),
        None => None,
    };
    let stats = TarIndexStats {
        shards: shards.len(),
        loaded_from_cache: if scanned { 0 } else { shards.len() },
        built: if scanned { shards.len() } else { 0 },
        problems: indexes.iter().map(|index| index.problems).sum(),
    };
    let shards: Vec<Shard> = shards
        .into_iter()
        .zip(indexes)
        .map(|(object, index)| {
            let object =
                RemoteObject::new(Arc::clone(&cache), Arc::clone(&store), &location, object);
            Shard::remote(object, index)
        })
        .collect();
    let root = PathBuf::from(location.uri());
    let read_ahead = Prefetcher::start(Arc::clone(&cache), Arc::clone(&store), location.clone())
        .map_err(|error| warn!(%error, "cannot start the read-ahead thread"))
        .ok();
    let through = ThroughCache {
        read_ahead,
        cache: Arc::clone(&cache),
    };
    let class_names = |root: &Path, max_label| match classes {
        Some((_, text)) => Ok(parse_class_names(&String::from_utf8_lossy(&text))),
        None => numbered_class_names(root, max_label),
    };
    let set = TarShards::assemble(
        &root,
        root.clone(),
        shards,
        stats,
        Some(through),
        class_names,
    )?;
    let opened = cache.stats();
    info!(
        uri = %location.uri(),
        shards = set.index_stats().shards,
        samples = set.len(),
        bytes_read = opened.bytes_fetched - before.bytes_fetched,
        requests = opened.requests - before.requests,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "opened tar shards in the object store"
    );
    Ok(set)
}

/// Where the index of the shards `key` names (a prefix's URI, with the split or the names that
/// picked them) in `location`'s bucket scanned on this machine is kept in the cache folder.
fn local_index_path(dir: &Path, location: &RemoteLocation, key: &str) -> PathBuf {
    let name = format!(
        "{:016x}.bin",
        key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        })
    );
    dir.join("tar-indexes").join(&location.bucket).join(name)
}

/// Keeps a scanned index for the next open on this machine; failing that, warns (the next open
/// scans again).
fn keep_local_index(path: &Path, shards: &[IndexedShard]) {
    let kept = tar_index::encode(shards, MAX_INDEX_BYTES).and_then(|bytes| {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| Error::io(parent, source))?;
        }
        write_atomically(path, &bytes).map_err(|source| Error::io(path, source))
    });
    if let Err(error) = kept {
        warn!(path = %path.display(), %error, "cannot keep the scanned tar index");
    }
}
