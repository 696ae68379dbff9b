//! Splits as dataset hubs lay them out, so that a folder holding train and test is never read
//! whole: shards named `{split}-NNNNN-of-NNNNN.*` (any prefix is a split's name), files whose
//! names hold a split's keyword as a word of their own (`train.jsonl`, `test.parquet`,
//! `imagenet-val-0003.tar`), subfolders `{split}/` or `data/{split}/` of data files (any name), a
//! `DatasetDict` folder (`dataset_dict.json`), and image folders whose subfolders are named like
//! splits (`train/`, `val/`, ...), one holding class folders, or with two such beside folders of
//! other names (and no `data/`). Split folders of data files beside loose split files are splits
//! too, and so are folders of data files beside an image folder's splits.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tracing::warn;

use super::{kind_of, sort_paths, FileKind};
use crate::error::{Error, Result};
use crate::image_format::has_image_extension;
use crate::split_names::{is_split_folder_name, split_keyword_in_file_name};

/// The group of files without a split in their name, beside named ones.
pub(crate) const UNNAMED: &str = "(no split in the name)";

/// Where each split of a folder lies.
#[derive(Debug)]
pub(crate) enum SplitLayout {
    /// The split's files (shards named by split).
    Files(BTreeMap<String, Vec<PathBuf>>),
    /// The split's folder.
    Folders(BTreeMap<String, PathBuf>),
    /// No split: the data files of the root's `data/` folder.
    Unsplit(Vec<PathBuf>),
}

impl SplitLayout {
    pub(crate) fn names(&self) -> Vec<String> {
        match self {
            SplitLayout::Files(splits) => splits.keys().cloned().collect(),
            SplitLayout::Folders(splits) => splits.keys().cloned().collect(),
            SplitLayout::Unsplit(_) => Vec::new(),
        }
    }
}

/// The split a hub shard's name gives: `train` for `train-00000-of-00002.parquet` (or
/// `train-00000-of-00002-5b3c.parquet`); `None` for any other name.
pub(crate) fn split_of_shard_name(name: &str) -> Option<&str> {
    hub_shard(name).map(|shard| shard.split)
}

/// What a hub shard's name says: its split, its number and the set's count.
struct HubShard<'n> {
    split: &'n str,
    index: u64,
    count: u64,
}

/// The parts of a hub shard's name (`{split}-NNNNN-of-NNNNN[...]`), or `None` for another name.
fn hub_shard(name: &str) -> Option<HubShard<'_>> {
    let bytes = name.as_bytes();
    let mut from = 0;
    while let Some(found) = name[from..].find("-of-") {
        let at = from + found;
        let digits_before = bytes[..at]
            .iter()
            .rev()
            .take_while(|b| b.is_ascii_digit())
            .count();
        let number_start = at - digits_before;
        let digits_after = bytes[at + 4..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits_before > 0
            && digits_after > 0
            && number_start >= 2
            && bytes[number_start - 1] == b'-'
        {
            let index = name[number_start..at].parse().ok()?;
            let count = name[at + 4..at + 4 + digits_after].parse().ok()?;
            return Some(HubShard {
                split: &name[..number_start - 1],
                index,
                count,
            });
        }
        from = at + 4;
    }
    None
}

/// Checks that the hub shards among `files` (one split of a folder read whole) are one whole
/// set: one count, and each number below it once. Files not named as hub shards are not
/// looked at. A set with one missing would be read as the whole split, short; two sets (a new
/// export beside an older one) would repeat its rows.
pub(crate) fn check_shard_set(source_name: &str, split: &str, files: &[PathBuf]) -> Result<()> {
    let names: Vec<String> = files
        .iter()
        .filter_map(|file| file.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    let shards: Vec<(&str, HubShard<'_>)> = names
        .iter()
        .filter_map(|name| hub_shard(name).map(|shard| (name.as_str(), shard)))
        .collect();
    let Some((first_name, first)) = shards.first() else {
        return Ok(());
    };
    let refuse = |problem: String| {
        Err(Error::ShardSet {
            source_name: source_name.to_string(),
            split: split.to_string(),
            problem,
        })
    };
    if let Some((other_name, other)) = shards.iter().find(|(_, s)| s.count != first.count) {
        return refuse(format!(
            "{first_name} is one of {}, {other_name} one of {} (an export beside an older \
             one?); keep one set",
            first.count, other.count
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (name, shard) in &shards {
        if shard.index >= shard.count {
            return refuse(format!("{name} is numbered past its count"));
        }
        if !seen.insert(shard.index) {
            return refuse(format!("shard {:05} is there twice", shard.index));
        }
    }
    let missing_count = first.count - seen.len() as u64;
    if missing_count > 0 {
        let shown: Vec<String> = (0..first.count)
            .filter(|index| !seen.contains(index))
            .take(5)
            .map(|index| format!("{index:05}"))
            .collect();
        let more = if missing_count > 5 { ", ..." } else { "" };
        return refuse(format!(
            "{missing_count} of its {} shards are missing ({}{more}): a download cut short?",
            first.count,
            shown.join(", ")
        ));
    }
    Ok(())
}

/// The split a file's name gives: its hub shard name's ([`split_of_shard_name`]), else the
/// split keyword it holds as a word of its own (`train.jsonl`, `imagenet-val-0003.tar`: the hub's
/// rule, [`split_keyword_in_file_name`]); `None` for neither.
pub(crate) fn split_of_file_name(name: &str) -> Option<String> {
    split_of_shard_name(name)
        .or_else(|| split_keyword_in_file_name(name))
        .map(str::to_string)
}

/// The split `path` belongs to among files named by a pattern or list: its name's
/// ([`split_of_file_name`]), else the nearest folder of its path named like a split; `None` for
/// neither.
pub(crate) fn split_of_file(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_string_lossy();
    if let Some(split) = split_of_file_name(&name) {
        return Some(split);
    }
    path.parent()?
        .components()
        .rev()
        .map(|component| component.as_os_str().to_string_lossy())
        .find(|folder| is_split_folder_name(folder))
        .map(|folder| folder.into_owned())
}

/// Groups `files` by split when more than one split is among them (files of no split form a
/// group of their own, [`UNNAMED`]); `None` when they hold one split or none.
pub(crate) fn group_files(files: &[PathBuf]) -> Option<BTreeMap<String, Vec<PathBuf>>> {
    let mut groups: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for file in files {
        let split = split_of_file(file).unwrap_or_else(|| UNNAMED.to_string());
        groups.entry(split).or_default().push(file.clone());
    }
    (groups.len() > 1).then_some(groups)
}

/// The splits laid out in `root`, or `None` when it is not a split layout. Looked for in
/// `root`, then in `root/data`.
pub(crate) fn find_splits(root: &Path) -> Result<Option<SplitLayout>> {
    if root.join(super::HF_STATE_FILE).is_file() || root.join(crate::MDS_INDEX_FILE).is_file() {
        // A `save_to_disk` dataset (its shards are `data-NNNNN-of-NNNNN.arrow`) or an MDS one:
        // one split.
        return Ok(None);
    }
    if let Some(splits) = dict_splits(root)? {
        let folders = splits
            .into_iter()
            .map(|split| {
                let folder = root.join(&split);
                (split, folder)
            })
            .collect();
        return Ok(Some(SplitLayout::Folders(folders)));
    }
    for base in [root.to_path_buf(), root.join("data")] {
        if !base.is_dir() {
            continue;
        }
        let listing = Listing::of(&base)?;
        if !listing.data_files.is_empty() {
            let mut splits: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
            for file in &listing.data_files {
                let name = file
                    .file_name()
                    .map(|name| name.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let split = split_of_file_name(&name).unwrap_or_else(|| UNNAMED.to_string());
                splits.entry(split).or_default().push(file.clone());
            }
            if splits.keys().all(|split| split == UNNAMED) {
                // A plain folder of data files: no split; under `data/` (a hub repository
                // whose files are not named by split), those files. Its subfolders' data
                // files are not read, which is said (a JSONL folder says so in its notices).
                let unread = folders_of_data(&listing);
                let jsonl = listing
                    .data_files
                    .iter()
                    .all(|file| kind_of(file) == Some(FileKind::Jsonl));
                if !unread.is_empty() && !jsonl {
                    warn!(
                        folder = %base.display(),
                        subfolders = ?unread.iter().map(|(name, _, _)| name).collect::<Vec<_>>(),
                        "reading the data files of this folder only: its subfolders' data files \
                         are not read (name them with a pattern, e.g. folder/**/*.parquet)"
                    );
                }
                if base == root {
                    return Ok(None);
                }
                let mut files = listing.data_files;
                sort_paths(&mut files);
                return Ok(Some(SplitLayout::Unsplit(files)));
            }
            // Split folders of data files beside loose split files (`train/` beside
            // `validation.parquet`) are splits too: never hidden by the files.
            let split_folders = folders_of_data(&listing)
                .into_iter()
                .filter(|(name, _, _)| is_split_folder_name(name));
            for (name, folder, files) in split_folders {
                let name = name.to_lowercase();
                if splits.contains_key(&name) {
                    return Err(Error::SplitTwice {
                        source_name: base.display().to_string(),
                        split: name,
                        folder,
                    });
                }
                splits.insert(name, files);
            }
            for files in splits.values_mut() {
                sort_paths(files);
            }
            return Ok(Some(SplitLayout::Files(splits)));
        }
        // `data/` is looked in next, as a base of its own, not taken for a split.
        let candidates = listing
            .folders
            .iter()
            .filter(|(name, _)| !(base == root && name == "data"));
        let mut with_data = BTreeMap::new();
        let mut with_images = false;
        // Folders named like splits holding anything, and how many hold class folders (an
        // image folder laid out by split).
        let mut named_splits = BTreeMap::new();
        let mut image_splits = 0;
        // Folders named like splits holding images directly (Hugging Face's imagefolder lays
        // out `train/` and `test/` so, with a `metadata.jsonl` each).
        let mut flat_image_splits = 0;
        for (name, folder) in candidates {
            let inside = Listing::of(folder).ok();
            if is_split_folder_name(name) {
                if let Some(inner) = &inside {
                    if inner.images || !inner.folders.is_empty() || !inner.data_files.is_empty() {
                        named_splits.insert(name.clone(), folder.clone());
                    }
                    if inner.data_files.is_empty() && !inner.images && !inner.folders.is_empty() {
                        image_splits += 1;
                    }
                    if inner.images {
                        flat_image_splits += 1;
                    }
                }
            }
            // A folder holding images is an image folder's class (a data file in it, or a
            // conversion written into it, stray), never a split of data files.
            if inside.as_ref().is_some_and(|l| l.images) {
                with_images = true;
            } else if folder.join(crate::MDS_INDEX_FILE).is_file()
                || inside.as_ref().is_some_and(|l| !l.data_files.is_empty())
                || (base == root && inside.is_some_and(|l| holds_split_folders_of_data(&l)))
            {
                // The last: a hub configuration laid out by split folders (the hub's Parquet
                // conversion, `default/train/0000.parquet`), read by split in its turn.
                with_data.insert(name.clone(), folder.clone());
            }
        }
        // An image folder laid out by split (`train/cat/`, `val/cat/`): every folder named
        // like a split, one of them holding class folders; or two such beside folders of other
        // names (`samples/`, a conversion written there), with no `data/` (a hub repository's).
        // Its splits are the folders named like one and any folder of data files beside them,
        // never read whole with the splits taken as classes; other folders are not read. (One
        // class folder named `test`, holding folders of its own, is a class.)
        let all_split_named = !listing.folders.is_empty()
            && listing
                .folders
                .iter()
                .all(|(name, _)| is_split_folder_name(name));
        let beside_others = image_splits >= 2 && !root.join("data").is_dir();
        // Two or more folders, all named like splits, one holding images directly: splits too
        // (in the root or in `data/`), never one image folder whose classes are its splits
        // (nor, under `data/`, one class `data`). Each is then an image folder of its own,
        // which needs class folders. One such folder alone is read as it was (a class).
        let flat_splits = flat_image_splits > 0 && all_split_named && named_splits.len() >= 2;
        if flat_splits || (base == root && image_splits > 0 && (all_split_named || beside_others)) {
            named_splits.extend(with_data);
            return Ok(Some(SplitLayout::Folders(named_splits)));
        }
        if !with_data.is_empty() && !with_images {
            return Ok(Some(SplitLayout::Folders(with_data)));
        }
    }
    Ok(None)
}

/// The folder of `root` named like the split `split` (in any case) holding data files of its
/// own, when there is one: a split asked of a folder whose loose data files are named by no
/// split, beside split folders (`tokens.bin` beside `val/`; `preview.parquet` beside `train/`
/// and `validation/`), which is read as those loose files when no split is asked.
/// `Err` lists the split folders there are (none: the folder is not laid out by split).
pub(crate) fn split_folder_of(
    root: &Path,
    split: &str,
) -> Result<std::result::Result<PathBuf, Vec<String>>> {
    let listing = Listing::of(root)?;
    let folders: Vec<(String, PathBuf, Vec<PathBuf>)> = folders_of_data(&listing)
        .into_iter()
        .filter(|(name, _, _)| is_split_folder_name(name))
        .collect();
    Ok(
        match folders
            .iter()
            .find(|(name, _, _)| name.eq_ignore_ascii_case(split))
        {
            Some((_, folder, _)) => Ok(folder.clone()),
            None => Err(folders.into_iter().map(|(name, _, _)| name).collect()),
        },
    )
}

/// The subfolders of `listing` holding data files of their own: each one's name, path and
/// data files.
fn folders_of_data(listing: &Listing) -> Vec<(String, PathBuf, Vec<PathBuf>)> {
    listing
        .folders
        .iter()
        .filter_map(|(name, folder)| {
            let inner = Listing::of(folder).ok()?;
            (!inner.data_files.is_empty()).then(|| (name.clone(), folder.clone(), inner.data_files))
        })
        .collect()
}

/// The splits of a Hugging Face `DatasetDict` folder (`dataset_dict.json`: `{"splits": [...]}`,
/// one subfolder each), or `None` when `root` is not one.
pub(crate) fn dict_splits(root: &Path) -> Result<Option<Vec<String>>> {
    let path = root.join(super::HF_DICT_FILE);
    if !path.is_file() {
        return Ok(None);
    }
    let text = crate::files::read_small_file(&path, crate::files::MAX_MANIFEST_BYTES)
        .map_err(|source| Error::io(&path, source))?;
    let json: serde_json::Value =
        serde_json::from_slice(&text).map_err(|source| Error::Manifest {
            path: path.clone(),
            source,
        })?;
    dict_splits_of(&json, &path).map(Some)
}

/// The splits the `dataset_dict.json` at `path` (parsed: `json`) lists, each the name of a
/// folder beside it: a name that is not one plain folder name (empty, `.`, `..`, a path) is
/// refused (`""` named the dataset's own folder again, and its reading recursed until the
/// stack overflowed; `/etc` was listed as the split).
pub(crate) fn dict_splits_of(json: &serde_json::Value, path: &Path) -> Result<Vec<String>> {
    let splits: Vec<String> = json
        .get("splits")
        .and_then(serde_json::Value::as_array)
        .ok_or_else(|| Error::HfDataset {
            path: path.to_path_buf(),
            problem: "no \"splits\" list".into(),
        })?
        .iter()
        .filter_map(|split| split.as_str().map(str::to_string))
        .collect();
    for split in &splits {
        let mut components = Path::new(split).components();
        let plain = matches!(
            (components.next(), components.next()),
            (Some(std::path::Component::Normal(name)), None) if name == split.as_str()
        );
        if !plain {
            return Err(Error::HfDataset {
                path: path.to_path_buf(),
                problem: format!("split {split:?} is not the name of a folder beside it"),
            });
        }
    }
    Ok(splits)
}

/// Whether a folder holding no data files of its own has subfolders named like splits that
/// hold data files (`default/` of the hub's Parquet conversion: `train/0000.parquet`).
fn holds_split_folders_of_data(listing: &Listing) -> bool {
    listing.data_files.is_empty()
        && !listing.images
        && listing.folders.iter().any(|(name, folder)| {
            is_split_folder_name(name)
                && Listing::of(folder).is_ok_and(|inner| !inner.data_files.is_empty())
        })
}

/// A folder's data files (by extension, [`kind_of`]) and subfolders (hidden ones left out),
/// and whether it holds image files of its own.
struct Listing {
    data_files: Vec<PathBuf>,
    folders: Vec<(String, PathBuf)>,
    images: bool,
}

impl Listing {
    fn of(folder: &Path) -> Result<Listing> {
        let entries = std::fs::read_dir(folder).map_err(|source| Error::io(folder, source))?;
        let mut data_files = Vec::new();
        let mut folders = Vec::new();
        let mut images = false;
        for entry in entries {
            let path = entry.map_err(|source| Error::io(folder, source))?.path();
            let name = path
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name.starts_with('.') {
                // Hidden (`.git/`, `.cache/`), or macOS's AppleDouble `._train.parquet` beside
                // each file copied from its disks: never data, nor a split.
                continue;
            }
            if path.is_dir() {
                folders.push((name, path));
            } else if path.is_file() && kind_of(&path).is_some() {
                data_files.push(path);
            } else if has_image_extension(name.to_ascii_lowercase().as_bytes()) {
                images = true;
            }
        }
        folders.sort();
        Ok(Listing {
            data_files,
            folders,
            images,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_shard_names_give_their_split() {
        assert_eq!(
            split_of_shard_name("train-00000-of-00002.parquet"),
            Some("train")
        );
        assert_eq!(
            split_of_shard_name("validation-00001-of-00004-5b3c4e1a.parquet"),
            Some("validation")
        );
        assert_eq!(split_of_shard_name("my-split-3-of-9.tar"), Some("my-split"));
        assert_eq!(split_of_shard_name("shard-00000.tar"), None);
        assert_eq!(split_of_shard_name("-00000-of-00001.tar"), None);
        assert_eq!(split_of_shard_name("train-x-of-00001.tar"), None);
        assert_eq!(split_of_shard_name("part-of-1.tar"), None);
    }

    #[test]
    fn a_file_s_split_comes_from_its_name_or_a_split_folder() {
        assert_eq!(
            split_of_file(Path::new("/d/data/test-00000-of-00001.parquet")).as_deref(),
            Some("test")
        );
        assert_eq!(
            split_of_file(Path::new("/d/val/shard-0.tar")).as_deref(),
            Some("val")
        );
        assert_eq!(split_of_file(Path::new("/d/shards/shard-0.tar")), None);
    }
}
