//! What a soak client read, checked against the embedded loader: for each rank and epoch the
//! same digest, and every sample as many times as the embedded loader gives it (once, or twice
//! for the padding of an uneven tail) — counted as lost or duplicated otherwise.

use std::collections::BTreeMap;
use std::path::Path;

use super::client::EpochRead;
use super::{spec, SoakBench};
use crate::bench::Result;
use crate::{BatchDigest, Loader, LoaderOptions};

/// The embedded loaders of every rank, and the tallies so far.
pub struct Checker {
    ranks: Vec<Loader>,
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

impl Checker {
    /// One embedded loader (one decode thread) per rank of the soak's job.
    pub fn new(data: &Path, args: &SoakBench) -> Result<Checker> {
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
        Ok(Checker {
            checked: vec![0; ranks.len()],
            ranks,
            batches: 0,
            lost: 0,
            duplicated: 0,
            mismatches: 0,
        })
    }

    /// Epochs every rank has had checked.
    pub fn epochs(&self) -> u64 {
        self.checked.iter().copied().min().unwrap_or(0)
    }

    /// Checks one epoch of one rank.
    pub fn check(&mut self, read: &EpochRead) -> Result<()> {
        let Some(loader) = self.ranks.get(read.rank as usize) else {
            return Err(crate::bench::Error::Failed(format!(
                "a client reported rank {} of {}",
                read.rank,
                self.ranks.len()
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
        if lost + duplicated > 0 || digest.hex() != read.digest {
            tracing::error!(
                rank = read.rank,
                epoch = read.epoch,
                lost,
                duplicated,
                "a rank's epoch differs from the embedded loader's"
            );
        }
        self.lost += lost;
        self.duplicated += duplicated;
        self.mismatches += u64::from(digest.hex() != read.digest);
        self.batches += read.batches;
        self.checked[read.rank as usize] += 1;
        Ok(())
    }
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
