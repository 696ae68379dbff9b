//! Shared fixtures of the loader's integration tests: small generated image sets and specs.

#![allow(dead_code)]

use std::path::Path;

use stoker_datasets::{generate_imagenet_like, SyntheticImageNetSpec};
use stoker_proto::v1::{self as proto, BadSamplePolicy, JobSpec};

/// Writes a seeded ImageNet-like set of `count` images under `dir`.
pub fn make_images(dir: &Path, count: u64) {
    let spec = SyntheticImageNetSpec {
        count,
        seed: 11,
        classes: 10,
    };
    generate_imagenet_like(dir, &spec, &|_| {}).expect("sample set");
}

/// The imagenet-train spec over `dir` at a small output size (fast tests).
pub fn train_spec(dir: &Path, batch_size: u32) -> JobSpec {
    JobSpec {
        dataset: Some(proto::DatasetSource {
            uri: dir.to_string_lossy().into_owned(),
            format: 0,
        }),
        pipeline: stoker_worker::presets::imagenet_train(32),
        batch_size,
        seed: 3,
        shuffle: true,
        drop_last: false,
        rank: 0,
        world_size: 1,
        uneven_tail: 0,
        on_error: BadSamplePolicy::Skip as i32,
        shuffle_window: 0,
    }
}
