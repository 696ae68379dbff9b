//! Finding a dataset's files: the tar, Parquet and JSONL sources all take one file or a folder
//! of them ([`root_files`]), found by extension (a JSONL file's: [`is_jsonl_file_name`]); and
//! the files a writer of a set wrote under temporary names, named once the set is whole
//! ([`name_written_set`]) or removed when it is not ([`remove_written_set`]); and the small
//! files a dataset's reading starts from (a manifest, a class list, an index cache) read as
//! regular files of a bounded size ([`read_small_file`]).

use std::path::{Path, PathBuf};

use crate::error::{Error, Result, WriteError};

/// The extension of the index caches written beside tar shards (`tar_shards/cache.rs`).
pub(crate) const TAR_INDEX_CACHE_SUFFIX: &str = "stoker-idx";

/// Whether the file `name` is one of macOS's AppleDouble files (`._shard-0.tar`, beside each
/// file copied from its disks): they hold a file's attributes, never data.
pub(crate) fn is_apple_double(name: &[u8]) -> bool {
    name.starts_with(b"._")
}

/// Whether a file named `name` is an index cache written beside a tar shard (or its temporary,
/// `<...>.stoker-idx.tmp-<pid>`): Stoker's own file, never data a pattern names.
pub(crate) fn is_tar_index_cache_name(name: &str) -> bool {
    let suffix = format!(".{TAR_INDEX_CACHE_SUFFIX}");
    name.ends_with(&suffix) || name.contains(&format!("{suffix}.tmp-"))
}

/// The lowercase file name of `path`.
pub(crate) fn lowercase_name(path: &Path) -> String {
    path.file_name()
        .map(|name| name.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default()
}

/// Whether `path`'s name is a JSONL file's: `.jsonl`, or compressed, `.jsonl.gz`, `.jsonl.zst`,
/// `.jsonl.zstd` (any case; `jsonl/compressed.rs` reads the compression from the same endings).
pub fn is_jsonl_file_name(path: &Path) -> bool {
    let name = lowercase_name(path);
    [".jsonl", ".jsonl.gz", ".jsonl.zst", ".jsonl.zstd"]
        .iter()
        .any(|ending| name.ends_with(ending))
}

/// Whether `path` ends in `.extension` (any case).
pub(crate) fn has_extension(path: &Path, extension: &str) -> bool {
    path.extension()
        .is_some_and(|found| found.eq_ignore_ascii_case(extension))
}

/// The `*.extension` files directly in `folder`, sorted by name (symbolic links followed, like
/// the rest of the dataset code). A `*.extension.partial` file there, which a write stopped
/// before it named its set's files leaves, is [`WriteError::UnfinishedWrite`]: the files named
/// may be a part of the set.
pub(crate) fn files_with_extension(folder: &Path, extension: &str) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(folder).map_err(|source| Error::io(folder, source))?;
    let unfinished = format!(".{extension}.partial");
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.map_err(|source| Error::io(folder, source))?.path();
        let name = lowercase_name(&path);
        if name.ends_with(&unfinished) && !is_apple_double(name.as_bytes()) {
            return Err(WriteError::UnfinishedWrite {
                folder: folder.to_path_buf(),
                file: path
                    .file_name()
                    .map_or(name.clone(), |n| n.to_string_lossy().into_owned()),
            }
            .into());
        }
        let apple_double = path
            .file_name()
            .is_some_and(|name| is_apple_double(name.as_encoded_bytes()));
        if has_extension(&path, extension) && path.is_file() && !apple_double {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// A writer of a set's reads (`stoker convert`): a sample that cannot be read by its own fault
/// (a broken link, a file gone) is written empty, so the set holds the same samples in the same
/// order and it reads back as the same bad sample; logged as the loader logs bad samples (the
/// first 20, then one in 1,000), counted, and said in total at the end, where a set none of
/// whose samples could be read fails (a folder this user may not read). A read that failed for
/// another reason (the disk, descriptors) fails the write.
#[derive(Debug, Default)]
pub(crate) struct Placeholders {
    written: u64,
    first: Option<String>,
}

impl Placeholders {
    /// Sample `index`'s bytes, or none for a sample that cannot be read by its own fault.
    pub(crate) fn read(&mut self, source: &dyn crate::SampleSource, index: u64) -> Result<Vec<u8>> {
        match source.read(index) {
            Ok(bytes) => Ok(bytes),
            Err(error) if error.read_fault() == crate::ReadFault::Sample => {
                self.written += 1;
                let said = format!("{}: {error}", source.describe(index));
                if self.written <= 20 || self.written % 1000 == 0 {
                    tracing::warn!(
                        index,
                        sample = %said,
                        written_empty = self.written,
                        "a sample that cannot be read is written empty: it reads back as the same bad sample"
                    );
                }
                self.first.get_or_insert(said);
                Ok(Vec::new())
            }
            Err(error) => Err(error),
        }
    }

    /// At the end of a write of `samples`: an error when none could be read, else the count
    /// written empty said once.
    pub(crate) fn finish(&self, samples: u64) -> Result<()> {
        if self.written == 0 {
            return Ok(());
        }
        let first = self.first.as_deref().unwrap_or_default();
        if self.written == samples {
            return Err(Error::InvalidArgument(format!(
                "none of the {samples} samples could be read (the first: {first})"
            )));
        }
        tracing::warn!(
            written_empty = self.written,
            samples,
            first,
            "samples that could not be read were written empty"
        );
        Ok(())
    }
}

/// Whether `folder` holds `*.extension` files, or one a write left unfinished (which opening it
/// refuses by name, rather than it being taken for another format).
pub(crate) fn folder_holds(folder: &Path, extension: &str) -> bool {
    match files_with_extension(folder, extension) {
        Ok(files) => !files.is_empty(),
        Err(Error::Write(WriteError::UnfinishedWrite { .. })) => true,
        Err(_) => false,
    }
}

/// The files a dataset root names, and the folder they sit in: the root itself when it is a
/// file (with its parent), else what `list` finds in the folder (with the folder). Fails with
/// [`Error::RootNotFound`] when the root does not exist.
pub(crate) fn root_files(
    path: &Path,
    list: impl FnOnce(&Path) -> Result<Vec<PathBuf>>,
) -> Result<(PathBuf, Vec<PathBuf>)> {
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(source) if source.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::RootNotFound(path.to_path_buf()));
        }
        Err(source) => return Err(Error::io(path, source)),
    };
    let (folder, files) = if metadata.is_dir() {
        (path.to_path_buf(), list(path)?)
    } else {
        let folder = path
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        (folder, vec![path.to_path_buf()])
    };
    // A worker's data roots hold every file, not only the name the job gave.
    crate::referenced_files::check_data_files(&files)?;
    Ok((folder, files))
}
/// Gives each file of a set written under a temporary name, `(temporary, final)`, its final
/// name, once every file of the set is written (so a write stopped midway leaves no set a
/// reader would open as whole); the final names, in order.
/// A process stopped between two renames leaves the rest under their temporary names, which
/// readers refuse ([`files_with_extension`]); the folder is synced after, so the names last.
pub(crate) fn name_written_set(files: Vec<(PathBuf, PathBuf)>) -> Result<Vec<PathBuf>> {
    let named: Vec<PathBuf> = files
        .into_iter()
        .map(|(temporary, path)| {
            std::fs::rename(&temporary, &path).map_err(|source| Error::io(&path, source))?;
            Ok(path)
        })
        .collect::<Result<_>>()?;
    if let Some(folder) = named.first().and_then(|path| path.parent()) {
        std::fs::File::open(folder)
            .and_then(|folder| folder.sync_all())
            .map_err(|source| Error::io(folder, source))?;
    }
    Ok(named)
}

/// Removes, best effort, the temporary files of a set whose write failed: those `files` written
/// whole (`(temporary, final)`) and the one being written, `open`.
pub(crate) fn remove_written_set(files: &[(PathBuf, PathBuf)], open: Option<&Path>) {
    let temporaries = files.iter().map(|(temporary, _)| temporary.as_path());
    for temporary in temporaries.chain(open) {
        let _ = std::fs::remove_file(temporary);
    }
}

/// The file at `path` opened for reading, with its metadata, refused (`InvalidInput`) when
/// it is not a regular file: a named pipe is opened without waiting for a writer, and refused.
pub(crate) fn open_regular_file(
    path: &Path,
) -> std::io::Result<(std::fs::File, std::fs::Metadata)> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok((file, metadata))
}

/// The bytes of the small file at `path` (a manifest, a class list, an index cache): refused
/// when it is not a regular file (a named pipe waited for a writer for good; a link to
/// `/dev/zero` was read until memory ran out) or holds more than `max_bytes`.
pub(crate) fn read_small_file(path: &Path, max_bytes: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let (file, metadata) = open_regular_file(path)?;
    let too_large = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than the {max_bytes} bytes such a file holds"),
        )
    };
    if metadata.len() > max_bytes {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(usize::try_from(metadata.len()).unwrap_or(0));
    file.take(max_bytes + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_large());
    }
    Ok(bytes)
}

/// The most bytes a manifest or class list of a dataset is read as (`dataset_dict.json`,
/// `state.json`, `dataset_info.json`, `classes.txt`).
pub(crate) const MAX_MANIFEST_BYTES: u64 = 256 << 20;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SampleSource;

    /// Every sample gone (a folder its user may not read) was converted to a set of empty
    /// samples, logged once per sample, and the convert succeeded.
    #[test]
    fn a_set_none_of_whose_samples_reads_is_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let spec = crate::SyntheticImageNetSpec {
            count: 4,
            seed: 1,
            classes: 2,
        };
        crate::generate_imagenet_like(dir.path(), &spec, &|_| {}).unwrap();
        let folder = crate::ImageFolder::open(dir.path()).unwrap();
        let mut placeholders = Placeholders::default();
        let first = folder.path(0).unwrap();
        std::fs::remove_file(&first).unwrap();
        assert!(placeholders.read(&folder, 0).unwrap().is_empty());
        assert!(!placeholders.read(&folder, 1).unwrap().is_empty());
        assert!(placeholders.finish(folder.len()).is_ok(), "one of four");
        for index in 0..folder.len() {
            if let Some(path) = folder.path(index) {
                let _ = std::fs::remove_file(path);
            }
        }
        let mut none = Placeholders::default();
        for index in 0..folder.len() {
            assert!(none.read(&folder, index).unwrap().is_empty());
        }
        let error = none.finish(folder.len()).unwrap_err().to_string();
        assert!(
            error.contains("none of the 4 samples could be read"),
            "{error}"
        );
    }
}
