//! Which files a worker may read for a job: the data roots (`--data-root`), checked once,
//! and every local path a job names (each dataset of a mix, every folder a pattern can reach,
//! each listed file, a tokenizer) held under one of them. Remote sources are the worker's
//! credentials' business, not its disks'.

use std::path::{Path, PathBuf};

use stoker_pipeline::{spec_sources, Error, ErrorKind, Result};
use stoker_proto::v1::op::Op as OpKind;
use stoker_proto::v1::JobSpec;
use stoker_rpc::error_kinds;
use tonic::Status;

/// Canonical forms of the data roots; a root that does not exist is an error naming it.
pub fn canonical_roots(roots: &[PathBuf]) -> Result<Vec<PathBuf>> {
    roots
        .iter()
        .map(|root| {
            std::fs::canonicalize(root).map_err(|e| {
                Error::InvalidSpec(format!("--data-root {} is not usable: {e}", root.display()))
            })
        })
        .collect()
}

/// Checks that a job's datasets (each of a mix), and the tokenizers they name, lie under one
/// of `roots`.
pub(super) fn check_root(roots: &[PathBuf], spec: &JobSpec) -> std::result::Result<(), Status> {
    let sources = spec_sources(spec);
    let named = spec.mix.as_ref().map_or(1, |mix| mix.sources.len());
    if sources.is_empty() || sources.len() != named {
        return Err(Status::invalid_argument("job spec has no dataset"));
    }
    for (dataset, pipeline) in sources {
        // Remote sources are read with the worker's own credentials, not from its disks. What
        // is local is decided as the opener decides it (`./a://b` is a path).
        // A pattern is held to the roots by every folder it can walk (`reach_of_name`).
        for name in stoker_pipeline::source_names(dataset) {
            match stoker_datasets::parse_dataset_uri(name) {
                Ok(stoker_datasets::DatasetLocation::Local(path)) => {
                    let reach = stoker_datasets::reach_of_name(&path.to_string_lossy())
                        .map_err(|error| Status::invalid_argument(error.to_string()))?;
                    for path in reach {
                        check_under_roots(roots, &path, "dataset")?;
                    }
                }
                Ok(_) => {}
                Err(error) => return Err(Status::invalid_argument(error.to_string())),
            }
        }
        // A tokenizer is read whole: outside the roots it could be any file (or /dev/zero).
        for op in pipeline {
            if let Some(OpKind::Tokenize(tokenize)) = &op.op {
                let path = tokenize.tokenizer_path.trim();
                if !path.is_empty() {
                    check_under_roots(roots, Path::new(path), "tokenizer")?;
                }
            }
        }
    }
    Ok(())
}

/// Checks that `path` (the `what` of a job), resolved, lies under one of `roots`.
fn check_under_roots(
    roots: &[PathBuf],
    path: &Path,
    what: &str,
) -> std::result::Result<(), Status> {
    let canonical = std::fs::canonicalize(path).map_err(|e| unresolved(what, path, e))?;
    if roots.iter().any(|root| canonical.starts_with(root)) {
        return Ok(());
    }
    let listed: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
    Err(error_kinds::status(
        ErrorKind::PermissionDenied,
        format!(
            "{what} {} is outside this worker's --data-root ({})",
            path.display(),
            listed.join(", ")
        ),
    ))
}

/// Why `path` (the `what` of a job) could not be resolved: not there (`NotFound`), not allowed
/// (`PermissionDenied`), or its file system failing for now (a stale NFS handle, an I/O error,
/// short of descriptors: `UNAVAILABLE`, which the opener hands back for another try rather
/// than tell the client, whose run ended on a passing failover).
fn unresolved(what: &str, path: &Path, error: std::io::Error) -> Status {
    use stoker_datasets::ReadFault;
    let message = format!(
        "{what} {} cannot be opened on this worker: {error}",
        path.display()
    );
    let kind = error.kind();
    let fault = stoker_datasets::Error::Io {
        path: path.to_path_buf(),
        source: error,
    }
    .read_fault();
    match (fault, kind) {
        (ReadFault::Source | ReadFault::Resource, _) => {
            Status::unavailable(format!("{message} (may pass: tried again)"))
        }
        (_, std::io::ErrorKind::PermissionDenied) => {
            error_kinds::status(ErrorKind::PermissionDenied, message)
        }
        _ => error_kinds::status(ErrorKind::NotFound, message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stoker_proto::v1::DatasetSource;

    fn job_over(uri: &str) -> JobSpec {
        JobSpec {
            dataset: Some(DatasetSource {
                uri: uri.into(),
                ..DatasetSource::default()
            }),
            ..JobSpec::default()
        }
    }

    /// A path whose resolution failed for a while (a stale NFS handle, an I/O error) read as
    /// not found, and the client was told: its run ended on a file server's failover. It may
    /// pass now (the opener hands the task back); one not allowed says so.
    #[test]
    fn a_path_the_file_system_fails_to_resolve_for_now_may_pass() {
        let path = Path::new("/data/train");
        for code in [libc::ESTALE, libc::EIO, libc::ETIMEDOUT, libc::EMFILE] {
            let status = unresolved("dataset", path, std::io::Error::from_raw_os_error(code));
            assert!(error_kinds::is_transient(&status), "{code}: {status:?}");
        }
        let missing = unresolved(
            "dataset",
            path,
            std::io::Error::from_raw_os_error(libc::ENOENT),
        );
        assert!(!error_kinds::is_transient(&missing));
        assert_eq!(error_kinds::kind_of_status(&missing), ErrorKind::NotFound);
        let denied = unresolved(
            "dataset",
            path,
            std::io::Error::from_raw_os_error(libc::EACCES),
        );
        assert_eq!(
            error_kinds::kind_of_status(&denied),
            ErrorKind::PermissionDenied
        );
        assert!(denied.message().contains("/data/train"), "{denied:?}");
    }

    #[test]
    fn a_path_that_only_looks_like_a_uri_is_held_to_the_data_roots() -> TestResult {
        let dir = tempfile::tempdir()?;
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("inside"))?;
        // `elsewhere/x:` is a folder: `elsewhere/x://y` is a local path, not a URI.
        std::fs::create_dir_all(dir.path().join("elsewhere/x:/y"))?;
        let roots = canonical_roots(std::slice::from_ref(&root))?;
        let sneaky = format!("{}/elsewhere/x://y", dir.path().display());
        let refused = check_root(&roots, &job_over(&sneaky)).expect_err("outside the roots");
        assert!(refused.message().contains("--data-root"), "{refused:?}");
        let inside = root.join("inside");
        check_root(&roots, &job_over(&inside.to_string_lossy()))?;
        // A remote source is the worker's credentials' business, not its disks'.
        check_root(&roots, &job_over("s3://bucket/prefix"))?;
        Ok(())
    }

    #[test]
    fn every_folder_a_pattern_or_list_can_reach_is_held_to_the_data_roots() -> TestResult {
        let dir = tempfile::tempdir()?;
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("shards"))?;
        std::fs::create_dir_all(dir.path().join("outside"))?;
        std::fs::write(root.join("shards/shard-0.tar"), b"x")?;
        std::fs::write(dir.path().join("outside/shard-0.tar"), b"x")?;
        let roots = canonical_roots(std::slice::from_ref(&root))?;
        let root_text = root.display().to_string();
        check_root(&roots, &job_over(&format!("{root_text}/shards/*.tar")))?;
        check_root(
            &roots,
            &job_over(&format!("{root_text}/**/shard-{{0..0}}.tar")),
        )?;
        // A brace that leads out of the root, as a glob's folder or as a file.
        for sneaky in [
            format!("{root_text}/{{shards,../outside}}/*.tar"),
            format!("{root_text}/{{shards,../outside}}/shard-0.tar"),
        ] {
            let refused = check_root(&roots, &job_over(&sneaky)).expect_err("outside the roots");
            assert!(
                refused.message().contains("--data-root"),
                "{sneaky}: {refused:?}"
            );
        }
        // A list is checked name by name.
        let mut listed = job_over("");
        if let Some(dataset) = listed.dataset.as_mut() {
            dataset.uris = vec![
                format!("{root_text}/shards/shard-0.tar"),
                dir.path().join("outside/shard-0.tar").display().to_string(),
            ];
        }
        let refused = check_root(&roots, &listed).expect_err("outside the roots");
        assert!(refused.message().contains("outside"), "{refused:?}");
        Ok(())
    }

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;
}
