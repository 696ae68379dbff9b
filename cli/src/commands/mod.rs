//! Argument parsing and dispatch of the `stoker` subcommands.

mod bench;
mod convert;
mod coordinator;
mod demo;
mod digest;
mod index;
mod inspect;
mod make_dataset;
mod make_tokens;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use stoker_proto::v1::{self as proto, BadSamplePolicy, JobSpec};

/// Stoker: a data loader that keeps GPUs fed.
#[derive(Debug, Parser)]
#[command(
    name = "stoker",
    version,
    about = "Stoker: a data loader that keeps GPUs fed. Runs the embedded loader, benchmarks, \
             dataset tools and the coordinator daemon.",
    long_about = None
)]
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
    /// Rewrite an ImageFolder as tar shards (WebDataset layout) or Parquet files, sample for
    /// sample.
    Convert(convert::ConvertArgs),
    /// Write the index object of tar shards in an object store (s3://BUCKET/PREFIX), so an
    /// open reads it instead of every shard.
    Index(index::IndexArgs),
    /// Describe a dataset: samples, classes, formats, sizes.
    Inspect(inspect::InspectArgs),
    /// Write a seeded ImageNet-like sample set (JPEG/PNG class folders).
    MakeDataset(make_dataset::MakeDatasetArgs),
    /// Run the coordinator daemon of the distributed mode (workers: `stoker-worker`).
    Coordinator(coordinator::CoordinatorArgs),
    /// Write a seeded token file (random ids, nanoGPT `.bin` layout) for benchmarks.
    MakeTokens(make_tokens::MakeTokensArgs),
}

pub use stoker_rpc::{init_logging, shutdown_signal};

impl Cli {
    /// Whether the command is a report read through a pipe (`stoker inspect ... | head`), so
    /// it should end quietly when its reader goes, as Unix tools do (SIGPIPE's default action),
    /// rather than panic in `println!` on the closed pipe. The daemons, benches and commands
    /// that write files keep Rust's default (SIGPIPE ignored: a closed pipe is an error).
    pub fn ends_with_its_reader(&self) -> bool {
        matches!(
            self.command,
            Command::Digest(_) | Command::Inspect(_) | Command::Demo(_)
        )
    }
}

/// Prints the closing line of a command that wrote files: a reader gone by then (`| true`,
/// `| head -0`) is no failure of the work done, which a panic on the closed pipe (exit 101)
/// told scripts it was.
pub(crate) fn summary(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(error) = out
        .write_fmt(line)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush())
    {
        if error.kind() != std::io::ErrorKind::BrokenPipe {
            tracing::warn!(%error, "cannot print the summary");
        }
    }
}

/// Runs the chosen subcommand.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Digest(args) => digest::run(args),
        Command::Convert(args) => convert::run(args),
        Command::Index(args) => index::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::MakeDataset(args) => make_dataset::run(args),
        Command::Coordinator(args) => coordinator::run(args),
        Command::MakeTokens(args) => make_tokens::run(args),
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
    /// Dataset: an ImageFolder root (class folders of images), a folder of
    /// WebDataset-style `.tar` shards (or one `.tar`), a folder of `.parquet` files (or one
    /// `.parquet`; `image` + `label` columns, as `stoker convert --to parquet` writes), a Mosaic
    /// MDS folder (`index.json` and its shards), a token
    /// file (`*.bin`, served as windows of --seq-len + 1 tokens) or JSON Lines text (a `.jsonl`
    /// file or a folder of them, tokenised with --tokenizer and packed into rows of --seq-len).
    /// `s3://BUCKET/PREFIX` (any of these, or a `save_to_disk` folder) is read through the local
    /// cache (STOKER_CACHE_DIR, STOKER_CACHE_MAX_BYTES, AWS_*); given --tokenizer it is read as
    /// JSONL text. A source may be a pattern: a glob (`*`, `?`, `[...]`, `**`) or brace groups
    /// (`shards/shard-{00000..00127}.tar`), quoted so the shell leaves it alone. Required.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// The split to read of a source laid out by split (hub shards `train-00000-of-00002.*`,
    /// `train/` or `data/train/` folders, image folders by split); a source holding several
    /// splits is refused without it.
    #[arg(long)]
    pub split: Option<String>,
    /// Tokens per row for token files and packed text.
    #[arg(long, default_value_t = 1024)]
    pub seq_len: u32,
    /// Token file element type (auto: from the file name, `*.u32.bin` is uint32, else uint16).
    #[arg(long, default_value = "auto", value_parser = ["auto", "uint16", "uint32"])]
    pub token_dtype: String,
    /// JSONL text: the `tokenizer.json` to tokenise with (an `s3://` source given one is read as
    /// JSONL text).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// JSONL text: the field holding the text (default `text`); an MDS set: the image column
    /// read (the commands read MDS sets of images with the image pipeline; MDS text and token
    /// sets are read from Python, with `Tokenize` or `TokenWindows`).
    #[arg(long)]
    pub text_field: Option<String>,
    /// Parquet, Hugging Face folders and MDS sets: the image column (default `image`, `jpg` or
    /// `png`, else the `Image` feature, else MDS's one image-encoded column).
    #[arg(long)]
    pub image_column: Option<String>,
    /// Image pipeline preset (image datasets only; token files and JSONL text get their
    /// token pipeline).
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
    /// Shards per shuffle window for sharded sources: tar shards, Parquet row groups, Hugging
    /// Face record batches, MDS shards, JSONL files (0: global shuffle; W >= 1: shuffle the
    /// shard order, then samples within windows of W shards, keeping reads mostly sequential;
    /// not used, and logged, for a source without shards or with --no-shuffle).
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
        let data = self.data.as_ref().ok_or_else(|| {
            anyhow::anyhow!(
                "--data PATH is required (an ImageFolder root, tar shards, parquet files, a token file or JSONL)"
            )
        })?;
        let token_dtype = match self.token_dtype.as_str() {
            "uint16" => proto::Dtype::Uint16,
            "uint32" => proto::Dtype::Uint32,
            _ => proto::Dtype::Unspecified,
        };
        Ok(JobSpec {
            dataset: Some(proto::DatasetSource {
                uri: data.to_string_lossy().into_owned(),
                format: proto::DatasetFormat::Auto as i32,
                text_column: self.text_field.clone().unwrap_or_default(),
                image_column: self.image_column.clone().unwrap_or_default(),
                token_dtype: token_dtype as i32,
                split: self.split.clone().unwrap_or_default(),
                ..Default::default()
            }),
            pipeline: self.pipeline_ops(data)?,
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
            resized_epoch: None,
            mix: None,
        })
    }

    /// The op list for `data`: token windows for a token file, Tokenize + PackSequences for
    /// JSONL text, the image preset otherwise.
    fn pipeline_ops(&self, data: &std::path::Path) -> anyhow::Result<Vec<proto::Op>> {
        use proto::op::Op as OpKind;
        let op = |kind| proto::Op { op: Some(kind) };
        let judged = self.judged(data);
        let data = judged.as_path();
        if is_tokens(data) {
            return Ok(vec![op(OpKind::TokenWindows(proto::TokenWindows {
                seq_len: self.seq_len,
                ..Default::default()
            }))]);
        }
        if self.is_text(data) {
            let tokenizer = self.tokenizer.as_ref().ok_or_else(|| {
                anyhow::anyhow!("JSONL text needs --tokenizer PATH (a tokenizer.json)")
            })?;
            return Ok(vec![
                op(OpKind::Tokenize(proto::Tokenize {
                    tokenizer_path: tokenizer.to_string_lossy().into_owned(),
                })),
                op(OpKind::PackSequences(proto::PackSequences {
                    seq_len: self.seq_len,
                    eos_id: -1,
                    pad_id: 0,
                })),
            ]);
        }
        Ok(stoker_pipeline::presets::by_name(
            &self.pipeline,
            self.size,
        )?)
    }

    /// The pipeline in words, for reports (as [`JobArgs::pipeline_ops`] chooses it).
    pub fn pipeline_name(&self) -> String {
        let judged = self.data.as_deref().map(|data| self.judged(data));
        match judged.as_deref() {
            Some(data) if is_tokens(data) => format!("token-windows({})", self.seq_len),
            Some(data) if self.is_text(data) => format!("tokenize+pack({})", self.seq_len),
            _ => self.pipeline.clone(),
        }
    }

    /// The file `data` is judged by: the first file a pattern or a split names, else `data`.
    fn judged(&self, data: &std::path::Path) -> PathBuf {
        let named =
            stoker_datasets::resolve_local(&[&data.to_string_lossy()], self.split.as_deref());
        match named {
            Ok(stoker_datasets::LocalSource::Files { files, .. }) => files
                .into_iter()
                .next()
                .unwrap_or_else(|| data.to_path_buf()),
            Ok(stoker_datasets::LocalSource::Path(path)) => path,
            Err(_) => data.to_path_buf(),
        }
    }

    /// Whether `data` is read as JSONL text: JSONL files (as a job reads the path), or an
    /// `s3://` source (its objects are not listed here) given a tokenizer.
    fn is_text(&self, data: &std::path::Path) -> bool {
        stoker_datasets::local_format(data)
            .is_ok_and(|format| format == stoker_datasets::LocalFormat::Jsonl)
            || (self.tokenizer.is_some() && data.to_string_lossy().starts_with("s3://"))
    }
}

/// Whether `data` is read as token windows: a token file, a Megatron corpus named by its
/// `.bin` or `.idx` ([`is_megatron_corpus`]), or an `s3://` object named `*.bin` (not looked
/// at here: the pipeline opens it).
fn is_tokens(data: &std::path::Path) -> bool {
    let remote_bin = data.to_string_lossy().starts_with("s3://")
        && data
            .extension()
            .is_some_and(|extension| extension.eq_ignore_ascii_case("bin"));
    remote_bin || is_megatron_corpus(data) || stoker_datasets::looks_like_token_file(data)
}

/// Whether `path` names a Megatron corpus by its `.bin` or `.idx`, the other beside it.
pub(crate) fn is_megatron_corpus(path: &std::path::Path) -> bool {
    let named = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("bin") || e.eq_ignore_ascii_case("idx"));
    named && stoker_datasets::megatron_pair(path).is_some()
}
