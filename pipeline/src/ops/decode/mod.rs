//! Image decoding to packed RGB8, the way PIL's `Image.open(f).convert("RGB")` gives it:
//!
//! - JPEG through libjpeg-turbo (TurboJPEG 3 API, with region and DCT-scaled decoding), in
//!   YCbCr, RGB, grayscale, CMYK and YCCK; CMYK and YCCK are converted to RGB exactly as Pillow
//!   does (see [`cmyk_to_rgb`]);
//! - PNG through the `png` crate;
//! - WebP (lossy, lossless, with alpha; an animation's first frame), BMP, TIFF (the first
//!   page, one plane of gray, RGB, RGBA or CMYK samples: a palette, YCbCr, planar or
//!   gray-with-alpha TIFF or a BigTIFF, which PIL reads, is [`SampleError::UnsupportedKind`])
//!   and PBM/PGM/PPM through the `image` crate;
//! - GIF (the first frame) through the `gif` crate, composed as Pillow composes it: on a
//!   canvas of the logical screen (grown to hold the frame where it reaches past), the part the
//!   frame leaves uncovered in the colour of its transparent index (else of index 0), a palette
//!   of gray entries in index order read as gray for every index, as Pillow reads it.
//!
//! The format comes from the bytes ([`sniff_format`]), never from a file name. Alpha is dropped
//! without compositing and gray is replicated to three channels, as `convert("RGB")` does (a
//! GIF's transparent pixels keep their palette colour, as PIL's palette lookup gives them; a
//! TIFF's associated, premultiplied, alpha is first divided out as Pillow's unpacking does).
//! Where PIL differs, measured against Pillow 13.0:
//!
//! - 16-bit samples keep their high byte. PIL does the same for 16-bit colour PNG and TIFF, but
//!   clips 16-bit *gray* (PNG, TIFF, PGM: modes "I;16" and "I") at 255, so such an image comes
//!   out as its 8-bit version here and nearly white from PIL;
//! - PNM with a maximum other than 255 (a 16-bit PPM, a PGM of maxval 100) is scaled to 8 bits
//!   by the `image` crate and by PIL with other rounding: one level apart at most; a CMYK
//!   TIFF is turned into RGB by the `image` crate's formula, one level from Pillow's at most
//!   for 8-bit samples (16-bit ones were not compared);
//! - a GIF without any colour table (gray to PIL), or with blocks the `gif` crate refuses (an
//!   extension of an unknown label, a graphic control block of more than 4 bytes or of 3
//!   without transparency, a stray byte between blocks), is a bad sample; the transparent
//!   index is the last graphic control block's before the first frame here (PIL keeps an
//!   earlier one's where the last gives none), and of a block of several sub-blocks, the last
//!   sub-block's (PIL reads the first).
//!
//! Lossy WebP comes out bit-exact against Pillow's libwebp 1.6 on every image tried (qualities
//! 5 to 99, methods 0 to 6, with and without alpha); the Python suite's
//! `test_image_formats.py` checks it.
//!
//! Sizes come from the header alone ([`read_header`]), and the pixel limit is applied before
//! any pixel is decoded; the `image` crate's decoders also get [`image::Limits`] (the header's
//! width and height, and an allocation cap from them), so a file whose later headers claim
//! more than its first cannot allocate past it.
//!
//! The safe `turbojpeg` wrapper does not expose `tj3SetCroppingRegion`, so JPEG decoding talks
//! to `turbojpeg::raw` through a small owned handle. Every call checks its return code; errors
//! and warnings (a truncated file is a warning to libjpeg) become [`SampleError::Corrupt`], as
//! does a progressive JPEG of more than 500 scans, but for padding before the end-of-image
//! marker and three quirks Pillow reads through (a JFIF header of version 2, a sequential
//! scan's fields as Samsung phones write them, bytes between two header segments that libjpeg
//! discards, where they cannot be the sign of damage), which are decoded from a mended copy
//! (`jpeg_markers.rs`). A region that libjpeg refuses (its crop alignment follows the file's
//! sampling factors, which TurboJPEG's subsampling classes do not always name) is decoded
//! whole at the same scale.

use std::cell::RefCell;
use std::ffi::CStr;
use std::os::raw::c_int;

use stoker_datasets::{sniff_format, ImageFormat};
use turbojpeg::raw;

mod formats;
mod jpeg_markers;

use super::geometry::CropWindow;
use crate::error::SampleError;
use formats::{
    bmp_size, decode_gif, decode_png, decode_with_image_crate, gif_size, png_header, unsupported,
};
use jpeg_markers::jpeg_size;

/// A libjpeg warning that says nothing of the pixels: bytes between the last scan's data and the
/// end-of-image marker, given once the whole image was decoded (see
/// `JpegDecompressor::check_decoded`).
const HARMLESS_WARNING: &str = "extraneous bytes before marker 0xd9";

/// PIL's `Image.MAX_IMAGE_PIXELS`: the default limit against decompression bombs.
pub const DEFAULT_MAX_PIXELS: u64 = 89_478_485;

/// What the header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageHeader {
    /// The container format, from the leading bytes (never [`ImageFormat::Other`]).
    pub format: ImageFormat,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
}

/// Packed RGB8 pixels of (part of) an image.
#[derive(Debug, Default)]
pub struct DecodedImage {
    /// `width * height * 3` bytes, rows without padding.
    pub pixels: Vec<u8>,
    /// Width of `pixels`.
    pub width: u32,
    /// Height of `pixels`.
    pub height: u32,
    /// Left edge of `pixels` in the scaled image (a region decode starts at an iMCU boundary).
    pub offset_x: u32,
    /// Top edge of `pixels` in the scaled image.
    pub offset_y: u32,
    /// Size of the whole image at the decode scale: `ceil(original * scale)`.
    pub scaled_width: u32,
    /// See `scaled_width`.
    pub scaled_height: u32,
    /// The DCT scale used: `scale_num / 8` (8 means full size).
    pub scale_eighths: u32,
    /// Width of the image as its header gives it (before any DCT scaling): its true extent
    /// in decoded pixels is this times [`DecodedImage::scale`], which `scaled_width` rounds up.
    pub original_width: u32,
    /// See `original_width`.
    pub original_height: u32,
}

impl DecodedImage {
    /// The scale from original to decoded pixels.
    pub fn scale(&self) -> f64 {
        f64::from(self.scale_eighths) / 8.0
    }
}

/// How much of the image to decode and how small it may come out.
#[derive(Debug, Clone, Copy)]
pub struct DecodeRequest {
    /// Only this part of the image is needed (original pixel coordinates); `None` for all.
    pub region: Option<CropWindow>,
    /// The region will be resized to this (width, height): with DCT scaling allowed, decode at
    /// the smallest 1/8, 1/4 or 1/2 scale that keeps the region at least this large.
    pub target: (u32, u32),
    /// Allow DCT-domain downscaling.
    pub allow_dct_scaling: bool,
    /// Refuse images with more pixels than this.
    pub max_pixels: u64,
}

/// Reads the format and size without decoding pixels, and applies the pixel limit.
pub fn read_header(bytes: &[u8], max_pixels: u64) -> Result<ImageHeader, SampleError> {
    if bytes.is_empty() {
        return Err(SampleError::Empty);
    }
    let format = sniff_format(bytes);
    let (width, height) = match format {
        ImageFormat::Png => png_header(bytes)?,
        ImageFormat::Other => return Err(unsupported(bytes)),
        // For JPEG, TurboJPEG's header call reports success without touching its stored size
        // when the data ends before the frame header (it takes that for a tables-only stream),
        // so the size comes from a marker scan of our own bytes instead.
        ImageFormat::Jpeg => jpeg_size(bytes)?,
        // A BMP's height is signed (top-down rows), and an OS/2 header's fields are 16-bit.
        ImageFormat::Bmp => bmp_size(bytes)?,
        // A GIF's size is Pillow's: the logical screen, grown to hold the first frame.
        ImageFormat::Gif => gif_size(bytes)?,
        // The others have their size in a fixed header (a TIFF's in its first directory),
        // which imagesize reads without touching pixel data.
        ImageFormat::WebP | ImageFormat::Tiff | ImageFormat::Pnm => {
            let size = imagesize::blob_size(bytes)
                .map_err(|e| SampleError::Corrupt(format!("{} header: {e}", format.name())))?;
            (
                u32::try_from(size.width).unwrap_or(u32::MAX),
                u32::try_from(size.height).unwrap_or(u32::MAX),
            )
        }
    };
    if width == 0 || height == 0 {
        return Err(SampleError::Corrupt(format!(
            "image has size {width}x{height}"
        )));
    }
    if u64::from(width) * u64::from(height) > max_pixels {
        return Err(SampleError::TooManyPixels {
            width: u64::from(width),
            height: u64::from(height),
            limit: max_pixels,
        });
    }
    Ok(ImageHeader {
        format,
        width,
        height,
    })
}

/// Decodes `bytes` (whose header is `header`) to RGB8 into `out`, reusing its allocation.
pub fn decode(
    bytes: &[u8],
    header: &ImageHeader,
    request: &DecodeRequest,
    out: &mut DecodedImage,
) -> Result<(), SampleError> {
    match header.format {
        ImageFormat::Jpeg => JPEG_DECOMPRESSOR.with(|cell| {
            let mut decompressor = cell.borrow_mut();
            decompressor.get()?.decode(bytes, header, request, out)
        }),
        ImageFormat::Png => decode_png(bytes, request.max_pixels, out),
        ImageFormat::WebP => decode_with_image_crate(bytes, header, image::ImageFormat::WebP, out),
        ImageFormat::Bmp => decode_with_image_crate(bytes, header, image::ImageFormat::Bmp, out),
        ImageFormat::Tiff => decode_with_image_crate(bytes, header, image::ImageFormat::Tiff, out),
        ImageFormat::Pnm => decode_with_image_crate(bytes, header, image::ImageFormat::Pnm, out),
        ImageFormat::Gif => decode_gif(bytes, header, out),
        ImageFormat::Other => Err(unsupported(bytes)),
    }
}

thread_local! {
    // One TurboJPEG instance per decode thread: creating one costs more than a small decode.
    static JPEG_DECOMPRESSOR: RefCell<LazyDecompressor> = const { RefCell::new(LazyDecompressor(None)) };
}

struct LazyDecompressor(Option<JpegDecompressor>);

impl LazyDecompressor {
    fn get(&mut self) -> Result<&mut JpegDecompressor, SampleError> {
        if self.0.is_none() {
            self.0 = Some(JpegDecompressor::new()?);
        }
        self.0
            .as_mut()
            .ok_or_else(|| SampleError::Corrupt("no JPEG decompressor".into()))
    }
}

/// An owned TurboJPEG decompression handle.
struct JpegDecompressor {
    handle: raw::tjhandle,
    /// CMYK pixels of the last four-component JPEG, before [`cmyk_to_rgb`]; kept for reuse.
    cmyk: Vec<u8>,
}

// iMCU widths by subsampling, in TurboJPEG's TJSAMP order (444, 422, 420, GRAY, 440, 411, 441).
const MCU_WIDTH: [u32; 7] = [8, 16, 16, 8, 8, 32, 8];

/// A per-thread decode buffer larger than this is let go after use instead of kept for the
/// next sample: a few very large images (up to the pixel limit, 268 MB of RGB) would otherwise
/// hold their size on every decode thread for good, outside every memory budget. 64 MiB keeps
/// the buffers of photos up to about 22 megapixels.
pub(crate) const SCRATCH_KEEP_BYTES: usize = 64 << 20;

/// The most scans a progressive JPEG may have: libjpeg walks every block of the image on each
/// scan, so a small file repeating one scan thousands of times would hold a decode thread for
/// minutes (libjpeg-turbo's own advice for untrusted input: 500).
const MAX_SCANS: c_int = 500;

impl JpegDecompressor {
    fn new() -> Result<Self, SampleError> {
        // SAFETY: tj3Init has no preconditions; a null return is handled below.
        let handle = unsafe { raw::tj3Init(raw::TJINIT_TJINIT_DECOMPRESS as c_int) };
        if handle.is_null() {
            return Err(SampleError::Corrupt(
                "libjpeg-turbo could not create a decompressor".into(),
            ));
        }
        Ok(Self {
            handle,
            cmyk: Vec::new(),
        })
    }

    fn last_error(&self) -> String {
        // SAFETY: the handle is valid; tj3GetErrorStr returns a NUL-terminated static or
        // per-handle string that stays valid until the next call on this handle.
        let message = unsafe { CStr::from_ptr(raw::tj3GetErrorStr(self.handle)) };
        message.to_string_lossy().into_owned()
    }

    fn get(&self, param: u32) -> i32 {
        // SAFETY: valid handle, known parameter id.
        unsafe { raw::tj3Get(self.handle, param as c_int) }
    }

    fn check(&self, status: i32) -> Result<(), SampleError> {
        if status == 0 {
            Ok(())
        } else {
            Err(SampleError::Corrupt(self.last_error()))
        }
    }

    /// [`check`](Self::check) of a decode, which passes the warning that says nothing of the
    /// pixels ([`HARMLESS_WARNING`]): bytes padding the end of the last scan (common in scraped
    /// sets; Pillow reads such files, with the same pixels). TurboJPEG keeps the first
    /// warning, so a file that warned of damaged data before it is still refused. The quirks'
    /// warnings are refused here too: a file showing one is decoded from a mended copy
    /// (`jpeg_markers.rs`).
    fn check_decoded(&self, status: i32) -> Result<(), SampleError> {
        self.check_passing(status, |warning| warning.contains(HARMLESS_WARNING))
    }

    /// [`check`](Self::check) of a header read, which reads no pixels: the quirks' warnings
    /// pass as well, for the decode to mend them or refuse them.
    fn check_header(&self, status: i32) -> Result<(), SampleError> {
        self.check_passing(status, |warning| {
            warning.contains(HARMLESS_WARNING) || jpeg_markers::is_quirk(warning)
        })
    }

    /// [`check`](Self::check), passing a warning that `passes`.
    fn check_passing(&self, status: i32, passes: impl Fn(&str) -> bool) -> Result<(), SampleError> {
        if status == 0 {
            return Ok(());
        }
        let message = self.last_error();
        // SAFETY: valid handle.
        let code = unsafe { raw::tj3GetErrorCode(self.handle) };
        if code == raw::TJERR_TJERR_WARNING as c_int && passes(&message) {
            tracing::debug!(%message, "a JPEG warning that leaves the pixels whole, passed");
            return Ok(());
        }
        Err(SampleError::Corrupt(message))
    }

    fn read_header(&mut self, bytes: &[u8]) -> Result<(u32, u32), SampleError> {
        // SAFETY: valid handle; the pointer and length describe a live slice.
        let status = unsafe {
            raw::tj3DecompressHeader(self.handle, bytes.as_ptr(), bytes.len() as raw::size_t)
        };
        self.check_header(status)?;
        let width = self.get(raw::TJPARAM_TJPARAM_JPEGWIDTH);
        let height = self.get(raw::TJPARAM_TJPARAM_JPEGHEIGHT);
        if width <= 0 || height <= 0 {
            return Err(SampleError::Corrupt(
                "libjpeg-turbo found no frame header (the JPEG is cut short or damaged)".into(),
            ));
        }
        Ok((width as u32, height as u32))
    }

    fn decode(
        &mut self,
        bytes: &[u8],
        header: &ImageHeader,
        request: &DecodeRequest,
        out: &mut DecodedImage,
    ) -> Result<(), SampleError> {
        // A quirk libjpeg warns of though the pixels are whole (`jpeg_markers.rs`): mended
        // before the decode where the header shows it, the copy's own warnings counting.
        if jpeg_markers::quirk_in_header(bytes) {
            if let Some(copy) = jpeg_markers::mended(bytes) {
                return self.decode_either(&copy, header, request, out);
            }
        }
        match self.decode_either(bytes, header, request, out) {
            // One past the header (a later scan's fields, bytes discarded between the
            // segments after a scan, a JFIF header after the scan): the file is decoded again
            // from a copy without it, where the walk mends it.
            Err(SampleError::Corrupt(warning)) if jpeg_markers::is_quirk(&warning) => {
                match jpeg_markers::mended(bytes) {
                    Some(copy) => self.decode_either(&copy, header, request, out),
                    None => Err(SampleError::Corrupt(warning)),
                }
            }
            decoded => decoded,
        }
    }

    /// The request's region decoded, or the whole image where libjpeg refuses the region.
    fn decode_either(
        &mut self,
        bytes: &[u8],
        header: &ImageHeader,
        request: &DecodeRequest,
        out: &mut DecodedImage,
    ) -> Result<(), SampleError> {
        match self.decode_at(bytes, header, request, out, false) {
            Err(SampleError::Corrupt(warning)) if jpeg_markers::is_quirk(&warning) => {
                Err(SampleError::Corrupt(warning))
            }
            // libjpeg starts a region on an iMCU of the largest sampling factors, which
            // TurboJPEG's subsampling class does not always give (three components all 2x2 are
            // "4:4:4" to it, 8 pixels wide, 16 to libjpeg): such a valid file fails a region
            // decode, and is decoded whole at the same scale instead (a damaged one fails again).
            Err(_) if request.region.is_some() => self.decode_at(bytes, header, request, out, true),
            decoded => decoded,
        }
    }

    /// [`decode`](Self::decode) of the request's region, or of the whole image (at the scale
    /// the region asks for) when `whole`.
    fn decode_at(
        &mut self,
        bytes: &[u8],
        header: &ImageHeader,
        request: &DecodeRequest,
        out: &mut DecodedImage,
        whole: bool,
    ) -> Result<(), SampleError> {
        let size = self.read_header(bytes)?;
        if size != (header.width, header.height) {
            // TurboJPEG leaves the last image's size where its header read stops before the
            // frame (a stream cut inside its tables), so the size it gives is not named.
            return Err(SampleError::Corrupt(format!(
                "libjpeg-turbo does not read the {}x{} frame header the marker scan found (a \
                 second frame header, or the JPEG cut short or damaged before it)",
                header.width, header.height
            )));
        }
        let max_pixels = i32::try_from(request.max_pixels).unwrap_or(i32::MAX);
        // SAFETY: valid handle and parameter; the value is checked by the library.
        self.check(unsafe {
            raw::tj3Set(
                self.handle,
                raw::TJPARAM_TJPARAM_MAXPIXELS as c_int,
                max_pixels,
            )
        })?;
        // SAFETY: as above.
        self.check(unsafe {
            raw::tj3Set(
                self.handle,
                raw::TJPARAM_TJPARAM_SCANLIMIT as c_int,
                MAX_SCANS,
            )
        })?;
        let region = request.region.unwrap_or(CropWindow {
            top: 0,
            left: 0,
            height: header.height,
            width: header.width,
        });
        let eighths = if request.allow_dct_scaling {
            dct_scale_eighths(region.width, region.height, request.target)
        } else {
            8
        };
        // TurboJPEG only accepts its factors in lowest terms (1/1, 1/2, 1/4, 1/8).
        let scaling = raw::tjscalingfactor {
            num: 1,
            denom: (8 / eighths) as c_int,
        };
        // SAFETY: valid handle; 1/8, 2/8, 4/8 and 8/8 are among TurboJPEG's supported factors.
        self.check(unsafe { raw::tj3SetScalingFactor(self.handle, scaling) })?;
        let scaled = |v: u32| (u64::from(v) * u64::from(eighths)).div_ceil(8) as u32;
        let scaled_width = scaled(header.width);
        let scaled_height = scaled(header.height);

        let subsampling = self.get(raw::TJPARAM_TJPARAM_SUBSAMP);
        let mcu_width = usize::try_from(subsampling)
            .ok()
            .and_then(|s| MCU_WIDTH.get(s))
            .map(|w| (w * eighths / 8).max(1));
        let (x0, y0, x1, y1) = match (request.region, mcu_width) {
            (Some(region), Some(mcu)) if !whole => {
                // One column more on each side than the window: libjpeg upsamples a
                // subsampled chroma at the region's left and right edges as at the image's,
                // which would change the window's own edge columns (by 20 levels on photos).
                let left = (u64::from(region.left) * u64::from(eighths) / 8) as u32;
                let left = left.saturating_sub(1);
                let top = (u64::from(region.top) * u64::from(eighths) / 8) as u32;
                let right = (scaled(region.left + region.width) + 1).min(scaled_width);
                let bottom = scaled(region.top + region.height).min(scaled_height);
                (left - left % mcu, top, right, bottom)
            }
            _ => (0, 0, scaled_width, scaled_height),
        };
        let crop = raw::tjregion {
            x: x0 as c_int,
            y: y0 as c_int,
            w: (x1 - x0) as c_int,
            h: (y1 - y0) as c_int,
        };
        let full = x0 == 0 && y0 == 0 && x1 == scaled_width && y1 == scaled_height;
        let crop = if full {
            raw::tjregion {
                x: 0,
                y: 0,
                w: 0,
                h: 0,
            }
        } else {
            crop
        };
        // SAFETY: valid handle; the region lies inside the scaled image and starts on an iMCU
        // boundary, which the library checks again.
        self.check(unsafe { raw::tj3SetCroppingRegion(self.handle, crop) })?;

        let (width, height) = (x1 - x0, y1 - y0);
        let pixel_count = width as usize * height as usize;
        // libjpeg-turbo refuses to turn four components into RGB ("Unsupported color conversion
        // request"); it gives CMYK for them (converting YCCK itself), which Pillow's formula
        // then turns into RGB.
        let colorspace = self.get(raw::TJPARAM_TJPARAM_COLORSPACE);
        let four_components =
            colorspace == raw::TJCS_TJCS_CMYK as i32 || colorspace == raw::TJCS_TJCS_YCCK as i32;
        if four_components {
            let mut cmyk = std::mem::take(&mut self.cmyk);
            cmyk.clear();
            cmyk.resize(pixel_count * 4, 0);
            let converted = self
                .decompress(bytes, &mut cmyk, (width, height), 4, raw::TJPF_TJPF_CMYK)
                .map(|()| cmyk_to_rgb(&cmyk, &mut out.pixels));
            // Kept for the next CMYK image unless it is one of the very large ones.
            if cmyk.capacity() <= SCRATCH_KEEP_BYTES {
                self.cmyk = cmyk;
            }
            converted?;
        } else {
            out.pixels.clear();
            out.pixels.resize(pixel_count * 3, 0);
            let rgb = raw::TJPF_TJPF_RGB;
            self.decompress(bytes, &mut out.pixels, (width, height), 3, rgb)?;
        }
        out.width = width;
        out.height = height;
        out.offset_x = x0;
        out.offset_y = y0;
        out.scaled_width = scaled_width;
        out.scaled_height = scaled_height;
        out.scale_eighths = eighths;
        out.original_width = header.width;
        out.original_height = header.height;
        Ok(())
    }
}

impl JpegDecompressor {
    /// Decodes the cropping region set on the handle, `size` (width, height) pixels at the
    /// scale set, into `pixels`: rows of `width` pixels of `channels` bytes in `pixel_format`.
    fn decompress(
        &mut self,
        bytes: &[u8],
        pixels: &mut [u8],
        size: (u32, u32),
        channels: u32,
        pixel_format: raw::TJPF,
    ) -> Result<(), SampleError> {
        let pitch = size.0 as usize * channels as usize;
        if pixels.len() < pitch * size.1 as usize {
            return Err(SampleError::Corrupt(format!(
                "JPEG region of {}x{} does not fit its buffer of {} bytes",
                size.0,
                size.1,
                pixels.len()
            )));
        }
        // SAFETY: valid handle; `pixels` holds `size.1` rows of `pitch` bytes (checked above),
        // which is what tj3Decompress8 writes for the cropping region of that size set on the
        // handle, at that pitch in `pixel_format`.
        let status = unsafe {
            raw::tj3Decompress8(
                self.handle,
                bytes.as_ptr(),
                bytes.len() as raw::size_t,
                pixels.as_mut_ptr(),
                pitch as c_int,
                pixel_format as c_int,
            )
        };
        self.check_decoded(status)
    }
}

/// CMYK from libjpeg-turbo to RGB, bit for bit as Pillow gives `Image.open(f).convert("RGB")`
/// of a four-component JPEG, appended to a cleared `rgb`.
///
/// Pillow's JPEG reader (`JpegImagePlugin.py`) decodes every four-component JPEG, with or
/// without an Adobe APP14 marker, with rawmode `"CMYK;I"` ("assume adobe conventions"):
/// libjpeg's CMYK output with each byte inverted (`unpackCMYKI` in `Unpack.c`). `convert("RGB")`
/// then runs `cmyk2rgb` (`Convert.c`, since Pillow 4.3): `nk = 255 - k`, each channel
/// `nk - MULDIV255(c, nk)` with `MULDIV255(a, b) = ((t >> 8) + t) >> 8, t = a * b + 128`. Undoing
/// the inversion, `nk` is libjpeg's own K byte and `c` is `255 - C`.
fn cmyk_to_rgb(cmyk: &[u8], rgb: &mut Vec<u8>) {
    rgb.clear();
    rgb.reserve(cmyk.len() / 4 * 3);
    for pixel in cmyk.chunks_exact(4) {
        let not_black = u32::from(pixel[3]);
        for &ink in &pixel[..3] {
            let product = (255 - u32::from(ink)) * not_black + 128;
            let scaled = ((product >> 8) + product) >> 8;
            // `scaled` is at most `not_black`: no clipping is needed (Pillow's CLIP8 is a no-op).
            rgb.push((not_black - scaled) as u8);
        }
    }
}

impl Drop for JpegDecompressor {
    fn drop(&mut self) {
        // SAFETY: the handle came from tj3Init and is destroyed once.
        unsafe { raw::tj3Destroy(self.handle) };
    }
}

/// The smallest DCT scale (in eighths: 1, 2, 4 or 8) that keeps a `width`x`height` region at
/// least as large as `target` in both directions.
pub fn dct_scale_eighths(width: u32, height: u32, target: (u32, u32)) -> u32 {
    for eighths in [1u32, 2, 4] {
        let w = u64::from(width) * u64::from(eighths) / 8;
        let h = u64::from(height) * u64::from(eighths) / 8;
        if w >= u64::from(target.0) && h >= u64::from(target.1) {
            return eighths;
        }
    }
    8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmyk_conversion_is_pillows() {
        // (C, M, Y, K) as libjpeg gives them: white, black (K only), black (no K: Adobe's
        // inverted zero is full ink).
        let mut rgb = Vec::new();
        cmyk_to_rgb(&[255, 255, 255, 255, 0, 0, 0, 255, 0, 0, 0, 0], &mut rgb);
        assert_eq!(rgb, [255, 255, 255, 0, 0, 0, 0, 0, 0]);
        cmyk_to_rgb(&[200, 100, 30, 128, 10, 20, 30, 40], &mut rgb);
        // nk = 128: 128 - MULDIV255(55, 128) = 128 - 28 = 100; 155 -> 128 - 78 = 50;
        // 225 -> 128 - 113 = 15. nk = 40: 245 -> 40 - 38 = 2; 235 -> 40 - 37 = 3; 225 -> 5.
        assert_eq!(rgb, [100, 50, 15, 2, 3, 5]);
    }

    #[test]
    fn dct_scale_keeps_the_region_at_least_target_sized() {
        assert_eq!(dct_scale_eighths(400, 350, (224, 224)), 8);
        assert_eq!(dct_scale_eighths(448, 448, (224, 224)), 4);
        assert_eq!(dct_scale_eighths(1800, 1800, (224, 224)), 1);
        assert_eq!(dct_scale_eighths(900, 1000, (224, 224)), 2);
    }
}
