//! JSONL objects in an object store: the objects under an `s3://` prefix (or those that `s3://`
//! patterns or a list name) are fetched whole into the cache tier, compressed ones decompressed
//! there, and read as local files are. Indexing needs every byte of a file anyway (its line
//! starts), so no range reads. The copies are fetched a batch at a time and let go of once
//! indexed (a lock descriptor each: a set of more files than the descriptor limit could not
//! open): one evicted by a cap is fetched (and decompressed) again when next read, the version
//! listed at open; an object rewritten since stops the job, naming it. Errors name the
//! objects' `s3://` URIs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::ObjectMeta;

use super::compressed::{is_jsonl_file_name, Compression};
use super::{JsonlDocuments, JsonlFile};
use crate::error::{Error, Result};
use crate::naming::{listed_of_split, RemoteFiles};
use crate::storage::{s3_location, DerivedSource, ObjectCache, Remake, RemoteLocation, Store};

impl JsonlDocuments {
    /// Opens the JSONL objects (`.jsonl`, `.jsonl.gz`, `.jsonl.zst`) directly under `uri`
    /// (`s3://BUCKET/PREFIX`, or the one object it names), in key order, through `cache`; only
    /// those of `split` when their names are the hub's `{split}-NNNNN-of-NNNNN.jsonl` (several
    /// splits with none asked for are refused, naming them). The fields are those of
    /// [`JsonlDocuments::open`].
    pub fn open_remote(
        uri: &str,
        cache: Arc<ObjectCache>,
        text_field: &str,
        label_field: &str,
        split: Option<&str>,
    ) -> Result<JsonlDocuments> {
        let location = s3_location(uri, "JSONL objects are named by s3://BUCKET/PREFIX")?;
        let store = cache.store(&location)?;
        let listed: Vec<ObjectMeta> = cache
            .list(&store, &location)?
            .into_iter()
            .filter(|object| {
                is_jsonl_file_name(Path::new(object.location.filename().unwrap_or_default()))
            })
            .collect();
        if listed.is_empty() {
            return Err(Error::NoRemoteObjects {
                uri: location.uri(),
                what: "*.jsonl object".into(),
            });
        }
        let listed = listed_of_split(uri, listed, split)?;
        let files = fetch_files(&cache, &store, &location, &listed)?;
        Self::assemble(Path::new(uri), files, text_field, label_field)
    }

    /// Opens the JSONL objects that `s3://` patterns or a list named
    /// ([`crate::resolve_remote`]), in their order, as [`JsonlDocuments::open_remote`] opens a
    /// prefix's.
    pub fn open_remote_files(
        files: RemoteFiles,
        cache: Arc<ObjectCache>,
        text_field: &str,
        label_field: &str,
    ) -> Result<JsonlDocuments> {
        if files.kind != crate::FileKind::Jsonl {
            return Err(Error::InvalidArgument(format!(
                "{} names {} objects, not JSONL files",
                files.name,
                files.kind.name()
            )));
        }
        let indexed = fetch_files(&cache, &files.store, &files.location, &files.objects)?;
        Self::assemble(Path::new(&files.name), indexed, text_field, label_field)
    }
}

/// Fetches `objects` whole into the cache, a batch at a time, decompresses the compressed ones
/// there, and indexes each, named by its URI; each copy is let go of once indexed (fetched, or
/// decompressed, again if evicted).
fn fetch_files(
    cache: &Arc<ObjectCache>,
    store: &Arc<Store>,
    location: &RemoteLocation,
    objects: &[ObjectMeta],
) -> Result<Vec<JsonlFile>> {
    cache.check_fits_whole(&location.uri(), "JSONL files", objects)?;
    cache.fetch_listed_in_batches(store, location, objects, |batch| {
        let mut files = Vec::with_capacity(batch.len());
        for (remote, copy) in batch {
            let uri = PathBuf::from(remote.uri());
            let remake = match Compression::of(&uri) {
                None => Remake::Fetched(remote),
                Some(compression) => {
                    let source = DerivedSource::of_object(remote, "decompressed")?;
                    compression.remake(source, &uri)
                }
            };
            // A compressed file's copy goes once the decompressed one is made.
            let copy = remake.copy_from(copy)?;
            files.push(JsonlFile::open(uri, Some(copy), Some(remake))?);
        }
        Ok(files)
    })
}
