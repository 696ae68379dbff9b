//! Property tests of the epoch planner: the invariants the determinism contract rests on.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use proptest::prelude::*;
use stoker_pipeline::{EpochPlan, Permutation, PlanConfig};
use stoker_proto::v1::UnevenTail;

/// Checks the padded ranks of `n` samples over `world`: each rank has `n / world` samples
/// (rounded up), every sample is seen, and the repeats add up to the padding. Returns how often
/// each sample is seen, and the padding.
fn padded_coverage(
    ranks: &[Vec<u64>],
    n: u64,
    world: u32,
) -> Result<(Vec<u32>, u64), TestCaseError> {
    let per_rank = n.div_ceil(u64::from(world));
    let mut counts = vec![0u32; n as usize];
    for indices in ranks {
        prop_assert_eq!(indices.len() as u64, per_rank);
        for &i in indices {
            counts[i as usize] += 1;
        }
    }
    let padding = per_rank * u64::from(world) - n;
    prop_assert!(counts.iter().all(|&c| c >= 1));
    prop_assert_eq!(
        counts.iter().map(|&c| u64::from(c - 1)).sum::<u64>(),
        padding
    );
    Ok((counts, padding))
}

fn all_ranks(config: PlanConfig, epoch: u64) -> Vec<Vec<u64>> {
    (0..config.world_size)
        .map(|rank| {
            let plan = EpochPlan::new(PlanConfig { rank, ..config }, epoch).unwrap();
            (0..plan.steps())
                .flat_map(|s| plan.batch_indices(s))
                .collect()
        })
        .collect()
}

/// The dataset indices of each rank in the shard-aware order over `sizes`.
fn all_ranks_sharded(config: PlanConfig, epoch: u64, sizes: &[u64]) -> Vec<Vec<u64>> {
    (0..config.world_size)
        .map(|rank| {
            let plan = EpochPlan::new_sharded(PlanConfig { rank, ..config }, epoch, sizes).unwrap();
            (0..plan.steps())
                .flat_map(|s| plan.batch_indices(s))
                .collect()
        })
        .collect()
}

/// A single-rank, shard-aware shuffle config over `sizes` with windows of `window` shards.
fn sharded_config(sizes: &[u64], seed: u64, window: u32) -> PlanConfig {
    PlanConfig {
        num_samples: sizes.iter().sum(),
        batch_size: 4,
        seed,
        shuffle: true,
        drop_last: false,
        rank: 0,
        world_size: 1,
        uneven_tail: UnevenTail::Pad,
        shuffle_window: window,
    }
}

/// The shard holding each dataset index, for contiguous shards of `sizes`.
fn shard_of(sizes: &[u64]) -> Vec<usize> {
    sizes
        .iter()
        .enumerate()
        .flat_map(|(shard, &size)| std::iter::repeat_n(shard, size as usize))
        .collect()
}

/// The whole epoch order of a single-rank plan, as shards visited (consecutive repeats merged).
fn shard_sequence(plan: &EpochPlan, sizes: &[u64]) -> Vec<usize> {
    let shards = shard_of(sizes);
    let mut sequence: Vec<usize> = (0..plan.config().num_samples)
        .map(|p| shards[plan.sample_at(p) as usize])
        .collect();
    sequence.dedup();
    sequence
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn permutation_is_a_bijection(n in 1u64..3000, key in any::<u64>()) {
        let perm = Permutation::new(n, key);
        let mut seen = vec![false; n as usize];
        for i in 0..n {
            let v = perm.apply(i);
            prop_assert!(v < n);
            prop_assert!(!seen[v as usize]);
            seen[v as usize] = true;
        }
    }

    #[test]
    fn permutation_of_large_domains_stays_in_range(exp in 20u32..41, extra in 0u64..1000, key in any::<u64>(), probe in any::<u64>()) {
        let n = (1u64 << exp) + extra;
        let perm = Permutation::new(n, key);
        prop_assert!(perm.apply(probe % n) < n);
    }

    #[test]
    fn every_sample_once_per_epoch_across_ranks(
        n in 1u64..500, batch in 1u32..17, world in 1u32..9, seed in any::<u64>(),
        epoch in 0u64..5, shuffle in any::<bool>(),
    ) {
        let config = PlanConfig {
            num_samples: n, batch_size: batch, seed, shuffle, drop_last: false,
            rank: 0, world_size: world, uneven_tail: UnevenTail::Pad, shuffle_window: 0,
        };
        let (counts, padding) = padded_coverage(&all_ranks(config, epoch), n, world)?;
        // Only the wrap-around padding repeats, spread evenly (it wraps more than once only
        // when there are fewer samples than ranks).
        let most = 1 + padding.div_ceil(n) as u32;
        prop_assert!(counts.iter().all(|&c| c <= most));
        if padding == 0 {
            prop_assert!(counts.iter().all(|&c| c == 1));
        }
    }

    #[test]
    fn dropped_tail_gives_disjoint_ranks(
        n in 1u64..500, batch in 1u32..17, world in 1u32..9, seed in any::<u64>(), drop_last in any::<bool>(),
    ) {
        let config = PlanConfig {
            num_samples: n, batch_size: batch, seed, shuffle: true, drop_last,
            rank: 0, world_size: world, uneven_tail: UnevenTail::Drop, shuffle_window: 0,
        };
        let ranks = all_ranks(config, 0);
        let mut seen = std::collections::HashSet::new();
        let steps: Vec<usize> = ranks.iter().map(|r| r.len()).collect();
        prop_assert!(steps.windows(2).all(|w| w[0] == w[1]), "ranks differ in length");
        for indices in &ranks {
            for &i in indices { prop_assert!(seen.insert(i), "sample {} on two ranks", i); }
        }
        if !drop_last {
            prop_assert_eq!(seen.len() as u64, n / u64::from(world) * u64::from(world));
        }
    }

    #[test]
    fn same_seed_same_order_new_epoch_new_order(n in 16u64..2000, seed in any::<u64>(), epoch in 0u64..100) {
        let config = PlanConfig {
            num_samples: n, batch_size: 8, seed, shuffle: true, drop_last: false,
            rank: 0, world_size: 1, uneven_tail: UnevenTail::Pad, shuffle_window: 0,
        };
        let order = |c: PlanConfig, e: u64| {
            let plan = EpochPlan::new(c, e).unwrap();
            (0..n).map(|p| plan.sample_at(p)).collect::<Vec<_>>()
        };
        let first = order(config, epoch);
        prop_assert_eq!(&first, &order(config, epoch));
        prop_assert_ne!(&first, &order(config, epoch + 1));
        prop_assert_ne!(&first, &order(PlanConfig { seed: seed ^ 1, ..config }, epoch));
    }

    #[test]
    fn sharded_order_is_a_bijection(
        sizes in prop::collection::vec(0u64..40, 1..20), window in 1u32..5, seed in any::<u64>(),
        epoch in 0u64..5,
    ) {
        let n: u64 = sizes.iter().sum();
        prop_assume!(n > 0);
        let plan = EpochPlan::new_sharded(sharded_config(&sizes, seed, window), epoch, &sizes).unwrap();
        let mut seen = vec![false; n as usize];
        for p in 0..n {
            let v = plan.sample_at(p);
            prop_assert!(v < n);
            prop_assert!(!seen[v as usize], "sample {} twice", v);
            seen[v as usize] = true;
        }
    }

    #[test]
    fn sharded_order_gives_every_sample_once_across_ranks(
        sizes in prop::collection::vec(0u64..40, 1..20), window in 1u32..5, batch in 1u32..9,
        world in 1u32..6, seed in any::<u64>(), epoch in 0u64..5,
    ) {
        let n: u64 = sizes.iter().sum();
        prop_assume!(n > 0);
        let config = PlanConfig { batch_size: batch, world_size: world, ..sharded_config(&sizes, seed, window) };
        padded_coverage(&all_ranks_sharded(config, epoch, &sizes), n, world)?;
    }

    #[test]
    fn window_of_one_reads_one_shard_at_a_time(
        sizes in prop::collection::vec(1u64..30, 1..25), seed in any::<u64>(), epoch in 0u64..5,
    ) {
        let plan = EpochPlan::new_sharded(sharded_config(&sizes, seed, 1), epoch, &sizes).unwrap();
        let sequence = shard_sequence(&plan, &sizes);
        // Each shard is one run: crossings == shards - 1, and every shard is visited.
        prop_assert_eq!(sequence.len(), sizes.len());
        let mut visited = sequence.clone();
        visited.sort_unstable();
        prop_assert_eq!(visited, (0..sizes.len()).collect::<Vec<_>>());
    }

    #[test]
    fn windows_keep_reads_within_their_shards(
        sizes in prop::collection::vec(1u64..30, 2..25), window in 1u32..5, seed in any::<u64>(),
    ) {
        let plan = EpochPlan::new_sharded(sharded_config(&sizes, seed, window), 0, &sizes).unwrap();
        let shards = shard_of(&sizes);
        // Positions of one window touch exactly `window` shards (fewer in the last window).
        let order: Vec<usize> = (0..plan.config().num_samples)
            .map(|p| shards[plan.sample_at(p) as usize])
            .collect();
        let mut seen = std::collections::HashSet::new();
        let mut windows = Vec::new();
        let mut current = std::collections::BTreeSet::new();
        for &shard in &order {
            if !current.contains(&shard) && current.len() == window as usize {
                windows.push(std::mem::take(&mut current));
            }
            prop_assert!(current.contains(&shard) || seen.insert(shard), "shard {} revisited", shard);
            current.insert(shard);
        }
        windows.push(current);
        prop_assert_eq!(windows.len(), sizes.len().div_ceil(window as usize));
    }

    #[test]
    fn sharded_order_is_seeded_by_seed_and_epoch(
        sizes in prop::collection::vec(1u64..20, 10..30), window in 1u32..5, seed in any::<u64>(),
        epoch in 0u64..100,
    ) {
        let config = sharded_config(&sizes, seed, window);
        let order = |c: PlanConfig, e: u64| {
            let plan = EpochPlan::new_sharded(c, e, &sizes).unwrap();
            (0..c.num_samples).map(|p| plan.sample_at(p)).collect::<Vec<_>>()
        };
        let shards = |c: PlanConfig, e: u64| {
            shard_sequence(&EpochPlan::new_sharded(c, e, &sizes).unwrap(), &sizes)
        };
        let first = order(config, epoch);
        prop_assert_eq!(&first, &order(config, epoch));
        if window == 1 {
            // With one shard per window the visited shard sequence is the shard order.
            let first_shards = shards(config, epoch);
            prop_assert_eq!(&first_shards, &shards(config, epoch));
            prop_assert_ne!(&first_shards, &shards(config, epoch + 1));
            prop_assert_ne!(&first_shards, &shards(PlanConfig { seed: seed ^ 1, ..config }, epoch));
        }
        prop_assert_ne!(&first, &order(config, epoch + 1));
        prop_assert_ne!(&first, &order(PlanConfig { seed: seed ^ 1, ..config }, epoch));
    }
}

#[test]
fn sharded_plans_fall_back_and_check_sizes() {
    let sizes = [3u64, 0, 5, 2];
    let config = sharded_config(&sizes, 9, 0);
    // Window 0 is the global shuffle; no shuffle is dataset order, whatever the shards.
    let global = EpochPlan::new(config, 1).unwrap();
    let sharded = EpochPlan::new_sharded(config, 1, &sizes).unwrap();
    assert!((0..10).all(|p| global.sample_at(p) == sharded.sample_at(p)));
    let unshuffled = PlanConfig {
        shuffle: false,
        shuffle_window: 2,
        ..config
    };
    let plan = EpochPlan::new_sharded(unshuffled, 1, &sizes).unwrap();
    assert!((0..10).all(|p| plan.sample_at(p) == p));
    // Sizes must cover the dataset exactly.
    let windowed = PlanConfig {
        shuffle_window: 2,
        ..config
    };
    for bad in [&[3u64, 5][..], &[][..], &[u64::MAX, 11][..]] {
        assert!(EpochPlan::new_sharded(windowed, 0, bad).is_err());
    }
}
