//! Where dataset bytes live: local paths, or objects in S3-compatible stores read through a
//! local cache tier on disk.
//!
//! - [`parse_dataset_uri`]: a plain path, `file://PATH` or `s3://BUCKET/PREFIX`; any other
//!   scheme is refused with an error naming the supported ones.
//! - [`ObjectCache`]: whole remote objects materialised as local files (parallel ranged GETs
//!   of [`DEFAULT_PART_SIZE`], retried with backoff; size cap with LRU eviction; safe for
//!   concurrent threads and processes; survives restarts) with hit / miss / byte counters
//!   ([`CacheStats`](crate::CacheStats)). [`ObjectCache::fetch`] turns a URI into local paths, the step any
//!   format can build on.
//! - [`RemoteTarShards`]: tar shards under an `s3://` prefix, as a [`SampleSource`].
//! - `derived_copy`: a file made once from a local file (a compressed JSONL file
//!   decompressed) and kept in the same tier, under the same cap and locks.
//!
//! Design choice: whole-object caching, fetched at open. A shard's sample count must be known
//! when the epoch is planned, and a tar shard's index needs its headers, which are spread over
//! the whole file; fetching the shards at open (all of them in parallel) and indexing the local
//! copies keeps the reading path exactly the local one. The price is that a dataset larger than
//! the cache cap is still fetched whole (the entries are locked while it is indexed, so the cap
//! is exceeded with a warning; afterwards an entry is locked only while its file is open in the
//! pool of open files, and one evicted meanwhile is fetched again when next read). Lazy per-shard fetching, with the counts taken from the cached index
//! files, is the next step for sets larger than the local disk.
//!
//! Credentials and endpoint come from the standard environment variables (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL`...; see [`S3Settings`]); the
//! cache from `STOKER_CACHE_DIR` and `STOKER_CACHE_MAX_BYTES` (see
//! [`ObjectCacheOptions::from_env`]).
//!
//! [`SampleSource`]: crate::SampleSource

mod cache;
mod derived;
mod download;
mod entry;
mod entry_lock;
mod eviction;
mod options;
mod remote_tar;
mod stats;
mod uri;

pub use cache::ObjectCache;
pub(crate) use derived::derived_copy;
pub use entry::CachedObject;
pub use options::{
    ObjectCacheOptions, S3Settings, DEFAULT_CONCURRENCY, DEFAULT_MAX_BYTES, DEFAULT_PART_SIZE,
};
pub use remote_tar::RemoteTarShards;
pub use uri::{parse_dataset_uri, DatasetLocation, RemoteLocation};
