//! Typed reads of numeric columns (integer and float `Value` features, `ClassLabel`s) for a
//! list of rows: the data behind the SelectColumns op, as for Parquet.

use std::collections::BTreeMap;

use arrow_array::Array;
use arrow_schema::DataType;

use super::HfDataset;
use crate::error::{Error, Result};
use crate::parquet_files::columns::{self, Cell};
use crate::sample_source::{NumericColumns, NumericKind};

impl NumericColumns for HfDataset {
    fn numeric_kind(&self, name: &str) -> Result<NumericKind> {
        let data_type = self.column_type(name)?;
        if columns::is_integer(data_type) {
            Ok(NumericKind::Integer)
        } else if columns::is_numeric(data_type) {
            Ok(NumericKind::Float)
        } else {
            Err(self.column_error(format!(
                "column {name:?} has type {data_type}, which is not numeric"
            )))
        }
    }

    /// Integer and floating-point columns; 64-bit values are rounded to the nearest `f32`.
    fn read_f32_columns(
        &self,
        columns: &[&str],
        indices: &[u64],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        self.read_numeric(
            columns,
            indices,
            out,
            "f32",
            columns::is_numeric,
            columns::float_cell,
        )
    }

    /// Integer columns only: a floating-point column is refused rather than truncated.
    fn read_i64_columns(
        &self,
        columns: &[&str],
        indices: &[u64],
        out: &mut Vec<i64>,
    ) -> Result<()> {
        self.read_numeric(
            columns,
            indices,
            out,
            "i64",
            columns::is_integer,
            columns::integer_cell,
        )
    }
}

impl HfDataset {
    fn column_error(&self, problem: String) -> Error {
        Error::HfDataset {
            path: self.root.clone(),
            problem,
        }
    }

    /// The Arrow type of column `name`.
    fn column_type(&self, name: &str) -> Result<&DataType> {
        let schema = &self.files[0].schema;
        schema
            .index_of(name)
            .map(|index| schema.field(index).data_type())
            .map_err(|_| self.column_error(format!("no numeric column named {name:?}")))
    }

    /// Appends `columns` of each of `rows` to `out`, row-major; each record batch involved is
    /// decoded once per call, for the columns asked only. On error `out` keeps only what it
    /// held before.
    fn read_numeric<T: Copy + Default>(
        &self,
        columns: &[&str],
        rows: &[u64],
        out: &mut Vec<T>,
        type_name: &str,
        accepts: fn(&DataType) -> bool,
        cell: fn(&dyn Array, usize) -> Cell<T>,
    ) -> Result<()> {
        let schema = &self.files[0].schema;
        let mut roots = Vec::with_capacity(columns.len());
        for name in columns {
            let data_type = self.column_type(name)?;
            if !accepts(data_type) {
                return Err(self.column_error(format!(
                    "column {name:?} has type {data_type}, which does not convert to {type_name}"
                )));
            }
            roots.push(
                schema
                    .index_of(name)
                    .map_err(|_| self.column_error(format!("no numeric column named {name:?}")))?,
            );
        }
        // Output position of each row, grouped by batch so each batch decodes once.
        let mut by_batch: BTreeMap<usize, Vec<(usize, u64)>> = BTreeMap::new();
        for (position, &index) in rows.iter().enumerate() {
            let (batch, _, row) = self.locate(index).ok_or(Error::IndexOutOfRange {
                index,
                len: self.len,
            })?;
            by_batch.entry(batch).or_default().push((position, row));
        }
        let width = columns.len();
        let base = out.len();
        out.resize(base + rows.len() * width, T::default());
        let result = (|| -> Result<()> {
            for (batch, wanted) in by_batch {
                let span = self.batches[batch];
                let file = &self.files[span.file];
                let decoded = file.read_columns(span.batch_in_file, &roots)?;
                for (slot, name) in columns.iter().enumerate() {
                    let values = decoded.column(slot);
                    for &(position, row) in &wanted {
                        let value = usize::try_from(row)
                            .map_or(Cell::Null, |row| cell(values.as_ref(), row));
                        let problem = match value {
                            Cell::Value(value) => {
                                out[base + position * width + slot] = value;
                                continue;
                            }
                            Cell::Null => "has no value (null)".to_string(),
                            Cell::Unfit => format!("does not fit {type_name}"),
                        };
                        return Err(Error::HfValue {
                            path: file.path.clone(),
                            column: (*name).to_string(),
                            row: span.first_row_in_file + row,
                            problem,
                        });
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
}
