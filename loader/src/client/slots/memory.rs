//! The memory behind a slot pool: one mapping holding every slot (anonymous, or a `memfd` other
//! processes map), and the process-wide budget of page-locked slots with each pool's
//! registration state.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::PageLocker;

/// One mapping holding every slot of a pool, slot `i` at `i * stride` (`slot_bytes` rounded up
/// to whole pages). Its pages are made when first written, so memory grows with the slots
/// used, as on the heap. A `memfd` when shared with worker processes, else anonymous memory.
#[derive(Debug)]
pub(super) struct Arena {
    pub(super) fd: Option<OwnedFd>,
    pub(super) base: *mut u8,
    pub(super) size: usize,
    pub(super) stride: usize,
    pub(super) id: u64,
}

/// Page-locking of a pool's slots: the driver hook that registers them (which may choose its
/// device when the first slot is locked), where each slot stands, and the share of the
/// process's pinned budget the pool holds (given back slot by slot once the pool is closed,
/// the rest when it is dropped).
#[derive(Debug)]
pub(super) struct Pinning {
    pub(super) locker: Arc<dyn PageLocker>,
    /// The process's pinned budget the pool was made within (a pool beside it takes its
    /// part of the same).
    pub(super) budget_bytes: u64,
    /// The pool's slots' part of the pinned budget: given back slot by slot once the pool
    /// closed, the rest when it is dropped.
    pub(super) share: Mutex<PinnedShare>,
    pub(super) slots: Mutex<PinSlots>,
}

impl Pinning {
    pub(super) fn status(&self, index: usize) -> PinStatus {
        self.slots
            .lock()
            .map(|s| s.status.get(index).copied().unwrap_or_default())
            .unwrap_or_default()
    }
}

#[derive(Debug, Default)]
pub(super) struct PinSlots {
    pub(super) status: Vec<PinStatus>,
    /// Why the first slot that could not be locked was refused.
    pub(super) error: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum PinStatus {
    #[default]
    Unused,
    Locked,
    Failed,
}

/// Bytes of page-locked slots reserved by the pools of this process.
pub(super) static PINNED_RESERVED: AtomicU64 = AtomicU64::new(0);

/// Reserves `bytes` of the process's pinned budget `budget`; `Err(held)` with what other
/// pools hold when they do not fit.
pub(super) fn reserve_pinned(bytes: u64, budget: u64) -> Result<(), u64> {
    let mut held = PINNED_RESERVED.load(Ordering::Relaxed);
    loop {
        if held.saturating_add(bytes) > budget {
            return Err(held);
        }
        match PINNED_RESERVED.compare_exchange(
            held,
            held + bytes,
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            Ok(_) => return Ok(()),
            Err(now) => held = now,
        }
    }
}

/// Bytes of the pinned budget that this process's pools and other [`PinnedShare`]s hold now.
pub fn pinned_reserved() -> u64 {
    PINNED_RESERVED.load(Ordering::Relaxed)
}

/// A share of the process's pinned budget for page-locked memory beside the slot pools (the
/// GPU decode lane's staging, nvJPEG's pinned buffers), given back when dropped: with them the
/// budget the pools are sized against covers every page the process locks through Stoker.
#[derive(Debug)]
#[must_use = "the share is given back when dropped"]
pub struct PinnedShare {
    bytes: u64,
}

impl PinnedShare {
    /// Takes `bytes` of the process's pinned budget `budget`; `Err(held)`, what the pools and
    /// shares of the process hold, when they do not fit beside it.
    pub fn take(bytes: u64, budget: u64) -> Result<PinnedShare, u64> {
        let mut share = PinnedShare::empty();
        share.grow(bytes, budget)?;
        Ok(share)
    }

    /// A share of nothing yet, for a holder whose page-locked memory comes and goes
    /// ([`PinnedShare::grow`], [`PinnedShare::shrink`]).
    pub fn empty() -> PinnedShare {
        PinnedShare { bytes: 0 }
    }

    /// Takes `bytes` more of `budget`; `Err(held)` as [`PinnedShare::take`] when they do not
    /// fit (the share is then unchanged).
    pub fn grow(&mut self, bytes: u64, budget: u64) -> Result<(), u64> {
        reserve_pinned(bytes, budget)?;
        self.bytes += bytes;
        Ok(())
    }

    /// Gives `bytes` back (at most what the share holds).
    pub fn shrink(&mut self, bytes: u64) {
        let bytes = bytes.min(self.bytes);
        self.bytes -= bytes;
        PINNED_RESERVED.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// The bytes taken.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for PinnedShare {
    fn drop(&mut self) {
        PINNED_RESERVED.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// The host's page size.
pub(super) fn page_size() -> usize {
    // SAFETY: a plain query.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|&s| s > 0)
        .unwrap_or(4096)
}

/// `bytes` rounded up to whole pages: the stride of arena slots, so each starts on a page (the
/// driver locks whole pages; a hole punched in one slot never touches its neighbour).
pub fn slot_stride(bytes: usize) -> usize {
    let page = page_size();
    bytes.div_ceil(page).max(1) * page
}

// SAFETY: the mapping is plain memory; the pool hands each slot's range to one `Slot` at a
// time, which is the only writer through this process's mapping.
unsafe impl Send for Arena {}
unsafe impl Sync for Arena {}

impl Arena {
    /// Gives slot `index`'s pages back to the system (a hole punched in the `memfd`, or the
    /// anonymous pages dropped); they read as zeros when next written.
    pub(super) fn release_pages(&self, index: usize) {
        let offset = index * self.stride;
        // SAFETY: the range is slot `index`'s, inside the mapping, and no one uses it now.
        let released = unsafe {
            match &self.fd {
                Some(fd) => libc::fallocate(
                    fd.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset as libc::off_t,
                    self.stride as libc::off_t,
                ),
                None => libc::madvise(
                    self.base.add(offset).cast(),
                    self.stride,
                    libc::MADV_DONTNEED,
                ),
            }
        };
        if released != 0 {
            tracing::debug!(
                error = %std::io::Error::last_os_error(),
                "could not release an idle slot's pages"
            );
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: `base` and `size` are this mapping's, and no slot outlives the pool (the
        // pool unlocks its slots before its arena is dropped).
        unsafe { libc::munmap(self.base.cast(), self.size) };
    }
}

/// Numbers arenas, so that a process mapping them can tell a new one from one it holds.
static ARENAS: AtomicU64 = AtomicU64::new(1);

/// Why a pinned pool could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PinnedPoolError {
    /// Its slots do not fit in what is left of the process's pinned budget.
    #[error("{wanted} bytes of page-locked batch slots do not fit in the pinned budget of {budget} bytes for this process ({held} held by its other loaders and GPU decode lanes)")]
    Budget {
        /// Bytes the pool's slots need.
        wanted: u64,
        /// The budget.
        budget: u64,
        /// Bytes other pools and shares of the process hold.
        held: u64,
    },
    /// The slots' mapping could not be made.
    #[error("cannot map the batch slots: {0}")]
    Map(std::io::Error),
}

impl Arena {
    /// A mapping for `capacity` slots of `slot_bytes`, each on its own pages: a `memfd` other
    /// processes can map when `shared`, else anonymous memory.
    pub(super) fn map(slot_bytes: usize, capacity: usize, shared: bool) -> std::io::Result<Arena> {
        let stride = slot_stride(slot_bytes);
        let size = stride
            .checked_mul(capacity)
            .ok_or_else(|| std::io::Error::other("slot pool size overflows"))?;
        // SAFETY: plain system calls on a descriptor this function owns; the mapping is
        // checked before use.
        unsafe {
            let fd = if shared {
                let raw = libc::memfd_create(c"stoker-slots".as_ptr(), libc::MFD_CLOEXEC);
                if raw < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let fd = OwnedFd::from_raw_fd(raw);
                if libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Some(fd)
            } else {
                None
            };
            let (flags, raw_fd) = match &fd {
                Some(fd) => (libc::MAP_SHARED, fd.as_raw_fd()),
                None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1),
            };
            let base = libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                raw_fd,
                0,
            );
            if base == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error());
            }
            Ok(Arena {
                fd,
                base: base.cast(),
                size,
                stride,
                id: ARENAS.fetch_add(1, Ordering::Relaxed),
            })
        }
    }
}
