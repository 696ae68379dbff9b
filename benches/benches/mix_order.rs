//! Lookups of one batch's samples in a mixed order against the plain order's, per sample: a
//! rank of 53 walking its batches of 98 through a two-source mix (0.7 / 0.3) shuffled in
//! windows of the default 100 positions and of the widest, 2^20. "walking" reads the steps in
//! order, as a rank does (the windows it met stay laid out); "cold" reads one step per window,
//! so every batch lays its window out whole (what every batch paid before windows were kept).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use stoker_pipeline::{EpochPlan, MixEnd, MixOrder, PlanConfig};
use stoker_proto::v1::UnevenTail;

const BATCH: u32 = 98;
const WORLD: u32 = 53;
const RANK: u32 = 17;

/// A rank's plan over `len` positions (the planner's strides over the mixed order).
fn rank_plan(len: u64, shuffle: bool) -> EpochPlan {
    let config = PlanConfig {
        num_samples: len,
        batch_size: BATCH,
        seed: 7,
        shuffle,
        drop_last: true,
        rank: RANK,
        world_size: WORLD,
        uneven_tail: UnevenTail::Pad,
        shuffle_window: 0,
    };
    match EpochPlan::new(config, 0) {
        Ok(plan) => plan,
        Err(error) => panic!("plan: {error}"),
    }
}

fn mix_lookups(c: &mut Criterion) {
    let mut group = c.benchmark_group("mix_batch_lookup");
    group.throughput(Throughput::Elements(u64::from(BATCH)));
    let lens = [14_000_000u64, 6_000_000];
    let plain = rank_plan(lens[0] + lens[1], true);
    let mut step = 0u64;
    group.bench_function("plain_order", |b| {
        b.iter(|| {
            step = (step + 1) % plain.steps();
            black_box(plain.batch_indices(step))
        })
    });
    for window in [100u32, 1 << 20] {
        let order = match MixOrder::new(&[0.7, 0.3], &lens, window, MixEnd::FirstExhausted, 7, true)
        {
            Ok(order) => order,
            Err(error) => panic!("mix: {error}"),
        };
        let plan = rank_plan(order.epoch_len(), false);
        let span = u64::from(BATCH) * u64::from(WORLD);
        let mut step = 0u64;
        group.bench_function(format!("mix_window_{window}_walking"), |b| {
            b.iter(|| {
                step = (step + 1) % plan.steps();
                black_box(order.draws(0, &plan.batch_indices(step)))
            })
        });
        // One step per window: the next window's first whole batch.
        let stride = u64::from(window).div_ceil(span) + 1;
        let mut step = 0u64;
        group.bench_function(format!("mix_window_{window}_cold"), |b| {
            b.iter(|| {
                step = (step + stride) % plan.steps();
                black_box(order.draws(0, &plan.batch_indices(step)))
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .measurement_time(Duration::from_secs(4))
        .warm_up_time(Duration::from_secs(1));
    targets = mix_lookups
}
criterion_main!(benches);
