//! Per-image JPEG decode cost on the ImageNet-like fixture set, in images/s: libjpeg-turbo full
//! decode (what torchvision's PIL path pays), the region decode Stoker does for a
//! RandomResizedCrop window (with and without DCT scaling), zune-jpeg as the pure-Rust
//! alternative, and the whole `imagenet_train` pipeline as a worker runs it.
//!
//! Every iteration walks the whole set once, so a figure is the mean over the generator's mix of
//! sizes, qualities and chroma layouts, not one lucky file.

mod common;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use stoker_benches::{full_decode_request, imagenet_like_jpegs, JpegFixture};
use stoker_pipeline::{
    decode, presets, random_resized_crop_window, CropWindow, DecodeRequest, DecodedImage, Pipeline,
    RandomResizedCropRange, SampleRng, SampleTimings, Scratch, DEFAULT_MAX_PIXELS,
};
use zune_jpeg::zune_core::bytestream::ZCursor;
use zune_jpeg::JpegDecoder;

/// Output side of the crop, as in the ImageNet training recipe.
const CROP_SIZE: u32 = 224;

fn load_fixtures() -> Vec<JpegFixture> {
    match imagenet_like_jpegs() {
        Ok(jpegs) => jpegs,
        Err(error) => panic!("cannot prepare the bench images: {error}"),
    }
}

/// One crop window per image, drawn the way a worker draws it for epoch 0, so the region
/// benches see the same spread of crop areas as training does.
fn crop_windows(jpegs: &[JpegFixture]) -> Vec<CropWindow> {
    let range = RandomResizedCropRange::default();
    jpegs
        .iter()
        .enumerate()
        .map(|(index, jpeg)| {
            let mut rng = SampleRng::new(0, 0, index as u64);
            random_resized_crop_window(jpeg.header.width, jpeg.header.height, &range, &mut rng)
        })
        .collect()
}

fn region_request(window: CropWindow, allow_dct_scaling: bool) -> DecodeRequest {
    DecodeRequest {
        region: Some(window),
        target: (CROP_SIZE, CROP_SIZE),
        allow_dct_scaling,
        max_pixels: DEFAULT_MAX_PIXELS,
    }
}

fn zune_decode_rgb(bytes: &[u8], pixels: &mut Vec<u8>) {
    let mut decoder = JpegDecoder::new(ZCursor::new(bytes));
    if let Err(error) = decoder.decode_headers() {
        panic!("zune-jpeg header: {error:?}");
    }
    let Some(len) = decoder.output_buffer_size() else {
        panic!("zune-jpeg gave no output size after reading the header");
    };
    // Reuse one buffer across images, as Stoker's DecodedImage does, so both sides skip the
    // allocator in the steady state.
    pixels.resize(len, 0);
    if let Err(error) = decoder.decode_into(pixels) {
        panic!("zune-jpeg decode: {error:?}");
    }
}

fn jpeg_decoders(c: &mut Criterion) {
    let jpegs = load_fixtures();
    let windows = crop_windows(&jpegs);
    let mut group = c.benchmark_group("jpeg_decode");
    group.sampling_mode(SamplingMode::Flat);
    group.throughput(Throughput::Elements(jpegs.len() as u64));

    let mut image = DecodedImage::default();
    group.bench_function("turbojpeg_full", |b| {
        b.iter(|| {
            for jpeg in &jpegs {
                let request = full_decode_request(&jpeg.header);
                if let Err(error) = decode(&jpeg.bytes, &jpeg.header, &request, &mut image) {
                    panic!("full decode: {error}");
                }
                black_box(&image.pixels);
            }
        })
    });
    for (name, allow_dct_scaling) in [
        ("turbojpeg_region_rrc", false),
        ("turbojpeg_region_rrc_dct", true),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                for (jpeg, window) in jpegs.iter().zip(&windows) {
                    let request = region_request(*window, allow_dct_scaling);
                    if let Err(error) = decode(&jpeg.bytes, &jpeg.header, &request, &mut image) {
                        panic!("region decode: {error}");
                    }
                    black_box(&image.pixels);
                }
            })
        });
    }
    let mut pixels = Vec::new();
    group.bench_function("zune_jpeg_full", |b| {
        b.iter(|| {
            for jpeg in &jpegs {
                zune_decode_rgb(&jpeg.bytes, &mut pixels);
                black_box(&pixels);
            }
        })
    });
    group.finish();
}

fn imagenet_train_pipeline(c: &mut Criterion) {
    let jpegs = load_fixtures();
    let pipeline = match Pipeline::from_ops(&presets::imagenet_train(CROP_SIZE)) {
        Ok(pipeline) => pipeline,
        Err(error) => panic!("imagenet_train preset: {error}"),
    };
    let mut out = vec![0u8; pipeline.bytes_per_sample()];
    let mut scratch = Scratch::default();
    let mut timings = SampleTimings::default();
    let mut group = c.benchmark_group("pipeline");
    group.sampling_mode(SamplingMode::Flat);
    group.throughput(Throughput::Elements(jpegs.len() as u64));
    group.bench_function("imagenet_train_224", |b| {
        b.iter(|| {
            for (index, jpeg) in jpegs.iter().enumerate() {
                let mut rng = SampleRng::new(0, 0, index as u64);
                if let Err(error) =
                    pipeline.process(&jpeg.bytes, &mut rng, &mut out, &mut scratch, &mut timings)
                {
                    panic!("pipeline: {error}");
                }
                black_box(&out);
            }
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = common::short_runs();
    targets = jpeg_decoders, imagenet_train_pipeline
}
criterion_main!(benches);
