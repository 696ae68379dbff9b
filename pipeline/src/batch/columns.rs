//! Parquet numeric columns (SelectColumns) into a batch: each column's output type checked
//! against the source when the job opens, one read for the whole batch, and per-sample reads
//! under the bad-input policy only when that read fails.

use std::time::Instant;

use rayon::prelude::*;
use stoker_datasets::{NumericKind, SampleSource};
use stoker_proto::v1 as proto;

use super::bad_sample_policy::SampleOutcome;
use super::{AssembledBatch, BatchAssembler};
use crate::error::{Error, Result};
use crate::job_pipeline::SelectedColumns;

/// One selected column and the type its tensor holds.
#[derive(Debug, Clone)]
pub(super) struct OutputColumn {
    pub(super) name: String,
    pub(super) kind: NumericKind,
}

impl OutputColumn {
    pub(super) fn dtype(&self) -> proto::Dtype {
        match self.kind {
            NumericKind::Integer => proto::Dtype::Int64,
            NumericKind::Float => proto::Dtype::Float32,
        }
    }

    pub(super) fn size(&self) -> usize {
        match self.kind {
            NumericKind::Integer => 8,
            NumericKind::Float => 4,
        }
    }
}

/// One sample's (or a batch's) values of the selected columns, row-major per kind.
#[derive(Debug, Default)]
struct ColumnValues {
    integers: Vec<i64>,
    floats: Vec<f32>,
}

/// Checks SelectColumns against the source and gives each column's output type.
pub(super) fn output_columns(
    source: &dyn SampleSource,
    selected: &SelectedColumns,
) -> Result<Vec<OutputColumn>> {
    let numeric = source.numeric_columns().ok_or_else(|| {
        Error::InvalidSpec(
            "SelectColumns reads numeric columns of Parquet sources; this source has none".into(),
        )
    })?;
    selected
        .names
        .iter()
        .map(|name| {
            let own = numeric
                .numeric_kind(name)
                .map_err(|error| Error::InvalidSpec(format!("SelectColumns: {error}")))?;
            let kind = match (selected.dtype, own) {
                (proto::Dtype::Int64, NumericKind::Float) => {
                    return Err(Error::InvalidSpec(format!(
                        "SelectColumns asks for int64 but column {name:?} holds floating-point \
                         values; ask for FLOAT32 or leave the dtype unspecified"
                    )))
                }
                (proto::Dtype::Float32, _) => NumericKind::Float,
                (_, own) => own,
            };
            Ok(OutputColumn {
                name: name.clone(),
                kind,
            })
        })
        .collect()
}

impl BatchAssembler {
    /// The selected columns of `indices` into their tensors: one read for the whole batch,
    /// and when that fails, one read per sample under the bad-input policy (a null cell or a
    /// damaged row group is then a bad sample, substituted or fatal like an image).
    pub(super) fn assemble_columns(
        &self,
        indices: &[u64],
        buffer: &mut [u8],
        assembled: &mut AssembledBatch,
    ) -> Result<()> {
        let started = Instant::now();
        // Marked as a read of the batch's first sample (the whole batch is one read).
        let reading = self.mark_read(indices.first().copied().unwrap_or(0));
        let whole = self.read_columns(indices);
        drop(reading);
        let values = match whole {
            Ok(values) => {
                assembled.timings.read_ns += started.elapsed().as_nanos() as u64;
                if self.column_labels {
                    assembled
                        .labels
                        .extend(indices.iter().map(|&index| self.source.label(index)));
                }
                values
            }
            Err(error) => {
                tracing::debug!(%error, "batch column read failed; reading sample by sample");
                let outcomes: Vec<Result<SampleOutcome<ColumnValues>>> = indices
                    .par_iter()
                    .map(|&index| {
                        self.with_policy(index, |source_index, timings| {
                            let started = Instant::now();
                            let values = self
                                .read_watched(source_index, || self.read_columns(&[source_index]));
                            timings.read_ns += started.elapsed().as_nanos() as u64;
                            values
                        })
                    })
                    .collect();
                let mut values = ColumnValues::default();
                for outcome in outcomes {
                    let outcome = outcome?;
                    values.integers.extend(outcome.value.integers);
                    values.floats.extend(outcome.value.floats);
                    if self.column_labels {
                        assembled.labels.push(self.source.label(outcome.used));
                    }
                    assembled.timings.add(&outcome.timings);
                    assembled.bad_samples.extend(outcome.bad);
                }
                values
            }
        };
        let started = Instant::now();
        let integer_width = self.integer_columns().count();
        let float_width = self.columns.len() - integer_width;
        let (mut integer_slot, mut float_slot) = (0, 0);
        for (column, layout) in self.columns.iter().zip(&assembled.tensors) {
            let dest = &mut buffer[layout.bytes.clone()];
            match column.kind {
                NumericKind::Integer => {
                    let values = values.integers.iter().skip(integer_slot);
                    for (cell, value) in dest.chunks_exact_mut(8).zip(values.step_by(integer_width))
                    {
                        cell.copy_from_slice(&value.to_le_bytes());
                    }
                    integer_slot += 1;
                }
                NumericKind::Float => {
                    let values = values.floats.iter().skip(float_slot);
                    for (cell, value) in dest.chunks_exact_mut(4).zip(values.step_by(float_width)) {
                        cell.copy_from_slice(&value.to_le_bytes());
                    }
                    float_slot += 1;
                }
            }
        }
        assembled.timings.assemble_ns += started.elapsed().as_nanos() as u64;
        Ok(())
    }

    fn integer_columns(&self) -> impl Iterator<Item = &str> {
        self.columns
            .iter()
            .filter(|column| column.kind == NumericKind::Integer)
            .map(|column| column.name.as_str())
    }

    /// The selected columns of `indices`: integer columns as `i64`, float ones as `f32`, each
    /// row-major over its own columns.
    fn read_columns(&self, indices: &[u64]) -> stoker_datasets::Result<ColumnValues> {
        let mut values = ColumnValues::default();
        let Some(numeric) = self.source.numeric_columns() else {
            return Ok(values);
        };
        let integers: Vec<&str> = self.integer_columns().collect();
        let floats: Vec<&str> = self
            .columns
            .iter()
            .filter(|column| column.kind == NumericKind::Float)
            .map(|column| column.name.as_str())
            .collect();
        if !integers.is_empty() {
            numeric.read_i64_columns(&integers, indices, &mut values.integers)?;
        }
        if !floats.is_empty() {
            numeric.read_f32_columns(&floats, indices, &mut values.floats)?;
        }
        Ok(values)
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Arc;

    use stoker_datasets::NumericColumns;
    use stoker_proto::v1::BadSamplePolicy;

    use super::*;
    use crate::batch::{Batch, BatchKey, Tensor};
    use crate::job_pipeline::JobPipeline;

    /// An in-memory table: `i` int (null at `null_row`), `f` float, `s` text, labels `10 * i`.
    struct Table {
        rows: u64,
        null_row: Option<u64>,
        numeric: bool,
    }

    impl Table {
        fn new(rows: u64) -> Arc<Table> {
            Arc::new(Table {
                rows,
                null_row: None,
                numeric: true,
            })
        }

        fn column_error(name: &str) -> stoker_datasets::Error {
            stoker_datasets::Error::ParquetColumn {
                path: PathBuf::from("table.parquet"),
                problem: format!("no numeric column named {name:?}"),
            }
        }

        fn cell(&self, name: &str, row: u64) -> stoker_datasets::Result<f64> {
            match name {
                "i" | "label" if self.null_row == Some(row) => {
                    Err(stoker_datasets::Error::ParquetNullCell {
                        path: PathBuf::from("table.parquet"),
                        column: name.into(),
                        row,
                    })
                }
                "i" => Ok(row as f64 * 3.0),
                "label" => Ok(row as f64 * 10.0),
                "f" => Ok(row as f64 + 0.5),
                other => Err(Table::column_error(other)),
            }
        }
    }

    impl SampleSource for Table {
        fn len(&self) -> u64 {
            self.rows
        }
        fn label(&self, index: u64) -> i64 {
            index as i64 * 10
        }
        fn describe(&self, index: u64) -> String {
            format!("table.parquet:row {index}")
        }
        fn read(&self, _index: u64) -> stoker_datasets::Result<Vec<u8>> {
            Ok(Vec::new())
        }
        fn class_names(&self) -> &[String] {
            &[]
        }
        fn numeric_columns(&self) -> Option<&dyn NumericColumns> {
            self.numeric.then_some(self as &dyn NumericColumns)
        }
    }

    impl NumericColumns for Table {
        fn numeric_kind(&self, name: &str) -> stoker_datasets::Result<NumericKind> {
            match name {
                "i" | "label" => Ok(NumericKind::Integer),
                "f" => Ok(NumericKind::Float),
                other => Err(Table::column_error(other)),
            }
        }
        fn read_f32_columns(
            &self,
            columns: &[&str],
            indices: &[u64],
            out: &mut Vec<f32>,
        ) -> stoker_datasets::Result<()> {
            for &row in indices {
                for name in columns {
                    out.push(self.cell(name, row)? as f32);
                }
            }
            Ok(())
        }
        fn read_i64_columns(
            &self,
            columns: &[&str],
            indices: &[u64],
            out: &mut Vec<i64>,
        ) -> stoker_datasets::Result<()> {
            for &row in indices {
                for name in columns {
                    if *name == "f" {
                        return Err(Table::column_error(name));
                    }
                    out.push(self.cell(name, row)? as i64);
                }
            }
            Ok(())
        }
    }

    fn columns(names: &[&str], dtype: proto::Dtype) -> JobPipeline {
        JobPipeline::Columns(SelectedColumns {
            names: names.iter().map(|name| name.to_string()).collect(),
            dtype,
        })
    }

    fn assembler(
        source: Arc<Table>,
        names: &[&str],
        dtype: proto::Dtype,
        policy: BadSamplePolicy,
    ) -> Result<BatchAssembler> {
        BatchAssembler::new(source, columns(names, dtype), 1, policy)
    }

    fn key() -> BatchKey {
        BatchKey {
            epoch: 0,
            rank: 0,
            step: 0,
        }
    }

    fn ints(tensor: &Tensor) -> Vec<i64> {
        tensor
            .elements()
            .unwrap_or_else(|| panic!("{} is not int64", tensor.name))
    }

    fn floats(tensor: &Tensor) -> Vec<f32> {
        tensor
            .elements()
            .unwrap_or_else(|| panic!("{} is not float32", tensor.name))
    }

    fn named<'a>(batch: &'a Batch, name: &str) -> &'a Tensor {
        batch.tensor(name).unwrap()
    }

    #[test]
    fn columns_are_checked_against_the_source_when_the_assembler_is_built() {
        let skip = BadSamplePolicy::Skip;
        let error = assembler(
            Table::new(4),
            &["i", "nope"],
            proto::Dtype::Unspecified,
            skip,
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            error.contains("invalid job spec") && error.contains("\"nope\""),
            "{error}"
        );
        let error = assembler(Table::new(4), &["i", "f"], proto::Dtype::Int64, skip)
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("column \"f\"") && error.contains("int64"),
            "{error}"
        );
        let without = Arc::new(Table {
            rows: 4,
            null_row: None,
            numeric: false,
        });
        let error = assembler(without, &["i"], proto::Dtype::Unspecified, skip)
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("numeric columns of Parquet"), "{error}");
        assert!(assembler(Table::new(4), &["i"], proto::Dtype::Int64, skip).is_ok());
    }

    #[test]
    fn one_aligned_tensor_per_column_in_its_own_or_the_asked_type() {
        let skip = BadSamplePolicy::Skip;
        let own = assembler(Table::new(8), &["f", "i"], proto::Dtype::Unspecified, skip).unwrap();
        let layout = own.layout(3);
        let summary: Vec<_> = layout
            .iter()
            .map(|t| (t.name.as_str(), t.dtype, t.shape.clone(), t.bytes.clone()))
            .collect();
        assert_eq!(
            summary,
            [
                ("f", proto::Dtype::Float32, vec![3], 0..12),
                ("i", proto::Dtype::Int64, vec![3], 16..40),
            ]
        );
        assert_eq!(own.batch_bytes(3), 40);
        let batch = own.assemble(key(), &[5, 0, 7]).unwrap();
        assert_eq!(floats(named(&batch, "f")), [5.5, 0.5, 7.5]);
        assert_eq!(ints(named(&batch, "i")), [15, 0, 21]);
        assert_eq!(ints(named(&batch, "label")), [50, 0, 70]);
        assert_eq!(batch.tensors.len(), 3);
        assert!(batch.bad_samples.is_empty());

        let as_float = assembler(Table::new(8), &["i", "f"], proto::Dtype::Float32, skip).unwrap();
        assert_eq!(as_float.batch_bytes(3), 16 + 12);
        let batch = as_float.assemble(key(), &[1, 2, 3]).unwrap();
        assert_eq!(floats(named(&batch, "i")), [3.0, 6.0, 9.0]);
        assert_eq!(floats(named(&batch, "f")), [1.5, 2.5, 3.5]);
    }

    #[test]
    fn a_selected_label_column_is_the_only_label_tensor() {
        let skip = BadSamplePolicy::Skip;
        let own = assembler(
            Table::new(8),
            &["label", "f"],
            proto::Dtype::Unspecified,
            skip,
        )
        .unwrap();
        let batch = own.assemble(key(), &[2, 4]).unwrap();
        let names: Vec<&str> = batch.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["label", "f"]);
        assert_eq!(ints(named(&batch, "label")), [20, 40]);
    }

    #[test]
    fn a_null_cell_follows_the_bad_input_policy() {
        let table = Arc::new(Table {
            rows: 6,
            null_row: Some(2),
            numeric: true,
        });
        let skip = assembler(
            Arc::clone(&table),
            &["i", "f"],
            proto::Dtype::Unspecified,
            BadSamplePolicy::Skip,
        )
        .unwrap();
        let batch = skip.assemble(key(), &[1, 2, 5]).unwrap();
        // Sample 2 is replaced by the next readable row, 3, in every tensor.
        assert_eq!(ints(named(&batch, "i")), [3, 9, 15]);
        assert_eq!(floats(named(&batch, "f")), [1.5, 3.5, 5.5]);
        assert_eq!(ints(named(&batch, "label")), [10, 30, 50]);
        assert_eq!(batch.bad_samples.len(), 1);
        let bad = &batch.bad_samples[0];
        assert_eq!((bad.sample_index, bad.substitute_index), (2, 3));
        assert!(bad.reason.contains("column i"), "{}", bad.reason);
        assert_eq!(skip.bad_samples_seen(), 1);
        // Batches without the bad row take the whole-batch read and match.
        let again = skip.assemble(key(), &[1, 3, 5]).unwrap();
        assert_eq!(again.tensors, batch.tensors);

        let fail = assembler(
            table,
            &["i"],
            proto::Dtype::Unspecified,
            BadSamplePolicy::Fail,
        )
        .unwrap();
        let error = fail.assemble(key(), &[0, 2]).unwrap_err().to_string();
        assert!(
            error.contains("bad sample 2") && error.contains("table.parquet:row 2"),
            "{error}"
        );
    }
}
