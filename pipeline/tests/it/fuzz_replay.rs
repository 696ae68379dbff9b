//! Replays the committed fuzz inputs of the worker's targets (`fuzz/corpus/<target>/` and the
//! crash inputs kept in `fuzz/regressions/<target>/`) through the same functions the libFuzzer
//! targets call, in an ordinary build: a panic in any of them fails the test and names the
//! file. `write_seed_corpora` (ignored) writes the seed files from code in this repo.

use stoker_datasets::fuzz_targets::committed_inputs;

use prost::Message;
use stoker_pipeline::{fuzz_targets, presets, train_bpe_tokenizer};
use stoker_proto::v1::{self as proto, op::Op as OpKind};
use turbojpeg::{Compressor, Image, PixelFormat, Subsamp};

type TestResult<T> = Result<T, Box<dyn std::error::Error>>;

#[test]
fn image_corpus_replays() -> TestResult<()> {
    for file in committed_inputs("image") {
        // Shown only when the body panics: which input did it.
        eprintln!("replaying {}", file.display());
        fuzz_targets::image(&std::fs::read(&file)?);
    }
    Ok(())
}

#[test]
fn job_spec_corpus_replays() -> TestResult<()> {
    for file in committed_inputs("job_spec") {
        eprintln!("replaying {}", file.display());
        fuzz_targets::job_spec(&std::fs::read(&file)?);
    }
    Ok(())
}

#[test]
fn job_plan_corpus_replays_and_reaches_every_stage() -> TestResult<()> {
    use fuzz_targets::JobPlanReach;
    let mut reached = std::collections::BTreeSet::new();
    for file in committed_inputs("job_plan") {
        eprintln!("replaying {}", file.display());
        reached.insert(fuzz_targets::job_plan(&std::fs::read(&file)?));
    }
    // The seeds are where a campaign starts: they must reach each stage a job goes through.
    for stage in [
        JobPlanReach::RefusedByCoordinator,
        JobPlanReach::RefusedByDaemon,
        JobPlanReach::Planned {
            mixed: false,
            resized: false,
        },
        JobPlanReach::Planned {
            mixed: true,
            resized: false,
        },
        JobPlanReach::Planned {
            mixed: false,
            resized: true,
        },
    ] {
        assert!(
            reached.contains(&stage),
            "no seed reaches {stage:?}: {reached:?}"
        );
    }
    Ok(())
}

#[test]
fn tokenizer_corpus_replays() -> TestResult<()> {
    let scratch = tempfile::tempdir()?;
    for file in committed_inputs("tokenizer") {
        eprintln!("replaying {}", file.display());
        fuzz_targets::tokenizer(&std::fs::read(&file)?, &scratch.path().join("input"))?;
    }
    Ok(())
}

/// A small gradient, so that the encoders have something to compress.
fn gradient(width: u32, height: u32, channels: u32) -> Vec<u8> {
    (0..width * height * channels)
        .map(|i| ((i % (width * channels)) * 5 + (i / (width * channels)) * 11) as u8)
        .collect()
}

fn jpeg(setup: impl FnOnce(&mut Compressor) -> turbojpeg::Result<()>) -> TestResult<Vec<u8>> {
    let (width, height) = (20, 12);
    let pixels = gradient(width as u32, height as u32, 3);
    let mut compressor = Compressor::new()?;
    compressor.set_quality(80)?;
    setup(&mut compressor)?;
    let image = Image {
        pixels: pixels.as_slice(),
        width,
        pitch: width * 3,
        height,
        format: PixelFormat::RGB,
    };
    Ok(compressor.compress_to_vec(image)?)
}

fn png(color: png::ColorType, depth: png::BitDepth, channels: u32) -> TestResult<Vec<u8>> {
    let (width, height) = (9, 7);
    let bytes_per_sample = if depth == png::BitDepth::Sixteen {
        2
    } else {
        1
    };
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, width, height);
    encoder.set_color(color);
    encoder.set_depth(depth);
    if color == png::ColorType::Indexed {
        encoder.set_palette(vec![0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255]);
    }
    let mut writer = encoder.write_header()?;
    let data: Vec<u8> = if color == png::ColorType::Indexed {
        (0..width * height).map(|i| (i % 4) as u8).collect()
    } else {
        gradient(width, height, channels * bytes_per_sample)
    };
    writer.write_image_data(&data)?;
    writer.finish()?;
    Ok(out)
}

/// A small image in a format the `image` crate writes (9 x 7, `color` from [`gradient`]).
fn image_crate(
    write: impl FnOnce(&mut std::io::Cursor<Vec<u8>>, &[u8], u32, u32) -> image::ImageResult<()>,
    channels: u32,
) -> TestResult<Vec<u8>> {
    let (width, height) = (9, 7);
    let mut out = std::io::Cursor::new(Vec::new());
    write(&mut out, &gradient(width, height, channels), width, height)?;
    Ok(out.into_inner())
}

/// A CMYK JPEG (YCCK in the file, with an Adobe marker), as Photoshop writes them.
fn ycck_jpeg() -> TestResult<Vec<u8>> {
    let (width, height) = (20, 12);
    let pixels = gradient(width as u32, height as u32, 4);
    let mut compressor = Compressor::new()?;
    compressor.set_quality(80)?;
    compressor.set_subsamp(Subsamp::Sub2x2)?;
    compressor.set_colorspace(turbojpeg::Colorspace::YCCK)?;
    let image = Image {
        pixels: pixels.as_slice(),
        width,
        pitch: width * 4,
        height,
        format: PixelFormat::CMYK,
    };
    Ok(compressor.compress_to_vec(image)?)
}

fn op(kind: OpKind) -> proto::Op {
    proto::Op { op: Some(kind) }
}

/// Writes the seed corpora of the worker's targets into `fuzz/corpus/`; run by hand when a
/// format changes (`cargo test --release -p stoker-pipeline --test it write_seed_corpora --
/// --ignored`), then commit what changed.
#[test]
#[ignore = "writes into the source tree; run by hand to refresh the seeds"]
fn write_seed_corpora() -> TestResult<()> {
    let put = |target: &str, name: &str, data: &[u8]| {
        stoker_datasets::fuzz_targets::write_seed(target, name, data)
    };

    put(
        "image",
        "420.jpg",
        &jpeg(|c| c.set_subsamp(Subsamp::Sub2x2))?,
    )?;
    put(
        "image",
        "444_progressive.jpg",
        &jpeg(|c| {
            c.set_subsamp(Subsamp::None)?;
            c.set_progressive(true)
        })?,
    )?;
    put(
        "image",
        "gray.jpg",
        &jpeg(|c| c.set_subsamp(Subsamp::Gray))?,
    )?;
    put(
        "image",
        "422_arithmetic.jpg",
        &jpeg(|c| {
            c.set_subsamp(Subsamp::Sub2x1)?;
            c.set_arithmetic(true)
        })?,
    )?;
    put(
        "image",
        "rgb.png",
        &png(png::ColorType::Rgb, png::BitDepth::Eight, 3)?,
    )?;
    put(
        "image",
        "gray_alpha.png",
        &png(png::ColorType::GrayscaleAlpha, png::BitDepth::Eight, 2)?,
    )?;
    put(
        "image",
        "rgba16.png",
        &png(png::ColorType::Rgba, png::BitDepth::Sixteen, 4)?,
    )?;
    put(
        "image",
        "palette.png",
        &png(png::ColorType::Indexed, png::BitDepth::Eight, 1)?,
    )?;

    put("image", "ycck.jpg", &ycck_jpeg()?)?;
    {
        use image::codecs::{bmp, gif, pnm, tiff, webp};
        use image::{ExtendedColorType as Color, ImageEncoder};
        use pnm::{PnmSubtype, SampleEncoding};
        let pnm_of = |subtype: PnmSubtype, color: Color, channels: u32| {
            image_crate(
                |out, pixels, w, h| {
                    pnm::PnmEncoder::new(out)
                        .with_subtype(subtype)
                        .write_image(pixels, w, h, color)
                },
                channels,
            )
        };
        let binary = SampleEncoding::Binary;
        let seeds = [
            (
                "rgb.bmp",
                image_crate(
                    |out, pixels, w, h| {
                        bmp::BmpEncoder::new(out).write_image(pixels, w, h, Color::Rgb8)
                    },
                    3,
                )?,
            ),
            (
                "rgba.tiff",
                image_crate(
                    |out, pixels, w, h| {
                        tiff::TiffEncoder::new(out).write_image(pixels, w, h, Color::Rgba8)
                    },
                    4,
                )?,
            ),
            (
                "gray16.tiff",
                image_crate(
                    |out, pixels, w, h| {
                        tiff::TiffEncoder::new(out).write_image(pixels, w, h, Color::L16)
                    },
                    2,
                )?,
            ),
            (
                "rgba_lossless.webp",
                image_crate(
                    |out, pixels, w, h| {
                        webp::WebPEncoder::new_lossless(out).write_image(pixels, w, h, Color::Rgba8)
                    },
                    4,
                )?,
            ),
            (
                "rgba.gif",
                image_crate(
                    |out, pixels, w, h| {
                        gif::GifEncoder::new(out).encode(pixels, w, h, Color::Rgba8)
                    },
                    4,
                )?,
            ),
            (
                "rgb.ppm",
                pnm_of(PnmSubtype::Pixmap(binary), Color::Rgb8, 3)?,
            ),
            (
                "gray.pgm",
                pnm_of(PnmSubtype::Graymap(binary), Color::L8, 1)?,
            ),
            (
                "plain.pgm",
                pnm_of(PnmSubtype::Graymap(SampleEncoding::Ascii), Color::L8, 1)?,
            ),
        ];
        for (name, bytes) in seeds {
            put("image", name, &bytes)?;
        }
    }

    let scratch = tempfile::tempdir()?;
    let tokenizer = scratch.path().join("tokenizer.json");
    let texts = ["the cat sat on the mat", "a dog ran", "caf\u{e9} au lait"];
    train_bpe_tokenizer(&texts, 300, "<|endoftext|>", &tokenizer)?;
    put("tokenizer", "bpe.json", &std::fs::read(&tokenizer)?)?;

    let spec = |pipeline: Vec<proto::Op>| proto::JobSpec {
        dataset: Some(proto::DatasetSource {
            uri: "data/train".into(),
            ..Default::default()
        }),
        batch_size: 4,
        seed: 7,
        shuffle: true,
        pipeline,
        ..Default::default()
    };
    let specs = [
        ("train", spec(presets::imagenet_train(32))),
        ("eval", spec(presets::imagenet_eval(32))),
        (
            "normalize_float",
            spec(vec![
                op(OpKind::DecodeImage(proto::DecodeImage::default())),
                op(OpKind::Resize(proto::Resize { shorter_side: 16 })),
                op(OpKind::CenterCrop(proto::CenterCrop {
                    height: 8,
                    width: 12,
                })),
                op(OpKind::Normalize(proto::Normalize {
                    mean: vec![0.5, 0.4, 0.3],
                    std: vec![0.2, 0.25, 0.3],
                })),
                op(OpKind::ToTensor(proto::ToTensor {
                    layout: proto::Layout::Nchw as i32,
                    dtype: proto::Dtype::Float32 as i32,
                })),
            ]),
        ),
        (
            "token_windows",
            spec(vec![op(OpKind::TokenWindows(proto::TokenWindows {
                seq_len: 64,
                ..Default::default()
            }))]),
        ),
        (
            "tokenize_pack",
            spec(vec![
                op(OpKind::Tokenize(proto::Tokenize {
                    tokenizer_path: "tokenizer.json".into(),
                })),
                op(OpKind::PackSequences(proto::PackSequences {
                    seq_len: 128,
                    ..Default::default()
                })),
            ]),
        ),
        (
            "select_columns",
            spec(vec![op(OpKind::SelectColumns(proto::SelectColumns {
                names: vec!["x".into(), "label".into()],
                ..Default::default()
            }))]),
        ),
    ];
    for (name, spec) in specs {
        put("job_spec", name, &spec.encode_to_vec())?;
    }

    // job_plan: inputs drawn from a fixed xorshift stream, the first three reaching each stage.
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut kept = std::collections::BTreeMap::<_, usize>::new();
    for _ in 0..200_000 {
        let len = 48 + (next() % 320) as usize;
        let data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        let reach = fuzz_targets::job_plan(&data);
        if reach == fuzz_targets::JobPlanReach::NoJob {
            continue;
        }
        let count = kept.entry(reach).or_default();
        if *count < 3 {
            *count += 1;
            let stage = match reach {
                fuzz_targets::JobPlanReach::Planned { mixed, resized } => format!(
                    "planned{}{}",
                    if mixed { "_mixed" } else { "" },
                    if resized { "_resized" } else { "" }
                ),
                other => format!("{other:?}").to_lowercase(),
            };
            let name = format!("{stage}_{count}");
            put("job_plan", &name, &data)?;
        }
        if kept.len() >= 6 && kept.values().all(|&n| n >= 3) {
            break;
        }
    }
    Ok(())
}
