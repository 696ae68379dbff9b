//! nvJPEG, loaded at run time, with the few calls the lane needs bound by hand: the library's
//! version, a handle on the hardware JPEG engines (or the GPU-hybrid backend where a GPU has
//! none) with device and pinned allocators that count against the lane's memory cap and its
//! strict bitstream check on, the full stream parse whose reading the lane compares with its
//! own before it takes an image ([`Decoder::read`]), and batched decoding into interleaved RGB,
//! of whole images or, on the hardware backend, of a region of each ([`Decoder::enable_roi`]).
//!
//! Why nvJPEG and not nvImageCodec: the lane needs only baseline JPEG decoding in batches;
//! nvJPEG has a stable C ABI (its soname carries the CUDA major version) and ships with the
//! CUDA toolkit and as a pip wheel, while nvImageCodec's C API has no stable ABI yet and would
//! add its own plugin layer over the same nvJPEG calls.

use std::ffi::{c_int, c_uint, c_void};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys;

mod budget;
mod roi;

pub use budget::Budget;
use budget::{device_free, device_malloc, pinned_free, pinned_malloc, Ctx, CuStream, Out};

use super::jpeg_scan::DecoderReading;
use super::libraries::search_dirs;
use super::region::Region;
use super::GpuDecodeError;
use roi::{RoiApi, RoiParams};

/// The nvJPEG major versions Stoker has been run against on a GPU.
pub const TESTED_MAJORS: &[i32] = &[13];

const SONAMES: &[&str] = &["libnvjpeg.so.13"];

/// `nvjpegStatus_t` success.
const SUCCESS: c_int = 0;
/// `NVJPEG_BACKEND_DEFAULT`, `NVJPEG_BACKEND_HARDWARE`.
const BACKEND_DEFAULT: c_int = 0;
const BACKEND_HARDWARE: c_int = 3;
/// `NVJPEG_CSS_444`.
const CSS_444: c_int = 0;
/// `NVJPEG_OUTPUT_RGBI`: interleaved RGB.
const OUTPUT_RGBI: c_int = 5;
/// Creation flags: `NVJPEG_FLAGS_BITSTREAM_STRICT` (4), which the documentation gives for every
/// backend ("nvJPEG library will try to decode a bitstream even if it doesn't strictly follow
/// the JPEG specification. Using this flag will return an error in such cases"): a stream
/// nvJPEG finds wrong fails its decode, and the lane builds that image on the CPU, whose
/// bad-sample policy then decides. `NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION` (32) would
/// upsample chroma as libjpeg-turbo does (mean difference from the CPU 0.2 grey levels instead
/// of 1.4 at 224x224 on the generated set), but the hardware decoder then ran at 4,800 img/s
/// instead of 8,600 on an H200: the lane keeps the engines' own upsampling.
const CREATE_FLAGS: c_uint = 4;
/// `libraryPropertyType`: MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL.
const PROPERTIES: [c_int; 3] = [0, 1, 2];

type Handle = *mut c_void;
type State = *mut c_void;
type Stream = *mut c_void;
type Params = *mut c_void;

/// `nvjpegImage_t`: up to four planes and their pitches (one plane for interleaved output).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Image {
    /// Plane addresses (device memory).
    pub channel: [*mut u8; 4],
    /// Bytes per row of each plane (`size_t` in nvjpeg.h).
    pub pitch: [usize; 4],
}

impl Image {
    /// Interleaved RGB at `ptr`, `pitch` bytes a row.
    pub fn rgb(ptr: u64, pitch: usize) -> Image {
        Image {
            channel: [
                ptr as *mut u8,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            ],
            pitch: [pitch, 0, 0, 0],
        }
    }
}

/// `nvjpegDevAllocatorV2_t` and `nvjpegPinnedAllocatorV2_t`, which have the same layout: an
/// allocation and a release callback, and the context both are given.
#[repr(C)]
struct Allocator {
    malloc: extern "C" fn(Ctx, Out, usize, CuStream) -> c_int,
    free: extern "C" fn(Ctx, *mut c_void, usize, CuStream) -> c_int,
    ctx: *mut c_void,
}

/// The entry points, resolved once per process.
struct Api {
    _library: libloading::Library,
    version: (i32, i32, i32),
    from: String,
    create_ex_v2:
        unsafe extern "C" fn(c_int, *mut Allocator, *mut Allocator, c_uint, *mut Handle) -> c_int,
    destroy: unsafe extern "C" fn(Handle) -> c_int,
    state_create: unsafe extern "C" fn(Handle, *mut State) -> c_int,
    state_destroy: unsafe extern "C" fn(State) -> c_int,
    stream_create: unsafe extern "C" fn(Handle, *mut Stream) -> c_int,
    stream_destroy: unsafe extern "C" fn(Stream) -> c_int,
    stream_parse: unsafe extern "C" fn(Handle, *const u8, usize, c_int, c_int, Stream) -> c_int,
    frame_dimensions: unsafe extern "C" fn(Stream, *mut c_uint, *mut c_uint) -> c_int,
    components_num: unsafe extern "C" fn(Stream, *mut c_uint) -> c_int,
    chroma_subsampling: unsafe extern "C" fn(Stream, *mut c_int) -> c_int,
    jpeg_encoding: unsafe extern "C" fn(Stream, *mut c_int) -> c_int,
    sample_precision: Option<unsafe extern "C" fn(Stream, *mut c_uint) -> c_int>,
    batched_supported: unsafe extern "C" fn(Handle, Stream, *mut c_int) -> c_int,
    batched_initialize: unsafe extern "C" fn(Handle, State, c_int, c_int, c_int) -> c_int,
    batched_preallocate:
        Option<unsafe extern "C" fn(Handle, State, c_int, c_int, c_int, c_int, c_int) -> c_int>,
    batched_decode: unsafe extern "C" fn(
        Handle,
        State,
        *const *const u8,
        *const usize,
        *mut Image,
        sys::CUstream,
    ) -> c_int,
    /// The calls of region decoding, where the library has them all.
    roi: Option<RoiApi>,
}

// SAFETY: function pointers and a library handle, usable from any thread.
unsafe impl Send for Api {}
unsafe impl Sync for Api {}

/// An `nvjpegStatus_t` as its name.
pub fn status_name(status: c_int) -> &'static str {
    match status {
        0 => "NVJPEG_STATUS_SUCCESS",
        1 => "NVJPEG_STATUS_NOT_INITIALIZED",
        2 => "NVJPEG_STATUS_INVALID_PARAMETER",
        3 => "NVJPEG_STATUS_BAD_JPEG",
        4 => "NVJPEG_STATUS_JPEG_NOT_SUPPORTED",
        5 => "NVJPEG_STATUS_ALLOCATOR_FAILURE",
        6 => "NVJPEG_STATUS_EXECUTION_FAILED",
        7 => "NVJPEG_STATUS_ARCH_MISMATCH",
        8 => "NVJPEG_STATUS_INTERNAL_ERROR",
        9 => "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED",
        10 => "NVJPEG_STATUS_INCOMPLETE_BITSTREAM",
        _ => "an unknown nvJPEG status",
    }
}

fn check(call: &'static str, status: c_int) -> Result<(), GpuDecodeError> {
    if status == SUCCESS {
        Ok(())
    } else {
        Err(GpuDecodeError::Call {
            call,
            error: format!("{} ({status})", status_name(status)),
        })
    }
}

/// Resolves one symbol as a plain function pointer.
///
/// # Safety
/// `T` is the symbol's true C signature.
unsafe fn symbol<T: Copy>(
    library: &libloading::Library,
    name: &'static str,
) -> Result<T, GpuDecodeError> {
    // SAFETY: as the caller promises.
    unsafe { library.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| GpuDecodeError::Library {
            library: "libnvjpeg",
            problem: format!("no symbol {name}: {e}"),
        })
}

impl Api {
    fn load(dirs: &[PathBuf]) -> Result<Api, GpuDecodeError> {
        let mut tried = Vec::new();
        let candidates = search_dirs(dirs)
            .into_iter()
            .flat_map(|dir| SONAMES.iter().map(move |name| dir.join(name)))
            .filter(|path| path.is_file())
            .map(|path| path.to_string_lossy().into_owned())
            .chain(SONAMES.iter().map(|s| s.to_string()));
        for candidate in candidates {
            // SAFETY: loading nvJPEG runs its initialisers, which only set up its state.
            match unsafe { libloading::Library::new(&candidate) } {
                Ok(library) => return Self::resolve(library, candidate),
                Err(error) => tried.push(format!("{candidate}: {error}")),
            }
        }
        Err(GpuDecodeError::Library {
            library: "libnvjpeg",
            problem: format!(
                "not found (tried {}); install the CUDA toolkit's nvJPEG 13 (libnvjpeg.so.13) or \
                 NVIDIA's pip wheel of it, or name its folder in STOKER_CUDA_LIB_DIRS",
                tried.join("; ")
            ),
        })
    }

    fn resolve(library: libloading::Library, from: String) -> Result<Api, GpuDecodeError> {
        // SAFETY: each type below is the documented signature of the symbol named with it.
        unsafe {
            let get_property: unsafe extern "C" fn(c_int, *mut c_int) -> c_int =
                symbol(&library, "nvjpegGetProperty")?;
            let mut version = [0; 3];
            for (slot, property) in version.iter_mut().zip(PROPERTIES) {
                check("nvjpegGetProperty", get_property(property, slot))?;
            }
            let version = (version[0], version[1], version[2]);
            if !TESTED_MAJORS.contains(&version.0) {
                return Err(GpuDecodeError::Library {
                    library: "libnvjpeg",
                    problem: format!(
                        "{from} is nvJPEG {}.{}.{}, a version Stoker has not been tested with \
                         (tested: {TESTED_MAJORS:?}.x)",
                        version.0, version.1, version.2
                    ),
                });
            }
            Ok(Api {
                create_ex_v2: symbol(&library, "nvjpegCreateExV2")?,
                destroy: symbol(&library, "nvjpegDestroy")?,
                state_create: symbol(&library, "nvjpegJpegStateCreate")?,
                state_destroy: symbol(&library, "nvjpegJpegStateDestroy")?,
                stream_create: symbol(&library, "nvjpegJpegStreamCreate")?,
                stream_destroy: symbol(&library, "nvjpegJpegStreamDestroy")?,
                stream_parse: symbol(&library, "nvjpegJpegStreamParse")?,
                frame_dimensions: symbol(&library, "nvjpegJpegStreamGetFrameDimensions")?,
                components_num: symbol(&library, "nvjpegJpegStreamGetComponentsNum")?,
                chroma_subsampling: symbol(&library, "nvjpegJpegStreamGetChromaSubsampling")?,
                jpeg_encoding: symbol(&library, "nvjpegJpegStreamGetJpegEncoding")?,
                sample_precision: symbol(&library, "nvjpegJpegStreamGetSamplePrecision").ok(),
                batched_supported: symbol(&library, "nvjpegDecodeBatchedSupported")?,
                batched_initialize: symbol(&library, "nvjpegDecodeBatchedInitialize")?,
                batched_decode: symbol(&library, "nvjpegDecodeBatched")?,
                batched_preallocate: symbol(&library, "nvjpegDecodeBatchedPreAllocate").ok(),
                roi: RoiApi::resolve(&library),
                version,
                from,
                _library: library,
            })
        }
    }
}

/// The process's nvJPEG, loaded on first use from `dirs` (see [`search_dirs`]).
fn api(dirs: &[PathBuf]) -> Result<&'static Api, GpuDecodeError> {
    static API: OnceLock<Result<Api, GpuDecodeError>> = OnceLock::new();
    API.get_or_init(|| Api::load(dirs))
        .as_ref()
        .map_err(Clone::clone)
}

/// The loaded nvJPEG's version and file, or why it cannot be loaded.
pub fn version(dirs: &[PathBuf]) -> Result<((i32, i32, i32), String), GpuDecodeError> {
    let api = api(dirs)?;
    Ok((api.version, api.from.clone()))
}

/// Whether nvJPEG's hardware backend starts on the device whose context is current: a handle
/// made with it as [`Decoder::new`] makes one, and destroyed at once. [`Decoder::new`] tries
/// that backend first too; the lane asks beforehand to plan its memory for the backend it will
/// use.
pub fn hardware_backend(dirs: &[PathBuf]) -> Result<bool, GpuDecodeError> {
    let status = try_backend(api(dirs)?, BACKEND_HARDWARE);
    if status != SUCCESS {
        tracing::debug!(status = status_name(status), "no hardware backend");
    }
    Ok(status == SUCCESS)
}

/// The status of making a handle on `backend` with the lane's allocators (over a budget of
/// their own, unbounded), the handle destroyed at once if made. nvJPEG's V2 creation refuses
/// null allocators (`NVJPEG_STATUS_INVALID_PARAMETER`, whatever the device), so the probe
/// passes real ones, as the decoder does.
fn try_backend(api: &Api, backend: c_int) -> c_int {
    let budget = Arc::new(Budget::new(usize::MAX, None));
    let mut allocators = allocators(&budget);
    let (device, pinned) = &mut *allocators;
    let mut handle = std::ptr::null_mut();
    // SAFETY: the allocators and their budget outlive the handle (destroyed below, before
    // they drop); the out-pointer is a local.
    let status = unsafe { (api.create_ex_v2)(backend, device, pinned, CREATE_FLAGS, &mut handle) };
    if status == SUCCESS {
        // SAFETY: the handle was made just above and nothing else holds it.
        unsafe { (api.destroy)(handle) };
    }
    status
}

/// The device and pinned allocators over `budget` (their context points at it: the budget
/// must outlive any handle made with them).
fn allocators(budget: &Arc<Budget>) -> Box<(Allocator, Allocator)> {
    let ctx = Arc::as_ptr(budget).cast_mut().cast::<c_void>();
    Box::new((
        Allocator {
            malloc: device_malloc,
            free: device_free,
            ctx,
        },
        Allocator {
            malloc: pinned_malloc,
            free: pinned_free,
            ctx,
        },
    ))
}

/// One nvJPEG decoder: a handle (hardware engines where there are, else the default backend),
/// its allocators' budget, a stream parser, and decode states used in turn.
pub struct Decoder {
    api: &'static Api,
    handle: Handle,
    parser: Stream,
    states: Vec<State>,
    hardware: bool,
    // Shared: the allocators' context points at it for the handle's life.
    budget: Arc<Budget>,
    // Kept for the handle's life, in case nvJPEG holds on to the tables themselves.
    _allocators: Box<(Allocator, Allocator)>,
    /// Region decoding, once [`Decoder::enable_roi`] made its parameters.
    roi: Option<RoiParams>,
}

// SAFETY: the decoder is used by one thread at a time (the lane's); nvJPEG handles may move
// between threads.
unsafe impl Send for Decoder {}

impl Decoder {
    /// A decoder with `states` decode states, whose own device allocations stay under
    /// `device_limit` bytes. Call with the device's context current.
    pub fn new(
        dirs: &[PathBuf],
        states: usize,
        batch_hint: c_int,
        device_limit: usize,
        pinned_budget: Option<u64>,
    ) -> Result<Decoder, GpuDecodeError> {
        let api = api(dirs)?;
        let budget = Arc::new(Budget::new(device_limit, pinned_budget));
        let mut allocators = allocators(&budget);
        let mut handle = std::ptr::null_mut();
        let mut chosen = None;
        // The hardware engines first, then the default backend.
        for backend in [BACKEND_HARDWARE, BACKEND_DEFAULT] {
            let (device, pinned) = &mut *allocators;
            // SAFETY: the allocators and their context outlive the handle (the decoder holds
            // both and destroys the handle first, in `Drop`); the out-pointer is a local.
            let status =
                unsafe { (api.create_ex_v2)(backend, device, pinned, CREATE_FLAGS, &mut handle) };
            if status == SUCCESS {
                chosen = Some(backend);
                break;
            }
            tracing::debug!(backend, status = status_name(status), "nvjpegCreateExV2");
        }
        let Some(backend) = chosen else {
            return Err(GpuDecodeError::Call {
                call: "nvjpegCreateExV2",
                error: "no backend starts (hardware or default)".into(),
            });
        };
        let hardware = backend == BACKEND_HARDWARE;
        if !hardware {
            tracing::info!(
                "no hardware JPEG decoder here; the GPU lane uses nvJPEG's default backend"
            );
        }
        let mut decoder = Decoder {
            api,
            handle,
            parser: std::ptr::null_mut(),
            states: Vec::new(),
            hardware,
            budget,
            _allocators: allocators,
            roi: None,
        };
        // SAFETY: the handle is live; out-pointers are fields of `decoder`, which destroys
        // whatever was made if a later step fails.
        unsafe {
            check(
                "nvjpegJpegStreamCreate",
                (api.stream_create)(decoder.handle, &mut decoder.parser),
            )?;
            for _ in 0..states.max(1) {
                let mut state = std::ptr::null_mut();
                check(
                    "nvjpegJpegStateCreate",
                    (api.state_create)(decoder.handle, &mut state),
                )?;
                decoder.states.push(state);
                // The hardware decoder's memory pool (nvImageCodec does the same, with the same
                // minimal size hint): nvJPEG reuses its buffers between batches.
                if let (true, Some(preallocate)) = (hardware, api.batched_preallocate) {
                    let status = preallocate(
                        decoder.handle,
                        state,
                        batch_hint,
                        1,
                        1,
                        CSS_444,
                        OUTPUT_RGBI,
                    );
                    if status != SUCCESS {
                        tracing::debug!(
                            status = status_name(status),
                            "nvjpegDecodeBatchedPreAllocate"
                        );
                    }
                }
            }
        }
        Ok(decoder)
    }

    /// Whether the handle drives the hardware JPEG engines.
    pub fn hardware(&self) -> bool {
        self.hardware
    }

    /// The allocators' budget.
    pub fn budget(&self) -> Arc<Budget> {
        Arc::clone(&self.budget)
    }

    /// nvJPEG's own reading of `bytes`: the whole stream parsed (`nvjpegJpegStreamParse`, the
    /// parse the hardware backend decodes by, not the header alone), then its frame size,
    /// component count, chroma subsampling, coding and sample precision; `None` when it cannot
    /// parse the stream, or its batched decode does not take it.
    pub fn read(&mut self, bytes: &[u8]) -> Option<DecoderReading> {
        let api = self.api;
        let parser = self.parser;
        let ok = |status: c_int| status == SUCCESS;
        let (mut width, mut height, mut components): (c_uint, c_uint, c_uint) = (0, 0, 0);
        let (mut subsampling, mut encoding, mut supported): (c_int, c_int, c_int) = (-1, 0, -1);
        // SAFETY: the handle and parser are live and used by this thread only; `bytes` is read
        // during the parse only (save_stream = 0 keeps a pointer to it, which no later call on
        // this parser reads before the next parse replaces it); each out-pointer is a local of
        // the type nvjpeg.h gives (`nvjpegChromaSubsampling_t` and `nvjpegJpegEncoding_t` are
        // C enums, int-sized).
        unsafe {
            if !ok((api.stream_parse)(
                self.handle,
                bytes.as_ptr(),
                bytes.len(),
                0,
                0,
                parser,
            )) || !ok((api.frame_dimensions)(parser, &mut width, &mut height))
                || !ok((api.components_num)(parser, &mut components))
                || !ok((api.chroma_subsampling)(parser, &mut subsampling))
                || !ok((api.jpeg_encoding)(parser, &mut encoding))
                || !ok((api.batched_supported)(self.handle, parser, &mut supported))
                || supported != 0
            {
                return None;
            }
            let precision = match api.sample_precision {
                Some(get) => {
                    let mut bits: c_uint = 0;
                    if !ok(get(parser, &mut bits)) {
                        return None;
                    }
                    Some(bits)
                }
                None => None,
            };
            Some(DecoderReading {
                width,
                height,
                components,
                subsampling,
                encoding,
                precision,
            })
        }
    }

    /// Decodes `images` to interleaved RGB at `outputs` (device memory, each big enough) on
    /// `stream`, with decode state `state` (which must not be in use by a decode still
    /// running: the caller waits for that one first): of each image the region `regions`
    /// names for it (each one [`Decoder::takes_region`] said yes to), else the whole image.
    ///
    /// # Safety
    /// `outputs` point at device memory of this context large enough for each image (or its
    /// region), which stays allocated until the work queued on `stream` is done; `stream` is
    /// live; no decode of this decoder with regions is still running.
    pub unsafe fn decode(
        &mut self,
        state: usize,
        images: &[&[u8]],
        outputs: &mut [Image],
        regions: &[Option<Region>],
        stream: sys::CUstream,
    ) -> Result<(), GpuDecodeError> {
        let state = self.states[state % self.states.len()];
        let pointers: Vec<*const u8> = images.iter().map(|b| b.as_ptr()).collect();
        let lengths: Vec<usize> = images.iter().map(|b| b.len()).collect();
        if regions.iter().any(Option::is_some) {
            // SAFETY: as the caller promises.
            return unsafe {
                self.decode_regions(state, &pointers, &lengths, outputs, regions, stream)
            };
        }
        // SAFETY: as the caller promises; the arrays live across the calls.
        unsafe {
            self.initialize_batch(state, images.len())?;
            check(
                "nvjpegDecodeBatched",
                (self.api.batched_decode)(
                    self.handle,
                    state,
                    pointers.as_ptr(),
                    lengths.as_ptr(),
                    outputs.as_mut_ptr(),
                    stream,
                ),
            )
        }
    }
}

impl Decoder {
    /// Readies decode state `state` for a batch of `count` images in interleaved RGB.
    ///
    /// # Safety
    /// `state` is this decoder's and no decode with it is still running.
    unsafe fn initialize_batch(&self, state: State, count: usize) -> Result<(), GpuDecodeError> {
        // SAFETY: as the caller promises.
        let status = unsafe {
            (self.api.batched_initialize)(self.handle, state, count as c_int, 1, OUTPUT_RGBI)
        };
        check("nvjpegDecodeBatchedInitialize", status)
    }
}

impl Drop for Decoder {
    fn drop(&mut self) {
        // The region parameters go before the handle they were made with.
        self.roi = None;
        // SAFETY: everything here was made by this decoder and is destroyed once; the lane
        // waits for its streams before dropping it.
        unsafe {
            for state in self.states.drain(..) {
                (self.api.state_destroy)(state);
            }
            if !self.parser.is_null() {
                (self.api.stream_destroy)(self.parser);
            }
            (self.api.destroy)(self.handle);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::libraries::venv_library_dirs;

    /// The nvJPEG of the workspace's virtualenv (`./dev test` installs NVIDIA's wheel, whose
    /// library links the CUDA runtime statically and loads without a GPU), or `None` to skip
    /// (outside CI).
    fn venv_api() -> Option<&'static Api> {
        match api(&venv_library_dirs()) {
            Ok(api) => Some(api),
            Err(GpuDecodeError::Library { problem, .. })
                if std::env::var("CI").as_deref() != Ok("true") =>
            {
                eprintln!("skipped: no libnvjpeg here ({problem}); ./dev test installs it");
                None
            }
            Err(error) => panic!("{error}"),
        }
    }

    #[test]
    fn nvjpeg_13_has_every_call_the_lane_binds_region_decoding_included() {
        // A misspelt name would stop the lane, or leave region decoding off for good, and only
        // a GPU run would tell.
        let Some(api) = venv_api() else { return };
        assert_eq!(api.version.0, 13, "{}", api.from);
        assert!(api.sample_precision.is_some() && api.batched_preallocate.is_some());
        assert!(
            api.roi.is_some(),
            "{} lacks a region decoding call",
            api.from
        );
    }

    /// `nvjpeg.h` of the wheel beside its library, with its whitespace runs made one space.
    fn venv_header() -> Option<String> {
        let found = venv_library_dirs()
            .iter()
            .filter_map(|lib| std::fs::read_to_string(lib.join("../include/nvjpeg.h")).ok())
            .next();
        if found.is_none() && std::env::var("CI").as_deref() == Ok("true") {
            panic!("no nvjpeg.h in the virtualenv's NVIDIA wheels");
        }
        found.map(|text| text.split_whitespace().collect::<Vec<_>>().join(" "))
    }

    #[test]
    fn the_values_and_calls_bound_by_hand_are_nvjpeg_hs() {
        let Some(header) = venv_header() else {
            eprintln!("skipped: no nvjpeg.h here; ./dev test installs NVIDIA's nvJPEG wheel");
            return;
        };
        let mut declared = vec![
            format!("NVJPEG_BACKEND_DEFAULT = {BACKEND_DEFAULT},"),
            format!("NVJPEG_BACKEND_HARDWARE = {BACKEND_HARDWARE},"),
            format!("NVJPEG_CSS_444 = {CSS_444},"),
            format!("NVJPEG_OUTPUT_RGBI = {OUTPUT_RGBI},"),
            "#define NVJPEG_FLAGS_BITSTREAM_STRICT 1<<2".to_string(),
            "#define NVJPEG_MAX_COMPONENT 4".to_string(),
            "unsigned char * channel[NVJPEG_MAX_COMPONENT]; size_t pitch[NVJPEG_MAX_COMPONENT];"
                .to_string(),
            "typedef int (*tDevMallocV2)(void* ctx, void **ptr, size_t size, cudaStream_t stream);"
                .to_string(),
            "typedef int (*tDevFreeV2)(void* ctx, void *ptr, size_t size, cudaStream_t stream);"
                .to_string(),
            "tDevMallocV2 dev_malloc; tDevFreeV2 dev_free; void *dev_ctx;".to_string(),
            "nvjpegCreateExV2(nvjpegBackend_t backend, nvjpegDevAllocatorV2_t *dev_allocator, \
             nvjpegPinnedAllocatorV2_t *pinned_allocator, unsigned int flags, nvjpegHandle_t \
             *handle);"
                .to_string(),
            "nvjpegDecodeParamsSetROI( nvjpegDecodeParams_t decode_params, int offset_x, int \
             offset_y, int roi_width, int roi_height);"
                .to_string(),
            "nvjpegDecodeBatchedEx( nvjpegHandle_t handle, nvjpegJpegState_t jpeg_handle, const \
             unsigned char *const *data, const size_t *lengths, nvjpegImage_t *destinations, \
             nvjpegDecodeParams_t *decode_params, cudaStream_t stream);"
                .to_string(),
            "nvjpegDecodeBatchedSupportedEx(nvjpegHandle_t handle, nvjpegJpegStream_t \
             jpeg_stream, nvjpegDecodeParams_t decode_params, int* is_supported);"
                .to_string(),
            "NVJPEG_ENCODING_BASELINE_DCT = 0xc0,".to_string(),
            "NVJPEG_ENCODING_EXTENDED_SEQUENTIAL_DCT_HUFFMAN = 0xc1,".to_string(),
        ];
        assert_eq!(CREATE_FLAGS, 1 << 2);
        for status in 0..=10 {
            let separator = if status == 10 { "" } else { "," };
            declared.push(format!("{} = {status}{separator}", status_name(status)));
        }
        use crate::decode::jpeg_scan::Chroma;
        for (chroma, name) in [
            (Chroma::S444, "444"),
            (Chroma::S422, "422"),
            (Chroma::S420, "420"),
            (Chroma::S440, "440"),
            (Chroma::Grey, "GRAY"),
        ] {
            declared.push(format!("NVJPEG_CSS_{name} = {},", chroma.nvjpeg_code()));
        }
        for line in declared {
            assert!(header.contains(&line), "nvjpeg.h has no {line:?}");
        }
    }

    #[test]
    fn the_backend_probe_makes_its_handle_as_nvjpeg_accepts_it() {
        // nvjpegCreateExV2 checks its arguments before the device: null allocators are
        // INVALID_PARAMETER on any machine (so a probe passing them read every GPU as lacking
        // the hardware engines), where real ones get as far as the device (here, without CUDA,
        // EXECUTION_FAILED; on a GPU, the backend's answer).
        let Some(api) = venv_api() else { return };
        for backend in [BACKEND_HARDWARE, BACKEND_DEFAULT] {
            let status = try_backend(api, backend);
            assert_ne!(
                status_name(status),
                "NVJPEG_STATUS_INVALID_PARAMETER",
                "backend {backend}"
            );
        }
    }
}
