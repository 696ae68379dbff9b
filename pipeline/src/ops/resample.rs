//! Resampling a decoded image (or the decoded part of it) into the output window, with the
//! bilinear, antialiased filter PIL and torchvision use, through `fast_image_resize`.

use fast_image_resize::images::{CroppedImage, Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

use super::decode::DecodedImage;
use super::geometry::CropWindow;
use crate::error::SampleError;

/// Where the output pixels come from, in original image coordinates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceWindow {
    /// Cut `window` out first, then resize it alone: the filter never reads past the window's
    /// edges (torchvision's `resized_crop`, as in RandomResizedCrop).
    CropThenResize(CropWindow),
    /// Resize the whole image to `resized`, then cut the output out at (`left`, `top`); offsets
    /// may be negative or run past the edge, where the output is black (Resize + CenterCrop).
    ResizeThenCrop {
        /// Size of the resized image (width, height).
        resized: (u32, u32),
        /// Left edge of the output in the resized image.
        left: i64,
        /// Top edge of the output in the resized image.
        top: i64,
    },
}

impl SourceWindow {
    /// The part of the original image the output depends on (for region decoding).
    pub fn needed_region(&self) -> Option<CropWindow> {
        match *self {
            SourceWindow::CropThenResize(window) => Some(window),
            // The filter reaches past the crop, so decode everything; the centre crop of an
            // eval pipeline keeps ~88% of each side anyway.
            SourceWindow::ResizeThenCrop { .. } => None,
        }
    }
}

fn bilinear() -> ResizeOptions {
    ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Bilinear))
}

fn resize_error(error: impl std::fmt::Display) -> SampleError {
    SampleError::Corrupt(format!("resize: {error}"))
}

/// Resamples `decoded` through `window` into `dest`, packed RGB8 of `out` (width, height).
pub fn resample(
    decoded: &DecodedImage,
    window: &SourceWindow,
    out: (u32, u32),
    dest: &mut [u8],
    resizer: &mut Resizer,
) -> Result<(), SampleError> {
    let source = ImageRef::new(
        decoded.width,
        decoded.height,
        &decoded.pixels,
        PixelType::U8x3,
    )
    .map_err(resize_error)?;
    match *window {
        SourceWindow::CropThenResize(crop) => {
            let mut target =
                Image::from_slice_u8(out.0, out.1, dest, PixelType::U8x3).map_err(resize_error)?;
            let scale = decoded.scale();
            if decoded.scale_eighths == 8 {
                let view = CroppedImage::new(
                    &source,
                    crop.left - decoded.offset_x,
                    crop.top - decoded.offset_y,
                    crop.width,
                    crop.height,
                )
                .map_err(resize_error)?;
                resizer
                    .resize(&view, &mut target, &bilinear())
                    .map_err(resize_error)
            } else {
                // DCT-scaled: the window has fractional edges in decoded pixels. Keep the
                // filter inside the integer cover of the window, as the full-size path does.
                let left = f64::from(crop.left) * scale - f64::from(decoded.offset_x);
                let top = f64::from(crop.top) * scale - f64::from(decoded.offset_y);
                let right = (left + f64::from(crop.width) * scale).min(f64::from(decoded.width));
                let bottom = (top + f64::from(crop.height) * scale).min(f64::from(decoded.height));
                let (x0, y0) = (left.floor().max(0.0), top.floor().max(0.0));
                let (x1, y1) = (right.ceil(), bottom.ceil());
                let view = CroppedImage::new(
                    &source,
                    x0 as u32,
                    y0 as u32,
                    (x1 - x0).max(1.0) as u32,
                    (y1 - y0).max(1.0) as u32,
                )
                .map_err(resize_error)?;
                let options = bilinear().crop(left - x0, top - y0, right - left, bottom - top);
                resizer
                    .resize(&view, &mut target, &options)
                    .map_err(resize_error)
            }
        }
        SourceWindow::ResizeThenCrop { resized, left, top } => {
            // Resized pixels to decoded ones by the image's true extent at the decode scale:
            // a DCT-scaled decode rounds its size up (897 px at 1/8 is 113, not 112.125), and
            // its width in place of the extent would stretch the whole mapping.
            let scale = decoded.scale();
            let factor_x = f64::from(decoded.original_width) * scale / f64::from(resized.0);
            let factor_y = f64::from(decoded.original_height) * scale / f64::from(resized.1);
            // The output columns/rows that fall inside the resized image.
            let x0 = (-left).clamp(0, i64::from(out.0));
            let x1 = (i64::from(resized.0) - left).clamp(x0, i64::from(out.0));
            let y0 = (-top).clamp(0, i64::from(out.1));
            let y1 = (i64::from(resized.1) - top).clamp(y0, i64::from(out.1));
            let options = bilinear().crop(
                (left + x0) as f64 * factor_x,
                (top + y0) as f64 * factor_y,
                (x1 - x0) as f64 * factor_x,
                (y1 - y0) as f64 * factor_y,
            );
            let full = x0 == 0 && y0 == 0 && x1 == i64::from(out.0) && y1 == i64::from(out.1);
            if full {
                let mut target = Image::from_slice_u8(out.0, out.1, dest, PixelType::U8x3)
                    .map_err(resize_error)?;
                return resizer
                    .resize(&source, &mut target, &options)
                    .map_err(resize_error);
            }
            dest.fill(0);
            if x1 == x0 || y1 == y0 {
                return Ok(());
            }
            let (inner_w, inner_h) = ((x1 - x0) as u32, (y1 - y0) as u32);
            let mut inner = Image::new(inner_w, inner_h, PixelType::U8x3);
            resizer
                .resize(&source, &mut inner, &options)
                .map_err(resize_error)?;
            let row_bytes = inner_w as usize * 3;
            for (row, pixels) in inner.buffer().chunks_exact(row_bytes).enumerate() {
                let start = ((y0 as usize + row) * out.0 as usize + x0 as usize) * 3;
                dest[start..start + row_bytes].copy_from_slice(pixels);
            }
            Ok(())
        }
    }
}

/// Mirrors packed RGB8 rows left to right, in place.
pub fn flip_horizontal(pixels: &mut [u8], width: u32) {
    let row_bytes = width as usize * 3;
    for row in pixels.chunks_exact_mut(row_bytes) {
        let (mut a, mut b) = (0usize, width as usize);
        while a + 1 < b {
            b -= 1;
            for c in 0..3 {
                row.swap(a * 3 + c, b * 3 + c);
            }
            a += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flip_mirrors_each_row() {
        let mut px: Vec<u8> = (0..18).collect();
        flip_horizontal(&mut px, 3);
        assert_eq!(
            px,
            vec![6, 7, 8, 3, 4, 5, 0, 1, 2, 15, 16, 17, 12, 13, 14, 9, 10, 11]
        );
    }
}
