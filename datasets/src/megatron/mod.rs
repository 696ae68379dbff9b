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
//! The index is read front to back a chunk at a time and checked as it goes (`index.rs`), never
//! whole: what stays is its counts, and each document's start when the pipeline asks for
//! document boundaries. The same corpus in a bucket (`s3://BUCKET/PREFIX.bin` beside
//! `PREFIX.idx`) is read through the cache tier ([`open_remote_megatron`]): the index and the
//! windows by ranges.
//!
//! Token ids are read as uint16 (code 8) or as int32 (code 4, read as uint32: the same bits for
//! every id a vocabulary holds); other dtypes are refused by name. The sequences must lie end to
//! end in the `.bin` (as the writer puts them), and the `.bin` must hold exactly the tokens the
//! index counts: a truncated `.idx`, a `.bin` shorter or longer than its index says, and an
//! index that contradicts itself are errors naming the file.

mod index;

use std::path::{Path, PathBuf};

use crate::error::{Error, Result, TokenError};
use crate::token_dtype::TokenDtype;
use crate::token_file::TokenFile;
#[cfg(feature = "fuzzing")]
pub(crate) use index::InMemory;
use index::{refused, RemoteIndex};
pub use index::{MegatronIndex, MEGATRON_INDEX_MAGIC};

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
/// that one. With `document_starts`, the windows know where each document starts
/// ([`TokenFile::with_document_starts`]; the index hands its starts over). Fails, naming the
/// file, when the `.idx` is truncated or contradicts itself, or the `.bin` holds other than the
/// tokens the index counts.
pub fn open_megatron(
    path: &Path,
    dtype: Option<TokenDtype>,
    seq_len: u32,
    document_starts: bool,
) -> Result<(TokenFile, MegatronIndex)> {
    let (bin, idx) = megatron_pair(path).ok_or_else(|| Error::RootNotFound(path.to_path_buf()))?;
    let mut index = MegatronIndex::read(&idx, document_starts)?;
    check_asked_dtype(&idx, &index, dtype)?;
    let bytes = std::fs::metadata(&bin)
        .map_err(|source| Error::io(&bin, source))?
        .len();
    check_bin_size(&bin, bytes, &index, &idx)?;
    let tokens = TokenFile::open(&bin, index.dtype, seq_len)?;
    Ok((with_starts(tokens, &mut index)?, index))
}

/// Opens the object `uri` (`s3://BUCKET/PREFIX.bin`) as a Megatron corpus when its index
/// `PREFIX.idx` lies beside it, read through `cache`: token windows of the index's dtype (which
/// `dtype`, when given, must be), the object's size checked against the index, the documents'
/// starts as [`open_megatron`] takes them. `None` when there is no index beside it (a flat
/// token file).
pub fn open_remote_megatron(
    uri: &str,
    cache: std::sync::Arc<crate::ObjectCache>,
    dtype: Option<TokenDtype>,
    seq_len: u32,
    document_starts: bool,
) -> Result<Option<(TokenFile, MegatronIndex)>> {
    use crate::storage::list_remote;
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
    let mut index = MegatronIndex::read_remote(&RemoteIndex(&object), &idx, document_starts)?;
    check_asked_dtype(&idx, &index, dtype)?;
    let tokens = TokenFile::open_remote(uri, cache, Some(index.dtype), seq_len)?;
    let bytes = tokens.tokens() * index.dtype.size() as u64;
    check_bin_size(tokens.path(), bytes, &index, &idx)?;
    Ok(Some((with_starts(tokens, &mut index)?, index)))
}

/// `tokens` with the document starts `index` read, handed over, when it read them.
fn with_starts(tokens: TokenFile, index: &mut MegatronIndex) -> Result<TokenFile> {
    match index.take_document_starts() {
        Some(starts) => tokens.with_document_starts(starts),
        None => Ok(tokens),
    }
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
