//! A small least-recently-used cache of decoded row groups, shared by all decode threads.
//!
//! Decoding a row group costs far more than reading one row out of it, and the planner hands
//! out neighbouring rows together (a batch without shuffle, or a shuffle window over a few row
//! groups), so the groups read last are kept, up to a byte budget. Each entry has its own lock
//! held while the group is decoded: threads that want the same group at the same moment wait
//! for one decode instead of all decoding it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::error::Result;

/// Upper bound on entries, whatever their size: keeps the scans short when groups are tiny.
const MAX_ENTRIES: usize = 64;

/// One cached group: filled by the first thread that needs it.
struct Slot<V> {
    value: Mutex<Option<Arc<V>>>,
}

struct Entry<V> {
    key: usize,
    slot: Arc<Slot<V>>,
    /// Decoded size in bytes; 0 until decoded.
    bytes: usize,
}

/// Recently decoded row groups, most recent first.
pub(crate) struct RowGroupCache<V> {
    budget_bytes: usize,
    entries: Mutex<VecDeque<Entry<V>>>,
    decodes: AtomicU64,
}

/// Locks a mutex whose data stays consistent even if a holder panicked (every update is a
/// single assignment or push/pop).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<V> RowGroupCache<V> {
    /// A cache keeping decoded groups up to `budget_bytes` in all (the most recent group is
    /// always kept, whatever its size).
    pub(crate) fn new(budget_bytes: usize) -> RowGroupCache<V> {
        RowGroupCache {
            budget_bytes,
            entries: Mutex::new(VecDeque::new()),
            decodes: AtomicU64::new(0),
        }
    }

    /// Number of group decodes so far (cache misses that decoded).
    pub(crate) fn decodes(&self) -> u64 {
        self.decodes.load(Ordering::Relaxed)
    }

    /// Whether group `key` is cached or being decoded.
    pub(crate) fn holds(&self, key: usize) -> bool {
        lock(&self.entries).iter().any(|entry| entry.key == key)
    }

    /// The decoded group `key`, from the cache or from `decode`, which returns the value and
    /// its size in bytes. A failed decode is not cached: the next call tries again.
    pub(crate) fn get_or_decode(
        &self,
        key: usize,
        decode: impl FnOnce() -> Result<(V, usize)>,
    ) -> Result<Arc<V>> {
        let slot = {
            let mut entries = lock(&self.entries);
            let found = entries
                .iter()
                .position(|entry| entry.key == key)
                .and_then(|position| entries.remove(position));
            match found {
                Some(entry) => {
                    let slot = Arc::clone(&entry.slot);
                    entries.push_front(entry);
                    slot
                }
                None => {
                    let slot = Arc::new(Slot {
                        value: Mutex::new(None),
                    });
                    entries.push_front(Entry {
                        key,
                        slot: Arc::clone(&slot),
                        bytes: 0,
                    });
                    self.evict(&mut entries);
                    slot
                }
            }
        };
        let mut value = lock(&slot.value);
        if let Some(decoded) = value.as_ref() {
            return Ok(Arc::clone(decoded));
        }
        let (decoded, bytes) = decode()?;
        self.decodes.fetch_add(1, Ordering::Relaxed);
        let decoded = Arc::new(decoded);
        *value = Some(Arc::clone(&decoded));
        drop(value);
        let mut entries = lock(&self.entries);
        if let Some(entry) = entries
            .iter_mut()
            .find(|entry| Arc::ptr_eq(&entry.slot, &slot))
        {
            entry.bytes = bytes;
        }
        self.evict(&mut entries);
        Ok(decoded)
    }

    /// Drops the least recently used groups past the budget, keeping the most recent one.
    /// Threads still using an evicted group keep their reference.
    fn evict(&self, entries: &mut VecDeque<Entry<V>>) {
        let mut total: usize = entries.iter().map(|entry| entry.bytes).sum();
        while entries.len() > 1 && (total > self.budget_bytes || entries.len() > MAX_ENTRIES) {
            if let Some(evicted) = entries.pop_back() {
                total -= evicted.bytes;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn repeated_keys_decode_once_and_the_budget_evicts_the_oldest() {
        let cache = RowGroupCache::<usize>::new(250);
        for key in [0, 0, 1, 1, 0] {
            let value = cache.get_or_decode(key, || Ok((key * 10, 100))).unwrap();
            assert_eq!(*value, key * 10);
        }
        assert_eq!(cache.decodes(), 2);
        // A third group of 100 bytes passes the 250-byte budget: the oldest (1) goes.
        cache.get_or_decode(2, || Ok((20, 100))).unwrap();
        cache.get_or_decode(0, || Ok((0, 100))).unwrap();
        assert_eq!(cache.decodes(), 3);
        cache.get_or_decode(1, || Ok((10, 100))).unwrap();
        assert_eq!(cache.decodes(), 4);
    }

    #[test]
    fn a_group_larger_than_the_budget_is_still_kept_while_it_is_the_latest() {
        let cache = RowGroupCache::<u8>::new(10);
        cache.get_or_decode(5, || Ok((1, 1_000))).unwrap();
        cache.get_or_decode(5, || Ok((1, 1_000))).unwrap();
        assert_eq!(cache.decodes(), 1);
    }

    #[test]
    fn failed_decodes_are_not_cached() {
        let cache = RowGroupCache::<u8>::new(1_000);
        let failing = || Err(Error::InvalidSpec("broken".into()));
        assert!(cache.get_or_decode(1, failing).is_err());
        assert!(cache.get_or_decode(1, failing).is_err());
        assert_eq!(*cache.get_or_decode(1, || Ok((7, 1))).unwrap(), 7);
        assert_eq!(cache.decodes(), 1);
    }

    #[test]
    fn threads_wanting_the_same_group_share_one_decode() {
        let cache = RowGroupCache::<u64>::new(1 << 20);
        std::thread::scope(|scope| {
            for _ in 0..8 {
                scope.spawn(|| {
                    for key in 0..4 {
                        let value = cache
                            .get_or_decode(key, || {
                                std::thread::sleep(std::time::Duration::from_millis(5));
                                Ok((key as u64, 8))
                            })
                            .unwrap();
                        assert_eq!(*value, key as u64);
                    }
                });
            }
        });
        assert_eq!(cache.decodes(), 4);
    }
}
