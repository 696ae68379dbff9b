//! Naming a dataset's files: what a source string (or a list of them) resolves to on local
//! disks, the same on every machine.
//!
//! A name is taken as written when a file or folder of that name exists. Otherwise it may hold
//! brace groups (`shard-{00000..01023}.tar`, `{train,val}-*.tar`: `braces.rs`) and glob
//! characters (`*`, `?`, `[...]`, `**`: `glob.rs`). The files a pattern or list names are
//! sorted by the bytes of their paths and counted once, so the plan, the digest and the
//! fingerprint never depend on the order a file system lists them in.
//!
//! A folder laid out by split (`splits.rs`) is never read whole: a split is named, or
//! [`Error::SplitNeeded`] names the splits found. Files named by a pattern or list that span
//! several splits are refused the same way.

mod braces;
mod glob;
mod remote;
mod splits;

use std::path::{Path, PathBuf};

use tracing::{info, warn};

use crate::error::{Error, Result};
pub(crate) use remote::{listed_of_split, objects_of_split};
pub use remote::{
    remote_kind, remote_layout, remote_split_prefix, resolve_remote, RemoteFiles, RemoteLayout,
};
pub(crate) use splits::{dict_splits, dict_splits_of};

/// The file listing a `save_to_disk` folder's shards, in order (`hf_folder/` reads it).
pub(crate) const HF_STATE_FILE: &str = "state.json";
/// The file holding a `save_to_disk` folder's features.
pub(crate) const HF_INFO_FILE: &str = "dataset_info.json";
/// The file marking a `DatasetDict` folder (one subfolder per split).
pub(crate) const HF_DICT_FILE: &str = "dataset_dict.json";
use splits::{find_splits, group_files, split_of_file, SplitLayout};

/// What a source resolves to on local disks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalSource {
    /// One folder or file, opened by its format's rules (a folder's own files, an image
    /// folder's classes).
    Path(PathBuf),
    /// Files a pattern, a list or a split named, sorted, each once.
    Files {
        /// The source as written (names joined by `,`), for messages.
        name: String,
        /// The files.
        files: Vec<PathBuf>,
    },
}

/// The kind of data file a name says a file is, for sources made of named files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// `.tar`: a WebDataset shard.
    TarShard,
    /// `.parquet`.
    Parquet,
    /// `.jsonl`, `.jsonl.gz`, `.jsonl.zst`.
    Jsonl,
    /// `.bin`: a flat token file.
    TokenFile,
}

impl FileKind {
    /// The format's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            FileKind::TarShard => "tar shards",
            FileKind::Parquet => "Parquet",
            FileKind::Jsonl => "JSONL",
            FileKind::TokenFile => "a token file",
        }
    }
}

/// The kind of data file `path`'s name says it is (any case); `None` for other names.
pub fn kind_of(path: &Path) -> Option<FileKind> {
    use crate::files::has_extension;
    if has_extension(path, "tar") {
        Some(FileKind::TarShard)
    } else if has_extension(path, "parquet") {
        Some(FileKind::Parquet)
    } else if crate::files::is_jsonl_file_name(path) {
        Some(FileKind::Jsonl)
    } else if has_extension(path, "bin") {
        Some(FileKind::TokenFile)
    } else {
        None
    }
}

/// The one kind of data file among `files`: refused by name when one is of no kind Stoker reads
/// from named files, or when they mix kinds.
pub fn kind_of_files(name: &str, files: &[PathBuf]) -> Result<FileKind> {
    let mut first: Option<(FileKind, &Path)> = None;
    for file in files {
        let Some(kind) = kind_of(file) else {
            return Err(Error::NotADataFile {
                source_name: name.to_string(),
                path: file.clone(),
            });
        };
        match first {
            None => first = Some((kind, file)),
            Some((seen, seen_file)) if seen != kind => {
                return Err(Error::MixedFormats {
                    source_name: name.to_string(),
                    first: format!("{} ({})", seen_file.display(), seen.name()),
                    second: format!("{} ({})", file.display(), kind.name()),
                });
            }
            Some(_) => {}
        }
    }
    first.map(|(kind, _)| kind).ok_or_else(|| Error::NoMatch {
        pattern: name.to_string(),
        folder: PathBuf::from("."),
    })
}

/// Whether `name` would be read as a pattern (it holds braces or glob characters).
pub fn is_pattern(name: &str) -> bool {
    braces::has_braces(name) || glob::has_glob(name)
}

/// Resolves local source names (paths or patterns; a list of several is one source) and the
/// split asked for (`None`: none named).
///
/// One name of an existing folder or file stays a [`LocalSource::Path`], unless the folder is
/// laid out by split: then the split asked for (or the only one) is read, and more than one
/// without `split` is [`Error::SplitNeeded`]. Anything else resolves to the files it names.
pub fn resolve_local(names: &[&str], split: Option<&str>) -> Result<LocalSource> {
    let split = split.map(str::trim).filter(|split| !split.is_empty());
    let Some(&first) = names.first() else {
        return Err(Error::InvalidArgument("a source names no file".into()));
    };
    if names.len() == 1 && Path::new(first).exists() {
        let source = resolve_path(Path::new(first), split)?;
        // A split's files, read as named files: held to a worker's roots like a pattern's.
        if let LocalSource::Files { files, .. } = &source {
            crate::referenced_files::check_data_files(files)?;
        }
        return Ok(source);
    }
    // A Megatron corpus by its prefix, as Megatron's `--data-path` names it: its `.bin`.
    if names.len() == 1 && !is_pattern(first) {
        if let Some((bin, _)) = crate::megatron_pair(Path::new(first)) {
            return resolve_path(&bin, split);
        }
    }
    let mut files = Vec::new();
    for &name in names {
        files_named(name, &mut files)?;
    }
    let mut files = once_each(files);
    sort_paths(&mut files);
    // A worker's data roots hold every file a pattern reaches (a folder it enters may be a
    // link), not only the folder its literal head names.
    crate::referenced_files::check_data_files(&files)?;
    let name = names.join(",");
    // One format first: files of two formats are refused as such, not as two splits.
    kind_of_files(&name, &files)?;
    let files = pick_split(&name, files, split)?;
    Ok(LocalSource::Files { name, files })
}

/// One existing path: a split layout's split, or the path itself.
fn resolve_path(path: &Path, split: Option<&str>) -> Result<LocalSource> {
    if path.is_dir() {
        if let Some(layout) = find_splits(path)? {
            return choose_split(path, layout, split, 0);
        }
    }
    match split {
        None => Ok(LocalSource::Path(path.to_path_buf())),
        Some(split) if path.is_file() && split_of_file(path).as_deref() == Some(split) => {
            Ok(LocalSource::Path(path.to_path_buf()))
        }
        Some(split) if path.is_dir() => match splits::split_folder_of(path, split)? {
            Ok(folder) => Ok(LocalSource::Path(folder)),
            Err(found) => Err(Error::NoSuchSplit {
                source_name: path.display().to_string(),
                split: split.to_string(),
                found,
            }),
        },
        Some(split) => Err(Error::NoSuchSplit {
            source_name: path.display().to_string(),
            split: split.to_string(),
            found: Vec::new(),
        }),
    }
}

/// How deep a split layout's folders are looked into for another split layout (a hub
/// repository's configuration folder, then its split's folder): no further, so a folder that
/// leads back to one above it (a link) ends.
const SPLIT_NESTING: u8 = 2;

/// The split `split` of `layout` (of `root`, `depth` folders into a split layout).
fn choose_split(
    root: &Path,
    layout: SplitLayout,
    split: Option<&str>,
    depth: u8,
) -> Result<LocalSource> {
    if let SplitLayout::Unsplit(files) = layout {
        return match split {
            None => Ok(LocalSource::Files {
                name: root.join("data").display().to_string(),
                files,
            }),
            Some(split) => Err(Error::NoSuchSplit {
                source_name: root.display().to_string(),
                split: split.to_string(),
                found: Vec::new(),
            }),
        };
    }
    // One folder (`default/`, a hub repository's one configuration) whose files are named by
    // split, asked for a split it holds: that folder's.
    if let (SplitLayout::Folders(folders), Some(asked)) = (&layout, split) {
        if let (1, false, true) = (
            folders.len(),
            folders.contains_key(asked),
            depth < SPLIT_NESTING,
        ) {
            if let Some(folder) = folders.values().next() {
                if let Some(inner) = find_splits(folder)? {
                    return choose_split(folder, inner, split, depth + 1);
                }
            }
        }
    }
    let found = layout.names();
    let chosen = match split {
        Some(split) => split.to_string(),
        None if found.len() == 1 => found[0].clone(),
        None => {
            return Err(Error::SplitNeeded {
                source_name: root.display().to_string(),
                found,
            })
        }
    };
    info!(path = %root.display(), split = %chosen, splits = ?found, "reading one split of a split layout");
    let missing = || Error::NoSuchSplit {
        source_name: root.display().to_string(),
        split: chosen.clone(),
        found: found.clone(),
    };
    match layout {
        SplitLayout::Folders(mut folders) => {
            let folder = folders.remove(&chosen).ok_or_else(missing)?;
            // A hub repository's configuration (`cola/` holding `train-*`, `test-*`) is laid
            // out by split itself: never read whole either. A folder whose files name one
            // split, or some none, is the split's folder, read whole as before.
            match find_splits(&folder)? {
                Some(inner) if holds_several_splits(&inner) && depth < SPLIT_NESTING => {
                    choose_split(&folder, inner, None, depth + 1)
                }
                _ => Ok(LocalSource::Path(folder)),
            }
        }
        SplitLayout::Files(mut groups) => {
            let files = groups.remove(&chosen).ok_or_else(missing)?;
            // The split read must be one whole set of hub shards (the others are not read).
            splits::check_shard_set(&root.display().to_string(), &chosen, &files)?;
            Ok(LocalSource::Files {
                name: format!("{} (split {chosen})", root.display()),
                files,
            })
        }
        SplitLayout::Unsplit(_) => Err(missing()),
    }
}

/// Whether `layout` names two splits or more, every file or folder of it in one.
fn holds_several_splits(layout: &SplitLayout) -> bool {
    let names = layout.names();
    names.len() >= 2 && !names.iter().any(|name| name == splits::UNNAMED)
}

/// The files among `files` of the split asked for; all of them when they hold one split and
/// none is asked for; refused when they span several and none is asked for. Hub shards among
/// them that are not one whole set are warned of (a pattern may name a few on purpose; a
/// folder's split is refused instead).
fn pick_split(name: &str, files: Vec<PathBuf>, split: Option<&str>) -> Result<Vec<PathBuf>> {
    let picked = files_of_split(name, files, split)?;
    let split_name = split
        .map(str::to_string)
        .or_else(|| picked.first().and_then(|file| split_of_file(file)))
        .unwrap_or_default();
    // Set by set: the shards of one folder (a pattern over several configurations' folders
    // names one set in each).
    let mut by_folder: std::collections::BTreeMap<Option<&Path>, Vec<PathBuf>> =
        std::collections::BTreeMap::new();
    for file in &picked {
        by_folder
            .entry(file.parent())
            .or_default()
            .push(file.clone());
    }
    for files in by_folder.values() {
        if let Err(problem) = splits::check_shard_set(name, &split_name, files) {
            warn!(%problem, "reading the files named as given, though their hub shards are not one whole set");
        }
    }
    Ok(picked)
}

/// [`pick_split`]'s choice, unchecked.
fn files_of_split(name: &str, files: Vec<PathBuf>, split: Option<&str>) -> Result<Vec<PathBuf>> {
    match (group_files(&files), split) {
        (None, None) => Ok(files),
        (Some(groups), None) => Err(Error::SplitNeeded {
            source_name: name.to_string(),
            found: groups.into_keys().collect(),
        }),
        (groups, Some(split)) => {
            let kept: Vec<PathBuf> = files
                .iter()
                .filter(|file| split_of_file(file).as_deref() == Some(split))
                .cloned()
                .collect();
            if kept.is_empty() {
                let found = match groups {
                    Some(groups) => groups.into_keys().collect(),
                    None => files
                        .first()
                        .and_then(|file| split_of_file(file))
                        .into_iter()
                        .collect(),
                };
                return Err(Error::NoSuchSplit {
                    source_name: name.to_string(),
                    split: split.to_string(),
                    found,
                });
            }
            Ok(kept)
        }
    }
}

/// Adds the files `name` names: itself when it exists (a folder is refused: a list or pattern
/// names files), else what its braces and globs expand to.
fn files_named(name: &str, files: &mut Vec<PathBuf>) -> Result<()> {
    let path = Path::new(name);
    if path.exists() {
        return named_file(path, name, files);
    }
    if !is_pattern(name) {
        return Err(Error::RootNotFound(path.to_path_buf()));
    }
    let expanded = if braces::has_braces(name) {
        braces::expand(name)?
    } else {
        vec![name.to_string()]
    };
    for each in &expanded {
        if glob::has_glob(each) {
            files.extend(glob::matching_files(each)?);
        } else if Path::new(each).exists() {
            named_file(Path::new(each), name, files)?;
        } else {
            return Err(Error::ListedFileMissing {
                path: PathBuf::from(each),
                pattern: name.to_string(),
            });
        }
    }
    Ok(())
}

fn named_file(path: &Path, name: &str, files: &mut Vec<PathBuf>) -> Result<()> {
    if path.is_dir() {
        return Err(Error::FolderInList {
            path: path.to_path_buf(),
            source_name: name.to_string(),
        });
    }
    files.push(path.to_path_buf());
    Ok(())
}

/// The paths a source name can read under: the name itself when it exists or holds no
/// pattern (a Megatron corpus named by its prefix: its `.bin` and `.idx`); else, for each name its braces expand to, that name (no glob in it) or the folder
/// its glob's literal head names. A worker holds each to its data roots before opening the
/// source, so no brace or glob reaches past them (a glob never walks up: `..` is matched
/// literally, and folders are only entered from their parent's listing).
pub fn reach_of_name(name: &str) -> Result<Vec<PathBuf>> {
    // A Megatron corpus by its prefix: the two files it reads.
    if !Path::new(name).exists() && !is_pattern(name) {
        if let Some((bin, idx)) = crate::megatron_pair(Path::new(name)) {
            return Ok(vec![bin, idx]);
        }
    }
    if Path::new(name).exists() || !is_pattern(name) {
        return Ok(vec![PathBuf::from(name)]);
    }
    let expanded = if braces::has_braces(name) {
        braces::expand(name)?
    } else {
        vec![name.to_string()]
    };
    let mut reach: Vec<PathBuf> = expanded
        .iter()
        .map(|each| {
            if glob::has_glob(each) {
                glob::literal_folder(each)
            } else {
                PathBuf::from(each)
            }
        })
        .collect();
    sort_paths(&mut reach);
    reach.dedup();
    Ok(reach)
}

/// The `source_pattern` fuzz body's work on `text`, a name under `root`: never panics, and a
/// resolved source's files are sorted, unique and each of the names' reach.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub fn fuzz_names(root: &Path, text: &str) {
    let _ = splits::split_of_file_name(text);
    let Ok(expanded) = braces::expand(text) else {
        return;
    };
    assert!(expanded.len() <= braces::MAX_EXPANDED);
    if expanded.len() > 256 {
        return;
    }
    let name = format!("{}/{text}", root.display());
    for split in [None, Some("train"), Some("val")] {
        if let Ok(LocalSource::Files { files, .. }) = resolve_local(&[&name], split) {
            let mut sorted = files.clone();
            sort_paths(&mut sorted);
            sorted.dedup();
            assert_eq!(sorted, files, "files come sorted and once");
        }
    }
    let _ = reach_of_name(&name);
}

/// `files` with each file once, the first name of each kept: `a.tar`, `./a.tar`, its absolute
/// path or a link to it are one file (compared by their canonical paths), read once.
fn once_each(files: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut seen = std::collections::HashSet::new();
    files
        .into_iter()
        .filter(|file| seen.insert(std::fs::canonicalize(file).unwrap_or_else(|_| file.clone())))
        .collect()
}

/// Sorts paths by their bytes: the order every machine computes alike.
pub(crate) fn sort_paths(paths: &mut [PathBuf]) {
    use std::os::unix::ffi::OsStrExt;
    paths.sort_by(|a, b| a.as_os_str().as_bytes().cmp(b.as_os_str().as_bytes()));
}

#[cfg(test)]
mod tests;
