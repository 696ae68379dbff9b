//! `stoker bench`: end-to-end images/s, CPU seconds per image, time to first batch, peak RSS,
//! where the time goes, and the decode floor (a plain full decode of the same images). On token
//! files and JSONL text it also reports tokens/s (the floor applies to images only).

use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use rayon::prelude::*;
use serde::Serialize;
use stoker_datasets::CacheStats;
use stoker_pipeline::open_source;
use stoker_pipeline::{decode, read_header, DecodeRequest, DecodedImage, DEFAULT_MAX_PIXELS};
use stoker_proto::v1::JobSpec;

use super::resources::usage;
use super::{Error, Result};
use stoker_loader::{Loader, LoaderOptions};

/// Settings of `stoker bench` beyond the job it runs.
#[derive(Debug, Clone, Args)]
pub struct PipelineBench {
    /// Decode threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Batches to run (0: one whole epoch).
    #[arg(long, default_value_t = 0)]
    pub batches: u64,
    /// Images of the decode-floor measurement (at most; 0 to skip it).
    #[arg(long, default_value_t = 1000)]
    pub floor_images: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The figures `stoker bench --json` prints.
#[derive(Debug, Serialize)]
struct BenchReport {
    pipeline: String,
    batch_size: u32,
    threads: usize,
    batches: u64,
    images: u64,
    wall_s: f64,
    images_per_s: f64,
    cpu_s: f64,
    cpu_s_per_image: f64,
    images_per_cpu_s: f64,
    first_batch_ms: f64,
    peak_rss_mb: f64,
    stage_ms_per_image: Stages,
    decode_floor_s_per_image: Option<f64>,
    pipeline_over_floor: Option<f64>,
    bad_samples: u64,
    /// The object cache's counters, for `s3://` datasets.
    object_cache: Option<CacheStats>,
    /// Token pipelines: training tokens delivered (batch x seq_len per batch).
    tokens: Option<u64>,
    tokens_per_s: Option<f64>,
}

/// Training tokens in a batch: `batch x seq_len` of its `tokens` (windows of seq_len + 1) or
/// `input_ids` tensor; `None` for image batches.
fn batch_tokens(batch: &stoker_loader::Batch) -> Option<u64> {
    batch
        .tensors
        .iter()
        .find_map(|t| match (t.name.as_str(), t.shape.as_slice()) {
            ("tokens", [rows, window]) => Some(rows * window.saturating_sub(1)),
            ("input_ids", [rows, seq_len]) => Some(rows * seq_len),
            _ => None,
        })
}

#[derive(Debug, Serialize)]
struct Stages {
    read: f64,
    decode: f64,
    augment: f64,
    assemble: f64,
}

/// Runs `spec` (whose image pipeline is called `pipeline` in the report) and prints the
/// report.
pub fn run(spec: &JobSpec, pipeline: &str, args: &PipelineBench) -> Result<()> {
    let wall_start = Instant::now();
    let usage_start = usage();
    let loader = Loader::new(
        spec.clone(),
        LoaderOptions {
            threads: args.threads,
            ..LoaderOptions::default()
        },
    )?;
    let steps = loader.steps_per_epoch();
    if steps == 0 {
        return Err(Error::InvalidArgument(
            "an epoch of this job holds no batch (fewer samples than one batch with \
             --drop-last, or than the ranks): nothing to benchmark"
                .into(),
        ));
    }
    let batches = if args.batches == 0 {
        steps
    } else {
        args.batches
    };
    let mut images = 0u64;
    let mut tokens: Option<u64> = None;
    let mut first_batch = None;
    let mut indices = Vec::new();
    let mut done = 0u64;
    let mut epoch = 0u64;
    'epochs: loop {
        let mut stream = loader.epoch(epoch, 0)?;
        while let Some(batch) = stream.next_batch()? {
            first_batch.get_or_insert_with(|| wall_start.elapsed());
            images += batch.sample_indices.len() as u64;
            if let Some(count) = batch_tokens(&batch) {
                *tokens.get_or_insert(0) += count;
            }
            if tokens.is_none() && (indices.len() as u64) < args.floor_images {
                indices.extend_from_slice(&batch.sample_indices);
            }
            done += 1;
            if done >= batches {
                break 'epochs;
            }
        }
        epoch += 1;
    }
    let wall = wall_start.elapsed();
    let usage_end = usage();
    let stats = loader.stats();
    let object_cache = loader.cache_stats();
    drop(loader);
    let cpu = (usage_end.cpu - usage_start.cpu).as_secs_f64();
    let per_image_ms = |seconds: f64| seconds * 1e3 / images.max(1) as f64;

    indices.truncate(args.floor_images as usize);
    let floor = if indices.is_empty() {
        None
    } else {
        Some(decode_floor(spec, args.threads, &indices)?)
    };
    let cpu_s_per_image = cpu / images.max(1) as f64;
    let report = BenchReport {
        pipeline: pipeline.to_string(),
        batch_size: spec.batch_size,
        threads: stats_threads(args.threads),
        batches: done,
        images,
        wall_s: wall.as_secs_f64(),
        images_per_s: images as f64 / wall.as_secs_f64(),
        cpu_s: cpu,
        cpu_s_per_image,
        images_per_cpu_s: images as f64 / cpu.max(1e-9),
        first_batch_ms: first_batch.map_or(0.0, |d| d.as_secs_f64() * 1e3),
        peak_rss_mb: usage_end.peak_rss_bytes as f64 / (1024.0 * 1024.0),
        stage_ms_per_image: Stages {
            read: per_image_ms(stats.read_s),
            decode: per_image_ms(stats.decode_s),
            augment: per_image_ms(stats.augment_s),
            assemble: per_image_ms(stats.assemble_s),
        },
        decode_floor_s_per_image: floor,
        pipeline_over_floor: floor.map(|f| cpu_s_per_image / f),
        bad_samples: stats.bad_samples,
        tokens,
        tokens_per_s: tokens.map(|t| t as f64 / wall.as_secs_f64()),
        object_cache,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report);
    }
    Ok(())
}

fn stats_threads(requested: usize) -> usize {
    if requested == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        requested
    }
}

/// CPU seconds per image of a plain full-size decode of `indices`, on the same thread count.
fn decode_floor(spec: &JobSpec, threads: usize, indices: &[u64]) -> Result<f64> {
    let dataset = spec
        .dataset
        .as_ref()
        .ok_or_else(|| Error::InvalidArgument("job has no dataset".into()))?;
    let source = open_source(dataset, &spec.pipeline)?;
    let bytes: Vec<Vec<u8>> = indices
        .iter()
        .filter_map(|&i| source.read(i).ok())
        .collect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(stats_threads(threads))
        .build()
        .map_err(|e| Error::Failed(format!("cannot start decode threads: {e}")))?;
    let bytes = Arc::new(bytes);
    let before = usage();
    let decoded: usize = pool.install(|| {
        bytes
            .par_iter()
            .map_init(DecodedImage::default, |image, data| {
                let Ok(header) = read_header(data, DEFAULT_MAX_PIXELS) else {
                    return 0;
                };
                let request = DecodeRequest {
                    region: None,
                    target: (header.width, header.height),
                    allow_dct_scaling: false,
                    max_pixels: DEFAULT_MAX_PIXELS,
                };
                usize::from(decode(data, &header, &request, image).is_ok())
            })
            .sum()
    });
    let cpu = (usage().cpu - before.cpu).as_secs_f64();
    Ok(cpu / decoded.max(1) as f64)
}

fn print_report(r: &BenchReport) {
    let unit = if r.tokens.is_some() {
        "samples"
    } else {
        "images"
    };
    println!(
        "pipeline {}  batch {}  threads {}  batches {}  {unit} {}",
        r.pipeline, r.batch_size, r.threads, r.batches, r.images
    );
    println!(
        "throughput        {:.0} {unit}/s ({:.2} s wall)",
        r.images_per_s, r.wall_s
    );
    if let (Some(tokens), Some(per_s)) = (r.tokens, r.tokens_per_s) {
        println!(
            "tokens            {:.1} M tokens/s ({tokens} tokens)",
            per_s / 1e6
        );
    }
    println!(
        "cpu               {:.3} ms/image ({:.0} images per CPU-second)",
        r.cpu_s_per_image * 1e3,
        r.images_per_cpu_s
    );
    println!("first batch       {:.0} ms", r.first_batch_ms);
    println!("peak rss          {:.0} MiB", r.peak_rss_mb);
    let s = &r.stage_ms_per_image;
    println!(
        "stages (ms/image) read {:.3}  decode {:.3}  augment {:.3}  assemble {:.3}",
        s.read, s.decode, s.augment, s.assemble
    );
    if let (Some(floor), Some(over)) = (r.decode_floor_s_per_image, r.pipeline_over_floor) {
        println!(
            "decode floor      {:.3} ms/image (full decode); pipeline costs {:.2}x the floor",
            floor * 1e3,
            over
        );
    }
    if r.bad_samples > 0 {
        println!("bad samples       {} replaced", r.bad_samples);
    }
    if let Some(cache) = &r.object_cache {
        println!("{cache}");
        if cache.hits + cache.misses > 0 {
            println!(
                "cache hit rate    {:.1}% of reads ({} ranges read ahead)",
                100.0 * cache.hit_rate(),
                cache.read_ahead
            );
        }
    }
}
