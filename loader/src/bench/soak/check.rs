//! What a soak client read, checked against the embedded loader: for each rank and epoch the
//! same digest, and every sample as many times as the embedded loader gives it (once, or twice
//! for the padding of an uneven tail) — counted as lost or duplicated otherwise.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex};

use super::client::EpochRead;
use super::{spec, SoakBench};
use crate::bench::{Error, Result};
use crate::{BatchDigest, Loader, LoaderOptions};

/// The tallies of the epochs checked so far.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Epochs checked per rank.
    checked: Vec<u64>,
    /// Batches checked, all ranks.
    pub batches: u64,
    /// Samples the embedded loader gave that a client did not get.
    pub lost: u64,
    /// Samples a client got beyond what the embedded loader gave.
    pub duplicated: u64,
    /// Epochs whose digest differs.
    pub mismatches: u64,
}

impl Tally {
    /// Epochs every rank has had checked.
    pub fn epochs(&self) -> u64 {
        self.checked.iter().copied().min().unwrap_or(0)
    }
}

/// The embedded loaders of every rank, checking on a thread of their own so that the soak's
/// clock (readings each second, the kill schedule) never waits for a check.
pub struct Checker {
    sender: Option<mpsc::Sender<EpochRead>>,
    tally: Arc<Mutex<Tally>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl Checker {
    /// One embedded loader (one decode thread) per rank of the soak's job.
    pub fn start(data: &Path, args: &SoakBench) -> Result<Checker> {
        let ranks = (0..args.clients)
            .map(|rank| {
                Loader::new(
                    spec(data, args.kind, rank, args.clients, args.batch_size),
                    LoaderOptions {
                        threads: 1,
                        ..LoaderOptions::default()
                    },
                )
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let tally = Arc::new(Mutex::new(Tally {
            checked: vec![0; ranks.len()],
            ..Tally::default()
        }));
        let (sender, reads) = mpsc::channel::<EpochRead>();
        let shared = tally.clone();
        let thread = std::thread::spawn(move || {
            for read in reads {
                check(&ranks, &read, &shared)?;
            }
            Ok(())
        });
        Ok(Checker {
            sender: Some(sender),
            tally,
            thread: Some(thread),
        })
    }

    /// Queues one epoch of one rank for checking.
    pub fn submit(&self, read: EpochRead) {
        if let Some(sender) = &self.sender {
            // A send fails only when the thread stopped on an error, which `finish` returns.
            let _ = sender.send(read);
        }
    }

    /// The tallies so far.
    pub fn tally(&self) -> Tally {
        lock(&self.tally).clone()
    }

    /// Checks what is queued, then returns the tallies.
    pub fn finish(mut self) -> Result<Tally> {
        self.sender.take();
        if let Some(thread) = self.thread.take() {
            thread
                .join()
                .map_err(|_| Error::Failed("the soak's checker panicked".into()))??;
        }
        Ok(self.tally())
    }
}

fn lock(tally: &Mutex<Tally>) -> std::sync::MutexGuard<'_, Tally> {
    tally
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Checks one epoch of one rank against `ranks`' embedded loaders.
fn check(ranks: &[Loader], read: &EpochRead, tally: &Mutex<Tally>) -> Result<()> {
    let Some(loader) = ranks.get(read.rank as usize) else {
        return Err(Error::Failed(format!(
            "a client reported rank {} of {}",
            read.rank,
            ranks.len()
        )));
    };
    let mut digest = BatchDigest::new();
    let mut want = Vec::new();
    for batch in loader.epoch(read.epoch, 0)? {
        let batch = batch?;
        digest.update(&batch);
        want.extend_from_slice(&batch.sample_indices);
    }
    let (lost, duplicated) = difference(&want, &read.samples);
    let mismatch = digest.hex() != read.digest;
    if lost + duplicated > 0 || mismatch {
        tracing::error!(
            rank = read.rank,
            epoch = read.epoch,
            lost,
            duplicated,
            mismatch,
            "a rank's epoch differs from the embedded loader's"
        );
    }
    let mut tally = lock(tally);
    tally.lost += lost;
    tally.duplicated += duplicated;
    tally.mismatches += u64::from(mismatch);
    tally.batches += read.batches;
    tally.checked[read.rank as usize] += 1;
    Ok(())
}

/// (lost, duplicated): how many of `want`'s samples are missing from `got`, and how many of
/// `got`'s are beyond `want`'s count of them.
fn difference(want: &[u64], got: &[u64]) -> (u64, u64) {
    let mut balance: BTreeMap<u64, i64> = BTreeMap::new();
    for index in want {
        *balance.entry(*index).or_default() += 1;
    }
    for index in got {
        *balance.entry(*index).or_default() -= 1;
    }
    balance.values().fold((0, 0), |(lost, duplicated), &n| {
        if n > 0 {
            (lost + n as u64, duplicated)
        } else {
            (lost, duplicated + n.unsigned_abs())
        }
    })
}

#[cfg(test)]
mod tests {
    use super::difference;

    #[test]
    fn lost_and_duplicated_samples_are_counted_apart() {
        assert_eq!(difference(&[1, 2, 3], &[3, 2, 1]), (0, 0));
        assert_eq!(difference(&[1, 2, 3], &[1, 2]), (1, 0));
        assert_eq!(difference(&[1, 2, 3], &[1, 2, 3, 3]), (0, 1));
        assert_eq!(difference(&[1, 2, 3], &[1, 1, 4]), (2, 2));
        // Padding repeats a sample in the embedded loader too.
        assert_eq!(difference(&[1, 2, 2], &[2, 1, 2]), (0, 0));
    }
}
