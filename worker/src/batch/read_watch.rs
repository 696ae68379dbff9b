//! The samples a job's threads are reading right now: what a loader's timeout names when a read
//! hangs (a stalled network file system, an object store that does not answer), so the message
//! says which file the batch waits for.
//!
//! Each read marks a slot of its thread (one relaxed atomic store before and one after); nothing
//! is timed or allocated on the read path.

use std::sync::atomic::{AtomicU64, Ordering};

/// Slots; a pool of more threads shares them (a slot then shows one of its threads' reads).
const SLOTS: usize = 256;

/// Indices at or past this are not marked (the source number takes the bits above).
const INDEX_LIMIT: u64 = 1 << 48;

/// The reads in progress, by thread.
#[derive(Debug)]
pub struct ReadWatch {
    /// `(source << 48 | index) + 1` of the read in progress; 0 when none.
    reading: Box<[AtomicU64]>,
}

impl Default for ReadWatch {
    fn default() -> Self {
        ReadWatch {
            reading: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

/// A read marked in a [`ReadWatch`]; unmarked when dropped.
pub(crate) struct Reading<'a> {
    slot: &'a AtomicU64,
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.slot.store(0, Ordering::Relaxed);
    }
}

impl ReadWatch {
    /// Marks sample `index` of source `source` (0 for a job of one dataset, the mix's source
    /// number otherwise) as being read on this thread, until the guard is dropped.
    pub(crate) fn mark(&self, source: u16, index: u64) -> Option<Reading<'_>> {
        if index >= INDEX_LIMIT {
            return None;
        }
        let thread = rayon::current_thread_index().unwrap_or(SLOTS - 1);
        let slot = &self.reading[thread % SLOTS];
        slot.store(((u64::from(source) << 48) | index) + 1, Ordering::Relaxed);
        Some(Reading { slot })
    }

    /// The reads in progress now, as (source, index), by slot.
    pub fn now(&self) -> Vec<(u16, u64)> {
        self.reading
            .iter()
            .map(|slot| slot.load(Ordering::Relaxed))
            .filter(|&marked| marked != 0)
            .map(|marked| {
                let value = marked - 1;
                ((value >> 48) as u16, value & (INDEX_LIMIT - 1))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_shows_while_it_runs_and_not_after() {
        let watch = ReadWatch::default();
        assert!(watch.now().is_empty());
        {
            let _reading = watch.mark(3, 1234);
            assert_eq!(watch.now(), vec![(3, 1234)]);
        }
        assert!(watch.now().is_empty());
        assert!(watch.mark(0, INDEX_LIMIT).is_none());
    }

    #[test]
    fn the_threads_of_a_pool_read_in_slots_of_their_own() -> Result<(), rayon::ThreadPoolBuildError>
    {
        let watch = ReadWatch::default();
        let pool = rayon::ThreadPoolBuilder::new().num_threads(4).build()?;
        let barrier = std::sync::Barrier::new(4);
        let seen = pool.broadcast(|context| {
            let _reading = watch.mark(0, context.index() as u64);
            barrier.wait(); // all four marked
            let now = watch.now();
            barrier.wait(); // all four read before any unmarks
            now.len()
        });
        assert_eq!(seen, vec![4; 4]);
        assert!(watch.now().is_empty());
        Ok(())
    }
}
