//! A `Loader.from_dataset` worker process ends with its loader's process (killed, by the OOM
//! killer say), also in the middle of a sample that hangs: between samples the closed pipe
//! ends it, in one it would not. The watch is a native thread, which needs no interpreter lock:
//! a Python thread could not look while a sample runs C code that holds it (a regular
//! expression that backtracks for ever, a decoder looping on a corrupt file), and the worker
//! was left running with no parent.
//!
//! Under fork and spawn the loader's process is the worker's parent; under forkserver the
//! parent is the fork server, which stays as long as its workers do, so the loader's process
//! itself is looked at: gone, a zombie, or its pid taken by a process started later. A look
//! that cannot tell (no `/proc`, out of descriptors) ends nothing.

use std::io::ErrorKind;
use std::path::Path;
use std::time::Duration;

use pyo3::prelude::*;

/// Time between two looks.
const CHECK: Duration = Duration::from_millis(500);

/// What a look at a process finds.
#[derive(Debug, PartialEq, Eq)]
enum Started {
    /// Gone, or a zombie.
    Gone,
    /// Not known now.
    Unknown,
    /// Running, started at this `/proc` start time.
    At(Vec<u8>),
}

/// When process `pid` started, from `/proc/PID/stat` (or only whether it exists, without
/// `/proc`).
fn started_at(pid: i32) -> Started {
    if !Path::new("/proc/self").is_dir() {
        // SAFETY: kill with signal 0 sends nothing; it only checks that `pid` exists.
        let exists = unsafe { libc::kill(pid, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
        return if exists {
            Started::Unknown
        } else {
            Started::Gone
        };
    }
    let stat = match std::fs::read(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat,
        Err(error) if error.kind() == ErrorKind::NotFound => return Started::Gone,
        Err(_) => return Started::Unknown,
    };
    // The name before the last ")" may hold any bytes; after it: the state, then the start
    // time as the twentieth field.
    let after = stat
        .iter()
        .rposition(|&byte| byte == b')')
        .map_or(&stat[..], |end| &stat[end + 1..]);
    let fields: Vec<&[u8]> = after
        .split(|byte| byte.is_ascii_whitespace())
        .filter(|field| !field.is_empty())
        .collect();
    match fields.as_slice() {
        [state, ..] if *state == b"Z" => Started::Gone,
        fields if fields.len() >= 20 => Started::At(fields[19].to_vec()),
        _ => Started::Unknown,
    }
}

/// Whether the loader, found started at `born` when the watch began, is gone now.
fn gone(born: &Started, now: &Started) -> bool {
    match (born, now) {
        (_, Started::Gone) => true,
        (Started::At(then), Started::At(now)) => then != now,
        _ => false,
    }
}

/// `exit_with_loader(loader_pid)`: starts the watch in this worker process; it exits the
/// process (`_exit(0)`, nothing more runs) once its parent changes or the loader's process is
/// gone.
#[pyfunction]
pub(crate) fn exit_with_loader(loader_pid: i32) -> PyResult<()> {
    // SAFETY: getppid cannot fail and touches no memory.
    let parent = unsafe { libc::getppid() };
    let born = started_at(loader_pid);
    std::thread::Builder::new()
        .name("stoker-loader-watch".into())
        .spawn(move || {
            // SAFETY: as above.
            while unsafe { libc::getppid() } == parent && !gone(&born, &started_at(loader_pid)) {
                std::thread::sleep(CHECK);
            }
            // SAFETY: ends the process at once, as the watch means to; no Rust state is used
            // after it.
            unsafe { libc::_exit(0) }
        })?;
    Ok(())
}
