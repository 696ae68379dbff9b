//! The body of the loader's fuzz target, as a plain function: the GPU decode lane's acceptance
//! decision on the CPU (`fuzz/`, see its README; the corpus replay is the test below).
//!
//! A body returns normally whatever the input; a panic is a bug. The `assert!`s are the
//! promises the decision makes: nothing is ever sized from one parser's reading alone, and a
//! region decoded instead of the whole image lies in the frame both read.

use stoker_pipeline::{read_header, DEFAULT_MAX_PIXELS};

use stoker_pipeline::{CropWindow, SourceWindow};

use crate::decode::{
    accept, documented_reading, region_for, scan, Decline, Frame, Placement, MAX_JPEG_SIDE,
};

/// Arena places are aligned to this in the lane.
const ALIGN: usize = 256;

/// One encoded image through both halves of the lane's acceptance decision: the decode
/// threads' marker scan checked against the CPU path's header read, and the lane's comparison
/// with nvJPEG's parse, stood in for by a parser that reads the stream as nvJPEG documents it
/// does (the first frame header's size, component count, sampling factors).
///
/// Checks: a stream the marker scan takes has exactly the frame a first-frame-header parser
/// reads, so the comparison accepts it; an accepted image's place is sized from the values
/// both read and holds its decoded bytes; every disagreement declines.
pub fn gpu_acceptance(data: &[u8]) {
    let scanned = scan(data);
    let reading = documented_reading(data);
    let Ok(frame) = scanned else {
        return;
    };
    // The scan took the stream: its frame header is the only one, so a parser reading the
    // first one reads it too.
    let reading = reading.expect("a stream the scan takes has a frame header nvJPEG reads");
    let placement = accept(&frame, &reading, ALIGN)
        .expect("the scan's frame is the one a first-frame-header parser reads");
    assert_eq!(
        (placement.width, placement.height),
        (reading.width, reading.height)
    );
    assert_eq!((frame.width, frame.height), (reading.width, reading.height));
    assert!(placement.width.max(placement.height) <= MAX_JPEG_SIDE);
    assert_eq!(placement.pitch, placement.width as usize * 3);
    assert_eq!(
        placement.decoded,
        placement.pitch * placement.height as usize
    );
    assert!(placement.place >= placement.decoded && placement.place % ALIGN == 0);
    // Any other reading of nvJPEG's declines, whichever field differs.
    for (k, other) in [
        (reading.width ^ 1, reading.height, reading.components),
        (reading.width, reading.height + 1, reading.components),
        (reading.width, reading.height, 4),
    ]
    .into_iter()
    .enumerate()
    {
        let mut differs = reading;
        (differs.width, differs.height, differs.components) = other;
        assert_eq!(
            accept(&frame, &differs, ALIGN),
            Err(Decline::Disagree),
            "changed field {k}"
        );
    }
    region_within_the_frame(data, &frame, &placement);
    // The CPU path's header (imagesize) either reads this size, and the window drawn in it
    // lies in the place, or the decode threads keep the image.
    if let Ok(header) = read_header(data, DEFAULT_MAX_PIXELS) {
        if frame.agrees((header.width, header.height)) {
            assert_eq!(
                header.width as usize * header.height as usize * 3,
                placement.decoded
            );
        }
    }
}

/// With region decoding, a crop window drawn from the input's last bytes: the region decoded
/// for it lies in the agreed frame, holds the window on MCU edges (or the frame's), and its
/// place is never larger than the whole image's, so a region asks the arena for no more than
/// the whole image would.
fn region_within_the_frame(data: &[u8], frame: &Frame, whole: &Placement) {
    let mut tail = data.iter().rev().copied().chain(std::iter::repeat(0));
    let mut draw = |below: u32| {
        let bytes = [0, 0, 0, 0].map(|_: u8| tail.next().unwrap_or(0));
        u32::from_le_bytes(bytes) % below.max(1)
    };
    let width = 1 + draw(frame.width);
    let height = 1 + draw(frame.height);
    let left = draw(frame.width - width + 1);
    let top = draw(frame.height - height + 1);
    let window = SourceWindow::CropThenResize(CropWindow {
        left,
        top,
        width,
        height,
    });
    let mcu = frame.chroma.mcu();
    let Some(decode) = region_for(&window, (frame.width, frame.height), mcu) else {
        return;
    };
    let r = decode.region;
    assert!(r.left <= left && r.top <= top, "{r:?} {window:?}");
    assert!(r.left + r.width >= left + width && r.top + r.height >= top + height);
    assert!(r.left + r.width <= frame.width && r.top + r.height <= frame.height);
    assert!(r.left % mcu.0 == 0 && r.top % mcu.1 == 0);
    let place = r.placement(ALIGN);
    assert!(place.decoded <= whole.decoded && place.place <= whole.place);
    assert_eq!(
        decode.window,
        SourceWindow::CropThenResize(CropWindow {
            left: left - r.left,
            top: top - r.top,
            width,
            height,
        })
    );
}

#[cfg(test)]
mod tests {
    use stoker_datasets::fuzz_targets::committed_inputs;

    use super::*;
    use crate::decode::hostile::hostile_set;

    /// Seeds over this size are left out of the committed corpus.
    const MAX_SEED: usize = 16 << 10;

    #[test]
    fn gpu_acceptance_corpus_replays() {
        for file in committed_inputs("gpu_acceptance") {
            eprintln!("replaying {}", file.display());
            gpu_acceptance(&std::fs::read(&file).expect("a committed input"));
        }
    }

    #[test]
    fn the_hostile_set_passes_the_body() {
        for hostile in hostile_set() {
            gpu_acceptance(&hostile.bytes);
        }
    }

    /// Writes the hostile set as the target's seeds; run by hand when it changes.
    #[test]
    #[ignore]
    fn write_seed_corpus() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/gpu_acceptance");
        std::fs::create_dir_all(&dir).expect("the corpus folder");
        for hostile in hostile_set() {
            if hostile.bytes.len() <= MAX_SEED {
                std::fs::write(dir.join(hostile.name), &hostile.bytes).expect("a seed");
            }
        }
    }
}
