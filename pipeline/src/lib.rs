//! Stoker's batch pipeline (the workers' core): the epoch plan and the job spec, the pipeline ops that turn encoded
//! samples into tensors, and batch assembly. No network here: the worker daemon of the
//! distributed mode (`stoker-worker-daemon`) and the wire (`stoker-rpc`) sit on top.
//!
//! A batch is a pure function of (job spec, epoch, rank, step): the [`EpochPlan`] says which
//! samples it holds, and a [`Job`] (a spec opened: dataset, checked pipeline, plan) builds it.
//! The coordinator, the embedded loader and the worker daemon (the `stoker-worker` binary) all
//! plan with the same code. [`ErrorKind`] is what callers tell errors apart by, here and, through
//! `stoker-rpc`'s status table, across the wire.
//!
//! A job's op list (protobuf, see `stoker-proto`) is checked and fused into a [`Pipeline`]:
//! the crop window is drawn from the image size alone, so JPEGs are decoded only over that
//! region (and at a reduced DCT scale when it is much larger than the output), resampled once
//! with PIL's antialiased bilinear filter, flipped, and written straight into the batch buffer.
//! Every random draw comes from [`SampleRng`], seeded by (seed, epoch, sample index): batches
//! do not depend on thread counts or timing.
//!
//! Token pipelines sit beside it in [`JobPipeline`]: fixed windows of a token file
//! (`TokenWindows`), or text tokenised with a Hugging Face `tokenizer.json` and packed into rows
//! of `seq_len` tokens with EOS between documents (`Tokenize`, `PackSequences`; the packing rule
//! is documented on [`pack_documents`]). [`BatchAssembler`] runs any of them under the same
//! bad-input policy and stage timings.
//!
//! ```
//! use stoker_pipeline::{EpochPlan, PlanConfig};
//! use stoker_proto::v1::UnevenTail;
//! let config = PlanConfig {
//!     num_samples: 10, batch_size: 4, seed: 7, shuffle: true, drop_last: false,
//!     rank: 0, world_size: 1, uneven_tail: UnevenTail::Pad, shuffle_window: 0,
//! };
//! let plan = EpochPlan::new(config, 0).unwrap();
//! assert_eq!(plan.steps(), 3);
//! let mut seen: Vec<u64> = (0..3).flat_map(|s| plan.batch_indices(s)).collect();
//! seen.sort();
//! assert_eq!(seen, (0..10).collect::<Vec<_>>());
//! ```
//!
//! ```
//! use stoker_pipeline::{presets, Pipeline};
//! let pipeline = Pipeline::from_ops(&presets::imagenet_train(224)).unwrap();
//! assert_eq!(pipeline.image_shape(64), vec![64, 224, 224, 3]);
//! assert_eq!(pipeline.bytes_per_sample(), 224 * 224 * 3);
//! ```

mod batch;
mod error;
/// The fuzz targets' bodies (`fuzz/`), behind the `fuzzing` feature: the fuzz crate and this
/// crate's corpus replay tests turn it on; a build for users leaves them out.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzz_targets;
mod job;
mod job_pipeline;
mod ops;
mod pipeline;
mod plan;
pub mod presets;
mod rng;

pub use batch::{
    mix_samples, AssembledBatch, Batch, BatchAssembler, BatchKey, DivertedImage, ImageDiverter,
    LaneRows, Tensor, TensorLayout, MAX_SUBSTITUTE_TRIES,
};
pub use error::{kind_of_opening, panic_text, Error, ErrorKind, Result, SampleError, ERROR_KINDS};
pub use job::{
    check_spec_shape, fingerprint as dataset_fingerprint, open_source, open_sources, plan_for_spec,
    source_names, source_split, spec_sources, token_dtype_fits, BatchBuffer, Job,
    FINGERPRINT_SAMPLES, MAX_BATCH_SIZE, MAX_WORLD_SIZE,
};
pub use job_pipeline::{
    check_op, lacks_decode_image, token_dtype_proto, JobPipeline, PackedText, SelectedColumns,
    COLUMNS_ORDER, TOKEN_ORDERS,
};
pub use ops::decode::{
    decode, read_header, DecodeRequest, DecodedImage, ImageHeader, DEFAULT_MAX_PIXELS,
};
pub use ops::geometry::{
    center_crop_offset, random_resized_crop_window, resize_shorter_side, CropWindow,
    RandomResizedCropRange,
};
pub use ops::pack::{pack_documents, PackSpec, PackSummary, PackedRowsMut};
pub use ops::resample::{flip_horizontal, resample, SourceWindow};
pub use ops::tensor::{ImageDtype, ImageLayout, OutputFormat};
pub use ops::tokenize::{train_bpe_tokenizer, TextTokenizer, TokenizerEngine, EOS_CANDIDATES};
pub use pipeline::{Geometry, Pipeline, SampleTimings, Scratch, IMAGE_ORDERS, MAX_SIDE};
pub use plan::mix::source_seed;
pub use plan::{resized_spec, EpochPlan, MixEnd, MixOrder, Permutation, PlanConfig, Resize};
pub use rng::{sample_seed, SampleRng};
/// A third-party library's panic on untrusted bytes as an error, not printed as a crash.
pub use stoker_datasets::without_panics;
