//! The Tokenize op: Hugging Face `tokenizers` over a `tokenizer.json` read from the worker's
//! disk, plus a small byte-level BPE trainer for tests, demos and benchmarks (nothing is ever
//! fetched from a hub).

use std::path::{Path, PathBuf};

use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{AddedToken, Tokenizer, TokenizerBuilder, TokenizerImpl};

use crate::error::{Error, Result, SampleError};

/// Token strings taken as the end-of-sequence token when a job does not give its id, in the
/// order they are looked up (GPT-2 / Llama 3 / T5, Llama 2 / Gemma, BERT).
pub const EOS_CANDIDATES: [&str; 6] = [
    "<|endoftext|>",
    "<|end_of_text|>",
    "</s>",
    "<eos>",
    "<|eot_id|>",
    "[SEP]",
];

/// A loaded tokenizer; shared by every decode thread (encoding takes `&self`).
pub struct TextTokenizer {
    path: PathBuf,
    tokenizer: Tokenizer,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl TextTokenizer {
    /// Loads a `tokenizer.json`.
    pub fn load(path: &Path) -> Result<TextTokenizer> {
        if !path.is_file() {
            return Err(Error::Io {
                path: path.to_path_buf(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "tokenizer.json not found (Tokenize reads it from the worker's disk)",
                ),
            });
        }
        let cannot_load = |error: String| {
            Error::InvalidPipeline(format!(
                "Tokenize: cannot load the tokenizer {}: {error}",
                path.display()
            ))
        };
        // tokenizers 0.23 panics on some malformed files (a `decoder` it cannot deserialise:
        // found by the `tokenizer` fuzz target); a bad file is an error, not a dead worker.
        let loaded = std::panic::catch_unwind(|| Tokenizer::from_file(path)).map_err(|panic| {
            let message = panic
                .downcast_ref::<&str>()
                .map(|text| (*text).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            cannot_load(format!("the tokenizer parser panicked: {message}"))
        })?;
        let tokenizer = loaded.map_err(|error| cannot_load(error.to_string()))?;
        Ok(TextTokenizer {
            path: path.to_path_buf(),
            tokenizer,
        })
    }

    /// The file it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Ids the tokenizer can produce (its vocabulary with added tokens).
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// The tokenizer's own end-of-sequence token: the first of [`EOS_CANDIDATES`] it knows.
    pub fn eos_id(&self) -> Option<u32> {
        EOS_CANDIDATES
            .iter()
            .find_map(|token| self.tokenizer.token_to_id(token))
    }

    /// The ids of `text`, without special tokens (the packer adds EOS itself).
    pub fn encode(&self, text: &str) -> std::result::Result<Vec<u32>, SampleError> {
        self.tokenizer
            .encode_fast(text, false)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|error| SampleError::InvalidText(format!("tokenizer failed: {error}")))
    }
}

/// Trains a byte-level BPE of at most `vocab_size` ids on `texts`, with `eos` as its first
/// special token (id 0), and writes it as a `tokenizer.json` at `out`. Takes well under a second
/// on a few hundred kilobytes of text: tests and benchmarks make their tokenizer this way.
pub fn train_bpe_tokenizer(texts: &[&str], vocab_size: usize, eos: &str, out: &Path) -> Result<()> {
    let failed = |error: tokenizers::Error| {
        Error::InvalidSpec(format!("cannot train a BPE tokenizer: {error}"))
    };
    let mut trainer = BpeTrainerBuilder::new()
        .show_progress(false)
        .vocab_size(vocab_size)
        .min_frequency(0)
        .special_tokens(vec![AddedToken::from(eos.to_string(), true)])
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut tokenizer: TokenizerImpl<
        BPE,
        NormalizerWrapper,
        ByteLevel,
        PostProcessorWrapper,
        ByteLevel,
    > = TokenizerBuilder::new()
        .with_model(BPE::default())
        .with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)))
        .with_decoder(Some(ByteLevel::default()))
        .build()
        .map_err(failed)?;
    tokenizer
        .train(&mut trainer, texts.iter())
        .map_err(failed)?;
    let tokenizer: Tokenizer = tokenizer.into();
    tokenizer.save(out, false).map_err(|error| Error::Io {
        path: out.to_path_buf(),
        source: std::io::Error::other(error.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trained_tokenizer_round_trips_and_knows_its_eos() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        let texts = [
            "the cat sat on the mat",
            "the dog sat on the log",
            "a cat and a dog",
        ];
        train_bpe_tokenizer(&texts, 300, "<|endoftext|>", &path).unwrap();
        let tokenizer = TextTokenizer::load(&path).unwrap();
        assert_eq!(tokenizer.eos_id(), Some(0));
        let ids = tokenizer.encode("the cat sat").unwrap();
        assert!(
            !ids.is_empty() && ids.len() < "the cat sat".len(),
            "{ids:?}"
        );
        assert!(!ids.contains(&0));
        // Byte-level: text never seen still encodes (no unknown token).
        assert!(!tokenizer.encode("zebra ünïcode 🦀").unwrap().is_empty());
        assert_eq!(tokenizer.encode("").unwrap(), Vec::<u32>::new());
    }

    #[test]
    fn missing_or_invalid_tokenizer_files_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let missing = TextTokenizer::load(&dir.path().join("nope.json")).unwrap_err();
        assert!(missing.to_string().contains("nope.json"), "{missing}");
        let junk = dir.path().join("junk.json");
        std::fs::write(&junk, "{not json").unwrap();
        let error = TextTokenizer::load(&junk).unwrap_err();
        assert!(
            error.to_string().contains("cannot load the tokenizer"),
            "{error}"
        );
    }
}
