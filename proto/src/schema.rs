//! The op language read from the proto itself, and ops built from it by name.
//!
//! `build.rs` keeps protoc's descriptor set of `stoker/v1/*.proto` (comments included) and the
//! crate embeds it. [`op_schema`] lists the variants of the `Op` oneof in field-number order,
//! each with its message's fields, types and comments; [`build_op`] encodes loosely typed
//! values (what a Python dict holds) into a typed [`Op`](crate::v1::Op), field by field,
//! through the same descriptor. Adding an op or a field to `job.proto` is then the whole
//! change for clients that build ops this way: nothing else keeps a list of them.

use std::sync::OnceLock;

use bytes::BufMut;
use prost::encoding::{encode_key, encode_varint, WireType};
use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorSet};

use crate::v1::Op;
use crate::{Error, Result};

/// protoc's descriptor set of `stoker/v1/*.proto`, written by `build.rs`.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/stoker.v1.bin"));

const PACKAGE: &str = "stoker.v1";
const OP_MESSAGE: &str = "Op";
// Paths in `SourceCodeInfo`: a file's `message_type` is field 4, a message's `field` is 2.
const MESSAGE_TYPE_FIELD: i32 = 4;
const FIELD_FIELD: i32 = 2;

/// One op: a variant of the `Op` oneof and the message it carries.
#[derive(Debug, Clone, PartialEq)]
pub struct OpSchema {
    /// The oneof field's name, e.g. `random_resized_crop`.
    pub name: String,
    /// The message's name, e.g. `RandomResizedCrop`.
    pub message: String,
    /// The oneof field's number.
    pub number: u32,
    /// The message's leading comment.
    pub doc: String,
    /// The message's fields, in declaration order.
    pub fields: Vec<FieldSchema>,
}

/// One field of an op message.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldSchema {
    /// The field's name, e.g. `scale_min`.
    pub name: String,
    /// The field's number.
    pub number: u32,
    /// The element type.
    pub kind: FieldKind,
    /// Whether the field is `repeated`.
    pub repeated: bool,
    /// The field's leading comment.
    pub doc: String,
}

/// The element types an op field may have.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldKind {
    /// `bool`
    Bool,
    /// `int32`
    Int32,
    /// `int64`
    Int64,
    /// `uint32`
    Uint32,
    /// `uint64`
    Uint64,
    /// `float`
    Float,
    /// `double`
    Double,
    /// `string`
    String,
    /// A proto enum.
    Enum(EnumSchema),
}

impl FieldKind {
    /// The proto spelling of the type (the enum's name for enums).
    pub fn type_name(&self) -> &str {
        match self {
            FieldKind::Bool => "bool",
            FieldKind::Int32 => "int32",
            FieldKind::Int64 => "int64",
            FieldKind::Uint32 => "uint32",
            FieldKind::Uint64 => "uint64",
            FieldKind::Float => "float",
            FieldKind::Double => "double",
            FieldKind::String => "string",
            FieldKind::Enum(schema) => &schema.name,
        }
    }
}

/// A proto enum used by an op field.
#[derive(Debug, Clone, PartialEq)]
pub struct EnumSchema {
    /// The enum's name, e.g. `Dtype`.
    pub name: String,
    /// Its values, in declaration order.
    pub values: Vec<EnumValue>,
}

/// One value of an enum.
#[derive(Debug, Clone, PartialEq)]
pub struct EnumValue {
    /// The value's name without the enum's prefix, as prost names it: `UINT8` for
    /// `DTYPE_UINT8`, `NHWC` for `LAYOUT_NHWC`.
    pub name: String,
    /// The value's number.
    pub number: i32,
}

impl EnumSchema {
    /// The value called `name`, ignoring case, with or without the enum's prefix.
    pub fn value(&self, name: &str) -> Option<&EnumValue> {
        let prefix = format!("{}_", screaming_snake(&self.name));
        let upper = name.to_ascii_uppercase();
        let short = upper.strip_prefix(&prefix).unwrap_or(&upper);
        self.values.iter().find(|value| value.name == short)
    }

    fn names(&self) -> String {
        let names: Vec<&str> = self.values.iter().map(|v| v.name.as_str()).collect();
        names.join(", ")
    }
}

/// A loosely typed field value, as a dynamic language holds it.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// No value: the field keeps its proto default (0, empty, the enum's first value).
    Unset,
    /// A boolean.
    Bool(bool),
    /// An integer, wide enough for every proto integer type.
    Int(i128),
    /// A floating-point number.
    Float(f64),
    /// A string (or an enum value's name).
    Str(String),
    /// The elements of a repeated field.
    List(Vec<Value>),
    /// A value no field takes (another type, an integer wider than 128 bits), as the caller
    /// describes it for the error.
    Other(String),
}

impl Value {
    fn describe(&self) -> String {
        match self {
            Value::Unset => "None".into(),
            Value::Bool(value) => value.to_string(),
            Value::Int(value) => value.to_string(),
            Value::Float(value) => value.to_string(),
            Value::Str(value) => format!("{value:?}"),
            Value::List(values) => {
                let values: Vec<String> = values.iter().map(Value::describe).collect();
                format!("[{}]", values.join(", "))
            }
            Value::Other(description) => description.clone(),
        }
    }
}

/// Every op of the language, in the `Op` oneof's field-number order.
pub fn op_schema() -> Result<&'static [OpSchema]> {
    static SCHEMA: OnceLock<std::result::Result<Vec<OpSchema>, String>> = OnceLock::new();
    SCHEMA
        .get_or_init(|| read_op_schema(FILE_DESCRIPTOR_SET))
        .as_deref()
        .map_err(|message| Error::Descriptor(message.clone()))
}

/// The op called `name` (the oneof field's name, `random_resized_crop`).
pub fn find_op(name: &str) -> Result<&'static OpSchema> {
    let schema = op_schema()?;
    schema
        .iter()
        .find(|op| op.name == name)
        .ok_or_else(|| Error::UnknownOp {
            name: name.to_string(),
            known: schema
                .iter()
                .map(|op| op.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// Builds the op called `name` from `(field, value)` pairs; fields not given keep their proto
/// default. Values must fit the field's type (an int in range for integer fields, a number for
/// float fields, a value's name for enum fields, a list for repeated fields); range and order
/// rules beyond the types are the worker's to check.
pub fn build_op(name: &str, fields: &[(String, Value)]) -> Result<Op> {
    let op = find_op(name)?;
    let mut message = Vec::new();
    for (field_name, value) in fields {
        let field = op
            .fields
            .iter()
            .find(|field| &field.name == field_name)
            .ok_or_else(|| Error::UnknownField {
                op: op.message.clone(),
                field: field_name.clone(),
                known: op
                    .fields
                    .iter()
                    .map(|field| field.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        encode_field(op, field, value, &mut message)?;
    }
    let mut encoded = Vec::with_capacity(message.len() + 8);
    encode_key(op.number, WireType::LengthDelimited, &mut encoded);
    encode_varint(message.len() as u64, &mut encoded);
    encoded.extend_from_slice(&message);
    Op::decode(encoded.as_slice()).map_err(|error| Error::Descriptor(error.to_string()))
}

fn encode_field(
    op: &OpSchema,
    field: &FieldSchema,
    value: &Value,
    buf: &mut Vec<u8>,
) -> Result<()> {
    let bad = |problem: String| Error::BadValue {
        op: op.message.clone(),
        field: field.name.clone(),
        problem,
    };
    match (value, field.repeated) {
        (Value::Unset, _) => Ok(()),
        (Value::List(values), true) => values
            .iter()
            .try_for_each(|value| encode_scalar(field, value, buf).map_err(bad)),
        (other, true) => Err(bad(format!(
            "needs a list of {}, got {}",
            field.kind.type_name(),
            other.describe()
        ))),
        (value, false) => encode_scalar(field, value, buf).map_err(bad),
    }
}

/// Encodes one element; the error says what was wrong with the value.
fn encode_scalar(
    field: &FieldSchema,
    value: &Value,
    buf: &mut Vec<u8>,
) -> std::result::Result<(), String> {
    let integer = |low: i128, high: i128| match value {
        Value::Int(number) if (low..=high).contains(number) => Ok(*number),
        other => Err(format!(
            "must be an int in {low}..={high}, got {}",
            other.describe()
        )),
    };
    let number = || match value {
        Value::Int(number) => Ok(*number as f64),
        Value::Float(number) => Ok(*number),
        other => Err(format!("must be a number, got {}", other.describe())),
    };
    let tag = field.number;
    match &field.kind {
        FieldKind::Bool => match value {
            Value::Bool(flag) => varint(tag, u64::from(*flag), buf),
            other => return Err(format!("must be a bool, got {}", other.describe())),
        },
        // Negative int32 and int64 values travel as their 64-bit two's complement.
        FieldKind::Int32 => varint(
            tag,
            integer(i32::MIN.into(), i32::MAX.into())? as i64 as u64,
            buf,
        ),
        FieldKind::Int64 => varint(
            tag,
            integer(i64::MIN.into(), i64::MAX.into())? as i64 as u64,
            buf,
        ),
        FieldKind::Uint32 => varint(tag, integer(0, u32::MAX.into())? as u64, buf),
        FieldKind::Uint64 => varint(tag, integer(0, u64::MAX.into())? as u64, buf),
        FieldKind::Float => {
            encode_key(tag, WireType::ThirtyTwoBit, buf);
            buf.put_f32_le(number()? as f32);
        }
        FieldKind::Double => {
            encode_key(tag, WireType::SixtyFourBit, buf);
            buf.put_f64_le(number()?);
        }
        FieldKind::String => match value {
            Value::Str(text) => {
                encode_key(tag, WireType::LengthDelimited, buf);
                encode_varint(text.len() as u64, buf);
                buf.put_slice(text.as_bytes());
            }
            other => return Err(format!("must be a string, got {}", other.describe())),
        },
        FieldKind::Enum(schema) => {
            let found = match value {
                Value::Str(name) => schema.value(name),
                _ => None,
            };
            match found {
                Some(found) => varint(tag, found.number as i64 as u64, buf),
                None => {
                    return Err(format!(
                        "must be one of {} (any case), got {}",
                        schema.names(),
                        value.describe()
                    ))
                }
            }
        }
    }
    Ok(())
}

fn varint(tag: u32, value: u64, buf: &mut Vec<u8>) {
    encode_key(tag, WireType::Varint, buf);
    encode_varint(value, buf);
}

/// `RandomResizedCrop` -> `RANDOM_RESIZED_CROP`, the prefix protoc style gives enum values.
fn screaming_snake(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for (index, ch) in name.chars().enumerate() {
        if ch.is_ascii_uppercase() && index > 0 {
            out.push('_');
        }
        out.push(ch.to_ascii_uppercase());
    }
    out
}

fn read_op_schema(bytes: &[u8]) -> std::result::Result<Vec<OpSchema>, String> {
    let set = FileDescriptorSet::decode(bytes).map_err(|error| error.to_string())?;
    let mut messages = Vec::new();
    let mut enums = Vec::new();
    for file in set.file.iter().filter(|file| file.package() == PACKAGE) {
        let comments = |path: &[i32]| -> String {
            file.source_code_info
                .iter()
                .flat_map(|info| &info.location)
                .find(|location| location.path == path)
                .map(|location| location.leading_comments().trim().to_string())
                .unwrap_or_default()
        };
        for (index, message) in file.message_type.iter().enumerate() {
            let path = [MESSAGE_TYPE_FIELD, index as i32];
            let field_docs: Vec<String> = (0..message.field.len())
                .map(|field| comments(&[path[0], path[1], FIELD_FIELD, field as i32]))
                .collect();
            messages.push((message, comments(&path), field_docs));
        }
        enums.extend(file.enum_type.iter());
    }
    let find_message = |type_name: &str| {
        let name = type_name.trim_start_matches(&format!(".{PACKAGE}."));
        messages
            .iter()
            .find(|(message, _, _)| message.name() == name)
            .ok_or_else(|| format!("message {type_name} is not in the descriptor set"))
    };
    let (op, _, _) = find_message(OP_MESSAGE)?;
    let mut ops: Vec<OpSchema> = op
        .field
        .iter()
        .filter(|field| field.oneof_index.is_some())
        .map(|variant| {
            let (message, doc, field_docs) = find_message(variant.type_name())?;
            Ok(OpSchema {
                name: variant.name().to_string(),
                message: message.name().to_string(),
                number: variant.number() as u32,
                doc: doc.clone(),
                fields: fields(message, field_docs, &enums)?,
            })
        })
        .collect::<std::result::Result<_, String>>()?;
    ops.sort_by_key(|op| op.number);
    Ok(ops)
}

fn fields(
    message: &DescriptorProto,
    docs: &[String],
    enums: &[&EnumDescriptorProto],
) -> std::result::Result<Vec<FieldSchema>, String> {
    message
        .field
        .iter()
        .zip(docs)
        .map(|(field, doc)| {
            let kind = match field.r#type() {
                Type::Bool => FieldKind::Bool,
                Type::Int32 => FieldKind::Int32,
                Type::Int64 => FieldKind::Int64,
                Type::Uint32 => FieldKind::Uint32,
                Type::Uint64 => FieldKind::Uint64,
                Type::Float => FieldKind::Float,
                Type::Double => FieldKind::Double,
                Type::String => FieldKind::String,
                Type::Enum => {
                    let name = field
                        .type_name()
                        .trim_start_matches(&format!(".{PACKAGE}."));
                    let found = enums
                        .iter()
                        .find(|candidate| candidate.name() == name)
                        .ok_or_else(|| format!("enum {name} is not in the descriptor set"))?;
                    let prefix = format!("{}_", screaming_snake(name));
                    FieldKind::Enum(EnumSchema {
                        name: name.to_string(),
                        values: found
                            .value
                            .iter()
                            .map(|value| EnumValue {
                                name: value
                                    .name()
                                    .strip_prefix(&prefix)
                                    .unwrap_or(value.name())
                                    .to_string(),
                                number: value.number(),
                            })
                            .collect(),
                    })
                }
                other => {
                    return Err(format!(
                        "{}.{} has type {other:?}, which op fields may not have (add it to \
                         stoker_proto::schema first)",
                        message.name(),
                        field.name()
                    ))
                }
            };
            Ok(FieldSchema {
                name: field.name().to_string(),
                number: field.number() as u32,
                kind,
                repeated: field.label() == Label::Repeated,
                doc: doc.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{self as proto, op::Op as OpKind};

    fn int(value: i128) -> Value {
        Value::Int(value)
    }

    fn floats(values: &[f64]) -> Value {
        Value::List(values.iter().map(|v| Value::Float(*v)).collect())
    }

    #[test]
    fn every_oneof_variant_is_listed_with_its_fields_and_comments() {
        let schema = op_schema().unwrap();
        let names: Vec<&str> = schema.iter().map(|op| op.name.as_str()).collect();
        assert_eq!(
            names[..3],
            ["decode_image", "random_resized_crop", "resize"]
        );
        assert!(names.contains(&"select_columns"));
        let crop = find_op("random_resized_crop").unwrap();
        assert_eq!(crop.message, "RandomResizedCrop");
        assert!(crop.doc.contains("torchvision"), "{}", crop.doc);
        let fields: Vec<(&str, &str)> = crop
            .fields
            .iter()
            .map(|f| (f.name.as_str(), f.kind.type_name()))
            .collect();
        assert_eq!(fields[0], ("height", "uint32"));
        assert_eq!(fields[2], ("scale_min", "float"));
        assert!(crop.fields[2].doc.contains("Area fraction"));
        let to_tensor = find_op("to_tensor").unwrap();
        let FieldKind::Enum(dtype) = &to_tensor.fields[1].kind else {
            panic!("dtype is not an enum")
        };
        assert_eq!(dtype.value("float32").map(|v| v.number), Some(2));
        assert_eq!(dtype.value("DTYPE_UINT8").map(|v| v.number), Some(1));
        assert!(find_op("normalize").unwrap().fields[0].repeated);
    }

    #[test]
    fn ops_build_from_loose_values() {
        let crop = build_op(
            "random_resized_crop",
            &[
                ("height".into(), int(8)),
                ("width".into(), int(16)),
                ("scale_min".into(), Value::Float(0.5)),
                ("scale_max".into(), int(1)),
            ],
        )
        .unwrap();
        assert_eq!(
            crop.op,
            Some(OpKind::RandomResizedCrop(proto::RandomResizedCrop {
                height: 8,
                width: 16,
                scale_min: 0.5,
                scale_max: 1.0,
                ..Default::default()
            }))
        );
        let tensor = build_op(
            "to_tensor",
            &[
                ("layout".into(), Value::Str("NCHW".into())),
                ("dtype".into(), Value::Str("float32".into())),
            ],
        )
        .unwrap();
        assert_eq!(
            tensor.op,
            Some(OpKind::ToTensor(proto::ToTensor {
                layout: proto::Layout::Nchw as i32,
                dtype: proto::Dtype::Float32 as i32,
            }))
        );
        let pack = build_op(
            "pack_sequences",
            &[("eos_id".into(), int(-1)), ("seq_len".into(), int(4))],
        )
        .unwrap();
        assert_eq!(
            pack.op,
            Some(OpKind::PackSequences(proto::PackSequences {
                seq_len: 4,
                eos_id: -1,
                pad_id: 0,
            }))
        );
        let normalize = build_op(
            "normalize",
            &[
                ("mean".into(), floats(&[0.5, 0.25, 0.0])),
                ("std".into(), floats(&[1.0, 2.0, 3.0])),
            ],
        )
        .unwrap();
        let Some(OpKind::Normalize(normalize)) = normalize.op else {
            panic!("not normalize")
        };
        assert_eq!(normalize.mean, [0.5, 0.25, 0.0]);
        assert_eq!(normalize.std, [1.0, 2.0, 3.0]);
        let columns = build_op(
            "select_columns",
            &[
                (
                    "names".into(),
                    Value::List(vec![Value::Str("x".into()), Value::Str("y".into())]),
                ),
                ("dtype".into(), Value::Unset),
            ],
        )
        .unwrap();
        let Some(OpKind::SelectColumns(columns)) = columns.op else {
            panic!("not select_columns")
        };
        assert_eq!(columns.names, ["x", "y"]);
        assert_eq!(columns.dtype, proto::Dtype::Unspecified as i32);
    }

    #[test]
    fn errors_name_the_op_the_field_and_the_problem() {
        let error = |name: &str, fields: &[(String, Value)]| {
            build_op(name, fields).unwrap_err().to_string()
        };
        let message = error("blur", &[]);
        assert!(message.contains("unknown op \"blur\""), "{message}");
        assert!(message.contains("center_crop"), "{message}");
        let message = error("resize", &[("size".into(), int(3))]);
        assert!(message.contains("Resize"), "{message}");
        assert!(message.contains("shorter_side"), "{message}");
        let message = error("center_crop", &[("height".into(), int(-1))]);
        assert!(
            message.contains("CenterCrop height must be an int in 0..=4294967295, got -1"),
            "{message}"
        );
        let message = error("decode_image", &[("allow_dct_scaling".into(), int(1))]);
        assert!(message.contains("must be a bool"), "{message}");
        let message = error("to_tensor", &[("layout".into(), Value::Str("HWC".into()))]);
        assert!(message.contains("NHWC, NCHW"), "{message}");
        let message = error("normalize", &[("mean".into(), Value::Float(0.5))]);
        assert!(message.contains("needs a list of float"), "{message}");
        let message = error(
            "tokenize",
            &[("tokenizer_path".into(), Value::List(vec![]))],
        );
        assert!(message.contains("must be a string"), "{message}");
    }
}
