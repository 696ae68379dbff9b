//! What the cache tier has done: the live counters shared by fetches, downloads and evictions,
//! and the [`CacheStats`] snapshot of them that sources report.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// What the cache tier has done since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CacheStats {
    /// Objects found valid in the cache.
    pub hits: u64,
    /// Objects fetched from the store (absent, changed or damaged in the cache).
    pub misses: u64,
    /// Bytes received from the store.
    pub bytes_fetched: u64,
    /// Bytes of the objects served from the cache without a fetch.
    pub bytes_from_cache: u64,
    /// Ranged GETs sent (retries included).
    pub requests: u64,
    /// Ranged GETs tried again after a failure.
    pub retries: u64,
    /// Entries evicted to keep the cache under its cap.
    pub evictions: u64,
    /// Bytes of the evicted entries.
    pub bytes_evicted: u64,
}

impl std::fmt::Display for CacheStats {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "object cache: {} hits, {} misses, {} bytes fetched, {} bytes from cache, \
             {} requests, {} retries, {} evictions",
            self.hits,
            self.misses,
            self.bytes_fetched,
            self.bytes_from_cache,
            self.requests,
            self.retries,
            self.evictions
        )
    }
}

/// The live counters behind [`CacheStats`].
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) hits: AtomicU64,
    pub(super) misses: AtomicU64,
    pub(super) bytes_fetched: AtomicU64,
    pub(super) bytes_from_cache: AtomicU64,
    pub(super) requests: AtomicU64,
    pub(super) retries: AtomicU64,
    pub(super) evictions: AtomicU64,
    pub(super) bytes_evicted: AtomicU64,
}

impl Counters {
    /// The counters' values now.
    pub(super) fn snapshot(&self) -> CacheStats {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        CacheStats {
            hits: load(&self.hits),
            misses: load(&self.misses),
            bytes_fetched: load(&self.bytes_fetched),
            bytes_from_cache: load(&self.bytes_from_cache),
            requests: load(&self.requests),
            retries: load(&self.retries),
            evictions: load(&self.evictions),
            bytes_evicted: load(&self.bytes_evicted),
        }
    }
}
