//! Integration tests of the public API: torchvision-compatible indexing, errors, the
//! synthetic generator and `inspect`, all on temporary folders.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use stoker_datasets::{
    generate_imagenet_like, inspect_image_folder, sniff_format, Error, ImageFolder, ImageFormat,
    SampleSource, SyntheticImageNetSpec, WriteError,
};

fn write_file(root: &Path, relative: &str, bytes: &[u8]) {
    let path = root.join(relative);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// Every sample as (path relative to the root, label).
fn samples(folder: &ImageFolder) -> Vec<(String, i64)> {
    (0..folder.len())
        .map(|index| {
            let path = folder.path(index).unwrap();
            let relative = path.strip_prefix(folder.root()).unwrap();
            (relative.to_string_lossy().into_owned(), folder.label(index))
        })
        .collect()
}

fn spec(count: u64, seed: u64, classes: u32) -> SyntheticImageNetSpec {
    SyntheticImageNetSpec {
        count,
        seed,
        classes,
    }
}

/// The files of a generated set, in index order, with their bytes.
fn all_bytes(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let folder = ImageFolder::open(root).unwrap();
    (0..folder.len())
        .map(|index| (folder.path(index).unwrap(), folder.read(index).unwrap()))
        .collect()
}

#[test]
fn indexes_like_torchvision() {
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path();
    for relative in [
        "dog/b.jpg",
        "dog/a.PNG",
        "dog/x.JPEG",
        "dog/.hidden.jpg",
        "dog/notes.txt",
        "dog/sub/c.jpeg",
        "dog/sub b/d.jpg",
        "dog/sub/inner/e.webp",
        "dog/sub/inner/readme.md",
        "cat/1.bmp",
        "cat/2.gif",
        "Zebra/z.TIF",
        "Zebra/y.Tiff",
        "stray.jpg",
    ] {
        write_file(root, relative, relative.as_bytes());
    }

    let folder = ImageFolder::open(root).unwrap();
    // Class names sort by code point (upper case first); folders sort by their whole path
    // string, so "dog/sub b" comes before "dog/sub/inner"; hidden files are kept.
    assert_eq!(folder.class_names(), ["Zebra", "cat", "dog"]);
    let expected = [
        ("Zebra/y.Tiff", 0),
        ("Zebra/z.TIF", 0),
        ("cat/1.bmp", 1),
        ("dog/.hidden.jpg", 2),
        ("dog/a.PNG", 2),
        ("dog/b.jpg", 2),
        ("dog/x.JPEG", 2),
        ("dog/sub/c.jpeg", 2),
        ("dog/sub b/d.jpg", 2),
        ("dog/sub/inner/e.webp", 2),
    ];
    let expected: Vec<(String, i64)> = expected
        .iter()
        .map(|(path, label)| (path.to_string(), *label))
        .collect();
    assert_eq!(samples(&folder), expected);
    assert_eq!(folder.len(), 10);
    assert!(!folder.is_empty());
    assert_eq!(folder.read(4).unwrap(), b"dog/a.PNG");
    assert!(folder.describe(4).ends_with("dog/a.PNG"));
}

#[test]
fn open_errors_name_the_root() {
    let temp = tempfile::tempdir().unwrap();
    let missing = temp.path().join("missing");
    let error = ImageFolder::open(&missing).unwrap_err();
    assert!(matches!(&error, Error::RootNotFound(path) if *path == missing));
    assert!(error.to_string().contains("missing"));

    write_file(temp.path(), "file.jpg", b"x");
    let file = temp.path().join("file.jpg");
    assert!(matches!(
        ImageFolder::open(&file).unwrap_err(),
        Error::NotADirectory(path) if path == file
    ));

    let empty = temp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let error = ImageFolder::open(&empty).unwrap_err();
    assert!(matches!(&error, Error::NoClasses(path) if *path == empty));
    assert!(error.to_string().contains("class folder"));

    let no_images = temp.path().join("no_images");
    write_file(&no_images, "a/readme.txt", b"x");
    write_file(&no_images, "b/c/data.csv", b"x");
    assert!(matches!(
        ImageFolder::open(&no_images).unwrap_err(),
        Error::EmptyDataset(path) if path == no_images
    ));

    let one_empty = temp.path().join("one_empty");
    write_file(&one_empty, "a/1.jpg", b"x");
    std::fs::create_dir_all(one_empty.join("b")).unwrap();
    match ImageFolder::open(&one_empty).unwrap_err() {
        Error::EmptyClasses { root, classes } => {
            assert_eq!(root, one_empty);
            assert_eq!(classes, ["b"]);
        }
        other => panic!("unexpected error {other}"),
    }
}

#[test]
fn read_errors_name_the_sample() {
    let temp = tempfile::tempdir().unwrap();
    write_file(temp.path(), "a/1.jpg", b"one");
    write_file(temp.path(), "a/2.jpg", b"two");
    let folder = ImageFolder::open(temp.path()).unwrap();
    std::fs::remove_file(temp.path().join("a/2.jpg")).unwrap();

    let error = folder.read(1).unwrap_err();
    assert!(matches!(&error, Error::Io { path, .. } if path.ends_with("a/2.jpg")));
    assert!(error.to_string().contains("2.jpg"), "{error}");
    assert!(matches!(
        folder.read(2).unwrap_err(),
        Error::IndexOutOfRange { index: 2, len: 2 }
    ));
    assert_eq!(folder.path(2), None);
}

#[test]
fn generator_is_deterministic_in_its_spec() {
    let temp = tempfile::tempdir().unwrap();
    let first = temp.path().join("first");
    let second = temp.path().join("second");
    let other_seed = temp.path().join("other_seed");
    generate_imagenet_like(&first, &spec(24, 3, 4), &|_| {}).unwrap();
    generate_imagenet_like(&second, &spec(24, 3, 4), &|_| {}).unwrap();
    generate_imagenet_like(&other_seed, &spec(24, 4, 4), &|_| {}).unwrap();

    let first = all_bytes(&first);
    let second = all_bytes(&second);
    assert_eq!(first.len(), 24);
    for ((first_path, first_bytes), (second_path, second_bytes)) in first.iter().zip(&second) {
        assert_eq!(first_path.file_name(), second_path.file_name());
        assert!(first_bytes == second_bytes, "{first_path:?} differs");
    }
    let other = all_bytes(&other_seed);
    let differing = first
        .iter()
        .zip(&other)
        .filter(|((_, first_bytes), (_, other_bytes))| first_bytes != other_bytes)
        .count();
    assert_eq!(differing, 24);
}

#[test]
fn generator_reuses_resumes_and_refuses() {
    let temp = tempfile::tempdir().unwrap();
    let out = temp.path().join("set");
    let calls = AtomicU64::new(0);
    let count_calls = |_files_done: u64| {
        calls.fetch_add(1, Ordering::Relaxed);
    };

    let made = generate_imagenet_like(&out, &spec(12, 1, 3), &count_calls).unwrap();
    assert_eq!(calls.load(Ordering::Relaxed), 12);
    assert_eq!(made.root, out);
    assert_eq!(made.files, 12);
    let on_disk: u64 = all_bytes(&out)
        .iter()
        .map(|(_, bytes)| bytes.len() as u64)
        .sum();
    assert_eq!(made.total_bytes, on_disk);
    let manifest = std::fs::read_to_string(out.join("stoker-dataset.json")).unwrap();
    for field in [
        "\"count\": 12",
        "\"seed\": 1",
        "\"classes\": 3",
        "\"files\": 12",
    ] {
        assert!(manifest.contains(field), "{manifest}");
    }

    // Same spec: returned as is, nothing generated.
    let reused = generate_imagenet_like(&out, &spec(12, 1, 3), &count_calls).unwrap();
    assert_eq!(reused, made);
    assert_eq!(calls.load(Ordering::Relaxed), 12);

    // Another spec: refused, naming what is there.
    let error = generate_imagenet_like(&out, &spec(13, 1, 3), &|_| {}).unwrap_err();
    assert!(
        matches!(
            error,
            Error::Write(WriteError::OutputHoldsOtherDataset { .. })
        ),
        "{error}"
    );
    assert!(error.to_string().contains("count=12"), "{error}");

    // An interrupted run (marker present, manifest missing, a file missing) is completed
    // with the same bytes.
    let before = all_bytes(&out);
    std::fs::rename(
        out.join("stoker-dataset.json"),
        out.join("stoker-dataset.in-progress.json"),
    )
    .unwrap();
    std::fs::remove_file(&before[5].0).unwrap();
    let resumed = generate_imagenet_like(&out, &spec(12, 1, 3), &|_| {}).unwrap();
    assert_eq!(resumed, made);
    assert_eq!(all_bytes(&out), before);
    assert!(!out.join("stoker-dataset.in-progress.json").exists());

    // A folder holding anything else: refused.
    let foreign = temp.path().join("foreign");
    write_file(&foreign, "holiday.jpg", b"x");
    let error = generate_imagenet_like(&foreign, &spec(12, 1, 3), &|_| {}).unwrap_err();
    assert!(matches!(&error, Error::Write(WriteError::OutputNotEmpty(path)) if *path == foreign));
    assert!(error.to_string().contains("not a stoker-generated dataset"));
}

#[test]
fn generated_set_looks_like_imagenet() {
    let temp = tempfile::tempdir().unwrap();
    let made = generate_imagenet_like(temp.path(), &spec(200, 0, 10), &|_| {}).unwrap();
    let folder = ImageFolder::open(temp.path()).unwrap();
    assert_eq!(folder.len(), 200);
    assert_eq!(folder.class_names().len(), 10);

    let mut pngs = 0;
    let mut grayscale = 0;
    let mut four_four_four = 0;
    let mut size_buckets_of_50_kb = std::collections::BTreeSet::new();
    let (mut width_sum, mut height_sum) = (0u64, 0u64);
    for index in 0..folder.len() {
        let bytes = folder.read(index).unwrap();
        let path = folder.path(index).unwrap();
        match sniff_format(&bytes) {
            ImageFormat::Png => {
                pngs += 1;
                assert_eq!(path.extension().unwrap(), "png");
                let size = imagesize::blob_size(&bytes).unwrap();
                width_sum += size.width as u64;
                height_sum += size.height as u64;
            }
            ImageFormat::Jpeg => {
                assert_eq!(path.extension().unwrap(), "jpg");
                let header = turbojpeg::read_header(&bytes).unwrap();
                width_sum += header.width as u64;
                height_sum += header.height as u64;
                grayscale += usize::from(header.subsamp == turbojpeg::Subsamp::Gray);
                four_four_four += usize::from(header.subsamp == turbojpeg::Subsamp::None);
                size_buckets_of_50_kb.insert(bytes.len() / 50_000);
            }
            other => panic!("{path:?} is {other:?}, neither jpeg nor png"),
        }
    }
    assert_eq!(pngs, 1, "one png per 200 images");
    assert!((2..=5).contains(&grayscale), "{grayscale} grayscale");
    assert!(four_four_four >= 10, "{four_four_four} 4:4:4");
    assert!(size_buckets_of_50_kb.len() >= 3, "file sizes do not spread");
    let mean_width = width_sum as f64 / 200.0;
    let mean_height = height_sum as f64 / 200.0;
    assert!(
        (360.0..450.0).contains(&mean_width),
        "mean width {mean_width}"
    );
    assert!(
        (310.0..390.0).contains(&mean_height),
        "mean height {mean_height}"
    );
    let mean_kb = made.total_bytes as f64 / 200.0 / 1000.0;
    assert!((85.0..135.0).contains(&mean_kb), "mean file {mean_kb} KB");

    let report = inspect_image_folder(&folder, 500 * 375).unwrap();
    assert_eq!(report.samples, 200);
    assert_eq!(report.classes.len(), 10);
    assert!(report.classes.iter().all(|(_, count)| *count == 20));
    assert_eq!(
        report.formats,
        [("jpeg".to_owned(), 199), ("png".to_owned(), 1)]
    );
    assert!((report.width.mean - mean_width).abs() < 1e-9);
    assert!((report.height.mean - mean_height).abs() < 1e-9);
    assert!(report.width.min <= report.width.p50 && report.width.p50 <= report.width.max);
    assert!((report.file_bytes.mean * 200.0 - made.total_bytes as f64).abs() < 1.0);
    assert!(report.pixels_over_limit > 0 && report.pixels_over_limit < 100);
}

#[test]
fn inspect_counts_other_and_unreadable_files() {
    let temp = tempfile::tempdir().unwrap();
    // A minimal BMP header: 40-byte info header, 7 x 5 pixels.
    let mut bmp = vec![0u8; 54];
    bmp[..2].copy_from_slice(b"BM");
    bmp[14] = 40;
    bmp[18] = 7;
    bmp[22] = 5;
    write_file(temp.path(), "a/picture.bmp", &bmp);
    write_file(temp.path(), "a/truncated.jpg", &[0xFF, 0xD8, 0xFF]);
    write_file(temp.path(), "b/text.png", b"not a png at all");
    // A QOI header (7 x 5) under a TIFF name: readable, but no format Stoker decodes.
    let mut qoi = b"qoif".to_vec();
    qoi.extend_from_slice(&7u32.to_be_bytes());
    qoi.extend_from_slice(&5u32.to_be_bytes());
    qoi.extend_from_slice(&[3, 0]);
    write_file(temp.path(), "b/odd.TIF", &qoi);
    let folder = ImageFolder::open(temp.path()).unwrap();

    let report = inspect_image_folder(&folder, 30).unwrap();
    assert_eq!(report.samples, 4);
    assert_eq!(report.classes, [("a".to_owned(), 2), ("b".to_owned(), 2)]);
    assert_eq!(
        report.formats,
        [
            ("unreadable".to_owned(), 2),
            ("bmp".to_owned(), 1),
            ("other:tif".to_owned(), 1)
        ]
    );
    assert_eq!(report.width.mean, 7.0);
    assert_eq!(report.height.p50, 5.0);
    assert_eq!(report.file_bytes.max, 54.0);
    assert_eq!(report.pixels_over_limit, 2);
}

/// Measures the generator at the scale of `stoker make-dataset` (run with `--ignored`).
#[test]
#[ignore = "takes tens of seconds; a measurement, not a check"]
fn measure_generating_five_thousand_images() {
    let temp = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let made = generate_imagenet_like(temp.path(), &spec(5000, 0, 10), &|_| {}).unwrap();
    let elapsed = started.elapsed();
    let folder = ImageFolder::open(temp.path()).unwrap();
    let report = inspect_image_folder(&folder, u64::MAX).unwrap();
    println!(
        "5000 images in {:.1} s: mean file {:.1} KB, mean size {:.0} x {:.0}, formats {:?}",
        elapsed.as_secs_f64(),
        made.total_bytes as f64 / 5000.0 / 1000.0,
        report.width.mean,
        report.height.mean,
        report.formats
    );
}

/// A named pipe called like an image is no sample (opening it waited for a writer, forever:
/// every command, and a worker's decode thread, hung); one reached through a link is an error
/// naming it, at once.
#[test]
fn named_pipes_are_never_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    write_file(dir.path(), "a/one.png", b"one");
    let mkfifo = |path: &Path| {
        let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o644) }, 0);
    };
    mkfifo(&dir.path().join("a/pipe.jpg"));
    mkfifo(&dir.path().join("elsewhere.fifo"));
    std::os::unix::fs::symlink(
        dir.path().join("elsewhere.fifo"),
        dir.path().join("a/zz.jpg"),
    )
    .unwrap();
    let folder = ImageFolder::open(dir.path()).unwrap();
    assert_eq!(folder.len(), 2, "the pipe is not listed; the link is");
    assert_eq!(folder.read(0).unwrap(), b"one");
    let started = Instant::now();
    let error = folder.read(1).unwrap_err().to_string();
    assert!(
        error.contains("zz.jpg") && error.contains("not a regular file"),
        "{error}"
    );
    assert!(started.elapsed().as_secs() < 5);
}

/// Class folders whose names are not UTF-8 keep names of their own (each undecodable byte as
/// `\xNN`): the replacement character made `a\xff` and `a\xfe` one class name, twice.
#[test]
fn class_folders_named_in_other_encodings_keep_distinct_names() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    for (folder, image) in [
        (&b"a\xfe"[..], "one.png"),
        (&b"a\xff"[..], "two.png"),
        (&b"b"[..], "three.png"),
    ] {
        let class = dir.path().join(std::ffi::OsStr::from_bytes(folder));
        std::fs::create_dir_all(&class).unwrap();
        std::fs::write(class.join(image), image.as_bytes()).unwrap();
    }
    let folder = ImageFolder::open(dir.path()).unwrap();
    assert_eq!(folder.class_names(), ["a\\xfe", "a\\xff", "b"]);
    assert_eq!(
        (0..3).map(|k| folder.label(k)).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    assert_eq!(folder.read(1).unwrap(), b"two.png");
}
