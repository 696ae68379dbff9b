//! Decoding only the part of an image its row is made from, when `STOKER_GPU_DECODE_ROI=1`
//! asks: a RandomResizedCrop window's pixels are all the crop kernel reads, so the hardware
//! engines may decode that window alone (nvJPEG's ROI decode, `nvjpegDecodeBatchedEx`, which
//! only the hardware backend takes) into a place the window's size, and the kernel crops from
//! it with the window moved by the region's corner. Here: whether it is asked, the region
//! decoded for a window (the window grown outward to whole MCUs, so every decoded pixel comes
//! from the same coded blocks a whole decode would use), and that region's placement.

use stoker_pipeline::{CropWindow, SourceWindow};

use super::jpeg_scan::Placement;

/// The variable that asks the lane to decode each crop window alone (`1`; unset or `0`: each
/// image is decoded whole).
pub const ROI_VARIABLE: &str = "STOKER_GPU_DECODE_ROI";

/// Whether `value` (the variable's, if set) asks for region decoding; after trimming, anything
/// but `0`, `1` or empty (read as `0`) is an error naming the variable.
pub fn roi_asked(value: Option<&str>) -> Result<bool, String> {
    super::switch_asked(ROI_VARIABLE, value)
}

/// A rectangle of an image, in pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// First column.
    pub left: u32,
    /// First row.
    pub top: u32,
    /// Columns.
    pub width: u32,
    /// Rows.
    pub height: u32,
}

impl Region {
    /// Where the region's decoded pixels go: interleaved RGB, its width a row, in a place
    /// rounded up to `align` bytes.
    pub fn placement(&self, align: usize) -> Placement {
        let pitch = self.width as usize * 3;
        let decoded = pitch * self.height as usize;
        let align = align.max(1);
        Placement {
            width: self.width,
            height: self.height,
            pitch,
            decoded,
            place: decoded.div_ceil(align) * align,
        }
    }
}

/// What decoding a region changes for one image: the region, and the image's window as seen
/// from the region's corner (what the crop kernel is given instead of the window in the whole
/// image).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionDecode {
    /// The part of the image decoded.
    pub region: Region,
    /// The window, moved by the region's corner.
    pub window: SourceWindow,
}

/// The region to decode of a `frame` (width, height) whose MCUs are `mcu` (width, height)
/// pixels for an output made from `window`: the crop window grown outward to MCU edges (or the
/// frame's edge). `None` when the output needs the whole image (a resize before the crop, whose
/// filter reads past any window), the window does not lie in the frame, or the region would be
/// the whole frame anyway.
pub fn region_for(
    window: &SourceWindow,
    frame: (u32, u32),
    mcu: (u32, u32),
) -> Option<RegionDecode> {
    let SourceWindow::CropThenResize(crop) = *window else {
        return None;
    };
    let (frame_w, frame_h) = frame;
    let right = crop.left.checked_add(crop.width)?;
    let bottom = crop.top.checked_add(crop.height)?;
    if crop.width == 0 || crop.height == 0 || right > frame_w || bottom > frame_h {
        return None;
    }
    let (mcu_w, mcu_h) = (mcu.0.max(1), mcu.1.max(1));
    let left = crop.left / mcu_w * mcu_w;
    let top = crop.top / mcu_h * mcu_h;
    let right = right.div_ceil(mcu_w).saturating_mul(mcu_w).min(frame_w);
    let bottom = bottom.div_ceil(mcu_h).saturating_mul(mcu_h).min(frame_h);
    if (left, top, right, bottom) == (0, 0, frame_w, frame_h) {
        return None;
    }
    Some(RegionDecode {
        region: Region {
            left,
            top,
            width: right - left,
            height: bottom - top,
        },
        window: SourceWindow::CropThenResize(CropWindow {
            left: crop.left - left,
            top: crop.top - top,
            width: crop.width,
            height: crop.height,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::kernel::CropItem;

    fn crop(left: u32, top: u32, width: u32, height: u32) -> SourceWindow {
        SourceWindow::CropThenResize(CropWindow {
            left,
            top,
            width,
            height,
        })
    }

    #[test]
    fn the_switch_takes_0_or_1_and_names_itself_otherwise() {
        for (value, asked) in [(None, false), (Some(""), false), (Some(" 0"), false)] {
            assert_eq!(roi_asked(value), Ok(asked), "{value:?}");
        }
        assert_eq!(roi_asked(Some("1 ")), Ok(true));
        let error = roi_asked(Some("yes")).unwrap_err();
        assert!(
            error.contains(ROI_VARIABLE) && error.contains("yes"),
            "{error}"
        );
    }

    #[test]
    fn a_window_grows_to_whole_mcus_within_the_frame() {
        // 4:2:0 (16x16 MCUs) in a 500x375 frame: columns 37..237 -> 32..240, rows 100..300 ->
        // 96..304; the window is then 5 columns and 4 rows into the region.
        let decode = region_for(&crop(37, 100, 200, 200), (500, 375), (16, 16)).unwrap();
        assert_eq!(
            decode.region,
            Region {
                left: 32,
                top: 96,
                width: 208,
                height: 208
            }
        );
        assert_eq!(decode.window, crop(5, 4, 200, 200));
        // At the frame's edge the region stops at the edge, not at the next MCU.
        let decode = region_for(&crop(300, 200, 200, 175), (500, 375), (16, 16)).unwrap();
        assert_eq!((decode.region.left, decode.region.top), (288, 192));
        assert_eq!((decode.region.width, decode.region.height), (212, 183));
        assert_eq!(decode.region.placement(512).pitch, 636);
    }

    #[test]
    fn the_whole_image_is_decoded_where_a_region_would_not_help_or_not_fit() {
        let resize_first = SourceWindow::ResizeThenCrop {
            resized: (256, 256),
            left: 16,
            top: 16,
        };
        assert_eq!(region_for(&resize_first, (500, 375), (16, 16)), None);
        // Within one MCU of every edge: the region is the frame.
        assert_eq!(
            region_for(&crop(3, 5, 495, 368), (500, 375), (16, 16)),
            None
        );
        // Past the frame, or empty: never decoded by region.
        assert_eq!(
            region_for(&crop(400, 0, 200, 100), (500, 375), (8, 8)),
            None
        );
        assert_eq!(region_for(&crop(0, 0, 0, 100), (500, 375), (8, 8)), None);
        assert_eq!(
            region_for(&crop(u32::MAX, 0, 2, 1), (500, 375), (8, 8)),
            None
        );
    }

    #[test]
    fn the_kernel_reads_the_same_pixels_from_the_region_as_from_the_whole_image() {
        // Windows spread over frames and MCU shapes: the region holds the window, its edges
        // are on MCU edges or the frame's, and the kernel's item for the region is the whole
        // image's moved by the region's corner (same filter, same scale, the same source
        // pixels read).
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |below: u32| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % u64::from(below.max(1))) as u32
        };
        let mut decoded_by_region = 0;
        for _ in 0..2000 {
            let frame = (16 + next(3000), 16 + next(3000));
            let mcu = [(8, 8), (16, 8), (16, 16), (8, 16)][next(4) as usize];
            let (width, height) = (1 + next(frame.0), 1 + next(frame.1));
            let (left, top) = (next(frame.0 - width + 1), next(frame.1 - height + 1));
            let window = crop(left, top, width, height);
            let Some(decode) = region_for(&window, frame, mcu) else {
                continue;
            };
            decoded_by_region += 1;
            let Region {
                left: rx,
                top: ry,
                width: rw,
                height: rh,
            } = decode.region;
            assert!(rx <= left && ry <= top, "{decode:?} {window:?}");
            assert!(rx + rw >= left + width && ry + rh >= top + height);
            assert!(rx + rw <= frame.0 && ry + rh <= frame.1);
            assert!(rx % mcu.0 == 0 && ry % mcu.1 == 0);
            assert!((rx + rw) % mcu.0 == 0 || rx + rw == frame.0);
            assert!((ry + rh) % mcu.1 == 0 || ry + rh == frame.1);
            let whole = CropItem::new(&window, frame, (224, 224), true, 3);
            let part = CropItem::new(&decode.window, (rw, rh), (224, 224), true, 3);
            let (dx, dy) = (rx as i32, ry as i32);
            assert_eq!(
                (part.clamp_x0 + dx, part.clamp_x1 + dx),
                (whole.clamp_x0, whole.clamp_x1)
            );
            assert_eq!(
                (part.clamp_y0 + dy, part.clamp_y1 + dy),
                (whole.clamp_y0, whole.clamp_y1)
            );
            // Positions count from the clamp's corner: the same numbers for both.
            assert_eq!(
                (part.origin_x, part.origin_y),
                (whole.origin_x, whole.origin_y)
            );
            assert_eq!((part.scale_x, part.scale_y), (whole.scale_x, whole.scale_y));
            assert_eq!(part.pitch, rw * 3);
            assert_eq!(
                (part.inside_x0, part.inside_x1, part.flip, part.row),
                (whole.inside_x0, whole.inside_x1, whole.flip, whole.row)
            );
            assert_eq!(decode.region.placement(1).decoded, (rw * rh * 3) as usize);
        }
        assert!(decoded_by_region > 1000, "{decoded_by_region}");
    }
}
