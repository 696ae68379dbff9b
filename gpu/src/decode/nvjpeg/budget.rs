//! What nvJPEG's device and pinned allocations through one decoder's allocators hold and may
//! hold ([`Budget`]), and the allocator callbacks nvJPEG calls: the device side within the
//! lane's memory cap, the pinned side within the process's pinned budget (beside the slot
//! pools), each refused past its limit without reaching CUDA.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use cudarc::driver::sys;
use stoker_loader::PinnedShare;

/// Device and pinned bytes nvJPEG holds through one decoder's allocators, and the most the
/// device side may hold (an allocation past it fails, and the decoder then sends its images to
/// the CPU).
#[derive(Debug)]
pub struct Budget {
    /// Device bytes allocated now.
    pub device: AtomicUsize,
    /// Pinned host bytes allocated now.
    pub pinned: AtomicUsize,
    /// The device bytes allowed.
    pub device_limit: usize,
    /// The process's pinned budget the pinned allocations count against (`None`: not counted).
    pub pinned_budget: Option<u64>,
    /// The part of that budget the pinned allocations hold.
    pub pinned_share: Mutex<PinnedShare>,
    /// Pinned allocations refused because the budget was full.
    pub pinned_refused: std::sync::atomic::AtomicU64,
    /// Allocations made so far (device and pinned): steady work makes none.
    pub allocations: std::sync::atomic::AtomicU64,
}

impl Budget {
    /// A budget of `device_limit` device bytes, its pinned allocations counted against the
    /// process's `pinned_budget` when there is one.
    pub fn new(device_limit: usize, pinned_budget: Option<u64>) -> Budget {
        Budget {
            device: AtomicUsize::new(0),
            pinned: AtomicUsize::new(0),
            device_limit,
            pinned_budget,
            pinned_share: Mutex::new(PinnedShare::empty()),
            pinned_refused: std::sync::atomic::AtomicU64::new(0),
            allocations: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Takes `size` pinned bytes of the process's budget (always, without one); false when
    /// they do not fit.
    fn take_pinned(&self, size: usize) -> bool {
        let Some(budget) = self.pinned_budget else {
            return true;
        };
        let mut share = self.pinned_share.lock().unwrap_or_else(|p| p.into_inner());
        let taken = share.grow(size as u64, budget).is_ok();
        if !taken {
            self.pinned_refused.fetch_add(1, Ordering::Relaxed);
        }
        taken
    }

    /// Gives `size` pinned bytes back to the process's budget.
    fn give_back_pinned(&self, size: usize) {
        if self.pinned_budget.is_some() {
            let mut share = self.pinned_share.lock().unwrap_or_else(|p| p.into_inner());
            share.shrink(size as u64);
        }
    }
}

/// An allocator callback's context (the decoder's [`Budget`]), the place for an allocation's
/// address, and the stream nvJPEG names (unused: allocations are not stream-ordered here).
pub(super) type Ctx = *mut c_void;
pub(super) type Out = *mut *mut c_void;
pub(super) type CuStream = sys::CUstream;

/// The status an allocator callback returns when it cannot allocate
/// (`cudaErrorMemoryAllocation`).
const NO_MEMORY: c_int = 2;

/// The decoder's budget behind an allocator callback's context.
///
/// # Safety
/// `ctx` is the decoder's `Budget`, alive while its handle is (as nvJPEG calls the callbacks).
unsafe fn budget_of<'a>(ctx: Ctx) -> &'a Budget {
    // SAFETY: as the caller promises.
    unsafe { &*(ctx as *const Budget) }
}

/// Stores an allocation's address where nvJPEG asked, or says why there is none.
fn hand_over(ptr: Out, address: Option<*mut c_void>) -> c_int {
    match address {
        Some(address) => {
            // SAFETY: nvJPEG passes a place for the pointer.
            unsafe { *ptr = address };
            0
        }
        None => NO_MEMORY,
    }
}

/// Frees a non-null `ptr` with `free` and takes its `size` off `held`.
fn release(ptr: *mut c_void, size: usize, held: &AtomicUsize, free: impl FnOnce()) -> c_int {
    if !ptr.is_null() {
        free();
        held.fetch_sub(size, Ordering::Relaxed);
    }
    0
}

pub(super) extern "C" fn device_malloc(ctx: Ctx, ptr: Out, size: usize, _: CuStream) -> c_int {
    // SAFETY: nvJPEG gives back the context the handle was made with.
    let budget = unsafe { budget_of(ctx) };
    budget.allocations.fetch_add(1, Ordering::Relaxed);
    let before = budget.device.fetch_add(size, Ordering::Relaxed);
    let mut address: sys::CUdeviceptr = 0;
    // SAFETY: an allocation into a local, in the context current on the lane's thread.
    let allocated = before + size <= budget.device_limit
        && unsafe { sys::cuMemAlloc_v2(&mut address, size.max(1)) } == sys::CUresult::CUDA_SUCCESS;
    if !allocated {
        budget.device.fetch_sub(size, Ordering::Relaxed);
    }
    hand_over(ptr, allocated.then_some(address as *mut c_void))
}

pub(super) extern "C" fn device_free(
    ctx: Ctx,
    ptr: *mut c_void,
    size: usize,
    _: CuStream,
) -> c_int {
    free_from(ctx, ptr, size, false)
}

pub(super) extern "C" fn pinned_malloc(ctx: Ctx, ptr: Out, size: usize, _: CuStream) -> c_int {
    // SAFETY: as in `device_malloc`.
    let budget = unsafe { budget_of(ctx) };
    budget.allocations.fetch_add(1, Ordering::Relaxed);
    if !budget.take_pinned(size) {
        return hand_over(ptr, None);
    }
    let mut address = std::ptr::null_mut();
    // SAFETY: an allocation into a local.
    let allocated =
        unsafe { sys::cuMemAllocHost_v2(&mut address, size.max(1)) } == sys::CUresult::CUDA_SUCCESS;
    if allocated {
        budget.pinned.fetch_add(size, Ordering::Relaxed);
    } else {
        budget.give_back_pinned(size);
    }
    hand_over(ptr, allocated.then_some(address))
}

pub(super) extern "C" fn pinned_free(
    ctx: Ctx,
    ptr: *mut c_void,
    size: usize,
    _: CuStream,
) -> c_int {
    free_from(ctx, ptr, size, true)
}

/// Frees a non-null `ptr` of `size` bytes that `pinned_malloc` (`pinned`) or `device_malloc`
/// made, and takes it off the budget (and the process's pinned budget).
fn free_from(ctx: Ctx, ptr: *mut c_void, size: usize, pinned: bool) -> c_int {
    // SAFETY: as in `device_malloc`.
    let budget = unsafe { budget_of(ctx) };
    if !pinned {
        // SAFETY: a non-null `ptr` came from `device_malloc`.
        return release(ptr, size, &budget.device, || unsafe {
            sys::cuMemFree_v2(ptr as sys::CUdeviceptr);
        });
    }
    if !ptr.is_null() {
        budget.give_back_pinned(size);
    }
    // SAFETY: a non-null `ptr` came from `pinned_malloc`.
    release(ptr, size, &budget.pinned, || unsafe {
        sys::cuMemFreeHost(ptr);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(device_limit: usize) -> Budget {
        Budget::new(device_limit, None)
    }

    #[test]
    fn a_pinned_allocation_past_the_process_budget_is_refused_without_reaching_cuda() {
        // A budget of one page, whatever else the process holds: 4,097 bytes never fit.
        let budget = Budget::new(0, Some(4096));
        let ctx = &budget as *const Budget as Ctx;
        let mut place: *mut c_void = std::ptr::null_mut();
        let status = pinned_malloc(ctx, &mut place, 4097, std::ptr::null_mut());
        assert_eq!(status, NO_MEMORY);
        assert!(place.is_null());
        assert_eq!(budget.pinned.load(Ordering::Relaxed), 0);
        assert_eq!(budget.pinned_refused.load(Ordering::Relaxed), 1);
        assert_eq!(budget.pinned_share.lock().unwrap().bytes(), 0);
        // Freeing nothing gives nothing back.
        assert_eq!(
            pinned_free(ctx, std::ptr::null_mut(), 4097, std::ptr::null_mut()),
            0
        );
        assert_eq!(budget.pinned_share.lock().unwrap().bytes(), 0);
    }

    #[test]
    fn a_device_allocation_past_the_budget_is_refused_without_reaching_cuda() {
        let budget = budget(1 << 20);
        let ctx = &budget as *const Budget as Ctx;
        let mut place: *mut c_void = std::ptr::null_mut();
        let status = device_malloc(ctx, &mut place, (1 << 20) + 1, std::ptr::null_mut());
        assert_eq!(status, NO_MEMORY);
        assert!(place.is_null());
        assert_eq!(budget.device.load(Ordering::Relaxed), 0);
        assert_eq!(budget.allocations.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn releasing_null_frees_nothing_and_a_pointer_frees_its_size() {
        let held = AtomicUsize::new(100);
        let mut freed = 0;
        assert_eq!(release(std::ptr::null_mut(), 40, &held, || freed += 1), 0);
        assert_eq!((freed, held.load(Ordering::Relaxed)), (0, 100));
        let mut value = 0u8;
        let ptr = &mut value as *mut u8 as *mut c_void;
        assert_eq!(release(ptr, 40, &held, || freed += 1), 0);
        assert_eq!((freed, held.load(Ordering::Relaxed)), (1, 60));
    }

    #[test]
    fn a_handed_over_address_lands_where_nvjpeg_asked() {
        let mut place: *mut c_void = std::ptr::null_mut();
        let mut value = 0u8;
        let address = &mut value as *mut u8 as *mut c_void;
        assert_eq!(hand_over(&mut place, Some(address)), 0);
        assert_eq!(place, address);
        assert_eq!(hand_over(&mut place, None), NO_MEMORY);
    }
}
