//! A check the parquet crate does not make before it decodes: that a dictionary page holds the
//! values its header claims. The crate sizes the dictionary by the claim first (parquet 59,
//! `set_dict`), so a 1 KB file claiming ~934 million Int64 values asked for 7.4 GB (found by the
//! `parquet` fuzz target). Each dictionary page of the column chunks about to be decoded is
//! read here first (its header, then its bytes) and a claim its bytes cannot hold is refused.
//! Before any page is read, the chunk's page headers are walked by `page_headers.rs`, so a
//! header the crate's reader would loop on never reaches it; where the first header passes, the
//! dictionary claim is judged before a fault in a later header is reported.

use std::sync::Arc;

use parquet::basic::Type as PhysicalType;
use parquet::column::page::{Page, PageReader};
use parquet::errors::ParquetError;
use parquet::file::metadata::{ColumnChunkMetaData, ParquetMetaData};
use parquet::file::reader::ChunkReader;
use parquet::file::serialized_reader::SerializedPageReader;
use parquet::schema::types::ColumnDescPtr;

use super::page_headers::check_page_headers;

/// Bytes a value of `physical` takes at least in a PLAIN dictionary page (0: no bound).
fn least_bytes(physical: PhysicalType, type_length: i32) -> u64 {
    match physical {
        PhysicalType::BOOLEAN => 0,
        PhysicalType::INT32 | PhysicalType::FLOAT => 4,
        PhysicalType::INT64 | PhysicalType::DOUBLE => 8,
        PhysicalType::INT96 => 12,
        // A length prefix of 4 bytes each.
        PhysicalType::BYTE_ARRAY => 4,
        PhysicalType::FIXED_LEN_BYTE_ARRAY => u64::try_from(type_length).unwrap_or(0),
    }
}

/// Refuses, in the chunks of `row_groups` x the leaf columns under `roots`, a page header the
/// bounded walk refuses, and a dictionary page whose header claims more values than its bytes
/// hold.
pub(super) fn check_pages<R: ChunkReader + 'static>(
    file: R,
    metadata: &ParquetMetaData,
    row_groups: &[usize],
    roots: &[usize],
) -> Result<(), ParquetError> {
    let file = Arc::new(file);
    let schema = metadata.file_metadata().schema_descr();
    for &group in row_groups {
        let row_group = metadata.row_group(group);
        let rows = usize::try_from(row_group.num_rows()).unwrap_or(0);
        for leaf in 0..schema.num_columns() {
            if !roots.contains(&schema.get_column_root_idx(leaf)) {
                continue;
            }
            let chunk = row_group.column(leaf);
            let walked = check_page_headers(file.as_ref(), chunk);
            if let Err(refused) = &walked {
                if refused.page == 0 {
                    return walked.map_err(|refused| refused.error);
                }
            }
            // Reads the first page only, whose header the walk passed.
            check_dictionary(Arc::clone(&file), chunk, rows, schema.column(leaf), group)?;
            walked.map_err(|refused| refused.error)?;
        }
    }
    Ok(())
}

/// Refuses the dictionary page of `chunk`, if it has one, when its header claims more values
/// than its bytes hold. Reads the chunk's first page only.
fn check_dictionary<R: ChunkReader + 'static>(
    file: Arc<R>,
    chunk: &ColumnChunkMetaData,
    rows: usize,
    column: ColumnDescPtr,
    group: usize,
) -> Result<(), ParquetError> {
    let mut pages = SerializedPageReader::new(file, chunk, rows, None)?;
    if !pages.peek_next_page()?.is_some_and(|page| page.is_dict) {
        return Ok(());
    }
    let Some(Page::DictionaryPage {
        buf, num_values, ..
    }) = pages.get_next_page()?
    else {
        return Ok(());
    };
    let least = least_bytes(column.physical_type(), column.type_length());
    if u64::from(num_values).saturating_mul(least) > buf.len() as u64 {
        return Err(ParquetError::General(format!(
            "column {} of row group {group}: its dictionary page claims {num_values} values \
             in {} bytes",
            column.path(),
            buf.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::{ParquetDataset, ParquetOptions};
    use crate::sample_source::SampleSource;

    #[test]
    fn a_dictionary_page_claiming_more_values_than_its_bytes_is_refused() {
        // The fuzz input: without the check, reading it allocates 7.4 GB.
        let input = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fuzz/regressions/parquet/dictionary-page-claims-934m-values");
        let dir = tempfile::tempdir().expect("temporary folder");
        let file = dir.path().join("data.parquet");
        std::fs::copy(&input, &file).expect("the regression input");
        let error = match ParquetDataset::open(&file, &ParquetOptions::default()) {
            Err(error) => error.to_string(),
            Ok(dataset) => (0..dataset.len())
                .find_map(|row| dataset.read(row).err())
                .map(|error| error.to_string())
                .unwrap_or_default(),
        };
        assert!(error.contains("dictionary page claims"), "{error:?}");
    }

    #[test]
    fn a_page_header_that_runs_past_the_file_is_an_error_at_once() {
        // The fuzz input: the first page header of a column chunk skips fields past the end of
        // the file; the parquet crate read the end as fields of no bytes and looped for many
        // minutes. The bounded walk refuses its never-ending varint before the crate reads it
        // (`NoReadPastEnd` stops the crate too; `bytes.rs` tests that).
        let input = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fuzz/regressions/parquet/page_header_skip_timeout");
        let dir = tempfile::tempdir().expect("temporary folder");
        let file = dir.path().join("data.parquet");
        std::fs::copy(&input, &file).expect("the regression input");
        let dataset = ParquetDataset::open(&file, &ParquetOptions::default()).expect("the footer");
        let errors: Vec<String> = (0..dataset.len())
            .map(|row| {
                dataset
                    .read(row)
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default()
            })
            .collect();
        assert!(!errors.is_empty());
        for error in &errors {
            assert!(
                error.contains("the page header at byte 4 holds a varint longer than 10 bytes"),
                "{error:?}"
            );
        }
    }

    #[test]
    fn a_page_header_whose_list_count_outruns_its_bytes_is_refused_at_once() {
        // The fuzz input: a page header holding a list of booleans with a count near 2^31. The
        // parquet crate's skipper takes each as no bytes and looped for minutes.
        let input = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fuzz/regressions/parquet/bool_list_skip_timeout");
        let dir = tempfile::tempdir().expect("temporary folder");
        let file = dir.path().join("data.parquet");
        std::fs::copy(&input, &file).expect("the regression input");
        let errors: Vec<String> = match ParquetDataset::open(&file, &ParquetOptions::default()) {
            Err(error) => vec![error.to_string()],
            Ok(dataset) => (0..dataset.len())
                .map(|row| dataset.read(row).err().map(|e| e.to_string()))
                .map(Option::unwrap_or_default)
                .collect(),
        };
        assert!(!errors.is_empty());
        for error in &errors {
            assert!(error.contains("the page header at byte"), "{error:?}");
        }
    }
}
