//! One object of a store read through the cache tier: by byte ranges, for formats whose readers
//! want ranges (Parquet's footers and column chunks), or whole, fetched again for a reader
//! whose copy was evicted since it let go of it (`remake.rs`).

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use object_store::ObjectMeta;

use tracing::warn;

use super::cache::ObjectCache;
use super::entry::{CachedObject, Entry};
use super::options::ObjectCacheOptions;
use super::prefetch::Prefetcher;
use super::s3_client::Store;
use super::uri::{s3_location, RemoteLocation};
use crate::error::{Error, Result};

/// Bytes of one file read by ranges: an object in a store through the cache tier
/// ([`RemoteObject`]), or (the `parquet_ranged` fuzz target) bytes in memory.
pub(crate) trait ByteRanges: Send + Sync {
    /// Its size in bytes.
    fn size(&self) -> u64;

    /// Bytes `ranges` of it, each within its size.
    fn read_ranges(&self, ranges: &[Range<u64>]) -> Result<Vec<Vec<u8>>>;

    /// The object as its store listed it (what a read-ahead hint names), when it is one.
    fn listed(&self) -> Option<&ObjectMeta>;
}

/// An object as listed, with what it is read through.
#[derive(Clone)]
pub(crate) struct RemoteObject {
    cache: Arc<ObjectCache>,
    store: Arc<Store>,
    location: RemoteLocation,
    object: ObjectMeta,
}

impl RemoteObject {
    /// The object `object` listed at `location`, read through `cache` from `store`.
    pub(crate) fn new(
        cache: Arc<ObjectCache>,
        store: Arc<Store>,
        location: &RemoteLocation,
        object: ObjectMeta,
    ) -> RemoteObject {
        RemoteObject {
            cache,
            store,
            location: location.clone(),
            object,
        }
    }

    /// The object's `s3://` URI.
    pub(crate) fn uri(&self) -> String {
        self.location.uri_of(self.object.location.as_ref())
    }

    /// Where its whole copy lies in the cache tier (whether it is there or not).
    pub(crate) fn copy_path(&self) -> Result<PathBuf> {
        Ok(Entry::new(&self.cache.options().dir, &self.location, &self.object)?.data)
    }

    /// The options of the cache tier it is read through.
    pub(crate) fn cache_options(&self) -> &ObjectCacheOptions {
        self.cache.options()
    }

    /// A fingerprint of the version listed: 128 bits of the SHA-256 of its ETag, or, when the
    /// store lists none, of its last-modified time (as its copy's path in the cache names it:
    /// a HEAD and a listing may give one version's time to another precision). What copies
    /// made from it are named by.
    pub(crate) fn version_fingerprint(&self) -> u128 {
        use sha2::{Digest, Sha256};
        let version = match &self.object.e_tag {
            Some(e_tag) => format!("etag {e_tag}"),
            None => format!("modified {}", self.object.last_modified.to_rfc3339()),
        };
        let bytes: [u8; 32] = Sha256::digest(version.as_bytes()).into();
        let mut half = [0u8; 16];
        half.copy_from_slice(&bytes[..16]);
        u128::from_le_bytes(half)
    }

    /// Its whole copy in the cache tier, locked while the returned one lives: fetched as
    /// listed unless there ([`ObjectCache::fetch_one`]).
    pub(crate) fn fetch_whole(&self) -> Result<CachedObject> {
        self.cache
            .fetch_one(&self.store, &self.location, &self.object)
    }

    /// The figures of the cache tier it is read through.
    pub(crate) fn cache_stats(&self) -> crate::cache_stats::CacheStats {
        self.cache.stats()
    }

    /// A read-ahead thread for this object and the others of its listing (they share the
    /// cache, the store and the location); `None`, with a warning, when the thread cannot
    /// start (samples are then fetched as they are read).
    pub(crate) fn start_read_ahead(&self) -> Option<Prefetcher> {
        Prefetcher::start(
            Arc::clone(&self.cache),
            Arc::clone(&self.store),
            self.location.clone(),
        )
        .map_err(|error| warn!(%error, "cannot start the read-ahead thread"))
        .ok()
    }
}

impl ByteRanges for RemoteObject {
    fn size(&self) -> u64 {
        self.object.size
    }

    /// Through the cache.
    fn read_ranges(&self, ranges: &[Range<u64>]) -> Result<Vec<Vec<u8>>> {
        self.cache
            .read_ranges(&self.store, &self.location, &self.object, ranges)
    }

    fn listed(&self) -> Option<&ObjectMeta> {
        Some(&self.object)
    }
}

/// The objects directly under `uri` (or the one it names) whose file name passes `keep`, in key
/// order; an error naming `what` when there is none.
pub(crate) fn list_remote(
    uri: &str,
    cache: &Arc<ObjectCache>,
    keep: &dyn Fn(&str) -> bool,
    what: &str,
) -> Result<(RemoteLocation, Vec<RemoteObject>)> {
    let location = s3_location(uri, "objects in a store are named by s3://BUCKET/PREFIX")?;
    let store = cache.store(&location)?;
    let objects: Vec<RemoteObject> = cache
        .list(&store, &location)?
        .into_iter()
        .filter(|object| keep(object.location.filename().unwrap_or_default()))
        .map(|object| RemoteObject {
            cache: Arc::clone(cache),
            store: Arc::clone(&store),
            location: location.clone(),
            object,
        })
        .collect();
    if objects.is_empty() {
        return Err(Error::NoRemoteObjects {
            uri: location.uri(),
            what: what.to_string(),
        });
    }
    Ok((location, objects))
}
