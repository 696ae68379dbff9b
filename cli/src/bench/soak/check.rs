//! What a soak client read, checked against the embedded loader: each segment (the batches
//! between two checkpoints) has the digest of the embedded loader's same batches and their
//! samples, as many times as the embedded loader gives them (once, or twice for the padding of
//! an uneven tail); and each rank's segments tile its epochs, a resumed client starting exactly
//! where its last checkpoint left off. Anything else counts as lost or duplicated.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex};

use super::client::SegmentRead;
use super::{spec, SoakBench};
use crate::bench::{Error, Result};
use stoker_loader::{BatchDigest, Loader, LoaderOptions};

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
    /// Segments whose digest differs.
    pub mismatches: u64,
    /// Segments whose start is not where the rank's last one ended.
    pub misplaced: u64,
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
    sender: Option<mpsc::Sender<SegmentRead>>,
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
            .collect::<stoker_loader::Result<Vec<_>>>()?;
        let tally = Arc::new(Mutex::new(Tally {
            checked: vec![0; ranks.len()],
            ..Tally::default()
        }));
        let (sender, reads) = mpsc::channel::<SegmentRead>();
        let shared = tally.clone();
        let batch = u64::from(args.batch_size);
        let thread = std::thread::spawn(move || {
            let mut next = vec![(0u64, 0u64); ranks.len()];
            for read in reads {
                check(&ranks, batch, &mut next, &read, &shared)?;
            }
            Ok(())
        });
        Ok(Checker {
            sender: Some(sender),
            tally,
            thread: Some(thread),
        })
    }

    /// Queues one segment of one rank for checking (a rank's in the order read).
    pub fn submit(&self, read: SegmentRead) {
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

/// Checks one segment of one rank against `ranks`' embedded loaders (batches of `batch`
/// samples); `next` is where each rank's next segment must start (epoch, step).
fn check(
    ranks: &[Loader],
    batch: u64,
    next: &mut [(u64, u64)],
    read: &SegmentRead,
    tally: &Mutex<Tally>,
) -> Result<()> {
    let rank = read.rank as usize;
    let Some(loader) = ranks.get(rank) else {
        return Err(Error::Failed(format!(
            "a client reported rank {} of {}",
            read.rank,
            ranks.len()
        )));
    };
    let steps = loader.steps_per_epoch();
    let mut digest = BatchDigest::new();
    let mut want = Vec::new();
    for batch in loader
        .epoch(read.epoch, read.first_step)?
        .take(read.batches as usize)
    {
        let batch = batch?;
        digest.update(&batch);
        want.extend_from_slice(&batch.sample_indices);
    }
    let (mut lost, mut duplicated) = difference(&want, &read.samples);
    let mismatch =
        digest.hex() != read.digest || read.ends_epoch != (read.first_step + read.batches == steps);
    // Batches between the last segment's end and this one's start were never read (or, before
    // it, read twice): a whole batch's samples each.
    let at = |(epoch, step): (u64, u64)| epoch * steps + step;
    let expected = at(next[rank]);
    let start = at((read.epoch, read.first_step));
    let misplaced = start != expected;
    if start > expected {
        lost += (start - expected) * batch;
    } else {
        duplicated += (expected - start).min(read.batches) * batch;
    }
    next[rank] = read.next();
    if lost + duplicated > 0 || mismatch {
        tracing::error!(
            rank = read.rank,
            epoch = read.epoch,
            first_step = read.first_step,
            lost,
            duplicated,
            mismatch,
            "a rank's segment differs from the embedded loader's"
        );
    }
    let mut tally = lock(tally);
    tally.lost += lost;
    tally.duplicated += duplicated;
    tally.mismatches += u64::from(mismatch);
    tally.misplaced += u64::from(misplaced);
    tally.batches += read.batches;
    tally.checked[rank] += u64::from(read.ends_epoch);
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
