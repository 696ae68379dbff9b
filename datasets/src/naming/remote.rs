//! What an `s3://` prefix holds: the one format of its data objects, so a prefix of Parquet
//! files reads as a local folder of them does, and the objects of one split when their names are
//! the hub's `{split}-NNNNN-of-NNNNN.*`.

use std::path::Path;
use std::sync::Arc;

use super::splits::{split_of_shard_name, UNNAMED};
use super::{kind_of, FileKind};
use crate::error::{Error, Result};
use crate::storage::{list_remote, ObjectCache, RemoteObject};

/// The one kind of data object directly under `uri` (a prefix, or the one object it names);
/// `None` when it holds none. Objects of several kinds are refused by name.
pub fn remote_kind(uri: &str, cache: &Arc<ObjectCache>) -> Result<Option<FileKind>> {
    // The tar set's own index object (`stoker index`) is no data file of its own.
    let data_file =
        |name: &str| name != crate::TAR_INDEX_OBJECT && kind_of(Path::new(name)).is_some();
    let listed = match list_remote(uri, cache, &data_file, "data file") {
        Ok((_, objects)) => objects,
        Err(Error::NoRemoteObjects { .. }) => return Ok(None),
        Err(error) => return Err(error),
    };
    let names: Vec<std::path::PathBuf> = listed.iter().map(|object| object.uri().into()).collect();
    super::kind_of_files(uri, &names).map(Some)
}

/// The objects of `objects` (listed under `uri`) of the split asked for: all when their names
/// give one split or none and none is asked for; [`Error::SplitNeeded`] when they give several
/// and none is asked for; [`Error::NoSuchSplit`] when the one asked for is not among them.
pub(crate) fn objects_of_split(
    uri: &str,
    objects: Vec<RemoteObject>,
    split: Option<&str>,
) -> Result<Vec<RemoteObject>> {
    let split_of = |object: &RemoteObject| {
        let name = object.uri();
        let file = name.rsplit('/').next().unwrap_or(&name).to_string();
        split_of_shard_name(&file).unwrap_or(UNNAMED).to_string()
    };
    let mut found: Vec<String> = objects.iter().map(split_of).collect();
    found.sort();
    found.dedup();
    let named: Vec<String> = found.iter().filter(|s| *s != UNNAMED).cloned().collect();
    match split {
        None if named.is_empty() || found.len() == 1 => Ok(objects),
        None => Err(Error::SplitNeeded {
            source_name: uri.to_string(),
            found,
        }),
        Some(split) => {
            let kept: Vec<RemoteObject> = objects
                .into_iter()
                .filter(|object| split_of(object) == split)
                .collect();
            if kept.is_empty() {
                return Err(Error::NoSuchSplit {
                    source_name: uri.to_string(),
                    split: split.to_string(),
                    found: named,
                });
            }
            Ok(kept)
        }
    }
}
