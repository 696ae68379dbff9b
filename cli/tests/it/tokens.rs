//! Token files and tokenised JSONL text end to end: every window or document exactly once per
//! epoch across ranks, bit-identical batches for any thread count, the packing rule on real
//! tokenizer output, bad lines under both policies, and the CLI on both kinds.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::collections::BTreeMap;
use std::path::Path;

use stoker_loader::{ErrorKind, Loader, LoaderOptions};
use stoker_pipeline::{pack_documents, PackSpec, PackedRowsMut, TextTokenizer};
use stoker_proto::v1::{self as proto, op::Op as OpKind, BadSamplePolicy, JobSpec};

use crate::common::{self, digest, epoch_batches as epoch, tensor};

fn op(kind: OpKind) -> proto::Op {
    proto::Op { op: Some(kind) }
}

fn spec(uri: &Path, pipeline: Vec<proto::Op>, batch_size: u32) -> JobSpec {
    let uri = format!("file://{}", uri.display());
    JobSpec {
        seed: 9,
        ..common::spec_over(&uri, pipeline, batch_size)
    }
}

fn ints(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Token `i` of the file is `i % 65_521` (a prime), so a window's content names its start.
fn write_counting_tokens(path: &Path, tokens: u32) {
    let bytes: Vec<u8> = (0..tokens)
        .flat_map(|i| ((i % 65_521) as u16).to_le_bytes())
        .collect();
    std::fs::write(path, bytes).unwrap();
}

fn windows_spec(path: &Path, seq_len: u32, batch_size: u32) -> JobSpec {
    let windows = op(OpKind::TokenWindows(proto::TokenWindows {
        seq_len,
        ..Default::default()
    }));
    spec(path, vec![windows], batch_size)
}

#[test]
fn token_windows_cover_the_file_once_per_epoch_across_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.bin");
    // 60 windows of 16 + 1 tokens: 60 * 16 + 1 tokens, plus a tail that is dropped.
    write_counting_tokens(&path, 60 * 16 + 1 + 7);
    let base = windows_spec(&path, 16, 8);
    let mut seen = BTreeMap::new();
    for rank in 0..3 {
        let ranked = JobSpec {
            rank,
            world_size: 3,
            ..base.clone()
        };
        for batch in epoch(&ranked, 2, 1) {
            let tokens = tensor(&batch, "tokens");
            assert_eq!(tokens.dtype, proto::Dtype::Uint16);
            let rows = batch.sample_indices.len() as u64;
            assert_eq!(tokens.shape, [rows, 17]);
            assert!(batch.tensors.iter().all(|t| t.name != "label"));
            for (row, &window) in tokens.data.chunks_exact(34).zip(&batch.sample_indices) {
                let ids: Vec<u16> = row
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect();
                let start = window as u16 * 16;
                assert_eq!(
                    ids,
                    (start..start + 17).collect::<Vec<_>>(),
                    "window {window}"
                );
                *seen.entry(window).or_insert(0) += 1;
            }
        }
    }
    assert_eq!(seen.len(), 60);
    assert!(seen.values().all(|&n| n == 1), "{seen:?}");
}

#[test]
fn token_batches_are_bit_identical_for_any_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.u32.bin");
    let spec_tokens = stoker_datasets::SyntheticTokensSpec {
        tokens: 40_000,
        vocab: 100_000,
        dtype: stoker_datasets::TokenDtype::Uint32,
        seed: 1,
    };
    stoker_datasets::write_synthetic_tokens(&path, &spec_tokens).unwrap();
    let spec = windows_spec(&path, 128, 16);
    let one = epoch(&spec, 1, 0);
    assert_eq!(tensor(&one[0], "tokens").dtype, proto::Dtype::Uint32);
    assert_eq!(tensor(&one[0], "tokens").shape, [16, 129]);
    for threads in [2, 4] {
        assert_eq!(
            digest(&epoch(&spec, threads, 0)),
            digest(&one),
            "threads={threads}"
        );
    }
    assert_ne!(digest(&epoch(&spec, 2, 1)), digest(&one));
}

#[test]
fn a_token_file_needs_token_windows_of_a_known_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.bin");
    write_counting_tokens(&path, 1001);
    let image = spec(&path, stoker_pipeline::presets::imagenet_eval(32), 4);
    let error = Loader::new(image, LoaderOptions::default()).err().unwrap();
    assert_eq!(error.kind(), ErrorKind::InvalidArgument, "{error}");
    assert!(error.to_string().contains("TokenWindows"), "{error}");
    let mut odd = windows_spec(&path, 8, 4);
    odd.dataset.as_mut().unwrap().token_dtype = proto::Dtype::Uint32 as i32;
    let error = Loader::new(odd, LoaderOptions::default()).err().unwrap();
    assert!(error.to_string().contains("not a multiple"), "{error}");
}

const WORDS: [&str; 12] = [
    "stoker",
    "feeds",
    "the",
    "gpu",
    "with",
    "tokens",
    "packed",
    "into",
    "rows",
    "of",
    "text",
    "documents",
];

/// Document `i`: a seeded run of words, 1 to 40 of them.
fn document(i: usize) -> String {
    let count = 1 + (i * 7919) % 40;
    (0..count)
        .map(|w| WORDS[(i * 31 + w * 17) % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

pub(crate) struct TextFixture {
    _dir: tempfile::TempDir,
    pub(crate) jsonl: std::path::PathBuf,
    pub(crate) tokenizer: std::path::PathBuf,
}

/// 45 documents over two files; line 3 of b.jsonl is malformed (sample 31).
pub(crate) fn text_fixture() -> TextFixture {
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("docs");
    std::fs::create_dir(&jsonl).unwrap();
    let line = |i: usize| serde_json::json!({ "text": document(i), "id": i }).to_string();
    let a: Vec<String> = (0..29).map(line).collect();
    let mut b: Vec<String> = (29..45).map(line).collect();
    b[2] = "{\"text\": \"cut short".into();
    std::fs::write(jsonl.join("a.jsonl"), a.join("\n")).unwrap();
    std::fs::write(jsonl.join("b.jsonl"), b.join("\n") + "\n").unwrap();
    let tokenizer = dir.path().join("tokenizer.json");
    let corpus: Vec<String> = (0..200).map(document).collect();
    let corpus: Vec<&str> = corpus.iter().map(String::as_str).collect();
    stoker_pipeline::train_bpe_tokenizer(&corpus, 400, "<|endoftext|>", &tokenizer).unwrap();
    TextFixture {
        _dir: dir,
        jsonl,
        tokenizer,
    }
}

fn packed_spec(fixture: &TextFixture, seq_len: u32, batch_size: u32) -> JobSpec {
    let pipeline = vec![
        op(OpKind::Tokenize(proto::Tokenize {
            tokenizer_path: fixture.tokenizer.to_string_lossy().into_owned(),
        })),
        op(OpKind::PackSequences(proto::PackSequences {
            seq_len,
            eos_id: -1,
            pad_id: 1,
        })),
    ];
    spec(&fixture.jsonl, pipeline, batch_size)
}

#[test]
fn packed_text_follows_the_packing_rule_and_covers_every_document_once() {
    let fixture = text_fixture();
    let tokenizer = TextTokenizer::load(&fixture.tokenizer).unwrap();
    let base = packed_spec(&fixture, 24, 4);
    let mut seen = BTreeMap::new();
    let mut bad = Vec::new();
    for rank in 0..3 {
        let ranked = JobSpec {
            rank,
            world_size: 3,
            ..base.clone()
        };
        for batch in epoch(&ranked, 2, 0) {
            let rows = batch.sample_indices.len();
            for name in ["input_ids", "position_ids", "document_ids"] {
                let t = tensor(&batch, name);
                assert_eq!(
                    (t.dtype, t.shape.as_slice()),
                    (proto::Dtype::Int32, &[rows as u64, 24][..])
                );
            }
            // The same documents, tokenised and packed here, give the same rows.
            let documents: Vec<Vec<u32>> = batch
                .sample_indices
                .iter()
                .map(|&i| {
                    let used = batch
                        .bad_samples
                        .iter()
                        .find(|b| b.sample_index == i)
                        .map_or(i, |b| b.substitute_index);
                    tokenizer.encode(&document(used as usize)).unwrap()
                })
                .collect();
            let len = rows * 24 * 4;
            let (mut ids, mut positions, mut docs) = (vec![0; len], vec![0; len], vec![0; len]);
            let pack = PackSpec {
                seq_len: 24,
                eos_id: 0,
                pad_id: 1,
            };
            let rows_out = PackedRowsMut {
                input_ids: &mut ids,
                position_ids: &mut positions,
                document_ids: &mut docs,
            };
            pack_documents(&pack, &documents, rows_out);
            assert_eq!(ints(&tensor(&batch, "input_ids").data), ints(&ids));
            assert_eq!(ints(&tensor(&batch, "position_ids").data), ints(&positions));
            assert_eq!(ints(&tensor(&batch, "document_ids").data), ints(&docs));
            // Every row starts a sequence; EOS (id 0) follows each whole document.
            let positions = ints(&positions);
            assert!(positions.chunks(24).all(|row| row[0] == 0));
            for &i in &batch.sample_indices {
                *seen.entry(i).or_insert(0) += 1;
            }
            bad.extend(batch.bad_samples);
        }
    }
    assert_eq!(seen.len(), 45);
    assert!(seen.values().all(|&n| n == 1));
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!(bad[0].sample_index, 31);
    assert_eq!(bad[0].substitute_index, 32);
    assert!(bad[0].path.ends_with("b.jsonl:3"), "{}", bad[0].path);
    assert!(bad[0].reason.contains("invalid JSON"), "{}", bad[0].reason);
}

#[test]
fn packed_text_is_bit_identical_for_any_thread_count_and_fails_on_request() {
    let fixture = text_fixture();
    let spec = packed_spec(&fixture, 32, 8);
    let one = epoch(&spec, 1, 0);
    assert_eq!(one.len(), 6);
    for threads in [2, 3] {
        assert_eq!(
            digest(&epoch(&spec, threads, 0)),
            digest(&one),
            "threads={threads}"
        );
    }
    assert_ne!(digest(&epoch(&spec, 2, 1)), digest(&one));
    let strict = JobSpec {
        on_error: BadSamplePolicy::Fail as i32,
        shuffle: false,
        ..spec
    };
    let loader = Loader::new(strict, LoaderOptions::default()).unwrap();
    let error = loader
        .epoch(0, 0)
        .unwrap()
        .find_map(|b| b.err())
        .unwrap()
        .to_string();
    assert!(error.contains("b.jsonl:3"), "{error}");
}

#[test]
fn the_cli_inspects_benches_and_digests_token_files_and_jsonl() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.bin");
    let path_str = path.to_str().unwrap();
    let made = common::stdout_of(&["make-tokens", "--tokens", "100000", "--out", path_str]);
    assert!(made.contains("wrote 100000 uint16 tokens"), "{made}");
    let inspect = common::stdout_of(&["inspect", "--data", path_str, "--seq-len", "256"]);
    assert!(inspect.contains("tokens    100000"), "{inspect}");
    assert!(inspect.contains("dtype     uint16"), "{inspect}");
    assert!(inspect.contains("windows   390 of 257 tokens"), "{inspect}");
    let bench = common::stdout_of(&[
        "bench",
        "--data",
        path_str,
        "--seq-len",
        "256",
        "--batch-size",
        "8",
        "--threads",
        "2",
    ]);
    assert!(bench.contains("M tokens/s"), "{bench}");
    let hash = |threads: &str| {
        let out = common::stdout_of(&[
            "digest",
            "--data",
            path_str,
            "--seq-len",
            "256",
            "--threads",
            threads,
        ]);
        out.lines().last().unwrap().to_string()
    };
    assert_eq!(hash("1"), hash("3"));

    let fixture = text_fixture();
    let jsonl = fixture.jsonl.to_str().unwrap();
    let inspect = common::stdout_of(&["inspect", "--data", jsonl]);
    assert!(inspect.contains("documents 45"), "{inspect}");
    assert!(inspect.contains("malformed 1"), "{inspect}");
    let tokenizer = fixture.tokenizer.to_str().unwrap();
    let args = |threads: &'static str| {
        vec![
            "digest",
            "--data",
            jsonl,
            "--tokenizer",
            tokenizer,
            "--seq-len",
            "64",
            "--threads",
            threads,
        ]
    };
    let one = common::stdout_of(&args("1"));
    assert!(one.contains("bad samples replaced 1"), "{one}");
    assert_eq!(
        one.lines().last(),
        common::stdout_of(&args("2")).lines().last()
    );
    let missing = common::stoker(&["bench", "--data", jsonl]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("--tokenizer"));
}

#[test]
fn parquet_text_packs_like_the_same_documents_in_jsonl() {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, RecordBatch, StringArray};
    use parquet::arrow::ArrowWriter;

    let fixture = text_fixture();
    // The same 45 documents as a Parquet text column (the malformed JSONL line excepted:
    // document 31 is replaced by 32 in both, as the skip policy does for JSONL).
    let texts: Vec<String> = (0..45)
        .map(|i| document(if i == 31 { 32 } else { i }))
        .collect();
    let column: ArrayRef = Arc::new(StringArray::from_iter_values(texts));
    let batch = RecordBatch::try_from_iter([("text", column)]).unwrap();
    let parquet = fixture.tokenizer.with_file_name("docs.parquet");
    let mut writer = ArrowWriter::try_new(
        std::fs::File::create(&parquet).unwrap(),
        batch.schema(),
        None,
    )
    .unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();

    let from_jsonl = packed_spec(&fixture, 24, 4);
    let mut from_parquet = from_jsonl.clone();
    from_parquet.dataset = Some(proto::DatasetSource {
        uri: parquet.to_string_lossy().into_owned(),
        ..Default::default()
    });
    let jsonl = epoch(&from_jsonl, 2, 0);
    let table = epoch(&from_parquet, 2, 0);
    assert_eq!(jsonl.len(), table.len());
    for (a, b) in jsonl.iter().zip(&table) {
        for name in ["input_ids", "position_ids", "document_ids"] {
            assert_eq!(
                tensor(a, name).data,
                tensor(b, name).data,
                "step {} {name}",
                a.step
            );
        }
    }
}

/// Compresses `from` into `to` with gzip (as two members, as `cat a.gz b.gz` makes) or zstd.
fn compress(from: &Path, to: &Path) {
    use std::io::Write;
    let bytes = std::fs::read(from).unwrap();
    let out = std::fs::File::create(to).unwrap();
    if to.to_string_lossy().ends_with(".gz") {
        let (head, tail) = bytes.split_at(bytes.len() / 2);
        for part in [head, tail] {
            let mut encoder = flate2::write::GzEncoder::new(
                out.try_clone().unwrap(),
                flate2::Compression::fast(),
            );
            encoder.write_all(part).unwrap();
            encoder.finish().unwrap();
        }
    } else {
        zstd::stream::copy_encode(bytes.as_slice(), out, 3).unwrap();
    }
}

#[test]
fn compressed_jsonl_digests_like_the_plain_files() {
    let fixture = text_fixture();
    let compressed = fixture.jsonl.with_file_name("compressed");
    std::fs::create_dir(&compressed).unwrap();
    compress(
        &fixture.jsonl.join("a.jsonl"),
        &compressed.join("a.jsonl.gz"),
    );
    compress(
        &fixture.jsonl.join("b.jsonl"),
        &compressed.join("b.jsonl.zst"),
    );
    let cache = tempfile::tempdir().unwrap();
    let tokenizer = fixture.tokenizer.to_str().unwrap();
    let digest_of = |data: &Path| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_stoker"))
            .args(["digest", "--data", data.to_str().unwrap()])
            .args([
                "--tokenizer",
                tokenizer,
                "--seq-len",
                "64",
                "--threads",
                "2",
            ])
            .env("STOKER_CACHE_DIR", cache.path())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        stdout
    };
    let plain = digest_of(&fixture.jsonl);
    let from_compressed = digest_of(&compressed);
    assert_eq!(plain.lines().last(), from_compressed.lines().last());
    assert!(
        from_compressed.contains("bad samples replaced 1"),
        "{from_compressed}"
    );
    // Decompressed once, into the cache tier: a second run reads the copies made by the first.
    let copies: Vec<std::path::PathBuf> = walk(cache.path())
        .into_iter()
        .filter(|path| {
            // The copies (named by their file's version), not their locks or metadata.
            let name = path.to_string_lossy();
            name.contains(".decompressed-") && !name.contains(".stoker-")
        })
        .collect();
    assert_eq!(copies.len(), 2, "{copies:?}");
    let made = std::fs::metadata(&copies[0]).unwrap().modified().unwrap();
    assert_eq!(digest_of(&compressed), from_compressed);
    assert_eq!(
        std::fs::metadata(&copies[0]).unwrap().modified().unwrap(),
        made
    );
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// `make-tokens` writes no file its readers would misread: a uint32 file must be named so
/// (`*.u32.bin`), and an empty one is refused.
#[test]
fn make_tokens_refuses_a_name_readers_would_take_for_another_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let uint32_to = |out: &Path| {
        let out = out.to_str().unwrap();
        common::stoker(&[
            "make-tokens",
            "--tokens",
            "100",
            "--dtype",
            "uint32",
            "--out",
            out,
        ])
    };
    let plain = dir.path().join("llama.bin");
    let wrong = uint32_to(&plain);
    let plain = plain.to_str().unwrap();
    assert!(!wrong.status.success());
    let message = String::from_utf8_lossy(&wrong.stderr);
    assert!(message.contains("*.u32.bin"), "{message}");
    assert!(!Path::new(plain).exists());
    let empty = common::stoker(&["make-tokens", "--tokens", "0", "--out", plain]);
    assert!(!empty.status.success());
    let named = dir.path().join("llama.u32.bin");
    assert!(uint32_to(&named).status.success());
    assert_eq!(std::fs::metadata(&named).unwrap().len(), 400);
}
