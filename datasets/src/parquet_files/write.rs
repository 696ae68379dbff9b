//! Writing any [`SampleSource`] as Parquet files (`stoker convert --to parquet`).
//!
//! Each row holds `key` (the sample index as 8 digits, like the tar shards' member keys),
//! `image` (the encoded bytes, unchanged) and `label` (`int64`), in index order, so row `i` of
//! the written set is sample `i` of the source. Files are named `part-000000.parquet`, ...;
//! a file is closed before it would pass the size limit (it always holds one row at least),
//! and each one is written under a temporary name and renamed when complete. Every file
//! carries the class names in its key-value metadata ([`CLASS_NAMES_KEY`]).
//!
//! The image column is stored uncompressed, without dictionary or statistics: JPEG and PNG
//! bytes are already compressed, and min/max of image bytes mean nothing.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use tracing::info;

use super::CLASS_NAMES_KEY;
use crate::error::{Error, Result, WriteError};
use crate::files::{name_written_set, remove_written_set};
use crate::sample_source::SampleSource;

/// Options of [`write_parquet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParquetWriterOptions {
    /// Close a file before its data grows past this many bytes (it always holds one row at
    /// least; the footer, a few kB, comes on top).
    pub file_bytes: u64,
    /// Rows per row group. Row groups are the unit of reading: a read decodes its whole group.
    pub rows_per_group: usize,
}

impl Default for ParquetWriterOptions {
    /// 256 MB files, like the tar shards; row groups of 256 rows (about 30 MB of
    /// ImageNet-sized JPEGs), small enough that decoding one for a few rows stays cheap and a
    /// shuffle window of several groups fits the reader's cache.
    fn default() -> Self {
        ParquetWriterOptions {
            file_bytes: 256_000_000,
            rows_per_group: 256,
        }
    }
}

/// What [`write_parquet`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParquetWritten {
    /// The files, in sample order.
    pub files: Vec<PathBuf>,
    /// Rows (samples) written.
    pub samples: u64,
    /// Row groups written, over all files.
    pub row_groups: usize,
    /// Total size of the files in bytes.
    pub bytes: u64,
}

/// The rows of the row group being assembled.
#[derive(Default)]
struct PendingRows {
    keys: Vec<String>,
    images: Vec<Vec<u8>>,
    labels: Vec<i64>,
    image_bytes: u64,
}

impl PendingRows {
    fn len(&self) -> usize {
        self.keys.len()
    }

    fn take_batch(
        &mut self,
        schema: &SchemaRef,
    ) -> std::result::Result<RecordBatch, arrow_schema::ArrowError> {
        let keys: ArrayRef = Arc::new(StringArray::from(std::mem::take(&mut self.keys)));
        let images = std::mem::take(&mut self.images);
        let images: ArrayRef = Arc::new(BinaryArray::from_iter_values(images.iter()));
        let labels: ArrayRef = Arc::new(Int64Array::from(std::mem::take(&mut self.labels)));
        self.image_bytes = 0;
        RecordBatch::try_new(Arc::clone(schema), vec![keys, images, labels])
    }
}

/// The file being written.
struct OpenFile {
    writer: ArrowWriter<File>,
    temporary: PathBuf,
    path: PathBuf,
    rows: u64,
    row_groups: usize,
}

impl OpenFile {
    fn create(
        out: &Path,
        number: usize,
        schema: &SchemaRef,
        properties: &WriterProperties,
    ) -> Result<OpenFile> {
        let path = out.join(format!("part-{number:06}.parquet"));
        let temporary = out.join(format!("part-{number:06}.parquet.partial"));
        let file = File::create(&temporary).map_err(|source| Error::io(&temporary, source))?;
        let writer = ArrowWriter::try_new(file, Arc::clone(schema), Some(properties.clone()))
            .map_err(|source| WriteError::ParquetWrite {
                path: temporary.clone(),
                source,
            })?;
        Ok(OpenFile {
            writer,
            temporary,
            path,
            rows: 0,
            row_groups: 0,
        })
    }

    fn write_error(&self, source: parquet::errors::ParquetError) -> Error {
        WriteError::ParquetWrite {
            path: self.temporary.clone(),
            source,
        }
        .into()
    }

    /// Writes `pending` as one row group.
    fn write_group(&mut self, pending: &mut PendingRows, schema: &SchemaRef) -> Result<()> {
        if pending.len() == 0 {
            return Ok(());
        }
        let rows = pending.len() as u64;
        let batch = pending
            .take_batch(schema)
            .map_err(|error| self.write_error(error.into()))?;
        self.writer
            .write(&batch)
            .map_err(|source| self.write_error(source))?;
        self.writer
            .flush()
            .map_err(|source| self.write_error(source))?;
        self.rows += rows;
        self.row_groups += 1;
        Ok(())
    }

    /// Bytes written so far, plus the pending rows' images.
    fn bytes_with(&self, pending: &PendingRows) -> u64 {
        self.writer.bytes_written() as u64 + pending.image_bytes
    }

    /// Writes `pending` as the last row group, then the footer; syncs the file, counts it in
    /// `written` and adds it to `finished` as (temporary name, final name): every file takes
    /// its final name once the whole set is written, so a run stopped midway leaves no file a
    /// reader would take for the set.
    fn close(
        mut self,
        pending: &mut PendingRows,
        schema: &SchemaRef,
        written: &mut ParquetWritten,
        finished: &mut Vec<(PathBuf, PathBuf)>,
    ) -> Result<()> {
        self.write_group(pending, schema)?;
        let temporary = self.temporary.clone();
        let (path, bytes, groups) = self.finish()?;
        finished.push((temporary, path));
        written.bytes += bytes;
        written.row_groups += groups;
        Ok(())
    }

    /// Writes the footer and syncs the file, still under its temporary name.
    fn finish(self) -> Result<(PathBuf, u64, usize)> {
        let temporary = self.temporary;
        let file = self
            .writer
            .into_inner()
            .map_err(|source| WriteError::ParquetWrite {
                path: temporary.clone(),
                source,
            })?;
        let io = |source| Error::io(&temporary, source);
        file.sync_all().map_err(io)?;
        let bytes = file.metadata().map_err(io)?.len();
        Ok((self.path, bytes, self.row_groups))
    }
}

fn writer_properties(class_names: &[String], rows_per_group: usize) -> Result<WriterProperties> {
    let names = serde_json::to_string(class_names).map_err(|error| {
        Error::InvalidSpec(format!("class names cannot be written as JSON: {error}"))
    })?;
    let image = ColumnPath::from("image");
    Ok(WriterProperties::builder()
        .set_max_row_group_row_count(Some(rows_per_group))
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_column_compression(image.clone(), Compression::UNCOMPRESSED)
        .set_column_dictionary_enabled(image.clone(), false)
        .set_column_statistics_enabled(image, EnabledStatistics::None)
        .set_key_value_metadata(Some(vec![KeyValue::new(
            CLASS_NAMES_KEY.to_string(),
            names,
        )]))
        .build())
}

/// Writes every sample of `source` as Parquet files into `out` (created; it must be empty).
/// `progress` is called with the number of samples written so far. The files are written under
/// temporary names and take theirs only once every sample is written, so a run stopped midway
/// (or failing on a sample) leaves no set a reader would open as whole.
pub fn write_parquet(
    source: &dyn SampleSource,
    out: &Path,
    options: &ParquetWriterOptions,
    progress: &dyn Fn(u64),
) -> Result<ParquetWritten> {
    std::fs::create_dir_all(out).map_err(|source| Error::io(out, source))?;
    let mut entries = std::fs::read_dir(out).map_err(|source| Error::io(out, source))?;
    if entries.next().is_some() {
        return Err(WriteError::ParquetOutputNotEmpty(out.to_path_buf()).into());
    }
    let rows_per_group = options.rows_per_group.max(1);
    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("image", DataType::Binary, false),
        Field::new("label", DataType::Int64, false),
    ]));
    let properties = writer_properties(source.class_names(), rows_per_group)?;

    let mut written = ParquetWritten {
        files: Vec::new(),
        samples: 0,
        row_groups: 0,
        bytes: 0,
    };
    let mut current: Option<OpenFile> = None;
    let mut placeholders = crate::files::Placeholders::default();
    let mut finished: Vec<(PathBuf, PathBuf)> = Vec::new();
    let mut pending = PendingRows::default();
    let result = (|| -> Result<()> {
        for index in 0..source.len() {
            let image = placeholders.read(source, index)?;
            let full = current.as_ref().is_some_and(|file| {
                file.rows + pending.len() as u64 > 0
                    && file.bytes_with(&pending) + image.len() as u64 > options.file_bytes
            });
            if full {
                if let Some(file) = current.take() {
                    file.close(&mut pending, &schema, &mut written, &mut finished)?;
                }
            }
            let file = match current.as_mut() {
                Some(file) => file,
                None => {
                    current.insert(OpenFile::create(out, finished.len(), &schema, &properties)?)
                }
            };
            pending.keys.push(format!("{index:08}"));
            pending.labels.push(source.label(index));
            pending.image_bytes += image.len() as u64;
            pending.images.push(image);
            if pending.len() >= rows_per_group {
                file.write_group(&mut pending, &schema)?;
            }
            written.samples += 1;
            progress(written.samples);
        }
        if let Some(file) = current.take() {
            file.close(&mut pending, &schema, &mut written, &mut finished)?;
        }
        placeholders.finish(source.len())
    })();
    if let Err(error) = result {
        remove_written_set(&finished, current.as_ref().map(|f| f.temporary.as_path()));
        return Err(error);
    }
    written.files = name_written_set(finished)?;
    info!(
        out = %out.display(),
        files = written.files.len(),
        row_groups = written.row_groups,
        samples = written.samples,
        bytes = written.bytes,
        "wrote parquet files"
    );
    Ok(written)
}
