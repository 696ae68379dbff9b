//! One entry of the cache tier on disk: where its files lie, the recorded identity of the
//! copy and its check against the listing, the download in progress, and the commit that makes
//! a complete download the entry.
//!
//! Layout under the cache folder, mirroring the bucket so the files read like the remote set:
//!
//! ```text
//! s3/<bucket>/<key>.stoker-versions/<v>   the bytes of one version of the object (<v>: its
//!                                         size and the CRC-32 of its ETag), complete and
//!                                         verified
//! ....stoker-versions/<v>.stoker-meta     JSON: size, ETag and last-modified of that copy
//! ....stoker-versions/<v>.stoker-lock     the entry's lock file; its mtime is the last use
//! ....stoker-versions/<v>.stoker-part-<pid>-<n>
//!                                         a download in progress
//! s3/<bucket>/<key>.stoker-ranges/<a>-<b> bytes a..b of the object, read lazily (an entry with
//!                                         its own .stoker-meta / .stoker-lock / parts)
//! local/<absolute path>.<transform>-<source size>-<source mtime ns>
//!                                         a copy made from a local file or an object's
//!                                         copy (its version's fingerprint for the mtime:
//!                                         see `derived.rs`), with the same .stoker-meta /
//!                                         .stoker-lock companions
//! tar-indexes/<bucket>/...                remote tar sets' indexes (`tar_shards/remote.rs`)
//! ```

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::ObjectMeta;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::uri::RemoteLocation;
use crate::error::{Error, Result};

pub(super) const META_SUFFIX: &str = ".stoker-meta";
pub(super) const LOCK_SUFFIX: &str = ".stoker-lock";
pub(super) const PART_MARKER: &str = ".stoker-part-";
pub(super) const INDEX_SUFFIX: &str = ".stoker-idx";
/// The folder beside an object's entry holding its ranges' entries (`<start>-<end>`).
pub(super) const RANGES_SUFFIX: &str = ".stoker-ranges";
/// The folder holding a whole object's copies by version (`<size>-<crc32 of its ETag>`): a
/// copy of a new version is another entry, so it is fetched while a process still reads the
/// old one (which goes once nobody holds it, by the cap).
pub(super) const VERSIONS_SUFFIX: &str = ".stoker-versions";
/// The folder of copies made from local files (`derived.rs`), beside `s3/`.
pub(super) const LOCAL_ROOT: &str = "local";

/// A remote object (or a range of one, or a copy of a local file) materialised in the cache.
/// While it holds its lock, its entry is locked shared: no process evicts or replaces it;
/// [`CachedObject::release`] lets go of it sooner than the drop does.
#[derive(Debug)]
pub struct CachedObject {
    entry: Entry,
    /// Holds the entry's shared lock; closing it releases the lock.
    lock: Option<File>,
    /// A derived copy's bytes, counted as this process's in its cache folder while held.
    held: Option<HeldCopy>,
}

/// The derived copies (`derived.rs`) this process holds, per cache folder: each copy's size
/// and how many of its objects hold it (two loaders over one file hold one copy). A copy is
/// made only in the room the cap leaves beside them: none of them can be evicted, but for
/// those whose lock was let go, which are made again in their own room.
type HeldCopies = BTreeMap<PathBuf, BTreeMap<PathBuf, (u64, usize)>>;
static HELD_COPIES: std::sync::Mutex<HeldCopies> = std::sync::Mutex::new(BTreeMap::new());

/// A held derived copy, counted in [`HELD_COPIES`] until dropped.
#[derive(Debug)]
struct HeldCopy {
    dir: PathBuf,
    data: PathBuf,
}

impl HeldCopy {
    fn new(dir: &Path, data: &Path, size: u64) -> HeldCopy {
        let mut held = HELD_COPIES.lock().unwrap_or_else(|p| p.into_inner());
        let copy = held
            .entry(dir.to_path_buf())
            .or_default()
            .entry(data.to_path_buf())
            .or_insert((size, 0));
        copy.1 += 1;
        HeldCopy {
            dir: dir.to_path_buf(),
            data: data.to_path_buf(),
        }
    }
}

impl Drop for HeldCopy {
    fn drop(&mut self) {
        let mut held = HELD_COPIES.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(copies) = held.get_mut(&self.dir) {
            if let Some(copy) = copies.get_mut(&self.data) {
                copy.1 -= 1;
                if copy.1 == 0 {
                    copies.remove(&self.data);
                }
            }
            if copies.is_empty() {
                held.remove(&self.dir);
            }
        }
    }
}

/// Bytes of the derived copies this process holds in the cache folder `dir`, each once, but
/// for the copy at `except` (one being made again: its own room is the one it takes).
pub(super) fn held_copies_except(dir: &Path, except: &Path) -> u64 {
    let held = HELD_COPIES.lock().unwrap_or_else(|p| p.into_inner());
    held.get(dir).map_or(0, |copies| {
        copies
            .iter()
            .filter(|(data, _)| data.as_path() != except)
            .map(|(_, (size, _))| size)
            .sum()
    })
}

/// Bytes of the derived copies this process holds in the cache folder `dir`, each once.
#[cfg(test)]
pub(super) fn held_copies(dir: &Path) -> u64 {
    held_copies_except(dir, Path::new(""))
}

impl CachedObject {
    /// The object's key in its bucket.
    pub fn key(&self) -> &str {
        &self.entry.key
    }

    /// The object's `s3://` URI.
    pub fn uri(&self) -> &str {
        &self.entry.uri
    }

    /// The entry behind it.
    pub(super) fn entry(&self) -> &Entry {
        &self.entry
    }

    /// The local file holding the object's bytes.
    pub fn path(&self) -> &Path {
        &self.entry.data
    }

    /// The object's size in bytes.
    pub fn size(&self) -> u64 {
        self.entry.listed.size
    }

    /// The last segment of the key.
    pub fn file_name(&self) -> &str {
        let key = &self.entry.key;
        key.rsplit('/').next().unwrap_or(key)
    }

    /// Whether the entry's lock is held.
    pub fn is_locked(&self) -> bool {
        self.lock.is_some()
    }

    /// Lets go of the entry's lock (and its descriptor): the entry may be evicted from now on.
    pub fn release(&mut self) {
        self.lock = None;
        self.held = None;
    }

    /// Lets go of the entry's lock and its descriptor, but not of the room a derived copy
    /// takes under the cap beside this process's other copies: the copy may be evicted from
    /// now on, and its user makes it again when it needs it (a set of many copies then holds
    /// no descriptor each, and still fits the cap whole or is refused).
    pub(crate) fn release_lock(&mut self) {
        self.lock = None;
    }

    /// A copy made from the local file `source` (see `derived.rs`) in the cache folder `dir`,
    /// holding `lock` (locked shared by the caller); its bytes count as this process's there.
    pub(super) fn local(
        dir: &Path,
        source: &Path,
        path: PathBuf,
        size: u64,
        lock: File,
    ) -> CachedObject {
        CachedObject {
            held: Some(HeldCopy::new(dir, &path, size)),
            entry: Entry {
                key: source.to_string_lossy().into_owned(),
                uri: format!("file://{}", source.display()),
                meta: with_suffix(&path, META_SUFFIX),
                lock: with_suffix(&path, LOCK_SUFFIX),
                data: path,
                listed: EntryMeta {
                    size,
                    e_tag: None,
                    last_modified: String::new(),
                    crc32: None,
                },
            },
            lock: Some(lock),
        }
    }
}

/// The recorded identity of a cached copy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct EntryMeta {
    pub(super) size: u64,
    pub(super) e_tag: Option<String>,
    last_modified: String,
    /// CRC-32 of the bytes, for entries committed without `fsync` (byte ranges): a copy torn by
    /// a crash fails it when read, and is fetched again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) crc32: Option<u32>,
}

impl EntryMeta {
    fn of(object: &ObjectMeta) -> EntryMeta {
        EntryMeta {
            size: object.size,
            e_tag: object.e_tag.clone(),
            last_modified: object.last_modified.to_rfc3339(),
            crc32: None,
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
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) key: String,
    pub(super) uri: String,
    pub(super) data: PathBuf,
    pub(super) meta: PathBuf,
    pub(super) lock: PathBuf,
    pub(super) listed: EntryMeta,
}

/// The state of an entry's copy against the listing.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Validity {
    Valid,
    Missing,
    Stale,
    Damaged(String),
}

/// The name of `object`'s version among its copies: its size and the CRC-32 of its ETag (of
/// its last-modified time when the store gives no ETag). Two versions sharing a name still
/// differ in their metadata, which every use checks.
fn version_name(object: &ObjectMeta) -> String {
    let version = match &object.e_tag {
        Some(e_tag) => e_tag.clone(),
        None => object.last_modified.to_rfc3339(),
    };
    format!(
        "{}-{:08x}",
        object.size,
        crc32fast::hash(version.as_bytes())
    )
}

pub(super) fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

impl Entry {
    pub(super) fn new(dir: &Path, location: &RemoteLocation, object: &ObjectMeta) -> Result<Entry> {
        let key = object.location.to_string();
        let uri = location.uri_of(&key);
        let bad_segment = |segment: &str| {
            segment.is_empty()
                || segment == "."
                || segment == ".."
                || [META_SUFFIX, LOCK_SUFFIX, INDEX_SUFFIX]
                    .iter()
                    .any(|suffix| segment.ends_with(suffix))
                || (segment.ends_with(RANGES_SUFFIX)
                    && !object
                        .location
                        .as_ref()
                        .contains(&format!("{RANGES_SUFFIX}/")))
                || segment.ends_with(VERSIONS_SUFFIX)
                || segment.contains(PART_MARKER)
        };
        if bad_segment(&location.bucket) || key.split('/').any(bad_segment) {
            return Err(Error::InvalidUri {
                uri,
                reason: "the key cannot be cached: it has an empty, `.` or `..` segment or \
                         ends like one of the cache's own files (.stoker-meta, .stoker-lock, \
                         .stoker-idx, .stoker-versions)"
                    .into(),
            });
        }
        let mut data = dir.join("s3").join(&location.bucket);
        data.extend(key.split('/'));
        // A whole object's copy lies under its version; a range's entry is checked against
        // the object's version and fetched again in place (held only while it is read).
        if !key.contains(&format!("{RANGES_SUFFIX}/")) {
            data = with_suffix(&data, VERSIONS_SUFFIX).join(version_name(object));
        }
        Ok(Entry {
            meta: with_suffix(&data, META_SUFFIX),
            lock: with_suffix(&data, LOCK_SUFFIX),
            data,
            key,
            uri,
            listed: EntryMeta::of(object),
        })
    }

    pub(super) fn open_lock(&self) -> Result<File> {
        super::entry_lock::open_lock_file(&self.lock)
    }

    pub(super) fn validity(&self) -> Validity {
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

    /// The entry as a [`CachedObject`] holding `lock` (locked shared by the caller).
    pub(super) fn into_cached(self, lock: File) -> CachedObject {
        CachedObject {
            entry: self,
            lock: Some(lock),
            held: None,
        }
    }

    /// The copy's bytes, when its recorded checksum (if any) holds; `None` when it does not
    /// (the metadata is then removed, so the entry is fetched again), when the metadata is
    /// gone or unreadable (another reader found the bytes torn and removed it), or when the
    /// copy itself is gone (deleted from outside, by a temporary-file cleaner say: the metadata
    /// is removed too): never bytes whose check could not be made.
    pub(super) fn read_checked(&self) -> Result<Option<Vec<u8>>> {
        let bytes = match std::fs::read(&self.data) {
            Ok(bytes) => bytes,
            Err(source) if source.kind() == std::io::ErrorKind::NotFound => {
                warn!(uri = %self.uri, cache = %self.data.display(), "cached copy was deleted; fetching it again");
                let _ = std::fs::remove_file(&self.meta);
                return Ok(None);
            }
            Err(source) => return Err(Error::cache(&self.data, source)),
        };
        let recorded: Option<EntryMeta> = std::fs::read(&self.meta)
            .ok()
            .and_then(|text| serde_json::from_slice(&text).ok());
        let Some(recorded) = recorded else {
            warn!(uri = %self.uri, cache = %self.data.display(), "cached copy lost its metadata while read; fetching it again");
            return Ok(None);
        };
        if recorded
            .crc32
            .is_some_and(|crc| crc != crc32fast::hash(&bytes))
        {
            warn!(uri = %self.uri, cache = %self.data.display(), "cached bytes fail their checksum; fetching them again");
            let _ = std::fs::remove_file(&self.meta);
            return Ok(None);
        }
        Ok(Some(bytes))
    }

    /// Whether the copy is valid; logs why not when it is there but unusable.
    pub(super) fn is_valid(&self) -> bool {
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
pub(super) struct PartFile {
    pub(super) path: PathBuf,
    pub(super) file: Arc<File>,
    pub(super) committed: bool,
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

/// Moves a complete download over the entry, then records its metadata.
/// Makes a complete download the entry. A whole object is synced to disk first; a byte range
/// (`checksummed`) is not (an `fsync` per sample would bound the read rate), its CRC-32 goes
/// into the metadata instead and every read checks it ([`Entry::read_checked`]).
pub(super) fn commit(entry: &Entry, part: &PartFile, checksummed: bool) -> Result<()> {
    let mut recorded = entry.listed.clone();
    if checksummed {
        let bytes = std::fs::read(&part.path).map_err(|source| Error::cache(&part.path, source))?;
        recorded.crc32 = Some(crc32fast::hash(&bytes));
    } else {
        part.file
            .sync_all()
            .map_err(|source| Error::cache(&part.path, source))?;
    }
    let received = part
        .file
        .metadata()
        .map_err(|source| Error::cache(&part.path, source))?
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
        Err(source) => return Err(Error::cache(&entry.meta, source)),
    }
    std::fs::rename(&part.path, &entry.data).map_err(|source| Error::cache(&entry.data, source))?;
    let meta = serde_json::to_vec(&recorded).map_err(|source| Error::Manifest {
        path: entry.meta.clone(),
        source,
    })?;
    write_atomically(&entry.meta, &meta).map_err(|source| Error::cache(&entry.meta, source))
}

/// Writes `bytes` to `path` through a temporary file and a rename.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let temporary = with_suffix(path, &format!("{PART_MARKER}{}-meta", std::process::id()));
    let written =
        std::fs::write(&temporary, bytes).and_then(|()| std::fs::rename(&temporary, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_matches_by_etag_else_by_time() {
        let listed = EntryMeta {
            size: 10,
            e_tag: Some("\"a\"".into()),
            last_modified: "t1".into(),
            crc32: None,
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
    fn bytes_are_read_only_with_their_metadata_and_a_checksum_that_holds() {
        let dir = tempfile::tempdir().unwrap();
        let location = RemoteLocation {
            bucket: "b".into(),
            prefix: String::new(),
        };
        let object = ObjectMeta {
            location: object_store::path::Path::from("set/a.bin"),
            last_modified: Default::default(),
            size: 4,
            e_tag: Some("\"a\"".into()),
            version: None,
        };
        let entry = Entry::new(dir.path(), &location, &object).unwrap();
        std::fs::create_dir_all(entry.data.parent().unwrap()).unwrap();
        std::fs::write(&entry.data, b"abcd").unwrap();
        let mut meta = EntryMeta::of(&object);
        meta.crc32 = Some(crc32fast::hash(b"abcd"));
        std::fs::write(&entry.meta, serde_json::to_vec(&meta).unwrap()).unwrap();
        assert_eq!(entry.read_checked().unwrap().as_deref(), Some(&b"abcd"[..]));
        // Torn bytes fail the checksum; the metadata goes, so the next reader fetches again.
        std::fs::write(&entry.data, b"ab\0\0").unwrap();
        assert_eq!(entry.read_checked().unwrap(), None);
        assert!(!entry.meta.exists());
        // A reader that finds the metadata gone (removed by another) does not take the bytes.
        assert_eq!(entry.read_checked().unwrap(), None);
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
        // A whole object under its version (size 1, the CRC-32 of its last-modified time).
        let version = crc32fast::hash(
            chrono::DateTime::<chrono::Utc>::default()
                .to_rfc3339()
                .as_bytes(),
        );
        let copy = format!("/cache/s3/b/train/shard-0.tar.stoker-versions/1-{version:08x}");
        assert_eq!(entry.data, Path::new(&copy));
        assert_eq!(entry.lock, Path::new(&format!("{copy}.stoker-lock")));
        // Another version is another entry; a range's entry has none.
        let mut newer = object("train/shard-0.tar");
        newer.e_tag = Some("\"b\"".into());
        let newer = Entry::new(Path::new("/cache"), &location, &newer).unwrap();
        assert_ne!(newer.data, entry.data);
        assert_eq!(newer.data.parent(), entry.data.parent());
        let range = Entry::new(
            Path::new("/cache"),
            &location,
            &object("train/shard-0.tar.stoker-ranges/0-10"),
        )
        .unwrap();
        assert_eq!(
            range.data,
            Path::new("/cache/s3/b/train/shard-0.tar.stoker-ranges/0-10")
        );
        for key in [
            "x.tar.stoker-versions",
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
}
