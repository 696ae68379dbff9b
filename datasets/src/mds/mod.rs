//! `MdsDataset`: Mosaic Streaming's MDS shards read in place: a folder holding `index.json` and
//! the `shard.NNNNN.mds` files it lists (or `shard.NNNNN.mds.zstd` / `.gz`, decompressed once
//! into the cache tier, as compressed JSONL files are; a copy is locked there only while it is
//! made and opened, and made again if evicted, so a set holds no descriptor per shard).
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
//! whose encoding is an image's, else the one column encoded `jpeg`, `png` or `pil` (several
//! refuse the set: Streaming's writer keeps columns in name order, so the first is no choice),
//! else `text` (encoded `str`). Its bytes are the sample: `jpeg`, `png` and `bytes` as they are; `pil`
//! (raw pixels after a width, height and mode header) becomes a binary PPM (mode `RGB`, or
//! `RGBA` with its alpha dropped as PIL's `convert("RGB")` drops it) or PGM (`L`, `LA`) of the
//! same pixels, which the decoder reads; other modes are bad samples; so does an
//! `ndarray` of `uint8` pixels shaped `[height, width]` or `[height, width, 3]` (named by the
//! column, or an image column by name), other arrays being bad samples. Labels come
//! from the column named, else `label`, else `cls`, encoded `int`, `str_int`, `json` (an integer)
//! or a numpy integer scalar (`uint8`..`int64`), read once at open; class names are the labels'
//! numbers. A shard cut short, offsets that run backwards or past the file, or a sample count
//! other than its index says is an error naming the shard.
//!
//! A prefix in a bucket reads the same (`remote.rs`), and an integer `ndarray` column is cut into
//! token windows (`tokens.rs`).

use std::ops::Range;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde_json::Value;
use tracing::info;

use crate::error::{Error, Result};
use crate::file_pool::{failed_for_descriptors, FileKey, FilePool, PooledFile};
use crate::label_checks;
use crate::sample_source::SampleSource;
use crate::storage::{CachedObject, ObjectCacheOptions};

use columns::{
    ndarray_as_pnm, ndarray_integers, pick_label_column, pick_sample_column, pil_as_pnm,
    shard_columns, Column, Encoding,
};
use shard::{local_shard_file, read_exact_at, Shard, ShardEntry};

mod columns;
mod remote;
mod shard;
#[cfg(test)]
mod tests;
mod tokens;
mod writer;

pub use tokens::MdsTokenWindows;
pub use writer::{write_mds, MdsColumn};

/// The file that makes a folder an MDS dataset.
pub const MDS_INDEX_FILE: &str = "index.json";

/// The most bytes an MDS `index.json` is read as (a few hundred a shard: millions of shards).
const MAX_INDEX_BYTES: u64 = 1 << 30;

/// Whether `path` is a folder holding an MDS `index.json` (its shards' format `mds`).
pub fn looks_like_mds(path: &Path) -> bool {
    let index = path.join(MDS_INDEX_FILE);
    index.is_file()
        && crate::files::read_small_file(&index, MAX_INDEX_BYTES)
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
    /// The column holding the samples (or, for token windows, the token ids).
    pub sample_column: Option<String>,
    /// The column holding the labels.
    pub label_column: Option<String>,
    /// Opened to be cut into token windows ([`MdsDataset::token_windows`]): no sample or label
    /// column is picked, and reading a sample is refused.
    pub tokens_only: bool,
}

/// An MDS dataset: sample `i` is the `i`-th sample over the shards in index order.
pub struct MdsDataset {
    /// The folder, or the prefix's `s3://` URI.
    root: PathBuf,
    /// The local copy of `index.json` (what the token file is made from), and what keeps it in
    /// the cache tier when it lies there.
    index_file: PathBuf,
    _index_copy: Option<CachedObject>,
    columns: Vec<Column>,
    shards: Vec<Shard>,
    first_samples: Vec<u64>,
    len: u64,
    /// The column read as samples (`None`: opened for token windows only).
    sample_column: Option<usize>,
    labels: Vec<i64>,
    class_names: Vec<String>,
    /// What opening found that its user should be told once.
    notices: Vec<String>,
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

/// `index.json`'s bytes (at `index_path`) parsed: its shard entries, every one MDS version 2,
/// and the columns they all declare.
fn parse_index(text: &[u8], index_path: &Path) -> Result<(Vec<Value>, Vec<Column>)> {
    let index: Value = serde_json::from_slice(text).map_err(|source| Error::Manifest {
        path: index_path.to_path_buf(),
        source,
    })?;
    let entries = match index.get("shards").and_then(Value::as_array) {
        Some(shards) if !shards.is_empty() => shards.clone(),
        _ => return Err(mds_error(index_path, "no \"shards\" list, or an empty one")),
    };
    let mut columns = None;
    for entry in &entries {
        let format = entry.get("format").and_then(Value::as_str);
        let version = entry.get("version").and_then(Value::as_u64);
        if format != Some("mds") || version != Some(2) {
            return Err(mds_error(
                index_path,
                format!("a shard of format {format:?}, version {version:?}: MDS version 2 is read"),
            ));
        }
        let these = shard_columns(entry, index_path)?;
        match &columns {
            None => columns = Some(these),
            Some(first) if *first != these => {
                return Err(mds_error(index_path, "its shards' columns differ"))
            }
            Some(_) => {}
        }
    }
    Ok((entries, columns.unwrap_or_default()))
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
        crate::referenced_files::check_data_file(&index_path)?;
        let text = crate::files::read_small_file(&index_path, MAX_INDEX_BYTES)
            .map_err(|error| Error::io(&index_path, error))?;
        let (entries, columns) = parse_index(&text, &index_path)?;
        let shards: Vec<Shard> = entries
            .iter()
            .map(|entry| {
                let entry = ShardEntry::of(entry, &index_path)?;
                Shard::open(local_shard_file(root, &entry, cache)?, entry.samples)
            })
            .collect::<Result<_>>()?;
        let index = (index_path, None);
        Self::assemble(root.to_path_buf(), index, columns, shards, options, started)
    }

    /// The dataset of `shards`, opened, with its sample and label columns picked and its labels
    /// read.
    fn assemble(
        root: PathBuf,
        (index_file, index_copy): (PathBuf, Option<CachedObject>),
        columns: Vec<Column>,
        shards: Vec<Shard>,
        options: &MdsOptions,
        started: std::time::Instant,
    ) -> Result<MdsDataset> {
        let index_name = root.join(MDS_INDEX_FILE);
        // Labels matter where the samples are images (not text, not token windows).
        let (sample_column, label_column, labels_matter) = if options.tokens_only {
            (None, None, false)
        } else {
            let sample = pick_sample_column(&columns, options, &index_name)?;
            let images = columns[sample].encoding != Encoding::Str;
            let label = pick_label_column(&columns, options, &index_name, images)?;
            (Some(sample), label, images)
        };
        let mut first_samples = Vec::with_capacity(shards.len());
        let mut len = 0u64;
        for shard in &shards {
            first_samples.push(len);
            len += shard.offsets.len() as u64 - 1;
        }
        if len == 0 {
            return Err(mds_error(&index_name, "its shards hold no sample"));
        }
        let mut dataset = MdsDataset {
            pool_keys: FilePool::global().reserve_keys(shards.len()),
            root,
            index_file,
            _index_copy: index_copy,
            columns,
            shards,
            first_samples,
            len,
            sample_column,
            labels: Vec::new(),
            class_names: Vec::new(),
            notices: Vec::new(),
        };
        if let Some(column) = label_column {
            dataset.labels = (0..len)
                .into_par_iter()
                .map(|index| dataset.read_label(index, column))
                .collect::<Result<_>>()?;
            let checked = label_checks::check_labels(
                &dataset.root,
                &dataset.columns[column].name,
                &dataset.labels,
                None,
                |index| dataset.describe(index),
            )?;
            dataset.class_names = checked.class_names;
        } else if labels_matter {
            let names: Vec<String> = dataset.columns.iter().map(|c| c.name.clone()).collect();
            let looked_for = "none named label or cls, no integer labels, target, targets or y";
            let notice = label_checks::no_label_column(&dataset.root, looked_for, &names);
            dataset.notices.push(notice);
        }
        info!(
            root = %dataset.root.display(),
            shards = dataset.shards.len(),
            samples = len,
            sample_column = sample_column.map(|c| dataset.columns[c].name.as_str()).unwrap_or("none"),
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
        let pooled = FilePool::global().get_or_open(
            key,
            || shard.open_again().map(PooledFile::plain),
            failed_for_descriptors,
        )?;
        shard.check_unchanged(&pooled.file)?;
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
        // Offsets are 32-bit: a column may claim up to 4 GiB, read only up to the cap every
        // format keeps.
        let size = wanted.end - wanted.start;
        if size > crate::MAX_SAMPLE_BYTES {
            return Err(Error::SampleTooLarge {
                what: format!(
                    "column {} of sample {local} of MDS shard {}",
                    self.columns[column].name,
                    shard.path.display()
                ),
                bytes: size,
            });
        }
        let mut bytes = vec![0u8; size as usize];
        read_exact_at(&pooled.file, &shard.path, &mut bytes, wanted.start)?;
        Ok((bytes, shard, local))
    }

    /// The label of sample `index`, from column `column`.
    fn read_label(&self, index: u64, column: usize) -> Result<i64> {
        let (bytes, shard, local) = self.column_bytes(index, column)?;
        let each = &self.columns[column];
        let label = match each.encoding {
            Encoding::Integer(int) if bytes.len() == int.size => {
                i64::try_from(int.value(&bytes)).ok()
            }
            Encoding::StrInt => std::str::from_utf8(&bytes)
                .ok()
                .and_then(|text| text.trim().parse().ok()),
            Encoding::Json => serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|value| value.as_i64()),
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
        let Some(column) = self.sample_column else {
            return Err(mds_error(
                &self.root,
                "was opened for token windows; it has no sample column",
            ));
        };
        let (bytes, shard, local) = self.column_bytes(index, column)?;
        let each = &self.columns[column];
        let bad = |problem: String| mds_error(&shard.path, format!("sample {local}: {problem}"));
        match each.encoding {
            Encoding::Pil => pil_as_pnm(&bytes).map_err(bad),
            Encoding::NdArray {
                dtype,
                static_shape,
            } => {
                let array = ndarray_integers(&bytes, dtype, static_shape)
                    .map_err(|problem| bad(format!("column {}: {problem}", each.name)))?;
                let (int, values) = (array.int, array.values);
                let shape = array
                    .shape
                    .or_else(|| each.shape.clone())
                    .unwrap_or_default();
                ndarray_as_pnm(int, &shape, values).ok_or_else(|| {
                    bad(format!(
                        "column {}: an array of {} of shape {shape:?} is no image (uint8 of \
                         [height, width] or [height, width, 3] is)",
                        each.name,
                        int.name()
                    ))
                })
            }
            _ => Ok(bytes),
        }
    }

    fn class_names(&self) -> &[String] {
        &self.class_names
    }

    /// An image dataset without a label column.
    fn notices(&self) -> Vec<String> {
        self.notices.clone()
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
            .field(
                "sample_column",
                &self.sample_column.map(|c| self.columns[c].name.as_str()),
            )
            .finish()
    }
}
