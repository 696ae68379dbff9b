//! `stoker-lane-helper`: the GPU decode lane in a process of its own. The loader starts it
//! (`STOKER_GPU_DECODE_HELPER`) and speaks to it over its stdin and stdout; it logs to stderr
//! and ends when its stdin does.

use std::process::ExitCode;

fn main() -> ExitCode {
    let arguments: Vec<_> = std::env::args_os().skip(1).collect();
    ExitCode::from(stoker_lane_helper::run(&arguments))
}
