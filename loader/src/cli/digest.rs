//! `stoker digest`: the SHA-256 of the first K batches, as the last line of output.

use clap::Args;
use stoker_loader::{BatchDigest, Loader, LoaderOptions, RemoteOptions};

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
    let spec = args.job.spec()?;
    let options = LoaderOptions {
        threads: args.threads,
        ..LoaderOptions::default()
    };
    let loader = match &args.address {
        Some(address) => Loader::remote(address, spec, options, RemoteOptions::default())?,
        None => Loader::new(spec, options)?,
    };
    let mut stream = loader.epoch(args.epoch, 0)?;
    let done = digest_batches(args.batches, || stream.next_batch())?;
    let served_by = match &args.address {
        Some(address) => format!("coordinator {address}"),
        None => format!("threads {}", loader.threads()),
    };
    println!(
        "batches {}  samples {}  bad samples replaced {}  {served_by}",
        done.digest.batches(),
        done.samples,
        done.bad,
    );
    // On stderr: the last line of stdout stays the digest.
    if let Some(cache) = loader.cache_stats() {
        eprintln!("{cache}");
    }
    println!("{}", done.digest.hex());
    Ok(())
}
