//! Megatron's indexed token corpora (`PREFIX.bin` + `PREFIX.idx`, what Megatron-LM, NeMo and
//! GPT-NeoX pretraining keep): the `.idx` read and checked, and the `.bin` served as token
//! windows of the dtype the `.idx` names, exactly as a flat token file of that dtype is
//! ([`TokenFile`]), with the documents' starts known from the index.
//!
//! The `.idx` layout (little-endian), as Megatron's index writer lays it out:
//! - the magic `MMIDIDX\0\0` (9 bytes), the version (`u64`, 1), the dtype code (`u8`: 1 uint8,
//!   2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16);
//! - the sequence count `S` (`u64`) and the document index's length `D` (`u64`);
//! - `S` sequence lengths in tokens (`i32`), `S` byte offsets of the sequences in the `.bin`
//!   (`i64`), and `D` sequence indices where documents start (`i64`, from 0, the last `S`).
//!
//! The same corpus in a bucket (`s3://BUCKET/PREFIX.bin` beside `PREFIX.idx`) is read through
//! the cache tier ([`open_remote_megatron`]): the index whole, the windows by ranges.
//!
//! Token ids are read as uint16 (code 8) or as int32 (code 4, read as uint32: the same bits for
//! every id a vocabulary holds); other dtypes are refused by name. The sequences must lie end to
//! end in the `.bin` (as the writer puts them), and the `.bin` must hold exactly the tokens the
//! index counts: a truncated `.idx`, a `.bin` shorter or longer than its index says, and an
//! index that contradicts itself are errors naming the file.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result, TokenError};
use crate::token_dtype::TokenDtype;
use crate::token_file::TokenFile;

/// The magic an index file starts with.
pub const MEGATRON_INDEX_MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";

/// The largest index read: about 100 million sequences.
const MAX_INDEX_BYTES: u64 = 2 << 30;

/// A Megatron `.idx`, read and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MegatronIndex {
    /// The dtype of the `.bin`'s tokens.
    pub dtype: TokenDtype,
    /// Each sequence's length in tokens.
    pub sequence_lengths: Vec<u32>,
    /// The sequence each document starts at (from 0; the last is the sequence count).
    pub document_indices: Vec<u64>,
}

fn refused(path: &Path, problem: impl Into<String>) -> Error {
    TokenError::MegatronIndex {
        path: path.to_path_buf(),
        problem: problem.into(),
    }
    .into()
}

/// Reads little-endian fields off the front of an index's bytes, naming the field that runs
/// past the end.
struct Fields<'a> {
    bytes: &'a [u8],
    at: usize,
    path: &'a Path,
}

impl<'a> Fields<'a> {
    fn take(&mut self, len: usize, what: &str) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(len)
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| {
                refused(
                    self.path,
                    format!(
                        "ends at byte {} inside {what} (the file is truncated)",
                        self.bytes.len()
                    ),
                )
            })?;
        let field = &self.bytes[self.at..end];
        self.at = end;
        Ok(field)
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        let bytes = self.take(8, what)?;
        Ok(u64::from_le_bytes(bytes.try_into().unwrap_or([0; 8])))
    }

    /// `count` elements of `size` bytes, refused before any allocation when the file cannot hold
    /// them.
    fn array(&mut self, count: u64, size: usize, what: &str) -> Result<&'a [u8]> {
        let len = usize::try_from(count)
            .ok()
            .and_then(|count| count.checked_mul(size))
            .ok_or_else(|| refused(self.path, format!("{what}: {count} entries do not fit")))?;
        self.take(len, what)
    }
}

impl MegatronIndex {
    /// Parses the bytes of the index `path` (named in errors) and checks it holds together.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<MegatronIndex> {
        let mut fields = Fields { bytes, at: 0, path };
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
        let code = fields.take(1, "the dtype code")?[0];
        let dtype = match code {
            8 => TokenDtype::Uint16,
            4 => TokenDtype::Uint32,
            1 | 2 | 3 | 5 | 6 | 7 => {
                let name = ["uint8", "int8", "int16", "", "int64", "float64", "float32"]
                    [usize::from(code - 1)];
                return Err(refused(
                    path,
                    format!(
                        "holds {name} tokens; token windows read uint16 (code 8) or int32 \
                         (code 4)"
                    ),
                ));
            }
            other => return Err(refused(path, format!("has the unknown dtype code {other}"))),
        };
        let sequences = fields.u64("the sequence count")?;
        let documents = fields.u64("the document count")?;
        let lengths = fields.array(sequences, 4, "the sequence lengths")?;
        let pointers = fields.array(sequences, 8, "the sequence pointers")?;
        let starts = fields.array(documents, 8, "the document index")?;
        let sequence_lengths = lengths
            .chunks_exact(4)
            .enumerate()
            .map(|(k, length)| {
                let length = i32::from_le_bytes(length.try_into().unwrap_or([0; 4]));
                u32::try_from(length)
                    .map_err(|_| refused(path, format!("sequence {k} has length {length}")))
            })
            .collect::<Result<Vec<u32>>>()?;
        // The sequences lie end to end: each pointer is the bytes of those before it.
        let size = dtype.size() as u64;
        let mut expected = 0u64;
        for (k, (pointer, &length)) in pointers.chunks_exact(8).zip(&sequence_lengths).enumerate() {
            let pointer = i64::from_le_bytes(pointer.try_into().unwrap_or([0; 8]));
            if u64::try_from(pointer).ok() != Some(expected) {
                return Err(refused(
                    path,
                    format!(
                        "sequence {k} starts at byte {pointer} of the .bin, not {expected} where \
                         the sequence before it ends"
                    ),
                ));
            }
            expected += u64::from(length) * size;
        }
        let document_indices = starts
            .chunks_exact(8)
            .map(|start| i64::from_le_bytes(start.try_into().unwrap_or([0; 8])))
            .map(|start| u64::try_from(start).unwrap_or(u64::MAX))
            .collect::<Vec<u64>>();
        let ordered = document_indices.windows(2).all(|pair| pair[0] <= pair[1]);
        if document_indices.first() != Some(&0)
            || document_indices.last() != Some(&sequences)
            || !ordered
        {
            return Err(refused(
                path,
                format!(
                    "its document index does not run from sequence 0 up to the sequence count \
                     {sequences}"
                ),
            ));
        }
        Ok(MegatronIndex {
            dtype,
            sequence_lengths,
            document_indices,
        })
    }

    /// Reads and parses the index file `path`.
    pub fn read(path: &Path) -> Result<MegatronIndex> {
        let len = std::fs::metadata(path)
            .map_err(|source| Error::io(path, source))?
            .len();
        if len > MAX_INDEX_BYTES {
            return Err(refused(
                path,
                format!(
                    "is {len} bytes, over the {MAX_INDEX_BYTES} read: split the corpus into \
                     several prefixes, read as a blend (stoker.megatron_blend)"
                ),
            ));
        }
        crate::referenced_files::check_data_file(path)?;
        let bytes = std::fs::read(path).map_err(|source| Error::io(path, source))?;
        MegatronIndex::parse(&bytes, path)
    }

    /// Tokens in the `.bin` the index describes.
    pub fn tokens(&self) -> u64 {
        self.sequence_lengths.iter().map(|&l| u64::from(l)).sum()
    }

    /// Documents the index holds.
    pub fn documents(&self) -> usize {
        self.document_indices.len().saturating_sub(1)
    }

    /// The token offset in the `.bin` where each document starts, and the token count last.
    pub fn document_starts(&self) -> Vec<u64> {
        let mut sequence_starts = Vec::with_capacity(self.sequence_lengths.len() + 1);
        let mut at = 0u64;
        sequence_starts.push(at);
        for &length in &self.sequence_lengths {
            at += u64::from(length);
            sequence_starts.push(at);
        }
        self.document_indices
            .iter()
            .map(|&sequence| {
                usize::try_from(sequence)
                    .ok()
                    .and_then(|k| sequence_starts.get(k))
                    .copied()
                    .unwrap_or(at)
            })
            .collect()
    }
}

/// Refuses a `.bin` (`path`, of `bytes`) that does not hold exactly the tokens its index `idx`
/// counts.
fn check_bin_size(path: &Path, bytes: u64, index: &MegatronIndex, idx: &Path) -> Result<()> {
    let expected = index.tokens() * index.dtype.size() as u64;
    if bytes != expected {
        return Err(TokenError::MegatronBinSize {
            path: path.to_path_buf(),
            bytes,
            expected,
            index: idx.to_path_buf(),
        }
        .into());
    }
    Ok(())
}

/// Refuses a dtype asked for that is not the one the index `idx` names.
fn check_asked_dtype(idx: &Path, index: &MegatronIndex, asked: Option<TokenDtype>) -> Result<()> {
    match asked {
        Some(asked) if asked != index.dtype => Err(refused(
            idx,
            format!(
                "names {} tokens, but {} was asked for",
                index.dtype.name(),
                asked.name()
            ),
        )),
        _ => Ok(()),
    }
}

/// The `.bin` and `.idx` of a Megatron corpus named by either file or by its prefix; `None`
/// when `path` names neither an existing pair nor a prefix of one.
pub fn megatron_pair(path: &Path) -> Option<(PathBuf, PathBuf)> {
    let text = path.to_string_lossy();
    let prefix = text
        .strip_suffix(".bin")
        .or_else(|| text.strip_suffix(".idx"))
        .unwrap_or(&text);
    let bin = PathBuf::from(format!("{prefix}.bin"));
    let idx = PathBuf::from(format!("{prefix}.idx"));
    (bin.is_file() && idx.is_file()).then_some((bin, idx))
}

/// Opens the Megatron corpus `path` names (its `.bin`, its `.idx` or its prefix) as token
/// windows of `seq_len + 1` tokens of the dtype the `.idx` names; `dtype`, when given, must be
/// that one. Fails, naming the file, when the `.idx` is truncated or contradicts itself, or the
/// `.bin` holds other than the tokens the index counts.
pub fn open_megatron(
    path: &Path,
    dtype: Option<TokenDtype>,
    seq_len: u32,
) -> Result<(TokenFile, MegatronIndex)> {
    let (bin, idx) = megatron_pair(path).ok_or_else(|| Error::RootNotFound(path.to_path_buf()))?;
    let index = MegatronIndex::read(&idx)?;
    check_asked_dtype(&idx, &index, dtype)?;
    let bytes = std::fs::metadata(&bin)
        .map_err(|source| Error::io(&bin, source))?
        .len();
    check_bin_size(&bin, bytes, &index, &idx)?;
    let tokens = TokenFile::open(&bin, index.dtype, seq_len)?;
    Ok((tokens, index))
}

/// Opens the object `uri` (`s3://BUCKET/PREFIX.bin`) as a Megatron corpus when its index
/// `PREFIX.idx` lies beside it, read through `cache`: token windows of the index's dtype (which
/// `dtype`, when given, must be), the object's size checked against the index. `None` when there
/// is no index beside it (a flat token file).
pub fn open_remote_megatron(
    uri: &str,
    cache: std::sync::Arc<crate::ObjectCache>,
    dtype: Option<TokenDtype>,
    seq_len: u32,
) -> Result<Option<(TokenFile, MegatronIndex)>> {
    use crate::storage::{list_remote, ByteRanges};
    let Some(prefix) = uri.strip_suffix(".bin") else {
        return Ok(None);
    };
    let idx_uri = format!("{prefix}.idx");
    let named = |name: &str| idx_uri.ends_with(&format!("/{name}"));
    let mut listed = match list_remote(&idx_uri, &cache, &named, "Megatron index") {
        Ok((_, objects)) => objects,
        Err(Error::NoRemoteObjects { .. }) => return Ok(None),
        Err(error) => return Err(error),
    };
    let Some(object) = listed.pop() else {
        return Ok(None);
    };
    let idx = PathBuf::from(&idx_uri);
    if object.size() > MAX_INDEX_BYTES {
        return Err(refused(
            &idx,
            format!(
                "is {} bytes, over the {MAX_INDEX_BYTES} read: split the corpus into several \
                 prefixes, read as a blend (stoker.megatron_blend)",
                object.size()
            ),
        ));
    }
    let bytes = object
        .read_ranges(std::slice::from_ref(&(0..object.size())))?
        .pop()
        .unwrap_or_default();
    let index = MegatronIndex::parse(&bytes, &idx)?;
    check_asked_dtype(&idx, &index, dtype)?;
    let tokens = TokenFile::open_remote(uri, cache, Some(index.dtype), seq_len)?;
    let bytes = tokens.tokens() * index.dtype.size() as u64;
    check_bin_size(tokens.path(), bytes, &index, &idx)?;
    Ok(Some((tokens, index)))
}

/// Writes `documents` (each one sequence of token ids) as the Megatron corpus `prefix.bin` +
/// `prefix.idx` of `dtype`, laid out byte for byte as Megatron's writer lays them out: what the
/// tests and fixtures read back.
pub fn write_megatron_corpus(
    prefix: &Path,
    documents: &[Vec<u32>],
    dtype: TokenDtype,
) -> Result<(PathBuf, PathBuf)> {
    let bin = PathBuf::from(format!("{}.bin", prefix.display()));
    let idx = PathBuf::from(format!("{}.idx", prefix.display()));
    let mut data = Vec::new();
    for id in documents.iter().flatten() {
        match dtype {
            TokenDtype::Uint16 => {
                let id = u16::try_from(*id).map_err(|_| {
                    Error::InvalidArgument(format!("token {id} does not fit uint16"))
                })?;
                data.extend_from_slice(&id.to_le_bytes());
            }
            TokenDtype::Uint32 => data.extend_from_slice(&id.to_le_bytes()),
        }
    }
    let count = documents.len() as u64;
    let mut index = Vec::new();
    index.extend_from_slice(MEGATRON_INDEX_MAGIC);
    index.extend_from_slice(&1u64.to_le_bytes());
    index.push(match dtype {
        TokenDtype::Uint16 => 8,
        TokenDtype::Uint32 => 4,
    });
    index.extend_from_slice(&count.to_le_bytes());
    index.extend_from_slice(&(count + 1).to_le_bytes());
    for document in documents {
        let length = i32::try_from(document.len())
            .map_err(|_| Error::InvalidArgument("a document over 2^31 tokens".into()))?;
        index.extend_from_slice(&length.to_le_bytes());
    }
    let mut pointer = 0i64;
    for document in documents {
        index.extend_from_slice(&pointer.to_le_bytes());
        pointer += (document.len() * dtype.size()) as i64;
    }
    for start in 0..=count {
        index.extend_from_slice(&(start as i64).to_le_bytes());
    }
    std::fs::write(&bin, data).map_err(|source| Error::io(&bin, source))?;
    std::fs::write(&idx, index).map_err(|source| Error::io(&idx, source))?;
    Ok((bin, idx))
}

#[cfg(test)]
mod tests;
