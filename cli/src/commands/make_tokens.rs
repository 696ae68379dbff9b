//! `stoker make-tokens`: a seeded token file (uniform random ids) for benchmarks.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use stoker_datasets::{write_synthetic_tokens, SyntheticTokensSpec, TokenDtype};

/// Arguments of `stoker make-tokens`.
#[derive(Debug, Args)]
pub struct MakeTokensArgs {
    /// Number of tokens, at least 1.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub tokens: u64,
    /// Output file (replaced once written whole). Readers pick the dtype from the name:
    /// `--dtype uint32` needs a `*.u32.bin` (or `*.uint32.bin`) name, `uint16` any other.
    #[arg(long)]
    pub out: PathBuf,
    /// Ids are drawn from 0..vocab (50257: GPT-2's vocabulary).
    #[arg(long, default_value_t = 50_257)]
    pub vocab: u32,
    /// Element type.
    #[arg(long, default_value = "uint16", value_parser = ["uint16", "uint32"])]
    pub dtype: String,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// Runs the command.
pub fn run(args: MakeTokensArgs) -> anyhow::Result<()> {
    let dtype = if args.dtype == "uint32" {
        TokenDtype::Uint32
    } else {
        TokenDtype::Uint16
    };
    let named = TokenDtype::from_file_name(&args.out);
    if named != dtype {
        anyhow::bail!(
            "--out {}: readers take a file of that name for {} tokens, not {}; name it \
             *.u32.bin for uint32 (any other name for uint16)",
            args.out.display(),
            named.name(),
            dtype.name()
        );
    }
    if let Some(parent) = args.out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let started = Instant::now();
    let spec = SyntheticTokensSpec {
        tokens: args.tokens,
        vocab: args.vocab,
        dtype,
        seed: args.seed,
    };
    write_synthetic_tokens(&args.out, &spec)?;
    super::summary(format_args!(
        "wrote {} {} tokens ({:.1} MB) to {} in {:.1} s",
        args.tokens,
        dtype.name(),
        (args.tokens * dtype.size() as u64) as f64 / 1e6,
        args.out.display(),
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}
