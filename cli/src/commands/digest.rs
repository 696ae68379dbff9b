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
    /// Batches to hash, at least 1 (fewer if the epoch is shorter).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..))]
    pub batches: u64,
    /// Decode threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Read the batches from the coordinator at this host:port (distributed mode) instead of
    /// building them in this process; the hash is the same. The token comes from
    /// STOKER_TOKEN.
    #[arg(long)]
    pub address: Option<String>,
    /// With --address: PEM CA certificate(s) to trust, connecting over TLS.
    #[arg(long, value_name = "FILE", requires = "address")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// With --tls-ca: the name the daemons' certificates carry, when not their address's host.
    #[arg(long, value_name = "NAME", requires = "tls_ca")]
    pub tls_server_name: Option<String>,
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
    mut next: impl FnMut() -> stoker_loader::Result<Option<stoker_loader::Batch>>,
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
        Some(address) => {
            let remote = RemoteOptions {
                tls_ca: args.tls_ca.clone(),
                tls_server_name: args.tls_server_name.clone(),
                ..RemoteOptions::default()
            };
            Loader::remote(address, spec, options, remote)?
        }
        None => Loader::new(spec, options)?,
    };
    let mut stream = loader.epoch(args.epoch, 0)?;
    let done = digest_batches(args.batches, || stream.next_batch())?;
    if done.digest.batches() == 0 {
        // A hash of nothing would match any other run's.
        anyhow::bail!(
            "epoch {} of this job holds no batch ({} steps per epoch): nothing to hash",
            args.epoch,
            loader.steps_per_epoch()
        );
    }
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
