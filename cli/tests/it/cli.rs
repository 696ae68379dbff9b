//! The `stoker` binary as a user runs it: help on every subcommand, digest reproducibility,
//! bench's JSON, inspect, make-dataset and a short demo.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::Path;
use std::process::Command;

use crate::common::{self, stdout_of, stoker};

fn last_line(text: &str) -> String {
    text.lines().last().unwrap_or_default().to_string()
}

#[test]
fn every_subcommand_has_help() {
    for sub in [
        "demo",
        "bench",
        "digest",
        "inspect",
        "make-dataset",
        "convert",
    ] {
        let out = stdout_of(&[sub, "--help"]);
        assert!(out.contains("Usage: stoker"), "{sub}: {out}");
    }
    assert!(stdout_of(&["--help"]).contains("make-dataset"));
    assert!(stdout_of(&["convert", "--help"]).contains("Parquet"));
}

#[test]
fn digest_depends_on_seed_and_epoch_but_not_threads() {
    let dir = tempfile::tempdir().unwrap();
    common::make_images(dir.path(), 48);
    let data = dir.path().to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "digest",
            "--data",
            data,
            "--batch-size",
            "8",
            "--batches",
            "3",
            "--size",
            "64",
        ];
        args.extend_from_slice(extra);
        last_line(&stdout_of(&args))
    };
    let one = run(&["--threads", "1"]);
    assert_eq!(one.len(), 64, "sha-256 hex: {one}");
    assert_eq!(one, run(&["--threads", "2"]));
    assert_ne!(one, run(&["--threads", "2", "--seed", "1"]));
    assert_ne!(one, run(&["--threads", "2", "--epoch", "1"]));
    assert_ne!(one, run(&["--threads", "2", "--rank", "1", "--world", "2"]));
    assert_ne!(one, run(&["--no-shuffle"]));
}

#[test]
fn bench_json_has_the_figures() {
    let dir = tempfile::tempdir().unwrap();
    common::make_images(dir.path(), 40);
    let out = stdout_of(&[
        "bench",
        "--data",
        dir.path().to_str().unwrap(),
        "--batch-size",
        "8",
        "--threads",
        "2",
        "--json",
    ]);
    let report: serde_json::Value = serde_json::from_str(last_line(&out).trim()).unwrap();
    for key in [
        "images_per_s",
        "cpu_s_per_image",
        "first_batch_ms",
        "peak_rss_mb",
        "decode_floor_s_per_image",
    ] {
        assert!(
            report[key].as_f64().is_some_and(|v| v > 0.0),
            "{key} in {report}"
        );
    }
    assert_eq!(report["images"], 40);
}

#[test]
fn make_dataset_then_inspect() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("set");
    let out = stdout_of(&[
        "make-dataset",
        "--count",
        "30",
        "--out",
        out_dir.to_str().unwrap(),
        "--seed",
        "2",
    ]);
    assert!(out.contains("wrote 30 images"), "{out}");
    let report = stdout_of(&["inspect", "--data", out_dir.to_str().unwrap()]);
    assert!(report.contains("samples   30"), "{report}");
    assert!(report.contains("classes   10"), "{report}");
    let json = stdout_of(&["inspect", "--data", out_dir.to_str().unwrap(), "--json"]);
    let value: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(value["samples"], 30);
}

/// An MDS set with two image columns, none named `image`: `inspect` and `digest` refuse it
/// naming `--image-column`, and read it once the column is named.
#[test]
fn image_column_names_the_one_of_several_image_columns() {
    use stoker_datasets::SampleSource as _;
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("images");
    common::make_images(&images, 8);
    let folder = stoker_datasets::ImageFolder::open(&images).unwrap();
    let column = |name: &str, encoding: &str, size| stoker_datasets::MdsColumn {
        name: name.into(),
        encoding: encoding.into(),
        size,
    };
    let columns = [
        column("depth", "png", None),
        column("label", "int", Some(8)),
        column("x", "jpeg", None),
    ];
    let rows: Vec<Vec<Vec<u8>>> = (0..folder.len())
        .map(|k| {
            let label = folder.label(k).to_le_bytes().to_vec();
            vec![b"not a png".to_vec(), label, folder.read(k).unwrap()]
        })
        .collect();
    let mds = dir.path().join("mds");
    stoker_datasets::write_mds(&mds, &columns, &rows, 4, None).unwrap();
    let mds = mds.to_str().unwrap();
    for command in ["inspect", "digest"] {
        let refused = stoker(&[command, "--data", mds]);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success(), "{command}");
        assert!(stderr.contains("--image-column"), "{command}: {stderr}");
    }
    let report = stdout_of(&["inspect", "--data", mds, "--image-column", "x"]);
    assert!(report.contains("samples   8"), "{report}");
    let digest = |data: &str, extra: &[&str]| {
        let args = [
            &[
                "digest",
                "--size",
                "32",
                "--batch-size",
                "4",
                "--data",
                data,
            ],
            extra,
        ]
        .concat();
        last_line(&stdout_of(&args))
    };
    assert_eq!(
        digest(mds, &["--image-column", "x"]),
        digest(images.to_str().unwrap(), &[])
    );
}

#[test]
fn a_report_whose_reader_goes_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let set = dir.path().join("set");
    let out = stdout_of(&[
        "make-dataset",
        "--count",
        "10",
        "--out",
        set.to_str().unwrap(),
    ]);
    assert!(out.contains("wrote 10 images"), "{out}");
    // `stoker inspect ... | head -0`: the reader is gone before the report is printed.
    let mut child = Command::new(env!("CARGO_BIN_EXE_stoker"))
        .args(["inspect", "--data", set.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        output.status.signal(),
        Some(libc::SIGPIPE),
        "{:?}",
        output.status
    );
}

#[test]
fn demo_makes_its_own_data_and_summarises() {
    let tmp = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_stoker"))
        .args([
            "demo",
            "--seconds",
            "1.5",
            "--sample-images",
            "64",
            "--batch-size",
            "16",
            "--step-ms",
            "5",
        ])
        .env("TMPDIR", tmp.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(text.contains("images/s"), "{text}");
    assert!(last_line(&text).starts_with("summary:"), "{text}");
    assert!(tmp
        .path()
        .join("stoker-sample-64")
        .join("class_00")
        .is_dir());
}

#[test]
fn bad_arguments_fail_with_a_message() {
    let output = stoker(&["digest", "--data", "/nonexistent/stoker-test"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("nonexistent"), "{stderr}");
    let output = stoker(&["bench", "--data", ".", "--pipeline", "made-up"]);
    assert!(!output.status.success());
    let output = stoker(&["demo", "--seconds", "-1"]);
    assert!(!output.status.success());
    // Past 65536 a job's stride would round to nothing; refused before anything starts.
    for weight in ["0", "65537"] {
        let output = stoker(&["coordinator", "--max-job-weight", weight]);
        assert_eq!(output.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("1..=65536"), "{stderr}");
    }
    // 0 is no "never" for the timeouts (it was raised to 100 ms silently, closing every
    // session after 100 ms of quiet), nor 0 sessions a limit.
    for (flag, value, said) in [
        ("--session-timeout-ms", "0", "100.."),
        ("--lease-timeout-ms", "50", "100.."),
        ("--max-sessions", "0", "at least 1"),
    ] {
        let output = stoker(&["coordinator", flag, value]);
        assert_eq!(output.status.code(), Some(2), "{flag}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(flag) && stderr.contains(said), "{stderr}");
    }
}

/// A Megatron corpus of two documents of 300 int32 tokens in `dir`, laid out as Megatron's index
/// writer lays it out; its prefix.
fn write_megatron_corpus(dir: &Path) -> std::path::PathBuf {
    let prefix = dir.join("corpus_text_document");
    let tokens: Vec<u8> = (0..600i32).flat_map(i32::to_le_bytes).collect();
    std::fs::write(prefix.with_extension("bin"), tokens).unwrap();
    let mut index = b"MMIDIDX\x00\x00".to_vec();
    index.extend(1u64.to_le_bytes());
    index.push(4);
    index.extend(2u64.to_le_bytes());
    index.extend(3u64.to_le_bytes());
    index.extend([300i32, 300].iter().flat_map(|l| l.to_le_bytes()));
    index.extend([0i64, 1200].iter().flat_map(|p| p.to_le_bytes()));
    index.extend([0i64, 1, 2].iter().flat_map(|d| d.to_le_bytes()));
    std::fs::write(prefix.with_extension("idx"), index).unwrap();
    prefix
}

/// `inspect` finds a source as a job does: a folder laid out by split is refused whole and
/// read by `--split`, a pattern names its files, a Megatron corpus is read with the dtype its
/// index names (not the `.bin` name's), and tar shards answer `--json`.
#[test]
fn inspect_finds_its_source_as_a_job_does() {
    let dir = tempfile::tempdir().unwrap();
    let splits = dir.path().join("splits");
    common::make_images(&splits.join("train"), 6);
    common::make_images(&splits.join("val"), 3);
    let whole = stoker(&["inspect", "--data", splits.to_str().unwrap()]);
    assert!(!whole.status.success());
    let message = String::from_utf8_lossy(&whole.stderr);
    assert!(
        message.contains("train, val") && message.contains("--split"),
        "{message}"
    );
    let val = stdout_of(&[
        "inspect",
        "--data",
        splits.to_str().unwrap(),
        "--split",
        "val",
    ]);
    assert!(val.contains("samples   3"), "{val}");
    let shards = dir.path().join("shards");
    stdout_of(&[
        "convert",
        "--from",
        splits.to_str().unwrap(),
        "--split",
        "train",
        "--to",
        "tar",
        "--out",
        shards.to_str().unwrap(),
    ]);
    let json = stdout_of(&["inspect", "--data", shards.to_str().unwrap(), "--json"]);
    let json: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(json["samples"], 6);
    let pattern = shards.join("shard-*.tar");
    let named = stdout_of(&["inspect", "--data", pattern.to_str().unwrap(), "--json"]);
    let named: serde_json::Value = serde_json::from_str(named.trim()).unwrap();
    assert_eq!(named["samples"], 6);
    let prefix = write_megatron_corpus(dir.path());
    for file in ["bin", "idx"] {
        let data = prefix.with_extension(file);
        let report = stdout_of(&[
            "inspect",
            "--data",
            data.to_str().unwrap(),
            "--seq-len",
            "8",
            "--json",
        ]);
        let report: serde_json::Value = serde_json::from_str(report.trim()).unwrap();
        // 4-byte tokens (the name rule would say uint16), in (600 - 1) / 8 windows.
        assert_eq!(report["dtype"], "uint32", "{report}");
        assert_eq!(report["windows"], 74, "{report}");
    }
    // JSONL named by split or pattern is described as documents (it was read as images:
    // "formats unreadable 1"), and token files by a pattern as windows (it was refused for
    // a pipeline nobody gave).
    let jsonl = dir.path().join("jsonl");
    std::fs::create_dir_all(&jsonl).unwrap();
    std::fs::write(
        jsonl.join("train.jsonl"),
        "{\"text\": \"one\"}\n{\"text\": \"two\"}\n",
    )
    .unwrap();
    std::fs::write(jsonl.join("test.jsonl"), "{\"text\": \"three\"}\n").unwrap();
    let train = stdout_of(&[
        "inspect",
        "--data",
        jsonl.to_str().unwrap(),
        "--split",
        "train",
        "--json",
    ]);
    let train: serde_json::Value = serde_json::from_str(train.trim()).unwrap();
    assert_eq!(train["documents"], 2, "{train}");
    let parts = dir.path().join("parts");
    std::fs::create_dir_all(&parts).unwrap();
    std::fs::copy(jsonl.join("train.jsonl"), parts.join("part-0.jsonl")).unwrap();
    std::fs::copy(jsonl.join("test.jsonl"), parts.join("part-1.jsonl")).unwrap();
    let every = parts.join("part-*.jsonl");
    let every = stdout_of(&["inspect", "--data", every.to_str().unwrap(), "--json"]);
    let every: serde_json::Value = serde_json::from_str(every.trim()).unwrap();
    assert_eq!(every["documents"], 3, "{every}");
    let tokens = dir.path().join("tokens");
    std::fs::create_dir_all(&tokens).unwrap();
    for name in ["a.bin", "b.bin"] {
        let ids: Vec<u8> = (0..100u16).flat_map(u16::to_le_bytes).collect();
        std::fs::write(tokens.join(name), ids).unwrap();
    }
    // One token file by a pattern is read as windows; several are refused as a job refuses
    // them (one source is one file), not for a pipeline nobody gave.
    let one = tokens.join("a*.bin");
    let windows = stdout_of(&["inspect", "--data", one.to_str().unwrap(), "--seq-len", "9"]);
    assert!(windows.contains("window"), "{windows}");
    let both = tokens.join("*.bin");
    let refused = stoker(&[
        "inspect",
        "--data",
        both.to_str().unwrap(),
        "--seq-len",
        "9",
    ]);
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && message.contains("a token source is one file"),
        "{message}"
    );
    // A `.bin` of uint32 ids is refused as a job refuses it (it was reported as uint16
    // tokens, twice as many); read as uint32 when told so.
    let wide = dir.path().join("wide.bin");
    let ids: Vec<u8> = (0..4096u32)
        .flat_map(|i| (70_000 + i).to_le_bytes())
        .collect();
    std::fs::write(&wide, ids).unwrap();
    let refused = stoker(&[
        "inspect",
        "--data",
        wide.to_str().unwrap(),
        "--seq-len",
        "9",
    ]);
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && message.contains("holds uint32 ids"),
        "{message}"
    );
    let told = ["--token-dtype", "uint32", "--seq-len", "9"];
    let report = stdout_of(&[&["inspect", "--data", wide.to_str().unwrap()], &told[..]].concat());
    assert!(
        report.contains("tokens    4096") && report.contains("uint32"),
        "{report}"
    );
}

/// An error's cause is said once, though the library's message quotes it.
#[test]
fn an_error_says_its_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = stoker(&[
        "make-tokens",
        "--tokens",
        "10",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("Is a directory").count(), 1, "{stderr}");
}

/// A Megatron corpus named by its `.idx` or its prefix (as by its `.bin`) is read as token
/// windows, and a
/// pattern is judged by the files it names: the report names the pipeline run.
#[test]
fn a_megatron_index_and_a_pattern_choose_the_token_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = write_megatron_corpus(dir.path());
    let by_index = prefix.with_extension("idx");
    let by_bin = prefix.with_extension("bin");
    let digest = |data: &Path| {
        let args = [
            "digest",
            "--data",
            data.to_str().unwrap(),
            "--seq-len",
            "16",
            "--batch-size",
            "4",
        ];
        let out = stdout_of(&args);
        out.lines().last().unwrap_or_default().to_string()
    };
    assert_eq!(digest(&by_index), digest(&by_bin));
    // By its prefix, as Megatron's --data-path names it.
    assert_eq!(digest(&prefix), digest(&by_bin));
    let pattern = dir.path().join("corpus_*.bin");
    let report = stdout_of(&[
        "bench",
        "--data",
        pattern.to_str().unwrap(),
        "--seq-len",
        "16",
        "--batch-size",
        "4",
        "--batches",
        "2",
        "--json",
    ]);
    assert!(report.contains("token-windows(16)"), "{report}");
}

#[test]
fn bench_coordinator_states_its_figures_with_the_journal_on() {
    let out = stdout_of(&[
        "bench",
        "coordinator",
        "--workers",
        "20",
        "--ranks",
        "64",
        "--ranks-per-job",
        "8",
        "--assignments",
        "20000",
        "--journal-every",
        "100",
        "--json",
    ]);
    assert!(out.contains("bytes per rank"), "{out}");
    let report: serde_json::Value = serde_json::from_str(last_line(&out).trim()).unwrap();
    assert_eq!(report["journal"], true);
    assert_eq!(report["jobs"], 8);
    assert!(report["assignments"].as_u64() >= Some(20000), "{report}");
    assert!(report["assignments_per_s"].as_f64() > Some(0.0), "{report}");
    // One commit per job registered, then the position writes (every 100 acks).
    assert!(
        report["journal_commits"].as_u64() >= Some(8 + 200),
        "{report}"
    );
    let memory = report["memory_bytes"].as_f64().unwrap();
    let per_rank = report["memory_bytes_per_rank"].as_f64().unwrap();
    assert!(
        memory > 0.0 && (per_rank - memory / 64.0).abs() < 1e-6,
        "{report}"
    );
}

/// The JSON rows of `stoker bench coordinator-grpc` with 2 workers, 2 ranks per job, one
/// second, and `extra`.
fn bench_grpc_rows(extra: &[&str]) -> Vec<serde_json::Value> {
    let args = [
        &[
            "bench",
            "coordinator-grpc",
            "--workers",
            "2",
            "--ranks-per-job",
            "2",
            "--seconds",
            "1",
            "--json",
        ][..],
        extra,
    ]
    .concat();
    let out = stdout_of(&args);
    let rows: serde_json::Value = serde_json::from_str(last_line(&out).trim()).unwrap();
    rows.as_array().expect("a JSON array of rows").clone()
}

#[test]
fn bench_coordinator_grpc_drives_a_real_coordinator() {
    // One row per control plane, the tree before and the batched one, from one run.
    let rows = bench_grpc_rows(&["--ranks", "4"]);
    let controls: Vec<_> = rows.iter().map(|r| r["control"].clone()).collect();
    assert_eq!(controls, ["before", "after"]);
    for report in &rows {
        assert_eq!(report["jobs"], 2);
        let assignments = report["assignments"].as_f64().unwrap();
        assert!(assignments > 0.0, "{report}");
        let cpu = report["coordinator_cpu_s"].as_f64().unwrap();
        assert!(cpu > 0.0, "the coordinator process worked: {report}");
        let per_core = report["assignments_per_coordinator_core_s"]
            .as_f64()
            .unwrap();
        assert!(
            (per_core - assignments / cpu).abs() < 1e-6 * per_core,
            "{report}"
        );
        let (p50, p99) = (
            report["lease_p50_us"].as_f64().unwrap(),
            report["lease_p99_us"].as_f64().unwrap(),
        );
        assert!(
            report["lease_calls"].as_u64() > Some(0) && p99 >= p50,
            "{report}"
        );
        // From when the work was there: reported, and measured (each lease's grant is found
        // by its step, `sim.rs`'s unit test).
        assert!(report["ready_p50_us"].as_f64() > Some(0.0), "{report}");
        assert!(report["ready_p99_us"].as_f64() > Some(0.0), "{report}");
        assert!(
            report["loopback_bytes_per_assignment"].as_f64() > Some(0.0),
            "{report}"
        );
    }

    // Sharded: each job at the coordinator its spec hashes to, every shard's CPU counted.
    let rows = bench_grpc_rows(&["--ranks", "16", "--shards", "2", "--control", "after"]);
    let report = &rows[0];
    assert_eq!(report["shards"], 2, "{report}");
    assert!(report["assignments"].as_u64() > Some(0), "{report}");
    let cpu: Vec<f64> = report["shard_cpu_s"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_f64().unwrap())
        .collect();
    assert_eq!(cpu.len(), 2, "{report}");
    let total = report["coordinator_cpu_s"].as_f64().unwrap();
    assert!((cpu.iter().sum::<f64>() - total).abs() < 1e-9, "{report}");
    let jobs: u64 = report["shard_jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j.as_u64().unwrap())
        .sum();
    assert_eq!(jobs, 8, "every job at one shard: {report}");

    // The coordinator on a core of its own, the simulators on the others (this machine has 2
    // or more; CI's has 2).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores >= 2 {
        let rows = bench_grpc_rows(&[
            "--ranks",
            "4",
            "--control",
            "after",
            "--coordinator-cores",
            "1",
        ]);
        let report = &rows[0];
        assert_eq!(report["machine_cores"], cores, "{report}");
        let listed = |key: &str| report[key].as_array().map_or(0, Vec::len);
        assert_eq!(
            (listed("coordinator_cores"), listed("simulator_cores")),
            (1, cores - 1)
        );
        assert!(report["coordinator_cpu_s"].as_f64() > Some(0.0), "{report}");
    }
}

#[test]
fn bench_formats_runs_every_format_against_its_baseline() {
    let out = stdout_of(&[
        "bench",
        "formats",
        "--images",
        "40",
        "--size",
        "32",
        "--tokens",
        "60000",
        "--seq-len",
        "128",
        "--rounds",
        "2",
        "--threads",
        "2",
        "--json",
    ]);
    let report: serde_json::Value = serde_json::from_str(last_line(&out).trim()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    let row = |name: &str| {
        rows.iter()
            .find(|row| row["format"] == name)
            .unwrap_or_else(|| panic!("no row {name}: {report}"))
    };
    for (name, baseline, samples) in [
        ("tar shards", None, 40),
        ("MDS (jpeg, int)", Some("tar shards"), 40),
        ("MDS zstd", Some("tar shards"), 40),
        ("token file", None, 468),
        ("Megatron", Some("token file"), 468),
        ("Megatron + documents", Some("token file"), 468),
        ("MDS tokens", Some("token file"), 468),
    ] {
        let row = row(name);
        // Every format read every sample, once per round.
        assert_eq!(row["samples"], samples, "{row}");
        assert_eq!(row["rounds_cpu_us_per_sample"].as_array().unwrap().len(), 2);
        let cpu = row["cpu_us_per_sample"].as_f64().unwrap();
        assert!(cpu > 0.0, "{row}");
        match baseline {
            None => assert!(row["over_baseline"].is_null(), "{row}"),
            Some(baseline) => {
                assert_eq!(row["baseline"], baseline);
                let base = self::row_cpu(rows, baseline);
                let ratio = row["over_baseline"].as_f64().unwrap();
                assert!((ratio - cpu / base).abs() < 1e-9 * ratio, "{row}");
            }
        }
    }
}

fn row_cpu(rows: &[serde_json::Value], name: &str) -> f64 {
    rows.iter()
        .find(|row| row["format"] == name)
        .and_then(|row| row["cpu_us_per_sample"].as_f64())
        .unwrap()
}

#[test]
fn demo_refuses_a_dashboard_off_loopback_without_a_credential() {
    let out = common::stoker(&["demo", "--seconds", "1", "--dashboard", "0.0.0.0:0"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("0.0.0.0:0") && stderr.contains("needs a dashboard credential"),
        "{stderr}"
    );
}

/// A lease-ahead past what a coordinator leases at once is refused as the worker starts: the
/// coordinator refused each lease, and the worker registered again and again, serving
/// nothing while its probe said ready.
#[test]
fn a_worker_leasing_ahead_past_the_coordinators_most_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(common::worker_binary())
        .args([
            "--coordinator",
            "127.0.0.1:1",
            "--lease-ahead",
            "5000",
            "--data-root",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--lease-ahead") && stderr.contains("4096"),
        "{stderr}"
    );
}

#[test]
fn a_worker_with_an_unusable_coordinator_address_exits_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(common::worker_binary())
        .args(["--coordinator", "no such address", "--data-root"])
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if child.try_wait().unwrap().is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the worker kept running with an address it cannot use");
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot use --coordinator"), "{stderr}");
    assert!(stderr.contains("no such address"), "{stderr}");
}

/// Parquet files beside a stray `notes.jsonl` read as Parquet in the loader and as JSONL in
/// `inspect` (which made `digest` ask for a tokenizer); an image folder with one stray Parquet
/// file trained on the Parquet rows alone. Now each is refused alike, naming both; tar shards
/// take such files as their metadata (img2dataset writes `00000.parquet` beside `00000.tar`).
#[test]
fn a_folder_of_two_formats_is_refused_alike_by_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("images");
    common::make_images(&images, 8);
    let (shards, parquet) = (dir.path().join("shards"), dir.path().join("parquet"));
    for (to, out) in [("tar", &shards), ("parquet", &parquet)] {
        stdout_of(&common::convert_args(&images, to, out, &[]));
    }
    // `inspect --image-column` is the column read (it was left out for Parquet).
    let refused = stoker(&[
        "inspect",
        "--data",
        parquet.to_str().unwrap(),
        "--image-column",
        "photo",
    ]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("photo"),
        "{stderr}"
    );
    let written = std::fs::read_dir(&parquet)
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    std::fs::copy(written.path(), images.join("stray.parquet")).unwrap();
    std::fs::copy(written.path(), shards.join("00000.parquet")).unwrap();
    std::fs::write(parquet.join("notes.jsonl"), "{\"text\": \"hello\"}\n").unwrap();
    for (folder, named) in [
        (&parquet, ["notes.jsonl (JSONL)", "(Parquet)"]),
        (
            &images,
            ["stray.parquet (Parquet)", "(a class folder of images)"],
        ),
    ] {
        for command in ["inspect", "digest"] {
            let refused = stoker(&[command, "--data", folder.to_str().unwrap()]);
            let stderr = String::from_utf8_lossy(&refused.stderr);
            assert!(!refused.status.success(), "{command} {folder:?}");
            assert!(
                stderr.contains("mixes formats") && named.iter().all(|n| stderr.contains(n)),
                "{command}: {stderr}"
            );
        }
    }
    let report = stdout_of(&["inspect", "--data", shards.to_str().unwrap()]);
    assert!(report.contains("(tar shards)"), "{report}");
}

/// `--shuffle-window` over an image folder (no shards) or with `--no-shuffle` did nothing,
/// silently: it is said.
#[test]
fn a_shuffle_window_that_is_not_used_is_said() {
    let dir = tempfile::tempdir().unwrap();
    common::make_images(dir.path(), 8);
    let data = dir.path().to_str().unwrap();
    for (extra, said) in [
        (None, "the source has no shards: shuffle_window is not used"),
        (
            Some("--no-shuffle"),
            "shuffle is off: shuffle_window is not used",
        ),
    ] {
        let mut args = vec![
            "digest",
            "--data",
            data,
            "--batch-size",
            "4",
            "--size",
            "32",
            "--shuffle-window",
            "2",
        ];
        args.extend(extra);
        let run = stoker(&args);
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(run.status.success() && stderr.contains(said), "{stderr}");
    }
}

/// An unreadable image is named by `inspect` (only `-vv` named it).
#[test]
fn inspect_names_the_unreadable_images() {
    let dir = tempfile::tempdir().unwrap();
    common::make_images(dir.path(), 8);
    let class = dir.path().join("class_01");
    std::fs::write(class.join("notes.jpg"), b"not an image").unwrap();
    std::fs::write(class.join("empty.png"), b"").unwrap();
    let report = stdout_of(&["inspect", "--data", dir.path().to_str().unwrap()]);
    assert!(report.contains("unreadable:"), "{report}");
    for name in ["notes.jpg", "empty.png"] {
        assert!(
            report.lines().any(|line| line.trim_start().ends_with(name)),
            "{name}: {report}"
        );
    }
    let json = stdout_of(&["inspect", "--data", dir.path().to_str().unwrap(), "--json"]);
    let value: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(
        value["unreadable"].as_array().map(Vec::len),
        Some(2),
        "{value}"
    );
}

/// A coordinator on a journal cut short stops with the error naming it, without redb's panic
/// message and backtrace printed before it as a crash's would be.
#[test]
fn a_damaged_journal_is_an_error_not_a_printed_panic() {
    let state = tempfile::tempdir().unwrap();
    drop(stoker_coordinator::CoordinatorService::open(state.path(), Default::default()).unwrap());
    let journal = state.path().join(stoker_coordinator::JOURNAL_FILE);
    let whole = std::fs::read(&journal).unwrap();
    std::fs::write(&journal, &whole[..3000.min(whole.len() / 2)]).unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_stoker"))
        .args(["coordinator", "--listen", "127.0.0.1:0", "--state"])
        .arg(state.path())
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "{stderr}");
    assert!(
        stderr.contains("coordinator.redb is damaged")
            && !stderr.contains("thread 'main'")
            && !stderr.contains("stack backtrace"),
        "{stderr}"
    );
}
