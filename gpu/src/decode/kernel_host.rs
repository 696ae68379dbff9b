//! Tests only: the crop kernel's source compiled for the host with the system's C++ compiler
//! (a small shim stands in for CUDA's built-ins and runs each thread of a launch in turn) and
//! run on the CPU, where it is held to the CPU path's resize, to the host's copy of its tail
//! arithmetic, and to itself reading a region instead of the whole image. NVRTC compiles the
//! kernel without contracting multiplies and adds (`--fmad=false`), and this build does the
//! same (`-ffp-contract=off`), so the GPU computes what runs here, operation for operation.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use fast_image_resize::Resizer;
use stoker_pipeline::{flip_horizontal, resample, CropWindow, DecodedImage, SourceWindow};

use super::kernel::{CropItem, BLOCK, SENTINEL, SOURCE};
use super::region::region_for;
use super::{Element, RowTail, TailParams};

/// CUDA's built-ins as plain C++, and a launch as loops over its blocks and threads.
const SHIM: &str = r#"
#include <math.h>
#define __device__
#define __forceinline__ inline
#define __global__
struct HostDim { unsigned int x, y, z; };
// One launch per test thread at a time: the tests run in parallel.
static thread_local HostDim blockIdx, threadIdx, blockDim;
static inline unsigned int __float_as_uint(float f) {
    unsigned int u;
    __builtin_memcpy(&u, &f, sizeof u);
    return u;
}
static inline int max(int a, int b) { return a > b ? a : b; }
static inline int min(int a, int b) { return a < b ? a : b; }
#include "crop_resize.cu"
extern "C" void launch_on_host(const CropItem* items, int count, unsigned char* out, int out_w,
                               int out_h, unsigned char* sentinels, TailParams tail,
                               unsigned int block) {
    blockDim.x = block;
    const unsigned int blocks = ((unsigned int)(out_w * out_h) + block - 1) / block;
    for (int image = 0; image < count; ++image) {
        for (unsigned int b = 0; b < blocks; ++b) {
            for (unsigned int t = 0; t < block; ++t) {
                blockIdx.x = b;
                blockIdx.y = (unsigned int)image;
                threadIdx.x = t;
                crop_resize_flip(items, out, out_w, out_h, sentinels, tail);
            }
        }
    }
}
"#;

type Launch =
    unsafe extern "C" fn(*const CropItem, i32, *mut u8, i32, i32, *mut u8, TailParams, u32);

struct HostKernel {
    _library: libloading::Library,
    launch: Launch,
}

/// The kernel built for the host, once per test process; `None` (the tests skip) where no C++
/// compiler runs, except in CI, where that fails.
fn host_kernel() -> Option<&'static HostKernel> {
    static KERNEL: OnceLock<Option<HostKernel>> = OnceLock::new();
    KERNEL
        .get_or_init(|| match build() {
            Ok(kernel) => Some(kernel),
            Err(why) if std::env::var("CI").as_deref() != Ok("true") => {
                eprintln!("skipped: the kernel was not built for the host ({why})");
                None
            }
            Err(why) => panic!("the kernel was not built for the host: {why}"),
        })
        .as_ref()
}

fn build() -> Result<HostKernel, String> {
    let dir = std::env::temp_dir().join(format!("stoker-kernel-host-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let built = build_in(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    built
}

fn build_in(dir: &Path) -> Result<HostKernel, String> {
    std::fs::write(dir.join("crop_resize.cu"), SOURCE).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("shim.cpp"), SHIM).map_err(|e| e.to_string())?;
    let library = dir.join("kernel.so");
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let output = Command::new(&compiler)
        .args([
            "-std=c++17",
            "-O2",
            "-shared",
            "-fPIC",
            "-ffp-contract=off",
            "-o",
        ])
        .arg(&library)
        .arg(dir.join("shim.cpp"))
        .output()
        .map_err(|e| format!("{compiler}: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "{compiler}: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    // SAFETY: the library was just built from the kernel and the shim; loading it runs no
    // initialisers of note.
    let library = unsafe { libloading::Library::new(&library) }.map_err(|e| e.to_string())?;
    // SAFETY: `launch_on_host` has this signature in the shim.
    let launch = unsafe { library.get::<Launch>(b"launch_on_host") }
        .map(|symbol| *symbol)
        .map_err(|e| e.to_string())?;
    Ok(HostKernel {
        _library: library,
        launch,
    })
}

/// A test image: gradients, edges and noise, so that filters that differ show it.
fn test_image(width: u32, height: u32) -> Vec<u8> {
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut pixels = Vec::with_capacity(width as usize * height as usize * 3);
    for y in 0..height {
        for x in 0..width {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let noise = (seed % 48) as u32;
            let edge = if (x / 17 + y / 11) % 2 == 0 { 0 } else { 90 };
            pixels.push(((x * 255 / width + noise) % 256) as u8);
            pixels.push(((y * 255 / height + edge) % 256) as u8);
            pixels.push(((x + y + noise * 3) % 256) as u8);
        }
    }
    pixels
}

/// The kernel's rows for `items` (their `src` pointing into memory the caller keeps alive),
/// `out` (width, height) pixels each, with `tail`; and the sentinels it gathered.
fn launch(items: &[CropItem], out: (u32, u32), tail: RowTail) -> (Vec<u8>, Vec<u8>) {
    let kernel = host_kernel().expect("checked by the caller");
    let mut rows = vec![0u8; items.len() * tail.row_bytes(out.1, out.0)];
    let mut sentinels = vec![0u8; items.len() * SENTINEL];
    // SAFETY: each item's source lies in memory the caller keeps alive, its rows and sentinel
    // rows (`row` < `items.len()`) in the buffers above, sized for them.
    unsafe {
        (kernel.launch)(
            items.as_ptr(),
            items.len() as i32,
            rows.as_mut_ptr(),
            out.0 as i32,
            out.1 as i32,
            sentinels.as_mut_ptr(),
            tail.params(),
            BLOCK,
        );
    }
    (rows, sentinels)
}

fn item_over(
    pixels: &[u8],
    window: &SourceWindow,
    size: (u32, u32),
    out: (u32, u32),
    flip: bool,
    row: u32,
) -> CropItem {
    let mut item = CropItem::new(window, size, out, flip, row);
    item.src = pixels.as_ptr() as u64;
    let len = pixels.len().min(SENTINEL);
    item.sentinel = pixels[pixels.len() - len..].as_ptr() as u64;
    item.sentinel_len = len as u32;
    item
}

/// The windows the tests cut: RandomResizedCrop's kind (shrinking, the whole image, growing,
/// at the edges) and a resize before a centre crop.
fn windows(width: u32, height: u32) -> Vec<SourceWindow> {
    let crop = |left, top, width, height| {
        SourceWindow::CropThenResize(CropWindow {
            left,
            top,
            width,
            height,
        })
    };
    vec![
        crop(10, 20, 200, 150),
        crop(0, 0, width, height),
        crop(100, 50, 30, 40),
        crop(
            width.saturating_sub(61),
            height.saturating_sub(97),
            61.min(width),
            97.min(height),
        ),
        crop(37, 3, 255, 64),
        crop(width * 3 / 4 - 40, height / 2 + 3, width / 5, height / 3),
        crop(width / 2 + 1, height / 3, width / 2 - 2, height / 2),
        SourceWindow::ResizeThenCrop {
            resized: (97, 73),
            left: 16,
            top: 4,
        },
    ]
}

#[test]
fn the_kernel_resizes_as_the_cpu_path_does() {
    if host_kernel().is_none() {
        return;
    }
    let (width, height, out) = (333u32, 250u32, (64u32, 64u32));
    let pixels = test_image(width, height);
    let decoded = DecodedImage {
        pixels: pixels.clone(),
        width,
        height,
        offset_x: 0,
        offset_y: 0,
        scaled_width: width,
        scaled_height: height,
        scale_eighths: 8,
        original_width: width,
        original_height: height,
    };
    let mut resizer = Resizer::new();
    let (mut values, mut differing, mut largest, mut signed) = (0usize, 0usize, 0u8, 0i64);
    for window in windows(width, height) {
        for flip in [false, true] {
            let item = item_over(&pixels, &window, (width, height), out, flip, 0);
            let (rows, _) = launch(&[item], out, RowTail::BYTES);
            let mut cpu = vec![0u8; out.0 as usize * out.1 as usize * 3];
            resample(&decoded, &window, out, &mut cpu, &mut resizer).expect("resample");
            if flip {
                flip_horizontal(&mut cpu, out.0);
            }
            for (a, b) in rows.iter().zip(&cpu) {
                let diff = a.abs_diff(*b);
                differing += usize::from(diff != 0);
                largest = largest.max(diff);
                signed += i64::from(*a) - i64::from(*b);
            }
            values += cpu.len();
        }
    }
    eprintln!(
        "kernel against the CPU's resize: {differing} of {values} values differ, by at most \
         {largest}; kernel minus CPU {signed} in all"
    );
    // The kernel's float taps (PIL's arithmetic) against fast_image_resize's fixed-point ones:
    // rounding alone, so never more than 1 apart, and as often up as down (measured here: 12.1%
    // of the values differ, kernel minus CPU -148 over all 196,608).
    assert!(largest <= 1, "a value differs by {largest}");
    assert!(
        differing * 6 <= values,
        "{differing} of {values} values differ"
    );
    assert!(
        signed.unsigned_abs() as usize * 20 <= differing,
        "biased by {signed}"
    );
}

/// Whether `window` lies within a `width x height` image (a resize before the crop always
/// does).
fn fits(window: &SourceWindow, width: u32, height: u32) -> bool {
    match window {
        SourceWindow::CropThenResize(crop) => {
            u64::from(crop.left) + u64::from(crop.width) <= u64::from(width)
                && u64::from(crop.top) + u64::from(crop.height) <= u64::from(height)
        }
        SourceWindow::ResizeThenCrop { .. } => true,
    }
}

#[test]
fn the_kernel_applies_the_tail_as_the_host_does() {
    if host_kernel().is_none() {
        return;
    }
    let (width, height, out) = (120u32, 90u32, (32u32, 24u32));
    let pixels = test_image(width, height);
    let items: Vec<CropItem> = windows(width, height)
        .iter()
        .filter(|window| fits(window, width, height))
        .enumerate()
        .map(|(row, window)| {
            let flip = row % 2 == 1;
            item_over(&pixels, window, (width, height), out, flip, row as u32)
        })
        .collect();
    let (bytes, _) = launch(&items, out, RowTail::BYTES);
    let row_bytes = RowTail::BYTES.row_bytes(out.1, out.0);
    for element in [Element::F32, Element::Bf16, Element::F16, Element::U8] {
        for planar in [false, true] {
            let tail = RowTail {
                element,
                planar,
                scale: [
                    1.0 / (255.0 * 0.229),
                    1.0 / (255.0 * 0.224),
                    1.0 / (255.0 * 0.225),
                ],
                shift: [-0.485 / 0.229, -0.456 / 0.224, -0.406 / 0.225],
            };
            let tail = if element == Element::U8 {
                RowTail {
                    planar,
                    ..RowTail::BYTES
                }
            } else {
                tail
            };
            let (rows, _) = launch(&items, out, tail);
            let size = tail.row_bytes(out.1, out.0);
            for (k, row) in bytes.chunks_exact(row_bytes).enumerate() {
                let mut expected = vec![0u8; size];
                tail.apply(row, out.1, out.0, &mut expected);
                assert!(
                    rows[k * size..(k + 1) * size] == expected[..],
                    "{element:?} planar {planar}, row {k}"
                );
            }
        }
    }
}

#[test]
fn a_region_decoded_alone_gives_the_whole_images_rows_and_sentinels_its_last_bytes() {
    if host_kernel().is_none() {
        return;
    }
    let out = (64u32, 64u32);
    let (mut values, mut regions) = (0usize, 0);
    // A small frame, and a large one, where a window's place in the whole image is a large
    // float and its place in the region a small one.
    for (width, height) in [(333u32, 250u32), (3001, 2003)] {
        let pixels = test_image(width, height);
        for window in windows(width, height) {
            for mcu in [(8, 8), (16, 16), (16, 8)] {
                let Some(decode) = region_for(&window, (width, height), mcu) else {
                    continue;
                };
                regions += 1;
                // What the engines write for the region: its rows of the whole image.
                let r = decode.region;
                let region: Vec<u8> = (r.top..r.top + r.height)
                    .flat_map(|y| {
                        let start = (y as usize * width as usize + r.left as usize) * 3;
                        pixels[start..start + r.width as usize * 3].iter().copied()
                    })
                    .collect();
                let whole = item_over(&pixels, &window, (width, height), out, true, 0);
                let part = item_over(&region, &decode.window, (r.width, r.height), out, true, 1);
                let (rows, sentinels) = launch(&[whole, part], out, RowTail::BYTES);
                let (a, b) = rows.split_at(rows.len() / 2);
                // The kernel's positions count from the window's corner in both: the same
                // numbers, the same rows.
                assert!(a == b, "{window:?} in {width}x{height}, region {r:?}");
                values += a.len();
                assert_eq!(&sentinels[..SENTINEL], &pixels[pixels.len() - SENTINEL..]);
                assert_eq!(&sentinels[SENTINEL..], &region[region.len() - SENTINEL..]);
            }
        }
    }
    assert!(regions >= 16, "{regions}");
    eprintln!("region against whole image: {values} values, all equal");
}
