//! `stoker index s3://BUCKET/PREFIX`: writes the index object of a tar shard set in an object
//! store (`PREFIX/stoker-tar-index.bin`), so that opening the set reads the listing and that
//! one object instead of every shard.

use anyhow::Context;
use clap::Args;
use stoker_datasets::{write_tar_index, ObjectCache};

/// Arguments of `stoker index`.
#[derive(Debug, Args)]
pub struct IndexArgs {
    /// The `s3://BUCKET/PREFIX` of the tar shards (credentials and endpoint from the `AWS_*`
    /// variables).
    pub uri: String,
}

/// Runs the command: reads every shard once, then writes the index beside them.
pub fn run(args: IndexArgs) -> anyhow::Result<()> {
    let cache = ObjectCache::from_env().context("cannot set up the object cache")?;
    let written = write_tar_index(&args.uri, &cache)
        .with_context(|| format!("cannot index the tar shards at {}", args.uri))?;
    super::summary(format_args!(
        "indexed {} shards, {} samples ({} bytes read); wrote {} ({} bytes)",
        written.shards, written.samples, written.shard_bytes, written.uri, written.bytes
    ));
    Ok(())
}
