//! A pool let go with its loaders: once the last loader over a pool is gone ([`PoolUser`]),
//! its free slots go at once and each slot still held goes as it comes back (a view of one
//! batch kept for logging held the whole pool before: its memory, its page locks and its share
//! of the pinned budget, so a loader made later found the budget held by loaders closed long
//! ago).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::memory::PinStatus;
use super::{Buffer, SlotPool};

/// A loader's use of a pool; when the last one is dropped the pool closes.
#[derive(Debug)]
pub struct PoolUser(Arc<SlotPool>);

impl Drop for PoolUser {
    fn drop(&mut self) {
        if self.0.users.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.close();
        }
    }
}

impl SlotPool {
    /// Counts a loader using the pool until the returned guard is dropped.
    pub fn user(self: &Arc<Self>) -> PoolUser {
        self.users.fetch_add(1, Ordering::AcqRel);
        PoolUser(Arc::clone(self))
    }

    /// Whether the pool was closed: it hands out no slot, and lets go of each that comes back.
    pub fn is_closed(&self) -> bool {
        self.state.lock().is_ok_and(|state| state.closed)
    }

    /// No loader uses the pool any more: the free slots are let go, the slots never made give
    /// their part of the pinned budget back, and every slot in use goes as it comes back
    /// ([`SlotPool::retire`]).
    fn close(&self) {
        if std::process::id() != self.owner {
            // A forked child's copy of the pool: the slots are the parent's (see `give_back`).
            return;
        }
        let (free, never_made) = {
            let Ok(mut state) = self.state.lock() else {
                return;
            };
            state.closed = true;
            (
                std::mem::take(&mut state.free),
                self.capacity.saturating_sub(state.allocated),
            )
        };
        self.give_back_share(never_made);
        for buffer in free {
            self.retire(buffer);
        }
        if let Some(beside) = self.beside_pool() {
            beside.close();
        }
        self.released.notify_all();
    }

    /// Lets go of a slot of a closed pool: unlocked if it was page-locked, its pages given back
    /// to the system, its part of the pinned budget returned; a heap buffer is freed.
    pub(super) fn retire(&self, buffer: Buffer) {
        if let (Buffer::Arena(index), Some(arena)) = (&buffer, &self.arena) {
            let locked = self.pinning.as_ref().is_some_and(|pinning| {
                pinning.slots.lock().is_ok_and(|mut slots| {
                    let status = slots.status.get_mut(*index);
                    let locked = status.as_deref() == Some(&PinStatus::Locked);
                    if let Some(status) = status {
                        // The pool's drop unlocks only the slots still marked locked.
                        *status = PinStatus::Unused;
                    }
                    locked
                })
            });
            if let (true, Some(pinning)) = (locked, &self.pinning) {
                // SAFETY: the slot was locked by `pin_for_hand_out` and is back in the pool,
                // which a slot is only after the fences of the copies reading it; marked
                // unused above, it is not unlocked again.
                unsafe { pinning.locker.unlock(self.arena_start(*index)) };
            }
            arena.release_pages(*index);
        }
        self.give_back_share(1);
    }

    /// Gives `slots` slots' part of the pinned budget back (a pool that pins).
    fn give_back_share(&self, slots: usize) {
        let (Some(pinning), Some(arena)) = (&self.pinning, &self.arena) else {
            return;
        };
        if let Ok(mut share) = pinning.share.lock() {
            share.shrink((slots as u64).saturating_mul(arena.stride as u64));
        }
    }
}
