//! `MdsDataset`: Mosaic Streaming's MDS shards read in place: a folder holding `index.json` and
//! the `shard.NNNNN.mds` files it lists (or `shard.NNNNN.mds.zstd` / `.gz`, decompressed once
//! into the cache tier, as compressed JSONL files are).
//!
//! The layout, as Streaming's `MDSWriter` writes it (little-endian):
//! - `index.json`: `{"version": 2, "shards": [...]}`, each shard `{"format": "mds", "version": 2,
//!   "column_names", "column_encodings", "column_sizes" (a fixed size or null per column),
//!   "samples", "compression" (null, `zstd[:level]`, `gz[:level]`...), "raw_data": {"basename",
//!   "bytes"}, "zip_data": {"basename", "bytes"} or null}`;
//! - a shard: the sample count `n` (`u32`), `n + 1` byte offsets of the samples in the file
//!   (`u32`, the last the end of the last sample), the writer's configuration as JSON text, then
//!   the samples; a sample is the sizes (`u32`) of its columns without a fixed size, in column
//!   order, then the columns' bytes end to end.
//!
//! The sample column is the one named, else the first of `image`, `jpg`, `jpeg`, `png`, `img`
//! whose encoding is an image's, else the first column encoded `jpeg`, `png` or `pil`, else
//! `text` (encoded `str`). Its bytes are the sample: `jpeg`, `png` and `bytes` as they are; `pil`
//! (raw pixels after a width, height and mode header) becomes a binary PPM (mode `RGB`) or PGM
//! (`L`) of the same pixels, which the decoder reads; other modes are bad samples. Labels come
//! from the column named, else `label`, else `cls`, encoded `int`, `str_int` or a numpy integer
//! scalar (`uint8`..`int64`), read once at open; class names are the labels' numbers. A shard
//! cut short, offsets that run backwards or past the file, or a sample count other than its
//! index says is an error naming the shard.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde_json::Value;
use tracing::info;

use crate::error::{Error, Result};
use crate::file_pool::{is_out_of_descriptors, FileKey, FilePool, PooledFile};
use crate::sample_source::{numbered_class_names, SampleSource};
use crate::storage::{derived_copy, CachedObject, ObjectCacheOptions};

#[cfg(test)]
mod tests;
mod writer;

pub use writer::{write_mds, MdsColumn};

/// The file that makes a folder an MDS dataset.
pub const MDS_INDEX_FILE: &str = "index.json";

/// Image column names looked for, in order, when none is named.
const IMAGE_COLUMN_NAMES: [&str; 5] = ["image", "jpg", "jpeg", "png", "img"];

/// Whether `path` is a folder holding an MDS `index.json` (its shards' format `mds`).
pub fn looks_like_mds(path: &Path) -> bool {
    let index = path.join(MDS_INDEX_FILE);
    index.is_file()
        && std::fs::read(&index)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
            .and_then(|json| {
                let format = json.get("shards")?.get(0)?.get("format")?.as_str()?;
                Some(format == "mds")
            })
            .unwrap_or(false)
}

/// The columns read from an MDS dataset (`None`: picked by name, see the module doc).
#[derive(Debug, Clone, Default)]
pub struct MdsOptions {
    /// The column holding the samples.
    pub sample_column: Option<String>,
    /// The column holding the labels.
    pub label_column: Option<String>,
}

/// How a column's bytes are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    /// `bytes`, `jpeg`, `png`: the bytes as they are.
    Bytes,
    /// `pil`: raw pixels after a header.
    Pil,
    /// `str`: UTF-8 text.
    Str,
    /// `int` (int64), or a numpy integer scalar of `size` bytes.
    Integer { size: usize, signed: bool },
    /// `str_int`: an integer written as text.
    StrInt,
    /// Anything else (floats, `json`, `ndarray`, `pkl`...): not read.
    Other,
}

impl Encoding {
    fn of(name: &str) -> Encoding {
        match name {
            "bytes" | "jpeg" | "png" => Encoding::Bytes,
            "pil" => Encoding::Pil,
            "str" => Encoding::Str,
            "int" | "int64" => Encoding::Integer {
                size: 8,
                signed: true,
            },
            "int8" => Encoding::Integer {
                size: 1,
                signed: true,
            },
            "int16" => Encoding::Integer {
                size: 2,
                signed: true,
            },
            "int32" => Encoding::Integer {
                size: 4,
                signed: true,
            },
            "uint8" => Encoding::Integer {
                size: 1,
                signed: false,
            },
            "uint16" => Encoding::Integer {
                size: 2,
                signed: false,
            },
            "uint32" => Encoding::Integer {
                size: 4,
                signed: false,
            },
            "uint64" => Encoding::Integer {
                size: 8,
                signed: false,
            },
            "str_int" => Encoding::StrInt,
            _ => Encoding::Other,
        }
    }
}

/// One column of the dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Column {
    name: String,
    encoding_name: String,
    encoding: Encoding,
    /// Its size when every sample's is the same (`column_sizes`).
    fixed: Option<u32>,
}

/// One shard: where it is read from and its samples' offsets.
struct Shard {
    /// The file the index names (the compressed one, when compressed), for messages.
    path: PathBuf,
    /// The file read: `path`, or its decompressed copy.
    read_from: PathBuf,
    /// The samples' byte offsets, `n + 1` of them.
    offsets: Vec<u32>,
    /// The decompressed copy in the cache tier, locked while the shard is read.
    _copy: Option<CachedObject>,
}

/// An MDS dataset: sample `i` is the `i`-th sample over the shards in index order.
pub struct MdsDataset {
    root: PathBuf,
    columns: Vec<Column>,
    shards: Vec<Shard>,
    first_samples: Vec<u64>,
    len: u64,
    sample_column: usize,
    labels: Vec<i64>,
    class_names: Vec<String>,
    pool_keys: Range<FileKey>,
}

impl Drop for MdsDataset {
    fn drop(&mut self) {
        FilePool::global().forget(self.pool_keys.clone());
    }
}

fn mds_error(path: &Path, problem: impl Into<String>) -> Error {
    Error::Mds {
        path: path.to_path_buf(),
        problem: problem.into(),
    }
}

/// The columns a shard's entry in `index.json` (at `path`) declares.
fn shard_columns(entry: &Value, path: &Path) -> Result<Vec<Column>> {
    let list = |key: &str| {
        entry
            .get(key)
            .and_then(Value::as_array)
            .ok_or_else(|| mds_error(path, format!("a shard has no {key:?} list")))
    };
    let names = list("column_names")?;
    let encodings = list("column_encodings")?;
    let sizes = list("column_sizes")?;
    if names.len() != encodings.len() || names.len() != sizes.len() || names.is_empty() {
        return Err(mds_error(
            path,
            "a shard's column names, encodings and sizes differ in number",
        ));
    }
    let mut columns = Vec::with_capacity(names.len());
    for ((name, encoding), size) in names.iter().zip(encodings).zip(sizes) {
        let (Some(name), Some(encoding_name)) = (name.as_str(), encoding.as_str()) else {
            return Err(mds_error(path, "a column name or encoding is not a string"));
        };
        let fixed = match size {
            Value::Null => None,
            size => Some(
                size.as_u64()
                    .and_then(|size| u32::try_from(size).ok())
                    .ok_or_else(|| mds_error(path, format!("column {name}'s size is {size}")))?,
            ),
        };
        columns.push(Column {
            name: name.to_string(),
            encoding_name: encoding_name.to_string(),
            encoding: Encoding::of(encoding_name),
            fixed,
        });
    }
    Ok(columns)
}

/// The file name `info` (`raw_data` or `zip_data`) gives, checked to be a plain file name.
fn basename<'a>(info: &'a Value, path: &Path) -> Result<Option<&'a str>> {
    if info.is_null() {
        return Ok(None);
    }
    let name = info
        .get("basename")
        .and_then(Value::as_str)
        .ok_or_else(|| mds_error(path, "a shard's file has no basename"))?;
    let mut parts = Path::new(name).components();
    match (parts.next(), parts.next()) {
        (Some(std::path::Component::Normal(_)), None) => Ok(Some(name)),
        _ => Err(mds_error(
            path,
            format!("shard file {name:?} is not a file name inside the folder"),
        )),
    }
}

/// Decompresses `source`, compressed by `compression` (`zstd`, `gz`; a `:level` suffix
/// ignored), into `out`.
fn decompress(compression: &str, source: &Path, out: &mut dyn std::io::Write) -> Result<()> {
    let file = File::open(source).map_err(|error| Error::io(source, error))?;
    let input = std::io::BufReader::new(file);
    let algorithm = compression.split(':').next().unwrap_or_default();
    let mut reader: Box<dyn std::io::Read> = match algorithm {
        "zstd" => Box::new(
            zstd::stream::read::Decoder::with_buffer(input)
                .map_err(|error| Error::io(source, error))?,
        ),
        "gz" => Box::new(flate2::read::MultiGzDecoder::new(input)),
        other => {
            return Err(mds_error(
                source,
                format!("compression {other:?} is not read (zstd and gz are)"),
            ))
        }
    };
    std::io::copy(&mut reader, out).map_err(|error| Error::Decompress {
        path: source.to_path_buf(),
        source: error,
    })?;
    Ok(())
}

/// Reads exactly `buf.len()` bytes at `offset` of `file` (named `path`); a short file is an
/// error naming it.
fn read_exact_at(file: &File, path: &Path, buf: &mut [u8], offset: u64) -> Result<()> {
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

impl Shard {
    /// Opens the shard of `entry` in `root`, checking its header against the `samples` the
    /// index gives.
    fn open(
        root: &Path,
        entry: &Value,
        index_path: &Path,
        options: &dyn Fn() -> Result<ObjectCacheOptions>,
    ) -> Result<Shard> {
        let samples = entry
            .get("samples")
            .and_then(Value::as_u64)
            .ok_or_else(|| mds_error(index_path, "a shard has no sample count"))?;
        let raw = basename(entry.get("raw_data").unwrap_or(&Value::Null), index_path)?;
        let zip = basename(entry.get("zip_data").unwrap_or(&Value::Null), index_path)?;
        let (path, read_from, copy) = match (raw.map(|name| root.join(name)), zip) {
            (Some(raw), _) if raw.is_file() => (raw.clone(), raw, None),
            (_, Some(zip)) => {
                let zip = root.join(zip);
                let compression = entry
                    .get("compression")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let copy = derived_copy(&options()?, &zip, "decompressed", &|source, out| {
                    decompress(&compression, source, out)
                })?;
                let read_from = copy.path().to_path_buf();
                (zip, read_from, Some(copy))
            }
            (Some(raw), None) => return Err(Error::io(&raw, std::io::ErrorKind::NotFound.into())),
            (None, None) => return Err(mds_error(index_path, "a shard names no file")),
        };
        let file = File::open(&read_from).map_err(|error| Error::io(&path, error))?;
        let bytes = file
            .metadata()
            .map_err(|error| Error::io(&path, error))?
            .len();
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
        Ok(Shard {
            path,
            read_from,
            offsets,
            _copy: copy,
        })
    }
}

impl MdsDataset {
    /// Opens the MDS folder `root` with the columns `options` names; compressed shards are
    /// decompressed into the cache tier that [`ObjectCacheOptions::from_env`] configures.
    pub fn open(root: &Path, options: &MdsOptions) -> Result<MdsDataset> {
        Self::open_with_cache(root, options, &ObjectCacheOptions::from_env)
    }

    /// Like [`MdsDataset::open`], with the cache tier's options given by `cache` (called for
    /// each compressed shard).
    pub fn open_with_cache(
        root: &Path,
        options: &MdsOptions,
        cache: &dyn Fn() -> Result<ObjectCacheOptions>,
    ) -> Result<MdsDataset> {
        let started = std::time::Instant::now();
        let index_path = root.join(MDS_INDEX_FILE);
        let text = std::fs::read(&index_path).map_err(|error| Error::io(&index_path, error))?;
        let index: Value = serde_json::from_slice(&text).map_err(|source| Error::Manifest {
            path: index_path.clone(),
            source,
        })?;
        let entries = index
            .get("shards")
            .and_then(Value::as_array)
            .filter(|shards| !shards.is_empty())
            .ok_or_else(|| mds_error(&index_path, "no \"shards\" list, or an empty one"))?;
        let mut columns = None;
        for entry in entries {
            let format = entry.get("format").and_then(Value::as_str);
            let version = entry.get("version").and_then(Value::as_u64);
            if format != Some("mds") || version != Some(2) {
                return Err(mds_error(
                    &index_path,
                    format!(
                        "a shard of format {format:?}, version {version:?}: MDS version 2 is read"
                    ),
                ));
            }
            let these = shard_columns(entry, &index_path)?;
            match &columns {
                None => columns = Some(these),
                Some(first) if *first != these => {
                    return Err(mds_error(&index_path, "its shards' columns differ"))
                }
                Some(_) => {}
            }
        }
        let columns = columns.unwrap_or_default();
        let shards: Vec<Shard> = entries
            .iter()
            .map(|entry| Shard::open(root, entry, &index_path, cache))
            .collect::<Result<_>>()?;
        let sample_column = pick_sample_column(&columns, options, &index_path)?;
        let label_column = pick_label_column(&columns, options, &index_path)?;
        let mut first_samples = Vec::with_capacity(shards.len());
        let mut len = 0u64;
        for shard in &shards {
            first_samples.push(len);
            len += shard.offsets.len() as u64 - 1;
        }
        if len == 0 {
            return Err(mds_error(&index_path, "its shards hold no sample"));
        }
        let mut dataset = MdsDataset {
            root: root.to_path_buf(),
            pool_keys: FilePool::global().reserve_keys(shards.len()),
            columns,
            shards,
            first_samples,
            len,
            sample_column,
            labels: Vec::new(),
            class_names: Vec::new(),
        };
        if let Some(column) = label_column {
            dataset.labels = (0..len)
                .into_par_iter()
                .map(|index| dataset.read_label(index, column))
                .collect::<Result<_>>()?;
            let max = dataset.labels.iter().copied().max();
            dataset.class_names = numbered_class_names(root, max)?;
        }
        info!(
            root = %root.display(),
            shards = dataset.shards.len(),
            samples = len,
            sample_column = %dataset.columns[sample_column].name,
            labels = label_column.map(|c| dataset.columns[c].name.as_str()).unwrap_or("none"),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "opened mds dataset"
        );
        Ok(dataset)
    }

    /// The folder opened.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The shard of sample `index`, the sample's place in it, and the shard's pool key.
    fn locate(&self, index: u64) -> Option<(&Shard, usize, FileKey)> {
        if index >= self.len {
            return None;
        }
        let shard = self
            .first_samples
            .partition_point(|first| *first <= index)
            .checked_sub(1)?;
        let local = usize::try_from(index - self.first_samples[shard]).ok()?;
        Some((
            &self.shards[shard],
            local,
            self.pool_keys.start + shard as u64,
        ))
    }

    /// The bytes of column `column` of sample `index`.
    fn column_bytes(&self, index: u64, column: usize) -> Result<(Vec<u8>, &Shard, usize)> {
        let (shard, local, key) = self.locate(index).ok_or(Error::IndexOutOfRange {
            index,
            len: self.len,
        })?;
        let pooled = FilePool::global()
            .get_or_open(
                key,
                || File::open(&shard.read_from).map(PooledFile::plain),
                is_out_of_descriptors,
            )
            .map_err(|error| Error::io(&shard.path, error))?;
        let begin = u64::from(shard.offsets[local]);
        let end = u64::from(shard.offsets[local + 1]);
        let sample_error =
            |problem: String| mds_error(&shard.path, format!("sample {local}: {problem}"));
        let variable = self.columns.iter().filter(|c| c.fixed.is_none()).count();
        let head = variable as u64 * 4;
        if begin + head > end {
            return Err(sample_error(format!(
                "its {end_minus} bytes hold no sizes for its {variable} columns of no fixed size",
                end_minus = end - begin
            )));
        }
        let mut sizes_bytes = vec![0u8; head as usize];
        read_exact_at(&pooled.file, &shard.path, &mut sizes_bytes, begin)?;
        let mut sizes = sizes_bytes
            .chunks_exact(4)
            .map(|word| u64::from(u32::from_le_bytes([word[0], word[1], word[2], word[3]])));
        let mut at = begin + head;
        let mut wanted = 0..0;
        for (k, each) in self.columns.iter().enumerate() {
            let size = match each.fixed {
                Some(size) => u64::from(size),
                None => sizes.next().unwrap_or(0),
            };
            if k == column {
                wanted = at..at + size;
            }
            at += size;
        }
        if at != end {
            return Err(sample_error(format!(
                "its columns take {} bytes, but it has {}",
                at - begin,
                end - begin
            )));
        }
        let mut bytes = vec![0u8; (wanted.end - wanted.start) as usize];
        read_exact_at(&pooled.file, &shard.path, &mut bytes, wanted.start)?;
        Ok((bytes, shard, local))
    }

    /// The label of sample `index`, from column `column`.
    fn read_label(&self, index: u64, column: usize) -> Result<i64> {
        let (bytes, shard, local) = self.column_bytes(index, column)?;
        let each = &self.columns[column];
        let label = match each.encoding {
            Encoding::Integer { size, signed } if bytes.len() == size => {
                let mut word = [0u8; 8];
                word[..size].copy_from_slice(&bytes);
                if signed && bytes[size - 1] & 0x80 != 0 {
                    word[size..].fill(0xff);
                }
                let value = i64::from_le_bytes(word);
                (signed || value >= 0).then_some(value)
            }
            Encoding::StrInt => std::str::from_utf8(&bytes)
                .ok()
                .and_then(|text| text.trim().parse().ok()),
            _ => None,
        };
        label.ok_or_else(|| {
            mds_error(
                &shard.path,
                format!(
                    "sample {local}: label column {} ({}) holds {} bytes that are no label",
                    each.name,
                    each.encoding_name,
                    bytes.len()
                ),
            )
        })
    }
}

/// The column whose bytes are the samples (see the module doc).
fn pick_sample_column(columns: &[Column], options: &MdsOptions, index: &Path) -> Result<usize> {
    let readable =
        |c: &Column| matches!(c.encoding, Encoding::Bytes | Encoding::Pil | Encoding::Str);
    let find = |name: &str| columns.iter().position(|c| c.name == name);
    let names = || {
        columns
            .iter()
            .map(|c| format!("{} ({})", c.name, c.encoding_name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(name) = &options.sample_column {
        let k = find(name).ok_or_else(|| {
            mds_error(
                index,
                format!("has no column {name:?}; its columns: {}", names()),
            )
        })?;
        if !readable(&columns[k]) {
            return Err(mds_error(
                index,
                format!(
                    "column {name:?} is encoded {}: samples are read from bytes, jpeg, png, pil \
                     or str columns",
                    columns[k].encoding_name
                ),
            ));
        }
        return Ok(k);
    }
    let image = |c: &Column| matches!(c.encoding_name.as_str(), "jpeg" | "png" | "pil" | "bytes");
    IMAGE_COLUMN_NAMES
        .iter()
        .find_map(|name| find(name).filter(|&k| image(&columns[k])))
        .or_else(|| {
            columns
                .iter()
                .position(|c| matches!(c.encoding_name.as_str(), "jpeg" | "png" | "pil"))
        })
        .or_else(|| find("text").filter(|&k| columns[k].encoding == Encoding::Str))
        .ok_or_else(|| {
            mds_error(
                index,
                format!(
                    "has no image column (image, jpg, png, or one encoded jpeg, png or pil) nor \
                     a text column; its columns: {}",
                    names()
                ),
            )
        })
}

/// The label column, if any (see the module doc).
fn pick_label_column(
    columns: &[Column],
    options: &MdsOptions,
    index: &Path,
) -> Result<Option<usize>> {
    let is_label = |c: &Column| matches!(c.encoding, Encoding::Integer { .. } | Encoding::StrInt);
    if let Some(name) = &options.label_column {
        let k = columns
            .iter()
            .position(|c| &c.name == name)
            .ok_or_else(|| mds_error(index, format!("has no label column {name:?}")))?;
        if !is_label(&columns[k]) {
            return Err(mds_error(
                index,
                format!(
                    "label column {name:?} is encoded {}: labels are int, str_int or a numpy \
                     integer",
                    columns[k].encoding_name
                ),
            ));
        }
        return Ok(Some(k));
    }
    Ok(["label", "cls"]
        .iter()
        .find_map(|name| columns.iter().position(|c| c.name == *name && is_label(c))))
}

/// A `pil` sample (width, height and mode length as `u32`, the mode, then raw pixels) as a
/// binary PPM (`RGB`) or PGM (`L`); `None` for other modes or sizes that do not add up.
fn pil_as_pnm(bytes: &[u8]) -> Option<Vec<u8>> {
    let word = |k: usize| {
        let b = bytes.get(4 * k..4 * k + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let (width, height, mode_len) = (word(0)?, word(1)?, word(2)?);
    let mode = bytes.get(12..12 + mode_len)?;
    let pixels = bytes.get(12 + mode_len..)?;
    let (magic, channels) = match mode {
        b"RGB" => ("P6", 3),
        b"L" => ("P5", 1),
        _ => return None,
    };
    if pixels.len() != width.checked_mul(height)?.checked_mul(channels)? {
        return None;
    }
    let mut out = format!("{magic}\n{width} {height}\n255\n").into_bytes();
    out.extend_from_slice(pixels);
    Some(out)
}

impl SampleSource for MdsDataset {
    fn len(&self) -> u64 {
        self.len
    }

    fn label(&self, index: u64) -> i64 {
        if index >= self.len {
            panic!(
                "sample index {index} is out of range for an mds dataset of {} samples",
                self.len
            );
        }
        self.labels.get(index as usize).copied().unwrap_or(0)
    }

    fn describe(&self, index: u64) -> String {
        match self.locate(index) {
            Some((shard, local, _)) => format!("{}:sample {local}", shard.path.display()),
            None => format!(
                "sample {index} (out of range for {} with {} samples)",
                self.root.display(),
                self.len
            ),
        }
    }

    fn read(&self, index: u64) -> Result<Vec<u8>> {
        let (bytes, shard, local) = self.column_bytes(index, self.sample_column)?;
        match self.columns[self.sample_column].encoding {
            Encoding::Pil => pil_as_pnm(&bytes).ok_or_else(|| {
                mds_error(
                    &shard.path,
                    format!("sample {local}: a pil image of a mode other than RGB or L"),
                )
            }),
            _ => Ok(bytes),
        }
    }

    fn class_names(&self) -> &[String] {
        &self.class_names
    }

    /// Samples per shard.
    fn shard_sizes(&self) -> Option<Vec<u64>> {
        Some(
            self.shards
                .iter()
                .map(|shard| shard.offsets.len() as u64 - 1)
                .collect(),
        )
    }
}

impl std::fmt::Debug for MdsDataset {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("MdsDataset")
            .field("root", &self.root)
            .field("shards", &self.shards.len())
            .field("samples", &self.len)
            .field("sample_column", &self.columns[self.sample_column].name)
            .finish()
    }
}
