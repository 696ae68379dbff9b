//! Tar shards in an object store, read through the local cache tier.

use std::path::Path;
use std::sync::Arc;

use super::cache::ObjectCache;
use super::entry::CachedObject;
use super::uri::RemoteLocation;
use crate::cache_stats::CacheStats;
use crate::error::{Error, Result};
use crate::sample_source::SampleSource;
use crate::tar_shards::{TarShards, CLASSES_FILE};

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
    objects: Vec<CachedObject>,
    cache: Arc<ObjectCache>,
}

fn is_tar(name: &str) -> bool {
    Path::new(name)
        .extension()
        .is_some_and(|extension| extension.eq_ignore_ascii_case("tar"))
}

impl RemoteTarShards {
    /// Lists `uri`, brings its shards into `cache` and indexes them.
    pub fn open(uri: &str, cache: Arc<ObjectCache>) -> Result<RemoteTarShards> {
        let (location, objects) = cache.fetch(uri, &|name| is_tar(name) || name == CLASSES_FILE)?;
        let shard_paths: Vec<_> = objects
            .iter()
            .filter(|object| is_tar(object.file_name()))
            .map(|object| object.path().to_path_buf())
            .collect();
        let Some(root) = shard_paths.first().and_then(|path| path.parent()) else {
            return Err(Error::NoRemoteObjects {
                uri: location.uri(),
                what: "*.tar shard".into(),
            });
        };
        let root = root.to_path_buf();
        // Index files go beside the cached shards: the cache folder is writable by definition.
        let shards = TarShards::open_files(&root, shard_paths, None)?;
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
        for object in &self.objects {
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
