//! The lane as the loader's decode backend: [`StartGpuLane`] starts it for a job (the loader's
//! `StartDecodeLane`), in this process or in a helper process of its own, and either lane is
//! the loader's `DecodeLane`, building a step's CPU rows on the decode pool and its own on the
//! GPU ([`build_with_lane`]).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use stoker_dashboard::GpuDecodeFigures;
use stoker_loader::{
    decode_panic, Built, DecodeLane, EmbeddedStep, Error, StartDecodeLane, StepTask,
};
use stoker_pipeline::Job;

use super::helper::HelperLane;
use super::lane::LaneDiverter;
use super::{DecodeMode, GpuDecodeError, GpuDecodeOptions, GpuLane, LaneTask};

/// Starts the GPU decode lane `options` ask for beside a job's decode threads (set as
/// `LoaderOptions::decode_lane`). Where the lane cannot run (no driver, no nvJPEG, a job it
/// cannot build), `decode="auto"` decodes on the CPU and says so in the log; `"gpu"` fails the
/// loader with the reason.
#[derive(Debug)]
pub struct StartGpuLane {
    options: GpuDecodeOptions,
    /// The lane last started, for its detailed figures ([`StartGpuLane::lane`]).
    started: Mutex<Option<Weak<GpuLane>>>,
    /// The helper lane last started ([`StartGpuLane::helper`]).
    helper: Mutex<Option<Weak<HelperLane>>>,
}

impl StartGpuLane {
    /// A starter of the lane `options` ask for.
    pub fn new(options: GpuDecodeOptions) -> StartGpuLane {
        StartGpuLane {
            options,
            started: Mutex::new(None),
            helper: Mutex::new(None),
        }
    }

    /// The helper lane this starter started last, while it runs.
    pub fn helper(&self) -> Option<Arc<HelperLane>> {
        self.helper
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(Weak::upgrade)
    }

    /// Starts the lane for `job`: in a helper process when the options name one.
    fn start_lane(&self, job: &Job, batch: usize) -> Result<Arc<dyn DecodeLane>, GpuDecodeError> {
        if let Some(helper) = &self.options.helper {
            let lane = Arc::new(HelperLane::start(&self.options, helper, job, batch)?);
            *self.helper.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::downgrade(&lane));
            return Ok(lane);
        }
        let lane = Arc::new(GpuLane::start(&self.options, job, batch)?);
        *self.started.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::downgrade(&lane));
        Ok(lane)
    }

    /// The lane this starter started last, while it runs.
    pub fn lane(&self) -> Option<Arc<GpuLane>> {
        self.started
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(Weak::upgrade)
    }
}

impl StartDecodeLane for StartGpuLane {
    fn start(&self, job: &Job) -> stoker_loader::Result<Option<Arc<dyn DecodeLane>>> {
        let batch = job.plan_config().batch_size as usize;
        match self.start_lane(job, batch) {
            Ok(lane) => Ok(Some(lane)),
            // "auto" decodes on the CPU where the lane cannot run; "gpu" fails.
            Err(error) if self.options.mode == DecodeMode::Auto => {
                tracing::warn!(%error, "decode='auto': the GPU decode lane cannot run; decoding on the CPU");
                Ok(None)
            }
            Err(error) => Err(Error::Gpu(error.to_string())),
        }
    }
}

impl DecodeLane for GpuLane {
    fn split_at(&self, epoch: u64, step: u64) -> u8 {
        GpuLane::split_at(self, epoch, step)
    }

    fn build(&self, pool: &rayon::ThreadPool, step: EmbeddedStep, sixteenths: u8) {
        build_with_lane(pool, self, step, sixteenths);
    }

    fn note_delivered(&self, epoch: u64, step: u64, rows: usize, interval: Duration) {
        GpuLane::note_delivered(self, epoch, step, rows, interval);
    }

    fn set_split(&self, epoch: u64, step: u64, sixteenths: u8) -> bool {
        GpuLane::set_split(self, epoch, step, sixteenths)
    }

    fn figures(&self) -> GpuDecodeFigures {
        GpuLane::figures(self)
    }

    fn busy(&self) -> Duration {
        GpuLane::busy(self)
    }

    fn shutdown(&self) {
        GpuLane::shutdown(self);
    }
}

/// What [`build_with_lane`] needs of a lane: the diverter offering it rows, the CPU's count,
/// an output buffer taken in step order, and the batch handed over.
pub(super) trait StepLane {
    /// A diverter offering the rows of `sixteenths` of a batch to the lane.
    fn diverter(&self, sixteenths: u8) -> LaneDiverter;
    /// Counts `rows` built by the decode threads in `busy` for a batch the lane also worked on.
    fn note_cpu(&self, rows: usize, busy: Duration);
    /// Waits for a free output buffer for the next batch, or `None` once the lane shuts down.
    fn take_ring(&self) -> Option<usize>;
    /// Hands the batch to the lane, which finishes it and sends it on.
    fn submit(&self, task: LaneTask);
}

impl StepLane for GpuLane {
    fn diverter(&self, sixteenths: u8) -> LaneDiverter {
        GpuLane::diverter(self, sixteenths)
    }

    fn note_cpu(&self, rows: usize, busy: Duration) {
        GpuLane::note_cpu(self, rows, busy);
    }

    fn take_ring(&self) -> Option<usize> {
        GpuLane::take_ring(self)
    }

    fn submit(&self, task: LaneTask) {
        GpuLane::submit(self, task);
    }
}

/// Builds a step's CPU rows on the pool, offering `gpu_sixteenths` of its rows to the lane,
/// then hands the rest to the lane (or sends the batch when the lane took nothing).
pub(super) fn build_with_lane(
    pool: &rayon::ThreadPool,
    lane: &impl StepLane,
    task: EmbeddedStep,
    gpu_sixteenths: u8,
) {
    let StepTask {
        context: job,
        plan,
        step,
        mut slot,
        reply,
        ..
    } = task;
    let started = Instant::now();
    let diverter = lane.diverter(gpu_sixteenths);
    let assembled = pool.install(|| {
        catch_unwind(AssertUnwindSafe(|| {
            job.assemble_step(&plan, step, slot.as_mut_slice(), Some(&diverter))
                .map_err(Error::from)
        }))
        .unwrap_or_else(|panic| Err(decode_panic(step, panic)))
    });
    let (assembled, indices) = match assembled {
        Ok(built) => built,
        Err(error) => {
            let _ = reply.send(Built {
                step,
                service: started.elapsed(),
                result: Err(error),
            });
            return;
        }
    };
    let items = diverter.into_items();
    lane.note_cpu(indices.len() - items.len(), started.elapsed());
    if items.is_empty() {
        let _ = reply.send(Built {
            step,
            service: started.elapsed(),
            result: Ok(assembled.into_batch(&indices, slot.into_bytes())),
        });
        return;
    }
    // The output buffer is taken here, in step order: a later step never holds the buffer an
    // earlier one waits for.
    let Some(ring) = lane.take_ring() else {
        let _ = reply.send(Built {
            step,
            service: started.elapsed(),
            result: Err(Error::Stopped("the GPU decode lane shut down".into())),
        });
        return;
    };
    lane.submit(LaneTask {
        job,
        epoch: plan.epoch(),
        step,
        slot,
        assembled,
        indices,
        items,
        ring,
        reply,
        started,
    });
}
