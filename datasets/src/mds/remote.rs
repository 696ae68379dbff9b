//! An MDS dataset under an `s3://` prefix, read through the cache tier: `index.json` and every
//! shard it names are fetched whole at open (as Streaming itself downloads its shards), a batch
//! at a time; compressed shards are decompressed there once. Each sample is then read from the
//! shard's local copy, as a local folder's are. `index.json` is held in the cache while the
//! dataset is open; the shards' copies are not (a lock descriptor each: a set of more shards
//! than the descriptor limit could not open), so one evicted by a cap is fetched (and
//! decompressed) again when next read, the version listed at open: an object rewritten since
//! stops the job, naming it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use object_store::ObjectMeta;

use super::shard::{decompressed, Shard, ShardEntry, ShardFile};
use super::{mds_error, parse_index, MdsDataset, MdsOptions, MDS_INDEX_FILE};
use crate::error::{Error, Result};
use crate::storage::{s3_location, DerivedSource, ObjectCache, Remake};

impl MdsDataset {
    /// Opens the MDS dataset under `uri` (`s3://BUCKET/PREFIX`, the prefix `index.json` lies
    /// directly under) with the columns `options` names, read through `cache`. The shards are
    /// fetched at open and must fit the cache's cap together: a set larger is refused, naming
    /// both sizes; a shard evicted later (by another reader's cap) is fetched again when read.
    /// Errors name the objects' `s3://` URIs.
    pub fn open_remote(
        uri: &str,
        cache: Arc<ObjectCache>,
        options: &MdsOptions,
    ) -> Result<MdsDataset> {
        let started = Instant::now();
        let location = s3_location(uri, "MDS shards in a store are named by s3://BUCKET/PREFIX")?;
        let store = cache.store(&location)?;
        let mut listing = cache.list(&store, &location)?;
        let root = PathBuf::from(location.uri());
        let index_name = root.join(MDS_INDEX_FILE);
        let base = location.key_of("");
        let index_meta = listing
            .iter()
            .find(|object| {
                object.location.as_ref().strip_prefix(base.as_str()) == Some(MDS_INDEX_FILE)
            })
            .ok_or_else(|| Error::NoRemoteObjects {
                uri: location.uri(),
                what: format!("MDS {MDS_INDEX_FILE}"),
            })?;
        let index_object = cache
            .fetch_listed(&store, &location, std::slice::from_ref(index_meta))?
            .pop()
            .ok_or_else(|| mds_error(&index_name, "was listed but not fetched"))?;
        let text =
            std::fs::read(index_object.path()).map_err(|error| Error::io(&index_name, error))?;
        let (entries, columns) = parse_index(&text, &index_name)?;
        let entries: Vec<ShardEntry<'_>> = entries
            .iter()
            .map(|entry| ShardEntry::of(entry, &index_name))
            .collect::<Result<_>>()?;
        // Shards in folders below the prefix (`0/shard.00000.mds`, as Streaming's
        // `merge_index` names them): one more listing per folder.
        let folders: std::collections::BTreeSet<&str> = entries
            .iter()
            .flat_map(|entry| [entry.raw, entry.zip])
            .flatten()
            .filter_map(|name| name.rsplit_once('/').map(|(folder, _)| folder))
            .collect();
        if !folders.is_empty() {
            let lister = cache.lister(&location.bucket)?;
            for folder in folders {
                let (objects, _) =
                    cache.list_key_prefix(&lister, &format!("{base}{folder}/"), false)?;
                listing.extend(objects);
            }
        }
        // One lookup per shard: a set of terabytes has tens of thousands of them. By the path
        // below the prefix, as the index names them.
        let by_name: HashMap<&str, &ObjectMeta> = listing
            .iter()
            .filter_map(|object| {
                Some((
                    object.location.as_ref().strip_prefix(base.as_str())?,
                    object,
                ))
            })
            .collect();
        let find = |name: &str| by_name.get(name).copied();

        // Each shard's object: its raw file when listed, else its compressed one.
        let mut objects: Vec<ObjectMeta> = Vec::with_capacity(entries.len());
        let mut compressed = Vec::with_capacity(entries.len());
        for entry in &entries {
            let raw = entry.raw.and_then(find).map(|object| (object, false));
            let Some((object, zipped)) =
                raw.or_else(|| entry.zip.and_then(find).map(|object| (object, true)))
            else {
                let name = entry.raw.or(entry.zip).unwrap_or_default();
                return Err(Error::io(
                    root.join(name),
                    std::io::ErrorKind::NotFound.into(),
                ));
            };
            objects.push(object.clone());
            compressed.push(zipped);
        }
        let bytes: u64 = objects.iter().map(|object| object.size).sum();
        let cap = cache.options().max_bytes;
        if bytes > cap {
            return Err(mds_error(
                &root,
                format!(
                    "its shards are {bytes} bytes, over the cache tier's cap of {cap} bytes \
                     (STOKER_CACHE_MAX_BYTES); they are fetched into the cache as the set opens \
                     and read from there"
                ),
            ));
        }
        // A batch at a time, each shard's copy let go of once its header is read: it is
        // fetched (and decompressed) again if evicted.
        let mut entries = entries.iter().zip(compressed);
        let shards = cache.fetch_listed_in_batches(&store, &location, &objects, |batch| {
            let mut shards = Vec::with_capacity(batch.len());
            for (remote, copy) in batch {
                let Some((entry, zipped)) = entries.next() else {
                    break;
                };
                let path = PathBuf::from(remote.uri());
                let remake = if zipped {
                    let source = DerivedSource::of_object(remote, "decompressed")?;
                    decompressed(source, &entry.compression, &path)
                } else {
                    Remake::Fetched(remote)
                };
                // A compressed shard's copy goes once the decompressed one is made.
                let copy = remake.copy_from(copy)?;
                let file = ShardFile {
                    read_from: copy.path().to_path_buf(),
                    path,
                    copy: Some(copy),
                    remake: Some(remake),
                };
                shards.push(Shard::open(file, entry.samples)?);
            }
            Ok(shards)
        })?;
        MdsDataset::assemble(
            root,
            (index_object.path().to_path_buf(), Some(index_object)),
            columns,
            shards,
            options,
            started,
        )
    }
}
