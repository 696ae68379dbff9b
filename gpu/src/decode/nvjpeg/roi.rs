//! Region decoding on the hardware backend: the calls (`nvjpegDecodeBatchedEx` and the decode
//! parameters that name each image's region), resolved where the library has them all, and
//! the decoder's side of them: a parameter per image of a batch, made once, and the question
//! whether the batched decode takes an image's region.

use std::ffi::c_int;

use cudarc::driver::sys;

use super::{check, symbol, Decoder, Handle, Image, Params, State, Stream, OUTPUT_RGBI, SUCCESS};
use crate::decode::region::Region;
use crate::decode::GpuDecodeError;

/// The calls that decode a region of each image of a batch (`nvjpegDecodeBatchedEx`, which
/// the documentation gives for the hardware backend only) and the decode parameters that name
/// the regions.
pub(super) struct RoiApi {
    params_create: unsafe extern "C" fn(Handle, *mut Params) -> c_int,
    params_destroy: unsafe extern "C" fn(Params) -> c_int,
    params_output_format: unsafe extern "C" fn(Params, c_int) -> c_int,
    params_roi: unsafe extern "C" fn(Params, c_int, c_int, c_int, c_int) -> c_int,
    supported_ex: unsafe extern "C" fn(Handle, Stream, Params, *mut c_int) -> c_int,
    decode_ex: unsafe extern "C" fn(
        Handle,
        State,
        *const *const u8,
        *const usize,
        *mut Image,
        *mut Params,
        sys::CUstream,
    ) -> c_int,
}

impl RoiApi {
    /// The calls, or `None` when the library lacks one.
    ///
    /// # Safety
    /// `library` is nvJPEG.
    pub(super) unsafe fn resolve(library: &libloading::Library) -> Option<RoiApi> {
        // SAFETY: each type below is the documented signature of the symbol named with it.
        unsafe {
            Some(RoiApi {
                params_create: symbol(library, "nvjpegDecodeParamsCreate").ok()?,
                params_destroy: symbol(library, "nvjpegDecodeParamsDestroy").ok()?,
                params_output_format: symbol(library, "nvjpegDecodeParamsSetOutputFormat").ok()?,
                params_roi: symbol(library, "nvjpegDecodeParamsSetROI").ok()?,
                supported_ex: symbol(library, "nvjpegDecodeBatchedSupportedEx").ok()?,
                decode_ex: symbol(library, "nvjpegDecodeBatchedEx").ok()?,
            })
        }
    }
}

/// The decode parameters region decoding uses: one to ask whether an image's region is taken,
/// and one per image of a batch.
pub(super) struct RoiParams {
    api: &'static RoiApi,
    probe: Params,
    images: Vec<Params>,
}

impl Decoder {
    /// Makes what decoding a region of each image of batches of up to `rows` images takes;
    /// `false` (decoding stays whole) where the handle is not on the hardware backend, the
    /// library lacks a call, or a call fails.
    pub fn enable_roi(&mut self, rows: usize) -> bool {
        let Some(api) = self.api.roi.as_ref().filter(|_| self.hardware) else {
            return false;
        };
        let mut roi = RoiParams {
            api,
            probe: std::ptr::null_mut(),
            images: Vec::with_capacity(rows),
        };
        let handle = self.handle;
        let make = |into: &mut Params| -> Result<(), GpuDecodeError> {
            // SAFETY: the handle is live; the out-pointer is the caller's, whose owner
            // destroys what was made (`RoiParams`' drop).
            unsafe {
                check(
                    "nvjpegDecodeParamsCreate",
                    (api.params_create)(handle, into),
                )?;
                check(
                    "nvjpegDecodeParamsSetOutputFormat",
                    (api.params_output_format)(*into, OUTPUT_RGBI),
                )
            }
        };
        let made = make(&mut roi.probe).and_then(|()| {
            for _ in 0..rows {
                let mut params = std::ptr::null_mut();
                let made = make(&mut params);
                if !params.is_null() {
                    roi.images.push(params);
                }
                made?;
            }
            Ok(())
        });
        match made {
            Ok(()) => {
                self.roi = Some(roi);
                true
            }
            Err(error) => {
                tracing::warn!(%error, "the GPU lane decodes whole images (no region decoding)");
                false
            }
        }
    }

    /// Decodes whole images again, the region parameters destroyed.
    pub fn disable_roi(&mut self) {
        self.roi = None;
    }

    /// Whether the batched decode takes `region` of the image [`Decoder::read`] read last
    /// (asked of nvJPEG with that image's parse); `false` without [`Decoder::enable_roi`].
    pub fn takes_region(&mut self, region: &Region) -> bool {
        let Some(roi) = &self.roi else {
            return false;
        };
        let mut supported: c_int = -1;
        // SAFETY: the probe and the parser are live and used by this thread only; the parser
        // holds the last image read, whose bytes the caller keeps alive meanwhile.
        unsafe {
            set_region(roi.api, roi.probe, Some(region))
                && (roi.api.supported_ex)(self.handle, self.parser, roi.probe, &mut supported)
                    == SUCCESS
                && supported == 0
        }
    }

    /// [`Decoder::decode`] of a batch in which some images are decoded by region.
    ///
    /// # Safety
    /// As [`Decoder::decode`]'s.
    pub(super) unsafe fn decode_regions(
        &self,
        state: State,
        pointers: &[*const u8],
        lengths: &[usize],
        outputs: &mut [Image],
        regions: &[Option<Region>],
        stream: sys::CUstream,
    ) -> Result<(), GpuDecodeError> {
        let Some(roi) = self
            .roi
            .as_ref()
            .filter(|roi| roi.images.len() >= pointers.len())
        else {
            return Err(GpuDecodeError::Unsupported(format!(
                "region decoding of {} images without their decode parameters",
                pointers.len()
            )));
        };
        // SAFETY: each parameter is live and read by no decode still running (the caller's
        // promise); the arrays live across the calls; the rest as the caller promises.
        unsafe {
            for (params, region) in roi.images.iter().zip(regions) {
                if !set_region(roi.api, *params, region.as_ref()) {
                    return Err(GpuDecodeError::Call {
                        call: "nvjpegDecodeParamsSetROI",
                        error: format!("{region:?} refused"),
                    });
                }
            }
            self.initialize_batch(state, pointers.len())?;
            check(
                "nvjpegDecodeBatchedEx",
                (roi.api.decode_ex)(
                    self.handle,
                    state,
                    pointers.as_ptr(),
                    lengths.as_ptr(),
                    outputs.as_mut_ptr(),
                    // nvJPEG reads the parameters (the C signature names no `const`).
                    roi.images.as_ptr().cast_mut(),
                    stream,
                ),
            )
        }
    }
}

/// Sets `params` to decode `region` (`None`: the whole image); whether nvJPEG took it.
///
/// # Safety
/// `params` is live and read by no decode still running.
unsafe fn set_region(api: &RoiApi, params: Params, region: Option<&Region>) -> bool {
    let (x, y, w, h) = match region {
        Some(r) => match (
            c_int::try_from(r.left),
            c_int::try_from(r.top),
            c_int::try_from(r.width),
            c_int::try_from(r.height),
        ) {
            (Ok(x), Ok(y), Ok(w), Ok(h)) => (x, y, w, h),
            _ => return false,
        },
        // The documented way to decode the whole image.
        None => (0, 0, -1, -1),
    };
    // SAFETY: as the caller promises.
    unsafe { (api.params_roi)(params, x, y, w, h) == SUCCESS }
}

impl Drop for RoiParams {
    fn drop(&mut self) {
        // SAFETY: parameters made by this decoder, destroyed once, before its handle.
        unsafe {
            for params in self.images.drain(..) {
                (self.api.params_destroy)(params);
            }
            if !self.probe.is_null() {
                (self.api.params_destroy)(self.probe);
            }
        }
    }
}
