//! Where dataset bytes live: local paths, or objects in S3-compatible stores read through a
//! local cache tier on disk.
//!
//! - [`parse_dataset_uri`]: a plain path, `file://PATH` or `s3://BUCKET/PREFIX`; any other
//!   scheme is refused with an error naming the supported ones.
//! - [`ObjectCache`]: whole remote objects materialised as local files (parallel ranged GETs
//!   of [`DEFAULT_PART_SIZE`], each asking for the version listed: If-Match on its ETag, so an
//!   object rewritten since is an error, not a mix of versions; retried with backoff; size cap
//!   with LRU eviction; safe for concurrent threads and processes; survives restarts) with
//!   hit / miss / byte counters ([`CacheStats`](crate::CacheStats)). [`ObjectCache::fetch`]
//!   turns a URI into local paths, the step any format can build on.
//! - What the formats read through it: tar shards under an `s3://` prefix
//!   ([`TarShards::open_remote`](crate::TarShards::open_remote), in `tar_shards/remote.rs`), each
//!   sample a ranged GET of its member through the cache, neighbouring ranges coalesced, so the
//!   cache may be smaller than the set.
//! - `RemoteObject`: one listed object read by byte ranges through the cache, which
//!   `file_bytes.rs` reads a token file's windows from as it reads a local file's, and Parquet
//!   its footers and column chunks.
//! - `derived_copy`: a file made once from a local file or an object's copy (a compressed
//!   JSONL file or MDS shard decompressed) and kept in the same tier, under the same cap and
//!   locks.
//! - `Remake` (`remake.rs`): how a copy a set's open made or fetched is had again once
//!   evicted: a set's copies are not held locked once opened (a descriptor each), so a set of
//!   more files than the descriptor limit opens.
//!
//! Design choice: the cache keeps whole objects for what is read whole (an index, a
//! compressed JSONL file) and ranges for samples read by position (`<key>.stoker-ranges/`
//! entries, each checked against the object's ETag and evicted like an object).
//!
//! The S3 client is made in one place, `s3_client.rs`, with this crate's `s3` feature (the
//! default); without it opening an `s3://` bucket fails with
//! [`Error::NoS3Client`](crate::Error::NoS3Client).
//!
//! Credentials and endpoint come from the standard environment variables (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL`...; see [`S3Settings`]), a web
//! identity they name, what those leave out from the AWS profile's shared files (`AWS_PROFILE`,
//! `~/.aws/credentials` and `~/.aws/config`: static keys, region, endpoint), then a container's
//! or the instance's role; the
//! cache from `STOKER_CACHE_DIR` and `STOKER_CACHE_MAX_BYTES` (see
//! [`ObjectCacheOptions::from_env`]).
//!
//! [`SampleSource`]: crate::SampleSource

#[cfg(feature = "s3")]
mod aws_profile;
mod cache;
mod cached_ranges;
mod derived;
mod download;
mod entry;
mod entry_lock;
mod eviction;
mod fetch_meter;
mod listed;
mod materialise;
mod options;
mod prefetch;
mod remake;
mod remote_object;
mod s3_client;
mod stats;
mod uri;

pub use cache::ObjectCache;
pub(crate) use derived::{derived_copy, DerivedSource};
pub(crate) use entry::write_atomically;
pub use entry::CachedObject;
pub(crate) use options::default_user_cache_dir;
pub use options::{
    ObjectCacheOptions, S3Settings, DEFAULT_CONCURRENCY, DEFAULT_MAX_BYTES, DEFAULT_PART_SIZE,
};
pub(crate) use prefetch::{Hint, Prefetcher};
#[cfg(test)]
pub(crate) use remake::tests::{evict_all, OneObject};
pub(crate) use remake::{open_again, Remake};
pub(crate) use remote_object::{list_remote, ByteRanges, RemoteObject};
pub(crate) use s3_client::Store;
pub(crate) use uri::s3_location;
pub use uri::{parse_dataset_uri, DatasetLocation, RemoteLocation};
