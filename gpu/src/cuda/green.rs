//! Green contexts: a context of the device that runs its kernels on a set of the device's SMs
//! only (CUDA 12.5 and later drivers), sharing the primary context's memory. The GPU decode
//! lane's pipes may run in one each (`STOKER_GPU_DECODE_SMS`), so their kernels never take
//! more than those SMs from a training step; the training step itself still runs on every SM.
//!
//! A green context may be current on one thread at a time: each pipe has its own, current on
//! its thread alone, and every other thread reaches the pipe's objects through the primary
//! context (waits on its events, the destruction of what it leaves).

use cudarc::driver::{sys, DriverError};

use super::{call_failed, device_handle, Cuda};

/// The environment variable that asks for the lane's pipes to run in green contexts of this
/// many SMs (the driver rounds up to its partition size).
pub const SMS_VARIABLE: &str = "STOKER_GPU_DECODE_SMS";

/// The oldest driver with every call used here (`cuGreenCtxStreamCreate` came in 12.5).
const OLDEST_DRIVER: i32 = 12050;

/// The SMs `STOKER_GPU_DECODE_SMS` asks for: `None` when it is unset or empty; an error
/// naming the variable when it is not a positive count.
pub fn sms_asked(value: Option<&str>) -> Result<Option<u32>, String> {
    let Some(text) = value.map(str::trim).filter(|text| !text.is_empty()) else {
        return Ok(None);
    };
    match text.parse::<u32>() {
        Ok(count) if count > 0 => Ok(Some(count)),
        _ => Err(format!(
            "{SMS_VARIABLE}={text:?} is not a positive count of SMs for the GPU decode lane"
        )),
    }
}

/// A green context of some of a device's SMs; destroyed when dropped.
#[derive(Debug)]
pub struct GreenContext {
    green: sys::CUgreenCtx,
    context: sys::CUcontext,
    sms: u32,
}

// SAFETY: the handles may move between threads; the context is made current on one thread at
// a time by its owner (a pipe's thread).
unsafe impl Send for GreenContext {}
unsafe impl Sync for GreenContext {}

impl GreenContext {
    /// A green context of at least `sms` of `cuda`'s device's SMs (as many more as the
    /// driver's partition size rounds up to), or what refused it, naming the variable: a
    /// driver older than 12.5, more SMs than the device can give beside the rest, a call that
    /// failed. Each call splits the whole device afresh, so two contexts made this way may
    /// hold the same SMs (the driver does not say which it gives).
    pub fn new(cuda: &Cuda, sms: u32) -> Result<GreenContext, String> {
        Self::make(cuda, sms).map_err(|problem| format!("{SMS_VARIABLE}={sms}: {problem}"))
    }

    fn make(cuda: &Cuda, sms: u32) -> Result<GreenContext, String> {
        let failed = |call| move |error| call_failed(call, error).to_string();
        let mut version = 0;
        // SAFETY: writes the driver's version into a local.
        unsafe { sys::cuDriverGetVersion(&mut version) }
            .result()
            .map_err(failed("cuDriverGetVersion"))?;
        if version < OLDEST_DRIVER {
            return Err(format!(
                "green contexts need a CUDA 12.5 driver or later; this one is {}.{}",
                version / 1000,
                version % 1000 / 10
            ));
        }
        let device = device_handle(cuda.ordinal()).map_err(|e| e.to_string())?;
        // SAFETY: plain-data structs the driver fills; zeroed is their empty value.
        let mut whole: sys::CUdevResource = unsafe { std::mem::zeroed() };
        let mut group: sys::CUdevResource = unsafe { std::mem::zeroed() };
        let mut rest: sys::CUdevResource = unsafe { std::mem::zeroed() };
        let mut groups = 1u32;
        // SAFETY: each pointer is to a local above; one group is asked for and room is given
        // for one.
        unsafe {
            sys::cuDeviceGetDevResource(
                device,
                &mut whole,
                sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM,
            )
            .result()
            .map_err(failed("cuDeviceGetDevResource"))?;
            sys::cuDevSmResourceSplitByCount(&mut group, &mut groups, &whole, &mut rest, 0, sms)
                .result()
                .map_err(failed("cuDevSmResourceSplitByCount"))?;
        }
        // SAFETY: the union's `sm` member is the one an SM resource fills.
        let (granted, total) = unsafe {
            (
                group.__bindgen_anon_1.sm.smCount,
                whole.__bindgen_anon_1.sm.smCount,
            )
        };
        if groups != 1 || granted == 0 || granted >= total {
            return Err(format!(
                "the device's {total} SMs give no group of {sms} beside the rest (got \
                 {groups} group(s) of {granted})"
            ));
        }
        let mut desc: sys::CUdevResourceDesc = std::ptr::null_mut();
        let mut green: sys::CUgreenCtx = std::ptr::null_mut();
        let mut context: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the descriptor is made from the one group above; the green context from it,
        // on the device the group came from; the conversion reads the context just made.
        unsafe {
            sys::cuDevResourceGenerateDesc(&mut desc, &mut group, 1)
                .result()
                .map_err(failed("cuDevResourceGenerateDesc"))?;
            sys::cuGreenCtxCreate(
                &mut green,
                desc,
                device,
                sys::CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as u32,
            )
            .result()
            .map_err(failed("cuGreenCtxCreate"))?;
            if let Err(error) = sys::cuCtxFromGreenCtx(&mut context, green).result() {
                let _ = sys::cuGreenCtxDestroy(green);
                return Err(failed("cuCtxFromGreenCtx")(error));
            }
        }
        tracing::info!(
            asked = sms,
            granted,
            of = total,
            "a GPU decode pipe runs in a green context"
        );
        Ok(GreenContext {
            green,
            context,
            sms: granted,
        })
    }

    /// The green context as a context to make current (on one thread at a time).
    pub fn context(&self) -> sys::CUcontext {
        self.context
    }

    /// The SMs its kernels run on.
    pub fn sms(&self) -> u32 {
        self.sms
    }

    /// A new non-blocking stream of the green context at `priority`; the caller destroys it
    /// before the context goes.
    pub fn stream(&self, priority: i32) -> Result<sys::CUstream, DriverError> {
        let mut stream = std::ptr::null_mut();
        // SAFETY: creation into a local, from the live green context.
        unsafe {
            sys::cuGreenCtxStreamCreate(
                &mut stream,
                self.green,
                sys::CUstream_flags_enum::CU_STREAM_NON_BLOCKING as u32,
                priority,
            )
            .result()?;
        }
        Ok(stream)
    }
}

impl Drop for GreenContext {
    fn drop(&mut self) {
        // SAFETY: destroyed once, after its owner's streams, events and module (which hold it
        // through an `Arc`) are gone.
        if let Err(error) = unsafe { sys::cuGreenCtxDestroy(self.green) }.result() {
            tracing::warn!(error = %super::describe(error), "destroying a green context");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sms_asked_for_are_a_positive_count_or_none() {
        assert_eq!(sms_asked(None), Ok(None));
        assert_eq!(sms_asked(Some("")), Ok(None));
        assert_eq!(sms_asked(Some(" 16 ")), Ok(Some(16)));
        for wrong in ["0", "-8", "eight", "1.5"] {
            let error = sms_asked(Some(wrong)).expect_err(wrong);
            assert!(
                error.contains(SMS_VARIABLE) && error.contains(wrong),
                "{error}"
            );
        }
    }
}
