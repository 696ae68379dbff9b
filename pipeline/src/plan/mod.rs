//! The epoch planner: which dataset sample lands at each (epoch, rank, step, slot), computed on
//! demand from the job spec alone (the determinism contract: see "Rules that hold across the
//! tree" in the repository's `ARCHITECTURE.md`).
//!
//! The epoch order is a seeded [`Permutation`] (or the identity without shuffle). For sources
//! made of shards (tar shards) a shard-aware order keeps reads mostly sequential: the shard order
//! is permuted, consecutive permuted shards are grouped into windows of `shuffle_window` shards,
//! and the samples of each window are permuted among themselves (see
//! [`EpochPlan::new_sharded`]). Rank `r` of
//! `world` takes positions `r, r + world, r + 2 * world, ...` of that order, as PyTorch's
//! `DistributedSampler` does; when the sample count does not divide by `world`, the tail is
//! padded by wrapping around or dropped, so every rank has the same number of steps. Within a
//! rank, batches are consecutive runs of `batch_size`, and `drop_last` behaves like
//! `DataLoader`'s.
//!
//! An epoch resumed on another world size ([`EpochPlan::resized`]) strides what is left of the
//! epoch order instead (see [`resize`]).

pub mod mix;
mod permutation;
pub mod resize;

pub use mix::{MixEnd, MixOrder};
pub use permutation::Permutation;
pub use resize::{resized_spec, Resize};

use std::sync::Arc;

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
    /// Shards per shuffle window of the shard-aware order: 0 shuffles globally; `W >= 1`
    /// shuffles the shard order, then the samples within each window of `W` consecutive
    /// shards. Only used with `shuffle` and by [`EpochPlan::new_sharded`].
    pub shuffle_window: u32,
}

impl PlanConfig {
    /// The planner inputs of `spec` over a dataset of `num_samples`.
    pub fn from_spec(spec: &stoker_proto::v1::JobSpec, num_samples: u64) -> PlanConfig {
        PlanConfig {
            num_samples,
            batch_size: spec.batch_size,
            seed: spec.seed,
            shuffle: spec.shuffle,
            drop_last: spec.drop_last,
            rank: spec.rank,
            // proto3 cannot tell 0 from unset; a world of 0 ranks means a single process.
            world_size: spec.world_size.max(1),
            uneven_tail: spec.uneven_tail(),
            shuffle_window: spec.shuffle_window,
        }
    }
}

/// The plan of one epoch for one rank.
#[derive(Debug, Clone)]
pub struct EpochPlan {
    config: PlanConfig,
    epoch: u64,
    order: Order,
    /// Resizes of this epoch, oldest first (none: the ranks stride the epoch order itself).
    resizes: Arc<[Resize]>,
    /// Positions of the order the ranks stride: the sample count, or what the resizes left.
    len: u64,
    samples_per_rank: u64,
    steps: u64,
}

/// The epoch order: which epoch position holds which dataset sample.
#[derive(Debug, Clone)]
enum Order {
    /// Dataset order.
    Identity,
    /// One permutation of all samples.
    Global(Permutation),
    /// Shard order permuted, then samples permuted within windows of shards.
    Sharded(Arc<ShardedOrder>),
}

/// The per-epoch table of the shard-aware order: O(shards) memory, O(log shards) per lookup.
///
/// A "slot" is a place in the permuted shard order; slot `j` holds the shard the shard
/// permutation maps `j` to, and its samples fill epoch positions `starts[j]..starts[j + 1]`
/// before the within-window shuffle.
#[derive(Debug)]
struct ShardedOrder {
    /// Slots per window (at least 1).
    window: u64,
    /// The first epoch position of each slot, plus the sample count at the end (`slots + 1`
    /// entries, non-decreasing).
    starts: Vec<u64>,
    /// The dataset index of the first sample of the shard at each slot.
    slot_first: Vec<u64>,
    /// The key of the epoch; window keys derive from it.
    epoch_key: u64,
}

impl ShardedOrder {
    /// Builds the table of `epoch` from the sizes of the shards in dataset order, which must
    /// sum to `num_samples`.
    fn new(shard_sizes: &[u64], num_samples: u64, window: u32, epoch_key: u64) -> Result<Self> {
        if shard_sizes.is_empty() {
            return Err(Error::InvalidSpec("the source lists no shards".into()));
        }
        let mut firsts = Vec::with_capacity(shard_sizes.len());
        let mut total = 0u64;
        for &size in shard_sizes {
            firsts.push(total);
            total = total
                .checked_add(size)
                .ok_or_else(|| Error::InvalidSpec("shard sizes overflow".into()))?;
        }
        if total != num_samples {
            return Err(Error::InvalidSpec(format!(
                "shard sizes sum to {total}, but the dataset has {num_samples} samples"
            )));
        }
        let shards = shard_sizes.len() as u64;
        let shard_order = Permutation::new(shards, epoch_key);
        let mut starts = Vec::with_capacity(shard_sizes.len() + 1);
        let mut slot_first = Vec::with_capacity(shard_sizes.len());
        let mut position = 0u64;
        for slot in 0..shards {
            // The permutation maps into `[0, shards)`, which indexes the slices.
            let shard = shard_order.apply(slot) as usize;
            starts.push(position);
            slot_first.push(firsts[shard]);
            position += shard_sizes[shard];
        }
        starts.push(position);
        Ok(Self {
            window: u64::from(window.max(1)),
            starts,
            slot_first,
            epoch_key,
        })
    }

    /// Number of slots (shards).
    fn slots(&self) -> usize {
        self.slot_first.len()
    }

    /// The non-empty slot whose positions hold `position` (which is below the sample count).
    fn slot_of(&self, position: u64) -> usize {
        // The last slot starting at or before `position`; a later slot starts past it, so this
        // one is non-empty and holds it.
        self.starts[..self.slots()]
            .partition_point(|&start| start <= position)
            .saturating_sub(1)
    }

    /// The dataset index at epoch `position`.
    fn apply(&self, position: u64) -> u64 {
        let window = self.slot_of(position) as u64 / self.window;
        // Window bounds fit in usize: they are at most the number of slots.
        let first_slot = (window * self.window) as usize;
        let end_slot = ((window + 1) * self.window).min(self.slots() as u64) as usize;
        let low = self.starts[first_slot];
        let high = self.starts[end_slot];
        let inside = Permutation::new(high - low, window_key(self.epoch_key, window));
        let target = low + inside.apply(position - low);
        let slot = self.slot_of(target);
        self.slot_first[slot] + (target - self.starts[slot])
    }
}

/// Samples per rank and steps when `world_size` ranks stride `len` positions, by the tail and
/// `drop_last` rules of `config`.
fn shape(config: &PlanConfig, len: u64) -> (u64, u64) {
    let world = u64::from(config.world_size);
    let samples_per_rank = match config.uneven_tail {
        UnevenTail::Pad => len.div_ceil(world),
        UnevenTail::Drop => len / world,
    };
    let batch = u64::from(config.batch_size);
    let steps = if config.drop_last {
        samples_per_rank / batch
    } else {
        samples_per_rank.div_ceil(batch)
    };
    (samples_per_rank, steps)
}

/// The key of the epoch order: a function of the seed and the epoch only.
fn epoch_key(seed: u64, epoch: u64) -> u64 {
    seed.rotate_left(17) ^ epoch.wrapping_mul(0xd6e8_feb8_6659_fd93) ^ 0x5354_4f4b_4552_4550
}

/// The key of the within-window order of `window` in an epoch keyed by `epoch_key`.
fn window_key(epoch_key: u64, window: u64) -> u64 {
    epoch_key.rotate_left(29)
        ^ window.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ 0x5748_4e44_4f57_5f4b
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
        let (samples_per_rank, steps) = shape(&config, config.num_samples);
        let order = if config.shuffle {
            Order::Global(Permutation::new(
                config.num_samples,
                epoch_key(config.seed, epoch),
            ))
        } else {
            Order::Identity
        };
        Ok(Self {
            config,
            epoch,
            order,
            resizes: Arc::new([]),
            len: config.num_samples,
            samples_per_rank,
            steps,
        })
    }

    /// This plan after `resizes` (oldest first): the ranks of this plan's configuration stride
    /// what the resizes left of the epoch order. Errors name a resize that does not fit.
    pub fn resized(mut self, resizes: Vec<Resize>) -> Result<Self> {
        let mut len = self.config.num_samples;
        for resize in &resizes {
            len = resize.check(len)?;
        }
        let (samples_per_rank, steps) = shape(&self.config, len);
        self.resizes = resizes.into();
        self.len = len;
        self.samples_per_rank = samples_per_rank;
        self.steps = steps;
        Ok(self)
    }

    /// The resizes this plan follows, oldest first.
    pub fn resizes(&self) -> &[Resize] {
        &self.resizes
    }

    /// The resize that ends this plan after rank `r` has read `steps[r]` batches (every rank
    /// of this plan's world; pass the same count for all when only one is known). What they read
    /// becomes the new resize's cursor and taken positions; append it to [`Self::resizes`] to
    /// plan the rest of the epoch on another world size.
    pub fn resize_after(&self, steps: &[u64]) -> Result<Resize> {
        let world = u64::from(self.config.world_size);
        if steps.len() as u64 != world {
            return Err(Error::InvalidSpec(format!(
                "a resize needs the steps of all {world} ranks, got {}",
                steps.len()
            )));
        }
        if let Some(step) = steps.iter().find(|&&s| s > self.steps) {
            return Err(Error::InvalidSpec(format!(
                "step {step} is past the end of the epoch ({} steps)",
                self.steps
            )));
        }
        let batch = u64::from(self.config.batch_size);
        // Positions a rank reads: the first `read` of its stride (capped at its share).
        let read = |s: u64| (s * batch).min(self.samples_per_rank);
        let common = steps.iter().copied().min().unwrap_or(0);
        if common == self.steps {
            // Every rank finished: nothing is left (not even a tail the rules dropped).
            return Ok(Resize {
                cursor: self.len,
                taken: Vec::new(),
            });
        }
        let cursor = (read(common) * world).min(self.len);
        let mut taken: Vec<u64> = Vec::new();
        for (rank, &s) in steps.iter().enumerate() {
            for position in read(common)..read(s) {
                let global = rank as u64 + position * world;
                // Positions past the end were padding: repeats of read ones, not new samples.
                if global < self.len {
                    taken.push(global);
                }
            }
        }
        taken.sort_unstable();
        taken.dedup();
        Ok(Resize { cursor, taken })
    }

    /// Plans `epoch` of a source made of shards, whose samples are contiguous per shard in
    /// index order: `shard_sizes` lists the samples of each shard in that order and must sum to
    /// `num_samples`.
    ///
    /// With `shuffle` and `shuffle_window >= 1`, the epoch order permutes the shard order (keyed
    /// by seed and epoch), groups consecutive permuted shards into windows of `shuffle_window`
    /// shards and permutes the samples of each window among themselves (keyed by seed, epoch
    /// and window), so reads stay within a few shards at a time. Otherwise it is the order of
    /// [`EpochPlan::new`] and `shard_sizes` is not used. The per-epoch table takes O(shards)
    /// memory; a lookup costs O(log shards).
    pub fn new_sharded(config: PlanConfig, epoch: u64, shard_sizes: &[u64]) -> Result<Self> {
        let mut plan = Self::new(config, epoch)?;
        if config.shuffle && config.shuffle_window > 0 {
            plan.order = Order::Sharded(Arc::new(ShardedOrder::new(
                shard_sizes,
                config.num_samples,
                config.shuffle_window,
                epoch_key(config.seed, epoch),
            )?));
        }
        Ok(plan)
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
        // Padding wraps around to the start of the strided order (only positions below
        // `samples_per_rank` are asked for, so `len` is not 0 here).
        let mut global = global % self.len.max(1);
        for resize in self.resizes.iter().rev() {
            global = resize.left(global);
        }
        match &self.order {
            Order::Identity => global,
            Order::Global(permutation) => permutation.apply(global),
            Order::Sharded(sharded) => sharded.apply(global),
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
            shuffle_window: 0,
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

    /// Dataset indices rank `rank` of `world` reads in batches `from..to` of `plan`'s epoch,
    /// after `resizes`.
    fn read(
        base: PlanConfig,
        world: u32,
        resizes: &[Resize],
        steps: std::ops::Range<u64>,
    ) -> Vec<Vec<u64>> {
        (0..world)
            .map(|rank| {
                let plan = EpochPlan::new(
                    PlanConfig {
                        rank,
                        world_size: world,
                        ..base
                    },
                    2,
                )
                .unwrap()
                .resized(resizes.to_vec())
                .unwrap();
                steps
                    .clone()
                    .take_while(|&s| s < plan.steps())
                    .flat_map(|s| plan.batch_indices(s))
                    .collect()
            })
            .collect()
    }

    fn plan_of(base: PlanConfig, world: u32, resizes: &[Resize]) -> EpochPlan {
        EpochPlan::new(
            PlanConfig {
                world_size: world,
                ..base
            },
            2,
        )
        .unwrap()
        .resized(resizes.to_vec())
        .unwrap()
    }

    /// Every sample of 0..n exactly once in `reads`.
    fn assert_exactly_once(n: u64, reads: &[Vec<u64>]) {
        let mut all: Vec<u64> = reads.iter().flatten().copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..n).collect::<Vec<u64>>());
    }

    #[test]
    fn no_resize_is_the_plain_plan() {
        let base = config(37, 4, 3);
        let plain = EpochPlan::new(base, 2).unwrap();
        let resized = EpochPlan::new(base, 2).unwrap().resized(vec![]).unwrap();
        assert_eq!(plain.steps(), resized.steps());
        for step in 0..plain.steps() {
            assert_eq!(plain.batch_indices(step), resized.batch_indices(step));
        }
    }

    #[test]
    fn four_ranks_resumed_on_two_and_two_on_three_read_each_sample_once() {
        // 96 samples, batches of 4: 4 ranks read 3 steps (48 samples), then 2 ranks the rest.
        let base = config(96, 4, 4);
        let before = read(base, 4, &[], 0..3);
        let resize = plan_of(base, 4, &[]).resize_after(&[3; 4]).unwrap();
        assert_eq!(resize.cursor, 48);
        let after = read(base, 2, std::slice::from_ref(&resize), 0..u64::MAX);
        assert_eq!(plan_of(base, 2, std::slice::from_ref(&resize)).steps(), 6);
        assert_exactly_once(96, &[before, after].concat());
        // 2 ranks read 5 steps of 60 samples (40), then 3 ranks the remaining 20 (no tail: 20 is
        // not a multiple of 3, so pad by the job's rule and count the repeats apart).
        let base = config(60, 4, 2);
        let before = read(base, 2, &[], 0..5);
        let resize = plan_of(base, 2, &[]).resize_after(&[5, 5]).unwrap();
        let plan = plan_of(base, 3, std::slice::from_ref(&resize));
        assert_eq!(plan.samples_per_rank(), 7, "ceil(20 / 3)");
        let after = read(base, 3, std::slice::from_ref(&resize), 0..u64::MAX);
        let mut all: Vec<u64> = [before, after].concat().into_iter().flatten().collect();
        assert_eq!(all.len(), 61, "one padded repeat");
        all.sort_unstable();
        all.dedup();
        assert_eq!(all, (0..60).collect::<Vec<u64>>());
    }

    #[test]
    fn ranks_ahead_of_the_slowest_are_not_repeated() {
        let base = config(120, 3, 4);
        let steps = [2, 5, 3, 2];
        let plan = plan_of(base, 4, &[]);
        let before: Vec<Vec<u64>> = (0..4)
            .map(|rank| {
                let plan = EpochPlan::new(PlanConfig { rank, ..base }, 2).unwrap();
                (0..steps[rank as usize])
                    .flat_map(|s| plan.batch_indices(s))
                    .collect()
            })
            .collect();
        let resize = plan.resize_after(&steps).unwrap();
        assert_eq!(resize.cursor, 2 * 3 * 4);
        assert_eq!(resize.taken.len(), (3 + 1) * 3);
        // 120 - 24 - 12 = 84 left, 14 for each of 6 ranks.
        let after = read(base, 6, std::slice::from_ref(&resize), 0..u64::MAX);
        assert_exactly_once(120, &[before, after].concat());
    }

    #[test]
    fn a_second_resize_in_the_same_epoch_composes() {
        // 4 ranks, 2 steps; then 2 ranks, 3 steps; then 3 ranks read the rest.
        let base = PlanConfig {
            shuffle_window: 0,
            ..config(200, 5, 4)
        };
        let first = plan_of(base, 4, &[]).resize_after(&[2; 4]).unwrap();
        let second = plan_of(base, 2, std::slice::from_ref(&first))
            .resize_after(&[3, 3])
            .unwrap();
        let chain = [first.clone(), second];
        let reads = [
            read(base, 4, &[], 0..2),
            read(base, 2, std::slice::from_ref(&first), 0..3),
            read(base, 3, &chain, 0..u64::MAX),
        ]
        .concat();
        // 200 - 40 - 30 = 130 left over 3 ranks: ceil(130 / 3) * 3 = 132, two padded repeats.
        let mut all: Vec<u64> = reads.into_iter().flatten().collect();
        assert_eq!(all.len(), 202);
        all.sort_unstable();
        all.dedup();
        assert_eq!(all, (0..200).collect::<Vec<u64>>());
    }

    #[test]
    fn a_finished_epoch_leaves_nothing_and_bad_counts_are_refused() {
        let base = PlanConfig {
            drop_last: true,
            uneven_tail: UnevenTail::Drop,
            ..config(50, 4, 3)
        };
        let plan = plan_of(base, 3, &[]);
        let done = plan.resize_after(&[plan.steps(); 3]).unwrap();
        assert_eq!(plan_of(base, 2, &[done]).steps(), 0);
        assert!(
            plan.resize_after(&[1, 1]).is_err(),
            "two counts for three ranks"
        );
        assert!(plan.resize_after(&[1, 1, plan.steps() + 1]).is_err());
    }
}
