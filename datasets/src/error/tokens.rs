//! Token files and Megatron corpora that cannot be read as such: a size that is not a whole
//! number of tokens, too few tokens for one window, an index that contradicts itself or its
//! data file.

use std::path::PathBuf;

/// Why a token file or a Megatron corpus cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// A token file whose length is not a whole number of tokens.
    #[error(
        "token file {path} has {bytes} bytes, not a multiple of the {dtype} token size: wrong \
         dtype (name the file *.u32.bin for uint32; the CLI takes --token-dtype) or a truncated \
         file"
    )]
    TokenFileSize {
        /// The file.
        path: PathBuf,
        /// Its length.
        bytes: u64,
        /// The dtype it was read as.
        dtype: &'static str,
    },

    /// A Megatron index (`.idx`) that cannot be read as one: truncated, of another version or
    /// dtype, or contradicting itself.
    #[error("Megatron index {path}: {problem}")]
    MegatronIndex {
        /// The index file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },

    /// A Megatron data file (`.bin`) whose size is not the tokens its index counts.
    #[error(
        "Megatron data file {path} is {bytes} bytes, {which} than the {expected} bytes its index \
         {index} counts (a truncated copy, or the .bin of another index)",
        which = if .bytes < .expected { "shorter" } else { "longer" }
    )]
    MegatronBinSize {
        /// The data file.
        path: PathBuf,
        /// Its size.
        bytes: u64,
        /// The size its index gives.
        expected: u64,
        /// The index file.
        index: PathBuf,
    },

    /// A token file with fewer tokens than one window.
    #[error("token file {path} holds {tokens} tokens, fewer than one window of {window}")]
    TokenFileTooShort {
        /// The file.
        path: PathBuf,
        /// Tokens in the file.
        tokens: u64,
        /// Tokens per window (seq_len + 1).
        window: u64,
    },
}
