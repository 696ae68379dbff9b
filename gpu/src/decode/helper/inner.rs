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
use stoker_loader::{Built, Error, LaneRows, PinnedShare, Slot};
use stoker_pipeline::{AssembledBatch, Job};
use stoker_proto::v1::{HelperBuilt, HelperStarted};

use super::process::discard;
use super::rows::{DeviceSide, HelperRows as Rows};
pub(super) use crate::decode::lane::lock;
use crate::decode::lane::{as_device_row, CpuRow, CpuRows, LaneSplit, LaneStats};
use crate::decode::RowTail;

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
    /// The share of each step offered to the lane.
    pub(super) split: LaneSplit,
    pub(super) stats: Arc<LaneStats>,
    pub(super) started: HelperStarted,
    pub(super) tail: RowTail,
    /// Output rows' (width, height) and the slot's bytes per row.
    pub(super) out: (u32, u32),
    pub(super) row_bytes: usize,
    pub(super) device: Option<DeviceSide>,
    pub(super) requests: Mutex<Option<BufWriter<ChildStdin>>>,
    pub(super) child: Mutex<Child>,
    /// The helper's process id.
    pub(super) pid: u32,
    /// The process that started the helper (a process forked from it must not end its lane).
    pub(super) owner: u32,
    /// nvJPEG's pinned allocations the helper refused, as its latest answer said.
    pub(super) pinned_refused: AtomicU64,
    /// Held while rows are copied out of the helper's buffers, and while the helper is taken
    /// as lost or the lane closes: nothing reads its memory once it may be gone.
    pub(super) copying: Mutex<()>,
    pub(super) pending: Mutex<HashMap<u64, Pending>>,
    pub(super) free: Mutex<Vec<usize>>,
    pub(super) returned: Condvar,
    /// Why the helper was lost; set once.
    pub(super) lost: Mutex<Option<String>>,
    /// Batches the helper answered as failed since the last it built.
    pub(super) failed_in_a_row: AtomicU64,
    /// Set when the lane shuts down.
    pub(super) closed: AtomicBool,
    pub(super) next_id: AtomicU64,
    pub(super) answer_timeout: Duration,
    /// How long the helper may take to end once told the end (or its stdin closes).
    pub(super) end_timeout: Duration,
    /// The helper's page-locked memory (its staging and the room it keeps for nvJPEG's pinned
    /// buffers), reserved within this process's pinned budget while the helper runs (let go
    /// once it is lost or the lane closed, and it ended: its pages went with it).
    pub(super) pinned: Mutex<Option<PinnedShare>>,
}

/// Batches in a row the helper answers as failed before it is taken as lost.
pub(super) const FAILED_BATCHES_LOST_AFTER: u64 = 3;

/// The buffer of a batch taken while the helper is lost: none (the batch is built on the CPU).
pub(super) const NO_RING: usize = usize::MAX;

impl Inner {
    /// Puts batch `id`, sent to the helper, among those waiting for an answer: the lane's busy
    /// time runs while any waits (from before it is there, so no taking can come first).
    pub(super) fn add_pending(&self, id: u64, pending: Pending) {
        self.stats.working(true);
        lock(&self.pending).insert(id, pending);
    }

    /// Takes batch `id` from those waiting for an answer.
    pub(super) fn take_pending(&self, id: u64) -> Option<Pending> {
        let taken = lock(&self.pending).remove(&id);
        if taken.is_some() {
            self.stats.working(false);
        }
        taken
    }

    /// Gives output buffer `ring` back for a later batch.
    pub(super) fn put_ring(&self, ring: usize) {
        if ring == NO_RING {
            return;
        }
        lock(&self.free).push(ring);
        self.returned.notify_one();
    }

    /// Closes this process's mapping of the helper's buffers, after any copy out of them (the
    /// rows handed out are in this process's own copy, which lives on with them). CUDA asks
    /// that an importer close its mapping before the exporter frees the memory, as the helper
    /// does when it ends; so this comes before its stdin closes or it is killed.
    pub(super) fn close_mapping(&self) {
        let _copying = lock(&self.copying);
        if let Some(side) = &self.device {
            side.close_ring();
        }
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
    /// ended), stops it, builds every batch it owed on the CPU, and wakes a producer waiting
    /// for a buffer.
    pub(super) fn lose(self: &Arc<Self>, why: String) {
        {
            // Not while rows are copied out of its buffers: that copy finishes first, and
            // none starts after (`lost` is set before the lock is let go).
            let _copying = lock(&self.copying);
            {
                let mut lost = lock(&self.lost);
                if lost.is_some() || self.closed.load(Ordering::Relaxed) {
                    return;
                }
                *lost = Some(why.clone());
            }
            if let Some(side) = &self.device {
                side.close_ring();
            }
            // A process that ended by itself keeps its own status: the kill finds it gone.
            let ended = end(&mut lock(&self.child), Duration::ZERO);
            let why = format!(
                "{why} (the process: {})",
                ended
                    .as_deref()
                    .unwrap_or("not ended 5 s after it was killed")
            );
            tracing::error!(
                reason = %why,
                "the GPU decode lane's helper process is lost; its batches and every later one are built on the CPU"
            );
            *lock(&self.lost) = Some(why);
            // Its page-locked pages went with it.
            if ended.is_some() {
                drop(lock(&self.pinned).take());
            }
        }
        // A write blocked on it ended with the kill (unless it could not be killed: that
        // writer keeps its stdin).
        if let Ok(mut requests) = self.requests.try_lock() {
            if let Some(requests) = requests.take() {
                discard(requests);
            }
        }
        {
            let _free = lock(&self.free);
            self.returned.notify_all();
        }
        self.drain();
    }

    /// Finishes a batch: the rows `built` names for the CPU (every image sent, without an
    /// answer) built into the slot, the helper's rows handed out with it. A panic on the way
    /// (the job's code building a row) fails this batch, as in the lane without a helper, and
    /// gives its buffer back if nothing had taken it yet: it ended the thread, the reader's,
    /// the watch's or the producer's, and the batch's step never came.
    pub(super) fn finish(self: &Arc<Self>, pending: Pending, built: Option<HelperBuilt>) -> Built {
        let (step, started, ring) = (pending.step, pending.started, pending.ring);
        let ring_taken = std::cell::Cell::new(false);
        let finished = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.finish_batch(pending, built, &ring_taken)
        }));
        finished.unwrap_or_else(|panic| {
            if !ring_taken.get() {
                self.put_ring(ring);
            }
            Built {
                step,
                service: started.elapsed(),
                result: Err(Error::Stopped(format!(
                    "the GPU decode lane panicked building step {step}: {}",
                    stoker_pipeline::panic_text(&*panic)
                ))),
            }
        })
    }

    /// [`Inner::finish`] unguarded; `ring_taken` set once the batch's buffer is given back or
    /// handed on.
    fn finish_batch(
        self: &Arc<Self>,
        pending: Pending,
        built: Option<HelperBuilt>,
        ring_taken: &std::cell::Cell<bool>,
    ) -> Built {
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
        // An answer that does not account for each image sent once, or names more rows than
        // its buffer holds, is out of step: nothing of it is used.
        let built = match built.map(|built| (check_answer(&built, &sent, self.capacity()), built)) {
            Some((Err(why), _)) => {
                self.lose(format!("its answer for step {step} {why}"));
                None
            }
            Some((Ok(()), built)) => Some(built),
            None => None,
        };
        if built.as_ref().is_some_and(|built| built.error.is_empty()) {
            self.failed_in_a_row.store(0, Ordering::Relaxed);
        }
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
                // A lane whose context broke fails every batch: taken as lost after a few, so
                // its share of each batch stops being sent to it.
                let failed = self.failed_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
                tracing::warn!(error = %built.error, step, failed_in_a_row = failed, "the GPU decode lane's helper could not build a batch; its rows are built on the CPU");
                if failed >= FAILED_BATCHES_LOST_AFTER {
                    self.lose(format!(
                        "its lane failed {failed} batches in a row, the last with: {}",
                        built.error
                    ));
                }
                (Vec::new(), all_cpu())
            }
            None => (Vec::new(), all_cpu()),
        };
        let (width, height) = self.out;
        let mut replaced: Vec<(usize, Vec<u8>)> = Vec::new();
        let mut rows = CpuRows {
            job: &job,
            epoch,
            slot: &mut slot,
            assembled: &mut assembled,
            row_bytes: self.row_bytes,
        };
        let made = rows.build(cpu.iter().copied(), |k, row| {
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
        // The helper's rows, copied here; if they cannot be (the helper lost meanwhile, or
        // the copy failing), they are built here too.
        let mut on_cpu = cpu.len();
        let device_rows = match made {
            Err(error) => {
                self.put_ring(ring);
                ring_taken.set(true);
                Err(error)
            }
            // The rows made of the buffer (its last step) give it back when let go.
            Ok(()) => match self.copy_rows(ring, positions.clone(), &replaced) {
                Ok(device_rows) => {
                    ring_taken.set(true);
                    Ok(device_rows)
                }
                Err(why) => {
                    self.put_ring(ring);
                    ring_taken.set(true);
                    if let Some(why) = why {
                        self.lose(format!("copying its rows for step {step}: {why}"));
                    }
                    let samples: HashMap<usize, u64> =
                        sent.iter().map(|row| (row.row, row.sample)).collect();
                    let left: Vec<(CpuRow, Option<usize>)> = positions
                        .iter()
                        .enumerate()
                        .filter(|(k, _)| !replaced.iter().any(|(r, _)| r == k))
                        .filter_map(|(_, &row)| {
                            let row = row as usize;
                            let sample = *samples.get(&row)?;
                            Some((CpuRow { row, sample }, None))
                        })
                        .collect();
                    on_cpu += left.len();
                    rows.build(left, |_, _| Ok(())).map(|()| None)
                }
            },
        };
        let stats = &self.stats;
        let on_device = match &device_rows {
            Ok(Some(_)) => positions.len().saturating_sub(replaced.len()),
            _ => 0,
        };
        stats
            .fallback_rows
            .fetch_add(on_cpu as u64, Ordering::Relaxed);
        stats
            .gpu_rows
            .fetch_add(on_device as u64, Ordering::Relaxed);
        let result = match device_rows {
            Err(error) => Err(error),
            Ok(device_rows) => {
                let mut batch = assembled.into_batch(&indices, slot.into_bytes());
                batch.device_rows = device_rows;
                Ok(batch)
            }
        };
        Built {
            step,
            service: started.elapsed(),
            result,
        }
    }

    /// How many device rows one output buffer holds (none without a device).
    fn capacity(&self) -> usize {
        let (width, height) = self.out;
        match &self.device {
            Some(side) => side.ring_slot_bytes / self.tail.row_bytes(height, width).max(1),
            None => 0,
        }
    }

    /// The helper's rows of a batch in buffer `ring`, copied here with `replaced` put over
    /// some of them, or `None` when it built none (the buffer then goes back). Fails with
    /// `None` when the helper is lost or the lane closed (its buffers are read no more), with
    /// why when the copy failed; the caller gives the buffer back then.
    fn copy_rows(
        self: &Arc<Self>,
        ring: usize,
        positions: Vec<u32>,
        replaced: &[(usize, Vec<u8>)],
    ) -> Result<Option<Arc<dyn LaneRows>>, Option<String>> {
        let (Some(side), false) = (self.device.as_ref(), positions.is_empty()) else {
            self.put_ring(ring);
            return Ok(None);
        };
        let (width, height) = self.out;
        let bytes = positions.len() * self.tail.row_bytes(height, width);
        let copied = {
            let _copying = lock(&self.copying);
            if lock(&self.lost).is_some() || self.closed.load(Ordering::Relaxed) {
                Err(None)
            } else {
                side.take_over(ring, bytes, replaced)
                    .map(|_| ())
                    .map_err(|e| Some(e.to_string()))
            }
        };
        copied?;
        Ok(Some(Arc::new(Rows {
            lane: Arc::clone(self),
            ring,
            positions,
            height,
            width,
            tail: self.tail,
        })))
    }

    /// Builds every batch still waiting on the CPU (the helper is lost), or fails them as
    /// stopped (the lane shut down).
    pub(super) fn drain(self: &Arc<Self>) {
        let pending: Vec<Pending> = lock(&self.pending).drain().map(|(_, p)| p).collect();
        for pending in pending {
            self.stats.working(false);
            let reply = pending.reply.clone();
            let built = match self.closed.load(Ordering::Relaxed) {
                true => self.stopped(pending),
                false => self.finish(pending, None),
            };
            let _ = reply.send(built);
        }
    }

    /// A batch of a lane that shut down: failed as stopped, its buffer given back (nothing
    /// here reads it any more).
    pub(super) fn stopped(&self, pending: Pending) -> Built {
        self.put_ring(pending.ring);
        Built {
            step: pending.step,
            service: pending.started.elapsed(),
            result: Err(Error::Stopped("the GPU decode lane shut down".into())),
        }
    }
}

/// Gives `child` `within` to end by itself (its stdin closed, or having said why it cannot
/// run), then kills it: how it ended, or `None` if it had not 5 s after the kill.
pub(super) fn end(child: &mut Child, within: Duration) -> Option<String> {
    reap(child, within).or_else(|| {
        if !within.is_zero() {
            tracing::warn!(
                timeout = ?within,
                "the lane's helper did not end in time; killing it"
            );
        }
        let _ = child.kill();
        reap(child, Duration::from_secs(5))
    })
}

/// Waits up to `within` for `child` to end: how it ended, or `None` if it has not yet.
pub(super) fn reap(child: &mut Child, within: Duration) -> Option<String> {
    let deadline = Instant::now() + within;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status.to_string()),
            Err(error) => return Some(error.to_string()),
            Ok(None) if Instant::now() >= deadline => return None,
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Whether `built` accounts for each image of `sent` once (a device row or the CPU, or both
/// for a device row the CPU's replaces) with at most `capacity` device rows; else how it does
/// not.
pub(super) fn check_answer(
    built: &HelperBuilt,
    sent: &[CpuRow],
    capacity: usize,
) -> Result<(), String> {
    if !built.error.is_empty() {
        return Ok(());
    }
    let mut left: HashMap<usize, u64> = sent.iter().map(|r| (r.row, r.sample)).collect();
    if left.len() != sent.len() {
        return Err("cannot be checked: two images sent for one row".into());
    }
    if built.rows.len() > capacity {
        return Err(format!(
            "names {} device rows where its buffer holds {capacity}",
            built.rows.len()
        ));
    }
    // Each batch row on the device once, by its device row.
    let mut device_rows: HashMap<usize, usize> = HashMap::with_capacity(built.rows.len());
    for (k, &row) in built.rows.iter().enumerate() {
        if device_rows.insert(row as usize, k).is_some() {
            return Err(format!("names batch row {row} twice on the device"));
        }
    }
    for cpu in &built.cpu {
        if let Some(k) = cpu.device_row {
            // Its device row is accounted for here (once: it leaves the map).
            if device_rows.get(&(cpu.row as usize)) != Some(&(k as usize)) {
                return Err(format!("names device row {k} for batch row {}", cpu.row));
            }
            device_rows.remove(&(cpu.row as usize));
        }
        if left.remove(&(cpu.row as usize)) != Some(cpu.sample) {
            return Err(format!(
                "names batch row {} for the CPU, not sent so",
                cpu.row
            ));
        }
    }
    let mut device_rows: Vec<usize> = device_rows.into_keys().collect();
    device_rows.sort_unstable();
    for row in device_rows {
        if left.remove(&row).is_none() {
            return Err(format!("names batch row {row} on the device, not sent so"));
        }
    }
    match left.keys().min() {
        Some(row) => Err(format!("leaves batch row {row} unbuilt")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stoker_proto::v1::HelperCpuRow;

    fn sent() -> Vec<CpuRow> {
        [(0, 10), (2, 12), (5, 15)]
            .map(|(row, sample)| CpuRow { row, sample })
            .to_vec()
    }

    fn cpu(row: u32, sample: u64, device_row: Option<u32>) -> HelperCpuRow {
        HelperCpuRow {
            row,
            sample,
            device_row,
        }
    }

    fn answer(rows: &[u32], cpu: Vec<HelperCpuRow>) -> HelperBuilt {
        HelperBuilt {
            rows: rows.to_vec(),
            cpu,
            ..HelperBuilt::default()
        }
    }

    #[test]
    fn an_answer_accounting_for_each_image_once_is_taken() {
        let ok = [
            answer(&[0, 2, 5], vec![]),
            answer(
                &[],
                vec![cpu(0, 10, None), cpu(2, 12, None), cpu(5, 15, None)],
            ),
            answer(&[0, 5], vec![cpu(2, 12, None), cpu(5, 15, Some(1))]),
        ];
        for built in ok {
            assert_eq!(check_answer(&built, &sent(), 3), Ok(()), "{built:?}");
        }
        // A failed batch goes to the CPU whole, whatever else it says.
        let failed = HelperBuilt {
            error: "sticky".into(),
            rows: vec![99],
            ..HelperBuilt::default()
        };
        assert_eq!(check_answer(&failed, &sent(), 0), Ok(()));
    }

    #[test]
    fn an_answer_out_of_step_is_named() {
        let wrong = [
            (
                answer(&[0, 2, 5], vec![]),
                2,
                "names 3 device rows where its buffer holds 2",
            ),
            (answer(&[0, 2], vec![]), 3, "leaves batch row 5 unbuilt"),
            (
                answer(&[0, 2, 5, 7], vec![]),
                4,
                "names batch row 7 on the device",
            ),
            (
                answer(&[0, 2, 2], vec![cpu(5, 15, None)]),
                3,
                "names batch row 2 twice on the device",
            ),
            // A row twice on the device, one of them replaced by the CPU's.
            (
                answer(&[0, 2, 5, 2], vec![cpu(2, 12, Some(1))]),
                4,
                "names batch row 2 twice on the device",
            ),
            // One device row replaced twice.
            (
                answer(&[0, 2, 5], vec![cpu(2, 12, Some(1)), cpu(2, 12, Some(1))]),
                3,
                "names device row 1 for batch row 2",
            ),
            (
                answer(&[0, 2], vec![cpu(5, 16, None)]),
                3,
                "names batch row 5 for the CPU",
            ),
            (
                answer(&[0, 2, 5], vec![cpu(5, 15, Some(1))]),
                3,
                "names device row 1 for batch row 5",
            ),
            (
                answer(&[0, 2, 5], vec![cpu(2, 12, None)]),
                3,
                "names batch row 2 on the device",
            ),
        ];
        for (built, capacity, why) in wrong {
            let error = check_answer(&built, &sent(), capacity).unwrap_err();
            assert!(error.starts_with(why), "{error} for {built:?}");
        }
    }
}
