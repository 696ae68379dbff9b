//! The on-disk cache of a shard's index, so a shard's headers are walked once.
//!
//! The cache lives beside the shard as `<shard file name>.stoker-idx`; where that folder cannot
//! be written, under the user cache folder (`$XDG_CACHE_HOME/stoker`, else `~/.cache/stoker`) in
//! a file named after a hash of the shard's absolute path. Either way the file records the
//! shard's absolute path, size and modification time, and is used only when size and time still
//! match (and, in the user cache, the path too).
//!
//! Here too: what identifies a local shard's file while it is read ([`FileIdentity`]), so a
//! shard rewritten or replaced under the job is never read at its old index's offsets.
//!
//! A cache file is untrusted input: magic, version, every length and a trailing checksum are
//! checked before anything is allocated or used, and a file that fails a check is rebuilt.
//!
//! Layout, little-endian:
//!
//! ```text
//! magic "STKTARIX" | version u32 | shard size u64 | mtime seconds i64 | mtime nanoseconds i64
//! | path length u32 | absolute path bytes | problems u64 | samples u64 | name bytes u64
//! | samples x (data offset u64, size u64, label i64, name end u64) | name bytes
//! | FNV-1a 64 checksum of everything before it
//! ```

use std::fs::{File, Metadata};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use tracing::{debug, warn};

use super::scan::{IndexedSample, ShardIndex};

const MAGIC: &[u8; 8] = b"STKTARIX";
/// 2: members `.webp`, `.bmp`, `.tif`, `.tiff`, `.gif`, `.pbm`, `.pgm`, `.ppm` and `.pnm` are
/// images too (version 1 indexed `.jpg`, `.jpeg` and `.png` only, and left out the samples whose
/// image had another extension), so indexes of version 1 are rebuilt. 3: an image whose file
/// name holds a dot before its extension is counted as a problem (version 2 left it out
/// unsaid), and a `.json` member without a label field beside a `.cls` is not (metadata). 4:
/// members whose file name starts with a dot (macOS's AppleDouble `._0001.jpg`) belong to no
/// sample (version 3 took them for members of the sample of key `""` or `dir/`, each ending the
/// sample before it), and a `.json` label that is no integer beside a `.cls` is no problem.
const VERSION: u32 = 4;
/// The extension of cache files.
pub(super) const CACHE_SUFFIX: &str = crate::files::TAR_INDEX_CACHE_SUFFIX;
const SAMPLE_BYTES: u64 = 32;

/// What identifies a shard's content for the cache: where it is, its size and its mtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ShardStamp {
    pub(super) absolute_path: PathBuf,
    pub(super) len: u64,
    pub(super) mtime_seconds: i64,
    pub(super) mtime_nanoseconds: i64,
}

impl ShardStamp {
    /// The stamp of the shard at `absolute_path` with metadata `metadata`.
    pub(super) fn new(absolute_path: PathBuf, metadata: &Metadata) -> ShardStamp {
        ShardStamp {
            absolute_path,
            len: metadata.len(),
            mtime_seconds: metadata.mtime(),
            mtime_nanoseconds: metadata.mtime_nsec(),
        }
    }
}

/// Where the cache of `shard` goes when its folder is writable.
pub(super) fn beside_path(shard: &Path) -> PathBuf {
    let mut name = shard.file_name().unwrap_or_default().to_os_string();
    name.push(".");
    name.push(CACHE_SUFFIX);
    shard.with_file_name(name)
}

/// Where the cache of the shard `stamp` describes goes inside the user cache folder `dir`.
pub(super) fn user_cache_path(dir: &Path, stamp: &ShardStamp) -> PathBuf {
    let hash = fnv1a(stamp.absolute_path.as_os_str().as_bytes());
    dir.join(format!("{hash:016x}.{CACHE_SUFFIX}"))
}

/// FNV-1a, 64 bits: a checksum against torn or damaged files, not against tampering.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Serialises `index` for the shard `stamp` describes.
pub(super) fn encode(stamp: &ShardStamp, index: &ShardIndex) -> Vec<u8> {
    let path = stamp.absolute_path.as_os_str().as_bytes();
    let mut out = Vec::with_capacity(
        64 + path.len() + index.samples.len() * SAMPLE_BYTES as usize + index.names.len(),
    );
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&stamp.len.to_le_bytes());
    out.extend_from_slice(&stamp.mtime_seconds.to_le_bytes());
    out.extend_from_slice(&stamp.mtime_nanoseconds.to_le_bytes());
    out.extend_from_slice(&(path.len() as u32).to_le_bytes());
    out.extend_from_slice(path);
    out.extend_from_slice(&index.problems.to_le_bytes());
    out.extend_from_slice(&(index.samples.len() as u64).to_le_bytes());
    out.extend_from_slice(&(index.names.len() as u64).to_le_bytes());
    for (sample, name_end) in index.samples.iter().zip(&index.name_ends) {
        out.extend_from_slice(&sample.data_offset.to_le_bytes());
        out.extend_from_slice(&sample.size.to_le_bytes());
        out.extend_from_slice(&sample.label.to_le_bytes());
        out.extend_from_slice(&name_end.to_le_bytes());
    }
    out.extend_from_slice(&index.names);
    let checksum = fnv1a(&out);
    out.extend_from_slice(&checksum.to_le_bytes());
    out
}

/// Why a cache file was not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Rejected {
    /// Well formed, but for another version of the shard (or another shard).
    Stale,
    /// Not a cache file this version of Stoker wrote, or damaged.
    Corrupt(&'static str),
}

/// A cursor over untrusted bytes: every read is bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize) -> Result<&'a [u8], Rejected> {
        if count > self.bytes.len() {
            return Err(Rejected::Corrupt("file ends early"));
        }
        let (head, tail) = self.bytes.split_at(count);
        self.bytes = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Rejected> {
        let mut array = [0u8; N];
        array.copy_from_slice(self.take(N)?);
        Ok(array)
    }

    fn u32(&mut self) -> Result<u32, Rejected> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, Rejected> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn i64(&mut self) -> Result<i64, Rejected> {
        Ok(i64::from_le_bytes(self.array()?))
    }
}

/// Parses a cache file and checks it describes the shard `stamp` describes.
///
/// `check_path`: also require the recorded absolute path to match (user cache files, whose
/// names are hashes). A cache beside its shard stays valid when the folder is moved.
pub(super) fn decode(
    bytes: &[u8],
    stamp: &ShardStamp,
    check_path: bool,
) -> Result<ShardIndex, Rejected> {
    let Some(body_len) = bytes.len().checked_sub(8) else {
        return Err(Rejected::Corrupt("file too short"));
    };
    let (body, checksum) = bytes.split_at(body_len);
    let mut reader = Reader { bytes: body };
    if reader.take(MAGIC.len())? != MAGIC {
        return Err(Rejected::Corrupt("not a stoker tar index (bad magic)"));
    }
    if reader.u32()? != VERSION {
        return Err(Rejected::Corrupt("unknown index version"));
    }
    let mut checksum_bytes = [0u8; 8];
    checksum_bytes.copy_from_slice(checksum);
    if u64::from_le_bytes(checksum_bytes) != fnv1a(body) {
        return Err(Rejected::Corrupt("checksum mismatch"));
    }
    let len = reader.u64()?;
    let mtime_seconds = reader.i64()?;
    let mtime_nanoseconds = reader.i64()?;
    let path_len = reader.u32()? as usize;
    let path = reader.take(path_len)?;
    if len != stamp.len
        || mtime_seconds != stamp.mtime_seconds
        || mtime_nanoseconds != stamp.mtime_nanoseconds
        || (check_path && path != stamp.absolute_path.as_os_str().as_bytes())
    {
        return Err(Rejected::Stale);
    }
    let problems = reader.u64()?;
    let samples = reader.u64()?;
    let names_len = reader.u64()?;
    let expected = samples
        .checked_mul(SAMPLE_BYTES)
        .and_then(|table| table.checked_add(names_len));
    if expected != Some(reader.bytes.len() as u64) {
        return Err(Rejected::Corrupt("lengths do not match the file size"));
    }
    // Both fit in memory now: they are bounded by the file's length.
    let samples = samples as usize;
    let mut index = ShardIndex {
        samples: Vec::with_capacity(samples),
        names: Vec::new(),
        name_ends: Vec::with_capacity(samples),
        problems,
    };
    let mut previous_end = 0u64;
    for _ in 0..samples {
        let sample = IndexedSample {
            data_offset: reader.u64()?,
            size: reader.u64()?,
            label: reader.i64()?,
        };
        let name_end = reader.u64()?;
        if name_end < previous_end || name_end > names_len || sample.label < 0 {
            return Err(Rejected::Corrupt("sample table out of order"));
        }
        previous_end = name_end;
        index.samples.push(sample);
        index.name_ends.push(name_end);
    }
    index.names = reader.bytes.to_vec();
    Ok(index)
}

/// The most bytes an index cache is read as: a shard's index holds tens of bytes a sample.
const TAR_INDEX_CACHE_BYTES: u64 = 1 << 30;

/// Loads the cache at `path` if it describes the shard `stamp` describes; logs why not.
pub(super) fn load(path: &Path, stamp: &ShardStamp, check_path: bool) -> Option<ShardIndex> {
    let bytes = match crate::files::read_small_file(path, TAR_INDEX_CACHE_BYTES) {
        Ok(bytes) => bytes,
        Err(source) if source.kind() == std::io::ErrorKind::NotFound => return None,
        Err(source) => {
            debug!(cache = %path.display(), error = %source, "cannot read tar index cache");
            return None;
        }
    };
    match decode(&bytes, stamp, check_path) {
        Ok(index) => Some(index),
        Err(Rejected::Stale) => {
            debug!(cache = %path.display(), "tar index cache is stale; rebuilding");
            None
        }
        Err(Rejected::Corrupt(why)) => {
            warn!(cache = %path.display(), problem = why, "corrupt tar index cache; rebuilding");
            None
        }
    }
}

/// Writes `bytes` to `path` through a temporary file in the same folder and a rename, so a
/// reader never sees half a cache.
pub(super) fn store(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut temporary_name = path.file_name().unwrap_or_default().to_os_string();
    temporary_name.push(format!(".tmp-{}", std::process::id()));
    let temporary = path.with_file_name(temporary_name);
    let written = std::fs::File::create(&temporary)
        .and_then(|mut file| file.write_all(bytes))
        .and_then(|()| std::fs::rename(&temporary, path));
    if written.is_err() {
        // Best effort: the temporary may not exist.
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

/// Caches a freshly built index beside its shard, else in the user cache; failing both, keeps
/// it in memory only (with a warning: the next open walks the headers again).
pub(super) fn save_index(
    beside: &Path,
    in_user_cache: Option<&Path>,
    stamp: &ShardStamp,
    index: &ShardIndex,
) {
    let bytes = encode(stamp, index);
    let beside_error = match store(beside, &bytes) {
        Ok(()) => return,
        Err(error) => error,
    };
    debug!(cache = %beside.display(), error = %beside_error, "cannot cache tar index beside its shard");
    let Some(user_cache) = in_user_cache else {
        warn!(shard = %stamp.absolute_path.display(), error = %beside_error, "cannot cache tar index; it will be rebuilt next time");
        return;
    };
    let stored = match user_cache.parent() {
        Some(dir) => std::fs::create_dir_all(dir).and_then(|()| store(user_cache, &bytes)),
        None => store(user_cache, &bytes),
    };
    if let Err(error) = stored {
        warn!(
            shard = %stamp.absolute_path.display(),
            cache = %user_cache.display(),
            error = %error,
            "cannot cache tar index; it will be rebuilt next time"
        );
    }
}

/// What identifies a local shard's file: its device and inode, length and modification time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileIdentity {
    pub(super) device: u64,
    pub(super) inode: u64,
    pub(super) len: u64,
    pub(super) modified: (i64, i64),
}

impl FileIdentity {
    pub(super) fn of(metadata: &std::fs::Metadata) -> FileIdentity {
        FileIdentity {
            device: metadata.dev(),
            inode: metadata.ino(),
            len: metadata.len(),
            modified: (metadata.mtime(), metadata.mtime_nsec()),
        }
    }
}

/// Whether the 512-byte block before `sample`'s data in `file` is a valid tar header (its
/// checksum holds) of a member of `sample`'s size: the member is still where it was indexed.
pub(super) fn member_header_holds(file: &File, sample: IndexedSample) -> std::io::Result<bool> {
    let Some(at) = sample.data_offset.checked_sub(512) else {
        return Ok(false);
    };
    let mut block = [0u8; 512];
    file.read_exact_at(&mut block, at)?;
    let header = tar::Header::from_byte_slice(&block);
    let sum: u32 = block
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                u32::from(b' ')
            } else {
                u32::from(b)
            }
        })
        .sum();
    Ok(header.cksum().is_ok_and(|recorded| recorded == sum)
        && header.entry_size().is_ok_and(|size| size == sample.size))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp() -> ShardStamp {
        ShardStamp {
            absolute_path: PathBuf::from("/data/shard-000000.tar"),
            len: 10_240,
            mtime_seconds: 1_700_000_000,
            mtime_nanoseconds: 5,
        }
    }

    fn index() -> ShardIndex {
        ShardIndex::of(2, &[("0.jpg", 512, 100, 0), ("1.png", 1536, 100, 1)])
    }

    #[test]
    fn round_trips() {
        let bytes = encode(&stamp(), &index());
        assert_eq!(decode(&bytes, &stamp(), true), Ok(index()));
    }

    #[test]
    fn another_size_time_or_path_is_stale() {
        let bytes = encode(&stamp(), &index());
        let mut other = stamp();
        other.len += 1;
        assert_eq!(decode(&bytes, &other, false), Err(Rejected::Stale));
        let mut other = stamp();
        other.mtime_nanoseconds += 1;
        assert_eq!(decode(&bytes, &other, false), Err(Rejected::Stale));
        let mut other = stamp();
        other.absolute_path = PathBuf::from("/elsewhere/shard-000000.tar");
        assert_eq!(decode(&bytes, &other, true), Err(Rejected::Stale));
        assert!(decode(&bytes, &other, false).is_ok());
    }

    #[test]
    fn every_truncation_and_bit_flip_is_rejected() {
        let bytes = encode(&stamp(), &index());
        for cut in 0..bytes.len() {
            assert!(
                decode(&bytes[..cut], &stamp(), true).is_err(),
                "cut at {cut}"
            );
        }
        for position in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[position] ^= 0x10;
            assert!(
                decode(&damaged, &stamp(), true).is_err(),
                "flip at {position}"
            );
        }
    }
}
