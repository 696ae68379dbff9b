//! `ParquetDataset` against files written here with the parquet crate and by `write_parquet`:
//! the sample index over files and row groups, labels and class names, the row-group cache,
//! text, struct-image and numeric columns, and bad input (truncated, garbage, corrupt pages,
//! null cells, wrong column types) that must give errors naming the file, never a panic.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{
    ArrayRef, BinaryArray, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
    StructArray, UInt8Array,
};
use arrow_schema::{DataType, Field, Fields};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use stoker_datasets::{
    generate_imagenet_like, looks_like_parquet, write_parquet, Error, ImageFolder, NumericKind,
    ParquetDataset, ParquetOptions, ParquetSampleKind, ParquetWriterOptions, SampleSource,
    SyntheticImageNetSpec, WriteError,
};

/// Named columns of a file to write.
type Columns = Vec<(&'static str, ArrayRef)>;

/// Writes `columns` as one Parquet file with row groups of `group_rows` rows.
fn write_file(path: &Path, columns: Columns, group_rows: usize) {
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let properties = WriterProperties::builder()
        .set_max_row_group_row_count(Some(group_rows))
        .build();
    let file = std::fs::File::create(path).unwrap();
    let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(properties)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
}

fn binary(values: &[&[u8]]) -> ArrayRef {
    Arc::new(BinaryArray::from_iter_values(values.iter()))
}

/// `count` fake images `image <i>` with labels `i % 3`.
fn image_columns(count: usize) -> Columns {
    let images: Vec<Vec<u8>> = (0..count)
        .map(|index| format!("image {index}").into_bytes())
        .collect();
    let images: Vec<&[u8]> = images.iter().map(Vec::as_slice).collect();
    let labels: Vec<i32> = (0..count as i32).map(|index| index % 3).collect();
    vec![
        ("image", binary(&images)),
        ("label", Arc::new(Int32Array::from(labels)) as ArrayRef),
    ]
}

fn open(path: &Path) -> Result<ParquetDataset, Error> {
    ParquetDataset::open(path, &ParquetOptions::default())
}

fn generated_folder(dir: &Path, count: u64) -> ImageFolder {
    let spec = SyntheticImageNetSpec {
        count,
        seed: 5,
        classes: 3,
    };
    generate_imagenet_like(dir, &spec, &|_| {}).unwrap();
    ImageFolder::open(dir).unwrap()
}

fn parquet_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "parquet"))
        .collect();
    files.sort();
    files
}

#[test]
fn write_parquet_keeps_order_bytes_labels_and_class_names() {
    let dir = tempfile::tempdir().unwrap();
    let folder = generated_folder(&dir.path().join("folder"), 30);
    let out = dir.path().join("parquet");
    let options = ParquetWriterOptions {
        file_bytes: 200_000,
        rows_per_group: 4,
    };
    let progress = std::sync::Mutex::new(Vec::new());
    let written = write_parquet(&folder, &out, &options, &|done| {
        progress.lock().unwrap().push(done)
    })
    .unwrap();
    assert_eq!(written.samples, 30);
    assert!(written.files.len() >= 2, "{written:?}");
    assert_eq!(written.files, parquet_files(&out));
    assert_eq!(*progress.lock().unwrap(), (1..=30).collect::<Vec<u64>>());
    assert!(looks_like_parquet(&out));
    assert!(looks_like_parquet(&written.files[0]));
    assert!(!looks_like_parquet(&dir.path().join("folder")));

    let dataset = open(&out).unwrap();
    assert_eq!(dataset.len(), 30);
    assert_eq!(dataset.class_names(), folder.class_names());
    assert_eq!(dataset.sample_kind(), ParquetSampleKind::Image);
    for index in 0..30 {
        assert_eq!(dataset.read(index).unwrap(), folder.read(index).unwrap());
        assert_eq!(dataset.label(index), folder.label(index));
    }
    let sizes = dataset.shard_sizes().unwrap();
    assert_eq!(sizes.len(), written.row_groups);
    assert_eq!(sizes.iter().sum::<u64>(), 30);
    assert!(sizes.iter().all(|size| (1..=4).contains(size)), "{sizes:?}");
    assert!(dataset.describe(0).ends_with("part-000000.parquet:row 0"));
    let last = dataset.describe(29);
    assert!(
        last.contains(&format!("part-{:06}.parquet:row ", written.files.len() - 1)),
        "{last}"
    );
    assert!(dataset.describe(30).contains("out of range"));
    assert!(matches!(
        dataset.read(30),
        Err(Error::IndexOutOfRange { index: 30, len: 30 })
    ));
    let summary = dataset.summary();
    assert_eq!(summary.rows, 30);
    assert_eq!(summary.files, written.files.len());
    let names: Vec<&str> = summary.columns.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["key", "image", "label"]);
    assert_eq!(summary.label_column.as_deref(), Some("label"));

    // A single file opens on its own, and the output folder is never overwritten.
    let first = open(&written.files[0]).unwrap();
    assert_eq!(first.read(0).unwrap(), folder.read(0).unwrap());
    let again = write_parquet(&folder, &out, &options, &|_| {});
    assert!(matches!(
        again,
        Err(Error::Write(WriteError::ParquetOutputNotEmpty(_)))
    ));
}

#[test]
fn rows_of_a_group_are_decoded_once_while_the_group_is_cached() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.parquet");
    write_file(&path, image_columns(50), 10);
    let dataset = open(&path).unwrap();
    assert_eq!(dataset.shard_sizes().unwrap(), vec![10; 5]);
    for index in 0..50 {
        assert_eq!(
            dataset.read(index).unwrap(),
            format!("image {index}").into_bytes()
        );
        assert_eq!(dataset.label(index), index as i64 % 3);
    }
    assert_eq!(dataset.row_group_decodes(), 5);
    // Everything fits the default budget: reading again decodes nothing.
    for index in (0..50).rev() {
        dataset.read(index).unwrap();
    }
    assert_eq!(dataset.row_group_decodes(), 5);

    // With a budget of about one group, alternating between two groups decodes each time.
    let small = ParquetDataset::open(
        &path,
        &ParquetOptions {
            cache_bytes: 1,
            ..ParquetOptions::default()
        },
    )
    .unwrap();
    for index in [0, 1, 10, 11, 0, 10] {
        small.read(index).unwrap();
    }
    assert_eq!(small.row_group_decodes(), 4);
}

/// A row group of 160 MiB (as pandas writes them: a million rows a group, whatever their size)
/// is decoded in batches of about 64 MiB, each row read back whole from its batch; one batch of
/// a group past 2 GiB did not decode at all (a binary column's offsets are 32-bit).
#[test]
fn a_large_row_group_is_decoded_in_batches_and_read_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("large.parquet");
    let rows: Vec<Vec<u8>> = (0..20u8)
        .map(|k| {
            let mut row = vec![k; 8 << 20];
            row[..8].copy_from_slice(&u64::from(k).to_le_bytes());
            row
        })
        .collect();
    let images: Vec<&[u8]> = rows.iter().map(Vec::as_slice).collect();
    let labels: Vec<i32> = (0..20).collect();
    let columns: Columns = vec![
        ("image", binary(&images)),
        ("label", Arc::new(Int32Array::from(labels)) as ArrayRef),
    ];
    write_file(&path, columns, 1 << 20);
    let dataset = open(&path).unwrap();
    assert_eq!(dataset.shard_sizes().unwrap(), vec![20]);
    for index in [19u64, 0, 7, 8, 15] {
        assert_eq!(
            dataset.read(index).unwrap(),
            rows[index as usize],
            "row {index}"
        );
        assert_eq!(dataset.label(index), index as i64);
    }
    assert_eq!(dataset.row_group_decodes(), 1);
    // 160 MiB in batches of about 64: three (8 + 8 + 4 rows), where one was decoded before.
    assert_eq!(dataset.record_batches_decoded(), 3);
}

/// Files of every codec pandas and pyarrow offer but brotli read the same rows.
#[test]
fn files_of_each_codec_read_the_same_rows() {
    use parquet::basic::{Compression, GzipLevel, ZstdLevel};
    let dir = tempfile::tempdir().unwrap();
    for (name, codec) in [
        ("snappy", Compression::SNAPPY),
        ("gzip", Compression::GZIP(GzipLevel::default())),
        ("zstd", Compression::ZSTD(ZstdLevel::default())),
        ("lz4", Compression::LZ4_RAW),
        ("none", Compression::UNCOMPRESSED),
    ] {
        let path = dir.path().join(format!("{name}.parquet"));
        let batch = RecordBatch::try_from_iter(image_columns(12)).unwrap();
        let properties = WriterProperties::builder()
            .set_compression(codec)
            .set_max_row_group_row_count(Some(5))
            .build();
        let file = std::fs::File::create(&path).unwrap();
        let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(properties)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        let dataset = open(&path).unwrap();
        for index in 0..12 {
            assert_eq!(
                dataset.read(index).unwrap(),
                format!("image {index}").into_bytes(),
                "{name}"
            );
            assert_eq!(dataset.label(index), index as i64 % 3, "{name}");
        }
    }
}

/// A shard of no rows (pandas writes an empty frame's object columns as the null type) adds
/// nothing and is not held to the others' columns; a set of only such files has no rows.
#[test]
fn a_shard_of_no_rows_is_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let empty: Columns = vec![
        (
            "image",
            Arc::new(arrow_array::NullArray::new(0)) as ArrayRef,
        ),
        (
            "label",
            Arc::new(Int32Array::from(Vec::<i32>::new())) as ArrayRef,
        ),
    ];
    write_file(&dir.path().join("part-0.parquet"), empty.clone(), 10);
    let only_empty = open(dir.path()).unwrap_err();
    assert!(
        matches!(only_empty, Error::NoParquetRows(_)),
        "{only_empty}"
    );
    write_file(&dir.path().join("part-1.parquet"), image_columns(5), 10);
    let dataset = open(dir.path()).unwrap();
    assert_eq!(dataset.len(), 5);
    assert_eq!(dataset.read(4).unwrap(), b"image 4");
}

#[test]
fn reads_from_many_threads_agree() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.parquet");
    write_file(&path, image_columns(200), 16);
    let dataset = open(&path).unwrap();
    std::thread::scope(|scope| {
        for thread in 0..4u64 {
            let dataset = &dataset;
            scope.spawn(move || {
                for step in 0..200u64 {
                    let index = (step * 7 + thread * 13) % 200;
                    assert_eq!(
                        dataset.read(index).unwrap(),
                        format!("image {index}").into_bytes()
                    );
                }
            });
        }
    });
}

#[test]
fn text_columns_are_read_as_utf8_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docs.parquet");
    let texts = ["première ligne", "", "third document"];
    write_file(
        &path,
        vec![
            ("id", Arc::new(Int64Array::from(vec![7, 8, 9])) as ArrayRef),
            ("text", Arc::new(StringArray::from(texts.to_vec()))),
            ("label", Arc::new(UInt8Array::from(vec![2, 0, 1]))),
        ],
        2,
    );
    let dataset = open(&path).unwrap();
    assert_eq!(dataset.sample_kind(), ParquetSampleKind::Text);
    for (index, text) in texts.iter().enumerate() {
        assert_eq!(dataset.read(index as u64).unwrap(), text.as_bytes());
    }
    assert_eq!(dataset.label(0), 2);
    // No class names in the metadata: one per label value, like tar shards without classes.txt.
    assert_eq!(dataset.class_names(), ["0", "1", "2"]);

    // A named text column, and no label column: every label is 0 and there is no class.
    let renamed = dir.path().join("renamed.parquet");
    write_file(
        &renamed,
        vec![(
            "body",
            Arc::new(StringArray::from(texts.to_vec())) as ArrayRef,
        )],
        8,
    );
    let options = ParquetOptions {
        text_column: Some("body".into()),
        ..ParquetOptions::default()
    };
    let dataset = ParquetDataset::open(&renamed, &options).unwrap();
    assert_eq!(dataset.read(2).unwrap(), b"third document");
    assert_eq!(dataset.label(2), 0);
    assert!(dataset.class_names().is_empty());

    // Captions beside images: the text column named is read, not the images beside it; an
    // image column named too is refused (a sample is one of them).
    let captioned = dir.path().join("captioned.parquet");
    let images: Vec<&[u8]> = vec![b"\xff\xd8jpeg", b"\xff\xd8jpeg", b"\xff\xd8jpeg"];
    write_file(
        &captioned,
        vec![
            ("image", binary(&images)),
            (
                "caption",
                Arc::new(StringArray::from(texts.to_vec())) as ArrayRef,
            ),
        ],
        8,
    );
    let options = ParquetOptions {
        text_column: Some("caption".into()),
        ..ParquetOptions::default()
    };
    let dataset = ParquetDataset::open(&captioned, &options).unwrap();
    assert_eq!(dataset.sample_kind(), ParquetSampleKind::Text);
    assert_eq!(dataset.read(0).unwrap(), "première ligne".as_bytes());
    let both = ParquetOptions {
        image_column: Some("image".into()),
        ..options
    };
    let error = ParquetDataset::open(&captioned, &both)
        .unwrap_err()
        .to_string();
    assert!(error.contains("both an image column"), "{error}");
}

#[test]
fn named_and_struct_image_columns() {
    let dir = tempfile::tempdir().unwrap();
    // Hugging Face `datasets` stores images as a struct of bytes and path.
    let fields = Fields::from(vec![
        Field::new("bytes", DataType::Binary, true),
        Field::new("path", DataType::Utf8, true),
    ]);
    let images = StructArray::new(
        fields,
        vec![
            binary(&[b"one", b"two"]),
            Arc::new(StringArray::from(vec!["1.jpg", "2.jpg"])),
        ],
        None,
    );
    let path = dir.path().join("hf.parquet");
    write_file(
        &path,
        vec![
            ("image", Arc::new(images) as ArrayRef),
            ("label", Arc::new(Int64Array::from(vec![4, 5]))),
        ],
        8,
    );
    let dataset = open(&path).unwrap();
    assert_eq!(dataset.read(1).unwrap(), b"two");
    assert_eq!(dataset.label(1), 5);

    let named = dir.path().join("named.parquet");
    write_file(
        &named,
        vec![
            ("picture", binary(&[b"a", b"b", b"c"])),
            (
                "class",
                Arc::new(Int32Array::from(vec![1, 1, 0])) as ArrayRef,
            ),
        ],
        8,
    );
    let options = ParquetOptions {
        image_column: Some("picture".into()),
        label_column: Some("class".into()),
        ..ParquetOptions::default()
    };
    let dataset = ParquetDataset::open(&named, &options).unwrap();
    assert_eq!(dataset.read(2).unwrap(), b"c");
    assert_eq!(dataset.label(0), 1);
    // Without the names, no sample column is found, and the error lists the columns.
    let message = open(&named).unwrap_err().to_string();
    assert!(message.contains("picture, class"), "{message}");
    assert!(message.contains("named.parquet"), "{message}");
}

#[test]
fn path_only_images_are_read_from_their_files_and_class_labels_name_the_classes() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("pictures")).unwrap();
    std::fs::write(dir.path().join("pictures/relative.jpg"), b"beside").unwrap();
    let absolute = dir.path().join("absolute.jpg");
    std::fs::write(&absolute, b"anywhere").unwrap();
    // `datasets`' to_parquet of an Image column built from files: bytes null, path set.
    let fields = Fields::from(vec![
        Field::new("bytes", DataType::Binary, true),
        Field::new("path", DataType::Utf8, true),
    ]);
    let bytes: ArrayRef = Arc::new(BinaryArray::from(vec![
        Some(b"embedded".as_slice()),
        None,
        None,
        None,
        None,
    ]));
    let paths: ArrayRef = Arc::new(StringArray::from(vec![
        Some("ignored.jpg"),
        Some("pictures/relative.jpg"),
        Some(absolute.to_str().unwrap()),
        Some("pictures/missing.jpg"),
        None,
    ]));
    let images = StructArray::new(fields, vec![bytes, paths], None);
    let batch = RecordBatch::try_from_iter(vec![
        ("image", Arc::new(images) as ArrayRef),
        (
            "label",
            Arc::new(Int64Array::from(vec![0, 1, 0, 1, 0])) as ArrayRef,
        ),
    ])
    .unwrap();
    let features = r#"{"info": {"features": {"image": {"_type": "Image"},
        "label": {"_type": "ClassLabel", "names": ["cat", "dog"]}}}}"#;
    let properties = WriterProperties::builder()
        .set_key_value_metadata(Some(vec![parquet::file::metadata::KeyValue::new(
            "huggingface".to_string(),
            features.to_string(),
        )]))
        .build();
    let path = dir.path().join("hf.parquet");
    let file = std::fs::File::create(&path).unwrap();
    let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(properties)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();

    let dataset = open(&path).unwrap();
    assert_eq!(dataset.class_names(), ["cat", "dog"]);
    assert_eq!(dataset.read(0).unwrap(), b"embedded");
    assert_eq!(dataset.read(1).unwrap(), b"beside");
    assert_eq!(dataset.read(2).unwrap(), b"anywhere");
    let missing = dataset.read(3).unwrap_err();
    assert!(
        missing.to_string().contains("pictures/missing.jpg"),
        "{missing}"
    );
    assert_eq!(missing.read_fault(), stoker_datasets::ReadFault::Sample);
    let empty = dataset.read(4).unwrap_err().to_string();
    assert!(empty.contains("has no value (null)"), "{empty}");
}

#[test]
fn numeric_columns_read_as_row_major_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("table.parquet");
    let count: i32 = 25;
    write_file(
        &path,
        vec![
            (
                "x",
                Arc::new(Float64Array::from_iter_values(
                    (0..count).map(|i| i as f64 / 4.0),
                )) as ArrayRef,
            ),
            ("y", Arc::new(Int32Array::from_iter_values(0..count))),
            (
                "z",
                Arc::new(UInt8Array::from_iter_values(
                    (0..count).map(|i| 200 + i as u8),
                )),
            ),
            (
                "maybe",
                Arc::new(Int32Array::from_iter(
                    (0..count).map(|i| (i != 3).then_some(i)),
                )),
            ),
            (
                "s",
                Arc::new(StringArray::from_iter_values(
                    (0..count).map(|i| i.to_string()),
                )),
            ),
        ],
        6,
    );
    let options = ParquetOptions {
        text_column: Some("s".into()),
        ..ParquetOptions::default()
    };
    let dataset = ParquetDataset::open(&path, &options).unwrap();

    let mut floats = vec![-1.0];
    dataset
        .read_f32_columns(&["y", "x"], &[20, 0, 7], &mut floats)
        .unwrap();
    assert_eq!(floats, [-1.0, 20.0, 5.0, 0.0, 0.0, 7.0, 1.75]);

    let mut integers = Vec::new();
    dataset
        .read_i64_columns(&["z", "y", "z"], &[24, 6], &mut integers)
        .unwrap();
    assert_eq!(integers, [224, 24, 224, 206, 6, 206]);

    let refused = [
        (
            dataset.read_i64_columns(&["x"], &[0], &mut integers),
            "does not convert",
        ),
        (
            dataset.read_i64_columns(&["nope"], &[0], &mut integers),
            "no numeric column",
        ),
        (
            dataset.read_i64_columns(&["s"], &[0], &mut integers),
            "does not convert",
        ),
        (
            dataset.read_i64_columns(&["maybe"], &[2, 3], &mut integers),
            "row 3",
        ),
    ];
    for (result, word) in refused {
        let message = result.unwrap_err().to_string();
        assert!(message.contains(word), "{message:?} lacks {word:?}");
        assert!(message.contains("table.parquet"), "{message}");
    }
    // The same reads through the source trait, as a pipeline op holding the source sees it.
    let source: &dyn SampleSource = &dataset;
    let columns = source.numeric_columns().unwrap();
    assert_eq!(columns.numeric_kind("x").unwrap(), NumericKind::Float);
    assert_eq!(columns.numeric_kind("z").unwrap(), NumericKind::Integer);
    assert!(columns.numeric_kind("s").is_err());
    assert!(columns.numeric_kind("nope").is_err());
    let mut through_trait = Vec::new();
    columns
        .read_f32_columns(&["y", "x"], &[20, 0, 7], &mut through_trait)
        .unwrap();
    assert_eq!(through_trait, floats[1..]);
    let folder_dir = tempfile::tempdir().unwrap();
    assert!(generated_folder(folder_dir.path(), 3)
        .numeric_columns()
        .is_none());

    // Errors leave the buffer as it was.
    assert_eq!(integers, [224, 24, 224, 206, 6, 206]);
    assert!(matches!(
        dataset.read_f32_columns(&["x"], &[25], &mut floats),
        Err(Error::IndexOutOfRange { .. })
    ));
}

#[test]
fn numeric_only_files_open_and_read_through_their_columns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("features.parquet");
    let count: i32 = 10;
    write_file(
        &path,
        vec![
            (
                "x",
                Arc::new(Float64Array::from_iter_values(
                    (0..count).map(|i| f64::from(i) * 0.5),
                )) as ArrayRef,
            ),
            ("y", Arc::new(Int32Array::from_iter_values(0..count))),
            (
                "label",
                Arc::new(Int64Array::from_iter_values(
                    (0..count).map(|i| i64::from(i % 2)),
                )),
            ),
        ],
        4,
    );
    assert!(looks_like_parquet(&path));
    let dataset = open(&path).unwrap();
    assert_eq!(dataset.len(), 10);
    assert_eq!(dataset.sample_kind(), ParquetSampleKind::Numeric);
    assert!(!dataset.has_sample_bytes());
    assert_eq!(dataset.label(3), 1);
    assert_eq!(dataset.class_names(), ["0", "1"]);
    let summary = dataset.summary();
    assert_eq!(summary.sample_column, None);
    assert_eq!(summary.label_column.as_deref(), Some("label"));
    let mut values = Vec::new();
    dataset
        .read_f32_columns(&["x", "y"], &[9, 2], &mut values)
        .unwrap();
    assert_eq!(values, [4.5, 9.0, 1.0, 2.0]);
    // There are no bytes to read: the error names the file and the way to read it.
    let message = dataset.read(0).unwrap_err().to_string();
    assert!(
        message.contains("features.parquet") && message.contains("SelectColumns"),
        "{message}"
    );

    // A text column asked for by name is still required, and a file with a column that is
    // neither numeric nor a sample column is not numeric-only.
    let options = ParquetOptions {
        text_column: Some("text".into()),
        ..ParquetOptions::default()
    };
    let message = ParquetDataset::open(&path, &options)
        .unwrap_err()
        .to_string();
    assert!(message.contains("no text column \"text\""), "{message}");
    let mixed = dir.path().join("mixed.parquet");
    write_file(
        &mixed,
        vec![
            ("x", Arc::new(Int32Array::from(vec![1])) as ArrayRef),
            ("name", Arc::new(StringArray::from(vec!["a"]))),
        ],
        4,
    );
    let message = open(&mixed).unwrap_err().to_string();
    assert!(message.contains("not only numeric columns"), "{message}");
}

#[test]
fn files_that_are_not_parquet_fail_at_open_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.parquet");
    write_file(&good, image_columns(40), 8);
    let bytes = std::fs::read(&good).unwrap();

    let cases: [(&str, Vec<u8>); 4] = [
        ("truncated.parquet", bytes[..bytes.len() / 2].to_vec()),
        (
            "garbage.parquet",
            b"this is not parquet at all, not even close".repeat(10),
        ),
        ("empty.parquet", Vec::new()),
        ("footer_cut.parquet", bytes[..bytes.len() - 3].to_vec()),
    ];
    for (name, contents) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, contents).unwrap();
        let error = open(&path).unwrap_err();
        assert!(
            matches!(error, Error::ParquetFile { .. }),
            "{name}: {error:?}"
        );
        assert!(error.to_string().contains(name), "{error}");
    }

    let empty = tempfile::tempdir().unwrap();
    assert!(matches!(open(empty.path()), Err(Error::NoParquetFiles(_))));
    let no_rows = dir.path().join("no_rows.parquet");
    write_file(&no_rows, image_columns(0), 8);
    assert!(matches!(open(&no_rows), Err(Error::NoParquetRows(_))));
    assert!(matches!(
        open(&dir.path().join("missing")),
        Err(Error::RootNotFound(_))
    ));
}

#[test]
fn wrong_column_types_fail_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, Columns, &str); 3] = [
        (
            "int_image.parquet",
            vec![("image", Arc::new(Int32Array::from(vec![1])) as ArrayRef)],
            "binary column",
        ),
        (
            "text_label.parquet",
            vec![
                ("image", binary(&[b"x"])),
                (
                    "label",
                    Arc::new(StringArray::from(vec!["cat"])) as ArrayRef,
                ),
            ],
            "integer column",
        ),
        (
            "binary_text.parquet",
            vec![("text", binary(&[b"x"]))],
            "UTF-8 string column",
        ),
    ];
    for (name, columns, word) in cases {
        let path = dir.path().join(name);
        write_file(&path, columns, 8);
        let error = open(&path).unwrap_err();
        assert!(matches!(error, Error::ParquetColumn { .. }), "{error:?}");
        let message = error.to_string();
        assert!(
            message.contains(word) && message.contains(name),
            "{message}"
        );
    }
}

#[test]
fn null_image_cells_fail_only_their_sample() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("holes.parquet");
    let images: ArrayRef = Arc::new(BinaryArray::from(vec![
        Some(&b"a"[..]),
        None,
        Some(&b"c"[..]),
    ]));
    write_file(&path, vec![("image", images)], 2);
    let dataset = open(&path).unwrap();
    assert_eq!(dataset.read(0).unwrap(), b"a");
    let error = dataset.read(1).unwrap_err();
    assert!(
        matches!(error, Error::ParquetNullCell { row: 1, .. }),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("holes.parquet") && message.contains("image"),
        "{message}"
    );
    assert_eq!(dataset.read(2).unwrap(), b"c");
    // No label column: every label is 0, and there are no class names.
    assert_eq!(dataset.label(2), 0);
    assert!(dataset.class_names().is_empty());

    let labels = dir.path().join("null_label.parquet");
    write_file(
        &labels,
        vec![
            ("image", binary(&[b"a", b"b"])),
            (
                "label",
                Arc::new(Int32Array::from(vec![Some(1), None])) as ArrayRef,
            ),
        ],
        8,
    );
    assert!(matches!(
        open(&labels),
        Err(Error::ParquetNullCell { row: 1, .. })
    ));
}

#[test]
fn corrupt_pages_fail_the_samples_of_their_row_group_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pages.parquet");
    write_file(&path, image_columns(40), 10);
    // Overwrite the page header of the image column's first page in row group 1.
    let metadata = {
        let file = std::fs::File::open(&path).unwrap();
        parquet::file::reader::FileReader::metadata(
            &parquet::file::serialized_reader::SerializedFileReader::new(file).unwrap(),
        )
        .clone()
    };
    let page = metadata.row_group(1).column(0).data_page_offset() as usize;
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[page..page + 24].fill(0xFF);
    std::fs::write(&path, bytes).unwrap();

    let dataset = open(&path).unwrap();
    for index in 0..40 {
        let result = dataset.read(index);
        if (10..20).contains(&index) {
            let error = result.unwrap_err();
            assert!(
                matches!(
                    error,
                    Error::ParquetRowGroup {
                        row_group: 1,
                        first_row: 10,
                        ..
                    }
                ),
                "{error:?}"
            );
            assert!(error.to_string().contains("pages.parquet"), "{error}");
        } else {
            assert_eq!(result.unwrap(), format!("image {index}").into_bytes());
        }
    }
}

#[test]
fn scattered_damage_gives_errors_or_bytes_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.parquet");
    let folder = generated_folder(&dir.path().join("folder"), 12);
    let written = write_parquet(
        &folder,
        &dir.path().join("written"),
        &ParquetWriterOptions {
            file_bytes: u64::MAX,
            rows_per_group: 3,
        },
        &|_| {},
    )
    .unwrap();
    std::fs::copy(&written.files[0], &good).unwrap();
    let bytes = std::fs::read(&good).unwrap();
    let mut state = 17u64;
    let mut failures = 0;
    // Half the rounds damage the footer region (metadata, page index), half anywhere.
    let footer_start = bytes.len().saturating_sub(4096);
    for round in 0..200 {
        let mut damaged = bytes.clone();
        let (start, span) = if round % 2 == 0 {
            (footer_start, damaged.len() - footer_start)
        } else {
            (0, damaged.len())
        };
        for _ in 0..4 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let at = start + (state >> 33) as usize % span;
            damaged[at] ^= 0x5A;
        }
        let path = dir.path().join(format!("damaged-{round}.parquet"));
        std::fs::write(&path, damaged).unwrap();
        match open(&path) {
            Ok(dataset) => {
                for index in 0..dataset.len() {
                    if dataset.read(index).is_err() {
                        failures += 1;
                    }
                }
            }
            Err(_) => failures += 1,
        }
        std::fs::remove_file(&path).unwrap();
    }
    // Image bytes are stored raw, so much damage lands in them and reads back unnoticed (the
    // decoder catches it later); the rest must show up as errors.
    assert!(failures > 0);
}

/// A text cell that is not UTF-8 fails its own sample only: Arrow's reader refuses the whole
/// row group for it, so the group is read again as raw bytes; its other rows read as written.
#[test]
fn a_text_cell_that_is_not_utf8_fails_only_its_sample() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docs.parquet");
    let texts: Vec<String> = (0..64)
        .map(|i| {
            if i == 9 {
                "BADCELL!".to_string()
            } else {
                format!("document {i}")
            }
        })
        .collect();
    let batch = RecordBatch::try_from_iter([(
        "text",
        Arc::new(StringArray::from(texts.clone())) as ArrayRef,
    )])
    .unwrap();
    // Plain, uncompressed pages without statistics or checksums, so the cell's bytes are in
    // the file as written and can be made invalid UTF-8 in place.
    let properties = WriterProperties::builder()
        .set_max_row_group_row_count(Some(64))
        .set_dictionary_enabled(false)
        .set_statistics_enabled(parquet::file::properties::EnabledStatistics::None)
        .set_compression(parquet::basic::Compression::UNCOMPRESSED)
        .build();
    let file = std::fs::File::create(&path).unwrap();
    let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(properties)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes
        .windows(8)
        .position(|window| window == b"BADCELL!")
        .unwrap();
    bytes[at..at + 2].copy_from_slice(&[0xff, 0xfe]);
    std::fs::write(&path, bytes).unwrap();

    let dataset = open(&path).unwrap();
    assert_eq!(dataset.sample_kind(), ParquetSampleKind::Text);
    for (index, text) in texts.iter().enumerate() {
        let read = dataset.read(index as u64).unwrap();
        if index == 9 {
            assert_eq!(&read[..2], &[0xff, 0xfe]);
            assert!(std::str::from_utf8(&read).is_err());
        } else {
            assert_eq!(read, text.as_bytes(), "row {index}");
        }
    }
}

/// A file renamed over one of the set's while it is open (the set written again, a copy
/// finished beside it): same layout, other bytes. The offsets read from the first file's footer
/// would serve the second file's rows under the first's labels; the read stops the job instead,
/// naming the file. Before, `Image 0` came back where `image 0` was opened.
#[test]
fn a_file_replaced_under_the_open_set_stops_the_job_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.parquet");
    write_file(&path, image_columns(8), 4);
    let dataset = open(&path).unwrap();
    let other = dir.path().join("a.parquet.new");
    let images: Vec<Vec<u8>> = (0..8).map(|k| format!("Image {k}").into_bytes()).collect();
    let images: Vec<&[u8]> = images.iter().map(Vec::as_slice).collect();
    let labels: Vec<i32> = (0..8).map(|k| (k + 1) % 3).collect();
    write_file(
        &other,
        vec![
            ("image", binary(&images)),
            ("label", Arc::new(Int32Array::from(labels)) as ArrayRef),
        ],
        4,
    );
    assert_eq!(
        std::fs::metadata(&other).unwrap().len(),
        std::fs::metadata(&path).unwrap().len()
    );
    std::fs::rename(&other, &path).unwrap();
    let error = dataset.read(0).unwrap_err();
    assert!(matches!(error, Error::FileReplaced { .. }), "{error:?}");
    assert!(error.dataset_changed() && error.to_string().contains("a.parquet"));
}

/// A file of the set removed while it is open: each of its rows was read as a bad sample (not
/// found) and replaced; the dataset changed, and the read stops the job naming the file.
#[test]
fn a_file_removed_under_the_open_set_stops_the_job_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.parquet");
    write_file(&path, image_columns(8), 4);
    let dataset = open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let error = dataset.read(0).unwrap_err();
    assert!(matches!(error, Error::FileRemoved { .. }), "{error:?}");
    assert!(error.dataset_changed() && error.read_fault() != stoker_datasets::ReadFault::Sample);
    assert!(error.to_string().contains("a.parquet"), "{error}");
}
