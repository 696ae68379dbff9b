//! Image folders, JSONL files and `save_to_disk` folders in a bucket of the in-test S3 server,
//! each read as the same files are locally: the same samples, labels and class names in the
//! same order, splits picked the same way, and errors naming the objects.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use stoker_datasets::{
    generate_imagenet_like, remote_layout, remote_split_prefix, resolve_remote, Error, FileKind,
    HfDataset, ImageFolder, JsonlDocuments, ParquetOptions, RemoteLayout, SampleSource,
    SyntheticImageNetSpec,
};

use crate::object_store::{assert_same_samples, cache, BUCKET};
use crate::s3_server::S3Server;

fn images(dir: &Path, count: u64, seed: u64) {
    let spec = SyntheticImageNetSpec {
        count,
        seed,
        classes: 3,
    };
    generate_imagenet_like(dir, &spec, &|_| {}).unwrap();
}

fn copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::copy(from, to).unwrap();
}

#[test]
fn an_image_folder_in_a_bucket_reads_in_the_order_torchvision_gives_its_local_copy() {
    let dir = tempfile::tempdir().unwrap();
    let server = S3Server::start(&dir.path().join("server"));
    let root = server.bucket_dir(BUCKET).join("imgs");
    images(&root, 24, 3);
    // Nested folders, a class whose name sorts before another's folders by bytes
    // (`class_00-x` < `class_00/`), files that are no images, a file beside the classes.
    let mut class_00: Vec<_> = std::fs::read_dir(root.join("class_00"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    class_00.sort();
    let first = &class_00[0];
    copy(first, &root.join("class_00/sub/b.jpg"));
    copy(first, &root.join("class_00/sub/a.JPEG"));
    copy(first, &root.join("class_00/sub-1/c.png"));
    copy(first, &root.join("class_00-x/d.jpg"));
    std::fs::write(root.join("class_01/notes.txt"), b"not an image").unwrap();
    std::fs::write(root.join("class_01/anim.gif"), b"GIF89a").unwrap();
    std::fs::write(root.join("class_02/phone.HEIC"), b"heic").unwrap();
    std::fs::write(root.join("README.md"), b"beside the classes").unwrap();
    let cache = cache(&server, &dir.path().join("cache"));

    let local = ImageFolder::open(&root).unwrap();
    assert_eq!(
        remote_layout("s3://data/imgs", &cache).unwrap(),
        RemoteLayout::Folders
    );
    // Not laid out by split: found by listing the prefix and one class folder, not each.
    let lists = server.counts.lists.load(Ordering::SeqCst);
    assert!(remote_split_prefix("s3://data/imgs", None, &cache)
        .unwrap()
        .is_none());
    assert!(server.counts.lists.load(Ordering::SeqCst) - lists <= 2);
    let remote = ImageFolder::open_remote("s3://data/imgs", Arc::clone(&cache), None).unwrap();
    assert_eq!(
        remote.class_names(),
        ["class_00", "class_00-x", "class_01", "class_02"]
    );
    assert_same_samples(&remote, &local);
    // The image files left out are counted and the first named, as locally.
    let (count, first) = local.left_out().unwrap();
    assert_eq!(count, 2);
    assert!(first.ends_with("class_01/anim.gif"), "{}", first.display());
    assert_eq!(
        remote.left_out().unwrap(),
        (2, Path::new("s3://data/imgs/class_01/anim.gif"))
    );
    for index in 0..local.len() {
        let local_path = local.describe(index);
        let relative = local_path
            .strip_prefix(&root.display().to_string())
            .unwrap();
        assert_eq!(remote.describe(index), format!("s3://data/imgs{relative}"));
    }
    assert!(remote.cache_stats().unwrap().misses > 0);

    // A second reader of the same cache folder reads every sample without a GET.
    let gets = server.counts.object_gets();
    let again = ImageFolder::open_remote("s3://data/imgs", Arc::clone(&cache), None).unwrap();
    assert_same_samples(&again, &local);
    assert_eq!(server.counts.object_gets(), gets, "read from the cache");

    // Read ahead when told: the hinted samples are in the cache before they are read.
    let other = crate::object_store::cache(&server, &dir.path().join("cache-2"));
    let ahead = ImageFolder::open_remote("s3://data/imgs", Arc::clone(&other), None).unwrap();
    let hinted: Vec<u64> = (0..5).collect();
    ahead.prefetch(&hinted);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while other.stats().misses < 5 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let gets = server.counts.object_gets();
    for &index in &hinted {
        assert_eq!(ahead.read(index).unwrap(), local.read(index).unwrap());
    }
    assert_eq!(
        server.counts.object_gets(),
        gets,
        "the hinted samples were fetched ahead"
    );

    // A class folder holding no image is refused, as torchvision refuses it locally.
    std::fs::create_dir_all(root.join("class_03")).unwrap();
    std::fs::write(root.join("class_03/readme.txt"), b"x").unwrap();
    let error = ImageFolder::open_remote("s3://data/imgs", Arc::clone(&cache), None).unwrap_err();
    assert!(
        matches!(&error, Error::EmptyClasses { classes, .. } if classes == &["class_03"]),
        "{error}"
    );
    // So is one a console made as a marker alone (`class_04/`, listed by the client without
    // its `/`, as this empty object is): before, the class was left out, the ones after it
    // shifted down by one.
    std::fs::remove_dir_all(root.join("class_03")).unwrap();
    std::fs::write(root.join("_SUCCESS"), b"").unwrap(); // a job's flag, not a class
    std::fs::write(root.join("class_04"), b"").unwrap();
    let error = ImageFolder::open_remote("s3://data/imgs", Arc::clone(&cache), None).unwrap_err();
    assert!(
        matches!(&error, Error::EmptyClasses { classes, .. } if classes == &["class_04"]),
        "{error}"
    );
    let error = ImageFolder::open_remote("s3://data/nothing", cache, None).unwrap_err();
    assert!(matches!(error, Error::NoClasses(_)), "{error}");
}

#[test]
fn an_image_folder_laid_out_by_split_in_a_bucket_reads_one_split() {
    let dir = tempfile::tempdir().unwrap();
    let server = S3Server::start(&dir.path().join("server"));
    let root = server.bucket_dir(BUCKET).join("imagenet");
    images(&root.join("train"), 12, 4);
    images(&root.join("val"), 6, 5);
    let cache = cache(&server, &dir.path().join("cache"));
    assert_eq!(
        remote_split_prefix("s3://data/imagenet", None, &cache).unwrap(),
        None,
        "no data objects: the image folder finds its own splits"
    );
    let both = ImageFolder::open_remote("s3://data/imagenet", Arc::clone(&cache), None)
        .unwrap_err()
        .to_string();
    assert!(both.contains("train, val"), "{both}");
    let train =
        ImageFolder::open_remote("s3://data/imagenet", Arc::clone(&cache), Some("train")).unwrap();
    assert_same_samples(&train, &ImageFolder::open(&root.join("train")).unwrap());
    let missing = ImageFolder::open_remote("s3://data/imagenet", Arc::clone(&cache), Some("test"))
        .unwrap_err()
        .to_string();
    assert!(missing.contains("its splits are train, val"), "{missing}");
    // A folder that is not laid out by split has no split to pick.
    let flat = ImageFolder::open_remote("s3://data/imagenet/val", cache, Some("train"))
        .unwrap_err()
        .to_string();
    assert!(flat.contains("not laid out by split"), "{flat}");
}

#[test]
fn jsonl_objects_in_a_bucket_read_as_the_local_files() {
    let dir = tempfile::tempdir().unwrap();
    let server = S3Server::start(&dir.path().join("server"));
    let root = server.bucket_dir(BUCKET).join("text");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(
        root.join("a.jsonl"),
        "{\"text\": \"one\", \"label\": 1}\n\n{\"text\": \"two\", \"label\": 2}\n",
    )
    .unwrap();
    std::fs::write(
        root.join("b.jsonl"),
        "{\"text\": \"three\", \"label\": 3}\n[4]\n",
    )
    .unwrap();
    crate::jsonl::write_compressed(
        &root.join("c.jsonl.gz"),
        "{\"text\": \"five\", \"label\": 5}\n{\"text\": \"six\", \"label\": 6}\n",
    );
    std::fs::write(root.join("notes.txt"), "not a document").unwrap();
    let cache = cache(&server, &dir.path().join("cache"));
    assert_eq!(
        remote_layout("s3://data/text", &cache).unwrap(),
        RemoteLayout::Files(FileKind::Jsonl)
    );
    let local = JsonlDocuments::open(&root, "", "").unwrap();
    let remote =
        JsonlDocuments::open_remote("s3://data/text", Arc::clone(&cache), "", "", None).unwrap();
    assert_eq!(remote.len(), 6);
    assert_eq!(remote.len(), local.len());
    assert_eq!(remote.label_field(), Some("label"));
    for index in [0, 1, 2, 4, 5] {
        assert_eq!(remote.read(index).unwrap(), local.read(index).unwrap());
        assert_eq!(remote.label(index), local.label(index));
    }
    // A bad line is a bad sample naming the object and the line.
    let bad = remote.read(3).unwrap_err().to_string();
    assert!(bad.contains("s3://data/text/b.jsonl:2"), "{bad}");

    // A pattern names the same objects.
    let named = resolve_remote(&["s3://data/text/*.jsonl"], None, &cache).unwrap();
    let named = JsonlDocuments::open_remote_files(named, Arc::clone(&cache), "", "").unwrap();
    assert_eq!(named.len(), 4);
    assert_eq!(named.read(2).unwrap(), b"three");

    // Files larger than the cache's cap, which holds them whole while read, are refused at
    // once (they were downloaded past the cap, and past a smaller disk's end).
    let mut small = crate::object_store::options(&server, &dir.path().join("small-cache"));
    small.max_bytes = 64;
    let small = Arc::new(stoker_datasets::ObjectCache::new(small).unwrap());
    let error = JsonlDocuments::open_remote("s3://data/text", small, "", "", None)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("JSONL files of s3://data/text") && error.contains("cap of 64 bytes"),
        "{error}"
    );

    // A damaged compressed object names itself.
    std::fs::write(root.join("d.jsonl.gz"), b"\x1f\x8b\x08\x00garbage").unwrap();
    let error = JsonlDocuments::open_remote("s3://data/text", cache, "", "", None)
        .unwrap_err()
        .to_string();
    assert!(error.contains("s3://data/text/d.jsonl.gz"), "{error}");
}

#[test]
fn a_save_to_disk_folder_in_a_bucket_reads_as_the_local_folder() {
    let dir = tempfile::tempdir().unwrap();
    let server = S3Server::start(&dir.path().join("server"));
    let root = server.bucket_dir(BUCKET).join("saved");
    crate::hf_folder::write_fixture(&root, None);
    let cache = cache(&server, &dir.path().join("cache"));
    assert_eq!(
        remote_layout("s3://data/saved", &cache).unwrap(),
        RemoteLayout::HfDataset
    );
    let options = ParquetOptions::default();
    let local = HfDataset::open(&root, &options).unwrap();
    let remote =
        HfDataset::open_remote("s3://data/saved", Arc::clone(&cache), &options, None).unwrap();
    assert_eq!(remote.class_names(), ["cat", "dog", "eel"]);
    assert_same_samples(&remote, &local);
    assert!(
        remote
            .describe(20)
            .starts_with("s3://data/saved/data-00001-of-00002.arrow"),
        "{}",
        remote.describe(20)
    );
    // Shards larger than the cache's cap, which holds them whole while read, are refused.
    let mut small = crate::object_store::options(&server, &dir.path().join("small-cache"));
    small.max_bytes = 64;
    let small = Arc::new(stoker_datasets::ObjectCache::new(small).unwrap());
    let error = HfDataset::open_remote("s3://data/saved", small, &options, None)
        .unwrap_err()
        .to_string();
    assert!(error.contains("Arrow shards of s3://data/saved"), "{error}");
    // A `save_to_disk` folder that is not laid out by split has no split to pick.
    let no_split = HfDataset::open_remote(
        "s3://data/saved",
        Arc::clone(&cache),
        &options,
        Some("train"),
    )
    .unwrap_err()
    .to_string();
    assert!(no_split.contains("not laid out by split"), "{no_split}");

    // A DatasetDict: the split asked for, or an error naming the splits.
    let dict = server.bucket_dir(BUCKET).join("dict");
    crate::hf_folder::write_fixture(&dict.join("train"), None);
    crate::hf_folder::write_fixture(&dict.join("test"), None);
    std::fs::write(
        dict.join("dataset_dict.json"),
        "{\"splits\": [\"train\", \"test\"]}",
    )
    .unwrap();
    let none = HfDataset::open_remote("s3://data/dict", Arc::clone(&cache), &options, None)
        .unwrap_err()
        .to_string();
    assert!(none.contains("train") && none.contains("test"), "{none}");
    let train = HfDataset::open_remote(
        "s3://data/dict",
        Arc::clone(&cache),
        &options,
        Some("train"),
    )
    .unwrap();
    assert_same_samples(&train, &local);

    // An image kept as a path is not read from a bucket; the sample names the path.
    let referenced = server.bucket_dir(BUCKET).join("referenced");
    crate::hf_folder::write_fixture(&referenced, Some(4));
    let with_path =
        HfDataset::open_remote("s3://data/referenced", Arc::clone(&cache), &options, None).unwrap();
    let error = with_path.read(4).unwrap_err().to_string();
    assert!(
        error.contains("ref.png") && error.contains("local"),
        "{error}"
    );
    assert_eq!(with_path.read(3).unwrap(), local.read(3).unwrap());

    // A shard cut short names its object. (The datasets open hold their copies locked: a
    // changed object is fetched again once nothing reads the old copy.)
    drop((remote, train, with_path));
    let shard = root.join("data-00001-of-00002.arrow");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() / 2]).unwrap();
    let error = HfDataset::open_remote("s3://data/saved", cache, &options, None)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("s3://data/saved/data-00001-of-00002.arrow"),
        "{error}"
    );
}
