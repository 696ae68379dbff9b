//! Weighted mixes of sources end to end (embedded, and through real daemons): the counts of
//! every window exact over 10,000 samples, the same stream for the same seed whatever the
//! thread count, each epoch rule, resume mid-epoch and on another world size, sources with
//! their own pipelines, text packed after mixing, and sources that cannot mix refused by name.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use stoker_loader::Batch;
use stoker_pipeline::resized_spec;
use stoker_proto::v1::{self as proto, op::Op as OpKind, JobSpec, MixEpochEnd};

use crate::common::{self, digest, elements, epoch_batches, tensor};

fn op(kind: OpKind) -> proto::Op {
    proto::Op { op: Some(kind) }
}

/// A mix of `sources` (dataset, pipeline, weight) with a window of 100.
fn mix_spec(
    sources: &[(&Path, Vec<proto::Op>, f64)],
    end: MixEpochEnd,
    epoch_samples: u64,
    batch_size: u32,
) -> JobSpec {
    let sources = sources
        .iter()
        .map(|(path, pipeline, weight)| proto::MixSource {
            dataset: Some(proto::DatasetSource {
                uri: path.to_string_lossy().into_owned(),
                ..Default::default()
            }),
            pipeline: pipeline.clone(),
            weight: *weight,
        })
        .collect();
    JobSpec {
        dataset: None,
        mix: Some(proto::Mix {
            sources,
            window: 100,
            epoch_end: end as i32,
            epoch_samples,
        }),
        ..common::spec_over("", Vec::new(), batch_size)
    }
}

/// Token `i` of source `source`'s file is `source * 30_000 + i % 30_000`: window `j` of
/// `seq_len + 1` tokens starts with `source * 30_000 + (j * seq_len) % 30_000`, which names
/// it (for `j < 30_000` when 7 and 30,000 share no factor).
fn write_tokens(path: &Path, source: u16, windows: u32, seq_len: u32) {
    let tokens = windows * seq_len + 1;
    let bytes: Vec<u8> = (0..tokens)
        .flat_map(|i| (source * 30_000 + (i % 30_000) as u16).to_le_bytes())
        .collect();
    std::fs::write(path, bytes).unwrap();
}

struct Tokens {
    _dir: tempfile::TempDir,
    a: PathBuf,
    b: PathBuf,
}

const SEQ_LEN: u32 = 7;

/// Two token files: 8,000 windows of source 0 and 4,000 of source 1.
fn tokens() -> Tokens {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.bin");
    let b = dir.path().join("b.bin");
    write_tokens(&a, 0, 8_000, SEQ_LEN);
    write_tokens(&b, 1, 4_000, SEQ_LEN);
    Tokens { _dir: dir, a, b }
}

fn windows() -> Vec<proto::Op> {
    vec![op(OpKind::TokenWindows(proto::TokenWindows {
        seq_len: SEQ_LEN,
        ..Default::default()
    }))]
}

fn token_mix(fixture: &Tokens, end: MixEpochEnd, epoch_samples: u64, batch: u32) -> JobSpec {
    mix_spec(
        &[
            (fixture.a.as_path(), windows(), 0.7),
            (fixture.b.as_path(), windows(), 0.3),
        ],
        end,
        epoch_samples,
        batch,
    )
}

/// (source, sample index) of every row of `batch`, in order; checks that each row's tokens
/// are that sample's.
fn batch_rows(batch: &Batch) -> Vec<(i64, u64)> {
    let sources = elements::<i64>(tensor(batch, "source"));
    let tokens = elements::<u16>(tensor(batch, "tokens"));
    assert_eq!(sources.len(), batch.sample_indices.len());
    let mut rows = Vec::new();
    for (row, (&source, &index)) in sources.iter().zip(&batch.sample_indices).enumerate() {
        let first = tokens[row * (SEQ_LEN as usize + 1)];
        let expected = source as u64 * 30_000 + (index * u64::from(SEQ_LEN)) % 30_000;
        assert_eq!(
            u64::from(first),
            expected,
            "row {row} of step {}",
            batch.step
        );
        rows.push((source, index));
    }
    rows
}

/// Each batch of `epoch` of `spec` from `step` on (at most `steps` of them), given to `each`
/// and dropped: a long epoch must not hold every slot of the loader.
fn stream(
    spec: &JobSpec,
    threads: usize,
    (epoch, step): (u64, u64),
    steps: Option<usize>,
    mut each: impl FnMut(&Batch),
) {
    let loader = common::embedded_loader(spec.clone(), threads).unwrap();
    let mut stream = loader.epoch(epoch, step).unwrap();
    let mut taken = 0;
    while steps.is_none_or(|s| taken < s) {
        let Some(batch) = stream.next_batch().unwrap() else {
            break;
        };
        each(&batch);
        taken += 1;
    }
}

/// The rows of `epoch` of `spec` (see [`batch_rows`]).
fn rows(spec: &JobSpec, threads: usize, epoch: u64) -> Vec<(i64, u64)> {
    let mut rows = Vec::new();
    stream(spec, threads, (epoch, 0), None, |b| {
        rows.extend(batch_rows(b))
    });
    rows
}

/// The digest of each batch of `epoch` of `spec` from `step` on.
fn digests(spec: &JobSpec, threads: usize, epoch: u64, step: u64) -> Vec<String> {
    let mut digests = Vec::new();
    stream(spec, threads, (epoch, step), None, |b| {
        digests.push(digest(std::slice::from_ref(b)))
    });
    digests
}

#[test]
fn every_window_of_100_holds_exactly_70_and_30_over_10000_samples() {
    let fixture = tokens();
    let spec = token_mix(&fixture, MixEpochEnd::Samples, 10_000, 64);
    let rows = rows(&spec, 2, 0);
    assert_eq!(rows.len(), 10_000);
    for (w, window) in rows.chunks(100).enumerate() {
        let zeros = window.iter().filter(|(s, _)| *s == 0).count();
        assert_eq!((zeros, window.len() - zeros), (70, 30), "window {w}");
    }
    // 7,000 and 3,000 draws are within one pass of each source: no sample twice.
    let distinct: BTreeSet<&(i64, u64)> = rows.iter().collect();
    assert_eq!(distinct.len(), 10_000);
    // The rows are shuffled within sources, not read in file order.
    let firsts: Vec<u64> = rows
        .iter()
        .filter(|r| r.0 == 0)
        .take(5)
        .map(|r| r.1)
        .collect();
    assert_ne!(firsts, vec![0, 1, 2, 3, 4]);
}

#[test]
fn the_same_seed_gives_the_same_stream_whatever_the_thread_count() {
    let fixture = tokens();
    let spec = token_mix(&fixture, MixEpochEnd::Samples, 2_000, 50);
    let one = digests(&spec, 1, 0, 0);
    assert_eq!(one, digests(&spec, 4, 0, 0));
    assert_ne!(one, digests(&spec, 1, 1, 0), "epochs differ");
    let reseeded = JobSpec {
        seed: spec.seed + 1,
        ..spec.clone()
    };
    assert_ne!(one, digests(&reseeded, 1, 0, 0), "seeds differ");
}

#[test]
fn each_epoch_rule_ends_where_it_says() {
    let fixture = tokens();
    // First exhausted: counts 70 and 30; 8000 / 70 = 114 and 4000 / 30 = 133 windows.
    let first = rows(
        &token_mix(&fixture, MixEpochEnd::FirstExhausted, 0, 100),
        2,
        0,
    );
    assert_eq!(first.len(), 11_400);
    let distinct: BTreeSet<&(i64, u64)> = first.iter().collect();
    assert_eq!(distinct.len(), 11_400, "no repeats");
    // All exhausted: ceil(4000 / 30) = 134 windows; source 0 restarts after 8,000.
    let all = rows(
        &token_mix(&fixture, MixEpochEnd::AllExhausted, 0, 100),
        2,
        0,
    );
    assert_eq!(all.len(), 13_400);
    let mut per_source: BTreeMap<i64, BTreeMap<u64, u32>> = BTreeMap::new();
    for &(source, index) in &all {
        let counts = per_source.entry(source).or_default();
        *counts.entry(index).or_default() += 1;
    }
    assert_eq!(per_source[&1].len(), 4_000, "every sample of source 1");
    assert_eq!(per_source[&0].len(), 8_000, "every sample of source 0");
    let repeats: u32 = per_source[&0].values().map(|n| n - 1).sum();
    assert_eq!(repeats, 134 * 70 - 8_000, "source 0 restarted for the rest");
    // A fixed count of samples, not a multiple of the window.
    let fixed = rows(&token_mix(&fixture, MixEpochEnd::Samples, 250, 100), 1, 0);
    assert_eq!(fixed.len(), 250);
}

#[test]
fn a_mixed_epoch_resumes_mid_epoch_and_on_another_world_size() {
    let fixture = tokens();
    let spec = token_mix(&fixture, MixEpochEnd::FirstExhausted, 0, 100);
    // The epoch started at step 40 is the tail of the uninterrupted one.
    let whole = digests(&spec, 2, 3, 0);
    assert_eq!(whole.len(), 114);
    assert_eq!(digests(&spec, 2, 3, 40), whole[40..]);
    // Two ranks read 20 steps each, then three ranks read the rest: each row once.
    let ranked = |rank, world| JobSpec {
        rank,
        world_size: world,
        ..spec.clone()
    };
    let mut seen: Vec<(i64, u64)> = Vec::new();
    for rank in 0..2 {
        stream(&ranked(rank, 2), 1, (3, 0), Some(20), |b| {
            seen.extend(batch_rows(b))
        });
    }
    for rank in 0..3 {
        let resumed = resized_spec(&ranked(rank, 3), 11_400, 3, 2, Vec::new(), &[20, 20]).unwrap();
        seen.extend(rows(&resumed, 1, 3));
    }
    let distinct: BTreeSet<&(i64, u64)> = seen.iter().collect();
    assert_eq!(distinct.len(), 11_400, "every row of the epoch");
    // 7,400 rows left over 3 ranks: ceil(7400 / 3) * 3 = 7,401, one padded repeat.
    assert_eq!(seen.len(), 11_401, "one padded repeat, nothing else twice");
    let mut whole_rows = rows(&spec, 2, 3);
    whole_rows.sort_unstable();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen, whole_rows, "the same rows as the one-rank epoch");
}
#[test]
fn image_sources_keep_their_own_pipelines_and_labels() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    common::make_images(&a, 40);
    common::make_images(&b, 20);
    let spec = mix_spec(
        &[
            (
                a.as_path(),
                stoker_pipeline::presets::imagenet_train(32),
                2.0,
            ),
            (
                b.as_path(),
                stoker_pipeline::presets::imagenet_eval(32),
                1.0,
            ),
        ],
        MixEpochEnd::FirstExhausted,
        0,
        12,
    );
    // Windows of 3 give 2 and 1: 40 / 2 = 20 and 20 / 1 = 20 windows.
    let spec = JobSpec {
        mix: spec.mix.map(|mix| proto::Mix { window: 3, ..mix }),
        ..spec
    };
    let batches = epoch_batches(&spec, 2, 0);
    assert_eq!(digest(&batches), digest(&epoch_batches(&spec, 1, 0)));
    for batch in &batches {
        let sources = elements::<i64>(tensor(batch, "source"));
        assert_eq!(tensor(batch, "image").shape[0] as usize, sources.len());
        assert_eq!(elements::<i64>(tensor(batch, "label")).len(), sources.len());
    }
    let sources: Vec<i64> = batches
        .iter()
        .flat_map(|b| elements::<i64>(tensor(b, "source")))
        .collect();
    assert_eq!(sources.len(), 60, "20 windows of 2 + 1");
    for window in sources.chunks(3) {
        assert_eq!(window.iter().filter(|&&s| s == 0).count(), 2);
    }
    // The eval pipeline is deterministic: source 1's sample i is the same image in any epoch,
    // while the train pipeline crops differently.
    let image_of = |batches: &[Batch], source: i64, index: u64| -> Vec<u8> {
        for batch in batches {
            let sources = elements::<i64>(tensor(batch, "source"));
            let image = tensor(batch, "image");
            let row = image.data.len() / sources.len();
            for (r, (&s, &i)) in sources.iter().zip(&batch.sample_indices).enumerate() {
                if s == source && i == index {
                    return image.data[r * row..(r + 1) * row].to_vec();
                }
            }
        }
        panic!("sample {index} of source {source} not in the epoch");
    };
    let next = epoch_batches(&spec, 2, 1);
    assert_eq!(image_of(&batches, 1, 7), image_of(&next, 1, 7));
    assert_ne!(image_of(&batches, 0, 7), image_of(&next, 0, 7));
}

#[test]
fn text_sources_are_packed_after_mixing() {
    let dir = tempfile::tempdir().unwrap();
    let document = |source: usize, i: usize| {
        format!("source {source} document {i} says the quick brown fox jumps over lazy dogs")
    };
    let mut folders = Vec::new();
    for source in 0..2 {
        let folder = dir.path().join(format!("docs{source}"));
        std::fs::create_dir(&folder).unwrap();
        let lines: Vec<String> = (0..40)
            .map(|i| serde_json::json!({ "text": document(source, i) }).to_string())
            .collect();
        std::fs::write(folder.join("part.jsonl"), lines.join("\n")).unwrap();
        folders.push(folder);
    }
    let tokenizer = dir.path().join("tokenizer.json");
    let corpus: Vec<String> = (0..40)
        .flat_map(|i| [document(0, i), document(1, i)])
        .collect();
    let corpus: Vec<&str> = corpus.iter().map(String::as_str).collect();
    stoker_pipeline::train_bpe_tokenizer(&corpus, 300, "<|endoftext|>", &tokenizer).unwrap();
    let pipeline = vec![
        op(OpKind::Tokenize(proto::Tokenize {
            tokenizer_path: tokenizer.to_string_lossy().into_owned(),
        })),
        op(OpKind::PackSequences(proto::PackSequences {
            seq_len: 64,
            eos_id: -1,
            pad_id: 1,
        })),
    ];
    let spec = mix_spec(
        &[
            (folders[0].as_path(), pipeline.clone(), 0.5),
            (folders[1].as_path(), pipeline, 0.5),
        ],
        MixEpochEnd::FirstExhausted,
        0,
        8,
    );
    let spec = JobSpec {
        mix: spec.mix.map(|mix| proto::Mix { window: 4, ..mix }),
        ..spec
    };
    let batches = epoch_batches(&spec, 2, 0);
    let mut rows_with_both = 0;
    for batch in &batches {
        let sources = elements::<i64>(tensor(batch, "source"));
        assert_eq!(sources.len(), 8, "one source per document");
        let documents = elements::<i32>(tensor(batch, "document_ids"));
        for row in documents.chunks(64) {
            let in_row: BTreeSet<i64> = row
                .iter()
                .filter(|&&d| d >= 0)
                .map(|&d| sources[d as usize])
                .collect();
            if in_row.len() == 2 {
                rows_with_both += 1;
            }
        }
    }
    assert!(
        rows_with_both > 0,
        "a packed row holds documents of both sources"
    );
}

#[test]
fn sources_that_cannot_mix_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    common::make_images(&a, 10);
    common::make_images(&b, 10);
    let spec = mix_spec(
        &[
            (
                a.as_path(),
                stoker_pipeline::presets::imagenet_train(32),
                1.0,
            ),
            (
                b.as_path(),
                stoker_pipeline::presets::imagenet_train(48),
                1.0,
            ),
        ],
        MixEpochEnd::AllExhausted,
        0,
        4,
    );
    let error = common::try_epoch(&spec, 1, 0)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(error.contains("source 1 gives image"), "{error}");
    assert!(
        error.contains("[32, 32, 3]") || error.contains("32"),
        "{error}"
    );
    let bad_weight = mix_spec(
        &[
            (
                a.as_path(),
                stoker_pipeline::presets::imagenet_train(32),
                1.0,
            ),
            (
                b.as_path(),
                stoker_pipeline::presets::imagenet_train(32),
                0.0,
            ),
        ],
        MixEpochEnd::AllExhausted,
        0,
        4,
    );
    let error = common::try_epoch(&bad_weight, 1, 0)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(error.contains("weight of mixed source 1"), "{error}");
}

#[test]
fn a_mix_through_the_daemons_gives_the_embedded_batches() {
    let fixture = tokens();
    let spec = token_mix(&fixture, MixEpochEnd::Samples, 3_000, 100);
    let state = tempfile::tempdir().unwrap();
    let coordinator = common::Daemon::coordinator(state.path(), "127.0.0.1:0");
    let root = fixture.a.parent().unwrap();
    let _worker = common::Daemon::worker(&coordinator.address, root);
    let remote = crate::distributed::remote(&coordinator.address, spec.clone()).unwrap();
    let mut stream = remote.epoch(0, 0).unwrap();
    let mut through_daemons = Vec::new();
    while let Some(batch) = stream.next_batch().unwrap() {
        through_daemons.push(digest(std::slice::from_ref(&batch)));
    }
    assert_eq!(through_daemons, digests(&spec, 2, 0, 0));
}
