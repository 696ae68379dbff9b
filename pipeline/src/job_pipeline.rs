//! A job's pipeline of any kind, chosen from its op list: images (decode + augment, see
//! [`Pipeline`]), fixed token windows from a token file, or text tokenised and packed into rows.
//!
//! | op list | batch tensors |
//! |---|---|
//! | `DecodeImage, ...` | `image` (uint8 NHWC or float32), `label` int64 `[B]` |
//! | `TokenWindows{seq_len}` | `tokens` `[B, seq_len + 1]` in the file's dtype (uint16/uint32) |
//! | `TokenWindows{seq_len, document_boundaries}` | `tokens`, and `position_ids`, `document_ids`: int32 `[B, seq_len + 1]` (a corpus with a document index) |
//! | `Tokenize{path}, PackSequences{seq_len, eos_id, pad_id}` | `input_ids`, `position_ids`, `document_ids`: int32 `[B, seq_len]` |
//! | `SelectColumns{names, dtype}` | one tensor per column, named like it: float32 or int64 `[B]`; `label` int64 `[B]` |
//!
//! A packed batch has one row per document of its step: `B` documents give `B` rows, and the
//! packing rule is in [`pack_documents`](crate::pack_documents)'s module docs.
//!
//! These are the only checks of op arguments and order: clients ask them through
//! [`check_op`] and [`JobPipeline::check`] rather than keep their own copies.

use std::sync::Arc;

use stoker_datasets::{TokenDtype, MAX_SEQ_LEN};
use stoker_proto::v1::{self as proto, op::Op as OpKind};

use crate::error::{Error, Result};
use crate::ops::pack::PackSpec;
use crate::ops::tokenize::TextTokenizer;
use crate::pipeline::{
    center_crop, flip_probability, normalize_parameters, op_name, random_resized_crop, resize_side,
    tensor_dtype, Pipeline,
};

/// Text tokenised on the workers and packed into rows.
#[derive(Debug, Clone)]
pub struct PackedText {
    /// The tokenizer, shared by the decode threads.
    pub tokenizer: Arc<TextTokenizer>,
    /// Row length, EOS and padding ids.
    pub pack: PackSpec,
}

/// Named numeric columns of a Parquet source, each read as a `[B]` tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectedColumns {
    /// Column names, non-empty and distinct, in tensor order.
    pub names: Vec<String>,
    /// The element type asked for: `Float32`, `Int64`, or `Unspecified` (each column's own
    /// type: float32 for floating-point columns, int64 for integer ones).
    pub dtype: proto::Dtype,
}

/// A checked pipeline of any kind.
#[derive(Debug, Clone)]
pub enum JobPipeline {
    /// Decode, crop, resize, flip, normalise images.
    Image(Pipeline),
    /// Windows of `seq_len + 1` tokens read from a token file as they are.
    TokenWindows {
        /// Input length of a window.
        seq_len: u32,
        /// Whether batches carry `position_ids` and `document_ids` from the corpus's
        /// document boundaries.
        documents: bool,
    },
    /// Tokenise text samples and pack them into rows.
    PackedText(PackedText),
    /// Numeric Parquet columns as tensors, one per column.
    Columns(SelectedColumns),
}

impl From<Pipeline> for JobPipeline {
    fn from(pipeline: Pipeline) -> Self {
        JobPipeline::Image(pipeline)
    }
}

fn invalid(message: impl Into<String>) -> Error {
    Error::InvalidPipeline(message.into())
}

/// The op lists a token source takes.
pub const TOKEN_ORDERS: &str = "[TokenWindows] (token files) or [Tokenize, PackSequences] (text)";

/// The op list of Parquet numeric columns: one op alone.
pub const COLUMNS_ORDER: &str = "[SelectColumns]";

fn seq_len(value: u32, op: &str) -> Result<u32> {
    if value == 0 || value > MAX_SEQ_LEN {
        return Err(invalid(format!(
            "{op} seq_len must be in 1..={MAX_SEQ_LEN}, got {value}"
        )));
    }
    Ok(value)
}

fn tokenizer_path(tokenize: &proto::Tokenize) -> Result<&std::path::Path> {
    let path = std::path::Path::new(tokenize.tokenizer_path.trim());
    if path.as_os_str().is_empty() {
        return Err(invalid(
            "Tokenize needs tokenizer_path (the path of a tokenizer.json)",
        ));
    }
    Ok(path)
}

/// PackSequences' arguments, the EOS id still `None` when the tokenizer is to give it.
fn pack_arguments(pack: &proto::PackSequences) -> Result<(u32, Option<u32>)> {
    let eos_id = if pack.eos_id < 0 {
        None
    } else {
        Some(
            u32::try_from(pack.eos_id)
                .ok()
                .filter(|id| *id <= i32::MAX as u32)
                .ok_or_else(|| {
                    invalid(format!(
                        "PackSequences eos_id must be negative (the tokenizer's EOS) or an id \
                         in 0..2^31, got {}",
                        pack.eos_id
                    ))
                })?,
        )
    };
    if pack.pad_id > i32::MAX as u32 {
        return Err(invalid(format!(
            "PackSequences pad_id must be an id in 0..2^31, got {}",
            pack.pad_id
        )));
    }
    Ok((seq_len(pack.seq_len, "PackSequences")?, eos_id))
}

fn selected_columns(select: &proto::SelectColumns) -> Result<SelectedColumns> {
    if select.names.is_empty() {
        return Err(invalid("SelectColumns needs at least one column name"));
    }
    let mut seen = std::collections::HashSet::new();
    for name in &select.names {
        if name.is_empty() {
            return Err(invalid("SelectColumns: a column name is empty"));
        }
        if !seen.insert(name.as_str()) {
            return Err(invalid(format!(
                "SelectColumns names column {name:?} twice"
            )));
        }
    }
    let dtype = match proto::Dtype::try_from(select.dtype) {
        Ok(dtype @ (proto::Dtype::Unspecified | proto::Dtype::Float32 | proto::Dtype::Int64)) => {
            dtype
        }
        Ok(other) => {
            return Err(invalid(format!(
                "SelectColumns dtype {}: use FLOAT32, INT64 or UNSPECIFIED (the column's own type)",
                other.as_str_name()
            )))
        }
        Err(_) => {
            return Err(invalid(format!(
                "SelectColumns dtype {} is not a known dtype",
                select.dtype
            )))
        }
    };
    Ok(SelectedColumns {
        names: select.names.clone(),
        dtype,
    })
}

/// Checks one op's arguments, whatever list it ends up in: the same checks
/// [`JobPipeline::from_ops`] makes, so a client can report a bad op where it was built.
pub fn check_op(op: &proto::Op) -> Result<()> {
    let Some(kind) = op.op.as_ref() else {
        return Err(invalid("the op is empty"));
    };
    match kind {
        OpKind::DecodeImage(_) => Ok(()),
        OpKind::RandomResizedCrop(crop) => random_resized_crop(crop).map(drop),
        OpKind::Resize(resize) => resize_side(resize).map(drop),
        OpKind::CenterCrop(crop) => center_crop(None, crop).map(drop),
        OpKind::RandomHorizontalFlip(flip) => flip_probability(flip).map(drop),
        OpKind::Normalize(normalize) => normalize_parameters(normalize).map(drop),
        OpKind::ToTensor(tensor) => tensor_dtype(tensor).map(drop),
        OpKind::TokenWindows(windows) => seq_len(windows.seq_len, "TokenWindows").map(drop),
        OpKind::Tokenize(tokenize) => tokenizer_path(tokenize).map(drop),
        OpKind::PackSequences(pack) => pack_arguments(pack).map(drop),
        OpKind::SelectColumns(select) => selected_columns(select).map(drop),
    }
}

/// Whether `ops` is an image op list missing its leading DecodeImage: not a token or columns
/// list, and not starting with DecodeImage (an empty list included). Clients may put
/// `DecodeImage` with default arguments in front of such a list; the wire contract itself
/// wants it written out.
pub fn lacks_decode_image(ops: &[proto::Op]) -> bool {
    let image_op = |op: &proto::Op| match &op.op {
        Some(
            OpKind::TokenWindows(_)
            | OpKind::Tokenize(_)
            | OpKind::PackSequences(_)
            | OpKind::SelectColumns(_),
        ) => false,
        Some(
            OpKind::DecodeImage(_)
            | OpKind::RandomResizedCrop(_)
            | OpKind::Resize(_)
            | OpKind::CenterCrop(_)
            | OpKind::RandomHorizontalFlip(_)
            | OpKind::Normalize(_)
            | OpKind::ToTensor(_),
        )
        | None => true,
    };
    ops.iter().all(image_op)
        && !matches!(
            ops.first().and_then(|op| op.op.as_ref()),
            Some(OpKind::DecodeImage(_))
        )
}

/// A checked op list before any file is read: what [`JobPipeline`] becomes once the tokenizer
/// of a text pipeline is loaded.
enum CheckedOps<'a> {
    Image(Pipeline),
    TokenWindows {
        seq_len: u32,
        documents: bool,
    },
    Text {
        tokenizer_path: &'a std::path::Path,
        seq_len: u32,
        eos_id: Option<u32>,
        pad_id: u32,
    },
    Columns(SelectedColumns),
}

fn check_ops(ops: &[proto::Op]) -> Result<CheckedOps<'_>> {
    let kinds = crate::pipeline::op_kinds(ops)?;
    let names = || {
        let names: Vec<&str> = kinds.iter().map(|kind| op_name(kind)).collect();
        names.join(", ")
    };
    let is_token_op = |kind: &&OpKind| {
        matches!(
            kind,
            OpKind::TokenWindows(_) | OpKind::Tokenize(_) | OpKind::PackSequences(_)
        )
    };
    match kinds.as_slice() {
        [OpKind::SelectColumns(select)] => Ok(CheckedOps::Columns(selected_columns(select)?)),
        kinds
            if kinds
                .iter()
                .any(|kind| matches!(kind, OpKind::SelectColumns(_))) =>
        {
            Err(invalid(format!(
                "SelectColumns is a pipeline of its own; got [{}]; supported: {COLUMNS_ORDER}",
                names()
            )))
        }
        [OpKind::TokenWindows(windows)] => Ok(CheckedOps::TokenWindows {
            seq_len: seq_len(windows.seq_len, "TokenWindows")?,
            documents: windows.document_boundaries,
        }),
        [OpKind::Tokenize(tokenize), OpKind::PackSequences(pack)] => {
            let (seq_len, eos_id) = pack_arguments(pack)?;
            Ok(CheckedOps::Text {
                tokenizer_path: tokenizer_path(tokenize)?,
                seq_len,
                eos_id,
                pad_id: pack.pad_id,
            })
        }
        [OpKind::Tokenize(_)] => Err(invalid(format!(
            "Tokenize needs PackSequences after it to make fixed-size rows; got [{}]; \
             supported token pipelines: {TOKEN_ORDERS}",
            names()
        ))),
        kinds if kinds.iter().any(is_token_op) => Err(invalid(format!(
            "unsupported token pipeline [{}]; supported token pipelines: {TOKEN_ORDERS}",
            names()
        ))),
        _ => Pipeline::from_ops(ops).map(CheckedOps::Image),
    }
}

impl JobPipeline {
    /// Checks an op list without reading any file (a Tokenize op's tokenizer is not loaded):
    /// every error [`from_ops`](Self::from_ops) gives but a missing or unusable tokenizer.
    pub fn check(ops: &[proto::Op]) -> Result<()> {
        check_ops(ops).map(drop)
    }

    /// Checks an op list; the ops decide the kind. Loads the tokenizer of a Tokenize op.
    pub fn from_ops(ops: &[proto::Op]) -> Result<JobPipeline> {
        match check_ops(ops)? {
            CheckedOps::Image(pipeline) => Ok(JobPipeline::Image(pipeline)),
            CheckedOps::TokenWindows { seq_len, documents } => {
                Ok(JobPipeline::TokenWindows { seq_len, documents })
            }
            CheckedOps::Columns(columns) => Ok(JobPipeline::Columns(columns)),
            CheckedOps::Text {
                tokenizer_path,
                seq_len,
                eos_id,
                pad_id,
            } => {
                let tokenizer = TextTokenizer::shared(tokenizer_path)?;
                let eos_id = match eos_id {
                    Some(id) => id,
                    None => tokenizer.eos_id().ok_or_else(|| {
                        invalid(format!(
                            "PackSequences: the tokenizer {} has none of the EOS tokens {:?}; \
                             give eos_id",
                            tokenizer_path.display(),
                            crate::ops::tokenize::EOS_CANDIDATES
                        ))
                    })?,
                };
                if tokenizer.vocab_size() > i32::MAX as usize {
                    return Err(invalid(format!(
                        "the tokenizer {} has ids up to {}, past int32's (2^31 - 1): \
                         PackSequences writes int32 ids",
                        tokenizer_path.display(),
                        tokenizer.vocab_size() - 1
                    )));
                }
                Ok(JobPipeline::PackedText(PackedText {
                    tokenizer,
                    pack: PackSpec {
                        seq_len,
                        eos_id,
                        pad_id,
                    },
                }))
            }
        }
    }

    /// The image pipeline, if this is one.
    pub fn image(&self) -> Option<&Pipeline> {
        match self {
            JobPipeline::Image(pipeline) => Some(pipeline),
            _ => None,
        }
    }

    /// What its user should be told once: a packed text's EOS or padding id past its
    /// tokenizer's ids, which a model with an embedding row per tokenizer id cannot look up
    /// (an id beyond the tokenizer is kept: a model may have rows past it).
    pub fn notices(&self) -> Vec<String> {
        let JobPipeline::PackedText(text) = self else {
            return Vec::new();
        };
        let ids = text.tokenizer.vocab_size();
        [("eos_id", text.pack.eos_id), ("pad_id", text.pack.pad_id)]
            .into_iter()
            .filter(|&(_, id)| usize::try_from(id).map_or(true, |id| id >= ids))
            .map(|(name, id)| {
                format!(
                    "PackSequences {name} {id} is past the ids of the tokenizer {} (0..{ids}): \
                     a model whose embedding has a row per tokenizer id fails on it",
                    text.tokenizer.path().display()
                )
            })
            .collect()
    }

    /// The SHA-256 of the tokenizer file a packed text pipeline loaded (`None` for others).
    pub fn tokenizer_sha256(&self) -> Option<&str> {
        match self {
            JobPipeline::PackedText(text) => Some(text.tokenizer.sha256()),
            _ => None,
        }
    }

    /// The `seq_len` of a TokenWindows pipeline: a token file source needs it to cut windows.
    pub fn token_windows_seq_len(&self) -> Option<u32> {
        match self {
            JobPipeline::TokenWindows { seq_len, .. } => Some(*seq_len),
            _ => None,
        }
    }
}

/// The wire dtype of a token file's tokens.
pub fn token_dtype_proto(dtype: TokenDtype) -> proto::Dtype {
    match dtype {
        TokenDtype::Uint16 => proto::Dtype::Uint16,
        TokenDtype::Uint32 => proto::Dtype::Uint32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::IMAGE_ORDERS;

    fn op(kind: OpKind) -> proto::Op {
        proto::Op { op: Some(kind) }
    }

    #[test]
    fn the_first_op_picks_the_kind() {
        let windows = JobPipeline::from_ops(&[op(OpKind::TokenWindows(proto::TokenWindows {
            seq_len: 128,
            ..Default::default()
        }))])
        .unwrap();
        assert_eq!(windows.token_windows_seq_len(), Some(128));
        let image = JobPipeline::from_ops(&crate::presets::imagenet_eval(32)).unwrap();
        assert!(image.image().is_some());
        assert_eq!(image.token_windows_seq_len(), None);
    }

    #[test]
    fn enum_values_this_build_does_not_know_are_refused() {
        for (layout, dtype, words) in [(0, -7, "dtype -7 is not"), (9, 1, "layout 9 is not")] {
            let tensor = op(OpKind::ToTensor(proto::ToTensor { layout, dtype }));
            let error = check_op(&tensor).unwrap_err().to_string();
            assert!(error.contains(words), "{error}");
        }
        assert!(check_op(&op(OpKind::ToTensor(proto::ToTensor::default()))).is_ok());
    }

    #[test]
    fn bad_token_op_lists_name_what_is_wrong() {
        let windows = op(OpKind::TokenWindows(proto::TokenWindows {
            seq_len: 0,
            ..Default::default()
        }));
        let error = JobPipeline::from_ops(&[windows]).unwrap_err().to_string();
        assert!(error.contains("seq_len must be in 1..="), "{error}");
        let tokenize = op(OpKind::Tokenize(proto::Tokenize {
            tokenizer_path: "/nonexistent/tokenizer.json".into(),
        }));
        let error = JobPipeline::from_ops(std::slice::from_ref(&tokenize))
            .unwrap_err()
            .to_string();
        assert!(error.contains("needs PackSequences"), "{error}");
        let pack = op(OpKind::PackSequences(proto::PackSequences {
            seq_len: 16,
            eos_id: -1,
            pad_id: 0,
        }));
        let error = JobPipeline::from_ops(&[tokenize, pack.clone()])
            .unwrap_err()
            .to_string();
        assert!(error.contains("/nonexistent/tokenizer.json"), "{error}");
        let error = JobPipeline::from_ops(&[pack]).unwrap_err().to_string();
        assert!(error.contains("supported token pipelines"), "{error}");
        let mixed = [
            op(OpKind::TokenWindows(proto::TokenWindows {
                seq_len: 8,
                ..Default::default()
            })),
            op(OpKind::DecodeImage(proto::DecodeImage::default())),
        ];
        assert!(JobPipeline::from_ops(&mixed).is_err());
    }

    #[test]
    fn eos_comes_from_the_tokenizer_unless_given() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        crate::train_bpe_tokenizer(&["hello world", "hello there"], 280, "</s>", &path).unwrap();
        let ops = |eos_id| {
            [
                op(OpKind::Tokenize(proto::Tokenize {
                    tokenizer_path: path.to_string_lossy().into_owned(),
                })),
                op(OpKind::PackSequences(proto::PackSequences {
                    seq_len: 32,
                    eos_id,
                    pad_id: 3,
                })),
            ]
        };
        let JobPipeline::PackedText(own) = JobPipeline::from_ops(&ops(-1)).unwrap() else {
            panic!("not packed text")
        };
        assert_eq!(
            (own.pack.eos_id, own.pack.pad_id, own.pack.seq_len),
            (0, 3, 32)
        );
        let JobPipeline::PackedText(given) = JobPipeline::from_ops(&ops(42)).unwrap() else {
            panic!("not packed text")
        };
        assert_eq!(given.pack.eos_id, 42);
    }

    /// A tokenizer numbering a token past int32's ids is refused: the count of its entries
    /// (three) was taken for its largest id, and id 3,000,000,000 was packed as -1294967296.
    #[test]
    fn a_tokenizer_with_ids_past_int32_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        let tokenizer = serde_json::json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": [],
            "normalizer": null,
            "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": null,
            "decoder": null,
            "model": {
                "type": "WordLevel",
                "vocab": {"[UNK]": 0, "</s>": 1, "hello": 3_000_000_000u64},
                "unk_token": "[UNK]"
            }
        });
        std::fs::write(&path, tokenizer.to_string()).unwrap();
        let loaded = crate::ops::tokenize::TextTokenizer::load(&path).unwrap();
        assert_eq!(loaded.vocab_size(), 3_000_000_001);
        let ops = [
            op(OpKind::Tokenize(proto::Tokenize {
                tokenizer_path: path.to_string_lossy().into_owned(),
            })),
            op(OpKind::PackSequences(proto::PackSequences {
                seq_len: 32,
                eos_id: -1,
                pad_id: 0,
            })),
        ];
        let error = JobPipeline::from_ops(&ops).unwrap_err().to_string();
        assert!(error.contains("ids up to 3000000000"), "{error}");
    }

    #[test]
    fn select_columns_is_checked_alone() {
        let select = |names: &[&str], dtype: proto::Dtype| {
            op(OpKind::SelectColumns(proto::SelectColumns {
                names: names.iter().map(|name| name.to_string()).collect(),
                dtype: dtype as i32,
            }))
        };
        let JobPipeline::Columns(columns) =
            JobPipeline::from_ops(&[select(&["x", "y"], proto::Dtype::Int64)]).unwrap()
        else {
            panic!("not columns")
        };
        assert_eq!(columns.names, ["x", "y"]);
        assert_eq!(columns.dtype, proto::Dtype::Int64);
        let error_of = |ops: &[proto::Op]| JobPipeline::from_ops(ops).unwrap_err().to_string();
        let error = error_of(&[select(&[], proto::Dtype::Unspecified)]);
        assert!(error.contains("at least one column"), "{error}");
        let error = error_of(&[select(&["x", ""], proto::Dtype::Unspecified)]);
        assert!(error.contains("empty"), "{error}");
        let error = error_of(&[select(&["x", "y", "x"], proto::Dtype::Float32)]);
        assert!(error.contains("\"x\" twice"), "{error}");
        let error = error_of(&[select(&["x"], proto::Dtype::Uint8)]);
        assert!(error.contains("DTYPE_UINT8"), "{error}");
        let error = error_of(&[op(OpKind::SelectColumns(proto::SelectColumns {
            names: vec!["x".into()],
            dtype: 99,
        }))]);
        assert!(error.contains("99"), "{error}");
        let with_image = [
            op(OpKind::DecodeImage(proto::DecodeImage::default())),
            select(&["x"], proto::Dtype::Unspecified),
        ];
        assert!(error_of(&with_image).contains("[SelectColumns]"));
        let then_windows = [
            select(&["x"], proto::Dtype::Unspecified),
            op(OpKind::TokenWindows(proto::TokenWindows {
                seq_len: 8,
                ..Default::default()
            })),
        ];
        assert!(error_of(&then_windows).contains("[SelectColumns]"));
    }

    #[test]
    fn check_reads_no_file_and_check_op_sees_one_op() {
        // The tokenizer is the workers' to load: checking the list does not open it.
        let text = [
            op(OpKind::Tokenize(proto::Tokenize {
                tokenizer_path: "/nonexistent/tokenizer.json".into(),
            })),
            op(OpKind::PackSequences(proto::PackSequences {
                seq_len: 16,
                eos_id: -1,
                pad_id: 0,
            })),
        ];
        JobPipeline::check(&text).unwrap();
        let error = check_op(&op(OpKind::PackSequences(proto::PackSequences {
            seq_len: 16,
            eos_id: 1 << 40,
            pad_id: 0,
        })))
        .unwrap_err()
        .to_string();
        assert!(error.contains("eos_id"), "{error}");
        let error = check_op(&op(OpKind::CenterCrop(proto::CenterCrop {
            height: 0,
            width: 8,
        })))
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("CenterCrop height must be in 1..=16384"),
            "{error}"
        );
        check_op(&op(OpKind::Resize(proto::Resize { shorter_side: 8 }))).unwrap();
    }

    #[test]
    fn order_errors_name_the_list_and_the_orders() {
        let flip = || {
            op(OpKind::RandomHorizontalFlip(proto::RandomHorizontalFlip {
                p: 0.5,
            }))
        };
        let crop = op(OpKind::CenterCrop(proto::CenterCrop {
            height: 8,
            width: 8,
        }));
        let decode = op(OpKind::DecodeImage(proto::DecodeImage::default()));
        let error = JobPipeline::check(&[decode.clone(), crop.clone(), flip(), flip()])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("RandomHorizontalFlip is out of place or repeated"),
            "{error}"
        );
        assert!(
            error.contains(
                "got [DecodeImage, CenterCrop, RandomHorizontalFlip, RandomHorizontalFlip]"
            ),
            "{error}"
        );
        assert!(error.contains(IMAGE_ORDERS), "{error}");
        let windows = op(OpKind::TokenWindows(proto::TokenWindows {
            seq_len: 8,
            ..Default::default()
        }));
        let error = JobPipeline::check(&[flip(), windows.clone()])
            .unwrap_err()
            .to_string();
        assert!(error.contains(TOKEN_ORDERS), "{error}");
        assert!(lacks_decode_image(&[]));
        assert!(lacks_decode_image(std::slice::from_ref(&crop)));
        assert!(!lacks_decode_image(&[decode, crop]));
        assert!(!lacks_decode_image(&[windows]));
    }
}
