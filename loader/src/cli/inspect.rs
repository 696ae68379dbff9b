//! `stoker inspect`: samples, classes, formats and size statistics of a dataset.

use std::path::PathBuf;

use clap::Args;
use stoker_datasets::{inspect_image_folder, ImageFolder, SampleSource};
use stoker_worker::DEFAULT_MAX_PIXELS;

/// Arguments of `stoker inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// ImageFolder root.
    #[arg(long)]
    pub data: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs the command.
pub fn run(args: InspectArgs) -> anyhow::Result<()> {
    if stoker_datasets::looks_like_tar_shards(&args.data) {
        let shards = stoker_datasets::TarShards::open(&args.data)?;
        let stats = shards.index_stats();
        println!("dataset   {} (tar shards)", args.data.display());
        println!("samples   {}", shards.len());
        println!("classes   {}", shards.class_names().len());
        println!(
            "shards    {} ({} index files reused, {} built, {} problems)",
            stats.shards, stats.loaded_from_cache, stats.built, stats.problems
        );
        println!("(size statistics are computed for ImageFolder datasets only so far)");
        return Ok(());
    }
    let folder = ImageFolder::open(&args.data)?;
    let report = inspect_image_folder(&folder, DEFAULT_MAX_PIXELS)?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!("dataset   {}", args.data.display());
    println!("samples   {}", report.samples);
    println!("classes   {}", report.classes.len());
    for (name, count) in &report.classes {
        println!("  {name:<24} {count}");
    }
    println!("formats");
    for (name, count) in &report.formats {
        println!("  {name:<24} {count}");
    }
    let line = |what: &str, s: &stoker_datasets::Summary, unit: &str| {
        println!(
            "{what:<9} min {:.0}{unit}  median {:.0}{unit}  mean {:.0}{unit}  max {:.0}{unit}",
            s.min, s.p50, s.mean, s.max
        );
    };
    line("width", &report.width, " px");
    line("height", &report.height, " px");
    let kb = stoker_datasets::Summary {
        min: report.file_bytes.min / 1e3,
        mean: report.file_bytes.mean / 1e3,
        max: report.file_bytes.max / 1e3,
        p50: report.file_bytes.p50 / 1e3,
    };
    line("file", &kb, " KB");
    if report.pixels_over_limit > 0 {
        println!(
            "over the pixel limit ({DEFAULT_MAX_PIXELS}): {}",
            report.pixels_over_limit
        );
    }
    Ok(())
}
