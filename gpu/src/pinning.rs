//! Page-locked batch slots: [`DevicePinning`] is the loader's `PageLocker` over a device's
//! primary CUDA context, chosen and opened when the first slot is locked.

use std::sync::{Arc, OnceLock};

use stoker_loader::PageLocker;

use crate::cuda::{active_devices, check_device, current_device, follow_device, Cuda, Unavailable};

/// Which device's primary context page-locks a pool's slots (they are pinned for every device
/// of the process either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinDevice {
    /// This device's.
    Fixed(usize),
    /// The one the process uses when the first slot is locked: the device whose context is
    /// current on the thread taking that batch (torch's current device, once torch has used it
    /// there), else this one if its context is active, else another device whose context is,
    /// else this one. A loader made before `torch.cuda.set_device` then starts no context on a
    /// device its process never uses (with eight ranks, eight contexts' memory on GPU 0), as
    /// long as the rank used its own device before its first batch.
    Follow(usize),
}

impl PinDevice {
    /// The device named at construction (a following pool's fallback).
    fn named(self) -> usize {
        match self {
            PinDevice::Fixed(ordinal) | PinDevice::Follow(ordinal) => ordinal,
        }
    }
}

/// The CUDA driver's page-locking of a pool's slots (`cuMemHostRegister`, portable): the
/// context is chosen and opened on the first lock, then every slot of the pools that share
/// this value is locked through it. Share one per loader and its resumed loaders, and fence
/// copies from their slots with [`DevicePinning::opened`]'s context.
#[derive(Debug)]
pub struct DevicePinning {
    device: PinDevice,
    cuda: OnceLock<Result<Arc<Cuda>, Unavailable>>,
}

impl DevicePinning {
    /// Page-locking through `device`'s primary context; nothing is opened yet.
    pub fn new(device: PinDevice) -> DevicePinning {
        DevicePinning {
            device,
            cuda: OnceLock::new(),
        }
    }

    /// The context that locks the slots, opened (and the device chosen) on the first call.
    fn cuda(&self) -> &Result<Arc<Cuda>, Unavailable> {
        self.cuda.get_or_init(|| {
            let ordinal = match self.device {
                PinDevice::Fixed(ordinal) => ordinal,
                PinDevice::Follow(fallback) => {
                    follow_device(current_device(), &active_devices(), fallback)
                }
            };
            Cuda::open(ordinal)
        })
    }

    /// The context that locked the slots, once chosen and opened.
    pub fn opened(&self) -> Option<&Arc<Cuda>> {
        self.cuda.get().and_then(|cuda| cuda.as_ref().ok())
    }
}

impl PageLocker for DevicePinning {
    fn check(&self) -> Result<(), String> {
        check_device(self.device.named())
            .map_err(|e| format!("page-locked batch slots need the CUDA driver: {e}"))
    }

    unsafe fn lock(&self, start: *mut u8, len: usize) -> Result<(), String> {
        match self.cuda() {
            // SAFETY: as the caller promises (mapped until unlocked, not locked already).
            Ok(cuda) => unsafe { cuda.lock_pages(start, len) }.map_err(|e| e.to_string()),
            Err(unavailable) => Err(unavailable.to_string()),
        }
    }

    unsafe fn unlock(&self, start: *mut u8) {
        if let Some(cuda) = self.opened() {
            // SAFETY: as the caller promises (locked by `lock`, through this context).
            unsafe { cuda.unlock_pages(start) };
        }
    }

    fn device(&self) -> Option<usize> {
        self.opened().map(|cuda| cuda.ordinal())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stoker_loader::SlotPool;

    #[test]
    fn a_pool_that_follows_the_process_opens_no_context_until_a_slot_goes_out() {
        if crate::cuda::driver_present() {
            // With a driver the slot is locked for real: test_gpu.py covers that.
            return;
        }
        let pinning = Arc::new(DevicePinning::new(PinDevice::Follow(0)));
        let error = pinning.check().unwrap_err();
        assert!(
            error.contains("page-locked batch slots need the CUDA driver")
                && error.contains("libcuda.so.1"),
            "{error}"
        );
        // Slots of 512 MiB (mapped, never touched), within a budget that holds them.
        let pool = SlotPool::pinned(512 << 20, 2, false, pinning.clone(), u64::MAX)
            .expect("the pool fits its budget");
        // Made, nothing opened; the first slot out tries and stays pageable, saying why.
        assert!(pool.is_pinned() && pinning.opened().is_none() && pool.pin_error().is_none());
        let mut slot = pool.try_take(8).unwrap();
        pool.pin_for_hand_out(slot.as_mut_slice().as_ptr());
        assert!(pinning.opened().is_none() && pool.pinned_device().is_none());
        assert!(!pool.all_pinned() && pool.pinned_bytes() == 0);
        let error = pool.pin_error().unwrap_or_default();
        assert!(error.contains("no CUDA driver"), "{error}");
    }
}
