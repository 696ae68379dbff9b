//! The epoch planner: which dataset sample lands at each (epoch, rank, step, slot), computed on
//! demand from the job spec alone (the determinism contract of DESIGN.md).
//!
//! The epoch order is a seeded [`Permutation`] (or the identity without shuffle). Rank `r` of
//! `world` takes positions `r, r + world, r + 2 * world, ...` of that order, as PyTorch's
//! `DistributedSampler` does; when the sample count does not divide by `world`, the tail is
//! padded by wrapping around or dropped, so every rank has the same number of steps. Within a
//! rank, batches are consecutive runs of `batch_size`, and `drop_last` behaves like
//! `DataLoader`'s.

mod permutation;

pub use permutation::Permutation;

use stoker_proto::v1::UnevenTail;

use crate::error::{Error, Result};

/// The inputs of a plan, taken from the job spec and the dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanConfig {
    /// Samples in the dataset.
    pub num_samples: u64,
    /// Samples per batch.
    pub batch_size: u32,
    /// The job's seed.
    pub seed: u64,
    /// Shuffle each epoch (else dataset order).
    pub shuffle: bool,
    /// Drop the last partial batch of each rank.
    pub drop_last: bool,
    /// This rank.
    pub rank: u32,
    /// Number of ranks.
    pub world_size: u32,
    /// How to even out ranks.
    pub uneven_tail: UnevenTail,
}

/// The plan of one epoch for one rank.
#[derive(Debug, Clone)]
pub struct EpochPlan {
    config: PlanConfig,
    epoch: u64,
    order: Option<Permutation>,
    samples_per_rank: u64,
    steps: u64,
}

/// The key of the epoch order: a function of the seed and the epoch only.
fn epoch_key(seed: u64, epoch: u64) -> u64 {
    seed.rotate_left(17) ^ epoch.wrapping_mul(0xd6e8_feb8_6659_fd93) ^ 0x5354_4f4b_4552_4550
}

impl EpochPlan {
    /// Plans `epoch`; errors name the field that is out of range.
    pub fn new(config: PlanConfig, epoch: u64) -> Result<Self> {
        if config.num_samples == 0 {
            return Err(Error::InvalidSpec("the dataset has no samples".into()));
        }
        if config.batch_size == 0 {
            return Err(Error::InvalidSpec("batch_size must be at least 1".into()));
        }
        if config.world_size == 0 {
            return Err(Error::InvalidSpec("world_size must be at least 1".into()));
        }
        if config.rank >= config.world_size {
            return Err(Error::InvalidSpec(format!(
                "rank {} is out of range for world_size {}",
                config.rank, config.world_size
            )));
        }
        if config.num_samples > 1 << 62 {
            return Err(Error::InvalidSpec("more than 2^62 samples".into()));
        }
        let world = u64::from(config.world_size);
        let samples_per_rank = match config.uneven_tail {
            UnevenTail::Pad => config.num_samples.div_ceil(world),
            UnevenTail::Drop => config.num_samples / world,
        };
        let batch = u64::from(config.batch_size);
        let steps = if config.drop_last {
            samples_per_rank / batch
        } else {
            samples_per_rank.div_ceil(batch)
        };
        let order = config
            .shuffle
            .then(|| Permutation::new(config.num_samples, epoch_key(config.seed, epoch)));
        Ok(Self {
            config,
            epoch,
            order,
            samples_per_rank,
            steps,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &PlanConfig {
        &self.config
    }

    /// The epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Samples this rank sees in the epoch (before `drop_last`).
    pub fn samples_per_rank(&self) -> u64 {
        self.samples_per_rank
    }

    /// Steps (batches) of this rank in the epoch; the same for every rank.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Samples in batch `step` (the last one may be short without `drop_last`); 0 past the end.
    pub fn batch_len(&self, step: u64) -> usize {
        if step >= self.steps {
            return 0;
        }
        let batch = u64::from(self.config.batch_size);
        (self.samples_per_rank - step * batch).min(batch) as usize
    }

    /// The dataset index at `position` of this rank's part of the epoch.
    pub fn sample_at(&self, position: u64) -> u64 {
        let global = u64::from(self.config.rank) + position * u64::from(self.config.world_size);
        // Padding wraps around to the start of the epoch order.
        let global = global % self.config.num_samples;
        match &self.order {
            Some(permutation) => permutation.apply(global),
            None => global,
        }
    }

    /// Dataset indices of batch `step`, in batch order.
    pub fn batch_indices(&self, step: u64) -> Vec<u64> {
        let start = step * u64::from(self.config.batch_size);
        (0..self.batch_len(step) as u64)
            .map(|slot| self.sample_at(start + slot))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(n: u64, batch: u32, world: u32) -> PlanConfig {
        PlanConfig {
            num_samples: n,
            batch_size: batch,
            seed: 0,
            shuffle: true,
            drop_last: false,
            rank: 0,
            world_size: world,
            uneven_tail: UnevenTail::Pad,
        }
    }

    #[test]
    fn steps_follow_dataloader_rules() {
        let plan = EpochPlan::new(config(10, 3, 1), 0).unwrap();
        assert_eq!(plan.steps(), 4);
        assert_eq!(plan.batch_len(3), 1);
        assert_eq!(plan.batch_len(4), 0);
        let plan = EpochPlan::new(
            PlanConfig {
                drop_last: true,
                ..config(10, 3, 1)
            },
            0,
        )
        .unwrap();
        assert_eq!(plan.steps(), 3);
    }

    #[test]
    fn pad_and_drop_even_out_ranks() {
        let pad = EpochPlan::new(config(10, 2, 4), 0).unwrap();
        assert_eq!(pad.samples_per_rank(), 3);
        let drop = EpochPlan::new(
            PlanConfig {
                uneven_tail: UnevenTail::Drop,
                ..config(10, 2, 4)
            },
            0,
        )
        .unwrap();
        assert_eq!(drop.samples_per_rank(), 2);
    }

    #[test]
    fn no_shuffle_is_dataset_order_strided_by_rank() {
        let plan = EpochPlan::new(
            PlanConfig {
                shuffle: false,
                rank: 1,
                ..config(10, 2, 3)
            },
            5,
        )
        .unwrap();
        assert_eq!(plan.batch_indices(0), vec![1, 4]);
        assert_eq!(plan.batch_indices(1), vec![7, 0]);
    }

    #[test]
    fn bad_configs_are_refused_with_the_field_named() {
        for (cfg, needle) in [
            (config(0, 1, 1), "no samples"),
            (config(5, 0, 1), "batch_size"),
            (config(5, 1, 0), "world_size"),
            (
                PlanConfig {
                    rank: 2,
                    ..config(5, 1, 2)
                },
                "rank 2",
            ),
        ] {
            let message = EpochPlan::new(cfg, 0).unwrap_err().to_string();
            assert!(message.contains(needle), "{message}");
        }
    }
}
