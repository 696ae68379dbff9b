//! Parquet numeric columns through `SelectColumns` and the embedded `Loader`: one tensor per
//! column with each sample's own values, every row exactly once per epoch, the same batches for
//! any thread count, null cells under both bad-input policies, and bad column lists refused
//! when the job opens.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use arrow_array::{ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use stoker_loader::{Loader, LoaderOptions};

use crate::common::{digest, elements, tensor, try_epoch as epoch};
use stoker_loader::Batch;
use stoker_proto::v1::{self as proto, op::Op as OpKind, BadSamplePolicy, JobSpec};

const ROWS: i32 = 45;

fn x_of(row: i32) -> f64 {
    f64::from(row) / 4.0 - 3.0
}

fn n_of(row: i32) -> i64 {
    i64::from(row) * 7 - 50
}

/// A table of `ROWS` rows in row groups of 7: a text column, float `x`, int32 `n` (null at
/// `null_row`) and `label`.
fn write_table(path: &Path, null_row: Option<i32>) {
    write_columns(path, null_row, true);
}

/// Like [`write_table`], with the text column only when `text` (without it the file holds
/// numbers only).
fn write_columns(path: &Path, null_row: Option<i32>, text: bool) {
    let mut columns: Vec<(&str, ArrayRef)> = vec![(
        "text",
        Arc::new(StringArray::from_iter_values(
            (0..ROWS).map(|i| format!("row {i}")),
        )),
    )];
    if !text {
        columns.clear();
    }
    columns.extend([
        (
            "x",
            Arc::new(Float64Array::from_iter_values((0..ROWS).map(x_of))) as ArrayRef,
        ),
        (
            "n",
            Arc::new(Int32Array::from_iter(
                (0..ROWS).map(|i| (Some(i) != null_row).then_some(n_of(i) as i32)),
            )) as ArrayRef,
        ),
        (
            "label",
            Arc::new(Int64Array::from_iter_values(
                (0..ROWS).map(|i| i64::from(i % 5)),
            )) as ArrayRef,
        ),
    ]);
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let properties = WriterProperties::builder()
        .set_max_row_group_row_count(Some(7))
        .build();
    let file = std::fs::File::create(path).unwrap();
    let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(properties)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
}

fn spec(path: &Path, names: &[&str], dtype: proto::Dtype, on_error: BadSamplePolicy) -> JobSpec {
    let select = proto::Op {
        op: Some(OpKind::SelectColumns(proto::SelectColumns {
            names: names.iter().map(|name| name.to_string()).collect(),
            dtype: dtype as i32,
        })),
    };
    let uri = format!("file://{}", path.display());
    JobSpec {
        on_error: on_error as i32,
        ..crate::common::spec_over(&uri, vec![select], 8)
    }
}

/// Each sample's (x, n, label) over an epoch, checking shapes on the way.
fn per_sample(batches: &[Batch]) -> BTreeMap<u64, Vec<(f32, i64, i64)>> {
    let mut seen: BTreeMap<u64, Vec<(f32, i64, i64)>> = BTreeMap::new();
    for batch in batches {
        let names: Vec<&str> = batch.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["x", "n", "label"]);
        let size = batch.sample_indices.len() as u64;
        for t in &batch.tensors {
            assert_eq!(t.shape, [size], "{}", t.name);
        }
        let x = elements::<f32>(tensor(batch, "x"));
        let n = elements::<i64>(tensor(batch, "n"));
        let label = elements::<i64>(tensor(batch, "label"));
        for (slot, &index) in batch.sample_indices.iter().enumerate() {
            seen.entry(index)
                .or_default()
                .push((x[slot], n[slot], label[slot]));
        }
    }
    seen
}

#[test]
fn columns_give_each_sample_its_values_once_per_epoch_for_any_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("table.parquet");
    write_table(&path, None);
    let spec = spec(
        &path,
        &["x", "n"],
        proto::Dtype::Unspecified,
        BadSamplePolicy::Fail,
    );
    let one = epoch(&spec, 1, 0).unwrap();
    assert_eq!(one.len(), 6, "45 rows in batches of 8");
    let seen = per_sample(&one);
    assert_eq!(seen.len(), ROWS as usize, "every row once");
    for (&index, values) in &seen {
        let row = index as i32;
        let expected = (x_of(row) as f32, n_of(row), i64::from(row % 5));
        assert_eq!(values, &[expected], "sample {index}");
    }
    assert!(one.iter().all(|b| b.bad_samples.is_empty()));
    let order: Vec<u64> = one.iter().flat_map(|b| b.sample_indices.clone()).collect();
    assert_ne!(order, (0..ROWS as u64).collect::<Vec<_>>(), "shuffled");

    for threads in [2, 4] {
        assert_eq!(digest(&epoch(&spec, threads, 0).unwrap()), digest(&one));
    }
    let next = epoch(&spec, 2, 1).unwrap();
    assert_ne!(digest(&next), digest(&one), "another epoch, another order");
    assert_eq!(per_sample(&next), seen);
}

#[test]
fn float32_converts_integer_columns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("table.parquet");
    write_table(&path, None);
    let spec = spec(
        &path,
        &["n", "x"],
        proto::Dtype::Float32,
        BadSamplePolicy::Fail,
    );
    for batch in epoch(&spec, 2, 0).unwrap() {
        let n = elements::<f32>(tensor(&batch, "n"));
        let x = elements::<f32>(tensor(&batch, "x"));
        for (slot, &index) in batch.sample_indices.iter().enumerate() {
            assert_eq!(n[slot], n_of(index as i32) as f32, "sample {index}");
            assert_eq!(x[slot], x_of(index as i32) as f32, "sample {index}");
        }
    }
}

#[test]
fn a_null_cell_is_a_bad_sample_under_either_policy() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("table.parquet");
    write_table(&path, Some(11));
    let skip = spec(
        &path,
        &["x", "n"],
        proto::Dtype::Unspecified,
        BadSamplePolicy::Skip,
    );
    let batches = epoch(&skip, 2, 0).unwrap();
    let bad: Vec<&proto::BadSample> = batches.iter().flat_map(|b| &b.bad_samples).collect();
    assert_eq!(bad.len(), 1);
    assert_eq!((bad[0].sample_index, bad[0].substitute_index), (11, 12));
    assert!(
        bad[0].path.contains("table.parquet:row 11"),
        "{}",
        bad[0].path
    );
    let seen = per_sample(&batches);
    // Slot 11 holds row 12's values; every other sample its own.
    assert_eq!(seen[&11], [(x_of(12) as f32, n_of(12), 2)]);
    assert_eq!(seen[&12], [(x_of(12) as f32, n_of(12), 2)]);
    assert_eq!(seen.len(), ROWS as usize);
    assert_eq!(digest(&epoch(&skip, 1, 0).unwrap()), digest(&batches));

    let fail = spec(
        &path,
        &["n"],
        proto::Dtype::Unspecified,
        BadSamplePolicy::Fail,
    );
    let error = epoch(&fail, 2, 0).unwrap_err().to_string();
    assert!(error.contains("bad sample 11"), "{error}");
    assert!(error.contains("null"), "{error}");
}

#[test]
fn bad_column_lists_are_refused_when_the_job_opens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("table.parquet");
    write_table(&path, None);
    let open = |names: &[&str], dtype| {
        Loader::new(
            spec(&path, names, dtype, BadSamplePolicy::Skip),
            LoaderOptions::default(),
        )
        .err()
        .map(|error| error.to_string())
        .unwrap_or_default()
    };
    let error = open(&["x", "missing"], proto::Dtype::Unspecified);
    assert!(error.contains("\"missing\""), "{error}");
    let error = open(&["text"], proto::Dtype::Unspecified);
    assert!(
        error.contains("\"text\"") && error.contains("not numeric"),
        "{error}"
    );
    let error = open(&["n", "x"], proto::Dtype::Int64);
    assert!(
        error.contains("column \"x\"") && error.contains("int64"),
        "{error}"
    );
    let error = open(&["n", "n"], proto::Dtype::Unspecified);
    assert!(error.contains("twice"), "{error}");
    assert_eq!(open(&["n"], proto::Dtype::Int64), "");
}

#[test]
fn a_numeric_only_file_reads_like_the_same_columns_beside_text() {
    let dir = tempfile::tempdir().unwrap();
    let with_text = dir.path().join("with_text.parquet");
    let numbers = dir.path().join("numbers.parquet");
    write_columns(&with_text, None, true);
    write_columns(&numbers, None, false);
    let names = ["x", "n"];
    let of = |path: &Path| {
        spec(
            path,
            &names,
            proto::Dtype::Unspecified,
            BadSamplePolicy::Fail,
        )
    };
    let batches = epoch(&of(&numbers), 2, 0).unwrap();
    assert_eq!(per_sample(&batches).len(), ROWS as usize, "every row once");
    assert_eq!(
        digest(&batches),
        digest(&epoch(&of(&with_text), 2, 0).unwrap())
    );

    // A pipeline that reads samples' bytes has nothing to read: refused when the job opens.
    let uri = format!("file://{}", numbers.display());
    let error = Loader::new(
        crate::common::spec_over(&uri, stoker_pipeline::presets::imagenet_train(32), 8),
        LoaderOptions::default(),
    )
    .err()
    .map(|error| error.to_string())
    .unwrap_or_default();
    assert!(
        error.contains("numeric columns only") && error.contains("[SelectColumns]"),
        "{error}"
    );
}
