//! Where a dataset's files may be read from: the files a dataset refers to by path rather than
//! holds (Hugging Face `Image` cells, in Parquet or in a `save_to_disk` folder, whose `bytes`
//! are null and whose `path` names the image), and every file of a dataset read from local
//! disk, its links followed.
//!
//! In process any path the user's own dataset names is read. A worker daemon serves jobs from
//! clients, so it confines them to its data roots ([`allow_referenced_files_under`]): a
//! dataset inside a root must not make it read `/etc/shadow` by naming it in a cell, nor by a
//! link to it planted among its files ([`check_data_file`]).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::error::Error;

static ROOTS: OnceLock<Vec<PathBuf>> = OnceLock::new();

/// Confines referenced files to `roots` (canonical paths) for the rest of the process; the
/// first call wins. Without a call every path is read.
pub fn allow_referenced_files_under(roots: Vec<PathBuf>) {
    let _ = ROOTS.set(roots);
}

/// Whether `path` may be read: `Err` says why not (outside the roots, or not resolvable).
pub(crate) fn check_allowed(path: &Path) -> Result<(), String> {
    let Some(roots) = ROOTS.get() else {
        return Ok(());
    };
    let canonical = std::fs::canonicalize(path).map_err(|error| {
        format!(
            "refers to the image file {}, which cannot be opened: {error}",
            path.display()
        )
    })?;
    if roots.iter().any(|root| canonical.starts_with(root)) {
        return Ok(());
    }
    Err(format!(
        "refers to the image file {}, outside this worker's data roots",
        path.display()
    ))
}

/// Checks that the dataset file `path` (a shard, a file of a folder or a pattern, an image, an
/// index), its links followed, lies under the data roots, when a worker daemon set them; in
/// process every file is read. The error names the file and where it leads.
pub(crate) fn check_data_file(path: &Path) -> crate::error::Result<()> {
    let Some(roots) = ROOTS.get() else {
        return Ok(());
    };
    let canonical = std::fs::canonicalize(path).map_err(|source| Error::io(path, source))?;
    if roots.iter().any(|root| canonical.starts_with(root)) {
        return Ok(());
    }
    Err(Error::io(
        path,
        std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "it leads to {}, outside this worker's --data-root",
                canonical.display()
            ),
        ),
    ))
}

/// [`check_data_file`] of each of `files`.
pub(crate) fn check_data_files(files: &[PathBuf]) -> crate::error::Result<()> {
    files.iter().try_for_each(|file| check_data_file(file))
}
