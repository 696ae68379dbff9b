//! `stoker digest`: the SHA-256 of the first K batches, as the last line of output.

use clap::Args;
use stoker_loader::{BatchDigest, Loader, LoaderOptions};

use super::JobArgs;

/// Arguments of `stoker digest`.
#[derive(Debug, Args)]
pub struct DigestArgs {
    #[command(flatten)]
    pub job: JobArgs,
    /// Epoch to read.
    #[arg(long, default_value_t = 0)]
    pub epoch: u64,
    /// Batches to hash (fewer if the epoch is shorter).
    #[arg(long, default_value_t = 4)]
    pub batches: u64,
    /// Decode threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

/// Runs the command.
pub fn run(args: DigestArgs) -> anyhow::Result<()> {
    let loader = Loader::new(
        args.job.spec()?,
        LoaderOptions {
            threads: args.threads,
            ..LoaderOptions::default()
        },
    )?;
    let mut stream = loader.epoch(args.epoch, 0)?;
    let mut digest = BatchDigest::new();
    let mut samples = 0u64;
    let mut bad = 0usize;
    while digest.batches() < args.batches {
        let Some(batch) = stream.next_batch()? else {
            break;
        };
        samples += batch.sample_indices.len() as u64;
        bad += batch.bad_samples.len();
        digest.update(&batch);
    }
    println!(
        "batches {}  samples {}  bad samples replaced {}  threads {}",
        digest.batches(),
        samples,
        bad,
        loader.threads()
    );
    // On stderr: the last line of stdout stays the digest.
    if let Some(cache) = loader.job().assembler().source().cache_stats() {
        eprintln!("{cache}");
    }
    println!("{}", digest.hex());
    Ok(())
}
