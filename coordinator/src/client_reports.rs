//! What the coordinator's dashboard shows of the jobs and clients it serves: job names, and
//! clients' reports turned into the same figures an embedded loader's monitor gives.

use std::time::Duration;

use stoker_proto::v1::{ClientStats, DepthChange, PrefetchControl};

use crate::{Coordinator, JobId};
use stoker_dashboard::{ChangeReason, ControllerSnapshot, LoaderStats, MonitorSnapshot};

/// A job's name on the dashboard: its id and the last part of its dataset path (a mix: of
/// each, joined by `+`).
pub(super) fn job_name(core: &Coordinator, job: u64) -> String {
    let dataset = core
        .job_spec(JobId(job))
        .map(|spec| {
            stoker_pipeline::spec_sources(spec)
                .into_iter()
                .map(|(d, _)| {
                    let names = stoker_pipeline::source_names(d);
                    let uri = names.first().map_or("", |name| name.trim_end_matches('/'));
                    uri.rsplit('/').next().unwrap_or(uri).to_string()
                })
                .collect::<Vec<_>>()
                .join("+")
        })
        .unwrap_or_default();
    format!("job {job} {dataset}")
}

/// A client's report in the form the dashboard charts (the same as an embedded loader's).
pub(super) fn client_snapshot(stats: &ClientStats, threads: usize) -> MonitorSnapshot {
    let elapsed_s = stats.elapsed_ns as f64 / 1e9;
    let stages = stats.stage_ns.unwrap_or_default();
    MonitorSnapshot {
        stats: LoaderStats {
            batches: stats.batches,
            samples: stats.samples,
            elapsed_s,
            samples_per_s: if elapsed_s > 0.0 {
                stats.samples as f64 / elapsed_s
            } else {
                0.0
            },
            wait_s: stats.wait_ns as f64 / 1e9,
            epoch_start_wait_s: stats.epoch_start_wait_ns as f64 / 1e9,
            first_batch_s: None,
            read_s: stages.read_ns as f64 / 1e9,
            decode_s: stages.decode_ns as f64 / 1e9,
            augment_s: stages.augment_ns as f64 / 1e9,
            assemble_s: stages.assemble_ns as f64 / 1e9,
            bad_samples: stats.bad_samples,
            // The clients' reports carry no count of the tokens packing dropped.
            tokens_dropped: 0,
            bytes: stats.bytes,
            in_flight: stats.queue_depth as usize,
            prefetch_depth: stats.prefetch_target as usize,
            gpu_idle_s: stats.gpu_idle_ns as f64 / 1e9,
            gpu_span_s: stats.gpu_span_ns as f64 / 1e9,
            // Nor what a lane beside the step costs.
            gpu_lane_cost_s: 0.0,
            gpu_lane_quiet_steps: 0,
            // Remote clients decode nothing themselves: no GPU lane to report.
            gpu_decode: None,
        },
        controller: stats.prefetch_control.as_ref().map(controller_view),
        // A client that reports no controller's view fixes its depth (or is of a version
        // before the view was reported).
        fixed_prefetch: stats
            .prefetch_control
            .is_none()
            .then_some(stats.prefetch_target as usize),
        slots_in_use: stats.queue_depth as usize,
        slot_capacity: stats.prefetch_target as usize,
        slot_bytes: 0,
        threads,
        threads_shared: true,
        report_age_s: None,
    }
}

/// A client's prefetch controller as its report tells it (an unknown reason reads as the
/// start).
fn controller_view(control: &PrefetchControl) -> ControllerSnapshot {
    let last_change = match control.last_change() {
        DepthChange::Startup => ChangeReason::Startup,
        DepthChange::Stall => ChangeReason::Stall,
        DepthChange::Idle => ChangeReason::Idle,
        DepthChange::LittlesLaw => ChangeReason::LittlesLaw,
        DepthChange::Budget => ChangeReason::Budget,
    };
    ControllerSnapshot {
        target_depth: control.target_depth as usize,
        budget_depth: control.budget_depth as usize,
        latency_mean: Duration::from_nanos(control.latency_mean_ns),
        latency_std: Duration::from_nanos(control.latency_std_ns),
        step_mean: Duration::from_nanos(control.step_mean_ns),
        step_std: Duration::from_nanos(control.step_std_ns),
        littles_depth: control.littles_depth as usize,
        stall_floor_depth: control.stall_floor_depth as usize,
        // A share, whatever the report says.
        stall_fraction: if control.stall_fraction.is_finite() {
            control.stall_fraction.clamp(0.0, 1.0)
        } else {
            0.0
        },
        last_change,
    }
}
