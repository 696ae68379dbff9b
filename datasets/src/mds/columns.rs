//! The columns of an MDS dataset: the encodings Streaming's `MDSWriter` names, which column
//! holds the samples, the labels or the tokens, and the decoding of `pil` images and `ndarray`
//! values.

use std::path::Path;

use serde_json::Value;

use super::{mds_error, MdsOptions};
use crate::error::Result;

/// Image column names looked for, in order, when none is named.
const IMAGE_COLUMN_NAMES: [&str; 5] = ["image", "jpg", "jpeg", "png", "img"];

/// Columns looked for, in order, as the token column when none is named.
const TOKEN_COLUMN_NAMES: [&str; 2] = ["tokens", "input_ids"];

/// An integer numpy dtype (of a scalar column or an array's values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct IntType {
    pub(super) size: usize,
    pub(super) signed: bool,
}

impl IntType {
    /// The value of the little-endian integer `bytes` (`size` of them).
    pub(super) fn value(self, bytes: &[u8]) -> i128 {
        let mut word = [0u8; 8];
        word[..self.size].copy_from_slice(&bytes[..self.size]);
        if self.signed && bytes[self.size - 1] & 0x80 != 0 {
            word[self.size..].fill(0xff);
            i128::from(i64::from_le_bytes(word))
        } else {
            i128::from(u64::from_le_bytes(word))
        }
    }

    /// The numpy name of the type.
    pub(super) fn name(self) -> String {
        format!("{}int{}", if self.signed { "" } else { "u" }, self.size * 8)
    }
}

/// The dtype of an `ndarray` column's values: an integer type, or another (a float) that holds
/// no token ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NdDtype {
    Int(IntType),
    NotInteger,
}

impl NdDtype {
    /// The dtype numpy names `name`, if Streaming writes it.
    fn named(name: &str) -> Option<NdDtype> {
        let int = |size, signed| Some(NdDtype::Int(IntType { size, signed }));
        match name {
            "uint8" => int(1, false),
            "int8" => int(1, true),
            "uint16" => int(2, false),
            "int16" => int(2, true),
            "uint32" => int(4, false),
            "int32" => int(4, true),
            "uint64" => int(8, false),
            "int64" => int(8, true),
            "float16" | "float32" | "float64" => Some(NdDtype::NotInteger),
            _ => None,
        }
    }

    /// The dtype Streaming's one-byte code `code` stands for.
    fn coded(code: u8) -> Option<NdDtype> {
        let int = |size, signed| Some(NdDtype::Int(IntType { size, signed }));
        match code {
            8 => int(1, false),
            9 => int(1, true),
            16 => int(2, false),
            17 => int(2, true),
            32 => int(4, false),
            33 => int(4, true),
            64 => int(8, false),
            65 => int(8, true),
            18 | 34 | 66 => Some(NdDtype::NotInteger),
            _ => None,
        }
    }
}

/// The integer values of one `ndarray` sample ([`ndarray_integers`]).
pub(super) struct NdValues<'a> {
    /// Their type.
    pub(super) int: IntType,
    /// The shape the sample's header gives (`None` when the encoding names it).
    pub(super) shape: Option<Vec<u64>>,
    /// Their bytes, little-endian.
    pub(super) values: &'a [u8],
}

/// The integer values of one `ndarray` sample (Streaming's layout: a dtype code byte unless the
/// encoding names the dtype, a shape header unless it names the shape, then the values), or what
/// is wrong with them.
pub(super) fn ndarray_integers(
    bytes: &[u8],
    dtype: Option<NdDtype>,
    static_shape: bool,
) -> std::result::Result<NdValues<'_>, String> {
    let mut at = 0usize;
    let dtype = match dtype {
        Some(dtype) => dtype,
        None => {
            let code = *bytes.first().ok_or("an empty array")?;
            at = 1;
            NdDtype::coded(code).ok_or(format!("dtype code {code} is none Streaming writes"))?
        }
    };
    let NdDtype::Int(int) = dtype else {
        return Err("its values are floats, not integers".into());
    };
    let mut dims = None;
    if !static_shape {
        let head = *bytes.get(at).ok_or("no shape header")?;
        at += 1;
        let (ndim, width) = (usize::from(head >> 2), 1usize << (head & 3));
        let shape = bytes
            .get(at..at + ndim * width)
            .ok_or("its shape header runs past its bytes")?;
        at += ndim * width;
        let width = IntType {
            size: width,
            signed: false,
        };
        dims = Some(
            shape
                .chunks_exact(width.size)
                .map(|dim| width.value(dim) as u64)
                .collect::<Vec<u64>>(),
        );
    }
    let values = &bytes[at..];
    if values.len() % int.size != 0 {
        return Err(format!(
            "{} bytes of values are no whole number of {}",
            values.len(),
            int.name()
        ));
    }
    if let Some(dims) = &dims {
        let count = dims.iter().fold(1u128, |product, &dim| {
            product.saturating_mul(u128::from(dim))
        });
        if count != (values.len() / int.size) as u128 {
            return Err(format!(
                "its shape holds {count} values but its bytes {}",
                values.len() / int.size
            ));
        }
    }
    Ok(NdValues {
        int,
        shape: dims,
        values,
    })
}

/// An `ndarray` image of `uint8` pixels, `shape` `[height, width]`, `[height, width, 1]` or
/// `[height, width, 3]`, as a binary PGM or PPM of the same pixels; `None` for other types or
/// shapes, or values that do not fill the shape.
pub(super) fn ndarray_as_pnm(int: IntType, shape: &[u64], values: &[u8]) -> Option<Vec<u8>> {
    if int.size != 1 || int.signed {
        return None;
    }
    let (magic, channels) = match shape {
        [_, _] | [_, _, 1] => ("P5", 1),
        [_, _, 3] => ("P6", 3),
        _ => return None,
    };
    let (height, width) = (shape[0], shape[1]);
    let pixels = height.checked_mul(width)?.checked_mul(channels)?;
    if height == 0 || width == 0 || pixels != values.len() as u64 {
        return None;
    }
    let mut out = format!("{magic}\n{width} {height}\n255\n").into_bytes();
    out.extend_from_slice(values);
    Some(out)
}

/// How a column's bytes are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Encoding {
    /// `bytes`, `jpeg`, `png`: the bytes as they are.
    Bytes,
    /// `pil`: raw pixels after a header.
    Pil,
    /// `str`: UTF-8 text.
    Str,
    /// `int` (int64), or a numpy integer scalar.
    Integer(IntType),
    /// `str_int`: an integer written as text.
    StrInt,
    /// `json`: a JSON value as UTF-8 text (a label when it is an integer).
    Json,
    /// `ndarray[:dtype[:shape]]`: a numpy array, its dtype (when the encoding names it) and
    /// whether its shape is named (then no shape header precedes the values).
    NdArray {
        dtype: Option<NdDtype>,
        static_shape: bool,
    },
    /// Anything else (floats, `json`, `pkl`...): not read.
    Other,
}

impl Encoding {
    /// The encoding Streaming names `name`.
    pub(super) fn of(name: &str) -> Encoding {
        match name {
            // `jpeg:95`: Streaming's JPEG coder written with its quality.
            "bytes" | "jpeg" | "png" => Encoding::Bytes,
            other if other.starts_with("jpeg:") => Encoding::Bytes,
            "pil" => Encoding::Pil,
            "str" => Encoding::Str,
            "int" => Encoding::Integer(IntType {
                size: 8,
                signed: true,
            }),
            "str_int" => Encoding::StrInt,
            "json" => Encoding::Json,
            "ndarray" => Encoding::NdArray {
                dtype: None,
                static_shape: false,
            },
            other => match (NdDtype::named(other), other.strip_prefix("ndarray:")) {
                (Some(NdDtype::Int(int)), _) => Encoding::Integer(int),
                (_, Some(rest)) => {
                    let mut parts = rest.splitn(2, ':');
                    match NdDtype::named(parts.next().unwrap_or_default()) {
                        Some(dtype) => Encoding::NdArray {
                            dtype: Some(dtype),
                            static_shape: parts.next().is_some(),
                        },
                        None => Encoding::Other,
                    }
                }
                _ => Encoding::Other,
            },
        }
    }
}

/// One column of the dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Column {
    pub(super) name: String,
    pub(super) encoding_name: String,
    pub(super) encoding: Encoding,
    /// Its size when every sample's is the same (`column_sizes`).
    pub(super) fixed: Option<u32>,
    /// The shape an `ndarray:dtype:shape` encoding names.
    pub(super) shape: Option<Vec<u64>>,
}

/// The columns a shard's entry in `index.json` (at `path`) declares.
pub(super) fn shard_columns(entry: &Value, path: &Path) -> Result<Vec<Column>> {
    let list = |key: &str| {
        entry
            .get(key)
            .and_then(Value::as_array)
            .ok_or_else(|| mds_error(path, format!("a shard has no {key:?} list")))
    };
    let names = list("column_names")?;
    let encodings = list("column_encodings")?;
    let sizes = list("column_sizes")?;
    if names.len() != encodings.len() || names.len() != sizes.len() || names.is_empty() {
        return Err(mds_error(
            path,
            "a shard's column names, encodings and sizes differ in number",
        ));
    }
    let mut columns = Vec::with_capacity(names.len());
    for ((name, encoding), size) in names.iter().zip(encodings).zip(sizes) {
        let (Some(name), Some(encoding_name)) = (name.as_str(), encoding.as_str()) else {
            return Err(mds_error(path, "a column name or encoding is not a string"));
        };
        let fixed = match size {
            Value::Null => None,
            size => Some(
                size.as_u64()
                    .and_then(|size| u32::try_from(size).ok())
                    .ok_or_else(|| mds_error(path, format!("column {name}'s size is {size}")))?,
            ),
        };
        columns.push(Column {
            name: name.to_string(),
            encoding_name: encoding_name.to_string(),
            encoding: Encoding::of(encoding_name),
            fixed,
            shape: named_shape(encoding_name),
        });
    }
    Ok(columns)
}

/// The shape `ndarray:dtype:d1,d2,...` names, if it names one.
fn named_shape(encoding: &str) -> Option<Vec<u64>> {
    let shape = encoding.strip_prefix("ndarray:")?.split_once(':')?.1;
    shape
        .split(',')
        .map(|dim| dim.trim().parse().ok())
        .collect()
}

/// The column whose bytes are the samples (see the module doc).
pub(super) fn pick_sample_column(
    columns: &[Column],
    options: &MdsOptions,
    index: &Path,
) -> Result<usize> {
    let readable = |c: &Column| {
        matches!(
            c.encoding,
            Encoding::Bytes | Encoding::Pil | Encoding::Str | Encoding::NdArray { .. }
        )
    };
    let find = |name: &str| columns.iter().position(|c| c.name == name);
    let names = || {
        columns
            .iter()
            .map(|c| format!("{} ({})", c.name, c.encoding_name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(name) = &options.sample_column {
        let k = find(name).ok_or_else(|| {
            mds_error(
                index,
                format!("has no column {name:?}; its columns: {}", names()),
            )
        })?;
        if !readable(&columns[k]) {
            return Err(mds_error(
                index,
                format!(
                    "column {name:?} is encoded {}: samples are read from bytes, jpeg, png, \
                     pil, ndarray or str columns",
                    columns[k].encoding_name
                ),
            ));
        }
        return Ok(k);
    }
    let image = |c: &Column| {
        matches!(c.encoding, Encoding::Bytes | Encoding::Pil)
            || matches!(c.encoding, Encoding::NdArray { .. })
    };
    if let Some(k) = IMAGE_COLUMN_NAMES
        .iter()
        .find_map(|name| find(name).filter(|&k| image(&columns[k])))
    {
        return Ok(k);
    }
    // Else the one column encoded as an image; of several (MDSWriter keeps them in name
    // order, so the first is no choice of the writer's), none is guessed.
    let encoded: Vec<usize> = (0..columns.len())
        .filter(|&k| {
            let c = &columns[k];
            matches!(c.encoding, Encoding::Pil)
                || (matches!(c.encoding, Encoding::Bytes) && c.encoding_name != "bytes")
        })
        .collect();
    if encoded.len() > 1 {
        let listed: Vec<String> = encoded
            .iter()
            .map(|&k| format!("{} ({})", columns[k].name, columns[k].encoding_name))
            .collect();
        return Err(mds_error(
            index,
            format!(
                "has several image columns, {}, and none named image, jpg or png: name the \
                 one to read (Python image_column=, stoker --image-column)",
                listed.join(", ")
            ),
        ));
    }
    encoded
        .first()
        .copied()
        .or_else(|| find("text").filter(|&k| columns[k].encoding == Encoding::Str))
        .ok_or_else(|| {
            mds_error(
                index,
                format!(
                    "has no image column (image, jpg, png, or one encoded jpeg, png or pil) nor \
                     a text column; its columns: {}",
                    names()
                ),
            )
        })
}

/// The label column, if any (see the module doc); when `labels_matter` (the samples are not
/// text), a `label` or `cls` column of an encoding labels are not read from refuses the
/// dataset rather than leave every label 0.
pub(super) fn pick_label_column(
    columns: &[Column],
    options: &MdsOptions,
    index: &Path,
    labels_matter: bool,
) -> Result<Option<usize>> {
    let is_label = |c: &Column| {
        matches!(
            c.encoding,
            Encoding::Integer(_) | Encoding::StrInt | Encoding::Json
        )
    };
    if let Some(name) = &options.label_column {
        let k = columns
            .iter()
            .position(|c| &c.name == name)
            .ok_or_else(|| mds_error(index, format!("has no label column {name:?}")))?;
        if !is_label(&columns[k]) {
            return Err(mds_error(
                index,
                format!(
                    "label column {name:?} is encoded {}: labels are int, str_int, json or a \
                     numpy integer",
                    columns[k].encoding_name
                ),
            ));
        }
        return Ok(Some(k));
    }
    let named = |name: &str| columns.iter().position(|c| c.name == name);
    if let Some(k) = LABEL_NAMES
        .iter()
        .find_map(|name| named(name).filter(|&k| is_label(&columns[k])))
    {
        return Ok(Some(k));
    }
    match LABEL_NAMES.iter().find_map(|name| named(name)) {
        Some(k) if labels_matter => {
            return Err(mds_error(
                index,
                format!(
                    "label column {:?} is encoded {}: labels are int, str_int, json or a \
                     numpy integer (label_column names another)",
                    columns[k].name, columns[k].encoding_name
                ),
            ))
        }
        Some(_) => return Ok(None),
        None => {}
    }
    // Beside images, the names other tools write, taken only when encoded as integers
    // (MosaicML Streaming's converters write `x`, `y`; a `json` column may hold boxes or lists).
    let integers = |c: &Column| matches!(c.encoding, Encoding::Integer(_) | Encoding::StrInt);
    Ok(crate::label_checks::LABEL_FALLBACK_NAMES
        .iter()
        .find_map(|name| named(name).filter(|&k| labels_matter && integers(&columns[k]))))
}

/// The columns a label is looked for in, in order, when none is named.
pub(super) const LABEL_NAMES: [&str; 2] = ["label", "cls"];

/// A `pil` sample (width, height and mode length as `u32`, the mode, then the raw pixels of
/// PIL's `tobytes()`) as a binary PPM (`P6`) or PGM (`P5`), converted as PIL's
/// `convert("RGB")` converts it: alpha dropped (`RGBA`, `LA`), `CMYK` by Pillow's `cmyk2rgb`,
/// `1` (bits, rows padded to a byte) as 0 or 255, `I;16`/`I;16B` clipped at 255. Err names
/// what cannot be read: a `P` image (the encoding keeps no palette: PIL itself decodes it
/// black), another mode, or sizes that do not add up.
pub(super) fn pil_as_pnm(bytes: &[u8]) -> std::result::Result<Vec<u8>, String> {
    let word = |k: usize| {
        let b = bytes.get(4 * k..4 * k + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let cut_short = || "a pil image cut short of its header".to_string();
    let (width, height, mode_len) = (
        word(0).ok_or_else(cut_short)?,
        word(1).ok_or_else(cut_short)?,
        word(2).ok_or_else(cut_short)?,
    );
    let mode = bytes.get(12..12 + mode_len).ok_or_else(cut_short)?;
    let pixels = bytes.get(12 + mode_len..).ok_or_else(cut_short)?;
    let mode_name = String::from_utf8_lossy(mode).into_owned();
    // Bytes per row as `tobytes()` lays them out.
    let row_bytes = match mode {
        b"1" => width.div_ceil(8),
        b"L" | b"P" => width,
        b"LA" | b"I;16" | b"I;16B" => width * 2,
        b"RGB" => width * 3,
        b"RGBA" | b"CMYK" => width * 4,
        _ => {
            return Err(format!(
                "a pil image of mode {mode_name:?} (RGB, RGBA, CMYK, L, LA, 1 and I;16 are read)"
            ))
        }
    };
    if mode == b"P" {
        return Err(
            "a pil image of mode \"P\": the pil encoding keeps no palette (PIL decodes it \
             black); convert such images to RGB before writing them"
                .to_string(),
        );
    }
    let size_matches = row_bytes
        .checked_mul(height)
        .is_some_and(|size| size == pixels.len());
    if !size_matches {
        return Err(format!(
            "a pil image of mode {mode_name:?} whose {} pixel bytes are not {width}x{height}",
            pixels.len()
        ));
    }
    let rgb = matches!(mode, b"RGB" | b"RGBA" | b"CMYK");
    let mut out =
        format!("{}\n{width} {height}\n255\n", if rgb { "P6" } else { "P5" }).into_bytes();
    out.reserve(width * height * if rgb { 3 } else { 1 });
    match mode {
        b"RGB" | b"L" => out.extend_from_slice(pixels),
        b"RGBA" => pixels
            .chunks_exact(4)
            .for_each(|pixel| out.extend_from_slice(&pixel[..3])),
        b"LA" => out.extend(pixels.chunks_exact(2).map(|pixel| pixel[0])),
        b"CMYK" => {
            for pixel in pixels.chunks_exact(4) {
                let keep = 255 - u32::from(pixel[3]);
                for &ink in &pixel[..3] {
                    // Pillow's MULDIV255: (a * b + 128) with its high byte added, shifted.
                    let product = u32::from(ink) * keep + 128;
                    let inked = ((product >> 8) + product) >> 8;
                    out.push(keep.saturating_sub(inked) as u8);
                }
            }
        }
        b"1" => {
            for row in pixels.chunks_exact(row_bytes.max(1)) {
                out.extend((0..width).map(|x| {
                    if row[x / 8] & (0x80 >> (x % 8)) != 0 {
                        255
                    } else {
                        0
                    }
                }));
            }
        }
        _ => {
            let big = mode == b"I;16B";
            out.extend(pixels.chunks_exact(2).map(|pair| {
                let value = if big {
                    u16::from_be_bytes([pair[0], pair[1]])
                } else {
                    u16::from_le_bytes([pair[0], pair[1]])
                };
                value.min(255) as u8
            }));
        }
    }
    Ok(out)
}

/// The column whose `ndarray` values are token ids: the one named, else `tokens`, else
/// `input_ids`, else the first `ndarray` column.
pub(super) fn pick_token_column(
    columns: &[Column],
    named: Option<&str>,
    index: &Path,
) -> Result<usize> {
    let is_array = |c: &Column| {
        matches!(
            c.encoding,
            Encoding::NdArray { dtype, .. } if dtype != Some(NdDtype::NotInteger)
        )
    };
    if let Some(name) = named {
        let k = columns
            .iter()
            .position(|c| c.name == name)
            .ok_or_else(|| mds_error(index, format!("has no token column {name:?}")))?;
        if !is_array(&columns[k]) {
            return Err(mds_error(
                index,
                format!(
                    "token column {name:?} is encoded {}: token ids are read from integer \
                     ndarray columns",
                    columns[k].encoding_name
                ),
            ));
        }
        return Ok(k);
    }
    TOKEN_COLUMN_NAMES
        .iter()
        .find_map(|name| columns.iter().position(|c| c.name == *name && is_array(c)))
        .or_else(|| columns.iter().position(is_array))
        .ok_or_else(|| {
            mds_error(
                index,
                "has no integer ndarray column to read token ids from (tokens, input_ids, or \
                 one encoded ndarray)",
            )
        })
}
