//! The device stage's tail (a trailing `Normalize`, the dtype, the memory layout) applied by the
//! lane's crop kernel itself, when `STOKER_GPU_DECODE_FUSED_TAIL=1` asks: the lane's rows then
//! come as the consumer's tensor holds them, and the stage copies them into place without a
//! pass of its own over them. Here: the tail as the kernel reads it ([`TailParams`]), and the
//! same arithmetic on the host ([`RowTail::apply`]), for a row the lane replaces with the CPU's.

use half::{bf16, f16};

/// The variable that asks the lane's kernel to apply the tail (`1`; unset or `0`: the rows stay
/// uint8 NHWC and the device stage runs the tail).
pub const FUSED_TAIL_VARIABLE: &str = "STOKER_GPU_DECODE_FUSED_TAIL";

/// Whether `value` (the variable's, if set) asks for the fused tail; after trimming, anything
/// but `0`, `1` or empty (read as `0`) is an error naming the variable.
pub fn fused_tail_asked(value: Option<&str>) -> Result<bool, String> {
    super::switch_asked(FUSED_TAIL_VARIABLE, value)
}

/// The element type of the rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Element {
    /// The decoded bytes, as the CPU path leaves them.
    U8 = 0,
    /// 32-bit floats.
    F32 = 1,
    /// bfloat16, rounded to nearest even.
    Bf16 = 2,
    /// IEEE half, rounded to nearest even.
    F16 = 3,
}

impl Element {
    /// The element named as torch names its dtype (`"uint8"`, `"float32"`, `"bfloat16"`,
    /// `"float16"`).
    pub fn named(name: &str) -> Option<Element> {
        match name {
            "uint8" => Some(Element::U8),
            "float32" => Some(Element::F32),
            "bfloat16" => Some(Element::Bf16),
            "float16" => Some(Element::F16),
            _ => None,
        }
    }

    /// Its name, as [`Element::named`] takes it.
    pub fn name(self) -> &'static str {
        match self {
            Element::U8 => "uint8",
            Element::F32 => "float32",
            Element::Bf16 => "bfloat16",
            Element::F16 => "float16",
        }
    }

    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            Element::U8 => 1,
            Element::F32 => 4,
            Element::Bf16 | Element::F16 => 2,
        }
    }
}

/// What the rows are made into: each channel `c` of a pixel's byte value `v` becomes
/// `v * scale[c] + shift[c]` (one fused multiply-add in f32: within one rounding of torch's
/// `addcmul` on the device stage) in `element`, the three channels interleaved (NHWC memory,
/// which is also `channels_last`'s) or `planar` (contiguous NCHW). A `Normalize` gives `1 / (255 std)` and
/// `-mean / std`, `ToTensor`'s float output `1 / 255` and 0; uint8 keeps the bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowTail {
    /// The rows' element type.
    pub element: Element,
    /// Channel planes (NCHW) rather than interleaved channels (NHWC memory).
    pub planar: bool,
    /// Per channel, the factor of the byte value.
    pub scale: [f32; 3],
    /// Per channel, what is added after.
    pub shift: [f32; 3],
}

impl RowTail {
    /// The rows as the CPU path leaves them: uint8 NHWC.
    pub const BYTES: RowTail = RowTail {
        element: Element::U8,
        planar: false,
        scale: [1.0; 3],
        shift: [0.0; 3],
    };

    /// Whether the rows stay as the CPU path leaves them (the stage then runs the tail).
    pub fn is_bytes(&self) -> bool {
        self.element == Element::U8 && !self.planar
    }

    /// The tail from what Python's device stage holds: the dtype's name, whether the layout
    /// is contiguous NCHW, and the per-channel scale and shift of the values (`None` for
    /// uint8 alone, whose bytes stay).
    pub fn from_stage(
        dtype: &str,
        planar: bool,
        affine: Option<(&[f64], &[f64])>,
    ) -> Result<RowTail, String> {
        let element = Element::named(dtype).ok_or_else(|| {
            format!(
                "the device tail's dtype must be uint8, float32, bfloat16 or float16, \
                 got {dtype:?}"
            )
        })?;
        let (scale, shift) = match (element, affine) {
            (Element::U8, None) => ([1.0; 3], [0.0; 3]),
            (Element::U8, Some(_)) => return Err("a uint8 device tail cannot normalise".into()),
            (_, None) => {
                return Err(format!(
                    "a {dtype} device tail needs the scale and shift of its values"
                ))
            }
            (_, Some((scale, shift))) => (three(scale, "scale")?, three(shift, "shift")?),
        };
        Ok(RowTail {
            element,
            planar,
            scale,
            shift,
        })
    }

    /// The shape of `rows` such rows of `height x width`: (rows, height, width, 3), or (rows,
    /// 3, height, width) in planes; C order.
    pub fn shape(&self, rows: usize, height: u32, width: u32) -> [usize; 4] {
        let (height, width) = (height as usize, width as usize);
        if self.planar {
            [rows, 3, height, width]
        } else {
            [rows, height, width, 3]
        }
    }

    /// Bytes of one row of `height x width` pixels.
    pub fn row_bytes(&self, height: u32, width: u32) -> usize {
        height as usize * width as usize * 3 * self.element.bytes()
    }

    /// The kernel's argument.
    pub fn params(&self) -> TailParams {
        TailParams {
            scale: self.scale,
            shift: self.shift,
            element: self.element as i32,
            planar: i32::from(self.planar),
        }
    }

    /// A uint8 NHWC row of `height x width` pixels as the kernel would write it with this
    /// tail, into `out` ([`RowTail::row_bytes`] long; native byte order, as the device's).
    pub fn apply(&self, row: &[u8], height: u32, width: u32, out: &mut [u8]) {
        let pixels = height as usize * width as usize;
        let size = self.element.bytes();
        for (pixel, rgb) in row.chunks_exact(3).take(pixels).enumerate() {
            for (c, &byte) in rgb.iter().enumerate() {
                let index = if self.planar {
                    c * pixels + pixel
                } else {
                    pixel * 3 + c
                };
                let Some(place) = out.get_mut(index * size..(index + 1) * size) else {
                    return;
                };
                let value = f32::from(byte).mul_add(self.scale[c], self.shift[c]);
                match self.element {
                    Element::U8 => place[0] = byte,
                    Element::F32 => place.copy_from_slice(&value.to_ne_bytes()),
                    Element::Bf16 => place.copy_from_slice(&bf16::from_f32(value).to_ne_bytes()),
                    Element::F16 => place.copy_from_slice(&f16::from_f32(value).to_ne_bytes()),
                }
            }
        }
    }
}

fn three(values: &[f64], what: &str) -> Result<[f32; 3], String> {
    match values {
        // Rounded once to f32, as torch.tensor(..., dtype=float32) rounds the stage's.
        [a, b, c] if values.iter().all(|v| v.is_finite()) => Ok([*a as f32, *b as f32, *c as f32]),
        _ => Err(format!(
            "the device tail's {what} must be 3 finite numbers, got {values:?}"
        )),
    }
}

/// The kernel's `TailParams`, passed by value (same fields, same order, C layout).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TailParams {
    /// Per channel, the factor of the byte value.
    pub scale: [f32; 3],
    /// Per channel, what is added after.
    pub shift: [f32; 3],
    /// [`Element`] as its number.
    pub element: i32,
    /// 1: channel planes.
    pub planar: i32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_is_read_as_a_switch_and_anything_else_is_named() {
        assert_eq!(fused_tail_asked(None), Ok(false));
        assert_eq!(fused_tail_asked(Some("0")), Ok(false));
        assert_eq!(fused_tail_asked(Some(" 1 ")), Ok(true));
        let error = fused_tail_asked(Some("yes")).unwrap_err();
        assert!(
            error.contains(FUSED_TAIL_VARIABLE) && error.contains("yes"),
            "{error}"
        );
    }

    #[test]
    fn the_stages_tail_is_taken_as_given_and_refused_where_it_cannot_be() {
        let mean = [0.485, 0.456, 0.406];
        let std = [0.229, 0.224, 0.225];
        let scale: Vec<f64> = std.iter().map(|s| 1.0 / (255.0 * s)).collect();
        let shift: Vec<f64> = mean.iter().zip(std).map(|(m, s)| -m / s).collect();
        let tail = RowTail::from_stage("bfloat16", false, Some((&scale, &shift))).unwrap();
        assert_eq!(tail.element, Element::Bf16);
        assert_eq!(tail.scale[0], (1.0 / (255.0 * 0.229)) as f32);
        assert_eq!(tail.row_bytes(224, 224), 224 * 224 * 3 * 2);
        assert!(!tail.is_bytes());
        assert!(RowTail::from_stage("uint8", false, None)
            .unwrap()
            .is_bytes());
        assert!(!RowTail::from_stage("uint8", true, None).unwrap().is_bytes());
        for (dtype, affine, named) in [
            ("int8", None, "int8"),
            ("float16", None, "scale and shift"),
            ("float32", Some((&scale[..2], &shift[..])), "scale"),
            (
                "float32",
                Some((&scale[..], &[f64::NAN, 0.0, 0.0][..])),
                "shift",
            ),
            ("uint8", Some((&scale[..], &shift[..])), "uint8"),
        ] {
            let error = RowTail::from_stage(dtype, false, affine).unwrap_err();
            assert!(error.contains(named), "{error}");
        }
    }

    #[test]
    fn a_row_is_made_as_the_stage_makes_it_in_each_element_and_layout() {
        // Two pixels: (0, 128, 255) and (1, 2, 3).
        let row = [0u8, 128, 255, 1, 2, 3];
        let scale = [
            1.0 / (255.0 * 0.229),
            1.0 / (255.0 * 0.224),
            1.0 / (255.0 * 0.225),
        ];
        let shift = [-0.485 / 0.229, -0.456 / 0.224, -0.406 / 0.225];
        let expect = |v: u8, c: usize| {
            (
                f32::from(v) * scale[c] as f32 + shift[c] as f32,
                f32::from(v).mul_add(scale[c] as f32, shift[c] as f32),
            )
        };
        let tail = RowTail::from_stage("float32", false, Some((&scale, &shift))).unwrap();
        let mut out = vec![0u8; tail.row_bytes(1, 2)];
        tail.apply(&row, 1, 2, &mut out);
        let floats: Vec<f32> = out
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        for (k, &v) in row.iter().enumerate() {
            let (separate, fused) = expect(v, k % 3);
            assert_eq!(floats[k], fused);
            // The multiply-add is fused: within one rounding of the two-step result.
            assert!((floats[k] - separate).abs() <= separate.abs() * 1e-6 + 1e-7);
        }

        // Planar: channel 0's two pixels first.
        let planar = RowTail {
            planar: true,
            ..tail
        };
        let mut out = vec![0u8; planar.row_bytes(1, 2)];
        planar.apply(&row, 1, 2, &mut out);
        let first_plane = f32::from_ne_bytes([out[4], out[5], out[6], out[7]]);
        assert_eq!(first_plane, expect(1, 0).1);

        // bfloat16 and float16: the f32 value rounded to nearest even.
        for (element, round) in [
            (
                Element::Bf16,
                (|v: f32| bf16::from_f32(v).to_bits()) as fn(f32) -> u16,
            ),
            (Element::F16, |v: f32| f16::from_f32(v).to_bits()),
        ] {
            let tail = RowTail { element, ..tail };
            let mut out = vec![0u8; tail.row_bytes(1, 2)];
            tail.apply(&row, 1, 2, &mut out);
            for (k, &v) in row.iter().enumerate() {
                let bits = u16::from_ne_bytes([out[2 * k], out[2 * k + 1]]);
                assert_eq!(bits, round(expect(v, k % 3).1), "{element:?} element {k}");
            }
        }
        // bf16 rounds ties to even: 1 + 2^-8 (halfway between 1 and the next bf16) is 1.
        assert_eq!(bf16::from_f32(1.0 + 1.0 / 256.0).to_bits(), 0x3f80);

        // uint8 keeps the bytes.
        let mut out = vec![0u8; 6];
        RowTail::BYTES.apply(&row, 1, 2, &mut out);
        assert_eq!(out, row);
    }

    #[test]
    fn the_params_hold_the_kernels_layout() {
        assert_eq!(std::mem::size_of::<TailParams>(), 32);
        assert_eq!(std::mem::offset_of!(TailParams, element), 24);
        let params = RowTail::BYTES.params();
        assert_eq!((params.element, params.planar), (0, 0));
    }
}
