//! Column types the Arrow-row sources (Parquet files, Hugging Face folders) accept, and typed
//! access to one cell of a decoded column.

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type,
    UInt64Type, UInt8Type,
};
use arrow_array::Array;
use arrow_schema::DataType;

/// Whether a column of `data_type` holds encoded bytes (images).
pub(crate) fn is_binary(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView
    )
}

/// Whether a column of `data_type` holds UTF-8 text.
pub(crate) fn is_text(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    )
}

/// Whether a column of `data_type` holds integers (labels, `i64` reads).
pub(crate) fn is_integer(data_type: &DataType) -> bool {
    data_type.is_integer()
}

/// The label column of an image table none names and none marks (no `label`, no
/// `ClassLabel`): the first integer column of the names other tools write
/// ([`LABEL_FALLBACK_NAMES`](crate::label_checks::LABEL_FALLBACK_NAMES)).
pub(crate) fn fallback_label_column(schema: &arrow_schema::Schema) -> Option<usize> {
    crate::label_checks::LABEL_FALLBACK_NAMES
        .iter()
        .filter_map(|name| schema.index_of(name).ok())
        .find(|&index| is_integer(schema.field(index).data_type()))
}

/// Whether a column of `data_type` holds numbers that convert to `f32`.
pub(crate) fn is_numeric(data_type: &DataType) -> bool {
    data_type.is_integer() || matches!(data_type, DataType::Float32 | DataType::Float64)
}

/// The bytes of cell `row` of a binary or text column; `None` when the cell is null (or the
/// column has another type, which the callers have ruled out).
pub(crate) fn bytes_cell(array: &dyn Array, row: usize) -> Option<&[u8]> {
    if row >= array.len() || array.is_null(row) {
        return None;
    }
    if let Some(values) = array.as_binary_opt::<i32>() {
        return Some(values.value(row));
    }
    if let Some(values) = array.as_binary_opt::<i64>() {
        return Some(values.value(row));
    }
    if let Some(values) = array.as_binary_view_opt() {
        return Some(values.value(row));
    }
    if let Some(values) = array.as_string_opt::<i32>() {
        return Some(values.value(row).as_bytes());
    }
    if let Some(values) = array.as_string_opt::<i64>() {
        return Some(values.value(row).as_bytes());
    }
    if let Some(values) = array.as_string_view_opt() {
        return Some(values.value(row).as_bytes());
    }
    None
}

/// One numeric cell read as a given type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Cell<T> {
    /// The value.
    Value(T),
    /// The cell is null (or past the column's end).
    Null,
    /// The value does not fit the type (an unsigned 64-bit value over `i64::MAX`), or the
    /// column's type does not convert to it.
    Unfit,
}

/// Reads cell `row` of a primitive array of type `$arrow` and converts it with `$convert`.
macro_rules! primitive_cell {
    ($array:expr, $row:expr, $convert:expr, [$($arrow:ty),*]) => {{
        $(
            if let Some(values) = $array.as_primitive_opt::<$arrow>() {
                return $convert(values.value($row));
            }
        )*
    }};
}

/// Cell `row` of an integer column as `i64`.
pub(crate) fn integer_cell(array: &dyn Array, row: usize) -> Cell<i64> {
    if row >= array.len() || array.is_null(row) {
        return Cell::Null;
    }
    primitive_cell!(
        array,
        row,
        |value| Cell::Value(i64::from(value)),
        [Int8Type, Int16Type, Int32Type, UInt8Type, UInt16Type, UInt32Type]
    );
    if let Some(values) = array.as_primitive_opt::<Int64Type>() {
        return Cell::Value(values.value(row));
    }
    if let Some(values) = array.as_primitive_opt::<UInt64Type>() {
        return i64::try_from(values.value(row)).map_or(Cell::Unfit, Cell::Value);
    }
    Cell::Unfit
}

/// Cell `row` of an integer or floating-point column as `f32` (rounded to nearest, as a cast
/// in numpy or torch would); a finite double past `f32`'s range does not fit (a cast would make
/// it infinite), while the data's own infinities and NaNs are kept.
pub(crate) fn float_cell(array: &dyn Array, row: usize) -> Cell<f32> {
    if row >= array.len() || array.is_null(row) {
        return Cell::Null;
    }
    primitive_cell!(
        array,
        row,
        |value| Cell::Value(f32::from(value)),
        [Int8Type, Int16Type, UInt8Type, UInt16Type]
    );
    if let Some(values) = array.as_primitive_opt::<Float32Type>() {
        return Cell::Value(values.value(row));
    }
    if let Some(values) = array.as_primitive_opt::<Float64Type>() {
        let value = values.value(row);
        let narrowed = value as f32;
        return if value.is_finite() && narrowed.is_infinite() {
            Cell::Unfit
        } else {
            Cell::Value(narrowed)
        };
    }
    primitive_cell!(
        array,
        row,
        |value| Cell::Value(value as f32),
        [Int32Type, Int64Type, UInt32Type, UInt64Type]
    );
    Cell::Unfit
}

/// The type of a column in words, for reports and errors.
pub(crate) fn type_name(data_type: &DataType) -> String {
    data_type.to_string()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{
        ArrayRef, BinaryArray, Float64Array, Int16Array, LargeStringArray, UInt64Array,
    };

    use super::*;

    #[test]
    fn bytes_cells_of_binary_and_text_columns() {
        let binary: ArrayRef = Arc::new(BinaryArray::from(vec![Some(&b"ab"[..]), None]));
        assert_eq!(bytes_cell(binary.as_ref(), 0), Some(&b"ab"[..]));
        assert_eq!(bytes_cell(binary.as_ref(), 1), None);
        assert_eq!(bytes_cell(binary.as_ref(), 2), None);
        let text: ArrayRef = Arc::new(LargeStringArray::from(vec!["héllo"]));
        assert_eq!(bytes_cell(text.as_ref(), 0), Some("héllo".as_bytes()));
        let numbers: ArrayRef = Arc::new(Int16Array::from(vec![1]));
        assert_eq!(bytes_cell(numbers.as_ref(), 0), None);
    }

    #[test]
    fn integer_cells_widen_and_refuse_what_does_not_fit() {
        let small: ArrayRef = Arc::new(Int16Array::from(vec![Some(-3), None]));
        assert_eq!(integer_cell(small.as_ref(), 0), Cell::Value(-3));
        assert_eq!(integer_cell(small.as_ref(), 1), Cell::Null);
        let large: ArrayRef = Arc::new(UInt64Array::from(vec![5, u64::MAX]));
        assert_eq!(integer_cell(large.as_ref(), 0), Cell::Value(5));
        assert_eq!(integer_cell(large.as_ref(), 1), Cell::Unfit);
        let floats: ArrayRef = Arc::new(Float64Array::from(vec![1.5]));
        assert_eq!(integer_cell(floats.as_ref(), 0), Cell::Unfit);
    }

    #[test]
    fn float_cells_convert_integers_and_doubles() {
        let floats: ArrayRef = Arc::new(Float64Array::from(vec![0.1, -2.0]));
        assert_eq!(float_cell(floats.as_ref(), 0), Cell::Value(0.1f64 as f32));
        assert_eq!(float_cell(floats.as_ref(), 1), Cell::Value(-2.0));
        let small: ArrayRef = Arc::new(Int16Array::from(vec![7]));
        assert_eq!(float_cell(small.as_ref(), 0), Cell::Value(7.0));
        let text: ArrayRef = Arc::new(LargeStringArray::from(vec!["1"]));
        assert_eq!(float_cell(text.as_ref(), 0), Cell::Unfit);
    }

    #[test]
    fn a_double_past_the_range_of_f32_does_not_fit_while_the_datas_own_infinities_pass() {
        let doubles: ArrayRef = Arc::new(Float64Array::from(vec![
            1e300,
            -1e39,
            f64::INFINITY,
            f64::MAX,
            3.4e38,
        ]));
        assert_eq!(float_cell(doubles.as_ref(), 0), Cell::Unfit);
        assert_eq!(float_cell(doubles.as_ref(), 1), Cell::Unfit);
        assert_eq!(float_cell(doubles.as_ref(), 2), Cell::Value(f32::INFINITY));
        assert_eq!(float_cell(doubles.as_ref(), 3), Cell::Unfit);
        assert_eq!(float_cell(doubles.as_ref(), 4), Cell::Value(3.4e38));
        let nan: ArrayRef = Arc::new(Float64Array::from(vec![f64::NAN]));
        assert!(matches!(float_cell(nan.as_ref(), 0), Cell::Value(v) if v.is_nan()));
    }
}
