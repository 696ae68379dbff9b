//! Stoker's GPU half, plugged into the loader (`stoker-loader`) through its two hooks: the CUDA
//! driver loaded at run time ([`Cuda`]: primary contexts shared with torch, page-locking,
//! fences on streams and their sweeps), page-locked batch slots ([`DevicePinning`], the
//! loader's `PageLocker`), and the GPU decode lane ([`GpuLane`]: nvJPEG, the crop kernel, the
//! split with the CPU decode threads), the loader's `DecodeLane` below its seam
//! ([`StartGpuLane`]), in this process or in a helper process of its own ([`HelperLane`]; the
//! helper's side of the lane is [`GpuLane::start_served`], its messages [`helper_wire`]). Nothing here needs CUDA to build, and without a driver each entry point
//! says what is missing.
//!
//! ```
//! use std::sync::Arc;
//! use stoker_gpu::{DevicePinning, PinDevice};
//! use stoker_loader::PageLocker;
//! let pinning = Arc::new(DevicePinning::new(PinDevice::Follow(0)));
//! // Nothing is opened until the first slot is locked.
//! assert_eq!(pinning.device(), None);
//! if !stoker_gpu::cuda_driver_present() {
//!     let refusal = pinning.check().unwrap_err();
//!     assert!(refusal.contains("page-locked batch slots need the CUDA driver"));
//! }
//! ```

mod cuda;
mod decode;
/// The fuzz targets' bodies (`fuzz/`), behind the `fuzzing` feature: the fuzz crate and this
/// crate's corpus replay tests turn it on; a build for users leaves them out.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzz_targets;
mod pinning;

pub use cuda::{
    active_devices as cuda_active_devices, check_device as cuda_check_device,
    driver_present as cuda_driver_present, Cuda, Fence, Sweep, Unavailable as CudaUnavailable,
};
pub use decode::helper::wire as helper_wire;
pub use decode::{
    compile_kernel, cuda_library_dirs, gpu_row, hardware_candidate, helper_asked, nvjpeg_version,
    served_pinned_limit, split_for_rates, Compiled, CropItem, Decline, DecodeMode, DeviceRows,
    Element, GpuDecodeError, GpuDecodeOptions, GpuLane, HelperLane, HelperOptions, LaneItem,
    LaneStats, RowTail, RowsBuilt, RowsTask, ServedHandles, StartGpuLane, TailParams,
    AUTO_POINT_STEPS, AUTO_START, DEFAULT_GPU_MEMORY, FUSED_TAIL_VARIABLE, HELPER_BINARY,
    HELPER_VARIABLE, IPC_HANDLE_BYTES, KERNEL, KERNEL_SOURCE, NVJPEG_TESTED_MAJORS, ROI_VARIABLE,
};
pub use pinning::{DevicePinning, PinDevice};
