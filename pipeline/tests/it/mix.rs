//! A mixed job's read-ahead: each source is told, before a batch is built, which of its own
//! samples that batch and the next one read (sources in object stores fetch them meanwhile).

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::sync::{Arc, Mutex};

use stoker_datasets::{SampleSource, TokenDtype, TokenFile, TokenWindowShape};
use stoker_pipeline::Job;
use stoker_proto::v1::{self as proto, op::Op as OpKind, JobSpec, MixEpochEnd};

/// A token file that records the read-ahead hints it gets.
struct Recording {
    inner: TokenFile,
    hints: Mutex<Vec<u64>>,
}

impl SampleSource for Recording {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn label(&self, index: u64) -> i64 {
        self.inner.label(index)
    }
    fn describe(&self, index: u64) -> String {
        self.inner.describe(index)
    }
    fn read(&self, index: u64) -> stoker_datasets::Result<Vec<u8>> {
        self.inner.read(index)
    }
    fn class_names(&self) -> &[String] {
        self.inner.class_names()
    }
    fn token_windows(&self) -> Option<TokenWindowShape> {
        self.inner.token_windows()
    }
    fn prefetch(&self, indices: &[u64]) {
        self.hints.lock().unwrap().extend_from_slice(indices);
    }
}

#[test]
fn each_mixed_source_is_told_its_samples_of_this_batch_and_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let mut sources = Vec::new();
    let mut recorders = Vec::new();
    for name in ["a.bin", "b.bin"] {
        let path = dir.path().join(name);
        let tokens: Vec<u8> = (0..4001u16).flat_map(u16::to_le_bytes).collect();
        std::fs::write(&path, tokens).unwrap();
        let recorder = Arc::new(Recording {
            inner: TokenFile::open(&path, TokenDtype::Uint16, 4).unwrap(),
            hints: Mutex::new(Vec::new()),
        });
        sources.push(Arc::clone(&recorder) as Arc<dyn SampleSource>);
        recorders.push(recorder);
    }
    let windows = vec![proto::Op {
        op: Some(OpKind::TokenWindows(proto::TokenWindows {
            seq_len: 4,
            ..Default::default()
        })),
    }];
    let source = |name: &str, weight: f64| proto::MixSource {
        dataset: Some(proto::DatasetSource {
            uri: dir.path().join(name).to_string_lossy().into_owned(),
            ..Default::default()
        }),
        pipeline: windows.clone(),
        weight,
    };
    let spec = JobSpec {
        batch_size: 10,
        seed: 1,
        shuffle: true,
        world_size: 1,
        mix: Some(proto::Mix {
            sources: vec![source("a.bin", 3.0), source("b.bin", 1.0)],
            window: 4,
            epoch_end: MixEpochEnd::FirstExhausted as i32,
            epoch_samples: 0,
        }),
        ..JobSpec::default()
    };
    let job = Job::with_sources(spec, sources).unwrap();
    let plan = job.plan(0).unwrap();
    let batch = job.batch(&plan, 0).unwrap();
    let next = job.batch(&plan, 1).unwrap();
    let source_of = |batch: &stoker_pipeline::Batch| -> Vec<i64> {
        let tensor = batch.tensor("source").unwrap();
        tensor
            .data
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    for (k, recorder) in recorders.iter().enumerate() {
        let hints = recorder.hints.lock().unwrap().clone();
        // Batch 0 built: hints for batches 0 and 1; batch 1 built: for 1 and 2.
        let mine = |batch: &stoker_pipeline::Batch| -> Vec<u64> {
            source_of(batch)
                .iter()
                .zip(&batch.sample_indices)
                .filter(|(s, _)| **s == k as i64)
                .map(|(_, i)| *i)
                .collect()
        };
        let (first, second) = (mine(&batch), mine(&next));
        assert!(
            !first.is_empty() && !second.is_empty(),
            "source {k} in both batches"
        );
        assert_eq!(
            hints[..first.len()],
            first[..],
            "source {k}: this batch first"
        );
        assert_eq!(
            hints[first.len()..first.len() + second.len()],
            second[..],
            "source {k}: then the next"
        );
    }
}

#[test]
fn a_mix_whose_batches_would_lay_out_too_many_windows_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.bin");
    let tokens: Vec<u8> = (0..4001u16).flat_map(u16::to_le_bytes).collect();
    std::fs::write(&path, tokens).unwrap();
    let spec = |world: u32| JobSpec {
        batch_size: 64,
        seed: 1,
        shuffle: true,
        world_size: world,
        mix: Some(proto::Mix {
            sources: vec![proto::MixSource {
                dataset: Some(proto::DatasetSource {
                    uri: path.to_string_lossy().into_owned(),
                    ..Default::default()
                }),
                pipeline: vec![proto::Op {
                    op: Some(OpKind::TokenWindows(proto::TokenWindows {
                        seq_len: 4,
                        ..Default::default()
                    })),
                }],
                weight: 1.0,
            }],
            window: 1 << 20,
            epoch_end: MixEpochEnd::Samples as i32,
            epoch_samples: 1 << 40,
        }),
        ..JobSpec::default()
    };
    let open = |world: u32| {
        let source: Arc<dyn SampleSource> =
            Arc::new(TokenFile::open(&path, TokenDtype::Uint16, 4).unwrap());
        Job::with_sources(spec(world), vec![source])
    };
    // 64 samples of one of 2^20 ranks: 64 windows of 2^20 positions per batch.
    let error = open(1 << 20).err().expect("refused").to_string();
    assert!(error.contains("window of 1048576 positions"), "{error}");
    assert!(error.contains("use a smaller window"), "{error}");
    // 8 ranks: one window per batch.
    assert!(open(8).is_ok());
    // At the bound: 3 * 2^14 ranks stride a batch over 3 * 2^20 positions, in 4 windows (2^22
    // positions); 2^16 ranks over 4 * 2^20, in 5.
    assert!(open(3 << 14).is_ok());
    let error = open(1 << 16).err().expect("refused").to_string();
    assert!(error.contains("lays out 5242880 positions"), "{error}");
}
