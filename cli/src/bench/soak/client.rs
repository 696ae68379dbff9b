//! One training rank of the soak, as its own process: reads epoch after epoch from the
//! coordinator with a simulated training step, and prints a JSON line at each checkpoint (every
//! [`CHECKPOINT_BATCHES`] batches and at the end of each epoch: the batches since the last one,
//! their digest and every sample index, in order) for the soak to check. The soak starts a
//! killed client again at the position after its last checkpoint (`--resume-epoch`,
//! `--resume-step`: the epoch and step a training script's `state_dict` keeps), which the
//! loader resumes from exactly. It stops after the epoch in which its stdin closes.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};

use super::{spec, DataKind};
use crate::bench::Result;
use stoker_loader::{BatchDigest, Loader, LoaderOptions, RemoteOptions};

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
    /// The epoch to start in (a resumed client).
    #[arg(long, default_value_t = 0)]
    pub resume_epoch: u64,
    /// The step of that epoch to start at.
    #[arg(long, default_value_t = 0)]
    pub resume_step: u64,
    /// Longest wanted credits, and the acknowledgements riding with them, are held (the
    /// loader's `ack_interval`).
    #[arg(long, default_value_t = 50)]
    pub ack_interval_ms: u64,
    /// Grow this process's resident set by this many KiB a second, never freed: a planted
    /// leak, to check that the soak's verdict catches one.
    #[arg(long, default_value_t = 0)]
    pub leak_kib_per_s: u64,
}

/// Batches between two checkpoints (a line each).
pub const CHECKPOINT_BATCHES: u64 = 4;

/// What a client read between two checkpoints: consecutive batches of one epoch.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SegmentRead {
    /// Its rank.
    pub rank: u32,
    /// The epoch.
    pub epoch: u64,
    /// The step of its first batch.
    pub first_step: u64,
    /// Batches read.
    pub batches: u64,
    /// Whether its last batch is the epoch's last.
    pub ends_epoch: bool,
    /// [`BatchDigest`] of its batches, in hex.
    pub digest: String,
    /// Sample indices of every batch, in order.
    pub samples: Vec<u64>,
}

impl SegmentRead {
    /// Where the rank's next segment starts: (epoch, step).
    pub fn next(&self) -> (u64, u64) {
        if self.ends_epoch {
            (self.epoch + 1, 0)
        } else {
            (self.epoch, self.first_step + self.batches)
        }
    }
}

/// A line a client prints: a segment read, or the error that stopped it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ClientLine {
    /// Batches up to a checkpoint.
    Segment(SegmentRead),
    /// The loader failed; the client exits.
    Failed(String),
}

/// Reads `spec`'s epochs at `address` until stdin closes, printing a [`ClientLine`] per
/// checkpoint.
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
    if args.leak_kib_per_s > 0 {
        let per_tick = (args.leak_kib_per_s * 1024 / 10) as usize;
        std::thread::spawn(move || {
            let mut kept: Vec<Vec<u8>> = Vec::new();
            loop {
                // Written, so that the pages are resident.
                kept.push(vec![1u8; per_tick]);
                std::thread::sleep(Duration::from_millis(100));
            }
        });
    }
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
            ack_interval: Duration::from_millis(args.ack_interval_ms),
            ..RemoteOptions::default()
        },
    )?;
    let step = Duration::from_millis(args.step_ms);
    let steps = loader.steps_per_epoch();
    let mut first_step = args.resume_step;
    for epoch in args.resume_epoch.. {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let mut stream = loader.epoch(epoch, first_step)?;
        let mut segment = Segment::starting_at(first_step);
        let mut ended = false;
        while let Some(batch) = stream.next_batch()? {
            segment.add(&batch);
            std::thread::sleep(step);
            let end = segment.first_step + segment.batches;
            ended = end >= steps;
            if segment.batches == CHECKPOINT_BATCHES || ended {
                print_line(&ClientLine::Segment(segment.read(args.rank, epoch, ended)))?;
                segment = Segment::starting_at(end);
            }
        }
        if !ended {
            // The stream ended early: what was read, as the epoch's end (the check will show
            // the batches missing).
            print_line(&ClientLine::Segment(segment.read(args.rank, epoch, true)))?;
        }
        first_step = 0;
    }
    Ok(())
}

/// The batches read since the last checkpoint.
struct Segment {
    first_step: u64,
    batches: u64,
    digest: BatchDigest,
    samples: Vec<u64>,
}

impl Segment {
    fn starting_at(first_step: u64) -> Segment {
        Segment {
            first_step,
            batches: 0,
            digest: BatchDigest::new(),
            samples: Vec::new(),
        }
    }

    fn add(&mut self, batch: &stoker_loader::Batch) {
        self.digest.update(batch);
        self.samples.extend_from_slice(&batch.sample_indices);
        self.batches += 1;
    }

    fn read(self, rank: u32, epoch: u64, ends_epoch: bool) -> SegmentRead {
        SegmentRead {
            rank,
            epoch,
            first_step: self.first_step,
            batches: self.batches,
            ends_epoch,
            digest: self.digest.hex(),
            samples: self.samples,
        }
    }
}

/// Prints `line` with one write (a line of a few hundred bytes: under the pipe's atomic size),
/// so that a client killed while printing leaves a whole line or none.
fn print_line(line: &ClientLine) -> Result<()> {
    let mut bytes = serde_json::to_vec(line)?;
    bytes.push(b'\n');
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&bytes)?;
    stdout.flush()?;
    Ok(())
}
