//! The last step of a sample: RGB8 pixels into the batch buffer in the requested layout and
//! element type, normalised on request (torchvision's ToTensor + Normalize).

/// Element type of the image tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageDtype {
    /// Raw pixels, 0..=255 (the default: 4x less to move than float32).
    Uint8,
    /// `v / 255`, then `(x - mean) / std` when normalising.
    Float32,
}

/// Memory layout of the image tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageLayout {
    /// [batch, height, width, channels]
    Nhwc,
    /// [batch, channels, height, width]
    Nchw,
}

/// Layout, type and normalisation of the image tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputFormat {
    /// Element type.
    pub dtype: ImageDtype,
    /// Layout.
    pub layout: ImageLayout,
    /// Per-channel (mean, std) on the [0, 1] scale; float32 only.
    pub normalize: Option<([f32; 3], [f32; 3])>,
}

impl Default for OutputFormat {
    fn default() -> Self {
        Self {
            dtype: ImageDtype::Uint8,
            layout: ImageLayout::Nhwc,
            normalize: None,
        }
    }
}

impl OutputFormat {
    /// Bytes per element.
    pub fn element_size(&self) -> usize {
        match self.dtype {
            ImageDtype::Uint8 => 1,
            ImageDtype::Float32 => 4,
        }
    }

    /// True when the resized RGB8 pixels already are the output bytes.
    pub fn is_packed_rgb8(&self) -> bool {
        self.dtype == ImageDtype::Uint8 && self.layout == ImageLayout::Nhwc
    }

    /// Per-channel lookup tables from a pixel value to its float32 output, computed exactly as
    /// torchvision does (`v / 255` in float32, then `(x - mean) / std` in float32).
    pub fn float_tables(&self) -> [[f32; 256]; 3] {
        let mut tables = [[0f32; 256]; 3];
        for (channel, table) in tables.iter_mut().enumerate() {
            for (value, slot) in table.iter_mut().enumerate() {
                let unit = value as f32 / 255.0;
                *slot = match &self.normalize {
                    Some((mean, std)) => (unit - mean[channel]) / std[channel],
                    None => unit,
                };
            }
        }
        tables
    }

    /// Writes `rgb` (packed RGB8, `width * height` pixels) into `dest` in this format.
    /// `tables` must come from [`OutputFormat::float_tables`] for float output.
    pub fn write(&self, rgb: &[u8], dest: &mut [u8], tables: &[[f32; 256]; 3]) {
        let pixels = rgb.len() / 3;
        match (self.dtype, self.layout) {
            (ImageDtype::Uint8, ImageLayout::Nhwc) => dest.copy_from_slice(rgb),
            (ImageDtype::Uint8, ImageLayout::Nchw) => {
                for (index, px) in rgb.chunks_exact(3).enumerate() {
                    for channel in 0..3 {
                        dest[channel * pixels + index] = px[channel];
                    }
                }
            }
            (ImageDtype::Float32, ImageLayout::Nhwc) => {
                for (px, out) in rgb.chunks_exact(3).zip(dest.chunks_exact_mut(12)) {
                    for channel in 0..3 {
                        let value = tables[channel][usize::from(px[channel])];
                        out[channel * 4..channel * 4 + 4].copy_from_slice(&value.to_le_bytes());
                    }
                }
            }
            (ImageDtype::Float32, ImageLayout::Nchw) => {
                let (red, rest) = dest.split_at_mut(pixels * 4);
                let (green, blue) = rest.split_at_mut(pixels * 4);
                let planes = [red, green, blue];
                for (channel, plane) in planes.into_iter().enumerate() {
                    let table = &tables[channel];
                    for (px, out) in rgb.chunks_exact(3).zip(plane.chunks_exact_mut(4)) {
                        out.copy_from_slice(&table[usize::from(px[channel])].to_le_bytes());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn floats(bytes: &[u8]) -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    #[test]
    fn nchw_uint8_is_planar() {
        let format = OutputFormat {
            dtype: ImageDtype::Uint8,
            layout: ImageLayout::Nchw,
            normalize: None,
        };
        let rgb = [1, 2, 3, 4, 5, 6];
        let mut dest = [0u8; 6];
        format.write(&rgb, &mut dest, &format.float_tables());
        assert_eq!(dest, [1, 4, 2, 5, 3, 6]);
    }

    #[test]
    fn normalize_matches_torchvision_arithmetic() {
        let format = OutputFormat {
            dtype: ImageDtype::Float32,
            layout: ImageLayout::Nchw,
            normalize: Some(([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])),
        };
        let rgb = [0, 128, 255];
        let mut dest = [0u8; 12];
        format.write(&rgb, &mut dest, &format.float_tables());
        let values = floats(&dest);
        // torch: (torch.tensor([0,128,255])/255 - mean)/std in float32
        assert_eq!(values[0], (0.0f32 / 255.0 - 0.485) / 0.229);
        assert_eq!(values[1], (128.0f32 / 255.0 - 0.456) / 0.224);
        assert_eq!(values[2], (255.0f32 / 255.0 - 0.406) / 0.225);
        assert!((values[0] - -2.117_904_1).abs() < 1e-6);
        assert!((values[2] - 2.64).abs() < 1e-6);
    }

    #[test]
    fn float_nhwc_without_normalize_is_unit_scaled() {
        let format = OutputFormat {
            dtype: ImageDtype::Float32,
            layout: ImageLayout::Nhwc,
            normalize: None,
        };
        let rgb = [0, 51, 255];
        let mut dest = [0u8; 12];
        format.write(&rgb, &mut dest, &format.float_tables());
        assert_eq!(floats(&dest), vec![0.0, 0.2, 1.0]);
    }
}
