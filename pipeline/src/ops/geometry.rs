//! Where each output pixel comes from: torchvision's RandomResizedCrop, Resize and CenterCrop
//! reduced to one source window per sample, computed from the image size alone (which the JPEG
//! header gives), so the decoder can skip what the crop leaves out.

use crate::rng::SampleRng;

/// An integer crop window in source pixels: torchvision's `(i, j, h, w)` = (top, left, height,
/// width).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CropWindow {
    /// First row.
    pub top: u32,
    /// First column.
    pub left: u32,
    /// Rows.
    pub height: u32,
    /// Columns.
    pub width: u32,
}

/// Parameters of torchvision's `RandomResizedCrop` beyond the output size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomResizedCropRange {
    /// Lower and upper bound of the crop's area as a fraction of the image's.
    pub scale: (f64, f64),
    /// Lower and upper bound of the crop's aspect ratio (width / height).
    pub ratio: (f64, f64),
}

impl Default for RandomResizedCropRange {
    fn default() -> Self {
        Self {
            scale: (0.08, 1.0),
            ratio: (3.0 / 4.0, 4.0 / 3.0),
        }
    }
}

/// Python's `round()`: halves go to the even neighbour.
fn python_round(value: f64) -> f64 {
    value.round_ties_even()
}

/// torchvision's `RandomResizedCrop.get_params`: ten tries at a random area and log-uniform
/// aspect ratio, then the centre crop clamped to the ratio range. Draws, in order: area, ratio,
/// then (on success) top and left.
pub fn random_resized_crop_window(
    width: u32,
    height: u32,
    range: &RandomResizedCropRange,
    rng: &mut SampleRng,
) -> CropWindow {
    let area = f64::from(width) * f64::from(height);
    let log_ratio = (range.ratio.0.ln(), range.ratio.1.ln());
    for _ in 0..10 {
        let target_area = area * rng.uniform(range.scale.0, range.scale.1);
        let aspect_ratio = rng.uniform(log_ratio.0, log_ratio.1).exp();
        let crop_width = python_round((target_area * aspect_ratio).sqrt());
        let crop_height = python_round((target_area / aspect_ratio).sqrt());
        if crop_width > 0.0
            && crop_width <= f64::from(width)
            && crop_height > 0.0
            && crop_height <= f64::from(height)
        {
            let crop_width = crop_width as u32;
            let crop_height = crop_height as u32;
            let top = rng.below(u64::from(height - crop_height) + 1) as u32;
            let left = rng.below(u64::from(width - crop_width) + 1) as u32;
            return CropWindow {
                top,
                left,
                height: crop_height,
                width: crop_width,
            };
        }
    }
    let in_ratio = f64::from(width) / f64::from(height);
    let min_ratio = range.ratio.0.min(range.ratio.1);
    let max_ratio = range.ratio.0.max(range.ratio.1);
    let (crop_width, crop_height) = if in_ratio < min_ratio {
        let w = width;
        let h = python_round(f64::from(w) / min_ratio) as u32;
        (w, h.clamp(1, height))
    } else if in_ratio > max_ratio {
        let h = height;
        let w = python_round(f64::from(h) * max_ratio) as u32;
        (w.clamp(1, width), h)
    } else {
        (width, height)
    };
    CropWindow {
        top: (height - crop_height) / 2,
        left: (width - crop_width) / 2,
        height: crop_height,
        width: crop_width,
    }
}

/// torchvision's `Resize(size)` with an int: the shorter side becomes `size`, the longer one is
/// scaled and truncated. Returns (width, height); `None` when the longer side would pass
/// `u32::MAX` (a strip of one pixel by millions, scaled up).
pub fn resize_shorter_side(width: u32, height: u32, size: u32) -> Option<(u32, u32)> {
    let (short, long) = if width <= height {
        (width, height)
    } else {
        (height, width)
    };
    let new_long = u32::try_from(u64::from(size) * u64::from(long) / u64::from(short.max(1)))
        .ok()?
        .max(1);
    Some(if width <= height {
        (size, new_long)
    } else {
        (new_long, size)
    })
}

/// torchvision's `CenterCrop` offsets of a `crop` out of `image` along one axis. Negative when
/// the crop is larger than the image: torchvision pads with zeros then, and the padded pixels
/// come out black.
pub fn center_crop_offset(image: u32, crop: u32) -> i64 {
    if crop > image {
        -(i64::from(crop - image) / 2)
    } else {
        python_round(f64::from(image - crop) / 2.0) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_round_goes_to_even() {
        assert_eq!(python_round(0.5), 0.0);
        assert_eq!(python_round(1.5), 2.0);
        assert_eq!(python_round(2.5), 2.0);
        assert_eq!(python_round(2.6), 3.0);
    }

    #[test]
    fn resize_matches_torchvision_sizes() {
        // torchvision: Resize(256) of 500x375 -> 341x256; of 375x500 -> 256x341.
        assert_eq!(resize_shorter_side(500, 375, 256), Some((341, 256)));
        assert_eq!(resize_shorter_side(375, 500, 256), Some((256, 341)));
        assert_eq!(resize_shorter_side(300, 300, 224), Some((224, 224)));
        assert_eq!(resize_shorter_side(1, 1000, 224), Some((224, 224_000)));
        // 300,000 x 1 to a shorter side of 16,384: 4,915,200,000 wide, past u32 (it wrapped
        // to 620,232,704, a zoom 7.9 times off).
        assert_eq!(resize_shorter_side(300_000, 1, 16_384), None);
    }

    #[test]
    fn center_crop_offsets_match_torchvision() {
        // int(round((341 - 224) / 2)) = round(58.5) = 58
        assert_eq!(center_crop_offset(341, 224), 58);
        assert_eq!(center_crop_offset(256, 224), 16);
        assert_eq!(center_crop_offset(225, 224), 0);
        assert_eq!(center_crop_offset(100, 224), -62);
        assert_eq!(center_crop_offset(101, 224), -61);
    }

    #[test]
    fn random_crops_stay_inside_and_respect_the_ranges() {
        let range = RandomResizedCropRange::default();
        for index in 0..2000 {
            let mut rng = SampleRng::new(1, 0, index);
            let (w, h) = (300 + (index as u32 % 200), 200 + (index as u32 % 311));
            let win = random_resized_crop_window(w, h, &range, &mut rng);
            assert!(win.width >= 1 && win.height >= 1);
            assert!(win.left + win.width <= w && win.top + win.height <= h);
            let area = f64::from(win.width * win.height) / f64::from(w * h);
            // Rounding of the sides widens the bounds a little.
            assert!(area > 0.07 && area <= 1.0, "area fraction {area}");
        }
    }

    #[test]
    fn impossible_ratio_falls_back_to_the_clamped_centre_crop() {
        // A 1000x10 strip cannot hold a 3:4..4:3 crop with 8% of its area: after ten tries
        // torchvision takes the full height and width = round(10 * 4/3) = 13, centred.
        let range = RandomResizedCropRange::default();
        let mut rng = SampleRng::new(0, 0, 0);
        let win = random_resized_crop_window(1000, 10, &range, &mut rng);
        assert_eq!(
            win,
            CropWindow {
                top: 0,
                left: 493,
                height: 10,
                width: 13
            }
        );
    }

    #[test]
    fn full_range_crop_of_exact_ratio_is_the_whole_image() {
        let range = RandomResizedCropRange {
            scale: (1.0, 1.0),
            ratio: (1.0, 1.0),
        };
        let mut rng = SampleRng::new(3, 1, 4);
        let win = random_resized_crop_window(64, 64, &range, &mut rng);
        assert_eq!(
            win,
            CropWindow {
                top: 0,
                left: 0,
                height: 64,
                width: 64
            }
        );
    }
}
