//! Batch buffers ("slots") recycled through a bounded pool: a batch's image bytes live in a slot
//! until the last reference to them (a `Bytes`, a NumPy array, a torch tensor) is dropped, and
//! then the slot goes back to the pool. The pool never holds more than `capacity` slots, so a
//! consumer that keeps every batch alive makes the loader wait, not grow without bound.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use bytes::Bytes;

#[derive(Debug)]
struct PoolState {
    free: Vec<Vec<u8>>,
    /// Slots that exist (free or in use).
    allocated: usize,
}

/// A bounded pool of equally sized batch buffers.
#[derive(Debug)]
pub struct SlotPool {
    slot_bytes: usize,
    capacity: usize,
    state: Mutex<PoolState>,
    released: Condvar,
}

/// One buffer taken from a [`SlotPool`]; it returns there when dropped.
#[derive(Debug)]
pub struct Slot {
    buffer: Vec<u8>,
    len: usize,
    pool: Arc<SlotPool>,
}

impl SlotPool {
    /// A pool of at most `capacity` buffers of `slot_bytes` bytes, allocated lazily.
    pub fn new(slot_bytes: usize, capacity: usize) -> Arc<SlotPool> {
        Arc::new(SlotPool {
            slot_bytes,
            capacity: capacity.max(1),
            state: Mutex::new(PoolState {
                free: Vec::new(),
                allocated: 0,
            }),
            released: Condvar::new(),
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
                vec![0u8; self.slot_bytes]
            }
            None => return None,
        };
        Some(Slot {
            buffer,
            len: len.min(self.slot_bytes),
            pool: Arc::clone(self),
        })
    }

    fn give_back(&self, buffer: Vec<u8>) {
        if let Ok(mut state) = self.state.lock() {
            state.free.push(buffer);
        }
        self.released.notify_all();
    }
}

impl Slot {
    /// Uses the first `len` bytes of the buffer (at most the slot's size).
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.buffer.len());
    }

    /// The buffer's size, whatever length is in use.
    pub fn capacity(&self) -> usize {
        self.buffer.len()
    }

    /// The slot's bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.buffer[..self.len]
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
        &self.buffer[..self.len]
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buffer));
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
