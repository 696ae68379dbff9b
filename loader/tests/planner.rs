//! Property tests of the epoch planner: the invariants the determinism contract rests on.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use proptest::prelude::*;
use stoker_loader::{EpochPlan, Permutation, PlanConfig};
use stoker_proto::v1::UnevenTail;

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
            rank: 0, world_size: world, uneven_tail: UnevenTail::Pad,
        };
        let ranks = all_ranks(config, epoch);
        let per_rank = n.div_ceil(u64::from(world));
        let mut counts = vec![0u32; n as usize];
        for indices in &ranks {
            prop_assert_eq!(indices.len() as u64, per_rank);
            for &i in indices { counts[i as usize] += 1; }
        }
        // Every sample is seen; only the wrap-around padding repeats, spread evenly (it wraps
        // more than once only when there are fewer samples than ranks).
        let padding = per_rank * u64::from(world) - n;
        let most = 1 + padding.div_ceil(n) as u32;
        prop_assert!(counts.iter().all(|&c| c >= 1 && c <= most));
        prop_assert_eq!(counts.iter().map(|&c| u64::from(c - 1)).sum::<u64>(), padding);
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
            rank: 0, world_size: world, uneven_tail: UnevenTail::Drop,
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
            rank: 0, world_size: 1, uneven_tail: UnevenTail::Pad,
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
}
