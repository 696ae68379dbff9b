//! A text column's row group read as raw bytes, for when Arrow's reader refuses the group: it
//! checks that every string of a group is UTF-8, so one bad cell failed the whole group, and
//! a group holds more rows than the bad-sample policy tries substitutes (a run under
//! `on_error="skip"` ended). Read this way each cell is a sample of its own again, and a cell
//! that is not UTF-8 is one bad sample (the text reader checks each document).

use std::sync::Arc;

use arrow_array::builder::BinaryBuilder;
use arrow_array::ArrayRef;
use parquet::basic::Type as PhysicalType;
use parquet::column::reader::ColumnReader;
use parquet::errors::{ParquetError, Result};
use parquet::file::metadata::ParquetMetaData;
use parquet::file::properties::ReaderProperties;
use parquet::file::reader::RowGroupReader;
use parquet::file::serialized_reader::SerializedRowGroupReader;

use super::bytes::ChunkBytes;

/// The cells of the flat byte-array column `root` (a root column index) in row group
/// `group`, as binary values (nulls kept), read from `bytes` without any UTF-8 check.
pub(super) fn raw_text_column(
    bytes: ChunkBytes,
    metadata: &ParquetMetaData,
    group: usize,
    root: usize,
) -> Result<ArrayRef> {
    let schema = metadata.file_metadata().schema_descr();
    let leaves: Vec<usize> = (0..schema.num_columns())
        .filter(|&leaf| schema.get_column_root_idx(leaf) == root)
        .collect();
    let &[leaf] = leaves.as_slice() else {
        return Err(ParquetError::General("not a flat column".into()));
    };
    let column = schema.column(leaf);
    if column.physical_type() != PhysicalType::BYTE_ARRAY || column.max_rep_level() != 0 {
        return Err(ParquetError::General("not a flat byte-array column".into()));
    }
    let max_def = column.max_def_level();
    let group_metadata = metadata.row_group(group);
    let rows = usize::try_from(group_metadata.num_rows())
        .map_err(|_| ParquetError::General("a row group of a negative row count".into()))?;
    let reader = SerializedRowGroupReader::new(
        Arc::new(bytes),
        group_metadata,
        None,
        Arc::new(ReaderProperties::builder().build()),
    )?;
    let ColumnReader::ByteArrayColumnReader(mut cells) = reader.get_column_reader(leaf)? else {
        return Err(ParquetError::General("not a byte-array column".into()));
    };
    let (mut levels, mut values) = (Vec::new(), Vec::new());
    let mut read = 0;
    while read < rows {
        let (records, _, _) =
            cells.read_records(rows - read, Some(&mut levels), None, &mut values)?;
        if records == 0 {
            break;
        }
        read += records;
    }
    if read != rows {
        return Err(ParquetError::General(format!(
            "read {read} rows where the footer announces {rows}"
        )));
    }
    let mut builder = BinaryBuilder::with_capacity(rows, 0);
    let mut values = values.iter();
    for row in 0..rows {
        let present = max_def == 0 || levels.get(row) == Some(&max_def);
        match present.then(|| values.next()).flatten() {
            Some(value) => builder.append_value(value.data()),
            None => builder.append_null(),
        }
    }
    Ok(Arc::new(builder.finish()))
}
