//! Typed reads of numeric columns (integer and float `Value` features, `ClassLabel`s) for a
//! list of rows: the data behind the SelectColumns op, read as for Parquet (`arrow_rows/`);
//! this gives that reader the record batches and the folder's errors.

use std::sync::Arc;

use arrow_array::ArrayRef;
use arrow_schema::Schema;

use super::HfDataset;
use crate::arrow_rows::{ArrowChunks, ArrowRows, ChunkSpan};
use crate::error::{Error, Result};

impl ArrowChunks for HfDataset {
    fn rows(&self) -> &ArrowRows {
        &self.rows
    }

    /// Every shard has the first one's columns (checked when the folder opens).
    fn schema(&self, _file: usize) -> &Schema {
        &self.files[0].schema
    }

    fn schemas(&self) -> usize {
        1
    }

    fn column_error(&self, _file: usize, problem: String) -> Error {
        Error::HfDataset {
            path: self.root.clone(),
            problem,
        }
    }

    fn decode(&self, span: &ChunkSpan, columns: &[usize]) -> Result<Vec<Vec<ArrayRef>>> {
        let decoded = self.files[span.file].read_columns(span.chunk_in_file, columns)?;
        Ok(decoded
            .columns()
            .iter()
            .map(|column| vec![Arc::clone(column)])
            .collect())
    }

    fn cell_error(&self, span: &ChunkSpan, column: &str, row: u64, why: Option<String>) -> Error {
        Error::HfValue {
            path: self.files[span.file].path.clone(),
            column: column.to_string(),
            row,
            problem: why.unwrap_or_else(|| "has no value (null)".into()),
        }
    }
}
