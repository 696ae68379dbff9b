//! The helper process: started and its start answered ([`spawn`]), its buffers opened here
//! ([`open_device`]), its answers read ([`read_answers`]) and their wait watched
//! ([`watch_answers`]).

use std::io::{BufReader, BufWriter, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use stoker_proto::v1::{
    helper_reply, helper_request, HelperEnd, HelperReply, HelperRequest, HelperStart, HelperStarted,
};

use super::inner::{end, lock, reap, Inner};
use super::rows::DeviceSide;
use super::wire::{read_answer, tail_message, write_message, HELPER_PROTOCOL};
use super::HelperOptions;
use crate::decode::lane::IPC_HANDLE_BYTES;
use crate::decode::{GpuDecodeError, GpuDecodeOptions, RowTail};

/// A helper that said it runs: the process, its stdin and stdout, and its start's answer.
pub(super) struct Spawned {
    pub(super) child: Child,
    pub(super) requests: BufWriter<ChildStdin>,
    pub(super) answers: BufReader<ChildStdout>,
    pub(super) started: HelperStarted,
}

/// Stops a helper that did not start, for `why`.
pub(super) fn failed(child: &mut Child, why: String) -> GpuDecodeError {
    let _ = end(child, Duration::ZERO);
    GpuDecodeError::Unsupported(format!("the lane's helper process: {why}"))
}

/// Starts the helper for rows of `size` (height, width) made `tail`, batches of up to
/// `batch_size`, and waits (within the start timeout) for it to say it runs.
pub(super) fn spawn(
    options: &GpuDecodeOptions,
    helper: &HelperOptions,
    (height, width): (u32, u32),
    batch_size: usize,
    tail: &RowTail,
) -> Result<Spawned, GpuDecodeError> {
    let mut command = Command::new(&helper.binary);
    // SAFETY: the closure makes one system call (async-signal-safe) between fork and exec.
    unsafe {
        command.pre_exec(|| {
            // What this process opened without CLOEXEC (a library's socket, say) closes at the
            // exec instead of living on in the helper; 0-2 are the helper's own. Before Linux
            // 5.11 (no CLOSE_RANGE_CLOEXEC), or where seccomp refuses the call, it fails, the
            // failure is ignored, and the helper inherits them.
            libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            Ok(())
        });
    }
    // In a process group of its own: a Ctrl-C meant for the training script (which may catch
    // it and go on) does not end the lane; the helper ends when its stdin does.
    let mut child = command
        .process_group(0)
        .env(
            super::wire::LOADER_PID_VARIABLE,
            std::process::id().to_string(),
        )
        .envs(helper.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| {
            GpuDecodeError::Unsupported(format!(
                "starting the lane's helper {}: {e}",
                helper.binary.display()
            ))
        })?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(failed(&mut child, "its pipes were not made".into()));
    };
    let mut requests = BufWriter::with_capacity(1 << 20, stdin);
    let start = HelperRequest {
        kind: Some(helper_request::Kind::Start(HelperStart {
            protocol: HELPER_PROTOCOL,
            device: options.device as u32,
            memory_bytes: options.memory_bytes as u64,
            height,
            width,
            batch_rows: batch_size as u32,
            library_dirs: options
                .library_dirs
                .iter()
                .map(|dir| dir.to_string_lossy().into_owned())
                .collect(),
            // The room left in this process's budget: the helper keeps to a limit within it.
            pinned_budget: options
                .pinned_budget
                .map(|budget| budget.saturating_sub(stoker_loader::pinned_reserved())),
            tail: Some(tail_message(tail)),
        })),
    };
    if let Err(error) = without_sigpipe(|| write_message(&mut requests, &start)) {
        discard(requests);
        return Err(failed(&mut child, format!("sending its start: {error}")));
    }
    let (answered, answer) = crossbeam_channel::bounded(1);
    let first = std::thread::Builder::new()
        .name("stoker-lane-helper-start".into())
        .spawn(move || {
            let mut stdout = BufReader::with_capacity(1 << 16, stdout);
            let reply = read_answer(&mut stdout);
            let _ = answered.send((reply, stdout));
        })
        .map_err(|e| failed(&mut child, format!("a thread for it: {e}")))?;
    let (reply, stdout) = match answer.recv_timeout(helper.start_timeout) {
        Ok(answer) => answer,
        Err(_) => {
            let error = failed(
                &mut child,
                format!("no answer to its start in {:?}", helper.start_timeout),
            );
            let _ = first.join();
            return Err(error);
        }
    };
    let _ = first.join();
    let started = match reply {
        Ok(Some(HelperReply {
            kind: Some(helper_reply::Kind::Started(started)),
        })) => started,
        Ok(Some(_)) => {
            return Err(failed(
                &mut child,
                "its first answer was not a start".into(),
            ))
        }
        Ok(None) => {
            let status = end(&mut child, Duration::from_secs(5));
            return Err(GpuDecodeError::Unsupported(format!(
                "the lane's helper process ended before it started ({})",
                status.unwrap_or_default()
            )));
        }
        Err(error) => return Err(failed(&mut child, format!("reading its start: {error}"))),
    };
    if !started.error.is_empty() {
        // It ends by itself once it has said why; within 5 s, or it is killed.
        let _ = end(&mut child, Duration::from_secs(5));
        return Err(GpuDecodeError::Unsupported(format!(
            "the lane's helper process cannot run the lane: {}",
            started.error
        )));
    }
    Ok(Spawned {
        child,
        requests,
        answers: stdout,
        started,
    })
}

/// Opens the helper's buffers named in `started`.
pub(super) fn open_device(
    device: usize,
    started: &HelperStarted,
) -> Result<DeviceSide, GpuDecodeError> {
    let handle: &[u8; IPC_HANDLE_BYTES] =
        started.ring_handle.as_ref().try_into().map_err(|_| {
            GpuDecodeError::Unsupported(format!(
                "an IPC handle of {} bytes, not {IPC_HANDLE_BYTES}",
                started.ring_handle.len()
            ))
        })?;
    DeviceSide::open(
        device,
        &started.device_uuid,
        handle,
        (
            started.ring_slots as usize,
            started.ring_slot_bytes as usize,
        ),
    )
}

/// Whether a helper's start answer `started` describes output buffers this loader can read:
/// rows of the tail's element type, 1 to [`MOST_RING_SLOTS`] buffers each holding a row at least
/// and no more than a batch of `batch_size` rows of `row_bytes` (rounded up to 4 KiB); else why
/// not. Checked before anything is opened or allocated from it.
pub(super) fn check_started(
    started: &HelperStarted,
    (element, row_bytes): (&str, usize),
    batch_size: usize,
) -> Result<(), String> {
    if !started.device {
        return Ok(());
    }
    if started.rows_dtype != element {
        return Err(format!(
            "its rows are {}, where this loader reads {element}",
            started.rows_dtype
        ));
    }
    if !(1..=MOST_RING_SLOTS).contains(&started.ring_slots) {
        return Err(format!("it names {} output buffers", started.ring_slots));
    }
    let most = batch_size
        .saturating_mul(row_bytes)
        .div_ceil(4096)
        .saturating_mul(4096);
    let slot = usize::try_from(started.ring_slot_bytes).unwrap_or(usize::MAX);
    if slot < row_bytes || slot > most {
        return Err(format!(
            "its output buffers are {slot} bytes, where a row is {row_bytes} and a batch {most} \
             at most"
        ));
    }
    Ok(())
}

/// The most output buffers a helper may name (its lane plans 2 to 8).
const MOST_RING_SLOTS: u32 = 8;

/// The reader's thread: finishes each batch the helper answers; once its stdout ends (or says
/// something out of step), takes it as lost and builds what it owed on the CPU.
pub(super) fn read_answers(inner: &Arc<Inner>, stdout: BufReader<ChildStdout>) {
    let mut stdout = stdout;
    let why = loop {
        let built = match read_answer(&mut stdout) {
            Ok(Some(HelperReply {
                kind: Some(helper_reply::Kind::Built(built)),
            })) => built,
            Ok(Some(_)) => break "it answered out of step".to_string(),
            Ok(None) => break OUTPUT_ENDED.to_string(),
            Err(error) => break format!("reading its answers: {error}"),
        };
        inner
            .pinned_refused
            .fetch_max(built.pinned_refused, Ordering::Relaxed);
        let Some(pending) = inner.take_pending(built.id) else {
            if inner.closed.load(Ordering::Relaxed) {
                // A batch failed as stopped when the lane shut down.
                continue;
            }
            break format!("it answered batch {}, which was not sent", built.id);
        };
        if built.ring as usize != pending.ring {
            let ring = pending.ring;
            inner.add_pending(built.id, pending);
            break format!(
                "it answered batch {} in output buffer {}, not {ring}",
                built.id, built.ring
            );
        }
        let reply = pending.reply.clone();
        let built = match inner.closed.load(Ordering::Relaxed) {
            // No one waits for it: its rows are not copied or built.
            true => inner.stopped(pending),
            false => inner.finish(pending, Some(built)),
        };
        let _ = reply.send(built);
    };
    // Once the lane is closed, the shutdown reaps it.
    if !inner.closed.load(Ordering::Relaxed) {
        if why == OUTPUT_ENDED {
            // Its output ends as it exits: the loss names how it ended, not the kill that
            // would otherwise find it still tearing down.
            let _ = reap(&mut lock(&inner.child), EXIT_GRACE);
        }
        inner.lose(why);
    }
    inner.drain();
}

/// Why a helper whose stdout closed is lost.
const OUTPUT_ENDED: &str = "its output ended";

/// How long a helper whose output ended is given to finish exiting before it is killed.
const EXIT_GRACE: Duration = Duration::from_millis(500);

/// The watch's thread: takes the helper as lost when a batch has waited for its answer longer
/// than the answer timeout, this process running: a wait counts from the end of a pause of the
/// process (stopped with Ctrl-Z or SIGSTOP, a suspended job or machine), which this thread
/// sees as a sleep that lasted far longer than asked. The helper, in a process group of its
/// own, answered meanwhile, and a helper healthy all along was killed as the process went on.
pub(super) fn watch_answers(inner: &Arc<Inner>) {
    let mut counted_from = Instant::now();
    while !inner.closed.load(Ordering::Relaxed) && lock(&inner.lost).is_none() {
        let oldest = lock(&inner.pending)
            .values()
            .map(|p| p.sent_at.elapsed().min(counted_from.elapsed()))
            .max();
        if let Some(waited) = oldest.filter(|&w| w > inner.answer_timeout) {
            inner.lose(format!(
                "no answer to a batch in {:.1} s",
                waited.as_secs_f64()
            ));
            return;
        }
        let slept_from = Instant::now();
        std::thread::sleep(Duration::from_millis(50));
        if slept_from.elapsed() > PAUSED {
            counted_from = Instant::now();
        }
    }
}

/// A sleep of the watch's this much longer than asked is a pause of the process.
const PAUSED: Duration = Duration::from_secs(1);

/// Runs `write` with SIGPIPE blocked on this thread, so that a write to a helper that died
/// fails (`EPIPE`) instead of ending this process, whatever the process does with SIGPIPE
/// (Rust and Python ignore it, but a training script may have set it back to its default).
/// The SIGPIPE such a write raises is taken before the thread's mask is put back.
pub(super) fn without_sigpipe<T>(write: impl FnOnce() -> T) -> T {
    // SAFETY: signal sets are plain values set up by the calls that take them; the mask is
    // this thread's, and put back as it was.
    unsafe {
        let mut pipe: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut pipe);
        libc::sigaddset(&mut pipe, libc::SIGPIPE);
        let mut before: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &pipe, &mut before);
        let pending_before = sigpipe_pending();
        let result = write();
        if !pending_before && sigpipe_pending() {
            let now = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            libc::sigtimedwait(&pipe, std::ptr::null_mut(), &now);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
        result
    }
}

/// Closes the helper's stdin without writing what a failed write left buffered (dropping the
/// writer would try again, outside [`without_sigpipe`]).
pub(super) fn discard(requests: BufWriter<ChildStdin>) {
    let (stdin, _unwritten) = requests.into_parts();
    drop(stdin);
}

/// Tells the helper the loader is done with it and closes its stdin: the helper ends at either.
/// The end is said because the stdin does not close while a process forked from this one
/// (without an exec) holds a copy of it. It waits for room in the pipe until `deadline` at
/// most (a helper still reading the last batches makes room; one that stopped reading is
/// killed at the deadline anyway), and a frame a failed write left unfinished is not followed
/// by another.
pub(super) fn end_and_close(requests: BufWriter<ChildStdin>, deadline: std::time::Instant) {
    let (stdin, unwritten) = requests.into_parts();
    if unwritten.is_ok_and(|bytes| bytes.is_empty()) {
        let mut frame = Vec::new();
        let end = HelperRequest {
            kind: Some(helper_request::Kind::End(HelperEnd {})),
        };
        let fd = stdin.as_raw_fd();
        // SAFETY: flag calls on the descriptor `stdin` owns, which closes below.
        let nonblocking = unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
        };
        if nonblocking && write_message(&mut frame, &end).is_ok() {
            // A few bytes, under the pipe's atomic size: written whole or not at all.
            let written = loop {
                let written = without_sigpipe(|| (&stdin).write(&frame));
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                match &written {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && !left.is_zero() => {
                        let mut room = libc::pollfd {
                            fd,
                            events: libc::POLLOUT,
                            revents: 0,
                        };
                        let wait = left.as_millis().clamp(1, 100) as libc::c_int;
                        // SAFETY: one descriptor this function owns, for at most `wait` ms.
                        unsafe { libc::poll(&mut room, 1, wait) };
                    }
                    _ => break written,
                }
            };
            if !written.as_ref().is_ok_and(|&n| n == frame.len()) {
                tracing::debug!(
                    ?written,
                    "the lane's helper was not told the end; its stdin closes"
                );
            }
        }
    }
    drop(stdin);
}

/// Whether a SIGPIPE is pending for this thread (or the process).
fn sigpipe_pending() -> bool {
    // SAFETY: as above.
    unsafe {
        let mut pending: libc::sigset_t = std::mem::zeroed();
        libc::sigpending(&mut pending);
        libc::sigismember(&pending, libc::SIGPIPE) == 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::process::ExitStatusExt;

    /// A start answer out of step with this loader (another build, a damaged pipe) set up
    /// its buffers from unchecked numbers: events and a device allocation per named buffer,
    /// rows of another element type read as this loader's.
    #[test]
    fn a_start_answer_out_of_step_is_refused_before_anything_is_opened() {
        let row = 3 * 32 * 32;
        let good = HelperStarted {
            device: true,
            rows_dtype: "uint8".into(),
            ring_slots: 4,
            ring_slot_bytes: (8 * row) as u64,
            ..HelperStarted::default()
        };
        assert_eq!(check_started(&good, ("uint8", row), 8), Ok(()));
        let cases = [
            (
                HelperStarted {
                    rows_dtype: "float16".into(),
                    ..good.clone()
                },
                "float16",
            ),
            (
                HelperStarted {
                    ring_slots: 0,
                    ..good.clone()
                },
                "0 output buffers",
            ),
            (
                HelperStarted {
                    ring_slots: u32::MAX,
                    ..good.clone()
                },
                "output buffers",
            ),
            (
                HelperStarted {
                    ring_slot_bytes: 10,
                    ..good.clone()
                },
                "10 bytes",
            ),
            (
                HelperStarted {
                    ring_slot_bytes: u64::MAX,
                    ..good.clone()
                },
                "a batch",
            ),
        ];
        for (started, named) in cases {
            let why = check_started(&started, ("uint8", row), 8).unwrap_err();
            assert!(why.contains(named), "{why}");
        }
        // Without a device no buffer is opened: nothing to check.
        let deviceless = HelperStarted {
            device: false,
            ring_slots: 0,
            ..good
        };
        assert_eq!(check_started(&deviceless, ("uint8", row), 8), Ok(()));
    }

    const CHILD: &str = "STOKER_TEST_SIGPIPE_CHILD";
    const NAME: &str = "decode::helper::process::tests::a_write_to_a_helper_that_ended_fails_and_this_process_lives_on";

    /// In a child process of this test, with SIGPIPE at its default (as a training script may
    /// set it): writes to a pipe whose reader has ended, then closes a writer whose flush
    /// failed with a frame in it; `mode` says which of the two are guarded ("guarded": both;
    /// "write": neither; "drop": the write only).
    fn write_to_an_ended_reader(mode: &str) {
        // SAFETY: sets this (child) process's disposition before any other thread writes.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        let mut reader = Command::new("true").stdin(Stdio::piped()).spawn().unwrap();
        let mut stdin = reader.stdin.take().unwrap();
        reader.wait().unwrap();
        let bytes = vec![0u8; 1 << 20];
        let written = match mode {
            "write" => stdin.write_all(&bytes),
            _ => without_sigpipe(|| stdin.write_all(&bytes)),
        };
        assert_eq!(written.unwrap_err().kind(), std::io::ErrorKind::BrokenPipe);
        assert!(
            !sigpipe_pending(),
            "the signal the write raised was left pending"
        );
        let mut requests = BufWriter::with_capacity(1 << 16, stdin);
        let flushed = without_sigpipe(|| {
            requests.write_all(b"a frame")?;
            requests.flush()
        });
        assert_eq!(flushed.unwrap_err().kind(), std::io::ErrorKind::BrokenPipe);
        match mode {
            "drop" => drop(requests),
            _ => discard(requests),
        }
    }

    #[test]
    fn a_write_to_a_helper_that_ended_fails_and_this_process_lives_on() {
        if let Ok(mode) = std::env::var(CHILD) {
            write_to_an_ended_reader(&mode);
            return;
        }
        let run = |mode: &str| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", NAME, "--nocapture"])
                .env(CHILD, mode)
                .output()
                .unwrap()
        };
        let guarded = run("guarded");
        assert!(
            guarded.status.success(),
            "{:?}: {}",
            guarded.status,
            String::from_utf8_lossy(&guarded.stdout)
        );
        // Unguarded, the write ends the process, and so does a writer dropped with a frame in
        // it: the test reaches what it guards against.
        for mode in ["write", "drop"] {
            let unguarded = run(mode);
            assert_eq!(unguarded.status.signal(), Some(libc::SIGPIPE), "{mode}");
        }
    }
}
