//! The `stoker` command: demo, bench, digest, inspect, convert, make-dataset and the
//! coordinator daemon, over the loader, the coordinator and the datasets crates; the bench
//! harnesses are the `stoker_cli` library.

mod commands;

use std::process::ExitCode;

use clap::Parser;

// Rust's allocations go to jemalloc: see the `stoker-alloc` crate.
use stoker_alloc as _;

fn main() -> ExitCode {
    let args = commands::Cli::parse();
    commands::init_logging(args.verbose);
    match commands::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
