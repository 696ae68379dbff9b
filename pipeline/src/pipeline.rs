//! A job's op list, checked and fused into one plan per sample: decode only the region the
//! crop needs, resample it once into the output size, flip, and write the output tensor.

use std::time::Instant;

use fast_image_resize::Resizer;
use stoker_proto::v1::{self as proto, op::Op as OpKind};

use crate::error::{Error, Result, SampleError};
use crate::ops::decode::{self, DecodeRequest, DecodedImage, ImageHeader, DEFAULT_MAX_PIXELS};
use crate::ops::geometry::{
    center_crop_offset, random_resized_crop_window, resize_shorter_side, RandomResizedCropRange,
};
use crate::ops::resample::{flip_horizontal, resample, SourceWindow};
use crate::ops::tensor::{ImageDtype, ImageLayout, OutputFormat};
use crate::rng::SampleRng;

/// How the output window is chosen.
#[derive(Debug, Clone, PartialEq)]
pub enum Geometry {
    /// RandomResizedCrop to (height, width).
    RandomResizedCrop {
        /// Output height.
        height: u32,
        /// Output width.
        width: u32,
        /// Area and ratio ranges.
        range: RandomResizedCropRange,
    },
    /// Optional Resize (shorter side), then CenterCrop to (height, width).
    CenterCrop {
        /// Shorter side after Resize, if there is one.
        resize_shorter: Option<u32>,
        /// Output height.
        height: u32,
        /// Output width.
        width: u32,
    },
}

/// Per-sample time spent in each stage, in nanoseconds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SampleTimings {
    /// Reading the bytes.
    pub read_ns: u64,
    /// Decoding.
    pub decode_ns: u64,
    /// Crop, resize, flip.
    pub augment_ns: u64,
    /// Writing into the batch buffer.
    pub assemble_ns: u64,
}

impl SampleTimings {
    /// Adds `other` into `self`.
    pub fn add(&mut self, other: &SampleTimings) {
        self.read_ns += other.read_ns;
        self.decode_ns += other.decode_ns;
        self.augment_ns += other.augment_ns;
        self.assemble_ns += other.assemble_ns;
    }
}

/// Reusable per-thread buffers, so steady-state processing allocates nothing.
#[derive(Default)]
pub struct Scratch {
    decoded: DecodedImage,
    rgb: Vec<u8>,
    resizer: Resizer,
}

impl Scratch {
    /// Lets go of buffers past [`decode::SCRATCH_KEEP_BYTES`].
    fn trim(&mut self) {
        if self.decoded.pixels.capacity() > decode::SCRATCH_KEEP_BYTES {
            self.decoded.pixels = Vec::new();
        }
        if self.rgb.capacity() > decode::SCRATCH_KEEP_BYTES {
            self.rgb = Vec::new();
        }
    }
}

/// A checked, fused image pipeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Pipeline {
    /// Pixel limit for decoding.
    pub max_pixels: u64,
    /// Whether DCT-domain downscaling may be used.
    pub allow_dct_scaling: bool,
    /// The output window.
    pub geometry: Geometry,
    /// Probability of a horizontal flip (0 when there is no flip op).
    pub flip_probability: f64,
    /// The output tensor.
    pub output: OutputFormat,
    float_tables: Box<[[f32; 256]; 3]>,
}

/// The kind of each op, or an error naming the first op that has none.
pub(crate) fn op_kinds(ops: &[proto::Op]) -> Result<Vec<&OpKind>> {
    ops.iter()
        .enumerate()
        .map(|(position, op)| {
            op.op
                .as_ref()
                .ok_or_else(|| invalid(format!("op {position} is empty")))
        })
        .collect()
}

fn invalid(message: impl Into<String>) -> Error {
    Error::InvalidPipeline(message.into())
}

/// The largest output side (height, width, or Resize's shorter side) an image op accepts.
pub const MAX_SIDE: u32 = 16_384;

/// The orders an image pipeline may take; ops in parentheses are optional.
pub const IMAGE_ORDERS: &str = "[DecodeImage, RandomResizedCrop, (RandomHorizontalFlip), (Normalize), (ToTensor)] or [DecodeImage, (Resize), CenterCrop, (RandomHorizontalFlip), (Normalize), (ToTensor)]";

fn side(value: u32, what: &str) -> Result<u32> {
    if value == 0 || value > MAX_SIDE {
        return Err(invalid(format!(
            "{what} must be in 1..={MAX_SIDE}, got {value}"
        )));
    }
    Ok(value)
}

fn finite_range(low: f32, high: f32, what: &str, min: f32) -> Result<(f64, f64)> {
    if !(low.is_finite() && high.is_finite()) || low < min || low > high {
        return Err(invalid(format!(
            "{what} must satisfy {min} <= low <= high, got ({low}, {high})"
        )));
    }
    Ok((f64::from(low), f64::from(high)))
}

/// RandomResizedCrop's output window; an unset (0, 0) range takes torchvision's default.
pub(crate) fn random_resized_crop(crop: &proto::RandomResizedCrop) -> Result<Geometry> {
    let scale = if crop.scale_min == 0.0 && crop.scale_max == 0.0 {
        (0.08, 1.0)
    } else {
        finite_range(
            crop.scale_min,
            crop.scale_max,
            "RandomResizedCrop scale",
            0.0,
        )?
    };
    if scale.1 <= 0.0 || scale.1 > 1.0 {
        return Err(invalid(format!(
            "RandomResizedCrop scale upper bound must be in (0, 1], got {}",
            scale.1
        )));
    }
    let ratio = if crop.ratio_min == 0.0 && crop.ratio_max == 0.0 {
        (3.0 / 4.0, 4.0 / 3.0)
    } else {
        finite_range(
            crop.ratio_min,
            crop.ratio_max,
            "RandomResizedCrop ratio",
            0.0,
        )?
    };
    if ratio.0 <= 0.0 {
        return Err(invalid(format!(
            "RandomResizedCrop ratio must be positive, got ({}, {})",
            ratio.0, ratio.1
        )));
    }
    Ok(Geometry::RandomResizedCrop {
        height: side(crop.height, "RandomResizedCrop height")?,
        width: side(crop.width, "RandomResizedCrop width")?,
        range: RandomResizedCropRange { scale, ratio },
    })
}

/// Resize's shorter side.
pub(crate) fn resize_side(resize: &proto::Resize) -> Result<u32> {
    side(resize.shorter_side, "Resize size (shorter_side)")
}

/// CenterCrop's output window, after an optional Resize.
pub(crate) fn center_crop(
    resize: Option<&proto::Resize>,
    crop: &proto::CenterCrop,
) -> Result<Geometry> {
    Ok(Geometry::CenterCrop {
        resize_shorter: resize.map(resize_side).transpose()?,
        height: side(crop.height, "CenterCrop height")?,
        width: side(crop.width, "CenterCrop width")?,
    })
}

/// RandomHorizontalFlip's probability.
pub(crate) fn flip_probability(flip: &proto::RandomHorizontalFlip) -> Result<f64> {
    if !(0.0..=1.0).contains(&flip.p) {
        return Err(invalid(format!(
            "RandomHorizontalFlip p must be in [0, 1], got {}",
            flip.p
        )));
    }
    Ok(f64::from(flip.p))
}

/// Normalize's per-channel mean and std.
pub(crate) fn normalize_parameters(norm: &proto::Normalize) -> Result<([f32; 3], [f32; 3])> {
    let (Ok(mean), Ok(std)) = (
        <[f32; 3]>::try_from(norm.mean.as_slice()),
        <[f32; 3]>::try_from(norm.std.as_slice()),
    ) else {
        return Err(invalid(format!(
            "Normalize needs 3 means and 3 stds (RGB), got {} and {}",
            norm.mean.len(),
            norm.std.len()
        )));
    };
    if mean.iter().any(|m| !m.is_finite()) {
        return Err(invalid(format!(
            "Normalize mean must be finite, got {mean:?}"
        )));
    }
    // A subnormal std (1e-40) is not 0 but divides pixels into infinities.
    if std
        .iter()
        .any(|s| !s.is_finite() || s.abs() < f32::MIN_POSITIVE)
    {
        return Err(invalid(format!(
            "Normalize std must be finite and non-zero (at least {:e} in magnitude), got {std:?}",
            f32::MIN_POSITIVE
        )));
    }
    // Pixels are scaled to [0, 1] first: statistics on the 0..255 scale (mmpretrain's
    // 123.675, 58.395) would make every input nearly the same value, silently.
    if mean.iter().any(|m| !(0.0..=1.0).contains(m)) || std.iter().any(|s| s.abs() > 1.0) {
        return Err(invalid(format!(
            "Normalize mean {mean:?} and std {std:?} must be on the [0, 1] scale the pixels are \
             scaled to (mean in [0, 1], |std| at most 1): divide 0..255 statistics by 255 \
             (123.675 -> 0.485); for 0..255 floats, Normalize((0, 0, 0), (1/255,) * 3)"
        )));
    }
    Ok((mean, std))
}

/// ToTensor's element type; `None` when unspecified (uint8, or float32 after Normalize).
pub(crate) fn tensor_dtype(tensor: &proto::ToTensor) -> Result<Option<ImageDtype>> {
    // prost reads a value outside an enum as its default: refuse it instead of guessing.
    if proto::Layout::try_from(tensor.layout).is_err() {
        return Err(invalid(format!(
            "ToTensor layout {} is not a known layout",
            tensor.layout
        )));
    }
    let dtype = proto::Dtype::try_from(tensor.dtype).map_err(|_| {
        invalid(format!(
            "ToTensor dtype {} is not a known dtype",
            tensor.dtype
        ))
    })?;
    match dtype {
        proto::Dtype::Uint8 => Ok(Some(ImageDtype::Uint8)),
        proto::Dtype::Float32 => Ok(Some(ImageDtype::Float32)),
        proto::Dtype::Unspecified => Ok(None),
        other => Err(invalid(format!(
            "ToTensor dtype must be uint8 or float32, got {}",
            other.as_str_name()
        ))),
    }
}

/// An order error: what is wrong, the op list as given, and the orders there are.
fn order_error(problem: &str, kinds: &[&OpKind]) -> Error {
    let names: Vec<&str> = kinds.iter().map(|kind| op_name(kind)).collect();
    invalid(format!(
        "{problem}; got [{}]; supported orders: {IMAGE_ORDERS}",
        names.join(", ")
    ))
}

impl Pipeline {
    /// Checks an op list and fuses it. Errors name the op at fault and what was expected.
    pub fn from_ops(ops: &[proto::Op]) -> Result<Pipeline> {
        let kinds = op_kinds(ops)?;
        let mut rest = kinds.as_slice();
        let (max_pixels, allow_dct_scaling) = match rest.first() {
            Some(OpKind::DecodeImage(decode)) => {
                rest = &rest[1..];
                let limit = if decode.max_pixels == 0 {
                    DEFAULT_MAX_PIXELS
                } else {
                    decode.max_pixels
                };
                (limit, decode.allow_dct_scaling)
            }
            _ => return Err(order_error("the first op must be DecodeImage", &kinds)),
        };

        let geometry = match rest {
            [OpKind::RandomResizedCrop(crop), tail @ ..] => {
                rest = tail;
                random_resized_crop(crop)?
            }
            [OpKind::Resize(resize), OpKind::CenterCrop(crop), tail @ ..] => {
                rest = tail;
                center_crop(Some(resize), crop)?
            }
            [OpKind::CenterCrop(crop), tail @ ..] => {
                rest = tail;
                center_crop(None, crop)?
            }
            [OpKind::Resize(_), ..] => {
                return Err(order_error(
                    "Resize alone gives images of different sizes, which cannot be batched: add CenterCrop after it",
                    &kinds,
                ))
            }
            _ => {
                return Err(order_error(
                    "after DecodeImage comes RandomResizedCrop, Resize + CenterCrop, or CenterCrop",
                    &kinds,
                ))
            }
        };

        // What may follow the geometry, in this order, each at most once.
        let mut flip = None;
        let mut normalize = None;
        let mut to_tensor: Option<&proto::ToTensor> = None;
        for op in rest {
            match op {
                OpKind::RandomHorizontalFlip(random_flip)
                    if flip.is_none() && normalize.is_none() && to_tensor.is_none() =>
                {
                    flip = Some(flip_probability(random_flip)?);
                }
                OpKind::Normalize(norm) if normalize.is_none() && to_tensor.is_none() => {
                    normalize = Some(normalize_parameters(norm)?);
                }
                OpKind::ToTensor(tensor) if to_tensor.is_none() => to_tensor = Some(tensor),
                other => {
                    return Err(order_error(
                        &format!("{} is out of place or repeated", op_name(other)),
                        &kinds,
                    ))
                }
            }
        }

        let layout = match to_tensor.map(|t| t.layout()) {
            Some(proto::Layout::Nchw) => ImageLayout::Nchw,
            Some(proto::Layout::Nhwc) => ImageLayout::Nhwc,
            // torchvision's Normalize works on CHW tensors.
            None if normalize.is_some() => ImageLayout::Nchw,
            None => ImageLayout::Nhwc,
        };
        let dtype = match to_tensor.map(tensor_dtype).transpose()?.flatten() {
            Some(ImageDtype::Uint8) if normalize.is_some() => {
                return Err(invalid(
                    "Normalize gives float32; ToTensor dtype uint8 contradicts it: leave the \
                     ToTensor dtype unset or make it float32",
                ))
            }
            Some(dtype) => dtype,
            None if normalize.is_some() => ImageDtype::Float32,
            None => ImageDtype::Uint8,
        };
        let output = OutputFormat {
            dtype,
            layout,
            normalize,
        };
        let float_tables = Box::new(output.float_tables());
        Ok(Pipeline {
            max_pixels,
            allow_dct_scaling,
            geometry,
            flip_probability: flip.unwrap_or(0.0),
            output,
            float_tables,
        })
    }

    /// Output (height, width).
    pub fn output_size(&self) -> (u32, u32) {
        match self.geometry {
            Geometry::RandomResizedCrop { height, width, .. }
            | Geometry::CenterCrop { height, width, .. } => (height, width),
        }
    }

    /// Shape of a batch of `batch` images in the output layout.
    pub fn image_shape(&self, batch: usize) -> Vec<u64> {
        let (height, width) = self.output_size();
        let (b, h, w) = (batch as u64, u64::from(height), u64::from(width));
        match self.output.layout {
            ImageLayout::Nhwc => vec![b, h, w, 3],
            ImageLayout::Nchw => vec![b, 3, h, w],
        }
    }

    /// The wire dtype of the image tensor.
    pub fn image_dtype(&self) -> proto::Dtype {
        match self.output.dtype {
            ImageDtype::Uint8 => proto::Dtype::Uint8,
            ImageDtype::Float32 => proto::Dtype::Float32,
        }
    }

    /// Bytes of one sample's image in the batch buffer.
    pub fn bytes_per_sample(&self) -> usize {
        let (height, width) = self.output_size();
        height as usize * width as usize * 3 * self.output.element_size()
    }

    /// Draws this sample's output window and flip from `rng` (always in the same order).
    /// Fails for an image whose resized longer side would pass `u32::MAX`
    /// ([`SampleError::TooElongated`]).
    pub fn plan(
        &self,
        header: &ImageHeader,
        rng: &mut SampleRng,
    ) -> std::result::Result<(SourceWindow, bool), SampleError> {
        let window = match &self.geometry {
            Geometry::RandomResizedCrop { range, .. } => SourceWindow::CropThenResize(
                random_resized_crop_window(header.width, header.height, range, rng),
            ),
            Geometry::CenterCrop {
                resize_shorter,
                height,
                width,
            } => {
                let resized = match resize_shorter {
                    Some(size) => resize_shorter_side(header.width, header.height, *size).ok_or(
                        SampleError::TooElongated {
                            width: header.width,
                            height: header.height,
                            size: *size,
                        },
                    )?,
                    None => (header.width, header.height),
                };
                SourceWindow::ResizeThenCrop {
                    resized,
                    left: center_crop_offset(resized.0, *width),
                    top: center_crop_offset(resized.1, *height),
                }
            }
        };
        // torchvision draws `torch.rand(1) < p`; drawing even when p is 0 or 1 keeps the stream
        // the same shape for every pipeline with a flip.
        let flip = self.flip_probability > 0.0 && rng.unit_f64() < self.flip_probability;
        Ok((window, flip))
    }

    /// Turns one sample's encoded bytes into its output tensor in `dest`
    /// (`bytes_per_sample()` bytes). A scratch buffer grown past 64 MiB by this sample is let
    /// go as it returns, not kept until the thread's next sample (a thread idle after a huge
    /// image held it meanwhile).
    pub fn process(
        &self,
        bytes: &[u8],
        rng: &mut SampleRng,
        dest: &mut [u8],
        scratch: &mut Scratch,
        timings: &mut SampleTimings,
    ) -> std::result::Result<(), SampleError> {
        let processed = self.process_kept(bytes, rng, dest, scratch, timings);
        scratch.trim();
        processed
    }

    /// [`Self::process`], its scratch buffers as they are left.
    fn process_kept(
        &self,
        bytes: &[u8],
        rng: &mut SampleRng,
        dest: &mut [u8],
        scratch: &mut Scratch,
        timings: &mut SampleTimings,
    ) -> std::result::Result<(), SampleError> {
        let started = Instant::now();
        let header = decode::read_header(bytes, self.max_pixels)?;
        let (window, flip) = self.plan(&header, rng)?;
        let (out_h, out_w) = self.output_size();
        let request = DecodeRequest {
            region: window.needed_region(),
            target: match window {
                SourceWindow::CropThenResize(_) => (out_w, out_h),
                SourceWindow::ResizeThenCrop { resized, .. } => resized,
            },
            allow_dct_scaling: self.allow_dct_scaling,
            max_pixels: self.max_pixels,
        };
        decode::decode(bytes, &header, &request, &mut scratch.decoded)?;
        let decoded_at = Instant::now();
        timings.decode_ns += (decoded_at - started).as_nanos() as u64;

        let packed = self.output.is_packed_rgb8();
        let rgb_len = out_w as usize * out_h as usize * 3;
        let target: &mut [u8] = if packed {
            dest
        } else {
            scratch.rgb.resize(rgb_len, 0);
            &mut scratch.rgb
        };
        resample(
            &scratch.decoded,
            &window,
            (out_w, out_h),
            target,
            &mut scratch.resizer,
        )?;
        if flip {
            flip_horizontal(target, out_w);
        }
        let augmented_at = Instant::now();
        timings.augment_ns += (augmented_at - decoded_at).as_nanos() as u64;
        if !packed {
            self.output.write(&scratch.rgb, dest, &self.float_tables);
            timings.assemble_ns += augmented_at.elapsed().as_nanos() as u64;
        }
        Ok(())
    }
}

/// The op's message name, for errors.
pub(crate) fn op_name(op: &OpKind) -> &'static str {
    match op {
        OpKind::DecodeImage(_) => "DecodeImage",
        OpKind::RandomResizedCrop(_) => "RandomResizedCrop",
        OpKind::Resize(_) => "Resize",
        OpKind::CenterCrop(_) => "CenterCrop",
        OpKind::RandomHorizontalFlip(_) => "RandomHorizontalFlip",
        OpKind::Normalize(_) => "Normalize",
        OpKind::ToTensor(_) => "ToTensor",
        OpKind::TokenWindows(_) => "TokenWindows",
        OpKind::Tokenize(_) => "Tokenize",
        OpKind::PackSequences(_) => "PackSequences",
        OpKind::SelectColumns(_) => "SelectColumns",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer grown past the keep size is let go by the time its sample is done; one of an
    /// ordinary size is kept and reused.
    #[test]
    fn a_very_large_images_buffers_are_not_kept_for_the_next_sample() {
        let pipeline = Pipeline::from_ops(&crate::presets::imagenet_eval(32)).unwrap();
        let (w, h) = (64usize, 48usize);
        let pixels: Vec<u8> = (0..w * h * 3).map(|i| (i % 251) as u8).collect();
        let image = turbojpeg::Image {
            pixels: pixels.as_slice(),
            width: w,
            pitch: w * 3,
            height: h,
            format: turbojpeg::PixelFormat::RGB,
        };
        let jpeg = turbojpeg::compress(image, 90, turbojpeg::Subsamp::Sub2x2).unwrap();
        let (out_h, out_w) = pipeline.output_size();
        let mut dest = vec![0u8; out_h as usize * out_w as usize * 3];
        let mut scratch = Scratch::default();
        scratch.decoded.pixels = Vec::with_capacity(decode::SCRATCH_KEEP_BYTES + 1);
        let mut rng = SampleRng::new(1, 0, 0);
        let mut timings = SampleTimings::default();
        pipeline
            .process(&jpeg, &mut rng, &mut dest, &mut scratch, &mut timings)
            .unwrap();
        assert_eq!(
            scratch.decoded.pixels.capacity(),
            0,
            "the large buffer went"
        );
        pipeline
            .process(&jpeg, &mut rng, &mut dest, &mut scratch, &mut timings)
            .unwrap();
        let kept = scratch.decoded.pixels.capacity();
        assert!(
            kept <= decode::SCRATCH_KEEP_BYTES && kept >= w * h * 3,
            "{kept}"
        );
        pipeline
            .process(&jpeg, &mut rng, &mut dest, &mut scratch, &mut timings)
            .unwrap();
        assert_eq!(
            scratch.decoded.pixels.capacity(),
            kept,
            "an ordinary buffer is reused"
        );
    }

    /// The buffer a very large image grows is let go as its sample is done, not kept by an idle
    /// thread until its next sample.
    #[test]
    fn a_very_large_images_buffer_goes_as_its_sample_is_done() {
        let pipeline = Pipeline::from_ops(&crate::presets::imagenet_eval(32)).unwrap();
        // 4,800 x 4,800 RGB: 69 MB, past the 64 MiB a thread keeps.
        let side = 4800usize;
        let pixels = vec![128u8; side * side * 3];
        let image = turbojpeg::Image {
            pixels: pixels.as_slice(),
            width: side,
            pitch: side * 3,
            height: side,
            format: turbojpeg::PixelFormat::RGB,
        };
        let jpeg = turbojpeg::compress(image, 50, turbojpeg::Subsamp::Sub2x2).unwrap();
        drop(pixels);
        let (out_h, out_w) = pipeline.output_size();
        let mut dest = vec![0u8; out_h as usize * out_w as usize * 3];
        let mut scratch = Scratch::default();
        let mut rng = SampleRng::new(1, 0, 0);
        let mut timings = SampleTimings::default();
        pipeline
            .process(&jpeg, &mut rng, &mut dest, &mut scratch, &mut timings)
            .unwrap();
        assert!(
            dest.iter().all(|&v| v.abs_diff(128) <= 2),
            "the image was decoded"
        );
        assert_eq!(scratch.decoded.pixels.capacity(), 0);
        assert!(scratch.rgb.capacity() <= decode::SCRATCH_KEEP_BYTES);
    }
}
