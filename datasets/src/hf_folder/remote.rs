//! A `save_to_disk` folder under an `s3://` prefix: `state.json` and `dataset_info.json` read
//! through the cache tier, the `.arrow` shards that `state.json` lists fetched whole into it
//! (an Arrow stream has no footer, so its batches are found by walking it from the start) and
//! a batch at a time, and read there as local shards are; each copy is let go of once walked
//! (a lock descriptor each: a folder of more shards than the descriptor limit could not open),
//! and one evicted by a cap is fetched again when next read, the version listed at open.
//! A `DatasetDict` prefix (`dataset_dict.json`) reads the split asked for from its folder.
//! Errors name the objects' `s3://` URIs.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use object_store::ObjectMeta;
use rayon::prelude::*;

use super::ipc_stream::StreamFile;
use super::layout::{self, DICT_FILE, INFO_FILE, STATE_FILE};
use super::HfDataset;
use crate::error::{Error, Result};
use crate::parquet_files::ParquetOptions;
use crate::storage::{s3_location, ObjectCache, Remake, RemoteLocation, Store};

impl HfDataset {
    /// Opens the `save_to_disk` folder under `uri` (`s3://BUCKET/PREFIX`) through `cache`, as
    /// [`HfDataset::open`] opens a local one; a `DatasetDict` prefix reads the folder of
    /// `split` (none asked for: refused, naming its splits). Images kept as paths rather than
    /// bytes are bad samples naming the path: they are read beside local folders only.
    pub fn open_remote(
        uri: &str,
        cache: Arc<ObjectCache>,
        options: &ParquetOptions,
        split: Option<&str>,
    ) -> Result<HfDataset> {
        let started = Instant::now();
        let mut location = s3_location(
            uri,
            "a Hugging Face dataset folder in an object store is named by s3://BUCKET/PREFIX",
        )?;
        let store = cache.store(&location)?;
        let mut listing = cache.list(&store, &location)?;
        if let Some(dict) = find(&listing, DICT_FILE) {
            let path = PathBuf::from(location.uri_of(dict.location.as_ref()));
            let json = layout::parse_json(&cache.read_whole(&store, &location, dict)?, &path)?;
            let splits = crate::naming::dict_splits_of(&json, &path)?;
            let root = PathBuf::from(location.uri());
            let split = match split {
                Some(split) if splits.iter().any(|s| s == split) => split,
                Some(split) => {
                    return Err(Error::NoSuchSplit {
                        source_name: uri.to_string(),
                        split: split.to_string(),
                        found: splits,
                    })
                }
                None => return Err(Error::HfDatasetDict { path: root, splits }),
            };
            location.prefix = location.key_of(split);
            listing = cache.list(&store, &location)?;
        } else if let Some(split) = split {
            return Err(Error::NoSuchSplit {
                source_name: uri.to_string(),
                split: split.to_string(),
                found: Vec::new(),
            });
        }
        let read_json = |name: &str| -> Result<(serde_json::Value, PathBuf)> {
            let object = find(&listing, name).ok_or_else(|| Error::HfDataset {
                path: PathBuf::from(location.uri()),
                problem: format!("it holds no {name}"),
            })?;
            let path = PathBuf::from(location.uri_of(object.location.as_ref()));
            let json = layout::parse_json(&cache.read_whole(&store, &location, object)?, &path)?;
            Ok((json, path))
        };
        let (state, state_path) = read_json(STATE_FILE)?;
        let (info, info_path) = read_json(INFO_FILE)?;
        let names = layout::data_file_names(&state, &state_path)?;
        let features = layout::features_of(&info, &info_path)?;
        let objects: Vec<ObjectMeta> = names
            .iter()
            .map(|name| {
                find(&listing, name)
                    .cloned()
                    .ok_or_else(|| Error::HfDataset {
                        path: state_path.clone(),
                        problem: format!("it lists the data file {name}, which is not there"),
                    })
            })
            .collect::<Result<_>>()?;
        let files = open_shards(&cache, &store, &location, &objects)?;
        let root = PathBuf::from(location.uri());
        Self::assemble(&root, files, features, options, true, started)
    }
}

/// The object named `name` directly under the listed prefix.
fn find<'a>(listing: &'a [ObjectMeta], name: &str) -> Option<&'a ObjectMeta> {
    listing
        .iter()
        .find(|object| object.location.filename() == Some(name))
}

/// Fetches the shards `objects` whole into the cache, a batch at a time, and opens each, named
/// by its URI; each copy is let go of once walked (fetched again if evicted).
fn open_shards(
    cache: &Arc<ObjectCache>,
    store: &Arc<Store>,
    location: &RemoteLocation,
    objects: &[ObjectMeta],
) -> Result<Vec<StreamFile>> {
    cache.check_fits_whole(&location.uri(), "Arrow shards", objects)?;
    cache.fetch_listed_in_batches(store, location, objects, |batch| {
        batch
            .into_par_iter()
            .map(|(remote, copy)| {
                let uri = PathBuf::from(remote.uri());
                StreamFile::open_copy(uri, copy, Remake::Fetched(remote))
            })
            .collect()
    })
}
