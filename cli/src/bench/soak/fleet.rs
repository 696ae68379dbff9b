//! The soak's processes: starting a daemon and reading the address it prints, killing one with
//! SIGKILL, and noticing one that died on its own.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::bench::{Error, Result};

/// How long a daemon may take to print its "listening on ADDR" line.
const BANNER_WAIT: Duration = Duration::from_secs(30);

/// A program and its arguments, kept to start it again after a kill.
#[derive(Debug, Clone)]
pub struct Recipe {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
}

/// One running incarnation of a process.
pub struct Running {
    child: Child,
    /// Its process id.
    pub pid: u32,
    /// Index of its readings in the soak's incarnation list.
    pub incarnation: usize,
}

impl Running {
    /// SIGKILLs it and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// `Some(status)` when it has exited on its own.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Takes its stdin (piped for clients), to close it later.
    pub fn take_stdin(&mut self) -> Option<ChildStdin> {
        self.child.stdin.take()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts a daemon and returns it with the address from its first line ("... listening on
/// ADDR ..."). Its stderr goes to `log` (appended); the rest of its stdout is discarded.
pub fn start_daemon(recipe: &Recipe, log: &std::fs::File) -> Result<(Child, String)> {
    let mut child = Command::new(&recipe.program)
        .args(&recipe.args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log.try_clone()?)
        .spawn()
        .map_err(|e| {
            Error::Failed(format!(
                "cannot start {}: {e}",
                recipe.program.to_string_lossy()
            ))
        })?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| Error::Failed("daemon stdout was not piped".into()))?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        let _ = reader.read_line(&mut line);
        let _ = tx.send(line);
        // Keep draining so a chatty daemon never blocks on a full pipe.
        let mut rest = String::new();
        while matches!(reader.read_line(&mut rest), Ok(n) if n > 0) {
            rest.clear();
        }
    });
    let line = match rx.recv_timeout(BANNER_WAIT) {
        Ok(line) if !line.is_empty() => line,
        _ => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Error::Failed(format!(
                "{} printed no address within {BANNER_WAIT:?} (see its log)",
                recipe.program.to_string_lossy()
            )));
        }
    };
    let address = banner_address(&line).ok_or_else(|| {
        Error::Failed(format!(
            "no 'listening on ADDR' in {:?} from {}",
            line.trim(),
            recipe.program.to_string_lossy()
        ))
    })?;
    Ok((child, address))
}

/// The word after "on" in a daemon's first line.
fn banner_address(line: &str) -> Option<String> {
    let mut words = line.split_whitespace();
    words.find(|w| *w == "on")?;
    words.next().map(str::to_string)
}

/// Wraps a started child as an incarnation.
pub fn running(child: Child, incarnation: usize) -> Running {
    Running {
        pid: child.id(),
        child,
        incarnation,
    }
}

/// The `stoker-worker` binary: `STOKER_WORKER_BIN`, else beside this executable.
pub fn worker_binary() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("STOKER_WORKER_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe()?;
    let beside = exe.with_file_name("stoker-worker");
    if beside.is_file() {
        Ok(beside)
    } else {
        Err(Error::Failed(format!(
            "no stoker-worker beside {} (build it with `cargo build --release -p stoker-worker-daemon`, \
             or set STOKER_WORKER_BIN)",
            exe.display()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::banner_address;

    #[test]
    fn the_address_is_the_word_after_on() {
        assert_eq!(
            banner_address("stoker coordinator listening on 127.0.0.1:7070 dashboard x\n"),
            Some("127.0.0.1:7070".into())
        );
        assert_eq!(banner_address("listening nowhere"), None);
        assert_eq!(banner_address("listening on"), None);
    }
}
