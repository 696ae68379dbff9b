use super::*;

fn touch(root: &Path, names: &[&str]) {
    for name in names {
        let path = root.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"x").unwrap();
    }
}

fn names_of(root: &Path, source: LocalSource) -> Vec<String> {
    match source {
        LocalSource::Files { files, .. } => files
            .iter()
            .map(|f| f.strip_prefix(root).unwrap().display().to_string())
            .collect(),
        LocalSource::Path(path) => vec![format!(
            "path:{}",
            path.strip_prefix(root).unwrap().display()
        )],
    }
}

fn at(root: &Path, name: &str) -> String {
    format!("{}/{name}", root.display())
}

#[test]
fn a_hub_folder_with_two_splits_is_refused_without_a_split_and_read_by_split() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    touch(
        root,
        &[
            "README.md",
            "data/train-00000-of-00002.parquet",
            "data/train-00001-of-00002.parquet",
            "data/test-00000-of-00001.parquet",
        ],
    );
    for source in [root.display().to_string(), at(root, "data")] {
        let message = resolve_local(&[&source], None).unwrap_err().to_string();
        assert!(message.contains("test, train"), "{message}");
        assert!(message.contains("split=\"train\""), "{message}");
        let train = resolve_local(&[&source], Some("train")).unwrap();
        assert_eq!(
            names_of(root, train),
            [
                "data/train-00000-of-00002.parquet",
                "data/train-00001-of-00002.parquet"
            ]
        );
        let missing = resolve_local(&[&source], Some("validation"))
            .unwrap_err()
            .to_string();
        assert!(
            missing.contains("validation") && missing.contains("test, train"),
            "{missing}"
        );
    }
}

/// `push_to_hub(config_name=...)` writes `{config}/{split}-NNNNN-of-NNNNN.parquet`: a config
/// folder is itself laid out by split, so neither the repository nor the config is read whole.
#[test]
fn a_hub_configs_folder_is_read_by_split_too() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    touch(
        root,
        &[
            "default/train-00000-of-00001.parquet",
            "default/test-00000-of-00001.parquet",
        ],
    );
    let source = root.display().to_string();
    let message = resolve_local(&[&source], None).unwrap_err().to_string();
    assert!(message.contains("test, train"), "{message}");
    let train = resolve_local(&[&source], Some("train")).unwrap();
    assert_eq!(
        names_of(root, train),
        ["default/train-00000-of-00001.parquet"]
    );
    // Two configurations: one is named by its folder, then one of its splits.
    touch(
        root,
        &[
            "sst2/train-00000-of-00001.parquet",
            "sst2/validation-00000-of-00001.parquet",
        ],
    );
    let message = resolve_local(&[&source], Some("sst2"))
        .unwrap_err()
        .to_string();
    assert!(message.contains("train, validation"), "{message}");
    let sst2 = at(root, "sst2");
    let validation = resolve_local(&[&sst2], Some("validation")).unwrap();
    assert_eq!(
        names_of(root, validation),
        ["sst2/validation-00000-of-00001.parquet"]
    );
}

/// A split's folder whose files name that one split, or some none, is read whole as before:
/// only a folder of two named splits or more is a configuration to read by split.
#[test]
fn a_split_folder_of_one_named_split_is_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    touch(
        root,
        &[
            "train/train-00000-of-00001.parquet",
            "train/extra.parquet",
            "test/test-00000-of-00001.parquet",
        ],
    );
    let source = root.display().to_string();
    let train = resolve_local(&[&source], Some("train")).unwrap();
    assert_eq!(names_of(root, train), ["path:train"]);
}

/// The hub's Parquet conversion (`refs/convert/parquet`): `{config}/{split}/0000.parquet`.
#[test]
fn the_hubs_parquet_conversion_is_read_by_split() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    touch(
        root,
        &[
            "default/train/0000.parquet",
            "default/train/0001.parquet",
            "default/test/0000.parquet",
        ],
    );
    let source = root.display().to_string();
    let message = resolve_local(&[&source], None).unwrap_err().to_string();
    assert!(message.contains("test, train"), "{message}");
    let train = resolve_local(&[&source], Some("train")).unwrap();
    assert_eq!(names_of(root, train), ["path:default/train"]);
}

/// A split whose hub shards are not one whole set is refused, naming what is wrong: one
/// missing would read as the whole split, short; an older export beside a newer one would
/// repeat rows.
#[test]
fn a_hub_split_missing_a_shard_or_holding_two_sets_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    touch(
        root,
        &[
            "data/train-00000-of-00003.parquet",
            "data/train-00002-of-00003.parquet",
            "data/test-00000-of-00001.parquet",
        ],
    );
    let source = root.display().to_string();
    let message = resolve_local(&[&source], Some("train"))
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("\"train\" split")
            && message.contains("1 of its 3 shards are missing (00001)"),
        "{message}"
    );
    touch(
        root,
        &[
            "data/train-00001-of-00003.parquet",
            "data/train-00000-of-00001.parquet",
        ],
    );
    let message = resolve_local(&[&source], Some("train"))
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("one of 3") && message.contains("one of 1"),
        "{message}"
    );
    // Only the split read is held to it: the test split reads beside a damaged train split.
    let test = resolve_local(&[&source], Some("test")).unwrap();
    assert_eq!(names_of(root, test), ["data/test-00000-of-00001.parquet"]);
    std::fs::remove_file(root.join("data/train-00000-of-00001.parquet")).unwrap();
    touch(root, &["data/train-00001-of-00003-5b3c.parquet"]);
    let message = resolve_local(&[&source], Some("train"))
        .unwrap_err()
        .to_string();
    assert!(message.contains("shard 00001 is there twice"), "{message}");
    std::fs::remove_file(root.join("data/train-00001-of-00003-5b3c.parquet")).unwrap();
    let train = resolve_local(&[&source], Some("train")).unwrap();
    assert_eq!(names_of(root, train).len(), 3);
    // A pattern picks files on purpose: a subset of a set is read as named.
    let some = at(root, "data/train-0000[01]-of-00003.parquet");
    let picked = resolve_local(&[&some], None).unwrap();
    assert_eq!(names_of(root, picked).len(), 2);
}

#[test]
fn split_folders_of_data_files_and_of_image_classes_are_splits() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    touch(
        root,
        &[
            "hub/data/train/0.tar",
            "hub/data/validation/0.tar",
            "imagenet/train/n01/a.jpg",
            "imagenet/val/n01/b.jpg",
            "classes/cat/a.jpg",
            "classes/test/b.jpg",
            "only/train/n01/a.jpg",
        ],
    );
    let hub = at(root, "hub");
    assert!(matches!(
        resolve_local(&[&hub], None),
        Err(Error::SplitNeeded { .. })
    ));
    assert_eq!(
        names_of(root, resolve_local(&[&hub], Some("validation")).unwrap()),
        ["path:hub/data/validation"]
    );
    let imagenet = at(root, "imagenet");
    let message = resolve_local(&[&imagenet], None).unwrap_err().to_string();
    assert!(message.contains("train, val"), "{message}");
    assert_eq!(
        names_of(root, resolve_local(&[&imagenet], Some("val")).unwrap()),
        ["path:imagenet/val"]
    );
    // Classes that include a split's name are classes, not splits.
    let classes = at(root, "classes");
    assert_eq!(
        names_of(root, resolve_local(&[&classes], None).unwrap()),
        ["path:classes"]
    );
    assert!(matches!(
        resolve_local(&[&classes], Some("train")),
        Err(Error::NoSuchSplit { .. })
    ));
    // One split alone is read.
    let only = at(root, "only");
    assert_eq!(
        names_of(root, resolve_local(&[&only], None).unwrap()),
        ["path:only/train"]
    );
}

/// An image folder's splits beside another folder (`samples/`, `__MACOSX/`) or beside a folder
/// of data files (a conversion written into the root), and a split folder beside loose split
/// files: splits all, never read whole with the splits taken as classes, nor one split hiding
/// the others.
#[test]
fn splits_beside_other_folders_or_loose_files_are_never_hidden() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    touch(
        root,
        &[
            "extra/train/cat/a.png",
            "extra/val/cat/b.png",
            "extra/samples/grid.png",
            "converted/train/class_00/a.jpg",
            "converted/val/class_02/b.jpg",
            "converted/val_tar/shard-000000.tar",
            "loose/train/part0.parquet",
            "loose/validation.parquet",
            "twice/train.parquet",
            "twice/train/part0.parquet",
        ],
    );
    let extra = at(root, "extra");
    let message = resolve_local(&[&extra], None).unwrap_err().to_string();
    assert!(
        message.contains("holds the splits train, val:"),
        "{message}"
    );
    assert_eq!(
        names_of(root, resolve_local(&[&extra], Some("train")).unwrap()),
        ["path:extra/train"]
    );
    let converted = at(root, "converted");
    let message = resolve_local(&[&converted], None).unwrap_err().to_string();
    assert!(message.contains("train, val, val_tar"), "{message}");
    assert_eq!(
        names_of(root, resolve_local(&[&converted], Some("val")).unwrap()),
        ["path:converted/val"]
    );
    let loose = at(root, "loose");
    let message = resolve_local(&[&loose], None).unwrap_err().to_string();
    assert!(message.contains("train, validation"), "{message}");
    assert_eq!(
        names_of(root, resolve_local(&[&loose], Some("train")).unwrap()),
        ["loose/train/part0.parquet"]
    );
    assert_eq!(
        names_of(root, resolve_local(&[&loose], Some("validation")).unwrap()),
        ["loose/validation.parquet"]
    );
    let twice = at(root, "twice");
    assert!(matches!(
        resolve_local(&[&twice], None),
        Err(Error::SplitTwice { split, .. }) if split == "train"
    ));
}

/// What the rules above must not take for splits: one class folder named `test` holding
/// folders of its own, a hub repository's `data/` beside a folder named like a split, loose
/// unnamed files beside a split folder (read as before, the folder said to be unread), and a
/// split folder spelt in capitals beside files of its split (held twice).
#[test]
fn one_split_named_folder_beside_others_is_no_split_layout() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    touch(
        root,
        &[
            "classes/cat/a.png",
            "classes/dog/c.png",
            "classes/test/sub/d.png",
            "hub/data/train-00000-of-00001.parquet",
            "hub/eval/configs/x.png",
            "corpus/tokens.bin",
            "corpus/val/tokens.bin",
            "capitals/train.parquet",
            "capitals/Train/part0.parquet",
        ],
    );
    let classes = at(root, "classes");
    assert_eq!(
        names_of(root, resolve_local(&[&classes], None).unwrap()),
        ["path:classes"]
    );
    let hub = at(root, "hub");
    assert_eq!(
        names_of(root, resolve_local(&[&hub], None).unwrap()),
        ["hub/data/train-00000-of-00001.parquet"]
    );
    let corpus = at(root, "corpus");
    assert_eq!(
        names_of(root, resolve_local(&[&corpus], None).unwrap()),
        ["path:corpus"]
    );
    let capitals = at(root, "capitals");
    assert!(matches!(
        resolve_local(&[&capitals], None),
        Err(Error::SplitTwice { split, .. }) if split == "train"
    ));
}

/// An image folder with a data file in one class folder (a stray Parquet file, a conversion
/// written into the source) is an image folder: that class folder is no split read alone.
#[test]
fn a_data_file_in_an_image_folders_class_folder_makes_no_split() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    touch(
        root,
        &[
            "stray/class_00/a.jpg",
            "stray/class_01/b.JPEG",
            "stray/class_01/extra.parquet",
            "nest/class_00/a.png",
            "nest/shards/shard-000000.tar",
        ],
    );
    for name in ["stray", "nest"] {
        let folder = at(root, name);
        assert_eq!(
            names_of(root, resolve_local(&[&folder], None).unwrap()),
            [format!("path:{name}")],
            "{name}"
        );
    }
}

/// A hub repository whose `data/` files are not named by split reads those files, as one
/// source; a split asked of it names none found.
#[test]
fn unnamed_data_files_under_data_are_the_source() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    touch(
        root,
        &[
            "repo/README.md",
            "repo/data/part-b.parquet",
            "repo/data/part-a.parquet",
        ],
    );
    let repo = at(root, "repo");
    assert_eq!(
        names_of(root, resolve_local(&[&repo], None).unwrap()),
        ["repo/data/part-a.parquet", "repo/data/part-b.parquet"]
    );
    assert!(matches!(
        resolve_local(&[&repo], Some("train")),
        Err(Error::NoSuchSplit { .. })
    ));
}

/// Files named for their split by a keyword (`train.jsonl`, the hub's `data/train.parquet`,
/// `imagenet1k-val-0000.tar`) are splits as hub shards are: a folder of two is refused without
/// a split and read by split, here, under `data/` and in a pattern.
#[test]
fn files_named_by_a_split_keyword_are_splits() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    touch(
        root,
        &[
            "hub/train.jsonl",
            "hub/test.jsonl",
            "repo/README.md",
            "repo/data/train.parquet",
            "repo/data/test.parquet",
            "wds/imagenet1k-train-0000.tar",
            "wds/imagenet1k-train-0001.tar",
            "wds/imagenet1k-val-0000.tar",
            "one/pretrain.jsonl",
            "one/train.jsonl",
            "single/data/train.parquet",
        ],
    );
    for (source, train, test) in [
        ("hub", "hub/train.jsonl", "hub/test.jsonl"),
        ("repo", "repo/data/train.parquet", "repo/data/test.parquet"),
        (
            "repo/data",
            "repo/data/train.parquet",
            "repo/data/test.parquet",
        ),
        ("hub/*.jsonl", "hub/train.jsonl", "hub/test.jsonl"),
    ] {
        let source = at(root, source);
        let refused = resolve_local(&[&source], None).unwrap_err();
        assert!(
            matches!(&refused, Error::SplitNeeded { found, .. } if found == &["test", "train"]),
            "{source}: {refused}"
        );
        assert_eq!(
            names_of(root, resolve_local(&[&source], Some("train")).unwrap()),
            [train]
        );
        assert_eq!(
            names_of(root, resolve_local(&[&source], Some("test")).unwrap()),
            [test]
        );
    }
    let wds = at(root, "wds");
    assert!(matches!(
        resolve_local(&[&wds], None),
        Err(Error::SplitNeeded { .. })
    ));
    assert_eq!(
        names_of(root, resolve_local(&[&wds], Some("train")).unwrap()),
        [
            "wds/imagenet1k-train-0000.tar",
            "wds/imagenet1k-train-0001.tar"
        ]
    );
    // A keyword inside a word is no split's; files named by a split beside ones named by none
    // are refused as two groups.
    let one = at(root, "one");
    let message = resolve_local(&[&one], None).unwrap_err().to_string();
    assert!(
        message.contains("(no split in the name), train"),
        "{message}"
    );
    // One split alone is read, and can be named.
    let single = at(root, "single");
    for split in [None, Some("train")] {
        assert_eq!(
            names_of(root, resolve_local(&[&single], split).unwrap()),
            ["single/data/train.parquet"]
        );
    }
}

#[test]
fn a_dataset_dict_folder_reads_the_split_named() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(
        root.join("dataset_dict.json"),
        r#"{"splits": ["train", "test"]}"#,
    )
    .unwrap();
    touch(root, &["train/state.json", "test/state.json"]);
    let source = root.display().to_string();
    let message = resolve_local(&[&source], None).unwrap_err().to_string();
    assert!(message.contains("test, train"), "{message}");
    assert_eq!(
        names_of(root, resolve_local(&[&source], Some("test")).unwrap()),
        ["path:test"]
    );
}

/// A `dataset_dict.json` naming a split that is no folder name beside it is refused: `""`
/// named the dataset's own folder again and its reading recursed until the stack overflowed
/// (the training process died of SIGSEGV), `/etc` was listed as the split.
#[test]
fn a_dataset_dict_split_that_is_no_folder_name_is_refused() {
    for split in ["", ".", "..", "/etc", "a/b", "train/"] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let splits = serde_json::json!({ "splits": [split] }).to_string();
        std::fs::write(root.join("dataset_dict.json"), splits).unwrap();
        touch(root, &["a/b/state.json"]);
        let source = root.display().to_string();
        for asked in [None, Some("train")] {
            let message = resolve_local(&[&source], asked).unwrap_err().to_string();
            assert!(
                message.contains("is not the name of a folder"),
                "{split:?}: {message}"
            );
        }
    }
}

/// A split's folder that leads back to the dataset's (a link) is looked into twice at most:
/// the reading went down `loop/loop/loop/...` until the path was too long for the system.
#[test]
fn a_split_folder_linking_back_to_its_dataset_ends() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join("dataset_dict.json"), r#"{"splits": ["loop"]}"#).unwrap();
    std::os::unix::fs::symlink(root, root.join("loop")).unwrap();
    let source = root.display().to_string();
    let message = resolve_local(&[&source], Some("train"))
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("has no split \"train\"; its splits are loop")
            && message.matches("loop").count() < 6,
        "{message}"
    );
}

#[test]
fn plain_folders_and_files_are_read_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    touch(
        root,
        &[
            "shards/shard-00000.tar",
            "shards/shard-00001.tar",
            "one.parquet",
        ],
    );
    assert_eq!(
        names_of(root, resolve_local(&[&at(root, "shards")], None).unwrap()),
        ["path:shards"]
    );
    assert_eq!(
        names_of(
            root,
            resolve_local(&[&at(root, "one.parquet")], None).unwrap()
        ),
        ["path:one.parquet"]
    );
    assert!(matches!(
        resolve_local(&[&at(root, "shards")], Some("train")),
        Err(Error::NoSuchSplit { .. })
    ));
    assert!(matches!(
        resolve_local(&[&at(root, "missing")], None),
        Err(Error::RootNotFound(_))
    ));
}

#[test]
fn patterns_and_lists_resolve_to_sorted_files_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    touch(
        root,
        &[
            "s/shard-00000.tar",
            "s/shard-00001.tar",
            "s/shard-00002.tar",
            "s/shard-00010.tar",
            "s/other.tar",
        ],
    );
    let range = resolve_local(&[&at(root, "s/shard-{00000..00002}.tar")], None).unwrap();
    assert_eq!(
        names_of(root, range),
        [
            "s/shard-00000.tar",
            "s/shard-00001.tar",
            "s/shard-00002.tar"
        ]
    );
    let glob = resolve_local(&[&at(root, "s/shard-*.tar")], None).unwrap();
    assert_eq!(
        names_of(root, glob),
        [
            "s/shard-00000.tar",
            "s/shard-00001.tar",
            "s/shard-00002.tar",
            "s/shard-00010.tar"
        ]
    );
    // A list in any order, with a file named twice: sorted, once.
    let list = resolve_local(
        &[
            &at(root, "s/shard-00010.tar"),
            &at(root, "s/shard-0000[01].tar"),
            &at(root, "s/shard-00000.tar"),
        ],
        None,
    )
    .unwrap();
    assert_eq!(
        names_of(root, list),
        [
            "s/shard-00000.tar",
            "s/shard-00001.tar",
            "s/shard-00010.tar"
        ]
    );
    // One file by other names (relative with `./`, through a link): once, by its first name.
    std::os::unix::fs::symlink(root.join("s/shard-00001.tar"), root.join("link.tar")).unwrap();
    let dotted = format!("{}/s/./shard-00001.tar", root.display());
    let aliases = resolve_local(
        &[
            &at(root, "s/shard-00001.tar"),
            &dotted,
            &at(root, "link.tar"),
        ],
        None,
    )
    .unwrap();
    assert_eq!(names_of(root, aliases), ["s/shard-00001.tar"]);
    let gap = resolve_local(&[&at(root, "s/shard-{00000..00004}.tar")], None).unwrap_err();
    assert!(gap.to_string().contains("shard-00003.tar"), "{gap}");
    let folder = resolve_local(&[&at(root, "s"), &at(root, "s/other.tar")], None).unwrap_err();
    assert!(matches!(folder, Error::FolderInList { .. }), "{folder}");
}

/// The index caches a first open writes beside tar shards (and their temporaries) are never
/// taken by a pattern, so a pattern without an extension reads the same shards the second time.
#[test]
fn patterns_leave_out_the_index_caches_written_beside_shards() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    touch(
        root,
        &[
            "s/shard-0.tar",
            "s/shard-1.tar",
            "s/shard-0.tar.stoker-idx",
            "s/shard-1.tar.stoker-idx.tmp-4242",
        ],
    );
    for pattern in ["s/shard-*", "s/*", "**/shard-?.*"] {
        assert_eq!(
            names_of(root, resolve_local(&[&at(root, pattern)], None).unwrap()),
            ["s/shard-0.tar", "s/shard-1.tar"],
            "{pattern}"
        );
    }
}

#[test]
fn patterns_spanning_splits_are_refused_unless_one_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    touch(
        root,
        &[
            "d/train-00000-of-00001.parquet",
            "d/test-00000-of-00001.parquet",
        ],
    );
    let pattern = at(root, "d/*.parquet");
    let message = resolve_local(&[&pattern], None).unwrap_err().to_string();
    assert!(message.contains("test, train"), "{message}");
    assert_eq!(
        names_of(root, resolve_local(&[&pattern], Some("test")).unwrap()),
        ["d/test-00000-of-00001.parquet"]
    );
}

#[test]
fn kinds_of_named_files_are_one_format() {
    let files = |names: &[&str]| names.iter().map(PathBuf::from).collect::<Vec<_>>();
    assert_eq!(
        kind_of_files("x", &files(&["a.tar", "b.TAR"])).unwrap(),
        FileKind::TarShard
    );
    assert_eq!(
        kind_of_files("x", &files(&["a.jsonl.gz", "b.jsonl"])).unwrap(),
        FileKind::Jsonl
    );
    let mixed = kind_of_files("x", &files(&["a.tar", "b.parquet"]))
        .unwrap_err()
        .to_string();
    assert!(
        mixed.contains("a.tar (tar shards)") && mixed.contains("b.parquet (Parquet)"),
        "{mixed}"
    );
    assert!(matches!(
        kind_of_files("x", &files(&["a.jpg"])),
        Err(Error::NotADataFile { .. })
    ));
}

/// A Megatron corpus named by its prefix reads its `.bin` and `.idx`: what a worker holds to
/// its data roots (the prefix itself is no file, and was refused as missing there).
#[test]
fn a_megatron_prefix_reaches_its_two_files() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    touch(
        root,
        &["corpus_text_document.bin", "corpus_text_document.idx"],
    );
    let prefix = at(root, "corpus_text_document");
    assert_eq!(
        reach_of_name(&prefix).unwrap(),
        [
            root.join("corpus_text_document.bin"),
            root.join("corpus_text_document.idx")
        ]
    );
    assert_eq!(
        names_of(root, resolve_local(&[&prefix], None).unwrap()),
        ["path:corpus_text_document.bin"]
    );
}

/// Hugging Face's imagefolder layout, each split's images lying in its folder beside a
/// `metadata.jsonl` (in the root or under `data/`): splits, never one image folder whose
/// classes are the splits (or, under `data/`, one class `data` holding every split), train and
/// test read as one set. One such folder alone is an image folder's class, as before.
#[test]
fn split_folders_holding_images_directly_are_splits() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    touch(
        root,
        &[
            "flat/train/0001.png",
            "flat/train/metadata.jsonl",
            "flat/test/0002.png",
            "flat/test/metadata.jsonl",
            "hub/README.md",
            "hub/data/train/0001.jpg",
            "hub/data/validation/0002.jpg",
            "one/train/0001.png",
            "one/cat/0002.png",
        ],
    );
    for (name, folder) in [("flat", "flat/train"), ("hub", "hub/data/train")] {
        let named = at(root, name);
        let message = resolve_local(&[&named], None).unwrap_err().to_string();
        assert!(message.contains("train"), "{name}: {message}");
        assert_eq!(
            names_of(root, resolve_local(&[&named], Some("train")).unwrap()),
            [format!("path:{folder}")]
        );
    }
    // A class named like a split beside one that is not: classes.
    let one = at(root, "one");
    assert_eq!(
        names_of(root, resolve_local(&[&one], None).unwrap()),
        ["path:one"]
    );
}

/// macOS's AppleDouble files (`._train.parquet`, beside each file copied from its disks) are
/// no split's files, nor splits of their own, nor matched by a pattern.
#[test]
fn apple_double_files_are_never_data() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    touch(
        root,
        &[
            "keyword/train.parquet",
            "keyword/._train.parquet",
            "keyword/test.parquet",
            "keyword/._test.parquet",
            "hub/train-00000-of-00001.parquet",
            "hub/._train-00000-of-00001.parquet",
            "hub/test-00000-of-00001.parquet",
        ],
    );
    let keyword = at(root, "keyword");
    assert_eq!(
        names_of(root, resolve_local(&[&keyword], Some("train")).unwrap()),
        ["keyword/train.parquet"]
    );
    let hub = at(root, "hub");
    let message = resolve_local(&[&hub], None).unwrap_err().to_string();
    assert!(!message.contains("._"), "{message}");
    let pattern = format!("{}/keyword/*.parquet", root.display());
    assert_eq!(
        names_of(root, resolve_local(&[&pattern], Some("train")).unwrap()),
        ["keyword/train.parquet"]
    );
}

/// Split folders of data files beside a loose file named by no split (`preview.parquet`): the
/// loose file is read when no split is asked (with a warning, as before), and a split asked is
/// its folder (it was not found: the loose file hid the folders).
#[test]
fn a_split_asked_beside_unnamed_loose_files_is_its_folder() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    touch(
        root,
        &[
            "set/train/p0.parquet",
            "set/train/p1.parquet",
            "set/validation/p0.parquet",
            "set/preview.parquet",
        ],
    );
    let set = at(root, "set");
    assert_eq!(
        names_of(root, resolve_local(&[&set], None).unwrap()),
        ["path:set"]
    );
    assert_eq!(
        names_of(root, resolve_local(&[&set], Some("train")).unwrap()),
        ["path:set/train"]
    );
    let message = resolve_local(&[&set], Some("test"))
        .unwrap_err()
        .to_string();
    assert!(message.contains("train, validation"), "{message}");
}
