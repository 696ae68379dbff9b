//! Resource safety end to end (issue 16): a token file truncated under a running loader is an
//! error naming it, not SIGBUS; thousands of tar shards, a `save_to_disk` folder of a thousand
//! Arrow shards, and a thousand compressed MDS shards or JSONL files, local or in a bucket of
//! the in-test S3 server, run under a small descriptor limit (the shard files live in a bounded
//! pool, their copies in the cache tier are not held locked); and running out of descriptors
//! never turns good samples into replaced "bad samples". The limits are set in a child `stoker` process (`sh -c 'ulimit -n N && exec
//! ...'`), never in the test process.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch, StringArray, StructArray};
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{DataType, Field};
use stoker_datasets::{
    write_mds, write_tar_shards, MdsColumn, SampleSource, TarShardsWriterOptions,
};
use stoker_loader::{Loader, LoaderOptions};
use stoker_proto::v1::{self as proto, op::Op as OpKind};

use crate::common;
use crate::object_store::s3_server::{S3Server, ACCESS_KEY, SECRET_KEY};

/// A 4x4 RGB PNG whose pixels encode `index`, so every sample is distinct.
fn tiny_png(index: u64) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut encoder = png::Encoder::new(&mut bytes, 4, 4);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().unwrap();
    let pixels: Vec<u8> = (0..48u64)
        .map(|byte| (index.wrapping_mul(31).wrapping_add(byte * 7) % 251) as u8)
        .collect();
    writer.write_image_data(&pixels).unwrap();
    writer.finish().unwrap();
    bytes
}

/// `count` distinct tiny images in 10 classes, to be written as tar shards.
struct TinyImages {
    count: u64,
    classes: Vec<String>,
}

impl SampleSource for TinyImages {
    fn len(&self) -> u64 {
        self.count
    }

    fn label(&self, index: u64) -> i64 {
        (index % 10) as i64
    }

    fn describe(&self, index: u64) -> String {
        format!("tiny_{index:05}.png")
    }

    fn read(&self, index: u64) -> stoker_datasets::Result<Vec<u8>> {
        Ok(tiny_png(index))
    }

    fn class_names(&self) -> &[String] {
        &self.classes
    }
}

/// Writes `count` tiny samples as tar shards of at most `shard_bytes` into `dir`.
fn write_shards(dir: &Path, count: u64, shard_bytes: u64) -> usize {
    let source = TinyImages {
        count,
        classes: (0..10).map(|class| format!("class_{class}")).collect(),
    };
    let written = write_tar_shards(
        &source,
        dir,
        &TarShardsWriterOptions { shard_bytes },
        &|_| {},
    )
    .unwrap();
    assert_eq!(written.samples, count);
    written.shards.len()
}

/// Sample `index` of the tiny set as a one-row record batch of a `save_to_disk` table: an
/// `Image` cell (bytes and path) and a `ClassLabel`.
fn hf_row(index: u64) -> RecordBatch {
    let image = StructArray::from(vec![
        (
            Arc::new(Field::new("bytes", DataType::Binary, true)),
            Arc::new(BinaryArray::from_vec(vec![tiny_png(index).as_slice()])) as ArrayRef,
        ),
        (
            Arc::new(Field::new("path", DataType::Utf8, true)),
            Arc::new(StringArray::from(vec![None::<String>])) as ArrayRef,
        ),
    ]);
    let label = Int64Array::from(vec![(index % 10) as i64]);
    RecordBatch::try_from_iter(vec![
        ("image", Arc::new(image) as ArrayRef),
        ("label", Arc::new(label) as ArrayRef),
    ])
    .unwrap()
}

/// Writes `count` tiny samples as a `save_to_disk` folder `dir` of `shards` Arrow stream files
/// (samples dealt out in order), each sample a record batch of its own.
fn write_hf_folder(dir: &Path, count: u64, shards: u64) {
    std::fs::create_dir_all(dir).unwrap();
    let per_shard = count.div_ceil(shards);
    let mut data_files = Vec::new();
    for shard in 0..shards {
        let name = format!("data-{shard:05}-of-{shards:05}.arrow");
        let file = std::fs::File::create(dir.join(&name)).unwrap();
        let mut writer = StreamWriter::try_new(file, &hf_row(0).schema()).unwrap();
        for index in shard * per_shard..((shard + 1) * per_shard).min(count) {
            writer.write(&hf_row(index)).unwrap();
        }
        writer.finish().unwrap();
        data_files.push(serde_json::json!({ "filename": name }));
    }
    let names: Vec<String> = (0..10).map(|class| format!("class_{class}")).collect();
    let features = serde_json::json!({
        "image": {"_type": "Image"},
        "label": {"names": names, "_type": "ClassLabel"},
    });
    let info = serde_json::json!({"citation": "", "description": "", "features": features});
    std::fs::write(dir.join("dataset_info.json"), info.to_string()).unwrap();
    let state = serde_json::json!({
        "_data_files": data_files,
        "_fingerprint": "0123456789abcdef",
        "_format_columns": null,
        "_format_kwargs": {},
        "_format_type": null,
        "_output_all_columns": false,
        "_split": null,
    });
    std::fs::write(dir.join("state.json"), state.to_string()).unwrap();
}

/// Writes `count` tiny samples as an MDS set `dir` of `per_shard` samples a shard, compressed
/// by `compression` when given (as Streaming's `MDSWriter` writes them: an image column, an
/// integer label).
fn write_mds_set(dir: &Path, count: u64, per_shard: usize, compression: Option<&str>) {
    let column = |name: &str, encoding: &str, size| MdsColumn {
        name: name.into(),
        encoding: encoding.into(),
        size,
    };
    let columns = [
        column("image", "png", None),
        column("label", "int", Some(8)),
    ];
    let rows: Vec<Vec<Vec<u8>>> = (0..count)
        .map(|index| {
            vec![
                tiny_png(index),
                ((index % 10) as i64).to_le_bytes().to_vec(),
            ]
        })
        .collect();
    write_mds(dir, &columns, &rows, per_shard, compression).unwrap();
}

/// `stoker digest` over a whole epoch of `dir` (batches of 100), under `ulimit -n` when given.
fn digest_run(dir: &Path, open_files: Option<u32>) -> Output {
    digest_of(&dir.to_string_lossy(), dir, open_files, None)
}

/// `stoker digest` over a whole epoch of `data` (a folder, or an `s3://` prefix of `server`),
/// its cache tier under `dir`, under `ulimit -n` when given.
fn digest_of(data: &str, dir: &Path, open_files: Option<u32>, server: Option<&S3Server>) -> Output {
    let args = [
        "digest",
        "--data",
        data,
        "--pipeline",
        "imagenet-eval",
        "--size",
        "4",
        "--batch-size",
        "100",
        "--batches",
        "1000000",
        "--threads",
        "2",
    ];
    stoker_run(dir, &args, open_files, server)
}

/// `stoker ARGS`, its cache tier under `dir`, under `ulimit -n` when given, reading `s3://`
/// through `server` when given.
fn stoker_run(
    dir: &Path,
    args: &[&str],
    open_files: Option<u32>,
    server: Option<&S3Server>,
) -> Output {
    let stoker = env!("CARGO_BIN_EXE_stoker");
    let mut command = match open_files {
        Some(limit) => {
            let mut command = Command::new("sh");
            command
                .arg("-c")
                .arg(format!("ulimit -n {limit} && exec \"$0\" \"$@\""))
                .arg(stoker);
            command
        }
        None => Command::new(stoker),
    };
    command
        .args(args)
        .env("RUST_LOG", "warn")
        .env("XDG_CACHE_HOME", dir.join("no-user-cache"));
    if let Some(server) = server {
        command
            .env("AWS_ENDPOINT_URL", server.endpoint())
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .env("AWS_REGION", "us-east-1");
    }
    command.output().unwrap()
}

/// A whole epoch of `many` (its files in a set read under `ulimit -n 256`) and of `reference`
/// (the same samples in fewer files, no limit): each `figures` (`batches N  samples M`) with
/// no sample replaced, and the same digest.
fn same_epoch_under_ulimit_256(many: &Path, reference: &Path, figures: &str) {
    let data = many.to_string_lossy();
    same_epoch_of(&data, many, None, reference, figures);
}

/// [`same_epoch_under_ulimit_256`] of `many`, a folder or an `s3://` prefix of `server`, its
/// cache tier under `dir`.
fn same_epoch_of(
    many: &str,
    dir: &Path,
    server: Option<&S3Server>,
    reference: &Path,
    figures: &str,
) {
    let (summary, digest) = summary_and_digest(&digest_of(many, dir, Some(256), server));
    let (reference_summary, expected) = summary_and_digest(&digest_run(reference, None));
    for summary in [&summary, &reference_summary] {
        let figures = format!("{figures}  bad samples replaced 0");
        assert!(summary.starts_with(&figures), "{summary}");
    }
    assert_eq!(
        digest,
        expected,
        "{many} and the same samples in {} differ",
        reference.display()
    );
}

/// The figures line (`batches N  samples M  bad samples replaced B ...`) and the digest.
fn summary_and_digest(output: &Output) -> (String, String) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        output.status.success() && lines.len() >= 2,
        "stoker digest failed: {}\n{}",
        stdout,
        String::from_utf8_lossy(&output.stderr)
    );
    (
        lines[lines.len() - 2].to_string(),
        lines[lines.len() - 1].to_string(),
    )
}

#[test]
fn five_thousand_shards_read_a_whole_epoch_under_ulimit_256() {
    let dir = tempfile::tempdir().unwrap();
    let many = dir.path().join("many");
    let few = dir.path().join("few");
    assert_eq!(write_shards(&many, 5000, 1), 5000);
    let few_shards = write_shards(&few, 5000, 2_000_000);
    assert!(few_shards < 10, "{few_shards} shards");

    same_epoch_under_ulimit_256(&many, &few, "batches 50  samples 5000");
}

/// Each Arrow shard of a `save_to_disk` folder was held open from open to drop: a folder of
/// more shards than the descriptor limit failed to open ("Too many open files").
#[test]
fn a_save_to_disk_folder_of_a_thousand_shards_reads_under_ulimit_256() {
    let dir = tempfile::tempdir().unwrap();
    let many = dir.path().join("many");
    let one = dir.path().join("one");
    write_hf_folder(&many, 1000, 1000);
    write_hf_folder(&one, 1000, 1);

    same_epoch_under_ulimit_256(&many, &one, "batches 10  samples 1000");
}

/// Each compressed shard of an MDS set is decompressed once into the cache tier, and its copy
/// was held there, locked, from open to drop: a descriptor a shard, so a set of more
/// compressed shards than the descriptor limit failed to open ("Too many open files").
#[test]
fn a_compressed_mds_set_of_a_thousand_shards_reads_under_ulimit_256() {
    let dir = tempfile::tempdir().unwrap();
    let many = dir.path().join("many");
    let one = dir.path().join("one");
    write_mds_set(&many, 1000, 1, Some("zstd"));
    write_mds_set(&one, 1000, 1000, None);

    same_epoch_under_ulimit_256(&many, &one, "batches 10  samples 1000");
}

/// Each compressed JSONL file is decompressed once into the cache tier, and its copy was held
/// there, locked, from open to drop: a descriptor a file, so a set of more compressed files
/// than the descriptor limit (C4's 1,024 `.json.gz` files a split, under the common limit of
/// 1,024) failed to open.
#[test]
fn a_thousand_compressed_jsonl_files_read_under_ulimit_256() {
    let fixture = crate::tokens::text_fixture();
    let dir = tempfile::tempdir().unwrap();
    let (many, one) = (dir.path().join("many"), dir.path().join("one"));
    write_jsonl_sets(&many, &one);
    let tokenizer = fixture.tokenizer.as_path();
    assert_eq!(
        jsonl_digest(
            (&many.to_string_lossy(), tokenizer),
            dir.path(),
            Some(256),
            None
        ),
        jsonl_digest((&one.to_string_lossy(), tokenizer), dir.path(), None, None)
    );
}

/// Writes 1,000 one-line documents into `many` as a `.jsonl.gz` file each, and into `one` as
/// a single `all.jsonl`.
fn write_jsonl_sets(many: &Path, one: &Path) {
    use std::io::Write;
    std::fs::create_dir_all(many).unwrap();
    std::fs::create_dir_all(one).unwrap();
    let line = |i: u64| format!("{{\"text\": \"document {i} of the set\"}}\n");
    for i in 0..1000 {
        let file = std::fs::File::create(many.join(format!("{i:04}.jsonl.gz"))).unwrap();
        let mut encoder = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
        encoder.write_all(line(i).as_bytes()).unwrap();
        encoder.finish().unwrap();
    }
    let all: String = (0..1000).map(line).collect();
    std::fs::write(one.join("all.jsonl"), all).unwrap();
}

/// The digest of a whole epoch of token windows (of `tokenizer`'s ids) of the JSONL set `data`
/// (a folder, or an `s3://` prefix of `server`), its cache tier under `dir`, under `ulimit -n`
/// when given.
fn jsonl_digest(
    (data, tokenizer): (&str, &Path),
    dir: &Path,
    open_files: Option<u32>,
    server: Option<&S3Server>,
) -> String {
    let tokenizer = tokenizer.to_string_lossy();
    let args = [
        "digest",
        "--data",
        data,
        "--tokenizer",
        &tokenizer,
        "--seq-len",
        "64",
    ];
    let output = stoker_run(dir, &args, open_files, server);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "stoker digest failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout.lines().last().unwrap_or_default().to_string()
}

/// The objects of a set under an `s3://` prefix that are read whole (MDS shards, compressed or
/// not; JSONL files; a `save_to_disk` folder's Arrow shards) were each held locked in the cache
/// tier from open to drop: a descriptor an object, so a set of more objects than the
/// descriptor limit failed to open ("Too many open files"). Each set of a thousand objects
/// reads under `ulimit -n 256` now, as its local copy in one file does.
#[test]
fn sets_of_a_thousand_objects_in_a_bucket_read_under_ulimit_256() {
    let dir = tempfile::tempdir().unwrap();
    let server = S3Server::start(&dir.path().join("server"));
    let bucket = server.bucket_dir("data");
    let local = dir.path().join("local");
    let figures = "batches 10  samples 1000";

    write_mds_set(&bucket.join("mds-zstd"), 1000, 1, Some("zstd"));
    write_mds_set(&bucket.join("mds"), 1000, 1, None);
    write_mds_set(&local.join("mds"), 1000, 1000, None);
    for prefix in ["s3://data/mds-zstd", "s3://data/mds"] {
        same_epoch_of(
            prefix,
            dir.path(),
            Some(&server),
            &local.join("mds"),
            figures,
        );
    }

    write_hf_folder(&bucket.join("hf"), 1000, 1000);
    write_hf_folder(&local.join("hf"), 1000, 1);
    same_epoch_of(
        "s3://data/hf",
        dir.path(),
        Some(&server),
        &local.join("hf"),
        figures,
    );

    let fixture = crate::tokens::text_fixture();
    let tokenizer = fixture.tokenizer.as_path();
    write_jsonl_sets(&bucket.join("jsonl"), &local.join("jsonl"));
    let one = local.join("jsonl").to_string_lossy().into_owned();
    let expected = jsonl_digest((&one, tokenizer), dir.path(), None, None);
    let remote = ("s3://data/jsonl", tokenizer);
    assert_eq!(
        jsonl_digest(remote, dir.path(), Some(256), Some(&server)),
        expected
    );
}

#[test]
fn running_short_of_descriptors_never_replaces_a_sample() {
    let dir = tempfile::tempdir().unwrap();
    let shards = dir.path().join("shards");
    assert_eq!(write_shards(&shards, 600, 1), 600);
    let output = digest_run(&shards, Some(64));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !stderr.contains("bad sample"),
        "a sample was treated as bad under the descriptor limit:\n{stderr}"
    );
    if output.status.success() {
        let (summary, _) = summary_and_digest(&output);
        assert!(
            summary.starts_with("batches 6  samples 600  bad samples replaced 0"),
            "{summary}"
        );
    } else {
        // A loud failure is allowed; it must say why.
        assert!(
            stderr.contains("open files") || stderr.contains("descriptor"),
            "a failure that does not name its cause:\n{stderr}"
        );
    }
}

#[test]
fn a_token_file_truncated_under_a_running_loader_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.bin");
    // 4,000 windows of 16 + 1 tokens.
    let tokens: Vec<u8> = (0..4000u32 * 16 + 1)
        .flat_map(|token| ((token % 60_000) as u16).to_le_bytes())
        .collect();
    std::fs::write(&path, &tokens).unwrap();
    let windows = proto::Op {
        op: Some(OpKind::TokenWindows(proto::TokenWindows {
            seq_len: 16,
            ..Default::default()
        })),
    };
    let spec = common::spec_over(&path.to_string_lossy(), vec![windows], 8);
    let loader = Loader::new(
        spec.clone(),
        LoaderOptions {
            threads: 2,
            ..LoaderOptions::default()
        },
    )
    .unwrap();
    let mut stream = loader.epoch(0, 0).unwrap();
    assert!(stream.next_batch().unwrap().is_some());

    // Another process cuts the file to 40 windows while the loader runs.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(40 * 16 * 2)
        .unwrap();
    let error = loop {
        match stream.next_batch() {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the epoch ended without noticing the truncation"),
            Err(error) => break error,
        }
    };
    let message = error.to_string();
    assert!(
        message.contains(&path.display().to_string()) && message.contains("changed"),
        "{message}"
    );
    assert_eq!(
        loader.stats().bad_samples,
        0,
        "truncation is not a bad sample"
    );
    drop(stream);
    drop(loader);

    // The process lives on: a loader over the file as it is now reads it.
    let batches = common::epoch_batches(&spec, 2, 0);
    assert_eq!(batches.len(), 5);
}
