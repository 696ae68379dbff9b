//! The helper process's side of the GPU decode lane (`stoker-lane-helper`): it reads the
//! loader's start and batches from its input, runs the lane in its own CUDA context
//! (`stoker_gpu::GpuLane::start_served`), and answers each batch on its output with what became
//! of each image; the rows themselves stay in the lane's output buffers, which the loader has
//! opened through their IPC handle. The messages are `stoker.v1.Helper*`
//! (`stoker_gpu::helper_wire`).
//!
//! A test hook, [`NO_DEVICE_VARIABLE`], starts the helper without a device: it then builds no
//! rows and sends every image back to be built on the CPU, so the process, its messages and
//! the loader's fallback are exercised where there is no GPU; with it, [`FAULT_VARIABLE`]
//! makes it go out of step in one of the ways the loader must survive.

use std::collections::HashMap;
use std::io::{BufReader, BufWriter, IsTerminal, Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stoker_gpu::helper_wire::{
    image_of, read_message, tail_of, write_message, HELPER_PROTOCOL, LOADER_PID_VARIABLE,
};
use stoker_gpu::{served_pinned_limit, DecodeMode, GpuDecodeOptions, GpuLane, RowsBuilt, RowsTask};
use stoker_proto::v1::{
    helper_reply, helper_request, HelperBuilt, HelperCpuRow, HelperReply, HelperRequest,
    HelperRows, HelperStart, HelperStarted,
};

/// The test hook: `1` starts the helper without a device (see the crate's docs).
pub const NO_DEVICE_VARIABLE: &str = "STOKER_LANE_HELPER_NO_DEVICE";

/// A second test hook, read only by the helper without a device: `kind:count` makes it go out
/// of step once it has answered `count` batches (`exit`: it exits without answering;
/// `garbage`: it writes a length no answer has; `unsent`: it answers a batch not sent;
/// `device-row`: it names a device row it cannot have; `error`: it answers every later batch as
/// failed, as a lane whose CUDA context broke would), so the loader's side of each is
/// exercised through real pipes.
pub const FAULT_VARIABLE: &str = "STOKER_LANE_HELPER_FAULT";

/// A third, read only by the helper without a device: a byte count it answers as its lane's
/// page-locked staging, with the limit a lane keeps to in the start's room (refusing to start,
/// as a lane does, when the staging does not fit in that room), so the loader's reservation of
/// the helper's page-locked memory is exercised through real pipes.
pub const STAGING_VARIABLE: &str = "STOKER_LANE_HELPER_STAGING";

/// Why the helper stopped before its input ended.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    /// Reading or writing a message failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The loader sent something out of step.
    #[error("{0}")]
    Protocol(String),
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the helper's command does, with the `arguments` after its name: none are taken (exit
/// status 2, saying so); the log goes to stderr (`RUST_LOG`, warnings by default, where no
/// log is set up yet); one loader is served on stdin and stdout ([`serve`]; stdout set apart
/// for the messages, anything else printed going to stderr); 0 when its input
/// ended or the loader said its end, 1 when it stopped on an error (said on stderr), also
/// within a second of the end of its parent process (the loader's, which starts it directly:
/// a helper left running would hold its share of the GPU's memory). `stoker-lane-helper` (this
/// crate's binary) and the command the Python package installs (through its native module)
/// both run it.
pub fn run(arguments: &[std::ffi::OsString]) -> u8 {
    if !arguments.is_empty() {
        eprintln!(
            "stoker-lane-helper takes no arguments: a Stoker loader starts it and speaks to it \
             over its stdin and stdout (STOKER_GPU_DECODE_HELPER=1)"
        );
        return 2;
    }
    // Fails only where the process has a log already; that one is kept.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .try_init();
    watch_the_loader();
    let output = match protocol_output() {
        Ok(output) => output,
        Err(error) => {
            eprintln!("stoker-lane-helper: setting its output apart: {error}");
            return 1;
        }
    };
    match serve(std::io::stdin().lock(), output) {
        Ok(()) => 0,
        Err(error) => {
            tracing::error!(%error, "the lane's helper stops");
            eprintln!("stoker-lane-helper: {error}");
            1
        }
    }
}

/// How often the helper looks whether the loader's process still runs.
const LOADER_CHECK: Duration = Duration::from_millis(500);

/// Ends this process (status 1) within [`LOADER_CHECK`] of the end of the loader's process: a
/// helper left running would hold its share of the GPU's memory. Its stdin ends with the
/// loader's process, unless a process forked from that one (without an exec) holds a copy; so
/// this watches for the helper being handed to another parent (init or a subreaper), which
/// happens as its parent ends, and, where the loader named itself ([`LOADER_PID_VARIABLE`]), for
/// that process to end: a loader that ended before this thread first read its parent left it
/// watching init for good. The parent it watches is the one it has as it starts, the loader
/// itself or a wrapper that does not exec it. The exit is immediate (`_exit`: no exit handlers
/// run beside the lane's threads); the system frees the process's GPU memory.
fn watch_the_loader() {
    let parent = std::os::unix::process::parent_id();
    let loader = std::env::var(LOADER_PID_VARIABLE)
        .ok()
        .and_then(|pid| pid.parse::<u32>().ok())
        // Where /proc cannot be read, the parent alone is watched.
        .filter(|_| process_runs(std::process::id()) == Some(true));
    let ended = move || {
        std::os::unix::process::parent_id() != parent
            || loader.is_some_and(|pid| process_runs(pid) == Some(false))
    };
    let watch = move || loop {
        if ended() {
            let loader = loader.unwrap_or(parent);
            tracing::error!(
                loader,
                "the loader's process ended; the lane's helper ends too"
            );
            eprintln!("stoker-lane-helper: the loader's process {loader} ended; ending too");
            // SAFETY: ends the process at once; nothing after it runs.
            unsafe { libc::_exit(1) };
        }
        std::thread::sleep(LOADER_CHECK);
    };
    if let Err(error) = std::thread::Builder::new()
        .name("stoker-lane-helper-loader".into())
        .spawn(watch)
    {
        tracing::warn!(%error, "no thread to watch the loader's process; the helper ends with its stdin only");
    }
}

/// Whether process `pid` runs (it exists and has not ended: a zombie, ended but not yet reaped,
/// does not run), from `/proc`; `None` where that cannot be read.
fn process_runs(pid: u32) -> Option<bool> {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the field after the command name, which closes with the last `)`.
        Ok(stat) => {
            let state = stat.rsplit_once(')')?.1.split_whitespace().next()?;
            Some(!matches!(state, "Z" | "X" | "x"))
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Some(false),
        Err(_) => None,
    }
}

/// The stdout the loader reads, set apart for the messages: they go out on a copy of it, and
/// stdout itself then points at stderr, so whatever else in the process prints (a library's
/// message, Python code in the package's command) lands there instead of cutting into them.
fn protocol_output() -> std::io::Result<std::fs::File> {
    use std::os::fd::FromRawFd;
    // SAFETY: plain descriptor calls; the copy is owned by the file made from it alone.
    unsafe {
        let messages = libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 3);
        if messages < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::dup2(2, 1) < 0 {
            let error = std::io::Error::last_os_error();
            libc::close(messages);
            return Err(error);
        }
        Ok(std::fs::File::from_raw_fd(messages))
    }
}

/// Serves one loader: its start from `input`, then its batches until the loader's end or the
/// end of `input`; answers on `output`. A lane that cannot start is answered as such (and is
/// not an error here).
pub fn serve(input: impl Read, output: impl Write + Send + 'static) -> Result<(), HelperError> {
    let mut input = BufReader::with_capacity(1 << 20, input);
    let mut output = BufWriter::with_capacity(1 << 16, output);
    let start = match read_message::<HelperRequest>(&mut input)? {
        Some(HelperRequest {
            kind: Some(helper_request::Kind::Start(start)),
        }) => start,
        Some(HelperRequest {
            kind: Some(helper_request::Kind::End(_)),
        })
        | None => return Ok(()),
        Some(_) => {
            return Err(HelperError::Protocol(
                "the first message was not a start".into(),
            ))
        }
    };
    if start.protocol != HELPER_PROTOCOL {
        let refusal = format!(
            "the loader speaks the helper's protocol {}, this helper {HELPER_PROTOCOL}: use the \
             helper built with the loader",
            start.protocol
        );
        write_message(&mut output, &started(refusal))?;
        return Ok(());
    }
    if std::env::var(NO_DEVICE_VARIABLE).is_ok_and(|v| v.trim() == "1") {
        return serve_without_device(&start, &mut input, &mut output);
    }
    let lane = match start_lane(&start) {
        Ok((lane, reply)) => {
            write_message(&mut output, &reply)?;
            lane
        }
        Err(error) => {
            write_message(&mut output, &started(error))?;
            return Ok(());
        }
    };
    serve_lane(&lane, input, output)
}

/// A start's answer that the lane cannot run, for `error`.
fn started(error: String) -> HelperReply {
    HelperReply {
        kind: Some(helper_reply::Kind::Started(HelperStarted {
            error,
            pid: std::process::id(),
            ..HelperStarted::default()
        })),
    }
}

/// Starts the lane `start` asks for, with the answer naming its buffers (one IPC handle) and
/// its device's UUID.
fn start_lane(start: &HelperStart) -> Result<(GpuLane, HelperReply), String> {
    let tail = start
        .tail
        .as_ref()
        .map(tail_of)
        .transpose()?
        .ok_or("the start names no tail")?;
    let options = GpuDecodeOptions {
        mode: DecodeMode::Gpu,
        device: start.device as usize,
        memory_bytes: start.memory_bytes as usize,
        library_dirs: start.library_dirs.iter().map(Into::into).collect(),
        pinned_budget: start.pinned_budget,
        tail,
        helper: None,
    };
    let (lane, handles) = GpuLane::start_served(
        &options,
        start.height,
        start.width,
        start.batch_rows as usize,
    )
    .map_err(|e| e.to_string())?;
    let figures = lane.figures();
    let reply = HelperReply {
        kind: Some(helper_reply::Kind::Started(HelperStarted {
            error: String::new(),
            pid: std::process::id(),
            device: true,
            hardware: lane.hardware(),
            max_decoded_bytes: handles.max_decoded_bytes as u64,
            ring_slots: handles.ring_slots as u32,
            ring_slot_bytes: handles.ring_slot_bytes as u64,
            ring_handle: handles.ring.to_vec().into(),
            device_uuid: handles.device_uuid.to_vec().into(),
            memory_bytes: figures.memory_bytes,
            memory_cap: figures.memory_cap,
            rows_dtype: lane.rows_tail().element.name().into(),
            staging_bytes: lane.staging_bytes() as u64,
            pinned_limit: handles.pinned_limit,
        })),
    };
    Ok((lane, reply))
}

/// The next batch from `input`: `None` when it ends.
fn next_rows(input: &mut impl Read) -> Result<Option<HelperRows>, HelperError> {
    match read_message::<HelperRequest>(input)? {
        Some(HelperRequest {
            kind: Some(helper_request::Kind::Rows(rows)),
        }) => Ok(Some(rows)),
        Some(HelperRequest {
            kind: Some(helper_request::Kind::End(_)),
        })
        | None => Ok(None),
        Some(_) => Err(HelperError::Protocol(
            "a message other than a batch or the end after the start".into(),
        )),
    }
}

/// How the test hook's helper goes out of step, after answering so many batches
/// ([`FAULT_VARIABLE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// It exits (status 0) without answering.
    Exit,
    /// It writes a length no answer has, then reads on without answering.
    Garbage,
    /// It answers a batch that was not sent.
    Unsent,
    /// It answers with a device row though it has no device.
    DeviceRow,
    /// It answers every batch as failed, as a lane whose CUDA context broke would.
    Error,
}

/// The fault `value` asks for and after how many answers (`kind:count`), or why it is not one.
fn fault_of(value: &str) -> Result<(Fault, u64), String> {
    let (kind, after) = value.trim().split_once(':').unwrap_or((value.trim(), "0"));
    let fault = match kind {
        "exit" => Fault::Exit,
        "garbage" => Fault::Garbage,
        "unsent" => Fault::Unsent,
        "device-row" => Fault::DeviceRow,
        "error" => Fault::Error,
        other => {
            return Err(format!(
                "{FAULT_VARIABLE}: no fault {other:?} (exit, garbage, unsent, device-row, \
                 error)"
            ))
        }
    };
    let after = after
        .parse()
        .map_err(|_| format!("{FAULT_VARIABLE}: {after:?} is not a count of answers"))?;
    Ok((fault, after))
}

/// The test hook's helper: every image of every batch goes back to the CPU (and, with
/// [`FAULT_VARIABLE`], it goes out of step after so many answers).
fn serve_without_device(
    start: &HelperStart,
    input: &mut impl Read,
    output: &mut impl Write,
) -> Result<(), HelperError> {
    let fault = match std::env::var(FAULT_VARIABLE) {
        Ok(value) => Some(fault_of(&value).map_err(HelperError::Protocol)?),
        Err(_) => None,
    };
    let staging = match std::env::var(STAGING_VARIABLE) {
        Ok(value) => value.trim().parse::<u64>().map_err(|_| {
            HelperError::Protocol(format!("{STAGING_VARIABLE}: {value:?} is not a byte count"))
        })?,
        Err(_) => 0,
    };
    if let Some(room) = start.pinned_budget.filter(|&room| staging > room) {
        let refusal = format!(
            "its page-locked staging ({staging} bytes) does not fit in the {room} bytes its \
             loader's pinned budget had left"
        );
        write_message(output, &started(refusal))?;
        return Ok(());
    }
    let reply = HelperReply {
        kind: Some(helper_reply::Kind::Started(HelperStarted {
            pid: std::process::id(),
            device: false,
            rows_dtype: "uint8".into(),
            staging_bytes: staging,
            pinned_limit: start
                .pinned_budget
                .map_or(0, |room| served_pinned_limit(room, staging)),
            ..HelperStarted::default()
        })),
    };
    write_message(output, &reply)?;
    let mut answered = 0;
    while let Some(rows) = next_rows(input)? {
        let mut built = HelperBuilt {
            id: rows.id,
            ring: rows.ring,
            cpu: rows
                .images
                .iter()
                .map(|image| HelperCpuRow {
                    row: image.row,
                    sample: image.sample,
                    device_row: None,
                })
                .collect(),
            ..HelperBuilt::default()
        };
        match fault.filter(|&(_, after)| answered >= after) {
            None => {}
            Some((Fault::Exit, _)) => return Ok(()),
            Some((Fault::Garbage, _)) => {
                output.write_all(&u32::MAX.to_le_bytes())?;
                output.flush()?;
                std::io::copy(input, &mut std::io::sink())?;
                return Ok(());
            }
            Some((Fault::Unsent, _)) => built.id += 1 << 40,
            Some((Fault::DeviceRow, _)) => {
                if let Some(first) = built.cpu.pop() {
                    built.rows.push(first.row);
                }
            }
            Some((Fault::Error, _)) => {
                built.error = "CUDA_ERROR_ILLEGAL_ADDRESS (the test fault)".into();
            }
        }
        write_message(
            output,
            &HelperReply {
                kind: Some(helper_reply::Kind::Built(built)),
            },
        )?;
        answered += 1;
    }
    Ok(())
}

/// Serves batches on `lane` until `input` ends: each batch's images the lane takes are queued
/// on it, the rest noted as declined; a writer thread answers each batch as the lane finishes
/// it, declined images with the CPU's.
fn serve_lane(
    lane: &GpuLane,
    mut input: impl Read,
    output: impl Write + Send + 'static,
) -> Result<(), HelperError> {
    let declined: Arc<Mutex<HashMap<u64, Vec<HelperCpuRow>>>> = Arc::default();
    let (answers, answered) = crossbeam_channel::unbounded::<RowsBuilt>();
    let writer = {
        let declined = Arc::clone(&declined);
        let refused = lane.pinned_refused_reader();
        std::thread::Builder::new()
            .name("stoker-lane-helper-answers".into())
            .spawn(move || write_answers(output, &answered, &declined, refused))?
    };
    let served = (|| {
        while let Some(rows) = next_rows(&mut input)? {
            let mut items = Vec::with_capacity(rows.images.len());
            let mut kept = Vec::new();
            for image in rows.images {
                let (row, sample) = (image.row, image.sample);
                match lane.served_item(image_of(image)) {
                    Some(item) => items.push(item),
                    None => kept.push(HelperCpuRow {
                        row,
                        sample,
                        device_row: None,
                    }),
                }
            }
            lock(&declined).insert(rows.id, kept);
            if items.is_empty() {
                let _ = answers.send(RowsBuilt {
                    id: rows.id,
                    ring: rows.ring as usize,
                    rows: Vec::new(),
                    cpu: Vec::new(),
                    error: None,
                    busy: Duration::ZERO,
                });
                continue;
            }
            lane.serve(RowsTask {
                id: rows.id,
                ring: rows.ring as usize,
                items,
                reply: answers.clone(),
            });
        }
        Ok::<(), HelperError>(())
    })();
    // The lane's pipes finish what was queued (answering it), then the writer ends with the
    // last answer.
    lane.shutdown();
    drop(answers);
    let written = writer
        .join()
        .unwrap_or_else(|_| Err(HelperError::Protocol("the answers' thread panicked".into())));
    served.and(written)
}

/// The writer's thread: each finished batch's answer, its declined images added, and the
/// lane's count of refused pinned allocations so far, on `output` (buffered by [`serve`]; each
/// message is flushed as it is written).
fn write_answers(
    mut output: impl Write,
    answered: &crossbeam_channel::Receiver<RowsBuilt>,
    declined: &Mutex<HashMap<u64, Vec<HelperCpuRow>>>,
    pinned_refused: impl Fn() -> u64,
) -> Result<(), HelperError> {
    for built in answered {
        let mut cpu = lock(declined).remove(&built.id).unwrap_or_default();
        cpu.extend(
            built
                .cpu
                .iter()
                .map(|&(row, sample, device_row)| HelperCpuRow {
                    row,
                    sample,
                    device_row: device_row.map(|k| k as u32),
                }),
        );
        let reply = HelperReply {
            kind: Some(helper_reply::Kind::Built(HelperBuilt {
                id: built.id,
                ring: built.ring as u32,
                rows: built.rows,
                cpu,
                error: built.error.unwrap_or_default(),
                busy_ns: built.busy.as_nanos() as u64,
                pinned_refused: pinned_refused(),
            })),
        };
        write_message(&mut output, &reply)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_answer_carries_the_lanes_refused_pinned_allocations_so_far() {
        let (sent, answered) = crossbeam_channel::unbounded();
        for id in [3, 4] {
            sent.send(RowsBuilt {
                id,
                ring: 1,
                rows: vec![0],
                cpu: Vec::new(),
                error: None,
                busy: Duration::ZERO,
            })
            .unwrap();
        }
        drop(sent);
        let refused = std::sync::atomic::AtomicU64::new(2);
        let mut output = Vec::new();
        let counted = || refused.fetch_add(3, std::sync::atomic::Ordering::Relaxed);
        write_answers(&mut output, &answered, &Mutex::default(), counted).unwrap();
        let mut input = output.as_slice();
        let mut seen = Vec::new();
        while let Some(reply) = read_message::<HelperReply>(&mut input).unwrap() {
            let Some(helper_reply::Kind::Built(built)) = reply.kind else {
                panic!("not an answer: {reply:?}");
            };
            seen.push((built.id, built.pinned_refused));
        }
        assert_eq!(seen, vec![(3, 2), (4, 5)]);
    }

    #[test]
    fn a_fault_is_read_as_its_kind_and_count_or_named_wrong() {
        assert_eq!(fault_of("exit:3"), Ok((Fault::Exit, 3)));
        assert_eq!(fault_of(" garbage:0 "), Ok((Fault::Garbage, 0)));
        assert_eq!(fault_of("unsent"), Ok((Fault::Unsent, 0)));
        assert_eq!(fault_of("device-row:2"), Ok((Fault::DeviceRow, 2)));
        assert!(fault_of("crash:1").is_err_and(|e| e.contains("no fault \"crash\"")));
        assert!(fault_of("exit:x").is_err_and(|e| e.contains("not a count")));
    }
}
