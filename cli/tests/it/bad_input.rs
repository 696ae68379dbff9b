//! Bad input never crashes the loader: missing, zero-byte, truncated and corrupt files,
//! non-images and images over the pixel limit, under both the skip and the fail policy.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use stoker_loader::{Loader, LoaderOptions};
use stoker_proto::v1::{BadSamplePolicy, JobSpec};

use crate::common;

/// Bad files added to class_00 (they sort after the generated `img_*` files), with a word the
/// reason must contain.
const BAD_KINDS: [(&str, &str); 7] = [
    ("zz_1_empty.jpg", "empty file"),
    ("zz_2_truncated.jpg", "corrupt"),
    ("zz_3_garbage_after_magic.jpg", "corrupt"),
    ("zz_4_scrambled_body.jpg", "corrupt"),
    ("zz_5_text.jpg", "not an image Stoker decodes"),
    ("zz_6_huge.jpg", "exceeds the limit"),
    ("zz_7_missing.jpg", "unreadable"),
];

fn first_jpeg(dir: &Path) -> Vec<u8> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("class_00"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jpg"))
        .collect();
    files.sort();
    std::fs::read(&files[0]).unwrap()
}

/// A small deterministic byte stream for scrambling.
fn noise(len: usize, mut state: u64) -> Vec<u8> {
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u8
        })
        .collect()
}

fn with_huge_frame_header(jpeg: &[u8]) -> Vec<u8> {
    let mut bytes = jpeg.to_vec();
    let sof = bytes
        .windows(2)
        .position(|w| w[0] == 0xFF && (w[1] == 0xC0 || w[1] == 0xC2))
        .expect("frame header");
    // 50000 x 50000 = 2.5 gigapixels, far over the 89.5 MP default.
    bytes[sof + 5..sof + 7].copy_from_slice(&50_000u16.to_be_bytes());
    bytes[sof + 7..sof + 9].copy_from_slice(&50_000u16.to_be_bytes());
    bytes
}

/// 20 good images plus every bad kind; the missing one is deleted after the loader indexed it.
fn bad_dataset(dir: &Path) {
    common::make_images(dir, 20);
    let good = first_jpeg(dir);
    let class = dir.join("class_00");
    let mut scrambled = good.clone();
    let body = scrambled.len() / 3;
    let tail = noise(scrambled.len() - body, 7);
    scrambled[body..].copy_from_slice(&tail);
    let mut garbage = vec![0xFF, 0xD8, 0xFF];
    garbage.extend(noise(5000, 9));
    let contents: [Vec<u8>; 7] = [
        Vec::new(),
        good[..good.len() * 2 / 5].to_vec(),
        garbage,
        scrambled,
        b"this is not an image\n".to_vec(),
        with_huge_frame_header(&good),
        good.clone(),
    ];
    for ((name, _), bytes) in BAD_KINDS.iter().zip(contents) {
        std::fs::write(class.join(name), bytes).unwrap();
    }
}

fn spec(dir: &Path, batch_size: u32, policy: BadSamplePolicy) -> JobSpec {
    JobSpec {
        shuffle: false,
        on_error: policy as i32,
        ..common::train_spec(dir, batch_size)
    }
}

fn open(dir: &Path, spec: JobSpec) -> Loader {
    let loader = common::embedded_loader(spec, 2).unwrap();
    std::fs::remove_file(dir.join("class_00").join(BAD_KINDS[6].0)).ok();
    loader
}

/// A loader over a new [`bad_dataset`] in a temporary folder (kept alive by the caller).
fn open_bad_dataset(batch_size: u32, policy: BadSamplePolicy) -> (tempfile::TempDir, Loader) {
    let dir = tempfile::tempdir().unwrap();
    bad_dataset(dir.path());
    let loader = open(dir.path(), spec(dir.path(), batch_size, policy));
    (dir, loader)
}

#[test]
fn skip_replaces_each_bad_sample_and_keeps_batch_shapes() {
    let (_dir, loader) = open_bad_dataset(9, BadSamplePolicy::Skip);
    let mut reported = BTreeMap::new();
    let mut samples = 0;
    for batch in loader.epoch(0, 0).unwrap() {
        let batch = batch.unwrap();
        let n = batch.sample_indices.len();
        samples += n;
        assert_eq!(
            batch.tensors[0].data.len(),
            n * 32 * 32 * 3,
            "batch keeps its shape"
        );
        for bad in batch.bad_samples {
            assert_ne!(bad.substitute_index, bad.sample_index);
            reported.insert(bad.path.clone(), bad.reason.clone());
        }
    }
    assert_eq!(samples, 27);
    assert_each_bad_kind_named(|name| {
        reported
            .iter()
            .find(|(path, _)| path.ends_with(name))
            .map(|(_, reason)| reason.clone())
    });
    assert_eq!(loader.stats().bad_samples, 7);
}

/// Epoch 0's batches that came, and the messages of those that failed.
fn epoch_outcomes(loader: &Loader) -> (usize, Vec<String>) {
    let mut good = 0;
    let mut errors = Vec::new();
    for result in loader.epoch(0, 0).unwrap() {
        match result {
            Ok(_) => good += 1,
            Err(error) => errors.push(error.to_string()),
        }
    }
    (good, errors)
}

/// Asserts that `explain` finds a message for each of [`BAD_KINDS`]'s files, and that it says
/// what is wrong with the file.
fn assert_each_bad_kind_named(explain: impl Fn(&str) -> Option<String>) {
    for (name, word) in BAD_KINDS {
        let message = explain(name).unwrap_or_else(|| panic!("nothing names {name}"));
        assert!(message.contains(word), "{name}: {message:?} lacks {word:?}");
    }
}

#[test]
fn skip_is_deterministic_across_thread_counts() {
    let dir = tempfile::tempdir().unwrap();
    bad_dataset(dir.path());
    let mut digests = Vec::new();
    for threads in [1, 3] {
        let loader =
            common::embedded_loader(spec(dir.path(), 5, BadSamplePolicy::Skip), threads).unwrap();
        let mut digest = stoker_loader::BatchDigest::new();
        for batch in loader.epoch(0, 0).unwrap() {
            digest.update(&batch.unwrap());
        }
        digests.push(digest.hex());
    }
    assert_eq!(digests[0], digests[1]);
}

#[test]
fn fail_names_each_bad_file() {
    let (_dir, loader) = open_bad_dataset(1, BadSamplePolicy::Fail);
    let (good, errors) = epoch_outcomes(&loader);
    assert_eq!(good, 20);
    assert_eq!(errors.len(), 7, "{errors:#?}");
    assert_each_bad_kind_named(|name| errors.iter().find(|m| m.contains(name)).cloned());
}

#[test]
fn a_dataset_of_only_bad_files_fails_clearly_even_when_skipping() {
    let dir = tempfile::tempdir().unwrap();
    let class = dir.path().join("only");
    std::fs::create_dir_all(&class).unwrap();
    for i in 0..3 {
        std::fs::write(class.join(format!("{i}.jpg")), b"nope").unwrap();
    }
    let loader = common::embedded_loader(spec(dir.path(), 2, BadSamplePolicy::Skip), 1).unwrap();
    let message = loader
        .epoch(0, 0)
        .unwrap()
        .next()
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(message.contains("could replace it"), "{message}");
}

/// A folder whose samples 3 and 11 read back as a truncated and a scrambled JPEG, to write
/// Parquet files with corrupt image cells.
struct CorruptCells {
    folder: stoker_datasets::ImageFolder,
}

impl stoker_datasets::SampleSource for CorruptCells {
    fn len(&self) -> u64 {
        self.folder.len()
    }
    fn label(&self, index: u64) -> i64 {
        self.folder.label(index)
    }
    fn describe(&self, index: u64) -> String {
        self.folder.describe(index)
    }
    fn read(&self, index: u64) -> stoker_datasets::Result<Vec<u8>> {
        let mut bytes = self.folder.read(index)?;
        match index {
            3 => bytes.truncate(bytes.len() * 2 / 5),
            11 => {
                let body = bytes.len() / 3;
                let tail = noise(bytes.len() - body, 5);
                bytes[body..].copy_from_slice(&tail);
            }
            _ => {}
        }
        Ok(bytes)
    }
    fn class_names(&self) -> &[String] {
        self.folder.class_names()
    }
}

/// 16 images as Parquet (row groups of 5) with corrupt JPEG cells at rows 3 and 11.
fn parquet_with_corrupt_cells(dir: &Path) -> PathBuf {
    let folder = dir.join("folder");
    common::make_images(&folder, 16);
    let source = CorruptCells {
        folder: stoker_datasets::ImageFolder::open(&folder).unwrap(),
    };
    let out = dir.join("parquet");
    stoker_datasets::write_parquet(
        &source,
        &out,
        &stoker_datasets::ParquetWriterOptions {
            file_bytes: u64::MAX,
            rows_per_group: 5,
        },
        &|_| {},
    )
    .unwrap();
    out
}

#[test]
fn corrupt_parquet_cells_are_skipped_or_named_by_file_and_row() {
    let dir = tempfile::tempdir().unwrap();
    let parquet = parquet_with_corrupt_cells(dir.path());

    let loader = open(dir.path(), spec(&parquet, 4, BadSamplePolicy::Skip));
    let mut reported = Vec::new();
    let mut samples = 0;
    for batch in loader.epoch(0, 0).unwrap() {
        let batch = batch.unwrap();
        samples += batch.sample_indices.len();
        assert_eq!(
            batch.tensors[0].data.len(),
            batch.sample_indices.len() * 32 * 32 * 3
        );
        for bad in batch.bad_samples {
            reported.push((bad.sample_index, bad.path, bad.reason));
        }
    }
    assert_eq!(samples, 16);
    reported.sort();
    assert_eq!(reported.len(), 2, "{reported:?}");
    for ((index, path, reason), row) in reported.iter().zip([3, 11]) {
        assert_eq!(*index, row);
        assert!(
            path.ends_with(&format!("part-000000.parquet:row {row}")),
            "{path}"
        );
        assert!(reason.contains("corrupt"), "{reason}");
    }

    let loader = open(dir.path(), spec(&parquet, 1, BadSamplePolicy::Fail));
    let (_, errors) = epoch_outcomes(&loader);
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert!(
        errors[0].contains("part-000000.parquet:row 3"),
        "{}",
        errors[0]
    );
    assert!(
        errors[1].contains("part-000000.parquet:row 11"),
        "{}",
        errors[1]
    );
}

#[test]
fn a_damaged_parquet_row_group_fails_its_samples_not_the_loader() {
    let dir = tempfile::tempdir().unwrap();
    let parquet = parquet_with_corrupt_cells(dir.path());
    let file = parquet.join("part-000000.parquet");
    // Row group 1 starts at sample 5: its image page holds sample 5's JPEG first, preceded by
    // the page header and a 4-byte length. Overwrite the header.
    let folder = stoker_datasets::ImageFolder::open(&dir.path().join("folder")).unwrap();
    let fifth = stoker_datasets::SampleSource::read(&folder, 5).unwrap();
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes
        .windows(fifth.len())
        .position(|window| window == fifth.as_slice())
        .unwrap();
    bytes[at - 16..at - 4].fill(0xFF);
    std::fs::write(&file, bytes).unwrap();

    let loader = open(dir.path(), spec(&parquet, 1, BadSamplePolicy::Fail));
    let (_, errors) = epoch_outcomes(&loader);
    // Rows 5..10 (row group 1) fail with the group named; row 3 and 11 are corrupt JPEGs.
    let group_errors: Vec<&String> = errors
        .iter()
        .filter(|error| error.contains("row group 1 (rows 5..10)"))
        .collect();
    assert_eq!(group_errors.len(), 5, "{errors:#?}");
    assert_eq!(errors.len(), 7, "{errors:#?}");

    // A file cut short fails the open, naming the file.
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    let error = Loader::new(
        spec(&parquet, 4, BadSamplePolicy::Skip),
        LoaderOptions::default(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(error.contains("part-000000.parquet"), "{error}");
}
