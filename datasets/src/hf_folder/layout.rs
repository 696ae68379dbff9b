//! The JSON files of a `save_to_disk` folder and the choice of columns from its features.
//!
//! - `state.json`: `_data_files`, the `.arrow` shards in sample order (`[{"filename": ...}]`).
//! - `dataset_info.json`: `features`, what each column means (`{"_type": "Image"}`,
//!   `{"_type": "ClassLabel", "names": [...]}`, `{"_type": "Value", "dtype": "string"}`...).
//! - `dataset_dict.json` (a `DatasetDict`, one subfolder per split): `{"splits": [...]}`.
//!
//! Columns are chosen by the Parquet rules (`crate::parquet_files`), with the features filling
//! what names cannot tell: the image column is the one named, else the first of `image`,
//! `jpg`, `png`, else the first `Image` feature; without one, the text column (named, else
//! `text`); labels come from the column named, else `label`, else the first `ClassLabel`
//! feature, and a `ClassLabel`'s `names` are the class names.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use arrow_schema::{DataType, Schema};
use serde_json::Value;

use crate::arrow_rows::columns;
use crate::error::{Error, Result};
use crate::label_checks;
use crate::parquet_files::{
    ParquetOptions, ParquetSampleKind, IMAGE_COLUMN_NAMES, LABEL_COLUMN_NAME, TEXT_COLUMN_NAME,
};

pub(crate) use crate::naming::{
    HF_DICT_FILE as DICT_FILE, HF_INFO_FILE as INFO_FILE, HF_STATE_FILE as STATE_FILE,
};

/// What a column means, as `dataset_info.json` declares it (the kinds Stoker maps).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HfFeature {
    /// `Image`: a struct of encoded `bytes` and a `path`.
    Image,
    /// `ClassLabel`: integer labels with class names.
    ClassLabel {
        /// The class names, indexed by label.
        names: Vec<String>,
    },
    /// `Value`: a scalar of `dtype` (`string`, `int64`, `float32`...).
    Value {
        /// The `datasets` dtype name.
        dtype: String,
    },
    /// Any other feature (`Sequence`, `Audio`, nested dicts...), kept by its `_type` (or
    /// `list` / `struct`); read only through its Arrow type.
    Other {
        /// The `_type`, or what the JSON shape says.
        kind: String,
    },
}

fn layout_error(path: &Path, problem: impl Into<String>) -> Error {
    Error::HfDataset {
        path: path.to_path_buf(),
        problem: problem.into(),
    }
}

/// Reads and parses one JSON file of the folder.
fn read_json(path: &Path) -> Result<Value> {
    crate::referenced_files::check_data_file(path)?;
    let text = crate::files::read_small_file(path, crate::files::MAX_MANIFEST_BYTES)
        .map_err(|source| Error::io(path, source))?;
    parse_json(&text, path)
}

/// Parses the JSON file `path` whose bytes are `text`.
pub(crate) fn parse_json(text: &[u8], path: &Path) -> Result<Value> {
    serde_json::from_slice(text).map_err(|source| Error::Manifest {
        path: path.to_path_buf(),
        source,
    })
}

/// The shard files `state.json` lists, in order, as paths inside `root`.
///
/// A file name with a folder part (`../x.arrow`, `/abs.arrow`) is refused: the shards of a
/// saved dataset sit beside `state.json`, and a dataset must not name files outside itself.
pub(crate) fn data_files(root: &Path) -> Result<Vec<PathBuf>> {
    let path = root.join(STATE_FILE);
    let names = data_file_names(&read_json(&path)?, &path)?;
    Ok(names.iter().map(|name| root.join(name)).collect())
}

/// The shard file names the `state.json` at `path` (parsed: `json`) lists, in order, each a
/// plain file name (see [`data_files`]).
pub(crate) fn data_file_names(json: &Value, path: &Path) -> Result<Vec<String>> {
    let entries = json
        .get("_data_files")
        .and_then(Value::as_array)
        .ok_or_else(|| layout_error(path, "no \"_data_files\" list"))?;
    let mut files = Vec::with_capacity(entries.len());
    for entry in entries {
        let name = entry
            .get("filename")
            .and_then(Value::as_str)
            .ok_or_else(|| layout_error(path, format!("a data file without filename: {entry}")))?;
        let mut components = Path::new(name).components();
        match (components.next(), components.next()) {
            (Some(Component::Normal(_)), None) => files.push(name.to_string()),
            _ => {
                return Err(layout_error(
                    path,
                    format!("data file {name:?} is not a file name inside the folder"),
                ))
            }
        }
    }
    if files.is_empty() {
        return Err(layout_error(path, "\"_data_files\" is empty"));
    }
    // Older `datasets` releases saved a selected, shuffled or split dataset as the whole table
    // and a mapping of the rows it keeps; read without the mapping, every row of the table
    // (another split's included) would be served.
    if let Some(indices) = json
        .get("_indices_data_files")
        .and_then(Value::as_array)
        .filter(|indices| !indices.is_empty())
    {
        let names: Vec<&str> = indices
            .iter()
            .filter_map(|entry| entry.get("filename").and_then(Value::as_str))
            .collect();
        return Err(layout_error(
            path,
            format!(
                "it keeps its rows through an indices mapping (\"_indices_data_files\": {}), \
                 which Stoker does not apply; save the dataset again after \
                 `dataset.flatten_indices()`",
                names.join(", ")
            ),
        ));
    }
    Ok(files)
}

/// The features `dataset_info.json` declares, by column name.
pub(crate) fn features(root: &Path) -> Result<BTreeMap<String, HfFeature>> {
    let path = root.join(INFO_FILE);
    features_of(&read_json(&path)?, &path)
}

/// The features the `dataset_info.json` at `path` (parsed: `json`) declares, by column name.
pub(crate) fn features_of(json: &Value, path: &Path) -> Result<BTreeMap<String, HfFeature>> {
    let declared = json
        .get("features")
        .and_then(Value::as_object)
        .ok_or_else(|| layout_error(path, "no \"features\" object"))?;
    let mut features = BTreeMap::new();
    for (name, feature) in declared {
        features.insert(name.clone(), parse_feature(feature, path, name)?);
    }
    Ok(features)
}

fn parse_feature(feature: &Value, path: &Path, name: &str) -> Result<HfFeature> {
    let Some(object) = feature.as_object() else {
        return Ok(HfFeature::Other {
            kind: if feature.is_array() {
                "list"
            } else {
                "unknown"
            }
            .into(),
        });
    };
    let Some(kind) = object.get("_type").and_then(Value::as_str) else {
        return Ok(HfFeature::Other {
            kind: "struct".into(),
        });
    };
    Ok(match kind {
        "Image" => HfFeature::Image,
        "ClassLabel" => {
            let names = object
                .get("names")
                .and_then(Value::as_array)
                .ok_or_else(|| {
                    layout_error(
                        path,
                        format!("ClassLabel feature {name:?} has no names list"),
                    )
                })?
                .iter()
                .map(|class| {
                    class.as_str().map(str::to_string).ok_or_else(|| {
                        layout_error(
                            path,
                            format!("ClassLabel feature {name:?} has a non-string name {class}"),
                        )
                    })
                })
                .collect::<Result<_>>()?;
            HfFeature::ClassLabel { names }
        }
        "Value" => HfFeature::Value {
            dtype: object
                .get("dtype")
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .to_string(),
        },
        other => HfFeature::Other { kind: other.into() },
    })
}

/// The columns a dataset is read from.
#[derive(Debug, Clone)]
pub(crate) struct ColumnChoice {
    /// The root column holding the samples.
    pub(crate) sample_column: usize,
    pub(crate) sample_column_name: String,
    pub(crate) kind: ParquetSampleKind,
    /// For a struct image column: the indices of its binary `bytes` field and of its UTF-8
    /// `path` field (when it has one).
    pub(crate) image_fields: Option<(usize, Option<usize>)>,
    /// The integer label column.
    pub(crate) label_column: Option<usize>,
    /// The class names of a `ClassLabel` label column.
    pub(crate) class_names: Option<Vec<String>>,
}

/// Picks the sample and label columns of `schema` (the first shard's) by the rules in the
/// module doc; `path` names the folder in errors.
pub(crate) fn choose_columns(
    schema: &Schema,
    features: &BTreeMap<String, HfFeature>,
    options: &ParquetOptions,
    path: &Path,
) -> Result<ColumnChoice> {
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    let find = |name: &str| schema.index_of(name).ok();
    let missing = |what: &str, name: &str| {
        layout_error(
            path,
            format!(
                "no {what} column named {name:?} (columns: {})",
                names.join(", ")
            ),
        )
    };
    let is_feature = |index: usize, wanted: fn(&HfFeature) -> bool| {
        features.get(schema.field(index).name()).is_some_and(wanted)
    };

    if let (Some(image), Some(text)) = (&options.image_column, &options.text_column) {
        return Err(layout_error(
            path,
            format!(
                "both an image column ({image:?}) and a text column ({text:?}) are named: a \
                 sample is one of them; name the one to read"
            ),
        ));
    }
    let image = match &options.image_column {
        Some(name) => Some(find(name).ok_or_else(|| missing("image", name))?),
        // A text column named (or a tokenizing pipeline's): that column, whatever image
        // column the folder has beside it.
        None if options.text_column.is_some() => None,
        None => IMAGE_COLUMN_NAMES
            .iter()
            .find_map(|name| find(name))
            .or_else(|| {
                (0..schema.fields().len())
                    .find(|&index| is_feature(index, |f| *f == HfFeature::Image))
            }),
    };
    let (sample_column, kind, image_fields) = match image {
        Some(index) => {
            let field = schema.field(index);
            let image_fields = match field.data_type() {
                data_type if columns::is_binary(data_type) => None,
                DataType::Struct(fields) => {
                    let position = |name: &str, accepts: fn(&DataType) -> bool| {
                        fields
                            .iter()
                            .position(|f| f.name() == name && accepts(f.data_type()))
                    };
                    let bytes = position("bytes", columns::is_binary).ok_or_else(|| {
                        layout_error(
                            path,
                            format!(
                                "image column {:?} is a struct without a binary \"bytes\" field \
                                 ({})",
                                field.name(),
                                field.data_type()
                            ),
                        )
                    })?;
                    Some((bytes, position("path", columns::is_text)))
                }
                other => {
                    return Err(layout_error(
                        path,
                        format!(
                            "image column {:?} has type {other}; images need an Image feature \
                             or a binary column",
                            field.name()
                        ),
                    ))
                }
            };
            (index, ParquetSampleKind::Image, image_fields)
        }
        None => {
            let name = options.text_column.as_deref().unwrap_or(TEXT_COLUMN_NAME);
            let index = find(name).ok_or_else(|| {
                layout_error(
                    path,
                    format!(
                        "found no sample column: no image column ({}, or an Image feature) and \
                         no text column {name:?} (columns: {})",
                        IMAGE_COLUMN_NAMES.join(", "),
                        names.join(", ")
                    ),
                )
            })?;
            let data_type = schema.field(index).data_type();
            if !columns::is_text(data_type) {
                return Err(layout_error(
                    path,
                    format!("text column {name:?} has type {data_type}; text needs a string Value"),
                ));
            }
            (index, ParquetSampleKind::Text, None)
        }
    };

    let label_column = match &options.label_column {
        Some(name) => Some(find(name).ok_or_else(|| missing("label", name))?),
        None => find(LABEL_COLUMN_NAME)
            .or_else(|| {
                let class_labels: Vec<usize> = (0..schema.fields().len())
                    .filter(|&index| {
                        is_feature(index, |f| matches!(f, HfFeature::ClassLabel { .. }))
                    })
                    .collect();
                let first = *class_labels.first()?;
                let named: Vec<&str> = class_labels
                    .iter()
                    .map(|&index| schema.field(index).name().as_str())
                    .collect();
                label_checks::warn_of_label_choice(path, named[0], &named);
                Some(first)
            })
            // Only beside images: a numeric set's `y` is one of its columns.
            .or_else(|| {
                (kind == ParquetSampleKind::Image)
                    .then(|| columns::fallback_label_column(schema))
                    .flatten()
            }),
    };
    let mut class_names = None;
    if let Some(index) = label_column {
        let field = schema.field(index);
        if !columns::is_integer(field.data_type()) {
            return Err(layout_error(
                path,
                format!(
                    "label column {:?} has type {}; labels need a ClassLabel or an integer Value",
                    field.name(),
                    field.data_type()
                ),
            ));
        }
        if let Some(HfFeature::ClassLabel { names }) = features.get(field.name()) {
            class_names = Some(names.clone());
        }
    }
    Ok(ColumnChoice {
        sample_column,
        sample_column_name: schema.field(sample_column).name().clone(),
        kind,
        image_fields,
        label_column,
        class_names,
    })
}
