//! A Megatron `.idx` read front to back a chunk at a time (a local file, an object through the
//! cache tier, or bytes in memory) and checked as it goes: nothing of its size is held but the
//! documents' starts, and those only when asked for, so a single-prefix corpus of hundreds of
//! millions of documents (an index of several GiB) opens in the memory its starts take.

use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::error::{Error, Result, TokenError};
use crate::storage::ByteRanges;
use crate::token_dtype::TokenDtype;

/// The magic an index file starts with.
pub const MEGATRON_INDEX_MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";

/// The header's bytes: the magic, the version, the dtype code and the two counts.
const HEADER_BYTES: u64 = 9 + 8 + 1 + 8 + 8;

/// Elements of one array read at a time: 4 MiB of sequence lengths, 8 MiB of pointers.
const CHUNK_ELEMENTS: u64 = 1 << 20;

/// A Megatron `.idx`, read and checked: its dtype and counts, and the documents' starts when
/// they were asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MegatronIndex {
    /// The dtype of the `.bin`'s tokens.
    pub dtype: TokenDtype,
    sequences: u64,
    documents: u64,
    tokens: u64,
    /// The token offset where each document starts, and the token count last.
    document_starts: Option<Vec<u64>>,
}

/// Where an index's bytes are read from, a range at a time.
pub(crate) trait IndexBytes {
    /// Its length in bytes.
    fn len(&self) -> u64;

    /// The bytes of `range`, which lies within the length.
    fn read(&self, range: Range<u64>) -> Result<Vec<u8>>;
}

/// An index in memory.
pub(crate) struct InMemory<'a>(pub(crate) &'a [u8]);

impl IndexBytes for InMemory<'_> {
    fn len(&self) -> u64 {
        self.0.len() as u64
    }

    fn read(&self, range: Range<u64>) -> Result<Vec<u8>> {
        let at = |offset: u64| usize::try_from(offset).unwrap_or(usize::MAX);
        Ok(self
            .0
            .get(at(range.start)..at(range.end))
            .unwrap_or_default()
            .to_vec())
    }
}

/// An index in a local file, read by positioned reads.
struct LocalIndex<'a> {
    file: std::fs::File,
    len: u64,
    path: &'a Path,
}

impl IndexBytes for LocalIndex<'_> {
    fn len(&self) -> u64 {
        self.len
    }

    fn read(&self, range: Range<u64>) -> Result<Vec<u8>> {
        let len = usize::try_from(range.end - range.start).unwrap_or(usize::MAX);
        let mut bytes = vec![0; len];
        self.file
            .read_exact_at(&mut bytes, range.start)
            .map_err(|source| Error::io(self.path, source))?;
        Ok(bytes)
    }
}

/// An index in an object of a store, read by ranges through the cache tier.
pub(super) struct RemoteIndex<'a>(pub(super) &'a dyn ByteRanges);

impl IndexBytes for RemoteIndex<'_> {
    fn len(&self) -> u64 {
        self.0.size()
    }

    fn read(&self, range: Range<u64>) -> Result<Vec<u8>> {
        Ok(self.0.read_ranges(&[range])?.pop().unwrap_or_default())
    }
}

pub(super) fn refused(path: &Path, problem: impl Into<String>) -> Error {
    TokenError::MegatronIndex {
        path: path.to_path_buf(),
        problem: problem.into(),
    }
    .into()
}

fn truncated(path: &Path, len: u64, what: &str) -> Error {
    refused(
        path,
        format!("ends at byte {len} inside {what} (the file is truncated)"),
    )
}

/// Reads little-endian fields off the front of an index's header, naming the field that runs
/// past the end.
struct Fields<'a> {
    bytes: &'a [u8],
    at: usize,
    path: &'a Path,
}

impl<'a> Fields<'a> {
    fn take(&mut self, len: usize, what: &str) -> Result<&'a [u8]> {
        let field = self
            .bytes
            .get(self.at..self.at + len)
            .ok_or_else(|| truncated(self.path, self.bytes.len() as u64, what))?;
        self.at += len;
        Ok(field)
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        let bytes = self.take(8, what)?;
        Ok(u64::from_le_bytes(bytes.try_into().unwrap_or([0; 8])))
    }
}

/// One array of the index, its elements read in order a chunk at a time.
struct Elements<'a> {
    bytes: &'a dyn IndexBytes,
    path: &'a Path,
    /// The next byte to read into the buffer, and the array's end.
    next_at: u64,
    end: u64,
    /// Bytes an element takes: 4 (`i32`) or 8 (`i64`).
    size: usize,
    chunk_bytes: u64,
    buffer: Vec<u8>,
    taken: usize,
}

impl<'a> Elements<'a> {
    /// The array `span` of `bytes` (which holds it) of elements of `size` bytes, read `chunk`
    /// elements at a time.
    fn new(
        bytes: &'a dyn IndexBytes,
        path: &'a Path,
        span: Range<u64>,
        size: usize,
        chunk: u64,
    ) -> Self {
        Elements {
            bytes,
            path,
            next_at: span.start,
            end: span.end,
            size,
            chunk_bytes: chunk.max(1) * size as u64,
            buffer: Vec::new(),
            taken: 0,
        }
    }

    /// The next element as a signed integer (an `i32` or an `i64`); `None` past the last.
    fn next(&mut self) -> Result<Option<i64>> {
        if self.taken == self.buffer.len() {
            if self.next_at >= self.end {
                return Ok(None);
            }
            let end = self.end.min(self.next_at.saturating_add(self.chunk_bytes));
            self.buffer = self.bytes.read(self.next_at..end)?;
            if self.buffer.len() as u64 != end - self.next_at {
                // The file shrank since its length was taken.
                return Err(truncated(self.path, self.next_at, "an array"));
            }
            self.next_at = end;
            self.taken = 0;
        }
        let Some(field) = self.buffer.get(self.taken..self.taken + self.size) else {
            return Err(truncated(self.path, self.next_at, "an array"));
        };
        self.taken += self.size;
        Ok(Some(match field.len() {
            4 => i64::from(i32::from_le_bytes(field.try_into().unwrap_or([0; 4]))),
            _ => i64::from_le_bytes(field.try_into().unwrap_or([0; 8])),
        }))
    }
}

/// Where an array of `count` elements of `size` bytes starting at `at` ends, checked against
/// the file's `len`.
fn array_end(path: &Path, len: u64, at: u64, count: u64, size: u64, what: &str) -> Result<u64> {
    let end = count
        .checked_mul(size)
        .and_then(|bytes| at.checked_add(bytes))
        .ok_or_else(|| refused(path, format!("{what}: {count} entries do not fit")))?;
    if end > len {
        return Err(truncated(path, len, what));
    }
    Ok(end)
}

impl MegatronIndex {
    /// Parses the bytes of the index `path` (named in errors), checks it holds together and
    /// reads its documents' starts.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<MegatronIndex> {
        MegatronIndex::read_from(&InMemory(bytes), path, true, CHUNK_ELEMENTS)
    }

    /// Reads and checks the index file `path`, with its documents' starts when
    /// `document_starts` (a `u64` each, held; the rest is read a chunk at a time).
    pub fn read(path: &Path, document_starts: bool) -> Result<MegatronIndex> {
        crate::referenced_files::check_data_file(path)?;
        let file = std::fs::File::open(path).map_err(|source| Error::io(path, source))?;
        let len = file
            .metadata()
            .map_err(|source| Error::io(path, source))?
            .len();
        let local = LocalIndex { file, len, path };
        MegatronIndex::read_from(&local, path, document_starts, CHUNK_ELEMENTS)
    }

    /// Reads and checks the index object `object` (named `path` in errors) through the cache
    /// tier, with its documents' starts when `document_starts`.
    pub(super) fn read_remote(
        object: &RemoteIndex<'_>,
        path: &Path,
        document_starts: bool,
    ) -> Result<MegatronIndex> {
        MegatronIndex::read_from(object, path, document_starts, CHUNK_ELEMENTS)
    }

    /// Reads and checks the index in `bytes`, `chunk` elements of an array at a time (the
    /// tests' small chunks cross their boundaries).
    pub(crate) fn read_from(
        bytes: &dyn IndexBytes,
        path: &Path,
        document_starts: bool,
        chunk: u64,
    ) -> Result<MegatronIndex> {
        let len = bytes.len();
        let head = bytes.read(0..len.min(HEADER_BYTES))?;
        let mut fields = Fields {
            bytes: &head,
            at: 0,
            path,
        };
        if fields.take(MEGATRON_INDEX_MAGIC.len(), "the magic")? != MEGATRON_INDEX_MAGIC {
            return Err(refused(
                path,
                "does not start with MMIDIDX: not a Megatron index file",
            ));
        }
        let version = fields.u64("the version")?;
        if version != 1 {
            return Err(refused(
                path,
                format!("is version {version}; version 1 is read"),
            ));
        }
        let dtype = dtype_of(fields.take(1, "the dtype code")?[0], path)?;
        let sequences = fields.u64("the sequence count")?;
        let entries = fields.u64("the document count")?;
        let pointers_at = array_end(
            path,
            len,
            HEADER_BYTES,
            sequences,
            4,
            "the sequence lengths",
        )?;
        let starts_at = array_end(
            path,
            len,
            pointers_at,
            sequences,
            8,
            "the sequence pointers",
        )?;
        let end = array_end(path, len, starts_at, entries, 8, "the document index")?;
        let array = |span: Range<u64>, size: usize| Elements::new(bytes, path, span, size, chunk);
        // The document index first: the sequences where documents start, from 0, ascending,
        // the sequence count last. Kept (to become token offsets) only when asked for.
        let not_running = || {
            refused(
                path,
                format!(
                    "its document index does not run from sequence 0 up to the sequence count \
                     {sequences}"
                ),
            )
        };
        let mut starts = Vec::new();
        let mut last = None;
        let mut documents = array(starts_at..end, 8);
        while let Some(start) = documents.next()? {
            let start = u64::try_from(start).map_err(|_| not_running())?;
            let ordered = match last {
                None => start == 0,
                Some(last) => last <= start && start <= sequences,
            };
            if !ordered {
                return Err(not_running());
            }
            last = Some(start);
            if document_starts {
                starts.push(start);
            }
        }
        if last != Some(sequences) {
            return Err(not_running());
        }
        // The sequences lie end to end: each pointer is the bytes of those before it. Each
        // kept document start becomes the token offset of its sequence.
        let size = dtype.size() as u64;
        let mut lengths = array(HEADER_BYTES..pointers_at, 4);
        let mut pointers = array(pointers_at..starts_at, 8);
        let mut tokens = 0u64;
        let mut next_start = 0;
        for k in 0..sequences {
            let (Some(length), Some(pointer)) = (lengths.next()?, pointers.next()?) else {
                return Err(truncated(path, len, "the sequence pointers"));
            };
            let length = u64::try_from(length)
                .map_err(|_| refused(path, format!("sequence {k} has length {length}")))?;
            let expected = tokens.saturating_mul(size);
            if u64::try_from(pointer).ok() != Some(expected) {
                return Err(refused(
                    path,
                    format!(
                        "sequence {k} starts at byte {pointer} of the .bin, not {expected} where \
                         the sequence before it ends"
                    ),
                ));
            }
            while starts.get(next_start) == Some(&k) {
                starts[next_start] = tokens;
                next_start += 1;
            }
            tokens = tokens
                .checked_add(length)
                .filter(|tokens| tokens.checked_mul(size).is_some())
                .ok_or_else(|| refused(path, "counts more tokens than a .bin could hold"))?;
        }
        for start in starts.iter_mut().skip(next_start) {
            *start = tokens;
        }
        Ok(MegatronIndex {
            dtype,
            sequences,
            documents: entries - 1,
            tokens,
            document_starts: document_starts.then_some(starts),
        })
    }

    /// Tokens in the `.bin` the index describes.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Sequences the index holds.
    pub fn sequences(&self) -> u64 {
        self.sequences
    }

    /// Documents the index holds.
    pub fn documents(&self) -> u64 {
        self.documents
    }

    /// The token offset in the `.bin` where each document starts, and the token count last;
    /// `None` when they were not read (or were handed to the token file they mark).
    pub fn document_starts(&self) -> Option<&[u64]> {
        self.document_starts.as_deref()
    }

    /// The documents' starts, taken out of the index.
    pub(super) fn take_document_starts(&mut self) -> Option<Vec<u64>> {
        self.document_starts.take()
    }
}

/// The token dtype of the index's dtype code; other dtypes refused by name.
fn dtype_of(code: u8, path: &Path) -> Result<TokenDtype> {
    match code {
        8 => Ok(TokenDtype::Uint16),
        4 => Ok(TokenDtype::Uint32),
        1 | 2 | 3 | 5 | 6 | 7 => {
            let name = ["uint8", "int8", "int16", "", "int64", "float64", "float32"]
                [usize::from(code - 1)];
            Err(refused(
                path,
                format!(
                    "holds {name} tokens; token windows read uint16 (code 8) or int32 (code 4)"
                ),
            ))
        }
        other => Err(refused(path, format!("has the unknown dtype code {other}"))),
    }
}
