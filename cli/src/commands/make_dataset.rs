//! `stoker make-dataset`: a seeded ImageNet-like sample set, with a progress bar.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use stoker_datasets::{generate_imagenet_like, GeneratedDataset, SyntheticImageNetSpec};

/// Arguments of `stoker make-dataset`.
#[derive(Debug, Args)]
pub struct MakeDatasetArgs {
    /// Number of images.
    #[arg(long)]
    pub count: u64,
    /// Output folder (created; reused if it already holds the same set).
    #[arg(long)]
    pub out: PathBuf,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// Writes the set with a progress bar on stderr.
pub fn generate_with_progress(
    out: &Path,
    count: u64,
    seed: u64,
) -> anyhow::Result<GeneratedDataset> {
    let bar = ProgressBar::new(count);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} images ({per_sec}, eta {eta})")
            .context("progress bar template")?
            .progress_chars("=> "),
    );
    bar.set_message("writing sample set");
    let spec = SyntheticImageNetSpec {
        count,
        seed,
        classes: 10,
    };
    let progress = |done: u64| bar.set_position(done);
    let result = generate_imagenet_like(out, &spec, &progress)
        .with_context(|| format!("cannot write the sample set to {}", out.display()));
    bar.finish_and_clear();
    result
}

/// Runs the command.
pub fn run(args: MakeDatasetArgs) -> anyhow::Result<()> {
    let generated = generate_with_progress(&args.out, args.count, args.seed)?;
    super::summary(format_args!(
        "wrote {} images ({:.1} MB, {:.0} KB mean) to {}",
        generated.files,
        generated.total_bytes as f64 / 1e6,
        generated.total_bytes as f64 / generated.files.max(1) as f64 / 1e3,
        generated.root.display()
    ));
    Ok(())
}
