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
        original_width: width,
        original_height: height,
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
                stoker_pipeline::resize_shorter_side(width, height, shorter).unwrap()
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
    encode_jpeg_with(pixels, width, height, |c| c.set_subsamp(subsamp).unwrap())
}

/// `pixels` (RGB rows) as a JPEG of quality 95, the compressor `set` as well.
fn encode_jpeg_with(
    pixels: &[u8],
    width: u32,
    height: u32,
    set: impl Fn(&mut turbojpeg::Compressor),
) -> Vec<u8> {
    let image = turbojpeg::Image {
        pixels,
        width: width as usize,
        pitch: width as usize * 3,
        height: height as usize,
        format: turbojpeg::PixelFormat::RGB,
    };
    let mut compressor = turbojpeg::Compressor::new().unwrap();
    compressor.set_quality(95).unwrap();
    set(&mut compressor);
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
    try_decode(bytes, region, target, dct).unwrap()
}

/// [`decode_with`], its refusal returned.
fn try_decode(
    bytes: &[u8],
    region: Option<CropWindow>,
    target: (u32, u32),
    dct: bool,
) -> Result<DecodedImage, stoker_pipeline::SampleError> {
    let header = read_header(bytes, DEFAULT_MAX_PIXELS)?;
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
    )?;
    Ok(out)
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
fn jpeg_warnings_that_leave_the_pixels_whole_are_passed_and_damage_is_not() {
    let (w, h) = (64, 48);
    let bytes = encode_jpeg(&smooth_photo(w, h), w, h, turbojpeg::Subsamp::Sub2x2);
    let clean = decode_with(&bytes, None, (w, h), false).pixels;
    // 237 bytes of padding between the scan's data and the end-of-image marker, as scraped
    // sets often hold: libjpeg warns, Pillow reads the same pixels.
    let mut padded = bytes[..bytes.len() - 2].to_vec();
    padded.extend(std::iter::repeat_n(0u8, 237));
    padded.extend([0xFF, 0xD9]);
    assert_eq!(decode_with(&padded, None, (w, h), false).pixels, clean);
    // A JFIF header of version 2.01.
    let jfif = bytes
        .windows(5)
        .position(|window| window == b"JFIF\0")
        .expect("a JFIF header");
    let mut revised = bytes.clone();
    revised[jfif + 5] = 2;
    assert_eq!(decode_with(&revised, None, (w, h), false).pixels, clean);
    // Damaged scan data is still refused: the middle of the scan cut out.
    let mut damaged = bytes[..bytes.len() / 2].to_vec();
    damaged.extend_from_slice(&bytes[bytes.len() * 3 / 4..]);
    assert!(
        try_decode(&damaged, None, (w, h), false).is_err(),
        "a cut scan decoded"
    );
}

/// `bytes` with each scan header's spectral selection and successive approximation set to
/// `fields` (Ss, Se, Ah<<4|Al): the walk reads one sequential scan, as `encode_jpeg` writes.
fn with_scan_fields(bytes: &[u8], fields: [u8; 3]) -> Vec<u8> {
    let sos = bytes
        .windows(2)
        .position(|w| w == [0xFF, 0xDA])
        .expect("a scan header");
    let components = usize::from(bytes[sos + 4]);
    let at = sos + 5 + 2 * components;
    let mut out = bytes.to_vec();
    out[at..at + 3].copy_from_slice(&fields);
    out
}

/// `bytes` with `junk` put before the first `marker` at or after `from`.
fn with_junk_before(bytes: &[u8], marker: u8, from: usize, junk: &[u8]) -> Vec<u8> {
    let at = from
        + bytes[from..]
            .windows(2)
            .position(|w| w == [0xFF, marker])
            .expect("the marker");
    let mut out = bytes.to_vec();
    out.splice(at..at, junk.iter().copied());
    out
}

/// `bytes` with its JFIF header's version set to `major.minor` (one put after the start of
/// image where it has none).
fn with_jfif_version(bytes: &[u8], major: u8, minor: u8) -> Vec<u8> {
    let mut out = bytes.to_vec();
    let jfif = match bytes.windows(5).position(|window| window == b"JFIF\0") {
        Some(jfif) => jfif,
        None => {
            let mut app0 = vec![0xFF, 0xE0, 0, 16];
            app0.extend(b"JFIF\0");
            app0.extend([1, 1, 0, 0, 1, 0, 1, 0, 0]);
            out.splice(2..2, app0);
            6
        }
    };
    out[jfif + 5] = major;
    out[jfif + 6] = minor;
    out
}

/// Fails naming `what` unless `decoded` is `expected` (its pixels and place; pixels unprinted).
fn assert_decoded_as(
    decoded: Result<DecodedImage, SampleError>,
    expected: &DecodedImage,
    what: &str,
) {
    match decoded {
        Ok(image) => {
            assert!(image.pixels == expected.pixels, "{what}: other pixels");
            assert_eq!(
                (image.width, image.height, image.offset_x, image.offset_y),
                (
                    expected.width,
                    expected.height,
                    expected.offset_x,
                    expected.offset_y
                ),
                "{what}"
            );
            assert_eq!(image.scale_eighths, expected.scale_eighths, "{what}");
        }
        Err(error) => panic!("{what}: refused ({error})"),
    }
}

#[test]
fn jpeg_quirks_libjpeg_warns_of_decode_whole_and_hide_no_damage() {
    let (w, h) = (96, 80);
    let bytes = encode_jpeg(&smooth_photo(w, h), w, h, turbojpeg::Subsamp::Sub2x2);
    let clean = decode_with(&bytes, None, (w, h), false);
    let window = CropWindow {
        top: 17,
        left: 21,
        height: 40,
        width: 50,
    };
    let clean_region = decode_with(&bytes, Some(window), (25, 20), true);
    // Files whose scan header holds zeros where a sequential scan has 0, 63, 0 (Samsung phones
    // write them; libjpeg warns "Invalid SOS parameters", Pillow reads the same pixels),
    // or whose JFIF header is of version 2: whole, alone and together, whole and by region.
    let zeros = with_scan_fields(&bytes, [0, 0, 0]);
    let odd = with_scan_fields(&bytes, [1, 62, 0x11]);
    let revised = with_jfif_version(&bytes, 2, 1);
    let both = with_jfif_version(&zeros, 2, 1);
    // Bytes between segments that libjpeg discards ("extraneous bytes before marker"): any
    // (stuffed pairs among them) after the JFIF header, before the tables; zeros after the
    // tables, before the scan.
    let junk = with_junk_before(&bytes, 0xDB, 2, &[0x00, 0x12, 0xFF, 0x00, 0x34]);
    let junk = with_junk_before(&junk, 0xDA, 2, &[0x00]);
    let junk_and_zeros = with_junk_before(&zeros, 0xC4, 2, &[0x00, 0x00]);
    for (name, quirky) in [
        ("zeros", &zeros),
        ("odd", &odd),
        ("jfif", &revised),
        ("both", &both),
        ("junk", &junk),
        ("junk and zeros", &junk_and_zeros),
    ] {
        assert_decoded_as(try_decode(quirky, None, (w, h), false), &clean, name);
        let region = try_decode(quirky, Some(window), (25, 20), true);
        assert_decoded_as(region, &clean_region, &format!("{name} by region"));
        // The quirk warns first, and TurboJPEG keeps a decode's first warning only: damage
        // after it (the scan cut short, or its middle cut out) is still refused.
        let cut = &quirky[..quirky.len() * 6 / 10];
        let mut gap = quirky[..quirky.len() / 2].to_vec();
        gap.extend_from_slice(&quirky[quirky.len() * 3 / 4..]);
        for (how, damaged) in [("cut", cut), ("gap", &gap[..])] {
            let refused = try_decode(damaged, None, (w, h), false);
            assert!(
                matches!(refused, Err(SampleError::Corrupt(_))),
                "{name}, {how}: a damaged scan decoded"
            );
            let refused = try_decode(damaged, Some(window), (25, 20), true);
            assert!(
                refused.is_err(),
                "{name}, {how}: a damaged scan decoded by region"
            );
        }
    }
    // A JFIF header of version 2 after the scan, which libjpeg reads as the decode ends: the
    // header walk does not see it, the decode's warning does; the file is decoded again from
    // a mended copy, and damage before it is still refused.
    let trailing = |file: &[u8]| {
        let mut app0 = vec![0xFF, 0xE0, 0, 16];
        app0.extend(b"JFIF\0");
        app0.extend([2, 1, 0, 0, 1, 0, 1, 0, 0]);
        let mut out = file[..file.len() - 2].to_vec();
        out.extend(app0);
        out.extend([0xFF, 0xD9]);
        out
    };
    let late = trailing(&bytes);
    assert_decoded_as(
        try_decode(&late, None, (w, h), false),
        &clean,
        "trailing jfif",
    );
    let region = try_decode(&late, Some(window), (25, 20), true);
    assert_decoded_as(region, &clean_region, "trailing jfif by region");
    let mut gap = bytes[..bytes.len() / 2].to_vec();
    gap.extend_from_slice(&bytes[bytes.len() * 3 / 4..]);
    let refused = try_decode(&trailing(&gap), None, (w, h), false);
    assert!(
        matches!(refused, Err(SampleError::Corrupt(_))),
        "a damaged scan decoded"
    );
    // Damage whose one sign is bytes libjpeg discards stays refused, not mended: a table
    // segment's marker damaged (its 0xFF, or its code made 0x00; libjpeg decodes without the
    // table), two of them in a row, a byte put into or lost from a quantization table (the
    // table read shifted by one).
    let marker_at = |file: &[u8], marker: u8, nth: usize| {
        file.windows(2)
            .enumerate()
            .filter(|(_, pair)| *pair == [0xFF, marker])
            .nth(nth)
            .expect("the marker")
            .0
    };
    let damaged_at = |file: &[u8], at: usize, damage: [u8; 2]| {
        let mut damaged = file.to_vec();
        damaged[at..at + 2].copy_from_slice(&damage);
        damaged
    };
    let first_table = marker_at(&bytes, 0xC4, 0);
    let second_table = marker_at(&bytes, 0xC4, 1);
    let quantization = marker_at(&bytes, 0xDB, 0);
    let mut inserted = bytes.clone();
    inserted.insert(quantization + 20, 7);
    let mut lost = bytes.clone();
    lost.remove(quantization + 20);
    let damaged = [
        ("table, 0xFF", damaged_at(&bytes, first_table, [0x00, 0xC4])),
        ("table, code", damaged_at(&bytes, first_table, [0xFF, 0x00])),
        (
            "two tables",
            damaged_at(
                &damaged_at(&bytes, first_table, [0x00, 0xC4]),
                second_table,
                [0x00, 0xC4],
            ),
        ),
        ("a byte put into a table", inserted),
        ("a byte lost from a table", lost),
    ];
    for (name, file) in &damaged {
        let refused = try_decode(file, None, (w, h), false);
        assert!(
            matches!(refused, Err(SampleError::Corrupt(_))),
            "{name}: decoded"
        );
    }
    // The scan fields of progressive and arithmetic-coded files are left as they are when
    // their JFIF header is mended: each decodes as it does with a version 1 header (a lossless
    // frame's, which a JFIF header would make YCbCr, in `jpeg_markers.rs`' tests).
    let pixels = smooth_photo(w, h);
    let made_with = |set: &dyn Fn(&mut turbojpeg::Compressor)| encode_jpeg_with(&pixels, w, h, set);
    let progressive = made_with(&|c| c.set_progressive(true).unwrap());
    let arithmetic = made_with(&|c| c.set_arithmetic(true).unwrap());
    for (name, file) in [("progressive", &progressive), ("arithmetic", &arithmetic)] {
        let as_made = decode_with(file, None, (w, h), false);
        let revised = with_jfif_version(file, 2, 1);
        assert_decoded_as(try_decode(&revised, None, (w, h), false), &as_made, name);
    }
    // Zeros discarded before a later scan of a progressive file (after the tables that follow
    // a scan's data): the decode's warning finds them, and the file is decoded again from a
    // copy without them.
    let as_made = decode_with(&progressive, None, (w, h), false);
    let last_table = progressive
        .windows(2)
        .rposition(|w| w == [0xFF, 0xC4])
        .unwrap();
    let later = with_junk_before(&progressive, 0xDA, last_table, &[0x00, 0x00]);
    assert_decoded_as(
        try_decode(&later, None, (w, h), false),
        &as_made,
        "progressive, junk before a later scan",
    );
    // A later scan's marker damaged (not the last's: bytes before the end-of-image marker are
    // passed) leaves that scan out of libjpeg's decode: refused.
    let scans = progressive
        .windows(2)
        .filter(|pair| *pair == [0xFF, 0xDA])
        .count();
    assert!(scans > 3, "{scans} scans");
    for nth in 1..scans - 1 {
        let at = marker_at(&progressive, 0xDA, nth);
        for damage in [[0x00, 0xDA], [0xFF, 0x00]] {
            let refused = try_decode(&damaged_at(&progressive, at, damage), None, (w, h), false);
            assert!(
                matches!(refused, Err(SampleError::Corrupt(_))),
                "scan {nth} damaged {damage:x?}: decoded"
            );
        }
    }
    // An arithmetic-coded sequential scan's zeros are mended as a Huffman-coded one's.
    let as_made = decode_with(&arithmetic, None, (w, h), false);
    let zeros = with_scan_fields(&arithmetic, [0, 0, 0]);
    let decoded = try_decode(&zeros, None, (w, h), false);
    assert_decoded_as(decoded, &as_made, "arithmetic, zeros");
}

/// A 24-bit BMP of `pixels` (RGB rows), its rows stored top down when `top_down` (a negative
/// height) or with the OS/2 core header when `os2`.
fn bmp(pixels: &[u8], width: u32, height: u32, top_down: bool, os2: bool) -> Vec<u8> {
    let stride = (width as usize * 3).div_ceil(4) * 4;
    let header = if os2 { 12 } else { 40 };
    let offset = 14 + header;
    let mut out = Vec::new();
    out.extend(b"BM");
    out.extend(((offset + stride * height as usize) as u32).to_le_bytes());
    out.extend([0u8; 4]);
    out.extend((offset as u32).to_le_bytes());
    out.extend((header as u32).to_le_bytes());
    if os2 {
        out.extend((width as u16).to_le_bytes());
        out.extend((height as u16).to_le_bytes());
        out.extend(1u16.to_le_bytes());
        out.extend(24u16.to_le_bytes());
    } else {
        out.extend((width as i32).to_le_bytes());
        let signed = if top_down {
            -(height as i32)
        } else {
            height as i32
        };
        out.extend(signed.to_le_bytes());
        out.extend(1u16.to_le_bytes());
        out.extend(24u16.to_le_bytes());
        out.extend([0u8; 24]);
    }
    let rows: Vec<u32> = if top_down {
        (0..height).collect()
    } else {
        (0..height).rev().collect()
    };
    for y in rows {
        let row = &pixels[(y * width * 3) as usize..][..(width * 3) as usize];
        for pixel in row.chunks(3) {
            out.extend([pixel[2], pixel[1], pixel[0]]);
        }
        out.extend(std::iter::repeat_n(0u8, stride - width as usize * 3));
    }
    out
}

#[test]
fn top_down_and_os2_bmps_and_jpegs_with_fill_bytes_decode() {
    let (w, h) = (13, 7);
    let source = smooth_photo(w, h);
    for (top_down, os2) in [(false, false), (true, false), (false, true)] {
        let bytes = bmp(&source, w, h, top_down, os2);
        let header = read_header(&bytes, DEFAULT_MAX_PIXELS).unwrap();
        assert_eq!(
            (header.width, header.height),
            (w, h),
            "top_down {top_down} os2 {os2}"
        );
        let decoded = decode_with(&bytes, None, (w, h), false);
        assert_eq!(decoded.pixels, source, "top_down {top_down} os2 {os2}");
    }
    // 0xFF fill bytes before each marker after SOI, which the standard allows.
    let jpeg = encode_jpeg(&smooth_photo(32, 24), 32, 24, turbojpeg::Subsamp::Sub2x2);
    let clean = decode_with(&jpeg, None, (32, 24), false).pixels;
    let mut filled = jpeg[..2].to_vec();
    let mut at = 2;
    while at < jpeg.len() {
        let marker = jpeg[at + 1];
        filled.extend([0xFF, 0xFF, 0xFF]);
        if marker == 0xDA {
            filled.extend(&jpeg[at..]);
            break;
        }
        let length = usize::from(u16::from_be_bytes([jpeg[at + 2], jpeg[at + 3]]));
        filled.extend(&jpeg[at..at + 2 + length]);
        at += 2 + length;
    }
    let header = read_header(&filled, DEFAULT_MAX_PIXELS).unwrap();
    assert_eq!((header.width, header.height), (32, 24));
    assert_eq!(decode_with(&filled, None, (32, 24), false).pixels, clean);
}

#[test]
fn region_decode_equals_the_same_part_of_a_full_decode() {
    let (w, h) = (200, 150);
    let source = smooth_photo(w, h);
    for subsamp in [turbojpeg::Subsamp::None, turbojpeg::Subsamp::Sub2x2] {
        let bytes = encode_jpeg(&source, w, h, subsamp);
        let full = decode_with(&bytes, None, (w, h), false);
        // A window inside iMCUs, and one whose edges fall on iMCU boundaries (16 pixels).
        for (left, width) in [(51, 90), (48, 96)] {
            let window = CropWindow {
                top: 37,
                left,
                height: 70,
                width,
            };
            let part = decode_with(&bytes, Some(window), (64, 64), false);
            // The region starts on an iMCU column and covers the window.
            assert!(part.offset_x <= left && part.offset_x % 8 == 0);
            assert_eq!(part.offset_y, 37);
            assert!(part.offset_x + part.width >= left + width && part.height == 70);
            // The window's own pixels are the full decode's, also at its edges (the region
            // holds a column more on each side, where chroma is upsampled as at an edge).
            let mut worst = 0u8;
            for row in 0..part.height {
                let full_row =
                    &full.pixels[(((row + 37) * w + left) * 3) as usize..][..(width * 3) as usize];
                let part_row = &part.pixels
                    [((row * part.width + left - part.offset_x) * 3) as usize..]
                    [..(width * 3) as usize];
                worst = worst.max(max_difference(full_row, part_row));
            }
            assert_eq!(
                worst, 0,
                "{subsamp:?} {left}+{width}: the window differs by {worst}"
            );
        }
    }
}

/// Bits written MSB first into a JPEG scan, 0xFF bytes stuffed, the last byte padded with ones.
#[derive(Default)]
struct ScanBits {
    bytes: Vec<u8>,
    current: u32,
    count: u32,
}

impl ScanBits {
    fn put(&mut self, code: u32, length: u32) {
        for bit in (0..length).rev() {
            self.current = (self.current << 1) | ((code >> bit) & 1);
            self.count += 1;
            if self.count == 8 {
                self.byte();
            }
        }
    }

    fn byte(&mut self) {
        let byte = self.current as u8;
        self.bytes.push(byte);
        if byte == 0xFF {
            self.bytes.push(0x00);
        }
        self.current = 0;
        self.count = 0;
    }

    fn finish(mut self) -> Vec<u8> {
        if self.count > 0 {
            let pad = 8 - self.count;
            self.put((1 << pad) - 1, pad);
        }
        self.bytes
    }
}

/// A baseline JPEG of three components with the sampling factors `factors` (h, v), every block
/// flat (its DC coefficient only, unit quantisation): block (bx, by) of component c is
/// `level(c, bx, by)` + 128 everywhere. libjpeg-turbo's encoder takes only the usual
/// subsamplings; this writes any.
fn flat_block_jpeg(
    width: u16,
    height: u16,
    factors: [(u8, u8); 3],
    level: impl Fn(usize, usize, usize) -> i32,
) -> Vec<u8> {
    // The spec's luminance DC table (Annex K.3); an AC table holding end-of-block alone.
    let dc_bits: [u8; 16] = [0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0];
    let mut dc_codes = [(0u32, 0u32); 12];
    let (mut code, mut symbol) = (0u32, 0usize);
    for (length, &count) in dc_bits.iter().enumerate() {
        for _ in 0..count {
            dc_codes[symbol] = (code, length as u32 + 1);
            code += 1;
            symbol += 1;
        }
        code <<= 1;
    }
    let mut out = vec![0xFF, 0xD8];
    let segment = |out: &mut Vec<u8>, marker: u8, body: &[u8]| {
        out.extend_from_slice(&[0xFF, marker]);
        out.extend_from_slice(&((body.len() + 2) as u16).to_be_bytes());
        out.extend_from_slice(body);
    };
    let mut quant = vec![0x00];
    quant.extend_from_slice(&[1u8; 64]);
    segment(&mut out, 0xDB, &quant);
    let mut frame = vec![8];
    frame.extend_from_slice(&height.to_be_bytes());
    frame.extend_from_slice(&width.to_be_bytes());
    frame.push(3);
    for (id, (h, v)) in factors.iter().enumerate() {
        frame.extend_from_slice(&[id as u8 + 1, (h << 4) | v, 0]);
    }
    segment(&mut out, 0xC0, &frame);
    let mut dc_table = vec![0x00];
    dc_table.extend_from_slice(&dc_bits);
    dc_table.extend(0..12u8);
    segment(&mut out, 0xC4, &dc_table);
    let mut ac_table = vec![0x10, 1];
    ac_table.extend_from_slice(&[0; 15]);
    ac_table.push(0x00);
    segment(&mut out, 0xC4, &ac_table);
    segment(&mut out, 0xDA, &[3, 1, 0x00, 2, 0x00, 3, 0x00, 0, 63, 0]);
    let h_max = factors.iter().map(|f| usize::from(f.0)).max().unwrap();
    let v_max = factors.iter().map(|f| usize::from(f.1)).max().unwrap();
    let mcus_x = usize::from(width).div_ceil(8 * h_max);
    let mcus_y = usize::from(height).div_ceil(8 * v_max);
    let mut bits = ScanBits::default();
    let mut previous = [0i32; 3];
    for my in 0..mcus_y {
        for mx in 0..mcus_x {
            for (c, (h, v)) in factors.iter().enumerate() {
                let (h, v) = (usize::from(*h), usize::from(*v));
                for by in 0..v {
                    for bx in 0..h {
                        // A flat block of value L has DC coefficient 8 L (level-shifted).
                        let dc = 8 * level(c, mx * h + bx, my * v + by);
                        let diff = dc - previous[c];
                        previous[c] = dc;
                        let category = 32 - diff.unsigned_abs().leading_zeros();
                        let (code, length) = dc_codes[category as usize];
                        bits.put(code, length);
                        let value = if diff < 0 { diff - 1 } else { diff };
                        bits.put(value as u32 & ((1 << category) - 1), category);
                        bits.put(0, 1); // end of block
                    }
                }
            }
        }
    }
    out.extend_from_slice(&bits.finish());
    out.extend_from_slice(&[0xFF, 0xD9]);
    out
}

/// A JPEG whose sampling factors TurboJPEG's subsampling classes do not name as libjpeg crops
/// it (all components 2x1 is "4:4:4" to it, an 8-pixel iMCU, and Y 2x2 with chroma 2x1 is
/// "4:4:0"; libjpeg crops both on 16) decodes by region as it decodes whole: before, half the
/// crops failed and a valid image was replaced as a bad sample.
#[test]
fn a_region_of_a_jpeg_with_unusual_sampling_factors_decodes_as_its_whole() {
    let (w, h) = (64u32, 48u32);
    for factors in [[(2, 1), (2, 1), (2, 1)], [(2, 2), (2, 1), (2, 1)]] {
        let bytes = flat_block_jpeg(w as u16, h as u16, factors, |c, bx, by| {
            ((bx * 37 + by * 11 + c * 23) % 160) as i32 - 80
        });
        let full = decode_with(&bytes, None, (w, h), false);
        assert_eq!((full.width, full.height), (w, h));
        for left in [0, 8, 16, 24, 40] {
            let window = CropWindow {
                top: 8,
                left,
                height: 24,
                width: 20,
            };
            let part = decode_with(&bytes, Some(window), (16, 16), false);
            assert!(
                part.offset_x <= left && part.offset_y <= 8,
                "{factors:?} at {left}"
            );
            assert!(
                part.offset_x + part.width >= left + 20,
                "{factors:?} at {left}"
            );
            assert!(part.offset_y + part.height >= 32, "{factors:?} at {left}");
            for row in 0..part.height {
                let full_row = &full.pixels
                    [(((row + part.offset_y) * w + part.offset_x) * 3) as usize..]
                    [..(part.width * 3) as usize];
                let part_row =
                    &part.pixels[(row * part.width * 3) as usize..][..(part.width * 3) as usize];
                assert_eq!(full_row, part_row, "{factors:?} at {left}, row {row}");
            }
        }
    }
}

/// A progressive JPEG whose last scan is repeated past 500 scans is refused as corrupt by the
/// scan limit (libjpeg walks every block on each scan: a small file of a large image could
/// hold a decode thread for minutes).
#[test]
fn a_progressive_jpeg_of_too_many_scans_is_refused() {
    let (w, h) = (96u32, 64u32);
    let pixels = smooth_photo(w, h);
    let image = turbojpeg::Image {
        pixels: pixels.as_slice(),
        width: w as usize,
        pitch: w as usize * 3,
        height: h as usize,
        format: turbojpeg::PixelFormat::RGB,
    };
    let mut compressor = turbojpeg::Compressor::new().unwrap();
    compressor.set_progressive(true).unwrap();
    let bytes = compressor.compress_to_vec(image).unwrap();
    assert_eq!(decode_with(&bytes, None, (w, h), false).width, w);
    // The last scan: from its SOS marker to the end-of-image marker.
    let last_scan = bytes
        .windows(2)
        .rposition(|pair| pair == [0xFF, 0xDA])
        .unwrap();
    let scan = &bytes[last_scan..bytes.len() - 2];
    let mut repeated = bytes[..bytes.len() - 2].to_vec();
    for _ in 0..600 {
        repeated.extend_from_slice(scan);
    }
    repeated.extend_from_slice(&[0xFF, 0xD9]);
    let header = read_header(&repeated, DEFAULT_MAX_PIXELS).unwrap();
    let mut out = DecodedImage::default();
    let refused = decode(
        &repeated,
        &header,
        &DecodeRequest {
            region: None,
            target: (w, h),
            allow_dct_scaling: false,
            max_pixels: DEFAULT_MAX_PIXELS,
        },
        &mut out,
    )
    .unwrap_err();
    // Refused by the limit, at its 501st scan; without it the repeats were each decoded (a
    // warning apiece) before the file was refused.
    assert!(
        refused.to_string().contains("more than 500 scans"),
        "{refused}"
    );
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
        // Statistics on the 0..255 scale: refused, not applied to [0, 1] pixels.
        (
            vec![
                decode_op(),
                crop_op(224),
                op(OpKind::Normalize(proto::Normalize {
                    mean: vec![123.675, 116.28, 103.53],
                    std: vec![58.395, 57.12, 57.375],
                })),
            ],
            "divide 0..255 statistics by 255",
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

/// A spec whose batches would not fit any machine (each side and the batch size in range, their
/// product not) is refused by name when the job opens, before a daemon serving other jobs is
/// asked to allocate one: here 256 samples of 16384x16384 pixels, 206 GB at least.
#[test]
fn a_job_whose_batch_would_take_more_than_16_gib_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let spec = stoker_datasets::SyntheticImageNetSpec {
        count: 4,
        seed: 3,
        classes: 2,
    };
    let generated = stoker_datasets::generate_imagenet_like(dir.path(), &spec, &|_| {}).unwrap();
    let job_spec = |side: u32| stoker_proto::v1::JobSpec {
        dataset: Some(stoker_proto::v1::DatasetSource {
            uri: generated.root.to_string_lossy().into_owned(),
            ..Default::default()
        }),
        pipeline: stoker_pipeline::presets::imagenet_train(side),
        batch_size: 256,
        world_size: 1,
        ..Default::default()
    };
    assert!(stoker_pipeline::Job::open(job_spec(224)).is_ok());
    let refused = match stoker_pipeline::Job::open(job_spec(16384)) {
        Ok(_) => panic!("a batch of 206 GB was accepted"),
        Err(error) => error.to_string(),
    };
    assert!(
        refused.contains("256 samples") && refused.contains(&(16usize << 30).to_string()),
        "{refused}"
    );
}
