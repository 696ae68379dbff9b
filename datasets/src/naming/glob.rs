//! Glob patterns over local files (`*`, `?`, `[...]`, `**`, matched by `globset`): the folder
//! the pattern's literal head names is walked, only as deep as the pattern reaches (any depth
//! below a `**`), and every file whose path matches is taken. `*` and `?` never match a `/`.

use std::path::{Path, PathBuf};

use globset::{GlobBuilder, GlobMatcher};

use crate::error::{Error, Result};

/// Whether `name` holds a glob character.
pub(crate) fn has_glob(name: &str) -> bool {
    name.contains(['*', '?', '['])
}

/// The files that match `pattern`, in no particular order. Fails when the pattern is not a
/// valid glob, its literal head is not a folder, or nothing matches (naming both).
pub(crate) fn matching_files(pattern: &str) -> Result<Vec<PathBuf>> {
    let matcher = compile(pattern)?;
    let (head, rest) = split_head(pattern);
    let max_depth = if rest.iter().any(|component| component.contains("**")) {
        usize::MAX
    } else {
        rest.len()
    };
    let folder = literal_folder(pattern);
    if !folder.is_dir() {
        return Err(Error::NoMatch {
            pattern: pattern.to_string(),
            folder,
        });
    }
    let mut found = Vec::new();
    walk(&folder, &head, 1, max_depth, &matcher, &mut found)?;
    if found.is_empty() {
        return Err(Error::NoMatch {
            pattern: pattern.to_string(),
            folder,
        });
    }
    Ok(found)
}

/// The pattern's components before the first that holds a glob character (joined by `/`),
/// and the rest.
fn split_head(pattern: &str) -> (String, Vec<&str>) {
    let components: Vec<&str> = pattern.split('/').collect();
    let literal = components
        .iter()
        .position(|component| has_glob(component))
        .unwrap_or(components.len());
    (
        components[..literal].join("/"),
        components[literal..].to_vec(),
    )
}

/// The folder a glob pattern's literal head names (`.` for none), where its walk starts.
pub(crate) fn literal_folder(pattern: &str) -> PathBuf {
    let (head, _) = split_head(pattern);
    match head.as_str() {
        "" if pattern.starts_with('/') => PathBuf::from("/"),
        "" => PathBuf::from("."),
        _ => PathBuf::from(head),
    }
}

/// The matcher of `pattern` (`*` and `?` never match a `/`; a backslash escapes).
pub(crate) fn compile(pattern: &str) -> Result<GlobMatcher> {
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map(|glob| glob.compile_matcher())
        .map_err(|error| Error::BadSourcePattern {
            pattern: pattern.to_string(),
            problem: error.kind().to_string(),
        })
}

/// Adds the files under `folder` (written `written` in the pattern's terms) that `matcher`
/// takes, going `max_depth - depth` folders further down. Folders reached through a symbolic
/// link are followed only where the pattern names a fixed depth, so a link loop under a `**`
/// cannot run forever.
fn walk(
    folder: &Path,
    written: &str,
    depth: usize,
    max_depth: usize,
    matcher: &GlobMatcher,
    found: &mut Vec<PathBuf>,
) -> Result<()> {
    let entries = std::fs::read_dir(folder).map_err(|source| Error::io(folder, source))?;
    for entry in entries {
        let entry = entry.map_err(|source| Error::io(folder, source))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        // The index caches written beside tar shards are Stoker's, not data (`train-*` would
        // otherwise take them once a first run has written them).
        let is_own = crate::files::is_tar_index_cache_name(&name);
        let apple_double = crate::files::is_apple_double(name.as_bytes());
        let candidate = if written.is_empty() {
            name.into_owned()
        } else if written.ends_with('/') {
            format!("{written}{name}")
        } else {
            format!("{written}/{name}")
        };
        let path = entry.path();
        let file_type = entry
            .file_type()
            .map_err(|source| Error::io(&path, source))?;
        // A link is judged by what it points to (a broken one is skipped).
        let (is_dir, is_file) = if file_type.is_symlink() {
            match std::fs::metadata(&path) {
                Ok(target) => (target.is_dir() && max_depth != usize::MAX, target.is_file()),
                Err(_) => (false, false),
            }
        } else {
            (file_type.is_dir(), file_type.is_file())
        };
        if is_dir && depth < max_depth {
            walk(&path, &candidate, depth + 1, max_depth, matcher, found)?;
        } else if is_file && !is_own && !apple_double && matcher.is_match(&candidate) {
            found.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(root: &Path, names: &[&str]) {
        for name in names {
            let path = root.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, b"x").unwrap();
        }
    }

    fn relative(root: &Path, mut files: Vec<PathBuf>) -> Vec<String> {
        files.sort();
        files
            .iter()
            .map(|f| f.strip_prefix(root).unwrap().display().to_string())
            .collect()
    }

    #[test]
    fn star_stays_in_its_folder_and_double_star_descends() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        touch(
            root,
            &[
                "data/train-0.parquet",
                "data/test-0.parquet",
                "data/sub/train-1.parquet",
            ],
        );
        let base = root.display().to_string();
        let star = matching_files(&format!("{base}/data/train-*.parquet")).unwrap();
        assert_eq!(relative(root, star), ["data/train-0.parquet"]);
        let deep = matching_files(&format!("{base}/data/**/train-*.parquet")).unwrap();
        assert_eq!(
            relative(root, deep),
            ["data/sub/train-1.parquet", "data/train-0.parquet"]
        );
        let class = matching_files(&format!("{base}/data/t[er]*-?.parquet")).unwrap();
        assert_eq!(
            relative(root, class),
            ["data/test-0.parquet", "data/train-0.parquet"]
        );
        let folders = matching_files(&format!("{base}/*/train-*.parquet")).unwrap();
        assert_eq!(relative(root, folders), ["data/train-0.parquet"]);
    }

    #[test]
    fn no_match_names_the_pattern_and_the_folder() {
        let dir = tempfile::tempdir().unwrap();
        touch(dir.path(), &["a.tar"]);
        let pattern = format!("{}/shard-*.tar", dir.path().display());
        let message = matching_files(&pattern).unwrap_err().to_string();
        assert!(message.contains(&pattern), "{message}");
        assert!(
            message.contains(&dir.path().display().to_string()),
            "{message}"
        );
        let missing = format!("{}/nowhere/*.tar", dir.path().display());
        let message = matching_files(&missing).unwrap_err().to_string();
        assert!(message.contains("nowhere"), "{message}");
        let broken = format!("{}/[a.tar", dir.path().display());
        assert!(matches!(
            matching_files(&broken),
            Err(Error::BadSourcePattern { .. })
        ));
    }
}
