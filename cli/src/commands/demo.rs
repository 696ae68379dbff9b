//! `stoker demo`: the embedded loader feeding a simulated training step, with a line of
//! throughput and stall each second and a summary at the end.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use stoker_loader::{Dashboard, DashboardAccess, Loader, LoaderOptions, LoaderStats};
use stoker_proto::v1::{self as proto, JobSpec};
use stoker_rpc::security::Token;

use super::make_dataset::generate_with_progress;

/// Arguments of `stoker demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// ImageFolder root; without it a small sample set is made in the system temp folder.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// How long to run.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Simulated training step per batch, in milliseconds (time the "GPU" is busy).
    #[arg(long, default_value_t = 60.0)]
    pub step_ms: f64,
    /// Samples per batch.
    #[arg(long, default_value_t = 64)]
    pub batch_size: u32,
    /// Decode threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Images in the generated sample set.
    #[arg(long, default_value_t = 1000)]
    pub sample_images: u64,
    /// Serve the dashboard (live charts, /api/jobs, /metrics) on this address, e.g.
    /// 127.0.0.1:8321 (port 0: any free port; the URL is printed). Off loopback it needs
    /// --dashboard-token-file.
    #[arg(long, value_name = "ADDR")]
    pub dashboard: Option<SocketAddr>,
    /// A file holding the dashboard's credential, which the dashboard then asks for, on
    /// loopback too (open `/?token=CREDENTIAL` once, or send `Authorization: Bearer
    /// CREDENTIAL`).
    #[arg(long, value_name = "FILE", requires = "dashboard")]
    pub dashboard_token_file: Option<PathBuf>,
    /// Keep the dashboard serving this many seconds after the run ends.
    #[arg(long, default_value_t = 0.0, value_name = "SECONDS")]
    pub linger: f64,
}

/// Runs the command.
pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    if !(args.seconds > 0.0 && args.seconds.is_finite()) {
        anyhow::bail!("--seconds must be positive, got {}", args.seconds);
    }
    if !(args.step_ms >= 0.0 && args.step_ms.is_finite()) {
        anyhow::bail!("--step-ms must be zero or positive, got {}", args.step_ms);
    }
    if !(args.linger >= 0.0 && args.linger.is_finite()) {
        anyhow::bail!("--linger must be zero or positive, got {}", args.linger);
    }
    // Started first, so the page can be opened while the sample set is being made.
    let credentials = match &args.dashboard_token_file {
        Some(path) => vec![Token::read(path)?],
        None => Vec::new(),
    };
    let dashboard = args
        .dashboard
        .map(|address| {
            Dashboard::start_with(
                address,
                DashboardAccess {
                    credentials,
                    ..DashboardAccess::default()
                },
            )
        })
        .transpose()?;
    if let Some(dashboard) = &dashboard {
        println!("dashboard: {}", dashboard.url());
    }
    let data = match &args.data {
        Some(path) => path.clone(),
        None => {
            let path = std::env::temp_dir().join(format!("stoker-sample-{}", args.sample_images));
            let generated = generate_with_progress(&path, args.sample_images, 0)?;
            println!(
                "sample set: {} images in {}",
                generated.files,
                generated.root.display()
            );
            generated.root
        }
    };
    let spec = JobSpec {
        dataset: Some(proto::DatasetSource {
            uri: data.to_string_lossy().into_owned(),
            format: proto::DatasetFormat::Auto as i32,
            ..Default::default()
        }),
        pipeline: stoker_pipeline::presets::imagenet_train(224),
        batch_size: args.batch_size,
        seed: 0,
        shuffle: true,
        world_size: 1,
        ..JobSpec::default()
    };
    let loader = Loader::new(
        spec,
        LoaderOptions {
            threads: args.threads,
            ..LoaderOptions::default()
        },
    )?;
    if let Some(dashboard) = &dashboard {
        dashboard.register_job("demo", 0, loader.monitor());
    }
    println!(
        "demo: imagenet-train 224, batch {}, {} decode threads, prefetch auto (at most {}), simulated step {} ms, {} s",
        args.batch_size,
        loader.threads(),
        loader.prefetch(),
        args.step_ms,
        args.seconds
    );
    let started = Instant::now();
    let run_for = Duration::from_secs_f64(args.seconds);
    let step = Duration::from_secs_f64(args.step_ms / 1e3);
    let mut last_report = (Instant::now(), LoaderStats::default());
    let mut epoch = 0;
    'run: loop {
        let mut stream = loader.epoch(epoch, 0)?;
        while let Some(_batch) = stream.next_batch()? {
            // The "GPU" works on the batch; the loader keeps decoding meanwhile.
            std::thread::sleep(step);
            if last_report.0.elapsed() >= Duration::from_secs(1) {
                let now = loader.stats();
                let seconds = last_report.0.elapsed().as_secs_f64();
                let images = now.samples - last_report.1.samples;
                let waited = now.wait_s - last_report.1.wait_s;
                println!(
                    "t={:>5.1}s  epoch {epoch}  {:>6.0} images/s  stall {:>5.1}%  in flight {}  depth {}",
                    started.elapsed().as_secs_f64(),
                    images as f64 / seconds,
                    100.0 * waited / seconds,
                    now.in_flight,
                    now.prefetch_depth
                );
                last_report = (Instant::now(), now);
            }
            if started.elapsed() >= run_for {
                break 'run;
            }
        }
        epoch += 1;
    }
    let stats = loader.stats();
    println!(
        "summary: {} images in {:.1} s = {:.0} images/s, stall {:.1}% of the run, first batch {:.0} ms, {} bad samples",
        stats.samples,
        stats.elapsed_s,
        stats.samples_per_s,
        100.0 * stats.wait_s / stats.elapsed_s.max(1e-9),
        stats.first_batch_s.unwrap_or(0.0) * 1e3,
        stats.bad_samples
    );
    if let Some(dashboard) = &dashboard {
        if args.linger > 0.0 {
            println!(
                "dashboard: still serving {} for {} s",
                dashboard.url(),
                args.linger
            );
            std::thread::sleep(Duration::from_secs_f64(args.linger));
        }
    }
    Ok(())
}
