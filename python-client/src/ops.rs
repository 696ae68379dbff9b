//! Python op dicts (`{"op": "random_resized_crop", "size": [224, 224], ...}`) to protobuf ops.
//! The Python layer checks arguments first; this checks again, since the native module can be
//! called directly, and names the op and key at fault.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyDictMethods};
use stoker_proto::v1::{self as proto, op::Op as OpKind};

use crate::errors::{raise, Kind};

fn bad(index: usize, message: impl std::fmt::Display) -> PyErr {
    raise(Kind::Pipeline, format!("op {index}: {message}"))
}

fn get<'py, T: FromPyObjectOwned<'py>>(
    op: &Bound<'py, PyDict>,
    index: usize,
    key: &str,
) -> PyResult<T> {
    let value = op
        .get_item(key)?
        .ok_or_else(|| bad(index, format!("missing key {key:?}")))?;
    let type_name = value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into());
    value
        .extract::<T>()
        .map_err(|_| bad(index, format!("{key:?} has the wrong type ({type_name})")))
}

fn pair<'py>(op: &Bound<'py, PyDict>, index: usize, key: &str) -> PyResult<(f64, f64)> {
    let values: Vec<f64> = get(op, index, key)?;
    match values.as_slice() {
        [a, b] => Ok((*a, *b)),
        _ => Err(bad(
            index,
            format!("{key:?} needs two numbers, got {}", values.len()),
        )),
    }
}

fn size<'py>(op: &Bound<'py, PyDict>, index: usize) -> PyResult<(u32, u32)> {
    let values: Vec<u32> = get(op, index, "size")?;
    match values.as_slice() {
        [h, w] => Ok((*h, *w)),
        _ => Err(bad(index, "\"size\" needs [height, width]")),
    }
}

fn triple<'py>(op: &Bound<'py, PyDict>, index: usize, key: &str) -> PyResult<Vec<f32>> {
    let values: Vec<f32> = get(op, index, key)?;
    if values.len() != 3 {
        return Err(bad(
            index,
            format!("{key:?} needs 3 values (RGB), got {}", values.len()),
        ));
    }
    Ok(values)
}

/// Converts the list of op dicts.
pub fn from_python(ops: &[Bound<'_, PyDict>]) -> PyResult<Vec<proto::Op>> {
    ops.iter()
        .enumerate()
        .map(|(index, op)| {
            let name: String = get(op, index, "op")?;
            let kind = match name.as_str() {
                "decode_image" => OpKind::DecodeImage(proto::DecodeImage {
                    max_pixels: get(op, index, "max_pixels")?,
                    allow_dct_scaling: get(op, index, "allow_dct_scaling")?,
                }),
                "random_resized_crop" => {
                    let (height, width) = size(op, index)?;
                    let scale = pair(op, index, "scale")?;
                    let ratio = pair(op, index, "ratio")?;
                    OpKind::RandomResizedCrop(proto::RandomResizedCrop {
                        height,
                        width,
                        scale_min: scale.0 as f32,
                        scale_max: scale.1 as f32,
                        ratio_min: ratio.0 as f32,
                        ratio_max: ratio.1 as f32,
                    })
                }
                "resize" => OpKind::Resize(proto::Resize {
                    shorter_side: get(op, index, "size")?,
                }),
                "center_crop" => {
                    let (height, width) = size(op, index)?;
                    OpKind::CenterCrop(proto::CenterCrop { height, width })
                }
                "random_horizontal_flip" => {
                    OpKind::RandomHorizontalFlip(proto::RandomHorizontalFlip {
                        p: get::<f64>(op, index, "p")? as f32,
                    })
                }
                "normalize" => OpKind::Normalize(proto::Normalize {
                    mean: triple(op, index, "mean")?,
                    std: triple(op, index, "std")?,
                }),
                "to_tensor" => {
                    let layout: String = get(op, index, "layout")?;
                    let dtype: String = get(op, index, "dtype")?;
                    let layout = match layout.as_str() {
                        "NHWC" => proto::Layout::Nhwc,
                        "NCHW" => proto::Layout::Nchw,
                        other => {
                            return Err(bad(
                                index,
                                format!("layout {other:?}: use \"NHWC\" or \"NCHW\""),
                            ))
                        }
                    };
                    let dtype = match dtype.as_str() {
                        "uint8" => proto::Dtype::Uint8,
                        "float32" => proto::Dtype::Float32,
                        other => {
                            return Err(bad(
                                index,
                                format!("dtype {other:?}: use \"uint8\" or \"float32\""),
                            ))
                        }
                    };
                    OpKind::ToTensor(proto::ToTensor {
                        layout: layout as i32,
                        dtype: dtype as i32,
                    })
                }
                "token_windows" => OpKind::TokenWindows(proto::TokenWindows {
                    seq_len: get(op, index, "seq_len")?,
                }),
                "tokenize" => OpKind::Tokenize(proto::Tokenize {
                    tokenizer_path: get(op, index, "tokenizer_path")?,
                }),
                "pack_sequences" => OpKind::PackSequences(proto::PackSequences {
                    seq_len: get(op, index, "seq_len")?,
                    eos_id: get(op, index, "eos_id")?,
                    pad_id: get(op, index, "pad_id")?,
                }),
                "select_columns" => {
                    let dtype: Option<String> = get(op, index, "dtype")?;
                    let dtype = match dtype.as_deref() {
                        None => proto::Dtype::Unspecified,
                        Some("float32") => proto::Dtype::Float32,
                        Some("int64") => proto::Dtype::Int64,
                        Some(other) => {
                            return Err(bad(
                                index,
                                format!("dtype {other:?}: use \"float32\", \"int64\" or None"),
                            ))
                        }
                    };
                    OpKind::SelectColumns(proto::SelectColumns {
                        names: get(op, index, "names")?,
                        dtype: dtype as i32,
                    })
                }
                other => return Err(bad(index, format!("unknown op {other:?}"))),
            };
            Ok(proto::Op { op: Some(kind) })
        })
        .collect()
}
