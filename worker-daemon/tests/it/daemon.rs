//! The `stoker-worker` binary as a user runs it: its help, and its logs.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::process::Command;

#[test]
fn help_says_what_the_daemon_does() {
    let worker = Command::new(env!("CARGO_BIN_EXE_stoker-worker"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&worker.stdout);
    assert!(help.contains("decode worker daemon"), "{help}");
    assert!(!help.contains("epoch planner"), "{help}");
}

#[test]
fn logs_to_a_pipe_carry_no_colour_codes() {
    use std::io::Read;
    // Nothing listens on port 1: the worker logs its retries (warnings) to stderr, a pipe here.
    let mut child = Command::new(env!("CARGO_BIN_EXE_stoker-worker"))
        .args(["--coordinator", "127.0.0.1:1", "-v"])
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    child.kill().unwrap();
    child.wait().unwrap();
    let mut logged = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut logged)
        .unwrap();
    assert!(
        logged.contains("WARN") || logged.contains("INFO"),
        "{logged}"
    );
    assert!(!logged.contains('\u{1b}'), "escape codes in {logged:?}");
}
