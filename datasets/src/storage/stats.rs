//! What the cache tier has done: the live counters shared by fetches, downloads and evictions,
//! and their [`CacheStats`] snapshot.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::cache_stats::CacheStats;

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
    pub(super) read_ahead: AtomicU64,
    /// Range reads that went past the cache because it could not hold them (its disk full,
    /// an entry locked past the deadline): logged at 1, 2, 4, 8... so a full disk does not
    /// flood the log.
    pub(super) past_cache: AtomicU64,
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
            read_ahead: load(&self.read_ahead),
        }
    }
}
