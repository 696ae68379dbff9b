//! Seeded token files for benchmarks and tests: uniform random ids below a vocabulary size.

use std::io::{BufWriter, Write};
use std::path::Path;

use rand_core::Rng;
use rand_pcg::Pcg64Mcg;

use crate::error::{Error, Result};
use crate::token_dtype::TokenDtype;

/// What [`write_synthetic_tokens`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyntheticTokensSpec {
    /// Tokens in the file.
    pub tokens: u64,
    /// Ids are drawn uniformly from `0..vocab`.
    pub vocab: u32,
    /// Element type.
    pub dtype: TokenDtype,
    /// Seed of the ids: the same spec writes the same bytes.
    pub seed: u64,
}

/// Writes a token file of `spec.tokens` seeded random ids to `path` (replacing it once written
/// whole).
pub fn write_synthetic_tokens(path: &Path, spec: &SyntheticTokensSpec) -> Result<()> {
    let fits = match spec.dtype {
        TokenDtype::Uint16 => spec.vocab <= 1 << 16,
        TokenDtype::Uint32 => true,
    };
    if spec.vocab == 0 || !fits {
        return Err(Error::InvalidSpec(format!(
            "vocab {} does not fit {} tokens (1..={})",
            spec.vocab,
            spec.dtype.name(),
            if spec.dtype == TokenDtype::Uint16 {
                1u64 << 16
            } else {
                1u64 << 32
            }
        )));
    }
    // Written under a temporary name and renamed once whole: a run stopped midway leaves no
    // shorter file under `path` for a reader to take as the set.
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".partial");
    let temporary = std::path::PathBuf::from(temporary);
    let written = write_ids(&temporary, spec)
        .and_then(|()| std::fs::rename(&temporary, path).map_err(|e| Error::io(path, e)));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

/// Writes `spec`'s ids to `path`.
fn write_ids(path: &Path, spec: &SyntheticTokensSpec) -> Result<()> {
    let file = std::fs::File::create(path).map_err(|source| Error::io(path, source))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let mut rng = Pcg64Mcg::new(u128::from(spec.seed) | 1 << 100);
    let vocab = u64::from(spec.vocab);
    for _ in 0..spec.tokens {
        // Multiply-shift maps a 32-bit draw onto 0..vocab without a division.
        let id = (u64::from(rng.next_u32()) * vocab) >> 32;
        let written = match spec.dtype {
            TokenDtype::Uint16 => out.write_all(&(id as u16).to_le_bytes()),
            TokenDtype::Uint32 => out.write_all(&(id as u32).to_le_bytes()),
        };
        written.map_err(|source| Error::io(path, source))?;
    }
    out.flush().map_err(|source| Error::io(path, source))?;
    Ok(())
}
