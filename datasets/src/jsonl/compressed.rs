//! Compressed JSON Lines: the compression a JSONL file's name says (gzip or zstd), and the
//! decompression of a compressed file into the local cache tier, done once per file version
//! (a changed file is decompressed again), so that it is then indexed and read at random like
//! a plain file.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
pub use crate::files::is_jsonl_file_name;
use crate::files::lowercase_name;
use crate::storage::{DerivedSource, Remake};

/// How a JSONL file is compressed, told by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Compression {
    /// `.jsonl.gz`: gzip (every member of a multi-member file).
    Gzip,
    /// `.jsonl.zst` or `.jsonl.zstd`: Zstandard (every frame).
    Zstd,
}

impl Compression {
    /// The compression of a `.jsonl.gz` / `.jsonl.zst` file; `None` for any other name.
    pub(super) fn of(path: &Path) -> Option<Compression> {
        let name = lowercase_name(path);
        if name.ends_with(".jsonl.gz") {
            Some(Compression::Gzip)
        } else if name.ends_with(".jsonl.zst") || name.ends_with(".jsonl.zstd") {
            Some(Compression::Zstd)
        } else {
            None
        }
    }

    /// How the decompressed copy of `source` is made in the cache tier, a failure to
    /// decompress naming `name` (the file, or the object's URI).
    pub(super) fn remake(self, source: DerivedSource, name: &Path) -> Remake {
        let name = name.to_path_buf();
        Remake::derived(source, move |file, out| {
            self.decompress(file, out).map_err(|error| match error {
                Error::Decompress { source, .. } => Error::Decompress {
                    path: name.clone(),
                    source,
                },
                other => other,
            })
        })
    }

    /// Decompresses `source` into `out`.
    pub(super) fn decompress(self, source: &Path, out: &mut dyn Write) -> Result<()> {
        let file = std::fs::File::open(source).map_err(|error| Error::io(source, error))?;
        let input = std::io::BufReader::new(file);
        let mut reader: Box<dyn Read> = match self {
            Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(input)),
            Compression::Zstd => Box::new(
                zstd::stream::read::Decoder::with_buffer(input)
                    .map_err(|error| Error::io(source, error))?,
            ),
        };
        std::io::copy(&mut reader, out).map_err(|error| Error::Decompress {
            path: source.to_path_buf(),
            source: error,
        })?;
        Ok(())
    }
}

/// The JSONL files directly in `folder` (plain and compressed), sorted by name.
pub(super) fn jsonl_files(folder: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(folder).map_err(|error| Error::io(folder, error))?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.map_err(|error| Error::io(folder, error))?.path();
        if is_jsonl_file_name(&path) && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// Entries looked at, at most, for JSONL files in the subfolders of a folder source.
const SUBFOLDER_ENTRIES_LOOKED_AT: usize = 10_000;

/// JSONL files in the subfolders of `folder` (at any depth, hidden folders left out), which a
/// folder source does not read: how many were found (looking at 10,000 entries at most) and
/// the first, relative to `folder`.
pub(super) fn jsonl_files_below(folder: &Path) -> (usize, Option<PathBuf>) {
    let mut pending: Vec<PathBuf> = match std::fs::read_dir(folder) {
        Ok(entries) => entries
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .filter(|path| path.is_dir() && !is_hidden(path))
            .collect(),
        Err(_) => return (0, None),
    };
    pending.sort();
    pending.reverse();
    let (mut found, mut first, mut looked) = (0, None, 0);
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        let mut folders = Vec::new();
        for path in paths {
            looked += 1;
            if looked > SUBFOLDER_ENTRIES_LOOKED_AT {
                return (found, first);
            }
            if path.is_dir() {
                if !is_hidden(&path) {
                    folders.push(path);
                }
            } else if is_jsonl_file_name(&path) {
                found += 1;
                if first.is_none() {
                    first = path.strip_prefix(folder).ok().map(Path::to_path_buf);
                }
            }
        }
        pending.extend(folders.into_iter().rev());
    }
    (found, first)
}

fn is_hidden(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|name| name.to_string_lossy().starts_with('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_tell_the_compression() {
        assert_eq!(
            Compression::of(Path::new("a/b.JSONL.GZ")),
            Some(Compression::Gzip)
        );
        assert_eq!(
            Compression::of(Path::new("b.jsonl.zst")),
            Some(Compression::Zstd)
        );
        assert_eq!(Compression::of(Path::new("b.jsonl")), None);
        assert_eq!(Compression::of(Path::new("b.tar.gz")), None);
        assert!(is_jsonl_file_name(Path::new("b.jsonl")));
        for compressed in ["b.jsonl.gz", "b.JSONL.ZST", "b.jsonl.zstd"] {
            assert!(
                Compression::of(Path::new(compressed)).is_some(),
                "{compressed}"
            );
            assert!(is_jsonl_file_name(Path::new(compressed)), "{compressed}");
        }
        assert!(is_jsonl_file_name(Path::new("b.jsonl.zstd")));
        assert!(!is_jsonl_file_name(Path::new("b.json.gz")));
    }
}
