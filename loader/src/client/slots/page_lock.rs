//! The hook that page-locks a pinned pool's slots ([`PageLocker`]): a device driver's
//! registration of host memory, so copies to the device read it by DMA. The CUDA driver's is
//! `stoker-gpu`'s; the pool only calls it, once per slot, and keeps each slot's state.

/// Registers host memory with a device driver for a [`super::SlotPool::pinned`] pool.
pub trait PageLocker: Send + Sync + std::fmt::Debug {
    /// Whether locking can work here (the driver loads, the device exists), checked without
    /// starting anything when a loader is built; else why not, as a whole sentence ("page-locked
    /// batch slots need ...").
    fn check(&self) -> Result<(), String>;

    /// Page-locks the `len` bytes at `start`; the first call may choose the device and open
    /// its context. Why not, when the driver refuses (the slot then stays pageable).
    ///
    /// # Safety
    /// The range is mapped, stays mapped until [`PageLocker::unlock`] is called on `start`,
    /// and is not locked already.
    unsafe fn lock(&self, start: *mut u8, len: usize) -> Result<(), String>;

    /// Undoes [`PageLocker::lock`].
    ///
    /// # Safety
    /// `start` was locked by [`PageLocker::lock`] and nothing reads the range any more.
    unsafe fn unlock(&self, start: *mut u8);

    /// The device whose context locks the slots, once a lock was tried and it opened.
    fn device(&self) -> Option<usize>;
}
