//! The soak's data: the job every process agrees on, and the generated set it reads.

use std::path::{Path, PathBuf};

use stoker_proto::v1::{self as proto, op::Op as OpKind, JobSpec};

use super::{DataKind, SoakBench};
use crate::bench::{Error, Result};

/// Tokens per window of a token soak (plus the next-token target).
const SEQ_LEN: u32 = 128;

/// The job every soak process agrees on, for `rank` of `world`.
pub(crate) fn spec(data: &Path, kind: DataKind, rank: u32, world: u32, batch: u32) -> JobSpec {
    let pipeline = match kind {
        DataKind::Images => stoker_pipeline::presets::imagenet_train(32),
        DataKind::Tokens => vec![proto::Op {
            op: Some(OpKind::TokenWindows(proto::TokenWindows {
                seq_len: SEQ_LEN,
                ..Default::default()
            })),
        }],
    };
    JobSpec {
        dataset: Some(proto::DatasetSource {
            uri: data.to_string_lossy().into_owned(),
            ..Default::default()
        }),
        pipeline,
        batch_size: batch,
        seed: 5,
        shuffle: true,
        drop_last: false,
        rank,
        world_size: world,
        uneven_tail: proto::UnevenTail::Pad as i32,
        // Every sample is good: any failed read must show, not be replaced.
        on_error: proto::BadSamplePolicy::Fail as i32,
        shuffle_window: 0,
        resized_epoch: None,
        mix: None,
    }
}

/// Writes the dataset under `root` and returns its path.
pub(super) fn make_data(root: &Path, args: &SoakBench) -> Result<PathBuf> {
    match args.kind {
        DataKind::Images => {
            let data = root.join("images");
            let spec = stoker_datasets::SyntheticImageNetSpec {
                count: args.samples,
                seed: args.seed,
                classes: 10,
            };
            stoker_datasets::generate_imagenet_like(&data, &spec, &|_| {})
                .map_err(|e| Error::Failed(format!("cannot write the soak's images: {e}")))?;
            Ok(data)
        }
        DataKind::Tokens => {
            let data = root.join("tokens.bin");
            let spec = stoker_datasets::SyntheticTokensSpec {
                tokens: args.samples * u64::from(SEQ_LEN + 1),
                vocab: 50_257,
                dtype: stoker_datasets::TokenDtype::Uint16,
                seed: args.seed,
            };
            stoker_datasets::write_synthetic_tokens(&data, &spec)
                .map_err(|e| Error::Failed(format!("cannot write the soak's tokens: {e}")))?;
            Ok(data)
        }
    }
}
