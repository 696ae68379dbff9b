//! Ready-made op lists: the ImageNet training and evaluation pipelines everyone starts from.

use stoker_proto::v1::{self as proto, op::Op as OpKind};

use crate::error::{Error, Result};

fn op(kind: OpKind) -> proto::Op {
    proto::Op { op: Some(kind) }
}

/// Decode, RandomResizedCrop(`size`) with torchvision's ranges, RandomHorizontalFlip(0.5),
/// uint8 NHWC out. Region decoding always; DCT scaling when the crop is at least twice `size`.
pub fn imagenet_train(size: u32) -> Vec<proto::Op> {
    vec![
        op(OpKind::DecodeImage(proto::DecodeImage {
            max_pixels: 0,
            allow_dct_scaling: true,
        })),
        op(OpKind::RandomResizedCrop(proto::RandomResizedCrop {
            height: size,
            width: size,
            scale_min: 0.08,
            scale_max: 1.0,
            ratio_min: 3.0 / 4.0,
            ratio_max: 4.0 / 3.0,
        })),
        op(OpKind::RandomHorizontalFlip(proto::RandomHorizontalFlip {
            p: 0.5,
        })),
        op(OpKind::ToTensor(proto::ToTensor {
            layout: proto::Layout::Nhwc as i32,
            dtype: proto::Dtype::Uint8 as i32,
        })),
    ]
}

/// Decode, Resize(`size * 256 / 224`), CenterCrop(`size`), uint8 NHWC out.
pub fn imagenet_eval(size: u32) -> Vec<proto::Op> {
    vec![
        op(OpKind::DecodeImage(proto::DecodeImage {
            max_pixels: 0,
            allow_dct_scaling: false,
        })),
        op(OpKind::Resize(proto::Resize {
            shorter_side: size * 256 / 224,
        })),
        op(OpKind::CenterCrop(proto::CenterCrop {
            height: size,
            width: size,
        })),
        op(OpKind::ToTensor(proto::ToTensor {
            layout: proto::Layout::Nhwc as i32,
            dtype: proto::Dtype::Uint8 as i32,
        })),
    ]
}

/// The op list of a named preset: `imagenet-train` or `imagenet-eval`, at `size`.
pub fn by_name(name: &str, size: u32) -> Result<Vec<proto::Op>> {
    match name {
        "imagenet-train" => Ok(imagenet_train(size)),
        "imagenet-eval" => Ok(imagenet_eval(size)),
        other => Err(Error::InvalidPipeline(format!(
            "unknown pipeline preset {other:?}; known: imagenet-train, imagenet-eval"
        ))),
    }
}
