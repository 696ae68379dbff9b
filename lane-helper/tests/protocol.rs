//! The helper binary as the loader runs it: a real process spoken to over its stdin and
//! stdout. Without a device (the test hook) it answers every image for the CPU; a start it
//! cannot serve is answered with why; the loader's end ends it, answering what it was sent,
//! while its stdin stays open; a stream out of step ends it with a failure.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use stoker_gpu::helper_wire::{read_message, tail_message, write_message, HELPER_PROTOCOL};
use stoker_gpu::RowTail;
use stoker_lane_helper::NO_DEVICE_VARIABLE;
use stoker_proto::v1::{
    helper_reply, helper_request, HelperEnd, HelperImage, HelperReply, HelperRequest, HelperRows,
    HelperStart, HelperStarted,
};

fn helper(env: &[(&str, &str)]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_stoker-lane-helper"))
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn start(protocol: u32) -> HelperRequest {
    HelperRequest {
        kind: Some(helper_request::Kind::Start(HelperStart {
            protocol,
            device: 0,
            memory_bytes: 256 << 20,
            height: 32,
            width: 32,
            batch_rows: 8,
            tail: Some(tail_message(&RowTail::BYTES)),
            ..HelperStart::default()
        })),
    }
}

fn started(child: &mut Child) -> HelperStarted {
    match read_message::<HelperReply>(child.stdout.as_mut().unwrap()).unwrap() {
        Some(HelperReply {
            kind: Some(helper_reply::Kind::Started(started)),
        }) => started,
        other => panic!("not a start's answer: {other:?}"),
    }
}

/// Waits (bounded) for the helper to end; its exit code and stderr.
fn ended(mut child: Child) -> (Option<i32>, String) {
    drop(child.stdin.take());
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the helper did not end");
        std::thread::sleep(Duration::from_millis(10));
    }
    let output = child.wait_with_output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn without_a_device_every_image_is_answered_for_the_cpu() {
    let mut child = helper(&[(NO_DEVICE_VARIABLE, "1")]);
    write_message(child.stdin.as_mut().unwrap(), &start(HELPER_PROTOCOL)).unwrap();
    let answer = started(&mut child);
    assert_eq!(answer.error, "");
    assert!(!answer.device);
    assert_eq!(answer.pid, child.id());
    for id in [7, 8] {
        let images = (0..3)
            .map(|k| HelperImage {
                row: k * 2,
                sample: 100 + u64::from(k),
                jpeg: vec![0xFF, 0xD8, 0xFF, 0xD9].into(),
                ..HelperImage::default()
            })
            .collect();
        let rows = HelperRequest {
            kind: Some(helper_request::Kind::Rows(HelperRows {
                id,
                ring: 1,
                images,
            })),
        };
        write_message(child.stdin.as_mut().unwrap(), &rows).unwrap();
        let built = match read_message::<HelperReply>(child.stdout.as_mut().unwrap()).unwrap() {
            Some(HelperReply {
                kind: Some(helper_reply::Kind::Built(built)),
            }) => built,
            other => panic!("not a batch's answer: {other:?}"),
        };
        assert_eq!((built.id, built.ring), (id, 1));
        assert!(built.rows.is_empty());
        let cpu: Vec<_> = built
            .cpu
            .iter()
            .map(|r| (r.row, r.sample, r.device_row))
            .collect();
        assert_eq!(cpu, vec![(0, 100, None), (2, 101, None), (4, 102, None)]);
    }
    let (code, stderr) = ended(child);
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn the_loaders_end_ends_the_helper_after_its_answers_while_its_stdin_stays_open() {
    let mut child = helper(&[(NO_DEVICE_VARIABLE, "1")]);
    let stdin = child.stdin.as_mut().unwrap();
    write_message(stdin, &start(HELPER_PROTOCOL)).unwrap();
    let rows = HelperRequest {
        kind: Some(helper_request::Kind::Rows(HelperRows {
            id: 5,
            ring: 0,
            images: vec![HelperImage {
                row: 0,
                sample: 9,
                jpeg: vec![0xFF, 0xD8, 0xFF, 0xD9].into(),
                ..HelperImage::default()
            }],
        })),
    };
    write_message(stdin, &rows).unwrap();
    let end = HelperRequest {
        kind: Some(helper_request::Kind::End(HelperEnd {})),
    };
    write_message(stdin, &end).unwrap();
    assert_eq!(started(&mut child).error, "");
    let stdout = child.stdout.as_mut().unwrap();
    match read_message::<HelperReply>(stdout).unwrap() {
        Some(HelperReply {
            kind: Some(helper_reply::Kind::Built(built)),
        }) => assert_eq!((built.id, built.cpu.len()), (5, 1)),
        other => panic!("not the batch's answer: {other:?}"),
    }
    // Its output ends, and it exits, with this side of its stdin still open.
    assert!(read_message::<HelperReply>(stdout).unwrap().is_none());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the helper did not end");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(child.stdin.is_some());
    assert_eq!(status.code(), Some(0));
}

#[test]
fn a_start_it_cannot_serve_is_answered_with_why() {
    // Another protocol.
    let mut child = helper(&[(NO_DEVICE_VARIABLE, "1")]);
    write_message(child.stdin.as_mut().unwrap(), &start(HELPER_PROTOCOL + 1)).unwrap();
    let answer = started(&mut child);
    assert!(answer.error.contains("protocol"), "{}", answer.error);
    assert_eq!(ended(child).0, Some(0));
    // Green contexts are not served, said before any device is touched.
    let mut child = helper(&[("STOKER_GPU_DECODE_SMS", "16")]);
    write_message(child.stdin.as_mut().unwrap(), &start(HELPER_PROTOCOL)).unwrap();
    let answer = started(&mut child);
    assert!(
        answer
            .error
            .contains("STOKER_GPU_DECODE_SMS does not apply"),
        "{}",
        answer.error
    );
    assert_eq!(ended(child).0, Some(0));
    // No device to run on, on any machine: CUDA sees none.
    let mut child = helper(&[("CUDA_VISIBLE_DEVICES", "")]);
    write_message(child.stdin.as_mut().unwrap(), &start(HELPER_PROTOCOL)).unwrap();
    let answer = started(&mut child);
    assert!(!answer.error.is_empty());
    assert!(!answer.device);
    assert_eq!(ended(child).0, Some(0));
}

#[test]
fn a_stream_out_of_step_ends_the_helper_with_a_failure() {
    let mut child = helper(&[(NO_DEVICE_VARIABLE, "1")]);
    let stdin = child.stdin.as_mut().unwrap();
    stdin.write_all(&u32::MAX.to_le_bytes()).unwrap();
    stdin.flush().unwrap();
    let (code, stderr) = ended(child);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("out of step"), "{stderr}");
    // A second start is out of step too.
    let mut child = helper(&[(NO_DEVICE_VARIABLE, "1")]);
    write_message(child.stdin.as_mut().unwrap(), &start(HELPER_PROTOCOL)).unwrap();
    started(&mut child);
    write_message(child.stdin.as_mut().unwrap(), &start(HELPER_PROTOCOL)).unwrap();
    let (code, stderr) = ended(child);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("other than a batch"), "{stderr}");
}

#[test]
fn arguments_are_refused_with_what_starts_it() {
    let output = Command::new(env!("CARGO_BIN_EXE_stoker-lane-helper"))
        .arg("--help")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("STOKER_GPU_DECODE_HELPER=1"));
}
