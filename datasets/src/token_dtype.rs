//! The element type of token arrays ([`TokenDtype`]): shared by token files, which store it,
//! and by the [`SampleSource`](crate::SampleSource) interface, which reports it for token
//! windows.

use std::path::Path;

use serde::Serialize;

/// The element type of a token file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenDtype {
    /// Little-endian `u16` (nanoGPT's default, vocabularies up to 65,536).
    Uint16,
    /// Little-endian `u32`.
    Uint32,
}

impl TokenDtype {
    /// Bytes per token.
    pub fn size(self) -> usize {
        match self {
            TokenDtype::Uint16 => 2,
            TokenDtype::Uint32 => 4,
        }
    }

    /// The dtype a file name implies: `*.u32.bin` / `*.uint32.bin` are `Uint32`, anything else
    /// `Uint16` (nanoGPT's convention), as `job.proto` documents.
    pub fn from_file_name(path: &Path) -> TokenDtype {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_ascii_lowercase())
            .unwrap_or_default();
        if name.ends_with(".u32.bin") || name.ends_with(".uint32.bin") {
            TokenDtype::Uint32
        } else {
            TokenDtype::Uint16
        }
    }

    /// Lowercase name (`"uint16"`, `"uint32"`), as NumPy spells it.
    pub fn name(self) -> &'static str {
        match self {
            TokenDtype::Uint16 => "uint16",
            TokenDtype::Uint32 => "uint32",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_follows_the_file_name_rule() {
        for (name, dtype) in [
            ("train.bin", TokenDtype::Uint16),
            ("train.u32.bin", TokenDtype::Uint32),
            ("train.UINT32.bin", TokenDtype::Uint32),
            ("u32.bin", TokenDtype::Uint16),
            ("train.u16.bin", TokenDtype::Uint16),
        ] {
            assert_eq!(TokenDtype::from_file_name(Path::new(name)), dtype, "{name}");
        }
    }
}
