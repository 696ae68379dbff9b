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

/// What the batches of a digest run added up to.
struct Digested {
    digest: BatchDigest,
    samples: u64,
    bad: usize,
}

/// Hashes up to `limit` batches from `next` (which says `None` at the end of the epoch).
fn digest_batches(
    limit: u64,
    mut next: impl FnMut() -> stoker_loader::Result<Option<stoker_proto::v1::Batch>>,
) -> anyhow::Result<Digested> {
    let mut digested = Digested {
        digest: BatchDigest::new(),
        samples: 0,
        bad: 0,
    };
    while digested.digest.batches() < limit {
        let Some(batch) = next()? else {
            break;
        };
        digested.samples += batch.sample_indices.len() as u64;
        digested.bad += batch.bad_samples.len();
        digested.digest.update(&batch);
    }
    Ok(digested)
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
    let done = digest_batches(args.batches, || stream.next_batch())?;
    println!(
        "batches {}  samples {}  bad samples replaced {}  threads {}",
        done.digest.batches(),
        done.samples,
        done.bad,
        loader.threads()
    );
    // On stderr: the last line of stdout stays the digest.
    if let Some(cache) = loader.job().assembler().source().cache_stats() {
        eprintln!("{cache}");
    }
    println!("{}", done.digest.hex());
    Ok(())
}

fn run_remote(args: &DigestArgs, address: &str) -> anyhow::Result<()> {
    let loader = RemoteLoader::connect(address, args.job.spec()?, RemoteOptions::default())?;
    let mut stream = loader.epoch(args.epoch, 0)?;
    let done = digest_batches(args.batches, || stream.next_batch())?;
    println!(
        "batches {}  samples {}  bad samples replaced {}  coordinator {address}",
        done.digest.batches(),
        done.samples,
        done.bad,
    );
    println!("{}", done.digest.hex());
    Ok(())
}
