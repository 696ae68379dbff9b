//! Files made from files, kept in the cache tier beside the remote objects: a compressed JSONL
//! file or MDS shard (local, or a remote object's copy) decompressed once, then read at random
//! like a plain one.
//!
//! A derived copy lives under `<cache>/local/` at its source's absolute path plus a suffix
//! naming the transformation and the source's version (its size and modification time:
//! `<cache>/local/data/a.jsonl.gz.decompressed-1234-1700000000000000000`; a remote object's
//! copy by its size and a fingerprint of the object's listed version in place of the time, so
//! the copy keeps its name when the object is fetched again), with the same companions as a
//! remote entry: a `.stoker-meta` file recording the source's size and modification time (or
//! that fingerprint) and the copy's size, and a `.stoker-lock` file locked shared while the copy is read (the copies
//! of an MDS or JSONL set only while made and opened: a set of thousands would hold a
//! descriptor each; its files make theirs again once evicted, `remake.rs`). A source that
//! changed gets a copy of its own, beside the old one that a running job may still read
//! (eviction takes the old one once nothing reads it). Processes
//! wait for a shared lock first: one making the copy holds it exclusive until the copy is
//! complete, then shared for as long as it reads it, so the others read the copy it made (and
//! take the exclusive lock to make it only when there is none). The copy is written to a part
//! file renamed into place when complete; the size cap and LRU eviction count it like any
//! entry, and never evict one locked. A copy whose lock was let go may be evicted while a
//! reader still holds it open: it reads on, and the disk keeps its bytes until it closes, so
//! the folder may then hold more than the cap by what the readers hold open.

use std::fs::File;
use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};
use tracing::info;

use super::entry::{
    held_copies_except, with_suffix, write_atomically, CachedObject, LOCAL_ROOT, LOCK_SUFFIX,
    META_SUFFIX, PART_MARKER,
};
use super::entry_lock::{downgrade, open_lock_file, touch, unlock, wait_for_lock};
use super::eviction::evict_to_cap;
use super::fetch_meter::FetchMeter;
use super::materialise::MAX_FETCHES;
use super::options::ObjectCacheOptions;
use super::remote_object::RemoteObject;
use super::stats::Counters;
use crate::error::{Error, Result};
use crate::same_file::{reopen_error, SameFile};

/// Numbers the part files of this process.
static NEXT_PART: AtomicU64 = AtomicU64::new(0);

/// What a derived copy was made from, and its own size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct DerivedMeta {
    source_size: u64,
    /// The source's modification time in nanoseconds since the epoch; for a remote object's
    /// copy, the fingerprint of the object's version (`SourceKind::Fetched`).
    source_modified_ns: u128,
    size: u64,
}

/// The source's identity: its size and modification time.
fn source_identity(source: &Path) -> Result<(u64, u128)> {
    let metadata = std::fs::metadata(source).map_err(|error| Error::io(source, error))?;
    Ok(identity_of(&metadata))
}

/// What a copy's source is, which says how its version is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SourceKind {
    /// A file of the user's: its version is its size and modification time.
    File,
    /// A remote object's copy in the cache tier: its version is its size and the object's as
    /// listed (`version`: a fingerprint of its ETag and last-modified time). The copy's own
    /// time changes each time it is fetched again after an eviction, and the copy made from
    /// it must keep its name.
    Fetched { version: u128 },
}

impl SourceKind {
    /// The identity of `source` of this kind.
    fn identity(self, source: &Path) -> Result<(u64, u128)> {
        let (size, modified_ns) = source_identity(source)?;
        Ok(match self {
            SourceKind::File => (size, modified_ns),
            SourceKind::Fetched { version } => (size, version),
        })
    }
}

/// The identity `metadata` gives: the size and modification time.
fn identity_of(metadata: &std::fs::Metadata) -> (u64, u128) {
    let modified = metadata
        .modified()
        .ok()
        .and_then(|time| time.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |since| since.as_nanos());
    (metadata.len(), modified)
}

/// Where the copy of `source` (of version `identity`) made by `transform` lives in the cache
/// folder `dir`.
fn copy_path(dir: &Path, source: &Path, transform: &str, identity: (u64, u128)) -> Result<PathBuf> {
    let absolute = std::fs::canonicalize(source).map_err(|error| Error::io(source, error))?;
    let mut path = dir.join(LOCAL_ROOT);
    for component in absolute.components() {
        if let Component::Normal(segment) = component {
            path.push(segment);
        }
    }
    let (size, modified_ns) = identity;
    Ok(with_suffix(
        &path,
        &format!(".{transform}-{size}-{modified_ns}"),
    ))
}

/// Whether the copy at `data` is the one `meta` records for a source of identity `source`.
fn is_valid(data: &Path, meta: &Path, source: (u64, u128)) -> Option<u64> {
    let recorded: DerivedMeta = serde_json::from_slice(&std::fs::read(meta).ok()?).ok()?;
    let size = std::fs::metadata(data).ok()?.len();
    (recorded.source_size == source.0
        && recorded.source_modified_ns == source.1
        && recorded.size == size)
        .then_some(size)
}

/// The copy of the local file `source` that `make` writes (`transform` names it, e.g.
/// `decompressed`), made once and kept in the cache tier of `options`. The copy stays locked
/// shared (never evicted) while the returned object lives, unless its holder lets go of the
/// lock ([`CachedObject::release_lock`]: then it only keeps its room under the cap, and makes
/// the copy again if it was evicted, its own room not counted against it).
///
/// `make` writes the whole copy to the file it is given; a copy larger than the room the cache's
/// cap leaves beside the copies this process holds in it is refused (`StorageFull`, naming
/// the cap), so a decompression bomb, or the copies of many compressed files one open makes
/// and holds, stop there rather than fill the disk (threads making copies at once may each
/// take the same room; other processes' copies are evicted only once not in use).
pub fn derived_copy(
    options: &ObjectCacheOptions,
    source: &Path,
    transform: &str,
    make: &dyn Fn(&Path, &mut dyn Write) -> Result<()>,
) -> Result<CachedObject> {
    derive(options, source, SourceKind::File, transform, make)
}

/// [`derived_copy`] of `source`, a source of `kind`.
fn derive(
    options: &ObjectCacheOptions,
    source: &Path,
    kind: SourceKind,
    transform: &str,
    make: Make<'_>,
) -> Result<CachedObject> {
    let identity = kind.identity(source)?;
    let data = copy_path(&options.dir, source, transform, identity)?;
    let meta = with_suffix(&data, META_SUFFIX);
    let lock_path = with_suffix(&data, LOCK_SUFFIX);
    let mut lock = open_lock_file(&lock_path)?;
    let cached = |size: u64, lock: File| {
        touch(&lock, &lock_path);
        CachedObject::local(&options.dir, source, data.clone(), size, lock)
    };
    let (timeout, written) = (options.lock_timeout, Some(data.as_path()));
    // An eviction may take the copy as a lock is turned shared: it is made again, a few
    // times at most.
    for _ in 0..MAX_FETCHES {
        // Shared first: a process making the copy holds the lock exclusive until it is
        // complete, then shared while it reads it, for the whole job; waiting for an exclusive
        // lock would wait for that job to end, not for the copy.
        wait_for_lock(&mut lock, false, &lock_path, timeout, written)?;
        if let Some(size) = is_valid(&data, &meta, identity) {
            return Ok(cached(size, lock));
        }
        unlock(&lock, &lock_path)?;
        wait_for_lock(&mut lock, true, &lock_path, timeout, written)?;
        let made = is_valid(&data, &meta, identity).is_none();
        if made {
            let room = Room {
                cap: options.max_bytes,
                held: held_copies_except(&options.dir, &data),
            };
            make_copy(room, (source, kind), &data, &meta, identity, make)?;
        }
        downgrade(&mut lock, &lock_path, timeout, written)?;
        if let Some(size) = is_valid(&data, &meta, identity) {
            let object = cached(size, lock);
            // The cap is checked (a walk of the whole folder) once an eighth of it was brought
            // in, counted with every fetch into the folder: a walk after each copy made an open
            // of thousands of compressed files walk a large folder thousands of times.
            let meter = FetchMeter::open(&options.dir);
            if made && meter.add(size, options.max_bytes / 8) {
                evict_to_cap(&options.dir, options.max_bytes, &Counters::default())?;
            }
            return Ok(object);
        }
        unlock(&lock, &lock_path)?;
    }
    Err(Error::cache(
        &data,
        std::io::Error::other(format!(
            "evicted by another reader each of the {MAX_FETCHES} times it was made, before it \
             could be read: the cache cap ({} bytes) is smaller than the files in use at once",
            options.max_bytes
        )),
    ))
}

/// How a copy is made from a file: the source file and the writer of the copy.
pub(crate) type Make<'a> = &'a dyn Fn(&Path, &mut dyn Write) -> Result<()>;

/// What a copy is derived from, as it was when its set was opened: what a reader that let go
/// of the copy's lock ([`CachedObject::release_lock`]) needs to make the copy again once it
/// was evicted, from those bytes and no others.
pub(crate) struct DerivedSource {
    /// The file copies are made from: a local file, or a remote object's copy in the cache.
    source: PathBuf,
    origin: Origin,
    options: ObjectCacheOptions,
    transform: &'static str,
}

/// Where a [`DerivedSource`]'s file comes from.
enum Origin {
    /// A local file, as it was opened (its device, inode and length).
    File(SameFile),
    /// A remote object, as listed: its copy in the cache tier, fetched again if evicted.
    Object(RemoteObject),
}

impl DerivedSource {
    /// The local file `source` as it is now, its copies made by `transform` in the cache tier
    /// of `options`.
    pub(crate) fn new(
        source: &Path,
        options: &ObjectCacheOptions,
        transform: &'static str,
    ) -> Result<DerivedSource> {
        let metadata = std::fs::metadata(source).map_err(|error| Error::io(source, error))?;
        Ok(DerivedSource {
            source: source.to_path_buf(),
            origin: Origin::File(SameFile::of(&metadata)),
            options: options.clone(),
            transform,
        })
    }

    /// The remote `object` as listed, its copies made by `transform` from its copy in the
    /// cache tier it is read through, and kept there. Such a copy is named by the object's
    /// version, not its copy's time: made again after both were evicted, it has the name it
    /// had.
    pub(crate) fn of_object(
        object: RemoteObject,
        transform: &'static str,
    ) -> Result<DerivedSource> {
        Ok(DerivedSource {
            source: object.copy_path()?,
            options: object.cache_options().clone(),
            origin: Origin::Object(object),
            transform,
        })
    }

    /// The copy `make` writes, made now unless it is in the cache tier ([`derived_copy`]); a
    /// remote object's copy is fetched first unless it is there, and held while it is read.
    pub(crate) fn copy(&self, make: Make<'_>) -> Result<CachedObject> {
        match &self.origin {
            Origin::File(_) => derived_copy(&self.options, &self.source, self.transform, make),
            Origin::Object(object) => self.copy_from(object.fetch_whole()?, make),
        }
    }

    /// [`DerivedSource::copy`] of a remote object from its copy `fetched` (locked), which is
    /// let go of once the copy is made.
    pub(crate) fn copy_from(&self, fetched: CachedObject, make: Make<'_>) -> Result<CachedObject> {
        let Origin::Object(object) = &self.origin else {
            return self.copy(make);
        };
        let kind = SourceKind::Fetched {
            version: object.version_fingerprint(),
        };
        derive(&self.options, fetched.path(), kind, self.transform, make)
    }

    /// The copy at `copy`, evicted, made again and opened, but only from the source as it
    /// was: a local file changed since (its size, time, device or inode: appended to,
    /// touched, rewritten, renamed over) is [`Error::FileReplaced`], one gone
    /// [`Error::FileRemoved`], both naming the file; a remote object rewritten since is
    /// [`Error::ObjectChanged`] as it is fetched again; a failure to make it again is the
    /// cache's ([`remade_error`]). The copy made is not held locked once open: an eviction
    /// after that leaves the open file readable.
    pub(super) fn make_again(&self, copy: &Path, make: Make<'_>) -> Result<File> {
        if let Origin::File(opened) = &self.origin {
            self.check_source(opened, copy)?;
        }
        let made = self.copy(make).map_err(|error| remade_error(copy, error))?;
        if made.path() != copy {
            return Err(match &self.origin {
                Origin::File(opened) => {
                    let now_len = source_identity(&self.source).map_or(0, |(len, _)| len);
                    self.replaced(opened, now_len)
                }
                Origin::Object(_) => made_elsewhere(copy, made.path()),
            });
        }
        File::open(made.path()).map_err(|error| Error::cache(made.path(), error))
    }

    /// `Ok` when the local file is still as it was opened, the copy at `copy` made from it.
    fn check_source(&self, opened: &SameFile, copy: &Path) -> Result<()> {
        let source = &self.source;
        let metadata =
            std::fs::metadata(source).map_err(|error| reopen_error(source, source, error))?;
        opened.matches(SameFile::of(&metadata), source)?;
        // Its time too: a copy's name holds its source's size and time.
        let now = copy_path(
            &self.options.dir,
            source,
            self.transform,
            identity_of(&metadata),
        )?;
        if now != copy {
            return Err(self.replaced(opened, metadata.len()));
        }
        Ok(())
    }

    /// The local file changed since it was opened, `now_len` bytes long now.
    fn replaced(&self, opened: &SameFile, now_len: u64) -> Error {
        Error::FileReplaced {
            path: self.source.clone(),
            opened_len: opened.len(),
            now_len,
        }
    }
}

/// A copy made again at `made` rather than at `copy`, where it was: the cache's fault.
pub(super) fn made_elsewhere(copy: &Path, made: &Path) -> Error {
    let problem = format!("it was made again as {}", made.display());
    Error::cache(copy, std::io::Error::other(problem))
}

/// The error of making again, for a reader, a copy evicted since its set was opened: it was
/// made from the same source then, so a failure now (the cap or the disk full, a write that
/// failed) is this node's cache's, never the sample's; other faults stay what they were.
pub(super) fn remade_error(copy: &Path, error: Error) -> Error {
    match error.read_fault() {
        crate::error::ReadFault::Sample => Error::Cache {
            path: copy.to_path_buf(),
            source: std::io::Error::other(format!(
                "the copy was evicted and making it again failed: {error}"
            )),
        },
        _ => error,
    }
}

/// The room a new copy has: the cache's cap, less the copies this process holds in it (none of
/// which can be evicted while held, but for those whose lock was let go).
#[derive(Debug, Clone, Copy)]
struct Room {
    cap: u64,
    held: u64,
}

/// Makes the copy of `source` at `data` through `make`, its metadata at `meta` written last;
/// the lock is held exclusive.
fn make_copy(
    room: Room,
    (source, kind): (&Path, SourceKind),
    data: &Path,
    meta: &Path,
    identity: (u64, u128),
    make: &dyn Fn(&Path, &mut dyn Write) -> Result<()>,
) -> Result<()> {
    let started = std::time::Instant::now();
    let part = with_suffix(
        data,
        &format!(
            "{PART_MARKER}{}-{}",
            std::process::id(),
            NEXT_PART.fetch_add(1, Ordering::Relaxed)
        ),
    );
    // The source replaced while it was read: the copy, named for the version looked at
    // first, is not kept.
    let made = write_part(&part, source, room, make).and_then(|size| {
        let now = kind.identity(source)?;
        if now != identity {
            return Err(Error::FileReplaced {
                path: source.to_path_buf(),
                opened_len: identity.0,
                now_len: now.0,
            });
        }
        Ok(size)
    });
    let size = match made {
        Ok(size) => size,
        Err(error) => {
            let _ = std::fs::remove_file(&part);
            return Err(error);
        }
    };
    // Invalidate first so no reader trusts old metadata with new bytes in between.
    match std::fs::remove_file(meta) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(Error::cache(meta, error)),
    }
    std::fs::rename(&part, data).map_err(|error| Error::cache(data, error))?;
    let recorded = DerivedMeta {
        source_size: identity.0,
        source_modified_ns: identity.1,
        size,
    };
    let text = serde_json::to_vec(&recorded).map_err(|error| Error::Manifest {
        path: meta.to_path_buf(),
        source: error,
    })?;
    write_atomically(meta, &text).map_err(|error| Error::cache(meta, error))?;
    info!(
        source = %source.display(),
        copy = %data.display(),
        bytes = size,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "made a derived copy in the cache tier"
    );
    Ok(())
}

/// Writes the copy into `part` through a writer that refuses to pass the `room` left; its
/// size.
fn write_part(
    part: &Path,
    source: &Path,
    room: Room,
    make: &dyn Fn(&Path, &mut dyn Write) -> Result<()>,
) -> Result<u64> {
    let file = File::create(part).map_err(|error| Error::cache(part, error))?;
    let mut capped = CappedWriter {
        inner: std::io::BufWriter::new(file),
        written: 0,
        room,
    };
    make(source, &mut capped)?;
    let file = capped
        .inner
        .into_inner()
        .map_err(|error| Error::cache(part, error.into_error()))?;
    file.sync_all().map_err(|error| Error::cache(part, error))?;
    Ok(capped.written)
}

/// A writer that fails once more than its room would be written.
struct CappedWriter<W> {
    inner: W,
    written: u64,
    room: Room,
}

impl<W: Write> Write for CappedWriter<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let after = self.written.saturating_add(bytes.len() as u64);
        let Room { cap, held } = self.room;
        if after.saturating_add(held) > cap {
            let beside = if held > 0 {
                format!(" with the {held} bytes of the copies this process reads already")
            } else {
                String::new()
            };
            return Err(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                format!(
                    "the copy would pass the cache cap of {cap} bytes (STOKER_CACHE_MAX_BYTES)\
                     {beside}"
                ),
            ));
        }
        let written = self.inner.write(bytes)?;
        self.written += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::super::entry::held_copies;
    use super::*;
    use crate::error::ReadFault;

    #[test]
    fn a_copy_that_cannot_be_made_again_is_the_caches_fault_not_the_samples() {
        let copy = Path::new("/cache/local/data/a.jsonl.gz.decompressed-1-2");
        let full = Error::Decompress {
            path: "/data/a.jsonl.gz".into(),
            source: std::io::Error::new(std::io::ErrorKind::StorageFull, "over the cap"),
        };
        assert_eq!(full.read_fault(), ReadFault::Sample);
        let remade = remade_error(copy, full);
        assert_eq!(remade.read_fault(), ReadFault::Source);
        assert!(remade.to_string().contains("over the cap"), "{remade}");
        // Short of descriptors: a fault that may pass, as it was.
        let short = Error::io(
            "/data/a.jsonl.gz",
            std::io::Error::from_raw_os_error(libc::EMFILE),
        );
        assert_eq!(remade_error(copy, short).read_fault(), ReadFault::Resource);
    }

    fn upper(source: &Path, out: &mut dyn Write) -> Result<()> {
        let text = std::fs::read(source).map_err(|error| Error::io(source, error))?;
        out.write_all(&text.to_ascii_uppercase())
            .map_err(|error| Error::io(source, error))
    }

    #[test]
    fn a_copy_is_made_once_and_again_when_its_source_changes() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("a.txt");
        std::fs::write(&source, "abc").unwrap();
        let options = ObjectCacheOptions::new(dir.path().join("cache"));
        let calls = AtomicU64::new(0);
        let make = |source: &Path, out: &mut dyn Write| {
            calls.fetch_add(1, Ordering::Relaxed);
            upper(source, out)
        };
        let first = derived_copy(&options, &source, "upper", &make).unwrap();
        assert_eq!(std::fs::read(first.path()).unwrap(), b"ABC");
        assert!(first
            .path()
            .starts_with(dir.path().join("cache").join(LOCAL_ROOT)));
        assert!(first.path().to_string_lossy().contains("a.txt.upper-3-"));
        drop(first);
        let again = derived_copy(&options, &source, "upper", &make).unwrap();
        assert_eq!(calls.load(Ordering::Relaxed), 1, "the valid copy is reused");
        drop(again);
        std::fs::write(&source, "abcd").unwrap();
        let changed = derived_copy(&options, &source, "upper", &make).unwrap();
        assert_eq!(std::fs::read(changed.path()).unwrap(), b"ABCD");
        assert_eq!(calls.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_second_reader_waits_for_the_copy_being_made_and_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("a.txt");
        std::fs::write(&source, "abc").unwrap();
        let mut options = ObjectCacheOptions::new(dir.path().join("cache"));
        options.lock_timeout = std::time::Duration::from_secs(5);
        let calls = AtomicU64::new(0);
        let slow = |source: &Path, out: &mut dyn Write| {
            calls.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(std::time::Duration::from_millis(300));
            upper(source, out)
        };
        std::thread::scope(|scope| {
            // The first keeps its copy (and its shared lock) for as long as the second runs,
            // as a job reading the copy does.
            let first = scope.spawn(|| derived_copy(&options, &source, "upper", &slow).unwrap());
            std::thread::sleep(std::time::Duration::from_millis(50));
            let second = derived_copy(&options, &source, "upper", &slow).unwrap();
            let first = first.join().unwrap();
            assert_eq!(second.path(), first.path());
            assert_eq!(std::fs::read(second.path()).unwrap(), b"ABC");
        });
        assert_eq!(calls.load(Ordering::Relaxed), 1, "made once");
    }

    #[test]
    fn a_changed_source_gets_a_copy_of_its_own_beside_one_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("a.txt");
        std::fs::write(&source, "abc").unwrap();
        let mut options = ObjectCacheOptions::new(dir.path().join("cache"));
        options.lock_timeout = std::time::Duration::from_secs(2);
        let old = derived_copy(&options, &source, "upper", &upper).unwrap();
        std::fs::write(&source, "abcd").unwrap();
        let new = derived_copy(&options, &source, "upper", &upper).unwrap();
        assert_ne!(new.path(), old.path());
        assert_eq!(std::fs::read(old.path()).unwrap(), b"ABC");
        assert_eq!(std::fs::read(new.path()).unwrap(), b"ABCD");
    }

    #[test]
    fn a_copy_over_the_cap_is_refused_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("big.txt");
        std::fs::write(&source, vec![b'x'; 100]).unwrap();
        let mut options = ObjectCacheOptions::new(dir.path().join("cache"));
        options.max_bytes = 10;
        let error = derived_copy(&options, &source, "upper", &upper).unwrap_err();
        assert!(error.to_string().contains("big.txt"), "{error}");
        let identity = source_identity(&source).unwrap();
        let copy = copy_path(&options.dir, &source, "upper", identity).unwrap();
        let leftovers: Vec<_> = std::fs::read_dir(copy.parent().unwrap())
            .unwrap()
            .flatten()
            .map(|entry| entry.file_name())
            .filter(|name| !name.to_string_lossy().ends_with(LOCK_SUFFIX))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    /// The copies one open makes of many compressed files are all held while it reads them,
    /// so none can be evicted: each under the cap alone, together they filled the disk past it
    /// (2,000 files of 150 MB decompressed against a 64 GiB cap). A copy is made only in the
    /// room the held ones leave; a copy let go gives its room back.
    #[test]
    fn copies_held_together_stay_under_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let mut options = ObjectCacheOptions::new(dir.path().join("cache"));
        options.max_bytes = 20;
        let sources: Vec<PathBuf> = (0..3)
            .map(|k| {
                let source = dir.path().join(format!("{k}.txt"));
                std::fs::write(&source, "eightbyt").unwrap();
                source
            })
            .collect();
        let first = derived_copy(&options, &sources[0], "upper", &upper).unwrap();
        let second = derived_copy(&options, &sources[1], "upper", &upper).unwrap();
        // One copy held twice (two loaders over one file) counts once.
        let second_again = derived_copy(&options, &sources[1], "upper", &upper).unwrap();
        assert_eq!(held_copies(&options.dir), 16);
        let error = derived_copy(&options, &sources[2], "upper", &upper)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("cache cap of 20 bytes") && error.contains("16 bytes of the copies"),
            "{error}"
        );
        drop(first);
        let third = derived_copy(&options, &sources[2], "upper", &upper).unwrap();
        assert_eq!(std::fs::read(third.path()).unwrap(), b"EIGHTBYT");
        drop((second, second_again, third));
        assert_eq!(held_copies(&options.dir), 0);
    }

    /// An open of many compressed files walked the whole cache folder after each copy it made
    /// (to hold the cap): with a large folder, thousands of walks. Walked once an eighth of the
    /// cap was made now.
    #[test]
    fn copies_made_one_after_another_walk_the_folder_once_an_eighth_of_the_cap_came() {
        let dir = tempfile::tempdir().unwrap();
        let mut options = ObjectCacheOptions::new(dir.path().join("cache"));
        options.max_bytes = 800;
        let copies: Vec<CachedObject> = (0..20)
            .map(|k| {
                let source = dir.path().join(format!("{k}.txt"));
                std::fs::write(&source, "tenbytes!!").unwrap();
                derived_copy(&options, &source, "upper", &upper).unwrap()
            })
            .collect();
        // 200 bytes made, an eighth of the cap 100: one walk when the count passed it, another
        // when it passed it again.
        let walks = crate::storage::eviction::tests::walks_of(&options.dir);
        assert!(
            (1..=2).contains(&walks),
            "{walks} walks for {} copies",
            copies.len()
        );
    }
}
