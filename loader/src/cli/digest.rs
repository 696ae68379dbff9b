//! `stoker digest`: the SHA-256 of the first K batches, as the last line of output.

use clap::Args;
use stoker_loader::distributed::{RemoteLoader, RemoteOptions};
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
    /// Read the batches from the coordinator at this host:port (distributed mode) instead of
    /// building them in this process; the hash is the same.
    #[arg(long)]
    pub address: Option<String>,
}

/// Runs the command.
pub fn run(args: DigestArgs) -> anyhow::Result<()> {
    if let Some(address) = &args.address {
        return run_remote(&args, address);
    }
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

fn run_remote(args: &DigestArgs, address: &str) -> anyhow::Result<()> {
    let loader = RemoteLoader::connect(address, args.job.spec()?, RemoteOptions::default())?;
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
        "batches {}  samples {}  bad samples replaced {}  coordinator {address}",
        digest.batches(),
        samples,
        bad,
    );
    println!("{}", digest.hex());
    Ok(())
}
