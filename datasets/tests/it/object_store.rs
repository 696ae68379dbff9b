//! `s3://` sources against a real S3-compatible server (s3s-fs) started on 127.0.0.1 by each
//! test: every sample read through the cache equals the local set, a warm cache fetches
//! nothing, a server restart mid-read is retried, the cap evicts least-recently-used entries,
//! concurrent readers share one download, and damaged or changed copies are fetched again.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use stoker_datasets::{
    generate_imagenet_like, write_parquet, write_tar_shards, ImageFolder, ObjectCache,
    ObjectCacheOptions, ParquetDataset, ParquetOptions, ParquetWriterOptions, S3Settings,
    SampleSource, SyntheticImageNetSpec, TarShards, TarShardsWriterOptions,
};

use crate::s3_server::{S3Server, ACCESS_KEY, SECRET_KEY};

pub(crate) const BUCKET: &str = "data";

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

pub(crate) fn options(server: &S3Server, cache_dir: &Path) -> ObjectCacheOptions {
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

pub(crate) fn cache(server: &S3Server, cache_dir: &Path) -> Arc<ObjectCache> {
    Arc::new(ObjectCache::new(options(server, cache_dir)).unwrap())
}

/// Every sample of `remote` has the bytes and label of the same sample of `local`.
pub(crate) fn assert_same_samples(remote: &dyn SampleSource, local: &dyn SampleSource) {
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

    let shards = local.shard_sizes().unwrap().len() as u64;
    let extra = objects - shards;

    // No index object: the shards are read once to index them, then each sample is a range.
    let cold = TarShards::open_remote("s3://data/train/v1", cache(&server, &cache_dir)).unwrap();
    assert_same_samples(&cold, &local);
    let stats = cold.cache_stats().unwrap();
    assert_eq!(
        stats.misses,
        local.len() + extra,
        "each sample's range and classes.txt"
    );
    assert_eq!(stats.hits, 0);
    assert!(stats.bytes_fetched >= uploaded, "{stats:?}");
    assert_eq!(server.counts.object_gets(), stats.requests);
    assert!(
        cold.describe(0).starts_with("s3://data/train/v1/"),
        "{}",
        cold.describe(0)
    );
    drop(cold);

    // A new cache object on the same folder: what a restarted process sees. The index scanned
    // by the cold open was kept in the cache folder.
    let gets_before = server.counts.object_gets();
    let warm = TarShards::open_remote("s3://data/train/v1/", cache(&server, &cache_dir)).unwrap();
    assert_same_samples(&warm, &local);
    let stats = warm.cache_stats().unwrap();
    assert_eq!((stats.hits, stats.misses), (local.len() + extra, 0));
    assert_eq!((stats.bytes_fetched, stats.requests), (0, 0));
    assert_eq!(server.counts.object_gets(), gets_before, "no object read");
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

    let reader = std::thread::spawn(move || TarShards::open_remote("s3://data/train", cache));
    server.wait_until_stopped_by_itself(Duration::from_secs(30));
    // Down long enough for connections to be refused a few times.
    std::thread::sleep(Duration::from_millis(700));
    server.restart();
    let remote = reader.join().unwrap().unwrap();
    assert_same_samples(&remote, &local);
    let stats = remote.cache_stats().unwrap();
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
    let error = TarShards::open_remote("s3://data/nothing-here", cache(&server, &cache_dir))
        .err()
        .unwrap();
    assert!(error.to_string().contains("no *.tar shard"), "{error}");

    let mut options = options(&server, &cache_dir);
    options.s3.secret_access_key = Some("wrong".into());
    options.max_attempts = 1;
    let error = TarShards::open_remote("s3://data/x", Arc::new(ObjectCache::new(options).unwrap()))
        .err()
        .unwrap();
    assert!(error.to_string().contains("s3://data/x"), "{error}");
}

#[test]
fn ranges_evicted_are_fetched_again() {
    let dir = tempfile::tempdir().unwrap();
    let local_dir = local_shards(dir.path(), 24);
    let local = TarShards::open_with_cache_dir(&local_dir, None).unwrap();
    let server = S3Server::start(&dir.path().join("server"));
    upload(&server, &local_dir, "train/v1");
    let cache_dir = dir.path().join("cache");
    let remote = TarShards::open_remote("s3://data/train/v1", cache(&server, &cache_dir)).unwrap();
    assert_same_samples(&remote, &local);
    let fetched = remote.cache_stats().unwrap().misses;

    // A cached range whose bytes were torn (same size, other bytes: a crash before they
    // reached the disk) fails its checksum and is fetched again.
    let ranges = cache_dir.join("s3").join(BUCKET).join("train").join("v1");
    let torn = std::fs::read_dir(&ranges)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.to_string_lossy().ends_with(".stoker-ranges"))
        .and_then(|folder| {
            std::fs::read_dir(folder)
                .unwrap()
                .map(|entry| entry.unwrap().path())
                .find(|path| path.extension().is_none())
        })
        .unwrap();
    let size = std::fs::metadata(&torn).unwrap().len() as usize;
    std::fs::write(&torn, vec![0u8; size]).unwrap();
    assert_same_samples(&remote, &local);
    assert_eq!(
        remote.cache_stats().unwrap().misses,
        fetched + 1,
        "the torn range again"
    );
    let fetched = fetched + 1;

    // Another process with a cap of zero: no range is locked between reads, so all can go.
    let mut zero = options(&server, &cache_dir);
    zero.max_bytes = 0;
    let evictor = ObjectCache::new(zero).unwrap();
    evictor.enforce_cap().unwrap();
    assert!(evictor.stats().evictions >= local.len());
    // Nothing of the ranges is left: their lock files went with them, and each shard's
    // emptied range folder (every range ever read left a lock file, for good).
    let left: Vec<_> = std::fs::read_dir(&ranges)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.to_string_lossy().ends_with(".stoker-ranges"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert_same_samples(&remote, &local);
    assert_eq!(
        remote.cache_stats().unwrap().misses,
        fetched + local.len(),
        "each sample fetched again once"
    );
}

/// A cache that cannot hold the ranges it is asked for (its disk full, a quota, a folder it
/// cannot write: here each object's range folder is a file) costs the read nothing: the ranges
/// come from the store past the cache, where before the read failed and the run with it.
#[test]
fn ranges_the_cache_cannot_hold_are_read_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let local_dir = local_shards(dir.path(), 12);
    let local = TarShards::open_with_cache_dir(&local_dir, None).unwrap();
    let server = S3Server::start(&dir.path().join("server"));
    upload(&server, &local_dir, "train/v1");
    let cache_dir = dir.path().join("cache");
    let remote = TarShards::open_remote("s3://data/train/v1", cache(&server, &cache_dir)).unwrap();
    let prefix = cache_dir.join("s3").join(BUCKET).join("train").join("v1");
    std::fs::create_dir_all(&prefix).unwrap();
    for shard in remote.shard_paths() {
        let name = shard.file_name().unwrap().to_string_lossy().into_owned();
        let folder = prefix.join(format!("{name}.stoker-ranges"));
        if folder.is_dir() {
            std::fs::remove_dir_all(&folder).unwrap();
        }
        std::fs::write(&folder, b"not a folder").unwrap();
    }
    assert_same_samples(&remote, &local);
}

/// `shards` tar files of `per_shard` samples each: a `.jpg` member of `bytes` seeded bytes (not
/// an image: these tests read bytes, they do not decode) and a `.cls` label.
pub(crate) fn byte_shards(dir: &Path, shards: usize, per_shard: usize, bytes: usize) -> PathBuf {
    let out = dir.join("byte-shards");
    std::fs::create_dir_all(&out).unwrap();
    for shard in 0..shards {
        let file = std::fs::File::create(out.join(format!("shard-{shard:05}.tar"))).unwrap();
        let mut builder = tar::Builder::new(file);
        for sample in 0..per_shard {
            let key = format!("s{shard:05}-{sample}");
            let seed = (shard * per_shard + sample) as u64;
            let data: Vec<u8> = (0..bytes as u64)
                .map(|i| (i.wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40_503)) as u8)
                .collect();
            let label = format!("{}", seed % 7);
            for (name, content) in [
                (format!("{key}.jpg"), data.as_slice()),
                (format!("{key}.cls"), label.as_bytes()),
            ] {
                let mut header = tar::Header::new_gnu();
                header.set_size(content.len() as u64);
                header.set_mode(0o644);
                header.set_cksum();
                builder.append_data(&mut header, name, content).unwrap();
            }
        }
        builder.finish().unwrap();
    }
    out
}

#[test]
fn a_thousand_shards_open_from_their_index_and_read_through_a_cache_of_a_tenth() {
    let dir = tempfile::tempdir().unwrap();
    let local_dir = byte_shards(dir.path(), 1000, 1, 40_000);
    let local = TarShards::open_with_cache_dir(&local_dir, None).unwrap();
    assert_eq!(local.len(), 1000);
    let server = S3Server::start(&dir.path().join("server"));
    let uploaded = upload(&server, &local_dir, "big");

    // `stoker index`'s step: every shard read once, the index object written beside them.
    let writer = cache(&server, &dir.path().join("writer-cache"));
    let written = stoker_datasets::write_tar_index("s3://data/big", &writer).unwrap();
    assert_eq!((written.shards, written.samples), (1000, 1000));
    assert_eq!(written.uri, "s3://data/big/stoker-tar-index.bin");
    assert!(server
        .bucket_dir(BUCKET)
        .join("big")
        .join(stoker_datasets::TAR_INDEX_OBJECT)
        .exists());

    // Another machine, its cache capped at a tenth of the set.
    let mut capped = options(&server, &dir.path().join("cache"));
    capped.max_bytes = uploaded / 10;
    let cache = Arc::new(ObjectCache::new(capped).unwrap());
    let remote = TarShards::open_remote("s3://data/big", Arc::clone(&cache)).unwrap();
    let opened = cache.stats();
    assert!(
        opened.bytes_fetched * 100 < uploaded,
        "the open read {} of {uploaded} bytes",
        opened.bytes_fetched
    );
    assert_same_samples(&remote, &local);
    let stats = cache.stats();
    assert!(stats.evictions > 0, "the cap was enforced: {stats:?}");
    assert!(stats.bytes_fetched < uploaded + uploaded / 10, "{stats:?}");
}

/// An index object that cannot be decoded (damaged, or over the size an index may take) is no
/// reason the set cannot open: its shards are scanned, as without one.
#[test]
fn a_set_whose_index_object_is_unreadable_opens_by_scanning_its_shards() {
    let dir = tempfile::tempdir().unwrap();
    let local_dir = byte_shards(dir.path(), 3, 2, 1_000);
    let local = TarShards::open_with_cache_dir(&local_dir, None).unwrap();
    let server = S3Server::start(&dir.path().join("server"));
    upload(&server, &local_dir, "damaged");
    let index = server
        .bucket_dir(BUCKET)
        .join("damaged")
        .join(stoker_datasets::TAR_INDEX_OBJECT);
    std::fs::write(&index, b"not an index").unwrap();
    let cache = Arc::new(ObjectCache::new(options(&server, &dir.path().join("cache"))).unwrap());
    let remote = TarShards::open_remote("s3://data/damaged", cache).unwrap();
    assert_eq!(remote.index_stats().built, 3);
    assert_same_samples(&remote, &local);
}

#[test]
fn a_shard_larger_than_the_cache_is_scanned_as_a_stream_of_windows() {
    // One 9.6 MB shard of 32 members of 300 KB, no index object; a cache capped at 1 MiB,
    // parts (the scan's window) of 128 KiB.
    let dir = tempfile::tempdir().unwrap();
    let local_dir = byte_shards(dir.path(), 1, 32, 300_000);
    let local = TarShards::open_with_cache_dir(&local_dir, None).unwrap();
    let server = S3Server::start(&dir.path().join("server"));
    let uploaded = upload(&server, &local_dir, "one");
    let mut capped = options(&server, &dir.path().join("cache"));
    capped.max_bytes = 1 << 20;
    let part = capped.part_size;
    assert!(uploaded > 8 * capped.max_bytes);
    let cache = Arc::new(ObjectCache::new(capped).unwrap());
    let remote = TarShards::open_remote("s3://data/one", Arc::clone(&cache)).unwrap();
    let opened = cache.stats();
    // A window per member at least (each member is longer than a window, so each header
    // starts a new one), no GET longer than a window, and the bytes of each member past its
    // first window never fetched.
    assert!(opened.requests >= 32, "{opened:?}");
    assert!(opened.bytes_fetched <= opened.requests * part, "{opened:?}");
    assert!(
        opened.bytes_fetched < uploaded / 2,
        "the scan skipped what it did not need: {opened:?}, shard {uploaded}"
    );
    assert_eq!(remote.len(), 32);
    assert_same_samples(&remote, &local);

    // The store gone for good in the middle of a scan: the open fails with the store's error;
    // it never keeps the members read so far as the shard's index.
    let mut server = server;
    let gets = server.counts.object_gets();
    server
        .counts
        .stop_at_object_get
        .store(gets + 10, std::sync::atomic::Ordering::SeqCst);
    let mut options = options(&server, &dir.path().join("second-cache"));
    options.request_retries = 0;
    options.max_attempts = 2;
    let cache = Arc::new(ObjectCache::new(options).unwrap());
    let error = match TarShards::open_remote("s3://data/one", cache) {
        Ok(remote) => panic!(
            "opened {} samples from a store that went away",
            remote.len()
        ),
        Err(error) => error.to_string(),
    };
    assert!(error.contains("s3://data/one/"), "{error}");
    server.wait_until_stopped_by_itself(Duration::from_secs(10));
}

#[test]
fn a_token_file_opens_from_its_listing_and_reads_ahead_when_told() {
    let dir = tempfile::tempdir().unwrap();
    let local_path = dir.path().join("train.bin");
    let tokens: Vec<u8> = (0..50_001u32)
        .flat_map(|i| ((i % 65_521) as u16).to_le_bytes())
        .collect();
    std::fs::write(&local_path, &tokens).unwrap();
    let local =
        stoker_datasets::TokenFile::open(&local_path, stoker_datasets::TokenDtype::Uint16, 100)
            .unwrap();
    let server = S3Server::start(&dir.path().join("server"));
    let target = server.bucket_dir(BUCKET).join("tokens");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::copy(&local_path, target.join("train.bin")).unwrap();

    let cache = cache(&server, &dir.path().join("cache"));
    let remote = stoker_datasets::TokenFile::open_remote(
        "s3://data/tokens/train.bin",
        Arc::clone(&cache),
        None,
        100,
    )
    .unwrap();
    assert_eq!(
        cache.stats().bytes_fetched,
        0,
        "the open read the listing only"
    );
    assert_eq!(remote.len(), local.len());
    assert_eq!(remote.token_windows(), local.token_windows());

    // Told that windows 0..8 come next, the read-ahead thread fetches them; reading them then
    // sends no request.
    let ahead: Vec<u64> = (0..8).collect();
    remote.prefetch(&ahead);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while cache.stats().read_ahead < 8 {
        assert!(std::time::Instant::now() < deadline, "{:?}", cache.stats());
        std::thread::sleep(Duration::from_millis(20));
    }
    let requests = cache.stats().requests;
    for index in ahead {
        assert_eq!(remote.read(index).unwrap(), local.read(index).unwrap());
    }
    assert_eq!(cache.stats().requests, requests, "read from the cache");
    assert_eq!(cache.stats().hits, 8);
    assert_same_samples(&remote, &local);
    assert!(
        remote
            .describe(3)
            .starts_with("s3://data/tokens/train.bin:tokens[300..401)"),
        "{}",
        remote.describe(3)
    );
}

#[test]
fn a_prefix_of_parquet_is_known_by_its_objects_and_read_by_split() {
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("images");
    let spec = SyntheticImageNetSpec {
        count: 24,
        seed: 9,
        classes: 3,
    };
    generate_imagenet_like(&images, &spec, &|_| {}).unwrap();
    let out = dir.path().join("parquet");
    let writer = ParquetWriterOptions {
        file_bytes: 200_000,
        rows_per_group: 4,
    };
    write_parquet(&ImageFolder::open(&images).unwrap(), &out, &writer, &|_| {}).unwrap();
    let mut parts: Vec<PathBuf> = std::fs::read_dir(&out)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "parquet"))
        .collect();
    parts.sort();
    assert!(parts.len() >= 2, "{parts:?}");
    let server = S3Server::start(&dir.path().join("server"));
    let hub = server.bucket_dir(BUCKET).join("hub");
    std::fs::create_dir_all(&hub).unwrap();
    let train = &parts[..parts.len() - 1];
    for (k, part) in train.iter().enumerate() {
        let name = format!("train-{k:05}-of-{:05}.parquet", train.len());
        std::fs::copy(part, hub.join(name)).unwrap();
    }
    std::fs::copy(
        &parts[parts.len() - 1],
        hub.join("test-00000-of-00001.parquet"),
    )
    .unwrap();
    let cache = cache(&server, &dir.path().join("cache"));
    assert_eq!(
        stoker_datasets::remote_kind("s3://data/hub", &cache).unwrap(),
        Some(stoker_datasets::FileKind::Parquet)
    );
    let options = ParquetOptions::default();
    let whole =
        ParquetDataset::open_remote_split("s3://data/hub", Arc::clone(&cache), &options, None)
            .unwrap_err()
            .to_string();
    assert!(whole.contains("the splits test, train"), "{whole}");
    let local_train = ParquetDataset::open_listed(&out, train.to_vec(), &options).unwrap();
    let remote_train = ParquetDataset::open_remote_split(
        "s3://data/hub",
        Arc::clone(&cache),
        &options,
        Some("train"),
    )
    .unwrap();
    assert_same_samples(&remote_train, &local_train);
    // A pattern names the same objects, as a local pattern names the same files.
    let named =
        stoker_datasets::resolve_remote(&["s3://data/hub/train-*.parquet"], None, &cache).unwrap();
    let named_train =
        ParquetDataset::open_remote_files(named, Arc::clone(&cache), &options).unwrap();
    assert_same_samples(&named_train, &local_train);
    let missing =
        ParquetDataset::open_remote_split("s3://data/hub", cache, &options, Some("validation"))
            .unwrap_err()
            .to_string();
    assert!(missing.contains("its splits are test, train"), "{missing}");
}

#[test]
fn a_parquet_set_opens_from_its_footers_and_labels_and_reads_like_the_local_one() {
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("images");
    let spec = SyntheticImageNetSpec {
        count: 40,
        seed: 5,
        classes: 4,
    };
    generate_imagenet_like(&images, &spec, &|_| {}).unwrap();
    let out = dir.path().join("parquet");
    let writer = ParquetWriterOptions {
        file_bytes: 2_000_000,
        rows_per_group: 4,
    };
    write_parquet(&ImageFolder::open(&images).unwrap(), &out, &writer, &|_| {}).unwrap();
    let local = ParquetDataset::open(&out, &ParquetOptions::default()).unwrap();
    let server = S3Server::start(&dir.path().join("server"));
    let target = server.bucket_dir(BUCKET).join("pq");
    std::fs::create_dir_all(&target).unwrap();
    let mut uploaded = 0;
    for entry in std::fs::read_dir(&out).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "parquet") {
            uploaded += std::fs::copy(&path, target.join(path.file_name().unwrap())).unwrap();
        }
    }
    let cache = cache(&server, &dir.path().join("cache"));
    let remote = ParquetDataset::open_remote(
        "s3://data/pq",
        Arc::clone(&cache),
        &ParquetOptions::default(),
    )
    .unwrap();
    let opened = cache.stats().bytes_fetched;
    assert!(
        opened * 100 < uploaded,
        "the open read {opened} of {uploaded} bytes (footers and label columns)"
    );
    assert_same_samples(&remote, &local);
    assert!(remote.cache_stats().unwrap().bytes_fetched < uploaded + uploaded / 10);

    // Read-ahead: told that rows 0..8 (two row groups) come next, a fresh open's thread brings
    // their chunks into its cache; reading them then sends no request, and every range it
    // fetched is used.
    let ahead_cache =
        Arc::new(ObjectCache::new(options(&server, &dir.path().join("ahead-cache"))).unwrap());
    let remote = ParquetDataset::open_remote(
        "s3://data/pq",
        Arc::clone(&ahead_cache),
        &ParquetOptions::default(),
    )
    .unwrap();
    let ahead: Vec<u64> = (0..8).collect();
    remote.prefetch(&ahead);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut settled = (0, std::time::Instant::now());
    loop {
        let fetched = ahead_cache.stats().read_ahead;
        if fetched != settled.0 {
            settled = (fetched, std::time::Instant::now());
        } else if fetched >= 2 && settled.1.elapsed() > Duration::from_millis(500) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            ahead_cache.stats()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = ahead_cache.stats();
    for index in ahead {
        assert_eq!(remote.read(index).unwrap(), local.read(index).unwrap());
    }
    let after = ahead_cache.stats();
    assert_eq!(
        after.requests, before.requests,
        "read from the cache: {after:?}"
    );
    assert_eq!(after.misses, before.misses, "{after:?}");
    assert_eq!(
        after.hits, after.read_ahead,
        "every range read ahead was read: {after:?}"
    );
    // Groups already decoded are not fetched again.
    remote.prefetch(&[0, 1, 2, 3]);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(ahead_cache.stats().requests, after.requests);

    // With the cache capped at a tenth of the set, every sample still reads.
    let mut capped = options(&server, &dir.path().join("capped-cache"));
    capped.max_bytes = uploaded / 10;
    let capped = Arc::new(ObjectCache::new(capped).unwrap());
    let remote = ParquetDataset::open_remote(
        "s3://data/pq",
        Arc::clone(&capped),
        &ParquetOptions::default(),
    )
    .unwrap();
    assert_same_samples(&remote, &local);
    assert!(capped.stats().evictions > 0, "{:?}", capped.stats());
}

#[test]
fn a_megatron_corpus_in_a_bucket_reads_with_the_dtype_of_its_index() {
    use stoker_datasets::{open_megatron, open_remote_megatron, write_megatron_corpus, TokenDtype};
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("local");
    std::fs::create_dir_all(&local).unwrap();
    // int32 ids above uint16's range, in a file whose name alone would say uint16.
    let documents: Vec<Vec<u32>> = (0..30u32)
        .map(|d| (0..3 + d % 5).map(|t| 70_000 + d * 10 + t).collect())
        .collect();
    let prefix = local.join("corpus_text_document");
    let (bin, idx) = write_megatron_corpus(&prefix, &documents, TokenDtype::Uint32).unwrap();
    let server = S3Server::start(&dir.path().join("server"));
    let target = server.bucket_dir(BUCKET).join("mg");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::copy(&bin, target.join("corpus_text_document.bin")).unwrap();
    std::fs::copy(&idx, target.join("corpus_text_document.idx")).unwrap();
    let cache = cache(&server, &dir.path().join("cache"));
    let (remote, index) = open_remote_megatron(
        "s3://data/mg/corpus_text_document.bin",
        Arc::clone(&cache),
        None,
        8,
        true,
    )
    .unwrap()
    .unwrap();
    assert_eq!(remote.dtype(), TokenDtype::Uint32);
    assert_eq!(index.documents(), 30);
    let (local_tokens, _) = open_megatron(&bin, None, 8, true).unwrap();
    assert_same_samples(&remote, &local_tokens);
    // The documents' starts, read from the object by ranges, are the local file's.
    assert_eq!(remote.document_starts(), local_tokens.document_starts());
    assert_eq!(remote.document_starts().map(<[u64]>::len), Some(31));

    // Without an index beside it the object is a flat token file.
    std::fs::copy(&bin, target.join("flat.bin")).unwrap();
    let flat =
        open_remote_megatron("s3://data/mg/flat.bin", Arc::clone(&cache), None, 8, false).unwrap();
    assert!(flat.is_none());
    // A .bin shorter than its index says: an error naming it.
    let data = std::fs::read(&bin).unwrap();
    std::fs::write(target.join("short.bin"), &data[..data.len() - 4]).unwrap();
    std::fs::copy(&idx, target.join("short.idx")).unwrap();
    let error = open_remote_megatron("s3://data/mg/short.bin", cache, None, 8, false)
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("s3://data/mg/short.bin") && error.contains("shorter"),
        "{error}"
    );
}

/// `stoker convert --out s3://`'s upload: shards larger than a part go up as multipart uploads
/// (several requests each), the set reads as the local one, and the marker that stood beside
/// the shards while they went up is gone.
#[test]
fn a_set_uploaded_in_parts_reads_as_the_local_one_and_its_marker_is_gone() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    // Two shards of one 17 MiB sample: each over the 16 MiB part size.
    let local_dir = byte_shards(dir.path(), 2, 1, 17 << 20);
    let local = TarShards::open_with_cache_dir(&local_dir, None).unwrap();
    let server = S3Server::start(&dir.path().join("server"));
    std::fs::create_dir_all(server.bucket_dir(BUCKET)).unwrap();
    let writer = cache(&server, &dir.path().join("writer-cache"));
    let before = server.counts.other.load(Ordering::SeqCst);
    let uploaded = stoker_datasets::upload_tar_set(&local_dir, "s3://data/parts", &writer).unwrap();
    assert_eq!(
        (uploaded.objects, uploaded.index.samples, uploaded.replaced),
        (2, 2, 0)
    );
    // Per shard: a start, two parts and a completion; the marker's put and delete; the index.
    let requests = server.counts.other.load(Ordering::SeqCst) - before;
    assert!(
        requests >= 11,
        "{requests} requests: the shards went up whole"
    );
    let folder = server.bucket_dir(BUCKET).join("parts");
    assert!(!folder.join(stoker_datasets::UNFINISHED_UPLOAD).exists());
    let remote =
        TarShards::open_remote("s3://data/parts", cache(&server, &dir.path().join("cache")))
            .unwrap();
    assert_same_samples(&remote, &local);
}
