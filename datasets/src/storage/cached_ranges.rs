//! Byte ranges of objects through the cache tier: each range an entry of its own, read,
//! fetched together with its neighbours, read ahead, and read from the store past the cache
//! when the cache cannot hold it.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use object_store::ObjectMeta;
use tracing::warn;

use super::cache::{LockWait, ObjectCache, Wanted};
use super::entry::RANGES_SUFFIX;
use super::s3_client::Store;
use super::uri::RemoteLocation;
use crate::error::{Error, Result};

/// Ranges a read-ahead brings in at once (each holds two descriptors while it is fetched).
const READ_AHEAD_AT_ONCE: usize = 32;

/// How long a range read waits, in all, for entries another process (or a read-ahead) is
/// fetching before it reads the ranges from the store itself: a ranged GET takes well under
/// a second, while a stalled one is retried for minutes with the entry locked, and a decode
/// thread must not wait that out (the store still has the bytes).
const RANGE_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The entry of bytes `range` of `object`.
pub(super) fn range_wanted(object: &ObjectMeta, range: &Range<u64>) -> Wanted {
    let key = object.location.to_string();
    Wanted {
        meta: ObjectMeta {
            location: object_store::path::Path::from(format!(
                "{key}{RANGES_SUFFIX}/{}-{}",
                range.start, range.end
            )),
            size: range.end.saturating_sub(range.start),
            ..object.clone()
        },
        key,
        offset: range.start,
        object_size: object.size,
    }
}

impl ObjectCache {
    /// The bytes of `ranges` of `object` (listed under `location`), through the cache: each
    /// range is an entry of its own (`<key>.stoker-ranges/<start>-<end>`, checked against the
    /// object's ETag like a whole object, evicted like one), so a dataset larger than the cache
    /// is read piece by piece. Ranges missing from the cache are fetched together, neighbours
    /// of one object in one GET (`download::MAX_COALESCE_GAP`). When the cache cannot hold
    /// them (another process or the read-ahead holds one of the entries past [`RANGE_WAIT`],
    /// or the cache's own files fail: a full disk, a quota), the ranges are read from the
    /// store past the cache rather than failing the read: the store still has them.
    pub(super) fn read_ranges(
        &self,
        store: &Arc<Store>,
        location: &RemoteLocation,
        object: &ObjectMeta,
        ranges: &[Range<u64>],
    ) -> Result<Vec<Vec<u8>>> {
        match self.read_ranges_cached(store, location, object, ranges) {
            Err(error @ (Error::CacheLockTimeout { .. } | Error::Cache { .. })) => {
                let past = self.counters.past_cache.fetch_add(1, Ordering::Relaxed) + 1;
                if past.is_power_of_two() {
                    warn!(%error, reads_past_the_cache = past, "the cache tier cannot hold these ranges; reading them from the store");
                }
                ranges
                    .iter()
                    .map(|range| {
                        self.read_uncached(store, location, object, range.clone())
                            .map(|bytes| bytes.to_vec())
                    })
                    .collect()
            }
            read => read,
        }
    }

    /// [`ObjectCache::read_ranges`] through the cache only.
    fn read_ranges_cached(
        &self,
        store: &Arc<Store>,
        location: &RemoteLocation,
        object: &ObjectMeta,
        ranges: &[Range<u64>],
    ) -> Result<Vec<Vec<u8>>> {
        let wanted = ranges
            .iter()
            .map(|range| range_wanted(object, range))
            .collect();
        let fetched_before = self.counters.bytes_fetched.load(Ordering::Relaxed);
        let wait = LockWait::InAll(RANGE_WAIT.min(self.options.lock_timeout));
        let ready = self.materialise(store, location, wanted, true, wait)?;
        let mut out = Vec::with_capacity(ready.len());
        for (cached, range) in ready.into_iter().zip(ranges) {
            let bytes = match cached.entry().read_checked()? {
                Some(bytes) => bytes,
                None => {
                    // Torn by a crash: its metadata is gone now, so this fetches it again.
                    drop(cached);
                    let again = self.materialise(
                        store,
                        location,
                        vec![range_wanted(object, range)],
                        true,
                        wait,
                    )?;
                    let again = again.first().ok_or_else(|| Error::IncompleteObject {
                        uri: location.uri_of(object.location.as_ref()),
                        expected: range.end - range.start,
                        received: 0,
                    })?;
                    again
                        .entry()
                        .read_checked()?
                        .ok_or_else(|| Error::IncompleteObject {
                            uri: location.uri_of(object.location.as_ref()),
                            expected: range.end - range.start,
                            received: 0,
                        })?
                }
            };
            out.push(bytes);
        }
        // The bytes are read: a cap check that fails costs this read nothing.
        if let Err(error) = self.check_cap_after_fetch(fetched_before) {
            warn!(%error, "the cache tier could not check its size cap");
        }
        Ok(out)
    }

    /// Brings the ranges of `hint` into the cache (several objects at once, neighbours
    /// coalesced) without reading them: the read-ahead of `prefetch.rs`.
    pub(super) fn prefetch_ranges(
        &self,
        store: &Arc<Store>,
        location: &RemoteLocation,
        hint: &[(ObjectMeta, Vec<Range<u64>>)],
    ) -> Result<()> {
        let wanted: Vec<Wanted> = hint
            .iter()
            .flat_map(|(object, ranges)| {
                ranges.iter().map(move |range| range_wanted(object, range))
            })
            .collect();
        let fetched_before = self.counters.bytes_fetched.load(Ordering::Relaxed);
        // A few ranges at a time: each holds a lock descriptor and a part file while it is
        // fetched, and a hint is a whole batch (a thousand ranges would take two thousand
        // descriptors, past a common soft limit of 1024).
        let mut wanted = wanted.into_iter().peekable();
        while wanted.peek().is_some() {
            let some: Vec<Wanted> = wanted.by_ref().take(READ_AHEAD_AT_ONCE).collect();
            drop(self.materialise(store, location, some, false, LockWait::InAll(RANGE_WAIT))?);
        }
        self.check_cap_after_fetch(fetched_before)
    }

    /// Enforces the cap once an eighth of it was fetched (by range reads, or objects fetched
    /// again for readers that let go of them) into the folder since the last time, by any
    /// process using it (a check walks the cache folder);
    /// `fetched_before` is the byte counter before this fetch.
    pub(super) fn check_cap_after_fetch(&self, fetched_before: u64) -> Result<()> {
        let fetched = self
            .counters
            .bytes_fetched
            .load(Ordering::Relaxed)
            .saturating_sub(fetched_before);
        if self.fetch_meter.add(fetched, self.options.max_bytes / 8) {
            self.enforce_cap()?;
        }
        Ok(())
    }
}
