//! Typed reads of numeric columns for a list of rows: the data behind the SelectColumns op,
//! which turns named scalar columns into tensors. The reading is `arrow_rows/`'s, shared with
//! Hugging Face folders; this gives it the row groups and the Parquet errors.

use arrow_array::ArrayRef;
use arrow_schema::Schema;

use super::ParquetDataset;
use crate::arrow_rows::{ArrowChunks, ArrowRows, ChunkSpan};
use crate::error::{Error, Result};
use crate::sample_source::{NumericColumns, NumericKind};

impl ParquetDataset {
    /// Whether column `name` (in the first file's schema) holds integers or floats.
    pub fn numeric_kind(&self, name: &str) -> Result<NumericKind> {
        NumericColumns::numeric_kind(self, name)
    }

    /// Appends the values of `columns` for each of `rows` to `out` as `f32`, row-major: row
    /// `rows[0]`'s columns in the order given, then `rows[1]`'s, and so on (a `[rows.len(),
    /// columns.len()]` tensor). Integer and floating-point columns are accepted; 64-bit values
    /// are rounded to the nearest `f32`.
    ///
    /// Each row group involved is decoded once per call, for the columns asked only. A
    /// missing column, a non-numeric one, a null cell or a damaged row group is an error
    /// naming the file (and row); `out` then keeps only what it held before.
    pub fn read_f32_columns(
        &self,
        columns: &[&str],
        rows: &[u64],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        NumericColumns::read_f32_columns(self, columns, rows, out)
    }

    /// Like [`ParquetDataset::read_f32_columns`], as `i64`, for integer columns (token ids,
    /// class indices, counts); a floating-point column is refused rather than truncated.
    pub fn read_i64_columns(
        &self,
        columns: &[&str],
        rows: &[u64],
        out: &mut Vec<i64>,
    ) -> Result<()> {
        NumericColumns::read_i64_columns(self, columns, rows, out)
    }
}

impl ArrowChunks for ParquetDataset {
    fn rows(&self) -> &ArrowRows {
        &self.rows
    }

    fn schema(&self, file: usize) -> &Schema {
        self.files[file].metadata.schema()
    }

    fn schemas(&self) -> usize {
        self.files.len()
    }

    fn column_error(&self, file: usize, problem: String) -> Error {
        Error::ParquetColumn {
            path: self.files[file].path.clone(),
            problem,
        }
    }

    fn decode(&self, span: &ChunkSpan, columns: &[usize]) -> Result<Vec<Vec<ArrayRef>>> {
        self.decode_columns(span, columns)
    }

    fn cell_error(&self, span: &ChunkSpan, column: &str, row: u64, why: Option<String>) -> Error {
        let path = self.files[span.file].path.clone();
        let column = column.to_string();
        match why {
            None => Error::ParquetNullCell { path, column, row },
            Some(problem) => Error::ParquetValue {
                path,
                column,
                row,
                problem,
            },
        }
    }
}
