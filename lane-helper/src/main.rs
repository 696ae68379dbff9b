//! `stoker-lane-helper`: the GPU decode lane in a process of its own. The loader starts it
//! (`STOKER_GPU_DECODE_HELPER`) and speaks to it over its stdin and stdout; it logs to stderr
//! and ends when its stdin does.

use std::process::ExitCode;

fn main() -> ExitCode {
    if std::env::args().nth(1).is_some() {
        eprintln!(
            "stoker-lane-helper takes no arguments: a Stoker loader starts it and speaks to it \
             over its stdin and stdout (STOKER_GPU_DECODE_HELPER=1)"
        );
        return ExitCode::from(2);
    }
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let stdin = std::io::stdin().lock();
    match stoker_lane_helper::serve(stdin, std::io::stdout()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "the lane's helper stops");
            eprintln!("stoker-lane-helper: {error}");
            ExitCode::FAILURE
        }
    }
}
