//! `ParquetDataset`: samples stored as the rows of Parquet files, read by row group.
//!
//! A dataset is one `.parquet` file or a folder of `*.parquet` files (sorted by name); sample
//! `i` is row `i` counting through the files in that order. Each row holds the sample's bytes
//! in one column: encoded images (a binary column, or a Hugging Face-style struct with a
//! binary `bytes` field) or text (a UTF-8 column, served as its UTF-8 bytes for a tokenising
//! pipeline), and optionally an integer label column. A file with neither, whose columns are
//! numeric, opens as numeric-only: its rows are read through the SelectColumns op
//! ([`ParquetDataset::read_f32_columns`]), and [`SampleSource::read`] refuses them.
//!
//! Opening reads each file's footer (row counts, schema) and the label column, which is small
//! and must be known before any sample is read. Samples are read by row group, the unit of
//! Parquet's layout: the first read of a row decodes the sample column of its whole group,
//! which stays in a small shared cache (`row_group_cache.rs`) for the rows after it.
//! [`SampleSource::shard_sizes`] reports rows per row group, so a shard-aware shuffle
//! (`shuffle_window`) keeps reads within a few groups. A set in an object store reads ahead:
//! told which samples come next ([`SampleSource::prefetch`]), a thread brings the sample
//! column's chunks of their row groups into the object cache while the current ones decode.

mod bytes;
mod footer;
mod numeric;
mod open;
mod options;
mod page_checks;
mod page_headers;
mod raw_text;
pub(crate) mod row_group_cache;
mod write;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ProjectionMask;
use parquet::errors::ParquetError;
use rayon::prelude::*;
use tracing::info;

use crate::arrow_rows::{arrow_rows_source, columns, describe_in, ArrowRows, ChunkSpan};
use crate::decoder_panics::without_panics;
use crate::error::{Error, Result};
use crate::files::{files_with_extension, has_extension, root_files};
use crate::label_checks;
use crate::naming::RemoteFiles;
use crate::sample_source::SampleSource;
use crate::storage::{list_remote, Hint, ObjectCache, Prefetcher, RemoteObject};
use bytes::{FileBytes, LocalFile};
use row_group_cache::RowGroupCache;

use footer::{open_file, read_labels, OpenedFile};
pub use options::{
    ColumnarSummary, ParquetColumnInfo, ParquetOptions, ParquetSampleKind, ParquetSummary,
};
pub use write::{write_parquet, ParquetWriterOptions, ParquetWritten};

/// The file key-value metadata key under which `write_parquet` stores the class names (a JSON
/// array of strings, indexed by label).
pub const CLASS_NAMES_KEY: &str = "stoker.class_names";

/// Image columns looked for, in this order, when no image column is named.
pub(crate) const IMAGE_COLUMN_NAMES: [&str; 3] = ["image", "jpg", "png"];
/// The text column looked for when neither an image nor a text column is named.
pub(crate) const TEXT_COLUMN_NAME: &str = "text";
/// The label column looked for when none is named.
pub(crate) const LABEL_COLUMN_NAME: &str = "label";

/// Whether `path` looks like a Parquet dataset: a `.parquet` file, or a folder holding at
/// least one `*.parquet` file. Used to pick the format of a dataset path automatically.
pub fn looks_like_parquet(path: &Path) -> bool {
    if path.is_file() {
        return has_extension(path, "parquet");
    }
    crate::files::folder_holds(path, "parquet")
}

/// One Parquet file of the dataset.
struct ParquetFile {
    /// The file's path, or its `s3://` URI, in messages.
    path: PathBuf,
    /// Where its bytes are read.
    source: FileBytes,
    bytes: u64,
    metadata: ArrowReaderMetadata,
    /// The root column holding the samples; `None` when numeric-only.
    sample_column: Option<usize>,
    /// When the sample column is a struct, the index of its binary `bytes` field.
    struct_field: Option<usize>,
    /// When that struct has a string `path` field (Hugging Face's `Image`), its index: a row
    /// whose `bytes` are null is read from the file it names.
    path_field: Option<usize>,
}

/// The decoded sample column of one row group.
struct DecodedGroup {
    /// Record batches of the group, in row order.
    chunks: Vec<ArrayRef>,
    /// The `path` field of each batch, when the column is an image struct with one.
    paths: Vec<ArrayRef>,
}

/// Decoded bytes a record batch of a row group holds at most, as its rows average: a batch of
/// a whole group of 1M rows, as pandas and pyarrow write them, would be gigabytes, and a
/// binary column's past 2 GiB does not decode at all (its offsets are 32-bit).
const BATCH_BYTES: u64 = 64 << 20;

/// Rows a record batch holds at most, whatever the footer says: the decoder sizes its buffers
/// for a batch's rows before it reads them, and a footer's row count is the file's word (a
/// 14 KB file announcing 2^30 rows had 4 GiB allocated per decode thread).
const BATCH_ROWS: u64 = 64 * 1024;

/// The rows of each record batch a row group of `rows` rows and `group_bytes` uncompressed
/// bytes (all its columns: more than the ones read, so the batches err small) is decoded in,
/// [`BATCH_ROWS`] at most.
fn rows_per_batch(rows: u64, group_bytes: i64) -> usize {
    let group_bytes = u64::try_from(group_bytes).unwrap_or(0).max(1);
    let rows = rows.max(1);
    let fitting = u128::from(rows) * u128::from(BATCH_BYTES) / u128::from(group_bytes);
    let fitting = u64::try_from(fitting)
        .unwrap_or(u64::MAX)
        .clamp(1, rows.min(BATCH_ROWS));
    usize::try_from(fitting).unwrap_or(usize::MAX)
}

impl DecodedGroup {
    /// The bytes of row `row` of the group, or `None` when the cell is null.
    fn cell(&self, row: usize) -> Option<&[u8]> {
        Self::find(&self.chunks, row)
    }

    /// The `path` of row `row`, when the column has one and it is not null.
    fn path(&self, row: usize) -> Option<&[u8]> {
        Self::find(&self.paths, row)
    }

    fn find(chunks: &[ArrayRef], mut row: usize) -> Option<&[u8]> {
        for chunk in chunks {
            if row < chunk.len() {
                return columns::bytes_cell(chunk.as_ref(), row);
            }
            row -= chunk.len();
        }
        None
    }
}

/// A set of Parquet files read as samples (encoded images or text) with labels.
///
/// Reading takes `&self`; any number of threads can read at once, and decoded row groups are
/// shared between them.
pub struct ParquetDataset {
    root: PathBuf,
    files: Vec<ParquetFile>,
    /// The row groups as chunks of rows, the labels and class names.
    rows: ArrowRows,
    /// The column samples are read from; `None` when numeric-only.
    sample_column: Option<String>,
    sample_kind: ParquetSampleKind,
    label_column: Option<String>,
    cache: RowGroupCache<DecodedGroup>,
    /// Record batches decoded so far (a row group is decoded in several when it is large).
    batches_decoded: std::sync::atomic::AtomicU64,
    /// The object cache, for a dataset read from an object store.
    object_cache: Option<Arc<ObjectCache>>,
    /// The read-ahead thread of a dataset read from an object store.
    read_ahead: Option<Prefetcher>,
}

/// The numeric-only sample name, in messages and the summary.
const NO_SAMPLE_COLUMN: &str = "(none: numeric columns only)";

impl ParquetDataset {
    /// The folder holding the files.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The Parquet files, in sample order.
    pub fn file_paths(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|file| file.path.as_path())
    }

    /// What the sample column holds.
    pub fn sample_kind(&self) -> ParquetSampleKind {
        self.sample_kind
    }

    /// Number of row-group decodes so far: how often a read missed the row-group cache.
    pub fn row_group_decodes(&self) -> u64 {
        self.cache.decodes()
    }

    /// Number of record batches decoded so far: a row group's decode takes one per about
    /// 64 MiB of it.
    pub fn record_batches_decoded(&self) -> u64 {
        self.batches_decoded
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Files, rows, row groups and columns.
    pub fn summary(&self) -> ParquetSummary {
        let columns = self
            .files
            .first()
            .map(|file| {
                file.metadata
                    .schema()
                    .fields()
                    .iter()
                    .map(|field| ParquetColumnInfo {
                        name: field.name().clone(),
                        data_type: columns::type_name(field.data_type()),
                    })
                    .collect()
            })
            .unwrap_or_default();
        ParquetSummary {
            files: self.files.len(),
            rows: self.rows.len(),
            chunks: self.rows.spans().len(),
            columns,
            sample_column: self.sample_column.clone(),
            sample_kind: self.sample_kind,
            label_column: self.label_column.clone(),
            file_bytes: self.files.iter().map(|file| file.bytes).sum(),
        }
    }

    /// Decodes `columns` (root indices) of one row group, as record-batch columns in the
    /// order of the projection, which is schema order.
    fn decode_columns(&self, span: &ChunkSpan, columns: &[usize]) -> Result<Vec<Vec<ArrayRef>>> {
        let file = &self.files[span.file];
        let group_error = |source: ParquetError| Error::ParquetRowGroup {
            path: file.path.clone(),
            row_group: span.chunk_in_file,
            first_row: span.first_row_in_file,
            end_row: span.first_row_in_file + span.rows,
            source,
        };
        let decode = || -> Result<Vec<Vec<ArrayRef>>> {
            let handle =
                file.source
                    .chunks(file.metadata.metadata(), &[span.chunk_in_file], columns)?;
            let checked = handle.try_clone(&file.path)?;
            page_checks::check_pages(
                checked,
                file.metadata.metadata(),
                &[span.chunk_in_file],
                columns,
            )
            .map_err(group_error)?;
            let mask =
                ProjectionMask::roots(file.metadata.parquet_schema(), columns.iter().copied());
            let group_bytes = file
                .metadata
                .metadata()
                .row_group(span.chunk_in_file)
                .total_byte_size();
            let batch_rows = rows_per_batch(span.rows, group_bytes);
            let reader =
                ParquetRecordBatchReaderBuilder::new_with_metadata(handle, file.metadata.clone())
                    .with_row_groups(vec![span.chunk_in_file])
                    .with_projection(mask)
                    .with_batch_size(batch_rows)
                    .build()
                    .map_err(group_error)?;
            let mut decoded = vec![Vec::new(); columns.len()];
            let mut rows = 0u64;
            for batch in reader {
                let batch = batch.map_err(|error| group_error(error.into()))?;
                self.batches_decoded
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                rows += batch.num_rows() as u64;
                for (column, chunks) in batch.columns().iter().zip(decoded.iter_mut()) {
                    chunks.push(Arc::clone(column));
                }
            }
            if rows != span.rows {
                return Err(group_error(ParquetError::General(format!(
                    "decoded {rows} rows where the footer announces {}",
                    span.rows
                ))));
            }
            Ok(decoded)
        };
        // The decoder parses untrusted bytes; a panic in it is one bad row group, not a dead
        // decode thread.
        without_panics("parquet", decode)
            .unwrap_or_else(|message| Err(group_error(ParquetError::General(message))))
    }

    /// The text column `root` of one row group as raw bytes ([`raw_text::raw_text_column`]).
    fn raw_text_group(&self, span: &ChunkSpan, root: usize) -> Result<ArrayRef> {
        let file = &self.files[span.file];
        let handle =
            file.source
                .chunks(file.metadata.metadata(), &[span.chunk_in_file], &[root])?;
        let checked = handle.try_clone(&file.path)?;
        // The pages' checks first, as for Arrow's read (headers the reader would loop on,
        // dictionaries claiming more than they hold).
        let read = || {
            page_checks::check_pages(
                checked,
                file.metadata.metadata(),
                &[span.chunk_in_file],
                &[root],
            )?;
            raw_text::raw_text_column(handle, file.metadata.metadata(), span.chunk_in_file, root)
        };
        without_panics("parquet", read)
            .unwrap_or_else(|message| Err(ParquetError::General(message)))
            .map_err(|source| Error::ParquetRowGroup {
                path: file.path.clone(),
                row_group: span.chunk_in_file,
                first_row: span.first_row_in_file,
                end_row: span.first_row_in_file + span.rows,
                source,
            })
    }

    /// The decoded sample column of group `group`, from the cache when it is there.
    fn sample_group(&self, group: usize, span: &ChunkSpan) -> Result<Arc<DecodedGroup>> {
        let file = &self.files[span.file];
        let Some(sample_column) = file.sample_column else {
            return Err(Error::ParquetColumn {
                path: file.path.clone(),
                problem: "the file has numeric columns only, no image or text column: read it \
                          with a [SelectColumns] pipeline"
                    .into(),
            });
        };
        self.cache.get_or_decode(group, || {
            let mut decoded = match self.decode_columns(span, &[sample_column]) {
                // Arrow refuses a text group with one cell that is not UTF-8 (its error says
                // "non UTF-8"): read raw, each cell is its own sample again (a bad one a bad
                // sample). Any other error stands.
                Err(error)
                    if self.sample_kind == ParquetSampleKind::Text
                        && error.to_string().contains("non UTF-8") =>
                {
                    match self.raw_text_group(span, sample_column) {
                        Ok(column) => {
                            tracing::debug!(%error, "a text row group read as raw bytes");
                            vec![vec![column]]
                        }
                        Err(_) => return Err(error),
                    }
                }
                decoded => decoded?,
            };
            let mut chunks = decoded.pop().unwrap_or_default();
            let mut paths = Vec::new();
            if let Some(field) = file.struct_field {
                let fields = |field: usize| {
                    chunks
                        .iter()
                        .map(|chunk| {
                            chunk
                                .as_struct_opt()
                                .map(|values| Arc::clone(values.column(field)))
                                .ok_or_else(|| Error::ParquetColumn {
                                    path: file.path.clone(),
                                    problem: format!(
                                        "image column {} did not decode as a struct",
                                        self.sample_column.as_deref().unwrap_or(NO_SAMPLE_COLUMN)
                                    ),
                                })
                        })
                        .collect::<Result<Vec<_>>>()
                };
                if let Some(path_field) = file.path_field {
                    paths = fields(path_field)?;
                }
                chunks = fields(field)?;
            }
            let bytes = chunks
                .iter()
                .chain(&paths)
                .map(|chunk| chunk.get_array_memory_size())
                .sum();
            Ok((DecodedGroup { chunks, paths }, bytes))
        })
    }
}

impl ParquetDataset {
    /// Reads an image kept as a file reference (Hugging Face's `Image` with null `bytes`): an
    /// absolute path, or one relative to the Parquet file's folder; local Parquet files only,
    /// and under the roots [`crate::allow_referenced_files_under`] set, if any.
    fn read_referenced_image(
        &self,
        reference: &str,
        span: &ChunkSpan,
        row: u64,
    ) -> Result<Vec<u8>> {
        let file = &self.files[span.file];
        let refused = |problem: String| Error::ParquetValue {
            path: file.path.clone(),
            column: self.sample_column.clone().unwrap_or_default(),
            row: span.first_row_in_file + row,
            problem,
        };
        let FileBytes::Local(local) = &file.source else {
            return Err(refused(format!(
                "is not embedded but refers to the file {reference:?}; referenced images are read \
                 beside local Parquet files only (embed the images: `datasets`' \
                 Image(decode=True) and `embed_table_storage`, or `stoker convert`)"
            )));
        };
        let base = local.path().parent().unwrap_or(Path::new("."));
        crate::image_file::read_referenced(reference, base, refused)
    }
}

impl SampleSource for ParquetDataset {
    arrow_rows_source!("parquet");

    fn read(&self, index: u64) -> Result<Vec<u8>> {
        let (group, span, row) = self.rows.find(index)?;
        let decoded = self.sample_group(group, span)?;
        let row_in_group = usize::try_from(row).unwrap_or(usize::MAX);
        if let Some(bytes) = decoded.cell(row_in_group) {
            return Ok(bytes.to_vec());
        }
        match decoded.path(row_in_group) {
            Some(reference) => {
                let reference = String::from_utf8_lossy(reference);
                self.read_referenced_image(&reference, span, row)
            }
            None => Err(Error::ParquetNullCell {
                path: self.files[span.file].path.clone(),
                column: self.sample_column.clone().unwrap_or_default(),
                row: span.first_row_in_file + row,
            }),
        }
    }

    fn has_sample_bytes(&self) -> bool {
        self.sample_kind != ParquetSampleKind::Numeric
    }

    /// Brings the sample column's chunks of the row groups holding `indices` into the object
    /// cache (groups already decoded or being decoded are left out); a local dataset, or one
    /// of numeric columns only, does nothing.
    fn prefetch(&self, indices: &[u64]) {
        let Some(read_ahead) = &self.read_ahead else {
            return;
        };
        let mut groups: Vec<usize> = Vec::new();
        for &index in indices {
            if let Some((group, _, _)) = self.rows.locate(index) {
                if !groups.contains(&group) && !self.cache.holds(group) {
                    groups.push(group);
                }
            }
        }
        let mut hint: Hint = Vec::new();
        for group in groups {
            let span = &self.rows.spans()[group];
            let file = &self.files[span.file];
            let (Some(column), FileBytes::Remote(object)) = (file.sample_column, &file.source)
            else {
                continue;
            };
            let Some(listed) = object.listed() else {
                continue;
            };
            let ranges = bytes::column_chunk_ranges(
                file.metadata.metadata(),
                &[span.chunk_in_file],
                &[column],
                object.size(),
            );
            match hint
                .iter_mut()
                .find(|(hinted, _)| hinted.location == listed.location)
            {
                Some((_, wanted)) => wanted.extend(ranges),
                None => hint.push((listed.clone(), ranges)),
            }
        }
        if !hint.is_empty() {
            read_ahead.hint(hint);
        }
    }

    fn cache_stats(&self) -> Option<crate::CacheStats> {
        self.object_cache.as_ref().map(|cache| cache.stats())
    }
}

impl std::fmt::Debug for ParquetDataset {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let column = &self.sample_column;
        let names = ("ParquetDataset", "row_groups");
        let files = self.files.len();
        self.rows
            .debug_source(formatter, names, &self.root, files, column)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_group_is_decoded_in_batches_of_about_64_mib() {
        // pandas' default: a million rows of 100 KB images, 100 GB: 671 rows a batch.
        assert_eq!(rows_per_batch(1 << 20, 100_000 << 20), 671);
        // Small groups whole; a row larger than the bound alone; nothing known: whole.
        assert_eq!(rows_per_batch(256, 10 << 20), 256);
        assert_eq!(rows_per_batch(10, 3 << 30), 1);
        assert_eq!(rows_per_batch(100, 0), 100);
        assert_eq!(rows_per_batch(0, -1), 1);
        // A footer's row count sizes no batch past 64 Ki rows: 2^30 rows claimed by 14 KB.
        assert_eq!(rows_per_batch(1 << 30, 14_000), 65_536);
        assert_eq!(rows_per_batch(u64::MAX, 0), 65_536);
    }
}
