//! Which images the GPU lane takes, and where it puts them.
//!
//! Two readings decide it. On the decode threads, [`scan`] walks every marker of the file (no
//! decoding): one baseline or extended-sequential Huffman frame with 8-bit samples, grey or
//! YCbCr in a chroma layout the hardware engines decode (4:4:4, 4:2:2, 4:2:0, 4:4:0), one scan
//! over every component whose entropy-coded data holds only stuffed bytes and restart markers in
//! order (as many as the restart interval gives), then an end-of-image marker at the end.
//! Everything else goes to the CPU threads, whose bad-sample policy then applies as it does to
//! every image there: progressive, arithmetic (SOF9-15, DAC), lossless or hierarchical coding,
//! 12-bit samples, CMYK/YCCK, 4:1:1, a second frame header (before or after the scan), a stray
//! start-of-image marker, a second scan, markers other than the end after the scan, an RGB or
//! unknown Adobe colour transform, sides over [`MAX_SIDE`], a file cut short, PNG. The frame
//! [`scan`] read must also be the size the CPU path's header read gave ([`Frame::agrees`]),
//! since the crop window was drawn from that one.
//!
//! On the lane's thread, nvJPEG parses the whole stream itself (`nvjpegJpegStreamParse`, the
//! parse its hardware backend decodes by) and [`accept`] compares what it read with the frame:
//! the image is decoded on the GPU only when the sizes, component count and subsampling agree,
//! and its place in the arena and its row pitch come from those agreed values
//! ([`Placement`]), so nothing is written past its place whichever parser is wrong.
//!
//! Restart markers are accepted: nvJPEG's header lists restart intervals as unsupported only for
//! its `GPU_HYBRID_DEVICE` backend, and the hardware backend (which takes "baseline JPEG
//! bitstream with single scan") decodes them; [`scan`] checks their order and count so a file
//! libjpeg-turbo would warn about for them goes to the CPU.
//!
//! What headers cannot show (flipped bits in the scan data, a scan cut short with an end marker
//! appended) is left to the decode itself: nvJPEG's strict bitstream check and per-image status,
//! and the lane's check that every place it crops from was written (`lane/pipe/`).

/// Why an image is left to the CPU threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decline {
    /// Not a JPEG (PNG, or anything else).
    NotJpeg,
    /// Progressive coding.
    Progressive,
    /// Arithmetic (SOF9-15, DAC), lossless or hierarchical coding.
    OtherCoding,
    /// Not 8 bits per sample.
    Precision,
    /// Four components (CMYK, YCCK) or another count than 1 or 3.
    Components,
    /// A chroma layout the engines do not decode (4:1:1, odd factors).
    Subsampling,
    /// A colour transform other than YCbCr (Adobe's RGB or unknown ones, RGB component ids).
    ColorSpace,
    /// No end-of-image marker: the file may be cut short.
    Truncated,
    /// More than `EOI_WINDOW` bytes after the end-of-image marker.
    TrailingData,
    /// A second frame header, before or after the scan.
    SecondFrame,
    /// A second start-of-image marker.
    StraySoi,
    /// More than one scan, a scan that does not cover every component, or markers other than
    /// the end-of-image marker after the scan.
    Scans,
    /// Restart markers out of order, without a restart interval, or not as many as it gives.
    Restarts,
    /// A side of 0 (a height given by a DNL marker) or over `MAX_SIDE`.
    Size,
    /// Two readings of the frame differ: the CPU path's header and the marker scan, or the
    /// marker scan and nvJPEG's parse.
    Disagree,
    /// nvJPEG cannot parse the stream, or its batched decode does not take it.
    DecoderRefused,
    /// The markers do not parse.
    Malformed,
}

impl Decline {
    /// A short name, for statistics and logs.
    pub fn name(self) -> &'static str {
        match self {
            Decline::NotJpeg => "not a JPEG",
            Decline::Progressive => "progressive JPEG",
            Decline::OtherCoding => "arithmetic, lossless or hierarchical JPEG",
            Decline::Precision => "not 8-bit",
            Decline::Components => "CMYK or an unusual component count",
            Decline::Subsampling => "unsupported chroma subsampling",
            Decline::ColorSpace => "RGB or unknown colour transform",
            Decline::Truncated => "no end-of-image marker",
            Decline::TrailingData => "data after the end-of-image marker",
            Decline::SecondFrame => "a second frame header",
            Decline::StraySoi => "a second start-of-image marker",
            Decline::Scans => "more than one scan",
            Decline::Restarts => "restart markers out of order or miscounted",
            Decline::Size => "a side of 0 or over the engines' limit",
            Decline::Disagree => "parsers read different frames",
            Decline::DecoderRefused => "nvJPEG refused the stream",
            Decline::Malformed => "malformed markers",
        }
    }
}

/// How far from the end the end-of-image marker may lie (some writers pad after it).
pub const EOI_WINDOW: usize = 64;

/// The longest side the lane takes. nvJPEG publishes no limit for its hardware engines; JPEG
/// allows 65,535. Larger images are rare in training sets and go to the CPU threads, where the
/// pixel limit applies as to every image.
pub const MAX_SIDE: u32 = 16_384;

/// A chroma layout the engines decode, by the luma component's sampling factors (the chroma
/// components' are 1x1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chroma {
    /// One component.
    Grey,
    /// Luma 1x1.
    S444,
    /// Luma 2x1.
    S422,
    /// Luma 2x2.
    S420,
    /// Luma 1x2.
    S440,
}

impl Chroma {
    /// nvJPEG's `nvjpegChromaSubsampling_t` for this layout.
    pub fn nvjpeg_code(self) -> i32 {
        match self {
            Chroma::S444 => 0,
            Chroma::S422 => 1,
            Chroma::S420 => 2,
            Chroma::S440 => 3,
            Chroma::Grey => 6,
        }
    }

    /// The minimum coded unit's width and height in pixels: 8 times the largest horizontal
    /// and vertical sampling factors.
    pub fn mcu(self) -> (u32, u32) {
        let (h, v) = self.max_factors();
        (8 * h, 8 * v)
    }

    /// The largest horizontal and vertical sampling factors (the MCU is 8 times these).
    fn max_factors(self) -> (u32, u32) {
        match self {
            Chroma::Grey | Chroma::S444 => (1, 1),
            Chroma::S422 => (2, 1),
            Chroma::S420 => (2, 2),
            Chroma::S440 => (1, 2),
        }
    }
}

/// The frame the marker scan read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// 1 or 3.
    pub components: u32,
    /// The chroma layout.
    pub chroma: Chroma,
    /// The frame header's marker: 0xC0 (baseline) or 0xC1 (extended sequential).
    pub coding: u8,
}

impl Frame {
    /// Whether the CPU path's header read (`imagesize`, the size the crop window was drawn
    /// in) gives this frame's size.
    pub fn agrees(&self, header: (u32, u32)) -> bool {
        (self.width, self.height) == header
    }

    /// Minimum coded units in the scan (the unit restart intervals count in).
    fn mcus(&self) -> u64 {
        let (h, v) = self.chroma.max_factors();
        u64::from(self.width.div_ceil(8 * h)) * u64::from(self.height.div_ceil(8 * v))
    }
}

/// What nvJPEG's own parse of the whole stream read (`nvjpegJpegStreamGetFrameDimensions`,
/// `GetComponentsNum`, `GetChromaSubsampling`, `GetJpegEncoding`, `GetSamplePrecision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecoderReading {
    /// Frame width.
    pub width: u32,
    /// Frame height.
    pub height: u32,
    /// Encoded components.
    pub components: u32,
    /// `nvjpegChromaSubsampling_t`.
    pub subsampling: i32,
    /// `nvjpegJpegEncoding_t`: the frame header's marker.
    pub encoding: i32,
    /// Bits per sample, where the library reports it.
    pub precision: Option<u32>,
}

/// Where the lane decodes an accepted image: interleaved RGB, `pitch` bytes a row, `bytes`
/// bytes in all (rounded up to `align`), all from the values both parsers agreed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Bytes per row.
    pub pitch: usize,
    /// Bytes the decoded image takes: `pitch * height`.
    pub decoded: usize,
    /// Bytes its place in the arena takes (`decoded` rounded up to the alignment).
    pub place: usize,
}

/// The lane's acceptance decision for one image: `frame` is what the decode threads' marker
/// scan read (already checked against the CPU path's header, [`Frame::agrees`]), `decoder`
/// what nvJPEG's own full parse read. The image is decoded on the GPU only when the two agree
/// on size, component count and subsampling, with the coding and precision the engines take;
/// its placement is sized from those values, with places aligned to `align` bytes.
pub fn accept(frame: &Frame, decoder: &DecoderReading, align: usize) -> Result<Placement, Decline> {
    let agree = decoder.width == frame.width
        && decoder.height == frame.height
        && decoder.components == frame.components
        && decoder.subsampling == frame.chroma.nvjpeg_code()
        && decoder.encoding == i32::from(frame.coding)
        && decoder.precision.is_none_or(|bits| bits == 8);
    if !agree {
        return Err(Decline::Disagree);
    }
    if frame.width == 0 || frame.height == 0 || frame.width.max(frame.height) > MAX_SIDE {
        return Err(Decline::Size);
    }
    let pitch = frame.width as usize * 3;
    let decoded = pitch * frame.height as usize;
    let align = align.max(1);
    Ok(Placement {
        width: frame.width,
        height: frame.height,
        pitch,
        decoded,
        place: decoded.div_ceil(align) * align,
    })
}

/// `Ok(())` when the hardware lane may take `bytes`, else why not (see `scan`).
pub fn hardware_candidate(bytes: &[u8]) -> Result<(), Decline> {
    scan(bytes).map(|_| ())
}

/// A segment's payload (after its length) and the offset just past it.
fn segment(bytes: &[u8], at: usize) -> Result<(&[u8], usize), Decline> {
    let length = bytes
        .get(at..at + 2)
        .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
        .ok_or(Decline::Malformed)?;
    if length < 2 {
        return Err(Decline::Malformed);
    }
    let payload = bytes.get(at + 2..at + length).ok_or(Decline::Malformed)?;
    Ok((payload, at + length))
}

/// The marker at `at` (after any 0xFF fill bytes) and the offset just past it.
fn marker(bytes: &[u8], mut at: usize) -> Result<(u8, usize), Decline> {
    if bytes.get(at) != Some(&0xFF) {
        return Err(Decline::Malformed);
    }
    while bytes.get(at + 1) == Some(&0xFF) {
        at += 1;
    }
    let code = *bytes.get(at + 1).ok_or(Decline::Truncated)?;
    Ok((code, at + 2))
}

/// A frame header: the frame, and its components' ids in order (a scan must name them).
struct FrameHeader {
    frame: Frame,
    ids: Vec<u8>,
}

/// Walks every marker of `bytes` and returns the frame when the lane may take the image.
pub fn scan(bytes: &[u8]) -> Result<Frame, Decline> {
    if bytes.len() < 4 || bytes[0] != 0xFF || bytes[1] != 0xD8 {
        return Err(Decline::NotJpeg);
    }
    let mut at = 2;
    let mut header: Option<FrameHeader> = None;
    let mut restart_interval = 0u32;
    let mut adobe_transform: Option<u8> = None;
    let mut scanned = false;
    loop {
        let (code, next) = marker(bytes, at)?;
        at = next;
        if scanned && code != 0xD9 {
            return Err(match code {
                0xD8 => Decline::StraySoi,
                0xC0..=0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF => Decline::SecondFrame,
                _ => Decline::Scans,
            });
        }
        match code {
            0xD8 => return Err(Decline::StraySoi),
            0xD9 => {
                let header = header.ok_or(Decline::Malformed)?;
                if !scanned {
                    return Err(Decline::Malformed);
                }
                if bytes.len() - at > EOI_WINDOW {
                    return Err(Decline::TrailingData);
                }
                return Ok(header.frame);
            }
            // Restart markers and TEM outside entropy-coded data, JPG and reserved markers.
            0x00..=0xBF | 0xC8 | 0xD0..=0xD7 | 0xF0..=0xFD => return Err(Decline::Malformed),
            0xDA => {
                let frame_header = header.as_ref().ok_or(Decline::Malformed)?;
                // Adobe's transform flag, for three components: 1 is YCbCr; 0 (RGB) and others
                // are decoded otherwise, or warned about, by libjpeg-turbo.
                if frame_header.frame.components == 3 && adobe_transform.is_some_and(|t| t != 1) {
                    return Err(Decline::ColorSpace);
                }
                let (payload, end) = segment(bytes, at)?;
                scan_header(payload, frame_header)?;
                let mcus = frame_header.frame.mcus();
                at = entropy_data(bytes, end, restart_interval, mcus)?;
                scanned = true;
            }
            _ => {
                let (payload, end) = segment(bytes, at)?;
                match code {
                    0xC0 | 0xC1 if header.is_some() => return Err(Decline::SecondFrame),
                    0xC0 | 0xC1 => header = Some(frame_header(code, payload)?),
                    0xC2 | 0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF if header.is_some() => {
                        return Err(Decline::SecondFrame)
                    }
                    0xC2 => return Err(Decline::Progressive),
                    // SOF3, SOF5-7 (lossless, hierarchical), SOF9-15 (arithmetic), DAC, DHP,
                    // EXP.
                    0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCC..=0xCF | 0xDE | 0xDF => {
                        return Err(Decline::OtherCoding)
                    }
                    0xDD => {
                        let interval = payload.get(..2).ok_or(Decline::Malformed)?;
                        restart_interval =
                            u32::from(u16::from_be_bytes([interval[0], interval[1]]));
                    }
                    0xEE if payload.starts_with(b"Adobe") => {
                        adobe_transform = Some(*payload.get(11).ok_or(Decline::Malformed)?);
                    }
                    _ => {}
                }
                at = end;
            }
        }
    }
}

/// Reads a frame header: precision, size, components, sampling factors.
fn frame_header(code: u8, payload: &[u8]) -> Result<FrameHeader, Decline> {
    let (&precision, rest) = payload.split_first().ok_or(Decline::Malformed)?;
    if precision != 8 {
        return Err(Decline::Precision);
    }
    let field = |at: usize| {
        rest.get(at..at + 2)
            .map(|b| u32::from(u16::from_be_bytes([b[0], b[1]])))
            .ok_or(Decline::Malformed)
    };
    let (height, width) = (field(0)?, field(2)?);
    let count = usize::from(*rest.get(4).ok_or(Decline::Malformed)?);
    let components = rest.get(5..).ok_or(Decline::Malformed)?;
    if components.len() != 3 * count {
        return Err(Decline::Malformed);
    }
    if count != 1 && count != 3 {
        return Err(Decline::Components);
    }
    let ids: Vec<u8> = components.chunks_exact(3).map(|c| c[0]).collect();
    if (1..ids.len()).any(|i| ids[..i].contains(&ids[i])) {
        return Err(Decline::Malformed);
    }
    let factors: Vec<(u8, u8)> = components
        .chunks_exact(3)
        .map(|c| (c[1] >> 4, c[1] & 0x0F))
        .collect();
    if factors
        .iter()
        .any(|&(h, v)| !(1..=4).contains(&h) || !(1..=4).contains(&v))
    {
        return Err(Decline::Malformed);
    }
    let chroma = if count == 1 {
        Chroma::Grey
    } else {
        if ids == [b'R', b'G', b'B'] {
            return Err(Decline::ColorSpace);
        }
        if factors[1] != (1, 1) || factors[2] != (1, 1) {
            return Err(Decline::Subsampling);
        }
        match factors[0] {
            (1, 1) => Chroma::S444,
            (2, 1) => Chroma::S422,
            (2, 2) => Chroma::S420,
            (1, 2) => Chroma::S440,
            _ => return Err(Decline::Subsampling),
        }
    };
    if width == 0 || height == 0 || width.max(height) > MAX_SIDE {
        return Err(Decline::Size);
    }
    Ok(FrameHeader {
        frame: Frame {
            width,
            height,
            components: count as u32,
            chroma,
            coding: code,
        },
        ids,
    })
}

/// Checks a scan header: every frame component once, in the frame's order, sequential
/// spectral selection and no successive approximation.
fn scan_header(payload: &[u8], frame: &FrameHeader) -> Result<(), Decline> {
    let count = usize::from(*payload.first().ok_or(Decline::Malformed)?);
    if payload.len() != 1 + 2 * count + 3 {
        return Err(Decline::Malformed);
    }
    let ids: Vec<u8> = payload[1..1 + 2 * count]
        .chunks_exact(2)
        .map(|c| c[0])
        .collect();
    if ids != frame.ids {
        return Err(Decline::Scans);
    }
    let tail = &payload[1 + 2 * count..];
    if tail != [0, 63, 0] {
        return Err(Decline::Malformed);
    }
    Ok(())
}

/// Walks entropy-coded data from `at` to the marker that ends it and returns that marker's
/// offset: stuffed zero bytes, fill bytes and restart markers in order inside; with a restart
/// interval, one restart marker between each `interval` MCUs.
fn entropy_data(bytes: &[u8], mut at: usize, interval: u32, mcus: u64) -> Result<usize, Decline> {
    let mut restarts = 0u64;
    loop {
        let found = bytes
            .get(at..)
            .and_then(|rest| rest.iter().position(|&b| b == 0xFF))
            .ok_or(Decline::Truncated)?;
        let mut ff = at + found;
        while bytes.get(ff + 1) == Some(&0xFF) {
            ff += 1;
        }
        match *bytes.get(ff + 1).ok_or(Decline::Truncated)? {
            0x00 => at = ff + 2,
            code @ 0xD0..=0xD7 => {
                if interval == 0 || u64::from(code - 0xD0) != restarts % 8 {
                    return Err(Decline::Restarts);
                }
                restarts += 1;
                at = ff + 2;
            }
            _ => {
                let expected = if interval == 0 {
                    0
                } else {
                    mcus.div_ceil(u64::from(interval)).saturating_sub(1)
                };
                if restarts != expected {
                    return Err(Decline::Restarts);
                }
                return Ok(ff);
            }
        }
    }
}

/// A parser that reads a JPEG as nvJPEG's documentation says it does, standing in for
/// `nvjpegJpegStreamParse` where no GPU is (the fuzz target and the tests): the first frame
/// header's size, component count, sampling factors (`nvjpegJpegStreamGetChromaSubsampling`:
/// grey for one component, a known layout for three, else unknown), coding and precision.
/// `None` where it finds no frame header.
#[cfg(any(test, feature = "fuzzing"))]
pub fn documented_reading(bytes: &[u8]) -> Option<DecoderReading> {
    if bytes.get(..2) != Some(&[0xFF, 0xD8]) {
        return None;
    }
    let mut at = 2;
    loop {
        let (code, next) = marker(bytes, at).ok()?;
        if matches!(code, 0x01 | 0xD0..=0xD9) {
            at = next;
            continue;
        }
        let (payload, end) = segment(bytes, next).ok()?;
        if matches!(code, 0xC0..=0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF) {
            let u16_at = |i: usize| {
                payload
                    .get(i..i + 2)
                    .map(|b| u32::from(u16::from_be_bytes([b[0], b[1]])))
            };
            let count = usize::from(*payload.get(5)?);
            let factors: Vec<(u8, u8)> = payload
                .get(6..6 + 3 * count)?
                .chunks_exact(3)
                .map(|c| (c[1] >> 4, c[1] & 0x0F))
                .collect();
            let subsampling = match (count, factors.as_slice()) {
                (1, _) => Chroma::Grey.nvjpeg_code(),
                (3, [luma, (1, 1), (1, 1)]) => match luma {
                    (1, 1) => Chroma::S444.nvjpeg_code(),
                    (2, 1) => Chroma::S422.nvjpeg_code(),
                    (2, 2) => Chroma::S420.nvjpeg_code(),
                    (1, 2) => Chroma::S440.nvjpeg_code(),
                    (4, 1) => 4,
                    _ => -1,
                },
                _ => -1,
            };
            return Some(DecoderReading {
                width: u16_at(3)?,
                height: u16_at(1)?,
                components: count as u32,
                subsampling,
                encoding: i32::from(code),
                precision: Some(u32::from(*payload.first()?)),
            });
        }
        if code == 0xDA {
            return None;
        }
        at = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal marker stream: SOI, an APP0, a frame header of `sof` with the given
    /// components' sampling bytes, a scan header, one byte of data, EOI.
    fn jpeg(sof: u8, precision: u8, sampling: &[u8]) -> Vec<u8> {
        let mut out = vec![0xFF, 0xD8];
        out.extend([0xFF, 0xE0, 0x00, 0x04, b'J', b'F']);
        let length = 8 + 3 * sampling.len();
        out.extend([
            0xFF,
            sof,
            0x00,
            length as u8,
            precision,
            0x00,
            0x10,
            0x00,
            0x10,
        ]);
        out.push(sampling.len() as u8);
        for (i, s) in sampling.iter().enumerate() {
            out.extend([i as u8 + 1, *s, 0]);
        }
        out.extend([0xFF, 0xDA, 0x00, 6 + 2 * sampling.len() as u8]);
        out.push(sampling.len() as u8);
        for i in 0..sampling.len() {
            out.extend([i as u8 + 1, 0]);
        }
        out.extend([0, 63, 0, 0x12, 0xFF, 0x00, 0x34, 0xFF, 0xD9]);
        out
    }

    #[test]
    fn baseline_grey_and_ycbcr_layouts_are_taken() {
        for (sampling, chroma) in [
            (&[0x11][..], Chroma::Grey),
            (&[0x11, 0x11, 0x11], Chroma::S444),
            (&[0x21, 0x11, 0x11], Chroma::S422),
            (&[0x22, 0x11, 0x11], Chroma::S420),
            (&[0x12, 0x11, 0x11], Chroma::S440),
        ] {
            let frame = scan(&jpeg(0xC0, 8, sampling)).unwrap();
            assert_eq!(frame.chroma, chroma, "{sampling:?}");
            assert_eq!((frame.width, frame.height), (16, 16));
        }
        assert_eq!(
            hardware_candidate(&jpeg(0xC1, 8, &[0x22, 0x11, 0x11])),
            Ok(())
        );
    }

    #[test]
    fn the_rest_is_left_to_the_cpu_with_the_reason() {
        let cases: [(Vec<u8>, Decline); 7] = [
            (jpeg(0xC2, 8, &[0x22, 0x11, 0x11]), Decline::Progressive),
            (jpeg(0xC9, 8, &[0x22, 0x11, 0x11]), Decline::OtherCoding),
            (jpeg(0xC3, 8, &[0x11]), Decline::OtherCoding),
            (jpeg(0xC0, 12, &[0x11]), Decline::Precision),
            (
                jpeg(0xC0, 8, &[0x11, 0x11, 0x11, 0x11]),
                Decline::Components,
            ),
            (jpeg(0xC0, 8, &[0x41, 0x11, 0x11]), Decline::Subsampling),
            (b"\x89PNG\r\n\x1a\n0000".to_vec(), Decline::NotJpeg),
        ];
        for (bytes, expected) in cases {
            assert_eq!(hardware_candidate(&bytes), Err(expected));
        }
        let mut cut = jpeg(0xC0, 8, &[0x22, 0x11, 0x11]);
        cut.truncate(cut.len() - 2);
        assert_eq!(hardware_candidate(&cut), Err(Decline::Truncated));
        // A length running past the end, and a scan before any frame.
        let mut broken = vec![0xFF, 0xD8, 0xFF, 0xE0, 0x7F, 0xFF];
        broken.extend([0xFF, 0xD9]);
        assert_eq!(hardware_candidate(&broken), Err(Decline::Malformed));
        let scan_first = vec![
            0xFF, 0xD8, 0xFF, 0xDA, 0x00, 0x08, 1, 1, 0, 0, 63, 0, 0xFF, 0xD9,
        ];
        assert_eq!(hardware_candidate(&scan_first), Err(Decline::Malformed));
    }

    #[test]
    fn accept_sizes_from_the_agreed_frame_and_declines_any_difference() {
        let frame = scan(&jpeg(0xC0, 8, &[0x22, 0x11, 0x11])).unwrap();
        let reading = documented_reading(&jpeg(0xC0, 8, &[0x22, 0x11, 0x11])).unwrap();
        let placement = accept(&frame, &reading, 256).unwrap();
        assert_eq!(placement.pitch, 48);
        assert_eq!(placement.decoded, 48 * 16);
        assert_eq!(placement.place, 768);
        assert_eq!(accept(&frame, &reading, 1000).unwrap().place, 1000);
        for differ in [
            DecoderReading {
                width: 17,
                ..reading
            },
            DecoderReading {
                height: 15,
                ..reading
            },
            DecoderReading {
                components: 4,
                ..reading
            },
            DecoderReading {
                subsampling: 0,
                ..reading
            },
            DecoderReading {
                encoding: 0xC2,
                ..reading
            },
            DecoderReading {
                precision: Some(12),
                ..reading
            },
        ] {
            assert_eq!(accept(&frame, &differ, 256), Err(Decline::Disagree));
        }
        let unknown_precision = DecoderReading {
            precision: None,
            ..reading
        };
        assert!(accept(&frame, &unknown_precision, 256).is_ok());
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        for length in 0..400 {
            let mut bytes: Vec<u8> = (0..length)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state >> 24) as u8
                })
                .collect();
            if length > 2 {
                bytes[0] = 0xFF;
                bytes[1] = 0xD8;
            }
            let _ = hardware_candidate(&bytes);
            let _ = documented_reading(&bytes);
        }
    }
}
