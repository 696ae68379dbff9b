//! Argument parsing and dispatch of the `stoker` subcommands.

mod bench;
mod bench_coordinator;
mod bench_stall;
mod convert;
mod demo;
mod digest;
mod inspect;
mod make_dataset;
mod resources;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use stoker_proto::v1::{self as proto, BadSamplePolicy, JobSpec};

/// Stoker: a data loader that keeps GPUs fed.
#[derive(Debug, Parser)]
#[command(name = "stoker", version, about, long_about = None)]
pub struct Cli {
    /// Log more (-v: info, -vv: debug). RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the embedded loader against a simulated training step, printing throughput and stall.
    Demo(demo::DemoArgs),
    /// Measure end-to-end throughput, CPU cost, first-batch time, memory, and the decode floor.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Bench(bench::BenchArgs),
    /// Print the SHA-256 of the first K batches (last line), to check reproducibility.
    Digest(digest::DigestArgs),
    /// Rewrite an ImageFolder as tar shards (WebDataset layout), sample for sample.
    Convert(convert::ConvertArgs),
    /// Describe a dataset: samples, classes, formats, sizes.
    Inspect(inspect::InspectArgs),
    /// Write a seeded ImageNet-like sample set (JPEG/PNG class folders).
    MakeDataset(make_dataset::MakeDatasetArgs),
}

/// Sets up `tracing` on stderr.
pub fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// Runs the chosen subcommand.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Digest(args) => digest::run(args),
        Command::Convert(args) => convert::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::MakeDataset(args) => make_dataset::run(args),
    }
}

/// What to do with unreadable samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnError {
    /// Replace the sample with the next readable one, count and log it.
    Skip,
    /// Stop with an error naming the sample.
    Fail,
}

/// Options shared by the commands that run a job.
#[derive(Debug, Args)]
pub struct JobArgs {
    /// Dataset: an ImageFolder root (class folders of JPEG/PNG files), or a folder of
    /// WebDataset-style `.tar` shards (or one `.tar`), or `s3://BUCKET/PREFIX` of `.tar` shards
    /// (read through the local cache: STOKER_CACHE_DIR, STOKER_CACHE_MAX_BYTES, AWS_*). Required.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Pipeline preset.
    #[arg(long, default_value = "imagenet-train", value_parser = ["imagenet-train", "imagenet-eval"])]
    pub pipeline: String,
    /// Output image size (square).
    #[arg(long, default_value_t = 224)]
    pub size: u32,
    /// Samples per batch.
    #[arg(long, default_value_t = 64)]
    pub batch_size: u32,
    /// Seed of the shuffle and of every augmentation.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Keep dataset order.
    #[arg(long)]
    pub no_shuffle: bool,
    /// Drop each rank's last partial batch.
    #[arg(long)]
    pub drop_last: bool,
    /// Shards per shuffle window for tar shards (0: global shuffle; W >= 1: shuffle the shard
    /// order, then samples within windows of W shards, keeping reads mostly sequential).
    #[arg(long, default_value_t = 0)]
    pub shuffle_window: u32,
    /// This rank.
    #[arg(long, default_value_t = 0)]
    pub rank: u32,
    /// Number of ranks.
    #[arg(long, default_value_t = 1)]
    pub world: u32,
    /// Bad sample policy.
    #[arg(long, value_enum, default_value_t = OnError::Skip)]
    pub on_error: OnError,
}

impl JobArgs {
    /// The job spec these options describe.
    pub fn spec(&self) -> anyhow::Result<JobSpec> {
        let data = self
            .data
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("--data DIR is required (an ImageFolder root)"))?;
        Ok(JobSpec {
            dataset: Some(proto::DatasetSource {
                uri: data.to_string_lossy().into_owned(),
                format: proto::DatasetFormat::Auto as i32,
                ..Default::default()
            }),
            pipeline: stoker_worker::presets::by_name(&self.pipeline, self.size)?,
            batch_size: self.batch_size,
            seed: self.seed,
            shuffle: !self.no_shuffle,
            drop_last: self.drop_last,
            rank: self.rank,
            world_size: self.world,
            uneven_tail: proto::UnevenTail::Pad as i32,
            on_error: match self.on_error {
                OnError::Skip => BadSamplePolicy::Skip as i32,
                OnError::Fail => BadSamplePolicy::Fail as i32,
            },
            shuffle_window: self.shuffle_window,
        })
    }
}
