//! Hostile JPEGs for the lane's acceptance decision, made from valid ones that libjpeg-turbo
//! encodes here (TurboJPEG's raw API: restart markers, CMYK, arithmetic coding and 12-bit
//! samples are settings of the encoder, so those files are real ones, not patched headers), then
//! edited at the marker level: two frame headers of different sizes, a stray start-of-image
//! marker, a frame header after the scan, restart markers out of order, a scan cut short with an
//! end marker appended, bits flipped to ones in the scan data, another image after the end.
//!
//! Each comes with what the lane must do with it ([`Expect`]): decline it to the CPU threads
//! for a reason its markers show, take it (valid files), or take it with headers that cannot
//! show the damage, leaving it to the decode's own checks (nvJPEG's strict bitstream check and
//! status, the lane's written-place check). The same set, written by Python, goes through
//! `decode="gpu"` in `python-client/tests/test_gpu_decode.py`; its seeds are the acceptance
//! fuzz target's corpus.

use std::os::raw::c_int;

use turbojpeg::raw;

use super::jpeg_scan::Decline;

/// What the lane must do with a hostile file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Declined by the marker scan, for this reason.
    Declined(Decline),
    /// Taken: a valid file.
    Taken,
    /// Taken by the headers, which cannot show the damage: left to the decode's checks.
    LeftToDecode,
}

/// One hostile file.
#[derive(Debug, Clone)]
pub struct Hostile {
    /// A name, also the seed's file name.
    pub name: &'static str,
    /// The file.
    pub bytes: Vec<u8>,
    /// What the lane must do with it.
    pub expect: Expect,
}

/// Encoder settings for [`encode`].
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Size.
    pub width: usize,
    /// See `width`.
    pub height: usize,
    /// A TurboJPEG `TJSAMP` value.
    pub subsampling: c_int,
    /// Restart markers every this many MCU rows (0: none).
    pub restart_rows: c_int,
    /// Arithmetic coding instead of Huffman.
    pub arithmetic: bool,
    /// Progressive coding.
    pub progressive: bool,
    /// CMYK (four components) instead of YCbCr.
    pub cmyk: bool,
    /// 12-bit samples.
    pub twelve_bit: bool,
}

impl Settings {
    /// A baseline 4:2:0 YCbCr image of this size.
    pub fn baseline(width: usize, height: usize) -> Settings {
        Settings {
            width,
            height,
            subsampling: raw::TJSAMP_TJSAMP_420 as c_int,
            restart_rows: 0,
            arithmetic: false,
            progressive: false,
            cmyk: false,
            twelve_bit: false,
        }
    }
}

/// A smooth, varied test pattern (gradients and a ring), `channels` samples a pixel.
fn pattern(width: usize, height: usize, channels: usize) -> Vec<u8> {
    let mut pixels = Vec::with_capacity(width * height * channels);
    for y in 0..height {
        for x in 0..width {
            let ring =
                ((x as f64 - width as f64 / 2.0).hypot(y as f64 - height as f64 / 2.0) / 3.0).sin();
            for c in 0..channels {
                let value = (x * 255 / width.max(1)) as f64 * [0.7, 0.2, 0.5, 0.3][c]
                    + (y * 255 / height.max(1)) as f64 * [0.2, 0.7, 0.4, 0.1][c]
                    + 40.0 * ring;
                pixels.push(value.clamp(0.0, 255.0) as u8);
            }
        }
    }
    pixels
}

/// Encodes the test pattern with libjpeg-turbo.
pub fn encode(settings: Settings) -> Vec<u8> {
    let channels = if settings.cmyk { 4 } else { 3 };
    let pixels = pattern(settings.width, settings.height, channels);
    // SAFETY: a TurboJPEG handle used by this thread only and destroyed below; the source
    // buffers hold `width * height * channels` samples; the output is TurboJPEG's allocation,
    // copied out and freed with tj3Free.
    unsafe {
        let handle = raw::tj3Init(raw::TJINIT_TJINIT_COMPRESS as c_int);
        assert!(!handle.is_null(), "tj3Init");
        let set = |param: raw::TJPARAM, value: c_int| {
            assert_eq!(
                raw::tj3Set(handle, param as c_int, value),
                0,
                "tj3Set {param}"
            );
        };
        set(raw::TJPARAM_TJPARAM_QUALITY, 90);
        if settings.cmyk {
            set(
                raw::TJPARAM_TJPARAM_COLORSPACE,
                raw::TJCS_TJCS_CMYK as c_int,
            );
            set(
                raw::TJPARAM_TJPARAM_SUBSAMP,
                raw::TJSAMP_TJSAMP_444 as c_int,
            );
        } else {
            set(raw::TJPARAM_TJPARAM_SUBSAMP, settings.subsampling);
        }
        set(raw::TJPARAM_TJPARAM_RESTARTROWS, settings.restart_rows);
        set(
            raw::TJPARAM_TJPARAM_ARITHMETIC,
            c_int::from(settings.arithmetic),
        );
        set(
            raw::TJPARAM_TJPARAM_PROGRESSIVE,
            c_int::from(settings.progressive),
        );
        let format = if settings.cmyk {
            raw::TJPF_TJPF_CMYK
        } else {
            raw::TJPF_TJPF_RGB
        } as c_int;
        let mut out: *mut u8 = std::ptr::null_mut();
        let mut size: raw::size_t = 0;
        let (w, h) = (settings.width as c_int, settings.height as c_int);
        let status = if settings.twelve_bit {
            set(raw::TJPARAM_TJPARAM_PRECISION, 12);
            let wide: Vec<i16> = pixels.iter().map(|&v| i16::from(v) << 4).collect();
            raw::tj3Compress12(handle, wide.as_ptr(), w, 0, h, format, &mut out, &mut size)
        } else {
            raw::tj3Compress8(
                handle,
                pixels.as_ptr(),
                w,
                0,
                h,
                format,
                &mut out,
                &mut size,
            )
        };
        assert_eq!(status, 0, "tj3Compress");
        let bytes = std::slice::from_raw_parts(out, size as usize).to_vec();
        raw::tj3Free(out.cast());
        raw::tj3Destroy(handle);
        bytes
    }
}

/// The markers of a JPEG in order: (code, offset of its 0xFF, offset past its segment). The
/// scan's entry ends where its entropy-coded data does.
fn markers(bytes: &[u8]) -> Vec<(u8, usize, usize)> {
    let mut found = vec![(0xD8, 0, 2)];
    let mut at = 2;
    while at + 1 < bytes.len() {
        let code = bytes[at + 1];
        if code == 0xD9 {
            found.push((code, at, at + 2));
            break;
        }
        let length = usize::from(u16::from_be_bytes([bytes[at + 2], bytes[at + 3]]));
        let mut end = at + 2 + length;
        if code == 0xDA {
            while !(bytes[end] == 0xFF
                && bytes[end + 1] != 0
                && !(0xD0..=0xD7).contains(&bytes[end + 1]))
            {
                end += 1;
            }
        }
        found.push((code, at, end));
        at = end;
    }
    found
}

/// The first segment with marker `code`: (start, end).
fn find(bytes: &[u8], code: u8) -> (usize, usize) {
    let (_, start, end) = *markers(bytes)
        .iter()
        .find(|m| m.0 == code)
        .unwrap_or_else(|| panic!("no marker {code:#x}"));
    (start, end)
}

/// `bytes` with `insert` placed at `at`.
fn spliced(bytes: &[u8], at: usize, insert: &[u8]) -> Vec<u8> {
    [&bytes[..at], insert, &bytes[at..]].concat()
}

/// The frame header of `bytes` with its size changed to `width` x `height`.
fn resized_frame(bytes: &[u8], width: u16, height: u16) -> Vec<u8> {
    let (start, end) = find(bytes, 0xC0);
    let mut frame = bytes[start..end].to_vec();
    frame[5..7].copy_from_slice(&height.to_be_bytes());
    frame[7..9].copy_from_slice(&width.to_be_bytes());
    frame
}

/// The offsets of the scan's entropy-coded data: (first byte, the end marker's 0xFF).
fn scan_data(bytes: &[u8]) -> (usize, usize) {
    let (start, end) = find(bytes, 0xDA);
    let length = usize::from(u16::from_be_bytes([bytes[start + 2], bytes[start + 3]]));
    (start + 2 + length, end)
}

/// The hostile set, from 64x48 images (and one 65,500 pixels wide).
pub fn hostile_set() -> Vec<Hostile> {
    let valid = encode(Settings::baseline(64, 48));
    let restarts = encode(Settings {
        restart_rows: 1,
        ..Settings::baseline(64, 48)
    });
    let mut set = vec![
        Hostile {
            name: "valid_420",
            bytes: valid.clone(),
            expect: Expect::Taken,
        },
        Hostile {
            name: "restart_markers",
            bytes: restarts.clone(),
            expect: Expect::Taken,
        },
    ];
    // Two frame headers of different sizes, before the scan.
    let (_, frame_end) = find(&valid, 0xC0);
    set.push(Hostile {
        name: "two_frames",
        bytes: spliced(&valid, frame_end, &resized_frame(&valid, 4000, 3000)),
        expect: Expect::Declined(Decline::SecondFrame),
    });
    // A stray start-of-image marker among the headers.
    let (frame_start, _) = find(&valid, 0xC0);
    set.push(Hostile {
        name: "stray_soi",
        bytes: spliced(&valid, frame_start, &[0xFF, 0xD8]),
        expect: Expect::Declined(Decline::StraySoi),
    });
    // A larger frame header after the scan.
    let (_, data_end) = scan_data(&valid);
    set.push(Hostile {
        name: "frame_after_scan",
        bytes: spliced(&valid, data_end, &resized_frame(&valid, 4000, 3000)),
        expect: Expect::Declined(Decline::SecondFrame),
    });
    set.push(Hostile {
        name: "side_65500",
        bytes: encode(Settings::baseline(65_500, 8)),
        expect: Expect::Declined(Decline::Size),
    });
    set.push(Hostile {
        name: "precision_12",
        bytes: encode(Settings {
            twelve_bit: true,
            ..Settings::baseline(64, 48)
        }),
        expect: Expect::Declined(Decline::Precision),
    });
    set.push(Hostile {
        name: "cmyk",
        bytes: encode(Settings {
            cmyk: true,
            ..Settings::baseline(64, 48)
        }),
        expect: Expect::Declined(Decline::Components),
    });
    set.push(Hostile {
        name: "arithmetic",
        bytes: encode(Settings {
            arithmetic: true,
            ..Settings::baseline(64, 48)
        }),
        expect: Expect::Declined(Decline::OtherCoding),
    });
    set.push(Hostile {
        name: "progressive",
        bytes: encode(Settings {
            progressive: true,
            ..Settings::baseline(64, 48)
        }),
        expect: Expect::Declined(Decline::Progressive),
    });
    // Restart markers out of order: the second one renumbered.
    let mut disordered = restarts.clone();
    let rst = markers(&restarts)
        .iter()
        .find(|m| m.0 == 0xDA)
        .map(|m| m.1)
        .unwrap();
    let second = (rst..disordered.len() - 1)
        .filter(|&i| disordered[i] == 0xFF && (0xD0..=0xD7).contains(&disordered[i + 1]))
        .nth(1)
        .expect("two restart markers");
    disordered[second + 1] = 0xD5;
    set.push(Hostile {
        name: "restarts_out_of_order",
        bytes: disordered,
        expect: Expect::Declined(Decline::Restarts),
    });
    // Scans cut in the middle with the end marker appended: with restart markers the count
    // shows it; without, only the decode can.
    for (name, bytes, expect) in [
        ("truncated_scan", &valid, Expect::LeftToDecode),
        (
            "truncated_restart_scan",
            &restarts,
            Expect::Declined(Decline::Restarts),
        ),
    ] {
        let (data_start, data_end) = scan_data(bytes);
        let mut cut = data_start + (data_end - data_start) / 2;
        while bytes[cut - 1] == 0xFF {
            cut += 1;
        }
        set.push(Hostile {
            name,
            bytes: [&bytes[..cut], &[0xFF, 0xD9][..]].concat(),
            expect,
        });
    }
    // Bits flipped to ones in the middle of the scan data, the markers intact (0xFE, never
    // 0xFF): a run of ones is no code of the standard Huffman tables, which libjpeg-turbo
    // reports; the headers are untouched.
    let (data_start, data_end) = scan_data(&valid);
    let mut flipped = valid.clone();
    let middle = (data_start + data_end) / 2;
    for byte in &mut flipped[middle - 6..middle + 6] {
        *byte = 0xFE;
    }
    set.push(Hostile {
        name: "bit_flipped_scan",
        bytes: flipped,
        expect: Expect::LeftToDecode,
    });
    set.push(Hostile {
        name: "image_after_end",
        bytes: [&valid[..], &valid[..]].concat(),
        expect: Expect::Declined(Decline::TrailingData),
    });
    set
}

#[cfg(test)]
mod tests {
    use stoker_pipeline::{decode, read_header, DecodeRequest, DecodedImage, DEFAULT_MAX_PIXELS};

    use super::super::jpeg_scan::{accept, documented_reading, scan};
    use super::*;

    /// What the CPU path does with a file: `Ok` when it decodes without a warning.
    fn cpu_decodes(bytes: &[u8]) -> bool {
        let Ok(header) = read_header(bytes, DEFAULT_MAX_PIXELS) else {
            return false;
        };
        let request = DecodeRequest {
            region: None,
            target: (header.width, header.height),
            allow_dct_scaling: false,
            max_pixels: DEFAULT_MAX_PIXELS,
        };
        decode(bytes, &header, &request, &mut DecodedImage::default()).is_ok()
    }

    #[test]
    fn each_hostile_file_is_declined_or_left_to_the_decode_as_stated() {
        for hostile in hostile_set() {
            let scanned = scan(&hostile.bytes);
            match hostile.expect {
                Expect::Declined(reason) => {
                    assert_eq!(scanned, Err(reason), "{}", hostile.name);
                }
                Expect::Taken | Expect::LeftToDecode => {
                    let frame = scanned.unwrap_or_else(|e| panic!("{}: {e:?}", hostile.name));
                    // The CPU path's header reads the same size, and a parser reading as
                    // nvJPEG documents agrees: the lane would decode it.
                    let header = read_header(&hostile.bytes, DEFAULT_MAX_PIXELS).unwrap();
                    assert!(
                        frame.agrees((header.width, header.height)),
                        "{}",
                        hostile.name
                    );
                    let reading = documented_reading(&hostile.bytes).unwrap();
                    let placement = accept(&frame, &reading, 256).unwrap();
                    assert_eq!(placement.decoded, 64 * 48 * 3, "{}", hostile.name);
                }
            }
        }
    }

    #[test]
    fn the_cpu_decodes_the_valid_files_and_refuses_the_damaged_ones_the_lane_takes() {
        for hostile in hostile_set() {
            match hostile.expect {
                Expect::Taken => assert!(cpu_decodes(&hostile.bytes), "{}", hostile.name),
                // The damage headers cannot show is a bad sample on the CPU: the lane's decode
                // checks must find it too (the GPU test holds them to it).
                Expect::LeftToDecode => {
                    assert!(!cpu_decodes(&hostile.bytes), "{}", hostile.name)
                }
                Expect::Declined(_) => {}
            }
        }
    }

    #[test]
    fn a_second_frame_header_is_what_the_cpu_header_and_nvjpeg_would_read_differently() {
        let set = hostile_set();
        let two = set.iter().find(|h| h.name == "two_frames").unwrap();
        // The first frame header is what both the CPU's header read and nvJPEG's documented
        // parse give; the lane still declines it, as libjpeg-turbo refuses two frames.
        let header = read_header(&two.bytes, DEFAULT_MAX_PIXELS).unwrap();
        assert_eq!((header.width, header.height), (64, 48));
        assert_eq!(documented_reading(&two.bytes).unwrap().width, 64);
        assert!(!cpu_decodes(&two.bytes));
    }
}
