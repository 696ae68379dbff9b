//! `s3://` patterns, brace ranges, lists and splits against the in-test S3 server: each selects
//! the objects a local pattern would select among the same files, in the same order, listing
//! only the keys that start with the text before its first wildcard; what matches nothing, a
//! missing name, two buckets and two formats are refused by name.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use stoker_datasets::{resolve_remote, Error, FileKind, SampleSource, TarShards};

use crate::object_store::{assert_same_samples, byte_shards, cache, BUCKET};
use crate::s3_server::S3Server;

/// Copies `names` of the local folder `local` to `prefix` in the server's bucket, renamed by
/// `rename`.
fn put(server: &S3Server, local: &Path, prefix: &str, names: &[(&str, &str)]) {
    let target = server.bucket_dir(BUCKET).join(prefix);
    std::fs::create_dir_all(&target).unwrap();
    for (from, to) in names {
        std::fs::copy(local.join(from), target.join(to)).unwrap();
    }
}

fn shard(k: usize) -> String {
    format!("shard-{k:05}.tar")
}

/// The local shards `ks` of `local`, as a set to compare with.
fn local_set(local: &Path, ks: &[usize]) -> TarShards {
    let files: Vec<PathBuf> = ks.iter().map(|&k| local.join(shard(k))).collect();
    TarShards::open_files(local, files).unwrap()
}

fn uris(files: &stoker_datasets::RemoteFiles) -> Vec<String> {
    files.uris()
}

#[test]
fn patterns_ranges_and_lists_select_the_objects_a_local_pattern_would() {
    let dir = tempfile::tempdir().unwrap();
    let local = byte_shards(dir.path(), 6, 3, 2_000);
    let server = S3Server::start(&dir.path().join("server"));
    let all: Vec<(String, String)> = (0..6).map(|k| (shard(k), shard(k))).collect();
    let all: Vec<(&str, &str)> = all.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    put(&server, &local, "ws", &all);
    put(&server, &local, "deep/a/b", &all[..2]);
    put(&server, &local, "deep/c", &all[2..3]);
    // A key that sorts before `deep/a/...` by its bytes (`-` is below `/`), as a local path does,
    // and after it by path components.
    put(&server, &local, "deep", &[(all[3].0, "a-1.tar")]);
    let cache = cache(&server, &dir.path().join("cache"));
    // The index object `stoker index` writes: named shards take their entries from it.
    stoker_datasets::write_tar_index("s3://data/ws", &cache).unwrap();

    // A brace range is found in one listing of its folder, not one request per name.
    let lists = server.counts.lists.load(Ordering::SeqCst);
    let heads = server.counts.heads.load(Ordering::SeqCst);
    let ranged = resolve_remote(&["s3://data/ws/shard-{00001..00003}.tar"], None, &cache).unwrap();
    assert_eq!(server.counts.lists.load(Ordering::SeqCst), lists + 1);
    assert_eq!(server.counts.heads.load(Ordering::SeqCst), heads);
    assert_eq!(ranged.kind, FileKind::TarShard);
    assert_eq!(
        uris(&ranged),
        (1..=3)
            .map(|k| format!("s3://data/ws/{}", shard(k)))
            .collect::<Vec<_>>()
    );
    let remote = TarShards::open_remote_files(ranged, Arc::clone(&cache)).unwrap();
    assert_eq!(remote.index_stats().built, 0, "read from the index object");
    assert_same_samples(&remote, &local_set(&local, &[1, 2, 3]));

    let class = resolve_remote(&["s3://data/ws/shard-0000[024].tar"], None, &cache).unwrap();
    // Only the keys under the text before the first wildcard were listed, in its folder.
    let last_query = |server: &S3Server| {
        server
            .counts
            .list_queries
            .lock()
            .unwrap()
            .last()
            .cloned()
            .unwrap()
    };
    let query = last_query(&server);
    assert!(
        query.contains("prefix=ws%2Fshard-0000&") || query.ends_with("prefix=ws%2Fshard-0000"),
        "{query}"
    );
    assert!(query.contains("delimiter=%2F"), "{query}");
    let remote = TarShards::open_remote_files(class, Arc::clone(&cache)).unwrap();
    assert_same_samples(&remote, &local_set(&local, &[0, 2, 4]));

    // A list is sorted and counted once, whatever order it is written in.
    let list = resolve_remote(
        &[
            "s3://data/ws/shard-00005.tar",
            "s3://data/ws/shard-00000.tar",
            "s3://data/ws/shard-0000[05].tar",
        ],
        None,
        &cache,
    )
    .unwrap();
    assert_eq!(
        uris(&list),
        [
            "s3://data/ws/shard-00000.tar",
            "s3://data/ws/shard-00005.tar"
        ]
    );

    // `*` stays in its folder; `**` crosses folders, listing only under `deep/`.
    let star = resolve_remote(&["s3://data/deep/*/*.tar"], None, &cache).unwrap();
    assert_eq!(uris(&star), ["s3://data/deep/c/shard-00002.tar"]);
    let deep = resolve_remote(&["s3://data/deep/**/*.tar"], None, &cache).unwrap();
    let query = last_query(&server);
    assert!(
        query.contains("prefix=deep%2F") && !query.contains("delimiter"),
        "{query}"
    );
    assert_eq!(
        uris(&deep),
        [
            "s3://data/deep/a-1.tar",
            "s3://data/deep/a/b/shard-00000.tar",
            "s3://data/deep/a/b/shard-00001.tar",
            "s3://data/deep/c/shard-00002.tar"
        ]
    );
    let remote = TarShards::open_remote_files(deep, Arc::clone(&cache)).unwrap();
    assert_eq!(remote.len(), 12);
    assert_eq!(remote.index_stats().built, 4, "no index object: scanned");
}

#[test]
fn what_names_nothing_or_too_much_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let local = byte_shards(dir.path(), 2, 1, 500);
    let server = S3Server::start(&dir.path().join("server"));
    put(
        &server,
        &local,
        "ws",
        &[(&shard(0), &shard(0)), (&shard(1), &shard(1))],
    );
    std::fs::write(server.bucket_dir(BUCKET).join("ws/tokens.bin"), [0u8; 8]).unwrap();
    let cache = cache(&server, &dir.path().join("cache"));

    let message = |names: &[&str]| match resolve_remote(names, None, &cache) {
        Ok(files) => panic!("{names:?} selected {:?}", files.uris()),
        Err(error) => (error.to_string(), error),
    };
    let (text, error) = message(&["s3://data/ws/nothing-*.tar"]);
    assert!(matches!(error, Error::NoMatch { .. }), "{text}");
    assert!(
        text.contains("s3://data/ws/nothing-*.tar") && text.contains("s3://data/ws"),
        "{text}"
    );
    let (text, error) = message(&["s3://data/ws/shard-{00000..00003}.tar"]);
    assert!(matches!(error, Error::ListedFileMissing { .. }), "{text}");
    assert!(text.contains("s3://data/ws/shard-00002.tar"), "{text}");
    let (text, error) = message(&["s3://data/ws/*"]);
    assert!(matches!(error, Error::MixedFormats { .. }), "{text}");
    let (text, _) = message(&["s3://data/ws/shard-00000.tar", "s3://other/shard-00001.tar"]);
    assert!(text.contains("the buckets data and other"), "{text}");
    let (text, error) = message(&["s3://da*/ws/shard-00000.tar"]);
    assert!(matches!(error, Error::BadSourcePattern { .. }), "{text}");
    let (text, error) = message(&["s3://data/ws/shard-[0.tar"]);
    assert!(matches!(error, Error::BadSourcePattern { .. }), "{text}");
}

#[test]
fn a_prefix_or_pattern_of_tar_shards_named_by_split_reads_one_split() {
    let dir = tempfile::tempdir().unwrap();
    let local = byte_shards(dir.path(), 3, 2, 800);
    let server = S3Server::start(&dir.path().join("server"));
    put(
        &server,
        &local,
        "hub",
        &[
            (&shard(0), "train-00000-of-00002.tar"),
            (&shard(1), "train-00001-of-00002.tar"),
            (&shard(2), "test-00000-of-00001.tar"),
        ],
    );
    let cache = cache(&server, &dir.path().join("cache"));
    let whole = TarShards::open_remote_split("s3://data/hub", Arc::clone(&cache), None)
        .unwrap_err()
        .to_string();
    assert!(whole.contains("test, train"), "{whole}");
    let train =
        TarShards::open_remote_split("s3://data/hub", Arc::clone(&cache), Some("train")).unwrap();
    assert_same_samples(&train, &local_set(&local, &[0, 1]));
    let missing = TarShards::open_remote_split("s3://data/hub", Arc::clone(&cache), Some("val"))
        .unwrap_err()
        .to_string();
    assert!(
        missing.contains("val") && missing.contains("test, train"),
        "{missing}"
    );

    let spanning = resolve_remote(&["s3://data/hub/*.tar"], None, &cache)
        .err()
        .unwrap()
        .to_string();
    assert!(spanning.contains("test, train"), "{spanning}");
    let test = resolve_remote(&["s3://data/hub/*.tar"], Some("test"), &cache).unwrap();
    assert_eq!(uris(&test), ["s3://data/hub/test-00000-of-00001.tar"]);
    let test = TarShards::open_remote_files(test, Arc::clone(&cache)).unwrap();
    assert_same_samples(&test, &local_set(&local, &[2]));

    // A split missing one of its shards under a prefix read whole is refused, naming it.
    put(
        &server,
        &local,
        "cut",
        &[
            (&shard(0), "train-00000-of-00003.tar"),
            (&shard(1), "train-00002-of-00003.tar"),
        ],
    );
    let cut = TarShards::open_remote_split("s3://data/cut", Arc::clone(&cache), Some("train"))
        .unwrap_err()
        .to_string();
    assert!(
        cut.contains("1 of its 3 shards are missing (00001)"),
        "{cut}"
    );
    // One shard named by its URI is read, as locally.
    let one = "s3://data/cut/train-00000-of-00003.tar";
    let one = TarShards::open_remote_split(one, cache, None).unwrap();
    assert_same_samples(&one, &local_set(&local, &[0]));
}

#[test]
fn a_prefix_laid_out_by_split_folders_reads_one_split() {
    let dir = tempfile::tempdir().unwrap();
    let local = byte_shards(dir.path(), 3, 2, 600);
    let server = S3Server::start(&dir.path().join("server"));
    put(
        &server,
        &local,
        "splits/train",
        &[(&shard(0), &shard(0)), (&shard(1), &shard(1))],
    );
    put(&server, &local, "splits/test", &[(&shard(2), &shard(2))]);
    put(
        &server,
        &local,
        "repo/data",
        &[(&shard(0), "train-00000-of-00001.tar")],
    );
    std::fs::write(server.bucket_dir(BUCKET).join("repo/README.md"), "a card").unwrap();
    put(&server, &local, "flat", &[(&shard(0), &shard(0))]);
    let cache = cache(&server, &dir.path().join("cache"));
    let split_prefix =
        |uri: &str, split: Option<&str>| stoker_datasets::remote_split_prefix(uri, split, &cache);

    let whole = split_prefix("s3://data/splits", None)
        .unwrap_err()
        .to_string();
    assert!(whole.contains("test, train"), "{whole}");
    let (train, own) = split_prefix("s3://data/splits", Some("train"))
        .unwrap()
        .unwrap();
    assert_eq!((train.as_str(), own), ("s3://data/splits/train", true));
    let train = TarShards::open_remote(&train, Arc::clone(&cache)).unwrap();
    assert_same_samples(&train, &local_set(&local, &[0, 1]));
    let missing = split_prefix("s3://data/splits", Some("val"))
        .unwrap_err()
        .to_string();
    assert!(
        missing.contains("val") && missing.contains("test, train"),
        "{missing}"
    );
    // A hub repository: its files under data/, their split from their names.
    assert_eq!(
        split_prefix("s3://data/repo", Some("train")).unwrap(),
        Some(("s3://data/repo/data".to_string(), false))
    );
    // Data objects right under the prefix: read as it is.
    assert_eq!(split_prefix("s3://data/flat", None).unwrap(), None);
}
