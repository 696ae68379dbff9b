//! Stoker's data sources: where samples come from before workers decode them.
//!
//! - [`SampleSource`]: the interface the pipeline reads through, samples addressed by a dense
//!   index `0..len` with a label each.
//! - [`ImageFolder`]: a `root/<class>/**/<image>` tree indexed exactly like torchvision's
//!   `datasets.ImageFolder`, so sample `i` and its label match a PyTorch run.
//! - [`TarShards`]: WebDataset-style tar shards read by random access through a cached index;
//!   [`write_tar_shards`] writes any source in that layout.
//! - [`TokenFile`]: a nanoGPT-style token array served as windows of `seq_len + 1` tokens,
//!   copied out of a read-only memory map (a file cut short under a job is an error naming it,
//!   not SIGBUS: `mapped_file/`); [`write_synthetic_tokens`] writes a seeded one.
//! - [`JsonlDocuments`]: JSON Lines documents, one sample per line, read as UTF-8 text.
//! - [`ParquetDataset`]: rows of Parquet files (image bytes or text, plus labels), read by
//!   row group; [`write_parquet`] writes any source as Parquet, and
//!   [`ParquetDataset::read_f32_columns`] reads numeric columns as tensors.
//! - [`MdsDataset`]: Mosaic Streaming's MDS shards (`index.json` and `shard.NNNNN.mds`, or
//!   zstd/gz-compressed), read in place; [`write_mds`] writes the same layout.
//! - [`HfDataset`]: a Hugging Face `datasets` folder as `save_to_disk` writes it (Arrow IPC
//!   stream shards + `dataset_info.json`), its `Image`, string, `ClassLabel` and numeric
//!   features mapped to samples, labels, class names and numeric columns; read by record batch.
//! - [`local_format`]: the format a local path is read as when none is named, one rule for
//!   every reader; a folder of data files of two formats, or of data files beside image
//!   class folders, is refused by name.
//! - [`resolve_local`]: what a source names: a path, a glob (`*`, `?`, `[...]`, `**`), a brace
//!   range or list (`shard-{00000..01023}.tar`), or a list of those, resolved to files sorted
//!   alike on every machine; a folder laid out by split is read one split at a time.
//! - [`ObjectCache`], [`parse_dataset_uri`]: `s3://` sources read through
//!   a local cache tier on disk (size cap, LRU eviction, safe across processes): tar shards,
//!   Parquet, token files and Megatron corpora by ranges, JSONL and `save_to_disk` shards
//!   fetched whole, image folders an object per sample; [`remote_layout`] tells which a prefix
//!   holds.
//! - [`generate_imagenet_like`]: writes a seeded, ImageNet-like image folder for benchmarks.
//! - [`inspect_image_folder`]: format and size statistics from image headers;
//!   [`inspect_samples`] computes the same from any source's bytes.
//! - [`sniff_format`]: tells the image formats Stoker decodes (JPEG, PNG, WebP, BMP, TIFF,
//!   PBM/PGM/PPM, GIF) apart by their magic bytes, for decode decisions.
//! - [`ReadFault`]: whose fault a failed read is (the sample's, the machine's resources, or the
//!   storage's), so only a sample's own bad bytes ever count as a bad sample.
//!
//! Files read by position (tar shards, JSONL files, cached objects with their locks) are held
//! open in one bounded pool per process (`file_pool.rs`), sized from the soft descriptor limit,
//! so the number of files in a dataset is not bounded by `ulimit -n`.
//!
//! ```
//! use stoker_datasets::{
//!     generate_imagenet_like, sniff_format, ImageFolder, ImageFormat, SampleSource,
//!     SyntheticImageNetSpec,
//! };
//!
//! let out = tempfile::tempdir()?;
//! let spec = SyntheticImageNetSpec { count: 12, seed: 7, classes: 3 };
//! let generated = generate_imagenet_like(out.path(), &spec, &|_files_done| {})?;
//! assert_eq!(generated.files, 12);
//!
//! let folder = ImageFolder::open(out.path())?;
//! assert_eq!(folder.len(), 12);
//! assert_eq!(folder.class_names(), ["class_00", "class_01", "class_02"]);
//! assert_eq!(folder.label(0), 0);
//! assert_eq!(sniff_format(&folder.read(0)?), ImageFormat::Jpeg);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![cfg_attr(test, allow(clippy::unwrap_used))]

mod arrow_rows;
mod cache_stats;
mod decoder_panics;
mod error;
mod file_bytes;
mod file_pool;
mod files;
/// The fuzz targets' bodies (`fuzz/`), behind the `fuzzing` feature: the fuzz crate and this
/// crate's corpus replay tests turn it on; a build for users leaves them out.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzz_targets;
mod hf_folder;
mod image_file;
mod image_folder;
mod image_format;
mod inspect;
mod jsonl;
mod label_checks;
mod local_format;
mod mapped_file;
mod mds;
mod megatron;
mod naming;
mod parquet_files;
mod referenced_files;
/// The in-test S3 server of the integration tests, for unit tests that read private state.
#[cfg(all(test, feature = "s3"))]
#[path = "../tests/it/s3_server.rs"]
mod s3_server;
mod same_file;
mod sample_source;
mod split_names;
mod storage;
mod synthetic;
mod tar_shards;
mod token_dtype;
mod token_file;

pub use cache_stats::CacheStats;
pub use decoder_panics::without_panics;

/// The most bytes one encoded sample (an image file, a shard's member, a JSONL line) is read
/// as: 2 GiB, above any image within the decoders' default pixel limit (89,478,485 pixels of at
/// most 16 bytes each, uncompressed); a larger one is a bad sample, [`Error::SampleTooLarge`].
pub const MAX_SAMPLE_BYTES: u64 = 2 << 30;
pub use error::{
    CredentialsError, Error, LabelError, ReadFault, Result, TarSetError, TokenError, WriteError,
};
pub use hf_folder::{looks_like_hf_dataset, HfColumnInfo, HfDataset, HfFeature, HfSummary};
pub use image_folder::ImageFolder;
pub use image_format::{sniff_format, ImageFormat};
pub use inspect::{
    inspect_image_folder, inspect_samples, DatasetReport, Summary, UNREADABLE_NAMED,
};
pub use jsonl::{
    looks_like_jsonl, JsonlDocuments, JsonlReport, DEFAULT_LABEL_FIELD, DEFAULT_TEXT_FIELD,
};
pub use local_format::{local_format, LocalFormat};
pub use mds::{
    looks_like_mds, write_mds, MdsColumn, MdsDataset, MdsOptions, MdsTokenWindows, MDS_INDEX_FILE,
};
pub use megatron::{
    megatron_pair, open_megatron, open_remote_megatron, write_megatron_corpus, MegatronIndex,
    MEGATRON_INDEX_MAGIC,
};
pub use naming::{
    is_pattern, kind_of, kind_of_files, reach_of_name, remote_kind, remote_layout,
    remote_split_prefix, resolve_local, resolve_remote, FileKind, LocalSource, RemoteFiles,
    RemoteLayout,
};
pub use parquet_files::{
    looks_like_parquet, write_parquet, ColumnarSummary, ParquetColumnInfo, ParquetDataset,
    ParquetOptions, ParquetSampleKind, ParquetSummary, ParquetWriterOptions, ParquetWritten,
    CLASS_NAMES_KEY,
};
pub use referenced_files::allow_referenced_files_under;
pub use sample_source::{
    NumericColumns, NumericKind, SampleSource, TokenWindowShape, MAX_NUMBERED_CLASSES,
};
pub use storage::{
    parse_dataset_uri, CachedObject, DatasetLocation, ObjectCache, ObjectCacheOptions,
    RemoteLocation, S3Settings, DEFAULT_CONCURRENCY, DEFAULT_MAX_BYTES, DEFAULT_PART_SIZE,
};
pub use synthetic::{generate_imagenet_like, GeneratedDataset, SyntheticImageNetSpec};
pub use tar_shards::{
    check_empty_prefix, compressed_tar_shard, looks_like_tar_shards, upload_tar_set,
    write_tar_index, write_tar_shards, TarIndexStats, TarIndexWritten, TarSetUploaded, TarShards,
    TarShardsWriterOptions, TarShardsWritten, CLASSES_FILE, TAR_INDEX_OBJECT, UNFINISHED_UPLOAD,
};
pub use token_dtype::TokenDtype;
pub use token_file::{
    looks_like_token_file, write_synthetic_tokens, SyntheticTokensSpec, TokenFile, TokenFileReport,
    WiderIds, MAX_SEQ_LEN,
};
