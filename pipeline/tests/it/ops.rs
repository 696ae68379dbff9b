//! Stoker's image ops against fixed expected outputs: torchvision's own results on a known
//! pattern (`tests/fixtures/torchvision_expected.json`, written by
//! `tests/fixtures/torchvision_expected.py`), decoder round trips, and the pipeline's checks.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use serde_json::Value;
use stoker_pipeline::{
    decode, read_header, resample, CropWindow, DecodeRequest, DecodedImage, Error, ImageDtype,
    ImageLayout, OutputFormat, Pipeline, SampleError, SampleRng, SampleTimings, Scratch,
    SourceWindow, DEFAULT_MAX_PIXELS,
};
use stoker_proto::v1::{self as proto, op::Op as OpKind};

fn pattern(width: u32, height: u32) -> Vec<u8> {
    let mut pixels = Vec::with_capacity((width * height * 3) as usize);
    for y in 0..height {
        for x in 0..width {
            for c in 0..3 {
                pixels.push(((x * 7 + y * 13 + c * 50 + ((x * y) % 11) * 9) % 256) as u8);
            }
        }
    }
    pixels
}

fn full_image(pixels: Vec<u8>, width: u32, height: u32) -> DecodedImage {
    DecodedImage {
        pixels,
        width,
        height,
        offset_x: 0,
        offset_y: 0,
        scaled_width: width,
        scaled_height: height,
        scale_eighths: 8,
    }
}

fn expected() -> Value {
    let text = include_str!("../fixtures/torchvision_expected.json");
    serde_json::from_str(text).expect("fixture parses")
}

fn numbers(value: &Value) -> Vec<u8> {
    value
        .as_array()
        .expect("array")
        .iter()
        .map(|v| v.as_u64().expect("int") as u8)
        .collect()
}

fn max_difference(a: &[u8], b: &[u8]) -> u8 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| x.abs_diff(*y))
        .max()
        .unwrap_or(0)
}

fn run_case(case: &Value) -> Vec<u8> {
    let doc = expected();
    let (width, height) = (
        doc["width"].as_u64().unwrap() as u32,
        doc["height"].as_u64().unwrap() as u32,
    );
    let image = full_image(pattern(width, height), width, height);
    let out = case["out"].as_array().unwrap();
    let (out_w, out_h) = (
        out[0].as_u64().unwrap() as u32,
        out[1].as_u64().unwrap() as u32,
    );
    let window = match case["kind"].as_str().unwrap() {
        "crop_then_resize" => {
            let w: Vec<u32> = case["window"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            SourceWindow::CropThenResize(CropWindow {
                top: w[0],
                left: w[1],
                height: w[2],
                width: w[3],
            })
        }
        _ => {
            let shorter = case["shorter"].as_u64().unwrap() as u32;
            let resized = if shorter == 0 {
                (width, height)
            } else {
                stoker_pipeline::resize_shorter_side(width, height, shorter)
            };
            let r = case["resized"].as_array().unwrap();
            assert_eq!(
                (resized.0 as u64, resized.1 as u64),
                (r[0].as_u64().unwrap(), r[1].as_u64().unwrap()),
                "resize size differs from torchvision"
            );
            SourceWindow::ResizeThenCrop {
                resized,
                left: stoker_pipeline::center_crop_offset(resized.0, out_w),
                top: stoker_pipeline::center_crop_offset(resized.1, out_h),
            }
        }
    };
    let mut dest = vec![0u8; (out_w * out_h * 3) as usize];
    let mut resizer = fast_image_resize::Resizer::new();
    resample(&image, &window, (out_w, out_h), &mut dest, &mut resizer).unwrap();
    dest
}

#[test]
fn crops_and_resizes_match_torchvision_within_one_level() {
    let doc = expected();
    for case in doc["cases"].as_array().unwrap() {
        let ours = run_case(case);
        let theirs = numbers(&case["pixels"]);
        let diff = max_difference(&ours, &theirs);
        assert!(
            diff <= 1,
            "{}: max difference {diff} from torchvision",
            case["name"]
        );
    }
}

#[test]
fn padded_center_crop_is_black_where_torchvision_pads() {
    let doc = expected();
    let case = doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "resize_center_crop_padded")
        .unwrap();
    let ours = run_case(case);
    // Resized to 51x40, cropped 48x48: four black rows on top and bottom.
    assert!(ours[..48 * 4 * 3].iter().all(|&v| v == 0));
    assert!(ours[ours.len() - 48 * 4 * 3..].iter().all(|&v| v == 0));
    assert!(ours[48 * 4 * 3..48 * 5 * 3].iter().any(|&v| v != 0));
}

#[test]
fn flip_matches_torchvision() {
    let doc = expected();
    let case = &doc["cases"][0];
    let mut ours = numbers(&case["pixels"]);
    stoker_pipeline::flip_horizontal(&mut ours, 16);
    assert_eq!(ours, numbers(&doc["flip_of_crop_downscale"]));
}

#[test]
fn normalize_matches_torchvision() {
    let doc = expected();
    let pixels = numbers(&doc["cases"][0]["pixels"]);
    let format = OutputFormat {
        dtype: ImageDtype::Float32,
        layout: ImageLayout::Nchw,
        normalize: Some(([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])),
    };
    let mut dest = vec![0u8; pixels.len() * 4];
    format.write(&pixels, &mut dest, &format.float_tables());
    let theirs: Vec<f64> = doc["normalize_of_crop_downscale_chw"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    for (chunk, expected) in dest.chunks_exact(4).zip(theirs) {
        let value = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        assert!(
            (f64::from(value) - expected).abs() < 1e-6,
            "{value} vs {expected}"
        );
    }
}

fn encode_jpeg(pixels: &[u8], width: u32, height: u32, subsamp: turbojpeg::Subsamp) -> Vec<u8> {
    let image = turbojpeg::Image {
        pixels,
        width: width as usize,
        pitch: width as usize * 3,
        height: height as usize,
        format: turbojpeg::PixelFormat::RGB,
    };
    let mut compressor = turbojpeg::Compressor::new().unwrap();
    compressor.set_quality(95).unwrap();
    compressor.set_subsamp(subsamp).unwrap();
    compressor.compress_to_vec(image).unwrap()
}

fn smooth_photo(width: u32, height: u32) -> Vec<u8> {
    let mut pixels = Vec::new();
    for y in 0..height {
        for x in 0..width {
            let (fx, fy) = (x as f32 / width as f32, y as f32 / height as f32);
            pixels.push((255.0 * fx) as u8);
            pixels.push((255.0 * fy) as u8);
            pixels.push((128.0 + 100.0 * (fx * 9.0).sin() * (fy * 7.0).cos()) as u8);
        }
    }
    pixels
}

fn psnr(a: &[u8], b: &[u8]) -> f64 {
    let mse: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
        .sum::<f64>()
        / a.len() as f64;
    10.0 * (255.0f64 * 255.0 / mse.max(1e-9)).log10()
}

fn decode_with(
    bytes: &[u8],
    region: Option<CropWindow>,
    target: (u32, u32),
    dct: bool,
) -> DecodedImage {
    let header = read_header(bytes, DEFAULT_MAX_PIXELS).unwrap();
    let mut out = DecodedImage::default();
    decode(
        bytes,
        &header,
        &DecodeRequest {
            region,
            target,
            allow_dct_scaling: dct,
            max_pixels: DEFAULT_MAX_PIXELS,
        },
        &mut out,
    )
    .unwrap();
    out
}

#[test]
fn jpeg_decodes_close_to_the_source() {
    let (w, h) = (160, 120);
    let source = smooth_photo(w, h);
    let bytes = encode_jpeg(&source, w, h, turbojpeg::Subsamp::Sub2x2);
    let header = read_header(&bytes, DEFAULT_MAX_PIXELS).unwrap();
    assert_eq!((header.width, header.height), (w, h));
    let decoded = decode_with(&bytes, None, (w, h), false);
    assert_eq!((decoded.width, decoded.height), (w, h));
    assert!(psnr(&decoded.pixels, &source) > 30.0);
}

#[test]
fn region_decode_equals_the_same_part_of_a_full_decode() {
    let (w, h) = (200, 150);
    let source = smooth_photo(w, h);
    for subsamp in [turbojpeg::Subsamp::None, turbojpeg::Subsamp::Sub2x2] {
        let bytes = encode_jpeg(&source, w, h, subsamp);
        let full = decode_with(&bytes, None, (w, h), false);
        let window = CropWindow {
            top: 37,
            left: 51,
            height: 70,
            width: 90,
        };
        let part = decode_with(&bytes, Some(window), (64, 64), false);
        // The region starts on an iMCU column and covers the window.
        assert!(part.offset_x <= 51 && part.offset_x % 8 == 0);
        assert_eq!(part.offset_y, 37);
        assert!(part.offset_x + part.width >= 141 && part.height == 70);
        let mut worst = 0u8;
        for row in 0..part.height {
            let full_row = &full.pixels[(((row + 37) * w + part.offset_x) * 3) as usize..]
                [..(part.width * 3) as usize];
            let part_row =
                &part.pixels[(row * part.width * 3) as usize..][..(part.width * 3) as usize];
            worst = worst.max(max_difference(full_row, part_row));
        }
        // 4:4:4 is exact; 4:2:0 upsampling at the region's edge may differ by a level or two.
        let allowed = if subsamp == turbojpeg::Subsamp::None {
            0
        } else {
            3
        };
        assert!(worst <= allowed, "{subsamp:?}: region differs by {worst}");
    }
}

#[test]
fn dct_scaling_halves_large_regions() {
    let (w, h) = (640, 480);
    let bytes = encode_jpeg(&smooth_photo(w, h), w, h, turbojpeg::Subsamp::Sub2x2);
    let decoded = decode_with(&bytes, None, (224, 224), true);
    assert_eq!(decoded.scale_eighths, 4);
    assert_eq!((decoded.width, decoded.height), (320, 240));
    let decoded = decode_with(&bytes, None, (224, 224), false);
    assert_eq!(decoded.scale_eighths, 8);
}

fn encode_png(width: u32, height: u32, color: png::ColorType, data: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut bytes, width, height);
        encoder.set_color(color);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().unwrap();
        writer.write_image_data(data).unwrap();
    }
    bytes
}

#[test]
fn png_of_every_color_type_decodes_to_rgb() {
    let rgb = pattern(5, 4);
    let bytes = encode_png(5, 4, png::ColorType::Rgb, &rgb);
    assert_eq!(decode_with(&bytes, None, (5, 4), false).pixels, rgb);

    let gray: Vec<u8> = (0..20).map(|v| v * 10).collect();
    let bytes = encode_png(5, 4, png::ColorType::Grayscale, &gray);
    let expected: Vec<u8> = gray.iter().flat_map(|&g| [g, g, g]).collect();
    assert_eq!(decode_with(&bytes, None, (5, 4), false).pixels, expected);

    let rgba: Vec<u8> = rgb
        .chunks_exact(3)
        .flat_map(|p| [p[0], p[1], p[2], 7])
        .collect();
    let bytes = encode_png(5, 4, png::ColorType::Rgba, &rgba);
    assert_eq!(decode_with(&bytes, None, (5, 4), false).pixels, rgb);
}

#[test]
fn headers_refuse_what_is_not_an_image_or_too_large() {
    assert_eq!(
        read_header(b"", DEFAULT_MAX_PIXELS),
        Err(SampleError::Empty)
    );
    assert_eq!(
        read_header(b"hello, world", DEFAULT_MAX_PIXELS),
        Err(SampleError::UnsupportedFormat)
    );
    let bytes = encode_jpeg(&smooth_photo(64, 48), 64, 48, turbojpeg::Subsamp::Sub2x2);
    assert!(matches!(
        read_header(&bytes, 1000),
        Err(SampleError::TooManyPixels {
            width: 64,
            height: 48,
            limit: 1000
        })
    ));
    let truncated = read_header(&bytes[..20], DEFAULT_MAX_PIXELS);
    assert!(
        matches!(truncated, Err(SampleError::Corrupt(_))),
        "{truncated:?}"
    );
}

fn op(kind: OpKind) -> proto::Op {
    proto::Op { op: Some(kind) }
}

fn decode_op() -> proto::Op {
    op(OpKind::DecodeImage(proto::DecodeImage {
        max_pixels: 0,
        allow_dct_scaling: false,
    }))
}

fn crop_op(size: u32) -> proto::Op {
    op(OpKind::RandomResizedCrop(proto::RandomResizedCrop {
        height: size,
        width: size,
        scale_min: 0.08,
        scale_max: 1.0,
        ratio_min: 0.75,
        ratio_max: 4.0 / 3.0,
    }))
}

#[test]
fn pipeline_checks_name_the_op_at_fault() {
    let cases: Vec<(Vec<proto::Op>, &str)> = vec![
        (vec![], "first op must be DecodeImage"),
        (vec![crop_op(224)], "first op must be DecodeImage"),
        (vec![decode_op()], "RandomResizedCrop, Resize + CenterCrop"),
        (
            vec![
                decode_op(),
                op(OpKind::Resize(proto::Resize { shorter_side: 256 })),
            ],
            "add CenterCrop",
        ),
        (vec![decode_op(), crop_op(0)], "RandomResizedCrop height"),
        (
            vec![
                decode_op(),
                crop_op(224),
                op(OpKind::RandomHorizontalFlip(proto::RandomHorizontalFlip {
                    p: 1.5,
                })),
            ],
            "p must be in [0, 1]",
        ),
        (
            vec![
                decode_op(),
                crop_op(224),
                op(OpKind::Normalize(proto::Normalize {
                    mean: vec![0.5],
                    std: vec![0.5],
                })),
            ],
            "3 means",
        ),
        (
            vec![
                decode_op(),
                crop_op(224),
                op(OpKind::Normalize(proto::Normalize {
                    mean: vec![0.5; 3],
                    std: vec![0.0; 3],
                })),
            ],
            "non-zero",
        ),
        (
            vec![decode_op(), crop_op(224), crop_op(224)],
            "RandomResizedCrop is out of place",
        ),
        (
            vec![
                decode_op(),
                crop_op(224),
                op(OpKind::Normalize(proto::Normalize {
                    mean: vec![0.5; 3],
                    std: vec![0.5; 3],
                })),
                op(OpKind::ToTensor(proto::ToTensor {
                    layout: 0,
                    dtype: proto::Dtype::Uint8 as i32,
                })),
            ],
            "contradicts",
        ),
        (vec![decode_op(), proto::Op { op: None }], "op 1 is empty"),
    ];
    for (ops, needle) in cases {
        match Pipeline::from_ops(&ops) {
            Err(Error::InvalidPipeline(message)) => {
                assert!(message.contains(needle), "{message:?} lacks {needle:?}")
            }
            other => panic!("expected InvalidPipeline containing {needle:?}, got {other:?}"),
        }
    }
}

#[test]
fn pipeline_output_is_a_function_of_the_rng_stream() {
    let (w, h) = (300, 220);
    let bytes = encode_jpeg(&smooth_photo(w, h), w, h, turbojpeg::Subsamp::Sub2x2);
    let pipeline = Pipeline::from_ops(&stoker_pipeline::presets::imagenet_train(64)).unwrap();
    let run = |index: u64| {
        let mut out = vec![0u8; pipeline.bytes_per_sample()];
        let mut timings = SampleTimings::default();
        pipeline
            .process(
                &bytes,
                &mut SampleRng::new(5, 0, index),
                &mut out,
                &mut Scratch::default(),
                &mut timings,
            )
            .unwrap();
        out
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));
}

#[test]
fn normalized_pipeline_gives_float_chw() {
    let ops = vec![
        decode_op(),
        op(OpKind::Resize(proto::Resize { shorter_side: 40 })),
        op(OpKind::CenterCrop(proto::CenterCrop {
            height: 32,
            width: 32,
        })),
        op(OpKind::Normalize(proto::Normalize {
            mean: vec![0.5; 3],
            std: vec![0.25; 3],
        })),
    ];
    let pipeline = Pipeline::from_ops(&ops).unwrap();
    assert_eq!(pipeline.image_shape(2), vec![2, 3, 32, 32]);
    assert_eq!(pipeline.image_dtype(), proto::Dtype::Float32);
    let bytes = encode_png(8, 8, png::ColorType::Rgb, &[255u8; 8 * 8 * 3]);
    let mut out = vec![0u8; pipeline.bytes_per_sample()];
    pipeline
        .process(
            &bytes,
            &mut SampleRng::new(0, 0, 0),
            &mut out,
            &mut Scratch::default(),
            &mut SampleTimings::default(),
        )
        .unwrap();
    let first = f32::from_le_bytes([out[0], out[1], out[2], out[3]]);
    assert_eq!(first, (1.0 - 0.5) / 0.25);
}
