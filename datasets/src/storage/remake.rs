//! How a copy in the cache tier that its reader does not hold locked is had again once
//! evicted. The copies a set's open brings into the cache (a local compressed file
//! decompressed, a remote object fetched whole, or decompressed after that) are let go of once
//! opened: a lock descriptor each would keep a set of more files than the descriptor limit from
//! opening. A cap may then evict one between two reads of it, and the reader opening it again
//! gets it made or fetched again, from the bytes the set was opened with and no others.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use super::derived::{made_elsewhere, remade_error, DerivedSource};
use super::entry::CachedObject;
use super::remote_object::RemoteObject;
use crate::error::{Error, Result};
use crate::same_file::{reopen_error, SameFile};

/// How a copy is written from its source file, kept by its reader.
pub(crate) type MakeFn = dyn Fn(&Path, &mut dyn Write) -> Result<()> + Send + Sync;

/// Where a copy read from the cache tier comes from again once evicted.
pub(crate) enum Remake {
    /// Made from a file (a local one, or a remote object's copy) by `make`.
    Derived {
        source: Box<DerivedSource>,
        make: Box<MakeFn>,
    },
    /// A remote object's whole copy, fetched again as listed.
    Fetched(RemoteObject),
}

impl Remake {
    /// A copy `make` writes from `source`.
    pub(crate) fn derived(
        source: DerivedSource,
        make: impl Fn(&Path, &mut dyn Write) -> Result<()> + Send + Sync + 'static,
    ) -> Remake {
        Remake::Derived {
            source: Box::new(source),
            make: Box::new(make),
        }
    }

    /// The copy, made or fetched now unless it is in the cache tier, locked while the
    /// returned one lives.
    pub(crate) fn copy(&self) -> Result<CachedObject> {
        match self {
            Remake::Derived { source, make } => source.copy(make.as_ref()),
            Remake::Fetched(object) => object.fetch_whole(),
        }
    }

    /// [`Remake::copy`] from `fetched`, the remote object's copy the set's open just fetched
    /// (locked): itself, or the copy made from it (then let go of).
    pub(crate) fn copy_from(&self, fetched: CachedObject) -> Result<CachedObject> {
        match self {
            Remake::Derived { source, make } => source.copy_from(fetched, make.as_ref()),
            Remake::Fetched(_) => Ok(fetched),
        }
    }

    /// The copy at `copy` opened again to be read: made or fetched again if evicted, from its
    /// source as it was when the set was opened ([`DerivedSource::make_again`]; an object is
    /// fetched as listed, one rewritten since is [`Error::ObjectChanged`]). A failure to have
    /// it again that would read as a bad sample is the cache's ([`remade_error`]). The copy is
    /// not held locked once open: an eviction after that leaves the open file readable.
    pub(crate) fn open_again(&self, copy: &Path) -> Result<File> {
        match File::open(copy) {
            Ok(file) => return Ok(file),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(Error::cache(copy, error)),
        }
        tracing::debug!(copy = %copy.display(), "an evicted copy had again");
        match self {
            Remake::Derived { source, make } => source.make_again(copy, make.as_ref()),
            Remake::Fetched(object) => {
                let fetched = object
                    .fetch_whole()
                    .map_err(|error| remade_error(copy, error))?;
                if fetched.path() != copy {
                    return Err(made_elsewhere(copy, fetched.path()));
                }
                File::open(copy).map_err(|error| Error::cache(copy, error))
            }
        }
    }

    /// `Ok` when `file`, the copy at `copy` opened again, has the `len` it had when its set
    /// was opened: had again, it is another file of the same bytes; one of another length is
    /// a damaged copy, the cache's fault.
    pub(crate) fn check_copy(file: &File, copy: &Path, len: u64) -> Result<()> {
        let now = SameFile::of_file(file, copy)?.len();
        if now == len {
            return Ok(());
        }
        let problem = format!("the copy is {now} bytes; it was {len} when its set was opened");
        Err(Error::cache(copy, std::io::Error::other(problem)))
    }
}

/// The file `read_from` (the one named `path`, or its copy in the cache tier) opened again to
/// read it: by [`Remake::open_again`] when `remake` has its copy again once evicted, else by its
/// path ([`reopen_error`] when that fails).
pub(crate) fn open_again(remake: Option<&Remake>, path: &Path, read_from: &Path) -> Result<File> {
    match remake {
        Some(remake) => remake.open_again(read_from),
        None => File::open(read_from).map_err(|error| reopen_error(path, read_from, error)),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use object_store::memory::InMemory;
    use object_store::path::Path as ObjectPath;
    use object_store::{ObjectStoreExt, PutPayload};

    use super::*;
    use crate::storage::{s3_location, ObjectCache, ObjectCacheOptions, Store};

    /// Evicts every entry of the cache folder of `cache` that nobody holds, as another
    /// reader's cap does.
    pub(crate) fn evict_all(cache: &ObjectCache) {
        let mut options = cache.options().clone();
        options.max_bytes = 0;
        ObjectCache::new(options).unwrap().enforce_cap().unwrap();
    }

    fn upper(source: &Path, out: &mut dyn Write) -> Result<()> {
        let text = std::fs::read(source).map_err(|error| Error::io(source, error))?;
        out.write_all(&text.to_ascii_uppercase())
            .map_err(|error| Error::io(source, error))
    }

    /// Writes `bytes` as `set/a.txt` of `memory`.
    fn put(cache: &ObjectCache, memory: &InMemory, bytes: &[u8]) {
        let path = ObjectPath::from("set/a.txt");
        let payload = PutPayload::from(bytes.to_vec());
        cache.runtime.block_on(memory.put(&path, payload)).unwrap();
    }

    /// An object store holding `s3://bucket/set/a.txt` (a new version, another ETag, each time
    /// `put`), read through a cache tier of its own.
    pub(crate) struct OneObject {
        _dir: tempfile::TempDir,
        pub(crate) cache: Arc<ObjectCache>,
        memory: Arc<InMemory>,
        /// The object as first listed.
        pub(crate) object: RemoteObject,
    }

    impl OneObject {
        /// The object holding `text` first.
        pub(crate) fn new(text: &[u8]) -> OneObject {
            let dir = tempfile::tempdir().unwrap();
            let cache = Arc::new(ObjectCache::new(ObjectCacheOptions::new(dir.path())).unwrap());
            let memory = Arc::new(InMemory::new());
            put(&cache, &memory, text);
            let store: Arc<Store> = Arc::clone(&memory) as Arc<Store>;
            let location = s3_location("s3://bucket/set", "a test prefix").unwrap();
            let listed = cache.list(&store, &location).unwrap().pop().unwrap();
            OneObject {
                _dir: dir,
                object: RemoteObject::new(Arc::clone(&cache), store, &location, listed),
                cache,
                memory,
            }
        }

        /// Writes the object again, holding `bytes`.
        pub(crate) fn put(&self, bytes: &[u8]) {
            put(&self.cache, &self.memory, bytes);
        }

        fn gets(&self) -> u64 {
            self.cache.stats().requests
        }
    }

    /// A remote object's copy let go of and evicted is fetched again when opened again, the
    /// version listed: the same bytes; the object rewritten since (the same length) stops the
    /// read as a changed dataset, naming it, never serving the new bytes.
    #[test]
    fn an_objects_copy_let_go_of_is_fetched_again_as_listed_once_evicted() {
        let one = OneObject::new(b"first");
        let remake = Remake::Fetched(one.object.clone());
        let mut copy = remake.copy().unwrap();
        let path = copy.path().to_path_buf();
        copy.release_lock();
        evict_all(&one.cache);
        assert!(!path.exists(), "evicted");
        let gets = one.gets();
        let file = remake.open_again(&path).unwrap();
        Remake::check_copy(&file, &path, 5).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        assert_eq!(one.gets(), gets + 1, "fetched again");
        // Held nowhere once open: evicted again at once.
        evict_all(&one.cache);
        assert!(!path.exists());

        one.put(b"FIRST");
        let error = remake.open_again(&path).unwrap_err();
        assert!(matches!(error, Error::ObjectChanged { .. }), "{error}");
        assert!(error.dataset_changed() && error.to_string().contains("s3://bucket/set/a.txt"));
    }

    /// A copy made from a remote object's copy is named by the object's version: with both
    /// evicted, it is made again (the object fetched again first) under the name it had, so
    /// its reader finds it; the object rewritten since stops the read, naming it.
    #[test]
    fn a_copy_made_from_an_object_is_made_again_under_its_name_once_both_are_evicted() {
        let one = OneObject::new(b"abc");
        let source = DerivedSource::of_object(one.object.clone(), "upper").unwrap();
        let remake = Remake::derived(source, upper);
        let mut copy = remake.copy().unwrap();
        let path = copy.path().to_path_buf();
        assert_eq!(std::fs::read(&path).unwrap(), b"ABC");
        copy.release_lock();
        evict_all(&one.cache);
        assert!(!path.exists(), "evicted");
        let gets = one.gets();
        let file = remake.open_again(&path).unwrap();
        Remake::check_copy(&file, &path, 3).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"ABC");
        assert_eq!(one.gets(), gets + 1, "fetched again");

        evict_all(&one.cache);
        one.put(b"xyz");
        let error = remake.open_again(&path).unwrap_err();
        assert!(matches!(error, Error::ObjectChanged { .. }), "{error}");
        assert!(error.dataset_changed());
    }
}
