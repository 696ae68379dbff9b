//! `stoker convert` as a user runs it: an ImageFolder rewritten as tar shards gives the same
//! batches as the folder, whatever the shuffle and thread count; unsupported targets and
//! non-empty outputs are refused clearly.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

use std::path::Path;

use common::{stdout_of, stoker};

fn digest(data: &Path, extra: &[&str]) -> String {
    let mut args = vec![
        "digest",
        "--data",
        data.to_str().unwrap(),
        "--batch-size",
        "8",
        "--batches",
        "5",
        "--size",
        "64",
    ];
    args.extend_from_slice(extra);
    let out = stdout_of(&args);
    let last = out.lines().last().unwrap_or_default().to_string();
    assert_eq!(last.len(), 64, "sha-256 hex expected: {out}");
    last
}

#[test]
fn tar_shards_give_the_same_batches_as_the_folder() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("folder");
    let shards = dir.path().join("shards");
    common::make_images(&folder, 40);
    let out = stdout_of(&[
        "convert",
        "--from",
        folder.to_str().unwrap(),
        "--to",
        "tar",
        "--out",
        shards.to_str().unwrap(),
        "--shard-size",
        "1",
    ]);
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
    let shuffled = digest(&folder, &["--threads", "1"]);
    assert_eq!(shuffled, digest(&shards, &["--threads", "1"]));
    assert_eq!(shuffled, digest(&shards, &["--threads", "2"]));
    assert_ne!(
        shuffled,
        digest(&shards, &["--threads", "2", "--seed", "3"])
    );
    // The shard-aware shuffle is deterministic too, and a different order from the global one.
    let windowed = digest(&shards, &["--threads", "1", "--shuffle-window", "2"]);
    assert_eq!(
        windowed,
        digest(&shards, &["--threads", "2", "--shuffle-window", "2"])
    );
    assert_ne!(windowed, shuffled);

    let inspected = stdout_of(&["inspect", "--data", folder.to_str().unwrap()]);
    assert!(inspected.contains("samples   40"), "{inspected}");
}

#[test]
fn parquet_and_non_empty_outputs_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("folder");
    common::make_images(&folder, 4);
    let out = dir.path().join("out");
    let convert = |to: &str| {
        stoker(&[
            "convert",
            "--from",
            folder.to_str().unwrap(),
            "--to",
            to,
            "--out",
            out.to_str().unwrap(),
        ])
    };
    let parquet = convert("parquet");
    assert!(!parquet.status.success());
    let message = String::from_utf8_lossy(&parquet.stderr);
    assert!(message.contains("not built yet"), "{message}");
    assert!(!out.exists());

    assert!(convert("tar").status.success());
    let again = convert("tar");
    assert!(!again.status.success());
    let message = String::from_utf8_lossy(&again.stderr);
    assert!(message.contains("not empty"), "{message}");

    let help = stdout_of(&["convert", "--help"]);
    assert!(help.contains("--shard-size"), "{help}");
}
