//! The small JSON files that mark a folder as a generated dataset: a marker written first (the
//! set is incomplete) and a manifest written last (the set is complete).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Written last: its presence means every file of the set is in place.
pub(crate) const MANIFEST_NAME: &str = "stoker-dataset.json";
/// Written first and removed at the end: a run with this spec started here and may not have
/// finished.
pub(crate) const IN_PROGRESS_NAME: &str = "stoker-dataset.in-progress.json";

/// Names this generator; bumped whenever the same spec would produce different bytes, so a set
/// made by an older generator is not mistaken for the current one.
const GENERATOR: &str = "stoker synthetic imagenet-like";
const GENERATOR_VERSION: u32 = 2;

/// The inputs that fully determine a generated set's bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SpecRecord {
    generator: String,
    generator_version: u32,
    count: u64,
    seed: u64,
    classes: u32,
}

impl SpecRecord {
    pub(crate) fn new(count: u64, seed: u64, classes: u32) -> SpecRecord {
        SpecRecord {
            generator: GENERATOR.to_owned(),
            generator_version: GENERATOR_VERSION,
            count,
            seed,
            classes,
        }
    }

    /// The spec in words, for error messages.
    pub(crate) fn describe(&self) -> String {
        format!(
            "count={} seed={} classes={} ({} v{})",
            self.count, self.seed, self.classes, self.generator, self.generator_version
        )
    }
}

/// The record of a complete set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Manifest {
    #[serde(flatten)]
    pub(crate) spec: SpecRecord,
    pub(crate) files: u64,
    pub(crate) total_bytes: u64,
}

/// Reads a JSON record, or `None` when the file does not exist.
pub(crate) fn read_record<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<T>> {
    let text = match std::fs::read(path) {
        Ok(text) => text,
        Err(source) if source.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(Error::io(path, source)),
    };
    serde_json::from_slice(&text)
        .map(Some)
        .map_err(|source| Error::Manifest {
            path: path.to_path_buf(),
            source,
        })
}

/// Writes a JSON record under a temporary name, then renames it into place.
pub(crate) fn write_record<T: Serialize>(path: &Path, record: &T) -> Result<()> {
    let mut text = serde_json::to_vec_pretty(record).map_err(|source| Error::Manifest {
        path: path.to_path_buf(),
        source,
    })?;
    text.push(b'\n');
    super::write_atomically(path, &text)
}
