//! `stoker convert --out s3://`: a local folder of tar shards uploaded under an empty prefix,
//! then indexed. A marker object ([`UNFINISHED_UPLOAD`]) goes up first and is deleted last, so
//! a convert cut short (a failed PUT, a killed process) leaves a set that says so: readers
//! refuse it rather than read the shards that made it as the whole set, and a convert to the
//! same prefix replaces what the unfinished one wrote.

use std::path::{Path, PathBuf};

use object_store::ObjectMeta;
use tracing::warn;

use super::index_object::{IndexedShard, TAR_INDEX_OBJECT};
use super::remote::{
    folder_of, is_tar, listed_shards, put_index, remote_location, TarIndexWritten,
};
use super::scan::scan_archive;
use super::CLASSES_FILE;
use crate::error::{Error, Result, TarSetError};
use crate::storage::{ObjectCache, RemoteLocation, Store};

/// The object an upload writes beside its shards before any of them and deletes after their
/// index: a set beside it is incomplete.
pub const UNFINISHED_UPLOAD: &str = "stoker-convert-unfinished";

/// What the marker object holds, for whoever finds it in a bucket.
const MARKER_TEXT: &str = "A `stoker convert --out s3://` was writing this prefix and did not \
    finish: shards are missing. Stoker refuses to read the set; run the convert again with the \
    same --out to replace it.\n";

/// The parts a shard is uploaded in when it is larger (a multipart upload: each part its own
/// request, retried alone). S3 takes parts of 5 MiB and more, up to 10,000 of them.
const PART_BYTES: usize = 16 << 20;

/// What [`upload_tar_set`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TarSetUploaded {
    /// Objects written (shards, `classes.txt`), the index aside.
    pub objects: usize,
    /// Their bytes.
    pub bytes: u64,
    /// The index object written beside them.
    pub index: TarIndexWritten,
    /// Objects of an unfinished upload that were there and were replaced.
    pub replaced: usize,
}

/// The keys under `location` an upload there replaces: none for an empty prefix, the objects of
/// an unfinished upload (its marker beside shards, `classes.txt` and an index only). Any other
/// object, or a folder, refuses the prefix: shards written beside another set's would be read
/// with it as one set.
fn replaced_keys(
    cache: &ObjectCache,
    store: &Store,
    location: &RemoteLocation,
) -> Result<Vec<String>> {
    let (listing, folders) = cache.list_with_folders(store, location)?;
    let name = |object: &ObjectMeta| object.location.filename().unwrap_or_default().to_string();
    let unfinished = listing
        .iter()
        .any(|object| name(object) == UNFINISHED_UPLOAD);
    let uploaded = |object: &ObjectMeta| {
        let name = name(object);
        is_tar(&name)
            || [CLASSES_FILE, TAR_INDEX_OBJECT, UNFINISHED_UPLOAD].contains(&name.as_str())
    };
    if listing.is_empty() && folders.is_empty() {
        return Ok(Vec::new());
    }
    if unfinished && folders.is_empty() && listing.iter().all(uploaded) {
        return Ok(listing
            .iter()
            .map(|object| object.location.to_string())
            .collect());
    }
    let first = listing
        .first()
        .map(|object| location.uri_of(object.location.as_ref()))
        .or_else(|| folders.first().map(|folder| location.uri_of(folder)))
        .unwrap_or_default();
    Err(Error::InvalidUri {
        uri: location.uri(),
        reason: format!(
            "it already holds {} object(s) and {} folder(s), {first} the first: write the set \
             under an empty prefix (its shards would be read with the others there as one set)",
            listing.len(),
            folders.len(),
        ),
    })
}

/// Refuses a prefix `uri` (`s3://BUCKET/PREFIX`) that holds objects or folders, for a set about
/// to be written there (a prefix an unfinished upload left is taken: the upload replaces it).
pub fn check_empty_prefix(uri: &str, cache: &ObjectCache) -> Result<()> {
    let location = remote_location(uri)?;
    let store = cache.store(&location)?;
    replaced_keys(cache, &store, &location).map(drop)
}

/// Uploads the tar shards (and `classes.txt`) of the local folder `local` under `uri`
/// (`s3://BUCKET/PREFIX`), which must be empty or hold an unfinished upload
/// ([`check_empty_prefix`]), then their index object, built from the local copies (nothing is
/// read back but the listing, for the ETags the store gave them); the marker
/// [`UNFINISHED_UPLOAD`] stands beside them until the index is written. `stoker convert --out
/// s3://`.
pub fn upload_tar_set(local: &Path, uri: &str, cache: &ObjectCache) -> Result<TarSetUploaded> {
    let location = remote_location(uri)?;
    let store = cache.store(&location)?;
    let replaced = replaced_keys(cache, &store, &location)?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(local)
        .map_err(|source| Error::io(local, source))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            is_tar(&name) || name == CLASSES_FILE
        })
        .collect();
    files.sort();
    let folder = location.prefix.trim_end_matches('/').to_string();
    let key_of = |name: &str| {
        if folder.is_empty() {
            name.to_string()
        } else {
            format!("{folder}/{name}")
        }
    };
    let marker = key_of(UNFINISHED_UPLOAD);
    cache.put(&store, &location, &marker, MARKER_TEXT.as_bytes().to_vec())?;
    if !replaced.is_empty() {
        warn!(
            uri = %location.uri(),
            objects = replaced.len(),
            "replacing the objects of an upload that did not finish"
        );
    }
    for key in replaced.iter().filter(|key| **key != marker) {
        cache.delete(&store, &location, key)?;
    }
    let mut bytes = 0u64;
    for file in &files {
        bytes += std::fs::metadata(file)
            .map_err(|source| Error::io(file, source))?
            .len();
        let name = file.file_name().unwrap_or_default().to_string_lossy();
        cache.put_file(&store, &location, &key_of(&name), file, PART_BYTES)?;
    }
    let listing = cache.list(&store, &location)?;
    let shards = listed_shards(&listing, &location)?;
    let indexed = shards
        .iter()
        .map(|object| {
            let name = object.location.filename().unwrap_or_default().to_string();
            let path = local.join(&name);
            let file = std::fs::File::open(&path).map_err(|source| Error::io(&path, source))?;
            Ok(IndexedShard {
                index: scan_archive(&path, &file, object.size)?,
                name,
                size: object.size,
                e_tag: object.e_tag.clone(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let index = put_index(cache, &store, &location, &shards, &indexed, 0)?;
    cache.delete(&store, &location, &marker)?;
    Ok(TarSetUploaded {
        objects: files.len(),
        bytes,
        index,
        replaced: replaced.len(),
    })
}

/// Refuses tar `shards` whose folder holds an unfinished upload's marker (in `listing`, what was
/// listed to find them).
pub(super) fn refuse_unfinished(
    location: &RemoteLocation,
    shards: &[ObjectMeta],
    listing: &[ObjectMeta],
) -> Result<()> {
    let marker = listing.iter().find(|object| {
        object.location.filename() == Some(UNFINISHED_UPLOAD)
            && shards.iter().any(|shard| {
                folder_of(shard.location.as_ref()) == folder_of(object.location.as_ref())
            })
    });
    match marker {
        Some(marker) => Err(Error::TarSet(TarSetError::UnfinishedUpload {
            marker: location.uri_of(marker.location.as_ref()),
        })),
        None => Ok(()),
    }
}
