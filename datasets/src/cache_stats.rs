//! The figures of the local cache tier ([`CacheStats`]): what the storage layer counts and what
//! a [`SampleSource`](crate::SampleSource) read through it reports. A module of its own so the
//! source interface needs nothing from storage, which implements sources.

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
    /// Byte ranges fetched ahead of their reads (a source's read-ahead); a read that then
    /// finds one counts as a hit. Not counted in `hits` and `misses`, which count reads.
    pub read_ahead: u64,
}

impl CacheStats {
    /// The share of lookups by reads that the cache served (0 without lookups).
    pub fn hit_rate(&self) -> f64 {
        let lookups = self.hits + self.misses;
        if lookups == 0 {
            0.0
        } else {
            self.hits as f64 / lookups as f64
        }
    }
}

impl std::fmt::Display for CacheStats {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "object cache: {} hits, {} misses, {} bytes fetched, {} bytes from cache, \
             {} requests, {} retries, {} evictions ({} bytes), {} read ahead",
            self.hits,
            self.misses,
            self.bytes_fetched,
            self.bytes_from_cache,
            self.requests,
            self.retries,
            self.evictions,
            self.bytes_evicted,
            self.read_ahead
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_every_figure() {
        let stats = CacheStats {
            evictions: 2,
            bytes_evicted: 300,
            read_ahead: 4,
            ..CacheStats::default()
        };
        let line = stats.to_string();
        assert!(line.contains("2 evictions (300 bytes)"), "{line}");
        assert!(line.contains("4 read ahead"), "{line}");
    }
}
