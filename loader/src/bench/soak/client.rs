//! One training rank of the soak, as its own process: reads epoch after epoch from the
//! coordinator with a simulated training step, and prints one JSON line per epoch (its digest
//! and every sample index, in order) for the soak to check. It stops after the epoch in which
//! its stdin closes.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};

use super::{spec, DataKind};
use crate::bench::Result;
use crate::{BatchDigest, Loader, LoaderOptions, RemoteOptions};

/// Settings of one soak client (started by `stoker bench soak`, not by hand).
#[derive(Debug, Clone, Args)]
pub struct SoakClient {
    /// The coordinator's host:port.
    #[arg(long)]
    pub address: String,
    /// The dataset.
    #[arg(long)]
    pub data: PathBuf,
    /// What the dataset is.
    #[arg(long, value_enum)]
    pub kind: DataKind,
    /// This rank.
    #[arg(long)]
    pub rank: u32,
    /// Number of ranks.
    #[arg(long)]
    pub world: u32,
    /// Samples per batch.
    #[arg(long)]
    pub batch_size: u32,
    /// Simulated training step per batch, in milliseconds.
    #[arg(long)]
    pub step_ms: u64,
}

/// What a client read in one epoch.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct EpochRead {
    /// Its rank.
    pub rank: u32,
    /// The epoch.
    pub epoch: u64,
    /// [`BatchDigest`] of its batches, in hex.
    pub digest: String,
    /// Batches read.
    pub batches: u64,
    /// Sample indices of every batch, in order.
    pub samples: Vec<u64>,
}

/// A line a client prints: an epoch read, or the error that stopped it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ClientLine {
    /// One epoch done.
    Epoch(EpochRead),
    /// The loader failed; the client exits.
    Failed(String),
}

/// Reads `spec`'s epochs at `address` until stdin closes, printing a [`ClientLine`] per epoch.
pub fn run(args: &SoakClient) -> Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        // The soak closes our stdin to say "finish this epoch, then stop".
        let mut sink = [0u8; 64];
        let mut stdin = std::io::stdin();
        while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
        flag.store(true, Ordering::SeqCst);
    });
    let result = read_epochs(args, &stop);
    if let Err(error) = &result {
        print_line(&ClientLine::Failed(error.to_string()))?;
    }
    result
}

fn read_epochs(args: &SoakClient, stop: &AtomicBool) -> Result<()> {
    let spec = spec(
        &args.data,
        args.kind,
        args.rank,
        args.world,
        args.batch_size,
    );
    let loader = Loader::remote(
        &args.address,
        spec,
        LoaderOptions {
            // A restarted coordinator and killed workers cost seconds, not minutes.
            deadline: Duration::from_secs(120),
            ..LoaderOptions::default()
        },
        RemoteOptions {
            connect_timeout: Duration::from_secs(60),
            stall_reopen: Duration::from_secs(3),
            worker_grace: Duration::from_secs(120),
            ..RemoteOptions::default()
        },
    )?;
    let step = Duration::from_millis(args.step_ms);
    for epoch in 0.. {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let mut digest = BatchDigest::new();
        let mut samples = Vec::new();
        let mut stream = loader.epoch(epoch, 0)?;
        while let Some(batch) = stream.next_batch()? {
            digest.update(&batch);
            samples.extend_from_slice(&batch.sample_indices);
            std::thread::sleep(step);
        }
        print_line(&ClientLine::Epoch(EpochRead {
            rank: args.rank,
            epoch,
            digest: digest.hex(),
            batches: digest.batches(),
            samples,
        }))?;
    }
    Ok(())
}

fn print_line(line: &ClientLine) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer(&mut stdout, line)?;
    stdout.write_all(b"\n")?;
    stdout.flush()?;
    Ok(())
}
