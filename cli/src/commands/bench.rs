//! `stoker bench`: parses the settings of a bench and runs its harness (`stoker_cli::bench`).

use clap::Args;
use stoker_cli::bench::{
    coordinator::CoordinatorBench, coordinator_grpc::CoordinatorGrpcBench, formats::FormatsBench,
    pipeline, pipeline::PipelineBench, soak::client::SoakClient, soak::SoakBench,
    stall::StallBench, transport::TransportBench,
};

use super::JobArgs;

/// Arguments of `stoker bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Other benchmarks.
    #[command(subcommand)]
    pub which: Option<BenchKind>,
    #[command(flatten)]
    pub job: JobArgs,
    #[command(flatten)]
    pub pipeline: PipelineBench,
}

/// Benchmarks other than the end-to-end image pipeline.
#[derive(Debug, clap::Subcommand)]
pub enum BenchKind {
    /// Stall and buffered bytes of the prefetch controller against fixed depths, under a
    /// simulated training loop with constant, jittered and bursty step times.
    Stall(StallBench),
    /// Task assignments per second and memory of the coordinator core, driven in process by
    /// many simulated workers and ranks on one thread.
    Coordinator(CoordinatorBench),
    /// Task assignments per second of a real coordinator process over gRPC on loopback,
    /// driven by simulated workers and clients (each with its own connection), with the
    /// coordinator's CPU time and the lease calls' latency.
    CoordinatorGrpc(CoordinatorGrpcBench),
    /// Batch streaming throughput of the distributed mode's gRPC transport over loopback, beside
    /// a memcpy bandwidth measured in the same run.
    Transport(TransportBench),
    /// The distributed mode for N minutes under faults: a coordinator, three workers and two
    /// client processes on loopback; a random worker SIGKILLed every ~20 s, the coordinator
    /// every ~60 s; every epoch of every rank checked against the embedded loader (lost,
    /// duplicated, digest), and each process's memory and open descriptors fitted over time.
    /// Prints one JSON line.
    Soak(SoakBench),
    /// CPU per sample of peers' formats beside Stoker's own, side by side: the same images as
    /// tar shards and as MDS shards (plain, zstd), the same tokens as a token file, a Megatron
    /// corpus (with and without document boundaries) and an MDS token column; written into a
    /// temporary folder (whose cache tier, `STOKER_CACHE_DIR`, the run sets) and run in
    /// interleaved rounds.
    Formats(FormatsBench),
    /// One rank of `bench soak` (started by it).
    #[command(hide = true)]
    SoakClient(SoakClient),
}

/// Runs the command.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    use stoker_cli::bench::{coordinator, coordinator_grpc, formats, soak, stall, transport};
    match args.which {
        Some(BenchKind::Stall(bench)) => stall::run(&bench)?,
        Some(BenchKind::Coordinator(bench)) => coordinator::run(&bench)?,
        Some(BenchKind::CoordinatorGrpc(bench)) => coordinator_grpc::run(&bench)?,
        Some(BenchKind::Transport(bench)) => transport::run(&bench)?,
        Some(BenchKind::Soak(bench)) => soak::run(&bench)?,
        Some(BenchKind::Formats(bench)) => formats::run(&bench)?,
        Some(BenchKind::SoakClient(client)) => soak::client::run(&client)?,
        None => pipeline::run(&args.job.spec()?, &args.job.pipeline_name(), &args.pipeline)?,
    }
    Ok(())
}
