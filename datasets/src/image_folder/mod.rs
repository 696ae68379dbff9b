//! `ImageFolder`: a `root/<class>/**/<image>` tree indexed exactly like torchvision's
//! `datasets.ImageFolder`, kept compact enough for tens of millions of files; the same tree
//! under an `s3://` prefix (`remote.rs`) is indexed from its keys in the same order.

mod listing;
mod python_order;
mod remote;

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use rayon::prelude::*;
use tracing::{info, warn};

use crate::cache_stats::CacheStats;
use crate::error::{Error, Result};
use crate::sample_source::SampleSource;
use listing::{find_classes, list_class, FolderListing, LeftOut};
use python_order::path_from_bytes;

/// A folder of images with one subfolder per class, indexed the way torchvision's
/// `ImageFolder` indexes it: sample `i` and its label are the same in both.
///
/// The index holds no `PathBuf` per sample: file names live in one byte buffer with one end
/// offset each, and the folder (hence the label) of a sample is found by binary search over
/// the folders, which are few. That is about `name length + 8` bytes per sample.
pub struct ImageFolder {
    root: PathBuf,
    class_names: Vec<String>,
    folders: Vec<IndexedFolder>,
    names: Vec<u8>,
    name_ends: Vec<u64>,
    /// How samples are read when the folder is under an `s3://` prefix.
    remote: Option<remote::RemoteImages>,
    /// Image files left out (see [`ImageFolder::left_out`]): how many, and the first.
    left_out: Option<(u64, PathBuf)>,
}

/// A folder holding at least one image; its samples are `first_sample..` up to the next
/// folder's first sample.
struct IndexedFolder {
    first_sample: u64,
    label: u32,
    relative: Box<[u8]>,
}

impl ImageFolder {
    /// Indexes the image folder at `root`.
    ///
    /// Fails when `root` is missing or not a folder, holds no class folder, or when a class
    /// folder holds no image (torchvision refuses that too).
    pub fn open(root: &Path) -> Result<ImageFolder> {
        let started = Instant::now();
        let metadata = match std::fs::metadata(root) {
            Ok(metadata) => metadata,
            Err(source) if source.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::RootNotFound(root.to_path_buf()));
            }
            Err(source) => return Err(Error::io(root, source)),
        };
        if !metadata.is_dir() {
            return Err(Error::NotADirectory(root.to_path_buf()));
        }
        let classes = find_classes(root)?;
        if classes.is_empty() {
            return Err(Error::NoClasses(root.to_path_buf()));
        }
        // A class folder linked outside a worker's data roots is refused whole at open; a
        // file linked out is refused when read.
        for class in &classes {
            let name =
                <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&class.name_bytes);
            crate::referenced_files::check_data_file(&root.join(name))?;
        }
        if u32::try_from(classes.len()).is_err() {
            return Err(Error::TooLarge(root.to_path_buf()));
        }

        let listings: Vec<(Vec<FolderListing>, LeftOut)> = classes
            .par_iter()
            .map(|class| {
                let mut left_out = LeftOut::default();
                let folders = list_class(root, &class.name_bytes, &mut left_out);
                (folders, left_out)
            })
            .collect();
        let mut left_out = LeftOut::default();
        let listings: Vec<Vec<FolderListing>> = listings
            .into_iter()
            .map(|(folders, class_left_out)| {
                left_out.merge(class_left_out);
                folders
            })
            .collect();

        let class_names: Vec<String> = classes.into_iter().map(|class| class.name).collect();
        let empty_classes: Vec<String> = listings
            .iter()
            .zip(&class_names)
            .filter(|(folders, _)| folders.is_empty())
            .map(|(_, name)| name.clone())
            .collect();
        if empty_classes.len() == class_names.len() {
            return Err(Error::EmptyDataset(root.to_path_buf()));
        }
        if !empty_classes.is_empty() {
            return Err(Error::EmptyClasses {
                root: root.to_path_buf(),
                classes: empty_classes,
            });
        }

        let mut folder = ImageFolder {
            root: root.to_path_buf(),
            class_names,
            folders: Vec::new(),
            names: Vec::new(),
            name_ends: Vec::new(),
            remote: None,
            left_out: None,
        };
        for (label, class_folders) in (0u32..).zip(listings) {
            for listing in class_folders {
                folder.append(label, listing);
            }
        }
        folder.report_left_out(left_out);
        folder.names.shrink_to_fit();
        folder.name_ends.shrink_to_fit();
        info!(
            root = %root.display(),
            classes = folder.class_names.len(),
            samples = folder.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "indexed image folder"
        );
        Ok(folder)
    }

    fn append(&mut self, label: u32, listing: FolderListing) {
        self.folders.push(IndexedFolder {
            first_sample: self.name_ends.len() as u64,
            label,
            relative: listing.relative.into_boxed_slice(),
        });
        let base = self.names.len() as u64;
        self.names.extend_from_slice(&listing.names);
        self.name_ends
            .extend(listing.name_ends.iter().map(|end| base + *end as u64));
    }

    /// Image files the folder holds but does not take as samples, and the first of them by
    /// path: GIF (torchvision's `ImageFolder` leaves it out too, so sample indices stay
    /// torchvision's) and formats Stoker does not decode (HEIC, AVIF, JPEG 2000, JPEG XL, raw
    /// camera files...). Opening logs them once, with the count and that file. `None` when
    /// there is none.
    pub fn left_out(&self) -> Option<(u64, &Path)> {
        self.left_out
            .as_ref()
            .map(|(count, first)| (*count, first.as_path()))
    }

    /// Keeps and logs (once) what `left_out` counted.
    fn report_left_out(&mut self, left_out: LeftOut) {
        let Some(first) = left_out.first else {
            return;
        };
        let first = self.root.join(path_from_bytes(&first));
        self.left_out = Some((left_out.count, first));
        for notice in self.notices() {
            warn!("{notice}");
        }
    }

    /// The folder the dataset was opened from (an `s3://` prefix as a path, when remote).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The full path of sample `index`, or `None` past the end.
    pub fn path(&self, index: u64) -> Option<PathBuf> {
        let (folder, name) = self.locate(index)?;
        let mut path = self.root.join(path_from_bytes(&folder.relative));
        path.push(path_from_bytes(name));
        Some(path)
    }

    /// The folder holding sample `index` and the sample's file name.
    fn locate(&self, index: u64) -> Option<(&IndexedFolder, &[u8])> {
        let position = usize::try_from(index).ok()?;
        let end = usize::try_from(*self.name_ends.get(position)?).ok()?;
        let start = match position {
            0 => 0,
            _ => usize::try_from(self.name_ends[position - 1]).ok()?,
        };
        let folder_position = self
            .folders
            .partition_point(|folder| folder.first_sample <= index)
            .checked_sub(1)?;
        Some((&self.folders[folder_position], &self.names[start..end]))
    }
}

impl SampleSource for ImageFolder {
    fn len(&self) -> u64 {
        self.name_ends.len() as u64
    }

    fn label(&self, index: u64) -> i64 {
        match self.locate(index) {
            Some((folder, _)) => i64::from(folder.label),
            None => panic!(
                "sample index {index} is out of range for an image folder of {} samples",
                self.len()
            ),
        }
    }

    fn describe(&self, index: u64) -> String {
        match self.path(index) {
            Some(path) => path.display().to_string(),
            None => format!(
                "sample {index} (out of range for {} with {} samples)",
                self.root.display(),
                self.len()
            ),
        }
    }

    fn read(&self, index: u64) -> Result<Vec<u8>> {
        if self.remote.is_some() {
            return self.read_remote(index);
        }
        let path = self.path(index).ok_or(Error::IndexOutOfRange {
            index,
            len: self.len(),
        })?;
        crate::image_file::read_bounded(&path)
    }

    fn class_names(&self) -> &[String] {
        &self.class_names
    }

    fn prefetch(&self, indices: &[u64]) {
        self.prefetch_remote(indices);
    }

    /// The image files left out ([`ImageFolder::left_out`]), with their count and the first.
    fn notices(&self) -> Vec<String> {
        self.left_out
            .iter()
            .map(|(count, first)| {
                format!(
                    "{}: left out {count} image file(s) an image folder does not take (GIF, as \
                     torchvision's ImageFolder; HEIC, AVIF, JPEG 2000 and other formats Stoker \
                     does not decode), the first {}",
                    self.root.display(),
                    first.display()
                )
            })
            .collect()
    }

    fn cache_stats(&self) -> Option<CacheStats> {
        self.remote.as_ref().map(|remote| remote.cache.stats())
    }
}

impl fmt::Debug for ImageFolder {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("ImageFolder")
            .field("root", &self.root)
            .field("classes", &self.class_names.len())
            .field("samples", &self.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(root: &Path, relative: &str) {
        let path = root.join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, relative.as_bytes()).unwrap();
    }

    /// A large file that starts as no image does is a bad sample, found from its first bytes;
    /// a large image is read whole, as a small file of any bytes is (the decoder judges it).
    #[test]
    fn a_large_file_that_is_no_image_is_refused_from_its_first_bytes() {
        let temp = tempfile::tempdir().unwrap();
        touch(temp.path(), "a/small.jpg");
        let mut png = vec![0u8; 5 << 20];
        png[..8].copy_from_slice(&[0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A]);
        std::fs::write(temp.path().join("a/large.png"), &png).unwrap();
        std::fs::write(temp.path().join("a/video.jpg"), vec![0u8; 5 << 20]).unwrap();
        let folder = ImageFolder::open(temp.path()).unwrap();
        let names: Vec<String> = (0..3).map(|i| folder.describe(i)).collect();
        let at = |name: &str| names.iter().position(|n| n.contains(name)).unwrap() as u64;
        assert_eq!(folder.read(at("small.jpg")).unwrap(), b"a/small.jpg");
        assert_eq!(folder.read(at("large.png")).unwrap(), png);
        let error = folder.read(at("video.jpg")).unwrap_err();
        assert_eq!(error.read_fault(), crate::ReadFault::Sample, "{error}");
        assert!(error.to_string().contains("no image format"), "{error}");
    }

    #[test]
    fn locate_finds_folder_boundaries() {
        let temp = tempfile::tempdir().unwrap();
        touch(temp.path(), "a/1.jpg");
        touch(temp.path(), "a/x/2.jpg");
        touch(temp.path(), "a/x/3.jpg");
        touch(temp.path(), "b/4.png");
        let folder = ImageFolder::open(temp.path()).unwrap();
        let labels: Vec<i64> = (0..folder.len()).map(|index| folder.label(index)).collect();
        assert_eq!(labels, [0, 0, 0, 1]);
        assert_eq!(folder.read(2).unwrap(), b"a/x/3.jpg");
        assert_eq!(folder.read(3).unwrap(), b"b/4.png");
        assert!(folder.path(4).is_none());
        assert!(folder.describe(4).contains("out of range"));
    }

    #[test]
    fn image_files_of_formats_not_taken_are_counted_and_the_first_named() {
        let temp = tempfile::tempdir().unwrap();
        touch(temp.path(), "a/1.jpg");
        touch(temp.path(), "a/x/2.heic");
        touch(temp.path(), "b/3.png");
        touch(temp.path(), "b/0.gif");
        touch(temp.path(), "b/notes.txt");
        let folder = ImageFolder::open(temp.path()).unwrap();
        assert_eq!(folder.len(), 2);
        let (count, first) = folder.left_out().unwrap();
        assert_eq!(count, 2);
        assert_eq!(first, temp.path().join("a/x/2.heic"));
        touch(temp.path(), "a/0.avif");
        let folder = ImageFolder::open(temp.path()).unwrap();
        assert_eq!(folder.left_out().unwrap().0, 3);
        assert_eq!(folder.left_out().unwrap().1, temp.path().join("a/0.avif"));
        std::fs::remove_dir_all(temp.path().join("a/x")).unwrap();
        std::fs::remove_file(temp.path().join("a/0.avif")).unwrap();
        std::fs::remove_file(temp.path().join("b/0.gif")).unwrap();
        assert!(ImageFolder::open(temp.path()).unwrap().left_out().is_none());
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn label_past_the_end_panics_with_a_message() {
        let temp = tempfile::tempdir().unwrap();
        touch(temp.path(), "a/1.jpg");
        let folder = ImageFolder::open(temp.path()).unwrap();
        folder.label(1);
    }

    #[cfg(unix)]
    #[test]
    fn symlinked_folders_are_followed_and_loops_stop() {
        let temp = tempfile::tempdir().unwrap();
        touch(temp.path(), "a/1.jpg");
        touch(temp.path(), "elsewhere/2.jpg");
        std::os::unix::fs::symlink(temp.path().join("elsewhere"), temp.path().join("a/link"))
            .unwrap();
        std::os::unix::fs::symlink(temp.path().join("a"), temp.path().join("a/loop")).unwrap();
        let folder = ImageFolder::open(&temp.path().join("a").join("..")).unwrap();
        let paths: Vec<String> = (0..folder.len())
            .map(|index| folder.describe(index))
            .collect();
        // Classes "a" and "elsewhere"; "a/loop" leads back to "a", so it is not walked.
        assert_eq!(paths.len(), 3, "{paths:?}");
        assert!(paths[0].ends_with("a/1.jpg"), "{paths:?}");
        assert!(paths[1].ends_with("a/link/2.jpg"), "{paths:?}");
        assert!(paths[2].ends_with("elsewhere/2.jpg"), "{paths:?}");
    }
}
