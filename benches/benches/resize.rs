//! Resize of one decoded ImageNet-sized photo (the fixture nearest 500x375, packed RGB8) to
//! 224x224, in images/s: fast_image_resize's antialiased bilinear convolution (the filter PIL
//! and torchvision use), the same through `stoker_pipeline::resample` (the call the pipeline
//! makes, to show the wrapper costs nothing), the pure-Rust `resize` crate's Triangle filter as
//! the alternative, and fast_image_resize's nearest neighbour as the floor of any resampler.

mod common;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use rgb::FromSlice;
use stoker_benches::{decoded_near, imagenet_like_jpegs};
use stoker_pipeline::{resample, CropWindow, DecodedImage, SourceWindow};

/// The typical ImageNet training image: 4:3 with the long side at 500.
const SOURCE_SIZE: (u32, u32) = (500, 375);

/// Output side, as in the ImageNet recipes.
const OUT_SIDE: u32 = 224;

fn load_source() -> DecodedImage {
    let decoded =
        imagenet_like_jpegs().and_then(|jpegs| decoded_near(&jpegs, SOURCE_SIZE.0, SOURCE_SIZE.1));
    match decoded {
        Ok(image) => image,
        Err(error) => panic!("cannot prepare the bench image: {error}"),
    }
}

fn bench_resizers(c: &mut Criterion, group_name: &str, source: &DecodedImage) {
    let source_ref =
        match ImageRef::new(source.width, source.height, &source.pixels, PixelType::U8x3) {
            Ok(image) => image,
            Err(error) => panic!("source image: {error}"),
        };
    let mut target = Image::new(OUT_SIDE, OUT_SIDE, PixelType::U8x3);
    let mut resizer = Resizer::new();
    let mut group = c.benchmark_group(group_name);
    group.throughput(Throughput::Elements(1));
    for (name, algorithm) in [
        (
            "fast_image_resize_bilinear",
            ResizeAlg::Convolution(FilterType::Bilinear),
        ),
        ("fast_image_resize_nearest", ResizeAlg::Nearest),
    ] {
        let options = ResizeOptions::new().resize_alg(algorithm);
        group.bench_function(name, |b| {
            b.iter(|| {
                if let Err(error) = resizer.resize(&source_ref, &mut target, &options) {
                    panic!("{name}: {error}");
                }
                black_box(target.buffer());
            })
        });
    }

    let whole_image = SourceWindow::CropThenResize(CropWindow {
        top: 0,
        left: 0,
        height: source.height,
        width: source.width,
    });
    let mut dest = vec![0u8; (OUT_SIDE * OUT_SIDE * 3) as usize];
    group.bench_function("stoker_resample_bilinear", |b| {
        b.iter(|| {
            let out = (OUT_SIDE, OUT_SIDE);
            if let Err(error) = resample(source, &whole_image, out, &mut dest, &mut resizer) {
                panic!("stoker resample: {error}");
            }
            black_box(&dest);
        })
    });

    let mut alternative = match resize::new(
        source.width as usize,
        source.height as usize,
        OUT_SIDE as usize,
        OUT_SIDE as usize,
        resize::Pixel::RGB8,
        resize::Type::Triangle,
    ) {
        Ok(resizer) => resizer,
        Err(error) => panic!("resize crate: {error}"),
    };
    group.bench_function("resize_crate_triangle", |b| {
        b.iter(|| {
            if let Err(error) = alternative.resize(source.pixels.as_rgb(), dest.as_rgb_mut()) {
                panic!("resize crate: {error}");
            }
            black_box(&dest);
        })
    });
    group.finish();
}

fn resize_to_224(c: &mut Criterion) {
    let source = load_source();
    let group_name = format!("resize_{}x{}_to_{OUT_SIDE}", source.width, source.height);
    bench_resizers(c, &group_name, &source);
}

criterion_group! {
    name = benches;
    config = common::short_runs();
    targets = resize_to_224
}
criterion_main!(benches);
