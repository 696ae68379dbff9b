//! `HfDataset`: a Hugging Face `datasets` folder as `Dataset.save_to_disk` writes it, read by
//! record batch.
//!
//! The folder holds `state.json` (the `data-0000x-of-0000N.arrow` shards in sample order),
//! `dataset_info.json` (the features) and the shards, Arrow IPC *stream* files. Sample `i` is
//! row `i` counting through the shards in that order. Features map to Stoker's columns
//! (`layout.rs` has the rules): an `Image` column gives image samples (its `bytes`), a string
//! `Value` text samples, a `ClassLabel` the labels and class names, and integer or float
//! `Value`s are numeric columns for the SelectColumns op.
//!
//! An `Image` cell whose `bytes` are null but whose `path` is set (an image kept as a file
//! reference rather than embedded) is read from that file, a path relative to the dataset
//! folder or an absolute one, as an image folder's file is (bounded; no named pipe): in process
//! wherever it is, in a worker daemon only under its data roots (elsewhere that sample's read
//! fails, naming the path), so a dataset cannot make a worker read another file. Current
//! `datasets` releases embed the bytes in `save_to_disk` (re-saving an older folder embeds
//! them), so this is the rarer case.
//!
//! The same folder under an `s3://` prefix (`remote.rs`) is read from copies of its objects
//! fetched whole into the cache tier; images kept as paths are not read from there.
//!
//! A `DatasetDict` folder (`dataset_dict.json`, one subfolder per split) is not a dataset:
//! opening it fails with an error naming the splits to pick.
//!
//! Opening reads the JSON files, walks each shard's message headers (`ipc_stream.rs`: no body
//! is read but the label column's) and reads the labels. Samples are read by record batch, the
//! unit of the stream: the first read of a row decodes the sample column of its batch, which
//! stays in the same small cache as Parquet's row groups. [`SampleSource::shard_sizes`]
//! reports rows per record batch, so a shard-aware shuffle keeps reads within a few batches.

mod ipc_stream;
mod layout;
mod numeric;
mod remote;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef};
use rayon::prelude::*;
use tracing::info;

use crate::arrow_rows::columns::{self, Cell};
use crate::arrow_rows::{arrow_rows_source, describe_in, ArrowRows, ChunkSpan};
use crate::error::{Error, Result};
use crate::label_checks;
use crate::parquet_files::row_group_cache::RowGroupCache;
use crate::parquet_files::{ColumnarSummary, ParquetOptions, ParquetSampleKind};
use crate::sample_source::SampleSource;
use ipc_stream::StreamFile;
use layout::ColumnChoice;

pub use layout::HfFeature;

/// Whether `path` looks like a Hugging Face `datasets` folder: one holding `state.json` and
/// `dataset_info.json` (a `Dataset`), or `dataset_dict.json` (a `DatasetDict`, which
/// [`HfDataset::open`] refuses with the splits to pick). Used to pick the format of a dataset
/// path automatically.
pub fn looks_like_hf_dataset(path: &Path) -> bool {
    path.is_dir()
        && ((path.join(layout::STATE_FILE).is_file() && path.join(layout::INFO_FILE).is_file())
            || path.join(layout::DICT_FILE).is_file())
}

/// A column of a Hugging Face dataset, for reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfColumnInfo {
    /// The column name.
    pub name: String,
    /// Its Arrow type, in words.
    pub data_type: String,
    /// Its feature in `dataset_info.json`, if declared there.
    pub feature: Option<HfFeature>,
}

/// Facts about an opened [`HfDataset`]; its chunks are record batches.
pub type HfSummary = ColumnarSummary<HfColumnInfo>;

/// The decoded sample column of one record batch.
struct DecodedBatch {
    /// The bytes (or text) of each row.
    values: ArrayRef,
    /// An image struct's `path` field, for rows whose bytes are null.
    paths: Option<ArrayRef>,
}

/// A Hugging Face `datasets` folder read as samples (encoded images or text) with labels.
///
/// Reading takes `&self`; any number of threads can read at once, and decoded record batches
/// are shared between them.
pub struct HfDataset {
    root: PathBuf,
    files: Vec<StreamFile>,
    /// The record batches as chunks of rows, the labels and class names.
    rows: ArrowRows,
    features: BTreeMap<String, HfFeature>,
    choice: ColumnChoice,
    cache: RowGroupCache<DecodedBatch>,
    /// Read from an object store (`remote.rs`): images kept as paths are not read.
    in_store: bool,
}

/// Reads the label column of every batch of `file` as `i64`.
fn read_labels(file: &StreamFile, column: usize) -> Result<Vec<i64>> {
    let name = file.schema.field(column).name().clone();
    let mut labels = Vec::new();
    for batch in 0..file.batches.len() {
        let decoded = file.read_columns(batch, &[column])?;
        let values = decoded.column(0);
        for row in 0..values.len() {
            let problem = match columns::integer_cell(values.as_ref(), row) {
                Cell::Value(label) => {
                    labels.push(label);
                    continue;
                }
                Cell::Null => "has no value (null); labels need one",
                Cell::Unfit => "does not fit a 64-bit signed label",
            };
            return Err(Error::HfValue {
                path: file.path.clone(),
                column: name,
                row: labels.len() as u64,
                problem: problem.into(),
            });
        }
    }
    Ok(labels)
}

impl HfDataset {
    /// Opens the `save_to_disk` folder `path`, with the columns `options` names (`None`: by the
    /// rules in the module doc; `cache_bytes` bounds the decoded batches kept).
    ///
    /// Fails when the path is missing, is a `DatasetDict` (the error names its splits), lacks
    /// `state.json` or `dataset_info.json`, a shard is truncated or corrupt (the error names
    /// it), the shards' schemas differ, the columns asked for are missing or unusable, or a
    /// label is null.
    pub fn open(path: &Path, options: &ParquetOptions) -> Result<HfDataset> {
        let started = Instant::now();
        match std::fs::metadata(path) {
            Ok(metadata) if metadata.is_dir() => {}
            Ok(_) => return Err(Error::NotADirectory(path.to_path_buf())),
            Err(source) if source.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::RootNotFound(path.to_path_buf()))
            }
            Err(source) => return Err(Error::io(path, source)),
        }
        if let Some(splits) = crate::naming::dict_splits(path)? {
            return Err(Error::HfDatasetDict {
                path: path.to_path_buf(),
                splits,
            });
        }
        let paths = layout::data_files(path)?;
        let features = layout::features(path)?;
        crate::referenced_files::check_data_files(&paths)?;

        let files: Vec<StreamFile> = paths
            .into_par_iter()
            .map(StreamFile::open)
            .collect::<Result<_>>()?;
        Self::assemble(path, files, features, options, false, started)
    }

    /// The dataset of the opened shards `files` (in sample order) with the `features` of its
    /// `dataset_info.json`; `path` names it, `in_store` says it was read from an object store.
    fn assemble(
        path: &Path,
        files: Vec<StreamFile>,
        features: BTreeMap<String, HfFeature>,
        options: &ParquetOptions,
        in_store: bool,
        started: Instant,
    ) -> Result<HfDataset> {
        let schema = Arc::clone(&files[0].schema);
        if let Some(other) = files
            .iter()
            .find(|file| file.schema.fields() != schema.fields())
        {
            return Err(Error::HfDataset {
                path: other.path.clone(),
                problem: format!(
                    "its columns differ from those of {}",
                    files[0].path.display()
                ),
            });
        }
        let choice = layout::choose_columns(&schema, &features, options, path)?;
        let labels: Vec<i64> = match choice.label_column {
            Some(column) => files
                .par_iter()
                .map(|file| read_labels(file, column))
                .collect::<Result<Vec<_>>>()?
                .concat(),
            None => Vec::new(),
        };

        let mut batches = Vec::new();
        let mut len = 0u64;
        for (file_number, file) in files.iter().enumerate() {
            let mut first_row_in_file = 0;
            for (batch_in_file, block) in file.batches.iter().enumerate() {
                batches.push(ChunkSpan {
                    file: file_number,
                    chunk_in_file: batch_in_file,
                    first_row_in_file,
                    rows: block.rows,
                });
                // Each batch's count is bounded by its body; their sum is checked too.
                let (Some(next), Some(total)) = (
                    first_row_in_file.checked_add(block.rows),
                    len.checked_add(block.rows),
                ) else {
                    return Err(Error::HfDataset {
                        path: path.to_path_buf(),
                        problem: "its record batches' row counts add up past 2^64".into(),
                    });
                };
                (first_row_in_file, len) = (next, total);
            }
        }
        if len == 0 {
            return Err(Error::HfDataset {
                path: path.to_path_buf(),
                problem: "its shards hold no row".into(),
            });
        }
        let (class_names, notice) = match choice.label_column {
            None if choice.kind == ParquetSampleKind::Image => {
                let columns: Vec<String> =
                    schema.fields().iter().map(|f| f.name().clone()).collect();
                let looked_for = "none named label, no ClassLabel feature, no integer labels, cls, target, targets or y";
                let notice = label_checks::no_label_column(path, looked_for, &columns);
                (Vec::new(), Some(notice))
            }
            None => (Vec::new(), None),
            Some(column) => {
                let checked = label_checks::check_labels(
                    path,
                    schema.field(column).name(),
                    &labels,
                    choice.class_names.clone(),
                    |index| describe_in(&batches, index, |file| files[file].path.as_path()),
                )?;
                (checked.class_names, checked.notice)
            }
        };
        let rows = ArrowRows::new(batches, labels, class_names).with_notice(notice);
        info!(
            path = %path.display(),
            files = files.len(),
            record_batches = rows.spans().len(),
            samples = len,
            sample_column = %choice.sample_column_name,
            classes = rows.class_names().len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "opened hugging face dataset"
        );
        Ok(HfDataset {
            root: path.to_path_buf(),
            files,
            rows,
            features,
            choice,
            cache: RowGroupCache::new(options.cache_bytes),
            in_store,
        })
    }

    /// The dataset folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// What the sample column holds.
    pub fn sample_kind(&self) -> ParquetSampleKind {
        self.choice.kind
    }

    /// Number of record-batch decodes so far: how often a read missed the cache.
    pub fn batch_decodes(&self) -> u64 {
        self.cache.decodes()
    }

    /// Shards, rows, record batches and columns.
    pub fn summary(&self) -> HfSummary {
        let schema = &self.files[0].schema;
        HfSummary {
            files: self.files.len(),
            rows: self.rows.len(),
            chunks: self.rows.spans().len(),
            columns: schema
                .fields()
                .iter()
                .map(|field| HfColumnInfo {
                    name: field.name().clone(),
                    data_type: columns::type_name(field.data_type()),
                    feature: self.features.get(field.name()).cloned(),
                })
                .collect(),
            sample_column: Some(self.choice.sample_column_name.clone()),
            sample_kind: self.choice.kind,
            label_column: self
                .choice
                .label_column
                .map(|index| schema.field(index).name().clone()),
            file_bytes: self.files.iter().map(|file| file.bytes).sum(),
        }
    }

    /// The decoded sample column of batch `batch`, from the cache when it is there.
    fn sample_batch(&self, batch: usize, span: &ChunkSpan) -> Result<Arc<DecodedBatch>> {
        self.cache.get_or_decode(batch, || {
            let file = &self.files[span.file];
            let decoded = file.read_columns(span.chunk_in_file, &[self.choice.sample_column])?;
            let column = Arc::clone(decoded.column(0));
            let decoded = match self.choice.image_fields {
                None => DecodedBatch {
                    values: column,
                    paths: None,
                },
                Some((bytes, path)) => {
                    let values = column.as_struct_opt().ok_or_else(|| Error::ArrowStream {
                        path: file.path.clone(),
                        problem: format!(
                            "image column {:?} did not decode as a struct",
                            self.choice.sample_column_name
                        ),
                    })?;
                    DecodedBatch {
                        values: Arc::clone(values.column(bytes)),
                        paths: path.map(|path| Arc::clone(values.column(path))),
                    }
                }
            };
            let bytes = decoded.values.get_array_memory_size()
                + decoded
                    .paths
                    .as_ref()
                    .map_or(0, |paths| paths.get_array_memory_size());
            Ok((decoded, bytes))
        })
    }

    /// Reads an image kept as a file reference: an absolute path, or one relative to the
    /// dataset folder (what `datasets` writes for images it did not embed), under the roots
    /// [`crate::allow_referenced_files_under`] set, if any.
    fn read_referenced_image(
        &self,
        reference: &str,
        span: &ChunkSpan,
        row: u64,
    ) -> Result<Vec<u8>> {
        let refused = |problem: String| Error::HfValue {
            path: self.files[span.file].path.clone(),
            column: self.choice.sample_column_name.clone(),
            row: span.first_row_in_file + row,
            problem,
        };
        if self.in_store {
            return Err(refused(format!(
                "is not embedded but refers to the file {reference:?}; referenced images are read \
                 beside local dataset folders only (save the dataset again with a current \
                 `datasets`, which embeds them, or `stoker convert` it)"
            )));
        }
        crate::image_file::read_referenced(reference, &self.root, refused)
    }
}

impl SampleSource for HfDataset {
    arrow_rows_source!("hugging face");

    fn read(&self, index: u64) -> Result<Vec<u8>> {
        let (batch, span, row) = self.rows.find(index)?;
        let decoded = self.sample_batch(batch, span)?;
        let row_in_batch = usize::try_from(row).unwrap_or(usize::MAX);
        if let Some(bytes) = columns::bytes_cell(decoded.values.as_ref(), row_in_batch) {
            return Ok(bytes.to_vec());
        }
        let reference = decoded
            .paths
            .as_ref()
            .and_then(|paths| columns::bytes_cell(paths.as_ref(), row_in_batch))
            .and_then(|path| std::str::from_utf8(path).ok());
        match reference {
            Some(reference) => self.read_referenced_image(reference, span, row),
            None => Err(Error::HfValue {
                path: self.files[span.file].path.clone(),
                column: self.choice.sample_column_name.clone(),
                row: span.first_row_in_file + row,
                problem: match self.choice.image_fields {
                    Some(_) => "the image has neither bytes nor a path (null)".into(),
                    None => "has no value (null)".into(),
                },
            }),
        }
    }
}

impl std::fmt::Debug for HfDataset {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let column = &self.choice.sample_column_name;
        let names = ("HfDataset", "record_batches");
        let files = self.files.len();
        self.rows
            .debug_source(formatter, names, &self.root, files, column)
    }
}
