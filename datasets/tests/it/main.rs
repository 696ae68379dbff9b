//! The datasets crate's integration tests, one binary (one link, one process): one module per
//! format or area, on temporary folders; `s3_server` is the in-test S3-compatible server the
//! object-store tests (and the loader's, through `#[path]`) start on 127.0.0.1 (both with the
//! `s3` feature, the default), `remote_names` reads `s3://` patterns, lists and splits through
//! it, `remote_folders` image folders, JSONL and `save_to_disk` folders, and `remote_mds` MDS
//! shards; `fuzz_replay`
//! replays the committed fuzz inputs of the tar, Parquet, token-file and JSONL targets.

mod fuzz_replay;
mod hf_folder;
mod image_folder;
mod jsonl;
#[cfg(feature = "s3")]
mod object_store;
mod parquet;
#[cfg(feature = "s3")]
mod remote_folders;
#[cfg(feature = "s3")]
mod remote_mds;
#[cfg(feature = "s3")]
mod remote_names;
#[cfg(feature = "s3")]
mod s3_server;
mod tar_shards;
mod token_file;
