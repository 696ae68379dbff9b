//! Which format a local dataset path is read as, decided in one place for the loader, `stoker
//! inspect` and the command line's choice of pipeline, so the three never read one folder as
//! different formats. Tar shards take the Parquet and JSONL files beside them as what they are
//! in the sets img2dataset writes (each shard's metadata); a folder of Parquet and JSONL files
//! both, or of data files beside image class folders, is refused by name: read as any one of
//! them, the rest of the folder would be left out without a word.

use std::path::{Path, PathBuf};

use crate::files::is_tar_index_cache_name;
use crate::image_format::has_image_extension;
use crate::naming::{kind_of, FileKind};
use crate::{
    looks_like_hf_dataset, looks_like_jsonl, looks_like_mds, looks_like_parquet,
    looks_like_tar_shards, looks_like_token_file, megatron_pair, Error, Result,
};

/// The format a local path is read as when none is named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalFormat {
    /// A `.tar` shard or a folder of them.
    TarShards,
    /// A Hugging Face `save_to_disk` folder.
    HfDataset,
    /// A folder of Mosaic Streaming's MDS shards.
    Mds,
    /// A `.parquet` file or a folder of them.
    Parquet,
    /// A `.bin` token file, or a Megatron corpus named by its `.bin` or `.idx`.
    TokenFile,
    /// A `.jsonl[.gz|.zst]` file or a folder of them.
    Jsonl,
    /// Anything else: read as an image folder (whose opening says what is wrong with it).
    ImageFolder,
}

/// The format `path` is read as when none is named, in this order: tar shards, a Hugging Face
/// folder, MDS shards, Parquet, a token file or Megatron corpus, JSONL, else an image folder.
/// A folder holding Parquet and JSONL files both, or Parquet or JSONL files beside two or more
/// subfolders of images (class folders: one may be the images a Parquet file's cells name by
/// path), is [`Error::MixedFormats`]; a folder of tar shards is read as tar shards.
pub fn local_format(path: &Path) -> Result<LocalFormat> {
    if looks_like_tar_shards(path) {
        return Ok(LocalFormat::TarShards);
    }
    if looks_like_hf_dataset(path) {
        return Ok(LocalFormat::HfDataset);
    }
    if looks_like_mds(path) {
        return Ok(LocalFormat::Mds);
    }
    if path.is_dir() {
        check_one_format(path)?;
    }
    let megatron_index = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("idx"))
        && megatron_pair(path).is_some();
    Ok(if looks_like_parquet(path) {
        LocalFormat::Parquet
    } else if looks_like_token_file(path) || megatron_index {
        LocalFormat::TokenFile
    } else if looks_like_jsonl(path) {
        LocalFormat::Jsonl
    } else {
        LocalFormat::ImageFolder
    })
}

/// Refuses a folder (of no tar shards, Hugging Face or MDS set) whose Parquet and JSONL files
/// are both there, or that holds them beside two or more subfolders of images. Hidden entries
/// (`.stoker-idx`, a `.cache`) and macOS's AppleDouble `._*` files are passed over, as the
/// formats' readers pass them over.
fn check_one_format(folder: &Path) -> Result<()> {
    let entries = std::fs::read_dir(folder).map_err(|source| Error::io(folder, source))?;
    let mut data: Option<(FileKind, PathBuf)> = None;
    let mut class_folders: Vec<PathBuf> = Vec::new();
    let mut names: Vec<PathBuf> = Vec::new();
    for entry in entries {
        let path = entry.map_err(|source| Error::io(folder, source))?.path();
        let hidden = path
            .file_name()
            .is_some_and(|name| name.as_encoded_bytes().starts_with(b"."));
        if !hidden {
            names.push(path);
        }
    }
    // In name order, so the files named are the same on every machine.
    names.sort();
    for path in names {
        if path.is_dir() {
            if class_folders.len() < 2 && holds_an_image(&path) {
                class_folders.push(path);
            }
            continue;
        }
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        if name.as_deref().is_some_and(is_tar_index_cache_name) {
            continue;
        }
        // A folder's `.bin` files are no token set (a token file is named by itself).
        let Some(kind) = kind_of(&path).filter(|kind| *kind != FileKind::TokenFile) else {
            continue;
        };
        match &data {
            None => data = Some((kind, path)),
            Some((seen, seen_path)) if *seen != kind => {
                return Err(mixed(
                    folder,
                    (seen_path, seen.name()),
                    (&path, kind.name()),
                ));
            }
            Some(_) => {}
        }
    }
    match (data, class_folders.as_slice()) {
        (Some((kind, file)), [first, _]) => Err(mixed(
            folder,
            (&file, kind.name()),
            (first, "a class folder of images"),
        )),
        _ => Ok(()),
    }
}

/// Whether `folder` directly holds a file with an image extension (looked for among its first
/// entries, so a huge folder costs no more than a few reads).
fn holds_an_image(folder: &Path) -> bool {
    const LOOKED_AT: usize = 256;
    std::fs::read_dir(folder).is_ok_and(|entries| {
        entries.flatten().take(LOOKED_AT).any(|entry| {
            has_image_extension(entry.file_name().as_encoded_bytes()) && entry.path().is_file()
        })
    })
}

fn mixed(folder: &Path, first: (&Path, &str), second: (&Path, &str)) -> Error {
    let named = |(path, kind): (&Path, &str)| {
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |name| name.to_string_lossy().into_owned(),
        );
        format!("{name} ({kind})")
    };
    Error::MixedFormats {
        source_name: folder.display().to_string(),
        first: named(first),
        second: named(second),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"x").unwrap();
    }

    #[test]
    fn a_folder_of_one_format_is_that_format() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        touch(&root.join("shard-000000.tar"));
        touch(&root.join("classes.txt"));
        touch(&root.join("README.md"));
        touch(&root.join("._shard-000000.jsonl"));
        touch(&root.join(".stoker-idx/shard-000000.tar.idx"));
        touch(&root.join("logs/run.txt"));
        assert_eq!(local_format(root).unwrap(), LocalFormat::TarShards);
        let images = tempfile::tempdir().unwrap();
        touch(&images.path().join("cat/1.jpg"));
        assert_eq!(
            local_format(images.path()).unwrap(),
            LocalFormat::ImageFolder
        );
        let file = root.join("shard-000000.tar");
        assert_eq!(local_format(&file).unwrap(), LocalFormat::TarShards);
    }

    /// Layouts users keep that the first version of the rule refused: img2dataset's shards
    /// with each one's metadata (`00000.parquet`, `00000_stats.json`); a Parquet file whose
    /// Image cells name files in a folder beside it.
    #[test]
    fn shards_with_their_metadata_and_parquet_with_its_images_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for name in [
            "00000.tar",
            "00000.parquet",
            "00000_stats.json",
            "00001.tar",
        ] {
            touch(&root.join(name));
        }
        touch(&root.join("notes.jsonl"));
        assert_eq!(local_format(root).unwrap(), LocalFormat::TarShards);
        let parquet = tempfile::tempdir().unwrap();
        touch(&parquet.path().join("data.parquet"));
        touch(&parquet.path().join("images/1.jpg"));
        assert_eq!(local_format(parquet.path()).unwrap(), LocalFormat::Parquet);
    }

    /// A convert stopped between its renames left a set whose named files read as a smaller
    /// set (52 samples of 60, no word); one stopped before any left a folder read as an image
    /// folder without classes.
    #[test]
    fn a_set_a_write_left_unfinished_is_refused_naming_the_file() {
        for (named, partial) in [
            (Some("shard-000000.tar"), "shard-000001.tar.partial"),
            (None, "shard-000000.tar.partial"),
            (Some("part-000000.parquet"), "part-000001.parquet.partial"),
        ] {
            let dir = tempfile::tempdir().unwrap();
            if let Some(named) = named {
                touch(&dir.path().join(named));
            }
            touch(&dir.path().join(partial));
            let error = match local_format(dir.path()).unwrap() {
                LocalFormat::TarShards => crate::TarShards::open(dir.path()).err(),
                LocalFormat::Parquet => {
                    crate::ParquetDataset::open(dir.path(), &Default::default()).err()
                }
                other => panic!("{partial}: read as {other:?}"),
            };
            let message = error.map(|e| e.to_string()).unwrap_or_default();
            assert!(
                message.contains(partial) && message.contains("did not finish"),
                "{partial}: {message}"
            );
        }
    }

    /// Parquet and JSONL files in one folder were read as Parquet by the loader and as JSONL
    /// by `stoker inspect`; one stray Parquet file beside class folders was trained on alone.
    #[test]
    fn a_folder_of_two_formats_or_of_data_beside_class_folders_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        touch(&root.join("part-0.parquet"));
        touch(&root.join("notes.jsonl"));
        let message = local_format(root).unwrap_err().to_string();
        assert!(
            message.contains("notes.jsonl (JSONL)")
                && message.contains("part-0.parquet (Parquet)")
                && message.contains("format="),
            "{message}"
        );
        let images = tempfile::tempdir().unwrap();
        touch(&images.path().join("cat/1.jpg"));
        touch(&images.path().join("dog/1.jpg"));
        touch(&images.path().join("x.parquet"));
        let message = local_format(images.path()).unwrap_err().to_string();
        assert!(
            message.contains("x.parquet (Parquet)")
                && message.contains("cat (a class folder of images)"),
            "{message}"
        );
    }
}
