//! `stoker bench formats`: the CPU one sample costs when read from peers' formats beside the
//! same samples in Stoker's own, side by side in one run. The same images as tar shards (the
//! baseline) and as Mosaic Streaming's MDS shards, plain and zstd-compressed, through the same
//! image pipeline; the same tokens as a flat token file (the baseline) and as a Megatron
//! corpus, with and without its document boundaries, and as an MDS `ndarray` token column,
//! through the same token windows. Runs interleave (each round runs every format once, every
//! other round in reverse order) and each format's figure is its median round.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use serde::Serialize;
use stoker_datasets::{
    generate_imagenet_like, write_mds, write_megatron_corpus, write_tar_shards, ImageFolder,
    MdsColumn, SampleSource, SyntheticImageNetSpec, TarShardsWriterOptions, TokenDtype,
};
use stoker_pipeline::presets;
use stoker_proto::v1::{self as proto, op::Op as OpKind, JobSpec};

use super::resources::usage;
use super::{Error, Result};
use stoker_loader::{Loader, LoaderOptions};

/// Settings of `stoker bench formats`.
#[derive(Debug, Clone, Args)]
pub struct FormatsBench {
    /// An image folder whose images are written in each format (default: a synthetic one of
    /// `--images` images, made in a temporary folder).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Images of the synthetic folder.
    #[arg(long, default_value_t = 2000)]
    pub images: u64,
    /// Output image size (square) of the image pipeline (imagenet-train).
    #[arg(long, default_value_t = 224)]
    pub size: u32,
    /// Tokens written in each token format (uint16 ids, documents of 50 to 4,000 tokens).
    #[arg(long, default_value_t = 20_000_000)]
    pub tokens: u64,
    /// Window length of the token formats.
    #[arg(long, default_value_t = 2048)]
    pub seq_len: u32,
    /// Rounds (each runs every format once).
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// Decode threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// One format's figures.
#[derive(Debug, Serialize)]
struct FormatRow {
    format: String,
    /// What it is measured against (`None` for a baseline).
    baseline: Option<String>,
    samples: u64,
    /// The median round's CPU seconds (all threads) per sample, and its rounds'.
    cpu_us_per_sample: f64,
    rounds_cpu_us_per_sample: Vec<f64>,
    samples_per_s: f64,
    /// `cpu_us_per_sample` over the baseline's.
    over_baseline: Option<f64>,
}

/// What `stoker bench formats --json` prints.
#[derive(Debug, Serialize)]
struct FormatsReport {
    threads: usize,
    rounds: u32,
    images: u64,
    tokens: u64,
    seq_len: u32,
    rows: Vec<FormatRow>,
}

/// A format to run: its name, the baseline it is held against, and its job.
struct Case {
    name: &'static str,
    baseline: Option<&'static str>,
    spec: JobSpec,
}

/// One run of `spec`, one whole epoch: samples, CPU seconds, wall seconds. The process's CPU
/// is counted, so the run starts after a pause that lets the previous run's threads finish.
fn run_once(spec: &JobSpec, threads: usize) -> Result<(u64, f64, f64)> {
    std::thread::sleep(std::time::Duration::from_millis(300));
    let started = Instant::now();
    let before = usage();
    let loader = Loader::new(
        spec.clone(),
        LoaderOptions {
            threads,
            ..LoaderOptions::default()
        },
    )?;
    let mut samples = 0u64;
    let mut stream = loader.epoch(0, 0)?;
    while let Some(batch) = stream.next_batch()? {
        samples += batch.sample_indices.len() as u64;
    }
    drop(stream);
    drop(loader);
    let cpu = (usage().cpu - before.cpu).as_secs_f64();
    Ok((samples, cpu, started.elapsed().as_secs_f64()))
}

fn spec(uri: &Path, format: proto::DatasetFormat, pipeline: Vec<proto::Op>, batch: u32) -> JobSpec {
    JobSpec {
        dataset: Some(proto::DatasetSource {
            uri: uri.to_string_lossy().into_owned(),
            format: format as i32,
            ..Default::default()
        }),
        pipeline,
        batch_size: batch,
        seed: 7,
        shuffle: true,
        drop_last: false,
        rank: 0,
        world_size: 1,
        uneven_tail: proto::UnevenTail::Pad as i32,
        on_error: proto::BadSamplePolicy::Fail as i32,
        shuffle_window: 0,
        resized_epoch: None,
        mix: None,
    }
}

fn windows(seq_len: u32, document_boundaries: bool) -> Vec<proto::Op> {
    vec![proto::Op {
        op: Some(OpKind::TokenWindows(proto::TokenWindows {
            seq_len,
            document_boundaries,
        })),
    }]
}

fn failed(what: &str) -> impl Fn(stoker_datasets::Error) -> Error + '_ {
    move |error| Error::Failed(format!("{what}: {error}"))
}

/// Writes the image folder's images as tar shards and as MDS shards (plain and zstd) under
/// `dir`; the cases reading them.
fn image_cases(folder: &Path, dir: &Path, size: u32) -> Result<(u64, Vec<Case>)> {
    let images = ImageFolder::open(folder).map_err(failed("the image folder"))?;
    let tar = dir.join("tar");
    let options = TarShardsWriterOptions {
        shard_bytes: 64 << 20,
    };
    write_tar_shards(&images, &tar, &options, &|_| {}).map_err(failed("tar shards"))?;
    let columns = [
        MdsColumn {
            name: "image".into(),
            encoding: "jpeg".into(),
            size: None,
        },
        MdsColumn {
            name: "label".into(),
            encoding: "int".into(),
            size: Some(8),
        },
    ];
    let rows = (0..images.len())
        .map(|k| {
            Ok(vec![
                images.read(k)?,
                images.label(k).to_le_bytes().to_vec(),
            ])
        })
        .collect::<stoker_datasets::Result<Vec<_>>>()
        .map_err(failed("the images"))?;
    // Streaming's default shard size is 64 MiB: about 600 of ImageNet's images.
    let per_shard = 600;
    let mds = dir.join("mds");
    write_mds(&mds, &columns, &rows, per_shard, None).map_err(failed("MDS shards"))?;
    let mds_zstd = dir.join("mds-zstd");
    write_mds(&mds_zstd, &columns, &rows, per_shard, Some("zstd")).map_err(failed("MDS"))?;
    let pipeline = presets::imagenet_train(size);
    let case = |name, baseline, uri: &Path, format| Case {
        name,
        baseline,
        spec: spec(uri, format, pipeline.clone(), 64),
    };
    use proto::DatasetFormat as F;
    Ok((
        images.len(),
        vec![
            case("tar shards", None, &tar, F::TarShards),
            case("MDS (jpeg, int)", Some("tar shards"), &mds, F::Mds),
            case("MDS zstd", Some("tar shards"), &mds_zstd, F::Mds),
        ],
    ))
}

/// Writes `tokens` uint16 ids as a flat token file, a Megatron corpus and an MDS token column
/// under `dir`; the cases reading them.
fn token_cases(tokens: u64, seq_len: u32, dir: &Path) -> Result<Vec<Case>> {
    // Documents of 50 to 4,000 tokens (a fixed sequence, not random: the same every run).
    let mut documents: Vec<Vec<u32>> = Vec::new();
    let mut written = 0u64;
    let mut state = 0x9e37_79b9_u64;
    while written < tokens {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        let length = (50 + (state >> 33) % 3_951).min(tokens - written);
        let document = (0..length)
            .map(|t| ((state >> 16).wrapping_add(t * 7_919) % 50_000) as u32)
            .collect();
        documents.push(document);
        written += length;
    }
    let megatron = dir.join("corpus_text_document");
    let (bin, _) = write_megatron_corpus(&megatron, &documents, TokenDtype::Uint16)
        .map_err(failed("the Megatron corpus"))?;
    let flat_dir = dir.join("flat");
    std::fs::create_dir_all(&flat_dir)?;
    let flat = flat_dir.join("tokens.bin");
    std::fs::copy(&bin, &flat)?;
    let column = [MdsColumn {
        name: "tokens".into(),
        encoding: "ndarray:uint16".into(),
        size: None,
    }];
    let rows: Vec<Vec<Vec<u8>>> = documents
        .iter()
        .map(|document| {
            // A one-axis shape header (uint16 lengths), then the ids.
            let mut bytes = vec![(1 << 2) | 1];
            bytes.extend_from_slice(&(document.len() as u16).to_le_bytes());
            for &id in document {
                bytes.extend_from_slice(&(id as u16).to_le_bytes());
            }
            vec![bytes]
        })
        .collect();
    let mds = dir.join("mds-tokens");
    write_mds(&mds, &column, &rows, 20_000, None).map_err(failed("MDS tokens"))?;
    use proto::DatasetFormat as F;
    let case = |name, baseline, uri: &Path, format, boundaries| Case {
        name,
        baseline,
        spec: spec(uri, format, windows(seq_len, boundaries), 16),
    };
    Ok(vec![
        case("token file", None, &flat, F::TokenFile, false),
        case("Megatron", Some("token file"), &bin, F::TokenFile, false),
        case(
            "Megatron + documents",
            Some("token file"),
            &bin,
            F::TokenFile,
            true,
        ),
        case("MDS tokens", Some("token file"), &mds, F::Mds, false),
    ])
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

/// Writes the formats, runs them side by side and prints the report.
pub fn run(args: &FormatsBench) -> Result<()> {
    if args.rounds == 0 || args.images == 0 || args.seq_len == 0 {
        return Err(Error::InvalidArgument(
            "--rounds, --images and --seq-len must be at least 1".into(),
        ));
    }
    if args.tokens <= u64::from(args.seq_len) {
        return Err(Error::InvalidArgument(
            "--tokens must be more than --seq-len".into(),
        ));
    }
    let dir = tempfile::tempdir()?;
    // Derived copies (zstd shards decompressed, MDS tokens) go to a cache of this run's own.
    std::env::set_var("STOKER_CACHE_DIR", dir.path().join("cache"));
    let folder = match &args.data {
        Some(folder) => folder.clone(),
        None => {
            let folder = dir.path().join("images");
            let spec = SyntheticImageNetSpec {
                count: args.images,
                seed: 5,
                classes: 10,
            };
            generate_imagenet_like(&folder, &spec, &|_| {})
                .map_err(failed("the synthetic images"))?;
            folder
        }
    };
    let (images, mut cases) = image_cases(&folder, dir.path(), args.size)?;
    cases.extend(token_cases(args.tokens, args.seq_len, dir.path())?);
    // A first run of each opens its files, fills the page cache and makes the cache tier's
    // copies; it is not counted.
    for case in &cases {
        run_once(&case.spec, args.threads)?;
    }
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut figures = vec![(0u64, 0.0f64); cases.len()];
    for round in 0..args.rounds {
        // Every other round runs the formats in reverse, so none always follows the same one.
        let mut order: Vec<usize> = (0..cases.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for k in order {
            let case = &cases[k];
            let (samples, cpu_s, wall_s) = run_once(&case.spec, args.threads)?;
            cpu[k].push(cpu_s * 1e6 / samples.max(1) as f64);
            figures[k] = (samples, samples as f64 / wall_s.max(1e-9));
        }
    }
    let medians: Vec<f64> = cpu.iter().map(|rounds| median(rounds)).collect();
    let rows = cases
        .iter()
        .enumerate()
        .map(|(k, case)| {
            let baseline = case
                .baseline
                .and_then(|name| cases.iter().position(|c| c.name == name));
            FormatRow {
                format: case.name.to_string(),
                baseline: case.baseline.map(str::to_string),
                samples: figures[k].0,
                cpu_us_per_sample: medians[k],
                rounds_cpu_us_per_sample: cpu[k].clone(),
                samples_per_s: figures[k].1,
                over_baseline: baseline.map(|b| medians[k] / medians[b].max(1e-12)),
            }
        })
        .collect();
    let report = FormatsReport {
        threads: args.threads,
        rounds: args.rounds,
        images,
        tokens: args.tokens,
        seq_len: args.seq_len,
        rows,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!(
        "{} images at {}px, {} tokens in windows of {}; median of {} rounds, CPU of all threads",
        report.images, args.size, report.tokens, report.seq_len, report.rounds
    );
    println!(
        "{:<22} {:>9} {:>14} {:>12} {:>14}",
        "format", "samples", "CPU us/sample", "samples/s", "vs baseline"
    );
    for row in &report.rows {
        let versus = match (&row.baseline, row.over_baseline) {
            (Some(name), Some(ratio)) => format!("{ratio:.3}x {name}"),
            _ => "baseline".to_string(),
        };
        println!(
            "{:<22} {:>9} {:>14.2} {:>12.0} {:>14}",
            row.format, row.samples, row.cpu_us_per_sample, row.samples_per_s, versus
        );
    }
    Ok(())
}
