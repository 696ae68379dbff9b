//! Sources whose samples are the rows of Arrow data decoded in chunks: Parquet files (a chunk
//! is a row group) and Hugging Face `save_to_disk` folders (a chunk is a record batch of an IPC
//! stream). Written once here for both: which chunk holds sample `i` ([`ArrowRows`]), the labels
//! and class names, what [`SampleSource`](crate::SampleSource) reports of them, and the numeric
//! columns the SelectColumns op reads ([`read_numeric`]). Each format gives its chunks and its
//! errors ([`ArrowChunks`]). Which column types they accept, and one cell of a decoded column,
//! is `columns.rs`.

pub(crate) mod columns;

use std::collections::BTreeMap;
use std::path::Path;

use arrow_array::{Array, ArrayRef};
use arrow_schema::{DataType, Schema};

use crate::error::{Error, Result};
use crate::sample_source::{NumericColumns, NumericKind};
use columns::Cell;

/// One chunk of rows, placed in the dataset's sample index.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChunkSpan {
    /// The file it is in.
    pub(crate) file: usize,
    /// Its number inside its file (row group, or record batch).
    pub(crate) chunk_in_file: usize,
    /// The file row of its first row.
    pub(crate) first_row_in_file: u64,
    pub(crate) rows: u64,
}

/// The rows of a chunked source: where each chunk starts in the sample index, and each
/// sample's label.
pub(crate) struct ArrowRows {
    spans: Vec<ChunkSpan>,
    /// The sample index of each chunk's first row.
    starts: Vec<u64>,
    len: u64,
    /// Per-sample labels; empty when there is no label column (every label is 0).
    labels: Vec<i64>,
    class_names: Vec<String>,
    /// What opening found that its user should be told once.
    notices: Vec<String>,
}

impl ArrowRows {
    /// The rows of `spans` (chunks without rows left out), in order.
    pub(crate) fn new(spans: Vec<ChunkSpan>, labels: Vec<i64>, class_names: Vec<String>) -> Self {
        let spans: Vec<ChunkSpan> = spans.into_iter().filter(|span| span.rows > 0).collect();
        let mut starts = Vec::with_capacity(spans.len());
        let mut len = 0u64;
        for span in &spans {
            starts.push(len);
            len = len.saturating_add(span.rows);
        }
        ArrowRows {
            spans,
            starts,
            len,
            labels,
            class_names,
            notices: Vec::new(),
        }
    }

    /// The same rows, with `notice` to tell the source's user.
    pub(crate) fn with_notice(mut self, notice: Option<String>) -> Self {
        self.notices.extend(notice);
        self
    }

    /// What opening found that the source's user should be told once.
    pub(crate) fn notices(&self) -> &[String] {
        &self.notices
    }

    /// Samples.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// The chunks, in sample order.
    pub(crate) fn spans(&self) -> &[ChunkSpan] {
        &self.spans
    }

    /// The class names.
    pub(crate) fn class_names(&self) -> &[String] {
        &self.class_names
    }

    /// The chunk holding sample `index`, its number, and the sample's row inside it.
    pub(crate) fn locate(&self, index: u64) -> Option<(usize, &ChunkSpan, u64)> {
        if index >= self.len {
            return None;
        }
        let chunk = self
            .starts
            .partition_point(|start| *start <= index)
            .checked_sub(1)?;
        let span = self.spans.get(chunk)?;
        let row = index - self.starts[chunk];
        (row < span.rows).then_some((chunk, span, row))
    }

    /// [`ArrowRows::locate`], or the error for an index past the samples.
    pub(crate) fn find(&self, index: u64) -> Result<(usize, &ChunkSpan, u64)> {
        self.locate(index).ok_or(Error::IndexOutOfRange {
            index,
            len: self.len,
        })
    }

    /// The label of sample `index` (0 without a label column).
    ///
    /// # Panics
    ///
    /// When `index` is past the samples, as [`SampleSource::label`](crate::SampleSource::label)
    /// allows; `what` names the dataset's kind in the message.
    pub(crate) fn label(&self, index: u64, what: &str) -> i64 {
        if index >= self.len {
            panic!(
                "sample index {index} is out of range for a {what} dataset of {} samples",
                self.len
            );
        }
        usize::try_from(index)
            .ok()
            .and_then(|index| self.labels.get(index))
            .copied()
            .unwrap_or(0)
    }

    /// Sample `index` as `FILE:row N`, the file being `file_path(span.file)`; out of range, a
    /// sentence naming the dataset's kind `what` and `root`.
    pub(crate) fn describe<'a>(
        &self,
        index: u64,
        file_path: impl Fn(usize) -> &'a Path,
        what: &str,
        root: &Path,
    ) -> String {
        match self.locate(index) {
            Some((_, span, row)) => format!(
                "{}:row {}",
                file_path(span.file).display(),
                span.first_row_in_file + row
            ),
            None => format!(
                "sample {index} (out of range for the {what} dataset at {} with {} samples)",
                root.display(),
                self.len
            ),
        }
    }

    /// A chunked source's `Debug`: `name`, its `root`, `files` files, its chunks counted under
    /// `chunks` (what the format calls them), samples, sample column and classes.
    pub(crate) fn debug_source(
        &self,
        formatter: &mut std::fmt::Formatter<'_>,
        (name, chunks): (&str, &str),
        root: &Path,
        files: usize,
        sample_column: &dyn std::fmt::Debug,
    ) -> std::fmt::Result {
        formatter
            .debug_struct(name)
            .field("root", &root)
            .field("files", &files)
            .field(chunks, &self.spans.len())
            .field("samples", &self.len)
            .field("sample_column", sample_column)
            .field("classes", &self.class_names.len())
            .finish()
    }

    /// Rows per chunk: chunks are the unit the files are read and decoded by.
    pub(crate) fn shard_sizes(&self) -> Vec<u64> {
        self.spans.iter().map(|span| span.rows).collect()
    }
}

/// Sample `index` of the chunks `spans` (in sample order) as `FILE:row N`, the file being
/// `file_path(span.file)`, before their [`ArrowRows`] is made (a label check names a row with
/// it); past them, `sample N`.
pub(crate) fn describe_in<'a>(
    spans: &[ChunkSpan],
    index: u64,
    file_path: impl Fn(usize) -> &'a Path,
) -> String {
    let mut start = 0u64;
    for span in spans {
        if index < start + span.rows {
            let row = span.first_row_in_file + (index - start);
            return format!("{}:row {row}", file_path(span.file).display());
        }
        start += span.rows;
    }
    format!("sample {index}")
}

/// The [`SampleSource`](crate::SampleSource) methods a chunked source answers from its
/// `rows` ([`ArrowRows`]), `files` (each with its `path`) and `root`, the same way for every
/// format; `$what` names the format in messages. Shards are chunks: the unit a file is read
/// and decoded by.
macro_rules! arrow_rows_source {
    ($what:literal) => {
        fn len(&self) -> u64 {
            self.rows.len()
        }

        fn label(&self, index: u64) -> i64 {
            self.rows.label(index, $what)
        }

        fn describe(&self, index: u64) -> String {
            let path = |file: usize| self.files[file].path.as_path();
            self.rows.describe(index, path, $what, &self.root)
        }

        fn class_names(&self) -> &[String] {
            self.rows.class_names()
        }

        fn shard_sizes(&self) -> Option<Vec<u64>> {
            Some(self.rows.shard_sizes())
        }

        fn numeric_columns(&self) -> Option<&dyn crate::sample_source::NumericColumns> {
            Some(self)
        }

        fn notices(&self) -> Vec<String> {
            self.rows.notices().to_vec()
        }
    };
}
pub(crate) use arrow_rows_source;

/// What a chunked format gives the readers written here.
pub(crate) trait ArrowChunks {
    /// Its rows.
    fn rows(&self) -> &ArrowRows;

    /// The schema of file `file`.
    fn schema(&self, file: usize) -> &Schema;

    /// How many files' schemas `schema` tells apart (1 where every file has the first one's).
    fn schemas(&self) -> usize;

    /// The error for column problem `problem` in file `file`.
    fn column_error(&self, file: usize, problem: String) -> Error;

    /// Columns `columns` (root indices, ascending, each once) of the chunk `span`, each as the
    /// arrays it decoded to, in row order.
    fn decode(&self, span: &ChunkSpan, columns: &[usize]) -> Result<Vec<Vec<ArrayRef>>>;

    /// The error for cell `column` of file row `row` of `span`'s file: null (`why` `None`) or
    /// holding a value that does not convert (`why` says how).
    fn cell_error(&self, span: &ChunkSpan, column: &str, row: u64, why: Option<String>) -> Error;
}

/// Every chunked source reads its numeric columns here.
impl<S: ArrowChunks> NumericColumns for S {
    fn numeric_kind(&self, name: &str) -> Result<NumericKind> {
        numeric_kind(self, name)
    }

    /// Integer and floating-point columns; 64-bit values are rounded to the nearest `f32`.
    fn read_f32_columns(&self, names: &[&str], rows: &[u64], out: &mut Vec<f32>) -> Result<()> {
        read_f32(self, names, rows, out)
    }

    /// Integer columns only: a floating-point column is refused rather than truncated.
    fn read_i64_columns(&self, names: &[&str], rows: &[u64], out: &mut Vec<i64>) -> Result<()> {
        read_i64(self, names, rows, out)
    }
}

/// Whether column `name` of `source` holds integers (in every file) or floats (in one file at
/// least: the integers of the others are read as floats too); a file without the column, or
/// with it of another type, refuses it, so a set of files written apart is refused when the job
/// opens rather than read as bad samples.
pub(crate) fn numeric_kind(source: &impl ArrowChunks, name: &str) -> Result<NumericKind> {
    let mut kind = NumericKind::Integer;
    for file in 0..source.schemas() {
        let schema = source.schema(file);
        let index = schema.index_of(name).map_err(|_| {
            let problem = if file == 0 {
                format!("no numeric column named {name:?}")
            } else {
                format!("no column named {name:?}, which the first file has")
            };
            source.column_error(file, problem)
        })?;
        let data_type = schema.field(index).data_type();
        if columns::is_integer(data_type) {
            continue;
        }
        if !columns::is_numeric(data_type) {
            return Err(source.column_error(
                file,
                format!("column {name:?} has type {data_type}, which is not numeric"),
            ));
        }
        kind = NumericKind::Float;
    }
    Ok(kind)
}

/// [`read_numeric`] as `f32`: integer and floating-point columns, 64-bit values rounded to the
/// nearest `f32`.
pub(crate) fn read_f32(
    source: &impl ArrowChunks,
    names: &[&str],
    rows: &[u64],
    out: &mut Vec<f32>,
) -> Result<()> {
    let (accepts, cell) = (columns::is_numeric, columns::float_cell);
    read_numeric(source, names, rows, out, "f32", accepts, cell)
}

/// [`read_numeric`] as `i64`: integer columns only (a floating-point column is refused rather
/// than truncated).
pub(crate) fn read_i64(
    source: &impl ArrowChunks,
    names: &[&str],
    rows: &[u64],
    out: &mut Vec<i64>,
) -> Result<()> {
    let (accepts, cell) = (columns::is_integer, columns::integer_cell);
    read_numeric(source, names, rows, out, "i64", accepts, cell)
}

/// Appends `columns` of each of `rows` of `source` to `out` as `T`, row-major (a `[rows.len(),
/// columns.len()]` tensor): each column must pass `accepts` and each cell convert by `cell`
/// (`type_name` names `T` in errors). Each chunk involved is decoded once per call, for the
/// columns asked only. On error `out` keeps only what it held before.
fn read_numeric<T: Copy + Default>(
    source: &impl ArrowChunks,
    columns: &[&str],
    rows: &[u64],
    out: &mut Vec<T>,
    type_name: &str,
    accepts: fn(&DataType) -> bool,
    cell: fn(&dyn Array, usize) -> Cell<T>,
) -> Result<()> {
    let table = source.rows();
    let width = columns.len();
    let base = out.len();
    // Output position of each row, grouped by chunk so each chunk decodes once.
    let mut by_chunk: BTreeMap<usize, Vec<(usize, u64)>> = BTreeMap::new();
    for (position, &index) in rows.iter().enumerate() {
        let (chunk, _, row) = table.find(index)?;
        by_chunk.entry(chunk).or_default().push((position, row));
    }
    out.resize(base + rows.len() * width, T::default());
    let result = (|| -> Result<()> {
        for (chunk, wanted) in by_chunk {
            let span = table.spans()[chunk];
            let schema = source.schema(span.file);
            let mut roots = Vec::with_capacity(width);
            for name in columns {
                let index = schema.index_of(name).map_err(|_| {
                    source.column_error(span.file, format!("no numeric column named {name:?}"))
                })?;
                let data_type = schema.field(index).data_type();
                if !accepts(data_type) {
                    return Err(source.column_error(
                        span.file,
                        format!(
                            "column {name:?} has type {data_type}, which does not convert to \
                             {type_name}"
                        ),
                    ));
                }
                roots.push(index);
            }
            let mut distinct = roots.clone();
            distinct.sort_unstable();
            distinct.dedup();
            let decoded = source.decode(&span, &distinct)?;
            for (slot, (name, root)) in columns.iter().zip(&roots).enumerate() {
                let Some(arrays) = distinct
                    .binary_search(root)
                    .ok()
                    .and_then(|at| decoded.get(at))
                else {
                    continue;
                };
                for &(position, row) in &wanted {
                    let problem = match chunk_cell(arrays, row, cell) {
                        Cell::Value(value) => {
                            out[base + position * width + slot] = value;
                            continue;
                        }
                        Cell::Null => None,
                        Cell::Unfit => Some(format!("does not fit {type_name}")),
                    };
                    return Err(source.cell_error(
                        &span,
                        name,
                        span.first_row_in_file + row,
                        problem,
                    ));
                }
            }
        }
        Ok(())
    })();
    if result.is_err() {
        out.truncate(base);
    }
    result
}

/// Cell `row` of a column decoded as consecutive arrays.
fn chunk_cell<T>(
    arrays: &[ArrayRef],
    mut row: u64,
    cell: fn(&dyn Array, usize) -> Cell<T>,
) -> Cell<T> {
    for array in arrays {
        let len = array.len() as u64;
        if row < len {
            return usize::try_from(row).map_or(Cell::Null, |row| cell(array.as_ref(), row));
        }
        row -= len;
    }
    Cell::Null
}
