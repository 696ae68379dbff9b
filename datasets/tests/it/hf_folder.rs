//! `HfDataset` against folders written here the way `Dataset.save_to_disk` writes them (Arrow
//! IPC stream shards with arrow-ipc's `StreamWriter`, `dataset_info.json`, `state.json`): the
//! feature mapping (Image, string, ClassLabel, numeric Values), equality with a Parquet copy
//! of the same table, images kept as file references, DatasetDict folders, and bad input
//! (truncated shards, shards cut after opening, names outside the folder).

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::Path;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{
    ArrayRef, BinaryArray, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
    StructArray,
};
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{DataType, Field};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use serde_json::json;
use stoker_datasets::{
    looks_like_hf_dataset, Error, HfDataset, NumericColumns, NumericKind, ParquetDataset,
    ParquetOptions, ParquetSampleKind, SampleSource,
};

const CLASSES: [&str; 3] = ["cat", "dog", "eel"];

fn image_bytes(row: usize) -> Vec<u8> {
    format!("image bytes of row {row}").into_bytes()
}

/// Rows `rows` of the test table: `image` (struct of bytes and path, as the `Image` feature
/// stores it), `label` (int64, a ClassLabel), `text`, `score` (float64), `count` (int32).
/// Row `reference_row`, when in range, keeps its image as a path (`ref.png`) with null bytes.
fn table(rows: std::ops::Range<usize>, reference_row: Option<usize>) -> RecordBatch {
    let bytes: Vec<Option<Vec<u8>>> = rows
        .clone()
        .map(|row| (Some(row) != reference_row).then(|| image_bytes(row)))
        .collect();
    let paths: Vec<Option<String>> = rows
        .clone()
        .map(|row| (Some(row) == reference_row).then(|| "ref.png".to_string()))
        .collect();
    let image = StructArray::from(vec![
        (
            Arc::new(Field::new("bytes", DataType::Binary, true)),
            Arc::new(BinaryArray::from_iter(bytes)) as ArrayRef,
        ),
        (
            Arc::new(Field::new("path", DataType::Utf8, true)),
            Arc::new(StringArray::from(paths)) as ArrayRef,
        ),
    ]);
    let labels: Vec<i64> = rows.clone().map(|row| (row % 3) as i64).collect();
    let texts: Vec<String> = rows.clone().map(|row| format!("text {row}")).collect();
    let scores: Vec<f64> = rows.clone().map(|row| row as f64 * 0.25).collect();
    let counts: Vec<i32> = rows.map(|row| row as i32 * 7).collect();
    RecordBatch::try_from_iter(vec![
        ("image", Arc::new(image) as ArrayRef),
        ("label", Arc::new(Int64Array::from(labels)) as ArrayRef),
        ("text", Arc::new(StringArray::from(texts)) as ArrayRef),
        ("score", Arc::new(Float64Array::from(scores)) as ArrayRef),
        ("count", Arc::new(Int32Array::from(counts)) as ArrayRef),
    ])
    .unwrap()
}

fn features() -> serde_json::Value {
    json!({
        "image": {"_type": "Image"},
        "label": {"names": CLASSES, "_type": "ClassLabel"},
        "text": {"dtype": "string", "_type": "Value"},
        "score": {"dtype": "float64", "_type": "Value"},
        "count": {"dtype": "int32", "_type": "Value"},
    })
}

/// Writes a `save_to_disk`-style folder: one stream file per shard, each batch of a shard one
/// record batch, then `dataset_info.json` and `state.json`.
fn write_hf_folder(dir: &Path, shards: &[Vec<RecordBatch>], features: &serde_json::Value) {
    std::fs::create_dir_all(dir).unwrap();
    let mut data_files = Vec::new();
    for (number, batches) in shards.iter().enumerate() {
        let name = format!("data-{number:05}-of-{:05}.arrow", shards.len());
        let file = std::fs::File::create(dir.join(&name)).unwrap();
        let mut writer = StreamWriter::try_new(file, &batches[0].schema()).unwrap();
        for batch in batches {
            writer.write(batch).unwrap();
        }
        writer.finish().unwrap();
        data_files.push(json!({ "filename": name }));
    }
    let info = json!({"citation": "", "description": "", "features": features});
    std::fs::write(dir.join("dataset_info.json"), info.to_string()).unwrap();
    let state = json!({
        "_data_files": data_files,
        "_fingerprint": "0123456789abcdef",
        "_format_columns": null,
        "_format_kwargs": {},
        "_format_type": null,
        "_output_all_columns": false,
        "_split": null,
    });
    std::fs::write(dir.join("state.json"), state.to_string()).unwrap();
}

/// 23 rows in two shards: rows 0..16 as batches of 0..6, 6..12, 12..16; rows 16..23 as one.
pub(crate) fn write_fixture(dir: &Path, reference_row: Option<usize>) {
    let shards = vec![
        vec![
            table(0..6, reference_row),
            table(6..12, reference_row),
            table(12..16, reference_row),
        ],
        vec![table(16..23, reference_row)],
    ];
    write_hf_folder(dir, &shards, &features());
}

fn open(path: &Path) -> Result<HfDataset, Error> {
    HfDataset::open(path, &ParquetOptions::default())
}

fn arrow_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "arrow"))
        .collect();
    files.sort();
    files
}

#[test]
fn features_map_to_images_labels_class_names_and_numeric_columns() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("set");
    write_fixture(&root, None);
    assert!(looks_like_hf_dataset(&root));
    assert!(!looks_like_hf_dataset(dir.path()));

    let dataset = open(&root).unwrap();
    assert_eq!(dataset.len(), 23);
    assert_eq!(dataset.class_names(), CLASSES);
    assert_eq!(dataset.sample_kind(), ParquetSampleKind::Image);
    assert_eq!(dataset.shard_sizes(), Some(vec![6, 6, 4, 7]));
    for index in 0..23u64 {
        assert_eq!(dataset.label(index), index as i64 % 3);
        assert_eq!(dataset.read(index).unwrap(), image_bytes(index as usize));
    }
    assert!(dataset
        .describe(17)
        .ends_with("data-00001-of-00002.arrow:row 1"));
    assert!(matches!(
        dataset.read(23),
        Err(Error::IndexOutOfRange { index: 23, len: 23 })
    ));
    // One decode per record batch, whatever the number of reads in it.
    assert_eq!(dataset.batch_decodes(), 4);

    let summary = dataset.summary();
    assert_eq!((summary.files, summary.rows, summary.chunks), (2, 23, 4));
    assert_eq!(summary.label_column.as_deref(), Some("label"));

    let numeric = dataset.numeric_columns().unwrap();
    assert_eq!(numeric.numeric_kind("count").unwrap(), NumericKind::Integer);
    assert_eq!(numeric.numeric_kind("score").unwrap(), NumericKind::Float);
    let error = numeric.numeric_kind("text").unwrap_err();
    assert!(error.to_string().contains("not numeric"), "{error}");
    let mut floats = Vec::new();
    numeric
        .read_f32_columns(&["score", "count"], &[20, 1, 7], &mut floats)
        .unwrap();
    assert_eq!(floats, [5.0, 140.0, 0.25, 7.0, 1.75, 49.0]);
    let mut integers = vec![-1];
    numeric
        .read_i64_columns(&["label", "count"], &[22, 0], &mut integers)
        .unwrap();
    assert_eq!(integers, [-1, 1, 154, 0, 0]);
    assert!(numeric
        .read_i64_columns(&["score"], &[0], &mut integers)
        .is_err());
    assert_eq!(
        integers.len(),
        5,
        "a failed read leaves the output as it was"
    );
}

#[test]
fn samples_labels_and_columns_equal_those_of_a_parquet_copy() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("set");
    write_fixture(&root, None);
    let parquet_path = dir.path().join("copy.parquet");
    let properties = WriterProperties::builder()
        .set_max_row_group_row_count(Some(5))
        .build();
    let whole = table(0..23, None);
    let file = std::fs::File::create(&parquet_path).unwrap();
    let mut writer = ArrowWriter::try_new(file, whole.schema(), Some(properties)).unwrap();
    writer.write(&whole).unwrap();
    writer.close().unwrap();

    let hf = open(&root).unwrap();
    let parquet = ParquetDataset::open(&parquet_path, &ParquetOptions::default()).unwrap();
    assert_eq!(hf.len(), parquet.len());
    let all: Vec<u64> = (0..hf.len()).rev().collect();
    for &index in &all {
        assert_eq!(hf.label(index), parquet.label(index));
        assert_eq!(hf.read(index).unwrap(), parquet.read(index).unwrap());
    }
    let columns = ["score", "count", "label"];
    let (mut from_hf, mut from_parquet) = (Vec::new(), Vec::new());
    hf.read_f32_columns(&columns, &all, &mut from_hf).unwrap();
    parquet
        .read_f32_columns(&columns, &all, &mut from_parquet)
        .unwrap();
    assert_eq!(from_hf, from_parquet);
}

#[test]
fn text_datasets_and_features_found_by_type() {
    let dir = tempfile::tempdir().unwrap();
    let texts: ArrayRef = Arc::new(StringArray::from(vec!["alpha", "beta", "gamma"]));
    let grades: ArrayRef = Arc::new(Int64Array::from(vec![1, 0, 1]));
    let text_only = dir.path().join("text");
    write_hf_folder(
        &text_only,
        &[vec![RecordBatch::try_from_iter(vec![
            ("text", Arc::clone(&texts)),
            ("grade", Arc::clone(&grades)),
        ])
        .unwrap()]],
        &json!({
            "text": {"dtype": "string", "_type": "Value"},
            "grade": {"names": ["bad", "good"], "_type": "ClassLabel"},
        }),
    );
    let dataset = open(&text_only).unwrap();
    assert_eq!(dataset.sample_kind(), ParquetSampleKind::Text);
    assert_eq!(dataset.read(2).unwrap(), b"gamma");
    // No `label` column: the first ClassLabel gives the labels and the class names.
    assert_eq!(dataset.class_names(), ["bad", "good"]);
    assert_eq!(
        (0..3).map(|i| dataset.label(i)).collect::<Vec<_>>(),
        [1, 0, 1]
    );

    // An Image feature under another name (CIFAR-10's `img`), a binary column.
    let images = dir.path().join("img");
    let binary: ArrayRef = Arc::new(BinaryArray::from_iter_values([b"x0", b"x1"]));
    write_hf_folder(
        &images,
        &[vec![
            RecordBatch::try_from_iter(vec![("img", binary)]).unwrap()
        ]],
        &json!({"img": {"_type": "Image"}}),
    );
    let dataset = open(&images).unwrap();
    assert_eq!(dataset.read(1).unwrap(), b"x1");
    assert!(dataset.class_names().is_empty());
    assert_eq!(dataset.label(1), 0);

    // Captions beside an Image feature: the text column named is read, not the images; both
    // named is refused.
    let captioned = dir.path().join("captioned");
    let pictures: ArrayRef = Arc::new(BinaryArray::from_iter_values([b"x0", b"x1", b"x2"]));
    write_hf_folder(
        &captioned,
        &[vec![RecordBatch::try_from_iter(vec![
            ("image", pictures),
            ("caption", Arc::clone(&texts)),
        ])
        .unwrap()]],
        &json!({
            "image": {"_type": "Image"},
            "caption": {"dtype": "string", "_type": "Value"},
        }),
    );
    let named = |image: Option<&str>| ParquetOptions {
        text_column: Some("caption".into()),
        image_column: image.map(str::to_string),
        ..ParquetOptions::default()
    };
    let dataset = HfDataset::open(&captioned, &named(None)).unwrap();
    assert_eq!(dataset.sample_kind(), ParquetSampleKind::Text);
    assert_eq!(dataset.read(1).unwrap(), b"beta");
    let error = HfDataset::open(&captioned, &named(Some("image")))
        .unwrap_err()
        .to_string();
    assert!(error.contains("both an image column"), "{error}");

    // Neither: the error lists the columns.
    let neither = dir.path().join("neither");
    write_hf_folder(
        &neither,
        &[vec![
            RecordBatch::try_from_iter(vec![("grade", grades)]).unwrap()
        ]],
        &json!({"grade": {"dtype": "int64", "_type": "Value"}}),
    );
    let error = open(&neither).unwrap_err().to_string();
    assert!(
        error.contains("found no sample column") && error.contains("grade"),
        "{error}"
    );
}

#[test]
fn an_image_kept_as_a_path_is_read_from_the_folder() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("set");
    write_fixture(&root, Some(8));
    std::fs::write(root.join("ref.png"), b"the referenced file").unwrap();
    let dataset = open(&root).unwrap();
    assert_eq!(dataset.read(8).unwrap(), b"the referenced file");
    assert_eq!(dataset.read(9).unwrap(), image_bytes(9));
    std::fs::remove_file(root.join("ref.png")).unwrap();
    let error = dataset.read(8).unwrap_err().to_string();
    assert!(error.contains("ref.png"), "{error}");
    // A referenced path that is no regular file (a named pipe, which waited for a writer for
    // good) is refused at once, as an image folder's file is.
    let fifo = std::ffi::CString::new(root.join("ref.png").display().to_string()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let (done, finished) = std::sync::mpsc::channel();
    let reading = std::thread::spawn(move || {
        let outcome = dataset.read(8).map_err(|error| error.to_string());
        let _ = done.send(());
        outcome
    });
    finished
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("a read of a named pipe returns");
    let error = reading.join().unwrap().unwrap_err();
    assert!(error.contains("not a regular file"), "{error}");

    // References may leave the folder (an absolute path, or one relative to the folder), as
    // `datasets` writes them for images it did not embed: read in process (a worker daemon
    // confines them to its data roots).
    let outside = dir.path().join("outside.png");
    std::fs::write(&outside, b"not for this dataset").unwrap();
    for reference in [outside.display().to_string(), "../outside.png".to_string()] {
        let escaping = dir.path().join("escaping");
        let _ = std::fs::remove_dir_all(&escaping);
        let mut batch = table(0..2, Some(1));
        let image = batch.column(0).as_struct().clone();
        let (fields, mut arrays, nulls) = image.into_parts();
        arrays[1] = Arc::new(StringArray::from(vec![None, Some(reference.as_str())]));
        let image = StructArray::new(fields, arrays, nulls);
        let mut columns = batch.columns().to_vec();
        columns[0] = Arc::new(image);
        batch = RecordBatch::try_new(batch.schema(), columns).unwrap();
        write_hf_folder(&escaping, &[vec![batch]], &features());
        let dataset = open(&escaping).unwrap();
        assert_eq!(dataset.read(0).unwrap(), image_bytes(0));
        assert_eq!(
            dataset.read(1).unwrap(),
            b"not for this dataset",
            "{reference}"
        );
    }
}

#[test]
fn truncated_shards_are_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("set");
    write_fixture(&root, None);
    let first = arrow_files(&root).remove(0);
    let whole = std::fs::read(&first).unwrap();
    // Cut inside a body, inside a header, and just before the end-of-stream marker.
    for keep in [whole.len() / 2, 100, whole.len() - 8] {
        std::fs::write(&first, &whole[..keep]).unwrap();
        let error = open(&root).unwrap_err();
        assert!(
            matches!(error, Error::ArrowStream { .. }),
            "{keep}: {error:?}"
        );
        let message = error.to_string();
        assert!(
            message.contains("data-00000-of-00002.arrow") && message.contains("truncated"),
            "{keep}: {message}"
        );
    }
    std::fs::write(&first, b"not an arrow stream at all, just some text").unwrap();
    let message = open(&root).unwrap_err().to_string();
    assert!(message.contains("data-00000-of-00002.arrow"), "{message}");

    // A shard cut after opening: reads fail with an error naming it (no memory map, no SIGBUS).
    std::fs::write(&first, &whole).unwrap();
    let dataset = open(&root).unwrap();
    std::fs::write(&first, &whole[..whole.len() / 3]).unwrap();
    let failed: Vec<Error> = (0..16)
        .filter_map(|index| dataset.read(index).err())
        .collect();
    assert!(!failed.is_empty());
    // Each stops the job as the dataset changed under it: no row is a bad sample, replaced.
    assert!(
        failed.iter().all(|error| error.dataset_changed()
            && error.to_string().contains("data-00000-of-00002.arrow")),
        "{failed:?}"
    );
}

#[test]
fn dataset_dict_folders_and_bad_layouts_are_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("dict");
    write_fixture(&root.join("train"), None);
    write_fixture(&root.join("test"), None);
    std::fs::write(
        root.join("dataset_dict.json"),
        r#"{"splits": ["train", "test"]}"#,
    )
    .unwrap();
    assert!(looks_like_hf_dataset(&root));
    let error = open(&root).unwrap_err();
    assert!(matches!(error, Error::HfDatasetDict { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("train, test"), "{message}");
    assert!(
        message.contains(&root.join("train").display().to_string()),
        "{message}"
    );
    assert_eq!(open(&root.join("test")).unwrap().len(), 23);

    // A state.json naming a file outside the folder.
    let escape = dir.path().join("escape");
    write_fixture(&escape, None);
    std::fs::write(
        escape.join("state.json"),
        r#"{"_data_files": [{"filename": "../dict/train/data-00000-of-00002.arrow"}]}"#,
    )
    .unwrap();
    let message = open(&escape).unwrap_err().to_string();
    assert!(
        message.contains("not a file name inside the folder"),
        "{message}"
    );

    // A dataset saved with an indices mapping (older `datasets`, after select, shuffle or
    // train_test_split): refused by name, never read as the whole table; a null mapping (what
    // those releases wrote for a dataset without one) reads as before.
    let mapped = dir.path().join("mapped");
    write_fixture(&mapped, None);
    let state_path = mapped.join("state.json");
    let mut state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&state_path).unwrap()).unwrap();
    state["_indices_data_files"] = json!(null);
    std::fs::write(&state_path, state.to_string()).unwrap();
    assert_eq!(open(&mapped).unwrap().len(), 23);
    state["_indices_data_files"] = json!([{ "filename": "indices.arrow" }]);
    std::fs::write(&state_path, state.to_string()).unwrap();
    let message = open(&mapped).unwrap_err().to_string();
    assert!(
        message.contains("indices.arrow") && message.contains("flatten_indices()"),
        "{message}"
    );

    // A ClassLabel feature on a text column, as the label column.
    let wrong = dir.path().join("wrong");
    write_fixture(&wrong, None);
    let options = ParquetOptions {
        label_column: Some("text".into()),
        ..ParquetOptions::default()
    };
    let message = HfDataset::open(&wrong, &options).unwrap_err().to_string();
    assert!(message.contains("labels need"), "{message}");

    assert!(matches!(
        open(&dir.path().join("missing")),
        Err(Error::RootNotFound(_))
    ));
}
