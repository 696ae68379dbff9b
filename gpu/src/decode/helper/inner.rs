//! The loader's side of a helper lane, shared by its threads and its rows: the batches sent
//! and waiting for their answer, the output buffers free for the next batch, what the helper
//! is (started, or lost and why), and a batch finished from the helper's answer (or, without
//! one, on the CPU).

use std::collections::HashMap;
use std::io::BufWriter;
use std::process::{Child, ChildStdin};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use stoker_loader::{Built, Error, LaneRows, Slot};
use stoker_pipeline::{AssembledBatch, Job};
use stoker_proto::v1::{HelperBuilt, HelperStarted};

use super::rows::{DeviceSide, HelperRows as Rows};
use crate::decode::lane::{as_device_row, CpuRow, CpuRows, LaneStats};
use crate::decode::{DecodeMode, RowTail, SplitSchedule};

pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// A batch sent to the helper, waiting for its answer.
pub(super) struct Pending {
    pub(super) job: Arc<Job>,
    pub(super) epoch: u64,
    pub(super) step: u64,
    pub(super) slot: Slot,
    pub(super) assembled: AssembledBatch,
    pub(super) indices: Vec<u64>,
    /// Each image sent: its batch row and sample.
    pub(super) sent: Vec<CpuRow>,
    pub(super) ring: usize,
    pub(super) reply: Sender<Built>,
    pub(super) started: Instant,
    pub(super) sent_at: Instant,
}

/// What the lane's threads share with its rows.
pub(super) struct Inner {
    pub(super) mode: DecodeMode,
    pub(super) stats: Arc<LaneStats>,
    pub(super) splits: Mutex<SplitSchedule>,
    pub(super) started: HelperStarted,
    pub(super) tail: RowTail,
    /// Output rows' (width, height) and the slot's bytes per row.
    pub(super) out: (u32, u32),
    pub(super) row_bytes: usize,
    pub(super) device: Option<DeviceSide>,
    pub(super) requests: Mutex<Option<BufWriter<ChildStdin>>>,
    pub(super) child: Mutex<Child>,
    pub(super) pending: Mutex<HashMap<u64, Pending>>,
    pub(super) free: Mutex<Vec<usize>>,
    /// Output buffers in all.
    pub(super) ring_slots: usize,
    pub(super) returned: Condvar,
    /// Why the helper was lost; set once.
    pub(super) lost: Mutex<Option<String>>,
    /// Set when the lane shuts down.
    pub(super) closed: AtomicBool,
    pub(super) next_id: AtomicU64,
    /// The helper's time on the batches it answered.
    pub(super) busy_ns: AtomicU64,
    pub(super) answer_timeout: Duration,
}

/// The buffer of a batch taken while the helper is lost: none (the batch is built on the CPU).
pub(super) const NO_RING: usize = usize::MAX;

impl Inner {
    /// Gives output buffer `ring` back for a later batch (after the lane shut down, the last
    /// one back closes the helper's stdin).
    pub(super) fn put_ring(&self, ring: usize) {
        if ring == NO_RING {
            return;
        }
        lock(&self.free).push(ring);
        self.returned.notify_one();
        if self.closed.load(Ordering::Relaxed) {
            self.close_when_free();
        }
    }

    /// Closes the helper's stdin if every output buffer is free; whether it did (or was).
    pub(super) fn close_when_free(&self) -> bool {
        let free = lock(&self.free);
        if free.len() < self.ring_slots {
            return false;
        }
        drop(free);
        drop(lock(&self.requests).take());
        true
    }

    /// Waits for a free output buffer: `None` once the lane shuts down, [`NO_RING`] once the
    /// helper is lost.
    pub(super) fn take_ring(&self) -> Option<usize> {
        let mut free = lock(&self.free);
        loop {
            if self.closed.load(Ordering::Relaxed) {
                return None;
            }
            if lock(&self.lost).is_some() {
                return Some(NO_RING);
            }
            if let Some(ring) = free.pop() {
                return Some(ring);
            }
            free = self
                .returned
                .wait_timeout(free, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Takes the helper as lost for `why` (the first reason stays, with how the process
    /// ended), stops it, and wakes a producer waiting for a buffer. The reader then builds
    /// what it owed on the CPU.
    pub(super) fn lose(&self, why: String) {
        let mut lost = lock(&self.lost);
        if lost.is_some() || self.closed.load(Ordering::Relaxed) {
            return;
        }
        let ended = {
            let mut child = lock(&self.child);
            // A process that ended by itself keeps its own status: the kill finds it gone.
            let _ = child.kill();
            child
                .wait()
                .map(|s| s.to_string())
                .unwrap_or_else(|e| e.to_string())
        };
        let why = format!("{why} (the process: {ended})");
        tracing::error!(
            reason = %why,
            "the GPU decode lane's helper process is lost; its batches and every later one are built on the CPU"
        );
        *lost = Some(why);
        drop(lost);
        drop(lock(&self.requests).take());
        let _free = lock(&self.free);
        self.returned.notify_all();
    }

    /// Finishes a batch: the rows `built` names for the CPU (every image sent, without an
    /// answer) built into the slot, the helper's rows handed out with it.
    pub(super) fn finish(self: &Arc<Self>, pending: Pending, built: Option<HelperBuilt>) -> Built {
        let Pending {
            job,
            epoch,
            step,
            mut slot,
            mut assembled,
            indices,
            sent,
            ring,
            reply: _,
            started,
            sent_at: _,
        } = pending;
        let all_cpu = || sent.iter().map(|row| (*row, None)).collect::<Vec<_>>();
        let (positions, cpu): (Vec<u32>, Vec<(CpuRow, Option<usize>)>) = match &built {
            Some(built) if built.error.is_empty() && self.device.is_some() => (
                built.rows.clone(),
                built
                    .cpu
                    .iter()
                    .map(|row| {
                        let cpu = CpuRow {
                            row: row.row as usize,
                            sample: row.sample,
                        };
                        (cpu, row.device_row.map(|k| k as usize))
                    })
                    .collect(),
            ),
            Some(built) if built.error.is_empty() => (Vec::new(), all_cpu()),
            Some(built) => {
                tracing::debug!(error = %built.error, step, "the helper could not build a batch; building its rows on the CPU");
                (Vec::new(), all_cpu())
            }
            None => (Vec::new(), all_cpu()),
        };
        if let Some(built) = &built {
            self.busy_ns.fetch_add(built.busy_ns, Ordering::Relaxed);
        }
        let replacing = cpu.iter().filter(|(_, k)| k.is_some()).count();
        let stats = &self.stats;
        stats
            .fallback_rows
            .fetch_add(cpu.len() as u64, Ordering::Relaxed);
        stats.gpu_rows.fetch_add(
            positions.len().saturating_sub(replacing) as u64,
            Ordering::Relaxed,
        );
        let (width, height) = self.out;
        let mut replaced: Vec<(usize, Vec<u8>)> = Vec::new();
        let made = CpuRows {
            job: &job,
            epoch,
            slot: &mut slot,
            assembled: &mut assembled,
            row_bytes: self.row_bytes,
        }
        .build(cpu.iter().copied(), |k, row| {
            if k >= positions.len() {
                return Err(format!(
                    "the helper named device row {k} of {}",
                    positions.len()
                ));
            }
            replaced.push((
                k,
                as_device_row(self.tail, row, height, width)?.into_owned(),
            ));
            Ok(())
        });
        let result = match made {
            Err(error) => {
                self.put_ring(ring);
                Err(error)
            }
            Ok(()) => {
                let mut batch = assembled.into_batch(&indices, slot.into_bytes());
                match self.hand_on(ring, positions, &replaced) {
                    Ok(rows) => {
                        batch.device_rows = rows;
                        Ok(batch)
                    }
                    Err(error) => Err(error),
                }
            }
        };
        Built {
            step,
            service: started.elapsed(),
            result,
        }
    }

    /// The helper's rows of a batch in buffer `ring` (`replaced` put over some of them here),
    /// or `None` when it built none (the buffer then goes back at once).
    fn hand_on(
        self: &Arc<Self>,
        ring: usize,
        positions: Vec<u32>,
        replaced: &[(usize, Vec<u8>)],
    ) -> stoker_loader::Result<Option<Arc<dyn LaneRows>>> {
        let (Some(side), false) = (self.device.as_ref(), positions.is_empty()) else {
            self.put_ring(ring);
            return Ok(None);
        };
        let replaced = match replaced.is_empty() {
            true => None,
            false => match side.replace(ring, replaced) {
                Ok(event) => Some(event),
                Err(error) => {
                    self.put_ring(ring);
                    return Err(Error::Gpu(error.to_string()));
                }
            },
        };
        let (width, height) = self.out;
        Ok(Some(Arc::new(Rows {
            lane: Arc::clone(self),
            ring,
            positions,
            height,
            width,
            tail: self.tail,
            replaced,
        })))
    }

    /// Builds every batch still waiting on the CPU (the helper is lost), or fails them as
    /// stopped (the lane shut down).
    pub(super) fn drain(self: &Arc<Self>) {
        let pending: Vec<Pending> = lock(&self.pending).drain().map(|(_, p)| p).collect();
        for pending in pending {
            let reply = pending.reply.clone();
            let built = if self.closed.load(Ordering::Relaxed) {
                // Nothing will read its buffer; the helper may still write it, until it ends.
                self.put_ring(pending.ring);
                Built {
                    step: pending.step,
                    service: pending.started.elapsed(),
                    result: Err(Error::Stopped("the GPU decode lane shut down".into())),
                }
            } else {
                self.finish(pending, None)
            };
            let _ = reply.send(built);
        }
    }
}
