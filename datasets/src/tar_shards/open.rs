//! Opening `TarShards`: a folder of shards, one shard, a listed set, or objects in a store;
//! each shard's index read from its cache (beside it, or in the user cache folder) or made by a
//! scan, and the class names read.

use super::*;

impl TarShards {
    /// Opens a folder of `*.tar` shards (sorted by name) or one `.tar` file, caching each
    /// shard's index beside it or, where that folder is read-only, in the user cache folder
    /// (`$XDG_CACHE_HOME/stoker` or `~/.cache/stoker`).
    ///
    /// Problems inside the shards are logged and counted (see [`TarShards::index_stats`]);
    /// opening fails only when the path is missing, a shard cannot be read at all, or no
    /// complete sample is found.
    pub fn open(path: &Path) -> Result<TarShards> {
        Self::open_with_cache_dir(path, default_user_cache_dir().as_deref())
    }

    /// Like [`TarShards::open`], with `fallback_cache_dir` in place of the user cache folder
    /// (`None`: keep indexes of read-only shards in memory only).
    pub fn open_with_cache_dir(
        path: &Path,
        fallback_cache_dir: Option<&Path>,
    ) -> Result<TarShards> {
        let started = Instant::now();
        let (root, shard_paths) = root_files(path, |folder| files_with_extension(folder, "tar"))?;
        if shard_paths.is_empty() {
            return Err(Error::NoShards(path.to_path_buf()));
        }
        Self::open_listed(path, root, shard_paths, fallback_cache_dir, started)
    }

    /// Opens the shards `files` (a pattern's or list's, in this order), with the class names of
    /// `classes.txt` beside the first; `name` names the set in messages.
    pub fn open_files(name: &Path, files: Vec<PathBuf>) -> Result<TarShards> {
        let started = Instant::now();
        let Some(first) = files.first() else {
            return Err(Error::NoShards(name.to_path_buf()));
        };
        let root = first
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        Self::open_listed(
            name,
            root,
            files,
            default_user_cache_dir().as_deref(),
            started,
        )
    }

    /// Indexes `shard_paths` (`path` names the set in messages).
    fn open_listed(
        path: &Path,
        root: PathBuf,
        shard_paths: Vec<PathBuf>,
        fallback_cache_dir: Option<&Path>,
        started: Instant,
    ) -> Result<TarShards> {
        let opened: Vec<(Shard, bool)> = shard_paths
            .into_par_iter()
            .map(|shard| open_shard(shard, fallback_cache_dir))
            .collect::<Result<_>>()?;
        let mut stats = TarIndexStats {
            shards: opened.len(),
            ..TarIndexStats::default()
        };
        let mut shards = Vec::with_capacity(opened.len());
        for (shard, from_cache) in opened {
            if from_cache {
                stats.loaded_from_cache += 1;
            } else {
                stats.built += 1;
            }
            stats.problems += shard.index.problems;
            shards.push(shard);
        }
        let set = TarShards::assemble(path, root, shards, stats, None, |root, max_label| {
            class_names(root, max_label)
        })?;
        if set.stats.problems > 0 {
            warn!(
                path = %path.display(),
                problems = set.stats.problems,
                "tar shards have members that could not be indexed or are truncated"
            );
        }
        info!(
            path = %path.display(),
            shards = set.stats.shards,
            samples = set.len,
            classes = set.class_names.len(),
            indexes_from_cache = set.stats.loaded_from_cache,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "indexed tar shards"
        );
        Ok(set)
    }

    /// Opens the tar shards under `uri` (`s3://BUCKET/PREFIX`, or one `.tar` object), read
    /// through `cache`: the set's index object when it matches the listing, else each shard
    /// scanned once as a stream of ranged GETs (with a warning; `stoker index` writes the
    /// object). Samples are ranged GETs through the cache, read ahead when told.
    pub fn open_remote(uri: &str, cache: Arc<ObjectCache>) -> Result<TarShards> {
        remote::open_remote_tar_set(uri, cache, None)
    }

    /// Like [`TarShards::open_remote`], reading only the shards of `split` when their names are
    /// the hub's `{split}-NNNNN-of-NNNNN.tar`: shards of several splits with none named are
    /// refused, naming the splits.
    pub fn open_remote_split(
        uri: &str,
        cache: Arc<ObjectCache>,
        split: Option<&str>,
    ) -> Result<TarShards> {
        remote::open_remote_tar_set(uri, cache, split)
    }

    /// Opens the tar shards that `s3://` patterns or a list named ([`crate::resolve_remote`]),
    /// as [`TarShards::open_remote`] opens a prefix: each shard's index from the index object
    /// of its folder when that describes it, else each shard scanned once.
    pub fn open_remote_files(files: RemoteFiles, cache: Arc<ObjectCache>) -> Result<TarShards> {
        if files.kind != crate::FileKind::TarShard {
            return Err(Error::InvalidArgument(format!(
                "{} names {} objects, not tar shards",
                files.name,
                files.kind.name()
            )));
        }
        remote::open_remote_tar_files(files, cache)
    }

    /// The set of `shards` (in sample order) under `root`, with class names from
    /// `class_names(root, largest label)`; `path` names the set in messages.
    pub(crate) fn assemble(
        path: &Path,
        root: PathBuf,
        shards: Vec<Shard>,
        stats: TarIndexStats,
        remote: Option<ThroughCache>,
        class_names: impl FnOnce(&Path, Option<i64>) -> Result<Vec<String>>,
    ) -> Result<TarShards> {
        let mut first_samples = Vec::with_capacity(shards.len());
        let mut len = 0u64;
        let mut max_label = None;
        for shard in &shards {
            first_samples.push(len);
            len += shard.index.samples.len() as u64;
            max_label = max_label.max(shard.index.samples.iter().map(|sample| sample.label).max());
        }
        if len == 0 {
            return Err(Error::NoTarSamples {
                path: path.to_path_buf(),
                problems: stats.problems,
            });
        }
        let class_names = class_names(&root, max_label)?;
        let mut notices = Vec::new();
        let sampleless: Vec<String> = shards
            .iter()
            .filter(|shard| shard.index.samples.is_empty())
            .map(|shard| shard.path.display().to_string())
            .collect();
        if let Some(first) = sampleless.first() {
            notices.push(format!(
                "{} shard(s) of {} hold no sample (empty, cut short before their first \
                 member, or not a tar archive), {first} the first",
                sampleless.len(),
                path.display()
            ));
        }
        if stats.problems > 0 {
            notices.push(format!(
                "{}: {} problem(s) indexing the tar shards (an image without a .cls or .json \
                 member holding a class index, which is left out; a label without an image; a \
                 second image for one key; a member cut short); `stoker inspect` counts them",
                path.display(),
                stats.problems
            ));
        }
        if let Some(max) = max_label.filter(|max| *max as u64 >= class_names.len() as u64) {
            notices.push(format!(
                "{}: labels go up to {max}, past the {} class names of {CLASSES_FILE}; the \
                 batches carry them as they are",
                path.display(),
                class_names.len()
            ));
        }
        let pool_keys = match remote {
            None => FilePool::global().reserve_keys(shards.len()),
            Some(_) => 0..0,
        };
        Ok(TarShards {
            root,
            shards,
            first_samples,
            len,
            class_names,
            stats,
            notices,
            pool_keys,
            remote,
        })
    }
}

/// Indexes one shard, from a cache when a valid one exists. The flag tells whether it did.
fn open_shard(path: PathBuf, fallback_cache_dir: Option<&Path>) -> Result<(Shard, bool)> {
    let metadata = std::fs::metadata(&path).map_err(|source| Error::io(&path, source))?;
    let absolute = std::path::absolute(&path).map_err(|source| Error::io(&path, source))?;
    let stamp = ShardStamp::new(absolute, &metadata);
    let beside = cache::beside_path(&path);
    let in_user_cache = fallback_cache_dir.map(|dir| cache::user_cache_path(dir, &stamp));

    let cached = cache::load(&beside, &stamp, false).or_else(|| {
        in_user_cache
            .as_deref()
            .and_then(|cache_path| cache::load(cache_path, &stamp, true))
    });
    let from_cache = cached.is_some();
    let index = match cached {
        Some(index) => index,
        None => {
            let index = scan::scan_shard(&path, stamp.len)?;
            cache::save_index(&beside, in_user_cache.as_deref(), &stamp, &index);
            index
        }
    };
    let shard = Shard {
        path,
        len: stamp.len,
        indexed: Some(cache::FileIdentity::of(&metadata)),
        index,
        object: None,
    };
    Ok((shard, from_cache))
}

/// Class names from `classes.txt` in `root` when present, else `"0"` to `max_label`.
fn class_names(root: &Path, max_label: Option<i64>) -> Result<Vec<String>> {
    let classes_file = root.join(CLASSES_FILE);
    // Its lines go to the client as class names: a link out of a worker's roots is refused.
    if classes_file.exists() {
        crate::referenced_files::check_data_file(&classes_file)?;
    }
    let text = match crate::files::read_small_file(&classes_file, crate::files::MAX_MANIFEST_BYTES)
    {
        Ok(bytes) => String::from_utf8(bytes).map_err(|_| {
            Error::io(
                &classes_file,
                std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"),
            )
        })?,
        Err(source) if source.kind() == std::io::ErrorKind::NotFound => {
            return numbered_class_names(root, max_label)
        }
        Err(source) => return Err(Error::io(classes_file, source)),
    };
    Ok(parse_class_names(&text))
}
