//! Stoker's decode workers: the pipeline ops that turn encoded samples into tensors, and batch
//! assembly.
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
//! use stoker_worker::{presets, Pipeline};
//! let pipeline = Pipeline::from_ops(&presets::imagenet_train(224)).unwrap();
//! assert_eq!(pipeline.image_shape(64), vec![64, 224, 224, 3]);
//! assert_eq!(pipeline.bytes_per_sample(), 224 * 224 * 3);
//! ```

mod batch;
mod error;
#[doc(hidden)]
pub mod fuzz_targets;
mod job_pipeline;
mod ops;
mod pipeline;
pub mod presets;
mod rng;

pub use batch::{AssembledBatch, BatchAssembler, BatchKey, TensorLayout, MAX_SUBSTITUTE_TRIES};
pub use error::{Error, Result, SampleError};
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
pub use ops::tokenize::{train_bpe_tokenizer, TextTokenizer, EOS_CANDIDATES};
pub use pipeline::{Geometry, Pipeline, SampleTimings, Scratch, IMAGE_ORDERS, MAX_SIDE};
pub use rng::SampleRng;
