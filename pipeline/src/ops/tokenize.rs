//! The Tokenize op: Hugging Face `tokenizers` over a `tokenizer.json` read from the worker's
//! disk, plus a small byte-level BPE trainer for tests, demos and benchmarks (nothing is ever
//! fetched from a hub).
//!
//! Encoding runs on the crate's 1.0 line (`tokenizers-v1`, pinned to an exact release
//! candidate): a rewrite with a SIMD pre-tokenizer, many times faster per core than 0.23 with
//! identical ids. It reads a `tokenizer.json` in its canonical form, and older files after its
//! own upgrade pass; a file it still cannot read, or cannot encode probe texts (many scripts,
//! and each of the file's added tokens in context) with exactly as 0.23 does, is encoded by
//! 0.23 as before (logged once, and said by [`TextTokenizer::engine`]). 0.23 also answers the
//! vocabulary lookups (size, EOS) and trains the test tokenizers. A file's own truncation and padding are left unapplied, as
//! `transformers` leaves them unless asked: packing cuts and pads the rows itself.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{AddedToken, Tokenizer, TokenizerBuilder, TokenizerImpl};

use crate::error::{panic_text, Error, Result, SampleError};

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
    /// The 1.0 encoder, when it reads the file.
    fast: Option<tokenizers_v1::pipeline::PipelineTokenizer>,
    /// Why 1.0 does not read the file, when it does not.
    fast_problem: Option<String>,
    /// Whether 1.0 failed on a text yet (said once).
    fast_failed: std::sync::atomic::AtomicBool,
    /// The SHA-256 of the file's bytes, in hex.
    sha256: String,
    /// One past the largest id of its vocabulary with added tokens.
    id_bound: usize,
}

/// Which `tokenizers` line encodes a [`TextTokenizer`]'s text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenizerEngine {
    /// The 1.0 line.
    V1,
    /// 0.23, because 1.0 cannot read the file (the reason).
    Legacy(String),
}

/// Reads `text` (a `tokenizer.json`) with the 1.0 line: as it is, or after 1.0's upgrade pass
/// for files written by older versions. Never panics (a panic in the reader is an error).
fn load_v1(text: &str) -> std::result::Result<tokenizers_v1::pipeline::PipelineTokenizer, String> {
    // Contained: a panic of the reader (a BPE of 65,536 merges, in 1.0.0-rc.3) is this error,
    // not a backtrace printed for every loader made.
    crate::without_panics("tokenizers 1.0", || match tokenizers_v1::from_json(text) {
        Ok(tokenizer) => Ok(tokenizer),
        Err(direct) => {
            let canonical = tokenizers_v1::canonicalize_str(text)
                .map_err(|error| format!("{direct}; its upgrade pass: {error}"))?;
            tokenizers_v1::from_json(&canonical)
                .map_err(|error| format!("{direct}; after its upgrade pass: {error}"))
        }
    })
    .unwrap_or_else(Err)
}

/// Text 1.0 and 0.23 must encode alike before 1.0 is trusted with a file (with the file's added
/// tokens: [`probe_texts`]): letters, digits, punctuation, runs of whitespace, non-ASCII
/// scripts, an emoji, and the special tokens of common tokenizers (a file 1.0 reads but cannot
/// encode with, such as a `Split` regex outside its engines, fails here rather than on a
/// sample).
const PROBE: &str = "Stoker's probe: The quick brown fox, 123 4.5e-6 0xFF! \n\t  indented \
    Ünïcödé café Straße 日本語 中文 한국어 Здравствуйте العربية 🦀✨ \
    <|endoftext|> <|end_of_text|> </s> <eos> [CLS] [SEP] <unk>\r\n\n";

/// The texts 1.0 must encode as 0.23 does: [`PROBE`], and each of the file's added tokens in
/// the places where the two lines have been seen to part (at a text's start, between words,
/// glued to letters on either side, after a space), a few dozen tokens to a text: a token a user
/// added to a SentencePiece-style file (`Metaspace`) gets its spaces otherwise on 1.0 there.
fn probe_texts(legacy: &Tokenizer) -> Vec<String> {
    let mut added: Vec<(u32, String)> = legacy
        .get_added_tokens_decoder()
        .into_iter()
        .map(|(id, token)| (id, token.content))
        .collect();
    added.sort_unstable();
    let mut texts = vec![PROBE.to_string()];
    for group in added.chunks(32) {
        let mut around = String::new();
        for (_, token) in group {
            around.push_str(&format!("a {token}b {token} c{token}d\n{token}x  {token} "));
            texts.push(format!("{token}x"));
            texts.push(format!(" {token} y"));
        }
        texts.push(around);
    }
    texts
}

/// Whether `fast` gives `legacy`'s ids on every text of [`probe_texts`].
fn agrees_on_probe(
    fast: &tokenizers_v1::pipeline::PipelineTokenizer,
    legacy: &Tokenizer,
) -> std::result::Result<(), String> {
    for text in probe_texts(legacy) {
        let mut tokens = Vec::new();
        crate::without_panics("tokenizers 1.0", || {
            fast.encode_into(
                &text,
                &tokenizers_v1::pipeline::EncodeOptions::no_specials(),
                &mut tokens,
            )
        })
        .map_err(|panic| format!("encoding a probe text: {panic}"))?
        .map_err(|error| format!("encoding a probe text: {error}"))?;
        let expected = legacy
            .encode_fast(text.as_str(), false)
            .map_err(|error| format!("0.23 encoding a probe text: {error}"))?;
        let ids: Vec<u32> = tokens.into_iter().map(u32::from).collect();
        if ids != expected.get_ids() {
            return Err(format!(
                "its ids differ from 0.23's on a probe text ({:?})",
                text.chars().take(60).collect::<String>()
            ));
        }
    }
    Ok(())
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// The tokenizers this process has loaded and still uses, by path, with the file's identity
/// (device, inode, size, modification time) as it was read.
type Loaded = std::collections::HashMap<PathBuf, (FileIdentity, std::sync::Weak<TextTokenizer>)>;
static LOADED: std::sync::LazyLock<std::sync::Mutex<Loaded>> =
    std::sync::LazyLock::new(Default::default);

/// What tells one version of a file from another without reading it.
type FileIdentity = (u64, u64, u64, Option<std::time::SystemTime>);

fn identity_of(path: &Path) -> Option<FileIdentity> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(path).ok()?;
    Some((
        metadata.dev(),
        metadata.ino(),
        metadata.len(),
        metadata.modified().ok(),
    ))
}

impl TextTokenizer {
    /// The `tokenizer.json` at `path`, loaded once for every job of this process that uses
    /// that version of the file while one holds it: a worker builds a job per rank, and each
    /// loaded its own copy (86 MB a rank of a 400K-word vocabulary; 2.3 GB for 24 ranks).
    /// The load itself runs without the table's lock (another job's tokenizer is not held up
    /// behind it); of two loads of one file at once, the first kept serves both.
    pub fn shared(path: &Path) -> Result<Arc<TextTokenizer>> {
        let identity = identity_of(path);
        let known = |loaded: &Loaded| {
            let (known, tokenizer) = loaded.get(path)?;
            (Some(*known) == identity).then(|| tokenizer.upgrade())?
        };
        if let Some(tokenizer) = known(&LOADED.lock().unwrap_or_else(|p| p.into_inner())) {
            return Ok(tokenizer);
        }
        let tokenizer = Arc::new(TextTokenizer::load(path)?);
        let mut loaded = LOADED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(first) = known(&loaded) {
            return Ok(first);
        }
        loaded.retain(|_, (_, tokenizer)| tokenizer.strong_count() > 0);
        if let Some(identity) = identity {
            loaded.insert(path.to_path_buf(), (identity, Arc::downgrade(&tokenizer)));
        }
        Ok(tokenizer)
    }

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
        let loaded = crate::without_panics("tokenizers 0.23", || Tokenizer::from_file(path))
            .map_err(cannot_load)?;
        let mut tokenizer = loaded.map_err(|error| cannot_load(error.to_string()))?;
        let mut text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let sha256 = format!(
            "{:x}",
            <sha2::Sha256 as sha2::Digest>::digest(text.as_bytes())
        );
        if let Some(dropout) = bpe_dropout(&text) {
            return Err(cannot_load(format!(
                "its model's dropout is {dropout}: BPE dropout draws other tokens at every \
                 encoding, so a batch would differ on another worker and on resume; set \
                 \"dropout\" to null in the file"
            )));
        }
        // A file's truncation and padding (a model's input length, say) are not applied, as
        // `transformers` leaves them unapplied unless asked: packing splits a long document
        // across rows and pads only once a batch's documents end, where a file's padding
        // would pack pad ids as a document's tokens and its truncation drop the rest of each
        // document.
        let ignored: Vec<&str> = [
            ("truncation", tokenizer.get_truncation().is_some()),
            ("padding", tokenizer.get_padding().is_some()),
        ]
        .into_iter()
        .filter_map(|(setting, set)| set.then_some(setting))
        .collect();
        if !ignored.is_empty() {
            tracing::info!(
                path = %path.display(),
                settings = %ignored.join(" and "),
                "Tokenize leaves the tokenizer file's truncation and padding unapplied"
            );
            tokenizer
                .with_truncation(None)
                .map_err(|error| cannot_load(error.to_string()))?;
            tokenizer.with_padding(None);
            text = without_truncation_and_padding(&text).map_err(cannot_load)?;
        }
        let checked = load_v1(&text).and_then(|fast| {
            agrees_on_probe(&fast, &tokenizer)?;
            Ok(fast)
        });
        let (fast, fast_problem) = match checked {
            Ok(fast) => (Some(fast), None),
            Err(problem) => {
                tracing::info!(
                    path = %path.display(),
                    %problem,
                    "tokenizers 1.0 cannot read this tokenizer.json; encoding with 0.23"
                );
                (None, Some(problem))
            }
        };
        // Ids are the file's word: a vocabulary of three entries may hold id 3,000,000,000.
        let id_bound = tokenizer
            .get_vocab(true)
            .values()
            .max()
            .map_or(0, |&id| id as usize + 1)
            .max(tokenizer.get_vocab_size(true));
        Ok(TextTokenizer {
            path: path.to_path_buf(),
            id_bound,
            tokenizer,
            fast,
            fast_problem,
            fast_failed: std::sync::atomic::AtomicBool::new(false),
            sha256,
        })
    }

    /// Which `tokenizers` line encodes.
    pub fn engine(&self) -> TokenizerEngine {
        match &self.fast_problem {
            None => TokenizerEngine::V1,
            Some(problem) => TokenizerEngine::Legacy(problem.clone()),
        }
    }

    /// The file it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The SHA-256 of the file's bytes as read, in hex: workers whose digests differ read
    /// different files, which may give other ids.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// One past the largest id the tokenizer can produce (of its vocabulary with added
    /// tokens): its entry count where ids run 0..n, more where the file numbers them past that.
    pub fn vocab_size(&self) -> usize {
        self.id_bound
    }

    /// The first token `other` gives another id than this tokenizer does (their vocabularies
    /// with added tokens), said in words; `None` when every token has the same id in both, so
    /// their ids mean the same text.
    pub fn vocabulary_difference(&self, other: &TextTokenizer) -> Option<String> {
        let mine = self.tokenizer.get_vocab(true);
        let theirs = other.tokenizer.get_vocab(true);
        let mut differing: Vec<(u32, &String, Option<u32>)> = mine
            .iter()
            .filter_map(|(token, &id)| {
                let other_id = theirs.get(token).copied();
                (other_id != Some(id)).then_some((id, token, other_id))
            })
            .collect();
        differing.sort_unstable();
        match differing.first() {
            Some((id, token, Some(other_id))) => Some(format!(
                "{token:?} is id {id} in {} and {other_id} in {}",
                self.path.display(),
                other.path.display()
            )),
            Some((id, token, None)) => Some(format!(
                "{token:?} (id {id} in {}) is not in {}",
                self.path.display(),
                other.path.display()
            )),
            // Every token of this one has its id in the other: the other may have more.
            None if theirs.len() != mine.len() => Some(format!(
                "{} has {} ids and {} has {}",
                self.path.display(),
                mine.len(),
                other.path.display(),
                theirs.len()
            )),
            None => None,
        }
    }

    /// The tokenizer's own end-of-sequence token: the first of [`EOS_CANDIDATES`] it knows.
    pub fn eos_id(&self) -> Option<u32> {
        EOS_CANDIDATES
            .iter()
            .find_map(|token| self.tokenizer.token_to_id(token))
    }

    /// The ids of `text`, without special tokens (the packer adds EOS itself).
    pub fn encode(&self, text: &str) -> std::result::Result<Vec<u32>, SampleError> {
        let mut ids = Vec::new();
        self.encode_into(text, &mut ids)?;
        Ok(ids)
    }

    /// Appends the ids of `text` to `ids`, without special tokens.
    pub fn encode_into(
        &self,
        text: &str,
        ids: &mut Vec<u32>,
    ) -> std::result::Result<(), SampleError> {
        let failed = |error: &dyn std::fmt::Display| {
            SampleError::InvalidText(format!("tokenizer failed: {error}"))
        };
        if let Some(fast) = &self.fast {
            let mut tokens = Vec::with_capacity(text.len() / 3);
            // A panic or error in the release candidate: this text goes to 0.23 (which gives
            // the ids 1.0 would have given), so the document is not replaced by another.
            let encoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                fast.encode_into(
                    text,
                    &tokenizers_v1::pipeline::EncodeOptions::no_specials(),
                    &mut tokens,
                )
            }));
            let problem = match encoded {
                Ok(Ok(())) => {
                    ids.extend(tokens.into_iter().map(u32::from));
                    return Ok(());
                }
                Ok(Err(error)) => error.to_string(),
                Err(panic) => format!("it panicked: {}", panic_text(&*panic)),
            };
            if self
                .fast_failed
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                tracing::debug!(path = %self.path.display(), %problem, "tokenizers 1.0 could not encode a text; 0.23 encodes it");
            } else {
                tracing::warn!(
                    path = %self.path.display(),
                    %problem,
                    "tokenizers 1.0 could not encode a text; 0.23 encodes it (said once per tokenizer)"
                );
            }
        }
        let encoding = self
            .tokenizer
            .encode_fast(text, false)
            .map_err(|error| failed(&error))?;
        ids.extend_from_slice(encoding.get_ids());
        Ok(())
    }

    /// The ids of `text` from 0.23 alone (for checking the two lines agree).
    pub fn encode_legacy(&self, text: &str) -> std::result::Result<Vec<u32>, SampleError> {
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

/// The BPE dropout the `tokenizer.json` text `text` sets (its `model.dropout`), when above 0.
fn bpe_dropout(text: &str) -> Option<f64> {
    let config: serde_json::Value = serde_json::from_str(text).ok()?;
    let dropout = config.get("model")?.get("dropout")?.as_f64()?;
    (dropout > 0.0).then_some(dropout)
}

/// The `tokenizer.json` text `text` with its `truncation` and `padding` set to none.
fn without_truncation_and_padding(text: &str) -> std::result::Result<String, String> {
    let mut config: serde_json::Value =
        serde_json::from_str(text).map_err(|error| error.to_string())?;
    if let Some(object) = config.as_object_mut() {
        object.insert("truncation".into(), serde_json::Value::Null);
        object.insert("padding".into(), serde_json::Value::Null);
    }
    Ok(config.to_string())
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

        // BPE dropout set in the file: refused (other tokens at every encoding); 0 or null
        // is no dropout.
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for (dropout, refused) in [
            (serde_json::json!(0.3), true),
            (serde_json::json!(0.0), false),
        ] {
            config["model"]["dropout"] = dropout;
            let with_dropout = dir.path().join("dropout.json");
            std::fs::write(&with_dropout, config.to_string()).unwrap();
            match TextTokenizer::load(&with_dropout) {
                Err(error) => {
                    assert!(refused, "{error}");
                    assert!(error.to_string().contains("dropout is 0.3"), "{error}");
                }
                Ok(_) => assert!(!refused, "dropout 0.3 was taken"),
            }
        }
    }

    #[test]
    fn the_1_0_line_encodes_and_gives_0_23s_ids() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        let long = "fn main() { println!(\"hello\"); }\n".repeat(500);
        let texts = [
            "the cat sat on the mat",
            "Ünïcödé café Straße 日本語 한국어 🦀✨",
            "",
            "\n\n  \t spaces  and\r\nlines\n",
            long.as_str(),
            "<|endoftext|> inside the text",
        ];
        train_bpe_tokenizer(&texts, 400, "<|endoftext|>", &path).unwrap();
        let tokenizer = TextTokenizer::load(&path).unwrap();
        assert_eq!(tokenizer.engine(), TokenizerEngine::V1);
        for text in texts {
            assert_eq!(
                tokenizer.encode(text).unwrap(),
                tokenizer.encode_legacy(text).unwrap(),
                "{:?}",
                &text[..text.len().min(40)]
            );
        }
        let mut appended = vec![7];
        tokenizer.encode_into("the cat", &mut appended).unwrap();
        assert_eq!(appended[0], 7);
        assert_eq!(&appended[1..], tokenizer.encode("the cat").unwrap());
    }

    #[test]
    fn a_files_truncation_and_padding_are_left_unapplied() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        let texts = ["the cat sat on the mat and the dog sat on the log"];
        train_bpe_tokenizer(&texts, 300, "<|endoftext|>", &path).unwrap();
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let plain = TextTokenizer::load(&path).unwrap();
        let whole = plain.encode(texts[0]).unwrap();
        assert!(whole.len() > 4);
        config["truncation"] = serde_json::json!({
            "direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0
        });
        config["padding"] = serde_json::json!({
            "strategy": {"Fixed": 64}, "direction": "Right", "pad_to_multiple_of": null,
            "pad_id": 0, "pad_type_id": 0, "pad_token": "<|endoftext|>"
        });
        std::fs::write(&path, config.to_string()).unwrap();
        let tokenizer = TextTokenizer::load(&path).unwrap();
        // Neither cut to 4 nor padded to 64: the document's own ids, on the fast engine.
        assert_eq!(tokenizer.encode(texts[0]).unwrap(), whole);
        assert_eq!(tokenizer.encode_legacy(texts[0]).unwrap(), whole);
        assert_eq!(tokenizer.engine(), TokenizerEngine::V1);
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

    /// A tokenizer file is loaded once while a job of the process holds it (a worker builds
    /// a job per rank, each loaded its own), and again once the file changes.
    #[test]
    fn a_tokenizer_file_is_loaded_once_while_it_is_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        crate::train_bpe_tokenizer(&["hello world", "hello there"], 280, "</s>", &path).unwrap();
        let first = TextTokenizer::shared(&path).unwrap();
        let second = TextTokenizer::shared(&path).unwrap();
        assert!(Arc::ptr_eq(&first, &second));
        // Another version of the file: loaded anew.
        std::thread::sleep(std::time::Duration::from_millis(20));
        crate::train_bpe_tokenizer(&["other words", "other things"], 270, "</s>", &path).unwrap();
        let changed = TextTokenizer::shared(&path).unwrap();
        assert!(!Arc::ptr_eq(&first, &changed));
        assert_ne!(first.sha256(), changed.sha256());
    }
}
