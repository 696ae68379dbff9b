//! Finding a dataset's files by extension: the tar, Parquet and JSONL sources all take one file
//! or a folder of them.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Whether `path` ends in `.extension` (any case).
pub(crate) fn has_extension(path: &Path, extension: &str) -> bool {
    path.extension()
        .is_some_and(|found| found.eq_ignore_ascii_case(extension))
}

/// The `*.extension` files directly in `folder`, sorted by name (symbolic links followed, like
/// the rest of the dataset code).
pub(crate) fn files_with_extension(folder: &Path, extension: &str) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(folder).map_err(|source| Error::io(folder, source))?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.map_err(|source| Error::io(folder, source))?.path();
        if has_extension(&path, extension) && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}
