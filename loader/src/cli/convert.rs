//! `stoker convert`: rewrites an ImageFolder in another storage format, with a progress bar.
//!
//! `--to tar` writes WebDataset-style tar shards whose sample `i` is sample `i` of the folder,
//! so a job gives the same batches on either. `--to parquet` is planned and refused for now.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use stoker_datasets::{write_tar_shards, ImageFolder, SampleSource, TarShardsWriterOptions};

/// Target formats of `stoker convert`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TargetFormat {
    /// Tar shards, WebDataset layout: `<index>.<ext>` image and `<index>.cls` label members.
    Tar,
    /// Parquet files (not built yet).
    Parquet,
}

/// Arguments of `stoker convert`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// ImageFolder root to read.
    #[arg(long)]
    pub from: PathBuf,
    /// Format to write.
    #[arg(long, value_enum)]
    pub to: TargetFormat,
    /// Output folder (created; must be empty).
    #[arg(long)]
    pub out: PathBuf,
    /// Largest shard size in MB (10^6 bytes); a shard always holds one sample at least.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    pub shard_size: u64,
}

/// Runs the command.
pub fn run(args: ConvertArgs) -> anyhow::Result<()> {
    if args.to == TargetFormat::Parquet {
        anyhow::bail!(
            "converting to parquet is not built yet; use --to tar (WebDataset-style tar shards)"
        );
    }
    let folder = ImageFolder::open(&args.from)
        .with_context(|| format!("cannot open the image folder {}", args.from.display()))?;
    let options = TarShardsWriterOptions {
        shard_bytes: args.shard_size.saturating_mul(1_000_000),
    };
    let bar = ProgressBar::new(folder.len());
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} samples ({per_sec}, eta {eta})")
            .context("progress bar template")?
            .progress_chars("=> "),
    );
    bar.set_message("writing tar shards");
    let progress = |done: u64| bar.set_position(done);
    let written = write_tar_shards(&folder, &args.out, &options, &progress)
        .with_context(|| format!("cannot write tar shards to {}", args.out.display()));
    bar.finish_and_clear();
    let written = written?;
    println!(
        "wrote {} samples in {} shards ({:.1} MB) to {}",
        written.samples,
        written.shards.len(),
        written.bytes as f64 / 1e6,
        args.out.display()
    );
    Ok(())
}
