//! `TokenFile`: a flat little-endian array of token ids (nanoGPT / Megatron `.bin`), memory-mapped
//! and served as fixed windows of `seq_len + 1` tokens.
//!
//! Window `i` holds tokens `[i * seq_len, i * seq_len + seq_len + 1)`: consecutive windows share
//! one token, so every token but the first is a training target exactly once per epoch (input
//! `window[..seq_len]`, target `window[1..]`, as nanoGPT's `get_batch` cuts them). The last
//! incomplete window is dropped.

mod synthetic;

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use serde::Serialize;
use tracing::info;

use crate::error::{Error, Result};
use crate::sample_source::{SampleSource, TokenWindowShape};
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

/// A memory-mapped token array cut into windows of `seq_len + 1` tokens; one window is one
/// sample. Reading copies the window's bytes out of the map (little-endian, the file's dtype).
pub struct TokenFile {
    path: PathBuf,
    map: Mmap,
    dtype: TokenDtype,
    seq_len: u32,
    tokens: u64,
    windows: u64,
}

impl TokenFile {
    /// Maps `path` as tokens of `dtype` cut into windows of `seq_len + 1` tokens.
    ///
    /// Fails when the file is missing, its length is not a multiple of the token size, or it
    /// holds fewer than `seq_len + 1` tokens (no complete window).
    pub fn open(path: &Path, dtype: TokenDtype, seq_len: u32) -> Result<TokenFile> {
        if seq_len == 0 || seq_len > MAX_SEQ_LEN {
            return Err(Error::InvalidArgument(format!(
                "token windows need seq_len in 1..={MAX_SEQ_LEN}, got {seq_len}"
            )));
        }
        let file = match File::open(path) {
            Ok(file) => file,
            Err(source) if source.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::RootNotFound(path.to_path_buf()))
            }
            Err(source) => return Err(Error::io(path, source)),
        };
        let bytes = file
            .metadata()
            .map_err(|source| Error::io(path, source))?
            .len();
        if bytes % dtype.size() as u64 != 0 {
            return Err(Error::TokenFileSize {
                path: path.to_path_buf(),
                bytes,
                dtype: dtype.name(),
            });
        }
        let tokens = bytes / dtype.size() as u64;
        let window = u64::from(seq_len) + 1;
        if tokens < window {
            return Err(Error::TokenFileTooShort {
                path: path.to_path_buf(),
                tokens,
                window,
            });
        }
        // SAFETY: the map is read-only and only ever copied out of. A file truncated by another
        // process while mapped would fault on access, as with any reader of mapped files; the
        // training data is not expected to change under a running job.
        let map = unsafe { Mmap::map(&file) }.map_err(|source| Error::io(path, source))?;
        // Windows are visited in shuffled order.
        #[cfg(unix)]
        if let Err(error) = map.advise(memmap2::Advice::Random) {
            tracing::debug!(%error, "madvise(random) failed; reading with default readahead");
        }
        let windows = (tokens - 1) / u64::from(seq_len);
        info!(path = %path.display(), tokens, windows, dtype = dtype.name(), "mapped token file");
        Ok(TokenFile {
            path: path.to_path_buf(),
            map,
            dtype,
            seq_len,
            tokens,
            windows,
        })
    }

    /// The file.
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

    /// Bytes of one window (`(seq_len + 1) * dtype size`).
    pub fn window_bytes(&self) -> usize {
        (self.seq_len as usize + 1) * self.dtype.size()
    }

    /// The bytes of window `index`, borrowed from the map.
    pub fn window(&self, index: u64) -> Result<&[u8]> {
        if index >= self.windows {
            return Err(Error::IndexOutOfRange {
                index,
                len: self.windows,
            });
        }
        let start = index as usize * self.seq_len as usize * self.dtype.size();
        Ok(&self.map[start..start + self.window_bytes()])
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
        self.window(index).map(<[u8]>::to_vec)
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
    /// Counts, dtype, windows and the largest token id (reads the whole file once).
    pub fn report(&self) -> TokenFileReport {
        let max_token = match self.dtype {
            TokenDtype::Uint16 => self
                .map
                .chunks_exact(2)
                .map(|c| u64::from(u16::from_le_bytes([c[0], c[1]])))
                .max(),
            TokenDtype::Uint32 => self
                .map
                .chunks_exact(4)
                .map(|c| u64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .max(),
        };
        TokenFileReport {
            tokens: self.tokens,
            dtype: self.dtype,
            bytes: self.map.len() as u64,
            seq_len: self.seq_len,
            windows: self.windows,
            max_token: max_token.unwrap_or(0),
        }
    }
}
