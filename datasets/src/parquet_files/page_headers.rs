//! A walk over the page headers of the column chunks about to be decoded, with a bounded
//! Thrift compact-protocol reader of our own, before the parquet crate reads them.
//!
//! The crate's reader (parquet 59) skips a field it does not know by its Thrift type, and takes
//! a boolean as no bytes even where it is a list element (which the encoding gives a byte): a
//! crafted header holding a list of booleans with a count near 2^31 loops for minutes without
//! reading (found by the `parquet` fuzz target). Here every list, set or map element takes at
//! least one byte, so a count larger than the bytes left in the column chunk is refused at
//! once; so is nesting deeper than the crate's own limit, and a header that runs past its chunk.
//! A header that passes is one the crate skips through in time linear in its bytes.

use parquet::errors::ParquetError;
use parquet::file::metadata::ColumnChunkMetaData;
use parquet::file::reader::ChunkReader;

/// Bytes of a header read first; a header longer than this (large statistics) is read again
/// with a window twice as long, up to the end of its chunk.
const FIRST_WINDOW: u64 = 1024;

/// Nesting the reader follows, as the parquet crate's skipper does.
const MAX_DEPTH: u32 = 64;

/// Thrift compact-protocol types, as the low nibble of a field or element header gives them.
mod wire {
    pub const BOOL_TRUE: u8 = 1;
    pub const BOOL_FALSE: u8 = 2;
    pub const BYTE: u8 = 3;
    pub const I16: u8 = 4;
    pub const I32: u8 = 5;
    pub const I64: u8 = 6;
    pub const DOUBLE: u8 = 7;
    pub const BINARY: u8 = 8;
    pub const LIST: u8 = 9;
    pub const SET: u8 = 10;
    pub const MAP: u8 = 11;
    pub const STRUCT: u8 = 12;
    pub const UUID: u8 = 13;
}

/// `PageHeader.compressed_page_size`'s field id.
const COMPRESSED_PAGE_SIZE: i16 = 3;

/// Why a header could not be read from the bytes at hand.
#[derive(Debug, PartialEq)]
enum Fault {
    /// The header goes on past the bytes given (more of the chunk may hold it).
    Short,
    /// The header is malformed whatever follows.
    Malformed(String),
}

/// A page header's length in bytes and the page size it gives.
#[derive(Debug, PartialEq)]
struct Header {
    length: u64,
    compressed_page_size: i32,
}

/// A page header the walk refused: which page of its chunk (0 the first) and why.
#[derive(Debug)]
pub(super) struct RefusedHeader {
    pub(super) page: usize,
    pub(super) error: ParquetError,
}

/// Checks each page header of `chunk` (a column chunk of `file`) as described in the module
/// doc, following the pages by their compressed sizes to the end of the chunk.
pub(super) fn check_page_headers<R: ChunkReader>(
    file: &R,
    chunk: &ColumnChunkMetaData,
) -> Result<(), RefusedHeader> {
    let refused = |page: usize, reason: String| RefusedHeader {
        page,
        error: ParquetError::General(format!("column {}: {reason}", chunk.column_path())),
    };
    let start = chunk
        .dictionary_page_offset()
        .unwrap_or_else(|| chunk.data_page_offset());
    let (Ok(start), Ok(length)) = (u64::try_from(start), u64::try_from(chunk.compressed_size()))
    else {
        return Err(refused(
            0,
            "its chunk has a negative offset or size".to_string(),
        ));
    };
    let end = start.saturating_add(length).min(file.len());
    let mut offset = start;
    let mut page = 0;
    while offset < end {
        let header = read_header(file, offset, end).map_err(|reason| {
            refused(page, format!("the page header at byte {offset} {reason}"))
        })?;
        let Ok(size) = u64::try_from(header.compressed_page_size) else {
            return Err(refused(
                page,
                format!("the page header at byte {offset} gives a negative page size"),
            ));
        };
        // A page past its chunk ends the walk: the crate stops at the chunk's end as well.
        offset = offset.saturating_add(header.length).saturating_add(size);
        page += 1;
    }
    Ok(())
}

/// Reads the header at `offset`, with windows growing up to `end`.
fn read_header<R: ChunkReader>(file: &R, offset: u64, end: u64) -> Result<Header, String> {
    let left = end - offset;
    let mut window = FIRST_WINDOW.min(left);
    loop {
        let length = usize::try_from(window).map_err(|_| "does not fit in memory".to_string())?;
        let bytes = file
            .get_bytes(offset, length)
            .map_err(|error| format!("could not be read: {error}"))?;
        match parse_header(&bytes) {
            Ok(header) => return Ok(header),
            Err(Fault::Malformed(reason)) => return Err(reason),
            Err(Fault::Short) if window == left => {
                return Err("runs past the end of its column chunk".to_string())
            }
            Err(Fault::Short) => window = window.saturating_mul(2).min(left),
        }
    }
}

/// Parses a page header at the start of `bytes`.
fn parse_header(bytes: &[u8]) -> Result<Header, Fault> {
    let mut reader = Reader { bytes, at: 0 };
    let mut compressed_page_size = None;
    let mut last_id = 0i16;
    while let Some((id, kind)) = reader.field(&mut last_id)? {
        if id == COMPRESSED_PAGE_SIZE && kind == wire::I32 {
            compressed_page_size = Some(reader.i32()?);
        } else {
            reader.skip_field(kind, MAX_DEPTH)?;
        }
    }
    let compressed_page_size = compressed_page_size
        .ok_or_else(|| Fault::Malformed("has no compressed page size".to_string()))?;
    Ok(Header {
        length: reader.at as u64,
        compressed_page_size,
    })
}

/// A cursor over Thrift compact-protocol bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn byte(&mut self) -> Result<u8, Fault> {
        let byte = *self.bytes.get(self.at).ok_or(Fault::Short)?;
        self.at += 1;
        Ok(byte)
    }

    fn skip(&mut self, count: u64) -> Result<(), Fault> {
        let count = usize::try_from(count).map_err(|_| Fault::Short)?;
        if count > self.left() {
            return Err(Fault::Short);
        }
        self.at += count;
        Ok(())
    }

    /// An unsigned LEB128 varint of at most 10 bytes.
    fn varint(&mut self) -> Result<u64, Fault> {
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            let byte = self.byte()?;
            value |= u64::from(byte & 0x7f).checked_shl(shift).unwrap_or(0);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(Fault::Malformed(
            "holds a varint longer than 10 bytes".to_string(),
        ))
    }

    /// A zigzag varint that must fit in an `i32`.
    fn i32(&mut self) -> Result<i32, Fault> {
        let raw = self.varint()?;
        let value = (raw >> 1) as i64 ^ -((raw & 1) as i64);
        i32::try_from(value).map_err(|_| Fault::Malformed(format!("holds an i32 of {value}")))
    }

    /// The next field's id and type, or `None` at the struct's stop byte.
    fn field(&mut self, last_id: &mut i16) -> Result<Option<(i16, u8)>, Fault> {
        let header = self.byte()?;
        if header == 0 {
            return Ok(None);
        }
        let kind = header & 0x0f;
        let delta = header >> 4;
        let id = if delta == 0 {
            let raw = self.varint()?;
            let value = (raw >> 1) as i64 ^ -((raw & 1) as i64);
            i16::try_from(value)
                .map_err(|_| Fault::Malformed(format!("holds a field id of {value}")))?
        } else {
            last_id.wrapping_add(i16::from(delta))
        };
        *last_id = id;
        Ok(Some((id, kind)))
    }

    /// Skips a struct field's value: a boolean field holds its value in its type.
    fn skip_field(&mut self, kind: u8, depth: u32) -> Result<(), Fault> {
        match kind {
            wire::BOOL_TRUE | wire::BOOL_FALSE => Ok(()),
            _ => self.skip_value(kind, depth),
        }
    }

    /// Skips a value of `kind`; a boolean here (a list, set or map element) takes a byte.
    fn skip_value(&mut self, kind: u8, depth: u32) -> Result<(), Fault> {
        if depth == 0 {
            return Err(Fault::Malformed(format!(
                "nests deeper than {MAX_DEPTH} levels"
            )));
        }
        match kind {
            wire::BOOL_TRUE | wire::BOOL_FALSE | wire::BYTE => self.skip(1),
            wire::I16 | wire::I32 | wire::I64 => self.varint().map(drop),
            wire::DOUBLE => self.skip(8),
            wire::UUID => self.skip(16),
            wire::BINARY => {
                let length = self.varint()?;
                self.skip(length)
            }
            wire::LIST | wire::SET => {
                let header = self.byte()?;
                if header == 0 {
                    // Some writers give an empty list no element type.
                    return Ok(());
                }
                let count = match header >> 4 {
                    15 => self.varint()?,
                    count => u64::from(count),
                };
                self.elements(count, 1)?;
                for _ in 0..count {
                    self.skip_value(header & 0x0f, depth - 1)?;
                }
                Ok(())
            }
            wire::MAP => {
                let count = self.varint()?;
                if count == 0 {
                    return Ok(());
                }
                let kinds = self.byte()?;
                self.elements(count, 2)?;
                for _ in 0..count {
                    self.skip_value(kinds >> 4, depth - 1)?;
                    self.skip_value(kinds & 0x0f, depth - 1)?;
                }
                Ok(())
            }
            wire::STRUCT => {
                let mut last_id = 0;
                while let Some((_, field_kind)) = self.field(&mut last_id)? {
                    self.skip_field(field_kind, depth - 1)?;
                }
                Ok(())
            }
            other => Err(Fault::Malformed(format!(
                "holds a value of Thrift type {other}"
            ))),
        }
    }

    /// Refuses `count` elements of `bytes_each` bytes at least where fewer bytes are left.
    fn elements(&self, count: u64, bytes_each: u64) -> Result<(), Fault> {
        if count.saturating_mul(bytes_each) > self.left() as u64 {
            return Err(Fault::Short);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header: type (1), uncompressed size (2), compressed size (3), then `extra` fields
    /// (given whole, with their field headers), then stop.
    fn header(compressed: u8, extra: &[u8]) -> Vec<u8> {
        let mut bytes = vec![0x15, 0x00, 0x15, 2 * compressed, 0x15, 2 * compressed];
        bytes.extend_from_slice(extra);
        bytes.push(0);
        bytes
    }

    #[test]
    fn a_plain_header_gives_its_length_and_page_size() {
        let bytes = header(40, &[]);
        assert_eq!(
            parse_header(&bytes),
            Ok(Header {
                length: 7,
                compressed_page_size: 40
            })
        );
    }

    #[test]
    fn a_list_of_booleans_takes_a_byte_each_and_a_huge_count_is_refused_without_looping() {
        // Field 4 (delta 1), a list of three booleans: one byte each.
        let bytes = header(40, &[0x19, 0x31, 1, 2, 1]);
        assert_eq!(parse_header(&bytes).map(|h| h.length), Ok(12));
        // The same list claiming 2^31 - 1 elements: too many for the bytes, at once.
        let bytes = header(40, &[0x19, 0xf1, 0xff, 0xff, 0xff, 0xff, 0x07, 1, 2]);
        assert_eq!(parse_header(&bytes), Err(Fault::Short));
    }

    #[test]
    fn a_map_counts_two_bytes_an_entry_and_a_struct_field_boolean_none() {
        // Field 4: a map of one i32 -> bool entry; field 5: a struct holding a bool field.
        let extra = [0x1b, 0x01, 0x51, 0x02, 0x01, 0x1c, 0x11, 0x00];
        let bytes = header(9, &extra);
        assert_eq!(parse_header(&bytes).map(|h| h.length), Ok(15));
    }

    #[test]
    fn nesting_past_the_limit_and_a_missing_page_size_are_malformed() {
        let mut extra = vec![0x1c];
        extra.extend(std::iter::repeat_n(0x1c, MAX_DEPTH as usize + 1));
        let bytes = header(1, &extra);
        assert!(matches!(
            parse_header(&bytes),
            Err(Fault::Malformed(reason)) if reason.contains("deeper than 64")
        ));
        assert!(matches!(
            parse_header(&[0x15, 0x00, 0x00]),
            Err(Fault::Malformed(reason)) if reason.contains("no compressed page size")
        ));
    }

    #[test]
    fn a_header_longer_than_the_first_window_is_read_with_a_wider_one() {
        // A binary field of 3,000 bytes (statistics of that size exist) after the sizes.
        let mut extra = vec![0x18, 0xb8, 0x17];
        extra.extend(std::iter::repeat_n(7u8, 3000));
        let bytes = bytes::Bytes::from(header(5, &extra));
        let end = bytes.len() as u64;
        let read = read_header(&bytes, 0, end).expect("a long header");
        assert_eq!(read.length, end);
        assert_eq!(
            read_header(&bytes, 0, end - 1).expect_err("cut short"),
            "runs past the end of its column chunk"
        );
    }
}
