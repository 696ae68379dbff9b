//! `JsonlDocuments`: JSON Lines files (one file or a folder of `*.jsonl`), one document per
//! non-blank line, read by random access.
//!
//! The files' line starts are indexed once at open (a `memchr` scan of the file read in chunks,
//! a few GB/s, so no index is cached on disk). Reading sample `i` reads its one line with a
//! positioned read on a file from the process's pool of open files (so a file cut short under
//! a running job is an error naming it, never SIGBUS, and many files hold few descriptors),
//! parses it and returns the UTF-8 text of the text field. Compressed files (`.jsonl.gz`,
//! `.jsonl.zst`) are decompressed once into the local cache tier (`compressed.rs`) and read from
//! there the same way (a copy locked there only while it is made and indexed, and made again
//! from its file if evicted, so a set holds no descriptor per file); errors still name the
//! compressed file. JSONL objects in an object store
//! (`remote.rs`) are fetched whole into the cache tier and read from there. A line that is not
//! a JSON object, lacks the field, or holds something other than a string there is a bad sample
//! whose error names `file:line`; it never stops the index from being built. What Python's
//! `json.dumps` writes beyond strict JSON (`NaN`, a lone surrogate) and a byte-order mark are
//! read as Python reads them back (`lenient.rs`).

use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;
use tracing::info;

use crate::error::{Error, Result};
use crate::file_pool::{FileKey, FilePool};
use crate::files::root_files;
use crate::inspect::Summary;
use crate::sample_source::SampleSource;
use crate::storage::{DerivedSource, ObjectCacheOptions};

mod compressed;
mod lenient;
mod lines;
mod remote;

pub use compressed::is_jsonl_file_name;
use lines::{JsonlFile, LineRef};

/// The text field read when none is named.
pub const DEFAULT_TEXT_FIELD: &str = "text";

/// The label field used, when none is named, if the first document has an integer one.
pub const DEFAULT_LABEL_FIELD: &str = "label";

/// Whether `path` is a JSONL file (`.jsonl`, `.jsonl.gz`, `.jsonl.zst`) or a folder holding at
/// least one, for picking a format automatically.
pub fn looks_like_jsonl(path: &Path) -> bool {
    if path.is_file() {
        return is_jsonl_file_name(path);
    }
    compressed::jsonl_files(path).is_ok_and(|files| !files.is_empty())
}

/// JSON Lines documents: sample `i` is the `i`-th non-blank line over the files in name order.
pub struct JsonlDocuments {
    root: PathBuf,
    files: Vec<JsonlFile>,
    /// Index of each file's first sample.
    first_samples: Vec<u64>,
    len: u64,
    text_field: String,
    label_field: Option<String>,
    /// The files' keys in the pool of open files (one per file, in order).
    pool_keys: Range<FileKey>,
    /// What opening found that its user should be told (JSONL files it does not read).
    notices: Vec<String>,
}

impl Drop for JsonlDocuments {
    fn drop(&mut self) {
        FilePool::global().forget(self.pool_keys.clone());
    }
}

impl JsonlDocuments {
    /// Opens a JSONL file or a folder of them (sorted by name), compressed ones decompressed
    /// into the cache tier that [`ObjectCacheOptions::from_env`] configures (read only when a
    /// compressed file is there).
    ///
    /// `text_field` is the field read (`""`: `"text"`); `label_field` the integer label field
    /// (`""`: `"label"` when the first document has an integer one, else no label, and every
    /// label is -1; a field named that the first document holds no integer in is refused, and
    /// a later document without one reads -1).
    pub fn open(path: &Path, text_field: &str, label_field: &str) -> Result<JsonlDocuments> {
        Self::open_with_cache(path, text_field, label_field, &ObjectCacheOptions::from_env)
    }

    /// Like [`JsonlDocuments::open`], with the cache tier's options given by `cache` (called
    /// once, when a compressed file is there).
    pub fn open_with_cache(
        path: &Path,
        text_field: &str,
        label_field: &str,
        cache: &dyn Fn() -> Result<ObjectCacheOptions>,
    ) -> Result<JsonlDocuments> {
        let (_, paths) = root_files(path, compressed::jsonl_files)?;
        let mut documents =
            Self::open_listed_with_cache(path, paths, text_field, label_field, cache)?;
        if path.is_dir() {
            let (below, first) = compressed::jsonl_files_below(path);
            if let Some(first) = first {
                documents.notices.push(format!(
                    "{below} JSONL file(s) in subfolders of {} are not read (a folder source \
                     reads the files directly in it), {} the first: name them with a pattern \
                     such as {}/**/*.jsonl",
                    path.display(),
                    first.display(),
                    path.display()
                ));
            }
        }
        Ok(documents)
    }

    /// Opens the JSONL files `paths` (a pattern's or list's, in this order) as
    /// [`JsonlDocuments::open`] opens a folder's; `path` names the set in messages.
    pub fn open_listed(
        path: &Path,
        paths: Vec<PathBuf>,
        text_field: &str,
        label_field: &str,
    ) -> Result<JsonlDocuments> {
        Self::open_listed_with_cache(
            path,
            paths,
            text_field,
            label_field,
            &ObjectCacheOptions::from_env,
        )
    }

    fn open_listed_with_cache(
        path: &Path,
        paths: Vec<PathBuf>,
        text_field: &str,
        label_field: &str,
        cache: &dyn Fn() -> Result<ObjectCacheOptions>,
    ) -> Result<JsonlDocuments> {
        if paths.is_empty() {
            return Err(Error::NoJsonlFiles(path.to_path_buf()));
        }
        let mut options = None;
        let mut files = Vec::with_capacity(paths.len());
        for path in paths {
            let (copy, remake) = match compressed::Compression::of(&path) {
                Some(compression) => {
                    let in_force = match options.take() {
                        Some(in_force) => in_force,
                        None => cache()?,
                    };
                    let source = DerivedSource::new(&path, &in_force, "decompressed")?;
                    let remake = compression.remake(source, &path);
                    options = Some(in_force);
                    (Some(remake.copy()?), Some(remake))
                }
                None => (None, None),
            };
            files.push(JsonlFile::open(path, copy, remake)?);
        }
        Self::assemble(path, files, text_field, label_field)
    }

    /// The documents of the indexed `files` (in sample order); `path` names the set.
    fn assemble(
        path: &Path,
        files: Vec<JsonlFile>,
        text_field: &str,
        label_field: &str,
    ) -> Result<JsonlDocuments> {
        let mut first_samples = Vec::with_capacity(files.len());
        let mut len = 0u64;
        for file in &files {
            first_samples.push(len);
            len += file.lines.len() as u64;
        }
        if len == 0 {
            return Err(Error::EmptyJsonl(path.to_path_buf()));
        }
        let text_field = if text_field.is_empty() {
            DEFAULT_TEXT_FIELD.to_string()
        } else {
            text_field.to_string()
        };
        let files_count = files.len();
        let mut documents = JsonlDocuments {
            root: path.to_path_buf(),
            files,
            first_samples,
            len,
            text_field,
            label_field: None,
            pool_keys: FilePool::global().reserve_keys(files_count),
            notices: Vec::new(),
        };
        documents.label_field = if label_field.is_empty() {
            let first = documents.record(0).ok();
            first
                .and_then(|record| record.get(DEFAULT_LABEL_FIELD).and_then(Value::as_i64))
                .map(|_| DEFAULT_LABEL_FIELD.to_string())
        } else {
            documents.check_named_label(label_field)?;
            Some(label_field.to_string())
        };
        info!(
            path = %path.display(),
            files = documents.files.len(),
            documents = len,
            text_field = %documents.text_field,
            "indexed jsonl documents"
        );
        Ok(documents)
    }

    /// The path opened.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The files, in sample order.
    pub fn file_paths(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|file| file.path.as_path())
    }

    /// The field read as text.
    pub fn text_field(&self) -> &str {
        &self.text_field
    }

    /// The label field, if labels are read.
    pub fn label_field(&self) -> Option<&str> {
        self.label_field.as_deref()
    }

    /// Refuses a label field `field` that the first document (when it reads) holds no
    /// integer in: a misnamed field, every label of which would read -1, where the other
    /// formats refuse a label column that is not there.
    fn check_named_label(&self, field: &str) -> Result<()> {
        let Ok(first) = self.record(0) else {
            return Ok(()); // a bad sample, told when read
        };
        if first.get(field).and_then(Value::as_i64).is_some() {
            return Ok(());
        }
        let (file, line) = self.locate(0).ok_or(Error::EmptyJsonl(self.root.clone()))?;
        let held = first
            .keys()
            .take(8)
            .map(|key| format!("{key:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        Err(Error::MalformedRecord {
            path: file.path.clone(),
            line: u64::from(line.line),
            reason: format!(
                "the label field {field:?} holds no integer in the first document (its fields: \
                 {held}): name the field that holds each document's integer label"
            ),
        })
    }

    fn locate(&self, index: u64) -> Option<(&JsonlFile, LineRef)> {
        self.locate_with_key(index)
            .map(|(file, line, _)| (file, line))
    }

    /// The file holding sample `index`, its line, and the file's key in the pool.
    fn locate_with_key(&self, index: u64) -> Option<(&JsonlFile, LineRef, FileKey)> {
        if index >= self.len {
            return None;
        }
        let file = self
            .first_samples
            .partition_point(|first| *first <= index)
            .checked_sub(1)?;
        let file_ref = self.files.get(file)?;
        let line = *file_ref
            .lines
            .get(usize::try_from(index - self.first_samples[file]).ok()?)?;
        Some((file_ref, line, self.pool_keys.start + file as u64))
    }

    fn malformed(file: &JsonlFile, line: LineRef, reason: impl Into<String>) -> Error {
        Error::MalformedRecord {
            path: file.path.clone(),
            line: u64::from(line.line),
            reason: reason.into(),
        }
    }

    /// The parsed JSON object of sample `index`.
    fn record(&self, index: u64) -> Result<serde_json::Map<String, Value>> {
        let (file, line, key) = self.locate_with_key(index).ok_or(Error::IndexOutOfRange {
            index,
            len: self.len,
        })?;
        let bytes = file.line(FilePool::global(), key, line)?;
        let parsed = serde_json::from_slice::<Value>(lenient::without_bom(&bytes));
        // What Python's json wrote (NaN, a lone surrogate) is read as it reads it back; a line
        // the rewrite does not mend is explained by the strict parse's error.
        let parsed = match (parsed, lenient::rewritten(&bytes)) {
            (Err(strict), Some(fixed)) => {
                serde_json::from_slice::<Value>(&fixed).map_err(|_| strict)
            }
            (parsed, _) => parsed,
        };
        match parsed {
            Ok(Value::Object(record)) => Ok(record),
            Ok(other) => Err(Self::malformed(
                file,
                line,
                format!("expected a JSON object, found {}", json_kind(&other)),
            )),
            Err(error) => Err(Self::malformed(
                file,
                line,
                format!("invalid JSON: {error}"),
            )),
        }
    }

    /// Document statistics for `stoker inspect`: reads every line once.
    pub fn report(&self) -> JsonlReport {
        let mut text_bytes = Vec::with_capacity(self.len as usize);
        let mut malformed = 0u64;
        for index in 0..self.len {
            match self.read(index) {
                Ok(text) => text_bytes.push(text.len() as u64),
                Err(_) => malformed += 1,
            }
        }
        JsonlReport {
            files: self.files.len(),
            documents: self.len,
            malformed,
            text_field: self.text_field.clone(),
            label_field: self.label_field.clone(),
            text_bytes: Summary::of(&mut text_bytes),
        }
    }
}

impl std::fmt::Debug for JsonlDocuments {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("JsonlDocuments")
            .field("root", &self.root)
            .field("files", &self.files.len())
            .field("documents", &self.len)
            .field("text_field", &self.text_field)
            .field("label_field", &self.label_field)
            .finish()
    }
}

/// The value of `field` in the JSON object `line` (the last one when the key repeats, as a full
/// parse keeps), or `None` when the object has no such key; other values are validated as a
/// full parse validates them (UTF-8, escapes, number ranges, nesting depth) but not built. An
/// error when `line` is not one valid JSON object.
fn text_field_of(line: &[u8], field: &str) -> serde_json::Result<Option<Value>> {
    use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};

    struct Field<'f>(&'f str);

    /// Walks a value through `deserialize_any`, so the parser checks it as it would for a
    /// `Value` (serde's `IgnoredAny` skips strings and numbers unchecked), keeping nothing.
    struct Skip;

    impl<'de> Visitor<'de> for Skip {
        type Value = ();

        fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            formatter.write_str("any JSON value")
        }

        fn visit_bool<E>(self, _: bool) -> std::result::Result<(), E> {
            Ok(())
        }

        fn visit_i64<E>(self, _: i64) -> std::result::Result<(), E> {
            Ok(())
        }

        fn visit_u64<E>(self, _: u64) -> std::result::Result<(), E> {
            Ok(())
        }

        fn visit_f64<E>(self, _: f64) -> std::result::Result<(), E> {
            Ok(())
        }

        fn visit_str<E>(self, _: &str) -> std::result::Result<(), E> {
            Ok(())
        }

        fn visit_unit<E>(self) -> std::result::Result<(), E> {
            Ok(())
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
            while seq.next_element_seed(Skip)?.is_some() {}
            Ok(())
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<(), A::Error> {
            while map.next_key_seed(Skip)?.is_some() {
                map.next_value_seed(Skip)?;
            }
            Ok(())
        }
    }

    impl<'de> DeserializeSeed<'de> for Skip {
        type Value = ();

        fn deserialize<D: serde::Deserializer<'de>>(
            self,
            deserializer: D,
        ) -> std::result::Result<(), D::Error> {
            deserializer.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Field<'_> {
        type Value = Option<Value>;

        fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            formatter.write_str("a JSON object")
        }

        fn visit_map<A: MapAccess<'de>>(
            self,
            mut map: A,
        ) -> std::result::Result<Self::Value, A::Error> {
            let mut found = None;
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if key == self.0 {
                    found = Some(map.next_value::<Value>()?);
                } else {
                    map.next_value_seed(Skip)?;
                }
            }
            Ok(found)
        }
    }

    impl<'de> DeserializeSeed<'de> for Field<'_> {
        type Value = Option<Value>;

        fn deserialize<D: serde::Deserializer<'de>>(
            self,
            deserializer: D,
        ) -> std::result::Result<Self::Value, D::Error> {
            deserializer.deserialize_map(self)
        }
    }

    let mut deserializer = serde_json::Deserializer::from_slice(line);
    let value = Field(field).deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(value)
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl SampleSource for JsonlDocuments {
    fn len(&self) -> u64 {
        self.len
    }

    /// The document's file and line: a label would be read from the line itself.
    fn fingerprint_key(&self, index: u64) -> String {
        self.describe(index)
    }

    /// The integer label field of the document, -1 when labels are off or the document has
    /// no usable label (reading it parses the line again).
    fn label(&self, index: u64) -> i64 {
        let Some(field) = &self.label_field else {
            return -1;
        };
        self.record(index)
            .ok()
            .and_then(|record| record.get(field).and_then(Value::as_i64))
            .unwrap_or(-1)
    }

    fn describe(&self, index: u64) -> String {
        match self.locate(index) {
            Some((file, line)) => format!("{}:{}", file.path.display(), line.line),
            None => format!(
                "document {index} (out of range for the JSONL documents at {} with {} lines)",
                self.root.display(),
                self.len
            ),
        }
    }

    fn read(&self, index: u64) -> Result<Vec<u8>> {
        let (file, line) = self.locate(index).ok_or(Error::IndexOutOfRange {
            index,
            len: self.len,
        })?;
        // The fast path walks the line once and keeps only the text field (other values are
        // checked and skipped, never built); any failure is explained by the full parse below,
        // which gives the same result and the same error messages.
        let bytes = {
            let (file, line, key) = self.locate_with_key(index).ok_or(Error::IndexOutOfRange {
                index,
                len: self.len,
            })?;
            file.line(FilePool::global(), key, line)?
        };
        let field = &self.text_field;
        if let Ok(Some(Value::String(text))) = text_field_of(lenient::without_bom(&bytes), field) {
            return Ok(text.into_bytes());
        }
        if let Some(fixed) = lenient::rewritten(&bytes) {
            if let Ok(Some(Value::String(text))) = text_field_of(&fixed, field) {
                return Ok(text.into_bytes());
            }
        }
        let mut record = self.record(index)?;
        match record.remove(&self.text_field) {
            Some(Value::String(text)) => Ok(text.into_bytes()),
            Some(other) => Err(Self::malformed(
                file,
                line,
                format!(
                    "field {:?} holds {}, not a string",
                    self.text_field,
                    json_kind(&other)
                ),
            )),
            None => Err(Self::malformed(
                file,
                line,
                format!("no field {:?}", self.text_field),
            )),
        }
    }

    fn class_names(&self) -> &[String] {
        &[]
    }

    fn shard_sizes(&self) -> Option<Vec<u64>> {
        Some(self.files.iter().map(|f| f.lines.len() as u64).collect())
    }

    /// JSONL files in subfolders of a folder source, which it does not read.
    fn notices(&self) -> Vec<String> {
        self.notices.clone()
    }
}

/// What `stoker inspect` reports about JSONL documents.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JsonlReport {
    /// Files read.
    pub files: usize,
    /// Non-blank lines (samples).
    pub documents: u64,
    /// Lines that are not a JSON object with a string text field.
    pub malformed: u64,
    /// The text field.
    pub text_field: String,
    /// The label field, if labels are read.
    pub label_field: Option<String>,
    /// UTF-8 bytes of the text, over well-formed documents.
    pub text_bytes: Summary,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_field_is_found_as_a_full_parse_finds_it() {
        let cases: [(&str, Option<Value>); 6] = [
            (
                r#"{"text": "hello", "label": 3}"#,
                Some(Value::from("hello")),
            ),
            // Escaped key and value, nested values skipped.
            (
                r#"{"meta": {"a": [1, {"b": null}]}, "te\u0078t": "caf\u00e9\n"}"#,
                Some(Value::from("café\n")),
            ),
            // A repeated key: the last one, as serde_json's map keeps.
            (
                r#"{"text": "first", "text": "last"}"#,
                Some(Value::from("last")),
            ),
            (r#"{"other": "x"}"#, None),
            (r#"{"text": 7}"#, Some(Value::from(7))),
            (r#"  {"text": ""}  "#, Some(Value::from(""))),
        ];
        for (line, expected) in cases {
            assert_eq!(
                text_field_of(line.as_bytes(), "text").unwrap(),
                expected,
                "{line}"
            );
            let full: Value = serde_json::from_str(line).unwrap();
            assert_eq!(full.get("text").cloned(), expected, "{line}");
        }
        for bad in [
            r#"["text"]"#,
            r#"{"text": "x"} trailing"#,
            r#"{"text": "x""#,
            "",
            "7",
        ] {
            assert!(text_field_of(bad.as_bytes(), "text").is_err(), "{bad}");
        }
    }
}
