//! Opening one file of a Parquet dataset: its footer read, the sample and label columns found
//! in its schema, and its labels read.

use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::Array;
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::ProjectionMask;
use parquet::basic::Compression;
use parquet::errors::ParquetError;
use parquet::file::reader::Length;

use super::bytes::FileBytes;
use super::{
    page_checks, ParquetFile, ParquetOptions, ParquetSampleKind, CLASS_NAMES_KEY,
    IMAGE_COLUMN_NAMES, LABEL_COLUMN_NAME, TEXT_COLUMN_NAME,
};
use crate::arrow_rows::columns::{self, Cell};
use crate::decoder_panics::without_panics;
use crate::error::{Error, Result};

/// A file's footer read, its columns resolved.
pub(super) struct OpenedFile {
    pub(super) file: ParquetFile,
    /// `None` for a numeric-only file.
    pub(super) sample_column_name: Option<String>,
    pub(super) kind: ParquetSampleKind,
    pub(super) label_column: Option<usize>,
    pub(super) class_names: Option<Vec<String>>,
    /// The ClassLabel columns the label column was chosen among (none named, none `label`).
    pub(super) label_candidates: Vec<String>,
}

/// Whether every column of `schema` is numeric (and there is at least one).
fn all_numeric(schema: &arrow_schema::Schema) -> bool {
    !schema.fields().is_empty()
        && schema
            .fields()
            .iter()
            .all(|field| columns::is_numeric(field.data_type()))
}

/// Reads the footer of the file at `path` (its bytes from `source`) and finds the sample and
/// label columns in its schema; `None` for a file of no rows (an empty shard: pandas writes
/// its object columns as the null type), which adds nothing and is not held to the others.
pub(super) fn open_file(
    path: PathBuf,
    source: FileBytes,
    options: &ParquetOptions,
) -> Result<Option<OpenedFile>> {
    let handle = source.footer()?;
    let bytes = handle.len();
    let metadata = without_panics("parquet", || {
        ArrowReaderMetadata::load(&handle, ArrowReaderOptions::new())
    })
    .unwrap_or_else(|message| Err(ParquetError::General(message)))
    .map_err(|source| Error::ParquetFile {
        path: path.clone(),
        source,
    })?;
    // A codec this build does not decode is refused now, not at every read (a set without
    // labels would open and then fail each sample).
    let unread = metadata
        .metadata()
        .row_groups()
        .iter()
        .flat_map(|group| group.columns())
        .map(|column| column.compression())
        .find(|codec| {
            !matches!(
                codec,
                Compression::UNCOMPRESSED
                    | Compression::SNAPPY
                    | Compression::GZIP(_)
                    | Compression::ZSTD(_)
                    | Compression::LZ4
                    | Compression::LZ4_RAW
            )
        });
    if let Some(codec) = unread {
        return Err(Error::ParquetColumn {
            path: path.clone(),
            problem: format!(
                "its pages are compressed with {codec}, which Stoker does not decode (snappy, \
                 gzip, zstd and lz4 are read): write it again with one of those"
            ),
        });
    }
    // Rows are counted from the row groups, as pyarrow counts them: some writers left the
    // footer's own count at 0 (Parquet.Net 3.0) or at one append's (fastparquet), and a file
    // whose footer said 0 was left out as empty, its samples silently lost.
    let groups = metadata.metadata().row_groups();
    if let Some(group) = groups.iter().position(|group| group.num_rows() < 0) {
        return Err(Error::ParquetFile {
            path: path.clone(),
            source: ParquetError::General(format!(
                "row group {group} counts {} rows (the metadata is corrupt)",
                groups[group].num_rows()
            )),
        });
    }
    let group_rows: i128 = groups
        .iter()
        .map(|group| i128::from(group.num_rows()))
        .sum();
    let footer_rows = metadata.metadata().file_metadata().num_rows();
    if i128::from(footer_rows) != group_rows {
        tracing::warn!(
            path = %path.display(),
            footer_rows,
            group_rows = %group_rows,
            "a parquet footer's row count differs from its row groups'; the groups' is read"
        );
    }
    if group_rows == 0 {
        tracing::info!(path = %path.display(), "a parquet file of no rows left out");
        return Ok(None);
    }
    let schema = Arc::clone(metadata.schema());
    let column_problem = |problem: String| Error::ParquetColumn {
        path: path.clone(),
        problem,
    };
    let names: Vec<&str> = schema
        .fields()
        .iter()
        .map(|field| field.name().as_str())
        .collect();
    let find = |name: &str| schema.index_of(name).ok();

    if let (Some(image), Some(text)) = (&options.image_column, &options.text_column) {
        return Err(column_problem(format!(
            "both an image column ({image:?}) and a text column ({text:?}) are named: a sample \
             is one of them; name the one to read"
        )));
    }
    let image = match &options.image_column {
        // A text column named: that column, whatever image column the file has beside it
        // (captions beside images).
        None if options.text_column.is_some() => None,
        Some(name) => Some((
            find(name).ok_or_else(|| {
                column_problem(format!(
                    "no image column named {name:?} (columns: {})",
                    names.join(", ")
                ))
            })?,
            name.clone(),
        )),
        // Else, as in a Hugging Face folder, the first `Image` feature `datasets` wrote into
        // the metadata (CIFAR's `img`).
        None => IMAGE_COLUMN_NAMES
            .iter()
            .find_map(|name| find(name).map(|index| (index, (*name).to_string())))
            .or_else(|| {
                let features = hf_features(&metadata)?;
                schema
                    .fields()
                    .iter()
                    .enumerate()
                    .find_map(|(index, field)| {
                        is_image_feature(&features, field.name())
                            .then(|| (index, field.name().clone()))
                    })
            }),
    };
    let mut path_field = None;
    let (sample_column, sample_column_name, kind, struct_field) = match image {
        Some((index, name)) => {
            let data_type = schema.field(index).data_type();
            let struct_field = match data_type {
                data_type if columns::is_binary(data_type) => None,
                DataType::Struct(fields) => {
                    // Hugging Face's Image: {bytes, path}; a null `bytes` is read from `path`.
                    path_field = fields.iter().position(|field| {
                        field.name() == "path" && columns::is_text(field.data_type())
                    });
                    Some(
                        fields
                            .iter()
                            .position(|field| {
                                field.name() == "bytes" && columns::is_binary(field.data_type())
                            })
                            .ok_or_else(|| {
                                column_problem(format!(
                                    "image column {name:?} is a struct without a binary \
                                     \"bytes\" field ({data_type})"
                                ))
                            })?,
                    )
                }
                other => {
                    return Err(column_problem(format!(
                        "image column {name:?} has type {other}; images need a binary column"
                    )))
                }
            };
            (
                Some(index),
                Some(name),
                ParquetSampleKind::Image,
                struct_field,
            )
        }
        None => {
            let name = options
                .text_column
                .clone()
                .unwrap_or_else(|| TEXT_COLUMN_NAME.to_string());
            match find(&name) {
                Some(index) => {
                    let data_type = schema.field(index).data_type();
                    if !columns::is_text(data_type) {
                        return Err(column_problem(format!(
                            "text column {name:?} has type {data_type}; text needs a UTF-8 \
                             string column"
                        )));
                    }
                    (Some(index), Some(name), ParquetSampleKind::Text, None)
                }
                // Neither images nor text asked for or found: numeric-only when every column
                // is a number.
                None if options.text_column.is_none() && all_numeric(&schema) => {
                    (None, None, ParquetSampleKind::Numeric, None)
                }
                None => {
                    return Err(column_problem(format!(
                        "found no sample column: no image column ({}), no text column {name:?}, \
                         and not only numeric columns (columns: {})",
                        IMAGE_COLUMN_NAMES.join(", "),
                        names.join(", ")
                    )))
                }
            }
        }
    };

    let metadata_value = |key: &str| {
        metadata
            .metadata()
            .file_metadata()
            .key_value_metadata()
            .and_then(|pairs| pairs.iter().find(|pair| pair.key == key))
            .and_then(|pair| pair.value.clone())
    };
    // The label column: the one named, else `label`, else, as in a Hugging Face folder, the
    // first `ClassLabel` of the features `datasets` writes into the metadata (`to_parquet` of a
    // set whose labels are `labels`; the dataset warns when there are several of them, the
    // `label_candidates`), else beside images the names other tools write.
    let label_candidates: Vec<String> = match (&options.label_column, find(LABEL_COLUMN_NAME)) {
        (None, None) => metadata_value(HF_METADATA_KEY)
            .and_then(|json| parsed_features(&json))
            .map(|features| {
                schema
                    .fields()
                    .iter()
                    .map(|field| field.name().clone())
                    .filter(|name| class_label_names(&features, name).is_some())
                    .collect()
            })
            .unwrap_or_default(),
        _ => Vec::new(),
    };
    let label_column = match &options.label_column {
        Some(name) => Some(find(name).ok_or_else(|| {
            column_problem(format!(
                "no label column named {name:?} (columns: {})",
                names.join(", ")
            ))
        })?),
        None => find(LABEL_COLUMN_NAME)
            .or_else(|| find(label_candidates.first()?))
            // Only beside images: a numeric set's `y` is one of its columns.
            .or_else(|| {
                (kind == ParquetSampleKind::Image)
                    .then(|| columns::fallback_label_column(&schema))
                    .flatten()
            }),
    };
    if let Some(index) = label_column {
        let field = schema.field(index);
        if !columns::is_integer(field.data_type()) {
            return Err(column_problem(format!(
                "label column {:?} has type {}; labels need an integer column",
                field.name(),
                field.data_type()
            )));
        }
    }

    let class_names = metadata_value(CLASS_NAMES_KEY)
        .map(|json| {
            serde_json::from_str::<Vec<String>>(&json).map_err(|error| {
                column_problem(format!(
                    "the {CLASS_NAMES_KEY} metadata is not a JSON list of strings: {error}"
                ))
            })
        })
        .transpose()?;
    // Hugging Face `datasets` keeps the features in the `huggingface` metadata: a ClassLabel
    // label column's names are the class names.
    let class_names = match (class_names, label_column) {
        (Some(names), _) => Some(names),
        (None, Some(index)) => metadata_value(HF_METADATA_KEY)
            .and_then(|json| parsed_features(&json))
            .and_then(|features| class_label_names(&features, schema.field(index).name())),
        (None, None) => None,
    };

    Ok(Some(OpenedFile {
        file: ParquetFile {
            path,
            source,
            bytes,
            metadata,
            sample_column,
            struct_field,
            path_field,
        },
        sample_column_name,
        kind,
        label_column,
        class_names,
        label_candidates,
    }))
}

/// The key of the features `datasets` writes into a Parquet file's metadata.
const HF_METADATA_KEY: &str = "huggingface";

/// The Hugging Face features `datasets` wrote into a file's metadata, if any, parsed (once:
/// parsed again for each column, a file of 2,000 columns took minutes to open).
fn hf_features(metadata: &ArrowReaderMetadata) -> Option<serde_json::Value> {
    let json = &metadata
        .metadata()
        .file_metadata()
        .key_value_metadata()?
        .iter()
        .find(|pair| pair.key == HF_METADATA_KEY)?
        .value;
    parsed_features(json.as_deref()?)
}

/// `datasets`' metadata JSON `json`, parsed; `None` when it is not JSON.
fn parsed_features(json: &str) -> Option<serde_json::Value> {
    serde_json::from_str(json).ok()
}

/// Whether the Hugging Face features `features` declare `column` an `Image`.
fn is_image_feature(features: &serde_json::Value, column: &str) -> bool {
    features
        .get("info")
        .and_then(|info| info.get("features")?.get(column)?.get("_type")?.as_str())
        == Some("Image")
}

/// The names of the `ClassLabel` feature `column` in `datasets`' metadata, if it is one
/// (`{"info": {"features": {column: {"_type": "ClassLabel", "names": [...]}}}}`).
fn class_label_names(features: &serde_json::Value, column: &str) -> Option<Vec<String>> {
    let feature = features.get("info")?.get("features")?.get(column)?;
    if feature.get("_type")?.as_str()? != "ClassLabel" {
        return None;
    }
    feature
        .get("names")?
        .as_array()?
        .iter()
        .map(|name| name.as_str().map(str::to_string))
        .collect()
}

/// Reads the whole label column of a file as `i64`.
pub(super) fn read_labels(file: &ParquetFile, column: usize) -> Result<Vec<i64>> {
    let file_error = |source: ParquetError| Error::ParquetFile {
        path: file.path.clone(),
        source,
    };
    let groups: Vec<usize> = (0..file.metadata.metadata().num_row_groups()).collect();
    let handle = file
        .source
        .chunks(file.metadata.metadata(), &groups, &[column])?;
    let checked = handle.try_clone(&file.path)?;
    page_checks::check_pages(checked, file.metadata.metadata(), &groups, &[column])
        .map_err(file_error)?;
    let mask = ProjectionMask::roots(file.metadata.parquet_schema(), [column]);
    let column_name = file.metadata.schema().field(column).name().clone();
    let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(handle, file.metadata.clone())
        .with_projection(mask)
        .with_batch_size(64 * 1024)
        .build()
        .map_err(file_error)?;
    let mut labels = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|error| file_error(error.into()))?;
        let values = batch.column(0);
        for row in 0..values.len() {
            let file_row = labels.len() as u64;
            match columns::integer_cell(values.as_ref(), row) {
                Cell::Value(label) => labels.push(label),
                Cell::Null => {
                    return Err(Error::ParquetNullCell {
                        path: file.path.clone(),
                        column: column_name,
                        row: file_row,
                    })
                }
                Cell::Unfit => {
                    return Err(Error::ParquetValue {
                        path: file.path.clone(),
                        column: column_name,
                        row: file_row,
                        problem: "does not fit a 64-bit signed label".into(),
                    })
                }
            }
        }
    }
    Ok(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_label_names_come_from_the_hugging_face_features() {
        let json = r#"{"info": {"features": {"image": {"_type": "Image"},
            "label": {"_type": "ClassLabel", "names": ["cat", "dog"]},
            "score": {"_type": "Value", "dtype": "int64"}}}}"#;
        let features = parsed_features(json).unwrap();
        assert_eq!(
            class_label_names(&features, "label"),
            Some(vec!["cat".to_string(), "dog".to_string()])
        );
        assert_eq!(class_label_names(&features, "score"), None);
        assert_eq!(class_label_names(&features, "missing"), None);
        assert!(parsed_features("not json").is_none());
        assert!(is_image_feature(&features, "image"));
        assert!(!is_image_feature(&features, "label"));
    }

    /// A file whose footer counts other rows than its row groups hold (written so by some
    /// writers) is read by its row groups, as pyarrow reads it: one whose footer said 0 was
    /// left out as empty, its samples silently lost.
    #[test]
    fn rows_are_counted_from_the_row_groups_whatever_the_footer_says() {
        use arrow_array::{ArrayRef, Int64Array, RecordBatch};
        let batch = RecordBatch::try_from_iter(vec![(
            "count",
            Arc::new(Int64Array::from(vec![0, 1, 2, 1, 0])) as ArrayRef,
        )])
        .unwrap();
        let mut written = Vec::new();
        let mut writer =
            parquet::arrow::ArrowWriter::try_new(&mut written, batch.schema(), None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        // In the footer's compact thrift: field 3, num_rows (i64, zigzag 5 = 0x0a), then
        // field 4's header, the row groups (a list of one struct).
        let count_at: Vec<usize> = written
            .windows(4)
            .enumerate()
            .filter(|(_, bytes)| *bytes == [0x16, 0x0a, 0x19, 0x1c])
            .map(|(at, _)| at + 1)
            .collect();
        assert_eq!(count_at.len(), 1, "{count_at:?}");
        let dir = tempfile::tempdir().unwrap();
        let options = ParquetOptions {
            image_column: None,
            text_column: None,
            label_column: None,
            cache_bytes: 1 << 20,
        };
        // zigzag 0 and 7.
        for (footer_rows, zigzag) in [(0, 0x00), (7, 0x0e)] {
            let mut bytes = written.clone();
            bytes[count_at[0]] = zigzag;
            let path = dir.path().join(format!("footer_{footer_rows}.parquet"));
            std::fs::write(&path, &bytes).unwrap();
            let footer = parquet::file::metadata::ParquetMetaDataReader::new()
                .parse_and_finish(&bytes::Bytes::from(bytes))
                .unwrap();
            assert_eq!(footer.file_metadata().num_rows(), footer_rows);
            let dataset = crate::ParquetDataset::open(&path, &options).unwrap();
            assert_eq!(
                crate::SampleSource::len(&dataset),
                5,
                "footer {footer_rows}"
            );
        }
    }

    /// A file of many columns whose `huggingface` metadata is large opens in about the time
    /// one parse of it takes: the metadata was parsed again for each column (400 columns over
    /// 2 MB of it took 40 s here, 2,000 did not open in minutes).
    #[test]
    fn wide_files_parse_their_metadata_once() {
        use arrow_array::{ArrayRef, Int32Array, RecordBatch};
        use arrow_schema::{DataType, Field, Schema};
        let columns = 400;
        let fields: Vec<Field> = (0..columns)
            .map(|c| Field::new(format!("c{c}"), DataType::Int32, false))
            .collect();
        let zeros = vec!["0"; 1_000_000].join(",");
        let features = format!(r#"{{"info": {{"features": {{}}}}, "padding": [{zeros}]}}"#);
        let schema = Arc::new(Schema::new(fields));
        let arrays: Vec<ArrayRef> = (0..columns)
            .map(|_| Arc::new(Int32Array::from(vec![1])) as ArrayRef)
            .collect();
        let batch = RecordBatch::try_new(Arc::clone(&schema), arrays).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wide.parquet");
        let file = std::fs::File::create(&path).unwrap();
        // In the file's key-value metadata, where `datasets` writes it.
        let properties = parquet::file::properties::WriterProperties::builder()
            .set_key_value_metadata(Some(vec![parquet::file::metadata::KeyValue::new(
                HF_METADATA_KEY.to_string(),
                features,
            )]))
            .build();
        let mut writer =
            parquet::arrow::ArrowWriter::try_new(file, schema, Some(properties)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        let started = std::time::Instant::now();
        let options = ParquetOptions {
            image_column: None,
            text_column: None,
            label_column: None,
            cache_bytes: 1 << 20,
        };
        // Numeric columns only: opened in well under the time 400 parses took.
        let opened = crate::ParquetDataset::open(&path, &options);
        assert!(opened.is_ok(), "{:?}", opened.err());
        let took = started.elapsed();
        assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    }
}
