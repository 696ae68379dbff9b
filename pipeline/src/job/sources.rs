//! Opening a job's datasets: the sources a spec names (one, or the sources of a mix), each opened
//! by its location (a local path or `file://`, or `s3://` through the object cache) and format
//! (picked from the files when the spec leaves it out), with the options its ops need (a token
//! file's window length, a Parquet or Hugging Face source's columns).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use stoker_datasets::{
    is_pattern, kind_of, kind_of_files, local_format, megatron_pair, open_megatron,
    open_remote_megatron, parse_dataset_uri, remote_layout, remote_split_prefix, resolve_local,
    resolve_remote, DatasetLocation, FileKind, HfDataset, ImageFolder, JsonlDocuments, LocalFormat,
    LocalSource, MdsDataset, MdsOptions, MdsTokenWindows, ObjectCache, ObjectCacheOptions,
    ParquetDataset, ParquetOptions, RemoteLayout, SampleSource, TarShards, TokenDtype, TokenFile,
    WiderIds,
};
use stoker_proto::v1::{self as proto, op::Op as OpKind, DatasetFormat, JobSpec};

use crate::error::{Error, Result};

/// The (dataset, pipeline) pairs `spec` names: its mix's sources, or its dataset with its
/// pipeline (none when it has no dataset).
pub fn spec_sources(spec: &JobSpec) -> Vec<(&proto::DatasetSource, &[proto::Op])> {
    match &spec.mix {
        Some(mix) => mix
            .sources
            .iter()
            .filter_map(|source| Some((source.dataset.as_ref()?, source.pipeline.as_slice())))
            .collect(),
        None => spec
            .dataset
            .iter()
            .map(|dataset| (dataset, spec.pipeline.as_slice()))
            .collect(),
    }
}

/// The names a dataset source gives: its `uris`, or its one `uri` (trimmed; empty ones left
/// out).
pub fn source_names(dataset: &proto::DatasetSource) -> Vec<&str> {
    let listed: Vec<&str> = dataset
        .uris
        .iter()
        .map(|name| name.trim())
        .filter(|name| !name.is_empty())
        .collect();
    if !listed.is_empty() {
        return listed;
    }
    let uri = dataset.uri.trim();
    if uri.is_empty() {
        Vec::new()
    } else {
        vec![uri]
    }
}

/// The split a dataset source asks for, if any.
pub fn source_split(dataset: &proto::DatasetSource) -> Option<&str> {
    Some(dataset.split.trim()).filter(|split| !split.is_empty())
}

/// Opens every dataset `spec` names (see [`open_source`]), in order.
pub fn open_sources(spec: &JobSpec) -> Result<Vec<Arc<dyn SampleSource>>> {
    match &spec.mix {
        Some(mix) => mix
            .sources
            .iter()
            .enumerate()
            .map(|(k, source)| {
                let dataset = source.dataset.as_ref().ok_or_else(|| {
                    Error::InvalidSpec(format!("mixed source {k} has no dataset"))
                })?;
                open_source(dataset, &source.pipeline)
            })
            .collect(),
        None => {
            let dataset = spec
                .dataset
                .as_ref()
                .ok_or_else(|| Error::InvalidSpec("dataset is missing".into()))?;
            Ok(vec![open_source(dataset, &spec.pipeline)?])
        }
    }
}

/// Opens the dataset a spec names. `ops` is the job's pipeline: a token file is cut into the
/// windows of its `TokenWindows` op.
///
/// A local source is first resolved (`resolve_local`): a pattern or a list of names becomes
/// the files it names, and a folder laid out by split gives the split asked for. Files named so
/// are read by their one format (tar shards, Parquet, JSONL, or one token file). A folder or file
/// named alone is read by `AUTO`'s rules: a `.tar` file or a folder of them is tar shards, a
/// folder with `state.json` and `dataset_info.json` a Hugging Face `datasets` folder,
/// `.parquet` files Parquet, a `.bin` file a token file (a Megatron corpus, with the dtype its
/// `.idx` names, when the `.idx` lies beside it; the `.idx` names it too), a `.jsonl` file or a
/// folder of them JSONL documents, anything else an image folder. `s3://BUCKET/PREFIX` is read
/// through the local object cache (configured by `STOKER_CACHE_DIR`, `STOKER_CACHE_MAX_BYTES`
/// and the `AWS_*` variables); other schemes are refused.
pub fn open_source(
    dataset: &proto::DatasetSource,
    ops: &[proto::Op],
) -> Result<Arc<dyn SampleSource>> {
    let names = source_names(dataset);
    if names.is_empty() {
        return Err(Error::InvalidSpec("dataset.uri is empty".into()));
    }
    let mut local = Vec::with_capacity(names.len());
    for &name in &names {
        match parse_dataset_uri(name).map_err(Error::OpenDataset)? {
            DatasetLocation::Local(path) => local.push(path.to_string_lossy().into_owned()),
            DatasetLocation::S3(_) if names.len() == 1 && !is_pattern(name) => {
                return open_remote_source(name, dataset, ops);
            }
            DatasetLocation::S3(_) if local.is_empty() && names.iter().all(|n| is_s3(n)) => {
                return open_remote_names(&names, dataset, ops);
            }
            DatasetLocation::S3(_) => {
                return Err(Error::InvalidSpec(format!(
                    "{}: a list names local files and s3:// objects; one source is read from \
                     one place (mix the two with stoker.mix)",
                    names.join(",")
                )))
            }
        }
    }
    let local: Vec<&str> = local.iter().map(String::as_str).collect();
    let path = match resolve_local(&local, source_split(dataset)).map_err(Error::OpenDataset)? {
        LocalSource::Path(path) => path,
        LocalSource::Files { name, files } => return open_named_files(&name, files, dataset, ops),
    };
    let path = path.as_path();
    let format = match dataset.format() {
        DatasetFormat::Auto => match local_format(path).map_err(Error::OpenDataset)? {
            LocalFormat::TarShards => DatasetFormat::TarShards,
            LocalFormat::HfDataset => DatasetFormat::HfDataset,
            LocalFormat::Mds => DatasetFormat::Mds,
            LocalFormat::Parquet => DatasetFormat::Parquet,
            LocalFormat::TokenFile => DatasetFormat::TokenFile,
            LocalFormat::Jsonl => DatasetFormat::Jsonl,
            LocalFormat::ImageFolder => image_folder_format(path)?,
        },
        other => other,
    };
    match format {
        DatasetFormat::Auto | DatasetFormat::ImageFolder => Ok(Arc::new(
            ImageFolder::open(path).map_err(Error::OpenDataset)?,
        )),
        DatasetFormat::TarShards => {
            Ok(Arc::new(TarShards::open(path).map_err(Error::OpenDataset)?))
        }
        DatasetFormat::TokenFile => open_token_file(path, dataset, ops),
        DatasetFormat::Jsonl => Ok(Arc::new(
            JsonlDocuments::open(
                path,
                dataset.text_column.trim(),
                dataset.label_column.trim(),
            )
            .map_err(Error::OpenDataset)?,
        )),
        DatasetFormat::Parquet => open_parquet(path, dataset, ops),
        DatasetFormat::HfDataset => Ok(Arc::new(
            HfDataset::open(path, &column_options(dataset, ops)).map_err(Error::OpenDataset)?,
        )),
        DatasetFormat::Mds => open_mds(
            &|options| MdsDataset::open(path, options),
            &ObjectCacheOptions::from_env,
            dataset,
            ops,
        ),
    }
}

/// Opens an MDS dataset (`open` given the columns to read): its samples, or, when the pipeline
/// cuts token windows, the ids of its token column cut into them, written once into the cache
/// tier `cache` gives (asked for only then: a plain folder needs none).
fn open_mds(
    open: &dyn Fn(&MdsOptions) -> stoker_datasets::Result<MdsDataset>,
    cache: &dyn Fn() -> stoker_datasets::Result<ObjectCacheOptions>,
    dataset: &proto::DatasetSource,
    ops: &[proto::Op],
) -> Result<Arc<dyn SampleSource>> {
    let mut options = mds_options(dataset);
    let Some(seq_len) = token_windows_seq_len(ops) else {
        return Ok(Arc::new(open(&options).map_err(Error::OpenDataset)?));
    };
    options.tokens_only = true;
    let mds = open(&options).map_err(Error::OpenDataset)?;
    let windows = MdsTokenWindows {
        column: options.sample_column.clone(),
        dtype: token_dtype(dataset)?,
        seq_len,
        document_boundaries: wants_document_boundaries(ops),
    };
    let cache = cache().map_err(Error::OpenDataset)?;
    Ok(Arc::new(
        mds.token_windows(&windows, &cache)
            .map_err(Error::OpenDataset)?,
    ))
}

/// The columns the spec names for an MDS dataset: the sample (or token) column is its image
/// column, else its text column ("" = pick by name).
fn mds_options(dataset: &proto::DatasetSource) -> MdsOptions {
    MdsOptions {
        sample_column: named(&dataset.image_column).or_else(|| named(&dataset.text_column)),
        label_column: named(&dataset.label_column),
        tokens_only: false,
    }
}

/// Opens files a pattern, a list or a split named, by their one format.
fn open_named_files(
    name: &str,
    files: Vec<PathBuf>,
    dataset: &proto::DatasetSource,
    ops: &[proto::Op],
) -> Result<Arc<dyn SampleSource>> {
    let kind = kind_of_files(name, &files).map_err(Error::OpenDataset)?;
    check_named_format(name, kind, "files", dataset)?;
    let display = Path::new(name);
    match kind {
        FileKind::TarShard => Ok(Arc::new(
            TarShards::open_files(display, files).map_err(Error::OpenDataset)?,
        )),
        FileKind::Parquet => Ok(Arc::new(
            ParquetDataset::open_listed(display, files, &column_options(dataset, ops))
                .map_err(Error::OpenDataset)?,
        )),
        FileKind::Jsonl => Ok(Arc::new(
            JsonlDocuments::open_listed(
                display,
                files,
                dataset.text_column.trim(),
                dataset.label_column.trim(),
            )
            .map_err(Error::OpenDataset)?,
        )),
        FileKind::TokenFile => match files.as_slice() {
            [file] => open_token_file(file, dataset, ops),
            _ => Err(Error::InvalidSpec(format!(
                "{name} names {} token files: a token source is one file (mix several with \
                 stoker.mix)",
                files.len()
            ))),
        },
    }
}

/// Refuses a format asked for that is not the one of the files (or objects: `what`) `name`
/// named, `kind`; `AUTO` takes theirs.
fn check_named_format(
    name: &str,
    kind: FileKind,
    what: &str,
    dataset: &proto::DatasetSource,
) -> Result<()> {
    let theirs = match kind {
        FileKind::TarShard => DatasetFormat::TarShards,
        FileKind::Parquet => DatasetFormat::Parquet,
        FileKind::Jsonl => DatasetFormat::Jsonl,
        FileKind::TokenFile => DatasetFormat::TokenFile,
    };
    let format = dataset.format();
    if format != DatasetFormat::Auto && format != theirs {
        return Err(Error::InvalidSpec(format!(
            "{name} names {} {what}, but the format asked for is {}",
            kind.name(),
            format.as_str_name()
        )));
    }
    Ok(())
}

/// Opens the local token file `path`, cut into the windows of the pipeline's `TokenWindows` op,
/// its dtype as the spec names it or else from the file name.
fn open_token_file(
    path: &Path,
    dataset: &proto::DatasetSource,
    ops: &[proto::Op],
) -> Result<Arc<dyn SampleSource>> {
    let seq_len = token_windows_seq_len(ops).ok_or_else(|| {
        Error::InvalidSpec(format!(
            "{} is a token file: its pipeline must be [TokenWindows{{seq_len}}]",
            path.display()
        ))
    })?;
    // A Megatron corpus (the .bin beside its .idx): the dtype is the index's.
    if megatron_pair(path).is_some() {
        let documents = wants_document_boundaries(ops);
        let (tokens, _) = open_megatron(path, token_dtype(dataset)?, seq_len, documents)
            .map_err(Error::OpenDataset)?;
        return Ok(Arc::new(tokens));
    }
    let named = token_dtype(dataset)?;
    let dtype = named.unwrap_or_else(|| TokenDtype::from_file_name(path));
    let tokens = TokenFile::open(path, dtype, seq_len).map_err(Error::OpenDataset)?;
    checked_dtype(tokens, named.is_some(), &path.display().to_string())
}

/// `tokens`, unless its dtype came from its name (`given` false) and [`token_dtype_fits`]
/// refuses it.
fn checked_dtype(tokens: TokenFile, given: bool, name: &str) -> Result<Arc<dyn SampleSource>> {
    if !given {
        token_dtype_fits(&tokens, name)?;
    }
    Ok(Arc::new(tokens))
}

/// Refuses token file `tokens` (called `name`), read as uint16 by its name, whose head holds
/// wider ids: read so, it would train on each id's parts as two or four tokens, silently.
pub fn token_dtype_fits(tokens: &TokenFile, name: &str) -> Result<()> {
    match tokens.wider_ids().map_err(Error::OpenDataset)? {
        None => Ok(()),
        Some(WiderIds::Uint32) => Err(Error::InvalidSpec(format!(
            "{name} is read as uint16 tokens by its name, but holds uint32 ids (every second \
             16-bit value of its head is a uint32's small high half): name it *.u32.bin (the \
             CLI also takes --token-dtype uint32)"
        ))),
        Some(WiderIds::Int64) => Err(Error::InvalidSpec(format!(
            "{name} is read as uint16 tokens by its name, but holds 64-bit ids (of every four \
             16-bit values of its head, the last two are 0: NumPy's default int64, as \
             np.array(ids).tofile() writes): write it as uint16 (vocabularies up to 65,536) or \
             uint32 under a *.u32.bin name, e.g. np.array(ids, dtype=np.uint16).tofile(path)"
        ))),
    }
}

/// Whether the op list's `TokenWindows` op asks for document boundaries (a Megatron corpus's
/// starts are read, a `u64` per document, only then).
fn wants_document_boundaries(ops: &[proto::Op]) -> bool {
    ops.iter().any(
        |op| matches!(&op.op, Some(OpKind::TokenWindows(windows)) if windows.document_boundaries),
    )
}

/// The `seq_len` of the op list's `TokenWindows` op, if it has one.
fn token_windows_seq_len(ops: &[proto::Op]) -> Option<u32> {
    ops.iter().find_map(|op| match &op.op {
        Some(OpKind::TokenWindows(windows)) => Some(windows.seq_len),
        _ => None,
    })
}

/// Opens a Parquet dataset with the columns the spec names ("" = pick by name).
fn open_parquet(
    path: &Path,
    dataset: &proto::DatasetSource,
    ops: &[proto::Op],
) -> Result<Arc<dyn SampleSource>> {
    Ok(Arc::new(
        ParquetDataset::open(path, &column_options(dataset, ops)).map_err(Error::OpenDataset)?,
    ))
}

/// A column a spec names (`None` for "": picked by name).
fn named(column: &str) -> Option<String> {
    let column = column.trim();
    (!column.is_empty()).then(|| column.to_string())
}

/// The columns the spec names for a Parquet or HF dataset ("" = pick by name). A pipeline that
/// tokenizes reads a text column (`text` unless one is named), never an image column beside it.
fn column_options(dataset: &proto::DatasetSource, ops: &[proto::Op]) -> ParquetOptions {
    let tokenizes = ops
        .iter()
        .any(|op| matches!(op.op, Some(OpKind::Tokenize(_))));
    ParquetOptions {
        image_column: named(&dataset.image_column),
        text_column: named(&dataset.text_column).or_else(|| tokenizes.then(|| "text".to_string())),
        label_column: named(&dataset.label_column),
        ..ParquetOptions::default()
    }
}

/// Opens an `s3://` dataset as a local folder of the same files is opened: tar shards,
/// Parquet, JSONL, a token file (a Megatron corpus with its `.idx`), a `save_to_disk` folder or
/// an image folder. `AUTO` takes a key ending in `.bin` or `.parquet` for that file, and a
/// prefix by what lies directly under it ([`remote_layout`]): the one kind of data object
/// there, a `save_to_disk` folder (`state.json`), or, with folders only, an image folder (tar
/// shards when it holds nothing: their index object names them). A split is read from objects
/// named by split (`train-00000-of-00002.parquet`), from a prefix's split folders (`train/`,
/// `test/`, or under `data/`), a `DatasetDict`'s, or an image folder's (`train/<class>/`), as
/// from a local folder's.
fn open_remote_source(
    uri: &str,
    dataset: &proto::DatasetSource,
    ops: &[proto::Op],
) -> Result<Arc<dyn SampleSource>> {
    let cache = Arc::new(ObjectCache::from_env().map_err(Error::OpenDataset)?);
    // A prefix laid out by split folders (`train/`, `test/`, or under `data/`) reads the
    // split's folder, as a local folder does; a data object's key is read as it is.
    let mut split = source_split(dataset).map(str::to_string);
    let chosen;
    let uri = match kind_of(Path::new(uri)) {
        Some(_) => uri,
        None => {
            match remote_split_prefix(uri, split.as_deref(), &cache).map_err(Error::OpenDataset)? {
                Some((prefix, split_s_own)) => {
                    if split_s_own {
                        split = None;
                    }
                    chosen = prefix;
                    chosen.as_str()
                }
                None => uri,
            }
        }
    };
    let format = match dataset.format() {
        DatasetFormat::Auto if uri.to_ascii_lowercase().ends_with(".bin") => {
            DatasetFormat::TokenFile
        }
        DatasetFormat::Auto if uri.to_ascii_lowercase().ends_with(".parquet") => {
            DatasetFormat::Parquet
        }
        DatasetFormat::Auto => match remote_layout(uri, &cache).map_err(Error::OpenDataset)? {
            RemoteLayout::Files(FileKind::Parquet) => DatasetFormat::Parquet,
            RemoteLayout::Files(FileKind::TokenFile) => DatasetFormat::TokenFile,
            RemoteLayout::Files(FileKind::Jsonl) => DatasetFormat::Jsonl,
            RemoteLayout::HfDataset => DatasetFormat::HfDataset,
            RemoteLayout::Mds => DatasetFormat::Mds,
            RemoteLayout::Folders => DatasetFormat::ImageFolder,
            RemoteLayout::Files(FileKind::TarShard) | RemoteLayout::Nothing => {
                DatasetFormat::TarShards
            }
        },
        other => other,
    };
    if split.is_some() && format == DatasetFormat::TokenFile {
        return Err(Error::InvalidSpec(format!(
            "split= picks objects of a prefix by their names; {uri} is one token file"
        )));
    }
    if split.is_some() && format == DatasetFormat::Mds {
        return Err(Error::InvalidSpec(format!(
            "split= picks a split folder (PREFIX/<split>/index.json); {uri} is one MDS dataset"
        )));
    }
    match format {
        DatasetFormat::TarShards => Ok(Arc::new(
            TarShards::open_remote_split(uri, cache, split.as_deref())
                .map_err(Error::OpenDataset)?,
        )),
        DatasetFormat::TokenFile => {
            let seq_len = token_windows_seq_len(ops).ok_or_else(|| {
                Error::InvalidSpec(format!(
                    "{uri} is a token file: its pipeline must be [TokenWindows{{seq_len}}]"
                ))
            })?;
            let dtype = token_dtype(dataset)?;
            // A Megatron corpus (its .idx beside the .bin): the dtype is the index's.
            let documents = wants_document_boundaries(ops);
            let megatron = open_remote_megatron(uri, Arc::clone(&cache), dtype, seq_len, documents)
                .map_err(Error::OpenDataset)?;
            if let Some((tokens, _)) = megatron {
                return Ok(Arc::new(tokens));
            }
            let tokens =
                TokenFile::open_remote(uri, cache, dtype, seq_len).map_err(Error::OpenDataset)?;
            checked_dtype(tokens, dtype.is_some(), uri)
        }
        DatasetFormat::Parquet => Ok(Arc::new(
            ParquetDataset::open_remote_split(
                uri,
                cache,
                &column_options(dataset, ops),
                split.as_deref(),
            )
            .map_err(Error::OpenDataset)?,
        )),
        DatasetFormat::Jsonl => Ok(Arc::new(
            JsonlDocuments::open_remote(
                uri,
                cache,
                dataset.text_column.trim(),
                dataset.label_column.trim(),
                split.as_deref(),
            )
            .map_err(Error::OpenDataset)?,
        )),
        DatasetFormat::HfDataset => Ok(Arc::new(
            HfDataset::open_remote(uri, cache, &column_options(dataset, ops), split.as_deref())
                .map_err(Error::OpenDataset)?,
        )),
        DatasetFormat::Auto | DatasetFormat::ImageFolder => Ok(Arc::new(
            ImageFolder::open_remote(uri, cache, split.as_deref()).map_err(Error::OpenDataset)?,
        )),
        DatasetFormat::Mds => open_mds(
            &|columns| MdsDataset::open_remote(uri, Arc::clone(&cache), columns),
            &|| Ok(cache.options().clone()),
            dataset,
            ops,
        ),
    }
}

/// The image folder format for a path no other format takes, unless it is or holds
/// gzip-compressed tar shards, said for what they are (not "no class folder").
fn image_folder_format(path: &Path) -> Result<DatasetFormat> {
    if let Some(shard) = stoker_datasets::compressed_tar_shard(path) {
        return Err(Error::InvalidSpec(format!(
            "{} is a gzip-compressed tar shard, which Stoker does not read (a sample is read \
             by its offset in the shard): decompress the shards (gunzip, keeping .tar) or \
             write them uncompressed",
            shard.display()
        )));
    }
    Ok(DatasetFormat::ImageFolder)
}

/// Whether `name` is an `s3://` URI.
fn is_s3(name: &str) -> bool {
    matches!(parse_dataset_uri(name), Ok(DatasetLocation::S3(_)))
}

/// Opens the objects that `s3://` patterns or a list of names select, by their one format: tar
/// shards, Parquet files, JSONL files, or one token file.
fn open_remote_names(
    names: &[&str],
    dataset: &proto::DatasetSource,
    ops: &[proto::Op],
) -> Result<Arc<dyn SampleSource>> {
    let cache = Arc::new(ObjectCache::from_env().map_err(Error::OpenDataset)?);
    let files = resolve_remote(names, source_split(dataset), &cache).map_err(Error::OpenDataset)?;
    check_named_format(&files.name, files.kind, "objects", dataset)?;
    match files.kind {
        FileKind::TarShard => Ok(Arc::new(
            TarShards::open_remote_files(files, cache).map_err(Error::OpenDataset)?,
        )),
        FileKind::Parquet => Ok(Arc::new(
            ParquetDataset::open_remote_files(files, cache, &column_options(dataset, ops))
                .map_err(Error::OpenDataset)?,
        )),
        FileKind::TokenFile => match files.uris().as_slice() {
            [uri] => open_remote_source(uri, dataset, ops),
            uris => Err(Error::InvalidSpec(format!(
                "{} names {} token files: a token source is one file (mix several with \
                 stoker.mix)",
                files.name,
                uris.len()
            ))),
        },
        FileKind::Jsonl => Ok(Arc::new(
            JsonlDocuments::open_remote_files(
                files,
                cache,
                dataset.text_column.trim(),
                dataset.label_column.trim(),
            )
            .map_err(Error::OpenDataset)?,
        )),
    }
}

/// The token dtype `dataset` names (`None`: from the file name).
fn token_dtype(dataset: &proto::DatasetSource) -> Result<Option<TokenDtype>> {
    match dataset.token_dtype() {
        proto::Dtype::Unspecified => Ok(None),
        proto::Dtype::Uint16 => Ok(Some(TokenDtype::Uint16)),
        proto::Dtype::Uint32 => Ok(Some(TokenDtype::Uint32)),
        other => Err(Error::InvalidSpec(format!(
            "dataset.token_dtype must be UINT16 or UINT32, got {}",
            other.as_str_name()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(uris: &[&str]) -> proto::DatasetSource {
        proto::DatasetSource {
            uris: uris.iter().map(|uri| uri.to_string()).collect(),
            ..proto::DatasetSource::default()
        }
    }

    /// A list is read from one place: local files and `s3://` objects together are refused by
    /// name, whichever comes first (before any store is asked).
    #[test]
    fn a_list_of_local_and_s3_names_is_refused_by_name() {
        for uris in [
            &["s3://bucket/a.tar", "/data/b.tar"][..],
            &["/data/b.tar", "s3://bucket/a.tar"],
        ] {
            let Err(error) = open_source(&named(uris), &[]) else {
                panic!("{uris:?} opened");
            };
            let message = error.to_string();
            assert!(
                message.contains("local files and s3:// objects"),
                "{message}"
            );
            assert_eq!(error.kind(), crate::ErrorKind::InvalidArgument);
        }
    }

    #[test]
    fn a_list_s_names_come_before_uri_and_blank_ones_are_left_out() {
        let mut dataset = named(&[" a.tar ", "", "b.tar"]);
        dataset.uri = "ignored".into();
        assert_eq!(source_names(&dataset), ["a.tar", "b.tar"]);
        assert_eq!(source_names(&named(&[])), Vec::<&str>::new());
        assert_eq!(source_split(&proto::DatasetSource::default()), None);
    }

    /// gzip-compressed tar shards are said to be what they are, not "no class folder".
    #[test]
    fn gzip_compressed_tar_shards_are_refused_for_what_they_are() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("shard-0.tar.gz"), b"\x1f\x8b").unwrap();
        std::fs::write(dir.path().join("shard-1.tgz"), b"\x1f\x8b").unwrap();
        let folder = dir.path().to_string_lossy().into_owned();
        let one = dir
            .path()
            .join("shard-1.tgz")
            .to_string_lossy()
            .into_owned();
        for (uri, named) in [(folder, "shard-0.tar.gz"), (one, "shard-1.tgz")] {
            let Err(error) = open_source(&named_uri(&uri), &[]) else {
                panic!("{uri} opened");
            };
            let message = error.to_string();
            assert!(
                message.contains(named) && message.contains("gzip-compressed tar shard"),
                "{message}"
            );
        }
    }

    fn named_uri(uri: &str) -> proto::DatasetSource {
        proto::DatasetSource {
            uri: uri.to_string(),
            ..proto::DatasetSource::default()
        }
    }
}
