//! The samples a job's threads are reading right now: what a loader's timeout names when a read
//! hangs (a stalled network file system, an object store that does not answer), so the message
//! says which file the batch waits for.
//!
//! A read claims a free slot (a compare-exchange, from a slot the thread first tried) and gives
//! it back when done; slots sit on cache lines of their own, so threads reading at once do not
//! share one. Nothing is timed or allocated on the read path.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Slots: reads in progress at once that can be named (more are not marked).
const SLOTS: usize = 128;

/// Indices at or past this are not marked (the source number takes the bits above).
const INDEX_LIMIT: u64 = 1 << 48;

/// One slot, alone on its cache line (128 bytes: two 64-byte lines, as adjacent-line
/// prefetchers pair them).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Slot(AtomicU64);

/// The reads in progress.
#[derive(Debug)]
pub struct ReadWatch {
    /// `(source << 48 | index) + 1` of the read holding the slot; 0 when free.
    slots: Box<[Slot]>,
}

impl Default for ReadWatch {
    fn default() -> Self {
        ReadWatch {
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
        }
    }
}

/// A read marked in a [`ReadWatch`]; its slot is freed when this is dropped.
pub(crate) struct Reading<'a> {
    slot: &'a AtomicU64,
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        // The slot is this read's alone since it was claimed.
        self.slot.store(0, Ordering::Relaxed);
    }
}

/// Threads seen so far, for the slot each tries first.
static THREADS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The slot this thread tries first (threads spread over the slots in turn).
    static FIRST_SLOT: usize = THREADS.fetch_add(1, Ordering::Relaxed) % SLOTS;
}

impl ReadWatch {
    /// Marks sample `index` of source `source` (0 for a job of one dataset, the mix's source
    /// number otherwise) as being read on this thread, until the guard is dropped; nothing
    /// when every slot is taken.
    pub(crate) fn mark(&self, source: u16, index: u64) -> Option<Reading<'_>> {
        if index >= INDEX_LIMIT {
            return None;
        }
        let value = ((u64::from(source) << 48) | index) + 1;
        let first = FIRST_SLOT.with(|slot| *slot);
        (0..SLOTS).find_map(|k| {
            let slot = &self.slots[(first + k) % SLOTS].0;
            // `then`, not `then_some`: a guard made for a slot not taken would free it.
            slot.compare_exchange(0, value, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
                .then(|| Reading { slot })
        })
    }

    /// The reads in progress now, as (source, index).
    pub fn now(&self) -> Vec<(u16, u64)> {
        self.slots
            .iter()
            .map(|slot| slot.0.load(Ordering::Relaxed))
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
    fn reads_that_start_on_one_slot_take_others_and_never_clear_each_other() {
        let watch = ReadWatch::default();
        // One thread holding many reads at once: each takes a slot of its own.
        let mut held: Vec<_> = (0..SLOTS as u64).map(|i| watch.mark(0, i)).collect();
        assert!(held.iter().all(Option::is_some));
        assert!(watch.mark(0, 999).is_none(), "every slot taken");
        let first = held.remove(0);
        drop(held); // all but the first let go
        assert_eq!(watch.now(), vec![(0, 0)]);
        drop(first);
        assert!(watch.now().is_empty());
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
            let mut now = watch.now();
            barrier.wait(); // all four read before any lets go
            now.sort_unstable();
            now
        });
        assert!(seen
            .iter()
            .all(|now| *now == vec![(0, 0), (0, 1), (0, 2), (0, 3)]));
        assert!(watch.now().is_empty());
        Ok(())
    }
}
