//! The dashboard's HTTP routes: the page and its two assets, the JSON API, and `/metrics`.

use std::sync::{Arc, Mutex};

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::series::{
    unix_ms, JobSeries, Point, Registry, Verdict, Window, HISTORY, SAMPLE_INTERVAL, VERDICT_WINDOW,
};
use super::{metrics, POLL_PERIOD};

const PAGE: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/dashboard.js");
const STYLE: &str = include_str!("page/dashboard.css");

type Shared = Arc<Mutex<Registry>>;

/// The router over the shared registry.
pub(crate) fn router(registry: Shared) -> Router {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", PAGE) }),
        )
        .route(
            "/dashboard.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/dashboard.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
        .route("/api/jobs", get(jobs))
        .route("/metrics", get(prometheus))
        .with_state(registry)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// Most points one `/api/jobs` answer holds over all its jobs (about 40 MB of JSON): the
/// answer is built under the registry's lock, which the coordinator also takes under its own,
/// so a page opened on a fleet of hundreds of ranks gets each job's newest points only, an
/// equal share of these (a hundred jobs still get their whole history).
const MAX_ANSWER_POINTS: usize = 120_000;

/// Parameters of `/api/jobs`.
#[derive(Debug, Default, Deserialize)]
struct JobsQuery {
    /// Only points newer than this (Unix ms), so the page fetches what it lacks.
    since: Option<u64>,
    /// The figures as of the newest reading at or before this time (Unix ms): lets a test
    /// compare what the page showed with what the API said at that reading.
    at: Option<u64>,
}

/// The body of `/api/jobs`.
#[derive(Debug, Serialize)]
struct JobsResponse<'a> {
    now_ms: u64,
    interval_ms: u64,
    poll_ms: u64,
    history_s: u64,
    window_s: u64,
    jobs: Vec<JobView<'a>>,
}

/// One job in `/api/jobs`.
#[derive(Debug, Serialize)]
struct JobView<'a> {
    name: &'a str,
    rank: u32,
    /// Stable id fragment: the page's elements are `job-<key>-stall` and so on.
    key: &'a str,
    threads: usize,
    slots_in_use: usize,
    slot_capacity: usize,
    /// Whether the loader's prefetch controller chooses its depth (and measures the trainer's
    /// step); false: the depth is fixed, or nothing reported yet.
    automatic_prefetch: bool,
    verdict: Verdict,
    /// The newest reading (or the one asked for with `at`).
    current: Option<&'a Point>,
    /// The verdict window ending at `current`.
    window: Option<Window>,
    /// Readings newer than `since` up to `current`, oldest first.
    series: Vec<&'a Point>,
    /// Load per worker. In embedded mode the one "worker" is the decode pool of this process;
    /// the distributed mode lists its workers here.
    workers: Vec<WorkerView>,
    /// The job's share of the workers (distributed mode).
    share: Option<&'a super::JobShare>,
}

/// One worker's load.
#[derive(Debug, Serialize)]
struct WorkerView {
    name: String,
    kind: &'static str,
    threads: usize,
    busy_pct: Option<f64>,
    tasks_per_s: Option<f64>,
    bad_samples: u64,
}

async fn jobs(State(registry): State<Shared>, Query(query): Query<JobsQuery>) -> Response {
    let Ok(registry) = registry.lock() else {
        return poisoned();
    };
    let body = JobsResponse {
        now_ms: unix_ms(),
        interval_ms: SAMPLE_INTERVAL.as_millis() as u64,
        poll_ms: POLL_PERIOD.as_millis() as u64,
        history_s: HISTORY.as_secs(),
        window_s: VERDICT_WINDOW.as_secs(),
        jobs: registry
            .jobs
            .iter()
            .map(|job| {
                let share = registry
                    .shares
                    .iter()
                    .flatten()
                    .find(|share| share.name == job.name);
                let most = points_per_job(registry.jobs.len());
                job_view(job, &query, most, registry.workers.as_deref(), share)
            })
            .collect(),
    };
    ([(header::CACHE_CONTROL, "no-store")], Json(body)).into_response()
}

/// The points each of `jobs` jobs may send in one answer.
fn points_per_job(jobs: usize) -> usize {
    (MAX_ANSWER_POINTS / jobs.max(1)).max(1)
}

/// One job's part of the answer: its newest `most` points of those `query` asks for.
fn job_view<'a>(
    job: &'a JobSeries,
    query: &JobsQuery,
    most: usize,
    workers: Option<&[super::WorkerLoad]>,
    share: Option<&'a super::JobShare>,
) -> JobView<'a> {
    let position = job.position_at(query.at);
    let current = position.and_then(|p| job.points.get(p));
    let window = position.map(|p| job.window_ending(p));
    let since = query.since.unwrap_or(0);
    let mut series: Vec<&Point> = match position {
        Some(end) => job
            .points
            .range(..=end)
            .filter(|p| p.t_ms > since)
            .collect(),
        None => Vec::new(),
    };
    series.drain(..series.len().saturating_sub(most));
    let snapshot = job.latest.as_ref();
    let threads = snapshot.map_or(0, |s| s.threads);
    JobView {
        name: &job.name,
        rank: job.rank,
        key: &job.key,
        threads,
        slots_in_use: snapshot.map_or(0, |s| s.slots_in_use),
        slot_capacity: snapshot.map_or(0, |s| s.slot_capacity),
        automatic_prefetch: snapshot.is_some_and(|s| s.controller.is_some()),
        verdict: window
            .as_ref()
            .map_or(Verdict::Starting, |w| w.verdict.clone()),
        current,
        series,
        workers: match workers {
            Some(workers) => workers
                .iter()
                .map(|w| WorkerView {
                    name: w.name.clone(),
                    kind: "daemon",
                    threads: w.threads,
                    busy_pct: None,
                    tasks_per_s: w.tasks_per_s,
                    bad_samples: w.bad_samples,
                })
                .collect(),
            None => vec![WorkerView {
                name: "decode threads (this process)".to_string(),
                kind: "embedded",
                threads,
                busy_pct: current.and_then(|p| p.busy_pct),
                tasks_per_s: current.and_then(|p| p.batches_per_s),
                bad_samples: current.map_or(0, |p| p.bad_samples),
            }],
        },
        share,
        window,
    }
}

async fn prometheus(State(registry): State<Shared>) -> Response {
    let Ok(registry) = registry.lock() else {
        return poisoned();
    };
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        metrics::render(&registry),
    )
        .into_response()
}

fn poisoned() -> Response {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        "dashboard state unavailable (a sampler thread panicked)",
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::series::Registry;
    use crate::{LoaderMonitor, LoaderStats, MonitorSnapshot};
    use std::sync::{Arc, Mutex};

    /// An answer's points are bounded over all its jobs: each job's newest share of them.
    /// Before, a page opened on hundreds of ranks serialized every rank's whole history
    /// (about 100 MB for 256) under the lock the coordinator takes under its own.
    #[test]
    fn an_answer_holds_each_jobs_newest_share_of_the_points() {
        assert_eq!(points_per_job(0), MAX_ANSWER_POINTS);
        assert_eq!(points_per_job(100), 1_200);
        assert_eq!(points_per_job(256), 468);
        assert_eq!(points_per_job(usize::MAX), 1);
        let latest = Arc::new(Mutex::new(MonitorSnapshot::default()));
        let mut registry = Registry::default();
        registry.register("job", 0, LoaderMonitor::reported(Arc::clone(&latest)));
        for tick in 1..=12u32 {
            latest.lock().unwrap().stats = LoaderStats {
                elapsed_s: f64::from(tick),
                samples: u64::from(tick) * 10,
                ..LoaderStats::default()
            };
            registry.sample_all();
        }
        let job = &registry.jobs[0];
        let all: Vec<u64> = job.points.iter().map(|p| p.samples_total).collect();
        let view = job_view(job, &JobsQuery::default(), 5, None, None);
        let sent: Vec<u64> = view.series.iter().map(|p| p.samples_total).collect();
        assert_eq!(sent, all[all.len() - 5..]);
        let whole = job_view(job, &JobsQuery::default(), 1_000, None, None);
        assert_eq!(whole.series.len(), all.len());
    }
}
