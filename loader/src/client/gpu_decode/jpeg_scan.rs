//! Which images the GPU lane takes, from their markers alone (no decoding, on the decode
//! threads): baseline or extended-sequential Huffman JPEGs with 8-bit samples, grey or YCbCr
//! with the chroma layouts the hardware engines decode (4:4:4, 4:2:2, 4:2:0, 4:4:0), ending
//! with an end-of-image marker. Everything else (progressive, arithmetic or lossless coding,
//! CMYK/YCCK, 4:1:1, 12-bit, a file cut short, PNG) goes to the CPU threads, whose bad-sample
//! policy then applies as it does to every image there.

/// Why an image is left to the CPU threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decline {
    /// Not a JPEG (PNG, or anything else).
    NotJpeg,
    /// Progressive coding.
    Progressive,
    /// Arithmetic, lossless or hierarchical coding.
    OtherCoding,
    /// Not 8 bits per sample.
    Precision,
    /// Four components (CMYK, YCCK) or another count than 1 or 3.
    Components,
    /// A chroma layout the engines do not decode (4:1:1, odd factors).
    Subsampling,
    /// No end-of-image marker at the end: the file may be cut short.
    Truncated,
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
            Decline::Truncated => "no end-of-image marker",
            Decline::Malformed => "malformed markers",
        }
    }
}

/// How far from the end the end-of-image marker may lie (some writers pad after it).
const EOI_WINDOW: usize = 64;

/// `Ok(())` when the hardware lane may take `bytes`, else why not.
pub fn hardware_candidate(bytes: &[u8]) -> Result<(), Decline> {
    if bytes.len() < 4 || bytes[0] != 0xFF || bytes[1] != 0xD8 {
        return Err(Decline::NotJpeg);
    }
    let tail = &bytes[bytes.len().saturating_sub(EOI_WINDOW)..];
    if !tail.windows(2).any(|w| w == [0xFF, 0xD9]) {
        return Err(Decline::Truncated);
    }
    let mut at = 2;
    loop {
        // Markers may be preceded by any number of 0xFF fill bytes.
        while bytes.get(at) == Some(&0xFF) && bytes.get(at + 1) == Some(&0xFF) {
            at += 1;
        }
        if bytes.get(at) != Some(&0xFF) {
            return Err(Decline::Malformed);
        }
        let marker = *bytes.get(at + 1).ok_or(Decline::Malformed)?;
        at += 2;
        // Markers without a length.
        if marker == 0x01 || (0xD0..=0xD7).contains(&marker) {
            continue;
        }
        if marker == 0xD9 || marker == 0xDA {
            // End of image or start of scan before any frame header.
            return Err(Decline::Malformed);
        }
        let length = bytes
            .get(at..at + 2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
            .ok_or(Decline::Malformed)?;
        if length < 2 {
            return Err(Decline::Malformed);
        }
        let segment = bytes.get(at + 2..at + length).ok_or(Decline::Malformed)?;
        match marker {
            0xC0 | 0xC1 => return frame(segment),
            0xC2 => return Err(Decline::Progressive),
            0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF => return Err(Decline::OtherCoding),
            _ => at += length,
        }
    }
}

/// Checks a baseline frame header: precision, components, sampling factors.
fn frame(segment: &[u8]) -> Result<(), Decline> {
    let (&precision, rest) = segment.split_first().ok_or(Decline::Malformed)?;
    if precision != 8 {
        return Err(Decline::Precision);
    }
    let count = usize::from(*rest.get(4).ok_or(Decline::Malformed)?);
    let components = rest.get(5..5 + 3 * count).ok_or(Decline::Malformed)?;
    match count {
        1 => Ok(()),
        3 => {
            let factors: Vec<(u8, u8)> = components
                .chunks_exact(3)
                .map(|c| (c[1] >> 4, c[1] & 0x0F))
                .collect();
            if factors[1] != (1, 1) || factors[2] != (1, 1) {
                return Err(Decline::Subsampling);
            }
            match factors[0] {
                (1, 1) | (2, 1) | (2, 2) | (1, 2) => Ok(()),
                _ => Err(Decline::Subsampling),
            }
        }
        _ => Err(Decline::Components),
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
        out.extend([0xFF, 0xDA, 0x00, 0x02, 0x00, 0xFF, 0xD9]);
        out
    }

    #[test]
    fn baseline_grey_and_ycbcr_layouts_are_taken() {
        for sampling in [
            &[0x11][..],
            &[0x11, 0x11, 0x11],
            &[0x21, 0x11, 0x11],
            &[0x22, 0x11, 0x11],
            &[0x12, 0x11, 0x11],
        ] {
            assert_eq!(
                hardware_candidate(&jpeg(0xC0, 8, sampling)),
                Ok(()),
                "{sampling:?}"
            );
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
        let scan_first = vec![0xFF, 0xD8, 0xFF, 0xDA, 0x00, 0x02, 0xFF, 0xD9];
        assert_eq!(hardware_candidate(&scan_first), Err(Decline::Malformed));
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
        }
    }
}
