//! Typed reads of numeric columns for a list of rows: the data behind the SelectColumns op,
//! which turns named scalar columns into tensors.

use std::collections::BTreeMap;

use arrow_array::ArrayRef;

use super::columns::{self, Cell};
use super::ParquetDataset;
use crate::error::{Error, Result};
use crate::sample_source::{NumericColumns, NumericKind};

impl NumericColumns for ParquetDataset {
    fn numeric_kind(&self, name: &str) -> Result<NumericKind> {
        ParquetDataset::numeric_kind(self, name)
    }

    fn read_f32_columns(
        &self,
        columns: &[&str],
        indices: &[u64],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        ParquetDataset::read_f32_columns(self, columns, indices, out)
    }

    fn read_i64_columns(
        &self,
        columns: &[&str],
        indices: &[u64],
        out: &mut Vec<i64>,
    ) -> Result<()> {
        ParquetDataset::read_i64_columns(self, columns, indices, out)
    }
}

impl ParquetDataset {
    /// Whether column `name` (in the first file's schema) holds integers or floats.
    pub fn numeric_kind(&self, name: &str) -> Result<NumericKind> {
        let Some(file) = self.files.first() else {
            return Err(Error::NoParquetRows(self.root.clone()));
        };
        let schema = file.metadata.schema();
        let problem = |problem: String| Error::ParquetColumn {
            path: file.path.clone(),
            problem,
        };
        let index = schema
            .index_of(name)
            .map_err(|_| problem(format!("no numeric column named {name:?}")))?;
        let data_type = schema.field(index).data_type();
        if columns::is_integer(data_type) {
            Ok(NumericKind::Integer)
        } else if columns::is_numeric(data_type) {
            Ok(NumericKind::Float)
        } else {
            Err(problem(format!(
                "column {name:?} has type {data_type}, which is not numeric"
            )))
        }
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
        self.read_numeric(
            columns,
            rows,
            out,
            "f32",
            columns::is_numeric,
            columns::float_cell,
        )
    }

    /// Like [`ParquetDataset::read_f32_columns`], as `i64`, for integer columns (token ids,
    /// class indices, counts); a floating-point column is refused rather than truncated.
    pub fn read_i64_columns(
        &self,
        columns: &[&str],
        rows: &[u64],
        out: &mut Vec<i64>,
    ) -> Result<()> {
        self.read_numeric(
            columns,
            rows,
            out,
            "i64",
            columns::is_integer,
            columns::integer_cell,
        )
    }

    fn read_numeric<T: Copy + Default>(
        &self,
        columns: &[&str],
        rows: &[u64],
        out: &mut Vec<T>,
        type_name: &str,
        accepts: fn(&arrow_schema::DataType) -> bool,
        cell: fn(&dyn arrow_array::Array, usize) -> Cell<T>,
    ) -> Result<()> {
        let width = columns.len();
        let base = out.len();
        // Output position of each row, grouped by row group so each group decodes once.
        let mut by_group: BTreeMap<usize, Vec<(usize, u64)>> = BTreeMap::new();
        for (position, &index) in rows.iter().enumerate() {
            let (group, _, row) = self.locate(index).ok_or(Error::IndexOutOfRange {
                index,
                len: self.len,
            })?;
            by_group.entry(group).or_default().push((position, row));
        }
        out.resize(base + rows.len() * width, T::default());
        let result = (|| -> Result<()> {
            for (group, wanted) in by_group {
                let span = self.groups[group];
                let file = &self.files[span.file];
                let schema = file.metadata.schema();
                let mut roots = Vec::with_capacity(width);
                for name in columns {
                    let index = schema.index_of(name).map_err(|_| Error::ParquetColumn {
                        path: file.path.clone(),
                        problem: format!("no numeric column named {name:?}"),
                    })?;
                    let data_type = schema.field(index).data_type();
                    if !accepts(data_type) {
                        return Err(Error::ParquetColumn {
                            path: file.path.clone(),
                            problem: format!(
                                "column {name:?} has type {data_type}, which does not convert \
                                 to {type_name}"
                            ),
                        });
                    }
                    roots.push(index);
                }
                // The projection yields columns in schema order, once each.
                let mut distinct = roots.clone();
                distinct.sort_unstable();
                distinct.dedup();
                let decoded = self.decode_columns(&span, &distinct)?;
                for (slot, (name, root)) in columns.iter().zip(&roots).enumerate() {
                    let Ok(projected) = distinct.binary_search(root) else {
                        continue;
                    };
                    let chunks = &decoded[projected];
                    for &(position, row) in &wanted {
                        let value = match chunk_cell(chunks, row, cell) {
                            Cell::Value(value) => value,
                            Cell::Null => {
                                return Err(Error::ParquetNullCell {
                                    path: file.path.clone(),
                                    column: (*name).to_string(),
                                    row: span.first_row_in_file + row,
                                })
                            }
                            Cell::Unfit => {
                                return Err(Error::ParquetValue {
                                    path: file.path.clone(),
                                    column: (*name).to_string(),
                                    row: span.first_row_in_file + row,
                                    problem: format!("does not fit {type_name}"),
                                })
                            }
                        };
                        out[base + position * width + slot] = value;
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

/// Cell `row` of a column decoded as consecutive chunks.
fn chunk_cell<T>(
    chunks: &[ArrayRef],
    mut row: u64,
    cell: fn(&dyn arrow_array::Array, usize) -> Cell<T>,
) -> Cell<T> {
    for chunk in chunks {
        let len = chunk.len() as u64;
        if row < len {
            return usize::try_from(row).map_or(Cell::Null, |row| cell(chunk.as_ref(), row));
        }
        row -= len;
    }
    Cell::Null
}
