//! One MDS shard: where its bytes are (a raw file, a compressed one decompressed into the cache
//! tier, or an object's copy there) and its header, checked against the index.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::mds_error;
use crate::error::{Error, Result};
use crate::same_file::SameFile;
use crate::storage::{self, CachedObject, DerivedSource, ObjectCacheOptions, Remake};

/// One shard: where it is read from and its samples' offsets.
pub(super) struct Shard {
    /// The file the index names (the compressed one, when compressed; an object's `s3://`
    /// URI), for messages.
    pub(super) path: PathBuf,
    /// The local file read: `path`, its decompressed copy, or the object's copy in the cache.
    pub(super) read_from: PathBuf,
    /// The samples' byte offsets, `n + 1` of them.
    pub(super) offsets: Vec<u32>,
    /// The file read from as it was opened: its device, inode and length.
    identity: SameFile,
    /// The copy in the cache tier: let go of after the header is read (a descriptor a shard
    /// would keep a set of more shards than the descriptor limit from opening; a derived
    /// copy's room under the cap is kept).
    pub(super) _copy: Option<CachedObject>,
    /// How the copy is made or fetched again once evicted (`storage/remake.rs`).
    remake: Option<Remake>,
}

/// Where a shard's bytes are, before its header is read.
pub(super) struct ShardFile {
    /// The name in messages.
    pub(super) path: PathBuf,
    /// The local file holding the shard's bytes, uncompressed.
    pub(super) read_from: PathBuf,
    /// What keeps `read_from` in the cache tier, when it lies there.
    pub(super) copy: Option<CachedObject>,
    /// How that copy is made again once evicted, when it may be let go of.
    pub(super) remake: Option<Remake>,
}

/// The file name `info` (`raw_data` or `zip_data`) gives, checked to lie inside the folder: a
/// file name, or a path below it (`0/shard.00000.mds`, as Streaming's `merge_index` writes for
/// sets converted in parts); never `..`, `.` or an absolute path.
pub(super) fn basename<'a>(info: &'a Value, path: &Path) -> Result<Option<&'a str>> {
    if info.is_null() {
        return Ok(None);
    }
    let name = info
        .get("basename")
        .and_then(Value::as_str)
        .ok_or_else(|| mds_error(path, "a shard's file has no basename"))?;
    let below = !name.is_empty()
        && Path::new(name)
            .components()
            .all(|part| matches!(part, std::path::Component::Normal(_)));
    if !below {
        return Err(mds_error(
            path,
            format!("shard file {name:?} is not a file name inside the folder"),
        ));
    }
    Ok(Some(name))
}

/// Decompresses the local file `source`, compressed by `compression` (`zstd`, `gz`; a `:level`
/// suffix ignored), into `out`; errors name `name`.
pub(super) fn decompress(
    compression: &str,
    source: &Path,
    name: &Path,
    out: &mut dyn std::io::Write,
) -> Result<()> {
    let file = File::open(source).map_err(|error| Error::io(name, error))?;
    let input = std::io::BufReader::new(file);
    let algorithm = compression.split(':').next().unwrap_or_default();
    let mut reader: Box<dyn std::io::Read> = match algorithm {
        "zstd" => Box::new(
            zstd::stream::read::Decoder::with_buffer(input)
                .map_err(|error| Error::io(name, error))?,
        ),
        "gz" => Box::new(flate2::read::MultiGzDecoder::new(input)),
        other => {
            return Err(mds_error(
                name,
                format!("compression {other:?} is not read (zstd and gz are)"),
            ))
        }
    };
    std::io::copy(&mut reader, out).map_err(|error| Error::Decompress {
        path: name.to_path_buf(),
        source: error,
    })?;
    Ok(())
}

/// Reads exactly `buf.len()` bytes at `offset` of `file` (named `path`); a short file is an
/// error naming it.
pub(super) fn read_exact_at(file: &File, path: &Path, buf: &mut [u8], offset: u64) -> Result<()> {
    file.read_exact_at(buf, offset).map_err(|error| {
        if error.kind() == std::io::ErrorKind::UnexpectedEof {
            mds_error(
                path,
                format!(
                    "the shard ends before byte {} (it is cut short)",
                    offset + buf.len() as u64
                ),
            )
        } else {
            Error::io(path, error)
        }
    })
}

/// The shard's sample count and its file name in `index.json`'s `entry` (at `index_path`):
/// the raw file's, the compressed one's, and the compression.
pub(super) struct ShardEntry<'a> {
    pub(super) samples: u64,
    pub(super) raw: Option<&'a str>,
    pub(super) zip: Option<&'a str>,
    pub(super) compression: String,
}

impl<'a> ShardEntry<'a> {
    pub(super) fn of(entry: &'a Value, index_path: &Path) -> Result<ShardEntry<'a>> {
        let samples = entry
            .get("samples")
            .and_then(Value::as_u64)
            .ok_or_else(|| mds_error(index_path, "a shard has no sample count"))?;
        let raw = basename(entry.get("raw_data").unwrap_or(&Value::Null), index_path)?;
        let zip = basename(entry.get("zip_data").unwrap_or(&Value::Null), index_path)?;
        if raw.is_none() && zip.is_none() {
            return Err(mds_error(index_path, "a shard names no file"));
        }
        let compression = entry
            .get("compression")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        Ok(ShardEntry {
            samples,
            raw,
            zip,
            compression,
        })
    }
}

/// The local file of the shard `entry` describes in the folder `root`: its raw file when it is
/// there, else its compressed file decompressed once into the cache tier of `options`.
pub(super) fn local_shard_file(
    root: &Path,
    entry: &ShardEntry<'_>,
    options: &dyn Fn() -> Result<ObjectCacheOptions>,
) -> Result<ShardFile> {
    match (entry.raw.map(|name| root.join(name)), entry.zip) {
        (Some(raw), _) if raw.is_file() => {
            crate::referenced_files::check_data_file(&raw)?;
            Ok(ShardFile {
                path: raw.clone(),
                read_from: raw,
                copy: None,
                remake: None,
            })
        }
        (_, Some(zip)) => {
            let zip = root.join(zip);
            crate::referenced_files::check_data_file(&zip)?;
            let source = DerivedSource::new(&zip, &options()?, "decompressed")?;
            let remake = decompressed(source, &entry.compression, &zip);
            let copy = remake.copy()?;
            Ok(ShardFile {
                read_from: copy.path().to_path_buf(),
                path: zip,
                copy: Some(copy),
                remake: Some(remake),
            })
        }
        (raw, None) => Err(Error::io(
            raw.unwrap_or_else(|| root.to_path_buf()),
            std::io::ErrorKind::NotFound.into(),
        )),
    }
}

/// How the copy of a shard compressed by `compression` (named `path` in errors) is made
/// from `source`.
pub(super) fn decompressed(source: DerivedSource, compression: &str, path: &Path) -> Remake {
    let (compression, path) = (compression.to_string(), path.to_path_buf());
    Remake::derived(source, move |file, out| {
        decompress(&compression, file, &path, out)
    })
}

impl Shard {
    /// Reads the header of the shard in `file`, checking it against the `samples` the index
    /// gives.
    pub(super) fn open(shard: ShardFile, samples: u64) -> Result<Shard> {
        let ShardFile {
            path,
            read_from,
            mut copy,
            remake,
        } = shard;
        let file = File::open(&read_from).map_err(|error| Error::io(&path, error))?;
        let metadata = file.metadata().map_err(|error| Error::io(&path, error))?;
        let bytes = metadata.len();
        let mut word = [0u8; 4];
        read_exact_at(&file, &path, &mut word, 0)?;
        let count = u64::from(u32::from_le_bytes(word));
        if count != samples {
            return Err(mds_error(
                &path,
                format!("the shard holds {count} samples but index.json says {samples}"),
            ));
        }
        let table = (count + 1) * 4;
        if 4 + table > bytes {
            return Err(mds_error(
                &path,
                format!("the shard's {count} sample offsets run past its {bytes} bytes"),
            ));
        }
        let mut raw_offsets = vec![0u8; table as usize];
        read_exact_at(&file, &path, &mut raw_offsets, 4)?;
        let offsets: Vec<u32> = raw_offsets
            .chunks_exact(4)
            .map(|word| u32::from_le_bytes([word[0], word[1], word[2], word[3]]))
            .collect();
        let ascending = offsets.windows(2).all(|pair| pair[0] <= pair[1]);
        let first = u64::from(offsets[0]);
        let last = u64::from(offsets[offsets.len() - 1]);
        if !ascending || first < 4 + table || last > bytes {
            return Err(mds_error(
                &path,
                format!(
                    "its sample offsets run from {first} to {last}{} in a file of {bytes} bytes \
                     whose header ends at {}",
                    if ascending {
                        ""
                    } else {
                        ", backwards in places,"
                    },
                    4 + table
                ),
            ));
        }
        if let (Some(copy), Some(_)) = (&mut copy, &remake) {
            copy.release_lock();
        }
        Ok(Shard {
            path,
            read_from,
            offsets,
            identity: SameFile::of(&metadata),
            _copy: copy,
            remake,
        })
    }

    /// Refuses `file` (the shard opened again to read it, by its path) when it is not the file
    /// opened with the dataset: another file put in its place (a conversion or a copy written
    /// beside it and renamed over it, as rsync does), or one of another length; the offsets
    /// read at open would point into other bytes, other samples read under the labels read
    /// then. The job stops, naming the file; never bad samples replaced. Its modification time
    /// is not compared (shards touched to keep a scratch purge away are the same; but for a
    /// compressed shard whose copy must be made again, see [`Remake::open_again`]); a
    /// shard rewritten in place at the same length is not told.
    ///
    /// A copy that can be had again is checked by its length ([`Remake::check_copy`]).
    pub(super) fn check_unchanged(&self, file: &File) -> Result<()> {
        match self.remake {
            Some(_) => Remake::check_copy(file, &self.read_from, self.identity.len()),
            None => self.identity.check(file, &self.path),
        }
    }

    /// The shard's file opened again to read it: `read_from`, or, when that copy was evicted
    /// from the cache tier, the copy made or fetched again from its source as it was when the
    /// set was opened ([`Remake::open_again`]: a source changed since stops the job, naming
    /// it).
    pub(super) fn open_again(&self) -> Result<File> {
        storage::open_again(self.remake.as_ref(), &self.path, &self.read_from)
    }

    /// The version of the bytes the shard is read as: the file read, its length and its
    /// modification time in nanoseconds. A copy that can be had again is named by its path
    /// (which holds its source's version when the set was opened) and its length then:
    /// its own time changes when it is made again, and it may be evicted meanwhile.
    pub(super) fn version(&self) -> Result<(&Path, u64, u128)> {
        if self.remake.is_some() {
            return Ok((&self.read_from, self.identity.len(), 0));
        }
        let metadata = std::fs::metadata(&self.read_from)
            .map_err(|error| Error::io(&self.read_from, error))?;
        let modified = metadata
            .modified()
            .ok()
            .and_then(|time| time.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |since| since.as_nanos());
        Ok((&self.read_from, metadata.len(), modified))
    }
}
