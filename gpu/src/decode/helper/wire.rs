//! What the loader and the helper process send each other (`stoker.v1.Helper*`, in
//! `proto/stoker/v1/lane_helper.proto`): messages framed by their length on a pipe, and the
//! lane's values (an offered image, the rows' tail) as the messages carry them.

use std::io::{self, Read, Write};

use prost::Message;
use stoker_datasets::ImageFormat;
use stoker_pipeline::{CropWindow, DivertedImage, ImageHeader, SourceWindow};
use stoker_proto::v1::{HelperImage, HelperReply, HelperTail};

use crate::decode::{Element, RowTail};

/// The protocol's version: a helper refuses a start of another (2: an answer comes once its
/// rows are written, no ready events; 3: the loader says its end, and gives the helper the room
/// left in its pinned budget, within which the helper keeps to a limit it answers).
pub const HELPER_PROTOCOL: u32 = 3;

/// The environment variable a loader starts its helper with: the loader's process id, which
/// the helper watches from its first instant (its parent as it reads it may already be another
/// process, the loader having ended as the helper started).
pub const LOADER_PID_VARIABLE: &str = "STOKER_LANE_HELPER_LOADER";

/// The largest message either side reads: a batch of large JPEGs fits many times over; a length
/// past it is a stream out of step, not a message.
pub const MAX_MESSAGE: usize = 1 << 30;

/// Writes `message` as one frame: its length (4 bytes, little-endian), then its bytes.
pub fn write_message(out: &mut impl Write, message: &impl Message) -> io::Result<()> {
    let bytes = message.encode_to_vec();
    let len = u32::try_from(bytes.len())
        .ok()
        .filter(|&len| len as usize <= MAX_MESSAGE)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a message of {} bytes is too large to send", bytes.len()),
            )
        })?;
    out.write_all(&len.to_le_bytes())?;
    out.write_all(&bytes)?;
    out.flush()
}

/// The largest answer the loader reads from its helper: an answer lists a batch's rows (a few
/// bytes each), so a longer length is a stream out of step, which then costs no more memory
/// than this.
pub const MAX_ANSWER: usize = 16 << 20;

/// Reads one frame's message; `Ok(None)` when the stream ends before a frame starts.
pub fn read_message<M: Message + Default>(input: &mut impl Read) -> io::Result<Option<M>> {
    read_frame(input, MAX_MESSAGE)
}

/// Reads one of the helper's answers (at most [`MAX_ANSWER`] bytes), as [`read_message`].
pub fn read_answer(input: &mut impl Read) -> io::Result<Option<HelperReply>> {
    read_frame(input, MAX_ANSWER)
}

/// Reads one frame's message of at most `max` bytes.
fn read_frame<M: Message + Default>(input: &mut impl Read, max: usize) -> io::Result<Option<M>> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < len.len() {
        match input.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes (the most is {max}): the stream is out of step"),
        ));
    }
    let mut bytes = vec![0u8; len];
    input.read_exact(&mut bytes)?;
    M::decode(bytes.as_slice())
        .map(Some)
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))
}

/// An offered image as it travels.
pub fn image_message(image: &DivertedImage) -> HelperImage {
    let mut message = HelperImage {
        row: image.row as u32,
        sample: image.sample,
        jpeg: image.bytes.clone().into(),
        header_width: image.header.width,
        header_height: image.header.height,
        flip: image.flip,
        ..HelperImage::default()
    };
    match image.window {
        SourceWindow::CropThenResize(window) => {
            message.crop_first = true;
            message.top = window.top;
            message.left = window.left;
            message.window_height = window.height;
            message.window_width = window.width;
        }
        SourceWindow::ResizeThenCrop { resized, left, top } => {
            (message.resized_width, message.resized_height) = resized;
            (message.offset_left, message.offset_top) = (left, top);
        }
    }
    message
}

/// The image a message carries (a JPEG: the helper's lane takes nothing else).
pub fn image_of(message: HelperImage) -> DivertedImage {
    let window = if message.crop_first {
        SourceWindow::CropThenResize(CropWindow {
            top: message.top,
            left: message.left,
            height: message.window_height,
            width: message.window_width,
        })
    } else {
        SourceWindow::ResizeThenCrop {
            resized: (message.resized_width, message.resized_height),
            left: message.offset_left,
            top: message.offset_top,
        }
    };
    DivertedImage {
        row: message.row as usize,
        sample: message.sample,
        read: message.sample,
        bytes: message.jpeg.to_vec(),
        header: ImageHeader {
            format: ImageFormat::Jpeg,
            width: message.header_width,
            height: message.header_height,
        },
        window,
        flip: message.flip,
    }
}

/// The rows' tail as it travels.
pub fn tail_message(tail: &RowTail) -> HelperTail {
    HelperTail {
        element: tail.element as u32,
        planar: tail.planar,
        scale: tail.scale.to_vec(),
        shift: tail.shift.to_vec(),
    }
}

/// The tail a message carries, or why it is not one.
pub fn tail_of(message: &HelperTail) -> Result<RowTail, String> {
    let element = match message.element {
        0 => Element::U8,
        1 => Element::F32,
        2 => Element::Bf16,
        3 => Element::F16,
        other => return Err(format!("element type {other} is not one the lane writes")),
    };
    let three = |values: &[f32], what: &str| -> Result<[f32; 3], String> {
        values
            .try_into()
            .map_err(|_| format!("the tail's {what} has {} values, not 3", values.len()))
    };
    Ok(RowTail {
        element,
        planar: message.planar,
        scale: three(&message.scale, "scale")?,
        shift: three(&message.shift, "shift")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use stoker_proto::v1::{helper_request, HelperRequest, HelperRows};

    fn image(window: SourceWindow) -> DivertedImage {
        DivertedImage {
            row: 5,
            sample: 77,
            read: 77,
            bytes: vec![0xFF, 0xD8, 1, 2, 3],
            header: ImageHeader {
                format: ImageFormat::Jpeg,
                width: 640,
                height: 480,
            },
            window,
            flip: true,
        }
    }

    #[test]
    fn an_image_comes_back_as_it_was_sent() {
        for window in [
            SourceWindow::CropThenResize(CropWindow {
                top: 3,
                left: 9,
                height: 200,
                width: 300,
            }),
            SourceWindow::ResizeThenCrop {
                resized: (293, 256),
                left: -4,
                top: 16,
            },
        ] {
            let sent = image(window);
            let back = image_of(image_message(&sent));
            assert_eq!(back.row, sent.row);
            assert_eq!(back.sample, sent.sample);
            assert_eq!(back.bytes, sent.bytes);
            assert_eq!(back.header, sent.header);
            assert_eq!(back.window, sent.window);
            assert_eq!(back.flip, sent.flip);
        }
    }

    #[test]
    fn a_tail_comes_back_as_it_was_sent_and_a_wrong_one_is_named() {
        let tail = RowTail {
            element: Element::Bf16,
            planar: true,
            scale: [0.1, 0.2, 0.3],
            shift: [-1.0, -2.0, -3.0],
        };
        assert_eq!(tail_of(&tail_message(&tail)).unwrap(), tail);
        assert_eq!(
            tail_of(&tail_message(&RowTail::BYTES)).unwrap(),
            RowTail::BYTES
        );
        let mut wrong = tail_message(&tail);
        wrong.element = 9;
        assert!(tail_of(&wrong).unwrap_err().contains("element type 9"));
        let mut short = tail_message(&tail);
        short.shift.pop();
        assert!(tail_of(&short).unwrap_err().contains("shift has 2 values"));
    }

    #[test]
    fn frames_carry_messages_and_tell_an_end_from_a_cut() {
        let request = HelperRequest {
            kind: Some(helper_request::Kind::Rows(HelperRows {
                id: 4,
                ring: 1,
                images: vec![image_message(&image(SourceWindow::ResizeThenCrop {
                    resized: (10, 10),
                    left: 0,
                    top: 0,
                }))],
            })),
        };
        let mut stream = Vec::new();
        write_message(&mut stream, &request).unwrap();
        write_message(&mut stream, &request).unwrap();
        let mut reader = stream.as_slice();
        for _ in 0..2 {
            let read: HelperRequest = read_message(&mut reader).unwrap().unwrap();
            assert_eq!(read, request);
        }
        assert!(read_message::<HelperRequest>(&mut reader)
            .unwrap()
            .is_none());
        // Cut inside the length, inside the body; a length past the most.
        for cut in [2, stream.len() / 2 - 3] {
            let error = read_message::<HelperRequest>(&mut &stream[..cut]).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof, "cut at {cut}");
        }
        let huge = ((MAX_MESSAGE + 1) as u32).to_le_bytes();
        let error = read_message::<HelperRequest>(&mut &huge[..]).unwrap_err();
        assert!(error.to_string().contains("out of step"), "{error}");
        // An answer longer than the most an answer has is out of step before it is read.
        let long = ((MAX_ANSWER + 1) as u32).to_le_bytes();
        let error = read_answer(&mut &long[..]).unwrap_err();
        assert!(error.to_string().contains("out of step"), "{error}");
        assert!(read_message::<HelperReply>(&mut &long[..])
            .is_err_and(|e| e.kind() == io::ErrorKind::UnexpectedEof));
    }
}
