//! The formats beside JPEG: PNG through the `png` crate (its palette checked before any pixel),
//! GIF's first frame through the `gif` crate as Pillow composes it, and WebP, BMP, TIFF and
//! PBM/PGM/PPM through the `image` crate with limits from the header, each to packed RGB8 as
//! `convert("RGB")` gives it.

use std::io::Cursor;

use super::*;

pub(super) fn png_error(error: png::DecodingError) -> SampleError {
    SampleError::Corrupt(format!("png: {error}"))
}

pub(super) fn png_header(bytes: &[u8]) -> Result<(u32, u32), SampleError> {
    let decoder = png::Decoder::new(Cursor::new(bytes));
    let reader = decoder.read_info().map_err(png_error)?;
    let info = reader.info();
    Ok((info.width, info.height))
}

/// Why bytes `sniff_format` finds in no format Stoker decodes are refused: a BigTIFF (whose
/// leading bytes are no TIFF's to it) is named as one.
pub(super) fn unsupported(bytes: &[u8]) -> SampleError {
    if bytes.starts_with(b"II+\0") || bytes.starts_with(b"MM\0+") {
        return SampleError::UnsupportedKind("tiff: a BigTIFF (64-bit offsets)".into());
    }
    SampleError::UnsupportedFormat
}

/// A BMP's size from its DIB header: a Windows header's signed height (negative for rows
/// stored top down), or an OS/2 core header's 16-bit fields.
pub(super) fn bmp_size(bytes: &[u8]) -> Result<(u32, u32), SampleError> {
    let corrupt = || SampleError::Corrupt("bmp header: too short".into());
    let field = |at: usize, len: usize| bytes.get(at..at + len).ok_or_else(corrupt);
    let header = u32::from_le_bytes(field(14, 4)?.try_into().map_err(|_| corrupt())?);
    if header == 12 {
        let width = u16::from_le_bytes(field(18, 2)?.try_into().map_err(|_| corrupt())?);
        let height = u16::from_le_bytes(field(20, 2)?.try_into().map_err(|_| corrupt())?);
        return Ok((u32::from(width), u32::from(height)));
    }
    let width = i32::from_le_bytes(field(18, 4)?.try_into().map_err(|_| corrupt())?);
    let height = i32::from_le_bytes(field(22, 4)?.try_into().map_err(|_| corrupt())?);
    Ok((width.unsigned_abs(), height.unsigned_abs()))
}

/// Refuses palettes the `png` crate (0.18.1) would panic on while expanding them: a PLTE chunk
/// whose length is not a multiple of 3, and a tRNS chunk with more entries than the palette
/// (both invalid PNG; the crate stores them unchecked and slices past their ends). Found by the
/// `image` fuzz target; `fuzz/regressions/image/` keeps the inputs.
pub(super) fn check_png_palette(info: &png::Info<'_>) -> Result<(), SampleError> {
    let Some(palette) = info.palette.as_deref() else {
        return Ok(());
    };
    if palette.len() % 3 != 0 {
        return Err(SampleError::Corrupt(format!(
            "png: PLTE chunk of {} bytes is not a whole number of RGB entries",
            palette.len()
        )));
    }
    let transparent = info.trns.as_deref().map_or(0, <[u8]>::len);
    if info.color_type == png::ColorType::Indexed && transparent > palette.len() / 3 {
        return Err(SampleError::Corrupt(format!(
            "png: tRNS chunk has {transparent} entries for a palette of {}",
            palette.len() / 3
        )));
    }
    Ok(())
}

pub(super) fn decode_png(
    bytes: &[u8],
    max_pixels: u64,
    out: &mut DecodedImage,
) -> Result<(), SampleError> {
    let mut decoder = png::Decoder::new(Cursor::new(bytes));
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = decoder.read_info().map_err(png_error)?;
    check_png_palette(reader.info())?;
    let (width, height) = (reader.info().width, reader.info().height);
    if u64::from(width) * u64::from(height) > max_pixels {
        return Err(SampleError::TooManyPixels {
            width: u64::from(width),
            height: u64::from(height),
            limit: max_pixels,
        });
    }
    let size = reader
        .output_buffer_size()
        .ok_or_else(|| SampleError::Corrupt("png: output size overflows".into()))?;
    let mut raw_pixels = vec![0u8; size];
    let frame = reader.next_frame(&mut raw_pixels).map_err(png_error)?;
    let channels = match frame.color_type {
        png::ColorType::Grayscale => 1,
        png::ColorType::GrayscaleAlpha => 2,
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        png::ColorType::Indexed => {
            return Err(SampleError::Corrupt("png: palette was not expanded".into()))
        }
    };
    let pixel_count = width as usize * height as usize;
    out.pixels.clear();
    out.pixels.reserve(pixel_count * 3);
    for y in 0..height as usize {
        let row = &raw_pixels[y * frame.line_size..][..width as usize * channels];
        for px in row.chunks_exact(channels) {
            // PIL's convert("RGB") drops alpha without compositing; so do we.
            match channels {
                1 | 2 => out.pixels.extend_from_slice(&[px[0], px[0], px[0]]),
                _ => out.pixels.extend_from_slice(&px[..3]),
            }
        }
    }
    whole_image(out, width, height);
    Ok(())
}

fn gif_error(error: gif::DecodingError) -> SampleError {
    SampleError::Corrupt(format!("gif: {error}"))
}

/// A GIF read to its first frame's descriptor, no pixel decoded.
struct GifStart<'a> {
    decoder: gif::Decoder<Cursor<&'a [u8]>>,
    /// The first frame's left, top, width and height.
    frame: [u32; 4],
    /// The image's size as Pillow gives it: the logical screen, grown to hold the first frame
    /// where that frame reaches past it.
    canvas: (u32, u32),
}

fn gif_start(bytes: &[u8]) -> Result<GifStart<'_>, SampleError> {
    let mut options = gif::DecodeOptions::new();
    options.set_color_output(gif::ColorOutput::Indexed);
    let mut decoder = options.read_info(Cursor::new(bytes)).map_err(gif_error)?;
    let frame = match decoder.next_frame_info().map_err(gif_error)? {
        Some(frame) => [frame.left, frame.top, frame.width, frame.height].map(u32::from),
        None => return Err(SampleError::Corrupt("gif: no image in the file".into())),
    };
    let [left, top, width, height] = frame;
    let canvas = (
        u32::from(decoder.width()).max(left + width),
        u32::from(decoder.height()).max(top + height),
    );
    Ok(GifStart {
        decoder,
        frame,
        canvas,
    })
}

/// A GIF's size as Pillow gives it (see [`GifStart::canvas`]).
pub(super) fn gif_size(bytes: &[u8]) -> Result<(u32, u32), SampleError> {
    Ok(gif_start(bytes)?.canvas)
}

/// Decodes a GIF's first frame as Pillow's `convert("RGB")` gives it: the frame's indices on a
/// canvas of [`gif_size`] filled with the frame's transparent index (index 0 where it has
/// none), each index through the palette Pillow picks ([`gif_colours`]). Transparent pixels
/// keep their palette colour.
pub(super) fn decode_gif(
    bytes: &[u8],
    header: &ImageHeader,
    out: &mut DecodedImage,
) -> Result<(), SampleError> {
    let GifStart {
        mut decoder,
        frame: [left, top, width, height],
        canvas,
    } = gif_start(bytes)?;
    if canvas != (header.width, header.height) {
        return Err(SampleError::Corrupt(format!(
            "gif header gives {}x{} but the decoder {}x{}",
            header.width, header.height, canvas.0, canvas.1
        )));
    }
    if width == 0 || height == 0 {
        return Err(SampleError::Corrupt(format!(
            "gif: the first frame is {width}x{height}"
        )));
    }
    let (fill, local) = match decoder.current_frame_info() {
        Some(frame) => (frame.transparent.unwrap_or(0), frame.palette.clone()),
        None => (0, None),
    };
    let colours = gif_colours(local.as_deref(), decoder.global_palette());
    // The frame lies inside the canvas, whose pixels the header's limit allowed.
    let mut indices = vec![0u8; width as usize * height as usize];
    decoder.read_into_buffer(&mut indices).map_err(gif_error)?;
    let (canvas_width, frame_width) = (header.width as usize, width as usize);
    out.pixels.clear();
    out.pixels
        .resize(canvas_width * header.height as usize * 3, 0);
    for pixel in out.pixels.chunks_exact_mut(3) {
        pixel.copy_from_slice(&colours[usize::from(fill)]);
    }
    for (y, row) in indices.chunks_exact(frame_width).enumerate() {
        let start = ((top as usize + y) * canvas_width + left as usize) * 3;
        let line = &mut out.pixels[start..start + frame_width * 3];
        for (pixel, &index) in line.chunks_exact_mut(3).zip(row) {
            pixel.copy_from_slice(&colours[usize::from(index)]);
        }
    }
    whole_image(out, header.width, header.height);
    Ok(())
}

/// The colour of each index of a GIF's first frame, from the palette Pillow picks: it reads a
/// palette whose entries are their own indices in gray ((0,0,0), (1,1,1)...) as none, then
/// takes the frame's own palette, else the global one, else gray (index i as (i,i,i), past
/// the palette too); an index past a palette is black.
fn gif_colours(local: Option<&[u8]>, global: Option<&[u8]>) -> [[u8; 3]; 256] {
    let gray_ramp = |palette: &[u8]| {
        palette
            .chunks_exact(3)
            .enumerate()
            .all(|(i, entry)| entry.iter().all(|&sample| usize::from(sample) == i))
    };
    let mut colours = [[0u8; 3]; 256];
    match [local, global]
        .into_iter()
        .flatten()
        .find(|p| !gray_ramp(p))
    {
        Some(palette) => {
            for (colour, entry) in colours.iter_mut().zip(palette.chunks_exact(3)) {
                colour.copy_from_slice(entry);
            }
        }
        None => {
            for (i, colour) in colours.iter_mut().enumerate() {
                *colour = [i as u8; 3];
            }
        }
    }
    colours
}

/// Records in `out` that its pixels are a whole `width` x `height` image, unscaled.
fn whole_image(out: &mut DecodedImage, width: u32, height: u32) {
    out.width = width;
    out.height = height;
    out.offset_x = 0;
    out.offset_y = 0;
    out.scaled_width = width;
    out.scaled_height = height;
    out.scale_eighths = 8;
    out.original_width = width;
    out.original_height = height;
}

/// Bytes per pixel of the widest output the `image` crate decodes to (RGBA, f32 samples).
const WIDEST_PIXEL_BYTES: u64 = 16;

/// Decodes a WebP, BMP, TIFF or PNM through the `image` crate.
///
/// The decoder may not produce an image larger than the header said (which [`read_header`]
/// checked against the pixel limit), nor allocate more than twice the widest output of that
/// size: once for the output, once for the decoder's own buffers.
pub(super) fn decode_with_image_crate(
    bytes: &[u8],
    header: &ImageHeader,
    format: image::ImageFormat,
    out: &mut DecodedImage,
) -> Result<(), SampleError> {
    let corrupt = |error: image::ImageError| match error {
        image::ImageError::Unsupported(kind) => {
            SampleError::UnsupportedKind(format!("{}: {kind}", header.format.name()))
        }
        error => SampleError::Corrupt(format!("{}: {error}", header.format.name())),
    };
    let pixels = u64::from(header.width) * u64::from(header.height);
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(header.width);
    limits.max_image_height = Some(header.height);
    limits.max_alloc = Some(pixels.saturating_mul(2 * WIDEST_PIXEL_BYTES));
    let mut reader = image::ImageReader::with_format(Cursor::new(bytes), format);
    reader.limits(limits);
    let decoded = reader.decode().map_err(corrupt)?;
    if (decoded.width(), decoded.height()) != (header.width, header.height) {
        return Err(SampleError::Corrupt(format!(
            "{} header gives {}x{} but the decoder {}x{}",
            header.format.name(),
            header.width,
            header.height,
            decoded.width(),
            decoded.height()
        )));
    }
    let with_alpha = matches!(
        decoded,
        image::DynamicImage::ImageRgba8(_) | image::DynamicImage::ImageRgba16(_)
    );
    let decoded =
        if with_alpha && format == image::ImageFormat::Tiff && tiff_alpha_is_associated(bytes) {
            unpremultiplied(decoded)
        } else {
            decoded
        };
    rgb8_of(decoded, &mut out.pixels);
    whole_image(out, header.width, header.height);
    Ok(())
}

/// Whether a TIFF's first image holds associated (premultiplied) alpha: its first extra
/// sample is of kind 1 (stored unsigned or signed, as Pillow reads either). The `image` crate
/// hands such samples through as they are stored.
fn tiff_alpha_is_associated(bytes: &[u8]) -> bool {
    use tiff::decoder::ifd::Value;
    let Ok(Some(kinds)) = tiff::decoder::Decoder::new(Cursor::new(bytes))
        .and_then(|mut decoder| decoder.find_tag(tiff::tags::Tag::ExtraSamples))
    else {
        return false;
    };
    let first = match kinds {
        Value::List(kinds) => kinds.into_iter().next(),
        kind => Some(kind),
    };
    matches!(
        first,
        Some(
            Value::Byte(1)
                | Value::Short(1)
                | Value::Unsigned(1)
                | Value::UnsignedBig(1)
                | Value::SignedByte(1)
                | Value::SignedShort(1)
                | Value::Signed(1)
                | Value::SignedBig(1)
        )
    )
}

/// RGBA of premultiplied samples divided by their alpha as Pillow's `RGBa` unpacking does:
/// each colour times 255 over alpha, truncated and clipped at 255; a pixel of alpha 0 black.
/// 16-bit samples by their high bytes (Pillow's `RGBa;16`); other layouts as they are.
fn unpremultiplied(decoded: image::DynamicImage) -> image::DynamicImage {
    let mut rgba = match decoded {
        image::DynamicImage::ImageRgba8(rgba) => rgba,
        image::DynamicImage::ImageRgba16(rgba) => {
            let (width, height) = rgba.dimensions();
            let high = rgba
                .as_raw()
                .iter()
                .map(|&sample| (sample >> 8) as u8)
                .collect();
            match image::RgbaImage::from_raw(width, height, high) {
                Some(rgba) => rgba,
                None => return image::DynamicImage::ImageRgba16(rgba),
            }
        }
        other => return other,
    };
    for pixel in rgba.pixels_mut() {
        let alpha = u32::from(pixel[3]);
        match alpha {
            0 => pixel.0 = [0; 4],
            255 => {}
            _ => {
                for sample in &mut pixel.0[..3] {
                    *sample = (u32::from(*sample) * 255 / alpha).min(255) as u8;
                }
            }
        }
    }
    image::DynamicImage::ImageRgba8(rgba)
}

/// Packed RGB8 of any decoded image into `rgb`: alpha dropped without compositing, gray
/// replicated, 16-bit samples reduced to their high byte (see the module doc for where PIL
/// differs), float samples through the `image` crate's own conversion (clamped to 0..=1).
pub(super) fn rgb8_of(decoded: image::DynamicImage, rgb: &mut Vec<u8>) {
    use image::DynamicImage;

    fn expand<T: Copy>(samples: &[T], channels: usize, to_u8: impl Fn(T) -> u8, rgb: &mut Vec<u8>) {
        rgb.clear();
        rgb.reserve(samples.len() / channels * 3);
        for pixel in samples.chunks_exact(channels) {
            if channels < 3 {
                let gray = to_u8(pixel[0]);
                rgb.extend_from_slice(&[gray, gray, gray]);
            } else {
                rgb.extend(pixel[..3].iter().map(|&sample| to_u8(sample)));
            }
        }
    }
    let byte = |sample: u8| sample;
    let high_byte = |sample: u16| (sample >> 8) as u8;
    match decoded {
        DynamicImage::ImageRgb8(image) => *rgb = image.into_raw(),
        DynamicImage::ImageRgba8(image) => expand(image.as_raw(), 4, byte, rgb),
        DynamicImage::ImageLuma8(image) => expand(image.as_raw(), 1, byte, rgb),
        DynamicImage::ImageLumaA8(image) => expand(image.as_raw(), 2, byte, rgb),
        DynamicImage::ImageRgb16(image) => expand(image.as_raw(), 3, high_byte, rgb),
        DynamicImage::ImageRgba16(image) => expand(image.as_raw(), 4, high_byte, rgb),
        DynamicImage::ImageLuma16(image) => expand(image.as_raw(), 1, high_byte, rgb),
        DynamicImage::ImageLumaA16(image) => expand(image.as_raw(), 2, high_byte, rgb),
        other => *rgb = other.to_rgb8().into_raw(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gifs_colours_come_from_the_palette_pillow_picks() {
        let colour: Vec<u8> = vec![255, 0, 0, 0, 255, 0];
        let gray: Vec<u8> = vec![0, 0, 0, 1, 1, 1];
        let lit = |colours: [[u8; 3]; 256]| [colours[0], colours[1], colours[2], colours[200]];
        // The frame's own palette, an index past it black.
        let picked = gif_colours(Some(&colour), Some(&gray));
        assert_eq!(
            lit(picked),
            [[255, 0, 0], [0, 255, 0], [0, 0, 0], [0, 0, 0]]
        );
        // A gray ramp is no palette to Pillow: the global one, else gray past the ramp too.
        let picked = gif_colours(Some(&gray), Some(&colour));
        assert_eq!(
            lit(picked),
            [[255, 0, 0], [0, 255, 0], [0, 0, 0], [0, 0, 0]]
        );
        for (local, global) in [
            (None, Some(&gray[..])),
            (Some(&gray[..]), None),
            (None, None),
        ] {
            let picked = gif_colours(local, global);
            assert_eq!(
                lit(picked),
                [[0, 0, 0], [1, 1, 1], [2, 2, 2], [200, 200, 200]]
            );
        }
        // A gray palette out of order is a palette.
        let picked = gif_colours(None, Some(&[1, 1, 1, 0, 0, 0]));
        assert_eq!(lit(picked), [[1, 1, 1], [0, 0, 0], [0, 0, 0], [0, 0, 0]]);
    }

    #[test]
    fn premultiplied_samples_are_divided_by_alpha_as_pillow_does() {
        let pixels = vec![
            0, 0, 0, 0, // alpha 0
            9, 9, 9, 0, // alpha 0, colour left in: black, as Pillow gives it
            19, 26, 52, 64, // 19 * 255 / 64 = 75.7: 75
            200, 64, 1, 64, // above alpha: clipped at 255
            34, 102, 51, 255, // opaque: as stored
        ];
        let rgba = image::RgbaImage::from_raw(5, 1, pixels).unwrap();
        let out = unpremultiplied(image::DynamicImage::ImageRgba8(rgba));
        assert_eq!(
            out.as_bytes(),
            [0, 0, 0, 0, 0, 0, 0, 0, 75, 103, 207, 64, 255, 255, 3, 64, 34, 102, 51, 255]
        );
        // 16-bit samples by their high bytes.
        let wide = image::ImageBuffer::from_raw(1, 1, vec![19 << 8 | 0xFF, 0, 0, 64 << 8]).unwrap();
        let out = unpremultiplied(image::DynamicImage::ImageRgba16(wide));
        assert_eq!(out.as_bytes(), [75, 0, 0, 64]);
        // Layouts without alpha pass through.
        let rgb = image::RgbImage::from_raw(1, 1, vec![1, 2, 3]).unwrap();
        let out = unpremultiplied(image::DynamicImage::ImageRgb8(rgb));
        assert_eq!(out.as_bytes(), [1, 2, 3]);
    }
}
