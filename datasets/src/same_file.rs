//! Whether a file a dataset reads by position is still the file it was opened with: its
//! device, inode and length, taken at open and compared as it is read again (opened again by
//! its path, or held open). Another file put in its place (written beside it and renamed over
//! it, as rsync, `save_to_disk` and most writers do) or the file cut or grown is refused with
//! [`Error::FileReplaced`]: the offsets read at open would point into other bytes, other
//! samples read under the labels read then, so the job stops naming the file, and no sample is
//! replaced as bad (a JSONL file may grow: lines appended leave the others where they were). A
//! file removed, found missing when it is opened again, is [`Error::FileRemoved`]. A file
//! rewritten in place at the same length (or longer, where a file may grow) is not told.

use std::fs::{File, Metadata};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::error::{Error, Result};

/// A file's device, inode and length when the dataset opened it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SameFile {
    device: u64,
    inode: u64,
    len: u64,
}

impl SameFile {
    /// The identity `metadata` gives.
    pub(crate) fn of(metadata: &Metadata) -> SameFile {
        SameFile {
            device: metadata.dev(),
            inode: metadata.ino(),
            len: metadata.len(),
        }
    }

    /// The identity of `file` (named `path` in errors).
    pub(crate) fn of_file(file: &File, path: &Path) -> Result<SameFile> {
        let metadata = file.metadata().map_err(|error| Error::io(path, error))?;
        Ok(SameFile::of(&metadata))
    }

    /// The file's length when opened.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// `Ok` when `file` (named `path`) is the file this identity was taken of, with its
    /// length; else [`Error::FileReplaced`].
    pub(crate) fn check(&self, file: &File, path: &Path) -> Result<()> {
        self.matches(SameFile::of_file(file, path)?, path)
    }

    /// Like [`SameFile::check`], but a file grown since (only appended to: every offset read
    /// at open still holds the bytes it held) is the same.
    pub(crate) fn check_appended(&self, file: &File, path: &Path) -> Result<()> {
        let now = SameFile::of_file(file, path)?;
        if (now.device, now.inode) == (self.device, self.inode) && now.len >= self.len {
            return Ok(());
        }
        self.matches(now, path)
    }

    /// `Ok` when `now` (the identity of the file at `path` now) is this one; else
    /// [`Error::FileReplaced`].
    pub(crate) fn matches(&self, now: SameFile, path: &Path) -> Result<()> {
        if now == *self {
            return Ok(());
        }
        Err(Error::FileReplaced {
            path: path.to_path_buf(),
            opened_len: self.len,
            now_len: now.len,
        })
    }
}

/// The error of opening the file `path` again, from `read_from` (the file, or an object's
/// copy in the cache tier), that failed with `source`: a file no longer there is
/// [`Error::FileRemoved`], the dataset changed, not a sample that cannot be read; a copy no
/// longer there is this node's cache's fault ([`Error::Cache`]), not the dataset's.
pub(crate) fn reopen_error(path: &Path, read_from: &Path, source: std::io::Error) -> Error {
    match source.kind() {
        _ if read_from != path => Error::Cache {
            path: read_from.to_path_buf(),
            source,
        },
        std::io::ErrorKind::NotFound => Error::FileRemoved {
            path: path.to_path_buf(),
        },
        _ => Error::io(path, source),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_file_renamed_over_cut_or_grown_is_not_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.bin");
        std::fs::write(&path, b"0123456789").unwrap();
        let opened = SameFile::of_file(&File::open(&path).unwrap(), &path).unwrap();
        assert_eq!(opened.len(), 10);
        opened.check(&File::open(&path).unwrap(), &path).unwrap();
        // Same length, another file renamed over it.
        let beside = dir.path().join("a.bin.new");
        std::fs::write(&beside, b"abcdefghij").unwrap();
        std::fs::rename(&beside, &path).unwrap();
        let error = opened
            .check(&File::open(&path).unwrap(), &path)
            .unwrap_err();
        assert!(matches!(
            error,
            Error::FileReplaced {
                opened_len: 10,
                now_len: 10,
                ..
            }
        ));
        assert!(error.dataset_changed());
        // The same file grown.
        let opened = SameFile::of_file(&File::open(&path).unwrap(), &path).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"+")
            .unwrap();
        let error = opened
            .check(&File::open(&path).unwrap(), &path)
            .unwrap_err();
        assert!(
            matches!(error, Error::FileReplaced { now_len: 11, .. }),
            "{error}"
        );
        // Only appended to: the same file where appending keeps the offsets read at open.
        opened
            .check_appended(&File::open(&path).unwrap(), &path)
            .unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(5)
            .unwrap();
        let error = opened
            .check_appended(&File::open(&path).unwrap(), &path)
            .unwrap_err();
        assert!(
            matches!(error, Error::FileReplaced { now_len: 5, .. }),
            "{error}"
        );
    }

    /// A file gone when opened again is a changed dataset; an object's copy gone from the
    /// cache tier is the cache's fault (another worker may read the object), not the dataset's.
    #[test]
    fn a_file_gone_is_removed_and_a_copy_gone_is_the_caches() {
        let gone = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let path = Path::new("/data/a.arrow");
        let removed = reopen_error(path, path, gone());
        assert!(matches!(removed, Error::FileRemoved { .. }) && removed.dataset_changed());
        let uri = Path::new("s3://bucket/a.arrow");
        let copy = Path::new("/cache/bucket/a.arrow");
        let evicted = reopen_error(uri, copy, gone());
        assert!(matches!(evicted, Error::Cache { .. }), "{evicted}");
        assert!(!evicted.dataset_changed() && evicted.read_fault() != crate::ReadFault::Sample);
    }
}
