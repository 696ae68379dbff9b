//! `stoker convert` as a user runs it: an ImageFolder rewritten as tar shards or as Parquet
//! gives the same batches as the folder, whatever the shuffle and thread count; non-empty
//! outputs are refused clearly; `inspect` reads all three.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::Path;

use crate::common::{self, convert_args, stdout_of, stoker};

/// The digest of the first 5 batches of `data`.
fn digest(data: &Path, extra: &[&str]) -> String {
    digest_of_batches(data, "5", extra)
}

fn digest_of_batches(data: &Path, batches: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "digest",
        "--data",
        data.to_str().unwrap(),
        "--batch-size",
        "8",
        "--batches",
        batches,
        "--size",
        "64",
    ];
    args.extend_from_slice(extra);
    let out = stdout_of(&args);
    let last = out.lines().last().unwrap_or_default().to_string();
    assert_eq!(last.len(), 64, "sha-256 hex expected: {out}");
    last
}

/// The converted set shuffles like the folder it came from, whatever the thread count; its
/// shard-aware shuffle is deterministic too, and a different order from the global one. Returns
/// the digest of the shuffled epoch.
fn assert_shuffles_like(folder: &Path, converted: &Path) -> String {
    let shuffled = digest(folder, &["--threads", "1"]);
    assert_eq!(shuffled, digest(converted, &["--threads", "1"]));
    assert_eq!(shuffled, digest(converted, &["--threads", "2"]));
    let windowed = digest(converted, &["--threads", "1", "--shuffle-window", "2"]);
    assert_eq!(
        windowed,
        digest(converted, &["--threads", "2", "--shuffle-window", "2"])
    );
    assert_ne!(windowed, shuffled);
    shuffled
}

#[test]
fn tar_shards_give_the_same_batches_as_the_folder() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("folder");
    let shards = dir.path().join("shards");
    common::make_images(&folder, 40);
    let out = stdout_of(&convert_args(
        &folder,
        "tar",
        &shards,
        &["--shard-size", "1"],
    ));
    assert!(out.contains("wrote 40 samples"), "{out}");
    let mut names: Vec<String> = std::fs::read_dir(&shards)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".tar"))
        .collect();
    names.sort();
    assert!(names.len() >= 2, "several shards expected: {names:?}");
    assert_eq!(names[0], "shard-000000.tar");
    assert!(shards.join("classes.txt").is_file());

    assert_eq!(
        digest(&folder, &["--no-shuffle"]),
        digest(&shards, &["--no-shuffle"])
    );
    let shuffled = assert_shuffles_like(&folder, &shards);
    assert_ne!(
        shuffled,
        digest(&shards, &["--threads", "2", "--seed", "3"])
    );

    let inspected = stdout_of(&["inspect", "--data", folder.to_str().unwrap()]);
    assert!(inspected.contains("samples   40"), "{inspected}");
}

#[test]
fn parquet_gives_the_same_batches_as_the_folder_and_the_tar_shards() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("folder");
    let shards = dir.path().join("shards");
    let parquet = dir.path().join("parquet");
    common::make_images(&folder, 40);
    let convert = |to: &str, out: &Path, extra: &[&str]| {
        let args = [&["--shard-size", "1"][..], extra].concat();
        stdout_of(&convert_args(&folder, to, out, &args))
    };
    convert("tar", &shards, &[]);
    let out = convert("parquet", &parquet, &["--row-group-size", "8"]);
    assert!(out.contains("wrote 40 samples"), "{out}");
    let mut names: Vec<String> = std::fs::read_dir(&parquet)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert!(names.len() >= 2, "several files expected: {names:?}");
    assert!(
        names.iter().all(|name| name.ends_with(".parquet")),
        "{names:?}"
    );
    assert_eq!(names[0], "part-000000.parquet");

    let unshuffled = digest(&folder, &["--no-shuffle"]);
    assert_eq!(unshuffled, digest(&shards, &["--no-shuffle"]));
    assert_eq!(unshuffled, digest(&parquet, &["--no-shuffle"]));
    // One file of the set on its own is a dataset too.
    let first_batch = |data: &Path| digest_of_batches(data, "1", &["--no-shuffle"]);
    assert_eq!(first_batch(&parquet.join(&names[0])), first_batch(&folder));

    assert_shuffles_like(&folder, &parquet);

    let inspected = stdout_of(&["inspect", "--data", parquet.to_str().unwrap()]);
    for expected in [
        "(parquet)",
        "row groups, 40 rows",
        "Binary  (images)",
        "(labels)",
        "samples   40",
        "classes   10",
        "jpeg",
    ] {
        assert!(
            inspected.contains(expected),
            "{expected:?} missing: {inspected}"
        );
    }
    let json = stdout_of(&["inspect", "--data", parquet.to_str().unwrap(), "--json"]);
    let json: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(json["rows"], 40);
    assert_eq!(json["images"]["samples"], 40);
}

#[test]
fn non_empty_outputs_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("folder");
    common::make_images(&folder, 4);
    for to in ["tar", "parquet"] {
        let out = dir.path().join(to);
        let convert = || stoker(&convert_args(&folder, to, &out, &[]));
        assert!(convert().status.success());
        let again = convert();
        assert!(!again.status.success());
        let message = String::from_utf8_lossy(&again.stderr);
        assert!(message.contains("not empty"), "{message}");
    }
    // An output inside the folder it converts would be a class of it from then on.
    let inside = folder.join("tars");
    let refused = stoker(&convert_args(&folder, "tar", &inside, &[]));
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && message.contains("lies inside"),
        "{message}"
    );
    assert!(!inside.exists());
    assert!(stoker(&["inspect", "--data", folder.to_str().unwrap()])
        .status
        .success());
    // Nor beside the split it converts, inside the dataset's root: one more split there.
    let split = dir.path().join("split");
    common::make_images(&split.join("train"), 4);
    common::make_images(&split.join("val"), 4);
    let beside = split.join("val_tar");
    let refused = stoker(&convert_args(&split, "tar", &beside, &["--split", "val"]));
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && message.contains("lies inside the dataset"),
        "{message}"
    );
    assert!(!beside.exists());

    // A reader gone before the closing line (`| true`) is no failure of the work done.
    let out = dir.path().join("piped");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_stoker"))
        .args(convert_args(&folder, "tar", &out, &[]))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let done = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(
        done.status.success() && !stderr.contains("panicked"),
        "{stderr}"
    );

    let help = stdout_of(&["convert", "--help"]);
    assert!(help.contains("--shard-size"), "{help}");
    assert!(help.contains("--row-group-size"), "{help}");
}

/// A folder laid out by split is never converted whole (its split names becoming classes): it
/// is refused naming its splits, and `--split` converts one, as the loader reads it.
#[test]
fn a_folder_laid_out_by_split_is_converted_one_split_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let splits = dir.path().join("splits");
    common::make_images(&splits.join("train"), 8);
    common::make_images(&splits.join("val"), 4);
    let whole = stoker(&convert_args(
        &splits,
        "tar",
        &dir.path().join("whole"),
        &[],
    ));
    assert!(!whole.status.success());
    let message = String::from_utf8_lossy(&whole.stderr);
    assert!(message.contains("train, val"), "{message}");
    let out = dir.path().join("train");
    stdout_of(&convert_args(&splits, "tar", &out, &["--split", "train"]));
    assert_eq!(
        digest(&out, &[]),
        digest(&splits, &["--split", "train"]),
        "the split converted reads as the split"
    );
}

/// A conversion that fails (here: none of its samples can be read, every image a broken link,
/// as a folder its user may not read gives) leaves no shard or file behind, nor a set of empty
/// samples: nothing a reader would take for the whole set. (One sample unreadable by its own
/// fault is written empty instead: see below.)
#[test]
fn a_conversion_that_fails_leaves_no_set_to_read() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("folder");
    common::make_images(&folder, 12);
    for class in std::fs::read_dir(&folder).unwrap().flatten() {
        if !class.path().is_dir() {
            continue;
        }
        for image in std::fs::read_dir(class.path()).unwrap().flatten() {
            std::fs::remove_file(image.path()).unwrap();
            std::os::unix::fs::symlink(dir.path().join("gone.jpg"), image.path()).unwrap();
        }
    }
    for to in ["tar", "parquet"] {
        let out = dir.path().join(to);
        let failed = stoker(&convert_args(&folder, to, &out, &["--shard-size", "1"]));
        let stderr = String::from_utf8_lossy(&failed.stderr);
        assert!(!failed.status.success(), "{to}: {stderr}");
        assert!(
            stderr.contains("none of the 12 samples could be read"),
            "{to}: {stderr}"
        );
        let left: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .flatten()
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            !left
                .iter()
                .any(|name| name.contains(".tar") || name.contains(".parquet")),
            "{to}: {left:?}"
        );
    }
}

/// `digest` never prints the hash of nothing: `--batches 0` is refused, and so is an epoch
/// without a batch; `bench` of such an epoch says so rather than spinning.
#[test]
fn an_epoch_without_a_batch_is_refused_not_hashed_or_spun_on() {
    let (_dir, folder) = common::images_in_tempdir(4);
    let data = folder.to_str().unwrap();
    let zero = stoker(&["digest", "--data", data, "--batches", "0"]);
    assert!(!zero.status.success());
    let short = [
        "--data",
        data,
        "--batch-size",
        "8",
        "--drop-last",
        "--size",
        "32",
    ];
    let digest = stoker(&[&["digest"][..], &short].concat());
    assert!(!digest.status.success());
    let message = String::from_utf8_lossy(&digest.stderr);
    assert!(message.contains("holds no batch"), "{message}");
    let started = std::time::Instant::now();
    let bench = stoker(&[&["bench"][..], &short, &["--floor-images", "0"]].concat());
    assert!(!bench.status.success());
    let message = String::from_utf8_lossy(&bench.stderr);
    assert!(message.contains("holds no batch"), "{message}");
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
}

/// What opening a dataset finds that its user should be told (here labels past the class names
/// of `classes.txt`) is in the command's log, as the Python module logs it.
#[test]
fn a_datasets_notices_reach_the_commands_log() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("folder");
    common::make_images(&folder, 12);
    let shards = dir.path().join("shards");
    stdout_of(&convert_args(&folder, "tar", &shards, &[]));
    std::fs::write(shards.join("classes.txt"), "a\nb\n").unwrap();
    let out = stoker(&["digest", "--data", shards.to_str().unwrap(), "--size", "32"]);
    assert!(out.status.success());
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("past the 2 class names of classes.txt"),
        "{log}"
    );
}

/// One broken link in the folder ended `convert` (training reads it as a bad sample): it is
/// written empty, so the tar shards and the Parquet files give the folder's batches, the same
/// substitute in its place.
#[test]
fn a_sample_that_cannot_be_read_is_converted_as_the_same_bad_sample() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("folder");
    common::make_images(&folder, 12);
    std::os::unix::fs::symlink(dir.path().join("gone.jpg"), folder.join("class_01/aa.jpg"))
        .unwrap();
    let expected = digest_of_batches(&folder, "2", &["--no-shuffle"]);
    for to in ["tar", "parquet"] {
        let out = dir.path().join(to);
        let done = stoker(&convert_args(&folder, to, &out, &[]));
        let stderr = String::from_utf8_lossy(&done.stderr);
        assert!(done.status.success(), "{to}: {stderr}");
        assert!(stderr.contains("written empty"), "{to}: {stderr}");
        assert_eq!(
            digest_of_batches(&out, "2", &["--no-shuffle"]),
            expected,
            "{to}"
        );
    }
}
