//! `TarShards`: samples stored in tar files in the WebDataset layout, read by random access.
//!
//! Members are grouped into samples by key, the member path up to the first dot of its file
//! name (`dir/0001.jpg` and `dir/0001.cls` form sample `dir/0001`). A sample holds one image
//! member (`.jpg`, `.jpeg`, `.png`, `.webp`, `.bmp`, `.tif`, `.tiff`, `.gif`, `.pbm`, `.pgm`,
//! `.ppm`, `.pnm`) and one label member: `.cls` (an ASCII integer) or `.json`
//! (an object with an integer `label` or `cls` field). Other members are ignored.
//!
//! Each shard's index (data offset, size and label per sample) is built once by walking the tar
//! headers and cached (see `cache.rs`); reading a sample is one positioned read on a file handle
//! shared by all threads. Shard files are held open in the process's bounded pool of open files
//! (`file_pool.rs`), so the number of shards is not bounded by the descriptor limit: a shard
//! not read for a while is closed and opened again when next read.
//!
//! The same set under `s3://BUCKET/PREFIX` ([`TarShards::open_remote`], `remote.rs`) is the same
//! type with other shard bytes: each shard an object, indexed by the set's index object
//! (`index_object.rs`), each sample a ranged GET through the cache tier, read ahead.

mod cache;
pub(crate) mod index_object;
mod open;
mod remote;
pub(crate) mod scan;
mod upload;
mod write;

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;
use tracing::{info, warn};

use crate::cache_stats::CacheStats;
use crate::error::{Error, Result};
use crate::file_pool::{failed_for_descriptors, FileKey, FilePool, PooledFile};
use crate::files::{files_with_extension, has_extension, root_files};
use crate::naming::RemoteFiles;
use crate::same_file::reopen_error;
use crate::sample_source::{numbered_class_names, SampleSource};
use crate::storage::{
    default_user_cache_dir, ByteRanges, Hint, ObjectCache, Prefetcher, RemoteObject,
};
use cache::ShardStamp;
use scan::ShardIndex;

pub use index_object::TAR_INDEX_OBJECT;
pub use remote::{write_tar_index, TarIndexWritten};
pub use upload::{check_empty_prefix, upload_tar_set, TarSetUploaded, UNFINISHED_UPLOAD};
pub use write::{write_tar_shards, TarShardsWriterOptions, TarShardsWritten};

/// The file next to the shards that names the classes, one per line, in label order.
pub const CLASSES_FILE: &str = "classes.txt";

/// Whether `path` looks like a tar shard set: a `.tar` file, or a folder holding at least one
/// `*.tar` file. Used to pick the format of a dataset path automatically.
pub fn looks_like_tar_shards(path: &Path) -> bool {
    if path.is_file() {
        return has_extension(path, "tar");
    }
    crate::files::folder_holds(path, "tar")
}

/// The first gzip-compressed tar shard `path` is or holds (`*.tar.gz`, `*.tgz`), which are not
/// read (a member is read by its offset in the shard); `None` when there is none.
pub fn compressed_tar_shard(path: &Path) -> Option<std::path::PathBuf> {
    let compressed = |path: &Path| {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_ascii_lowercase());
        name.is_some_and(|name| name.ends_with(".tar.gz") || name.ends_with(".tgz"))
    };
    if path.is_file() {
        return compressed(path).then(|| path.to_path_buf());
    }
    let mut found: Vec<std::path::PathBuf> = std::fs::read_dir(path)
        .ok()?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.is_file() && compressed(path))
        .collect();
    found.sort();
    found.into_iter().next()
}

/// How the shard indexes of a [`TarShards`] were obtained.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TarIndexStats {
    /// Number of shard files.
    pub shards: usize,
    /// Shards whose index came from a cache file.
    pub loaded_from_cache: usize,
    /// Shards whose index was built by walking their tar headers.
    pub built: usize,
    /// Members or samples reported while indexing: left out (incomplete sample, bad label,
    /// everything after a corrupt header) or truncated.
    pub problems: u64,
}

/// One shard: where its bytes are, its size and its index.
pub(crate) struct Shard {
    /// The file, or the object's `s3://` URI (as a path), for messages.
    path: PathBuf,
    len: u64,
    /// A local shard's file when it was indexed: a read checks the open file is still it.
    indexed: Option<cache::FileIdentity>,
    index: ShardIndex,
    /// `None`: the local file at `path`, through the pool of open files.
    object: Option<RemoteObject>,
}

impl Shard {
    /// The object `object`, indexed by `index`.
    pub(crate) fn remote(object: RemoteObject, index: ShardIndex) -> Shard {
        Shard {
            path: PathBuf::from(object.uri()),
            len: object.size(),
            indexed: None,
            index,
            object: Some(object),
        }
    }

    /// The bytes `range` of it, read from its object (`None` for a local shard).
    fn read_object(&self, range: Range<u64>) -> Option<Result<Vec<u8>>> {
        let object = self.object.as_ref()?;
        Some(
            object
                .read_ranges(std::slice::from_ref(&range))
                .map(|mut bytes| bytes.pop().unwrap_or_default()),
        )
    }
}

/// What a set of objects reads through: the cache tier, and its read-ahead thread (none if it
/// could not start: samples are then fetched as read).
pub(crate) struct ThroughCache {
    pub(crate) cache: Arc<ObjectCache>,
    pub(crate) read_ahead: Option<Prefetcher>,
}

/// A set of tar shards in the WebDataset layout, read by random access.
///
/// Sample `i` is found in shard order (shards sorted by file name), then member order inside
/// the shard. Reading takes `&self` and uses positioned reads, so any number of threads can
/// read at once.
pub struct TarShards {
    /// The folder, or the `s3://` prefix (as a path).
    root: PathBuf,
    shards: Vec<Shard>,
    /// The index of each shard's first sample.
    first_samples: Vec<u64>,
    len: u64,
    class_names: Vec<String>,
    stats: TarIndexStats,
    /// What opening found that its user should be told once: members left out, labels past
    /// the class names.
    notices: Vec<String>,
    /// The shards' keys in the pool of open files (one per shard, in order).
    pool_keys: Range<FileKey>,
    /// Objects' shards: what they are read through.
    remote: Option<ThroughCache>,
}

impl Drop for TarShards {
    fn drop(&mut self) {
        FilePool::global().forget(self.pool_keys.clone());
    }
}

impl TarShards {
    /// The folder holding the shards (the `s3://` prefix, as a path, for objects).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The shard files, in sample order.
    pub fn shard_paths(&self) -> impl Iterator<Item = &Path> {
        self.shards.iter().map(|shard| shard.path.as_path())
    }

    /// How the shard indexes were obtained, and how many problems they hold.
    pub fn index_stats(&self) -> TarIndexStats {
        self.stats
    }

    /// The shard holding sample `index` and the sample's position inside it.
    fn locate(&self, index: u64) -> Option<(&Shard, usize)> {
        self.locate_position(index)
            .map(|(position, local)| (&self.shards[position], local))
    }

    /// The position of the shard holding sample `index`, and the sample's inside it.
    fn locate_position(&self, index: u64) -> Option<(usize, usize)> {
        if index >= self.len {
            return None;
        }
        locate_sample(
            &self.first_samples,
            |position| Some(self.shards.get(position)?.index.samples.len()),
            index,
        )
    }

    /// The open file of shard `position`, from the pool or opened now.
    fn shard_file(&self, position: usize, member: &dyn Fn() -> String) -> Result<Arc<PooledFile>> {
        let shard = &self.shards[position];
        let open = || {
            let read_error = |source| Error::ShardRead {
                shard: shard.path.clone(),
                member: member(),
                source,
            };
            File::open(&shard.path)
                .map(PooledFile::plain)
                .map_err(|source| match source.kind() {
                    // Indexed at open, gone now: the dataset changed, not its samples bad.
                    std::io::ErrorKind::NotFound => reopen_error(&shard.path, &shard.path, source),
                    _ => read_error(source),
                })
        };
        FilePool::global().get_or_open(
            self.pool_keys.start + position as u64,
            open,
            failed_for_descriptors,
        )
    }
}

/// The class names of a `classes.txt` holding `text`: one per line, trailing empty lines
/// dropped (labels past them are a notice of the set).
pub(crate) fn parse_class_names(text: &str) -> Vec<String> {
    let names: Vec<String> = text
        .lines()
        .map(|line| line.trim_end_matches('\r').to_string())
        .collect();
    // A trailing empty line is a file ending, not a class.
    let names = match names.iter().rposition(|name| !name.is_empty()) {
        Some(last) => names[..=last].to_vec(),
        None => Vec::new(),
    };
    names
}

/// The shard holding sample `index` of a set whose shards start at `first_samples` (each
/// shard's first sample) and hold `samples(shard)` samples, and the sample's place in it.
fn locate_sample(
    first_samples: &[u64],
    samples: impl Fn(usize) -> Option<usize>,
    index: u64,
) -> Option<(usize, usize)> {
    let position = first_samples
        .partition_point(|first| *first <= index)
        .checked_sub(1)?;
    let local = usize::try_from(index - first_samples[position]).ok()?;
    (local < samples(position)?).then_some((position, local))
}

impl SampleSource for TarShards {
    fn len(&self) -> u64 {
        self.len
    }

    /// The shard's path and the member's whole name (which may hold folders), and the label.
    fn fingerprint_key(&self, index: u64) -> String {
        match self.locate(index) {
            Some((shard, local)) => format!(
                "{}:{}#{}",
                shard.path.to_string_lossy(),
                shard.index.member_name(local),
                shard.index.samples[local].label
            ),
            None => self.describe(index),
        }
    }

    fn label(&self, index: u64) -> i64 {
        match self.locate(index) {
            Some((shard, local)) => shard.index.samples[local].label,
            None => panic!(
                "sample index {index} is out of range for tar shards of {} samples",
                self.len
            ),
        }
    }

    fn describe(&self, index: u64) -> String {
        match self.locate(index) {
            Some((shard, local)) => {
                format!(
                    "{}:{}",
                    shard.path.display(),
                    shard.index.member_name(local)
                )
            }
            None => format!(
                "sample {index} (out of range for the tar shards at {} with {} samples)",
                self.root.display(),
                self.len
            ),
        }
    }

    fn read(&self, index: u64) -> Result<Vec<u8>> {
        let (position, local) = self.locate_position(index).ok_or(Error::IndexOutOfRange {
            index,
            len: self.len,
        })?;
        let shard = &self.shards[position];
        let sample = shard.index.samples[local];
        let member = || shard.index.member_name(local).into_owned();
        let truncated = || Error::TruncatedMember {
            shard: shard.path.clone(),
            member: member(),
            size: sample.size,
            available: shard.len.saturating_sub(sample.data_offset),
        };
        if sample.data_offset.saturating_add(sample.size) > shard.len {
            return Err(truncated());
        }
        if sample.size > crate::MAX_SAMPLE_BYTES {
            return Err(Error::SampleTooLarge {
                what: format!("member {} of tar shard {}", member(), shard.path.display()),
                bytes: sample.size,
            });
        }
        let size = usize::try_from(sample.size).map_err(|_| Error::ShardRead {
            shard: shard.path.clone(),
            member: member(),
            source: std::io::Error::other("member larger than the address space"),
        })?;
        let range = sample.data_offset..sample.data_offset + sample.size;
        if let Some(read) = shard.read_object(range) {
            return read;
        }
        let opened = self.shard_file(position, &member)?;
        let read_error = |source| Error::ShardRead {
            shard: shard.path.clone(),
            member: member(),
            source,
        };
        // Still the file indexed? A shard rewritten in place or replaced (and opened again)
        // would give other bytes at the index's offsets. One fstat per sample read; when only
        // the modification time moved (touch, a copy that does not keep times), the member's
        // own header must still be where the index says, with its size.
        let metadata = opened.file.metadata().map_err(read_error)?;
        if let Some(indexed) = &shard.indexed {
            let now = cache::FileIdentity::of(&metadata);
            let same_file =
                (now.device, now.inode, now.len) == (indexed.device, indexed.inode, indexed.len);
            let in_place = same_file
                && (now.modified == indexed.modified
                    || cache::member_header_holds(&opened.file, sample).map_err(read_error)?);
            if !in_place {
                return Err(Error::FileReplaced {
                    path: shard.path.clone(),
                    opened_len: shard.len,
                    now_len: metadata.len(),
                });
            }
        }
        let mut bytes = vec![0u8; size];
        match opened.file.read_exact_at(&mut bytes, sample.data_offset) {
            Ok(()) => Ok(bytes),
            // The shard shrank after it was indexed: not the dataset the job planned over.
            Err(source) if source.kind() == std::io::ErrorKind::UnexpectedEof => {
                Err(Error::FileChanged {
                    path: shard.path.clone(),
                    opened_len: shard.len,
                    end: sample.data_offset + sample.size,
                })
            }
            Err(source) => Err(Error::ShardRead {
                shard: shard.path.clone(),
                member: member(),
                source,
            }),
        }
    }

    fn class_names(&self) -> &[String] {
        &self.class_names
    }

    /// Members left out or cut short while indexing, and labels past the class names.
    fn notices(&self) -> Vec<String> {
        self.notices.clone()
    }

    fn shard_sizes(&self) -> Option<Vec<u64>> {
        Some(
            self.shards
                .iter()
                .map(|shard| shard.index.samples.len() as u64)
                .collect(),
        )
    }

    /// Objects' samples `indices` are fetched ahead; local shards are read where they lie.
    fn prefetch(&self, indices: &[u64]) {
        let Some(read_ahead) = self.remote.as_ref().and_then(|r| r.read_ahead.as_ref()) else {
            return;
        };
        let mut hint: Hint = Vec::new();
        for &index in indices {
            let Some((shard, local)) = self.locate(index) else {
                continue;
            };
            let Some(listed) = shard.object.as_ref().and_then(|object| object.listed()) else {
                continue;
            };
            let sample = shard.index.samples[local];
            let range = sample.data_offset..sample.data_offset + sample.size;
            match hint
                .iter_mut()
                .find(|(object, _)| object.location == listed.location)
            {
                Some((_, ranges)) => ranges.push(range),
                None => hint.push((listed.clone(), vec![range])),
            }
        }
        read_ahead.hint(hint);
    }

    fn cache_stats(&self) -> Option<CacheStats> {
        self.remote.as_ref().map(|remote| remote.cache.stats())
    }
}

impl std::fmt::Debug for TarShards {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("TarShards")
            .field("root", &self.root)
            .field("shards", &self.shards.len())
            .field("samples", &self.len)
            .field("classes", &self.class_names.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a shard of `samples` complete samples (`.cls` + `.jpg`) keyed under `prefix`.
    fn write_shard(path: &Path, prefix: &str, samples: usize) {
        let mut builder = tar::Builder::new(Vec::new());
        for index in 0..samples {
            for (extension, data) in [
                ("cls", (index % 2).to_string().into_bytes()),
                ("jpg", format!("image {index}").into_bytes()),
            ] {
                let mut header = tar::Header::new_gnu();
                header.set_size(data.len() as u64);
                header.set_mode(0o644);
                builder
                    .append_data(
                        &mut header,
                        format!("{prefix}/{index:04}.{extension}"),
                        data.as_slice(),
                    )
                    .unwrap();
            }
        }
        std::fs::write(path, builder.into_inner().unwrap()).unwrap();
    }

    #[test]
    fn shard_sizes_list_samples_per_shard_and_sum_to_len() {
        let dir = tempfile::tempdir().unwrap();
        write_shard(&dir.path().join("a.tar"), "a", 3);
        write_shard(&dir.path().join("b.tar"), "b", 1);
        write_shard(&dir.path().join("c.tar"), "c", 5);
        let shards = TarShards::open_with_cache_dir(dir.path(), None).unwrap();
        let sizes = shards.shard_sizes().unwrap();
        assert_eq!(sizes, vec![3, 1, 5]);
        assert_eq!(sizes.iter().sum::<u64>(), shards.len());
        // Samples are contiguous per shard in index order.
        assert!(shards.describe(3).contains("b.tar"));
        assert!(shards.describe(4).contains("c.tar"));
    }

    /// A `classes.txt` or an index cache that is no regular file (a named pipe, a link to
    /// `/dev/zero`) is refused or passed over at once: the pipe waited for a writer for good,
    /// the link was read until memory ran out.
    #[test]
    fn files_beside_the_shards_that_are_no_regular_files_end_at_once() {
        let dir = tempfile::tempdir().unwrap();
        write_shard(&dir.path().join("a.tar"), "a", 2);
        let cache = dir
            .path()
            .join(format!("a.tar.{}", crate::files::TAR_INDEX_CACHE_SUFFIX));
        std::os::unix::fs::symlink("/dev/zero", &cache).unwrap();
        let fifo =
            std::ffi::CString::new(dir.path().join(CLASSES_FILE).to_string_lossy().into_owned())
                .unwrap();
        // SAFETY: makes a named pipe at a path of this test's folder.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let started = std::time::Instant::now();
        let error = TarShards::open_with_cache_dir(dir.path(), None)
            .expect_err("a classes.txt that is a pipe is refused")
            .to_string();
        assert!(error.contains("not a regular file"), "{error}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        // Without the pipe, the link is passed over as no cache and the shard scanned.
        std::fs::remove_file(dir.path().join(CLASSES_FILE)).unwrap();
        let shards = TarShards::open_with_cache_dir(dir.path(), None).unwrap();
        assert_eq!(shards.len(), 2);
    }

    /// A shard removed under the job, found gone when the pool opens it again: its samples
    /// were each read as bad (not found) and replaced; the dataset changed, and the job stops.
    #[test]
    fn a_shard_removed_under_the_job_is_a_changed_dataset_not_bad_samples() {
        let dir = tempfile::tempdir().unwrap();
        write_shard(&dir.path().join("a.tar"), "a", 2);
        let shards = TarShards::open_with_cache_dir(dir.path(), None).unwrap();
        assert_eq!(shards.read(0).unwrap(), b"image 0");
        std::fs::remove_file(dir.path().join("a.tar")).unwrap();
        // The pool lets it go (a set of more shards than its budget).
        FilePool::global().forget(shards.pool_keys.clone());
        let error = shards.read(1).unwrap_err();
        assert!(matches!(error, Error::FileRemoved { .. }), "{error:?}");
        assert!(error.dataset_changed() && error.read_fault() != crate::ReadFault::Sample);
        assert!(error.to_string().contains("a.tar"), "{error}");
    }

    #[test]
    fn a_fingerprint_key_names_the_shard_and_the_whole_member() {
        let dir = tempfile::tempdir().unwrap();
        write_shard(&dir.path().join("a.tar"), "train/a", 2);
        let shards = TarShards::open_with_cache_dir(dir.path(), None).unwrap();
        // The member's folder is kept; the fingerprint leaves out the folder shards share.
        let shard = dir.path().join("a.tar");
        assert_eq!(
            shards.fingerprint_key(1),
            format!("{}:train/a/0001.jpg#1", shard.display())
        );
    }
}
