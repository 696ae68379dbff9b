//! Tar shards in an object store, read through the local cache tier.
//!
//! Descriptors: once the shards are indexed, their cache entries' locks are let go; a shard's
//! lock is taken again whenever its file is opened in the process's pool of open files, and
//! dropped with it. So a source holds two descriptors per shard it reads at the moment (data
//! and lock), not per shard it has. An entry not open may be evicted by another process; the
//! next read of it fetches it again (an object changed in the store meanwhile is an error,
//! [`Error::ObjectChanged`]: the index no longer fits it).

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use tracing::info;

use super::cache::ObjectCache;
use super::entry::CachedObject;
use super::uri::RemoteLocation;
use crate::cache_stats::CacheStats;
use crate::error::{Error, Result};
use crate::file_pool::PooledFile;
use crate::sample_source::SampleSource;
use crate::tar_shards::{ShardOpener, TarShards, CLASSES_FILE};

/// WebDataset tar shards under an `s3://BUCKET/PREFIX`: every `*.tar` object directly under
/// the prefix (or the one `.tar` object the URI names), plus `classes.txt` when present.
///
/// Opening materialises every shard in the cache (fetching those that are absent, changed or
/// damaged) and indexes it with [`TarShards`], whose index files sit beside the cached shards,
/// so a warm open reads nothing but one listing from the store. Reads are then local. The
/// cache entries stay locked (shared) while this source lives, so no process evicts them.
pub struct RemoteTarShards {
    location: RemoteLocation,
    shards: TarShards,
    objects: Arc<Vec<CachedObject>>,
    cache: Arc<ObjectCache>,
}

/// Opens a cached shard with its entry's lock, fetching the entry again when it was evicted.
struct LockingOpener {
    /// All objects of the source; `shard_objects[i]` is the position of shard `i`'s.
    objects: Arc<Vec<CachedObject>>,
    shard_objects: Vec<usize>,
    cache: Arc<ObjectCache>,
    /// The URI the source was opened with: listed again to fetch an evicted shard, so the
    /// listing describes the object the same way as the first time.
    source_uri: String,
}

impl ShardOpener for LockingOpener {
    fn open(&self, shard: usize, path: &Path) -> Result<PooledFile> {
        let object = self
            .shard_objects
            .get(shard)
            .and_then(|position| self.objects.get(*position))
            .ok_or_else(|| {
                Error::InvalidArgument(format!("no cached object for shard {}", path.display()))
            })?;
        let timeout = self.cache.options().lock_timeout;
        if let Some((file, lock)) = object.lock_again(timeout)? {
            return Ok(PooledFile {
                file,
                _held: Some(lock),
            });
        }
        info!(uri = %object.uri(), "cached shard was evicted while in use; fetching it again");
        let name = object.file_name().to_string();
        let (_, fetched) = self
            .cache
            .fetch(&self.source_uri, &|candidate| candidate == name)?;
        let again = fetched
            .into_iter()
            .find(|candidate| candidate.key() == object.key())
            .ok_or_else(|| Error::ObjectChanged {
                uri: object.uri().to_string(),
            })?;
        if !object.same_object(&again) {
            return Err(Error::ObjectChanged {
                uri: object.uri().to_string(),
            });
        }
        let file = File::open(again.path()).map_err(|source| Error::io(again.path(), source))?;
        Ok(PooledFile {
            file,
            _held: again.into_lock(),
        })
    }
}

fn is_tar(name: &str) -> bool {
    Path::new(name)
        .extension()
        .is_some_and(|extension| extension.eq_ignore_ascii_case("tar"))
}

impl RemoteTarShards {
    /// Lists `uri`, brings its shards into `cache` and indexes them.
    pub fn open(uri: &str, cache: Arc<ObjectCache>) -> Result<RemoteTarShards> {
        let (location, mut objects) =
            cache.fetch(uri, &|name| is_tar(name) || name == CLASSES_FILE)?;
        let shard_objects: Vec<usize> = objects
            .iter()
            .enumerate()
            .filter(|(_, object)| is_tar(object.file_name()))
            .map(|(position, _)| position)
            .collect();
        let shard_paths: Vec<_> = shard_objects
            .iter()
            .map(|position| objects[*position].path().to_path_buf())
            .collect();
        let Some(root) = shard_paths.first().and_then(|path| path.parent()) else {
            return Err(Error::NoRemoteObjects {
                uri: location.uri(),
                what: "*.tar shard".into(),
            });
        };
        let root = root.to_path_buf();
        // Index files go beside the cached shards: the cache folder is writable by definition.
        let mut shards = TarShards::open_files(&root, shard_paths, None)?;
        for object in &mut objects {
            object.release();
        }
        let objects = Arc::new(objects);
        shards.set_opener(Arc::new(LockingOpener {
            objects: Arc::clone(&objects),
            shard_objects,
            cache: Arc::clone(&cache),
            source_uri: uri.to_string(),
        }));
        Ok(RemoteTarShards {
            location,
            shards,
            objects,
            cache,
        })
    }

    /// The bucket and prefix read.
    pub fn location(&self) -> &RemoteLocation {
        &self.location
    }

    /// The shards as local files in the cache.
    pub fn local(&self) -> &TarShards {
        &self.shards
    }

    /// The cache the shards came through.
    pub fn cache(&self) -> &Arc<ObjectCache> {
        &self.cache
    }
}

impl SampleSource for RemoteTarShards {
    fn len(&self) -> u64 {
        self.shards.len()
    }

    fn label(&self, index: u64) -> i64 {
        self.shards.label(index)
    }

    /// The shard's `s3://` URI and the member, rather than the cached file's path.
    fn describe(&self, index: u64) -> String {
        let local = self.shards.describe(index);
        for object in self.objects.iter() {
            if let Some(member) = object
                .path()
                .to_str()
                .and_then(|path| local.strip_prefix(path))
            {
                return format!("{}{member}", object.uri());
            }
        }
        local
    }

    fn read(&self, index: u64) -> Result<Vec<u8>> {
        self.shards.read(index)
    }

    fn class_names(&self) -> &[String] {
        self.shards.class_names()
    }

    fn shard_sizes(&self) -> Option<Vec<u64>> {
        self.shards.shard_sizes()
    }

    fn cache_stats(&self) -> Option<CacheStats> {
        Some(self.cache.stats())
    }
}
