//! The `stoker` binary on `s3://` tar shards served by a real S3-compatible server (s3s-fs on
//! 127.0.0.1, started by the test; credentials and endpoint through the standard `AWS_*`
//! variables): the digest equals the local one, for any thread count, cold or warm cache, and
//! the cache counters reach stderr.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

#[path = "../../../datasets/tests/it/s3_server.rs"]
pub(crate) mod s3_server;

use std::path::Path;
use std::process::Command;

use s3_server::{S3Server, ACCESS_KEY, SECRET_KEY};

use crate::common;

/// Runs `stoker` with the server's endpoint and credentials and a cache in `cache_dir`.
fn run_stoker_s3(server: &S3Server, cache_dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_stoker"))
        .args(args)
        .env("AWS_ENDPOINT_URL", server.endpoint())
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_REGION", "us-east-1")
        .env("STOKER_CACHE_DIR", cache_dir)
        .output()
        .unwrap()
}

/// Runs `stoker` as [`run_stoker_s3`] does; returns (last stdout line, stderr), after
/// checking the run read the whole 40-sample epoch.
fn stoker_s3(server: &S3Server, cache_dir: &Path, args: &[&str]) -> (String, String) {
    let output = run_stoker_s3(server, cache_dir, args);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "stoker {args:?} failed: {stderr}");
    if args.contains(&"100") {
        assert!(stdout.contains("samples 40 "), "{stdout}");
    }
    (
        stdout.lines().last().unwrap_or_default().to_string(),
        stderr,
    )
}

/// Runs `stoker` as [`stoker_s3`] does, for a run that must fail; returns its stderr.
fn stoker_s3_refused(server: &S3Server, cache_dir: &Path, args: &[&str]) -> String {
    let output = run_stoker_s3(server, cache_dir, args);
    assert!(
        !output.status.success(),
        "stoker {args:?} should have failed"
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `stoker digest` over the whole epoch of the 40-image fixture (5 batches of 8): every
/// sample, once, in the same order.
const WHOLE_EPOCH: [&str; 7] = [
    "digest",
    "--batches",
    "100",
    "--batch-size",
    "8",
    "--size",
    "32",
];

/// `stoker digest` of one small batch of `data`.
fn one_batch(data: &str) -> [&str; 7] {
    ["digest", "--batches", "1", "--size", "32", "--data", data]
}

/// `stoker convert` of the image folder `images` to `format` in `out`, with `extra` flags.
fn convert(images: &Path, format: &str, out: &Path, extra: &[&str]) {
    common::stdout_of(&common::convert_args(images, format, out, extra));
}

/// Copies the tar shards in `shards` and their `classes.txt` to `bucket` (a folder the test's
/// S3 server serves); returns how many.
fn upload_shards(shards: &Path, bucket: &Path) -> usize {
    std::fs::create_dir_all(bucket).unwrap();
    let mut objects = 0;
    for entry in std::fs::read_dir(shards).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".tar") || name == "classes.txt" {
            std::fs::copy(&path, bucket.join(&name)).unwrap();
            objects += 1;
        }
    }
    objects
}

#[test]
fn digest_over_s3_equals_the_local_digest_cold_and_warm() {
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("images");
    common::make_images(&images, 40);
    // Shards of 1 MB: about ten images each, so several shards.
    let shards = dir.path().join("shards");
    convert(&images, "tar", &shards, &["--shard-size", "1"]);

    let server = S3Server::start(&dir.path().join("server"));
    let bucket = server.bucket_dir("data").join("train");
    let objects = upload_shards(&shards, &bucket) as u64;
    assert!(objects >= 3, "several shards and classes.txt");
    let cache = dir.path().join("cache");
    let local = shards.to_str().unwrap();

    // `stoker index` writes the index object beside the shards: opens read it, not the shards.
    let (indexed, _) = stoker_s3(
        &server,
        &dir.path().join("index-cache"),
        &["index", "s3://data/train"],
    );
    assert!(
        indexed.contains("40 samples")
            && indexed.contains("wrote s3://data/train/stoker-tar-index.bin"),
        "{indexed}"
    );

    for extra in [&["--no-shuffle"][..], &["--shuffle-window", "2"][..]] {
        let args = [&WHOLE_EPOCH[..], extra].concat();
        let expected = common::stdout_of(&[&args[..], &["--data", local]].concat());
        let expected = expected.lines().last().unwrap().to_string();
        for threads in ["1", "2"] {
            let remote_args = [
                &args[..],
                &["--data", "s3://data/train", "--threads", threads],
            ]
            .concat();
            let (digest, stderr) = stoker_s3(&server, &cache, &remote_args);
            assert_eq!(digest, expected, "{remote_args:?}");
            assert!(stderr.contains("object cache: "), "{stderr}");
        }
    }
    // The first run fetched every sample's range; every later one was served by the cache.
    let gets = server.counts.object_gets();
    assert!(gets >= objects);
    let (_, stderr) = stoker_s3(&server, &cache, &one_batch("s3://data/train"));
    assert!(
        stderr.contains(" hits, 0 misses, 0 bytes fetched"),
        "{stderr}"
    );
    assert_eq!(
        server.counts.object_gets(),
        gets,
        "the warm run read no object"
    );

    // `stoker convert --out s3://` uploads the shards and their index: the set reads the same.
    let to_bucket = [
        "convert",
        "--from",
        images.to_str().unwrap(),
        "--to",
        "tar",
        "--out",
        "s3://data/converted",
        "--shard-size",
        "1",
    ];
    let (converted, _) = stoker_s3(&server, &dir.path().join("convert-cache"), &to_bucket);
    assert!(
        converted.contains("wrote s3://data/converted/stoker-tar-index.bin (40 samples"),
        "{converted}"
    );
    let whole_epoch = [&WHOLE_EPOCH[..], &["--no-shuffle"]].concat();
    let expected = common::stdout_of(&[&whole_epoch[..], &["--data", local]].concat());
    let (digest, stderr) = stoker_s3(
        &server,
        &dir.path().join("converted-cache"),
        &[&whole_epoch[..], &["--data", "s3://data/converted"]].concat(),
    );
    assert_eq!(digest, expected.lines().last().unwrap());
    assert!(!stderr.contains("no tar index object"), "{stderr}");
    // Converting again onto the same prefix is refused before anything is written: its shards
    // would have been read with the older set's as one.
    let stderr = stoker_s3_refused(&server, &dir.path().join("convert-cache"), &to_bucket);
    assert!(stderr.contains("already holds"), "{stderr}");
    // A convert cut short (its marker left beside the first shards it uploaded) is refused
    // by readers, whole or by a pattern, rather than read as a smaller set; a convert to the
    // same prefix replaces it.
    let cut = server.bucket_dir("data").join("cut");
    std::fs::create_dir_all(&cut).unwrap();
    let mut names: Vec<String> = std::fs::read_dir(&bucket)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".tar"))
        .collect();
    names.sort();
    for name in names
        .iter()
        .take(2)
        .chain(["classes.txt".to_string()].iter())
    {
        std::fs::copy(bucket.join(name), cut.join(name)).unwrap();
    }
    std::fs::write(cut.join(stoker_datasets::UNFINISHED_UPLOAD), "unfinished").unwrap();
    for data in ["s3://data/cut", "s3://data/cut/*.tar"] {
        let stderr = stoker_s3_refused(
            &server,
            &dir.path().join("converted-cache"),
            &one_batch(data),
        );
        assert!(
            stderr.contains("stoker-convert-unfinished is there")
                && stderr.contains("run the convert again"),
            "{data}: {stderr}"
        );
    }
    let to_cut = [&to_bucket[..6], &["s3://data/cut", "--shard-size", "1"]].concat();
    let (converted, _) = stoker_s3(&server, &dir.path().join("convert-cache"), &to_cut);
    assert!(
        converted.contains("replacing the 4 objects an unfinished convert had left"),
        "{converted}"
    );
    assert!(!cut.join(stoker_datasets::UNFINISHED_UPLOAD).exists());
    let (digest, _) = stoker_s3(
        &server,
        &dir.path().join("converted-cache"),
        &[&whole_epoch[..], &["--data", "s3://data/cut"]].concat(),
    );
    assert_eq!(digest, expected.lines().last().unwrap());
    // Another scheme than s3:// is refused, not written to a folder named after it.
    let refused = run_stoker_s3(
        &server,
        &dir.path().join("convert-cache"),
        &[&to_bucket[..6], &["gs://data/elsewhere"]].concat(),
    );
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("gs://"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(!Path::new("gs:").exists());
    // A glob over the shards' keys and a brace list of two folders read what they name, from
    // the index objects beside the shards.
    let (digest, stderr) = stoker_s3(
        &server,
        &dir.path().join("converted-cache"),
        &[&whole_epoch[..], &["--data", "s3://data/converted/*.tar"]].concat(),
    );
    assert_eq!(digest, expected.lines().last().unwrap());
    assert!(!stderr.contains("no tar index object"), "{stderr}");
    // The folder `train/` is a split's name, as it is locally: a pattern spanning it and
    // another folder is refused, naming the splits, and `--split train` reads that folder.
    let spanning = "s3://data/{converted,train}/*.tar";
    let stderr = stoker_s3_refused(
        &server,
        &dir.path().join("converted-cache"),
        &one_batch(spanning),
    );
    assert!(
        stderr.contains(spanning) && stderr.contains("train") && stderr.contains("split"),
        "{stderr}"
    );
    let (digest, _) = stoker_s3(
        &server,
        &dir.path().join("converted-cache"),
        &[&whole_epoch[..], &["--data", spanning, "--split", "train"]].concat(),
    );
    assert_eq!(digest, expected.lines().last().unwrap());
    let refused = Command::new(env!("CARGO_BIN_EXE_stoker"))
        .args([
            "convert",
            "--from",
            images.to_str().unwrap(),
            "--to",
            "parquet",
        ])
        .args(["--out", "s3://data/p"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("convert uploads tar shards only"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    // A Parquet file in the bucket (its key ends in .parquet): footer and columns by ranges.
    let parquet = dir.path().join("parquet");
    convert(&images, "parquet", &parquet, &[]);
    let file = std::fs::read_dir(&parquet)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.extension().is_some_and(|e| e == "parquet"))
        .unwrap();
    let name = file.file_name().unwrap().to_string_lossy().into_owned();
    let pq = server.bucket_dir("data").join("pq");
    std::fs::create_dir_all(&pq).unwrap();
    std::fs::copy(&file, pq.join(&name)).unwrap();
    let expected =
        common::stdout_of(&[&whole_epoch[..], &["--data", parquet.to_str().unwrap()]].concat());
    let uri = format!("s3://data/pq/{name}");
    let (digest, _) = stoker_s3(
        &server,
        &dir.path().join("parquet-cache"),
        &[&whole_epoch[..], &["--data", &uri]].concat(),
    );
    assert_eq!(digest, expected.lines().last().unwrap());

    // `stoker inspect` takes the same URI, and describes the same 40 images as the local set.
    let inspected = |data: &str| {
        let output = run_stoker_s3(&server, &cache, &["inspect", "--json", "--data", data]);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        json
    };
    let remote = inspected("s3://data/train");
    let local = inspected(images.to_str().unwrap());
    for key in ["samples", "classes", "width", "height", "file_bytes"] {
        assert_eq!(remote[key], local[key], "{key}: {remote} vs {local}");
    }
    assert_eq!(remote["samples"], 40);
}

/// Copies the files under `from` to `to`, folders and all.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_tree(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

#[test]
fn image_folders_mds_jsonl_and_tokens_in_a_bucket_digest_as_their_local_copies() {
    let dir = tempfile::tempdir().unwrap();
    let server = S3Server::start(&dir.path().join("server"));
    let images = dir.path().join("images");
    common::make_images(&images, 40);
    copy_tree(&images, &server.bucket_dir("data").join("folder"));
    let whole_epoch = [&WHOLE_EPOCH[..], &["--shuffle-window", "4"]].concat();
    let local =
        common::stdout_of(&[&whole_epoch[..], &["--data", images.to_str().unwrap()]].concat());
    let local = local.lines().last().unwrap();
    for threads in ["1", "2"] {
        let (digest, stderr) = stoker_s3(
            &server,
            &dir.path().join("cache"),
            &[
                &whole_epoch[..],
                &["--data", "s3://data/folder", "--threads", threads],
            ]
            .concat(),
        );
        assert_eq!(digest, local, "threads {threads}");
        assert!(stderr.contains("object cache: "), "{stderr}");
    }
    // Laid out by split (`train/<class>/`, `val/<class>/`): one split, picked by name.
    copy_tree(&images, &server.bucket_dir("data").join("by-split/train"));
    copy_tree(&images, &server.bucket_dir("data").join("by-split/val"));
    let stderr = stoker_s3_refused(
        &server,
        &dir.path().join("cache"),
        &one_batch("s3://data/by-split"),
    );
    assert!(stderr.contains("train, val"), "{stderr}");
    let (digest, _) = stoker_s3(
        &server,
        &dir.path().join("cache"),
        &[
            &whole_epoch[..],
            &["--data", "s3://data/by-split", "--split", "val"],
        ]
        .concat(),
    );
    assert_eq!(digest, local);

    // The same images as Mosaic Streaming's MDS shards (zstd), in torchvision's order: the
    // same digest, locally and from the bucket.
    use stoker_datasets::SampleSource as _;
    let folder = stoker_datasets::ImageFolder::open(&images).unwrap();
    let columns = [
        stoker_datasets::MdsColumn {
            name: "image".into(),
            encoding: "jpeg".into(),
            size: None,
        },
        stoker_datasets::MdsColumn {
            name: "label".into(),
            encoding: "int".into(),
            size: Some(8),
        },
    ];
    let rows: Vec<Vec<Vec<u8>>> = (0..folder.len())
        .map(|k| {
            let label = folder.label(k).to_le_bytes().to_vec();
            vec![folder.read(k).unwrap(), label]
        })
        .collect();
    let mds = server.bucket_dir("data").join("mds");
    stoker_datasets::write_mds(&mds, &columns, &rows, 16, Some("zstd")).unwrap();
    // A global shuffle (no window): shards play no part in the order.
    let folder_digest =
        common::stdout_of(&[&WHOLE_EPOCH[..], &["--data", images.to_str().unwrap()]].concat());
    let folder_digest = folder_digest.lines().last().unwrap();
    let local_mds =
        common::stdout_of(&[&WHOLE_EPOCH[..], &["--data", mds.to_str().unwrap()]].concat());
    assert_eq!(local_mds.lines().last().unwrap(), folder_digest);
    let (digest, _) = stoker_s3(
        &server,
        &dir.path().join("cache"),
        &[&WHOLE_EPOCH[..], &["--data", "s3://data/mds"]].concat(),
    );
    assert_eq!(digest, folder_digest);

    // JSONL documents, tokenised and packed: the objects of a prefix, and a pattern's.
    let fixture = crate::tokens::text_fixture();
    copy_tree(&fixture.jsonl, &server.bucket_dir("data").join("docs"));
    let tokenizer = fixture.tokenizer.to_str().unwrap();
    let text = |data: &str| {
        let args = [
            "digest",
            "--data",
            data,
            "--tokenizer",
            tokenizer,
            "--seq-len",
            "64",
        ];
        stoker_s3(&server, &dir.path().join("cache"), &args).0
    };
    let local = common::stdout_of(&[
        "digest",
        "--data",
        fixture.jsonl.to_str().unwrap(),
        "--tokenizer",
        tokenizer,
        "--seq-len",
        "64",
    ]);
    let local = local.lines().last().unwrap();
    assert_eq!(text("s3://data/docs"), local);
    assert_eq!(text("s3://data/docs/*.jsonl"), local);

    // Qwen's ids written as uint32 under a plain `.bin` name: refused from the object's head,
    // as a local file is; `--token-dtype uint32` reads it.
    let ids: Vec<u8> = (0..4096u32)
        .flat_map(|i| ((i * 7919) % 151_646).to_le_bytes())
        .collect();
    let tokens = server.bucket_dir("data").join("tokens");
    std::fs::create_dir_all(&tokens).unwrap();
    std::fs::write(tokens.join("train.bin"), ids).unwrap();
    let windows = [
        "digest",
        "--data",
        "s3://data/tokens/train.bin",
        "--seq-len",
        "64",
    ];
    let stderr = stoker_s3_refused(&server, &dir.path().join("cache"), &windows);
    assert!(stderr.contains("holds uint32 ids"), "{stderr}");
    stoker_s3(
        &server,
        &dir.path().join("cache"),
        &[&windows[..], &["--token-dtype", "uint32"]].concat(),
    );
}

/// The variables naming credentials, a region, an endpoint or a profile: a run given none of
/// them reads the profile of the home folder's shared files.
const AWS_VARIABLES: [&str; 11] = [
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
];

/// Keys, region and endpoint come from the AWS profile in `~/.aws` (as `aws configure` writes
/// them) where the environment has none: the client used to skip the files and wait on an
/// instance metadata service. A profile whose credentials come through single sign-on is
/// refused at once, naming how to export them.
#[test]
fn a_profile_of_the_shared_aws_files_gives_the_keys_the_environment_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("images");
    common::make_images(&images, 8);
    let shards = dir.path().join("shards");
    convert(&images, "tar", &shards, &[]);
    let server = S3Server::start(&dir.path().join("server"));
    upload_shards(&shards, &server.bucket_dir("data").join("train"));
    let home = dir.path().join("home");
    std::fs::create_dir_all(home.join(".aws")).unwrap();
    std::fs::write(
        home.join(".aws/credentials"),
        format!(
            "[trainer]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n"
        ),
    )
    .unwrap();
    std::fs::write(
        home.join(".aws/config"),
        format!(
            "[profile trainer]\nregion = us-east-1\nendpoint_url = {}\n\n\
             [profile corp]\nsso_session = corp\nregion = us-east-1\n",
            server.endpoint()
        ),
    )
    .unwrap();
    let run = |profile: &str| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_stoker"));
        command.args(one_batch("s3://data/train"));
        for variable in AWS_VARIABLES {
            command.env_remove(variable);
        }
        command
            .env("HOME", &home)
            .env("AWS_PROFILE", profile)
            .env("STOKER_CACHE_DIR", dir.path().join("cache"))
            .output()
            .unwrap()
    };
    let read = run("trainer");
    let stderr = String::from_utf8_lossy(&read.stderr);
    assert!(read.status.success(), "{stderr}");
    let local = common::stdout_of(&one_batch(shards.to_str().unwrap()));
    assert_eq!(
        String::from_utf8_lossy(&read.stdout).lines().last(),
        local.lines().last()
    );
    let refused = run("corp");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        stderr.contains("sso_session") && stderr.contains("export-credentials"),
        "{stderr}"
    );
}

#[test]
fn unknown_schemes_are_refused_by_name() {
    let output = common::stoker(&["digest", "--data", "gs://bucket/train"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("gs://") && stderr.contains("s3://BUCKET/PREFIX"),
        "{stderr}"
    );
}

/// Two S3 servers over copies of one tar set (indexed), the 40-image fixture; the local
/// digest of the whole epoch.
fn two_stores_of_one_set(dir: &Path) -> ([S3Server; 2], String) {
    let images = dir.join("images");
    common::make_images(&images, 40);
    let shards = dir.join("shards");
    convert(&images, "tar", &shards, &["--shard-size", "1"]);
    let servers = [
        S3Server::start(&dir.join("server-a")),
        S3Server::start(&dir.join("server-b")),
    ];
    for (server, name) in servers.iter().zip(["a", "b"]) {
        upload_shards(&shards, &server.bucket_dir("data").join("train"));
        let cache = dir.join(format!("index-cache-{name}"));
        stoker_s3(server, &cache, &["index", "s3://data/train"]);
    }
    let local =
        common::stdout_of(&[&WHOLE_EPOCH[..], &["--data", shards.to_str().unwrap()]].concat());
    (servers, local.lines().last().unwrap().to_string())
}

/// `stoker digest` of the whole epoch of `s3://data/train` from the coordinator at `address`.
fn whole_epoch_at(address: &str) -> Vec<&str> {
    [
        &WHOLE_EPOCH[..],
        &["--data", "s3://data/train", "--address", address],
    ]
    .concat()
}

/// A worker of `coordinator` reading through `server`, its cache in `dir/worker-cache-NAME`.
fn worker_of(server: &S3Server, coordinator: &str, dir: &Path, name: &str) -> common::Daemon {
    let cache = dir.join(format!("worker-cache-{name}"));
    let endpoint = server.endpoint();
    let env = [
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
        ("AWS_REGION", "us-east-1"),
        ("STOKER_CACHE_DIR", cache.to_str().unwrap()),
    ];
    let root = dir.to_str().unwrap();
    let args = [
        "--coordinator",
        coordinator,
        "--data-root",
        root,
        "--threads",
        "1",
    ];
    let log = std::process::Stdio::inherit();
    common::Daemon::start_with_env(common::worker_binary(), &args, log, &env)
}

/// A store that refuses one worker's reads of the shards while it serves the job's index (a
/// token of that node's that expired; its endpoint another store that lost them): the batches
/// that worker fails are its own failures, handed back, and the worker that can read builds
/// them; the epoch is the local one. Before, the first such failure reached the client as the
/// batch's error and ended its run. Alone, the worker tells the client after a few tries, by
/// name, rather than leave it waiting for its deadline.
#[test]
fn a_store_refusing_one_workers_reads_leaves_its_batches_to_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let (servers, local) = two_stores_of_one_set(dir.path());
    *servers[0].counts.refuse_gets_ending.lock().unwrap() = Some(".tar".into());
    let coordinator = common::Daemon::coordinator(&dir.path().join("state"), "127.0.0.1:0");
    let remote_args = whole_epoch_at(&coordinator.address);
    {
        let _workers = [
            worker_of(&servers[0], &coordinator.address, dir.path(), "a"),
            worker_of(&servers[1], &coordinator.address, dir.path(), "b"),
        ];
        let (remote, _) = stoker_s3(&servers[1], &dir.path().join("client-cache"), &remote_args);
        assert_eq!(remote, local);
    }
    // Worker a alone, under a coordinator of its own.
    let coordinator = common::Daemon::coordinator(&dir.path().join("state-alone"), "127.0.0.1:0");
    let _alone = worker_of(&servers[0], &coordinator.address, dir.path(), "alone");
    let remote_args = whole_epoch_at(&coordinator.address);
    let mut command = Command::new(env!("CARGO_BIN_EXE_stoker"));
    command.args(&remote_args);
    let output =
        crate::dashboard::run_with_limit(&mut command, std::time::Duration::from_secs(120));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("403") && stderr.contains("tried 3 times on this worker"),
        "{stderr}"
    );
}
