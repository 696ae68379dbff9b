//! `TokenFile`: a flat little-endian array of token ids (nanoGPT / Megatron `.bin`), served as
//! fixed windows of `seq_len + 1` tokens.
//!
//! Window `i` holds tokens `[i * seq_len, i * seq_len + seq_len + 1)`: consecutive windows share
//! one token, so every token but the first is a training target exactly once per epoch (input
//! `window[..seq_len]`, target `window[1..]`, as nanoGPT's `get_batch` cuts them). The last
//! incomplete window is dropped.
//!
//! The same windows come from a local file or from one object at `s3://BUCKET/KEY`
//! ([`TokenFile::open_remote`]): the file's bytes are read by position (`file_bytes.rs`). A local
//! file's windows are copied out of a read-only memory map straight into the caller's buffer (one
//! copy, no system call per window); a file cut short under a running job gives an error naming
//! it ([`Error::FileChanged`]), from then on for every window, never SIGBUS and never zeros as
//! tokens: `mapped_file/` says how, and when it falls back to `pread`. An object's windows are
//! ranged GETs through the cache tier; opening one reads its listing only, and the windows a
//! batch reads next are fetched ahead ([`SampleSource::prefetch`]).

mod synthetic;

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use tracing::info;

use crate::cache_stats::CacheStats;
use crate::error::{Error, Result, TokenError};
use crate::file_bytes::FileBytes;
use crate::mapped_file::MappedFile;
use crate::sample_source::{SampleSource, TokenWindowShape};
use crate::storage::{list_remote, CachedObject, ObjectCache};
use crate::token_dtype::TokenDtype;

pub use synthetic::{write_synthetic_tokens, SyntheticTokensSpec};

/// Longest window (`seq_len`) a token file may be cut into; longer is refused as a likely
/// mistake (a window is one sample and lives in one batch row).
pub const MAX_SEQ_LEN: u32 = 1 << 24;

/// Whether `path` looks like a token file (`*.bin`), for picking a format automatically.
pub fn looks_like_token_file(path: &Path) -> bool {
    path.is_file()
        && path
            .extension()
            .is_some_and(|extension| extension.eq_ignore_ascii_case("bin"))
}

/// Bytes of a token file's head [`TokenFile::wider_ids`] looks at: 64 KiB.
const DTYPE_PROBE_BYTES: u64 = 64 << 10;

/// Highest high half (a uint32's upper 16 bits) a uint32 id of a vocabulary in use has: ids
/// below 1,048,576 (Llama 3's 128,256, Qwen's 151,646, Gemma's 256,000 and beyond).
const UINT32_HIGH_HALF_MAX: u16 = 15;

/// Ids wider than the uint16 a file's name implies, found in its head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WiderIds {
    /// 32-bit ids (a vocabulary past 65,536, or int32/uint32 arrays).
    Uint32,
    /// 64-bit ids: NumPy's default integer (`np.array(ids).tofile(...)`).
    Int64,
}

/// Whether `head`, little-endian 16-bit values, reads as ids `width` values wide (2: 32-bit,
/// 4: 64-bit): every value after an id's first of each group at most [`UINT32_HIGH_HALF_MAX`]
/// (the second) or 0 (the rest), while at least half the first values are above it. Tokens of
/// one vocabulary read as uint16 are alike at every position, so both never hold at once for
/// them (a vocabulary of 16 ids fails the second); too short a head (under 256 groups) is
/// taken as uint16.
fn head_reads_as(head: &[u8], width: usize) -> bool {
    let values: Vec<u16> = head
        .chunks_exact(2)
        .map(|pair| u16::from_le_bytes([pair[0], pair[1]]))
        .collect();
    let count = values.len() / width;
    if count < 256 {
        return false;
    }
    let groups = || values.chunks_exact(width);
    let upper_parts_small = groups().all(|group| {
        group[1] <= UINT32_HIGH_HALF_MAX && group[2..].iter().all(|&value| value == 0)
    });
    let first_parts_vary = groups()
        .filter(|group| group[0] > UINT32_HIGH_HALF_MAX)
        .count()
        * 2
        >= count;
    upper_parts_small && first_parts_vary
}

/// The wider ids `head` holds, if it reads as any ([`head_reads_as`]): 64-bit first (a 64-bit
/// id's upper half is also a 32-bit pair's, so it could pass as 32-bit ids too).
fn head_holds_wider_ids(head: &[u8]) -> Option<WiderIds> {
    if head_reads_as(head, 4) {
        Some(WiderIds::Int64)
    } else if head_reads_as(head, 2) {
        Some(WiderIds::Uint32)
    } else {
        None
    }
}

/// A token array cut into windows of `seq_len + 1` tokens; one window is one sample. Reading
/// copies the window's bytes (little-endian, the file's dtype) out of a local file's map or
/// from the object through the cache tier.
pub struct TokenFile {
    /// The file, or the object's `s3://` URI.
    path: PathBuf,
    data: FileBytes,
    dtype: TokenDtype,
    seq_len: u32,
    tokens: u64,
    windows: u64,
    /// The token offset of each document start, ascending (a Megatron corpus's, when asked
    /// for: [`TokenFile::with_document_starts`]).
    document_starts: Option<Arc<[u64]>>,
    /// The copy in the cache tier the tokens lie in, locked while they are read (tokens
    /// written out of another format: [`TokenFile::over_copy`]).
    _copy: Option<CachedObject>,
}

impl TokenFile {
    /// Opens `path` as tokens of `dtype` cut into windows of `seq_len + 1` tokens.
    ///
    /// Fails when the file is missing, its length is not a multiple of the token size, or it
    /// holds fewer than `seq_len + 1` tokens (no complete window).
    pub fn open(path: &Path, dtype: TokenDtype, seq_len: u32) -> Result<TokenFile> {
        check_seq_len(seq_len)?;
        let file = match File::open(path) {
            Ok(file) => file,
            Err(source) if source.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::RootNotFound(path.to_path_buf()))
            }
            Err(source) => return Err(Error::io(path, source)),
        };
        crate::referenced_files::check_data_file(path)?;
        let bytes = file
            .metadata()
            .map_err(|source| Error::io(path, source))?
            .len();
        let data = FileBytes::Local(MappedFile::new(path, file, bytes));
        TokenFile::over(path.to_path_buf(), data, dtype, seq_len)
    }

    /// Opens the one object `uri` (`s3://BUCKET/KEY`) names as a token file, read through
    /// `cache`; `dtype` `None` takes it from the name (`*.u32.bin`: uint32, else uint16).
    /// Opening reads the listing only (the object's size gives the windows).
    ///
    /// Fails as [`TokenFile::open`] does, and when the listing holds no object or several.
    pub fn open_remote(
        uri: &str,
        cache: Arc<ObjectCache>,
        dtype: Option<TokenDtype>,
        seq_len: u32,
    ) -> Result<TokenFile> {
        check_seq_len(seq_len)?;
        let (location, mut objects) = list_remote(uri, &cache, &|_| true, "token file")?;
        if objects.len() > 1 {
            return Err(Error::InvalidUri {
                uri: location.uri(),
                reason: format!(
                    "{} objects are listed there; name one token file (s3://BUCKET/KEY.bin)",
                    objects.len()
                ),
            });
        }
        let Some(object) = objects.pop() else {
            return Err(Error::NoRemoteObjects {
                uri: location.uri(),
                what: "token file".into(),
            });
        };
        let path = PathBuf::from(object.uri());
        let dtype = dtype.unwrap_or_else(|| TokenDtype::from_file_name(&path));
        TokenFile::over(path, FileBytes::remote(object), dtype, seq_len)
    }

    /// The same windows with the corpus's document boundaries: `starts`, the token offset of
    /// each document's first token (a Megatron index's, [`crate::MegatronIndex::document_starts`]),
    /// ascending; offsets at or past the end mark no document.
    pub fn with_document_starts(mut self, starts: Vec<u64>) -> Result<TokenFile> {
        if starts.windows(2).any(|pair| pair[0] > pair[1]) {
            return Err(Error::InvalidArgument(format!(
                "{}: document starts must ascend",
                self.path.display()
            )));
        }
        self.document_starts = Some(starts.into());
        Ok(self)
    }

    /// The ids wider than uint16 this file holds when it was opened as uint16 by its name
    /// (a vocabulary past 65,536 written by another tool under a plain `*.bin` name, or NumPy's
    /// default int64): its first 64 KiB, read from the local map or the object, hold 32-bit or
    /// 64-bit ids of under 1,048,576 (see `head_reads_as`). Read as uint16, such a file trains
    /// on each id's parts as two or four tokens. Always `None` for a file opened as uint32.
    pub fn wider_ids(&self) -> Result<Option<WiderIds>> {
        if self.dtype != TokenDtype::Uint16 {
            return Ok(None);
        }
        let head = self
            .data
            .read_range(0..self.data.len().min(DTYPE_PROBE_BYTES))?;
        Ok(head_holds_wider_ids(&head))
    }

    /// The windows of `data`, checked.
    fn over(path: PathBuf, data: FileBytes, dtype: TokenDtype, seq_len: u32) -> Result<TokenFile> {
        let bytes = data.len();
        if bytes % dtype.size() as u64 != 0 {
            return Err(TokenError::TokenFileSize {
                path,
                bytes,
                dtype: dtype.name(),
            }
            .into());
        }
        let tokens = bytes / dtype.size() as u64;
        let window = u64::from(seq_len) + 1;
        if tokens < window {
            return Err(TokenError::TokenFileTooShort {
                path,
                tokens,
                window,
            }
            .into());
        }
        let windows = (tokens - 1) / u64::from(seq_len);
        info!(
            path = %path.display(),
            tokens,
            windows,
            dtype = dtype.name(),
            mapped = data.is_mapped(),
            remote = data.cache_stats().is_some(),
            "opened token file"
        );
        Ok(TokenFile {
            path,
            data,
            dtype,
            seq_len,
            tokens,
            windows,
            document_starts: None,
            _copy: None,
        })
    }

    /// The windows of the tokens in `copy`, a local file in the cache tier kept locked while
    /// they are read; messages name `name` (what the tokens were written out of).
    pub(crate) fn over_copy(
        name: PathBuf,
        copy: CachedObject,
        dtype: TokenDtype,
        seq_len: u32,
    ) -> Result<TokenFile> {
        check_seq_len(seq_len)?;
        let file = File::open(copy.path()).map_err(|source| Error::io(&name, source))?;
        let bytes = file
            .metadata()
            .map_err(|source| Error::io(&name, source))?
            .len();
        let data = FileBytes::Local(MappedFile::new(copy.path(), file, bytes));
        let mut tokens = TokenFile::over(name, data, dtype, seq_len)?;
        tokens._copy = Some(copy);
        Ok(tokens)
    }

    /// The file (an object's `s3://` URI, as a path).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The element type.
    pub fn dtype(&self) -> TokenDtype {
        self.dtype
    }

    /// Tokens per window minus one (the input length).
    pub fn seq_len(&self) -> u32 {
        self.seq_len
    }

    /// Tokens in the file.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Whether windows are copied out of a memory map; `false` when every read is a `pread`
    /// (a file of one page, or one that could not be mapped) or a ranged GET (an object).
    pub fn is_mapped(&self) -> bool {
        self.data.is_mapped()
    }

    /// Bytes of one window (`(seq_len + 1) * dtype size`).
    pub fn window_bytes(&self) -> usize {
        (self.seq_len as usize + 1) * self.dtype.size()
    }

    /// Reads window `index` into `dest` ([`TokenFile::window_bytes`] long).
    ///
    /// A local file cut short since it was opened gives [`Error::FileChanged`]: for this window
    /// when the cut reaches it, and for every window once a read of the map has met the cut.
    pub fn read_window_into(&self, index: u64, dest: &mut [u8]) -> Result<()> {
        let range = self.window_range(index)?;
        if dest.len() != self.window_bytes() {
            return Err(Error::InvalidArgument(format!(
                "a window of {} holds {} bytes, not {}",
                self.path.display(),
                self.window_bytes(),
                dest.len()
            )));
        }
        self.data.read_at(dest, range.start)
    }

    /// The byte range of window `index`.
    fn window_range(&self, index: u64) -> Result<Range<u64>> {
        if index >= self.windows {
            return Err(Error::IndexOutOfRange {
                index,
                len: self.windows,
            });
        }
        let start = index * u64::from(self.seq_len) * self.dtype.size() as u64;
        Ok(start..start + self.window_bytes() as u64)
    }
}

impl std::fmt::Debug for TokenFile {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("TokenFile")
            .field("path", &self.path)
            .field("dtype", &self.dtype)
            .field("seq_len", &self.seq_len)
            .field("tokens", &self.tokens)
            .field("windows", &self.windows)
            .finish()
    }
}

impl SampleSource for TokenFile {
    fn len(&self) -> u64 {
        self.windows
    }

    /// Token windows have no class: always 0.
    fn label(&self, _index: u64) -> i64 {
        0
    }

    fn describe(&self, index: u64) -> String {
        let start = index.saturating_mul(u64::from(self.seq_len));
        format!(
            "{}:tokens[{start}..{})",
            self.path.display(),
            start.saturating_add(u64::from(self.seq_len) + 1)
        )
    }

    fn read(&self, index: u64) -> Result<Vec<u8>> {
        self.data.read_range(self.window_range(index)?)
    }

    fn read_into(&self, index: u64, dest: &mut [u8]) -> Result<()> {
        self.read_window_into(index, dest)
    }

    fn class_names(&self) -> &[String] {
        &[]
    }

    fn token_windows(&self) -> Option<TokenWindowShape> {
        Some(TokenWindowShape {
            dtype: self.dtype,
            seq_len: self.seq_len,
        })
    }

    fn document_starts(&self) -> Option<&[u64]> {
        self.document_starts.as_deref()
    }

    /// An object's windows `indices` are fetched ahead; a local file's are read where they lie.
    fn prefetch(&self, indices: &[u64]) {
        let ranges = indices
            .iter()
            .filter_map(|&index| self.window_range(index).ok())
            .collect();
        self.data.read_ahead(ranges);
    }

    fn cache_stats(&self) -> Option<CacheStats> {
        self.data.cache_stats()
    }
}

/// Refuses a window length of 0 or past [`MAX_SEQ_LEN`].
fn check_seq_len(seq_len: u32) -> Result<()> {
    if seq_len == 0 || seq_len > MAX_SEQ_LEN {
        return Err(Error::InvalidArgument(format!(
            "token windows need seq_len in 1..={MAX_SEQ_LEN}, got {seq_len}"
        )));
    }
    Ok(())
}

/// What `stoker inspect` reports about a token file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenFileReport {
    /// Tokens in the file.
    pub tokens: u64,
    /// Element type.
    pub dtype: TokenDtype,
    /// File size in bytes.
    pub bytes: u64,
    /// The window length asked for.
    pub seq_len: u32,
    /// Complete windows of `seq_len + 1` tokens.
    pub windows: u64,
    /// Largest token id (one pass over the file).
    pub max_token: u64,
}

impl TokenFile {
    /// Counts, dtype, windows and the largest token id (reads the whole file once, in chunks).
    pub fn report(&self) -> Result<TokenFileReport> {
        const CHUNK: u64 = 1 << 20;
        let size = self.dtype.size() as u64;
        let end = self.tokens * size;
        let mut chunk = Vec::new();
        let mut max_token = None;
        let mut offset = 0u64;
        while offset < end {
            let len = (end - offset).min(CHUNK - CHUNK % size);
            chunk.resize(len as usize, 0);
            self.data.read_at(&mut chunk, offset)?;
            let chunk_max = match self.dtype {
                TokenDtype::Uint16 => chunk
                    .chunks_exact(2)
                    .map(|c| u64::from(u16::from_le_bytes([c[0], c[1]])))
                    .max(),
                TokenDtype::Uint32 => chunk
                    .chunks_exact(4)
                    .map(|c| u64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                    .max(),
            };
            max_token = max_token.max(chunk_max);
            offset += len;
        }
        Ok(TokenFileReport {
            tokens: self.tokens,
            dtype: self.dtype,
            bytes: self.data.len(),
            seq_len: self.seq_len,
            windows: self.windows,
            max_token: max_token.unwrap_or(0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `values`, little-endian 16-bit or 32-bit, as bytes.
    fn bytes_of<T: Copy>(values: impl Iterator<Item = T>, le: fn(T) -> Vec<u8>) -> Vec<u8> {
        values.flat_map(le).collect()
    }

    #[test]
    fn uint32_ids_under_a_uint16_name_are_told_apart() {
        let wide = |vocabulary: u32| {
            let ids = (0..4096u32).map(move |i| (i * 7919) % vocabulary);
            bytes_of(ids, |id| id.to_le_bytes().to_vec())
        };
        // Llama 3 (128,256: high halves 0 or 1), Qwen (151,646) and Gemma (256,000: up to 3),
        // and a million-id vocabulary (up to 15).
        for vocabulary in [128_256, 151_646, 256_000, 1_048_576] {
            assert_eq!(
                head_holds_wider_ids(&wide(vocabulary)),
                Some(WiderIds::Uint32),
                "{vocabulary}"
            );
        }
        // NumPy's default int64, of GPT-2's vocabulary (every id under 65,536: one 16-bit
        // value of four varies) and of Llama 3's; a few ids of 15 or under among them.
        for vocabulary in [50_257, 128_256] {
            let ids = (0..4096u64).map(move |i| {
                if i % 9 == 0 {
                    i % 16
                } else {
                    (i * 7919) % vocabulary
                }
            });
            let int64 = bytes_of(ids, |id| id.to_le_bytes().to_vec());
            assert_eq!(
                head_holds_wider_ids(&int64),
                Some(WiderIds::Int64),
                "{vocabulary}"
            );
        }
        // Ids below 65,536 as uint16: text, read as it is; so is a 16-id vocabulary.
        let narrow = (0..8192u32).map(|i| ((i * 7919) % 65_536) as u16);
        assert_eq!(
            head_holds_wider_ids(&bytes_of(narrow, |id| id.to_le_bytes().to_vec())),
            None
        );
        let tiny = (0..8192u16).map(|i| i % 16);
        assert_eq!(
            head_holds_wider_ids(&bytes_of(tiny, |id| id.to_le_bytes().to_vec())),
            None
        );
        // All zeros, and a head too short to tell: uint16.
        assert_eq!(head_holds_wider_ids(&[0; 8192]), None);
        assert_eq!(head_holds_wider_ids(&[5, 0, 0, 0]), None);
    }

    #[test]
    fn an_opened_file_reads_its_own_head() {
        let mut file = tempfile::NamedTempFile::new().expect("a temporary file");
        let ids = (0..4096u32).map(|i| (i * 7919) % 151_646);
        std::io::Write::write_all(&mut file, &bytes_of(ids, |id| id.to_le_bytes().to_vec()))
            .expect("written");
        let as_uint16 = TokenFile::open(file.path(), TokenDtype::Uint16, 16).expect("opens");
        assert_eq!(
            as_uint16.wider_ids().expect("reads"),
            Some(WiderIds::Uint32)
        );
        let as_uint32 = TokenFile::open(file.path(), TokenDtype::Uint32, 16).expect("opens");
        assert_eq!(as_uint32.wider_ids().expect("reads"), None);
    }
}
