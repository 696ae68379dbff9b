//! An image folder under an `s3://` prefix (`PREFIX/<class>/**/<image>`), indexed from one
//! listing of every key under the prefix in the order torchvision would give a local copy of
//! it, and read one object per sample through the cache tier, read ahead when told.
//!
//! The keys stand for the paths of a local copy: the classes are the first folders under the
//! prefix (sorted), each class's folders are ordered by their paths and the files of a folder by
//! name, and a file is an image by its extension (the same rule as a local folder's). Keys
//! directly under the prefix belong to no class and are left out, as torchvision leaves out
//! files beside the class folders. A folder marker (a key ending in `/`, as consoles make) is a
//! folder: a class folder holding no image is refused, as locally. The client lists a marker
//! without its `/`, so an empty object with no extension directly under the prefix is taken for
//! a class folder's marker (a class folder of that name then holds no image unless others name
//! it), but for names starting with `_` or `.` (Spark's `_SUCCESS`); a marker of a class name
//! holding a dot is still left out. Keys are UTF-8, so ordering their bytes is Python's order.
//!
//! Per sample the index keeps what a read needs to ask for the version listed: the file name
//! (in the same packed buffer as a local folder's), its size, its ETag and last-modified time.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use object_store::ObjectMeta;

use super::listing::{FolderListing, LeftOut};
use super::ImageFolder;
use crate::error::{Error, Result};
use crate::image_format::{has_image_extension, is_left_out_image};
use crate::split_names::is_split_folder_name;
use crate::storage::{s3_location, Hint, ObjectCache, Prefetcher, RemoteLocation, Store};

/// What reads a remote image folder's samples: the cache, the store, the listing's facts.
pub(crate) struct RemoteImages {
    pub(super) cache: Arc<ObjectCache>,
    store: Arc<Store>,
    location: RemoteLocation,
    /// Per sample, in sample order: the object's size and last-modified time.
    facts: Vec<(u64, DateTime<Utc>)>,
    /// The samples' ETags packed (`""` where the store gave none), with their end offsets.
    e_tags: String,
    e_tag_ends: Vec<u64>,
    read_ahead: Option<Prefetcher>,
}

/// One image object under a class, as listed.
struct Listed {
    name: String,
    size: u64,
    modified: DateTime<Utc>,
    e_tag: Option<String>,
}

impl ImageFolder {
    /// Indexes the image folder under `uri` (`s3://BUCKET/PREFIX`) from one listing of every
    /// key under it, in the order a local copy would have (see the module doc); samples are
    /// read through `cache`, each a GET of its object (read ahead when
    /// [`prefetch`](crate::SampleSource::prefetch) is told).
    ///
    /// A prefix laid out by split (its folders all named like splits, `train/`, `val/`, one
    /// of them holding class folders) reads the folder of `split`; several without `split`
    /// are [`Error::SplitNeeded`], naming them, as for a local folder.
    ///
    /// Fails as [`ImageFolder::open`] does: no class folder under the prefix, or a class folder
    /// holding no image.
    pub fn open_remote(
        uri: &str,
        cache: Arc<ObjectCache>,
        split: Option<&str>,
    ) -> Result<ImageFolder> {
        let started = std::time::Instant::now();
        let mut location = s3_location(
            uri,
            "an image folder in an object store is named by s3://BUCKET/PREFIX",
        )?;
        let mut base = location.key_of("");
        let lister = cache.lister(&location.bucket)?;
        let (objects, _) = cache.list_key_prefix(&lister, &base, true)?;
        if let Some(chosen) = split_folder(uri, &base, &objects, split)? {
            location.prefix = location.key_of(&chosen);
            base = location.key_of("");
        }
        // Class -> folder (relative to the prefix, class first) -> images.
        let mut classes: BTreeMap<String, BTreeMap<String, Vec<Listed>>> = BTreeMap::new();
        let mut left_out = LeftOut::default();
        for object in objects {
            let key = object.location.as_ref();
            let Some(relative) = key.strip_prefix(&base) else {
                continue;
            };
            let Some((class, _)) = relative.split_once('/') else {
                // Beside the class folders; but a class folder's marker (`bird/`) arrives so too,
                // without its `/`: an empty object whose name has no extension stands for one
                // (not one named as a job's flag is, `_SUCCESS`, or a hidden one).
                let flag = relative.starts_with('_') || relative.starts_with('.');
                if object.size == 0 && !relative.is_empty() && !relative.contains('.') && !flag {
                    classes.entry(relative.to_string()).or_default();
                }
                continue;
            };
            let folders = classes.entry(class.to_string()).or_default();
            let Some((folder, name)) = relative.rsplit_once('/') else {
                continue;
            };
            if is_left_out_image(name.as_bytes()) {
                left_out.add(relative.as_bytes().to_vec());
            }
            if name.is_empty() || !has_image_extension(name.as_bytes()) {
                continue; // a folder marker, or not an image
            }
            folders.entry(folder.to_string()).or_default().push(Listed {
                name: name.to_string(),
                size: object.size,
                modified: object.last_modified,
                e_tag: object.e_tag,
            });
        }
        let root = PathBuf::from(location.uri());
        if classes.is_empty() {
            return Err(Error::NoClasses(root));
        }
        if u32::try_from(classes.len()).is_err() {
            return Err(Error::TooLarge(root));
        }
        let empty: Vec<String> = classes
            .iter()
            .filter(|(_, folders)| folders.is_empty())
            .map(|(class, _)| class.clone())
            .collect();
        if empty.len() == classes.len() {
            return Err(Error::EmptyDataset(root));
        }
        if !empty.is_empty() {
            return Err(Error::EmptyClasses {
                root,
                classes: empty,
            });
        }

        let mut remote = RemoteImages {
            store: cache.store(&location)?,
            cache,
            location,
            facts: Vec::new(),
            e_tags: String::new(),
            e_tag_ends: Vec::new(),
            read_ahead: None,
        };
        let mut folder = ImageFolder {
            root,
            class_names: classes.keys().cloned().collect(),
            folders: Vec::new(),
            names: Vec::new(),
            name_ends: Vec::new(),
            remote: None,
            left_out: None,
        };
        for (label, folders) in (0u32..).zip(classes.into_values()) {
            for (relative, mut images) in folders {
                images.sort_by(|left, right| left.name.cmp(&right.name));
                let mut listing = FolderListing {
                    relative: relative.into_bytes(),
                    names: Vec::new(),
                    name_ends: Vec::with_capacity(images.len()),
                };
                for image in images {
                    listing.names.extend_from_slice(image.name.as_bytes());
                    listing.name_ends.push(listing.names.len());
                    remote.facts.push((image.size, image.modified));
                    remote.e_tags.push_str(image.e_tag.as_deref().unwrap_or(""));
                    remote.e_tag_ends.push(remote.e_tags.len() as u64);
                }
                folder.append(label, listing);
            }
        }
        remote.read_ahead = Prefetcher::start(
            Arc::clone(&remote.cache),
            Arc::clone(&remote.store),
            remote.location.clone(),
        )
        .map_err(|error| tracing::warn!(%error, "cannot start the read-ahead thread"))
        .ok();
        folder.remote = Some(remote);
        folder.report_left_out(left_out);
        folder.names.shrink_to_fit();
        folder.name_ends.shrink_to_fit();
        tracing::info!(
            root = %folder.root.display(),
            classes = folder.class_names.len(),
            samples = folder.name_ends.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "indexed image folder in an object store"
        );
        Ok(folder)
    }

    /// The object of sample `index` as listed, when the folder is remote.
    fn listed(&self, index: u64) -> Option<(&RemoteImages, ObjectMeta)> {
        let remote = self.remote.as_ref()?;
        let (folder, name) = self.locate(index)?;
        let position = usize::try_from(index).ok()?;
        let (size, modified) = *remote.facts.get(position)?;
        let e_tag_end = usize::try_from(*remote.e_tag_ends.get(position)?).ok()?;
        let e_tag_start = match position {
            0 => 0,
            _ => usize::try_from(remote.e_tag_ends[position - 1]).ok()?,
        };
        let e_tag = remote.e_tags.get(e_tag_start..e_tag_end)?;
        let relative = std::str::from_utf8(&folder.relative).ok()?;
        let name = std::str::from_utf8(name).ok()?;
        let key = remote.location.key_of(&format!("{relative}/{name}"));
        let meta = ObjectMeta {
            location: object_store::path::Path::parse(key).ok()?,
            last_modified: modified,
            size,
            e_tag: (!e_tag.is_empty()).then(|| e_tag.to_string()),
            version: None,
        };
        Some((remote, meta))
    }

    /// Reads sample `index` of a remote folder through the cache.
    pub(super) fn read_remote(&self, index: u64) -> Result<Vec<u8>> {
        let (remote, object) = self.listed(index).ok_or(Error::IndexOutOfRange {
            index,
            len: self.name_ends.len() as u64,
        })?;
        if object.size == 0 {
            return Ok(Vec::new()); // an empty file: the decoder says it is no image
        }
        remote
            .cache
            .read_whole(&remote.store, &remote.location, &object)
    }

    /// Tells the read-ahead thread of a remote folder about `indices`.
    pub(super) fn prefetch_remote(&self, indices: &[u64]) {
        let Some(read_ahead) = self.remote.as_ref().and_then(|r| r.read_ahead.as_ref()) else {
            return;
        };
        let hint: Hint = indices
            .iter()
            .filter_map(|&index| self.listed(index))
            .filter(|(_, object)| object.size > 0)
            .map(|(_, object)| {
                let whole = 0..object.size;
                (object, vec![whole])
            })
            .collect();
        if !hint.is_empty() {
            read_ahead.hint(hint);
        }
    }
}

/// The split folder to read under `base` (`uri`'s key prefix) when its listing `objects` (every
/// key under it) is laid out by split: every first folder named like a split, and one of them
/// holding folders of its own. `None` when it is not so laid out and no split is asked for.
fn split_folder(
    uri: &str,
    base: &str,
    objects: &[ObjectMeta],
    split: Option<&str>,
) -> Result<Option<String>> {
    // Each first folder, and whether it holds folders (a class folder) of its own.
    let mut folders: BTreeMap<&str, bool> = BTreeMap::new();
    for object in objects {
        let Some(relative) = object.location.as_ref().strip_prefix(base) else {
            continue;
        };
        if let Some((first, rest)) = relative.split_once('/') {
            *folders.entry(first).or_default() |= rest.contains('/');
        }
    }
    let by_split = !folders.is_empty()
        && folders.keys().all(|name| is_split_folder_name(name))
        && folders.values().any(|holds_folders| *holds_folders);
    let found: Vec<String> = folders.keys().map(|name| name.to_string()).collect();
    match split {
        None if !by_split => Ok(None),
        None if found.len() == 1 => Ok(found.into_iter().next()),
        None => Err(Error::SplitNeeded {
            source_name: uri.to_string(),
            found,
        }),
        Some(split) if by_split && folders.contains_key(split) => Ok(Some(split.to_string())),
        Some(split) => Err(Error::NoSuchSplit {
            source_name: uri.to_string(),
            split: split.to_string(),
            found: if by_split { found } else { Vec::new() },
        }),
    }
}
