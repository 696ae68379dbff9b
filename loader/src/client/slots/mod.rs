//! Batch buffers ("slots") recycled through a bounded pool: a batch's image bytes live in a slot
//! until the last reference to them (a `Bytes`, a NumPy array, a torch tensor) is dropped, and
//! then the slot goes back to the pool. The pool never holds more than `capacity` slots, so a
//! consumer that keeps every batch alive makes the loader wait, not grow without bound.
//!
//! A pool's buffers live on the heap, or in one mapping (an arena): shared
//! ([`SlotPool::shared`]: a `memfd` that other processes map too, so they can write a batch
//! straight into its slot), and/or page-locked for a GPU ([`SlotPool::pinned`]: each slot is
//! registered with the device driver through a [`PageLocker`] once, when the first batch built
//! in it is handed out, and stays so until the pool is dropped, or closed with no loader over
//! it and the slot back (`closing`); never per batch).

use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;

mod beside;
mod closing;
mod memory;
mod page_lock;

pub use closing::PoolUser;
pub use memory::{pinned_reserved, slot_stride, PinnedPoolError, PinnedShare};
use memory::{Arena, PinSlots, PinStatus, Pinning};
pub use page_lock::PageLocker;

/// Where a slot's bytes are.
#[derive(Debug)]
enum Buffer {
    Heap(Vec<u8>),
    /// Slot `index` of the pool's arena.
    Arena(usize),
}

#[derive(Debug, Default)]
struct PoolState {
    free: Vec<Buffer>,
    /// Slots that exist (free or in use).
    allocated: usize,
    /// No loader uses the pool any more (see `closing`): it hands out no slot, and each that
    /// comes back is let go rather than kept.
    closed: bool,
}

/// A bounded pool of equally sized batch buffers.
#[derive(Debug)]
pub struct SlotPool {
    slot_bytes: usize,
    capacity: usize,
    arena: Option<Arena>,
    pinning: Option<Pinning>,
    /// A pinned pool's page-locked room for the small tensors of its batches
    /// ([`SlotPool::pin_beside`]): made when first asked for; `None` when it could not be.
    beside: OnceLock<Option<Arc<SlotPool>>>,
    state: Mutex<PoolState>,
    released: Condvar,
    /// The process that made the pool; see [`SlotPool::give_back`].
    owner: u32,
    /// The loaders using the pool ([`SlotPool::user`]).
    users: std::sync::atomic::AtomicUsize,
}

/// Where a shared pool's slots are, for another process to map them
/// ([`SlotPool::shared_memory`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedMemory {
    /// The `memfd` holding every slot (owned by the pool; valid while it lives).
    pub fd: RawFd,
    /// Its size in bytes.
    pub size: usize,
    /// A number no other pool of this process has.
    pub id: u64,
}

/// One buffer taken from a [`SlotPool`]; it returns there when dropped.
#[derive(Debug)]
pub struct Slot {
    buffer: Buffer,
    len: usize,
    pool: Arc<SlotPool>,
}

impl SlotPool {
    /// A pool of at most `capacity` buffers of `slot_bytes` bytes, allocated lazily.
    pub fn new(slot_bytes: usize, capacity: usize) -> Arc<SlotPool> {
        Arc::new(SlotPool {
            slot_bytes,
            capacity: capacity.max(1),
            arena: None,
            pinning: None,
            beside: OnceLock::new(),
            state: Mutex::new(PoolState::default()),
            released: Condvar::new(),
            owner: std::process::id(),
            users: Default::default(),
        })
    }

    /// Like [`SlotPool::new`], the slots in one shared `memfd` mapping that other processes
    /// can map ([`SlotPool::shared_memory`], [`Slot::shared_offset`]). Not in `/dev/shm`: the
    /// memory is the pool's own, freed when the pool and every mapping of it are gone. A slot
    /// given back releases its pages (they read as zeros when next written), so the pool holds
    /// the memory of the slots in use, not of every slot it ever handed out.
    pub fn shared(slot_bytes: usize, capacity: usize) -> std::io::Result<Arc<SlotPool>> {
        let capacity = capacity.max(1);
        let arena = Arena::map(slot_bytes, capacity, true)?;
        Ok(Arc::new(SlotPool {
            slot_bytes,
            capacity,
            arena: Some(arena),
            pinning: None,
            beside: OnceLock::new(),
            state: Mutex::new(PoolState::default()),
            released: Condvar::new(),
            owner: std::process::id(),
            users: Default::default(),
        }))
    }

    /// Like [`SlotPool::new`] (or [`SlotPool::shared`] when `shared`), each slot page-locked by
    /// `locker` when its first batch is handed out ([`SlotPool::pin_for_hand_out`]; a driver
    /// context is opened then, not here) and until the pool is dropped or closed and the slot
    /// back ([`SlotPool::user`]; never per batch), so
    /// copies to the device read it by DMA (and torch reports it pinned). The slots (`capacity` times `slot_stride(slot_bytes)` bytes) are
    /// reserved against `budget_bytes`, the most page-locked slot memory the pools of this
    /// process may hold together; when they do not
    /// fit, the error says how much the other pools hold. A shared pinned slot keeps its pages
    /// while it waits in the pool (a hole punched in locked memory would leave the device
    /// reading pages the process no longer sees).
    pub fn pinned(
        slot_bytes: usize,
        capacity: usize,
        shared: bool,
        locker: Arc<dyn PageLocker>,
        budget_bytes: u64,
    ) -> Result<Arc<SlotPool>, PinnedPoolError> {
        let capacity = capacity.max(1);
        let wanted = (capacity as u64).saturating_mul(slot_stride(slot_bytes) as u64);
        let share =
            PinnedShare::take(wanted, budget_bytes).map_err(|held| PinnedPoolError::Budget {
                wanted,
                budget: budget_bytes,
                held,
            })?;
        // A mapping that fails drops the share, giving it back.
        let arena = Arena::map(slot_bytes, capacity, shared).map_err(PinnedPoolError::Map)?;
        let pinning = Pinning {
            locker,
            budget_bytes,
            share: Mutex::new(share),
            slots: Mutex::new(PinSlots::default()),
        };
        Ok(Arc::new(SlotPool {
            slot_bytes,
            capacity,
            arena: Some(arena),
            pinning: Some(pinning),
            beside: OnceLock::new(),
            state: Mutex::new(PoolState::default()),
            released: Condvar::new(),
            owner: std::process::id(),
            users: Default::default(),
        }))
    }

    /// The shared mapping of a pool made by [`SlotPool::shared`], else `None`.
    pub fn shared_memory(&self) -> Option<SharedMemory> {
        let arena = self.arena.as_ref()?;
        Some(SharedMemory {
            fd: arena.fd.as_ref()?.as_raw_fd(),
            size: arena.size,
            id: arena.id,
        })
    }

    /// Most slots that will ever exist.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes per slot.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Whether the pool page-locks its slots (made by [`SlotPool::pinned`]).
    pub fn is_pinned(&self) -> bool {
        self.pinning.is_some()
    }

    /// Bytes of slot memory page-locked now (the room beside the slots included).
    pub fn pinned_bytes(&self) -> u64 {
        let (Some(pinning), Some(arena)) = (&self.pinning, &self.arena) else {
            return 0;
        };
        let slots = pinning.slots.lock().map_or(0, |s| {
            let locked = s.status.iter().filter(|&&p| p == PinStatus::Locked).count();
            (locked * arena.stride) as u64
        });
        slots + self.beside_pool().map_or(0, |beside| beside.pinned_bytes())
    }

    /// Whether no slot handed out so far was refused page-locking: false for a pool that does
    /// not pin, or where the driver refused a slot (it then stays pageable,
    /// and works as one; [`SlotPool::pin_error`] says why).
    pub fn all_pinned(&self) -> bool {
        self.pinning.as_ref().is_some_and(|p| {
            p.slots
                .lock()
                .is_ok_and(|s| !s.status.contains(&PinStatus::Failed))
        })
    }

    /// The device whose context page-locks the slots, for a pinned pool once it has locked
    /// (or tried to lock) its first slot and the context opened.
    pub fn pinned_device(&self) -> Option<usize> {
        self.pinning.as_ref().and_then(|p| p.locker.device())
    }

    /// Why the driver refused to page-lock a slot, if it did.
    pub fn pin_error(&self) -> Option<String> {
        self.pinning
            .as_ref()
            .and_then(|p| p.slots.lock().ok().and_then(|s| s.error.clone()))
    }

    /// Whether `ptr` lies in a page-locked slot of this pool, or in its page-locked room
    /// beside the slots ([`SlotPool::pin_beside`]): the tensors of a batch built apart from
    /// its slot (labels) are only once copied there.
    pub fn holds_pinned(&self, ptr: *const u8) -> bool {
        self.pinned_slot_of(ptr)
            .is_some_and(|(pinning, index)| pinning.status(index) == PinStatus::Locked)
            || self
                .beside_pool()
                .is_some_and(|beside| beside.holds_pinned(ptr))
    }

    /// Whether `ptr` lies in one of this pool's arena slots, page-locked or not (a batch's
    /// tensors built apart from its slot, such as labels, do not).
    pub fn holds(&self, ptr: *const u8) -> bool {
        self.arena
            .as_ref()
            .is_some_and(|arena| (ptr as usize).wrapping_sub(arena.base as usize) < arena.size)
    }

    /// The pinning and the slot index of `ptr`, when the pool pins and `ptr` is in its arena.
    fn pinned_slot_of(&self, ptr: *const u8) -> Option<(&Pinning, usize)> {
        let (pinning, arena) = (self.pinning.as_ref()?, self.arena.as_ref()?);
        let offset = (ptr as usize).wrapping_sub(arena.base as usize);
        (offset < arena.size).then(|| (pinning, offset / arena.stride))
    }

    /// Page-locks the slot holding `ptr` the first time a batch in it is handed out (in a
    /// pinned pool; at once otherwise, and for a slot locked before). Each slot is locked once
    /// and stays locked until the pool is dropped (or closed, once the slot is back). Locking
    /// 38 MB takes about 10 ms: done here,
    /// one slot at a time as batches go out, it never holds back the first batch behind the
    /// whole queue's slots, nor competes with the decode threads for the process's memory map
    /// all at once. A slot the driver refuses stays pageable (it still works; copies from it
    /// are slower), and the pool says so ([`SlotPool::all_pinned`], [`SlotPool::pin_error`]).
    pub fn pin_for_hand_out(&self, ptr: *const u8) {
        let (Some((pinning, index)), Some(arena)) = (self.pinned_slot_of(ptr), &self.arena) else {
            return;
        };
        let Ok(mut slots) = pinning.slots.lock() else {
            return;
        };
        if slots.status.len() <= index {
            slots.status.resize(index + 1, PinStatus::Unused);
        }
        if slots.status[index] != PinStatus::Unused {
            return;
        }
        // SAFETY: the slot's `stride` bytes lie inside the arena, which stays mapped until the
        // pool's drop unlocks every locked slot first; the status makes each lock happen once.
        let locked = unsafe { pinning.locker.lock(self.arena_start(index), arena.stride) };
        match locked {
            Ok(()) => slots.status[index] = PinStatus::Locked,
            Err(error) => {
                if slots.error.is_none() {
                    tracing::warn!(%error, slot = index, "a batch slot could not be page-locked; it stays pageable");
                    slots.error = Some(error);
                }
                slots.status[index] = PinStatus::Failed;
            }
        }
    }

    /// Slots currently handed out.
    pub fn in_use(&self) -> usize {
        self.state
            .lock()
            .map(|s| s.allocated - s.free.len())
            .unwrap_or(0)
    }

    /// A slot of `len` bytes (at most `slot_bytes`) if one is free or may still be allocated.
    pub fn try_take(self: &Arc<Self>, len: usize) -> Option<Slot> {
        let mut state = self.state.lock().ok()?;
        self.take_locked(&mut state, len)
    }

    /// Waits up to `timeout` for a slot.
    pub fn take_timeout(self: &Arc<Self>, len: usize, timeout: Duration) -> Option<Slot> {
        let mut state = self.state.lock().ok()?;
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(slot) = self.take_locked(&mut state, len) {
                return Some(slot);
            }
            let remaining = deadline.saturating_duration_since(std::time::Instant::now());
            if remaining.is_zero() {
                return None;
            }
            state = self.released.wait_timeout(state, remaining).ok()?.0;
        }
    }

    fn take_locked(self: &Arc<Self>, state: &mut PoolState, len: usize) -> Option<Slot> {
        debug_assert!(len <= self.slot_bytes);
        if state.closed {
            return None;
        }
        let buffer = match state.free.pop() {
            Some(buffer) => buffer,
            None if state.allocated < self.capacity => {
                state.allocated += 1;
                match self.arena {
                    Some(_) => Buffer::Arena(state.allocated - 1),
                    None => Buffer::Heap(vec![0u8; self.slot_bytes]),
                }
            }
            None => return None,
        };
        Some(Slot {
            buffer,
            len: len.min(self.slot_bytes),
            pool: Arc::clone(self),
        })
    }

    /// Where slot `index` of the arena starts: `stride` bytes from there are inside the
    /// mapping, since arena slots exist only in arena pools and `index < capacity`.
    fn arena_start(&self, index: usize) -> *mut u8 {
        match &self.arena {
            // SAFETY: `index * stride` is below the mapping's size (see above).
            Some(arena) => unsafe { arena.base.add(index * arena.stride) },
            None => unreachable!("arena slots come from arena pools"),
        }
    }

    fn give_back(&self, buffer: Buffer) {
        if std::process::id() != self.owner {
            // A process forked from the pool's (a checkpoint writer, a helper) let go of its
            // copy of a batch: the slot is still the parent's, its pages shared with it (a
            // `memfd`) or locked by it, and a thread of the parent may have held the pool's
            // lock at the fork. So nothing is punched, locked or returned here: the child's
            // copy of the buffer goes with it.
            return;
        }
        let locked = |index: usize| {
            self.pinning
                .as_ref()
                .is_some_and(|p| p.status(index) == PinStatus::Locked)
        };
        if let (Buffer::Arena(index), Some(arena)) = (&buffer, &self.arena) {
            if arena.fd.is_some() {
                if locked(*index) {
                    // Locked pages stay: see `SlotPool::pinned`.
                    return self.put_free(buffer);
                }
                // A shared slot's pages go back to the system while it waits in the pool, so
                // the memory held follows the batches alive (being written, waiting or held),
                // as memory freed batch by batch would, not the most the pool ever had at once.
                arena.release_pages(*index);
            }
        }
        self.put_free(buffer);
    }

    fn put_free(&self, buffer: Buffer) {
        let retired = match self.state.lock() {
            Ok(mut state) if !state.closed => {
                state.free.push(buffer);
                None
            }
            _ => Some(buffer),
        };
        match retired {
            Some(buffer) => self.retire(buffer),
            None => self.released.notify_all(),
        }
    }
}

impl Drop for SlotPool {
    fn drop(&mut self) {
        let Some(pinning) = &self.pinning else {
            return;
        };
        if std::process::id() != self.owner {
            // The parent's pages, locked through the parent's driver context (see `give_back`).
            return;
        }
        let status = pinning
            .slots
            .lock()
            .map(|s| s.status.clone())
            .unwrap_or_default();
        for (index, _) in status
            .iter()
            .enumerate()
            .filter(|(_, &s)| s == PinStatus::Locked)
        {
            // SAFETY: the slot was locked by `pin_for_hand_out`; every slot is back (slots hold
            // the pool), and a slot comes back only after the fences of the copies reading it.
            unsafe { pinning.locker.unlock(self.arena_start(index)) };
        }
        // The pool's share of the pinned budget goes back as `pinning` drops, after this.
    }
}

impl Slot {
    /// Uses the first `len` bytes of the buffer (at most the slot's size).
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.capacity());
    }

    /// The buffer's size, whatever length is in use.
    pub fn capacity(&self) -> usize {
        match &self.buffer {
            Buffer::Heap(buffer) => buffer.len(),
            Buffer::Arena(_) => self.pool.slot_bytes,
        }
    }

    /// Where the slot starts in its pool's shared mapping, for a pool made by
    /// [`SlotPool::shared`].
    pub fn shared_offset(&self) -> Option<usize> {
        match (&self.buffer, &self.pool.arena) {
            (Buffer::Arena(index), Some(arena)) if arena.fd.is_some() => Some(index * arena.stride),
            _ => None,
        }
    }

    /// The shared mapping the slot lies in and its offset there, for a pool made by
    /// [`SlotPool::shared`].
    pub fn shared_place(&self) -> Option<(SharedMemory, usize)> {
        Some((self.pool.shared_memory()?, self.shared_offset()?))
    }

    /// The slot's bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match &mut self.buffer {
            Buffer::Heap(buffer) => &mut buffer[..self.len],
            // SAFETY: the range is this slot's (see `arena_start`), and this slot is its only
            // holder until it is dropped.
            Buffer::Arena(index) => unsafe {
                std::slice::from_raw_parts_mut(self.pool.arena_start(*index), self.len)
            },
        }
    }

    /// Wraps the slot as `Bytes`; the slot returns to its pool when the last clone drops.
    pub fn into_bytes(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

/// Embedded jobs build their batches straight into a slot.
impl stoker_pipeline::BatchBuffer for Slot {
    fn as_mut_slice(&mut self) -> &mut [u8] {
        Slot::as_mut_slice(self)
    }

    fn into_bytes(self) -> Bytes {
        Slot::into_bytes(self)
    }
}

impl AsRef<[u8]> for Slot {
    fn as_ref(&self) -> &[u8] {
        match &self.buffer {
            Buffer::Heap(buffer) => &buffer[..self.len],
            // SAFETY: as in `as_mut_slice`.
            Buffer::Arena(index) => unsafe {
                std::slice::from_raw_parts(self.pool.arena_start(*index), self.len)
            },
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let buffer = std::mem::replace(&mut self.buffer, Buffer::Heap(Vec::new()));
        self.pool.give_back(buffer);
    }
}

#[cfg(test)]
mod tests {
    use super::memory::{page_size, reserve_pinned, PINNED_RESERVED};
    use super::*;
    use std::sync::atomic::Ordering;

    fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        mutex.lock().expect("no test thread panicked holding it")
    }

    #[test]
    fn slots_come_back_when_the_last_bytes_drop() {
        let pool = SlotPool::new(16, 2);
        let a = pool.try_take(16).unwrap().into_bytes();
        let b = pool.try_take(8).unwrap().into_bytes();
        assert_eq!(b.len(), 8);
        assert!(pool.try_take(16).is_none(), "capacity is 2");
        let a_clone = a.clone();
        drop(a);
        assert!(pool.try_take(16).is_none(), "a clone still holds the slot");
        drop(a_clone);
        assert!(pool.try_take(16).is_some());
        drop(b);
        assert_eq!(pool.in_use(), 0);
    }

    #[test]
    fn a_shared_pool_hands_out_distinct_slots_of_one_mapping() {
        let pool = SlotPool::shared(4096, 3).unwrap();
        let shared = pool.shared_memory().unwrap();
        assert_eq!(shared.size, 3 * 4096);
        assert_ne!(
            SlotPool::shared(8, 1).unwrap().shared_memory().unwrap().id,
            shared.id
        );
        let mut a = pool.try_take(4096).unwrap();
        let mut b = pool.try_take(100).unwrap();
        assert_eq!(
            (a.shared_offset(), b.shared_offset()),
            (Some(0), Some(4096))
        );
        a.as_mut_slice().fill(1);
        b.as_mut_slice().fill(2);
        // Another mapping of the same memfd sees what the slots hold.
        let file = std::fs::File::open(format!("/proc/self/fd/{}", shared.fd)).unwrap();
        let mut seen = vec![0u8; 4096 + 100];
        std::io::Read::read_exact(&mut &file, &mut seen).unwrap();
        assert!(seen[..4096].iter().all(|&x| x == 1) && seen[4096..].iter().all(|&x| x == 2));
        let bytes = b.into_bytes();
        assert_eq!(bytes.len(), 100);
        assert!(bytes.iter().all(|&x| x == 2));
        drop(bytes);
        // The slot given back gave its pages back: they read as zeros.
        let mut after = vec![9u8; 100];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut after, 4096).unwrap();
        assert!(after.iter().all(|&x| x == 0));
        // The slot given back is handed out again, not a fourth one.
        let c = pool.try_take(10).unwrap();
        assert_eq!(c.shared_offset(), Some(4096));
        let d = pool.try_take(10).unwrap();
        assert_eq!(d.shared_offset(), Some(2 * 4096));
        assert!(pool.try_take(10).is_none(), "capacity is 3");
        assert!(SlotPool::new(8, 1).shared_memory().is_none());
    }

    /// A process forked from the pool's (a checkpoint writer) that drops its copy of a batch
    /// leaves the parent's slot as it is: its shared pages keep the batch, and the slot is not
    /// handed out again in the parent until the parent drops it.
    #[test]
    fn a_forked_process_dropping_its_copy_of_a_batch_leaves_the_parents_slot_alone() {
        let pool = SlotPool::shared(4096, 2).unwrap();
        let mut slot = pool.try_take(4096).unwrap();
        slot.as_mut_slice().fill(7);
        let batch = slot.into_bytes();
        // SAFETY: the child only drops the batch (a process id check and, before the fix,
        // a punch and the pool's lock, which no other thread of this test holds) and exits.
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork: {}", std::io::Error::last_os_error());
        if child == 0 {
            drop(batch);
            // SAFETY: ends the child without running the test harness's exit path.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: waits for the child made above.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        assert!(
            batch.iter().all(|&x| x == 7),
            "the child's drop released the parent's pages"
        );
        // The parent's slot is still out: the other one comes next, then none.
        let other = pool.try_take(10).unwrap();
        assert_eq!(other.shared_offset(), Some(4096));
        assert!(pool.try_take(10).is_none());
        drop(batch);
        assert_eq!(pool.try_take(10).unwrap().shared_offset(), Some(0));
    }

    /// Held by the tests that reserve parts of the process's pinned budget, so one's
    /// reservations do not land between another's reading of what is held and its own.
    static LEDGER: Mutex<()> = Mutex::new(());

    #[test]
    fn the_pinned_budget_is_shared_by_the_pools_of_a_process() {
        let _ledger = LEDGER.lock().unwrap_or_else(|p| p.into_inner());
        let budget = pinned_reserved() + 10_000;
        assert!(reserve_pinned(6_000, budget).is_ok());
        let held = reserve_pinned(6_000, budget).unwrap_err();
        assert!(
            held >= 6_000,
            "the first reservation counts against the second"
        );
        assert!(
            reserve_pinned(4_000, budget).is_ok(),
            "what is left still fits"
        );
        PINNED_RESERVED.fetch_sub(10_000, Ordering::AcqRel);
    }

    #[test]
    fn a_share_beside_the_pools_counts_against_the_budget_until_dropped() {
        let _ledger = LEDGER.lock().unwrap_or_else(|p| p.into_inner());
        let budget = pinned_reserved() + 10_000;
        let share = PinnedShare::take(8_000, budget).expect("it fits");
        assert_eq!(share.bytes(), 8_000);
        // A pool's slots (or another share) do not fit beside it...
        let held = reserve_pinned(4_000, budget).unwrap_err();
        assert!(held >= 8_000, "{held}");
        assert!(PinnedShare::take(4_000, budget).is_err());
        // A share that grows and shrinks with its holder's allocations.
        let mut growing = PinnedShare::empty();
        assert!(growing.grow(2_000, budget).is_ok());
        assert!(growing.grow(1, budget).is_err(), "the budget is full");
        growing.shrink(1_500);
        growing.shrink(1_000_000);
        assert_eq!(growing.bytes(), 0, "it gives back no more than it holds");
        assert_eq!(pinned_reserved() + 2_000, budget);
        // ...until it is given back.
        drop(share);
        assert_eq!(pinned_reserved() + 10_000, budget);
        let again = PinnedShare::take(10_000, budget).expect("the whole budget is free again");
        drop(again);
    }

    /// A locker that refuses its first lock and takes the others, counting what it was asked.
    #[derive(Debug, Default)]
    struct Recording {
        locked: Mutex<Vec<usize>>,
        unlocked: Mutex<Vec<usize>>,
    }

    impl PageLocker for Recording {
        fn check(&self) -> Result<(), String> {
            Ok(())
        }

        unsafe fn lock(&self, start: *mut u8, len: usize) -> Result<(), String> {
            let mut locked = lock(&self.locked);
            locked.push(start as usize);
            assert_eq!(len % page_size(), 0, "whole pages are locked");
            if locked.len() == 1 {
                return Err("the driver refused the first slot".into());
            }
            Ok(())
        }

        unsafe fn unlock(&self, start: *mut u8) {
            lock(&self.unlocked).push(start as usize);
        }

        fn device(&self) -> Option<usize> {
            (!lock(&self.locked).is_empty()).then_some(3)
        }
    }

    #[test]
    fn a_pinned_pool_locks_each_slot_once_as_it_goes_out_and_unlocks_them_when_dropped() {
        let _ledger = LEDGER.lock().unwrap_or_else(|p| p.into_inner());
        let locker = Arc::new(Recording::default());
        let (slot_bytes, capacity) = (100, 3);
        let budget = pinned_reserved() + (capacity * slot_stride(slot_bytes)) as u64 + 1_000_000;
        let pool = SlotPool::pinned(slot_bytes, capacity, false, locker.clone(), budget)
            .expect("the pool fits its budget");
        // Made, nothing locked yet.
        assert!(pool.is_pinned() && pool.pinned_device().is_none() && pool.pin_error().is_none());
        let mut first = pool.try_take(8).unwrap();
        let first_at = first.as_mut_slice().as_ptr();
        pool.pin_for_hand_out(first_at);
        // Refused: the slot stays pageable and the pool says why.
        assert!(!pool.all_pinned() && !pool.holds_pinned(first_at));
        assert_eq!(
            pool.pin_error().as_deref(),
            Some("the driver refused the first slot")
        );
        assert_eq!(pool.pinned_device(), Some(3));
        let mut second = pool.try_take(8).unwrap();
        let second_at = second.as_mut_slice().as_ptr();
        pool.pin_for_hand_out(second_at);
        pool.pin_for_hand_out(second_at);
        pool.pin_for_hand_out(first_at);
        assert!(pool.holds_pinned(second_at));
        assert_eq!(pool.pinned_bytes(), slot_stride(slot_bytes) as u64);
        assert_eq!(
            lock(&locker.locked).len(),
            2,
            "each slot is tried once, the refused one included"
        );
        // Given back and taken again, a locked slot is not locked again.
        drop(second);
        let mut again = pool.try_take(8).unwrap();
        pool.pin_for_hand_out(again.as_mut_slice().as_ptr());
        assert_eq!(lock(&locker.locked).len(), 2);
        assert!(lock(&locker.unlocked).is_empty());
        drop((first, again));
        drop(pool);
        assert_eq!(
            *lock(&locker.unlocked),
            vec![second_at as usize],
            "the pool unlocks the slot it locked, once, when dropped"
        );
        // Its share of the budget is back: the same pool fits again.
        assert!(SlotPool::pinned(slot_bytes, capacity, false, locker, budget).is_ok());
    }

    /// A pool whose loaders were all gone let go of nothing while one view of one batch
    /// lived: the free slots' memory and page locks, and the whole pool's share of the pinned
    /// budget, so a loader made later found the budget held. Closed now: the free slots go at
    /// once, a held one as it comes back.
    #[test]
    fn a_pool_no_loader_uses_lets_go_of_its_slots_and_its_budget() {
        let _ledger = LEDGER.lock().unwrap_or_else(|p| p.into_inner());
        let locker = Arc::new(Recording::default());
        let (slot_bytes, capacity) = (100, 4);
        let stride = slot_stride(slot_bytes) as u64;
        let before = pinned_reserved();
        let budget = before + capacity as u64 * stride;
        let pool = SlotPool::pinned(slot_bytes, capacity, false, locker.clone(), budget)
            .expect("the pool fits its budget");
        let (first_user, second_user) = (pool.user(), pool.user());
        // Three slots go out (the locker refuses the first); two come back, one is kept.
        let mut slots: Vec<Slot> = (0..3).map(|_| pool.try_take(8).unwrap()).collect();
        let starts: Vec<usize> = slots
            .iter_mut()
            .map(|slot| slot.as_mut_slice().as_ptr() as usize)
            .collect();
        for &start in &starts {
            pool.pin_for_hand_out(start as *const u8);
        }
        let kept = slots.pop().unwrap();
        drop(slots);
        assert_eq!(pinned_reserved(), budget);
        drop(first_user);
        assert!(!pool.is_closed(), "another loader still uses it");
        drop(second_user);
        assert!(pool.is_closed() && pool.try_take(8).is_none());
        // The free slot that was locked is unlocked; the free ones and the one never made give
        // their part back: the held slot's part stays.
        assert_eq!(*lock(&locker.unlocked), vec![starts[1]]);
        assert_eq!(pinned_reserved(), before + stride);
        drop(kept);
        assert_eq!(*lock(&locker.unlocked), vec![starts[1], starts[2]]);
        assert_eq!(pinned_reserved(), before);
        // The pool's drop unlocks none of them again.
        drop(pool);
        assert_eq!(lock(&locker.unlocked).len(), 2);
    }

    #[test]
    fn small_tensors_copied_beside_a_pinned_pool_are_page_locked_within_its_budget() {
        let _ledger = LEDGER.lock().unwrap_or_else(|p| p.into_inner());
        let locker = Arc::new(Recording::default());
        let (slot_bytes, capacity, page) = (100, 2, page_size());
        let slots = (capacity * slot_stride(slot_bytes)) as u64;
        // Room for the slots and for two pages beside them, no more.
        let budget = pinned_reserved() + slots + 2 * page as u64;
        let pool = SlotPool::pinned(slot_bytes, capacity, false, locker.clone(), budget)
            .expect("the pool fits its budget");
        // The locker refuses its first lock: spend it on a batch slot.
        let mut batch = pool.try_take(8).unwrap();
        pool.pin_for_hand_out(batch.as_mut_slice().as_ptr());
        let labels: Vec<u8> = [7i64, -1, 3].iter().flat_map(|v| v.to_le_bytes()).collect();
        let odd = [1u8, 2, 3];
        let first = pool
            .pin_beside(&[&labels, &odd, &labels])
            .expect("room beside");
        assert_eq!(first[0], labels.as_slice());
        assert_eq!(first[1], odd.as_slice());
        assert_eq!(first[2], labels.as_slice());
        for part in &first {
            assert_eq!(part.as_ptr() as usize % 8, 0, "each part 8-byte aligned");
            assert!(
                pool.holds_pinned(part.as_ptr()),
                "the room beside is page-locked"
            );
        }
        assert!(
            !pool.holds_pinned(labels.as_ptr()),
            "the caller's own bytes are not"
        );
        assert!(pool.holds(batch.as_mut_slice().as_ptr()) && !pool.holds(labels.as_ptr()));
        assert!(
            !pool.holds(first[0].as_ptr()),
            "the room beside is not a batch slot"
        );
        assert_eq!(
            pool.pinned_bytes(),
            page as u64,
            "one slot beside locked, the refused one not"
        );
        // As many slots beside as the pool has: a third batch's parts wait for one.
        let second = pool.pin_beside(&[&odd]).expect("a second slot beside");
        assert!(
            pool.pin_beside(&[&odd]).is_none(),
            "both slots beside are held"
        );
        drop(first);
        assert!(
            pool.pin_beside(&[&odd]).is_some(),
            "the slot beside came back"
        );
        // Nothing to copy, or more than a slot beside holds: the caller keeps its bytes.
        assert!(pool.pin_beside(&[]).is_none());
        assert!(pool.pin_beside(&[&vec![0u8; page + 1]]).is_none());
        // The room counts against the budget: nothing more fits beside the pool...
        assert!(PinnedShare::take(1, budget).is_err());
        drop((second, batch));
        drop(pool);
        // ...until the pool and its room are gone.
        assert_eq!(pinned_reserved() + slots + 2 * page as u64, budget);
        // A budget without room beside the slots: the pool works, its parts stay pageable.
        let tight = pinned_reserved() + slots;
        let pool = SlotPool::pinned(slot_bytes, capacity, false, locker, tight).unwrap();
        assert!(pool.pin_beside(&[&odd]).is_none());
        assert!(pool.try_take(8).is_some());
    }

    #[test]
    fn arena_slots_start_on_pages() {
        let page = page_size();
        assert_eq!(slot_stride(1), page);
        assert_eq!(slot_stride(page), page);
        assert_eq!(slot_stride(page + 1), 2 * page);
        let pool = SlotPool::shared(100, 3).unwrap();
        let (a, b) = (pool.try_take(100).unwrap(), pool.try_take(100).unwrap());
        assert_eq!(
            (a.shared_offset(), b.shared_offset()),
            (Some(0), Some(page))
        );
        assert_eq!(pool.shared_memory().unwrap().size, 3 * page);
        assert!(!pool.is_pinned() && !pool.all_pinned() && pool.pinned_device().is_none());
        assert_eq!(pool.pinned_bytes(), 0);
    }

    #[test]
    fn take_timeout_wakes_on_release() {
        let pool = SlotPool::new(4, 1);
        let held = pool.try_take(4).unwrap();
        let waiter = {
            let pool = Arc::clone(&pool);
            std::thread::spawn(move || pool.take_timeout(4, Duration::from_secs(5)).is_some())
        };
        std::thread::sleep(Duration::from_millis(50));
        drop(held);
        assert!(waiter.join().unwrap());
        assert!(pool.take_timeout(4, Duration::from_millis(10)).is_some());
    }
}
