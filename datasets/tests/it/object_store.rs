//! `s3://` sources against a real S3-compatible server (s3s-fs) started on 127.0.0.1 by each
//! test: every sample read through the cache equals the local set, a warm cache fetches
//! nothing, a server restart mid-read is retried, the cap evicts least-recently-used entries,
//! concurrent readers share one download, and damaged or changed copies are fetched again.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use stoker_datasets::{
    generate_imagenet_like, write_tar_shards, CacheStats, ImageFolder, ObjectCache,
    ObjectCacheOptions, RemoteTarShards, S3Settings, SampleSource, SyntheticImageNetSpec,
    TarShards, TarShardsWriterOptions,
};

use crate::s3_server::{S3Server, ACCESS_KEY, SECRET_KEY};

const BUCKET: &str = "data";

/// A local tar-shard set of `count` images in several shards, under `dir/shards`.
fn local_shards(dir: &Path, count: u64) -> PathBuf {
    let images = dir.join("images");
    let spec = SyntheticImageNetSpec {
        count,
        seed: 5,
        classes: 4,
    };
    generate_imagenet_like(&images, &spec, &|_| {}).unwrap();
    let shards = dir.join("shards");
    let options = TarShardsWriterOptions {
        shard_bytes: 600_000,
    };
    write_tar_shards(
        &ImageFolder::open(&images).unwrap(),
        &shards,
        &options,
        &|_| {},
    )
    .unwrap();
    shards
}

/// Copies the shards and `classes.txt` of `local` to `prefix` in the server's bucket.
fn upload(server: &S3Server, local: &Path, prefix: &str) -> u64 {
    let target = server.bucket_dir(BUCKET).join(prefix);
    std::fs::create_dir_all(&target).unwrap();
    let mut bytes = 0;
    for entry in std::fs::read_dir(local).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".tar") || name == "classes.txt" {
            bytes += std::fs::copy(&path, target.join(&name)).unwrap();
        }
    }
    bytes
}

fn options(server: &S3Server, cache_dir: &Path) -> ObjectCacheOptions {
    let mut options = ObjectCacheOptions::new(cache_dir);
    // Small parts so that every shard takes several ranged GETs.
    options.part_size = 128 * 1024;
    options.concurrency = 4;
    options.s3 = S3Settings {
        endpoint: Some(server.endpoint()),
        access_key_id: Some(ACCESS_KEY.into()),
        secret_access_key: Some(SECRET_KEY.into()),
        region: Some("us-east-1".into()),
        allow_http: false,
    };
    options
}

fn cache(server: &S3Server, cache_dir: &Path) -> Arc<ObjectCache> {
    Arc::new(ObjectCache::new(options(server, cache_dir)).unwrap())
}

/// Every sample of `remote` has the bytes and label of the same sample of `local`.
fn assert_same_samples(remote: &dyn SampleSource, local: &dyn SampleSource) {
    assert_eq!(remote.len(), local.len());
    assert_eq!(remote.class_names(), local.class_names());
    assert_eq!(remote.shard_sizes(), local.shard_sizes());
    for index in 0..local.len() {
        assert_eq!(remote.label(index), local.label(index), "label of {index}");
        assert_eq!(
            remote.read(index).unwrap(),
            local.read(index).unwrap(),
            "bytes of {index}"
        );
    }
}

fn object_files(local: &Path) -> usize {
    std::fs::read_dir(local)
        .unwrap()
        .filter(|entry| {
            let name = entry.as_ref().unwrap().file_name();
            let name = name.to_string_lossy();
            name.ends_with(".tar") || name == "classes.txt"
        })
        .count()
}

#[test]
fn cold_then_warm_cache_reads_every_sample_and_the_warm_run_fetches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let local_dir = local_shards(dir.path(), 40);
    let local = TarShards::open_with_cache_dir(&local_dir, None).unwrap();
    assert!(local.shard_sizes().unwrap().len() >= 3, "several shards");
    let server = S3Server::start(&dir.path().join("server"));
    let uploaded = upload(&server, &local_dir, "train/v1");
    let objects = object_files(&local_dir) as u64;
    let cache_dir = dir.path().join("cache");

    let cold = RemoteTarShards::open("s3://data/train/v1", cache(&server, &cache_dir)).unwrap();
    assert_same_samples(&cold, &local);
    let stats = cold.cache_stats().unwrap();
    assert_eq!(stats.misses, objects);
    assert_eq!(stats.hits, 0);
    assert_eq!(stats.bytes_fetched, uploaded);
    assert!(stats.requests > objects, "parts of 128 KiB: {stats:?}");
    assert_eq!(server.counts.object_gets(), stats.requests);
    assert!(
        cold.describe(0).starts_with("s3://data/train/v1/"),
        "{}",
        cold.describe(0)
    );
    drop(cold);

    // A new cache object on the same folder: what a restarted process sees.
    let gets_before = server.counts.object_gets();
    let warm = RemoteTarShards::open("s3://data/train/v1/", cache(&server, &cache_dir)).unwrap();
    assert_same_samples(&warm, &local);
    let stats = warm.cache_stats().unwrap();
    assert_eq!(
        stats,
        CacheStats {
            hits: objects,
            bytes_from_cache: uploaded,
            ..CacheStats::default()
        }
    );
    assert_eq!(server.counts.object_gets(), gets_before, "no object read");
    // The tar indexes were cached beside the shards too.
    assert_eq!(
        warm.local().index_stats().loaded_from_cache,
        local.shard_sizes().unwrap().len()
    );
}

#[test]
fn a_server_restart_mid_read_is_retried_and_no_sample_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let local_dir = local_shards(dir.path(), 24);
    let local = TarShards::open_with_cache_dir(&local_dir, None).unwrap();
    let mut server = S3Server::start(&dir.path().join("server"));
    upload(&server, &local_dir, "train");
    server
        .counts
        .stop_at_object_get
        .store(5, std::sync::atomic::Ordering::SeqCst);
    let mut options = options(&server, &dir.path().join("cache"));
    // The client gives up after one retry, so that the outage reaches the part-retry loop.
    options.request_retries = 1;
    let cache = Arc::new(ObjectCache::new(options).unwrap());

    let reader = std::thread::spawn(move || RemoteTarShards::open("s3://data/train", cache));
    server.wait_until_stopped_by_itself(Duration::from_secs(30));
    // Down long enough for connections to be refused a few times.
    std::thread::sleep(Duration::from_millis(700));
    server.restart();
    let remote = reader.join().unwrap().unwrap();
    assert_same_samples(&remote, &local);
    let stats = remote.cache_stats().unwrap();
    assert_eq!(stats.misses, object_files(&local_dir) as u64);
    assert!(stats.retries >= 1, "{stats:?}");
    assert!(server.counts.object_gets() > 5);
}

/// Objects `a`, `b`, `c` of 100 kB each, as `s3://data/objects/<name>`.
fn three_objects(server: &S3Server) -> Vec<Vec<u8>> {
    let folder = server.bucket_dir(BUCKET).join("objects");
    std::fs::create_dir_all(&folder).unwrap();
    ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(position, name)| {
            let bytes: Vec<u8> = (0..100_000u32)
                .map(|i| (i.wrapping_mul(31) as u8) ^ position as u8)
                .collect();
            std::fs::write(folder.join(name), &bytes).unwrap();
            bytes
        })
        .collect()
}

fn fetch_one(cache: &ObjectCache, name: &str) -> stoker_datasets::CachedObject {
    let (_, mut objects) = cache
        .fetch(&format!("s3://data/objects/{name}"), &|_| true)
        .unwrap();
    assert_eq!(objects.len(), 1);
    objects.pop().unwrap()
}

#[test]
fn the_cap_evicts_the_least_recently_used_entry_and_never_one_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let server = S3Server::start(&dir.path().join("server"));
    three_objects(&server);
    let mut capped = options(&server, &dir.path().join("cache"));
    capped.max_bytes = 250_000;
    let cache = ObjectCache::new(capped).unwrap();

    let a = fetch_one(&cache, "a").path().to_path_buf();
    std::thread::sleep(Duration::from_millis(20));
    let b = fetch_one(&cache, "b").path().to_path_buf();
    std::thread::sleep(Duration::from_millis(20));
    drop(fetch_one(&cache, "a")); // a is now used more recently than b
    std::thread::sleep(Duration::from_millis(20));
    let c = fetch_one(&cache, "c");
    assert!(a.exists() && c.path().exists());
    assert!(!b.exists(), "b was the least recently used");
    let stats = cache.stats();
    assert_eq!((stats.evictions, stats.bytes_evicted), (1, 100_000));
    assert_eq!((stats.hits, stats.misses), (1, 3));

    // With the cap at one object and c held, fetching b must evict a, never c.
    let mut one_object = options(&server, &dir.path().join("cache"));
    one_object.max_bytes = 100_000;
    let small = ObjectCache::new(one_object).unwrap();
    let b_again = fetch_one(&small, "b");
    assert!(c.path().exists(), "c is in use");
    assert!(!a.exists());
    // b and c are both in use: over the cap, and nothing more can go.
    assert!(b_again.path().exists());
    drop(c);
    small.enforce_cap().unwrap();
    assert!(b_again.path().exists(), "the entry still held stays");
}

#[test]
fn concurrent_readers_of_an_uncached_object_share_one_complete_download() {
    let dir = tempfile::tempdir().unwrap();
    let server = S3Server::start(&dir.path().join("server"));
    let folder = server.bucket_dir(BUCKET).join("big");
    std::fs::create_dir_all(&folder).unwrap();
    let original: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(folder.join("blob.tar"), &original).unwrap();
    let cache_dir = dir.path().join("cache");

    let barrier = Arc::new(Barrier::new(4));
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let barrier = Arc::clone(&barrier);
            // One cache object per reader: separate file handles, as separate processes.
            let cache = ObjectCache::new(options(&server, &cache_dir)).unwrap();
            std::thread::spawn(move || {
                barrier.wait();
                let (_, objects) = cache.fetch("s3://data/big/blob.tar", &|_| true).unwrap();
                let bytes = std::fs::read(objects[0].path()).unwrap();
                (bytes, cache.stats())
            })
        })
        .collect();
    let mut misses = 0;
    let mut fetched = 0;
    for reader in readers {
        let (bytes, stats) = reader.join().unwrap();
        assert!(
            bytes == original,
            "a reader saw an incomplete or corrupt copy"
        );
        misses += stats.misses;
        fetched += stats.bytes_fetched;
    }
    assert_eq!(misses, 1, "one download for all readers");
    assert_eq!(fetched, original.len() as u64);
}

#[test]
fn a_truncated_or_outdated_copy_is_fetched_again() {
    let dir = tempfile::tempdir().unwrap();
    let server = S3Server::start(&dir.path().join("server"));
    let objects = three_objects(&server);
    let cache_dir = dir.path().join("cache");

    let path = fetch_one(&cache(&server, &cache_dir), "a")
        .path()
        .to_path_buf();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(40_000).unwrap();
    drop(file);

    let cache = cache(&server, &cache_dir);
    let object = fetch_one(&cache, "a");
    assert_eq!(std::fs::read(object.path()).unwrap(), objects[0]);
    assert_eq!((cache.stats().misses, cache.stats().hits), (1, 0));
    drop(object);

    // Same size, other content: the ETag tells.
    let changed: Vec<u8> = objects[0].iter().map(|byte| byte ^ 0xff).collect();
    std::fs::write(server.bucket_dir(BUCKET).join("objects/a"), &changed).unwrap();
    let cache = self::cache(&server, &cache_dir);
    let object = fetch_one(&cache, "a");
    assert_eq!(std::fs::read(object.path()).unwrap(), changed);
    assert_eq!(cache.stats().misses, 1);
}

#[test]
fn missing_prefixes_and_bad_credentials_give_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let server = S3Server::start(&dir.path().join("server"));
    server.bucket_dir(BUCKET);
    let cache_dir = dir.path().join("cache");
    let error = RemoteTarShards::open("s3://data/nothing-here", cache(&server, &cache_dir))
        .err()
        .unwrap();
    assert!(error.to_string().contains("no *.tar shard"), "{error}");

    let mut options = options(&server, &cache_dir);
    options.s3.secret_access_key = Some("wrong".into());
    options.max_attempts = 1;
    let error = RemoteTarShards::open("s3://data/x", Arc::new(ObjectCache::new(options).unwrap()))
        .err()
        .unwrap();
    assert!(error.to_string().contains("s3://data/x"), "{error}");
}

#[test]
fn shards_evicted_while_not_open_are_fetched_again_and_open_ones_stay() {
    let dir = tempfile::tempdir().unwrap();
    let local_dir = local_shards(dir.path(), 24);
    let local = TarShards::open_with_cache_dir(&local_dir, None).unwrap();
    let shards = local.shard_sizes().unwrap().len() as u64;
    assert!(shards >= 2, "several shards");
    let server = S3Server::start(&dir.path().join("server"));
    upload(&server, &local_dir, "train/v1");
    let cache_dir = dir.path().join("cache");
    let remote = RemoteTarShards::open("s3://data/train/v1", cache(&server, &cache_dir)).unwrap();
    let fetched = remote.cache_stats().unwrap().misses;

    // Another process with a cap of zero: once indexed, no shard is locked until it is read.
    let mut zero = options(&server, &cache_dir);
    zero.max_bytes = 0;
    let evictor = ObjectCache::new(zero).unwrap();
    evictor.enforce_cap().unwrap();
    assert!(
        remote.local().shard_paths().all(|path| !path.exists()),
        "every shard was evictable"
    );
    assert_same_samples(&remote, &local);
    assert_eq!(
        remote.cache_stats().unwrap().misses,
        fetched + shards,
        "each shard fetched again once"
    );
    // Now every shard is open in the pool, hence locked: none can go.
    evictor.enforce_cap().unwrap();
    assert!(remote.local().shard_paths().all(Path::exists));
}
