//! `TarShards` against shards built here with the `tar` crate: keys and labels, shard order,
//! the index cache (reused, rebuilt when stale or corrupt, moved to the fallback folder), and
//! bad input (truncated members, incomplete samples, corrupt headers) that must never crash.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use stoker_datasets::{
    write_tar_shards, Error, SampleSource, TarShards, TarShardsWriterOptions, WriteError,
    CLASSES_FILE,
};

/// A tar archive holding `members` (name, data) in order, as regular files.
fn tar_bytes(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, data) in members {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        builder.append_data(&mut header, name, *data).unwrap();
    }
    builder.into_inner().unwrap()
}

fn write_shard(path: &Path, members: &[(&str, &[u8])]) {
    std::fs::write(path, tar_bytes(members)).unwrap();
}

fn cache_of(shard: &Path) -> PathBuf {
    let mut name = shard.file_name().unwrap().to_os_string();
    name.push(".stoker-idx");
    shard.with_file_name(name)
}

fn read_all(shards: &TarShards) -> Vec<(Vec<u8>, i64)> {
    (0..shards.len())
        .map(|index| (shards.read(index).unwrap(), shards.label(index)))
        .collect()
}

/// Three complete samples, labelled 0, 1, 2 by `.cls`, with the label member first.
fn three_samples() -> Vec<(String, Vec<u8>)> {
    let mut members = Vec::new();
    for index in 0..3 {
        members.push((format!("s/{index:04}.cls"), index.to_string().into_bytes()));
        members.push((
            format!("s/{index:04}.jpg"),
            format!("image {index}").repeat(100).into_bytes(),
        ));
    }
    members
}

fn as_refs(members: &[(String, Vec<u8>)]) -> Vec<(&str, &[u8])> {
    members
        .iter()
        .map(|(name, data)| (name.as_str(), data.as_slice()))
        .collect()
}

#[test]
fn keys_group_members_and_labels_come_from_cls_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let shard = dir.path().join("data.tar");
    write_shard(
        &shard,
        &[
            ("dir/0001.jpg", b"jpeg one"),
            ("dir/0001.cls", b" 3\n"),
            ("dir/0001.txt", b"a caption, ignored"),
            ("dir/0002.json", br#"{"label": 1, "source": "x"}"#),
            ("dir/0002.png", b"png two"),
            ("dir/0003.JPEG", b"jpeg three"),
            ("dir/0003.json", br#"{"cls": 2}"#),
            ("dir/0004.jpg", b"jpeg four"),
            ("dir/0004.json", br#"{"label": 9}"#),
            ("dir/0004.cls", b"0"),
        ],
    );
    for path in [dir.path(), shard.as_path()] {
        let shards = TarShards::open(path).unwrap();
        assert_eq!(shards.len(), 4);
        assert_eq!(
            read_all(&shards),
            [
                (b"jpeg one".to_vec(), 3),
                (b"png two".to_vec(), 1),
                (b"jpeg three".to_vec(), 2),
                // `.cls` wins over `.json`.
                (b"jpeg four".to_vec(), 0),
            ]
        );
        assert_eq!(shards.class_names(), ["0", "1", "2", "3"]);
        assert!(shards.describe(1).ends_with("data.tar:dir/0002.png"));
        assert!(shards.describe(4).contains("out of range"));
        assert!(matches!(
            shards.read(4),
            Err(Error::IndexOutOfRange { index: 4, len: 4 })
        ));
        assert_eq!(shards.index_stats().problems, 0);
    }
}

#[test]
fn shards_are_read_in_name_order_with_classes_txt() {
    let dir = tempfile::tempdir().unwrap();
    write_shard(
        &dir.path().join("b.tar"),
        &[("x.jpg", b"from b"), ("x.cls", b"1")],
    );
    write_shard(
        &dir.path().join("a.tar"),
        &[
            ("x.jpg", b"from a 0"),
            ("x.cls", b"0"),
            ("y.jpg", b"from a 1"),
            ("y.cls", b"1"),
        ],
    );
    std::fs::write(dir.path().join("notes.txt"), "not a shard").unwrap();
    std::fs::write(dir.path().join(CLASSES_FILE), "cat\ndog\n").unwrap();
    let shards = TarShards::open(dir.path()).unwrap();
    assert_eq!(shards.index_stats().shards, 2);
    assert_eq!(
        read_all(&shards),
        [
            (b"from a 0".to_vec(), 0),
            (b"from a 1".to_vec(), 1),
            (b"from b".to_vec(), 1)
        ]
    );
    assert_eq!(shards.class_names(), ["cat", "dog"]);
    assert!(shards.describe(2).ends_with("b.tar:x.jpg"));
}

#[test]
fn reads_from_many_threads_agree() {
    let dir = tempfile::tempdir().unwrap();
    write_shard(&dir.path().join("a.tar"), &as_refs(&three_samples()));
    let shards = TarShards::open(dir.path()).unwrap();
    let expected = read_all(&shards);
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..50 {
                    assert_eq!(read_all(&shards), expected);
                }
            });
        }
    });
}

#[test]
fn the_index_cache_is_reused_and_rebuilt_when_stale_or_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let shard = dir.path().join("a.tar");
    write_shard(&shard, &as_refs(&three_samples()));
    let no_fallback = None;

    let first = TarShards::open_with_cache_dir(dir.path(), no_fallback).unwrap();
    assert_eq!(
        (
            first.index_stats().built,
            first.index_stats().loaded_from_cache
        ),
        (1, 0)
    );
    assert!(cache_of(&shard).is_file());
    let expected = read_all(&first);

    let second = TarShards::open_with_cache_dir(dir.path(), no_fallback).unwrap();
    assert_eq!(second.index_stats().loaded_from_cache, 1);
    assert_eq!(read_all(&second), expected);

    // Stale by mtime alone: same size, other time.
    let file = File::options().write(true).open(&shard).unwrap();
    file.set_modified(SystemTime::now() + Duration::from_secs(10))
        .unwrap();
    drop(file);
    let touched = TarShards::open_with_cache_dir(dir.path(), no_fallback).unwrap();
    assert_eq!(touched.index_stats().built, 1);
    assert_eq!(read_all(&touched), expected);

    // Stale by content: the shard is rewritten with one sample more.
    let mut members = three_samples();
    members.push(("s/0003.jpg".into(), b"image 3".to_vec()));
    members.push(("s/0003.cls".into(), b"1".to_vec()));
    write_shard(&shard, &as_refs(&members));
    let rewritten = TarShards::open_with_cache_dir(dir.path(), no_fallback).unwrap();
    assert_eq!(rewritten.index_stats().built, 1);
    assert_eq!(rewritten.len(), 4);
    assert_eq!(rewritten.read(3).unwrap(), b"image 3");

    // Corrupt: garbage, then a valid-looking file cut short, then one flipped byte.
    let valid_cache = std::fs::read(cache_of(&shard)).unwrap();
    let mut flipped = valid_cache.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x01;
    for damaged in [
        b"garbage".to_vec(),
        valid_cache[..valid_cache.len() - 9].to_vec(),
        flipped,
    ] {
        std::fs::write(cache_of(&shard), damaged).unwrap();
        let reopened = TarShards::open_with_cache_dir(dir.path(), no_fallback).unwrap();
        assert_eq!(reopened.index_stats().built, 1);
        assert_eq!(reopened.len(), 4);
        assert_eq!(reopened.read(3).unwrap(), b"image 3");
        // The rebuilt cache is valid again.
        assert_eq!(std::fs::read(cache_of(&shard)).unwrap(), valid_cache);
    }
}

#[test]
fn an_unwritable_shard_folder_caches_in_the_fallback_folder() {
    let dir = tempfile::tempdir().unwrap();
    let fallback = tempfile::tempdir().unwrap();
    let shard = dir.path().join("a.tar");
    write_shard(&shard, &as_refs(&three_samples()));
    // A folder where the cache file would go makes the beside cache unwritable, even as root.
    std::fs::create_dir(cache_of(&shard)).unwrap();

    let first = TarShards::open_with_cache_dir(dir.path(), Some(fallback.path())).unwrap();
    assert_eq!(first.index_stats().built, 1);
    let cached: Vec<_> = std::fs::read_dir(fallback.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(cached.len(), 1, "{cached:?}");
    assert!(cached[0].ends_with(".stoker-idx"), "{cached:?}");

    let second = TarShards::open_with_cache_dir(dir.path(), Some(fallback.path())).unwrap();
    assert_eq!(second.index_stats().loaded_from_cache, 1);
    assert_eq!(read_all(&second), read_all(&first));

    // Without any writable place the index still works, from memory.
    let third = TarShards::open_with_cache_dir(dir.path(), None).unwrap();
    assert_eq!(third.index_stats().built, 1);
    assert_eq!(third.len(), 3);
}

#[test]
fn a_shard_rewritten_or_cut_under_the_job_is_a_changed_source_not_other_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let shard = dir.path().join("a.tar");
    let bytes = tar_bytes(&as_refs(&three_samples()));
    std::fs::write(&shard, &bytes).unwrap();
    let shards = TarShards::open(dir.path()).unwrap();
    assert_eq!(shards.read(0).unwrap(), "image 0".repeat(100).as_bytes());
    // Touched (a new modification time, the same bytes): still read.
    std::fs::File::options()
        .write(true)
        .open(&shard)
        .unwrap()
        .set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
        .unwrap();
    assert_eq!(shards.read(1).unwrap(), "image 1".repeat(100).as_bytes());
    // Rewritten in place with other bytes of the same length (the pool keeps it open).
    std::thread::sleep(std::time::Duration::from_millis(20));
    let other: Vec<u8> = bytes.iter().map(|b| b.wrapping_add(1)).collect();
    std::fs::write(&shard, &other).unwrap();
    let error = shards.read(1).unwrap_err();
    assert!(matches!(error, Error::FileReplaced { .. }), "{error:?}");
    assert_eq!(error.read_fault(), stoker_datasets::ReadFault::Source);
    assert!(error.to_string().contains("a.tar"), "{error}");
    // Cut short after it was indexed: the same, never a bad sample.
    std::fs::write(&shard, &bytes).unwrap();
    let shards = TarShards::open(dir.path()).unwrap();
    std::fs::write(&shard, &bytes[..1024]).unwrap();
    let error = shards.read(2).unwrap_err();
    assert_eq!(
        error.read_fault(),
        stoker_datasets::ReadFault::Source,
        "{error:?}"
    );
}

#[test]
fn a_truncated_member_is_indexed_and_its_read_names_shard_and_member() {
    let dir = tempfile::tempdir().unwrap();
    let shard = dir.path().join("cut.tar");
    let bytes = tar_bytes(&as_refs(&three_samples()));
    // In 512-byte blocks, each .cls member takes 2 (header, data) and each .jpg (700 bytes) 3:
    // the data of s/0002.jpg starts after two samples, s/0002.cls and its own header.
    let last_image_data = (2 * 2 + 2 * 3 + 2 + 1) * 512;
    std::fs::write(&shard, &bytes[..last_image_data + 100]).unwrap();

    let shards = TarShards::open(dir.path()).unwrap();
    assert_eq!(shards.len(), 3);
    assert_eq!(shards.index_stats().problems, 1);
    assert_eq!(shards.read(1).unwrap(), "image 1".repeat(100).as_bytes());
    let error = shards.read(2).unwrap_err();
    assert!(
        matches!(
            &error,
            Error::TruncatedMember { member, available: 100, .. } if member == "s/0002.jpg"
        ),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("cut.tar") && message.contains("s/0002.jpg"),
        "{message}"
    );

    // Cut inside a label member: that sample is left out, the ones before are kept.
    let label_data = (2 * 2 + 2 * 3 + 1) * 512;
    std::fs::write(&shard, &bytes[..label_data]).unwrap();
    let shards = TarShards::open(dir.path()).unwrap();
    assert_eq!(shards.len(), 2);
    assert!(shards.index_stats().problems >= 1);
}

#[test]
fn samples_missing_their_label_or_image_are_left_out() {
    let dir = tempfile::tempdir().unwrap();
    write_shard(
        &dir.path().join("a.tar"),
        &[
            ("no-label.jpg", b"orphan image"),
            ("no-image.cls", b"1"),
            ("bad-label.jpg", b"badly labelled"),
            ("bad-label.cls", b"one"),
            ("negative.jpg", b"negative"),
            ("negative.cls", b"-1"),
            ("good.jpg", b"good"),
            ("good.cls", b"0"),
            // WebDataset's TarWriter writes key `img_1.5x` so: key `img_1`, no image.
            ("img_1.5x.jpg", b"dotted"),
            ("img_1.5x.cls", b"2"),
            // Beside its image, a member of another kind (a mask) is no problem.
            ("masked.jpg", b"masked"),
            ("masked.seg.png", b"mask"),
            ("masked.cls", b"1"),
            // Metadata beside a `.cls`: no problem; beside no label, the sample's one.
            ("meta.jpg", b"meta"),
            ("meta.json", br#"{"source": "x"}"#),
            ("meta.cls", b"2"),
            ("unlabelled.jpg", b"unlabelled"),
            ("unlabelled.json", br#"{"source": "y"}"#),
        ],
    );
    let shards = TarShards::open(dir.path()).unwrap();
    assert_eq!(
        read_all(&shards),
        [
            (b"good".to_vec(), 0),
            (b"masked".to_vec(), 1),
            (b"meta".to_vec(), 2)
        ]
    );
    assert_eq!(shards.index_stats().problems, 6);
}

#[test]
fn a_corrupt_header_keeps_the_samples_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let shard = dir.path().join("a.tar");
    let mut bytes = tar_bytes(&as_refs(&three_samples()));
    // The header of s/0002.cls, the first member of the third sample.
    let third_sample = (2 * 2 + 2 * 3) * 512;
    bytes[third_sample + 10] ^= 0x55;
    std::fs::write(&shard, &bytes).unwrap();
    let shards = TarShards::open(dir.path()).unwrap();
    assert_eq!(shards.len(), 2);
    assert_eq!(shards.index_stats().problems, 1);
    assert_eq!(shards.read(1).unwrap(), "image 1".repeat(100).as_bytes());

    // A file that is not a tar at all gives an error, not a crash.
    std::fs::write(&shard, vec![0x42; 4096]).unwrap();
    assert!(matches!(
        TarShards::open(dir.path()),
        Err(Error::NoTarSamples { .. })
    ));
    // A header cut short at the end of the file.
    std::fs::write(
        &shard,
        &tar_bytes(&as_refs(&three_samples()))[..third_sample + 100],
    )
    .unwrap();
    assert_eq!(TarShards::open(dir.path()).unwrap().len(), 2);
}

#[test]
fn missing_paths_and_empty_folders_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        TarShards::open(&dir.path().join("missing")),
        Err(Error::RootNotFound(_))
    ));
    assert!(matches!(
        TarShards::open(dir.path()),
        Err(Error::NoShards(_))
    ));
}

/// A minimal in-memory source to write from.
struct Memory {
    samples: Vec<(Vec<u8>, i64, String)>,
    classes: Vec<String>,
}

impl SampleSource for Memory {
    fn len(&self) -> u64 {
        self.samples.len() as u64
    }
    fn label(&self, index: u64) -> i64 {
        self.samples[index as usize].1
    }
    fn describe(&self, index: u64) -> String {
        self.samples[index as usize].2.clone()
    }
    fn read(&self, index: u64) -> stoker_datasets::Result<Vec<u8>> {
        Ok(self.samples[index as usize].0.clone())
    }
    fn class_names(&self) -> &[String] {
        &self.classes
    }
}

#[test]
fn written_shards_read_back_sample_for_sample() {
    let source = Memory {
        samples: (0..20)
            .map(|index| {
                let mut bytes = vec![0xFF, 0xD8, 0xFF];
                bytes.extend(std::iter::repeat_n(index as u8, 700 + index * 50));
                (bytes, (index % 3) as i64, format!("c/{index}.jpg"))
            })
            .collect(),
        classes: vec!["a".into(), "b".into(), "c".into()],
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("shards");
    let options = TarShardsWriterOptions { shard_bytes: 8_000 };
    let written = write_tar_shards(&source, &out, &options, &|_| {}).unwrap();
    assert!(written.shards.len() > 2, "{written:?}");
    assert_eq!(written.samples, 20);
    let shards = TarShards::open(&out).unwrap();
    assert_eq!(shards.len(), 20);
    assert_eq!(shards.class_names(), ["a", "b", "c"]);
    for index in 0..20 {
        assert_eq!(shards.read(index).unwrap(), source.read(index).unwrap());
        assert_eq!(shards.label(index), source.label(index));
    }
    assert!(shards
        .describe(0)
        .ends_with("shard-000000.tar:00000000.jpg"));
    // A non-empty output folder is refused.
    assert!(matches!(
        write_tar_shards(&source, &out, &options, &|_| {}),
        Err(Error::Write(WriteError::ShardOutputNotEmpty(_)))
    ));
}

/// A member (or an image file) of more than 2 GiB is a bad sample naming it, read as nothing:
/// read whole on each decode thread, a multi-gigabyte TIFF took the process's memory first. The
/// files are sparse: no disk is used.
#[test]
fn a_sample_past_the_size_bound_is_refused_unread() {
    use std::io::{Seek, SeekFrom, Write};
    let dir = tempfile::tempdir().unwrap();
    let huge = stoker_datasets::MAX_SAMPLE_BYTES + 1;
    let header = |name: &str, size: u64| {
        let mut header = tar::Header::new_gnu();
        header.set_path(name).unwrap();
        header.set_size(size);
        header.set_mode(0o644);
        header.set_cksum();
        header.as_bytes().to_vec()
    };
    let shard = dir.path().join("big.tar");
    let mut file = File::create(&shard).unwrap();
    file.write_all(&header("0000.tif", huge)).unwrap();
    let next = 512 + huge.div_ceil(512) * 512;
    file.seek(SeekFrom::Start(next)).unwrap();
    file.write_all(&header("0000.cls", 1)).unwrap();
    file.write_all(b"1").unwrap();
    file.write_all(&[0u8; 511 + 1024]).unwrap();
    // The small ones, in a shard of their own beside it.
    write_shard(&dir.path().join("small.tar"), &as_refs(&three_samples()));
    drop(file);
    let shards = TarShards::open(dir.path()).unwrap();
    assert_eq!(shards.len(), 4);
    let error = shards.read(0).unwrap_err();
    let message = error.to_string();
    assert!(
        matches!(error, Error::SampleTooLarge { bytes, .. } if bytes == huge)
            && message.contains("member 0000.tif of tar shard")
            && message.contains("more than the 2 GiB"),
        "{message}"
    );
    assert!(shards.read(1).is_ok());

    let folder = dir.path().join("folder/cat");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("a.png"), b"small").unwrap();
    File::create(folder.join("b.tif"))
        .unwrap()
        .set_len(huge)
        .unwrap();
    let images = stoker_datasets::ImageFolder::open(&dir.path().join("folder")).unwrap();
    assert_eq!(images.read(0).unwrap(), b"small");
    let message = images.read(1).unwrap_err().to_string();
    assert!(
        message.contains("b.tif") && message.contains("more than the 2 GiB"),
        "{message}"
    );
}

/// A shard that holds no sample (empty, cut short, not a tar) is told of by name; macOS's
/// AppleDouble files beside shards (`._a.tar`) are not shards at all.
#[test]
fn shards_without_samples_are_told_of_and_apple_double_files_left_out() {
    let dir = tempfile::tempdir().unwrap();
    write_shard(&dir.path().join("a.tar"), &as_refs(&three_samples()));
    std::fs::write(dir.path().join("empty.tar"), b"").unwrap();
    std::fs::write(dir.path().join("._a.tar"), b"\0\x05\x16\x07 attributes").unwrap();
    let shards = TarShards::open(dir.path()).unwrap();
    assert_eq!(shards.len(), 3);
    assert_eq!(shards.index_stats().shards, 2);
    let notices = shards.notices();
    assert!(
        notices
            .iter()
            .any(|n| n.starts_with("1 shard(s)") && n.contains("empty.tar the first")),
        "{notices:?}"
    );
}
