//! The hook a second decoder plugs into below the seam: a lane beside the embedded decode
//! threads that builds some rows of each image batch itself (the GPU decode lane of
//! `stoker-gpu`). The loader knows the lane only through [`DecodeLane`]: which share of a step
//! it takes, how it builds a step with the decode pool, the pace it is told of, a resumed
//! split, and the figures its monitor reads; [`StartDecodeLane`] makes one for a job.

use std::sync::Arc;
use std::time::Duration;

use stoker_dashboard::GpuDecodeFigures;
use stoker_pipeline::Job;

use super::source::StepTask;
use crate::error::Result;

/// One step of an embedded job, as the decode pool's producer takes it from its queue (and
/// hands it to a lane).
pub type EmbeddedStep = StepTask<Arc<Job>>;

/// A decoder beside the embedded decode threads. A batch's bits depend only on the share of
/// its rows the lane was offered ([`DecodeLane::split_at`]), never on timing.
pub trait DecodeLane: Send + Sync {
    /// The lane's share of step `step` of `epoch`, in sixteenths of its rows (0: the decode
    /// pool builds the step alone). Decided when first asked for a step of a new point, then
    /// kept.
    fn split_at(&self, epoch: u64, step: u64) -> u8;

    /// Builds `step` on `pool` with `sixteenths` of its rows offered to the lane, and sends
    /// the batch to the step's reply channel (the lane's work may finish after this returns).
    fn build(&self, pool: &rayon::ThreadPool, step: EmbeddedStep, sixteenths: u8);

    /// Step `step` of `epoch`, `rows` rows, went to the training loop `interval` after the
    /// batch before it.
    fn note_delivered(&self, epoch: u64, step: u64, rows: usize, interval: Duration);

    /// Sets the share of the point step `step` of `epoch` is in (a resumed state's); whether
    /// batches built ahead may carry another share.
    fn set_split(&self, epoch: u64, step: u64, sixteenths: u8) -> bool;

    /// The lane's figures now, for the loader's statistics and its monitor.
    fn figures(&self) -> GpuDecodeFigures;

    /// The time the lane has worked so far (its work in progress included): a consumer that
    /// reads it at each step tells the steps beside the lane's work from the steps with the
    /// lane quiet ([`crate::Loader::record_gpu_idle`]).
    fn busy(&self) -> Duration;

    /// Stops the lane's threads; a step queued after it fails as stopped. Idempotent. The
    /// embedded source calls it when the last source sharing the lane is dropped.
    fn shutdown(&self);
}

/// Makes a job's [`DecodeLane`] ([`crate::LoaderOptions::decode_lane`]).
pub trait StartDecodeLane: Send + Sync + std::fmt::Debug {
    /// The lane for `job`; `Ok(None)` when the job is to be decoded on the CPU after all (a
    /// lane asked for only where it can run), an error when it must run and cannot.
    fn start(&self, job: &Job) -> Result<Option<Arc<dyn DecodeLane>>>;
}
