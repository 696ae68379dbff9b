//! `stoker bench` on `s3://` tar shards beside the same shards on local disk, in one run: an
//! S3-compatible server (s3s-fs, the one the tests use) serves the set on 127.0.0.1, and the
//! release `stoker` binary runs the whole epoch: local, `s3://` with an empty cache
//! (cold) and again with the cache the cold run filled (warm), then cold again with a shard-aware
//! shuffle (`--shuffle-window 4`: a batch's samples come from few shards, so neighbours share
//! GETs). Printed per run: images/s, the
//! ratio to local, the first batch, bytes fetched, GETs and the cache hit rate (the cold run's
//! figures include the open: the listing and the index object written by `stoker index`).
//!
//! Run: `cargo build --release -p stoker-cli --bin stoker && cargo bench -p stoker-benches
//! --bench s3_read` (`S3_BENCH_IMAGES`, default 2000; `S3_BENCH_THREADS`, default all cores).
//! A loopback server has no network latency: the figures show Stoker's own cost of reading
//! through the cache, not a remote store's. The server hashes each object it sends (MD5 of
//! the whole object, even for a ranged GET), so the shards here are small (1 MB).

#[path = "../../datasets/tests/it/s3_server.rs"]
mod s3_server;

use std::path::{Path, PathBuf};
use std::process::Command;

use s3_server::{S3Server, ACCESS_KEY, SECRET_KEY};
use stoker_datasets::{
    generate_imagenet_like, write_tar_shards, ImageFolder, SyntheticImageNetSpec,
    TarShardsWriterOptions,
};

/// The release `stoker` binary beside this bench's own folder (`target/release/deps/..`).
fn stoker_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the bench's path");
    let release = exe.parent().and_then(Path::parent).expect("target/release");
    let binary = release.join("stoker");
    assert!(
        binary.exists(),
        "{} is missing: cargo build --release -p stoker-cli --bin stoker",
        binary.display()
    );
    binary
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(default)
}

/// One `stoker bench --json` run over `data`, with the server's credentials and `cache`.
fn bench(
    server: &S3Server,
    cache: &Path,
    data: &str,
    threads: u64,
    shuffle_window: &str,
) -> serde_json::Value {
    let output = Command::new(stoker_binary())
        .args([
            "bench",
            "--data",
            data,
            "--size",
            "224",
            "--batch-size",
            "64",
            "--threads",
            &threads.to_string(),
            "--floor-images",
            "0",
            "--shuffle-window",
            shuffle_window,
            "--json",
        ])
        .env("AWS_ENDPOINT_URL", server.endpoint())
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_REGION", "us-east-1")
        .env("STOKER_CACHE_DIR", cache)
        .output()
        .expect("stoker runs");
    assert!(
        output.status.success(),
        "stoker bench {data} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("bench JSON")
}

fn number(report: &serde_json::Value, path: &[&str]) -> f64 {
    path.iter()
        .try_fold(report, |value, key| value.get(key))
        .and_then(serde_json::Value::as_f64)
        .unwrap_or(0.0)
}

fn main() {
    // `cargo bench` passes `--bench`; a filter that names another bench skips this one.
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    if filter.is_some_and(|f| !"s3_read".contains(f.as_str())) {
        return;
    }
    let images = env_number("S3_BENCH_IMAGES", 2000);
    let threads = env_number("S3_BENCH_THREADS", 0);
    let dir = tempfile::tempdir().expect("a temporary folder");
    let folder = dir.path().join("images");
    let spec = SyntheticImageNetSpec {
        count: images,
        seed: 17,
        classes: 10,
    };
    generate_imagenet_like(&folder, &spec, &|_| {}).expect("the image set");
    let shards = dir.path().join("shards");
    // Small shards: the test server (s3s-fs) hashes the whole object (MD5) to answer each GET,
    // ranged or not, so large shards would measure the server rather than Stoker.
    let options = TarShardsWriterOptions {
        shard_bytes: 1_000_000,
    };
    write_tar_shards(
        &ImageFolder::open(&folder).expect("the image folder"),
        &shards,
        &options,
        &|_| {},
    )
    .expect("tar shards");

    let server = S3Server::start(&dir.path().join("server"));
    let bucket = server.bucket_dir("bench").join("set");
    std::fs::create_dir_all(&bucket).expect("the bucket folder");
    let mut set_bytes = 0;
    let mut shard_count = 0;
    for entry in std::fs::read_dir(&shards).expect("the shards") {
        let path = entry.expect("a shard").path();
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        if name.ends_with(".tar") || name == "classes.txt" {
            set_bytes += std::fs::copy(&path, bucket.join(&name)).expect("an upload");
            shard_count += u64::from(name.ends_with(".tar"));
        }
    }
    let index = Command::new(stoker_binary())
        .args(["index", "s3://bench/set"])
        .env("AWS_ENDPOINT_URL", server.endpoint())
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_REGION", "us-east-1")
        .env("STOKER_CACHE_DIR", dir.path().join("index-cache"))
        .output()
        .expect("stoker index runs");
    assert!(
        index.status.success(),
        "{}",
        String::from_utf8_lossy(&index.stderr)
    );

    println!(
        "s3_read: {images} images, {shard_count} shards, {:.1} MB; batch 64, 224 px, threads {}",
        set_bytes as f64 / 1e6,
        if threads == 0 {
            "all".to_string()
        } else {
            threads.to_string()
        }
    );
    let cache = dir.path().join("cache");
    let local = bench(&server, &cache, &shards.to_string_lossy(), threads, "0");
    let local_rate = number(&local, &["images_per_s"]);
    println!(
        "{:<10} {:>9} {:>7} {:>11} {:>12} {:>7} {:>9}",
        "run", "images/s", "ratio", "first ms", "MB fetched", "GETs", "hit rate"
    );
    println!(
        "{:<10} {:>9.0} {:>7.2} {:>11.0} {:>12} {:>7} {:>9}",
        "local",
        local_rate,
        1.0,
        number(&local, &["first_batch_ms"]),
        "-",
        "-",
        "-"
    );
    let shuffled_cache = dir.path().join("cache-window");
    for (run, cache, window) in [
        ("s3 cold", &cache, "0"),
        ("s3 warm", &cache, "0"),
        ("s3 cold w4", &shuffled_cache, "4"),
    ] {
        let report = bench(&server, cache, "s3://bench/set", threads, window);
        let rate = number(&report, &["images_per_s"]);
        let hits = number(&report, &["object_cache", "hits"]);
        let misses = number(&report, &["object_cache", "misses"]);
        // Reads served by the cache (the read-ahead's fetches count as neither).
        println!(
            "{:<10} {:>9.0} {:>7.2} {:>11.0} {:>12.1} {:>7.0} {:>8.1}%",
            run,
            rate,
            rate / local_rate.max(1e-9),
            number(&report, &["first_batch_ms"]),
            number(&report, &["object_cache", "bytes_fetched"]) / 1e6,
            number(&report, &["object_cache", "requests"]),
            100.0 * hits / (hits + misses).max(1.0)
        );
    }
}
