//! Batch buffers ("slots") recycled through a bounded pool: a batch's image bytes live in a slot
//! until the last reference to them (a `Bytes`, a NumPy array, a torch tensor) is dropped, and
//! then the slot goes back to the pool. The pool never holds more than `capacity` slots, so a
//! consumer that keeps every batch alive makes the loader wait, not grow without bound.
//!
//! A pool's buffers live on the heap, or in one shared mapping ([`SlotPool::shared`]: a
//! `memfd` that other processes map too, so they can write a batch straight into its slot).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use bytes::Bytes;

/// Where a slot's bytes are.
#[derive(Debug)]
enum Buffer {
    Heap(Vec<u8>),
    /// Slot `index` of the pool's arena.
    Arena(usize),
}

#[derive(Debug)]
struct PoolState {
    free: Vec<Buffer>,
    /// Slots that exist (free or in use).
    allocated: usize,
}

/// One shared mapping holding every slot of a pool, slot `i` at `i * slot_bytes`. Its pages
/// are made when first written, so memory grows with the slots used, as on the heap.
#[derive(Debug)]
struct Arena {
    fd: OwnedFd,
    base: *mut u8,
    size: usize,
    id: u64,
}

// SAFETY: the mapping is plain memory; the pool hands each slot's range to one `Slot` at a
// time, which is the only writer through this process's mapping.
unsafe impl Send for Arena {}
unsafe impl Sync for Arena {}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: `base` and `size` are this mapping's, and no slot outlives the pool.
        unsafe { libc::munmap(self.base.cast(), self.size) };
    }
}

/// Numbers arenas, so that a process mapping them can tell a new one from one it holds.
static ARENAS: AtomicU64 = AtomicU64::new(1);

/// A bounded pool of equally sized batch buffers.
#[derive(Debug)]
pub struct SlotPool {
    slot_bytes: usize,
    capacity: usize,
    arena: Option<Arena>,
    state: Mutex<PoolState>,
    released: Condvar,
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
            state: Mutex::new(PoolState {
                free: Vec::new(),
                allocated: 0,
            }),
            released: Condvar::new(),
        })
    }

    /// Like [`SlotPool::new`], the slots in one shared `memfd` mapping that other processes
    /// can map ([`SlotPool::shared_memory`], [`Slot::shared_offset`]). Not in `/dev/shm`: the
    /// memory is the pool's own, freed when the pool and every mapping of it are gone. A slot
    /// given back releases its pages (they read as zeros when next written), so the pool holds
    /// the memory of the slots in use, not of every slot it ever handed out.
    pub fn shared(slot_bytes: usize, capacity: usize) -> std::io::Result<Arc<SlotPool>> {
        let capacity = capacity.max(1);
        let size = slot_bytes
            .checked_mul(capacity)
            .ok_or_else(|| std::io::Error::other("slot pool size overflows"))?
            .max(1);
        // SAFETY: plain system calls on a descriptor this function owns; the mapping is
        // checked before use.
        let arena = unsafe {
            let raw = libc::memfd_create(c"stoker-slots".as_ptr(), libc::MFD_CLOEXEC);
            if raw < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let fd = OwnedFd::from_raw_fd(raw);
            if libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let base = libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            );
            if base == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error());
            }
            Arena {
                fd,
                base: base.cast(),
                size,
                id: ARENAS.fetch_add(1, Ordering::Relaxed),
            }
        };
        Ok(Arc::new(SlotPool {
            slot_bytes,
            capacity,
            arena: Some(arena),
            state: Mutex::new(PoolState {
                free: Vec::new(),
                allocated: 0,
            }),
            released: Condvar::new(),
        }))
    }

    /// The shared mapping of a pool made by [`SlotPool::shared`], else `None`.
    pub fn shared_memory(&self) -> Option<SharedMemory> {
        self.arena.as_ref().map(|arena| SharedMemory {
            fd: arena.fd.as_raw_fd(),
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

    /// Where slot `index` of the arena starts: `slot_bytes` from there are inside the
    /// mapping, since arena slots exist only in arena pools and `index < capacity`.
    fn arena_start(&self, index: usize) -> *mut u8 {
        match &self.arena {
            // SAFETY: `index * slot_bytes` is below the mapping's size (see above).
            Some(arena) => unsafe { arena.base.add(index * self.slot_bytes) },
            None => unreachable!("arena slots come from arena pools"),
        }
    }

    fn give_back(&self, buffer: Buffer) {
        if let (Buffer::Arena(index), Some(arena)) = (&buffer, &self.arena) {
            // A shared slot's pages go back to the system while it waits in the pool, so the
            // memory held follows the batches alive (being written, waiting or held), as
            // memory freed batch by batch would, not the most the pool ever had at once.
            // SAFETY: the range is this slot's, inside the memfd, and no one uses it now.
            let freed = unsafe {
                libc::fallocate(
                    arena.fd.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    (*index * self.slot_bytes) as libc::off_t,
                    self.slot_bytes as libc::off_t,
                )
            };
            if freed != 0 {
                tracing::debug!(
                    error = %std::io::Error::last_os_error(),
                    "could not release an idle shared slot's pages"
                );
            }
        }
        if let Ok(mut state) = self.state.lock() {
            state.free.push(buffer);
        }
        self.released.notify_all();
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
        match self.buffer {
            Buffer::Heap(_) => None,
            Buffer::Arena(index) => Some(index * self.pool.slot_bytes),
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
impl stoker_worker::BatchBuffer for Slot {
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
    use super::*;

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
