//! Synthesises photo-like pixels: content a JPEG encoder finds as hard as a real photograph.
//!
//! Smooth gradients compress to almost nothing and would make every decode benchmark lie, so the
//! picture is built from what makes photographs expensive: regions with sharp, wiggly borders
//! (objects), value-noise texture at six or seven scales whose amplitude falls roughly as `1/f`
//! (natural images' spectrum), busy and quiet areas (a low-frequency mask scales the texture),
//! small high-contrast speckles (foliage, gravel), soft lighting, and per-pixel sensor grain.
//!
//! Everything is drawn from the caller's RNG in a fixed order, row by row, so the pixels depend
//! only on the seed, never on threads.

use rand_core::Rng;
use rand_pcg::Pcg64Mcg;

/// How busy one picture is; the generator draws these per image.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PhotoStyle {
    /// Scales texture and grain; 1.0 is an average photograph.
    pub(crate) detail: f32,
    /// One channel (grayscale) instead of RGB.
    pub(crate) grayscale: bool,
}

/// Amplitude, in 8-bit levels, of the coarsest texture octave at detail 1.
fn knob(name: &str, default: f32) -> f32 { std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default) }
const TEXTURE_AMPLITUDE: f32 = 30.0;
/// Each octave half as large is this much weaker: 0.5 would be an exact `1/f` spectrum;
/// photographs resized down from camera resolution keep a little more fine detail.
const OCTAVE_GAIN: f32 = 0.8;
/// Standard deviation of the luminance grain at detail 1, in 8-bit levels.
const GRAIN_LEVELS: f32 = 3.2;

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
    let tint_spread = knob("TT", 0.4);
    let tint = [
        1.0 + tint_spread * (unit(rng) - 0.5),
        1.0 + tint_spread * (unit(rng) - 0.5),
        1.0 + tint_spread * (unit(rng) - 0.5),
    ];
    let light_slope_x = 0.3 * (unit(rng) - 0.5);
    let light_slope_y = 0.3 * (unit(rng) - 0.5);
    let vignette = 0.25 * unit(rng);

    let region_cell = (long_side / (1.5 + 2.5 * unit(rng))).max(8.0) as usize;
    let mut region_layers = vec![
        NoiseLayer::new(width, height, region_cell, rng),
        NoiseLayer::new(width, height, (region_cell / 3).max(2), rng),
        NoiseLayer::new(width, height, (region_cell / 9).max(2), rng),
    ];
    let mut busy_mask = NoiseLayer::new(width, height, (long_side / 3.0) as usize, rng);
    let mut texture_layers = Vec::new();
    let mut texture_amplitudes = Vec::new();
    let mut cell = knob("TC", 16.0);
    let mut amplitude = knob("TA", TEXTURE_AMPLITUDE) * style.detail.sqrt();
    while cell >= knob("TMIN", 1.9) {
        texture_layers.push(NoiseLayer::new(width, height, cell.round() as usize, rng));
        texture_amplitudes.push(amplitude);
        cell /= 2.0;
        amplitude *= knob("TG", OCTAVE_GAIN);
    }
    let hardness = knob("TH", 4.0);
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
    let grain_levels = knob("TGR", GRAIN_LEVELS) * style.detail;

    let mut region = vec![0.0f32; width];
    let mut busy = vec![0.0f32; width];
    let mut texture = vec![0.0f32; width];
    let mut octave_row = vec![0.0f32; width];
    let mut chroma = vec![vec![0.0f32; width]; channels];
    let mut grain = vec![0.0f32; width];
    let mut pixels = vec![0u8; width * height * channels];

    for (y, pixel_row) in pixels.chunks_exact_mut(width * channels).enumerate() {
        region.fill(0.0);
        for (layer, weight) in region_layers.iter_mut().zip([1.0, 0.35, 0.12]) {
            layer.add_row(y, weight, &mut region);
        }
        busy.fill(0.0);
        busy_mask.add_row(y, 1.0, &mut busy);
        texture.fill(0.0);
        for (layer, amplitude) in texture_layers.iter_mut().zip(&texture_amplitudes) {
            octave_row.fill(0.0);
            layer.add_row(y, 1.0, &mut octave_row);
            for (value, octave) in texture.iter_mut().zip(&octave_row) {
                *value += amplitude * (octave * hardness).clamp(-1.0, 1.0);
            }
        }
        for (layer, row) in chroma_layers.iter_mut().zip(chroma.iter_mut()) {
            row.fill(0.0);
            layer.add_row(y, 14.0, row);
        }
        fill_grain(rng, grain_levels, &mut grain);
        let leaf_row = leaves.row(y);

        let row_position = y as f32 / height as f32 - 0.5;
        let row_light = 1.0 + light_slope_y * row_position - vignette * row_position * row_position;
        for x in 0..width {
            let color = blend_palette(&palette, region[x], edge_sharpness);
            let leaf = leaves.leaf(leaf_row[x]);
            // Busy areas (foliage, fabric) next to quiet ones (sky, walls), as in photos.
            let busyness = (0.55 + 0.9 * busy[x]).clamp(0.08, 1.6) * leaf.texture_gain;
            let luminance = leaf.luminance + texture[x] * busyness;
            let light = row_light * column_light[x];
            if channels == 1 {
                let gray = 0.299 * color[0] + 0.587 * color[1] + 0.114 * color[2];
                let value = (gray + luminance + chroma[0][x]) * light + grain[x];
                pixel_row[x] = to_byte(value);
            } else {
                for channel in 0..3 {
                    let value = (color[channel]
                        + leaf.tint[channel]
                        + luminance * tint[channel]
                        + chroma[channel][x])
                        * light
                        + grain[x];
                    pixel_row[x * 3 + channel] = to_byte(value);
                }
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
        let smallest = knob("LMIN", 2.0);
        let largest = long_side * knob("LMAX", 0.15);
        let target_area = knob("LCOV", 1.5) * detail.sqrt() * (width * height) as f32;
        let luminance_spread = knob("LL", 40.0);
        let tint_spread = knob("LT", 12.0);
        let mut area = 0.0;
        while area < target_area && leaves.len() < 1 << 20 {
            // Inverse-CDF draw from p(r) ~ r^-3, the exponent that makes the pattern look the
            // same at every scale.
            let radius = (smallest / (1.0 - unit(rng)).sqrt()).min(largest);
            let elongation = 0.4 + 0.6 * unit(rng);
            let (major, minor) = (radius / elongation.sqrt(), radius * elongation.sqrt());
            let angle = std::f32::consts::PI * unit(rng);
            let center_x = width as f32 * unit(rng);
            let center_y = height as f32 * unit(rng);
            let rectangular = unit(rng) < 0.4;
            let leaf = Leaf {
                luminance: luminance_spread * (2.0 * unit(rng) - 1.0),
                tint: [
                    tint_spread * (2.0 * unit(rng) - 1.0),
                    tint_spread * (2.0 * unit(rng) - 1.0),
                    tint_spread * (2.0 * unit(rng) - 1.0),
                ],
                texture_gain: 0.2 + 1.6 * unit(rng),
            };
            let id = leaves.len() as u32;
            leaves.push(leaf);
            area += std::f32::consts::PI * major * minor;

            let (sin, cos) = angle.sin_cos();
            let reach = (major * major + minor * minor).sqrt().ceil();
            let top = (center_y - reach).max(0.0) as usize;
            let bottom = ((center_y + reach).ceil() as usize).min(height);
            let left = (center_x - reach).max(0.0) as usize;
            let right = ((center_x + reach).ceil() as usize).min(width);
            for y in top..bottom {
                let dy = y as f32 + 0.5 - center_y;
                let row = &mut ids[y * width..(y + 1) * width];
                for (x, slot) in row.iter_mut().enumerate().take(right).skip(left) {
                    let dx = x as f32 + 0.5 - center_x;
                    let along = (dx * cos + dy * sin) / major;
                    let across = (dy * cos - dx * sin) / minor;
                    let inside = if rectangular {
                        along.abs() <= 1.0 && across.abs() <= 1.0
                    } else {
                        along * along + across * across <= 1.0
                    };
                    if inside {
                        *slot = id;
                    }
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

/// Mixes the palette along the region field with sharp transitions, which make the borders
/// between objects.
fn blend_palette(palette: &[[f32; 3]], field: f32, sharpness: f32) -> [f32; 3] {
    let mut color = palette[0];
    let steps = palette.len() as f32;
    for (step, next) in palette.iter().enumerate().skip(1) {
        let threshold = -0.9 + 1.8 * step as f32 / steps;
        let weight = ((field - threshold) * sharpness + 0.5).clamp(0.0, 1.0);
        for channel in 0..3 {
            color[channel] += (next[channel] - color[channel]) * weight;
        }
    }
    color
}

/// A muted, photo-like colour: mostly luminance, moderate saturation.
fn random_color(rng: &mut Pcg64Mcg) -> [f32; 3] {
    let luminance = knob("PL0", 50.0) + knob("PL1", 160.0) * unit(rng);
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
    let toned = if value > KNEE_HIGH {
        KNEE_HIGH + (value - KNEE_HIGH) * SHOULDER_SLOPE
    } else if value < KNEE_LOW {
        KNEE_LOW + (value - KNEE_LOW) * SHOULDER_SLOPE
    } else {
        value
    };
    (toned + 0.5).clamp(0.0, 255.0) as u8
}

/// A uniform draw in `[0, 1)`.
pub(crate) fn unit(rng: &mut Pcg64Mcg) -> f32 {
    (rng.next_u32() >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// Value noise: random values on a lattice with `cell` pixels between points, smoothly
/// interpolated. Evaluated one image row at a time into a caller's buffer.
struct NoiseLayer {
    cell: usize,
    /// Where pixel 0 falls within the first cell, so octaves do not share a grid origin.
    phase_x: usize,
    phase_y: usize,
    lattice_width: usize,
    lattice: Vec<f32>,
    /// Smoothstep weight for each offset within a cell.
    weights: Vec<f32>,
    /// The lattice interpolated vertically at the current row.
    row: Vec<f32>,
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
            row: vec![0.0; lattice_width],
        }
    }

    /// Adds `amplitude` times this layer's values along row `y` to `out`.
    fn add_row(&mut self, y: usize, amplitude: f32, out: &mut [f32]) {
        let position_y = y + self.phase_y;
        let lattice_y = position_y / self.cell;
        let weight_y = self.weights[position_y % self.cell];
        let top = &self.lattice[lattice_y * self.lattice_width..][..self.lattice_width];
        let bottom = &self.lattice[(lattice_y + 1) * self.lattice_width..][..self.lattice_width];
        for ((value, top), bottom) in self.row.iter_mut().zip(top).zip(bottom) {
            *value = amplitude * (top + (bottom - top) * weight_y);
        }

        let mut x = 0;
        let mut lattice_x = 0;
        let mut offset = self.phase_x;
        while x < out.len() {
            let span = (self.cell - offset).min(out.len() - x);
            let left = self.row[lattice_x];
            let step = self.row[lattice_x + 1] - left;
            for (value, weight) in out[x..x + span]
                .iter_mut()
                .zip(&self.weights[offset..offset + span])
            {
                *value += left + step * weight;
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
        layer.add_row(13, 1.0, &mut row);
        assert!(row.iter().all(|value| (-1.0..=1.0).contains(value)));
        let largest_jump = row
            .windows(2)
            .map(|pair| (pair[1] - pair[0]).abs())
            .fold(0.0f32, f32::max);
        assert!(largest_jump < 0.7, "jump {largest_jump}");
    }
}
