//! What an `s3://` prefix holds: the one format of its data objects, so a prefix of Parquet
//! files reads as a local folder of them does, and the objects of one split when their names
//! give it as a local file's do (the hub's `{split}-NNNNN-of-NNNNN.*`, or a split's keyword as a
//! word of the name: `train.parquet`); and the objects that `s3://` patterns and lists name.
//!
//! A pattern is matched against keys the way a local one is against paths (`*` and `?` stay in
//! one folder, `**` crosses folders), over a listing of the keys that start with the part of
//! the pattern before its first wildcard only (S3's `prefix`, any string): those of that one
//! folder when the wildcards are all in the last part of the key, every key under it otherwise.
//! Names a brace group expands to are found in their folder's listing, one listing per folder,
//! not one request per name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::ObjectMeta;

use super::splits::{check_shard_set, split_of_file_name, split_of_shard_name, UNNAMED};
use super::{
    braces, glob, is_pattern, kind_of, kind_of_files, pick_split, FileKind, HF_DICT_FILE,
    HF_INFO_FILE, HF_STATE_FILE,
};
use crate::error::{Error, Result};
use crate::storage::{s3_location, ObjectCache, RemoteLocation, RemoteObject, Store};
use crate::{MDS_INDEX_FILE, TAR_INDEX_OBJECT};

/// What the formats find directly under an `s3://` prefix ([`remote_layout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteLayout {
    /// Data objects of one kind: tar shards, Parquet, JSONL or token files.
    Files(FileKind),
    /// A Hugging Face `save_to_disk` folder (`state.json` and `dataset_info.json`), or a
    /// `DatasetDict`'s (`dataset_dict.json`).
    HfDataset,
    /// Mosaic Streaming's MDS shards: `index.json` beside `shard.NNNNN.mds` objects (or
    /// compressed ones).
    Mds,
    /// Folders and no data object: an image folder (its class folders, or its split folders).
    Folders,
    /// None of these (a tar set's index object alone, or nothing).
    Nothing,
}

/// What lies directly under `uri` (a prefix, or the one object it names), from one listing:
/// data objects of several kinds are refused by name.
pub fn remote_layout(uri: &str, cache: &Arc<ObjectCache>) -> Result<RemoteLayout> {
    let location = s3_location(uri, "objects in a store are named by s3://BUCKET/PREFIX")?;
    let store = cache.store(&location)?;
    let (objects, folders) = cache.list_with_folders(&store, &location)?;
    if lists_hf_dataset(&objects) {
        return Ok(RemoteLayout::HfDataset);
    }
    if lists_mds(&objects) {
        return Ok(RemoteLayout::Mds);
    }
    // The tar set's own index object (`stoker index`) is no data file of its own.
    let data: Vec<PathBuf> = objects
        .iter()
        .filter(|object| {
            let name = object.location.filename().unwrap_or_default();
            name != TAR_INDEX_OBJECT && kind_of(Path::new(name)).is_some()
        })
        .map(|object| PathBuf::from(location.uri_of(object.location.as_ref())))
        .collect();
    if !data.is_empty() {
        return kind_of_files(uri, &data).map(RemoteLayout::Files);
    }
    Ok(if folders.is_empty() {
        RemoteLayout::Nothing
    } else {
        RemoteLayout::Folders
    })
}

/// Whether the listing of a prefix (the objects directly under it) is a `save_to_disk`
/// folder's or a `DatasetDict`'s.
fn lists_hf_dataset(listing: &[ObjectMeta]) -> bool {
    let has = |name: &str| {
        listing
            .iter()
            .any(|object| object.location.filename() == Some(name))
    };
    (has(HF_STATE_FILE) && has(HF_INFO_FILE)) || has(HF_DICT_FILE)
}

/// Whether the listing of a prefix holds an MDS `index.json` and a shard (`shard.*.mds`, or
/// compressed: `shard.*.mds.zstd`).
fn lists_mds(listing: &[ObjectMeta]) -> bool {
    let names = || {
        listing
            .iter()
            .filter_map(|object| object.location.filename())
    };
    names().any(|name| name == MDS_INDEX_FILE)
        && names().any(|name| name.starts_with("shard.") && name.contains(".mds"))
}

/// The one kind of data object directly under `uri` (a prefix, or the one object it names);
/// `None` when it holds none. Objects of several kinds are refused by name.
pub fn remote_kind(uri: &str, cache: &Arc<ObjectCache>) -> Result<Option<FileKind>> {
    Ok(match remote_layout(uri, cache)? {
        RemoteLayout::Files(kind) => Some(kind),
        _ => None,
    })
}

/// The prefix to read of an `s3://` prefix laid out by split folders, as a local folder is
/// (`splits.rs`): `None` (read `uri` itself, the split, if any, taken from its objects' names)
/// when data objects lie directly under it, or it has no folder of data objects, nor a `data/`
/// holding either. Otherwise, looked for under `uri` and then under its `data/`: the folder of
/// the split asked for among its folders holding data objects (any name: `train/`, `test/`), the
/// only one when there is one, or `data/` itself when data objects lie there; several without
/// a split asked for are [`Error::SplitNeeded`], naming them. One listing per folder looked in,
/// up to the first that holds images (an image folder's classes: not split folders).
/// With the prefix, whether it is the split's own (else the split, if any, is still to be taken
/// from the names of the objects under it).
pub fn remote_split_prefix(
    uri: &str,
    split: Option<&str>,
    cache: &Arc<ObjectCache>,
) -> Result<Option<(String, bool)>> {
    let location = s3_location(uri, "objects in a store are named by s3://BUCKET/PREFIX")?;
    // Data objects, and an MDS dataset's index (its shards are no kind of their own).
    let is_data = |object: &ObjectMeta| {
        let name = object.location.filename();
        name == Some(MDS_INDEX_FILE)
            || (name != Some(TAR_INDEX_OBJECT)
                && kind_of(Path::new(object.location.as_ref())).is_some())
    };
    let lister = cache.lister(&location.bucket)?;
    // Whether a folder holds data objects; `None` when it holds images (a class folder of an
    // image folder: its siblings are classes too, not splits, and are not listed one by one).
    let holds_data = |key_prefix: &str| -> Result<Option<bool>> {
        let (objects, _) = cache.list_key_prefix(&lister, key_prefix, false)?;
        if objects.iter().any(is_data) {
            return Ok(Some(true));
        }
        let is_image = |object: &ObjectMeta| {
            let name = object.location.filename().unwrap_or_default();
            crate::image_format::has_image_extension(name.as_bytes())
        };
        Ok((!objects.iter().any(is_image)).then_some(false))
    };
    let base = location.key_of("");
    for level in [base.clone(), format!("{base}data/")] {
        let (objects, folders) = cache.list_key_prefix(&lister, &level, false)?;
        if objects.iter().any(is_data) {
            // The split, if any, comes from the objects' names.
            return Ok(
                (level != base).then(|| (location.uri_of(level.trim_end_matches('/')), false))
            );
        }
        let mut splits: BTreeMap<String, String> = BTreeMap::new();
        for folder in folders {
            let name = folder
                .trim_end_matches('/')
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_string();
            if level == base && name == "data" {
                continue;
            }
            match holds_data(&folder)? {
                Some(true) => {
                    splits.insert(name, folder);
                }
                Some(false) => {}
                None => return Ok(None),
            }
        }
        if splits.is_empty() {
            continue;
        }
        let found: Vec<String> = splits.keys().cloned().collect();
        let chosen = match split {
            Some(split) => splits.get(split).ok_or_else(|| Error::NoSuchSplit {
                source_name: uri.to_string(),
                split: split.to_string(),
                found: found.clone(),
            })?,
            None if splits.len() == 1 => &splits[&found[0]],
            None => {
                return Err(Error::SplitNeeded {
                    source_name: uri.to_string(),
                    found,
                })
            }
        };
        return Ok(Some((location.uri_of(chosen.trim_end_matches('/')), true)));
    }
    Ok(None)
}

/// The objects of `objects` (listed under `uri`) of the split asked for: all when their names
/// give one split or none and none is asked for; [`Error::SplitNeeded`] when they give several
/// and none is asked for; [`Error::NoSuchSplit`] when the one asked for is not among them.
pub(crate) fn objects_of_split(
    uri: &str,
    objects: Vec<RemoteObject>,
    split: Option<&str>,
) -> Result<Vec<RemoteObject>> {
    of_split(uri, objects, |object| object.uri(), split)
}

/// [`objects_of_split`] of objects as listed.
pub(crate) fn listed_of_split(
    uri: &str,
    objects: Vec<ObjectMeta>,
    split: Option<&str>,
) -> Result<Vec<ObjectMeta>> {
    of_split(uri, objects, |object| object.location.to_string(), split)
}

/// The items of `items` whose names (`name_of`) are of the split asked for, by the rules of
/// [`objects_of_split`].
fn of_split<T>(
    uri: &str,
    items: Vec<T>,
    name_of: impl Fn(&T) -> String,
    split: Option<&str>,
) -> Result<Vec<T>> {
    let split_of = |item: &T| {
        let name = name_of(item);
        let file = name.rsplit('/').next().unwrap_or(&name).to_string();
        split_of_file_name(&file).unwrap_or_else(|| UNNAMED.to_string())
    };
    let mut found: Vec<String> = items.iter().map(split_of).collect();
    found.sort();
    found.dedup();
    let named: Vec<String> = found.iter().filter(|s| *s != UNNAMED).cloned().collect();
    // A split's hub shards read from a prefix are one whole set, as in a local folder; a URI
    // that names one shard reads that one.
    let names_a_shard = split_of_shard_name(uri.rsplit('/').next().unwrap_or(uri)).is_some();
    let whole_set = |kept: &[T], split: &str| {
        if names_a_shard {
            return Ok(());
        }
        let paths: Vec<std::path::PathBuf> = kept.iter().map(|item| name_of(item).into()).collect();
        check_shard_set(uri, split, &paths)
    };
    match split {
        None if named.is_empty() || found.len() == 1 => {
            whole_set(&items, found.first().map_or(UNNAMED, String::as_str))?;
            Ok(items)
        }
        None => Err(Error::SplitNeeded {
            source_name: uri.to_string(),
            found,
        }),
        Some(split) => {
            let kept: Vec<T> = items
                .into_iter()
                .filter(|item| split_of(item) == split)
                .collect();
            if kept.is_empty() {
                return Err(Error::NoSuchSplit {
                    source_name: uri.to_string(),
                    split: split.to_string(),
                    found: named,
                });
            }
            whole_set(&kept, split)?;
            Ok(kept)
        }
    }
}

/// The objects of one bucket that `s3://` patterns or a list of names select: sorted by key,
/// each once, of one kind of data file and of one split.
pub struct RemoteFiles {
    /// The source as written (names joined by `,`), for messages.
    pub name: String,
    /// The kind of data file they are.
    pub kind: FileKind,
    /// The bucket, with the first name's folder before its wildcards (the set's root in
    /// messages).
    pub(crate) location: RemoteLocation,
    pub(crate) store: Arc<Store>,
    /// The objects selected.
    pub(crate) objects: Vec<ObjectMeta>,
    /// Every object listed to find them (the tar index objects and `classes.txt` beside them).
    pub(crate) listing: Vec<ObjectMeta>,
}

impl RemoteFiles {
    /// The `s3://` URIs of the objects selected, in their order.
    pub fn uris(&self) -> Vec<String> {
        self.objects
            .iter()
            .map(|object| self.location.uri_of(object.location.as_ref()))
            .collect()
    }

    /// The objects selected, as read through `cache`.
    pub(crate) fn remote_objects(&self, cache: &Arc<ObjectCache>) -> Vec<RemoteObject> {
        self.objects
            .iter()
            .map(|object| {
                RemoteObject::new(
                    Arc::clone(cache),
                    Arc::clone(&self.store),
                    &self.location,
                    object.clone(),
                )
            })
            .collect()
    }
}

/// One key a name asks for, as its braces expand: a glob over keys, or one key.
struct Wanted {
    /// The name as written (before brace expansion), for messages.
    written: String,
    /// The key, or the key pattern.
    key: String,
    is_glob: bool,
}

impl Wanted {
    /// The key prefix listed to find it, and whether every key under it is listed (not only
    /// those of its folder): a name's folder; a glob's text before its first wildcard.
    fn listing(&self) -> (String, bool) {
        if !self.is_glob {
            let folder = self.key.rsplit_once('/').map_or("", |(folder, _)| folder);
            return (
                format!("{folder}/").trim_start_matches('/').to_string(),
                false,
            );
        }
        let first = self
            .key
            .find(['*', '?', '[', '\\'])
            .unwrap_or(self.key.len());
        let deep = self.key[first..].contains('/') || self.key.contains("**");
        (self.key[..first].to_string(), deep)
    }
}

/// The folder of a key prefix, as a location's prefix (no trailing `/`).
fn folder_of_prefix(key_prefix: &str) -> String {
    key_prefix
        .rsplit_once('/')
        .map_or("", |(folder, _)| folder)
        .to_string()
}

/// Resolves `s3://` names (patterns, brace groups, or a list of several, all of one bucket)
/// and the split asked for (`None`: none named) to the objects they select, as
/// [`super::resolve_local`] resolves local ones: a glob that matches nothing names the pattern
/// and the folder listed; a named object that is missing names it; objects of two formats or of
/// several splits (none asked for) are refused by name.
pub fn resolve_remote(
    names: &[&str],
    split: Option<&str>,
    cache: &Arc<ObjectCache>,
) -> Result<RemoteFiles> {
    let split = split.map(str::trim).filter(|split| !split.is_empty());
    let name = names.join(",");
    let mut bucket: Option<String> = None;
    let mut wanted = Vec::new();
    for &written in names {
        let location = s3_location(written, "a list of s3:// names holds s3:// URIs only")?;
        if is_pattern(&location.bucket) {
            return Err(Error::BadSourcePattern {
                pattern: written.to_string(),
                problem: "a bucket's name cannot be a pattern".into(),
            });
        }
        match &bucket {
            Some(first) if *first != location.bucket => {
                return Err(Error::InvalidArgument(format!(
                    "{name} names objects of the buckets {first} and {}: one source reads one \
                     bucket (mix sources of several with stoker.mix)",
                    location.bucket
                )))
            }
            Some(_) => {}
            None => bucket = Some(location.bucket.clone()),
        }
        let keys = if braces::has_braces(&location.prefix) {
            braces::expand(&location.prefix).map_err(|error| match error {
                Error::BadSourcePattern { problem, .. } => Error::BadSourcePattern {
                    pattern: written.to_string(),
                    problem,
                },
                other => other,
            })?
        } else {
            vec![location.prefix.clone()]
        };
        for key in keys {
            wanted.push(Wanted {
                written: written.to_string(),
                is_glob: glob::has_glob(&key),
                key,
            });
        }
    }
    let bucket = bucket.ok_or_else(|| Error::InvalidArgument("a source names no file".into()))?;
    let root = RemoteLocation {
        bucket: bucket.clone(),
        prefix: wanted
            .first()
            .map(|w| folder_of_prefix(&w.listing().0))
            .unwrap_or_default(),
    };
    let store = cache.store(&root)?;
    let lister = cache.lister(&bucket)?;
    // One listing per key prefix (and depth), whatever the number of names found in it.
    let mut listings: BTreeMap<(String, bool), Vec<ObjectMeta>> = BTreeMap::new();
    // The objects selected, by URI: a string, so they sort by its bytes as local paths do (a
    // path sorts by components: `a/0.tar` before `a-1.tar`).
    let mut selected: BTreeMap<String, ObjectMeta> = BTreeMap::new();
    for each in &wanted {
        let (folder, deep) = each.listing();
        let listed = match listings.entry((folder.clone(), deep)) {
            std::collections::btree_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::btree_map::Entry::Vacant(entry) => {
                entry.insert(cache.list_key_prefix(&lister, &folder, deep)?.0)
            }
        };
        if each.is_glob {
            let matcher = glob::compile(&each.key)?;
            let mut matched = false;
            for object in listed {
                let key = object.location.as_ref();
                let is_index = object.location.filename() == Some(TAR_INDEX_OBJECT);
                if !is_index && matcher.is_match(key) {
                    matched = true;
                    selected.insert(root.uri_of(key), object.clone());
                }
            }
            if !matched {
                return Err(Error::NoMatch {
                    pattern: root.uri_of(&each.key),
                    folder: PathBuf::from(root.uri_of(&folder_of_prefix(&folder))),
                });
            }
        } else {
            match listed
                .iter()
                .find(|object| object.location.as_ref() == each.key)
            {
                Some(object) => {
                    selected.insert(root.uri_of(&each.key), object.clone());
                }
                None => {
                    return Err(Error::ListedFileMissing {
                        path: PathBuf::from(root.uri_of(&each.key)),
                        pattern: each.written.clone(),
                    })
                }
            }
        }
    }
    // One bucket: URIs sort by their keys' bytes, as local paths do, the same on every machine.
    let uris: Vec<PathBuf> = selected.keys().map(PathBuf::from).collect();
    let kind = kind_of_files(&name, &uris)?;
    let objects: Vec<ObjectMeta> = pick_split(&name, uris, split)?
        .iter()
        .filter_map(|uri| selected.remove(uri.to_str()?))
        .collect();
    let listing = listings.into_values().flatten().collect();
    Ok(RemoteFiles {
        name,
        kind,
        location: root,
        store,
        objects,
        listing,
    })
}
