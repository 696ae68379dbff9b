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
    if args.ends_with_its_reader() {
        // SAFETY: signal() with SIG_DFL installs no handler; this runs before any thread starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    commands::init_logging(args.verbose);
    match commands::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", in_words(&error));
            ExitCode::FAILURE
        }
    }
}

/// `error` and its causes joined by `: `, each cause left out when the words before already
/// hold it (an error whose message quotes its source, as many library errors do).
fn in_words(error: &anyhow::Error) -> String {
    let mut words = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !words.contains(&cause) {
            words.push_str(": ");
            words.push_str(&cause);
        }
    }
    words
}
