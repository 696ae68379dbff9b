//! Image decoding: JPEG through libjpeg-turbo (TurboJPEG 3 API, with region and DCT-scaled
//! decoding) and PNG through the `png` crate, both to packed RGB8.
//!
//! The safe `turbojpeg` wrapper does not expose `tj3SetCroppingRegion`, so JPEG decoding talks
//! to `turbojpeg::raw` through a small owned handle. Every call checks its return code; errors
//! and warnings (a truncated file is a warning to libjpeg) become [`SampleError::Corrupt`].

use std::cell::RefCell;
use std::ffi::CStr;
use std::io::Cursor;
use std::os::raw::c_int;

use stoker_datasets::{sniff_format, ImageFormat};
use turbojpeg::raw;

use super::geometry::CropWindow;
use crate::error::SampleError;

/// PIL's `Image.MAX_IMAGE_PIXELS`: the default limit against decompression bombs.
pub const DEFAULT_MAX_PIXELS: u64 = 89_478_485;

/// What the header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageHeader {
    /// JPEG or PNG.
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
        // TurboJPEG's header call reports success without touching its stored size when the
        // data ends before the frame header (it takes that for a tables-only stream), so the
        // size comes from a marker scan of our own bytes instead.
        ImageFormat::Jpeg => {
            let size = imagesize::blob_size(bytes)
                .map_err(|e| SampleError::Corrupt(format!("JPEG header: {e}")))?;
            (
                u32::try_from(size.width).unwrap_or(u32::MAX),
                u32::try_from(size.height).unwrap_or(u32::MAX),
            )
        }
        ImageFormat::Png => png_header(bytes)?,
        ImageFormat::Other => return Err(SampleError::UnsupportedFormat),
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
        ImageFormat::Other => Err(SampleError::UnsupportedFormat),
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
}

// iMCU widths by subsampling, in TurboJPEG's TJSAMP order (444, 422, 420, GRAY, 440, 411, 441).
const MCU_WIDTH: [u32; 7] = [8, 16, 16, 8, 8, 32, 8];

impl JpegDecompressor {
    fn new() -> Result<Self, SampleError> {
        // SAFETY: tj3Init has no preconditions; a null return is handled below.
        let handle = unsafe { raw::tj3Init(raw::TJINIT_TJINIT_DECOMPRESS as c_int) };
        if handle.is_null() {
            return Err(SampleError::Corrupt(
                "libjpeg-turbo could not create a decompressor".into(),
            ));
        }
        Ok(Self { handle })
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

    fn read_header(&mut self, bytes: &[u8]) -> Result<(u32, u32), SampleError> {
        // SAFETY: valid handle; the pointer and length describe a live slice.
        let status = unsafe {
            raw::tj3DecompressHeader(self.handle, bytes.as_ptr(), bytes.len() as raw::size_t)
        };
        self.check(status)?;
        let width = self.get(raw::TJPARAM_TJPARAM_JPEGWIDTH);
        let height = self.get(raw::TJPARAM_TJPARAM_JPEGHEIGHT);
        if width <= 0 || height <= 0 {
            return Err(SampleError::Corrupt(format!(
                "JPEG header gives size {width}x{height}"
            )));
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
        let size = self.read_header(bytes)?;
        if size != (header.width, header.height) {
            return Err(SampleError::Corrupt(format!(
                "JPEG header gives {}x{} to libjpeg-turbo but {}x{} to the marker scan",
                size.0, size.1, header.width, header.height
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
            (Some(region), Some(mcu)) => {
                let left = (u64::from(region.left) * u64::from(eighths) / 8) as u32;
                let top = (u64::from(region.top) * u64::from(eighths) / 8) as u32;
                let right = scaled(region.left + region.width).min(scaled_width);
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
        let len = width as usize * height as usize * 3;
        out.pixels.clear();
        out.pixels.resize(len, 0);
        // SAFETY: `pixels` holds `height` rows of `pitch` bytes, which is what tj3Decompress8
        // writes for the cropping region set above in RGB format.
        let status = unsafe {
            raw::tj3Decompress8(
                self.handle,
                bytes.as_ptr(),
                bytes.len() as raw::size_t,
                out.pixels.as_mut_ptr(),
                (width * 3) as c_int,
                raw::TJPF_TJPF_RGB as c_int,
            )
        };
        self.check(status)?;
        out.width = width;
        out.height = height;
        out.offset_x = x0;
        out.offset_y = y0;
        out.scaled_width = scaled_width;
        out.scaled_height = scaled_height;
        out.scale_eighths = eighths;
        Ok(())
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

fn png_error(error: png::DecodingError) -> SampleError {
    SampleError::Corrupt(format!("png: {error}"))
}

fn png_header(bytes: &[u8]) -> Result<(u32, u32), SampleError> {
    let decoder = png::Decoder::new(Cursor::new(bytes));
    let reader = decoder.read_info().map_err(png_error)?;
    let info = reader.info();
    Ok((info.width, info.height))
}

/// Refuses palettes the `png` crate (0.18.1) would panic on while expanding them: a PLTE chunk
/// whose length is not a multiple of 3, and a tRNS chunk with more entries than the palette
/// (both invalid PNG; the crate stores them unchecked and slices past their ends). Found by the
/// `image` fuzz target; `fuzz/regressions/image/` keeps the inputs.
fn check_png_palette(info: &png::Info<'_>) -> Result<(), SampleError> {
    let Some(palette) = info.palette.as_deref() else {
        return Ok(());
    };
    if palette.len() % 3 != 0 {
        return Err(SampleError::Corrupt(format!(
            "png: PLTE chunk of {} bytes is not a whole number of RGB entries",
            palette.len()
        )));
    }
    let transparent = info.trns.as_deref().map_or(0, <[u8]>::len);
    if info.color_type == png::ColorType::Indexed && transparent > palette.len() / 3 {
        return Err(SampleError::Corrupt(format!(
            "png: tRNS chunk has {transparent} entries for a palette of {}",
            palette.len() / 3
        )));
    }
    Ok(())
}

fn decode_png(bytes: &[u8], max_pixels: u64, out: &mut DecodedImage) -> Result<(), SampleError> {
    let mut decoder = png::Decoder::new(Cursor::new(bytes));
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = decoder.read_info().map_err(png_error)?;
    check_png_palette(reader.info())?;
    let (width, height) = (reader.info().width, reader.info().height);
    if u64::from(width) * u64::from(height) > max_pixels {
        return Err(SampleError::TooManyPixels {
            width: u64::from(width),
            height: u64::from(height),
            limit: max_pixels,
        });
    }
    let size = reader
        .output_buffer_size()
        .ok_or_else(|| SampleError::Corrupt("png: output size overflows".into()))?;
    let mut raw_pixels = vec![0u8; size];
    let frame = reader.next_frame(&mut raw_pixels).map_err(png_error)?;
    let channels = match frame.color_type {
        png::ColorType::Grayscale => 1,
        png::ColorType::GrayscaleAlpha => 2,
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        png::ColorType::Indexed => {
            return Err(SampleError::Corrupt("png: palette was not expanded".into()))
        }
    };
    let pixel_count = width as usize * height as usize;
    out.pixels.clear();
    out.pixels.reserve(pixel_count * 3);
    for y in 0..height as usize {
        let row = &raw_pixels[y * frame.line_size..][..width as usize * channels];
        for px in row.chunks_exact(channels) {
            // PIL's convert("RGB") drops alpha without compositing; so do we.
            match channels {
                1 | 2 => out.pixels.extend_from_slice(&[px[0], px[0], px[0]]),
                _ => out.pixels.extend_from_slice(&px[..3]),
            }
        }
    }
    out.width = width;
    out.height = height;
    out.offset_x = 0;
    out.offset_y = 0;
    out.scaled_width = width;
    out.scaled_height = height;
    out.scale_eighths = 8;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dct_scale_keeps_the_region_at_least_target_sized() {
        assert_eq!(dct_scale_eighths(400, 350, (224, 224)), 8);
        assert_eq!(dct_scale_eighths(448, 448, (224, 224)), 4);
        assert_eq!(dct_scale_eighths(1800, 1800, (224, 224)), 1);
        assert_eq!(dct_scale_eighths(900, 1000, (224, 224)), 2);
    }
}
