//! Shared by the fuzz targets: the per-process scratch folder the path-taking parsers read
//! their input from. Each target binary is one process fuzzing one input at a time, so one
//! folder per process is enough; it lives under `$TMPDIR` (`./dev fuzz` points that at a
//! tmpfs when there is one) and is removed when the process exits normally.

use std::path::Path;
use std::sync::OnceLock;

/// This process's scratch folder (created on first use).
pub fn scratch() -> &'static Path {
    static SCRATCH: OnceLock<tempfile::TempDir> = OnceLock::new();
    SCRATCH
        .get_or_init(|| {
            tempfile::Builder::new()
                .prefix("stoker-fuzz-")
                .tempdir()
                .expect("a scratch folder under $TMPDIR")
        })
        .path()
}
