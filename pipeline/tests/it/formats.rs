//! The image formats beside JPEG and PNG, and four-component JPEGs: each written by an encoder
//! of its own (the `image` crate's; libjpeg-turbo's for CMYK and YCCK) and decoded back to the
//! pixels it holds; cut short or damaged, each gives a [`SampleError`], never a panic.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::io::Cursor;

use image::codecs::{
    bmp::BmpEncoder,
    gif::GifEncoder,
    pnm::{PnmEncoder, PnmSubtype, SampleEncoding},
    tiff::TiffEncoder,
    webp::WebPEncoder,
};
use image::{ExtendedColorType, ImageEncoder};
use stoker_datasets::{sniff_format, ImageFormat};
use stoker_pipeline::{
    decode, read_header, CropWindow, DecodeRequest, DecodedImage, SampleError, DEFAULT_MAX_PIXELS,
};

const WIDTH: u32 = 23;
const HEIGHT: u32 = 17;

/// `channels`-byte pixels of a pattern that touches every byte value.
fn pattern(channels: u32) -> Vec<u8> {
    (0..WIDTH * HEIGHT * channels)
        .map(|i| ((i * 37 + (i / channels) % 7 * 11) % 256) as u8)
        .collect()
}

/// The first three bytes of each `channels`-byte pixel (or one replicated, for gray).
fn as_rgb(pixels: &[u8], channels: usize) -> Vec<u8> {
    pixels
        .chunks_exact(channels)
        .flat_map(|p| {
            if channels < 3 {
                [p[0], p[0], p[0]]
            } else {
                [p[0], p[1], p[2]]
            }
        })
        .collect()
}

fn request(region: Option<CropWindow>, target: (u32, u32), dct: bool) -> DecodeRequest {
    DecodeRequest {
        region,
        target,
        allow_dct_scaling: dct,
        max_pixels: DEFAULT_MAX_PIXELS,
    }
}

fn try_decode(bytes: &[u8], request: &DecodeRequest) -> Result<DecodedImage, SampleError> {
    let header = read_header(bytes, DEFAULT_MAX_PIXELS)?;
    let mut out = DecodedImage::default();
    decode(bytes, &header, request, &mut out)?;
    assert_eq!(
        out.pixels.len(),
        out.width as usize * out.height as usize * 3
    );
    Ok(out)
}

fn decode_all(bytes: &[u8]) -> DecodedImage {
    let decoded = try_decode(bytes, &request(None, (WIDTH, HEIGHT), false)).unwrap();
    assert_eq!((decoded.width, decoded.height), (WIDTH, HEIGHT));
    decoded
}

fn encoded(write: impl FnOnce(&mut Cursor<Vec<u8>>) -> image::ImageResult<()>) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    write(&mut out).unwrap();
    out.into_inner()
}

fn bmp(pixels: &[u8], color: ExtendedColorType) -> Vec<u8> {
    encoded(|out| BmpEncoder::new(out).write_image(pixels, WIDTH, HEIGHT, color))
}

fn tiff(pixels: &[u8], color: ExtendedColorType) -> Vec<u8> {
    encoded(|out| TiffEncoder::new(out).write_image(pixels, WIDTH, HEIGHT, color))
}

fn pnm(pixels: &[u8], subtype: PnmSubtype, color: ExtendedColorType) -> Vec<u8> {
    encoded(|out| {
        PnmEncoder::new(out)
            .with_subtype(subtype)
            .write_image(pixels, WIDTH, HEIGHT, color)
    })
}

fn webp_lossless(pixels: &[u8], color: ExtendedColorType) -> Vec<u8> {
    encoded(|out| WebPEncoder::new_lossless(out).write_image(pixels, WIDTH, HEIGHT, color))
}

/// A GIF of `rgba` pixels; exact when they hold at most 256 colours (the encoder builds the
/// palette from them then, without quantising), fully transparent pixels becoming one
/// transparent palette entry.
fn gif(rgba: &[u8]) -> Vec<u8> {
    encoded(|out| GifEncoder::new(out).encode(rgba, WIDTH, HEIGHT, ExtendedColorType::Rgba8))
}

/// RGBA pixels of 12 colours, with the given alpha.
fn few_colours(alpha: impl Fn(usize) -> u8) -> Vec<u8> {
    (0..(WIDTH * HEIGHT) as usize)
        .flat_map(|i| {
            let colour = (i * 5 % 12) as u8;
            [colour * 20, 255 - colour * 13, colour * 7 + 3, alpha(i)]
        })
        .collect()
}

/// Every format's files, each with its sniffed format and the RGB8 pixels it holds.
fn lossless_samples() -> Vec<(&'static str, Vec<u8>, ImageFormat, Vec<u8>)> {
    let rgb = pattern(3);
    let rgba = pattern(4);
    let gray = pattern(1);
    let gray16: Vec<u16> = (0..WIDTH * HEIGHT)
        .map(|i| (i * 997 % 65536) as u16)
        .collect();
    let gray16_bytes: Vec<u8> = gray16.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let gray16_high: Vec<u8> = gray16.iter().flat_map(|v| [(v >> 8) as u8; 3]).collect();
    let bits: Vec<u8> = (0..WIDTH * HEIGHT).map(|i| u8::from(i % 3 == 0)).collect();
    // The encoder takes 0 for black (a 1 bit in the file) and anything else for white.
    let bits_rgb: Vec<u8> = bits.iter().flat_map(|&b| [b * 255; 3]).collect();
    let opaque = few_colours(|_| 255);
    let holes = few_colours(|i| if i % 4 == 0 { 0 } else { 255 });
    // The encoder gives the transparent palette entry the colour of the first transparent
    // pixel; the decoder keeps that colour under alpha 0, as PIL's palette lookup does.
    let hidden = [holes[0], holes[1], holes[2]];
    let holes_rgb: Vec<u8> = holes
        .chunks_exact(4)
        .flat_map(|p| {
            if p[3] == 0 {
                hidden
            } else {
                [p[0], p[1], p[2]]
            }
        })
        .collect();
    let binary = SampleEncoding::Binary;
    vec![
        (
            "bmp rgb",
            bmp(&rgb, ExtendedColorType::Rgb8),
            ImageFormat::Bmp,
            rgb.clone(),
        ),
        (
            "bmp rgba",
            bmp(&rgba, ExtendedColorType::Rgba8),
            ImageFormat::Bmp,
            as_rgb(&rgba, 4),
        ),
        (
            "bmp gray",
            bmp(&gray, ExtendedColorType::L8),
            ImageFormat::Bmp,
            as_rgb(&gray, 1),
        ),
        (
            "tiff rgb",
            tiff(&rgb, ExtendedColorType::Rgb8),
            ImageFormat::Tiff,
            rgb.clone(),
        ),
        (
            "tiff rgba",
            tiff(&rgba, ExtendedColorType::Rgba8),
            ImageFormat::Tiff,
            as_rgb(&rgba, 4),
        ),
        (
            "tiff gray16",
            tiff(&gray16_bytes, ExtendedColorType::L16),
            ImageFormat::Tiff,
            gray16_high,
        ),
        (
            "ppm",
            pnm(&rgb, PnmSubtype::Pixmap(binary), ExtendedColorType::Rgb8),
            ImageFormat::Pnm,
            rgb.clone(),
        ),
        (
            "pgm",
            pnm(&gray, PnmSubtype::Graymap(binary), ExtendedColorType::L8),
            ImageFormat::Pnm,
            as_rgb(&gray, 1),
        ),
        (
            "plain ppm",
            pnm(
                &rgb,
                PnmSubtype::Pixmap(SampleEncoding::Ascii),
                ExtendedColorType::Rgb8,
            ),
            ImageFormat::Pnm,
            rgb.clone(),
        ),
        (
            "pbm",
            pnm(&bits, PnmSubtype::Bitmap(binary), ExtendedColorType::L8),
            ImageFormat::Pnm,
            bits_rgb,
        ),
        ("gif", gif(&opaque), ImageFormat::Gif, as_rgb(&opaque, 4)),
        ("gif transparent", gif(&holes), ImageFormat::Gif, holes_rgb),
        (
            "webp lossless rgb",
            webp_lossless(&rgb, ExtendedColorType::Rgb8),
            ImageFormat::WebP,
            rgb.clone(),
        ),
        (
            "webp lossless rgba",
            webp_lossless(&rgba, ExtendedColorType::Rgba8),
            ImageFormat::WebP,
            as_rgb(&rgba, 4),
        ),
    ]
}

#[test]
fn every_format_decodes_to_the_pixels_it_holds() {
    for (name, bytes, format, expected) in lossless_samples() {
        assert_eq!(sniff_format(&bytes), format, "{name}");
        let header = read_header(&bytes, DEFAULT_MAX_PIXELS).unwrap();
        assert_eq!(
            (header.format, header.width, header.height),
            (format, WIDTH, HEIGHT)
        );
        let decoded = decode_all(&bytes);
        assert!(decoded.pixels == expected, "{name}: pixels differ");
        // A region request decodes the whole image (only JPEG decodes part of one).
        let window = CropWindow {
            top: 3,
            left: 5,
            height: 9,
            width: 11,
        };
        let part = try_decode(&bytes, &request(Some(window), (4, 4), true)).unwrap();
        assert_eq!(
            (part.width, part.height, part.offset_x, part.scale_eighths),
            (WIDTH, HEIGHT, 0, 8),
            "{name}"
        );
    }
}

#[test]
fn the_pixel_limit_holds_before_decoding() {
    for (name, bytes, _, _) in lossless_samples() {
        assert_eq!(
            read_header(&bytes, u64::from(WIDTH * HEIGHT) - 1),
            Err(SampleError::TooManyPixels {
                width: u64::from(WIDTH),
                height: u64::from(HEIGHT),
                limit: u64::from(WIDTH * HEIGHT) - 1,
            }),
            "{name}"
        );
    }
    // A BMP header of 2^30 x 2^30 pixels in 54 bytes.
    let mut bomb = vec![0u8; 54];
    bomb[..2].copy_from_slice(b"BM");
    bomb[14] = 40;
    bomb[18..22].copy_from_slice(&(1u32 << 30).to_le_bytes());
    bomb[22..26].copy_from_slice(&(1u32 << 30).to_le_bytes());
    bomb[26] = 1;
    bomb[28] = 24;
    assert!(matches!(
        read_header(&bomb, DEFAULT_MAX_PIXELS),
        Err(SampleError::TooManyPixels { .. })
    ));
}

/// A header that claims less than the data: the decoder may not go past the header's size.
#[test]
fn a_decoder_may_not_exceed_the_header() {
    let big = pnm(
        &pattern(3),
        PnmSubtype::Pixmap(SampleEncoding::Binary),
        ExtendedColorType::Rgb8,
    );
    let small = try_decode(&big, &request(None, (1, 1), false)).unwrap();
    let header = read_header(&big, DEFAULT_MAX_PIXELS).unwrap();
    let lying = stoker_pipeline::ImageHeader {
        width: WIDTH - 1,
        ..header
    };
    let mut out = DecodedImage::default();
    let result = decode(&big, &lying, &request(None, (1, 1), false), &mut out);
    assert!(matches!(result, Err(SampleError::Corrupt(_))), "{result:?}");
    assert_eq!(small.width, WIDTH);
}

#[test]
fn cut_or_damaged_files_give_errors_not_panics() {
    let mut samples = lossless_samples();
    samples.push((
        "cmyk jpeg",
        cmyk_jpeg(&cmyk_pattern(), turbojpeg::Colorspace::CMYK),
        ImageFormat::Jpeg,
        Vec::new(),
    ));
    for (name, bytes, _, _) in samples {
        // Cut inside the header and halfway through the data: always refused.
        for len in [12, 20, bytes.len() / 2] {
            let result = try_decode(&bytes[..len], &request(None, (WIDTH, HEIGHT), false));
            assert!(result.is_err(), "{name} cut to {len} bytes decoded");
        }
        // Every other length, and every byte changed in turn: anything but a panic.
        for len in (0..bytes.len()).step_by(7) {
            let _ = try_decode(&bytes[..len], &request(None, (WIDTH, HEIGHT), false));
        }
        for at in (0..bytes.len()).step_by(3) {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x5A;
            let _ = try_decode(&damaged, &request(None, (WIDTH, HEIGHT), true));
        }
    }
}

#[test]
fn what_is_no_image_stays_unsupported() {
    for bytes in [
        &b"hello, world"[..],
        b"P7\nWIDTH 2\n",
        b"\0\0\0\x1cftypavif",
        b"RIFF\0\0\0\0WAVEfmt ",
    ] {
        assert_eq!(
            read_header(bytes, DEFAULT_MAX_PIXELS),
            Err(SampleError::UnsupportedFormat),
            "{bytes:?}"
        );
    }
}

#[test]
fn a_bigtiff_is_named_as_one() {
    for head in [&b"II+\0\x08\0\0\0"[..], b"MM\0+\0\x08\0\0"] {
        match read_header(head, DEFAULT_MAX_PIXELS) {
            Err(SampleError::UnsupportedKind(what)) => assert!(what.contains("BigTIFF"), "{what}"),
            other => panic!("{head:?}: {other:?}"),
        }
    }
}

/// CMYK as libjpeg stores it (Adobe's inverted convention: 255 is no ink), K varying.
fn cmyk_pattern() -> Vec<u8> {
    let mut pixels = Vec::new();
    for y in 0..HEIGHT * 4 {
        for x in 0..WIDTH * 4 {
            let (fx, fy) = (
                x as f32 / (WIDTH * 4) as f32,
                y as f32 / (HEIGHT * 4) as f32,
            );
            pixels.extend_from_slice(&[
                (255.0 * fx) as u8,
                (255.0 * fy) as u8,
                (128.0 + 100.0 * (fx * 9.0).sin() * (fy * 7.0).cos()) as u8,
                (255.0 - 120.0 * fx * fy) as u8,
            ]);
        }
    }
    pixels
}

fn cmyk_jpeg(cmyk: &[u8], colorspace: turbojpeg::Colorspace) -> Vec<u8> {
    let image = turbojpeg::Image {
        pixels: cmyk,
        width: (WIDTH * 4) as usize,
        pitch: (WIDTH * 4 * 4) as usize,
        height: (HEIGHT * 4) as usize,
        format: turbojpeg::PixelFormat::CMYK,
    };
    let mut compressor = turbojpeg::Compressor::new().unwrap();
    compressor.set_quality(95).unwrap();
    compressor.set_subsamp(turbojpeg::Subsamp::None).unwrap();
    compressor.set_colorspace(colorspace).unwrap();
    compressor.compress_to_vec(image).unwrap()
}

/// The JPEG without its Adobe APP14 segment (libjpeg then takes four components for CMYK).
fn without_adobe_marker(jpeg: &[u8]) -> Vec<u8> {
    let at = jpeg
        .windows(2)
        .position(|w| w == [0xFF, 0xEE])
        .expect("an Adobe marker");
    let len = usize::from(u16::from_be_bytes([jpeg[at + 2], jpeg[at + 3]]));
    [&jpeg[..at], &jpeg[at + 2 + len..]].concat()
}

/// Pillow's `convert("RGB")` of a CMYK JPEG, written out again from `Convert.c`'s `cmyk2rgb`
/// over the bytes `unpackCMYKI` gives it (libjpeg's, inverted).
fn pillow_cmyk_to_rgb(cmyk: &[u8]) -> Vec<u8> {
    let muldiv255 = |a: i32, b: i32| {
        let t = a * b + 128;
        ((t >> 8) + t) >> 8
    };
    cmyk.chunks_exact(4)
        .flat_map(|p| {
            let [c, m, y, k] = [p[0], p[1], p[2], p[3]].map(|v| 255 - i32::from(v));
            let nk = 255 - k;
            [c, m, y].map(|v| (nk - muldiv255(v, nk)).clamp(0, 255) as u8)
        })
        .collect()
}

/// libjpeg-turbo's own CMYK decode of `jpeg` at `1/denominator` of its size.
fn turbojpeg_cmyk(jpeg: &[u8], denominator: usize) -> (Vec<u8>, u32, u32) {
    let mut decompressor = turbojpeg::Decompressor::new().unwrap();
    let header = decompressor.read_header(jpeg).unwrap();
    let factor = turbojpeg::ScalingFactor::new(1, denominator);
    decompressor.set_scaling_factor(factor).unwrap();
    let scaled = header.scaled(factor);
    let mut pixels = vec![0u8; scaled.width * scaled.height * 4];
    decompressor
        .decompress(
            jpeg,
            turbojpeg::Image {
                pixels: pixels.as_mut_slice(),
                width: scaled.width,
                pitch: scaled.width * 4,
                height: scaled.height,
                format: turbojpeg::PixelFormat::CMYK,
            },
        )
        .unwrap();
    (pixels, scaled.width as u32, scaled.height as u32)
}

#[test]
fn cmyk_and_ycck_jpegs_decode_as_pillow_converts_them() {
    let source = cmyk_pattern();
    let (w, h) = (WIDTH * 4, HEIGHT * 4);
    let ideal = pillow_cmyk_to_rgb(&source);
    for (name, jpeg) in [
        ("cmyk", cmyk_jpeg(&source, turbojpeg::Colorspace::CMYK)),
        ("ycck", cmyk_jpeg(&source, turbojpeg::Colorspace::YCCK)),
        (
            "cmyk without adobe marker",
            without_adobe_marker(&cmyk_jpeg(&source, turbojpeg::Colorspace::CMYK)),
        ),
    ] {
        let decoded = try_decode(&jpeg, &request(None, (w, h), false)).unwrap();
        assert_eq!((decoded.width, decoded.height), (w, h), "{name}");
        let (cmyk, _, _) = turbojpeg_cmyk(&jpeg, 1);
        assert!(
            decoded.pixels == pillow_cmyk_to_rgb(&cmyk),
            "{name}: not Pillow's conversion"
        );
        let worst = decoded
            .pixels
            .iter()
            .zip(&ideal)
            .map(|(a, b)| a.abs_diff(*b))
            .max()
            .unwrap();
        assert!(worst <= 12, "{name}: {worst} levels from the source");

        // A region at full scale is that part of the full decode (4:4:4: no upsampling edge).
        let window = CropWindow {
            top: 13,
            left: 21,
            height: 30,
            width: 40,
        };
        let part = try_decode(&jpeg, &request(Some(window), (30, 30), false)).unwrap();
        assert!(part.offset_x <= 21 && part.offset_x + part.width >= 61);
        assert_eq!((part.offset_y, part.height), (13, 30));
        for row in 0..part.height {
            let start = (((row + 13) * w + part.offset_x) * 3) as usize;
            let len = (part.width * 3) as usize;
            assert!(
                part.pixels[(row * part.width * 3) as usize..][..len]
                    == decoded.pixels[start..][..len],
                "{name}: region row {row} differs"
            );
        }

        // DCT-scaled: libjpeg-turbo's own half-size CMYK, converted the same way.
        let half = try_decode(&jpeg, &request(None, (w / 2, h / 2), true)).unwrap();
        assert_eq!(half.scale_eighths, 4, "{name}");
        let (cmyk, half_w, half_h) = turbojpeg_cmyk(&jpeg, 2);
        assert_eq!((half.width, half.height), (half_w, half_h));
        assert!(
            half.pixels == pillow_cmyk_to_rgb(&cmyk),
            "{name}: half scale"
        );
    }
}

/// A GIF of one frame of `indices` (`size` wide and high) at `place` (left, top) on a logical
/// screen of `screen`, with `global` and `local` palettes and a transparent index.
fn gif_frame(
    screen: (u16, u16),
    place: (u16, u16),
    size: (u16, u16),
    indices: &[u8],
    global: &[u8],
    local: Option<&[u8]>,
    transparent: Option<u8>,
) -> Vec<u8> {
    let mut out = Vec::new();
    let mut encoder = gif::Encoder::new(&mut out, screen.0, screen.1, global).unwrap();
    let frame = gif::Frame {
        left: place.0,
        top: place.1,
        width: size.0,
        height: size.1,
        buffer: indices.into(),
        palette: local.map(<[u8]>::to_vec),
        transparent,
        ..gif::Frame::default()
    };
    encoder.write_frame(&frame).unwrap();
    drop(encoder);
    out
}

/// A GIF's first frame as Pillow composes it (measured with Pillow 13.0; the Python suite's
/// `test_image_formats.py` compares Stoker with Pillow itself): the canvas its frame leaves
/// uncovered holds the colour of the transparent index, else of index 0 (not the background
/// colour, not black), from the frame's palette; a frame reaching past the logical screen
/// grows the image.
#[test]
fn a_gif_frame_smaller_than_its_screen_lies_on_pillows_canvas() {
    const RED: [u8; 3] = [255, 0, 0];
    const GREEN: [u8; 3] = [0, 255, 0];
    const BLUE: [u8; 3] = [0, 0, 255];
    const DUSK: [u8; 3] = [10, 20, 30];
    let global: Vec<u8> = [RED, GREEN, BLUE, DUSK].concat();
    let local: Vec<u8> = [[1, 2, 3], [4, 5, 6], [7, 8, 9], [11, 12, 13]].concat();
    let ones = [1u8; 12];
    // Each: the file, its size, the colour of the canvas outside the frame, the frame's.
    let cases = [
        (
            "no transparency",
            gif_frame((8, 6), (2, 1), (4, 3), &ones, &global, None, None),
            (8, 6),
            RED,
            GREEN,
        ),
        (
            "transparent index 3",
            gif_frame((8, 6), (2, 1), (4, 3), &ones, &global, None, Some(3)),
            (8, 6),
            DUSK,
            GREEN,
        ),
        (
            "local palette, transparent index 2",
            gif_frame(
                (8, 6),
                (2, 1),
                (4, 3),
                &ones,
                &global,
                Some(&local),
                Some(2),
            ),
            (8, 6),
            [7, 8, 9],
            [4, 5, 6],
        ),
        (
            "past the screen",
            gif_frame((4, 3), (2, 1), (4, 3), &ones, &global, None, None),
            (6, 4),
            RED,
            GREEN,
        ),
    ];
    for (name, file, (width, height), canvas, colour) in cases {
        let header = read_header(&file, DEFAULT_MAX_PIXELS).unwrap();
        assert_eq!((header.width, header.height), (width, height), "{name}");
        let decoded = try_decode(&file, &request(None, (width, height), false)).unwrap();
        for y in 0..height {
            for x in 0..width {
                let inside = (2..6).contains(&x) && (1..4).contains(&y);
                let at = (y * width + x) as usize * 3;
                let expected = if inside { colour } else { canvas };
                assert_eq!(decoded.pixels[at..at + 3], expected, "{name} at {x},{y}");
            }
        }
    }
    // The screen's background index counts for nothing.
    let mut background = gif_frame((8, 6), (2, 1), (4, 3), &ones, &global, None, None);
    background[11] = 2;
    let decoded = try_decode(&background, &request(None, (8, 6), false)).unwrap();
    assert_eq!(decoded.pixels[..3], RED);
    // A palette of gray entries in index order is gray to Pillow past its end too.
    let ramp: Vec<u8> = [[0; 3], [1; 3]].concat();
    let file = gif_frame((3, 1), (0, 0), (3, 1), &[1, 7, 0], &ramp, None, None);
    let decoded = try_decode(&file, &request(None, (3, 1), false)).unwrap();
    assert_eq!(decoded.pixels, [[1; 3], [7; 3], [0; 3]].concat());
    // An empty first frame is no image.
    let empty = gif_frame((4, 3), (1, 1), (0, 2), &[], &global, None, None);
    assert!(matches!(
        try_decode(&empty, &request(None, (4, 3), false)),
        Err(SampleError::Corrupt(_))
    ));
    // An index past the palette is black.
    let file = gif_frame(
        (2, 1),
        (0, 0),
        (2, 1),
        &[1, 9],
        &[RED, GREEN].concat(),
        None,
        None,
    );
    let decoded = try_decode(&file, &request(None, (2, 1), false)).unwrap();
    assert_eq!(decoded.pixels, [GREEN, [0, 0, 0]].concat());
    // The grown canvas counts against the pixel limit.
    let grown = gif_frame((4, 3), (2, 1), (4, 3), &ones, &global, None, None);
    assert!(matches!(
        read_header(&grown, 6 * 4 - 1),
        Err(SampleError::TooManyPixels {
            width: 6,
            height: 4,
            ..
        })
    ));
}
