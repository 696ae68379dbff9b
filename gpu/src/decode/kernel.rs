//! The batched crop-resize-flip kernel: its CUDA source, the per-image geometry it reads
//! ([`CropItem`], laid out as the source's struct), and compiling it with NVRTC (through
//! cudarc, loaded at run time). The lane compiles machine code for its GPU's architecture, so
//! an NVRTC newer than the driver still gives a kernel the driver loads; NVRTC needs no GPU,
//! so a test compiles the source on any machine that has the library.

use std::path::PathBuf;
use std::sync::Mutex;

use stoker_pipeline::SourceWindow;

use super::libraries::preload;
use super::GpuDecodeError;

/// The kernel's CUDA C++ source.
pub const SOURCE: &str = include_str!("crop_resize.cu");

/// The kernel's name in [`SOURCE`].
pub const KERNEL: &str = "crop_resize_flip";

/// The virtual architecture of the PTX made without a GPU's compute capability: the oldest
/// CUDA 13 supports.
pub const ARCH: &str = "compute_75";

/// Threads per block.
pub const BLOCK: u32 = 256;

/// One image's geometry, as the kernel's `CropItem` (same fields, same order, C layout).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CropItem {
    /// Device address of the decoded image's first byte (interleaved RGB).
    pub src: u64,
    /// Bytes from one decoded row to the next.
    pub pitch: u32,
    /// The filter reads source columns `clamp_x0..clamp_x1` and rows `clamp_y0..clamp_y1`.
    pub clamp_x0: i32,
    /// See `clamp_x0`.
    pub clamp_y0: i32,
    /// See `clamp_x0`.
    pub clamp_x1: i32,
    /// See `clamp_x0`.
    pub clamp_y1: i32,
    /// Source coordinate of the output's left edge, counted from `clamp_x0` (the kernel's
    /// positions all count from the clamp's corner, so a region decoded alone gives the same
    /// numbers as the whole image).
    pub origin_x: f32,
    /// Source coordinate of the output's top edge, counted from `clamp_y0`.
    pub origin_y: f32,
    /// Source pixels per output pixel, across.
    pub scale_x: f32,
    /// Source pixels per output pixel, down.
    pub scale_y: f32,
    /// Output columns `inside_x0..inside_x1` and rows `inside_y0..inside_y1` have a source;
    /// the rest is black.
    pub inside_x0: i32,
    /// See `inside_x0`.
    pub inside_y0: i32,
    /// See `inside_x0`.
    pub inside_x1: i32,
    /// See `inside_x0`.
    pub inside_y1: i32,
    /// 1 to mirror left to right.
    pub flip: i32,
    /// The image's row in the output batch.
    pub row: u32,
    /// Device address of the decoded image's last `sentinel_len` bytes, which the kernel
    /// copies to the image's row of the sentinel buffer (`SENTINEL` bytes a row).
    pub sentinel: u64,
    /// At most `SENTINEL` (0: nothing copied).
    pub sentinel_len: u32,
}

/// Bytes of each image's tail the kernel gathers into the sentinel buffer (the kernel's
/// `SENTINEL`), read back to tell whether the decode wrote the image's place: all eight equal
/// to the poison has a chance of 2^-64 for an image with varied bytes, and an image the check
/// doubts wrongly is only built on the CPU.
pub const SENTINEL: usize = 8;

fn clamp_i64(value: i64, low: i64, high: i64) -> i32 {
    value.clamp(low, high.max(low)) as i32
}

impl CropItem {
    /// The kernel's geometry for an image decoded whole at `decoded` (width, height) whose
    /// output pixels come from `window` (as on the CPU: [`stoker_pipeline::resample`]), into an
    /// output of `out` (width, height) at batch row `row`.
    pub fn new(
        window: &SourceWindow,
        decoded: (u32, u32),
        out: (u32, u32),
        flip: bool,
        row: u32,
    ) -> CropItem {
        let (out_w, out_h) = (i64::from(out.0), i64::from(out.1));
        let mut item = CropItem {
            src: 0,
            pitch: decoded.0 * 3,
            clamp_x0: 0,
            clamp_y0: 0,
            clamp_x1: decoded.0 as i32,
            clamp_y1: decoded.1 as i32,
            origin_x: 0.0,
            origin_y: 0.0,
            scale_x: 1.0,
            scale_y: 1.0,
            inside_x0: 0,
            inside_y0: 0,
            inside_x1: out.0 as i32,
            inside_y1: out.1 as i32,
            flip: i32::from(flip),
            row,
            sentinel: 0,
            sentinel_len: 0,
        };
        match *window {
            // The window alone is resized: the filter stays inside it.
            SourceWindow::CropThenResize(crop) => {
                item.clamp_x0 = crop.left as i32;
                item.clamp_y0 = crop.top as i32;
                item.clamp_x1 = (crop.left + crop.width) as i32;
                item.clamp_y1 = (crop.top + crop.height) as i32;
                // The output's edges are the window's, the clamp's corner.
                item.scale_x = (f64::from(crop.width) / f64::from(out.0)) as f32;
                item.scale_y = (f64::from(crop.height) / f64::from(out.1)) as f32;
            }
            // The whole image resized to `resized`, the output cut at (left, top); outside the
            // resized image the output is black.
            SourceWindow::ResizeThenCrop { resized, left, top } => {
                let factor_x = f64::from(decoded.0) / f64::from(resized.0);
                let factor_y = f64::from(decoded.1) / f64::from(resized.1);
                item.origin_x = (left as f64 * factor_x) as f32;
                item.origin_y = (top as f64 * factor_y) as f32;
                item.scale_x = factor_x as f32;
                item.scale_y = factor_y as f32;
                let x0 = (-left).clamp(0, out_w);
                let y0 = (-top).clamp(0, out_h);
                item.inside_x0 = x0 as i32;
                item.inside_y0 = y0 as i32;
                item.inside_x1 = clamp_i64(i64::from(resized.0) - left, x0, out_w);
                item.inside_y1 = clamp_i64(i64::from(resized.1) - top, y0, out_h);
            }
        }
        item
    }
}

/// A compute capability (major, minor), or `None` for PTX of `compute_75`.
type Arch = Option<(i32, i32)>;

/// What NVRTC made of [`SOURCE`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compiled {
    /// Machine code for one GPU architecture: loads on any driver of the same major CUDA
    /// version, whatever NVRTC's minor version.
    Cubin(Vec<u8>),
    /// PTX text for `compute_75`, which the driver compiles when it loads it (needs a driver at
    /// least as new as the NVRTC that wrote it).
    Ptx(String),
}

impl Compiled {
    /// The image for `cuModuleLoadData`, NUL-terminated.
    pub fn image(&self) -> Vec<u8> {
        let mut image = match self {
            Compiled::Cubin(bytes) => bytes.clone(),
            Compiled::Ptx(text) => text.clone().into_bytes(),
        };
        image.push(0);
        image
    }
}

fn nvrtc_failed(
    call: &'static str,
) -> impl Fn(cudarc::nvrtc::result::NvrtcError) -> GpuDecodeError {
    move |error| GpuDecodeError::Kernel(format!("{call}: {error:?}"))
}

/// Compiles [`SOURCE`] with NVRTC, loading `libnvrtc` from the first of `dirs` that has it
/// (else from the usual search): machine code for compute capability `sm` (major, minor)
/// when given, else PTX for `compute_75`.
pub fn compile(dirs: &[PathBuf], sm: Option<(i32, i32)>) -> Result<Compiled, GpuDecodeError> {
    // Compiled once per architecture and process (NVRTC takes a few hundred milliseconds).
    static DONE: Mutex<Vec<(Arch, Compiled)>> = Mutex::new(Vec::new());
    let mut done = DONE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, compiled)) = done.iter().find(|(arch, _)| *arch == sm) {
        return Ok(compiled.clone());
    }
    let compiled = compile_now(dirs, sm)?;
    done.push((sm, compiled.clone()));
    Ok(compiled)
}

fn compile_now(dirs: &[PathBuf], sm: Option<(i32, i32)>) -> Result<Compiled, GpuDecodeError> {
    use cudarc::nvrtc::{result, sys};

    let found = preload(&["libnvrtc.so.13", "libnvrtc.so.12"], dirs);
    // SAFETY: only tries to open the library by its usual names (the one preloaded above
    // answers to its soname).
    if !unsafe { sys::is_culib_present() } {
        return Err(GpuDecodeError::Library {
            library: "libnvrtc",
            problem: found.err().unwrap_or_else(|| "not found".into()),
        });
    }
    let source =
        std::ffi::CString::new(SOURCE).map_err(|e| GpuDecodeError::Kernel(e.to_string()))?;
    let program =
        result::create_program(&source, None).map_err(nvrtc_failed("nvrtcCreateProgram"))?;
    let arch = match sm {
        Some((major, minor)) => format!("--gpu-architecture=sm_{major}{minor}"),
        None => format!("--gpu-architecture={ARCH}"),
    };
    // SAFETY: `program` is live until destroyed below; the outputs are read into buffers of
    // the sizes NVRTC gives.
    let compiled = unsafe {
        let outcome = (|| {
            // No multiply-add contraction: the kernel computes as written, as its host build
            // in the tests does (`kernel_host`).
            let options = [arch.clone(), "--fmad=false".to_string()];
            if let Err(error) = result::compile_program(program, &options) {
                let log = result::get_program_log(program)
                    .map(|raw| {
                        std::ffi::CStr::from_ptr(raw.as_ptr())
                            .to_string_lossy()
                            .into_owned()
                    })
                    .unwrap_or_default();
                return Err(GpuDecodeError::Kernel(format!(
                    "NVRTC ({arch}): {error:?}: {log}"
                )));
            }
            if sm.is_some() {
                let mut size = 0usize;
                sys::nvrtcGetCUBINSize(program, &mut size)
                    .result()
                    .map_err(nvrtc_failed("nvrtcGetCUBINSize"))?;
                let mut cubin = vec![0u8; size];
                sys::nvrtcGetCUBIN(program, cubin.as_mut_ptr().cast())
                    .result()
                    .map_err(nvrtc_failed("nvrtcGetCUBIN"))?;
                Ok(Compiled::Cubin(cubin))
            } else {
                let ptx = result::get_ptx(program).map_err(nvrtc_failed("nvrtcGetPTX"))?;
                Ok(Compiled::Ptx(
                    std::ffi::CStr::from_ptr(ptx.as_ptr())
                        .to_string_lossy()
                        .into_owned(),
                ))
            }
        })();
        let _ = result::destroy_program(program);
        outcome
    };
    compiled
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::Element;
    use stoker_pipeline::CropWindow;

    #[test]
    fn the_item_matches_the_kernels_struct_layout() {
        // 8 + 4 + 4*4 + 4*4 + 4*4 + 4 + 4 = 68 bytes, padded to 72 for the u64 after them,
        // + 8 + 4 = 84, padded to the u64's alignment.
        assert_eq!(std::mem::size_of::<CropItem>(), 88);
        assert_eq!(std::mem::offset_of!(CropItem, sentinel), 72);
        assert_eq!(std::mem::align_of::<CropItem>(), 8);
        for field in [
            "unsigned long long src;",
            "unsigned int pitch;",
            "int clamp_x0;",
            "float origin_x;",
            "float scale_y;",
            "int inside_y1;",
            "int flip;",
            "unsigned int row;",
            "unsigned long long sentinel;",
            "unsigned int sentinel_len;",
        ] {
            assert!(
                SOURCE.contains(field),
                "{field} missing from the kernel source"
            );
        }
        for field in [
            "float scale[3];",
            "float shift[3];",
            "int element;",
            "int planar;",
            "TailParams tail) {",
        ] {
            assert!(
                SOURCE.contains(field),
                "{field} missing from the kernel source"
            );
        }
        for (name, element) in [
            ("U8", Element::U8),
            ("F32", Element::F32),
            ("BF16", Element::Bf16),
            ("F16", Element::F16),
        ] {
            assert!(SOURCE.contains(&format!("#define OUT_{name} {}\n", element as i32)));
        }
        assert!(SOURCE.contains(&format!("__global__ void {KERNEL}(")));
        assert!(SOURCE.contains(&format!("#define SENTINEL {SENTINEL}\n")));
    }

    #[test]
    fn nvrtc_compiles_the_kernel_to_ptx_and_machine_code() {
        let dirs = crate::decode::libraries::venv_library_dirs();
        let ptx = match compile(&dirs, None) {
            Ok(Compiled::Ptx(ptx)) => ptx,
            Ok(other) => panic!("PTX asked for, got {other:?}"),
            Err(GpuDecodeError::Library { problem, .. }) => {
                // `cargo test` runs before `./dev test` makes the virtualenv on a clean
                // machine; the Python suite's test_gpu_decode.py then compiles it in CI.
                eprintln!("skipped: no libnvrtc here ({problem})");
                return;
            }
            Err(error) => panic!("{error}"),
        };
        assert!(ptx.contains(&format!(".entry {KERNEL}")), "{ptx}");
        match compile(&dirs, Some((9, 0))) {
            Ok(Compiled::Cubin(cubin)) => assert_eq!(&cubin[..4], b"\x7fELF"),
            other => panic!("machine code asked for, got {other:?}"),
        }
        // An architecture NVRTC does not know is an error naming it, not a panic.
        match compile(&dirs, Some((1, 0))) {
            Err(GpuDecodeError::Kernel(message)) => assert!(message.contains("sm_10"), "{message}"),
            other => panic!("sm_10 compiled: {other:?}"),
        }
    }

    #[test]
    fn a_crop_is_resized_alone_and_a_centre_crop_has_black_edges() {
        let crop = CropWindow {
            left: 10,
            top: 20,
            width: 448,
            height: 224,
        };
        let item = CropItem::new(
            &SourceWindow::CropThenResize(crop),
            (500, 400),
            (224, 224),
            true,
            7,
        );
        assert_eq!((item.clamp_x0, item.clamp_x1), (10, 458));
        assert_eq!((item.clamp_y0, item.clamp_y1), (20, 244));
        assert_eq!((item.scale_x, item.scale_y), (2.0, 1.0));
        assert_eq!((item.flip, item.row, item.pitch), (1, 7, 1500));

        // A 200x100 image resized to 448x224 and cut to 224x300 at (112, -38): rows 38..262
        // of the output have a source.
        let item = CropItem::new(
            &SourceWindow::ResizeThenCrop {
                resized: (448, 224),
                left: 112,
                top: -38,
            },
            (200, 100),
            (224, 300),
            false,
            0,
        );
        assert_eq!((item.inside_x0, item.inside_x1), (0, 224));
        assert_eq!((item.inside_y0, item.inside_y1), (38, 262));
        assert!((item.scale_x - 200.0 / 448.0).abs() < 1e-6);
        assert!((item.origin_y - (-38.0 * 100.0 / 224.0)).abs() < 1e-4);
        assert_eq!((item.clamp_x1, item.clamp_y1), (200, 100));
    }
}
