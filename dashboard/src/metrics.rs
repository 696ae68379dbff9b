//! `/metrics`: every job's figures in the Prometheus text exposition format (version 0.0.4),
//! labelled `stoker_job` and `rank` (not `job`, which Prometheus gives every series it scrapes
//! and would rename ours to `exported_job`). Counters come from the newest reading's totals;
//! gauges from the newest point, so they agree with the JSON API. Every label takes a bounded
//! set of values per job.

use std::fmt::Write;

use super::series::{JobSeries, Registry, STAGES};

/// The `Content-Type` of the text format.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A family's samples for one job: an optional extra label and the value (`None`: not known,
/// left out).
type Samples = Vec<(Option<(&'static str, String)>, Option<f64>)>;

/// One metric family: its name, type, help, and how to read its samples off a job.
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    samples: fn(&JobSeries) -> Samples,
}

/// The newest reading's GPU decode lane figures, for jobs that have a lane.
fn lane(job: &JobSeries) -> Option<&crate::GpuDecodeFigures> {
    job.latest
        .as_ref()
        .and_then(|s| s.stats.gpu_decode.as_ref())
}

/// The newest reading's prefetch controller view, for jobs in automatic prefetch.
fn controller(job: &JobSeries) -> Option<crate::ControllerSnapshot> {
    job.latest.as_ref().and_then(|s| s.controller)
}

/// A sample with only the job labels.
fn one(value: Option<f64>) -> Samples {
    vec![(None, value)]
}

/// [`one`], left out while the job's newest reading is of a remote client whose reports
/// stopped: its shares of time and its rates are unknown then.
fn one_unless_silent(job: &JobSeries, value: Option<f64>) -> Samples {
    let silent = job.points.back().is_some_and(|p| p.report_age_s.is_some());
    if silent {
        Vec::new()
    } else {
        one(value)
    }
}

const FAMILIES: &[Family] = &[
    Family {
        name: "stoker_stall_ratio",
        kind: "gauge",
        help: "Share of the last sampling interval the trainer spent waiting for a batch (absent for a remote client whose reports stopped).",
        samples: |job| {
            one_unless_silent(
                job,
                job.points.back().and_then(|p| p.stall_pct).map(|p| p / 100.0),
            )
        },
    },
    Family {
        name: "stoker_stall_ratio_window",
        kind: "gauge",
        help: "Share of the last 10 seconds the trainer spent waiting for a batch (absent for a remote client whose reports stopped).",
        samples: |job| {
            let window = job
                .points
                .len()
                .checked_sub(1)
                .map(|end| job.window_ending(end));
            one_unless_silent(job, window.and_then(|w| w.stall_pct).map(|p| p / 100.0))
        },
    },
    Family {
        name: "stoker_wait_seconds_total",
        kind: "counter",
        help: "Seconds the trainer spent waiting inside next() since the loader started.",
        samples: |job| one(job.latest.as_ref().map(|s| s.stats.wait_s)),
    },
    Family {
        name: "stoker_run_seconds_total",
        kind: "counter",
        help: "Seconds since the loader's first epoch started (divide wait by this for the stall share).",
        samples: |job| one(job.latest.as_ref().map(|s| s.stats.elapsed_s)),
    },
    Family {
        name: "stoker_gpu_idle_ratio",
        kind: "gauge",
        help: "Share of the GPU's time over the last sampling interval its stream sat idle waiting for a batch (measured with CUDA events; absent where nothing measures it, and for a remote client whose reports stopped).",
        samples: |job| {
            let idle = job.points.back().and_then(|p| p.gpu_idle_pct);
            one_unless_silent(job, idle.map(|p| p / 100.0))
        },
    },
    Family {
        name: "stoker_gpu_idle_seconds_total",
        kind: "counter",
        help: "Seconds the GPU's stream sat idle waiting for a batch since the loader started.",
        samples: |job| one(job.latest.as_ref().map(|s| s.stats.gpu_idle_s)),
    },
    Family {
        name: "stoker_gpu_measured_seconds_total",
        kind: "counter",
        help: "Seconds of GPU time over which the GPU idle was measured (divide idle by this for its share).",
        samples: |job| one(job.latest.as_ref().map(|s| s.stats.gpu_span_s)),
    },
    Family {
        name: "stoker_gpu_lane_cost_seconds_total",
        kind: "counter",
        help: "Seconds the GPU's stream was busier on steps beside the GPU decode lane's work than on steps with the lane quiet, since the loader started (0 until quiet steps give a baseline).",
        samples: |job| one(job.latest.as_ref().map(|s| s.stats.gpu_lane_cost_s)),
    },
    Family {
        name: "stoker_gpu_decode_share_ratio",
        kind: "gauge",
        help: "Share of each batch offered to the GPU decode lane in the newest epoch (jobs with a lane only).",
        samples: |job| one(lane(job).map(|l| l.split_pct / 100.0)),
    },
    Family {
        name: "stoker_decode_rows_per_second",
        kind: "gauge",
        help: "Rows per second each decode lane built while it worked (lane=\"gpu\" or \"cpu\"; jobs with a GPU lane only).",
        samples: |job| match lane(job) {
            Some(l) => vec![
                (Some(("lane", "gpu".to_string())), Some(l.gpu_rows_per_s)),
                (Some(("lane", "cpu".to_string())), Some(l.cpu_rows_per_s)),
            ],
            None => Vec::new(),
        },
    },
    Family {
        name: "stoker_gpu_decode_memory_bytes",
        kind: "gauge",
        help: "Device bytes the GPU decode lane holds (jobs with a lane only).",
        samples: |job| one(lane(job).map(|l| l.memory_bytes as f64)),
    },
    Family {
        name: "stoker_gpu_decode_memory_cap_bytes",
        kind: "gauge",
        help: "The most device memory the GPU decode lane may hold (gpu_memory).",
        samples: |job| one(lane(job).map(|l| l.memory_cap as f64)),
    },
    Family {
        name: "stoker_samples_per_second",
        kind: "gauge",
        help: "Samples yielded per second over the last 10 seconds (absent for a remote client whose reports stopped).",
        samples: |job| one_unless_silent(job, job.points.back().and_then(|p| p.samples_per_s)),
    },
    Family {
        name: "stoker_samples_total",
        kind: "counter",
        help: "Samples yielded since the loader started.",
        samples: |job| one(job.latest.as_ref().map(|s| s.stats.samples as f64)),
    },
    Family {
        name: "stoker_batches_total",
        kind: "counter",
        help: "Batches yielded since the loader started.",
        samples: |job| one(job.latest.as_ref().map(|s| s.stats.batches as f64)),
    },
    Family {
        name: "stoker_bad_samples_total",
        kind: "counter",
        help: "Unreadable samples replaced under the skip policy.",
        samples: |job| one(job.latest.as_ref().map(|s| s.stats.bad_samples as f64)),
    },
    Family {
        name: "stoker_stage_seconds_total",
        kind: "counter",
        help: "Decode-thread seconds spent in each pipeline stage.",
        samples: |job| {
            let stats = job.latest.as_ref().map(|s| &s.stats);
            let values = stats.map(|s| [s.read_s, s.decode_s, s.augment_s, s.assemble_s]);
            STAGES
                .iter()
                .enumerate()
                .map(|(index, stage)| {
                    (
                        Some(("stage", (*stage).to_string())),
                        values.map(|v| v[index]),
                    )
                })
                .collect()
        },
    },
    Family {
        name: "stoker_prefetch_depth",
        kind: "gauge",
        help: "Batches the loader may keep in flight (absent for a remote client whose reports stopped).",
        samples: |job| {
            one_unless_silent(job, job.latest.as_ref().map(|s| s.stats.prefetch_depth as f64))
        },
    },
    Family {
        name: "stoker_in_flight_batches",
        kind: "gauge",
        help: "Batches being built (absent for a remote client whose reports stopped).",
        samples: |job| {
            one_unless_silent(job, job.latest.as_ref().map(|s| s.stats.in_flight as f64))
        },
    },
    Family {
        name: "stoker_batch_latency_seconds",
        kind: "gauge",
        help: "Smoothed time from requesting a batch to its arrival (automatic prefetch only; absent for a remote client whose reports stopped).",
        samples: |job| {
            one_unless_silent(job, controller(job).map(|c| c.latency_mean.as_secs_f64()))
        },
    },
    Family {
        name: "stoker_trainer_step_seconds",
        kind: "gauge",
        help: "Smoothed time the trainer spends between next() calls (automatic prefetch only; absent for a remote client whose reports stopped).",
        samples: |job| one_unless_silent(job, controller(job).map(|c| c.step_mean.as_secs_f64())),
    },
    Family {
        name: "stoker_decode_threads",
        kind: "gauge",
        help: "Decode threads of the loader.",
        samples: |job| one(job.latest.as_ref().map(|s| s.threads as f64)),
    },
    Family {
        name: "stoker_decode_busy_ratio",
        kind: "gauge",
        help: "Share of the decode threads' time spent working over the last 10 seconds (absent for a remote client whose reports stopped).",
        samples: |job| {
            one_unless_silent(job, job.points.back().and_then(|p| p.busy_pct).map(|p| p / 100.0))
        },
    },
    Family {
        name: "stoker_batch_slots_in_use",
        kind: "gauge",
        help: "Batch buffers in use (in flight, waiting, or held by the trainer).",
        samples: |job| one(job.latest.as_ref().map(|s| s.slots_in_use as f64)),
    },
    Family {
        name: "stoker_batch_slots",
        kind: "gauge",
        help: "Batch buffers that may exist.",
        samples: |job| one(job.latest.as_ref().map(|s| s.slot_capacity as f64)),
    },
    Family {
        name: "stoker_verdict",
        kind: "gauge",
        help: "1 for what holds the job back over the last 10 seconds, as the page says it (\"silent\" while a remote client's reports have stopped).",
        samples: |job| match job.points.len().checked_sub(1) {
            Some(end) => vec![(
                Some(("verdict", job.window_ending(end).verdict.label())),
                Some(1.0),
            )],
            None => Vec::new(),
        },
    },
    Family {
        name: "stoker_report_age_seconds",
        kind: "gauge",
        help: "Seconds since a remote client's last report, while its reports have stopped (absent otherwise).",
        samples: |job| one(job.points.back().and_then(|p| p.report_age_s)),
    },
];

/// The whole exposition.
pub(crate) fn render(registry: &Registry) -> String {
    let mut out = String::new();
    for family in FAMILIES {
        // Writing to a String cannot fail.
        let _ = writeln!(out, "# HELP {} {}", family.name, family.help);
        let _ = writeln!(out, "# TYPE {} {}", family.name, family.kind);
        for job in &registry.jobs {
            for (extra, value) in (family.samples)(job) {
                let Some(value) = value.filter(|v| v.is_finite()) else {
                    continue;
                };
                let _ = write!(
                    out,
                    "{}{{stoker_job=\"{}\",rank=\"{}\"",
                    family.name,
                    escape(&job.name),
                    job.rank
                );
                if let Some((label, label_value)) = extra {
                    let _ = write!(out, ",{label}=\"{}\"", escape(&label_value));
                }
                let _ = writeln!(out, "}} {value}");
            }
        }
    }
    if let Some(shares) = &registry.shares {
        render_shares(&mut out, shares);
    }
    if let Some((workers, wanted)) = registry.fleet {
        let families = [
            ("stoker_workers", "Worker daemons registered and alive.", workers),
            (
                "stoker_workers_wanted",
                "Workers the clients' demand wants: 1.2 x the batches/s they would take if never kept waiting, over what one worker builds per busy second (an autoscaling target).",
                wanted,
            ),
        ];
        for (name, help, value) in families {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            let _ = writeln!(out, "{name} {value}");
        }
    }
    out
}

/// The coordinator's families: each job's share of the workers, labelled `stoker_job` alone.
fn render_shares(out: &mut String, shares: &[super::JobShare]) {
    type Read = fn(&super::JobShare) -> Option<f64>;
    let families: [(&str, &str, &str, Read); 5] = [
        (
            "stoker_job_weight",
            "gauge",
            "The job's weight against other jobs waiting for workers (capped by --max-job-weight).",
            |s| Some(f64::from(s.weight)),
        ),
        (
            "stoker_job_leases_total",
            "counter",
            "Tasks (batches) leased to the job's sessions since the coordinator started.",
            |s| Some(s.leases as f64),
        ),
        (
            "stoker_job_lease_fraction",
            "gauge",
            "The job's share of all tasks leased over the last interval, 0 to 1.",
            |s| s.lease_fraction,
        ),
        (
            "stoker_job_waiting_sessions",
            "gauge",
            "The job's sessions whose clients wait for batches no task covers yet.",
            |s| Some(s.waiting_sessions as f64),
        ),
        (
            "stoker_job_workers",
            "gauge",
            "Workers that leased the job's tasks in the last 10 s.",
            |s| Some(s.workers.len() as f64),
        ),
    ];
    for (name, kind, help, read) in families {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for share in shares {
            if let Some(value) = read(share).filter(|v| v.is_finite()) {
                let _ = writeln!(
                    out,
                    "{name}{{stoker_job=\"{}\"}} {value}",
                    escape(&share.name)
                );
            }
        }
    }
}

/// Escapes a label value: backslash, double quote and newline.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn empty_registry_still_declares_families() {
        let text = render(&Registry::default());
        assert!(text.contains("# TYPE stoker_stall_ratio gauge"));
        assert!(text.contains("# TYPE stoker_samples_total counter"));
        assert!(!text.lines().any(|l| !l.starts_with('#')));
    }
}
