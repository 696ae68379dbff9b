//! Listing class folders and their image files in exactly the order torchvision's
//! `ImageFolder` (`find_classes` + `make_dataset`) produces, so sample indices and labels agree.
//!
//! torchvision's rules, reproduced here:
//! - classes are the entries of the root for which `DirEntry.is_dir()` holds (symlinks
//!   followed, hidden folders included), sorted;
//! - each class folder is walked with `sorted(os.walk(dir, followlinks=True))`: every folder
//!   below it, ordered by its full path string (not depth-first), files within a folder sorted;
//! - a file is kept when its lowercased name ends with one of `IMG_EXTENSIONS`; hidden files,
//!   broken symlinks and other non-folders count like any file;
//! - folders `os.walk` cannot list are skipped silently (we log them).
//!
//! One deliberate difference: `os.walk` follows a symlink loop until the path grows too long;
//! we stop at a folder that is already one of its own ancestors.

use std::fs;
use std::path::{Path, PathBuf};

use tracing::warn;

use super::python_order::{compare_like_python, os_str_bytes, path_from_bytes};
use crate::error::{Error, Result};
use crate::image_format::{has_image_extension, is_left_out_image};

/// A class folder found under the root.
pub(crate) struct ClassFolder {
    /// The folder name as the file system stores it.
    pub(crate) name_bytes: Vec<u8>,
    /// The folder name for display (lossy when it is not UTF-8).
    pub(crate) name: String,
}

/// Finds the class folders of `root`, sorted like torchvision's `find_classes`.
pub(crate) fn find_classes(root: &Path) -> Result<Vec<ClassFolder>> {
    let entries = fs::read_dir(root).map_err(|source| Error::io(root, source))?;
    let mut classes = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| Error::io(root, source))?;
        if entry_is_dir(&entry) {
            let name = entry.file_name();
            classes.push(ClassFolder {
                name_bytes: os_str_bytes(&name).to_vec(),
                name: class_name(os_str_bytes(&name)),
            });
        }
    }
    classes.sort_by(|left, right| compare_like_python(&left.name_bytes, &right.name_bytes));
    Ok(classes)
}

/// A class folder's name as text: its bytes as UTF-8, each byte that is not written as
/// `\xNN` (as Python's `backslashreplace` does), so two folders whose names differ only there
/// keep two names (the replacement character made them one).
fn class_name(bytes: &[u8]) -> String {
    let mut name = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        name.push_str(chunk.valid());
        for byte in chunk.invalid() {
            name.push_str(&format!("\\x{byte:02x}"));
        }
    }
    name
}

/// The image files of one folder, names packed in one buffer.
pub(crate) struct FolderListing {
    /// Folder path relative to the dataset root, components joined by `/`.
    pub(crate) relative: Vec<u8>,
    /// The image file names, concatenated in sorted order.
    pub(crate) names: Vec<u8>,
    /// End offset in `names` of each file name.
    pub(crate) name_ends: Vec<usize>,
}

/// Image files a folder leaves out (`image_format::is_left_out_image`): how many, and the first
/// of them by path (relative to the root, components joined by `/`).
#[derive(Debug, Default)]
pub(crate) struct LeftOut {
    pub(crate) count: u64,
    pub(crate) first: Option<Vec<u8>>,
}

impl LeftOut {
    /// Counts the file at `relative`.
    pub(crate) fn add(&mut self, relative: Vec<u8>) {
        self.count += 1;
        let earlier = self
            .first
            .as_ref()
            .is_some_and(|first| compare_like_python(first, &relative).is_le());
        if !earlier {
            self.first = Some(relative);
        }
    }

    /// Adds the files `other` counted.
    pub(crate) fn merge(&mut self, other: LeftOut) {
        if let Some(first) = other.first {
            self.add(first);
            self.count += other.count - 1;
        }
    }
}

/// Lists every folder under `root/class_name` that holds at least one image, in
/// `sorted(os.walk(...))` order, each with its image file names sorted; with the image files of
/// formats an image folder does not take, counted in `left_out`.
pub(crate) fn list_class(
    root: &Path,
    class_name: &[u8],
    left_out: &mut LeftOut,
) -> Vec<FolderListing> {
    struct PendingFolder {
        relative: Vec<u8>,
        ancestors: Vec<PathBuf>,
    }

    let mut pending = vec![PendingFolder {
        relative: class_name.to_vec(),
        ancestors: Vec::new(),
    }];
    let mut folders = Vec::new();
    while let Some(folder) = pending.pop() {
        let path = root.join(path_from_bytes(&folder.relative));
        let mut ancestors = folder.ancestors;
        match fs::canonicalize(&path) {
            Ok(identity) if ancestors.contains(&identity) => {
                warn!(path = %path.display(), "skipping symlink loop in image folder");
                continue;
            }
            Ok(identity) => ancestors.push(identity),
            Err(error) => {
                warn!(path = %path.display(), %error, "skipping unreadable folder");
                continue;
            }
        }
        let Some(entries) = read_folder(&path) else {
            continue;
        };

        let mut file_names: Vec<u8> = Vec::new();
        let mut file_spans: Vec<(usize, usize)> = Vec::new();
        for entry in entries {
            let name = entry.file_name();
            let name = os_str_bytes(&name);
            if entry_is_dir(&entry) {
                let mut relative = Vec::with_capacity(folder.relative.len() + 1 + name.len());
                relative.extend_from_slice(&folder.relative);
                relative.push(b'/');
                relative.extend_from_slice(name);
                pending.push(PendingFolder {
                    relative,
                    ancestors: ancestors.clone(),
                });
            } else if has_image_extension(name) && !entry_is_special(&entry) {
                let start = file_names.len();
                file_names.extend_from_slice(name);
                file_spans.push((start, file_names.len()));
            } else if is_left_out_image(name) {
                left_out.add([&folder.relative[..], b"/", name].concat());
            }
        }
        if file_spans.is_empty() {
            continue;
        }
        file_spans.sort_by(|left, right| {
            compare_like_python(&file_names[left.0..left.1], &file_names[right.0..right.1])
        });
        let mut names = Vec::with_capacity(file_names.len());
        let mut name_ends = Vec::with_capacity(file_spans.len());
        for (start, end) in file_spans {
            names.extend_from_slice(&file_names[start..end]);
            name_ends.push(names.len());
        }
        folders.push(FolderListing {
            relative: folder.relative,
            names,
            name_ends,
        });
    }
    // Every path shares the `root/class` prefix, so ordering the relative paths orders the
    // full `dirpath` strings that `sorted(os.walk(...))` compares.
    folders.sort_by(|left, right| compare_like_python(&left.relative, &right.relative));
    folders
}

/// Reads a folder's entries, or logs and returns `None` where `os.walk` would skip the folder.
fn read_folder(path: &Path) -> Option<Vec<fs::DirEntry>> {
    let entries = match fs::read_dir(path) {
        Ok(entries) => entries,
        Err(error) => {
            warn!(path = %path.display(), %error, "skipping unreadable folder");
            return None;
        }
    };
    match entries.collect::<std::io::Result<Vec<_>>>() {
        Ok(entries) => Some(entries),
        Err(error) => {
            warn!(path = %path.display(), %error, "skipping folder that failed mid-listing");
            None
        }
    }
}

/// Whether `entry` is neither a file nor a link (a named pipe, a socket, a device): opening a
/// pipe named `x.jpg` blocks until a writer comes, forever. A link is looked through when read.
fn entry_is_special(entry: &fs::DirEntry) -> bool {
    entry
        .file_type()
        .is_ok_and(|file_type| !file_type.is_file() && !file_type.is_symlink())
}

/// `os.DirEntry.is_dir()`: follows symlinks, and any error means "not a folder".
fn entry_is_dir(entry: &fs::DirEntry) -> bool {
    match entry.file_type() {
        Ok(file_type) if file_type.is_symlink() => {
            fs::metadata(entry.path()).is_ok_and(|metadata| metadata.is_dir())
        }
        Ok(file_type) => file_type.is_dir(),
        Err(_) => false,
    }
}
