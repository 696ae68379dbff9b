//! A JPEG's markers walked as libjpeg reads them, for what the decoder needs before and
//! around TurboJPEG: the frame's size ([`jpeg_size`]), and three things libjpeg warns of though
//! the pixels are whole, which Pillow reads through (the Python suite's
//! `test_image_formats.py` compares the pixels):
//! - a JFIF header of a major version other than 1;
//! - a sequential scan whose header holds other values than 0, 63 and 0 in its
//!   spectral-selection and approximation fields (Samsung phones write zeros there; libjpeg
//!   ignores the fields in a sequential scan);
//! - bytes between two segments of the header that are neither fill nor a marker (libjpeg
//!   discards them: "extraneous bytes before marker"), where they cannot be the sign of damage
//!   ([`may_be_left_out`]): after a segment of metadata, bytes that do not start as a segment
//!   does; after one that tells libjpeg how to decode (tables, frame, restart interval, Adobe
//!   colour transform), padding alone (zeros). Other runs stay, and the file is a bad sample.
//!
//! Their warnings would make such files bad samples. Nor can a warning be passed: TurboJPEG
//! keeps the text of a decode's first warning only, and these come before the scan data they
//! precede is read, so a warning of damage after them (a scan cut short) would go unseen. A
//! file whose header shows one ([`quirk_in_header`]) is decoded from a copy read as libjpeg
//! reads the original: the fields set to what libjpeg takes them for, the discarded bytes
//! left out ([`mended`]); one whose decode warns of one past its header is decoded again from
//! such a copy; either way the copy's own warnings count. Bytes after a scan's data are no
//! segment's: the walk takes them for scan data, and they stay (the decoder passes libjpeg's
//! warning of those before the end-of-image marker, `mod.rs`).

use std::ops::Range;

use crate::error::SampleError;

/// The text of libjpeg's warnings of what [`mended`] mends (`JWRN_JFIF_MAJOR`,
/// `JWRN_NOT_SEQUENTIAL`, `JWRN_EXTRANEOUS_DATA`).
const QUIRK_WARNINGS: [&str; 3] = [
    "unknown JFIF revision number",
    "Invalid SOS parameters for sequential JPEG",
    "extraneous bytes before marker",
];

/// Whether a decode's (first) warning is of a quirk [`mended`] mends (or would, had the walk
/// found it: bytes left over from a scan's data are no segment's, and stay).
pub(super) fn is_quirk(warning: &str) -> bool {
    QUIRK_WARNINGS.iter().any(|quirk| warning.contains(quirk))
}

/// One marker as libjpeg's reader meets it.
struct Segment<'a> {
    marker: u8,
    /// Bytes before the marker that libjpeg discards: neither fill nor part of a marker
    /// (empty in a well-formed file).
    junk: Range<usize>,
    /// Where the segment's data starts, past its length field (past the marker for one
    /// without a length).
    data_at: usize,
    /// The data, without the length field (empty for a marker without one).
    data: &'a [u8],
}

/// Why a walk of the markers ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// At the end-of-image marker.
    End,
    /// The bytes ended before a marker or inside a segment.
    Cut,
    /// A length field under 2 (it counts itself): damage libjpeg refuses.
    ShortLength,
}

/// The markers of a JPEG from its start-of-image on, read as libjpeg's `next_marker` reads
/// them: bytes other than 0xFF before a marker discarded (as is a stuffed pair, 0xFF 0x00),
/// 0xFF fill skipped, and after a scan's header its entropy-coded data (stuffed bytes, restart
/// markers, fill) skipped to the next marker.
struct Markers<'a> {
    bytes: &'a [u8],
    at: usize,
    in_scan: bool,
    stop: Option<Stop>,
}

impl<'a> Markers<'a> {
    /// The markers of `bytes`, which start with a start-of-image marker (none when not).
    fn new(bytes: &'a [u8]) -> Self {
        let jpeg = bytes.starts_with(&[0xFF, 0xD8]);
        Markers {
            bytes,
            at: 2,
            in_scan: false,
            stop: (!jpeg).then_some(Stop::Cut),
        }
    }

    /// Past a scan's entropy-coded data: to the 0xFF of the next marker but a restart marker.
    fn skip_scan_data(&mut self) -> Option<()> {
        let bytes = self.bytes;
        loop {
            self.at += bytes.get(self.at..)?.iter().position(|&b| b == 0xFF)?;
            match bytes.get(self.at + 1)? {
                0x00 | 0xD0..=0xD7 => self.at += 2,
                0xFF => self.at += 1,
                _ => return Some(()),
            }
        }
    }

    /// The next marker and where the bytes libjpeg discards before it end.
    fn next_marker(&mut self) -> Option<(u8, usize)> {
        let bytes = self.bytes;
        loop {
            self.at += bytes.get(self.at..)?.iter().position(|&b| b == 0xFF)?;
            let fill = self.at;
            self.at += bytes[fill..].iter().take_while(|&&b| b == 0xFF).count();
            let marker = *bytes.get(self.at)?;
            self.at += 1;
            if marker != 0x00 {
                return Some((marker, fill));
            }
        }
    }

    fn read(&mut self) -> Result<Segment<'a>, Stop> {
        if self.in_scan {
            self.in_scan = false;
            self.skip_scan_data().ok_or(Stop::Cut)?;
        }
        let junk_from = self.at;
        let (marker, fill) = self.next_marker().ok_or(Stop::Cut)?;
        let segment = |data_at, data| Segment {
            marker,
            junk: junk_from..fill,
            data_at,
            data,
        };
        match marker {
            0xD9 => {
                self.stop = Some(Stop::End);
                return Ok(segment(self.at, &[]));
            }
            // Markers without a length: restart markers outside a scan, TEM.
            0xD0..=0xD7 | 0x01 => return Ok(segment(self.at, &[])),
            _ => {}
        }
        let bytes = self.bytes;
        let &[high, low] = bytes.get(self.at..self.at + 2).ok_or(Stop::Cut)? else {
            return Err(Stop::Cut);
        };
        let length = usize::from(u16::from_be_bytes([high, low]));
        if length < 2 {
            return Err(Stop::ShortLength);
        }
        let data_at = self.at + 2;
        let data = bytes.get(data_at..self.at + length).ok_or(Stop::Cut)?;
        self.at += length;
        self.in_scan = marker == 0xDA;
        Ok(segment(data_at, data))
    }
}

impl<'a> Iterator for Markers<'a> {
    type Item = Segment<'a>;

    fn next(&mut self) -> Option<Segment<'a>> {
        if self.stop.is_some() {
            return None;
        }
        match self.read() {
            Ok(segment) => Some(segment),
            Err(stop) => {
                self.stop = Some(stop);
                None
            }
        }
    }
}

/// A JPEG's frame size from a walk of its markers ([`Markers`]): the first frame header's.
/// TurboJPEG's own header call is not used for it: it reports success without touching its
/// stored size when the data ends before the frame header (it takes that for a tables-only
/// stream).
pub(super) fn jpeg_size(bytes: &[u8]) -> Result<(u32, u32), SampleError> {
    let corrupt = |what: &str| SampleError::Corrupt(format!("jpeg header: {what}"));
    let mut markers = Markers::new(bytes);
    for segment in markers.by_ref() {
        match segment.marker {
            0xD9 | 0xDA => return Err(corrupt("no frame before the scan")),
            // SOF0-SOF15 but DHT (C4), JPG (C8) and DAC (CC): precision, height, width.
            0xC0..=0xCF if !matches!(segment.marker, 0xC4 | 0xC8 | 0xCC) => {
                let &[_, h1, h0, w1, w0, ..] = segment.data else {
                    return Err(corrupt("a frame header shorter than its fields"));
                };
                let (width, height) = (u16::from_be_bytes([w1, w0]), u16::from_be_bytes([h1, h0]));
                return Ok((u32::from(width), u32::from(height)));
            }
            _ => {}
        }
    }
    Err(match markers.stop {
        Some(Stop::ShortLength) => corrupt("a segment shorter than its length field"),
        _ => corrupt("ends before a frame"),
    })
}

/// What the mending changes in a copy.
enum Change {
    /// The byte at this offset set to this value.
    Set(usize, u8),
    /// These bytes left out.
    Drop(Range<usize>),
}

/// A copy of the JPEG `bytes` as libjpeg reads it: each JFIF header's major version set to 1;
/// the spectral selection and successive approximation of each scan of a sequential frame set
/// to 0, 63 and 0 (what a sequential decode reads regardless); the bytes libjpeg discards
/// between segments left out. `None` when nothing differs.
pub(super) fn mended(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut sets = Vec::new();
    let mut drops = Vec::new();
    walk(bytes, false, |change| match change {
        Change::Set(at, value) if bytes[at] != value => sets.push((at, value)),
        Change::Set(..) => {}
        Change::Drop(junk) => drops.push(junk),
    });
    if sets.is_empty() && drops.is_empty() {
        return None;
    }
    let mut copy = bytes.to_vec();
    for (at, value) in sets {
        copy[at] = value;
    }
    if !drops.is_empty() {
        // The discarded bytes lie between segments, where nothing was set; in order.
        let mut kept = Vec::with_capacity(copy.len());
        let mut from = 0;
        for junk in drops {
            kept.extend_from_slice(&copy[from..junk.start]);
            from = junk.end;
        }
        kept.extend_from_slice(&copy[from..]);
        copy = kept;
    }
    Some(copy)
}

/// Whether [`mended`] would change `bytes` before its first scan's data (a JFIF header, the
/// first scan's header, bytes discarded before either): a walk of the header alone, so that
/// such a file is mended before its first decode, not decoded twice. A quirk past that (a
/// later scan's header, a JFIF header after the scan) is found by the decode's warning.
pub(super) fn quirk_in_header(bytes: &[u8]) -> bool {
    let mut found = false;
    walk(bytes, true, |change| {
        found |= match change {
            Change::Set(at, value) => bytes[at] != value,
            Change::Drop(_) => true,
        }
    });
    found
}

/// Walks the markers of `bytes` ([`Markers`]) to their end (to the first scan's header alone
/// when `header_only`), calling `change` for each field the mending sets and each run of bytes
/// it leaves out, in the order of the file. A walk that meets damage stops there, with what it
/// found before (a decode of the copy then refuses the damage).
fn walk(bytes: &[u8], header_only: bool, mut change: impl FnMut(Change)) {
    let mut sequential = false;
    // The marker of the segment before each run of discarded bytes (the start of image first).
    let mut before = 0xD8;
    for segment in Markers::new(bytes) {
        if may_be_left_out(before, &bytes[segment.junk.clone()]) {
            change(Change::Drop(segment.junk.clone()));
        }
        before = segment.marker;
        let data = segment.data;
        match segment.marker {
            // libjpeg reads an APP0 as JFIF from 14 bytes on.
            0xE0 if data.len() >= 14 && data.starts_with(b"JFIF\0") => {
                change(Change::Set(segment.data_at + 5, 1));
            }
            // Baseline, extended and arithmetic-coded sequential frames.
            0xC0 | 0xC1 | 0xC9 => sequential = true,
            // Progressive, lossless and hierarchical frames keep their scans' fields.
            0xC2 | 0xC3 | 0xC5..=0xC7 | 0xCA | 0xCB | 0xCD..=0xCF => sequential = false,
            0xDA => {
                let Some(&components) = data.first() else {
                    return;
                };
                let fields = 1 + 2 * usize::from(components);
                if sequential && data.len() >= fields + 3 {
                    let at = segment.data_at + fields;
                    change(Change::Set(at, 0));
                    change(Change::Set(at + 1, 63));
                    change(Change::Set(at + 2, 0));
                }
                if header_only {
                    return;
                }
            }
            _ => {}
        }
    }
}

/// Whether a run of bytes libjpeg discards, after a segment of marker `before`, may be left
/// out of the copy: only where it cannot be the one sign of damage that changes the pixels.
///
/// A run that starts as a segment does (a marker code at its first or second byte, or a
/// stuffed pair, then a length field) may be segments whose marker was damaged: a table the
/// image needs (missing Huffman tables, libjpeg-turbo decodes with its default ones), or a
/// later scan of a progressive file. It stays. So does a run other than zeros after a segment
/// libjpeg decodes by (tables, frame, restart interval, Adobe's colour transform): a byte
/// inserted into or lost from such a segment leaves one behind, the table read shifted. After
/// metadata (APPn but Adobe's, comments) a run is that segment's tail, or bytes put between
/// segments: the pixels are libjpeg's either way.
fn may_be_left_out(before: u8, run: &[u8]) -> bool {
    let code = |byte: &u8| (0xC0..=0xFE).contains(byte);
    let length = |at: usize| {
        run.get(at..at + 2)
            .is_some_and(|field| u16::from_be_bytes([field[0], field[1]]) >= 2)
    };
    let starts_as_a_segment = (run.first().is_some_and(code) && length(1))
        || ((run.get(1).is_some_and(code) || run.starts_with(&[0xFF, 0x00])) && length(2));
    let decoded_by = matches!(before, 0xC0..=0xCF | 0xDB | 0xDD | 0xDE | 0xDF | 0xEE);
    !run.is_empty() && !starts_as_a_segment && (!decoded_by || run.iter().all(|&b| b == 0))
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
        // A marker byte damaged: the segment is discarded bytes to libjpeg, shaped as a
        // segment, so it stays (the decode refuses the file); what was before it is mended.
        let mut broken = quirky.clone();
        let frame = broken.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
        for damage in [[0x00, 0xC0], [0xFF, 0x00]] {
            broken[frame..frame + 2].copy_from_slice(&damage);
            let fixed = mended(&broken).expect("the JFIF header before it");
            assert_eq!(fixed.len(), broken.len(), "nothing left out");
            assert_eq!(fixed[..frame], whole[..frame]);
            assert_eq!(
                fixed[frame..frame + 19],
                broken[frame..frame + 19],
                "the frame as it was"
            );
            // The first scan's fields are a frameless scan's: not mended.
            let first = field_offsets(&fixed)[0];
            assert_eq!(fixed[first..first + 3], [0, 0, 0]);
        }
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

    /// `bytes` with `junk` put before the marker at `at`.
    fn with_junk(bytes: &[u8], at: usize, junk: &[u8]) -> Vec<u8> {
        let mut out = bytes.to_vec();
        out.splice(at..at, junk.iter().copied());
        out
    }

    #[test]
    fn bytes_libjpeg_discards_between_segments_are_left_out_and_nothing_else() {
        let good = skeleton(1, 0xC0, [0, 63, 0]);
        let frame = good.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
        let scan = good.windows(2).position(|w| w == [0xFF, 0xDA]).unwrap();
        // Bytes other than 0xFF, and stuffed pairs (0xFF 0x00), after the JFIF header (before
        // the frame); zeros after the frame (before the scan).
        for (at, junk) in [
            (frame, &[0x00][..]),
            (frame, &[0x12, 0x34, 0x56]),
            (frame, &[0x12, 0xFF, 0x00, 0x56, 0xFF, 0x00]),
            (scan, &[0x00]),
            (scan, &[0x00, 0x00, 0x00]),
        ] {
            let quirky = with_junk(&good, at, junk);
            assert!(quirk_in_header(&quirky), "{junk:?} at {at}");
            assert_eq!(mended(&quirky), Some(good.clone()), "{junk:?} at {at}");
            assert_eq!(jpeg_size(&quirky).ok(), Some((16, 16)), "{junk:?} at {at}");
        }
        // With a quirk beside it, both mended.
        let both = with_junk(&skeleton(2, 0xC0, [0, 0, 0]), scan, &[0x00, 0x00]);
        assert_eq!(mended(&both), Some(good.clone()));
        // Fill before a marker is no junk; bytes after a scan's data are the scan's.
        assert_eq!(mended(&with_junk(&good, frame, &[0xFF, 0xFF])), None);
        let end = good.len() - 2;
        assert_eq!(mended(&with_junk(&good, end, &[0x00, 0x12])), None);
        // Past the header (before a table segment after the first scan): mended, but left to
        // the decode's warning to find.
        let second = scan
            + 1
            + good[scan + 1..]
                .windows(2)
                .position(|w| w == [0xFF, 0xDA])
                .unwrap();
        let table = with_junk(&good, second, &[0xFF, 0xFE, 0, 4, b'h', b'i']);
        let later = with_junk(&table, second + 6, &[0x00, 0x12]);
        assert!(!quirk_in_header(&later));
        assert_eq!(mended(&later), Some(table));
    }

    #[test]
    fn a_discarded_run_that_may_be_the_sign_of_damage_stays() {
        const APP1: u8 = 0xE1;
        // After metadata: a run that starts as a segment does, whose 0xFF, code, or both were
        // damaged, or a segment's code left behind by a segment that read a byte too many.
        for run in [
            &[0x00, 0xC4, 0, 5, 1, 2, 3][..],
            &[0xFF, 0x00, 0, 2],
            &[0x00, 0xDA, 0, 12, 1, 2],
            &[0xC4, 0, 0x1F, 0, 1],
        ] {
            assert!(!may_be_left_out(APP1, run), "{run:x?}");
        }
        for run in [
            &[0x00][..],
            &[0x00, 0x12, 0x34],
            &[0x00, 0xC4, 0, 1],
            &[0x12, 0xFF, 0x00, 0x56],
        ] {
            assert!(may_be_left_out(APP1, run), "{run:x?}");
        }
        // After a table, the frame, a restart interval or Adobe's marker: zeros alone.
        for before in [0xDB, 0xC4, 0xC0, 0xC2, 0xCC, 0xDD, 0xEE] {
            assert!(may_be_left_out(before, &[0, 0, 0]), "{before:x}");
            assert!(!may_be_left_out(before, &[0x12]), "{before:x}");
            assert!(!may_be_left_out(before, &[0, 0xFF, 0]), "{before:x}");
        }
        assert!(!may_be_left_out(APP1, &[]));
        // A table segment whose 0xFF was damaged, before the frame, stays in the copy.
        let good = skeleton(1, 0xC0, [0, 63, 0]);
        let frame = good.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
        let damaged = with_junk(&good, frame, &[0x00, 0xC4, 0, 4, 0x10, 0x20]);
        assert!(!quirk_in_header(&damaged));
        assert_eq!(mended(&damaged), None);
        // Bytes after the frame that are not zeros stay; zeros go.
        let scan = good.windows(2).position(|w| w == [0xFF, 0xDA]).unwrap();
        assert_eq!(mended(&with_junk(&good, scan, &[0x00, 0x01])), None);
        assert_eq!(
            mended(&with_junk(&good, scan, &[0x00, 0x00])),
            Some(good.clone())
        );
    }

    #[test]
    fn the_frame_size_is_the_first_frame_headers_or_the_reason_there_is_none() {
        let good = skeleton(1, 0xC0, [0, 63, 0]);
        assert_eq!(jpeg_size(&good).ok(), Some((16, 16)));
        let frame = good.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
        let message = |bytes: &[u8]| match jpeg_size(bytes) {
            Err(SampleError::Corrupt(message)) => message,
            other => panic!("{other:?}"),
        };
        for end in 0..frame + 19 {
            assert_eq!(
                message(&good[..end]),
                "jpeg header: ends before a frame",
                "cut at {end}"
            );
        }
        // The APP0's length field made 1.
        let mut short = good.clone();
        short[4..6].copy_from_slice(&[0, 1]);
        assert_eq!(
            message(&short),
            "jpeg header: a segment shorter than its length field"
        );
        let mut frameless = good[..frame].to_vec();
        frameless.extend_from_slice(&good[frame + 19..]);
        assert_eq!(message(&frameless), "jpeg header: no frame before the scan");
        let mut tiny = good[..frame].to_vec();
        tiny.extend([0xFF, 0xC0, 0, 5, 8, 0, 16]);
        assert_eq!(
            message(&tiny),
            "jpeg header: a frame header shorter than its fields"
        );
    }

    #[test]
    fn only_the_quirks_warnings_are_named() {
        assert!(is_quirk("Warning: unknown JFIF revision number 2.01"));
        assert!(is_quirk("Invalid SOS parameters for sequential JPEG"));
        assert!(is_quirk(
            "Corrupt JPEG data: 3 extraneous bytes before marker 0xc4"
        ));
        assert!(!is_quirk("Premature end of JPEG file"));
        assert!(!is_quirk("Corrupt JPEG data: bad Huffman code"));
    }
}
