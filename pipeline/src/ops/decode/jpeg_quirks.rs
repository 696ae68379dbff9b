//! Two quirks of JPEG files that libjpeg warns of though their pixels are whole: a JFIF header
//! of a major version other than 1, and a sequential scan whose header holds other values than
//! 0, 63 and 0 in its spectral-selection and approximation fields (Samsung phones write zeros
//! there; libjpeg ignores the fields in a sequential scan). Pillow decodes such files (the
//! Python suite's `test_image_formats.py` compares the pixels); libjpeg's warning would make
//! them bad samples. Nor can the warning be passed: TurboJPEG keeps the text of a decode's
//! first warning only, and these come before any scan data is read, so a warning of damage
//! after them (a scan cut short) would go unseen. A file whose header
//! shows one ([`quirk_in_header`]) is decoded from a copy with the fields set to what libjpeg
//! reads them as ([`mended`]); one whose decode warns of one past its header is decoded again
//! from such a copy; either way the copy's own warnings count.

/// The text of libjpeg's warnings of the quirks (`JWRN_JFIF_MAJOR`, `JWRN_NOT_SEQUENTIAL`).
const QUIRK_WARNINGS: [&str; 2] = [
    "unknown JFIF revision number",
    "Invalid SOS parameters for sequential JPEG",
];

/// Whether a decode's (first) warning is of a quirk [`mended`] mends.
pub(super) fn is_quirk(warning: &str) -> bool {
    QUIRK_WARNINGS.iter().any(|quirk| warning.contains(quirk))
}

/// A copy of the JPEG `bytes` with each JFIF header's major version set to 1, and the
/// spectral selection and successive approximation of each scan of a sequential frame set to
/// 0, 63 and 0 (what a sequential decode reads regardless); `None` when no field differs.
pub(super) fn mended(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut copy: Option<Vec<u8>> = None;
    walk(bytes, false, |at, value| {
        if bytes[at] != value {
            copy.get_or_insert_with(|| bytes.to_vec())[at] = value;
        }
    });
    copy
}

/// Whether [`mended`] would change a field of `bytes` before its first scan's data (a JFIF
/// header, the first scan's header): a walk of the header alone, so that such a file is
/// mended before its first decode, not decoded twice. A quirk past that (a later scan's
/// header, a JFIF header after the scan) is found by the decode's warning.
pub(super) fn quirk_in_header(bytes: &[u8]) -> bool {
    let mut found = false;
    walk(bytes, true, |at, value| found |= bytes[at] != value);
    found
}

/// Walks the markers of `bytes` as libjpeg reads them, past each scan's entropy-coded data
/// (to the first scan's data alone when `header_only`), calling `set(at, value)` for each
/// field the quirks' mending sets. A walk that meets what is no marker stops there, with
/// what it found before (a decode of the copy then refuses the damage).
fn walk(bytes: &[u8], header_only: bool, mut set: impl FnMut(usize, u8)) {
    if bytes.get(..2) != Some(&[0xFF, 0xD8][..]) {
        return;
    }
    let mut sequential = false;
    let mut at = 2;
    while bytes.get(at) == Some(&0xFF) {
        // Fill bytes before a marker.
        while bytes.get(at) == Some(&0xFF) {
            at += 1;
        }
        let Some(&marker) = bytes.get(at) else { break };
        at += 1;
        match marker {
            // End of image.
            0xD9 => break,
            // Markers without a length: restart markers outside a scan, TEM.
            0xD0..=0xD7 | 0x01 => continue,
            _ => {}
        }
        let Some(&[high, low]) = bytes.get(at..at + 2) else {
            break;
        };
        let length = usize::from(u16::from_be_bytes([high, low]));
        // A length under 2 (the field counts itself) is damage libjpeg refuses.
        let Some(data) = bytes.get(at + 2..at + length).filter(|_| length >= 2) else {
            break;
        };
        let data_at = at + 2;
        match marker {
            // libjpeg reads an APP0 as JFIF from 14 bytes on.
            0xE0 if data.len() >= 14 && data.starts_with(b"JFIF\0") => set(data_at + 5, 1),
            // Baseline, extended and arithmetic-coded sequential frames.
            0xC0 | 0xC1 | 0xC9 => sequential = true,
            // Progressive, lossless and hierarchical frames keep their scans' fields.
            0xC2 | 0xC3 | 0xC5..=0xC7 | 0xCA | 0xCB | 0xCD..=0xCF => sequential = false,
            0xDA => {
                let Some(&components) = data.first() else {
                    break;
                };
                let fields = data_at + 1 + 2 * usize::from(components);
                if sequential && data_at + data.len() >= fields + 3 {
                    set(fields, 0);
                    set(fields + 1, 63);
                    set(fields + 2, 0);
                }
                if header_only {
                    return;
                }
                at = data_at + data.len();
                // The entropy-coded data: a 0xFF in it is followed by 0x00 (a stuffed byte),
                // a restart marker, or more fill; anything else is the next marker.
                loop {
                    let Some(next) = bytes[at..].iter().position(|&b| b == 0xFF) else {
                        return;
                    };
                    at += next;
                    match bytes.get(at + 1) {
                        Some(0x00 | 0xD0..=0xD7) => at += 2,
                        Some(0xFF) => at += 1,
                        Some(_) => break,
                        None => return,
                    }
                }
                continue;
            }
            _ => {}
        }
        at = data_at + data.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A JPEG's skeleton: SOI, a JFIF header of `major`, a frame of `frame` marker, one scan
    /// of three components with `fields`, scan data holding a stuffed byte, a restart marker
    /// and fill, a second scan, EOI.
    fn skeleton(major: u8, frame: u8, fields: [u8; 3]) -> Vec<u8> {
        let mut out = vec![0xFF, 0xD8];
        out.extend([0xFF, 0xE0, 0, 16]);
        out.extend(b"JFIF\0");
        out.extend([major, 2, 0, 0, 1, 0, 1, 0, 0]);
        out.extend([0xFF, frame, 0, 17, 8, 0, 16, 0, 16, 3]);
        out.extend([1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1]);
        for _ in 0..2 {
            out.extend([0xFF, 0xDA, 0, 12, 3, 1, 0, 2, 0x11, 3, 0x11]);
            out.extend(fields);
            out.extend([0x12, 0xFF, 0x00, 0x34, 0xFF, 0xD3, 0x56, 0xFF, 0xFF]);
        }
        out.extend([0xFF, 0xD9]);
        out
    }

    /// The offsets of each scan header's three fields in a [`skeleton`].
    fn field_offsets(bytes: &[u8]) -> Vec<usize> {
        (0..bytes.len() - 1)
            .filter(|&i| bytes[i] == 0xFF && bytes[i + 1] == 0xDA)
            .map(|i| i + 2 + 2 + 1 + 6)
            .collect()
    }

    #[test]
    fn the_jfif_version_and_a_sequential_scans_fields_are_mended_and_nothing_else() {
        let good = skeleton(1, 0xC0, [0, 63, 0]);
        assert_eq!(mended(&good), None, "nothing to mend");
        let quirky = skeleton(2, 0xC0, [0, 0, 0]);
        let fixed = mended(&quirky).expect("mended");
        assert_eq!(
            fixed, good,
            "each scan's fields and the version, nothing else"
        );
        assert_eq!(field_offsets(&fixed).len(), 2);
        // Arithmetic-coded sequential frames alike.
        let arithmetic = skeleton(1, 0xC9, [1, 5, 0x10]);
        let fixed = mended(&arithmetic).expect("mended");
        for at in field_offsets(&fixed) {
            assert_eq!(fixed[at..at + 3], [0, 63, 0]);
        }
        // A progressive or lossless frame's scan fields are its own.
        for frame in [0xC2, 0xC3, 0xCA] {
            let scans = skeleton(1, frame, [1, 5, 0x10]);
            assert_eq!(mended(&scans), None, "frame {frame:#x}");
            let revised = skeleton(2, frame, [1, 5, 0x10]);
            assert_eq!(mended(&revised), Some(scans), "frame {frame:#x}");
        }
    }

    #[test]
    fn a_walk_that_meets_no_marker_keeps_what_it_mended_and_never_panics() {
        let quirky = skeleton(2, 0xC0, [0, 0, 0]);
        let whole = mended(&quirky).expect("mended");
        // Cut anywhere: no panic, each byte as it was or as mended whole, and the JFIF
        // header mended once it is whole.
        for end in 0..quirky.len() {
            let cut = &quirky[..end];
            let fixed = mended(cut);
            if let Some(fixed) = &fixed {
                assert_eq!(fixed.len(), end);
                for (at, byte) in fixed.iter().enumerate() {
                    assert!(*byte == quirky[at] || *byte == whole[at], "cut at {end}");
                }
            }
            assert_eq!(fixed.is_some(), end >= 20, "cut at {end}");
        }
        // A byte where a marker should be ends the walk.
        let mut broken = quirky.clone();
        let frame = broken.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
        broken[frame] = 0x00;
        let fixed = mended(&broken).expect("the JFIF header before it");
        assert_eq!(fixed[..frame], whole[..frame]);
        assert_eq!(fixed[frame..], broken[frame..], "nothing after it changed");
        assert!(mended(b"not a jpeg").is_none());
        // A length field under 2 ends the walk too.
        let mut short = vec![0xFF, 0xD8, 0xFF, 0xE1, 0, 1];
        short.extend_from_slice(&quirky[2..]);
        assert_eq!(mended(&short), None);
    }

    #[test]
    fn the_header_walk_sees_the_quirks_before_the_first_scans_data_alone() {
        assert!(!quirk_in_header(&skeleton(1, 0xC0, [0, 63, 0])));
        assert!(quirk_in_header(&skeleton(2, 0xC0, [0, 63, 0])));
        assert!(quirk_in_header(&skeleton(1, 0xC0, [0, 0, 0])));
        assert!(!quirk_in_header(&skeleton(1, 0xC2, [1, 5, 0x10])));
        // The second scan's fields alone: past the header, for the decode to find.
        let mut later = skeleton(1, 0xC0, [0, 63, 0]);
        let second = field_offsets(&later)[1];
        later[second + 1] = 0;
        assert!(!quirk_in_header(&later));
        assert!(mended(&later).is_some());
        // An APP0 under libjpeg's 14 bytes is no JFIF header to it, nor here.
        let mut short = vec![0xFF, 0xD8, 0xFF, 0xE0, 0, 9];
        short.extend(b"JFIF\0");
        short.extend([2, 1]);
        short.extend_from_slice(&skeleton(1, 0xC0, [0, 63, 0])[2..]);
        assert_eq!(mended(&short), None);
    }

    #[test]
    fn only_the_quirks_warnings_are_named() {
        assert!(is_quirk("Warning: unknown JFIF revision number 2.01"));
        assert!(is_quirk("Invalid SOS parameters for sequential JPEG"));
        assert!(!is_quirk("Premature end of JPEG file"));
        assert!(!is_quirk("Corrupt JPEG data: bad Huffman code"));
    }
}
