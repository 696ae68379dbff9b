//! Opening a `ParquetDataset`: one file, a folder, a listed set, or objects in a store; each
//! file's footer and labels read (in parallel), the sample and label columns found and checked
//! against every file.

use super::*;

impl ParquetDataset {
    /// Opens a folder of `*.parquet` files (sorted by name) or one `.parquet` file.
    ///
    /// Fails when the path is missing, holds no Parquet file, a file's footer cannot be read
    /// (a truncated or non-Parquet file), a file lacks the columns asked for or holds them
    /// with unusable types, a label is null or negative, or the files' class names differ.
    /// Labels past the class names the files give are told ([`SampleSource::notices`]), as is
    /// an image dataset without a label column (every label 0). Damage inside the sample column shows up
    /// later, as an error from [`SampleSource::read`] for the samples concerned.
    pub fn open(path: &Path, options: &ParquetOptions) -> Result<ParquetDataset> {
        let started = Instant::now();
        let (root, paths) = root_files(path, |folder| files_with_extension(folder, "parquet"))?;
        if paths.is_empty() {
            return Err(Error::NoParquetFiles(path.to_path_buf()));
        }
        let files = paths
            .into_iter()
            .map(|path| (path.clone(), FileBytes::Local(LocalFile::new(path))))
            .collect();
        Self::open_files(path, root, files, options, None, started)
    }

    /// Opens the Parquet files `paths` (a pattern's or list's, in this order); `name` names the
    /// set in messages. Fails as [`ParquetDataset::open`] does.
    pub fn open_listed(
        name: &Path,
        paths: Vec<PathBuf>,
        options: &ParquetOptions,
    ) -> Result<ParquetDataset> {
        let started = Instant::now();
        let Some(first) = paths.first() else {
            return Err(Error::NoParquetFiles(name.to_path_buf()));
        };
        let root = first
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        let files = paths
            .into_iter()
            .map(|path| (path.clone(), FileBytes::Local(LocalFile::new(path))))
            .collect();
        Self::open_files(name, root, files, options, None, started)
    }

    /// Opens the `*.parquet` objects directly under `uri` (`s3://BUCKET/PREFIX`, or the one
    /// object it names), reading their footers and label columns by ranges through `cache`;
    /// samples are then read a row group's column chunk at a time, as from local files.
    pub fn open_remote(
        uri: &str,
        cache: Arc<ObjectCache>,
        options: &ParquetOptions,
    ) -> Result<ParquetDataset> {
        Self::open_remote_split(uri, cache, options, None)
    }

    /// Like [`ParquetDataset::open_remote`], reading only the objects of `split` when their
    /// names are the hub's `{split}-NNNNN-of-NNNNN.parquet`: objects of several splits with
    /// none named are refused, naming the splits.
    pub fn open_remote_split(
        uri: &str,
        cache: Arc<ObjectCache>,
        options: &ParquetOptions,
        split: Option<&str>,
    ) -> Result<ParquetDataset> {
        let started = Instant::now();
        let is_parquet = |name: &str| has_extension(Path::new(name), "parquet");
        let (location, objects) = list_remote(uri, &cache, &is_parquet, "*.parquet file")?;
        let objects = crate::naming::objects_of_split(uri, objects, split)?;
        let read_ahead = objects.first().and_then(RemoteObject::start_read_ahead);
        let files = objects
            .into_iter()
            .map(|object| {
                (
                    PathBuf::from(object.uri()),
                    FileBytes::Remote(Arc::new(object)),
                )
            })
            .collect();
        let root = PathBuf::from(location.uri());
        let mut dataset =
            Self::open_files(&root.clone(), root, files, options, Some(cache), started)?;
        dataset.read_ahead = read_ahead;
        Ok(dataset)
    }

    /// Opens the `.parquet` objects that `s3://` patterns or a list named
    /// ([`crate::resolve_remote`]), as [`ParquetDataset::open_remote`] opens a prefix of them.
    pub fn open_remote_files(
        files: RemoteFiles,
        cache: Arc<ObjectCache>,
        options: &ParquetOptions,
    ) -> Result<ParquetDataset> {
        if files.kind != crate::FileKind::Parquet {
            return Err(Error::InvalidArgument(format!(
                "{} names {} objects, not Parquet files",
                files.name,
                files.kind.name()
            )));
        }
        let started = Instant::now();
        let objects = files.remote_objects(&cache);
        let read_ahead = objects.first().and_then(RemoteObject::start_read_ahead);
        let parts = objects
            .into_iter()
            .map(|object| {
                (
                    PathBuf::from(object.uri()),
                    FileBytes::Remote(Arc::new(object)),
                )
            })
            .collect();
        let name = PathBuf::from(&files.name);
        let root = PathBuf::from(files.location.uri());
        let mut dataset = Self::open_files(&name, root, parts, options, Some(cache), started)?;
        dataset.read_ahead = read_ahead;
        Ok(dataset)
    }

    /// Opens one file read by ranges (`name` in messages), as an object in a store is: the
    /// footer from its tail, each row group's column chunks by ranges. The fuzz target of the
    /// ranged reads opens its input this way.
    #[cfg(feature = "fuzzing")]
    pub(crate) fn open_ranged(
        name: &Path,
        bytes: Arc<dyn crate::storage::ByteRanges>,
        options: &ParquetOptions,
    ) -> Result<ParquetDataset> {
        let files = vec![(name.to_path_buf(), FileBytes::Remote(bytes))];
        Self::open_files(
            name,
            name.to_path_buf(),
            files,
            options,
            None,
            Instant::now(),
        )
    }

    /// Opens `files` (display path, bytes), in this order; `path` names the set in messages.
    fn open_files(
        path: &Path,
        root: PathBuf,
        files: Vec<(PathBuf, FileBytes)>,
        options: &ParquetOptions,
        object_cache: Option<Arc<ObjectCache>>,
        started: Instant,
    ) -> Result<ParquetDataset> {
        let opened: Vec<Option<(OpenedFile, Option<Vec<i64>>)>> = files
            .into_par_iter()
            .map(|(path, source)| {
                let Some(opened) = open_file(path, source, options)? else {
                    return Ok(None);
                };
                let labels = opened
                    .label_column
                    .map(|column| {
                        without_panics("parquet", || read_labels(&opened.file, column))
                            .unwrap_or_else(|message| {
                                Err(Error::ParquetFile {
                                    path: opened.file.path.clone(),
                                    source: ParquetError::General(message),
                                })
                            })
                    })
                    .transpose()?;
                Ok(Some((opened, labels)))
            })
            .collect::<Result<_>>()?;
        let opened: Vec<(OpenedFile, Option<Vec<i64>>)> = opened.into_iter().flatten().collect();
        let Some((first, _)) = opened.first() else {
            return Err(Error::NoParquetRows(path.to_path_buf()));
        };
        let sample_column = first.sample_column_name.clone();
        let sample_kind = first.kind;
        let label_column = first
            .label_column
            .map(|index| first.file.metadata.schema().field(index).name().clone());
        if let Some(label) = &label_column {
            let candidates: Vec<&str> = first.label_candidates.iter().map(String::as_str).collect();
            label_checks::warn_of_label_choice(path, label, &candidates);
        }
        let class_names_from_metadata = first.class_names.clone();
        let mut files = Vec::with_capacity(opened.len());
        let mut groups = Vec::new();
        let mut labels = Vec::new();
        let mut len = 0u64;
        for (file_number, (opened, file_labels)) in opened.into_iter().enumerate() {
            let label_name = opened
                .label_column
                .map(|index| opened.file.metadata.schema().field(index).name());
            let same_columns = opened.sample_column_name == sample_column
                && opened.kind == sample_kind
                && label_name == label_column.as_ref();
            if !same_columns {
                return Err(Error::ParquetColumn {
                    path: opened.file.path,
                    problem: format!(
                        "its columns differ from the first file's (samples from {}, labels \
                         from {:?} there)",
                        sample_column.as_deref().unwrap_or(NO_SAMPLE_COLUMN),
                        label_column
                    ),
                });
            }
            let mut first_row_in_file = 0u64;
            for (group_in_file, group) in opened
                .file
                .metadata
                .metadata()
                .row_groups()
                .iter()
                .enumerate()
            {
                // A group without rows is left out by `ArrowRows::new`.
                let rows = u64::try_from(group.num_rows()).unwrap_or(0);
                groups.push(ChunkSpan {
                    file: file_number,
                    chunk_in_file: group_in_file,
                    first_row_in_file,
                    rows,
                });
                // Counts are the footer's word: a sum past u64 wrapped to a small set.
                let (Some(next), Some(total)) =
                    (first_row_in_file.checked_add(rows), len.checked_add(rows))
                else {
                    return Err(Error::ParquetColumn {
                        path: opened.file.path,
                        problem: "its row groups' row counts add up past 2^64".into(),
                    });
                };
                (first_row_in_file, len) = (next, total);
            }
            if let Some(file_labels) = file_labels {
                if file_labels.len() as u64 != first_row_in_file {
                    return Err(Error::ParquetColumn {
                        path: opened.file.path,
                        problem: format!(
                            "the label column has {} values but the row groups hold {} rows",
                            file_labels.len(),
                            first_row_in_file
                        ),
                    });
                }
                labels.extend(file_labels);
            }
            if opened.class_names != class_names_from_metadata {
                return Err(Error::ParquetColumn {
                    path: opened.file.path,
                    problem: format!(
                        "its class names ({}) differ from the first file's ({}): the same \
                         label would name two classes",
                        names_in_words(opened.class_names.as_deref()),
                        names_in_words(class_names_from_metadata.as_deref())
                    ),
                });
            }
            files.push(opened.file);
        }
        if len == 0 {
            return Err(Error::NoParquetRows(path.to_path_buf()));
        }
        let (class_names, notice) = match &label_column {
            None if sample_kind == ParquetSampleKind::Image => {
                let notice = label_checks::no_label_column(
                    path,
                    "none named label, no ClassLabel feature, no integer labels, cls, target, targets or y",
                    &column_names(&files[0]),
                );
                (Vec::new(), Some(notice))
            }
            None => (Vec::new(), None),
            Some(column) => {
                let checked = label_checks::check_labels(
                    path,
                    column,
                    &labels,
                    class_names_from_metadata,
                    |index| describe_in(&groups, index, |file| files[file].path.as_path()),
                )?;
                (checked.class_names, checked.notice)
            }
        };
        let rows = ArrowRows::new(groups, labels, class_names).with_notice(notice);
        info!(
            path = %path.display(),
            files = files.len(),
            row_groups = rows.spans().len(),
            samples = len,
            sample_column = sample_column.as_deref().unwrap_or(NO_SAMPLE_COLUMN),
            classes = rows.class_names().len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "opened parquet dataset"
        );
        Ok(ParquetDataset {
            root,
            files,
            rows,
            sample_column,
            sample_kind,
            label_column,
            cache: RowGroupCache::new(options.cache_bytes),
            batches_decoded: std::sync::atomic::AtomicU64::new(0),
            object_cache,
            read_ahead: None,
        })
    }
}

/// The class names a file's metadata gives, in words.
fn names_in_words(names: Option<&[String]>) -> String {
    match names {
        Some(names) => format!("{names:?}"),
        None => "none".to_string(),
    }
}

/// The columns of `file`, by name.
fn column_names(file: &ParquetFile) -> Vec<String> {
    let schema = file.metadata.schema();
    schema
        .fields()
        .iter()
        .map(|field| field.name().clone())
        .collect()
}
