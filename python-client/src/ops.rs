//! Pipeline ops between Python and Rust, with the proto as the one definition of the language.
//!
//! An op crosses as a dict whose `"op"` key names a variant of the proto's `Op` oneof and whose
//! other keys are that message's fields (`{"op": "center_crop", "height": 224, "width": 224}`);
//! [`stoker_proto::build_op`] turns it into a typed op through the embedded descriptor, so this
//! file lists no op. The checks are the workers' own ([`stoker_pipeline::check_op`],
//! [`stoker_pipeline::JobPipeline::check`]); Python calls them instead of keeping copies.
//! `op_schema()` shows Python the language: the ops, their fields, types and comments.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyDictMethods, PyFloat, PyInt, PyList, PyString, PyTuple};
use stoker_proto::v1 as proto;
use stoker_proto::{FieldKind, Value};

use crate::errors::{raise, Kind};

fn pipeline_error(message: impl std::fmt::Display) -> PyErr {
    raise(Kind::Pipeline, message.to_string())
}

fn value(object: &Bound<'_, PyAny>) -> PyResult<Value> {
    // bool before int: Python's bool is an int subclass.
    if object.is_none() {
        Ok(Value::Unset)
    } else if object.is_instance_of::<PyBool>() {
        Ok(Value::Bool(object.extract()?))
    } else if object.is_instance_of::<PyInt>() {
        // Wider than any proto integer, so an out-of-range value gets the field's own message.
        match object.extract::<i128>() {
            Ok(number) => Ok(Value::Int(number)),
            Err(_) => Ok(Value::Other(object.repr()?.to_string())),
        }
    } else if object.is_instance_of::<PyFloat>() {
        Ok(Value::Float(object.extract()?))
    } else if object.is_instance_of::<PyString>() {
        Ok(Value::Str(object.extract()?))
    } else if object.is_instance_of::<PyList>() || object.is_instance_of::<PyTuple>() {
        object
            .try_iter()?
            .map(|item| value(&item?))
            .collect::<PyResult<_>>()
            .map(Value::List)
    } else {
        Ok(Value::Other(object.repr()?.to_string()))
    }
}

/// One op dict to a proto op; the error names the op and the field.
fn op_from_dict(op: &Bound<'_, PyDict>) -> PyResult<Result<proto::Op, String>> {
    let Some(name) = op.get_item("op")? else {
        return Ok(Err("an op dict needs the key \"op\" (the op's name)".into()));
    };
    let Ok(name) = name.extract::<String>() else {
        return Ok(Err(format!("the \"op\" key must be a string, got {name}")));
    };
    let mut fields = Vec::with_capacity(op.len());
    for (key, item) in op.iter() {
        let key: String = key.str()?.extract()?;
        if key != "op" {
            fields.push((key, value(&item)?));
        }
    }
    Ok(stoker_proto::build_op(&name, &fields).map_err(|error| error.to_string()))
}

/// Converts the list of op dicts (nothing is checked beyond the field types).
pub fn from_python(ops: &[Bound<'_, PyDict>]) -> PyResult<Vec<proto::Op>> {
    ops.iter()
        .enumerate()
        .map(|(index, op)| {
            op_from_dict(op)?.map_err(|message| pipeline_error(format!("op {index}: {message}")))
        })
        .collect()
}

/// Checks one op dict's field types and arguments, as the workers would.
#[pyfunction]
fn check_op(op: &Bound<'_, PyDict>) -> PyResult<()> {
    let op = op_from_dict(op)?.map_err(pipeline_error)?;
    stoker_pipeline::check_op(&op).map_err(pipeline_error)
}

/// Checks an op list's ops and order without reading a file. Returns whether it is an image
/// list lacking its leading `DecodeImage` (checked with `DecodeImage()` put in front).
#[pyfunction]
fn check_pipeline(ops: Vec<Bound<'_, PyDict>>) -> PyResult<bool> {
    let mut ops = from_python(&ops)?;
    let lacks_decode = stoker_pipeline::lacks_decode_image(&ops);
    if lacks_decode {
        ops.insert(
            0,
            proto::Op {
                op: Some(proto::op::Op::DecodeImage(proto::DecodeImage::default())),
            },
        );
    }
    stoker_pipeline::JobPipeline::check(&ops).map_err(pipeline_error)?;
    Ok(lacks_decode)
}

/// The op language as the proto defines it: one dict per op (`name`, `message`, `number`,
/// `doc`, `fields`), each field a dict (`name`, `number`, `type`, `repeated`, `doc`, and
/// `values` for enums: the value names without the enum's prefix).
#[pyfunction]
fn op_schema(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    let schema = stoker_proto::op_schema().map_err(|e| raise(Kind::Stoker, e.to_string()))?;
    let ops = PyList::empty(py);
    for op in schema {
        let fields = PyList::empty(py);
        for field in &op.fields {
            let entry = PyDict::new(py);
            entry.set_item("name", &field.name)?;
            entry.set_item("number", field.number)?;
            entry.set_item("type", field.kind.type_name())?;
            entry.set_item("repeated", field.repeated)?;
            entry.set_item("doc", &field.doc)?;
            if let FieldKind::Enum(schema) = &field.kind {
                let values: Vec<&str> = schema.values.iter().map(|v| v.name.as_str()).collect();
                entry.set_item("values", values)?;
            }
            fields.append(entry)?;
        }
        let entry = PyDict::new(py);
        entry.set_item("name", &op.name)?;
        entry.set_item("message", &op.message)?;
        entry.set_item("number", op.number)?;
        entry.set_item("doc", &op.doc)?;
        entry.set_item("fields", fields)?;
        ops.append(entry)?;
    }
    Ok(ops)
}

/// The ids a `tokenizer.json` gives each of `texts` as the Tokenize op encodes them (no special
/// tokens added), and which `tokenizers` line encoded them: `"1.0"`, or `"0.23: <why 1.0 cannot
/// read the file>"`. For checking a tokenizer against another implementation.
#[pyfunction]
fn encode_texts(
    py: Python<'_>,
    tokenizer: std::path::PathBuf,
    texts: Vec<String>,
) -> PyResult<(Vec<Vec<u32>>, String)> {
    py.detach(|| {
        let loaded = stoker_pipeline::TextTokenizer::load(&tokenizer)?;
        let ids = texts
            .iter()
            .map(|text| loaded.encode(text))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| stoker_pipeline::Error::InvalidSpec(error.to_string()))?;
        let engine = match loaded.engine() {
            stoker_pipeline::TokenizerEngine::V1 => "1.0".to_string(),
            stoker_pipeline::TokenizerEngine::Legacy(why) => format!("0.23: {why}"),
        };
        Ok::<_, stoker_pipeline::Error>((ids, engine))
    })
    .map_err(pipeline_error)
}

/// Adds the op functions and the limits and orders the checks use to the module.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(check_op, module)?)?;
    module.add_function(wrap_pyfunction!(check_pipeline, module)?)?;
    module.add_function(wrap_pyfunction!(op_schema, module)?)?;
    module.add_function(wrap_pyfunction!(encode_texts, module)?)?;
    module.add("IMAGE_ORDERS", stoker_pipeline::IMAGE_ORDERS)?;
    module.add("TOKEN_ORDERS", stoker_pipeline::TOKEN_ORDERS)?;
    module.add("COLUMNS_ORDER", stoker_pipeline::COLUMNS_ORDER)?;
    module.add("MAX_SIDE", stoker_pipeline::MAX_SIDE)?;
    module.add("MAX_BATCH_SIZE", stoker_pipeline::MAX_BATCH_SIZE)?;
    module.add("MAX_SEQ_LEN", stoker_datasets::MAX_SEQ_LEN)?;
    module.add("DEFAULT_MAX_PIXELS", stoker_pipeline::DEFAULT_MAX_PIXELS)?;
    Ok(())
}
