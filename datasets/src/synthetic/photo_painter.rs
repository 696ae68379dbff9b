//! Synthesises photo-like pixels: content a JPEG encoder finds as hard as a real photograph.
//!
//! Smooth gradients compress to almost nothing and would make every decode benchmark lie, so the
//! picture stacks what makes photographs expensive to encode:
//! - large regions of a muted palette with sharp, wiggly borders (the scene's big objects);
//! - a "dead leaves" layer: thousands of occluding ellipses and rectangles whose sizes follow a
//!   power law, the classic model of natural images' scale invariance and occlusion edges,
//!   each shifting colour and surface texture;
//! - surface texture at five scales (16 down to 1 pixel), hard-edged rather than smooth, scaled
//!   by a low-frequency mask so busy areas (foliage, gravel) sit beside quiet ones (sky, walls);
//! - colour that follows the texture, soft lighting, luminance grain, and a tone curve that
//!   rolls highlights and shadows off instead of clipping them flat.
//!
//! Everything is drawn from the caller's RNG in a fixed order, so the pixels depend only on the
//! seed, never on threads.

use rand_core::Rng;
use rand_pcg::Pcg64Mcg;

/// How busy one picture is; the generator draws these per image.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PhotoStyle {
    /// Scales texture, objects and grain; 1.0 is an average photograph.
    pub(crate) detail: f32,
    /// One channel (grayscale) instead of RGB.
    pub(crate) grayscale: bool,
}

// The constants below were tuned so that a 500-image set averages about 110 KB per file at
// ImageNet's quality mix (see `generate_imagenet_like`); the file size rises with each of them.

/// Amplitude, in 8-bit levels, of each texture octave at detail 1. Octaves share one
/// amplitude: with a `1/f` fall-off the finest scales were too weak to reach photographs' file
/// sizes.
const TEXTURE_LEVELS: f32 = 50.0;
/// Texture octaves, in pixels per noise cell.
const TEXTURE_CELLS: [usize; 5] = [16, 8, 4, 2, 1];
/// How abruptly texture values saturate: 1 is smooth value noise, larger is more like
/// patches with edges.
const TEXTURE_HARDNESS: f32 = 4.0;
/// Texture strength where the busy mask is neutral.
const BUSY_BASE: f32 = 0.8;
/// How far each channel's response to texture strays from 1 (coloured texture).
const TEXTURE_TINT_SPREAD: f32 = 1.2;
/// Dead leaves cover the picture this many times over (at detail 1).
const LEAF_COVERAGE: f32 = 3.0;
/// Smallest leaf radius, in pixels.
const LEAF_SMALLEST_RADIUS: f32 = 2.0;
/// Largest leaf radius, as a share of the picture's long side.
const LEAF_LARGEST_RADIUS: f32 = 0.15;
/// Largest luminance shift of a leaf, in 8-bit levels.
const LEAF_LUMINANCE_LEVELS: f32 = 60.0;
/// Largest per-channel colour shift of a leaf, in 8-bit levels.
const LEAF_TINT_LEVELS: f32 = 30.0;
/// Amplitude of the slow per-channel colour drift across the picture, in 8-bit levels.
const CHROMA_DRIFT_LEVELS: f32 = 14.0;
/// Standard deviation of the luminance grain at detail 1, in 8-bit levels.
const GRAIN_LEVELS: f32 = 3.2;
/// Entries of the palette lookup table over the region field's range.
const PALETTE_STEPS: usize = 2048;
/// The region field stays within this range (its layers' weights sum to 1.47).
const REGION_FIELD_LIMIT: f32 = 1.5;

/// Paints a `width` x `height` picture; returns RGB (or gray) bytes, rows packed.
pub(crate) fn paint_photo(
    width: usize,
    height: usize,
    style: PhotoStyle,
    rng: &mut Pcg64Mcg,
) -> Vec<u8> {
    let channels = if style.grayscale { 1 } else { 3 };
    let long_side = width.max(height) as f32;

    let palette_size = 3 + (rng.next_u32() % 4) as usize;
    let palette: Vec<[f32; 3]> = (0..palette_size).map(|_| random_color(rng)).collect();
    let edge_sharpness = 20.0 + 60.0 * unit(rng);
    let palette_table = PaletteTable::new(&palette, edge_sharpness);
    let tint = [
        1.0 + TEXTURE_TINT_SPREAD * (unit(rng) - 0.5),
        1.0 + TEXTURE_TINT_SPREAD * (unit(rng) - 0.5),
        1.0 + TEXTURE_TINT_SPREAD * (unit(rng) - 0.5),
    ];
    let light_slope_x = 0.3 * (unit(rng) - 0.5);
    let light_slope_y = 0.3 * (unit(rng) - 0.5);
    let vignette = 0.25 * unit(rng);

    let region_cell = (long_side / (1.5 + 2.5 * unit(rng))).max(8.0) as usize;
    let mut region_layers = [
        NoiseLayer::new(width, height, region_cell, rng),
        NoiseLayer::new(width, height, (region_cell / 3).max(2), rng),
        NoiseLayer::new(width, height, (region_cell / 9).max(2), rng),
    ];
    let mut busy_mask = NoiseLayer::new(width, height, (long_side / 3.0) as usize, rng);
    let texture_amplitude = TEXTURE_LEVELS * style.detail.sqrt();
    let mut texture_layers: Vec<NoiseLayer> = TEXTURE_CELLS
        .iter()
        .map(|cell| NoiseLayer::new(width, height, *cell, rng))
        .collect();
    let leaves = LeafMap::scatter(width, height, style.detail, rng);
    let mut chroma_layers: Vec<NoiseLayer> = (0..channels)
        .map(|_| NoiseLayer::new(width, height, (long_side / 6.0) as usize, rng))
        .collect();

    let column_light: Vec<f32> = (0..width)
        .map(|x| {
            let position = x as f32 / width as f32 - 0.5;
            1.0 + light_slope_x * position - vignette * position * position
        })
        .collect();
    let grain_levels = GRAIN_LEVELS * style.detail;

    let mut region = vec![0.0f32; width];
    let mut busy = vec![0.0f32; width];
    let mut texture = vec![0.0f32; width];
    let mut chroma = vec![vec![0.0f32; width]; channels];
    let mut grain = vec![0.0f32; width];
    let mut luminance = vec![0.0f32; width];
    let mut base = [
        vec![0.0f32; width],
        vec![0.0f32; width],
        vec![0.0f32; width],
    ];
    let mut planes = vec![vec![0.0f32; width]; channels];
    let mut byte_planes = vec![vec![0u8; width]; channels];
    let mut pixels = vec![0u8; width * height * channels];

    for (y, pixel_row) in pixels.chunks_exact_mut(width * channels).enumerate() {
        region.fill(0.0);
        for (layer, weight) in region_layers.iter_mut().zip([1.0, 0.35, 0.12]) {
            layer.add_row(y, weight, &mut region, |value| value);
        }
        busy.fill(0.0);
        busy_mask.add_row(y, 1.0, &mut busy, |value| value);
        texture.fill(0.0);
        for layer in &mut texture_layers {
            layer.add_row(y, texture_amplitude, &mut texture, |value| {
                (value * TEXTURE_HARDNESS).clamp(-1.0, 1.0)
            });
        }
        for (layer, row) in chroma_layers.iter_mut().zip(chroma.iter_mut()) {
            row.fill(0.0);
            layer.add_row(y, CHROMA_DRIFT_LEVELS, row, |value| value);
        }
        fill_grain(rng, grain_levels, &mut grain);
        let leaf_row = leaves.row(y);

        let row_position = y as f32 / height as f32 - 0.5;
        let row_light = 1.0 + light_slope_y * row_position - vignette * row_position * row_position;

        // One scalar pass for the table look-ups, then straight-line passes the compiler can
        // vectorise.
        for x in 0..width {
            let leaf = leaves.leaf(leaf_row[x]);
            let color = palette_table.color(region[x]);
            let busyness = (BUSY_BASE + 0.9 * busy[x]).clamp(0.08, 1.6) * leaf.texture_gain;
            luminance[x] = leaf.luminance + texture[x] * busyness;
            for channel in 0..3 {
                base[channel][x] = color[channel] + leaf.tint[channel];
            }
        }
        if style.grayscale {
            let [red, green, blue] = &base;
            for (((gray, red), green), blue) in planes[0].iter_mut().zip(red).zip(green).zip(blue) {
                *gray = 0.299 * red + 0.587 * green + 0.114 * blue;
            }
        } else {
            for (plane, base) in planes.iter_mut().zip(&base) {
                plane.copy_from_slice(base);
            }
        }
        for (channel, plane) in planes.iter_mut().enumerate() {
            let channel_tint = if style.grayscale { 1.0 } else { tint[channel] };
            for ((((value, luminance), chroma), light), grain) in plane
                .iter_mut()
                .zip(&luminance)
                .zip(&chroma[channel])
                .zip(&column_light)
                .zip(&grain)
            {
                *value = (*value + luminance * channel_tint + chroma) * (row_light * light) + grain;
            }
        }
        for (bytes, plane) in byte_planes.iter_mut().zip(&planes) {
            for (byte, value) in bytes.iter_mut().zip(plane) {
                *byte = to_byte(*value);
            }
        }
        if style.grayscale {
            pixel_row.copy_from_slice(&byte_planes[0]);
        } else {
            for (((pixel, red), green), blue) in pixel_row
                .chunks_exact_mut(3)
                .zip(&byte_planes[0])
                .zip(&byte_planes[1])
                .zip(&byte_planes[2])
            {
                pixel.copy_from_slice(&[*red, *green, *blue]);
            }
        }
    }
    pixels
}

/// One occluding object of the "dead leaves" layer: an ellipse or a rotated rectangle that
/// shifts the colour and the surface texture of what lies under it.
#[derive(Debug, Clone, Copy)]
struct Leaf {
    luminance: f32,
    tint: [f32; 3],
    texture_gain: f32,
}

/// The dead-leaves layer: objects of sizes drawn from a power law, stacked front over back.
///
/// This model reproduces the scale invariance and the sharp occlusion edges of natural images,
/// which is where a JPEG spends most of its bits.
struct LeafMap {
    width: usize,
    /// Index into `leaves` for every pixel; 0 is "no leaf".
    ids: Vec<u32>,
    leaves: Vec<Leaf>,
}

impl LeafMap {
    fn scatter(width: usize, height: usize, detail: f32, rng: &mut Pcg64Mcg) -> LeafMap {
        let mut ids = vec![0u32; width * height];
        let mut leaves = vec![Leaf {
            luminance: 0.0,
            tint: [0.0; 3],
            texture_gain: 1.0,
        }];
        let long_side = width.max(height) as f32;
        let largest = long_side * LEAF_LARGEST_RADIUS;
        let target_area = LEAF_COVERAGE * detail.sqrt() * (width * height) as f32;
        let mut area = 0.0;
        while area < target_area && leaves.len() < 1 << 20 {
            // Inverse-CDF draw from p(r) ~ r^-3, the exponent that makes the pattern look the
            // same at every scale.
            let radius = (LEAF_SMALLEST_RADIUS / (1.0 - unit(rng)).sqrt()).min(largest);
            let elongation = 0.4 + 0.6 * unit(rng);
            let (major, minor) = (radius / elongation.sqrt(), radius * elongation.sqrt());
            let angle = std::f32::consts::PI * unit(rng);
            let center_x = width as f32 * unit(rng);
            let center_y = height as f32 * unit(rng);
            let rectangular = unit(rng) < 0.4;
            let leaf = Leaf {
                luminance: LEAF_LUMINANCE_LEVELS * (2.0 * unit(rng) - 1.0),
                tint: [
                    LEAF_TINT_LEVELS * (2.0 * unit(rng) - 1.0),
                    LEAF_TINT_LEVELS * (2.0 * unit(rng) - 1.0),
                    LEAF_TINT_LEVELS * (2.0 * unit(rng) - 1.0),
                ],
                texture_gain: 0.2 + 1.6 * unit(rng),
            };
            let id = leaves.len() as u32;
            leaves.push(leaf);
            area += std::f32::consts::PI * major * minor;

            let outline = Outline::new((center_x, center_y), major, minor, angle, rectangular);
            let reach = (major * major + minor * minor).sqrt();
            let top = (center_y - reach).max(0.0) as usize;
            let bottom = ((center_y + reach).ceil() as usize).min(height);
            for y in top..bottom {
                if let Some(span) = outline.row_span(y, width) {
                    ids[y * width..][span].fill(id);
                }
            }
        }
        LeafMap { width, ids, leaves }
    }

    fn row(&self, y: usize) -> &[u32] {
        &self.ids[y * self.width..(y + 1) * self.width]
    }

    fn leaf(&self, id: u32) -> Leaf {
        self.leaves[id as usize]
    }
}

/// A leaf's shape, an ellipse or a rotated rectangle, prepared for finding the pixels it
/// covers one row at a time.
struct Outline {
    center_x: f32,
    center_y: f32,
    form: OutlineForm,
}

enum OutlineForm {
    /// `a dx^2 + (b dy) dx + (c dy^2 - 1) <= 0`, with the reciprocal of `2a` kept.
    Ellipse {
        a_reciprocal_doubled: f32,
        a: f32,
        b: f32,
        c: f32,
    },
    /// `|dx cos + dy sin| <= half_major` and `|dy cos - dx sin| <= half_minor`.
    Rectangle {
        half_major: f32,
        half_minor: f32,
        sin: f32,
        cos: f32,
    },
}

impl Outline {
    fn new(
        center: (f32, f32),
        half_major: f32,
        half_minor: f32,
        angle: f32,
        rectangular: bool,
    ) -> Outline {
        let (sin, cos) = angle.sin_cos();
        let form = if rectangular {
            OutlineForm::Rectangle {
                half_major,
                half_minor,
                sin,
                cos,
            }
        } else {
            let major_squared = half_major * half_major;
            let minor_squared = half_minor * half_minor;
            let a = cos * cos / major_squared + sin * sin / minor_squared;
            OutlineForm::Ellipse {
                a_reciprocal_doubled: 0.5 / a,
                a,
                b: 2.0 * cos * sin * (1.0 / major_squared - 1.0 / minor_squared),
                c: sin * sin / major_squared + cos * cos / minor_squared,
            }
        };
        Outline {
            center_x: center.0,
            center_y: center.1,
            form,
        }
    }

    /// The pixels of row `y` whose centres lie inside, as a column range; filling whole spans
    /// is many times faster than testing every pixel of the bounding box.
    fn row_span(&self, y: usize, width: usize) -> Option<std::ops::Range<usize>> {
        let dy = y as f32 + 0.5 - self.center_y;
        // Offsets `dx` from the centre that lie inside.
        let (low, high) = match self.form {
            OutlineForm::Ellipse {
                a_reciprocal_doubled,
                a,
                b,
                c,
            } => {
                let b = b * dy;
                let c = c * dy * dy - 1.0;
                let discriminant = b * b - 4.0 * a * c;
                if discriminant < 0.0 {
                    return None;
                }
                let root = discriminant.sqrt();
                (
                    (-b - root) * a_reciprocal_doubled,
                    (-b + root) * a_reciprocal_doubled,
                )
            }
            OutlineForm::Rectangle {
                half_major,
                half_minor,
                sin,
                cos,
            } => {
                let (low_along, high_along) =
                    linear_interval(cos, -half_major - dy * sin, half_major - dy * sin)?;
                let (low_across, high_across) =
                    linear_interval(sin, dy * cos - half_minor, dy * cos + half_minor)?;
                (low_along.max(low_across), high_along.min(high_across))
            }
        };
        // Pixel x is inside when its centre x + 0.5 lies in [centre + low, centre + high]:
        // x from ceil(centre + low - 0.5) to floor(centre + high - 0.5). Clamping to the row
        // first keeps both conversions in range.
        let first = ceil_non_negative((self.center_x + low - 0.5).clamp(0.0, width as f32));
        let end = (self.center_x + high + 0.5).clamp(0.0, width as f32) as usize;
        (first < end).then_some(first..end)
    }
}

/// `value.ceil()` for values in `0..2^24`, without the libm call.
fn ceil_non_negative(value: f32) -> usize {
    let truncated = value as usize;
    truncated + usize::from((truncated as f32) < value)
}

/// The values of `dx` with `coefficient * dx` in `[low, high]`, or `None` if there are none.
fn linear_interval(coefficient: f32, low: f32, high: f32) -> Option<(f32, f32)> {
    if coefficient.abs() < 1e-6 {
        return (low <= 0.0 && 0.0 <= high).then_some((f32::NEG_INFINITY, f32::INFINITY));
    }
    let (first, second) = (low / coefficient, high / coefficient);
    Some((first.min(second), first.max(second)))
}

/// The palette mixed along the region field, tabulated: sharp transitions between successive
/// colours make the borders between the scene's large objects.
struct PaletteTable {
    colors: Vec<[f32; 3]>,
}

impl PaletteTable {
    fn new(palette: &[[f32; 3]], sharpness: f32) -> PaletteTable {
        let steps = palette.len() as f32;
        let colors = (0..PALETTE_STEPS)
            .map(|entry| {
                let field =
                    REGION_FIELD_LIMIT * (2.0 * entry as f32 / (PALETTE_STEPS - 1) as f32 - 1.0);
                let mut color = palette[0];
                for (step, next) in palette.iter().enumerate().skip(1) {
                    let threshold = -0.9 + 1.8 * step as f32 / steps;
                    let weight = ((field - threshold) * sharpness + 0.5).clamp(0.0, 1.0);
                    for channel in 0..3 {
                        color[channel] += (next[channel] - color[channel]) * weight;
                    }
                }
                color
            })
            .collect();
        PaletteTable { colors }
    }

    fn color(&self, field: f32) -> [f32; 3] {
        const SCALE: f32 = 0.5 * (PALETTE_STEPS - 1) as f32 / REGION_FIELD_LIMIT;
        const OFFSET: f32 = 0.5 * (PALETTE_STEPS - 1) as f32;
        let entry = ((field * SCALE + OFFSET).max(0.0) as usize).min(PALETTE_STEPS - 1);
        self.colors[entry]
    }
}

/// A muted, photo-like colour: mostly luminance, moderate saturation.
fn random_color(rng: &mut Pcg64Mcg) -> [f32; 3] {
    let luminance = 50.0 + 160.0 * unit(rng);
    let saturation = 55.0 * unit(rng);
    let red_shift = saturation * (unit(rng) - 0.5) * 2.0;
    let blue_shift = saturation * (unit(rng) - 0.5) * 2.0;
    [
        luminance + red_shift,
        luminance - 0.5 * (red_shift + blue_shift),
        luminance + blue_shift,
    ]
}

/// Triangular noise with standard deviation `levels`: cheap and close enough to Gaussian for
/// sensor grain. Sixteen bits of randomness per value.
fn fill_grain(rng: &mut Pcg64Mcg, levels: f32, grain: &mut [f32]) {
    // Two uniform bytes summed have standard deviation sqrt(2 * (256^2 - 1) / 12) ≈ 104.5.
    let scale = levels / 104.5;
    for chunk in grain.chunks_mut(4) {
        let bits = rng.next_u64();
        for (slot, value) in chunk.iter_mut().enumerate() {
            let pair = bits >> (slot * 16);
            let sum = (pair & 0xFF) as f32 + ((pair >> 8) & 0xFF) as f32;
            *value = (sum - 255.0) * scale;
        }
    }
}

/// Rounds to 8 bits through a soft shoulder at both ends, as a camera's tone curve does, so
/// stacked layers roll off into the highlights and shadows instead of clipping flat.
fn to_byte(value: f32) -> u8 {
    const KNEE_LOW: f32 = 40.0;
    const KNEE_HIGH: f32 = 215.0;
    const SHOULDER_SLOPE: f32 = 0.35;
    // Branch-free so that the row loops vectorise.
    let toned = value - (1.0 - SHOULDER_SLOPE) * (value - KNEE_HIGH).max(0.0)
        + (1.0 - SHOULDER_SLOPE) * (KNEE_LOW - value).max(0.0);
    (toned + 0.5).clamp(0.0, 255.0) as i32 as u8
}

/// A uniform draw in `[0, 1)`.
pub(crate) fn unit(rng: &mut Pcg64Mcg) -> f32 {
    (rng.next_u32() >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// Value noise: random values on a lattice with `cell` pixels between points, smoothly
/// interpolated. Evaluated one image row at a time into a caller's buffer.
///
/// Rows are produced top to bottom. The two lattice rows around the current image row are kept
/// interpolated across the full width, so each image row is one straight-line (vectorisable)
/// blend of two buffers instead of a walk over short cells.
struct NoiseLayer {
    cell: usize,
    /// Where pixel 0 falls within the first cell, so octaves do not share a grid origin.
    phase_x: usize,
    phase_y: usize,
    lattice_width: usize,
    lattice: Vec<f32>,
    /// Smoothstep weight for each offset within a cell.
    weights: Vec<f32>,
    /// Lattice rows `expanded_row` and `expanded_row + 1`, interpolated across the image width.
    upper: Vec<f32>,
    lower: Vec<f32>,
    expanded_row: Option<usize>,
}

impl NoiseLayer {
    fn new(width: usize, height: usize, cell: usize, rng: &mut Pcg64Mcg) -> NoiseLayer {
        let cell = cell.max(1);
        let phase_x = (rng.next_u32() as usize) % cell;
        let phase_y = (rng.next_u32() as usize) % cell;
        let lattice_width = (width + phase_x) / cell + 2;
        let lattice_height = (height + phase_y) / cell + 2;
        let lattice = (0..lattice_width * lattice_height)
            .map(|_| 2.0 * unit(rng) - 1.0)
            .collect();
        let weights = (0..cell)
            .map(|offset| {
                let t = offset as f32 / cell as f32;
                t * t * (3.0 - 2.0 * t)
            })
            .collect();
        NoiseLayer {
            cell,
            phase_x,
            phase_y,
            lattice_width,
            lattice,
            weights,
            upper: vec![0.0; width],
            lower: vec![0.0; width],
            expanded_row: None,
        }
    }

    /// Adds `amplitude * shape(value)` along row `y` to `out`, for this layer's values in
    /// `[-1, 1]`. `out` must be as wide as the image.
    fn add_row(&mut self, y: usize, amplitude: f32, out: &mut [f32], shape: impl Fn(f32) -> f32) {
        let position_y = y + self.phase_y;
        let lattice_y = position_y / self.cell;
        let weight_y = self.weights[position_y % self.cell];
        match self.expanded_row {
            Some(row) if row == lattice_y => {}
            Some(row) if row + 1 == lattice_y => {
                std::mem::swap(&mut self.upper, &mut self.lower);
                self.expand(lattice_y + 1, false);
            }
            _ => {
                self.expand(lattice_y, true);
                self.expand(lattice_y + 1, false);
            }
        }
        self.expanded_row = Some(lattice_y);
        for ((value, upper), lower) in out.iter_mut().zip(&self.upper).zip(&self.lower) {
            *value += amplitude * shape(upper + (lower - upper) * weight_y);
        }
    }

    /// Interpolates lattice row `lattice_y` across the image width into `upper` or `lower`.
    fn expand(&mut self, lattice_y: usize, into_upper: bool) {
        let lattice_row = &self.lattice[lattice_y * self.lattice_width..][..self.lattice_width];
        let out = if into_upper {
            &mut self.upper
        } else {
            &mut self.lower
        };
        if self.cell == 1 {
            let width = out.len();
            out.copy_from_slice(&lattice_row[..width]);
            return;
        }
        let mut x = 0;
        let mut lattice_x = 0;
        let mut offset = self.phase_x;
        while x < out.len() {
            let span = (self.cell - offset).min(out.len() - x);
            let left = lattice_row[lattice_x];
            let step = lattice_row[lattice_x + 1] - left;
            for (value, weight) in out[x..x + span]
                .iter_mut()
                .zip(&self.weights[offset..offset + span])
            {
                *value = left + step * weight;
            }
            x += span;
            lattice_x += 1;
            offset = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rng(seed: u128) -> Pcg64Mcg {
        Pcg64Mcg::new(seed)
    }

    #[test]
    fn same_seed_paints_the_same_pixels() {
        let style = PhotoStyle {
            detail: 1.0,
            grayscale: false,
        };
        let first = paint_photo(67, 41, style, &mut rng(7));
        let second = paint_photo(67, 41, style, &mut rng(7));
        let other = paint_photo(67, 41, style, &mut rng(8));
        assert_eq!(first.len(), 67 * 41 * 3);
        assert_eq!(first, second);
        assert_ne!(first, other);
    }

    #[test]
    fn grayscale_has_one_channel_and_uses_the_range() {
        let style = PhotoStyle {
            detail: 1.0,
            grayscale: true,
        };
        let pixels = paint_photo(128, 96, style, &mut rng(3));
        assert_eq!(pixels.len(), 128 * 96);
        let distinct = pixels
            .iter()
            .fold([false; 256], |mut seen, value| {
                seen[*value as usize] = true;
                seen
            })
            .iter()
            .filter(|seen| **seen)
            .count();
        assert!(distinct > 60, "only {distinct} gray levels");
    }

    #[test]
    fn noise_layer_stays_in_range_and_is_continuous() {
        let mut layer = NoiseLayer::new(50, 20, 7, &mut rng(1));
        let mut row = vec![0.0; 50];
        layer.add_row(13, 1.0, &mut row, |value| value);
        assert!(row.iter().all(|value| (-1.0..=1.0).contains(value)));
        let largest_jump = row
            .windows(2)
            .map(|pair| (pair[1] - pair[0]).abs())
            .fold(0.0f32, f32::max);
        assert!(largest_jump < 0.7, "jump {largest_jump}");
    }
}
