//! The bodies of the fuzz targets for the worker's parsers of untrusted bytes, as plain functions.
//!
//! `fuzz/` (libFuzzer, see its README) and the corpus replay in `tests/it/fuzz_replay.rs` call
//! the same function, so every seed and every crash input kept as a regression case is replayed
//! by the ordinary test run, without an instrumented build. A body returns normally whatever the
//! input; a panic (or an abort, a hang, an out-of-memory) is a bug.
//!
//! Errors from the code under test are the expected outcome for most inputs and are dropped;
//! the few `assert!`s check promises the code makes about what it returns.

use std::io;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use prost::Message;
use stoker_datasets::SampleSource;
use stoker_proto::v1::{self as proto, op::Op as OpKind};

use crate::ops::decode::{decode, read_header, DecodeRequest, DecodedImage};
use crate::ops::geometry::CropWindow;
use crate::ops::tokenize::{TextTokenizer, EOS_CANDIDATES};
use crate::pipeline::{Pipeline, SampleTimings, Scratch};
use crate::{check_op, lacks_decode_image, presets, BatchAssembler, BatchKey, JobPipeline};
use crate::{SampleRng, MAX_SIDE};

/// The pixel limit the image target decodes under: small enough that one input cannot hold
/// more than a few tens of megabytes, large enough for every seed.
pub const FUZZ_MAX_PIXELS: u64 = 1 << 22;

/// Output side of the pipelines the image target runs.
const PIPELINE_SIDE: u32 = 24;

/// Batches the job-spec target assembles are at most this large (an image pipeline may ask
/// for 16384x16384 float outputs, which the checks allow while a batch stays under 16 GiB).
const MAX_FUZZ_BATCH_BYTES: usize = 8 << 20;

/// The training and evaluation presets at a small size, under [`FUZZ_MAX_PIXELS`].
fn pipelines() -> &'static [Pipeline] {
    static PIPELINES: OnceLock<Vec<Pipeline>> = OnceLock::new();
    PIPELINES.get_or_init(|| {
        [
            presets::imagenet_train(PIPELINE_SIDE),
            presets::imagenet_eval(PIPELINE_SIDE),
        ]
        .into_iter()
        .map(|mut ops| {
            for op in &mut ops {
                if let Some(OpKind::DecodeImage(decode)) = &mut op.op {
                    decode.max_pixels = FUZZ_MAX_PIXELS;
                }
            }
            Pipeline::from_ops(&ops).expect("the presets are valid pipelines")
        })
        .collect()
    })
}

/// An encoded image: the header read with the pixel limit, a full decode, a region decode at
/// a reduced DCT scale, and both preset pipelines (crop, resize, flip) over it.
pub fn image(data: &[u8]) {
    let Ok(header) = read_header(data, FUZZ_MAX_PIXELS) else {
        return;
    };
    assert!(header.width > 0 && header.height > 0);
    assert!(u64::from(header.width) * u64::from(header.height) <= FUZZ_MAX_PIXELS);

    let mut decoded = DecodedImage::default();
    let full = DecodeRequest {
        region: None,
        target: (header.width, header.height),
        allow_dct_scaling: false,
        max_pixels: FUZZ_MAX_PIXELS,
    };
    if decode(data, &header, &full, &mut decoded).is_ok() {
        assert_eq!(
            (decoded.width, decoded.height),
            (header.width, header.height)
        );
        assert_eq!(
            decoded.pixels.len(),
            decoded.width as usize * decoded.height as usize * 3
        );
    }
    let region = DecodeRequest {
        region: Some(CropWindow {
            top: header.height / 4,
            left: header.width / 3,
            height: (header.height / 2).max(1),
            width: (header.width / 2).max(1),
        }),
        target: ((header.width / 16).max(1), (header.height / 16).max(1)),
        allow_dct_scaling: true,
        max_pixels: FUZZ_MAX_PIXELS,
    };
    if decode(data, &header, &region, &mut decoded).is_ok() {
        assert_eq!(
            decoded.pixels.len(),
            decoded.width as usize * decoded.height as usize * 3
        );
    }

    let mut scratch = Scratch::default();
    let mut timings = SampleTimings::default();
    for (seed, pipeline) in pipelines().iter().enumerate() {
        let mut dest = vec![0u8; pipeline.bytes_per_sample()];
        let mut rng = SampleRng::new(seed as u64, 0, 0);
        let _ = pipeline.process(data, &mut rng, &mut dest, &mut scratch, &mut timings);
    }
}

/// Text that reaches the tokenizer's normaliser, pre-tokeniser and added-token matcher.
const TOKENIZER_PROBE: &str = "Hello  world!\n\tcaf\u{e9} \u{1F600} <|endoftext|></s>[SEP] 12345 ";

/// A `tokenizer.json`: loaded the way the Tokenize op loads it (written to `scratch`, emptied
/// first), then asked for its vocabulary size and EOS id and made to encode a probe text.
pub fn tokenizer(data: &[u8], scratch: &Path) -> io::Result<()> {
    match std::fs::remove_dir_all(scratch) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    std::fs::create_dir_all(scratch)?;
    let path = scratch.join("tokenizer.json");
    std::fs::write(&path, data)?;
    let Ok(tokenizer) = TextTokenizer::load(&path) else {
        return Ok(());
    };
    let _ = tokenizer.vocab_size();
    let _ = tokenizer.eos_id();
    for candidate in EOS_CANDIDATES {
        let _ = tokenizer.encode(candidate);
    }
    let _ = tokenizer.encode(TOKENIZER_PROBE);
    Ok(())
}

/// A source of one small valid PNG, for building a batch with a fuzzed pipeline.
struct OneImage {
    png: Vec<u8>,
    /// Samples it has (each the same image).
    len: u64,
    /// Samples per shard, when it says it has shards.
    shards: Option<Vec<u64>>,
}

impl OneImage {
    fn shared() -> Arc<dyn SampleSource> {
        Self::repeated(1, None)
    }

    /// `len` samples, all the same small PNG, in `shards` when given.
    fn repeated(len: u64, shards: Option<Vec<u64>>) -> Arc<dyn SampleSource> {
        static PNG: OnceLock<Vec<u8>> = OnceLock::new();
        let png = PNG.get_or_init(|| {
            let (width, height) = (20u32, 12u32);
            let pixels: Vec<u8> = (0..width * height * 3).map(|i| (i * 7) as u8).collect();
            let mut out = Vec::new();
            let mut encoder = png::Encoder::new(&mut out, width, height);
            encoder.set_color(png::ColorType::Rgb);
            encoder.set_depth(png::BitDepth::Eight);
            encoder
                .write_header()
                .and_then(|mut writer| writer.write_image_data(&pixels))
                .expect("an in-memory PNG encodes");
            out
        });
        Arc::new(OneImage {
            png: png.clone(),
            len,
            shards,
        })
    }
}

impl SampleSource for OneImage {
    fn len(&self) -> u64 {
        self.len
    }

    fn label(&self, _index: u64) -> i64 {
        0
    }

    fn describe(&self, index: u64) -> String {
        format!("fuzz image {index}")
    }

    fn read(&self, _index: u64) -> stoker_datasets::Result<Vec<u8>> {
        Ok(self.png.clone())
    }

    fn class_names(&self) -> &[String] {
        &[]
    }

    fn shard_sizes(&self) -> Option<Vec<u64>> {
        self.shards.clone()
    }
}

/// A `JobSpec` as a daemon receives it: protobuf bytes decoded, then every check of the op
/// list that reads no file (the per-op checks, the whole-list check, the pipeline compiled
/// when it names no tokenizer file), the batch assembler set up over a one-image source, and,
/// for an image pipeline whose batch stays small, one batch built with it.
pub fn job_spec(data: &[u8]) {
    let Ok(spec) = proto::JobSpec::decode(data) else {
        return;
    };
    let ops = &spec.pipeline;
    for op in ops {
        let _ = check_op(op);
    }
    let _ = lacks_decode_image(ops);
    let checked = JobPipeline::check(ops);
    let reads_a_file = ops
        .iter()
        .any(|op| matches!(op.op, Some(OpKind::Tokenize(_))));
    if reads_a_file {
        return;
    }
    let compiled = JobPipeline::from_ops(ops);
    // `check` promises every error `from_ops` gives but a tokenizer's.
    assert_eq!(
        checked.is_ok(),
        compiled.is_ok(),
        "check and from_ops disagree"
    );
    let Ok(pipeline) = compiled else {
        return;
    };
    let image_bytes = pipeline.image().map(|image| {
        let (height, width) = image.output_size();
        assert!(height <= MAX_SIDE && width <= MAX_SIDE);
        image.bytes_per_sample()
    });
    let Ok(assembler) =
        BatchAssembler::new(OneImage::shared(), pipeline, spec.seed, spec.on_error())
    else {
        return;
    };
    if image_bytes.is_some_and(|bytes| bytes <= MAX_FUZZ_BATCH_BYTES) {
        let key = BatchKey {
            epoch: 0,
            rank: 0,
            step: 0,
        };
        let _ = assembler.assemble(key, &[0]);
    }
}

/// Samples of one source of the `job_plan` target, at most (so that one input stays fast).
const MAX_FUZZ_SOURCE_LEN: u64 = 1 << 20;

/// Steps of one plan the `job_plan` target looks up, and sources of a mix, at most.
const MAX_FUZZ_STEPS: usize = 16;

/// Positions of mix windows one `job_plan` input lays out at most: two batches at the bound.
const MAX_FUZZ_LAYOUT: u64 = 2 * crate::plan::mix::MAX_MIX_LAYOUT_PER_BATCH;

/// A number as the `job_plan` input gives it: mostly small (where the checks pass and the
/// planner works), sometimes anything (where they must refuse, or cope).
#[derive(Debug, Clone, Copy, arbitrary::Arbitrary)]
enum Number {
    Small(u8),
    Any(u64),
}

impl Number {
    fn get(self) -> u64 {
        match self {
            Number::Small(n) => u64::from(n),
            Number::Any(n) => n,
        }
    }

    /// The low 32 bits.
    fn get32(self) -> u32 {
        self.get() as u32
    }

    /// As a protobuf enum value of `known` values: mostly one of them or the first one past
    /// them, sometimes anything.
    fn pick(self, known: u8) -> i32 {
        match self {
            Number::Small(n) => i32::from(n % (known + 1)),
            Number::Any(n) => n as i32,
        }
    }

    /// As a mix weight: small ones in quarters, any other from its bits (NaN, infinities,
    /// negatives and subnormals included).
    fn weight(self) -> f64 {
        match self {
            Number::Small(n) => f64::from(n) / 4.0,
            Number::Any(bits) => f64::from_bits(bits),
        }
    }
}

/// A job as `arbitrary` builds it from the fuzzer's bytes: every field of the spec that the
/// coordinator and the daemons check or plan with, the datasets replaced by sources of the
/// sizes (and shards) it chooses.
#[derive(Debug, arbitrary::Arbitrary)]
struct FuzzJob {
    batch_size: Number,
    seed: u64,
    shuffle: bool,
    drop_last: bool,
    rank: Number,
    world_size: Number,
    uneven_tail: Number,
    on_error: Number,
    shuffle_window: Number,
    /// The sources: one for a plain job, one per mixed source for a mix (missing ones are
    /// empty sources).
    sources: Vec<FuzzSource>,
    mix: Option<FuzzMix>,
    resized: Option<FuzzResized>,
    /// The epoch planned (a resized job plans its own).
    epoch: Number,
    /// Steps looked up, besides the first and the last.
    steps: Vec<u64>,
}

#[derive(Debug, arbitrary::Arbitrary)]
struct FuzzSource {
    len: Number,
    /// Samples per shard (when some are given, the source says it has shards).
    shards: Vec<u8>,
}

#[derive(Debug, arbitrary::Arbitrary)]
struct FuzzMix {
    weights: Vec<Number>,
    window: Number,
    epoch_end: Number,
    epoch_samples: Option<Number>,
}

#[derive(Debug, arbitrary::Arbitrary)]
struct FuzzResized {
    epoch: Number,
    resizes: Vec<(Number, Vec<Number>)>,
}

impl FuzzJob {
    /// The spec, and the sources standing for its datasets.
    fn spec_and_sources(&self) -> (proto::JobSpec, Vec<Arc<dyn SampleSource>>) {
        let pipeline = presets::imagenet_eval(PIPELINE_SIDE);
        let dataset = |k: usize| proto::DatasetSource {
            uri: format!("/fuzz/{k}"),
            ..Default::default()
        };
        let wanted = self
            .mix
            .as_ref()
            .map_or(1, |mix| mix.weights.len().min(MAX_FUZZ_STEPS));
        let sources = (0..wanted)
            .map(|k| match self.sources.get(k) {
                Some(source) if !source.shards.is_empty() => {
                    let shards: Vec<u64> = source.shards.iter().map(|&n| u64::from(n)).collect();
                    OneImage::repeated(shards.iter().sum(), Some(shards))
                }
                Some(source) => OneImage::repeated(source.len.get() % MAX_FUZZ_SOURCE_LEN, None),
                None => OneImage::repeated(0, None),
            })
            .collect();
        let mut spec = proto::JobSpec {
            dataset: None,
            pipeline: Vec::new(),
            batch_size: self.batch_size.get32(),
            seed: self.seed,
            shuffle: self.shuffle,
            drop_last: self.drop_last,
            rank: self.rank.get32(),
            world_size: self.world_size.get32(),
            uneven_tail: self.uneven_tail.pick(3),
            on_error: self.on_error.pick(3),
            shuffle_window: self.shuffle_window.get32(),
            resized_epoch: self.resized.as_ref().map(|resized| proto::ResizedEpoch {
                epoch: resized.epoch.get(),
                resizes: resized
                    .resizes
                    .iter()
                    .map(|(cursor, taken)| proto::WorldResize {
                        cursor: cursor.get(),
                        taken: taken.iter().map(|n| n.get()).collect(),
                    })
                    .collect(),
            }),
            mix: None,
        };
        match &self.mix {
            Some(mix) => {
                spec.mix = Some(proto::Mix {
                    sources: mix
                        .weights
                        .iter()
                        .take(wanted)
                        .enumerate()
                        .map(|(k, weight)| proto::MixSource {
                            dataset: Some(dataset(k)),
                            pipeline: pipeline.clone(),
                            weight: weight.weight(),
                        })
                        .collect(),
                    window: mix.window.get32(),
                    epoch_end: mix.epoch_end.pick(3),
                    epoch_samples: mix.epoch_samples.map_or(0, Number::get),
                });
            }
            None => {
                spec.dataset = Some(dataset(0));
                spec.pipeline = pipeline;
            }
        }
        (spec, sources)
    }
}

/// How far one `job_plan` input went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum JobPlanReach {
    /// The bytes ran out before a job was built.
    NoJob,
    /// The coordinator's checks refused the spec.
    RefusedByCoordinator,
    /// The daemon's checks (opening the job over the sources) refused it.
    RefusedByDaemon,
    /// An epoch was planned and its steps looked up: a job of one dataset, a mix, a resized
    /// epoch (of either).
    Planned {
        /// A mixed job.
        mixed: bool,
        /// A job resumed on another world size.
        resized: bool,
    },
}

/// A job built by `arbitrary` from the input (see `FuzzJob`) through the checks a job meets on
/// its way: the coordinator's ([`crate::check_spec_shape`]), then the daemon's (`Job` over
/// sources of the chosen sizes: policies, pipelines, the mix's weights, window and epoch rule,
/// the resized epoch, the planner), then the plan of one epoch, its first, last and a few
/// chosen steps looked up (for a mix, each position's draw). Checked: a job that opens plans
/// its first epoch, and any epoch when it is not a resized one; every batch holds at most `batch_size` samples; every index lies inside
/// the dataset (a mix: every position inside the epoch, every draw from a source). Returns
/// how far the input went (the replay test checks that the seeds reach every stage).
pub fn job_plan(data: &[u8]) -> JobPlanReach {
    let mut input = arbitrary::Unstructured::new(data);
    let Ok(job) = <FuzzJob as arbitrary::Arbitrary>::arbitrary(&mut input) else {
        return JobPlanReach::NoJob;
    };
    let (spec, sources) = job.spec_and_sources();
    if crate::check_spec_shape(&spec).is_err() {
        return JobPlanReach::RefusedByCoordinator;
    }
    let Ok(opened) = crate::Job::with_sources(spec, sources) else {
        return JobPlanReach::RefusedByDaemon;
    };
    let first = opened.first_epoch();
    opened
        .plan(first)
        .expect("a job that opened plans its first epoch");
    let epoch = match &job.resized {
        Some(_) => first,
        None => job.epoch.get(),
    };
    let plan = opened
        .plan(epoch)
        .expect("a job that opened plans every epoch it serves");
    let steps = plan.steps();
    let chosen = job.steps.iter().take(MAX_FUZZ_STEPS);
    let looked_up = [0, steps.saturating_sub(1)]
        .into_iter()
        .chain(chosen.map(|&step| step % steps.max(1)));
    let batch = job.batch_size.get32() as usize;
    let mut laid_out = 0u64;
    for step in looked_up.filter(|&step| step < steps) {
        let indices = plan.batch_indices(step);
        assert_eq!(indices.len(), plan.batch_len(step));
        assert!(indices.len() <= batch, "a batch larger than batch_size");
        match opened.mix_order() {
            None => {
                let len = opened.num_samples();
                assert!(
                    indices.iter().all(|&i| i < len),
                    "an index past the dataset"
                );
            }
            Some(order) => {
                assert!(
                    indices.iter().all(|&i| i < order.epoch_len()),
                    "a position past the epoch"
                );
                // A batch's draws lay out the windows its positions fall in that the order
                // does not keep (at most MAX_MIX_LAYOUT_PER_BATCH positions, a tenth of a
                // second in a release build and far more instrumented): counted as if none
                // were kept, the body looks up draws within MAX_FUZZ_LAYOUT positions.
                let mut windows: Vec<u64> = indices.iter().map(|&p| p / order.window()).collect();
                windows.sort_unstable();
                windows.dedup();
                let cost = windows.len() as u64 * order.window();
                if laid_out + cost <= MAX_FUZZ_LAYOUT {
                    laid_out += cost;
                    let sources = order.lens().len();
                    for (draw, &position) in
                        order.draws(plan.epoch(), &indices).iter().zip(&indices)
                    {
                        assert!(draw.source < sources, "a draw from no source");
                        // A source's draws count its positions, so none passes the position.
                        assert!(draw.draw <= position, "a draw past its position");
                    }
                }
            }
        }
    }
    JobPlanReach::Planned {
        mixed: job.mix.is_some(),
        resized: job.resized.is_some(),
    }
}
