//! The crate's one error type: every failure names the path it concerns and why it failed.

use std::path::PathBuf;

mod credentials;
mod fault;
mod labels;
mod tar_sets;
mod tokens;
mod writing;

/// Everything that can go wrong while indexing, reading, generating or inspecting a dataset.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file-system call failed on `path`.
    #[error("i/o error on {path}: {source}")]
    Io {
        /// The file or folder the call was about.
        path: PathBuf,
        /// What the operating system reported.
        source: std::io::Error,
    },

    /// A file of the object cache tier (an entry, its lock or metadata, a part file, a
    /// derived copy) could not be used: the cache's fault, never a sample's.
    #[error("the cache tier cannot use {path}: {source}")]
    Cache {
        /// The cache's file or folder.
        path: PathBuf,
        /// What the operating system reported.
        source: std::io::Error,
    },

    /// The dataset root does not exist.
    #[error("dataset root {0} does not exist")]
    RootNotFound(PathBuf),

    /// The path exists but is a file (or something else), where a folder was expected.
    #[error("{0} is not a directory")]
    NotADirectory(PathBuf),

    /// The root holds no subfolders, so there is no class to index.
    #[error("found no class folder in {0}: an image folder holds one subfolder per class")]
    NoClasses(PathBuf),

    /// Class folders exist but none of them holds a file with an image extension.
    #[error("found no image file in any class folder of {0}")]
    EmptyDataset(PathBuf),

    /// Some class folders hold no image file; torchvision refuses such a folder too.
    #[error("found no image file for the classes {} in {root}", classes.join(", "))]
    EmptyClasses {
        /// The dataset root.
        root: PathBuf,
        /// The class folders without an image, in class order.
        classes: Vec<String>,
    },

    /// A sample index past the end of the dataset.
    #[error("sample index {index} is out of range for a dataset of {len} samples")]
    IndexOutOfRange {
        /// The index asked for.
        index: u64,
        /// The number of samples in the dataset.
        len: u64,
    },

    /// A dataset index that would not fit the compact in-memory layout.
    #[error("dataset under {0} is too large to index (more than 2^32 folders or classes)")]
    TooLarge(PathBuf),

    /// The generator was asked for something it cannot make.
    #[error("invalid synthetic dataset spec: {0}")]
    InvalidSpec(String),

    /// A dataset manifest could not be read or written.
    #[error("bad dataset manifest {path}: {source}")]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// Why it could not be parsed or written.
        source: serde_json::Error,
    },

    /// A dataset could not be written (the generator, tar shards, Parquet files).
    #[error(transparent)]
    Write(#[from] WriteError),

    /// A tar shard set path names a folder without any `*.tar` file.
    #[error("found no *.tar shard in {0}")]
    NoShards(PathBuf),

    /// Tar shards were found but no member group formed a complete sample (image + label).
    #[error(
        "found no complete sample (an image member and a .cls or .json label member with the \
         same key) in the tar shards at {path}{}",
        if *problems == 0 { String::new() } else { format!(
            "; {problems} member(s) were left out: the first ones are logged (a sample's \
             members share the key before the first dot of their names, so img.0.jpg has the \
             key img; a .cls member holds an integer; a .json label holds an integer label \
             or cls field)"
        ) }
    )]
    NoTarSamples {
        /// The shards' folder, pattern or prefix.
        path: PathBuf,
        /// Members or samples left out while indexing.
        problems: u64,
    },

    /// A tar member's data runs past the end of its shard: the shard was cut short.
    #[error(
        "tar shard {shard} is truncated: member {member} needs {size} bytes but only {available} \
         are left in the file"
    )]
    TruncatedMember {
        /// The shard file.
        shard: PathBuf,
        /// The member's path inside the shard.
        member: String,
        /// The member's size according to its header.
        size: u64,
        /// The bytes of the member present in the file.
        available: u64,
    },

    /// A sample whose encoded bytes are more than [`crate::MAX_SAMPLE_BYTES`]: no image within
    /// the decoders' pixel limit is that large, and read whole on each decode thread it would
    /// take the process's memory first.
    #[error("{what} is {bytes} bytes, more than the {} GiB a sample may take", crate::MAX_SAMPLE_BYTES >> 30)]
    SampleTooLarge {
        /// The sample (a file, or a shard's member).
        what: String,
        /// Its size.
        bytes: u64,
    },

    /// Reading a tar member failed for another reason than truncation.
    #[error("cannot read member {member} of tar shard {shard}: {source}")]
    ShardRead {
        /// The shard file.
        shard: PathBuf,
        /// The member's path inside the shard.
        member: String,
        /// What the operating system reported.
        source: std::io::Error,
    },

    /// An argument out of range (a window length).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A source pattern that cannot be read: an unbalanced brace, a bad range or glob, or one
    /// that names too many files.
    #[error("source pattern {pattern}: {problem}")]
    BadSourcePattern {
        /// The pattern as written.
        pattern: String,
        /// What is wrong with it.
        problem: String,
    },

    /// A glob pattern that matches no file (or whose folder does not exist).
    #[error("source pattern {pattern} matches no file in {}", folder.display())]
    NoMatch {
        /// The pattern as written (after brace expansion).
        pattern: String,
        /// The folder it was looked for in.
        folder: PathBuf,
    },

    /// A file a brace pattern names does not exist.
    #[error("{} does not exist (named by the source pattern {pattern})", path.display())]
    ListedFileMissing {
        /// The missing file.
        path: PathBuf,
        /// The pattern that named it.
        pattern: String,
    },

    /// A list or pattern that names a folder: they name files; a folder is a source alone.
    #[error(
        "{} is a folder: a list or pattern of sources names files ({source_name}); pass a \
         folder as the whole source",
        path.display()
    )]
    FolderInList {
        /// The folder.
        path: PathBuf,
        /// The source as written.
        source_name: String,
    },

    /// A named file whose name is of no format Stoker reads from a list of files.
    #[error(
        "{} (named by {source_name}) is not a data file Stoker reads from a list: name .tar \
         shards, .parquet, .jsonl[.gz|.zst] or one .bin token file",
        path.display()
    )]
    NotADataFile {
        /// The source as written.
        source_name: String,
        /// The file.
        path: PathBuf,
    },

    /// Files of several formats named as one source.
    #[error(
        "{source_name} mixes formats: {first} and {second}; name files of one format (a \
             pattern), or the format (Python's format=); mix sources of several with stoker.mix"
    )]
    MixedFormats {
        /// The source as written.
        source_name: String,
        /// A file of the first format, with its format.
        first: String,
        /// A file of another format, with its format.
        second: String,
    },

    /// A source holding several splits, with none named: it is never read whole.
    #[error(
        "{source_name} holds the splits {}: name one with split= (e.g. split=\"{}\"; --split \
         on the command line)",
        found.join(", "),
        found.iter().find(|s| s.as_str() == "train")
            .or(found.iter().find(|s| !s.starts_with('(')))
            .map_or("train", String::as_str)
    )]
    SplitNeeded {
        /// The source as written.
        source_name: String,
        /// The splits found, sorted.
        found: Vec<String>,
    },

    /// A split asked for that the source does not hold.
    #[error(
        "{source_name} has no split {split:?}; {}",
        if found.is_empty() { "it is not laid out by split (leave split out)".to_string() }
        else { format!("its splits are {}", found.join(", ")) }
    )]
    NoSuchSplit {
        /// The source as written.
        source_name: String,
        /// The split asked for.
        split: String,
        /// The splits it holds (none: not a split layout).
        found: Vec<String>,
    },

    /// A split named both by a folder's files and by a subfolder of it (`train.parquet` beside
    /// `train/`): reading one would leave the other out, reading both might repeat rows.
    #[error(
        "{source_name} holds the {split:?} split twice: files named so, and the folder {}; \
         keep one, or name the files to read with a pattern",
        folder.display()
    )]
    SplitTwice {
        /// The folder.
        source_name: String,
        /// The split.
        split: String,
        /// The subfolder named as the split.
        folder: PathBuf,
    },

    /// A split of a folder whose hub shards (`train-00000-of-00003.*`) are not one whole set:
    /// one missing (a download cut short) or of two sets (a new export over an older one).
    #[error("{source_name}: the {split:?} split's shards are not one whole set: {problem}")]
    ShardSet {
        /// The folder.
        source_name: String,
        /// The split.
        split: String,
        /// What is missing or extra.
        problem: String,
    },

    /// Labels a dataset cannot be read with: negative, or too many classes to number.
    #[error(transparent)]
    Labels(#[from] LabelError),

    /// A token file or a Megatron corpus that cannot be read as one.
    #[error(transparent)]
    Tokens(#[from] TokenError),

    /// A tar set's index too large to write, or a set an upload left unfinished.
    #[error(transparent)]
    TarSet(#[from] TarSetError),

    /// An MDS dataset's `index.json` or shard that cannot be read: cut short, inconsistent
    /// with its index, or using what Stoker does not read.
    #[error("{}: {problem}", path.display())]
    Mds {
        /// The index or shard file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },

    /// A file read by position ends before a range its index promises: it was truncated or
    /// replaced after the dataset was opened. The dataset no longer is the one the job planned
    /// over, so this, like the two below, is never one bad sample.
    #[error(
        "{path} changed under the running job: it was opened with {opened_len} bytes but now \
         ends before byte {end} (truncated or replaced after the dataset was opened)"
    )]
    FileChanged {
        /// The file.
        path: PathBuf,
        /// Its length when the dataset was opened.
        opened_len: u64,
        /// The end of the range that could not be read.
        end: u64,
    },

    /// A file read by position is not the one the dataset was opened with (another file, or
    /// another size): replaced or rewritten, its index's offsets may point into other bytes.
    #[error(
        "{path} was replaced or rewritten under the running job: it is not the file the \
         dataset was opened with ({opened_len} bytes then, {now_len} now)"
    )]
    FileReplaced {
        /// The file.
        path: PathBuf,
        /// Its length when the dataset was opened.
        opened_len: u64,
        /// Its length now.
        now_len: u64,
    },

    /// A file read by position was removed under the running job (found gone when reopened).
    #[error("{path} was removed under the running job (the dataset was opened with it)")]
    FileRemoved {
        /// The file.
        path: PathBuf,
    },

    /// A JSONL dataset path names a folder without any JSONL file.
    #[error("found no JSONL file (*.jsonl, *.jsonl.gz, *.jsonl.zst) in {0}")]
    NoJsonlFiles(PathBuf),

    /// A compressed file could not be decompressed: damaged or cut short, or its content
    /// would not fit the cache tier's cap.
    #[error("cannot decompress {path}: {source}")]
    Decompress {
        /// The compressed file.
        path: PathBuf,
        /// What the decoder (or the capped copy) reported.
        source: std::io::Error,
    },

    /// The JSONL files hold no non-blank line.
    #[error("found no document (non-blank line) in the JSONL files at {0}")]
    EmptyJsonl(PathBuf),

    /// One record (a JSONL line) cannot be used: not JSON, not an object, no text field.
    #[error("{}:{line}: {reason}", path.display())]
    MalformedRecord {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// What is wrong.
        reason: String,
    },
    /// A Parquet dataset path names a folder without any `*.parquet` file.
    #[error("found no *.parquet file in {0}")]
    NoParquetFiles(PathBuf),

    /// The Parquet files of a dataset hold no row.
    #[error("the parquet files at {0} hold no row")]
    NoParquetRows(PathBuf),

    /// A Parquet file's footer (its metadata) cannot be read: the file is truncated, is not
    /// Parquet, or its metadata is corrupt.
    #[error("cannot read the parquet file {path}: {source}")]
    ParquetFile {
        /// The Parquet file.
        path: PathBuf,
        /// What the Parquet reader reported.
        source: parquet::errors::ParquetError,
    },

    /// A row group could not be read or decoded (corrupt pages, a file cut short or changed
    /// since it was opened).
    #[error(
        "cannot decode row group {row_group} (rows {first_row}..{end_row}) of the parquet file \
         {path}: {source}"
    )]
    ParquetRowGroup {
        /// The Parquet file.
        path: PathBuf,
        /// The row group's number inside the file.
        row_group: usize,
        /// The file row of the group's first row.
        first_row: u64,
        /// One past the file row of the group's last row.
        end_row: u64,
        /// What the Parquet reader reported.
        source: parquet::errors::ParquetError,
    },

    /// A Parquet file lacks a column the dataset needs, holds it with an unusable type, or is
    /// compressed with a codec not read.
    #[error("parquet file {path}: {problem}")]
    ParquetColumn {
        /// The Parquet file.
        path: PathBuf,
        /// What is wrong with which column, in words.
        problem: String,
    },

    /// A cell the dataset needs is null.
    #[error("row {row} of the parquet file {path} has no value (null) in column {column}")]
    ParquetNullCell {
        /// The Parquet file.
        path: PathBuf,
        /// The column.
        column: String,
        /// The row inside the file.
        row: u64,
    },

    /// A value does not fit the type asked for (an unsigned 64-bit label over `i64::MAX`).
    #[error("row {row} of the parquet file {path}: the value in column {column} {problem}")]
    ParquetValue {
        /// The Parquet file.
        path: PathBuf,
        /// The column.
        column: String,
        /// The row inside the file.
        row: u64,
        /// What is wrong with the value.
        problem: String,
    },

    /// A Hugging Face `datasets` folder whose layout or features Stoker cannot use: a missing
    /// or malformed `state.json` / `dataset_info.json`, shards that differ, or columns missing
    /// or of an unusable type.
    #[error("hugging face dataset {path}: {problem}")]
    HfDataset {
        /// The folder, or the file of it concerned.
        path: PathBuf,
        /// What is wrong, in words.
        problem: String,
    },

    /// The path is a `DatasetDict` folder (one subfolder per split), not one dataset.
    #[error(
        "{path} is a hugging face DatasetDict with the splits {}: open one split's folder, \
         e.g. {}",
        splits.join(", "),
        path.join(splits.first().map_or("train", String::as_str)).display()
    )]
    HfDatasetDict {
        /// The folder holding `dataset_dict.json`.
        path: PathBuf,
        /// Its splits, as `dataset_dict.json` lists them.
        splits: Vec<String>,
    },

    /// An Arrow IPC stream file (a `save_to_disk` shard) that cannot be read: truncated,
    /// corrupt, or using a feature Stoker does not read (compressed or dictionary batches).
    #[error("cannot read the arrow stream file {path}: {problem}")]
    ArrowStream {
        /// The `.arrow` file.
        path: PathBuf,
        /// What is wrong, in words.
        problem: String,
    },

    /// A cell of a Hugging Face dataset that cannot be used: null where a value is needed, or
    /// a value that does not fit the type asked for.
    #[error("row {row} of the arrow file {path}, column {column}: {problem}")]
    HfValue {
        /// The `.arrow` file.
        path: PathBuf,
        /// The column.
        column: String,
        /// The row inside the file.
        row: u64,
        /// What is wrong with the value.
        problem: String,
    },
    /// A dataset URI names a scheme Stoker cannot read.
    #[error(
        "cannot read {uri}: the scheme {scheme}:// is not supported; use a local path, \
         file://PATH or s3://BUCKET/PREFIX"
    )]
    UnsupportedScheme {
        /// The URI as given.
        uri: String,
        /// Its scheme.
        scheme: String,
    },

    /// A dataset URI that cannot be parsed.
    #[error("invalid dataset uri {uri}: {reason}")]
    InvalidUri {
        /// The URI as given.
        uri: String,
        /// What is wrong with it.
        reason: String,
    },

    /// An object store request failed (after its retries).
    #[error(
        "object store request for {uri} failed: {source}{}",
        credentials::hint(source)
    )]
    ObjectStore {
        /// The object or prefix the request was about.
        uri: String,
        /// What the object store client reported.
        source: object_store::Error,
    },

    /// An `s3://` dataset in a build without an S3 client (stoker-datasets' `s3` feature off).
    #[error(
        "cannot read {uri}: this build has no S3 client (stoker-datasets was built without \
         its `s3` feature)"
    )]
    NoS3Client {
        /// The bucket asked for.
        uri: String,
    },

    /// A tar index object (`stoker index`) that cannot be decoded.
    #[error("the tar index {uri} is unusable ({reason}); write it again with `stoker index`")]
    BadTarIndex {
        /// The index object.
        uri: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A prefix of an object store holds no object the format reads.
    #[error("found no {what} under {uri}")]
    NoRemoteObjects {
        /// The prefix listed.
        uri: String,
        /// What was looked for, in words.
        what: String,
    },

    /// A downloaded object does not have the size its listing announced.
    #[error("object {uri} should hold {expected} bytes but {received} arrived")]
    IncompleteObject {
        /// The object.
        uri: String,
        /// The size the listing gave.
        expected: u64,
        /// The bytes received.
        received: u64,
    },

    /// An object a job listed was read again (a range not in the cache, a whole object) and the
    /// store holds another version of it now (it was rewritten since the listing).
    #[error(
        "object {uri} changed in the store since the job listed it (a read found another \
         version): the dataset was rewritten while the job ran; restart the job to read the new \
         version"
    )]
    ObjectChanged {
        /// The object.
        uri: String,
    },

    /// Another process held a cache entry's lock for longer than the deadline.
    #[error(
        "waited {waited_seconds} s for the lock of cache entry {path} (another process is \
         fetching or evicting it; a whole object is waited for while its download writes): \
         raise STOKER_CACHE_LOCK_TIMEOUT_SECS (default 600) or check that process"
    )]
    CacheLockTimeout {
        /// The entry's lock file.
        path: PathBuf,
        /// How long the wait lasted.
        waited_seconds: u64,
    },

    /// The cache tier's configuration (environment variables or options) is invalid.
    #[error("invalid object cache setting: {0}")]
    CacheConfig(String),
    /// An AWS profile's credentials could not be used.
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

pub use credentials::CredentialsError;
pub use fault::ReadFault;
pub use labels::LabelError;
pub use tar_sets::TarSetError;
pub use tokens::TokenError;
pub use writing::WriteError;

#[cfg(test)]
mod tests {
    use super::*;

    fn io_error(code: i32) -> Error {
        Error::io("/data/x", std::io::Error::from_raw_os_error(code))
    }

    #[test]
    fn resource_and_storage_failures_are_not_the_samples_fault() {
        for code in [libc::EMFILE, libc::ENFILE, libc::ENOMEM, libc::ENOBUFS] {
            assert_eq!(io_error(code).read_fault(), ReadFault::Resource, "{code}");
        }
        for code in [libc::EIO, libc::ENOSPC, libc::ESTALE] {
            assert_eq!(io_error(code).read_fault(), ReadFault::Source, "{code}");
        }
        let changed = Error::FileChanged {
            path: "/data/tokens.bin".into(),
            opened_len: 100,
            end: 80,
        };
        assert_eq!(changed.read_fault(), ReadFault::Source);
        assert!(changed.to_string().contains("/data/tokens.bin"));
        let shard = Error::ShardRead {
            shard: "/data/a.tar".into(),
            member: "x.jpg".into(),
            source: std::io::Error::from_raw_os_error(libc::EMFILE),
        };
        assert_eq!(shard.read_fault(), ReadFault::Resource);
    }

    /// A worker hands a batch back for a failure of its own storage (another worker may build
    /// it), never for a dataset changed under the job, which every worker sees: an object
    /// gone since the listing is such a change, a store refusing the worker is not.
    #[test]
    fn a_dataset_changed_under_the_job_is_told_from_a_storage_failure() {
        let store = |source| Error::ObjectStore {
            uri: "s3://data/train/a.tar".into(),
            source,
        };
        let gone = store(object_store::Error::NotFound {
            path: "train/a.tar".into(),
            source: "404".into(),
        });
        assert!(gone.dataset_changed() && gone.read_fault() == ReadFault::Source);
        let refused = store(object_store::Error::PermissionDenied {
            path: "train/a.tar".into(),
            source: "403".into(),
        });
        assert!(!refused.dataset_changed() && refused.read_fault() == ReadFault::Source);
        let changed = Error::FileReplaced {
            path: "/data/a.mds".into(),
            opened_len: 10,
            now_len: 12,
        };
        assert!(changed.dataset_changed());
        assert!(!io_error(libc::EIO).dataset_changed());
    }

    #[test]
    fn a_cache_file_that_cannot_be_used_is_never_the_samples_fault() {
        let cache = |code| {
            Error::cache(
                "/cache/s3/bucket/k.stoker-lock",
                std::io::Error::from_raw_os_error(code),
            )
        };
        // Errors that are a sample's own on its file are the cache's on the cache's files.
        for code in [
            libc::EACCES,
            libc::ENOENT,
            libc::ENAMETOOLONG,
            libc::EISDIR,
            libc::ENOSYS,
        ] {
            assert_eq!(io_error(code).read_fault(), ReadFault::Sample, "{code}");
            assert_eq!(cache(code).read_fault(), ReadFault::Source, "{code}");
        }
        assert_eq!(cache(libc::EMFILE).read_fault(), ReadFault::Resource);
        assert!(cache(libc::EACCES)
            .to_string()
            .contains("the cache tier cannot use"));
    }

    #[test]
    fn a_missing_or_cut_short_sample_is_the_samples_fault() {
        assert_eq!(io_error(libc::ENOENT).read_fault(), ReadFault::Sample);
        let truncated = Error::TruncatedMember {
            shard: "/data/a.tar".into(),
            member: "x.jpg".into(),
            size: 10,
            available: 4,
        };
        assert_eq!(truncated.read_fault(), ReadFault::Sample);
    }
}
