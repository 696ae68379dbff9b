//! `stoker convert`: rewrites an ImageFolder in another storage format, with a progress bar.
//!
//! `--to tar` writes WebDataset-style tar shards, `--to parquet` Parquet files (`key`, `image`,
//! `label` columns); either way sample `i` of the output is sample `i` of the folder, so a job
//! gives the same batches on all three. Tar shards may go straight to an object store
//! (`--out s3://BUCKET/PREFIX`), indexed there.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use stoker_datasets::{
    check_empty_prefix, parse_dataset_uri, resolve_local, upload_tar_set, write_parquet,
    write_tar_shards, DatasetLocation, ImageFolder, LocalSource, ObjectCache, ParquetWriterOptions,
    SampleSource, TarShardsWriterOptions,
};

/// Target formats of `stoker convert`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TargetFormat {
    /// Tar shards, WebDataset layout: `<index>.<ext>` image and `<index>.cls` label members.
    Tar,
    /// Parquet files: `key`, `image` (binary) and `label` (int64) columns, class names in the
    /// file metadata.
    Parquet,
}

/// Arguments of `stoker convert`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// ImageFolder root to read.
    #[arg(long)]
    pub from: PathBuf,
    /// The split to read of a folder laid out by split (`train/`, `val/`, ... each holding
    /// class folders), which is never converted whole.
    #[arg(long)]
    pub split: Option<String>,
    /// Format to write.
    #[arg(long, value_enum)]
    pub to: TargetFormat,
    /// Output folder (created; must be empty), or `s3://BUCKET/PREFIX` for tar shards: they
    /// are written to a temporary folder, uploaded with their `classes.txt`, and indexed
    /// (`stoker-tar-index.bin`, as `stoker index` writes it).
    #[arg(long)]
    pub out: PathBuf,
    /// Largest shard (tar) or file (Parquet) size in MB (10^6 bytes); each holds one sample at
    /// least.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    pub shard_size: u64,
    /// Parquet only: rows per row group, the unit a reader decodes at once.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub row_group_size: u64,
}

/// The image folder `--from` names, or its split `--split`: a folder laid out by split is
/// refused whole, naming its splits, as the loader refuses it.
fn open_folder(args: &ConvertArgs) -> anyhow::Result<ImageFolder> {
    let from = args.from.to_string_lossy();
    let cannot = || format!("cannot open the image folder {}", args.from.display());
    let path = match resolve_local(&[&from], args.split.as_deref()).with_context(cannot)? {
        LocalSource::Path(path) => path,
        LocalSource::Files { name, .. } => {
            anyhow::bail!("{name} names files; convert reads an image folder")
        }
    };
    ImageFolder::open(&path).with_context(cannot)
}

/// `path` with its links and `..` resolved, as far as it exists (an output folder not yet made
/// is its nearest existing folder's resolved path and the rest as written).
fn resolved(path: &std::path::Path) -> std::path::PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut existing = absolute.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(real) = existing.canonicalize() {
            return rest.iter().rev().fold(real, |path, part| path.join(part));
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                existing = parent;
            }
            _ => return absolute,
        }
    }
}

/// Runs the command.
pub fn run(mut args: ConvertArgs) -> anyhow::Result<()> {
    let out = args.out.to_string_lossy().into_owned();
    // `S3://` is a bucket as readers take it; another scheme is refused, not made a folder.
    match parse_dataset_uri(&out).with_context(|| format!("--out {out}"))? {
        DatasetLocation::S3(_) => return convert_to_bucket(args, &out),
        DatasetLocation::Local(path) => args.out = path,
    }
    let folder = open_folder(&args)?;
    // Written inside the folder it reads, the output would be a class of it from then on: the
    // image folder no longer opens ("no image file for the class ..."). Written inside the
    // dataset's root beside its split (`--from data --split val --out data/val_tar`), it would
    // be one more split of that dataset, met by every later reader of the root.
    let to = resolved(&args.out);
    for (inside, what) in [
        (folder.root(), "image folder"),
        (args.from.as_path(), "dataset"),
    ] {
        if to.starts_with(resolved(inside)) {
            anyhow::bail!(
                "--out {} lies inside the {what} {} it converts: write it elsewhere",
                args.out.display(),
                inside.display()
            );
        }
    }
    let max_bytes = args.shard_size.saturating_mul(1_000_000);
    let bar = ProgressBar::new(folder.len());
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} samples ({per_sec}, eta {eta})")
            .context("progress bar template")?
            .progress_chars("=> "),
    );
    let progress = |done: u64| bar.set_position(done);
    let summary = match args.to {
        TargetFormat::Tar => {
            bar.set_message("writing tar shards");
            let options = TarShardsWriterOptions {
                shard_bytes: max_bytes,
            };
            let written = write_tar_shards(&folder, &args.out, &options, &progress)
                .with_context(|| format!("cannot write tar shards to {}", args.out.display()));
            bar.finish_and_clear();
            let written = written?;
            format!(
                "wrote {} samples in {} shards ({:.1} MB) to {}",
                written.samples,
                written.shards.len(),
                written.bytes as f64 / 1e6,
                args.out.display()
            )
        }
        TargetFormat::Parquet => {
            bar.set_message("writing parquet files");
            let options = ParquetWriterOptions {
                file_bytes: max_bytes,
                rows_per_group: usize::try_from(args.row_group_size)
                    .context("--row-group-size does not fit this machine")?,
            };
            let written = write_parquet(&folder, &args.out, &options, &progress)
                .with_context(|| format!("cannot write parquet files to {}", args.out.display()));
            bar.finish_and_clear();
            let written = written?;
            format!(
                "wrote {} samples in {} parquet files, {} row groups ({:.1} MB) to {}",
                written.samples,
                written.files.len(),
                written.row_groups,
                written.bytes as f64 / 1e6,
                args.out.display()
            )
        }
    };
    super::summary(format_args!("{summary}"));
    Ok(())
}

/// `--out s3://...`: tar shards written to a temporary folder, then uploaded and indexed.
fn convert_to_bucket(args: ConvertArgs, uri: &str) -> anyhow::Result<()> {
    if args.to != TargetFormat::Tar {
        anyhow::bail!(
            "--out {uri}: convert uploads tar shards only; write Parquet to a local folder and \
             copy the files to the bucket (Stoker reads them from s3://)"
        );
    }
    let cache = ObjectCache::from_env().context("cannot set up the object cache")?;
    // Refused before the conversion, not after it.
    check_empty_prefix(uri, &cache)?;
    let staging = tempfile::tempdir().context("cannot make a temporary folder")?;
    let local = staging.path().join("shards");
    run(ConvertArgs {
        out: local.clone(),
        ..args
    })?;
    let uploaded = upload_tar_set(&local, uri, &cache)
        .with_context(|| format!("cannot upload the tar shards to {uri}"))?;
    let replaced = match uploaded.replaced {
        0 => String::new(),
        n => format!(" (replacing the {n} objects an unfinished convert had left)"),
    };
    super::summary(format_args!(
        "uploaded {} objects ({:.1} MB) to {uri}{replaced}; wrote {} ({} samples, {} bytes)",
        uploaded.objects,
        uploaded.bytes as f64 / 1e6,
        uploaded.index.uri,
        uploaded.index.samples,
        uploaded.index.bytes
    ));
    Ok(())
}
