//! `stoker bench stall`: the real embedded loader feeding a simulated training loop whose step
//! time is constant, jittered or bursty, with decode capacity set just above the demand. Prints
//! stall % and peak buffered bytes for the prefetch controller (`auto`) beside fixed depths 2
//! (PyTorch's default prefetch) and 8.
//!
//! Capacity is set by a synthetic source whose reads sleep a fixed time per sample: the decode
//! threads are then busy for a known time per batch whatever the machine, so "capacity 1.1x
//! demand" means the same thing everywhere.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use stoker_datasets::SampleSource;
use stoker_pipeline::Job;
use stoker_proto::v1::{self as proto, op::Op as OpKind, JobSpec};

use super::{Error, Result};
use stoker_loader::{Loader, LoaderOptions};

/// Settings of `stoker bench stall`.
#[derive(Debug, Clone, Args)]
pub struct StallBench {
    /// Steps per run (after the first batch).
    #[arg(long, default_value_t = 500)]
    pub steps: u64,
    /// Leading steps left out of the stall figure: the controller learns the pattern there
    /// (fixed depths get the same allowance).
    #[arg(long, default_value_t = 100)]
    pub warmup_steps: u64,
    /// Mean simulated step time in milliseconds.
    #[arg(long, default_value_t = 10.0)]
    pub step_ms: f64,
    /// Decode capacity as a multiple of the demand.
    #[arg(long, default_value_t = 1.1)]
    pub capacity: f64,
    /// Samples per batch.
    #[arg(long, default_value_t = 32)]
    pub batch_size: u32,
    /// Decode threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Memory budget for prefetched batches, in batches.
    #[arg(long, default_value_t = 48)]
    pub budget_batches: u64,
    /// Fixed depths to compare with the controller.
    #[arg(long, value_delimiter = ',', default_value = "2,8")]
    pub fixed: Vec<usize>,
    /// Print the JSON object alone (without it, the table comes before it; it is the last
    /// line either way).
    #[arg(long)]
    pub json: bool,
}

const SIDE: u32 = 48;

/// Every sample is the same small PNG, read after a fixed delay.
struct PacedSource {
    image: Vec<u8>,
    delay: Duration,
    len: u64,
    classes: Vec<String>,
}

impl SampleSource for PacedSource {
    fn len(&self) -> u64 {
        self.len
    }
    fn label(&self, index: u64) -> i64 {
        (index % 10) as i64
    }
    fn describe(&self, index: u64) -> String {
        format!("paced://{index}")
    }
    fn read(&self, _index: u64) -> stoker_datasets::Result<Vec<u8>> {
        pace(self.delay);
        Ok(self.image.clone())
    }
    fn class_names(&self) -> &[String] {
        &self.classes
    }
}

thread_local! {
    static NEXT_DUE: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

/// Holds each decode thread to one read per `delay` on average. Sleeps overshoot by tens of
/// microseconds, so each thread keeps a due time and sleeps until it: an overshoot is paid back
/// by the next read instead of lowering the capacity. Idle time is not banked beyond one delay.
fn pace(delay: Duration) {
    let now = Instant::now();
    let due = NEXT_DUE.with(|next| {
        let due = match next.get() {
            Some(previous) if previous + delay > now => previous + delay,
            _ => now + delay,
        };
        next.set(Some(due));
        due
    });
    if let Some(wait) = due.checked_duration_since(Instant::now()) {
        std::thread::sleep(wait);
    }
}

fn tiny_png() -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut bytes, SIDE, SIDE);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header()?;
        let pixels: Vec<u8> = (0..SIDE * SIDE * 3).map(|i| (i * 7 % 251) as u8).collect();
        writer.write_image_data(&pixels)?;
    }
    Ok(bytes)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
enum Pattern {
    Constant,
    Jittered,
    Bursty,
}

/// Every this many steps the bursty loop takes a long step (evaluation, checkpoint).
const BURST_EVERY: u64 = 25;
const BURST_FACTOR: f64 = 10.0;

impl Pattern {
    /// Step time of `step`, with mean 1 over a period.
    fn step_factor(self, step: u64, noise: &mut u64) -> f64 {
        match self {
            Pattern::Constant => 1.0,
            Pattern::Jittered => {
                *noise = noise
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                0.5 + (*noise >> 11) as f64 / (1u64 << 53) as f64
            }
            Pattern::Bursty => {
                // Normalised so the mean over a period is 1, like the other two.
                let mean = (BURST_EVERY as f64 - 1.0 + BURST_FACTOR) / BURST_EVERY as f64;
                if step % BURST_EVERY == BURST_EVERY - 1 {
                    BURST_FACTOR / mean
                } else {
                    1.0 / mean
                }
            }
        }
    }
}

#[derive(Debug, Serialize)]
struct RunResult {
    stall_pct: f64,
    peak_bytes: u64,
    final_depth: usize,
}

fn run_one(args: &StallBench, pattern: Pattern, prefetch: usize) -> Result<RunResult> {
    let step = Duration::from_secs_f64(args.step_ms / 1e3);
    // Threads x (1 / delay) samples per second = capacity x batch / step.
    let per_sample = Duration::from_secs_f64(
        args.threads as f64 * step.as_secs_f64() / (args.capacity * f64::from(args.batch_size)),
    );
    let source = Arc::new(PacedSource {
        image: tiny_png()?,
        delay: per_sample,
        len: u64::from(args.batch_size) * (args.steps + 64),
        classes: (0..10).map(|c| format!("class_{c}")).collect(),
    });
    let op = |kind| proto::Op { op: Some(kind) };
    let spec = JobSpec {
        dataset: Some(proto::DatasetSource {
            uri: "paced://".into(),
            format: 0,
            ..Default::default()
        }),
        pipeline: vec![
            op(OpKind::DecodeImage(proto::DecodeImage::default())),
            op(OpKind::CenterCrop(proto::CenterCrop {
                height: SIDE,
                width: SIDE,
            })),
        ],
        batch_size: args.batch_size,
        shuffle: false,
        world_size: 1,
        ..JobSpec::default()
    };
    let job = Job::with_source(spec, source)?;
    let batch_bytes = job.batch_bytes(args.batch_size as usize) as u64;
    let loader = Loader::from_job(
        job,
        LoaderOptions {
            threads: args.threads,
            prefetch,
            max_prefetch_bytes: batch_bytes * args.budget_batches,
            deadline: Duration::from_secs(60),
            max_held_batches: 1,
            ..LoaderOptions::default()
        },
    )?;
    let mut stream = loader.epoch(0, 0)?;
    // The first batch fills the pipeline: that is start-up time, not stall.
    drop(
        stream
            .next_batch()?
            .ok_or_else(|| Error::Failed("empty epoch".into()))?,
    );
    let slot_bytes = loader.slots().slot_bytes() as u64;
    let mut noise = 0x5eed_u64;
    let mut waited = Duration::ZERO;
    let mut peak_bytes = 0u64;
    let mut started = Instant::now();
    for index in 0..args.steps {
        if index == args.warmup_steps.min(args.steps.saturating_sub(1)) {
            waited = Duration::ZERO;
            started = Instant::now();
        }
        let factor = pattern.step_factor(index, &mut noise);
        std::thread::sleep(step.mul_f64(factor));
        let before = Instant::now();
        let batch = stream
            .next_batch()?
            .ok_or_else(|| Error::Failed("epoch ended early".into()))?;
        waited += before.elapsed();
        // Buffered: every slot taken, the one just handed over included.
        peak_bytes = peak_bytes.max(loader.slots().in_use() as u64 * slot_bytes);
        drop(batch);
    }
    let total = started.elapsed();
    Ok(RunResult {
        stall_pct: 100.0 * waited.as_secs_f64() / total.as_secs_f64(),
        peak_bytes,
        final_depth: loader.prefetch_depth(),
    })
}

/// Runs every pattern under the controller and each fixed depth, and prints the report.
pub fn run(args: &StallBench) -> Result<()> {
    if !(args.capacity > 0.0 && args.step_ms > 0.0) {
        return Err(Error::InvalidArgument(
            "--capacity and --step-ms must be positive".into(),
        ));
    }
    let batch_bytes = u64::from(SIDE * SIDE * 3) * u64::from(args.batch_size);
    let budget_bytes = batch_bytes * args.budget_batches;
    let mut configs = vec![("auto".to_string(), 0usize)];
    for depth in &args.fixed {
        if *depth == 0 {
            return Err(Error::InvalidArgument(
                "--fixed depths must be positive".into(),
            ));
        }
        configs.push((format!("fixed{depth}"), *depth));
    }
    let mut results: BTreeMap<Pattern, BTreeMap<String, RunResult>> = BTreeMap::new();
    if !args.json {
        println!(
            "simulated step {} ms, capacity {:.2}x demand, batch {}, {} threads, budget {} batches ({} bytes), stall over steps {}..{}",
            args.step_ms, args.capacity, args.batch_size, args.threads, args.budget_batches, budget_bytes, args.warmup_steps, args.steps
        );
        println!(
            "{:<10} {:<7} {:>8} {:>12} {:>6}",
            "pattern", "depth", "stall %", "peak bytes", "depth"
        );
    }
    for pattern in [Pattern::Constant, Pattern::Jittered, Pattern::Bursty] {
        for (name, prefetch) in &configs {
            let (name, prefetch) = (name.clone(), *prefetch);
            let result = run_one(args, pattern, prefetch)?;
            if !args.json {
                println!(
                    "{:<10} {:<7} {:>8.2} {:>12} {:>6}",
                    format!("{pattern:?}").to_lowercase(),
                    name,
                    result.stall_pct,
                    result.peak_bytes,
                    result.final_depth
                );
            }
            results.entry(pattern).or_default().insert(name, result);
        }
    }
    let report = serde_json::json!({
        "budget_bytes": budget_bytes,
        "patterns": results.iter().map(|(pattern, runs)| {
            let name = format!("{pattern:?}").to_lowercase();
            let runs: serde_json::Map<String, serde_json::Value> = runs.iter().map(|(config, r)| {
                (config.clone(), serde_json::json!({"stall_pct": r.stall_pct, "peak_bytes": r.peak_bytes}))
            }).collect();
            (name, serde_json::Value::Object(runs))
        }).collect::<serde_json::Map<_, _>>(),
    });
    println!("{report}");
    Ok(())
}
