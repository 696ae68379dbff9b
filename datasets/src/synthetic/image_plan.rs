//! What each generated image will be (size, format, JPEG settings, busyness), drawn per index
//! so that any image can be made alone, on any thread, with the same result.
//!
//! The distributions imitate the ImageNet-1k training set as a decoder meets it: most pictures
//! are 4:3 landscape or 3:4 portrait Flickr downsizes with the long side at 500, the rest spread
//! from about 150 to 1000 pixels; quality 75..96 centred near 90; mostly 4:2:0 chroma with a
//! share of 4:4:4 and a little 4:2:2; a few progressive files; about 1.6% grayscale JPEGs and
//! 0.5% PNGs.

use rand_core::Rng;
use rand_pcg::Pcg64Mcg;

use super::photo_painter::{unit, PhotoStyle};

/// One PNG in every this many consecutive indices (0.5%), so even a small set has some.
const PNG_PERIOD: u64 = 200;
/// One grayscale JPEG in every this many consecutive indices (about 1.6%).
const GRAYSCALE_PERIOD: u64 = 64;
/// Decorrelate the PNG and grayscale slots from each other ("PNG" and "GRAY" in ASCII).
const PNG_SALT: u64 = 0x0050_4E47;
const GRAYSCALE_SALT: u64 = 0x4752_4159;

/// How an image is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Encoding {
    /// A JPEG with these settings.
    Jpeg {
        quality: i32,
        subsampling: turbojpeg::Subsamp,
        progressive: bool,
    },
    /// An 8-bit RGB PNG.
    Png,
}

/// Everything needed to make image `index` of a set.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ImagePlan {
    pub(crate) width: usize,
    pub(crate) height: usize,
    pub(crate) encoding: Encoding,
    pub(crate) style: PhotoStyle,
    /// Seeds the painter, which draws from its own stream.
    pub(crate) paint_seed: u128,
}

impl ImagePlan {
    /// The plan for image `index` of the set generated with `seed`.
    pub(crate) fn for_index(seed: u64, index: u64) -> ImagePlan {
        let mut rng = Pcg64Mcg::new(stream_seed(seed, index, 1));
        let (width, height) = draw_dimensions(&mut rng);

        // Where the PNG and grayscale slots fall within their periods depends on the seed, but
        // every window of PNG_PERIOD consecutive indices holds exactly one PNG.
        let png_slot = mix64(seed ^ PNG_SALT) % PNG_PERIOD;
        let grayscale_slot = mix64(seed ^ GRAYSCALE_SALT) % GRAYSCALE_PERIOD;
        let is_png = index % PNG_PERIOD == png_slot;
        let grayscale = !is_png && index % GRAYSCALE_PERIOD == grayscale_slot;

        let encoding = if is_png {
            Encoding::Png
        } else {
            Encoding::Jpeg {
                quality: draw_quality(&mut rng),
                subsampling: if grayscale {
                    turbojpeg::Subsamp::Gray
                } else {
                    draw_subsampling(&mut rng)
                },
                progressive: unit(&mut rng) < 0.03,
            }
        };
        // Log-normal busyness: most photos near average, some nearly flat, some very busy,
        // which gives file sizes a long right tail like the real set.
        let detail = (0.45 * normal(&mut rng)).exp().clamp(0.25, 3.0);
        ImagePlan {
            width,
            height,
            encoding,
            style: PhotoStyle { detail, grayscale },
            paint_seed: stream_seed(seed, index, 2),
        }
    }
}

fn draw_dimensions(rng: &mut Pcg64Mcg) -> (usize, usize) {
    // (long side over short side, share of portrait orientation), weighted.
    let roll = unit(rng);
    let (aspect, portrait_share) = match roll {
        r if r < 0.68 => (4.0 / 3.0, 0.22),
        r if r < 0.77 => (1.0, 0.0),
        r if r < 0.86 => (3.0 / 2.0, 0.25),
        r if r < 0.90 => (16.0 / 9.0, 0.1),
        _ => (1.05 + 1.2 * unit(rng) * unit(rng), 0.35),
    };
    let long_side = if unit(rng) < 0.4 {
        500.0
    } else {
        (360.0 * (0.35 * normal(rng)).exp()).clamp(150.0, 1000.0)
    };
    let short_side = (long_side / aspect).round().max(100.0);
    let long_side = long_side.round();
    if unit(rng) < portrait_share {
        (short_side as usize, long_side as usize)
    } else {
        (long_side as usize, short_side as usize)
    }
}

fn draw_quality(rng: &mut Pcg64Mcg) -> i32 {
    if unit(rng) < 0.12 {
        75 + (rng.next_u32() % 11) as i32
    } else {
        (90.0 + 2.6 * normal(rng)).round().clamp(75.0, 96.0) as i32
    }
}

fn draw_subsampling(rng: &mut Pcg64Mcg) -> turbojpeg::Subsamp {
    match unit(rng) {
        r if r < 0.82 => turbojpeg::Subsamp::Sub2x2,
        r if r < 0.96 => turbojpeg::Subsamp::None,
        _ => turbojpeg::Subsamp::Sub2x1,
    }
}

/// A standard normal draw (Box-Muller; one of the pair is discarded for simplicity).
fn normal(rng: &mut Pcg64Mcg) -> f32 {
    let radius = (-2.0 * (1.0 - unit(rng)).ln()).sqrt();
    radius * (std::f32::consts::TAU * unit(rng)).cos()
}

/// A 128-bit RNG seed unique to `(seed, index, stream)`.
fn stream_seed(seed: u64, index: u64, stream: u64) -> u128 {
    let high = mix64(seed ^ mix64(stream));
    let low = mix64(index.wrapping_add(high));
    (u128::from(high) << 64) | u128::from(low)
}

/// SplitMix64's finaliser: spreads nearby inputs over the whole range.
fn mix64(value: u64) -> u64 {
    let mut z = value.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_are_pure_functions_of_seed_and_index() {
        let first = ImagePlan::for_index(5, 123);
        let again = ImagePlan::for_index(5, 123);
        assert_eq!(
            (first.width, first.height, first.encoding, first.paint_seed),
            (again.width, again.height, again.encoding, again.paint_seed)
        );
        assert_ne!(first.paint_seed, ImagePlan::for_index(6, 123).paint_seed);
        assert_ne!(first.paint_seed, ImagePlan::for_index(5, 124).paint_seed);
    }

    #[test]
    fn every_window_of_two_hundred_holds_one_png() {
        for seed in 0..4 {
            let pngs = (0..200)
                .filter(|index| ImagePlan::for_index(seed, *index).encoding == Encoding::Png)
                .count();
            assert_eq!(pngs, 1);
        }
    }

    #[test]
    fn shapes_and_settings_follow_imagenet() {
        let plans: Vec<ImagePlan> = (0..20_000).map(|i| ImagePlan::for_index(9, i)).collect();
        let count = plans.len() as f64;
        let mean_width = plans.iter().map(|p| p.width as f64).sum::<f64>() / count;
        let mean_height = plans.iter().map(|p| p.height as f64).sum::<f64>() / count;
        assert!((380.0..430.0).contains(&mean_width), "{mean_width}");
        assert!((330.0..375.0).contains(&mean_height), "{mean_height}");
        assert!(plans
            .iter()
            .all(|p| (100..=1000).contains(&p.width) && (100..=1000).contains(&p.height)));
        let mut grayscale = 0;
        let mut qualities = Vec::new();
        for plan in &plans {
            if let Encoding::Jpeg {
                quality,
                subsampling,
                ..
            } = plan.encoding
            {
                qualities.push(quality);
                grayscale += usize::from(subsampling == turbojpeg::Subsamp::Gray);
            }
        }
        let grayscale_share = grayscale as f64 / count;
        assert!((0.01..0.02).contains(&grayscale_share), "{grayscale_share}");
        qualities.sort_unstable();
        assert_eq!(qualities[qualities.len() / 2], 90);
        assert!(qualities[0] >= 75 && qualities[qualities.len() - 1] <= 96);
    }
}
