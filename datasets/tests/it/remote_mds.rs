//! Mosaic Streaming's MDS shards under a prefix of the in-test S3 server, read as the same folder
//! is locally: the same samples, labels and token windows, compressed shards decompressed in
//! the cache, split folders picked, and errors naming the objects.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::Path;
use std::sync::Arc;

use stoker_datasets::{
    remote_layout, remote_split_prefix, write_mds, MdsColumn, MdsDataset, MdsOptions,
    MdsTokenWindows, ObjectCache, ObjectCacheOptions, RemoteLayout, SampleSource,
};

use crate::object_store::{assert_same_samples, cache, options, BUCKET};
use crate::s3_server::S3Server;

fn column(name: &str, encoding: &str, size: Option<u32>) -> MdsColumn {
    MdsColumn {
        name: name.into(),
        encoding: encoding.into(),
        size,
    }
}

/// 9 samples: bytes of their own as `jpeg`, an int64 label, a uint32 `tokens` array of `k + 1`
/// ids (its dtype named, its shape in the sample).
fn write_set(dir: &Path, compression: Option<&str>) {
    write_shifted_set(dir, compression, 0);
}

/// [`write_set`] with every token id `shift` more: the same sizes, so the same `index.json`.
fn write_shifted_set(dir: &Path, compression: Option<&str>, shift: u32) {
    let columns = [
        column("image", "jpeg", None),
        column("label", "int", Some(8)),
        column("tokens", "ndarray:uint32", None),
    ];
    let rows: Vec<Vec<Vec<u8>>> = (0..9u8)
        .map(|k| {
            let mut tokens = vec![1 << 2, k + 1];
            for id in 0..=u32::from(k) {
                tokens.extend_from_slice(&(id * 7 + u32::from(k) + shift).to_le_bytes());
            }
            vec![
                vec![k; 10 + usize::from(k)],
                i64::from(k % 3).to_le_bytes().to_vec(),
                tokens,
            ]
        })
        .collect();
    write_mds(dir, &columns, &rows, 4, compression).unwrap();
}

#[test]
fn mds_shards_in_a_bucket_read_as_the_same_local_folder() {
    let dir = tempfile::tempdir().unwrap();
    let server = S3Server::start(&dir.path().join("server"));
    let bucket = server.bucket_dir(BUCKET);
    let cache = cache(&server, &dir.path().join("cache"));
    let local_cache = ObjectCacheOptions::new(dir.path().join("local-cache"));
    let local_options = || Ok(local_cache.clone());
    for (name, compression) in [
        ("plain", None),
        ("zstd", Some("zstd:3")),
        ("gz", Some("gz")),
    ] {
        let root = bucket.join("mds").join(name);
        write_set(&root, compression);
        let uri = format!("s3://{BUCKET}/mds/{name}");
        assert_eq!(remote_layout(&uri, &cache).unwrap(), RemoteLayout::Mds);
        let local =
            MdsDataset::open_with_cache(&root, &MdsOptions::default(), &local_options).unwrap();
        let remote =
            MdsDataset::open_remote(&uri, Arc::clone(&cache), &MdsOptions::default()).unwrap();
        assert_eq!(remote.class_names(), ["0", "1", "2"]);
        assert_same_samples(&remote, &local);
        assert!(
            remote
                .describe(5)
                .starts_with(&format!("{uri}/shard.00001.mds")),
            "{}",
            remote.describe(5)
        );

        // Token windows of the `tokens` column, with each sample a document.
        let tokens_only = MdsOptions {
            tokens_only: true,
            ..MdsOptions::default()
        };
        let windows = MdsTokenWindows {
            seq_len: 6,
            document_boundaries: true,
            ..MdsTokenWindows::default()
        };
        let local = MdsDataset::open_with_cache(&root, &tokens_only, &local_options)
            .unwrap()
            .token_windows(&windows, &local_cache)
            .unwrap();
        let remote = MdsDataset::open_remote(&uri, Arc::clone(&cache), &tokens_only)
            .unwrap()
            .token_windows(&windows, cache.options())
            .unwrap();
        assert_eq!(remote.tokens(), 45);
        assert_eq!(remote.document_starts(), local.document_starts());
        assert_eq!(remote.document_starts().unwrap()[..4], [0, 1, 3, 6]);
        assert_same_samples(&remote, &local);
    }
}

/// Shards uploaded again under the same `index.json` (fixed-size samples convert to the same
/// sizes: only the shards change, their index does not): the token copy made from the old ones
/// is not reused, the windows hold the new ids.
#[test]
fn shards_uploaded_again_under_the_same_index_give_their_new_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let server = S3Server::start(&dir.path().join("server"));
    let root = server.bucket_dir(BUCKET).join("mds/again");
    write_set(&root, None);
    let cache = cache(&server, &dir.path().join("cache"));
    let windows = MdsTokenWindows {
        seq_len: 6,
        ..MdsTokenWindows::default()
    };
    let tokens_only = MdsOptions {
        tokens_only: true,
        ..MdsOptions::default()
    };
    let first_window = |cache: &Arc<ObjectCache>| {
        MdsDataset::open_remote("s3://data/mds/again", Arc::clone(cache), &tokens_only)
            .unwrap()
            .token_windows(&windows, cache.options())
            .unwrap()
            .read(0)
            .unwrap()
    };
    let before = first_window(&cache);
    let index = std::fs::read(root.join("index.json")).unwrap();
    let shifted = dir.path().join("shifted");
    write_shifted_set(&shifted, None, 1000);
    assert_eq!(std::fs::read(shifted.join("index.json")).unwrap(), index);
    for shard in ["shard.00000.mds", "shard.00001.mds", "shard.00002.mds"] {
        std::fs::copy(shifted.join(shard), root.join(shard)).unwrap();
    }
    let after = first_window(&cache);
    assert_ne!(after, before);
    assert_eq!(u32::from_le_bytes(after[..4].try_into().unwrap()), 1000);
}

#[test]
fn split_folders_missing_shards_damage_and_a_small_cache_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let server = S3Server::start(&dir.path().join("server"));
    let bucket = server.bucket_dir(BUCKET);
    let cache = cache(&server, &dir.path().join("cache"));
    // Streaming's `split=`: a folder per split, each its own MDS set.
    write_set(&bucket.join("splits/train"), None);
    write_set(&bucket.join("splits/val"), Some("zstd"));
    let (prefix, own) = remote_split_prefix("s3://data/splits", Some("val"), &cache)
        .unwrap()
        .unwrap();
    assert_eq!((prefix.as_str(), own), ("s3://data/splits/val", true));
    let error = remote_split_prefix("s3://data/splits", None, &cache)
        .unwrap_err()
        .to_string();
    assert!(error.contains("train") && error.contains("val"), "{error}");
    // An MDS set itself is no split layout.
    assert!(remote_split_prefix("s3://data/splits/val", None, &cache)
        .unwrap()
        .is_none());
    assert_eq!(
        MdsDataset::open_remote(&prefix, Arc::clone(&cache), &MdsOptions::default())
            .unwrap()
            .len(),
        9
    );

    // A shard the index names that is not there.
    std::fs::remove_file(bucket.join("splits/train/shard.00001.mds")).unwrap();
    let error = MdsDataset::open_remote(
        "s3://data/splits/train",
        Arc::clone(&cache),
        &MdsOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("s3://data/splits/train/shard.00001.mds"),
        "{error}"
    );

    // A damaged compressed shard names its object.
    std::fs::write(
        bucket.join("splits/val/shard.00002.mds.zstd"),
        b"\x28\xb5\x2f\xfdgarbage",
    )
    .unwrap();
    let fresh = Arc::new(ObjectCache::new(options(&server, &dir.path().join("fresh"))).unwrap());
    let error = MdsDataset::open_remote("s3://data/splits/val", fresh, &MdsOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("s3://data/splits/val/shard.00002.mds.zstd"),
        "{error}"
    );

    // A set larger than the cache's cap is refused before anything is fetched.
    write_set(&bucket.join("big"), None);
    let mut small = options(&server, &dir.path().join("small"));
    let shards: u64 = (0..3)
        .map(|k| {
            let shard = bucket.join(format!("big/shard.0000{k}.mds"));
            std::fs::metadata(shard).unwrap().len()
        })
        .sum();
    let cap = shards - 1;
    small.max_bytes = cap;
    let small = Arc::new(ObjectCache::new(small).unwrap());
    let gets = server.counts.object_gets();
    let error = MdsDataset::open_remote("s3://data/big", small, &MdsOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains(&format!("over the cache tier's cap of {cap} bytes")),
        "{error}"
    );
    // Only index.json was fetched.
    assert_eq!(server.counts.object_gets() - gets, 1);
}

/// Streaming's `merge_index` names shards by their part's folder (`0/shard.00000.mds`): under a
/// prefix they are listed in their folders and read as the same set.
#[test]
fn a_merged_index_reads_shards_in_subfolders_of_the_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let server = S3Server::start(&dir.path().join("server"));
    let bucket = server.bucket_dir(BUCKET);
    let cache = cache(&server, &dir.path().join("cache"));
    let whole = bucket.join("whole");
    write_set(&whole, None);
    let merged = bucket.join("merged");
    std::fs::create_dir_all(merged.join("0")).unwrap();
    for entry in std::fs::read_dir(&whole).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("shard.") {
            std::fs::copy(&path, merged.join("0").join(&name)).unwrap();
        }
    }
    let index = std::fs::read_to_string(whole.join("index.json")).unwrap();
    std::fs::write(
        merged.join("index.json"),
        index.replace("\"shard.", "\"0/shard."),
    )
    .unwrap();
    let options = MdsOptions::default();
    let whole = MdsDataset::open_remote(
        &format!("s3://{BUCKET}/whole"),
        Arc::clone(&cache),
        &options,
    )
    .unwrap();
    let merged =
        MdsDataset::open_remote(&format!("s3://{BUCKET}/merged"), cache, &options).unwrap();
    assert_same_samples(&merged, &whole);
}
