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
/// for 16384x16384 float outputs, which the checks allow).
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
}

impl OneImage {
    fn shared() -> Arc<dyn SampleSource> {
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
        Arc::new(OneImage { png: png.clone() })
    }
}

impl SampleSource for OneImage {
    fn len(&self) -> u64 {
        1
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

/// The client's reader of the batch stream (`batch_wire::BatchReader`): the first two bytes set
/// the size of the frames the rest is cut into (1 to 65,536 bytes) and the landing's room (a
/// multiple of 4 KiB, 0 for none); the messages are read until the stream ends or fails. Each
/// batch read is checked: its landed tensors lie inside the landing, and encoding it again
/// (`encode_batch`) and reading that gives the same batch.
pub fn batch_stream(data: &[u8]) {
    const MAX_MESSAGE: usize = 1 << 20;
    let [frame_seed, room_seed, rest @ ..] = data else {
        return;
    };
    let frame = 1 + usize::from(*frame_seed) * 257;
    let room = usize::from(*room_seed) * 4096;
    let read = |chunks: std::collections::VecDeque<bytes::Bytes>, room: usize| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let body = crate::batch_wire::ChunkBody::ok(chunks);
            let mut reader = crate::batch_wire::BatchReader::new(body, MAX_MESSAGE);
            let mut batches = Vec::new();
            loop {
                let mut landing = crate::batch_wire::BufferLanding::new(room);
                match reader.next_batch(&mut landing).await {
                    Ok(Some(wire)) => {
                        let mut batch = wire.batch;
                        assert_eq!(batch.tensors.len(), wire.landed.len());
                        for (tensor, place) in batch.tensors.iter_mut().zip(wire.landed) {
                            if let Some(range) = place {
                                assert!(range.end <= landing.used && landing.used <= room);
                                tensor.data = bytes::Bytes::copy_from_slice(&landing.buffer[range]);
                            }
                        }
                        batches.push(batch);
                    }
                    Ok(None) | Err(_) => return batches,
                }
            }
        })
    };
    let whole = bytes::Bytes::copy_from_slice(rest);
    let chunks = (0..whole.len())
        .step_by(frame)
        .map(|at| whole.slice(at..(at + frame).min(whole.len())))
        .collect();
    for batch in read(chunks, room) {
        let Ok(encoded) = crate::batch_wire::encode_batch(batch.clone(), MAX_MESSAGE) else {
            continue;
        };
        let again = read(encoded.into_iter().collect(), MAX_MESSAGE);
        assert_eq!(
            again,
            vec![batch],
            "a batch read does not read back the same"
        );
    }
}
